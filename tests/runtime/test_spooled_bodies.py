"""Waiting bodies beyond `waiting_body_memory_bytes` wait in spool files: the wire does not change
(byte-for-byte echo, same rows), files go when their request is done, at shutdown and after a
crash, and a disk that cannot take a body gives a 503 naming the cause with nothing changed."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio
import trio.testing

from genrm_trio.http import _spool as spool_module
from genrm_trio.http._spool import SpoolBudget
from genrm_trio.testing import FakeJudge
from genrm_trio.testing.harness import Reply, Server, member, running_server


def big_member(i: int, g: str = "g", **extra: Any) -> dict[str, Any]:
    """A member whose response is large enough to be read back from its file in chunks."""
    body = member(i, g=g, **extra)
    body["response"]["generation_token_ids"] = list(range(i, 300_000 + i))
    body["response"]["generation_log_probs"] = [-0.1 - k / 7 for k in range(20_000)]
    body["instance_config"] = {"task": "parity", "n": i}
    return body


def files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def remove_the_only_file(directory: Path) -> None:
    (path,) = directory.iterdir()
    path.unlink()


def size_of(body: dict[str, Any]) -> int:
    return len(msgspec.json.encode(body))


async def waiters(server: Server, count: int) -> None:
    """Wait until ``count`` requests wait in the server (spooling runs in a worker thread)."""
    with trio.fail_after(10):
        # Polled: the worker thread that writes the file signals nothing a test can wait on.
        while server.engine.statistics().waiters != count:  # noqa: ASYNC110
            await trio.sleep(0.01)


async def rows(server: Server, bodies: list[dict[str, Any]]) -> list[Reply]:
    return await server.verify_all(bodies)


@pytest.mark.parametrize("judge_rule", ["scored", "masked"])
async def test_spooled_bodies_give_the_same_rows_byte_for_byte(
    tmp_path: Path, judge_rule: str
) -> None:
    rules = [] if judge_rule == "scored" else [{"action": "http_status", "status": 400}]
    bodies = [big_member(0), big_member(1)]
    async with running_server(judge=FakeJudge(rules=rules), waiting_body_memory_bytes=None) as s:
        expected = await rows(s, bodies)
    async with running_server(
        judge=FakeJudge(rules=rules), waiting_body_memory_bytes=0, spool_dir=str(tmp_path)
    ) as server:
        got = await rows(server, bodies)
        assert files(tmp_path) == []
    assert [r.status for r in got] == [200, 200]
    assert [r.masked for r in got] == [judge_rule == "masked"] * 2
    assert [r.raw for r in got] == [r.raw for r in expected]


async def test_only_bodies_beyond_the_budget_wait_in_files_and_each_goes_with_its_reply(
    tmp_path: Path,
) -> None:
    first, second = big_member(0), big_member(1)
    size = size_of(first)
    async with (
        running_server(
            judge=FakeJudge(latency="fixed:0.2"),
            waiting_body_memory_bytes=size,
            spool_dir=str(tmp_path),
        ) as server,
        trio.open_nursery() as nursery,
    ):
        in_memory = server.start_verify(nursery, first)
        await waiters(server, 1)
        assert files(tmp_path) == []
        # Beyond the budget: a different body is spooled, then rejected, and its file goes.
        rejected = await server.verify(big_member(0, q=4))
        assert rejected.status == 409
        assert files(tmp_path) == []
        spooled = server.start_verify(nursery, first)  # the same body again: it waits in a file
        await waiters(server, 2)
        assert len(files(tmp_path)) == 1
        assert server.app.spool_budget.in_memory == size
        last = await server.verify(second)
        assert last.status == 200
        replies = [await in_memory.result(), await spooled.result()]
        assert replies[0].raw == replies[1].raw
        assert files(tmp_path) == []
        assert server.app.spool_budget.in_memory == 0


async def test_a_cancelled_waiting_request_removes_its_file(tmp_path: Path) -> None:
    async with running_server(waiting_body_memory_bytes=0, spool_dir=str(tmp_path)) as server:
        async with trio.open_nursery() as nursery:
            pending = server.start_verify(nursery, big_member(0))
            await waiters(server, 1)
            assert len(files(tmp_path)) == 1
            pending.disconnect()
        assert files(tmp_path) == []
        # The member stays (C-51): its retry and slot 1 complete the group.
        replies = await rows(server, [big_member(0), big_member(1)])
        assert [r.status for r in replies] == [200, 200]
        assert files(tmp_path) == []


async def test_a_finished_spooled_group_still_knows_a_respelled_replay(tmp_path: Path) -> None:
    async with running_server(waiting_body_memory_bytes=0, spool_dir=str(tmp_path)) as server:
        replies = await rows(server, [member(0), member(1)])
        calls = server.calls()
        respelled = member(0)
        respelled["response"] = dict(reversed(list(respelled["response"].items())))
        replay = await server.verify(respelled)
        assert (replay.status, replay.reward) == (200, replies[0].reward)
        assert (await server.verify(member(0, regenerated=True))).status == 409
        assert server.calls() == calls


async def test_a_full_disk_is_a_503_naming_the_cause_and_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_write = os.write

    def full(fd: int, data: Any) -> int:
        # Spool files take 1000 bytes and then report a full disk; other writes are untouched.
        if not os.readlink(f"/proc/self/fd/{fd}").startswith(str(tmp_path)):
            return real_write(fd, data)
        if os.fstat(fd).st_size >= 1000:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data[:1000])

    async with running_server(waiting_body_memory_bytes=0, spool_dir=str(tmp_path)) as server:
        monkeypatch.setattr(spool_module.os, "write", full)
        reply = await server.verify(big_member(0))
        assert reply.status == 503
        assert "No space left on device" in reply.detail
        assert "waiting_body_memory_bytes" in reply.detail and str(tmp_path) in reply.detail
        assert files(tmp_path) == []  # the half-written file is gone
        stats = server.engine.statistics()
        assert (stats.active_groups, stats.waiters, server.calls()) == (0, 0, 0)
        monkeypatch.undo()
        replies = await rows(server, [big_member(0), big_member(1)])
        assert [r.status for r in replies] == [200, 200]


async def test_an_unusable_spool_directory_is_a_503_only_beyond_the_budget(
    tmp_path: Path,
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    target = blocker / "spool"
    budget = size_of(big_member(0)) + 1000
    async with running_server(waiting_body_memory_bytes=budget, spool_dir=str(target)) as server:
        within = await rows(server, [member(0, g="small"), member(1, g="small")])
        assert [r.status for r in within] == [200, 200]
        async with trio.open_nursery() as nursery:
            first = server.start_verify(nursery, big_member(0))
            await waiters(server, 1)
            beyond = await server.verify(big_member(1))
            assert beyond.status == 503
            assert "Not a directory" in beyond.detail and str(target) in beyond.detail
            assert server.engine.statistics().waiters == 1
            first.disconnect()


async def test_shutdown_removes_waiting_files_and_a_new_start_removes_a_crashed_servers(
    tmp_path: Path,
) -> None:
    dead = tmp_path / "genrm-trio-999999999-3.body"  # no such process
    dead.write_bytes(b"left by a crashed server")
    alive = tmp_path / f"genrm-trio-{os.getppid()}-3.body"  # a running process's
    alive.write_bytes(b"not ours to remove")
    unrelated = tmp_path / "notes.txt"
    unrelated.write_text("kept")
    async with running_server(waiting_body_memory_bytes=0, spool_dir=str(tmp_path)) as server:
        assert files(tmp_path) == sorted([alive.name, unrelated.name])
        async with trio.open_nursery() as nursery:
            pending = server.start_verify(nursery, big_member(0))
            await waiters(server, 1)
            assert len(files(tmp_path)) == 3
            server.engine.begin_shutdown()
        assert (await pending.result()).status == 503
    assert files(tmp_path) == sorted([alive.name, unrelated.name])


async def test_the_default_spool_directory_is_private_and_removed_at_shutdown() -> None:
    async with running_server(waiting_body_memory_bytes=0) as server:
        directory = server.app.spool.directory
        assert directory is not None
        assert (await trio.Path(directory).stat()).st_mode & 0o777 == 0o700
        async with trio.open_nursery() as nursery:
            pending = server.start_verify(nursery, big_member(0))
            await waiters(server, 1)
            assert len(list(await trio.Path(directory).iterdir())) == 1
            pending.disconnect()
    assert not await trio.Path(directory).exists()


def test_the_budget_admits_bodies_while_they_fit() -> None:
    budget = SpoolBudget(100)
    assert budget.admit(60) and budget.admit(40)
    assert not budget.admit(1)
    budget.release(60)
    assert budget.admit(50) and not budget.admit(11)
    unlimited = SpoolBudget(None)
    assert all(unlimited.admit(1 << 40) for _ in range(3))


async def test_a_spool_file_gone_before_the_reply_is_a_whole_503(tmp_path: Path) -> None:
    async with (
        running_server(waiting_body_memory_bytes=0, spool_dir=str(tmp_path)) as server,
        trio.open_nursery() as nursery,
    ):
        pending = server.start_verify(nursery, big_member(0))
        await waiters(server, 1)
        remove_the_only_file(tmp_path)
        last = await server.verify(big_member(1))
        assert last.status == 200
        reply = await pending.result()
        assert reply.status == 503
        assert "cannot read" in reply.detail and "No such file or directory" in reply.detail
