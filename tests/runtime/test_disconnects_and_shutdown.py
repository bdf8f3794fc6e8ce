"""Disconnects, shutdown, memory and per-request work counts through /verify (§10.13, §10.14)."""

from __future__ import annotations

import contextvars
import gc
import logging
import sys
import weakref

import pytest
import trio
import trio.testing

from genrm_trio.runtime.hooks import Hooks
from genrm_trio.testing import FakeJudge
from genrm_trio.testing.harness import member, running_server


async def test_disconnect_during_collection_keeps_the_member() -> None:
    # AS-148
    async with running_server() as server, trio.open_nursery() as nursery:
        pending = server.start_verify(nursery, member(0))
        await server.settle()
        pending.disconnect()
        await server.settle()
        assert (await server.verify(member(0, regenerated=True))).status == 409
        replies = await server.verify_all([member(0), member(1)])
        assert [r.reward for r in replies] == [3.0, 3.0]
        assert server.calls() == 2


async def test_disconnect_during_judging_and_identical_retry(autojump_clock) -> None:
    # AS-149
    async with running_server(judge=FakeJudge(latency="fixed:0.5")) as server:
        async with trio.open_nursery() as nursery:
            first = server.start_verify(nursery, member(0))
            second = server.start_verify(nursery, member(1))
            await trio.sleep(0.1)
            first.disconnect()
            retry = await server.verify(member(0))
            assert retry.reward == 3.0
            assert (await second.result()).reward == 3.0
        assert server.calls() == 2


async def test_group_completes_when_every_requester_left(autojump_clock) -> None:
    # AS-150
    async with running_server(judge=FakeJudge(latency="fixed:0.5")) as server:
        async with trio.open_nursery() as nursery:
            pending = [server.start_verify(nursery, member(i)) for i in range(2)]
            await trio.sleep(0.1)
            for p in pending:
                p.disconnect()
        await trio.sleep(1)
        calls = server.calls()
        assert calls == 2
        replies = await server.verify_all([member(0), member(1)])
        assert [r.reward for r in replies] == [3.0, 3.0]
        assert server.calls() == calls


async def test_cancelled_request_releases_its_body() -> None:
    # AS-151
    import msgspec

    from genrm_trio.wire.parsing import parse_verify_body

    marker = "response-that-must-be-released"

    def live_responses() -> int:
        return sum(1 for o in gc.get_objects() if isinstance(o, dict) and o.get("id") == marker)

    async with running_server() as server:
        body = member(0)
        body["response"]["id"] = marker
        body["response"]["generation_token_ids"] = list(range(10_000))
        data = msgspec.json.encode(body)
        parsed = parse_verify_body(data, server.config)
        del body
        request_ref = weakref.ref(parsed)
        # The response is validated, not built: only its scoring view is decoded.
        assert live_responses() == 0
        held_by_request = sys.getrefcount(data)

        async with trio.open_nursery() as nursery:
            scope = trio.CancelScope()

            async def wait(request: object) -> None:
                with scope:
                    async with server.engine.verify(request):
                        pass

            nursery.start_soon(wait, parsed)
            await server.settle()
            del parsed
            scope.cancel()
        gc.collect()
        assert request_ref() is None
        assert live_responses() == 0
        # Nothing holds the body any more (the member's identity let go of its bytes), while
        # the member keeps its compact texts.
        assert sys.getrefcount(data) < held_by_request
        assert server.engine.counters.canonical_fingerprints == 1
        replay = member(0)
        replay["response"]["id"] = marker
        replay["response"]["generation_token_ids"] = list(range(10_000))
        replies = await server.verify_all([replay, member(1)])
        assert [r.status for r in replies] == [200, 200]


async def test_shutdown_fails_waiters_and_leaves_nothing_behind() -> None:
    # AS-152
    judge = FakeJudge(rules=[{"match": {"response_1": "[[q=4]]"}, "action": "hang"}])
    async with running_server(judge=judge) as server:
        async with trio.open_nursery() as nursery:
            collecting = server.start_verify(nursery, member(0, g="c"))
            evaluating = [server.start_verify(nursery, member(i, 4, g="e")) for i in range(2)]
            await server.settle()
            assert judge.stats()["in_flight"] >= 1
            await server.engine.shutdown()
            for pending in [collecting, *evaluating]:
                reply = await pending.result()
                assert (reply.status, reply.detail) == (503, "GenRM server is shutting down")
        late = await server.verify(member(1, g="c"))
        assert (late.status, late.detail) == (503, "GenRM server is shutting down")
        compare = await server.compare({"conversation_history": [], "response_objs": []})
        assert compare.status == 503
        health = await server.get("/healthz")
        assert health.status == 503 and health.body["status"] == "shutting_down"
        stats = server.engine.statistics()
        assert (
            stats.active_groups,
            stats.retained_records,
            stats.watermarks,
            stats.waiters,
            stats.owned_tasks,
        ) == (0, 0, 0, 0, 0)
        assert judge.stats()["in_flight"] == 0
        server.engine.check_invariants()


async def test_per_request_work_is_counted_once() -> None:
    # AS-158
    async with running_server(judge=FakeJudge(latency="fixed:0.1")) as server:
        async with trio.open_nursery() as nursery:
            first = server.start_verify(nursery, member(0))
            second = server.start_verify(nursery, member(1))
            await trio.sleep(0.05)
            duplicate = await server.verify(member(0))
            await first.result()
            await second.result()
        assert duplicate.reward == 3.0
        await server.verify(member(1))
        assert (await server.verify(member(1, regenerated=True))).status == 409
        counters = server.engine.counters
        assert counters.fingerprints == 5
        assert counters.extractions == 2
        assert counters.conversions == 1


request_marker: contextvars.ContextVar[str] = contextvars.ContextVar("request_marker")


async def test_no_request_context_reaches_the_judge() -> None:
    # AS-67
    seen: list[str | None] = []

    def at_start(i: int, j: int, p: int) -> None:
        seen.append(request_marker.get(None))

    async with running_server(hooks=Hooks(on_comparison_start=at_start)) as server:
        request_marker.set("member request")
        headers = {"traceparent": "00-abc-def-01", "X-Request-ID": "abc"}
        bodies = [member(i) for i in range(2)]
        async with trio.open_nursery() as nursery:
            for body in bodies:
                nursery.start_soon(lambda b=body: server.verify(b, headers=headers))
        for recorded in server.judge.requests(10):
            names = set(recorded["headers"])
            assert names <= {
                "content-type",
                "accept",
                "user-agent",
                "host",
                "content-length",
                "accept-encoding",
                "connection",
            }
            assert "traceparent" not in names and "x-request-id" not in names
    assert seen == [None, None]


async def test_attempt_omitted_is_logged_once_per_instance(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # AS-27
    caplog.set_level(logging.INFO, logger="genrm_trio")
    text = "GenRM group attempt omitted; treating requests as group attempt zero"
    for _ in range(2):
        async with running_server() as server:
            for k in range(10):
                rows = await server.verify_all([member(i, g=f"g{k}", a=None) for i in range(2)])
                assert all(r.body["_ng_group_attempt"] == 0 for r in rows)
    assert caplog.text.count(text) == 2
