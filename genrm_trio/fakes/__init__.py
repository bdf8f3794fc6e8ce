"""The built-in fakes: a fake judge and a fake policy that genrm-trio ships and its tests run on.

`genrm-trio fake-judge` serves the fake judge (``judge_command``), `genrm-trio fake-policy`
the fake policy (``policy_command``), and `genrm-trio demo` judges its groups on a fake judge.
The fake judge is an OpenAI-compatible model whose verdicts follow the qualities written into
the texts, told what to do by rules and fault rates; it is served over ASGI, over real TCP
(``judge_http``) or straight to the judge client in memory (``memory_transport``). The fake
policy answers the collector with texts that carry such qualities. ``genrm_trio.testing``
builds its harness on these.
"""

from genrm_trio.fakes.judge import FakeJudge, FakeReply, pair_rule
from genrm_trio.fakes.judge_http import fake_judge_app, serve_fake_judge, wait_for_stats
from genrm_trio.fakes.memory_transport import MemoryTransport, memory_transport
from genrm_trio.fakes.policy import FakePolicy, FakePolicyApp, serve_fake_policy

__all__ = [
    "FakeJudge",
    "FakePolicy",
    "FakePolicyApp",
    "FakeReply",
    "MemoryTransport",
    "fake_judge_app",
    "memory_transport",
    "pair_rule",
    "serve_fake_judge",
    "serve_fake_policy",
    "wait_for_stats",
]
