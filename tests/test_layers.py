"""The house's structure, held by tests: dependencies point one way, and every package's
map names every module in it.

- The roof (``boxtrail``: the app, the server, the command line) imports the stages; the
  stages (``ingest``, ``query``, ``symbolicate``, ``tenancy``, ``metadata``, ``cluster``,
  ``console``) import each other only one way and never the roof; the floor (``core``)
  imports nothing of the project but itself. Each floor module is imported in a fresh
  interpreter, and fails if a stage or the roof was loaded with it.
- No two packages import each other, directly or around a circle (every import is read,
  those inside functions too).
- Each package's docstring names each of its modules (``name``), as the settings test holds
  the settings table: a module added without a place in the map fails here.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
ROOF = "boxtrail"
FLOOR = "core"
# The client (its own distribution too, client/pyproject.toml): it talks to a server over
# HTTP and imports nothing of it; of the server, only the roof's command line uses it.
CLIENT = "boxtrail_client"
STAGES = ("ingest", "query", "symbolicate", "tenancy", "metadata", "cluster", "console",
          "erasure", "usage", "iceberg")
PACKAGES = (ROOF, *STAGES, FLOOR, CLIENT)


def modules(package: str) -> list[str]:
    root = REPO / package
    return sorted(".".join(f.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
                  for f in root.rglob("*.py"))


def imported(source: str) -> set[str]:
    """The project modules a module's source imports, wherever in it."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        names = ([node.module] if isinstance(node, ast.ImportFrom) and node.module
                 and not node.level else
                 [a.name for a in node.names] if isinstance(node, ast.Import) else [])
        found |= {n for n in names if n.split(".")[0] in PACKAGES}
    return found


def imports(module: str) -> set[str]:
    path = REPO / Path(*module.split("."))
    file = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    return imported(file.read_text())


def package_graph() -> dict[str, dict[str, list[str]]]:
    """package -> package it imports -> the module pairs that do it."""
    graph: dict[str, dict[str, list[str]]] = {p: {} for p in PACKAGES}
    for package in PACKAGES:
        for module in modules(package):
            for target in imports(module):
                other = target.split(".")[0]
                if other != package:
                    graph[package].setdefault(other, []).append(f"{module} -> {target}")
    return graph


def test_the_floor_imports_no_other_package() -> None:
    assert package_graph()[FLOOR] == {}


def test_the_client_imports_nothing_of_the_server_and_only_the_roof_imports_it() -> None:
    graph = package_graph()
    assert graph[CLIENT] == {}
    users = {p for p in PACKAGES if CLIENT in graph[p]}
    assert users <= {ROOF}, users


def test_no_stage_imports_the_roof() -> None:
    graph = package_graph()
    upward = {s: graph[s][ROOF] for s in STAGES if ROOF in graph[s]}
    assert not upward, upward


def cycles(graph: dict[str, dict[str, list[str]]]) -> list[str]:
    """Every circle of the graph once, from its least node: ``a -> b -> a``."""
    found = []

    def visit(path: list[str]) -> None:
        for nxt in graph.get(path[-1], {}):
            if nxt == path[0]:
                found.append(" -> ".join([*path, nxt]))
            elif nxt not in path and nxt > path[0]:
                visit([*path, nxt])

    for node in sorted(graph):
        visit([node])
    return found


def test_no_import_cycle_between_packages() -> None:
    graph = package_graph()
    found = cycles(graph)
    # Per circle, one import of each of its arrows: where to cut it.
    detail = {c: [graph[a][b][0] for a, b in zip(c.split(" -> "), c.split(" -> ")[1:],
                                                  strict=False)] for c in found}
    assert not found, detail


def test_what_the_graph_is_made_of() -> None:
    """An import inside a function counts, a relative one is not the project's, and every
    circle is found once, however long."""
    source = "import os\nfrom .x import y\ndef later():\n    from query.engine import E\n"
    assert imported(source) == {"query.engine"}
    graph = {"a": {"b": ["."]}, "b": {"c": ["."], "a": ["."]}, "c": {"a": ["."]}, "d": {}}
    assert sorted(cycles(graph)) == ["a -> b -> a", "a -> b -> c -> a"]
    assert cycles({"a": {"b": ["."]}, "b": {}}) == []


@pytest.mark.parametrize("module", modules(FLOOR))
def test_a_floor_module_loads_no_stage(module: str) -> None:
    others = tuple(p for p in PACKAGES if p != FLOOR)
    probe = (f"import sys, {module}; "
             f"print(sorted(m for m in sys.modules if m.split('.')[0] in {others!r}))")
    out = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True,
                         text=True, check=True).stdout.strip()
    assert out == "[]", f"importing {module} loads {out}"


PACKAGE_DIRS = sorted({f.parent for p in PACKAGES for f in (REPO / p).rglob("__init__.py")})


@pytest.mark.parametrize("package", PACKAGE_DIRS,
                         ids=[p.relative_to(REPO).as_posix() for p in PACKAGE_DIRS])
def test_every_package_docstring_names_its_modules(package: Path) -> None:
    doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
    names = sorted({f.stem for f in package.glob("*.py") if f.stem != "__init__"}
                   | {d.name for d in package.iterdir() if (d / "__init__.py").exists()})
    missing = [n for n in names if f"``{n}``" not in doc]
    assert not missing, f"{package.relative_to(REPO)}/__init__.py does not name {missing}"
