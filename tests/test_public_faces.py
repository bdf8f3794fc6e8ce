"""The package's public faces: each subpackage a user builds on says what it exports in
``__all__``, every name there can be imported, and its other modules are private (``_``-prefixed)
unless they are ones the docs or other packages name. The wire types of the HTTP API live in
``wire/``, not beside the routes."""

from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path
from typing import Any

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "genrm_trio"

# Each face, with the modules it keeps public besides its __init__.
PUBLIC_MODULES: dict[str, set[str]] = {
    "genrm_trio.client": {"trl"},
    "genrm_trio.collect": set(),
    "genrm_trio.config": set(),
    # A library of modules: its face is the modules other packages build on.
    "genrm_trio.core": {
        "arrivals",
        "canonical",
        "chat_markup",
        "critical",
        "exact_ints",
        "gym_metrics",
        "identity",
        "invariants",
        "mask_window",
        "messages",
        "outcomes",
        "ownership",
        "pairs",
        "prompt_groups",
        "reachability",
        "records",
        "retention",
        "run_metrics",
        "scoring",
        "server_metrics",
        "standard_json",
        "statistics",
        "tallies",
        "texts",
        "transition",
        "verdicts",
    },
    "genrm_trio.fakes": {
        "judge",
        "judge_command",
        "judge_http",
        "memory_transport",
        "policy",
        "policy_command",
    },
    # client, slots and transport are imported by the runtime; http11 and balancer are named
    # by the docs.
    "genrm_trio.http": {"app", "read_gates", "serving"},
    "genrm_trio.judge": {"balancer", "client", "http11", "slots", "transport"},
    "genrm_trio.runtime": {"compare", "engine", "hooks"},
    "genrm_trio.store": {
        "configured",
        "embedded",
        "group_store",
        "memory_store",
        "redis_store",
        "resp",
    },
    "genrm_trio.testing": {
        "controlled_judge",
        "fixtures",
        "harness",
        "instrument",
        "redis_fixtures",
        "redis_server",
        "scenarios",
    },
    # Imported by http/, store/ and runtime/.
    "genrm_trio.wire": {
        "bodies",
        "group_bodies",
        "gym_bodies",
        "openrlhf_bodies",
        "parsing",
        "rendering",
        "schema",
    },
}
FACES = ["genrm_trio", *PUBLIC_MODULES]


@pytest.mark.parametrize("face", FACES)
def test_every_name_a_face_exports_can_be_imported(face: str) -> None:
    module = importlib.import_module(face)
    exported = module.__all__
    assert exported and all(isinstance(name, str) for name in exported)
    assert len(set(exported)) == len(exported)
    namespace: dict[str, Any] = {}
    exec(f"from {face} import *", namespace)
    assert sorted(set(exported) - set(namespace)) == []


@pytest.mark.parametrize("face", PUBLIC_MODULES)
def test_a_face_keeps_its_other_modules_private(face: str) -> None:
    module = importlib.import_module(face)
    public = {info.name for info in pkgutil.iter_modules(module.__path__)}
    public = {name for name in public if not name.startswith("_")}
    assert public == PUBLIC_MODULES[face]


def struct_classes(path: Path) -> list[str]:
    """The classes in ``path`` that derive from msgspec's Struct."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ClassDef) and any(
            ast.unparse(base) in {"msgspec.Struct", "Struct"} for base in node.bases
        ):
            found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.name}")
    return found


def test_the_http_layer_defines_no_wire_type() -> None:
    found = [
        name for path in sorted((PACKAGE / "http").rglob("*.py")) for name in struct_classes(path)
    ]
    assert found == []
