"""The linters a contributor runs first: ruff and mypy stay clean on the package and the tests."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def run(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_ruff_reports_nothing() -> None:
    paths = [p for p in ("genrm_trio", "tests", "benchmarks") if (ROOT / p).is_dir()]
    result = run(str(BIN / "ruff"), "check", *paths)
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_reports_nothing() -> None:
    result = run(str(BIN / "mypy"), "genrm_trio")
    assert result.returncode == 0, result.stdout + result.stderr
