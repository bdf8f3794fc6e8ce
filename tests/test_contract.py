"""docs/contract.md is where a requirement id is looked up: every id cited anywhere resolves there.

Code, tests, benchmarks and docs cite requirement ids (``C-43``, ``J-34a``, ``R-5.3``, ``AS-116``)
and worked examples (``E5``). A citation is only useful if the contract defines it, once.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONTRACT = ROOT / "docs" / "contract.md"
SCANNED_DIRS = ("genrm_trio", "tests", "benchmarks", "docs")
SCANNED_FILES = ("README.md",)
SCANNED_SUFFIXES = frozenset({".py", ".md", ".txt", ".yaml", ".yml", ".toml", ".json", ".cfg"})

# A series prefix, a dash and a number, then at most a lower-case letter (J-34a) or a numbered
# item. Worked examples are E1…E8. The guards keep words such as SHA-256, UTF-8,
# X-Request-Id or a hex id out: an id never follows a letter, digit or dash, nor runs on into one.
_ID = r"(?:(?:AS|CF|CL|[CIJMORSWX])-[0-9]+(?:[a-z]|\.[0-9]+)?|E[0-9]+)"
CITED_ID = re.compile(rf"(?<![\w-]){_ID}(?!\w)")
# A definition opens a list item (or a line) with the id in bold: `- **C-43** ...`.
DEFINED_ID = re.compile(rf"^\s*(?:[-*]\s+|[0-9]+\.\s+)?\*\*({_ID})\*\*", re.MULTILINE)


def scanned_files() -> list[Path]:
    files = [ROOT / name for name in SCANNED_FILES if (ROOT / name).is_file()]
    for directory in SCANNED_DIRS:
        for path in sorted((ROOT / directory).rglob("*")):
            if path.suffix not in SCANNED_SUFFIXES or not path.is_file():
                continue
            if any(part.startswith(".") or part == "__pycache__" for part in path.parts):
                continue
            if path != CONTRACT:
                files.append(path)
    return files


def citations(files: list[Path]) -> dict[str, list[str]]:
    """Every cited id with the places (`path:line`) that cite it."""
    cited: dict[str, list[str]] = {}
    for path in files:
        text = path.read_text(encoding="utf-8")
        for number, line in enumerate(text.splitlines(), start=1):
            for match in CITED_ID.finditer(line):
                place = f"{path.relative_to(ROOT)}:{number}"
                cited.setdefault(match.group(0), []).append(place)
    return cited


def definitions(text: str) -> list[str]:
    return DEFINED_ID.findall(text)


def unresolved(cited: dict[str, list[str]], defined: set[str]) -> list[str]:
    return [
        f"{identifier} (cited at {', '.join(places[:3])})"
        for identifier, places in sorted(cited.items())
        if identifier not in defined
    ]


def test_every_cited_id_is_defined_in_the_contract() -> None:
    cited = citations(scanned_files())
    defined = set(definitions(CONTRACT.read_text(encoding="utf-8")))
    # The scan must find what the code is known to cite, or a broken pattern would pass vacuously.
    assert {"C-43", "J-34a", "R-5.1", "AS-116", "E8", "W-20"} <= set(cited)
    missing = unresolved(cited, defined)
    assert not missing, "ids cited but not defined in docs/contract.md:\n" + "\n".join(missing)


def test_the_contract_refers_only_to_ids_it_defines() -> None:
    text = CONTRACT.read_text(encoding="utf-8")
    referenced = {match.group(0) for match in CITED_ID.finditer(text)}
    dangling = sorted(referenced - set(definitions(text)))
    assert not dangling, f"docs/contract.md refers to ids it never defines: {dangling}"


def test_no_id_is_defined_twice() -> None:
    counts = Counter(definitions(CONTRACT.read_text(encoding="utf-8")))
    twice = sorted(identifier for identifier, count in counts.items() if count > 1)
    assert not twice, f"ids defined more than once in docs/contract.md: {twice}"


def test_every_series_is_defined() -> None:
    """Each series of the contract (wire, judge, ..., later capabilities) has its definitions."""
    defined = definitions(CONTRACT.read_text(encoding="utf-8"))
    series = {re.sub(r"[-0-9].*", "", identifier) for identifier in defined}
    assert series == {"W", "J", "S", "E", "C", "M", "R", "I", "CF", "CL", "O", "AS", "X"}


def test_the_patterns_tell_ids_from_other_words() -> None:
    line = "C-43, J-34a and R-5.3 (see AS-116, E8); not SHA-256, UTF-8, X-Request-Id or ab-C-1"
    assert [match.group(0) for match in CITED_ID.finditer(line)] == [
        "C-43",
        "J-34a",
        "R-5.3",
        "AS-116",
        "E8",
    ]
    assert definitions("- **C-43** text\n  - **R-5.3** text\n**W-1** text\nsee **C-44**") == [
        "C-43",
        "R-5.3",
        "W-1",
    ]


def test_a_missing_definition_is_reported_with_its_place() -> None:
    cited = {"C-43": ["genrm_trio/core/groups.py:1"], "W-1": ["README.md:2"]}
    assert unresolved(cited, {"W-1"}) == ["C-43 (cited at genrm_trio/core/groups.py:1)"]
