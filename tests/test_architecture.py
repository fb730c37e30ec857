"""The package's architecture, checked on its source (docs/architecture.md).

Walks every module of ``osa_lab`` with :mod:`ast` (no imports are executed) and fails on:

* an import cycle between osa_lab modules, counting imports inside functions too;
* a ``_private`` name of one osa_lab module used by another (``from osa_lab.x import _y`` or
  ``x._y`` on an imported osa_lab module): a helper two modules share is public;
* an import that points up: a module may import its own wing and the wings below it, never a
  higher one (the floors of docs/architecture.md, :data:`FLOORS`).

Old module paths (``osa_lab.analysis`` …, see :mod:`osa_lab.compat`) are resolved to the
module that now holds the code before any rule is applied.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from osa_lab.compat import MOVED

PACKAGE = Path(__file__).resolve().parents[1] / "osa_lab"

#: floors from the bottom up (docs/architecture.md); a module's wing is the first name under
#: ``osa_lab`` (the package or top-level module it belongs to).
FLOORS: list[set[str]] = [
    # shared by all: exceptions, CLI argument checks, renames, whole-or-absent output files and locks
    {"errors", "arguments", "version", "deprecation", "fileio"},
    {"ops"},  # the mathematics
    {"nn"},  # layers, models, presets
    {"plots"},  # figures from tidy tables
    {"benchmarking"},  # timing helpers and ``osa-lab bench``
    {"studies"},  # experiments: settings → tidy tables
    {"reporting"},  # report notebooks' runner and set-up
    {"integrations"},  # bridges to other libraries (timm)
    # entry points: the command line, the dashboard app, the package's public face and its
    # old-path finder
    {"cli", "dashboard", "dashboard_cli", "dashboard_jobs", "__init__", "compat"},
]

#: (importing module, imported module): the only upward imports allowed. Keep it tiny; each
#: entry says why.
ALLOWED_UPWARD: set[tuple[str, str]] = set()


@dataclass(frozen=True)
class Import:
    source: str  # importing module
    target: str  # imported module (after resolving old paths)
    name: str | None  # the name taken from it by ``from target import name``; None for ``import``
    line: int


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES: dict[str, Path] = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def real(name: str) -> str:
    """The module that holds ``name``'s code: old paths resolved, an attribute's owner found."""
    for old in sorted(MOVED, key=len, reverse=True):
        if name == old or name.startswith(old + "."):
            name = MOVED[old] + name[len(old) :]
            break
    while name not in MODULES and "." in name:
        name = name.rsplit(".", 1)[0]
    return name


def is_package(name: str) -> bool:
    return MODULES[name].name == "__init__.py"


def imports_of(name: str, tree: ast.Module) -> list[Import]:
    found: list[Import] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "osa_lab":
                    found.append(Import(name, real(alias.name), None, node.lineno))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package(name) else name.split(".")[:-1]
                base = base[: len(base) - node.level + 1]
                origin = ".".join(base + ([node.module] if node.module else []))
            else:
                origin = node.module or ""
            if origin.split(".")[0] != "osa_lab":
                continue
            for alias in node.names:
                full = real(f"{origin}.{alias.name}")
                if full == f"{origin}.{alias.name}" or full in MODULES and full != real(origin):
                    found.append(Import(name, full, None, node.lineno))  # a submodule
                else:
                    found.append(Import(name, real(origin), alias.name, node.lineno))
    return found


def module_aliases(name: str, tree: ast.Module) -> dict[str, str]:
    """Local names bound to osa_lab modules (``import osa_lab.x as m``, ``from osa_lab import x``)."""
    bound: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "osa_lab":
                    bound[alias.asname or alias.name] = real(alias.name) if alias.asname else alias.name
        elif isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").startswith("osa_lab"):
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                if real(full) in MODULES and real(full) != real(node.module):
                    bound[alias.asname or alias.name] = real(full)
    return bound


def dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        head = dotted(node.value)
        return None if head is None else f"{head}.{node.attr}"
    return None


def is_private(attr: str) -> bool:
    return attr.startswith("_") and not attr.startswith("__")


TREES = {name: ast.parse(path.read_text(encoding="utf-8"), str(path)) for name, path in MODULES.items()}
IMPORTS = [imp for name, tree in TREES.items() for imp in imports_of(name, tree)]


def wing(name: str) -> str:
    parts = name.split(".")
    return "__init__" if len(parts) == 1 else parts[1]


def floor(name: str) -> int:
    for level, wings in enumerate(FLOORS):
        if wing(name) in wings:
            return level
    raise AssertionError(f"{name}: wing {wing(name)!r} is on no floor; add it to FLOORS and docs/architecture.md")


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), plus self-imports."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in edges.get(v, ()):
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_every_module_is_parsed_and_on_a_floor():
    assert len(MODULES) > 30
    for name in MODULES:
        floor(name)


def test_no_import_cycles_between_osa_lab_modules():
    edges: dict[str, set[str]] = {}
    for imp in IMPORTS:
        if imp.target != imp.source:
            edges.setdefault(imp.source, set()).add(imp.target)
    assert cycles(edges) == []


def test_no_private_name_crosses_a_module_boundary():
    crossings = [
        f"{imp.source}:{imp.line} imports {imp.name} from {imp.target}"
        for imp in IMPORTS
        if imp.name and is_private(imp.name) and imp.target != imp.source
    ]
    for name, tree in TREES.items():
        bound = module_aliases(name, tree)
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute) or not is_private(node.attr):
                continue
            owner = dotted(node.value)
            if owner is None:
                continue
            target = bound.get(owner) or (real(owner) if owner.startswith("osa_lab.") else None)
            if target and target in MODULES and target != name:
                crossings.append(f"{name}:{node.lineno} uses {owner}.{node.attr} ({target})")
    assert crossings == []


def test_imports_point_down():
    upward = [
        f"{imp.source}:{imp.line} (floor {floor(imp.source)}) imports {imp.target} (floor {floor(imp.target)})"
        for imp in IMPORTS
        if floor(imp.target) > floor(imp.source) and (imp.source, imp.target) not in ALLOWED_UPWARD
    ]
    assert upward == []


@pytest.mark.parametrize(
    "source, expected",
    [
        ("import osa_lab.analysis as A", [("osa_lab.studies.depth", None)]),
        ("from osa_lab.ops import expm", [("osa_lab.ops.expm", None)]),
        ("from osa_lab.ops.expm import _x, y", [("osa_lab.ops.expm", "_x"), ("osa_lab.ops.expm", "y")]),
        ("def f():\n    from osa_lab.jacobian import _build", [("osa_lab.studies.jacobian", "_build")]),
        ("from osa_lab import osa", [("osa_lab", "osa")]),
    ],
)
def test_the_walker_sees_imports_in_every_form(source, expected):
    found = imports_of("osa_lab.probe", ast.parse(source))
    assert [(imp.target, imp.name) for imp in found] == expected


def test_the_checks_catch_a_cycle_and_an_attribute_access():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    tree = ast.parse("from osa_lab.ops import expm\nexpm.gram_core_with_norm(1)\n")
    assert module_aliases("osa_lab.probe", tree) == {"expm": "osa_lab.ops.expm"}


def test_every_exception_type_lives_in_errors():
    """``osa_lab.errors`` holds every exception and warning type (other modules import them)."""
    elsewhere = []
    for name, tree in TREES.items():
        if name == "osa_lab.errors":
            continue
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and any(
                (dotted(base) or "").split(".")[-1].endswith(("Error", "Exception", "Warning")) for base in node.bases
            ):
                elsewhere.append(f"{name}:{node.lineno} class {node.name}")
    assert elsewhere == []


def test_the_gram_trust_rule_is_written_once():
    """The Triton kernels decide trust with ``ops.expm.gram_trust_ratio`` (the torch engine's rule)
    and run the core's backward through ``ops.expm.gram_core_backward``: neither re-reads the
    budgets nor calls autograd on the core itself, so CPU and GPU paths cannot drift apart."""
    source = (PACKAGE / "ops" / "triton" / "kernels.py").read_text(encoding="utf-8")
    names = {node.attr for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Attribute)}
    assert {"gram_trust_ratio", "gram_core_backward"} <= names
    assert not names & {"GRAM_TOLERANCE", "GRAM_MAX_COND", "grad"}
