"""The package's import graph, read from the source: no import cycles, no module reaching into
another package's private modules, and a command line whose imports reach no test-support module.

Every import of a genrm_trio module counts, at module level or inside a function (a function's
import runs too, later), with one exception: imports under ``if TYPE_CHECKING:``, which never
run. Importing ``a.b.c`` also runs the ``__init__`` of ``a.b``, so that counts as an import of
``a.b`` as well, unless the importing module is itself inside ``a.b`` (its package is then
already being imported).
"""

from __future__ import annotations

import ast
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "genrm_trio"


@dataclass(frozen=True)
class Edge:
    target: str
    where: str  # path:line of the import statement


def module_names(package: Path) -> dict[str, tuple[Path, bool]]:
    """Each module's dotted name, with its file and whether it is a package's ``__init__``."""
    names = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts.pop()
        names[".".join(parts)] = (path, is_package)
    return names


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement that can run: all but those under ``if TYPE_CHECKING:``."""
    found: list[ast.Import | ast.ImportFrom] = []
    pending: list[ast.AST] = [tree]
    while pending:
        node = pending.pop()
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        elif isinstance(node, ast.If) and _type_checking(node):
            pending.extend(node.orelse)
            continue
        pending.extend(ast.iter_child_nodes(node))
    return found


def import_graph(package: Path) -> dict[str, list[Edge]]:
    """For each module of ``package``, the modules of ``package`` it imports."""
    names = module_names(package)
    root = package.name

    def owner(name: str) -> str | None:
        """The module that defines ``name``: itself, or the nearest package above it."""
        while name not in names and "." in name:
            name = name.rpartition(".")[0]
        return name if name in names else None

    graph: dict[str, list[Edge]] = {}
    for name, (path, is_package) in names.items():
        here = name if is_package else name.rpartition(".")[0]
        ancestors = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
        edges: dict[str, Edge] = {}
        for node in _imports(ast.parse(path.read_text(), str(path))):
            where = f"{path.relative_to(package.parent)}:{node.lineno}"
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    parts = here.split(".")[: len(here.split(".")) - node.level + 1]
                    base = ".".join([*parts, base] if base else parts)
                targets = [
                    f"{base}.{alias.name}" if f"{base}.{alias.name}" in names else base
                    for alias in node.names
                ]
            for target in targets:
                if target != root and not target.startswith(root + "."):
                    continue
                module = owner(target)
                if module is None:
                    continue
                parts = module.split(".")
                packages = [".".join(parts[:i]) for i in range(1, len(parts))]
                for imported in [*packages, module]:
                    if imported == name or (imported in ancestors and imported != module):
                        continue
                    edges.setdefault(imported, Edge(imported, where))
        graph[name] = sorted(edges.values(), key=lambda edge: edge.target)
    return graph


def strongly_connected(graph: dict[str, list[Edge]]) -> list[list[str]]:
    """The groups of modules that import each other (Tarjan), largest first."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(start: str) -> None:
        # Iterative, so a deep chain of imports cannot exhaust the recursion limit.
        work = [(start, iter(graph[start]))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for edge in edges:
                if edge.target not in index:
                    index[edge.target] = low[edge.target] = len(index)
                    stack.append(edge.target)
                    on_stack.add(edge.target)
                    work.append((edge.target, iter(graph[edge.target])))
                    break
                if edge.target in on_stack:
                    low[node] = min(low[node], index[edge.target])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    group = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        group.append(member)
                        if member == node:
                            break
                    if len(group) > 1:
                        groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(groups, key=len, reverse=True)


def shortest_path(
    graph: dict[str, list[Edge]], start: str, goal: str, within: set[str] | None = None
) -> list[Edge] | None:
    """The imports that lead from ``start`` to ``goal`` by the fewest steps."""
    came: dict[str, tuple[str, Edge] | None] = {start: None}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for edge in graph[node]:
            if within is not None and edge.target not in within:
                continue
            if edge.target == goal:
                path = [edge]
                while (step := came[node]) is not None:
                    node, previous = step
                    path.append(previous)
                return path[::-1]
            if edge.target not in came:
                came[edge.target] = (node, edge)
                queue.append(edge.target)
    return None


def describe(start: str, path: list[Edge]) -> str:
    return " -> ".join([start, *(f"{edge.target} ({edge.where})" for edge in path)])


def cycles(graph: dict[str, list[Edge]]) -> list[str]:
    """One shortest cycle through the first module of each group that imports itself."""
    found = []
    for group in strongly_connected(graph):
        path = shortest_path(graph, group[0], group[0], set(group))
        assert path is not None
        found.append(f"{describe(group[0], path)}; modules in this cycle: {', '.join(group)}")
    return found


def closure(graph: dict[str, list[Edge]], start: str) -> set[str]:
    seen = {start}
    queue = deque([start])
    while queue:
        for edge in graph[queue.popleft()]:
            if edge.target not in seen:
                seen.add(edge.target)
                queue.append(edge.target)
    return seen


def test_the_package_has_no_import_cycle() -> None:
    found = cycles(import_graph(PACKAGE))
    assert not found, "import cycles:\n" + "\n".join(found)


def private_owner(module: str) -> str | None:
    """The package a private module belongs to (``a.b`` for ``a.b._c`` or ``a.b._c.d``), or None
    for a public module."""
    parts = module.split(".")
    for index, part in enumerate(parts[1:], start=1):
        if part.startswith("_"):
            return ".".join(parts[:index])
    return None


def test_no_module_imports_another_package_s_private_module() -> None:
    graph = import_graph(PACKAGE)
    found = [
        f"{name} -> {edge.target} ({edge.where})"
        for name, edges in graph.items()
        for edge in edges
        if (owner := private_owner(edge.target)) is not None
        and name != owner
        and not name.startswith(owner + ".")
    ]
    assert not found, "private modules imported from outside their package:\n" + "\n".join(found)


COMMAND_LINE = ("genrm_trio.cli", "genrm_trio.workers", "genrm_trio.gym_server")


@pytest.mark.parametrize("entry", COMMAND_LINE)
def test_the_command_line_imports_no_test_support(entry: str) -> None:
    # serve, demo, fake-judge, fake-policy and collect ship with the server; the test harness
    # (genrm_trio.testing, its private modules above all) is not part of it.
    graph = import_graph(PACKAGE)
    reached = sorted(m for m in closure(graph, entry) if m.startswith("genrm_trio.testing"))
    chains = [describe(entry, shortest_path(graph, entry, m) or []) for m in reached]
    assert not chains, f"{entry} reaches the test harness:\n" + "\n".join(chains)


def write_package(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / "pkg" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root / "pkg"


def test_the_graph_counts_imports_inside_functions_and_packages_but_not_type_checking(
    tmp_path: Path,
) -> None:
    package = write_package(
        tmp_path,
        {
            "__init__.py": "",
            "a.py": "def f():\n    from pkg import b\n",
            "b.py": "import pkg.sub.c\n",
            "sub/__init__.py": "from pkg.sub.d import X\n",
            "sub/c.py": "",
            "sub/d.py": "X = 1\nimport pkg.a\n",
            "e.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pkg.f\n",
            "f.py": "import pkg.e\n",
        },
    )
    graph = import_graph(package)
    assert cycles(graph) == [
        "pkg.a -> pkg.b (pkg/a.py:2) -> pkg.sub (pkg/b.py:1) -> pkg.sub.d (pkg/sub/__init__.py:1)"
        " -> pkg.a (pkg/sub/d.py:2); modules in this cycle: pkg.a, pkg.b, pkg.sub, pkg.sub.d"
    ]
    assert [edge.target for edge in graph["pkg.e"]] == []
