"""A server says when masking dominates: one WARNING naming the share and the most common reason
with its count, not one per rollout; an INFO when the share falls back; and
`genrm_masked_rollout_ratio` on /metrics reads the share the log names.

Over real loopback (the server under hypercorn, the judge on a closed port or the fake judge's TCP
server, the real clock), and in process on the mock clock where the window has to pass.
"""

from __future__ import annotations

import logging
import re
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import httpx
import pytest
import trio
import trio.testing
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve as hypercorn_serve
from prometheus_client.parser import text_string_to_metric_families

from genrm_trio.config import config_from_mapping
from genrm_trio.http.app import create_app
from genrm_trio.testing import FakeJudge, serve_fake_judge
from genrm_trio.testing.harness import SCENARIO_DEFAULTS, member, running_server

SAFETY_S = 20.0  # guards against a hung test only
GROUP = 4
MASKED = re.compile(r"GenRM masked \d+ of \d+ rollouts")
SETTINGS = {
    "num_rollouts_per_prompt": GROUP,
    "genrm_parse_retries": 0,  # one attempt per comparison: a dead judge fails it at once
    "mask_window_s": 60.0,
    "mask_warning_ratio": 0.5,
    "mask_warning_min_rollouts": 8,
}


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@asynccontextmanager
async def serving(**settings: Any) -> AsyncIterator[httpx.AsyncClient]:
    """The app under hypercorn on a loopback port, and a client of it over TCP."""
    config = config_from_mapping({**SCENARIO_DEFAULTS, **SETTINGS, **settings})
    app = create_app(config)
    hypercorn = HypercornConfig()
    hypercorn.bind = ["127.0.0.1:0"]
    hypercorn.accesslog = None
    hypercorn.errorlog = None
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(
            partial(hypercorn_serve, app, hypercorn, shutdown_trigger=stop.wait)
        )
        try:
            async with httpx.AsyncClient(
                base_url=binds[0], timeout=SAFETY_S, trust_env=False
            ) as client:
                yield client
        finally:
            stop.set()


async def post_groups(client: httpx.AsyncClient, groups: range) -> list[dict[str, Any]]:
    """Each group's members at once, one group after another; the rows."""
    rows: list[dict[str, Any]] = []

    async def post(body: dict[str, Any]) -> None:
        reply = await client.post("/verify", json=body)
        assert reply.status_code == 200, reply.text
        rows.append(reply.json())

    with trio.fail_after(SAFETY_S):
        for g in groups:
            async with trio.open_nursery() as nursery:
                for i in range(GROUP):
                    nursery.start_soon(post, member(i, 1 + i, f"g{g}"))
    return rows


def samples(exposition: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(exposition)
        for sample in family.samples
    }


def masking_lines(caplog: pytest.LogCaptureFixture) -> list[tuple[str, str]]:
    return [
        (record.levelname, record.getMessage())
        for record in caplog.records
        if MASKED.match(record.getMessage())
    ]


async def test_a_dead_judge_is_warned_once_with_its_reason_and_the_gauge_reads_the_share(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="genrm_trio")
    port = closed_port()
    async with serving(judge_base_url=f"http://127.0.0.1:{port}/v1") as client:
        rows = await post_groups(client, range(5))
        exposition = (await client.get("/metrics")).text
    assert len(rows) == 20 and all(row["mask_sample"] for row in rows)

    # One line for twenty masked rollouts: written at the eighth, the minimum sample.
    [(level, text)] = masking_lines(caplog)
    assert level == "WARNING"
    assert text.startswith("GenRM masked 8 of 8 rollouts in the last 60 s (100%, ")
    reason = re.search(r"most common reason \((\d+)\): (judge \w+); latest: (.*)", text)
    assert reason is not None, text
    assert (reason.group(1), reason.group(2)) == ("8", "judge ConnectError")
    assert reason.group(3).startswith(f"GenRM judge http://127.0.0.1:{port}/v1/chat/completions")
    assert f"ConnectError: cannot connect to 127.0.0.1:{port}" in reason.group(3)

    metrics = samples(exposition)
    assert metrics[("genrm_masked_rollout_ratio", ())] == 1.0
    assert metrics[("genrm_mask_window_rollouts", (("outcome", "masked"),))] == 20
    assert metrics[("genrm_mask_window_rollouts", (("outcome", "scored"),))] == 0
    by_reason = (("reason", "judge ConnectError"),)
    assert metrics[("genrm_mask_window_masked_rollouts", by_reason)] == 20


async def test_a_healthy_run_logs_no_masking_warning_and_reads_zero(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="genrm_trio")
    judge = FakeJudge()
    async with trio.open_nursery() as nursery:
        port = await nursery.start(serve_fake_judge, judge, "127.0.0.1", 0)
        async with serving(judge_base_url=f"http://127.0.0.1:{port}/v1") as client:
            rows = await post_groups(client, range(5))
            exposition = (await client.get("/metrics")).text
        nursery.cancel_scope.cancel()
    assert len(rows) == 20 and not any(row["mask_sample"] for row in rows)
    assert masking_lines(caplog) == []
    assert not any("fell below mask_warning_ratio" in r.getMessage() for r in caplog.records)
    metrics = samples(exposition)
    assert metrics[("genrm_masked_rollout_ratio", ())] == 0.0
    assert metrics[("genrm_mask_window_rollouts", (("outcome", "scored"),))] == 20
    assert not any(name == "genrm_mask_window_masked_rollouts" for name, _ in metrics)


async def test_masking_that_lasts_is_warned_once_a_window_and_its_end_is_said_at_info(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="genrm_trio")
    judge = FakeJudge(rules=[{"action": "http_status", "status": 503}])
    async with running_server(SETTINGS, judge=judge, mask_window_s=10.0) as server:
        groups = iter(range(1000))

        async def send(count: int) -> None:
            for _ in range(count):
                g = f"g{next(groups)}"
                rows = await server.verify_all([member(i, 1 + i, g) for i in range(GROUP)])
                assert all(row.status == 200 for row in rows)
                await trio.sleep(1.0)

        await send(25)  # 25 s of a judge answering 503: one warning a 10 s window
        warned = masking_lines(caplog)
        assert [level for level, _ in warned] == ["WARNING"] * 3
        assert all(
            "most common reason" in text and ": judge HTTP 503;" in text for _, text in warned
        )
        ratio = samples((await server.client.get("/metrics")).text)
        assert ratio[("genrm_masked_rollout_ratio", ())] == 1.0

        judge.set_rules([])  # the judge recovers
        await send(10)
        ended = [
            (r.levelname, r.getMessage())
            for r in caplog.records
            if "fell below mask_warning_ratio 0.5" in r.getMessage()
        ]
        assert len(ended) == 1 and ended[0][0] == "INFO"
        assert len(masking_lines(caplog)) == 3  # no warning after it
        after = samples((await server.client.get("/metrics")).text)
        assert after[("genrm_masked_rollout_ratio", ())] < 0.5
