"""Log line format on stderr (§9.1) and the startup lines (O-1, CF-13).

Every test restores the `genrm_trio` logger so other tests' log capture is unaffected.
"""

from __future__ import annotations

import ast
import json
import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from genrm_trio.config import config_from_mapping
from genrm_trio.logs import LogLineFormatter, configure_logging, startup_lines
from genrm_trio.runtime.hooks import Hooks
from genrm_trio.testing import FakeJudge, pair_rule
from genrm_trio.testing._shared_store import shared_engines
from genrm_trio.testing.harness import member, running_server
from genrm_trio.testing.redis_server import RedisServer
from genrm_trio.testing.scenarios.drivers import engine_outcome as verify

LINE = re.compile(
    r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z (DEBUG|INFO|WARNING|ERROR) genrm_trio (.*)$"
)


@pytest.fixture(autouse=True)
def restore_logger() -> Iterator[None]:
    logger = logging.getLogger("genrm_trio")
    saved = (list(logger.handlers), logger.level, logger.propagate)
    yield
    logger.handlers[:] = saved[0]
    logger.setLevel(saved[1])
    logger.propagate = saved[2]


def stderr_lines(capsys: pytest.CaptureFixture[str]) -> list[str]:
    return capsys.readouterr().err.splitlines()


def test_record_is_one_line_with_time_level_and_name(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("INFO")
    logging.getLogger("genrm_trio.runtime").info("GenRM cohort disposition=completed key='g'")
    lines = stderr_lines(capsys)
    assert len(lines) == 1
    match = LINE.match(lines[0])
    assert match is not None
    assert match.group(1) == "INFO"
    assert match.group(2) == "GenRM cohort disposition=completed key='g'"


def test_timestamp_is_iso_8601_utc_with_milliseconds() -> None:
    record = logging.LogRecord("genrm_trio.judge", logging.WARNING, __file__, 1, "x", None, None)
    record.created = 1704164645.678  # 2024-01-02T03:04:05.678Z
    assert LogLineFormatter().format(record) == "2024-01-02T03:04:05.678Z WARNING genrm_trio x"


def test_configuring_twice_prints_each_record_once(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("INFO")
    configure_logging("INFO")
    logging.getLogger("genrm_trio").warning("once")
    lines = stderr_lines(capsys)
    assert len(lines) == 1
    assert lines[0].endswith(" WARNING genrm_trio once")


def test_level_threshold_applies_and_can_be_changed(capsys: pytest.CaptureFixture[str]) -> None:
    logger = logging.getLogger("genrm_trio.http")
    configure_logging("WARNING")
    logger.info("hidden")
    logger.warning("shown")
    configure_logging("DEBUG")
    logger.debug("now shown")
    lines = stderr_lines(capsys)
    assert [line.split(" genrm_trio ", 1)[1] for line in lines] == ["shown", "now shown"]
    assert all(LINE.match(line) for line in lines)


def test_records_do_not_reach_root_handlers(capsys: pytest.CaptureFixture[str]) -> None:
    seen: list[logging.LogRecord] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record)

    root_handler = Collect()
    logging.getLogger().addHandler(root_handler)
    try:
        configure_logging("INFO")
        logging.getLogger("genrm_trio").info("only once")
    finally:
        logging.getLogger().removeHandler(root_handler)
    assert seen == []
    assert len(stderr_lines(capsys)) == 1


def test_line_breaks_in_a_message_stay_on_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("INFO")
    logging.getLogger("genrm_trio").warning("judge said:\nline two\r\n")
    lines = stderr_lines(capsys)
    assert len(lines) == 1
    assert lines[0].endswith(" genrm_trio judge said:\\nline two\\r\\n")


def test_error_with_traceback_starts_with_a_log_line(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("INFO")
    try:
        raise RuntimeError("evaluation broke")
    except RuntimeError:
        logging.getLogger("genrm_trio.runtime").exception("GenRM evaluation error")
    lines = stderr_lines(capsys)
    match = LINE.match(lines[0])
    assert match is not None
    assert match.groups() == ("ERROR", "GenRM evaluation error")
    assert lines[1] == "Traceback (most recent call last):"
    assert lines[-1] == "RuntimeError: evaluation broke"


def test_unknown_level_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown log level 'info'"):
        configure_logging("info")


def test_startup_summary_line_names_the_judge_without_user_info() -> None:
    config = config_from_mapping(
        {
            "judge_base_url": "https://alice:pw@judge.example:8443/v1/",
            "judge_model": "genrm-7b",
            "judge_api": "responses",
            "num_rollouts_per_prompt": 8,
            "comparison_strategy": "all_pairs",
            "num_judges_per_comparison": 2,
        }
    )
    summary = startup_lines(config)[0]
    assert summary == (
        "genrm-trio serving judge_api=responses judge=https://judge.example:8443/v1 "
        "model=genrm-7b N=8 strategy=all_pairs passes=2"
    )


def test_startup_effective_configuration_has_no_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GENRM_JUDGE_API_KEY", raising=False)
    config = config_from_mapping(
        {
            "judge_base_url": "http://judge:8000/v1",
            "judge_model": "genrm",
            "judge_api_key": "sk-very-secret",
        }
    )
    lines = startup_lines(config)
    assert len(lines) == 2
    assert all("sk-very-secret" not in line for line in lines)
    prefix = "effective configuration: "
    assert lines[1].startswith(prefix)
    effective = json.loads(lines[1][len(prefix) :])
    assert effective["judge_api_key"] == "<set>"
    assert effective["num_rollouts_per_prompt"] == 16
    assert effective["cohort_result_ttl_s"] == 3600.0
    assert "\n" not in lines[1]


async def test_json_lines_carry_group_key_attempt_slot_and_pair_as_fields(
    capsys: pytest.CaptureFixture[str],
) -> None:
    configure_logging("INFO", "json")
    judge = FakeJudge(rules=[pair_rule(0, 1, "http_status", status=500)])
    settings = {"num_rollouts_per_prompt": 3, "genrm_parse_retries": 1}
    async with running_server(settings, judge=judge) as server:
        replies = await server.complete("g", 0)
    assert [reply.masked for reply in replies] == [True, True, False]
    records = [json.loads(line) for line in stderr_lines(capsys)]
    assert all(set(r) >= {"time", "level", "logger", "message"} for r in records)
    assert all(LINE.match(f"{r['time']} {r['level']} genrm_trio x") for r in records)
    key = "group_id::g::group_attempt::0"
    retry = next(r for r in records if r["message"].startswith("GenRM judge retry"))
    assert retry["level"] == "INFO"
    assert {k: retry[k] for k in ("group_key", "pair", "judge_pass", "attempt", "replica")} == {
        "group_key": key,
        "pair": [0, 1],
        "judge_pass": 0,
        "attempt": 1,
        "replica": "http://fake-judge/v1",
    }
    dropped = [r for r in records if r["message"].startswith("GenRM dropped comparison")]
    assert [(r["pair"], r["group_key"], r["group_attempt"]) for r in dropped] == [([0, 1], key, 0)]
    masked = [r for r in records if r["message"].startswith("GenRM masked one rollout")]
    assert sorted(r["slot"] for r in masked) == [0, 1]
    disposition = next(r for r in records if "disposition=completed" in r["message"])
    assert (disposition["group_key"], disposition["group_attempt"]) == (key, 0)
    assert disposition["level"] == "WARNING"


# Every record about one group attempt that a judged group can produce, by its message.
GROUP_SCOPED = (
    "GenRM judge retry pair",
    "GenRM output budget exhausted for pair",
    "GenRM judge reply unparseable for pair",
    "GenRM dropped comparison",
    "GenRM masked one rollout",
    "GenRM cohort disposition=",
)


async def test_every_record_about_a_group_names_its_key_and_attempt(
    capsys: pytest.CaptureFixture[str],
) -> None:
    configure_logging("DEBUG", "json")
    judge = FakeJudge(
        rules=[
            pair_rule(0, 1, "http_status", status=500),  # retried, then dropped: two masked
            pair_rule(1, 2, "budget_exhausted", times=1),  # retried once, then a verdict
            pair_rule(2, 0, "text", text="no verdict here"),  # the default verdict
        ]
    )
    settings = {"num_rollouts_per_prompt": 3, "genrm_parse_retries": 1, "debug_logging": True}
    async with running_server(settings, judge=judge) as server:
        await server.complete("g", 3)
    records = [json.loads(line) for line in stderr_lines(capsys)]
    about_group = [r for r in records if r["message"].startswith(GROUP_SCOPED)]
    seen = {
        prefix for prefix in GROUP_SCOPED for r in about_group if r["message"].startswith(prefix)
    }
    assert seen == set(GROUP_SCOPED)  # the workload produced every kind
    key = "group_id::g::group_attempt::3"
    assert [(r["group_key"], r["group_attempt"]) for r in about_group] == [(key, 3)] * len(
        about_group
    )
    # Whatever else was logged about the group carries both fields too.
    keyed = [r for r in records if "group_key" in r or "group_attempt" in r]
    assert all((r["group_key"], r["group_attempt"]) == (key, 3) for r in keyed)


async def test_a_takeover_names_the_group_key_and_attempt(
    capsys: pytest.CaptureFixture[str], shared_redis_server: RedisServer
) -> None:
    configure_logging("INFO", "json")
    judging = trio.Event()

    async def hang(*_: Any) -> None:
        judging.set()
        await trio.sleep_forever()

    async with shared_engines(
        shared_redis_server.url, hooks=[Hooks(on_comparison_start=hang), None], lease_s=0.3
    ) as (a, b):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(verify, b, member(0, 4, "owned", 2))
            # Stored and waiting at b before the last member reaches a, which then owns the group.
            while b.statistics().waiters != 1 or b.queued:  # noqa: ASYNC110
                await trio.sleep(0.01)
            nursery.start_soon(verify, a, member(1, 2, "owned", 2))
            await judging.wait()
            await a.shutdown()  # the owner goes away mid-evaluation; b takes the group over
            while b.published == 0:  # noqa: ASYNC110
                await trio.sleep(0.01)
            nursery.cancel_scope.cancel()
    records = [json.loads(line) for line in stderr_lines(capsys)]
    [takeover] = [r for r in records if r["message"].startswith("GenRM took over")]
    assert takeover["level"] == "WARNING"
    key = "group_id::owned::group_attempt::2"
    assert (takeover["group_key"], takeover["group_attempt"]) == (key, 2)


PACKAGE = Path(__file__).resolve().parent.parent / "genrm_trio"
RUNNING_MD = PACKAGE.parent / "docs" / "running.md"
LOG_METHODS = {"debug", "info", "warning", "error", "exception", "log", "_log"}
PLACEHOLDER = re.compile(r"%[-#0 +]*\d*(?:\.\d+)?[sdrfi%]")


def logged_texts() -> list[tuple[str, list[str]]]:
    """(where, the first literal words of its message) for every log call of the server whose
    message is written out in the call (a %-format or an f-string)."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        # The fakes and the test harness, and the client library, which logs in the trainer's
        # process.
        if {"fakes", "testing", "client"} & set(path.parts):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in LOG_METHODS
                and isinstance(node.func.value, ast.Name | ast.Attribute)
                and ast.unparse(node.func.value) in {"log", "logger", "self"}
            ):
                continue
            args = node.args[1:] if node.func.attr in {"log", "_log"} else node.args
            if not args:
                continue
            message = args[0]
            if isinstance(message, ast.Constant) and isinstance(message.value, str):
                parts = PLACEHOLDER.split(message.value)
            elif isinstance(message, ast.JoinedStr):
                parts = [
                    v.value
                    for v in message.values
                    if isinstance(v, ast.Constant) and isinstance(v.value, str)
                ]
            else:
                continue  # a text built elsewhere (core/messages.py, judge/_attempts.py)
            where = f"{path.relative_to(PACKAGE.parent)}:{node.lineno}"
            # The table shows how each message starts: its first words of any length.
            found.append((where, [part for part in parts if len(part.strip()) >= 6][:1]))
    return found


def test_the_log_table_in_running_md_names_every_record_the_server_writes() -> None:
    table = RUNNING_MD.read_text(encoding="utf-8").split("## Log lines", 1)[1]
    calls = logged_texts()
    assert len(calls) > 40  # the scan found the server's log calls
    missing = [
        f"{where}: {part!r}" for where, parts in calls for part in parts if part not in table
    ]
    assert missing == []


def test_unknown_log_format_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown log format 'xml'"):
        configure_logging("INFO", "xml")
