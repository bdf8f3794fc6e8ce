"""Test support for users and our own suite: the fake judge, an in-process server, instruments."""

from genrm_trio.testing.fake_judge import FakeJudge, pair_rule
from genrm_trio.testing.fake_judge_http import fake_judge_app, serve_fake_judge

__all__ = ["FakeJudge", "fake_judge_app", "pair_rule", "serve_fake_judge"]
