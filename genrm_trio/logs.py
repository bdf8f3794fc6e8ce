"""Logging setup: one-line records on stderr, `<ISO-8601 time> <LEVEL> genrm_trio <message>`.

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


class LogLineFormatter(logging.Formatter):
    """Formats a record as one line; a traceback, when attached, follows on the next lines."""

    def format(self, record: logging.LogRecord) -> str:
        moment = datetime.datetime.fromtimestamp(record.created, tz=datetime.UTC)
        stamp = moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")
        # Messages carry judge texts and client-supplied keys; escaping line breaks keeps
        # one record on one line so log scrapers never mistake a fragment for a record.
        message = record.getMessage().replace("\r", "\\r").replace("\n", "\\n")
        line = f"{stamp} {record.levelname} {LOGGER_NAME} {message}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        if record.stack_info:
            line += "\n" + self.formatStack(record.stack_info)
        return line


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


def configure_logging(level: str) -> None:
    """Send the `genrm_trio` logger tree to stderr at `level`; calling again only updates it.

    The logger stops propagating so a root handler (hypercorn's, a test runner's) does not
    print every record a second time.
    """
    if level not in LEVELS:
        raise ValueError(f"unknown log level {level!r}; expected one of {', '.join(LEVELS)}")
    logger = logging.getLogger(LOGGER_NAME)
    handler = next((h for h in logger.handlers if isinstance(h, _StderrHandler)), None)
    if handler is None:
        handler = _StderrHandler()
        handler.setFormatter(LogLineFormatter())
        logger.addHandler(handler)
    logger.setLevel(LEVELS[level])
    logger.propagate = False


def startup_lines(config: Config) -> list[str]:
    """The INFO lines logged once at startup: the O-1 summary, then the effective configuration."""
    summary = (
        f"genrm-trio serving judge_api={config.judge_api} "
        f"judge={url_without_userinfo(config.judge_base_url)} model={config.judge_model} "
        f"N={config.num_rollouts_per_prompt} strategy={config.comparison_strategy} "
        f"passes={config.num_judges_per_comparison}"
    )
    effective = json.dumps(public_view(config), ensure_ascii=False)
    return [summary, f"effective configuration: {effective}"]
