"""A trainer's process that imports the client loads none of the server: no quart, no hypercorn,
no engine, no judge client, no group store, no test harness, and no TRL for the TRL reward
function. Each import runs in a fresh interpreter, so nothing an earlier test loaded counts."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

# Top-level packages and genrm_trio subpackages that only the server (or its tests) needs.
SERVER_MODULES = (
    "quart",
    "quart_trio",
    "hypercorn",
    "werkzeug",
    "prometheus_client",
    "trl",
    "genrm_trio.http",
    "genrm_trio.runtime",
    "genrm_trio.store",
    "genrm_trio.judge",
    "genrm_trio.testing",
    "genrm_trio.fakes",
)


def modules_after(statement: str) -> list[str]:
    """The names in sys.modules of a fresh interpreter after it ran ``statement``."""
    script = f"{statement}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    loaded: list[str] = json.loads(result.stdout)
    return loaded


def server_modules_in(loaded: list[str]) -> list[str]:
    return [
        name
        for name in loaded
        if any(name == root or name.startswith(root + ".") for root in SERVER_MODULES)
    ]


@pytest.mark.parametrize(
    "statement",
    [
        "import genrm_trio.client",
        "from genrm_trio.client import BlockingGenRMClient, GenRMClient, ResendPolicy",
        "from genrm_trio.client.trl import GenRMRewardFunction",
    ],
)
def test_importing_the_client_loads_no_server_code(statement: str) -> None:
    loaded = modules_after(statement)
    assert "genrm_trio.client" in loaded
    assert server_modules_in(loaded) == []


def test_the_server_face_still_loads_the_server_when_asked_for() -> None:
    loaded = modules_after("from genrm_trio import create_app, fingerprint")
    assert "genrm_trio.http.app" in loaded and "quart_trio" in loaded
