"""The linters a contributor runs first (ruff and mypy stay clean on the package and the tests),
and the size limits that keep a class or the engine module to one job."""

from __future__ import annotations

import ast
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


# A class or a module past these sizes does several jobs; split it before it grows further.
LARGEST_CLASS_LINES = 450
ENGINE_MODULE_LINES = 600


def test_no_class_grows_past_its_limit() -> None:
    sizes = []
    for path in sorted((ROOT / "genrm_trio").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                end = node.end_lineno or node.lineno
                sizes.append((end - node.lineno + 1, f"{path.relative_to(ROOT)}:{node.name}"))
    too_large = [(size, name) for size, name in sizes if size > LARGEST_CLASS_LINES]
    assert not too_large, f"classes over {LARGEST_CLASS_LINES} lines: {too_large}"


def test_the_engine_module_stays_small() -> None:
    lines = len((ROOT / "genrm_trio" / "runtime" / "engine.py").read_text().splitlines())
    assert lines <= ENGINE_MODULE_LINES, f"runtime/engine.py has {lines} lines"
