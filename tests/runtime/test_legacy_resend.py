"""A row resent under a legacy key whose group already completed (SPEC §5.14) is seen at once:
a WARNING at arrival with the hint, and a count in /healthz while it waits."""

from __future__ import annotations

import logging

import pytest
import trio
import trio.testing

from genrm_trio.testing.harness import member, running_server


async def test_a_lone_resent_row_is_logged_and_counted_while_it_waits(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="genrm_trio")
    async with running_server(
        num_rollouts_per_prompt=4, cohort_collection_timeout_s=60.0
    ) as server:
        first = await server.complete(None, None, _ng_task_index=7)
        assert [r.status for r in first] == [200] * 4
        assert (await server.get("/healthz")).body["legacy_resends_collecting"] == 0
        async with trio.open_nursery() as nursery:
            # A collector resends one masked row of the finished group, without a group id.
            pending = server.start_verify(nursery, member(2, 3, None, None, _ng_task_index=7))
            await trio.testing.wait_all_tasks_blocked()
            warnings = [r.getMessage() for r in caplog.records if "GenRM legacy group" in r.message]
            assert len(warnings) == 1
            assert warnings[0].startswith("GenRM legacy group 'task_idx::7::")
            assert "rollout_index=2 starts a new group under the same key" in warnings[0]
            assert warnings[0].endswith(
                "send the whole group again under a fresh _ng_group_id shared by every member."
            )
            assert (await server.get("/healthz")).body["legacy_resends_collecting"] == 1
            reply = await pending.result()
        assert reply.status == 503 and "did not collect 4 unique rollout indices" in reply.detail
        assert (await server.get("/healthz")).body["legacy_resends_collecting"] == 0
        server.engine.check_invariants()
