"""The package layout's import rules (README, Layout): imports go one way, as one table.

``LAYOUT`` says, for each part of the repository, which first-party parts (and torch) its files may import.
Every Python file belongs to one row, and every import it makes (``ast``-parsed: lazy imports inside
functions count too; ``importlib.import_module`` strings do not) must fall inside that row. The table was
taken from what the code imported when it was written; an import outside it is a change of the layout,
made here on purpose or not at all. The rules the table keeps (checked on the table itself below):

- the base (``planner.errors``, ``planner.fileio``, ``planner.limits``, ``planner.formatting``) imports only itself;
- ``planner.schedule`` uses only the base, and no torch;
- the plan (``planner/*.py``) uses the base, ``planner.schedule``, the solvers, the profile format and the device
  models' roofline (``profiles.modelled``, which itself uses no torch), never ``planner.runtime``, and no torch;
- ``solvers`` imports no torch, and of ``planner`` only the one exception hierarchy (``planner.errors``);
- only the CLI, examples and benchmarks (and ``planner.runtime`` itself) import ``planner.runtime``.

Inside a row the table says nothing of direction, so a second rule holds the modules themselves: the imports of
the packages and the CLI (each import counted as above, type-only ones under ``TYPE_CHECKING`` too) go round in
no circle. A circle is a design smell with a known cut: a format module that also assembles (move the
assembling up), two modules each holding a helper the other needs (move both down), a type and its resolver
in one file (split them).
"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parents[1]

# What an imported module (or a file, by its module name) belongs to: the longest matching prefix.
PARTS = {
    "planner.errors": "planner base",
    "planner.fileio": "planner base",
    "planner.schema_check": "planner base",
    "planner.limits": "planner base",
    "planner.formatting": "planner base",
    "planner.options": "planner base",
    "planner.schedule": "planner.schedule",
    "planner.runtime": "planner.runtime",
    "planner": "planner",  # the plan: graph, cost, bounds, search, cluster, plan, report, export, calibration
    "profiles.format": "profiles.format",  # the profile file format (no torch): what the plan reads
    # The device models' roofline (no torch): what a modelled profile is, which the plan splits for tensor parallelism.
    "profiles.modelled": "device models",
    "profiles.device_model": "device models",
    "profiles.models.hf_spec": "device models",
    "profiles.models": "profiles.models",
    "profiles": "profiles",
    "solvers": "solvers",
    "planner.commands": "cli",  # the command line's parser, argument types and terminal handling
    "cli": "cli",
    "torch": "torch",
}
BASE = "planner base"
EVERYTHING = frozenset(PARTS.values())

# Each row: the files of a part (a package's modules, or a folder's files) -> what they may import. An entry
# is a part above, or (where a part is too wide) one module: solvers may use planner.errors, not the base.
LAYOUT: dict[str, frozenset[str]] = {
    BASE: frozenset({BASE}),
    "planner.schedule": frozenset({BASE, "planner.schedule"}),
    "planner": frozenset({BASE, "planner", "planner.schedule", "profiles.format", "device models", "solvers"}),
    "planner.runtime": frozenset(
        {BASE, "planner", "planner.schedule", "planner.runtime", "profiles.format", "profiles", "torch"}
    ),
    "profiles.format": frozenset({BASE}),
    "device models": frozenset({BASE, "profiles.format", "device models"}),
    "profiles": frozenset({BASE, "profiles.format", "profiles", "profiles.models", "device models", "torch"}),
    "profiles.models": frozenset({BASE, "profiles", "profiles.models", "device models", "torch"}),
    "solvers": frozenset({"planner.errors", "solvers"}),
    "cli": EVERYTHING - {"solvers"},
    "examples": frozenset({"planner", "planner.runtime", "profiles", "torch"}),
    "benchmarks": EVERYTHING - {"cli"},
    "tests": EVERYTHING,
}
# Files outside the packages: their folder (or the file) is the row.
FOLDERS = {"cli.py": "cli", "examples": "examples", "benchmarks": "benchmarks", "tests": "tests"}


def _part(module: str) -> str | None:
    """The part of the project ``module`` (or ``module.name``) belongs to, None where it is not ours nor torch."""
    for prefix in sorted(PARTS, key=len, reverse=True):
        if module == prefix or module.startswith(prefix + "."):
            return PARTS[prefix]
    return None


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _row(path: Path) -> str | None:
    first = path.relative_to(ROOT).parts[0]
    if first in FOLDERS:
        return FOLDERS[first]
    part = _part(_module_name(path))
    return part if part in LAYOUT else None


def _imports(path: Path) -> set[str]:
    """Every module a file imports, at any depth (lazy imports inside functions count too).

    ``from package import name`` counts as ``package.name`` (a submodule, or a name the package defines), so
    ``from planner import runtime`` is an import of ``planner.runtime``; relative imports are resolved.
    """
    return set(_import_lines(path))


def _import_lines(path: Path) -> dict[str, int]:
    """:func:`_imports`, each with the line of its first import in ``path``."""
    found: dict[str, int] = {}
    package = _module_name(path).split(".") if path.relative_to(ROOT).parts[0] in PARTS else []
    if package and path.name != "__init__.py":
        package = package[:-1]
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                assert len(package) >= node.level, f"{path}: a relative import outside a package"
                module = ".".join(package[: len(package) - node.level + 1] + ([module] if module else []))
            names = [f"{module}.{alias.name}" for alias in node.names]
        for name in names:
            found[name] = min(found.get(name, node.lineno), node.lineno)
    return found


def _is_project_source(path: Path) -> bool:
    """Not .git, a build, nor a virtual environment made in the checkout (``python -m venv .venv``: its
    site-packages hold torch's test files, some of them Python 3.12 syntax this interpreter cannot parse)."""
    parts = path.relative_to(ROOT).parts
    return not any(p.startswith(".") or p in ("build", "site-packages") for p in parts)


SOURCES = sorted(path for path in ROOT.rglob("*.py") if _is_project_source(path))


def _outside(path: Path, allowed: frozenset[str]) -> set[str]:
    """The imports of ``path`` that its row does not allow."""
    wrong = set()
    for module in _imports(path):
        part = _part(module)
        single = any(module == a or module.startswith(a + ".") for a in allowed - EVERYTHING)
        if part is not None and part not in allowed and not single:
            wrong.add(module)
    return wrong


def test_every_file_has_a_row() -> None:
    homeless = [str(p.relative_to(ROOT)) for p in SOURCES if _row(p) is None]
    assert homeless == [], f"files in no row of LAYOUT (add the folder to the table): {homeless}"


def test_every_row_has_files() -> None:
    # A row no file falls in holds vacuously: a moved folder or a misspelt part would go unchecked.
    assert {_row(p) for p in SOURCES} == set(LAYOUT)


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_stay_inside_the_table(path: Path) -> None:
    row = _row(path)
    assert row is not None
    wrong = _outside(path, LAYOUT[row])
    assert wrong == set(), f"{path.relative_to(ROOT)} imports {sorted(wrong)}: not in row {row!r} of LAYOUT"


def test_the_table_keeps_the_one_way_rules() -> None:
    torch_free = (BASE, "planner.schedule", "planner", "profiles.format", "device models", "solvers")
    assert [row for row in torch_free if "torch" in LAYOUT[row]] == []
    assert LAYOUT[BASE] == {BASE}
    assert LAYOUT["planner.schedule"] <= {BASE, "planner.schedule"}
    assert LAYOUT["solvers"] <= {"planner.errors", "solvers"}
    importers = {row for row, allowed in LAYOUT.items() if "planner.runtime" in allowed}
    assert importers <= {"cli", "examples", "benchmarks", "planner.runtime", "tests"}
    # The plan is scored by the schedule, never the other way round; profiles never reach into the plan.
    assert "planner" not in LAYOUT["planner.schedule"] | LAYOUT["profiles"] | LAYOUT["profiles.models"]


def test_the_checks_see_imports() -> None:
    # The rules above would hold vacuously if no import were found: every kind of import is seen.
    runtime = [p for p in SOURCES if any(_part(m) == "planner.runtime" for m in _imports(p))]
    assert {_row(p) for p in runtime} >= {"cli", "examples", "benchmarks", "planner.runtime"}
    lazy = ROOT / "profiles" / "workload.py"  # imports profiles.models inside a function
    assert any(_part(m) == "profiles.models" for m in _imports(lazy))
    assert _outside(ROOT / "cli.py", LAYOUT["solvers"]), "cli.py imports what a solver may not"


# The modules held to no circle: the packages and the CLI (tests, examples and benchmarks sit above them all).
ACYCLIC = ("planner", "profiles", "solvers", "cli.py")
MODULES = {_module_name(p): p for p in SOURCES if p.relative_to(ROOT).parts[0] in ACYCLIC}


def _first_party(name: str, modules: set[str] | dict[str, Path] = MODULES) -> str | None:
    """The module an import of ``name`` reaches: the longest of ``modules`` it starts with, so that ``from pkg
    import name`` reaches ``pkg.name`` where that is a module, else ``pkg``; None where it is not ours."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _import_graph() -> nx.DiGraph:
    """Each module of :data:`MODULES` -> the modules it imports, every edge with the file and line of its import."""
    graph = nx.DiGraph()
    graph.add_nodes_from(MODULES)
    for module, path in MODULES.items():
        for name, line in _import_lines(path).items():
            target = _first_party(name)
            if target is None or target == module:
                continue
            # A package's __init__ is its front door: it re-exports what lies below it (planner's resolves each
            # name on first use, through a module-level __getattr__), so its edges point into the package by
            # construction. Counted, a submodule that takes a name from its own package would close a circle
            # that no import ever runs.
            if path.name == "__init__.py" and target.startswith(module + "."):
                continue
            graph.add_edge(module, target, at=f"{path.relative_to(ROOT)}:{line}")
    return graph


def _circles(graph: nx.DiGraph) -> list[str]:
    """One circle of each group of modules that import each other, as ``a (file:line) -> b (...) -> a``."""
    circles = []
    for group in sorted(nx.strongly_connected_components(graph), key=min):
        if len(group) > 1:
            cycle = nx.find_cycle(graph.subgraph(group))
            steps = [f"{a} ({graph.edges[a, b]['at']})" for a, b in cycle]
            circles.append(" -> ".join([*steps, cycle[0][0]]))
    return circles


def test_imports_go_round_in_no_circle() -> None:
    circles = _circles(_import_graph())
    assert circles == [], (
        "modules that import each other (cut: move a format's assembling up, move helpers two modules share "
        "down, split a type from its resolver):\n" + "\n".join(circles)
    )


def test_the_import_graph_sees_every_kind_of_import() -> None:
    # The rule above would hold vacuously on a graph that missed imports, or on a search that missed circles.
    assert _first_party("planner.plan.Plan") == "planner.plan"  # a name from a module
    assert _first_party("planner.export.export_plan") == "planner.export"  # a name a package defines
    assert _first_party("planner.runtime") == "planner.runtime"  # a subpackage, as `from planner import runtime`
    assert _first_party("torch.nn") is None
    graph = _import_graph()
    assert graph.has_edge("planner.search", "planner.assemble")  # at module level
    assert graph.has_edge("profiles.workload", "profiles.models")  # inside a function
    assert graph.has_edge("planner.assemble", "planner.request")  # under TYPE_CHECKING
    assert not graph.has_edge("planner.export", "planner.export.common")  # a package's front door
    graph.add_edge("planner.errors", "cli", at="(added)")
    assert any(c.startswith("cli (") and c.endswith("-> cli") for c in _circles(graph))
