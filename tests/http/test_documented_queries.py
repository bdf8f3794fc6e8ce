"""docs/operations.md's panels and alerts name series the server serves, and, where promtool is
installed, they are valid PromQL and valid Prometheus rules."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from genrm_trio.config import CONFIG_KEYS
from genrm_trio.http._worker_metrics import WORKERS_UP
from genrm_trio.testing.harness import running_server

OPERATIONS = Path(__file__).resolve().parents[2] / "docs" / "operations.md"
SERIES = re.compile(r"\bgenrm_[a-z0-9_]+")
HISTOGRAM_SAMPLES = ("_bucket", "_sum", "_count")


def documented_series() -> set[str]:
    text = OPERATIONS.read_text(encoding="utf-8")
    return {name for name in SERIES.findall(text) if name not in CONFIG_KEYS} - {"genrm_trio"}


def blocks(language: str) -> list[str]:
    text = OPERATIONS.read_text(encoding="utf-8")
    return re.findall(rf"```{language}\n(.*?)```", text, flags=re.DOTALL)


async def served_series() -> set[str]:
    """Every sample name a server's /metrics can carry, read from its # TYPE lines (a series
    with no sample yet, such as a histogram before its first observation, counts too)."""
    async with running_server() as server:
        text = (await server.client.get("/metrics")).text
    served = {WORKERS_UP}  # only under serve --workers
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            served.add(name)
            if kind == "histogram":
                served.update(name + suffix for suffix in HISTOGRAM_SAMPLES)
    return served


async def test_every_series_the_operations_guide_names_is_served() -> None:
    documented = documented_series()
    assert "genrm_oldest_collecting_group_seconds" in documented  # the scan finds them
    missing = documented - await served_series()
    assert not missing, f"docs/operations.md names series /metrics does not serve: {missing}"


def queries() -> list[str]:
    """Each query of the guide's PromQL blocks: lines up to a blank or comment line."""
    found: list[str] = []
    for block in blocks("promql"):
        current: list[str] = []
        for line in [*block.splitlines(), ""]:
            if line.strip() and not line.startswith("#"):
                # A continuation line is indented; a line at the margin starts a new query.
                if current and not line.startswith(" "):
                    found.append(" ".join(current))
                    current = []
                current.append(line.strip())
            elif current:
                found.append(" ".join(current))
                current = []
    return found


def test_the_guide_s_queries_are_found() -> None:
    assert "sum(min by (replica) (genrm_judge_replica_up))" in queries()
    assert "max(genrm_oldest_collecting_group_seconds)" in queries()


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is not installed")
def test_the_guide_s_queries_and_alerts_pass_promtool(tmp_path: Path) -> None:
    recorded = "groups:\n  - name: queries\n    rules:\n"
    for index, query in enumerate(queries()):
        expression = query.replace("$__rate_interval", "5m").replace('"', '\\"')
        recorded += f'      - record: genrm:query_{index}\n        expr: "{expression}"\n'
    (tmp_path / "queries.yml").write_text(recorded, encoding="utf-8")
    alerts = [block for block in blocks("yaml") if block.startswith("groups:")]
    assert len(alerts) == 1
    (tmp_path / "alerts.yml").write_text(alerts[0], encoding="utf-8")
    for name in ("queries.yml", "alerts.yml"):
        result = subprocess.run(
            ["promtool", "check", "rules", str(tmp_path / name)],
            capture_output=True,
            text=True,
            check=False,
        )
        assert result.returncode == 0, result.stdout + result.stderr
