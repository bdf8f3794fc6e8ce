"""The judge client: request building, reply reading, the attempt loop and the transport seam.

What a user builds on is exported here: the client (`JudgeClient` with its tasks, verdicts and
failures), the transport seam a test or another network stack plugs into (`JudgeTransport`,
`JudgeReply`, `TransportFactory` and the failures a transport ends in), and the network
transport, `Http11Transport`. ``slots`` and ``balancer`` are the server's bookkeeping of judge
slots and replicas; the modules whose names begin with ``_`` are the client's own. The readiness
probe (`JudgeProbe`, `wait_for_judge`) and the plain state it keeps (`JudgeReadiness`,
`ReplicaState`, `readiness_verdict`) are exported for the server and `serve --wait-for-judge`.
"""

from genrm_trio.judge._probe import JudgeProbe, wait_for_judge
from genrm_trio.judge._readiness import (
    JudgeReadiness,
    ReadinessVerdict,
    ReplicaState,
    readiness_verdict,
)
from genrm_trio.judge.client import JudgeClient, JudgeFailure, JudgeTask, JudgeVerdict
from genrm_trio.judge.http11 import Http11Transport
from genrm_trio.judge.transport import (
    ConnectError,
    ConnectTimedOut,
    JudgeEndpoint,
    JudgeReply,
    JudgeTransport,
    JudgeTransportError,
    ReadError,
    RemoteProtocolError,
    ReplyDecodingFailed,
    RequestInvalid,
    TransportFactory,
    TransportStatistics,
)

__all__ = [
    "ConnectError",
    "ConnectTimedOut",
    "Http11Transport",
    "JudgeClient",
    "JudgeEndpoint",
    "JudgeFailure",
    "JudgeProbe",
    "JudgeReadiness",
    "JudgeReply",
    "JudgeTask",
    "JudgeTransport",
    "JudgeTransportError",
    "JudgeVerdict",
    "ReadError",
    "ReadinessVerdict",
    "RemoteProtocolError",
    "ReplicaState",
    "ReplyDecodingFailed",
    "RequestInvalid",
    "TransportFactory",
    "TransportStatistics",
    "readiness_verdict",
    "wait_for_judge",
]
