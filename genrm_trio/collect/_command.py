"""`genrm-trio collect`: flags, preparing the files of a fresh or resumed run, the run, and the
metrics file (X-5).

Prints one summary line on stdout, also when SIGINT or SIGTERM stops the run. Exit 0 when every
task's group is complete, 1 when a task line was bad or a group is still incomplete (rerun with
--resume), 2 for a usage error or a server that cannot take the run (a group size other than
--repeats, or not ready to judge), 128 + the signal's number after SIGINT (130) or SIGTERM (143).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import msgspec
import trio

from genrm_trio.client import GenRMClient, ServerNotReady
from genrm_trio.collect._policy import API_KEY_ENV, PolicyClient
from genrm_trio.collect._preflight import GROUP_SIZE_FIELD, group_size_refusal
from genrm_trio.collect._progress import Progress
from genrm_trio.collect._resend import Backoff
from genrm_trio.collect._resume import GroupPlan, final_rows, plan_resume
from genrm_trio.collect._rows import (
    GROUP_ATTEMPT,
    GROUP_ID,
    TASK_INDEX,
    StoredRow,
    Task,
    attempts_path,
    bookkeeping,
    encode_line,
    failures_path,
    metrics_path,
    read_rows,
    read_tasks,
)
from genrm_trio.collect._runner import Clients, GroupRunner, RunCounts, Sinks, prometheus_total
from genrm_trio.core.run_metrics import summarize_rows

EXIT_OK = 0
EXIT_INCOMPLETE = 1
EXIT_USAGE = 2
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
JUDGE_ATTEMPTS_SERIES = "genrm_judge_attempts_total"
HEALTH_ATTEMPTS_FIELD = "judge_attempts_total"


class UsageError(Exception):
    """The run cannot start as asked; the message says why."""


@dataclass(slots=True)
class Prepared:
    plans: list[GroupPlan]
    complete: int
    dropped: int
    # A fresh run's journal header, written once the server and the policy are ready.
    header: bytes = b""


def _new_run(tasks: Sequence[Task], repeats: int, source: Path) -> Prepared:
    run_id = uuid.uuid4().hex[:12]
    header = {"run_id": run_id, "repeats": repeats, "input": str(source)}
    plans = [GroupPlan(t, f"{run_id}-{t.index}", 0) for t in tasks]
    return Prepared(plans, 0, 0, encode_line(header))


def _read(path: Path, name: str, *, whole: bool = False) -> tuple[bytes, list[StoredRow], int]:
    """A file's bytes, its rows (only their bookkeeping part unless `whole`) and the length of
    its complete lines."""
    data = path.read_bytes() if path.exists() else b""
    rows, good = read_rows(data, name, None if whole else bookkeeping)
    return data, rows, good


def _rewrite(path: Path, data: bytes, good: int, drop: set[int]) -> None:
    """Keep the complete lines of `path` whose numbers are not in `drop` (atomic replace)."""
    if good == len(data) and not drop:
        return
    lines = data[:good].split(b"\n")[:-1]
    kept = b"".join(line + b"\n" for n, line in enumerate(lines, start=1) if n not in drop)
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_bytes(kept)
    os.replace(temporary, path)


def prepare(
    output: Path, tasks: Sequence[Task], repeats: int, resume: bool, source: Path
) -> Prepared:
    """Plans of a fresh run, or of a resumed one after the files are cut back to whole groups."""
    journal = attempts_path(output)
    files = [output, failures_path(output), journal]
    existing = [p for p in files if p.exists() and p.stat().st_size > 0]
    if not resume or not journal.exists():
        if existing:
            hint = (
                "pass --resume to continue that run, or choose another --output"
                if not resume
                else f"it has no {journal.name}, so it was not written by genrm-trio collect"
            )
            raise UsageError(f"{existing[0]} already exists; {hint}")
        return _new_run(tasks, repeats, source)
    journal_data, journal_rows, journal_good = _read(journal, journal.name, whole=True)
    if not journal_rows or "run_id" not in journal_rows[0].row:
        raise UsageError(f"{journal} does not start with a run header; cannot resume")
    header = journal_rows[0].row
    if header.get("repeats") != repeats:
        raise UsageError(
            f"{output} was collected with --repeats {header.get('repeats')}; "
            f"resume with the same value (got {repeats})"
        )
    entries = [
        (r.row[TASK_INDEX], r.row[GROUP_ID], r.row[GROUP_ATTEMPT])
        for r in journal_rows[1:]
        if {TASK_INDEX, GROUP_ID, GROUP_ATTEMPT} <= r.row.keys()
    ]
    out_data, out_rows, out_good = _read(output, "output")
    fail_data, fail_rows, fail_good = _read(failures_path(output), "failures")
    run_id = header["run_id"]
    plan = plan_resume(
        tasks, repeats, [*out_rows, *fail_rows], entries, lambda t: f"{run_id}-{t.index}"
    )
    for path, data, good, name in (
        (output, out_data, out_good, "output"),
        (failures_path(output), fail_data, fail_good, "failures"),
    ):
        drop = {stored.line for stored in plan.dropped if stored.file == name}
        if path.exists():
            _rewrite(path, data, good, drop)
    _rewrite(journal, journal_data, journal_good, set())
    return Prepared(plan.todo, len(plan.complete), len(plan.dropped))


@dataclass(slots=True)
class Interruption:
    """The signal that stopped the run, once one has."""

    signal: int | None = None


@asynccontextmanager
async def _stoppable() -> AsyncIterator[Interruption]:
    """A block that the first SIGINT or SIGTERM cancels; what was written stays written (each
    group's rows go out in one append), and the caller goes on to its summary."""
    interruption = Interruption()
    with trio.open_signal_receiver(*STOP_SIGNALS) as signals:
        async with trio.open_nursery() as nursery:

            async def watch() -> None:
                async for received in signals:
                    interruption.signal = received
                    nursery.cancel_scope.cancel()
                    return

            nursery.start_soon(watch)
            yield interruption
            nursery.cancel_scope.cancel()


class NotReady(Exception):
    """The server or the policy did not answer in time; the message says which."""


class Refused(Exception):
    """The server cannot take this run as asked (exit 2): a group size that is not --repeats, or
    a server that is not ready to judge; the message says why."""


async def _wait_for(
    client: httpx.AsyncClient, name: str, url: str, ready: Callable[[int], bool], wait_s: float
) -> httpx.Response:
    """The first answer from ``url`` that ``ready`` accepts, asked every quarter second for at
    most ``wait_s`` seconds."""
    last = "no answer"
    with trio.move_on_after(max(0.0, wait_s)):
        while True:
            try:
                with trio.move_on_after(5):
                    reply = await client.get(url)
                    if ready(reply.status_code):
                        return reply
                    last = f"status {reply.status_code}"
            except httpx.HTTPError as error:
                last = type(error).__name__
            await trio.sleep(0.25)
    raise NotReady(f"the {name} at {url} was not ready in {wait_s}s: {last}")


def _json(reply: httpx.Response) -> object:
    try:
        return reply.json()
    except ValueError:
        return None


async def _wait_ready(args: argparse.Namespace) -> None:
    """Wait until the server's /healthz answers 200 and the policy answers at all (services
    started together come up in any order), then check the server before anything is sent: its
    group size must be --repeats, and its /readyz must say ready within --wait-ready."""
    server = args.server_url.rstrip("/")
    async with httpx.AsyncClient(trust_env=False) as client:
        health = await _wait_for(
            client, "server", f"{server}/healthz", lambda status: status == 200, args.wait_ready
        )
        body = _json(health)
        refusal = group_size_refusal(body, args.repeats, server)
        if refusal is not None:
            raise Refused(refusal)
        if not isinstance(body, dict) or GROUP_SIZE_FIELD not in body:
            print(
                f"genrm-trio collect: the server at {server} does not report its group size;"
                f" --repeats {args.repeats} is not checked",
                file=sys.stderr,
            )
        await _wait_for(
            client,
            "policy",
            f"{args.policy_url.rstrip('/')}/models",
            lambda status: status < 500,
            args.wait_ready,
        )
        genrm = GenRMClient(server, http=client, ready_wait_s=max(0.0, args.wait_ready))
        try:
            await genrm.wait_ready()
        except ServerNotReady as error:
            raise Refused(str(error)) from None


@dataclass(slots=True)
class Startup:
    """How the wait for the services ended: why they were not ready (exit 1), why the server
    cannot take the run (exit 2), or the signal that stopped the wait."""

    not_ready: str | None = None
    refused: str | None = None
    signal: int | None = None


async def _ready(args: argparse.Namespace) -> Startup:
    """Wait for the services and check the server."""
    startup = Startup()
    async with _stoppable() as interruption:
        try:
            await _wait_ready(args)
        except NotReady as error:
            startup.not_ready = str(error)
        except Refused as error:
            startup.refused = str(error)
    startup.signal = interruption.signal
    return startup


async def _judge_attempts(client: httpx.AsyncClient) -> float | None:
    """Judge attempts the server has counted: Prometheus `/metrics` (X-6), else `/healthz`."""
    try:
        with trio.move_on_after(10):
            reply = await client.get("/metrics")
            if reply.status_code == 200:
                total = prometheus_total(reply.text, JUDGE_ATTEMPTS_SERIES)
                if total is not None:
                    return total
            health = await client.get("/healthz")
            if health.status_code in (200, 503):
                value = health.json().get(HEALTH_ATTEMPTS_FIELD)
                if isinstance(value, int) and not isinstance(value, bool):
                    return float(value)
    except (httpx.HTTPError, ValueError, AttributeError):
        pass
    return None


@dataclass(slots=True)
class RunResult:
    counts: RunCounts
    judge_calls: float | None
    interruption: Interruption = field(default_factory=Interruption)


async def _collect(args: argparse.Namespace, prepared: Prepared, total: int) -> RunResult:
    @asynccontextmanager
    async def connect() -> AsyncIterator[Clients]:
        # A group's N members each wait on their own connection for the group's rewards.
        limits = httpx.Limits(max_connections=args.repeats, max_keepalive_connections=args.repeats)
        async with (
            httpx.AsyncClient(timeout=None, trust_env=False, limits=limits) as policy_http,
            httpx.AsyncClient(
                base_url=args.server_url, timeout=None, trust_env=False, limits=limits
            ) as server_http,
        ):
            policy = PolicyClient(
                policy_http,
                args.policy_url,
                api=args.policy_api,
                model=args.policy_model,
                api_key=os.environ.get(API_KEY_ENV) or None,
                retries=max(0, args.policy_retries),
                timeout_s=args.policy_timeout,
            )
            yield Clients(policy, server_http)

    output: Path = args.output
    before = after = None
    async with httpx.AsyncClient(base_url=args.server_url, trust_env=False) as probe:
        with (
            output.open("ab") as out_file,
            failures_path(output).open("ab") as fail_file,
            attempts_path(output).open("ab") as journal_file,
            Progress(total, prepared.complete) as progress,
        ):
            runner = GroupRunner(
                connect=connect,
                size=args.repeats,
                sinks=Sinks(out_file, fail_file, journal_file),
                verify_timeout_s=args.verify_timeout,
                backoff=Backoff(resends=args.verify_retries),
                on_group=progress.update,
            )
            async with _stoppable() as interruption:
                before = await _judge_attempts(probe)
                await runner.run_all(prepared.plans, args.concurrency)
                after = await _judge_attempts(probe)
    calls = after - before if after is not None and before is not None else None
    return RunResult(runner.counts, calls, interruption)


def _metrics(
    args: argparse.Namespace,
    tasks: Sequence[Task],
    bad_lines: int,
    result: RunResult,
    wall_time_s: float,
) -> dict[str, Any]:
    output: Path = args.output
    _, out_rows, _ = _read(output, "output")
    _, fail_rows, _ = _read(failures_path(output), "failures")
    final, earlier, complete = final_rows(tasks, args.repeats, [*out_rows, *fail_rows])
    zero = list(args.count_failure_classes_as_zero)
    summary = msgspec.to_builtins(summarize_rows(final, zero))
    earlier_classes = summarize_rows(earlier).failures_by_class
    counts = result.counts
    return {
        "tasks": len(tasks),
        "repeats": args.repeats,
        "groups_complete": complete,
        "groups_incomplete": len(tasks) - complete,
        "bad_input_lines": bad_lines,
        **summary,
        "count_failure_classes_as_zero": zero,
        "earlier_attempt_failures_by_class": earlier_classes,
        "this_run": {
            "resumed": bool(args.resume),
            "group_attempts": counts.groups_done,
            "group_attempts_sent": counts.attempts_sent,
            "verify_resends": counts.resends,
            "rollouts": counts.rollouts,
            "judge_calls": result.judge_calls,
            "wall_time_s": round(wall_time_s, 3),
            "rollouts_per_minute": round(60.0 * counts.rollouts / wall_time_s, 1)
            if wall_time_s > 0
            else 0.0,
        },
    }


def run(args: argparse.Namespace) -> int:
    """Run `collect` with parsed flags; return the exit status."""
    started = time.monotonic()
    try:
        text = args.input.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        print(f"genrm-trio collect: error: cannot read {args.input}: {error}", file=sys.stderr)
        return EXIT_USAGE
    tasks, errors = read_tasks(text.splitlines(), str(args.input))
    for bad_line in errors:
        print(f"genrm-trio collect: skipped {bad_line}", file=sys.stderr)
    try:
        prepared = prepare(args.output, tasks, args.repeats, args.resume, args.input)
    except (UsageError, ValueError, OSError) as error:
        print(f"genrm-trio collect: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    startup = trio.run(_ready, args)
    if startup.signal is not None:
        name = signal.Signals(startup.signal).name
        print(f"genrm-trio collect: {name} before the run began; nothing sent", file=sys.stderr)
        return 128 + startup.signal
    if startup.refused is not None:
        print(f"genrm-trio collect: error: {startup.refused}; nothing sent", file=sys.stderr)
        return EXIT_USAGE
    if startup.not_ready is not None:
        print(f"genrm-trio collect: error: {startup.not_ready}", file=sys.stderr)
        return EXIT_INCOMPLETE
    if prepared.header:
        attempts_path(args.output).write_bytes(prepared.header)
    if prepared.dropped:
        print(
            f"genrm-trio collect: dropped {prepared.dropped} rows of group attempts that were "
            "cut off; those groups are redone",
            file=sys.stderr,
        )
    result = trio.run(_collect, args, prepared, len(tasks))
    metrics = _metrics(args, tasks, len(errors), result, time.monotonic() - started)
    target = metrics_path(args.output)
    temporary = target.with_name(target.name + ".tmp")
    temporary.write_text(json.dumps(metrics, indent=2) + "\n", encoding="utf-8")
    os.replace(temporary, target)
    mean = metrics["reward_mean"]
    shown_mean = "n/a" if mean is None else f"{mean:.4f}"
    print(
        f"collected {metrics['groups_complete']}/{len(tasks)} groups: {metrics['scored']} scored,"
        f" {metrics['failed']} masked or failed, reward mean {shown_mean};"
        f" rows in {args.output}, failures in {failures_path(args.output)},"
        f" metrics in {target}",
        flush=True,
    )
    stopped = result.interruption.signal
    if stopped is not None:
        # Every finished group is already on disk; the ones in flight are redone on resume.
        name = signal.Signals(stopped).name
        print(
            f"genrm-trio collect: interrupted ({name}); rerun with --resume to finish",
            file=sys.stderr,
        )
        return 128 + stopped
    if errors or metrics["groups_incomplete"]:
        if metrics["groups_incomplete"]:
            print(
                f"genrm-trio collect: {metrics['groups_incomplete']} group(s) incomplete;"
                " rerun with --resume to redo them",
                file=sys.stderr,
            )
        return EXIT_INCOMPLETE
    return EXIT_OK
