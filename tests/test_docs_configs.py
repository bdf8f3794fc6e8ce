"""What the docs tell a user to run works as written: every configuration they show (a YAML
block in docs/ or the README, a file in docs/examples or a shipped NeMo Gym config) loads
without a start-up warning, and the commands they count are the commands `genrm-trio` has."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from genrm_trio.cli import _parser
from genrm_trio.config import config_warnings, parse_yaml
from genrm_trio.gym_config import is_gym_document, load_serve_config

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
YAML_BLOCK = re.compile(r"^```ya?ml\n(.*?)^```", re.MULTILINE | re.DOTALL)
CONFIG_KEYS_SEEN = frozenset({"judge_base_url", "judge_base_urls", "judge_model"})
# A Gym config names its judge through references the training config defines beside it.
GYM_JUDGE = "\ngenrm_judge_base_url: http://judge-host:8000/v1\ngenrm_judge_model: genrm\n"
NUMBERS = {"three": 3, "four": 4, "five": 5, "six": 6, "seven": 7}


def documented_configs() -> list[tuple[str, str]]:
    """(where, YAML text) of every configuration the docs show or ship."""
    found: list[tuple[str, str]] = []
    for page in [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]:
        text = page.read_text(encoding="utf-8")
        for match in YAML_BLOCK.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            found.append((f"{page.relative_to(ROOT)}:{line}", match.group(1)))
    shipped = [*DOCS.glob("examples/**/*.y*ml"), *ROOT.glob("resources_servers/*/configs/*.yaml")]
    for path in sorted(shipped):
        found.append((str(path.relative_to(ROOT)), path.read_text(encoding="utf-8")))
    configs = []
    for where, text in found:
        try:
            document: Any = parse_yaml(text)
        except yaml.YAMLError:  # a fragment that is not YAML on its own is no configuration
            continue
        if isinstance(document, dict) and (
            CONFIG_KEYS_SEEN & set(document) or is_gym_document(document)
        ):
            configs.append((where, text))
    return configs


CONFIGS = documented_configs()


def test_the_docs_show_the_configurations_users_start_from() -> None:
    places = [where for where, _ in CONFIGS]
    for page in ("docs/trainers.md", "docs/running.md", "docs/operations.md"):
        assert any(where.startswith(page) for where in places), places
    assert "resources_servers/genrm_trio/configs/genrm_trio.yaml" in places


@pytest.mark.parametrize(("where", "text"), CONFIGS, ids=[where for where, _ in CONFIGS])
def test_every_documented_configuration_loads_without_a_warning(
    where: str, text: str, tmp_path: Path
) -> None:
    path = tmp_path / "config.yaml"
    gym = is_gym_document(parse_yaml(text))
    path.write_text(text + GYM_JUDGE if gym else text, encoding="utf-8")
    config, _ = load_serve_config(path)
    assert config_warnings(config) == [], where


def test_running_md_counts_and_names_the_real_subcommands() -> None:
    text = (DOCS / "running.md").read_text(encoding="utf-8")
    match = re.search(r"`genrm-trio`, with (\w+) subcommands: ([^.]*)\.", text)
    assert match is not None
    named = re.findall(r"`([\w-]+)`", match.group(2))
    parser = _parser()
    [commands] = [a for a in parser._actions if a.dest == "command"]
    assert commands.choices is not None
    assert NUMBERS[match.group(1)] == len(commands.choices)
    assert sorted(named) == sorted(commands.choices)
