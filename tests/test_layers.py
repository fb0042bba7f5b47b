"""The structure of docs/architecture.md, read from the code's own imports (no import is run).

From the bottom up:

1. the vocabulary (``resources/core``): Dagster-free, imports only itself;
2. the stores (``resources/``): the ledger, the source store, the notifiers; import only
   ``resources/``;
3. the scheduling core (``orchestration/``: what a task is, where it is declared, its
   timetable, the run path, and one module per rule) and the services
   (``orchestration/services``): load no Dagster at import (the scheduling core), import no
   shell;
4. the shells: the tasks' Dagster definitions (``task_defs.py``, ``component.py``,
   ``checks.py``, ``definitions.py``), the CLI, the sensors, the task bodies in ``assets/``.

Rules: ``resources/`` imports nothing from ``orchestration/``, ``sensors/`` or ``assets/``;
``assets/`` and ``sensors/`` never import each other; ``orchestration/`` (its
``definitions.py`` aside) imports nothing from ``assets/`` or ``sensors/``; no import cycle,
counting a cycle through a package ``__init__`` (``from P import x`` depends on P's
``__init__``); a project import inside a function has a comment saying why; one name per
concept: two modules share a file name only where one is a shell running the other's concept
(``sensors/reclaim.py`` runs ``orchestration/reclaim.py``).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("orchestration", "resources", "sensors", "assets")


@dataclass(frozen=True)
class Import:
    source: str  # importing module, dotted
    target: str  # imported module, dotted
    line: int
    in_function: bool
    type_checking: bool
    commented: bool
    #: ``from P import x`` with P a package: the statement runs P's ``__init__`` (which must
    #: have got far enough to hand ``x`` over), so it depends on that ``__init__``.
    through_init: bool = False


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules(root: Path) -> dict[str, Path]:
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            if "migrations" in path.relative_to(root).parts:
                continue  # Alembic loads these by path; they are not imported
            found[module_name(root, path)] = path
    return found


def _is_package(name: str, modules: dict[str, Path]) -> bool:
    return name in modules and modules[name].name == "__init__.py"


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The project module ``name`` refers to: itself, else its nearest package."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _commented(lines: list[str], lineno: int) -> bool:
    """A trailing comment, or a comment line right above the import's group (a group's
    imports may span lines: ``from x import (\n    a,\n    b,\n)``)."""
    if "#" in lines[lineno - 1]:
        return True
    above = lineno - 2
    while above >= 0:
        text = lines[above].strip()
        continued = text.endswith((",", "(")) or text == ")"
        if not (text.startswith(("from ", "import ")) or continued):
            break
        above -= 1
    return above >= 0 and lines[above].strip().startswith("#")


def _visit(
    node: ast.AST,
    source: str,
    lines: list[str],
    modules: dict[str, Path],
    in_function: bool = False,
    type_checking: bool = False,
) -> Iterator[Import]:
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.Import | ast.ImportFrom):
            names: list[str] = []
            if isinstance(child, ast.Import):
                names = [alias.name for alias in child.names]
            elif child.module and child.level == 0:
                names = [f"{child.module}.{alias.name}" for alias in child.names]
            commented = _commented(lines, child.lineno)
            for name in names:
                target = _resolve(name, modules) if name.split(".")[0] in PACKAGES else None
                if target is not None and target != source:
                    yield Import(
                        source, target, child.lineno, in_function, type_checking, commented
                    )
            package = child.module if isinstance(child, ast.ImportFrom) else None
            if package and child.level == 0 and package != source and _is_package(package, modules):
                yield Import(
                    source, package, child.lineno, in_function, type_checking, commented, True
                )
        elif isinstance(child, ast.If) and _is_type_checking(child.test):
            yield from _visit(child, source, lines, modules, in_function, True)
        else:
            inner = in_function or isinstance(
                child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda
            )
            yield from _visit(child, source, lines, modules, inner, type_checking)


def imports_of(root: Path) -> Iterator[Import]:
    modules = _modules(root)
    for source, path in modules.items():
        text = path.read_text()
        yield from _visit(ast.parse(text), source, text.splitlines(), modules)


def _under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


#: The scheduling core: what a task is and where it is declared, its timetable, the run path,
#: and one module per rule -- Dagster-free at import, and below every shell.
SCHEDULING_CORE: tuple[str, ...] = tuple(
    f"orchestration.{name}"
    for name in (
        "task_spec",
        "timetable",
        "declarations",
        "task_run",
        "overlap",
        "pause",
        "retry",
        "manual_launch",
        "reclaim",
        "catch_up",
        "deadline",
        "missed_dues",
    )
)
#: The shells of ``orchestration/``: the tasks' Dagster definitions and the CLI.
SHELLS: tuple[str, ...] = (
    "orchestration.task_defs",
    "orchestration.component",
    "orchestration.checks",
    "orchestration.definitions",
    "orchestration.cli",
)

#: (importer, what it must not import, importers exempt, targets exempt)
FORBIDDEN: tuple[tuple[str, str, tuple[str, ...], tuple[str, ...]], ...] = (
    ("resources", "orchestration", (), ()),
    ("resources", "sensors", (), ()),
    ("resources", "assets", (), ()),
    ("resources.core", "resources", (), ("resources.core",)),
    ("assets", "sensors", (), ()),
    ("sensors", "assets", (), ()),
    ("orchestration", "assets", ("orchestration.definitions",), ()),
    ("orchestration", "sensors", ("orchestration.definitions",), ()),
    *(
        (layer, shell, (), ())
        for layer in ("orchestration.services", *SCHEDULING_CORE)
        for shell in SHELLS
    ),
)


def layer_violations(found: list[Import]) -> list[str]:
    problems = []
    for imp in found:
        for who, what, exempt_sources, exempt_targets in FORBIDDEN:
            if not _under(imp.source, who) or not _under(imp.target, what):
                continue
            if imp.source in exempt_sources or any(_under(imp.target, t) for t in exempt_targets):
                continue
            problems.append(f"{imp.source}:{imp.line} imports {imp.target} ({who} -> {what})")
    return problems


def cycles(found: list[Import]) -> list[list[str]]:
    """Every strongly connected group of modules (Tarjan), TYPE_CHECKING imports aside."""
    graph: dict[str, set[str]] = {}
    for imp in found:
        if not imp.type_checking:
            graph.setdefault(imp.source, set()).add(imp.target)
            graph.setdefault(imp.target, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                connect(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                group.append(top)
                if top == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return groups


def _package_parents(found: list[Import]) -> list[Import]:
    """Drop edges into a module's own parent package that only name a submodule
    (``from P.sub import x``): Python runs P's ``__init__`` before any submodule, which is no
    dependency of the submodule's. An import *from the package itself* (``from P import
    sub``) is kept: it needs P's ``__init__`` to have run far enough, so a P whose
    ``__init__`` imports the importer is a cycle through the package ``__init__``."""
    return [imp for imp in found if imp.through_init or not _under(imp.source, imp.target)]


#: The vocabulary: Dagster-free, importing only itself.
CORE: tuple[str, ...] = ("resources.core",)


def _in_core(module: str) -> bool:
    return any(_under(module, c) for c in CORE)


def _dagster_imports(root: Path, modules: tuple[str, ...]) -> list[str]:
    """Module-level imports of Dagster in ``modules`` (``if TYPE_CHECKING:`` annotations and
    imports inside functions aside)."""
    problems = []
    for module, path in _modules(root).items():
        if not any(_under(module, m) for m in modules):
            continue
        for node in ast.parse(path.read_text()).body:
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            problems += [
                f"{module}:{node.lineno} imports {name} (Dagster-free)"
                for name in names
                if name.split(".")[0] in ("dagster", "dagster_shared")
            ]
    return problems


def core_violations(root: Path, found: list[Import]) -> list[str]:
    """Core modules that import Dagster, or a project module outside the core."""
    problems = [
        f"{imp.source}:{imp.line} imports {imp.target} (the core imports only the core)"
        for imp in found
        if _in_core(imp.source) and not _in_core(imp.target)
    ]
    for module, path in _modules(root).items():
        if not _in_core(module):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            problems += [
                f"{module}:{node.lineno} imports {name} (the core is Dagster-free)"
                for name in names
                if name.split(".")[0] in ("dagster", "dagster_shared")
            ]
    return problems


def shared_names(root: Path) -> list[str]:
    """File names that two modules use for two concepts. A name may repeat where a shell
    (``sensors/``, ``orchestration/cli/``) runs the concept its namesake holds, and in the task
    folders of ``assets/`` (``tasks.py``: the bodies beside each ``defs.yaml``)."""
    by_name: dict[str, list[str]] = {}
    for module, path in _modules(root).items():
        if path.name not in ("__init__.py", "tasks.py"):
            by_name.setdefault(path.name, []).append(module)
    problems = []
    for name, found in sorted(by_name.items()):
        inner = [m for m in found if not m.startswith(("sensors.", "orchestration.cli."))]
        if len(inner) > 1:
            problems.append(f"{name}: {', '.join(sorted(inner))}")
    return problems


def uncommented_local_imports(found: list[Import]) -> list[str]:
    return [
        f"{imp.source}:{imp.line} imports {imp.target} inside a function without a comment"
        for imp in found
        if imp.in_function and not imp.commented
    ]


@pytest.fixture(scope="module")
def project_imports() -> list[Import]:
    return _package_parents(list(imports_of(ROOT)))


def test_the_reader_sees_the_project(project_imports: list[Import]) -> None:
    edges = {(i.source, i.target) for i in project_imports}
    assert ("resources.ledger.transitions", "resources.core.entry") in edges
    assert ("orchestration.task_run", "orchestration.overlap") in edges
    assert ("orchestration.definitions", "sensors") in edges


def test_every_import_points_down(project_imports: list[Import]) -> None:
    assert layer_violations(project_imports) == []


def test_the_core_is_dagster_free_and_imports_only_the_core(
    project_imports: list[Import],
) -> None:
    assert core_violations(ROOT, project_imports) == []


def test_no_import_cycles(project_imports: list[Import]) -> None:
    assert cycles(project_imports) == []


def test_imports_inside_functions_say_why(project_imports: list[Import]) -> None:
    assert uncommented_local_imports(project_imports) == []


def test_the_scheduling_core_loads_no_dagster() -> None:
    assert _dagster_imports(ROOT, SCHEDULING_CORE) == []


def test_one_name_per_concept() -> None:
    assert shared_names(ROOT) == []


def _write(root: Path, files: dict[str, str]) -> None:
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_the_checks_catch_an_upward_import_a_cycle_and_a_silent_local_import(
    tmp_path: Path,
) -> None:
    _write(
        tmp_path,
        {
            "resources/__init__.py": "",
            "resources/core/__init__.py": "",
            "resources/core/due.py": "from resources.store import X\nimport dagster as dg\n",
            "resources/store.py": "from orchestration.cli import main\n",
            "orchestration/__init__.py": "",
            "orchestration/cli.py": "from orchestration.runner import go\n",
            "orchestration/runner.py": (
                "def go():\n    from orchestration.cli import main\n\n"
                "def ok():\n    # why: loaded only here\n    from resources.store import X\n"
            ),
            "sensors/__init__.py": "import assets.a\n",
            "assets/__init__.py": "",
            "assets/a.py": "",
        },
    )
    found = _package_parents(list(imports_of(tmp_path)))
    assert layer_violations(found) == [
        "resources.core.due:1 imports resources.store (resources.core -> resources)",
        "resources.store:1 imports orchestration.cli (resources -> orchestration)",
        "sensors:1 imports assets.a (sensors -> assets)",
    ]
    assert core_violations(tmp_path, found) == [
        "resources.core.due:1 imports resources.store (the core imports only the core)",
        "resources.core.due:2 imports dagster (the core is Dagster-free)",
    ]
    assert cycles(found) == [["orchestration.cli", "orchestration.runner", "resources.store"]]
    assert uncommented_local_imports(found) == [
        "orchestration.runner:2 imports orchestration.cli inside a function without a comment"
    ]


def test_the_checks_catch_a_cycle_through_a_package_init_and_a_name_used_twice(
    tmp_path: Path,
) -> None:
    # The shape of a cycle the ledger package once had: its __init__ re-exports the resource,
    # and the resource took a sibling module from the package itself.
    _write(
        tmp_path,
        {
            "resources/__init__.py": "",
            "resources/ledger/__init__.py": "from resources.ledger.resource import Ledger\n",
            "resources/ledger/resource.py": "from resources.ledger import migrate\nLedger = 1\n",
            "resources/ledger/migrate.py": "",
            "resources/ledger/model.py": "from resources.ledger.migrate import x\n",
            "assets/__init__.py": "",
            "assets/model.py": "",
            "sensors/__init__.py": "",
            "sensors/migrate.py": "",
        },
    )
    found = _package_parents(list(imports_of(tmp_path)))
    assert cycles(found) == [["resources.ledger", "resources.ledger.resource"]]
    assert shared_names(tmp_path) == ["model.py: assets.model, resources.ledger.model"]
