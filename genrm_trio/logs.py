"""Logging setup: one-line records on stderr, `<ISO-8601 time> <LEVEL> genrm_trio <message>`, or
with `log_format: json` one JSON object per line that also carries the record's fields (group
key, attempt, slot, pair, judge pass, replica) as keys of their own (X-6).

Also builds the startup lines (O-1, CF-13) from the effective configuration.
"""

from __future__ import annotations

import datetime
import json
import logging
import sys

from genrm_trio.config import Config, public_view, url_without_userinfo

LOGGER_NAME = "genrm_trio"
LEVELS = {
    "DEBUG": logging.DEBUG,
    "INFO": logging.INFO,
    "WARNING": logging.WARNING,
    "ERROR": logging.ERROR,
}


# Fields a record may carry (``extra=``), written as keys of their own in JSON lines.
# ``attempt`` is a judge attempt of a comparison, ``group_attempt`` the group's _ng_group_attempt.
LOG_FIELDS = ("group_key", "group_attempt", "slot", "pair", "judge_pass", "attempt", "replica")


# The index of this process among `serve --workers N`'s workers, or None in a single process.
_worker: int | None = None


def set_worker(index: int | None) -> None:
    """Tag every later log line with the worker that wrote it (`serve --workers N`)."""
    global _worker
    _worker = index


def _stamp(record: logging.LogRecord) -> str:
    moment = datetime.datetime.fromtimestamp(record.created, tz=datetime.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


class LogLineFormatter(logging.Formatter):
    """Formats a record as one line; a traceback, when attached, follows on the next lines."""

    def format(self, record: logging.LogRecord) -> str:
        stamp = _stamp(record)
        # Messages carry judge texts and client-supplied keys; escaping line breaks keeps
        # one record on one line so log scrapers never mistake a fragment for a record.
        message = record.getMessage().replace("\r", "\\r").replace("\n", "\\n")
        if _worker is not None:
            message = f"[worker {_worker}] {message}"
        line = f"{stamp} {record.levelname} {LOGGER_NAME} {message}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        if record.stack_info:
            line += "\n" + self.formatStack(record.stack_info)
        return line


class JsonLineFormatter(logging.Formatter):
    """Formats a record as one JSON object on one line: ``time``, ``level``, ``logger``,
    ``message``, the fields of LOG_FIELDS the record carries, and ``exception`` (the traceback
    text) when one is attached."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "time": _stamp(record),
            "level": record.levelname,
            "logger": LOGGER_NAME,
            "message": record.getMessage(),
        }
        if _worker is not None:
            line["worker"] = _worker
        for name in LOG_FIELDS:
            value = record.__dict__.get(name)
            if value is not None:
                line[name] = value
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        # json.dumps escapes line breaks inside strings, so a record stays on one line.
        return json.dumps(line, ensure_ascii=False, default=str)


FORMATTERS: dict[str, type[logging.Formatter]] = {
    "text": LogLineFormatter,
    "json": JsonLineFormatter,
}


class _StderrHandler(logging.Handler):
    """Writes to whatever `sys.stderr` is at emit time, so redirected stderr is honoured."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = self.format(record)
            stream = sys.stderr
            stream.write(text + "\n")
            stream.flush()
        except Exception:
            self.handleError(record)


def configure_logging(level: str, log_format: str = "text") -> None:
    """Send the `genrm_trio` logger tree to stderr at `level`, as text lines or JSON lines
    (`log_format`); calling again only updates them.

    The logger stops propagating so a root handler (hypercorn's, a test runner's) does not
    print every record a second time.
    """
    if level not in LEVELS:
        raise ValueError(f"unknown log level {level!r}; expected one of {', '.join(LEVELS)}")
    if log_format not in FORMATTERS:
        raise ValueError(f"unknown log format {log_format!r}; expected one of text, json")
    logger = logging.getLogger(LOGGER_NAME)
    handler = next((h for h in logger.handlers if isinstance(h, _StderrHandler)), None)
    if handler is None:
        handler = _StderrHandler()
        logger.addHandler(handler)
    handler.setFormatter(FORMATTERS[log_format]())
    logger.setLevel(LEVELS[level])
    logger.propagate = False


def startup_lines(config: Config) -> list[str]:
    """The INFO lines logged once at startup: the O-1 summary, then the effective configuration."""
    judges = config.judge_base_urls or (config.judge_base_url,)
    summary = (
        f"genrm-trio serving judge_api={config.judge_api} "
        f"judge={','.join(url_without_userinfo(url) for url in judges)} "
        f"model={config.judge_model} "
        f"N={config.num_rollouts_per_prompt} strategy={config.comparison_strategy} "
        f"passes={config.num_judges_per_comparison}"
    )
    effective = json.dumps(public_view(config), ensure_ascii=False)
    return [summary, f"effective configuration: {effective}"]
