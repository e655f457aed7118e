"""The package layout's import rules (README, Layout): imports go one way.

- ``planner.schedule`` uses only the base (``planner.errors``, ``planner.fileio``, ``planner.table``);
- the plan (``planner/*.py``) uses the base and ``planner.schedule``, never ``planner.runtime``;
- ``solvers`` imports no torch, and of ``planner`` only the one exception hierarchy (``planner.errors``);
- only the CLI, examples and benchmarks (and ``planner.runtime`` itself) import ``planner.runtime``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BASE = {"planner.errors", "planner.fileio", "planner.limits", "planner.table"}


def _imports(path: Path) -> set[str]:
    """Every module a file imports, at any depth (lazy imports inside functions count too)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def _files(folder: str) -> list[Path]:
    return sorted((ROOT / folder).glob("*.py"))


def _project(names: set[str], prefix: str) -> set[str]:
    return {n for n in names if n == prefix or n.startswith(prefix + ".")}


@pytest.mark.parametrize("path", _files("planner/schedule"), ids=lambda p: p.name)
def test_schedule_uses_only_the_base(path: Path) -> None:
    planner = _project(_imports(path), "planner")
    # ``from planner.errors import UsageError`` also yields ``planner.errors.UsageError``: match prefixes.
    outside = {n for n in planner if not n.startswith("planner.schedule") and not n.startswith(tuple(BASE))}
    assert outside == set(), f"{path.name} imports {sorted(outside)}"
    assert not _project(_imports(path), "torch"), f"{path.name} imports torch"


@pytest.mark.parametrize("path", _files("planner"), ids=lambda p: p.name)
def test_plan_never_imports_runtime(path: Path) -> None:
    assert not _project(_imports(path), "planner.runtime"), f"{path.name} imports planner.runtime"


@pytest.mark.parametrize("path", _files("solvers"), ids=lambda p: p.name)
def test_solvers_are_pure(path: Path) -> None:
    names = _imports(path)
    planner = {n for n in _project(names, "planner") if not n.startswith("planner.errors")}
    assert not _project(names, "torch") and not planner, f"{path.name}: {sorted(names)}"


def _is_project_source(path: Path) -> bool:
    """Not .git, a build, nor a virtual environment made in the checkout (``python -m venv .venv``: its
    site-packages hold torch's test files, some of them Python 3.12 syntax this interpreter cannot parse)."""
    parts = path.relative_to(ROOT).parts
    return not any(p.startswith(".") or p in ("build", "site-packages") for p in parts)


def test_only_edges_import_runtime() -> None:
    allowed = ("cli.py", "examples/", "benchmarks/", "planner/runtime/", "tests/")
    importers = [
        str(path.relative_to(ROOT))
        for path in ROOT.rglob("*.py")
        if _is_project_source(path) and _project(_imports(path), "planner.runtime")
    ]
    assert importers, "nothing imports planner.runtime: the rule below would hold vacuously"
    wrong = [p for p in importers if not p.startswith(allowed)]
    assert wrong == [], f"only the CLI, examples and benchmarks may import planner.runtime: {wrong}"
