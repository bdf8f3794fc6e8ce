"""Test support for users and our own suite.

The public harness is what this package exports, plus the modules it names in the docs:
``harness`` (a whole server in a test), ``fixtures`` (the pytest plugin of the race harness),
``controlled_judge``, ``instrument``, ``redis_server`` and ``redis_fixtures`` (a real Redis
process for a test), and ``scenarios``. The fake judge it exports comes from
``genrm_trio.fakes``, with its in-memory transport. Modules whose names begin with ``_`` serve
our own suite and benchmarks, and may change without notice.
"""

from genrm_trio.fakes.judge import FakeJudge, pair_rule
from genrm_trio.fakes.judge_http import fake_judge_app, serve_fake_judge, wait_for_stats
from genrm_trio.testing.controlled_judge import ControlledJudge
from genrm_trio.testing.harness import member, running_server
from genrm_trio.testing.instrument import CriticalSectionInstrument
from genrm_trio.testing.redis_server import RedisServer

__all__ = [
    "ControlledJudge",
    "CriticalSectionInstrument",
    "FakeJudge",
    "RedisServer",
    "fake_judge_app",
    "member",
    "pair_rule",
    "running_server",
    "serve_fake_judge",
    "wait_for_stats",
]
