"""The package's architecture, checked on its source (docs/architecture.md).

Walks every module of ``osa_lab`` with :mod:`ast` (no imports are executed) and fails on:

* an import cycle between osa_lab modules, counting imports inside functions too;
* a ``_private`` name of one osa_lab module used by another (``from osa_lab.x import _y`` or
  ``x._y`` on an imported osa_lab module): a helper two modules share is public;
* an import that points up: a module may import its own wing and the wings below it, never a
  higher one (the floors of docs/architecture.md, :data:`FLOORS`);
* a retired module path (:data:`RETIRED_MODULES`) anywhere in the package, tests, docs,
  notebooks, benchmarks or scripts, or a module file that still carries one.
* a module over :data:`MAX_MODULE_LINES` lines or a function body over
  :data:`MAX_FUNCTION_LINES` code lines, unless it is listed with a ceiling
  (:data:`OVERSIZED`, :data:`LONG_FUNCTIONS`).
"""

from __future__ import annotations

import ast
import builtins
import io
import re
import sys
import tokenize
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "osa_lab"

#: floors from the bottom up (docs/architecture.md); a module's wing is the first name under
#: ``osa_lab`` (the package or top-level module it belongs to).
FLOORS: list[set[str]] = [
    # shared by all: exceptions, CLI argument checks, the lab extra's check, the version,
    # whole-or-absent output files and locks
    {"errors", "arguments", "extras", "version", "fileio"},
    {"ops"},  # the mathematics
    {"nn"},  # layers, models, presets
    {"plots"},  # figures from tidy tables
    {"benchmarking"},  # timing helpers and ``osa-lab bench``
    {"studies"},  # experiments: settings → tidy tables
    {"reporting"},  # report notebooks' runner and set-up
    {"integrations"},  # bridges to other libraries (timm)
    # entry points: the command line (also ``python -m osa_lab``), the dashboard app, the
    # package's public face
    {"cli", "__main__", "dashboard", "__init__"},
]

#: (importing module, imported module): the only upward imports allowed. Keep it tiny; each
#: entry says why.
ALLOWED_UPWARD: set[tuple[str, str]] = set()


@dataclass(frozen=True)
class Import:
    source: str  # importing module
    target: str  # imported module (the module that holds the name)
    name: str | None  # the name taken from it by ``from target import name``; None for ``import``
    line: int


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES: dict[str, Path] = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def real(name: str) -> str:
    """The module that holds ``name``: the name itself, or the module owning the attribute."""
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
        ("import osa_lab.studies.depth as A", [("osa_lab.studies.depth", None)]),
        ("from osa_lab.ops import expm", [("osa_lab.ops.expm", None)]),
        ("from osa_lab.ops.expm import _x, y", [("osa_lab.ops.expm", "_x"), ("osa_lab.ops.expm", "y")]),
        ("def f():\n    from osa_lab.studies.jacobian import _build", [("osa_lab.studies.jacobian", "_build")]),
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


def exception_classes_outside_the_root(tree: ast.Module, rooted: set[str]) -> list[str]:
    """Classes (at any depth) that derive from an exception or warning type but from none of
    ``rooted`` (the names of :class:`osa_lab.errors.OSALabError` and its subclasses)."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.ClassDef):
            continue
        bases = [(dotted(base) or "").split(".")[-1] for base in node.bases]
        exception_like = any(
            name.endswith(("Error", "Exception", "Warning"))
            or isinstance(getattr(builtins, name, None), type) and issubclass(getattr(builtins, name), BaseException)
            for name in bases
        )
        if exception_like and not any(name in rooted for name in bases):
            found.append(f"{node.lineno} class {node.name}({', '.join(bases)})")
    return found


def test_every_exception_type_derives_from_osalaberror():
    """One root: ``except OSALabError`` catches everything osa_lab raises, its warnings included."""
    from osa_lab import errors

    defined = [obj for obj in vars(errors).values()
               if isinstance(obj, type) and issubclass(obj, BaseException) and obj.__module__ == errors.__name__]  # fmt: skip
    assert len(defined) > 20
    assert [cls.__name__ for cls in defined if not issubclass(cls, errors.OSALabError)] == []
    rooted = {cls.__name__ for cls in defined}
    outside = [
        f"{name}:{where}"
        for name, tree in TREES.items()
        for where in exception_classes_outside_the_root(tree, rooted)
        if not (name == "osa_lab.errors" and where.endswith(" class OSALabError(Exception)"))  # the root itself
    ]
    assert outside == []


@pytest.mark.parametrize(
    "source, expected",
    [
        ("class BadTable(ValueError):\n    pass", ["1 class BadTable(ValueError)"]),
        ("def f():\n    class _Stop(Exception):\n        pass", ["2 class _Stop(Exception)"]),
        ("class Slow(UserWarning):\n    pass", ["1 class Slow(UserWarning)"]),
        ("class Lost(distributed.CommClosedError):\n    pass", ["1 class Lost(CommClosedError)"]),
        ("class Fine(errors.OSAInputError):\n    pass", []),
        ("def f():\n    class _Stop(OSALabError):\n        pass", []),
        ("class Model(nn.Module):\n    pass", []),
    ],
)
def test_the_root_check_sees_every_exception_class(source, expected):
    assert exception_classes_outside_the_root(ast.parse(source), {"OSALabError", "OSAInputError"}) == expected


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


#: Module paths that no longer exist (CHANGELOG.md, 0.2.0, names each replacement). Nothing may
#: import or mention them, and no module may be named after them.
RETIRED_MODULES: frozenset[str] = frozenset({
    "osa_lab.analysis", "osa_lab.bench", "osa_lab.benchtools", "osa_lab.checks", "osa_lab.compat",
    "osa_lab.dashboard_cli", "osa_lab.dashboard_jobs", "osa_lab.data", "osa_lab.deprecation",
    "osa_lab.depth_facts", "osa_lab.expm", "osa_lab.expm_study", "osa_lab.functional", "osa_lab.grid",
    "osa_lab.jacobian", "osa_lab.kernels", "osa_lab.layers", "osa_lab.metrics", "osa_lab.models",
    "osa_lab.notebook", "osa_lab.presets", "osa_lab.provenance", "osa_lab.report", "osa_lab.train",
    "osa_lab.validation",
})  # fmt: skip

#: where the scan looks: every text file a reader or an import can reach
SCANNED = [("osa_lab", "*.py"), ("tests", "*.py"), ("docs", "*.md"), ("docs", "*.py"), ("notebooks", "*.py"),
           ("benchmarks", "*.py"), ("examples", "*.py"), ("dashboards", "*.py"), ("scripts", "*"),
           (".", "*.md"), (".", "*.toml"), (".", "*.yml"), (".", "Makefile")]  # fmt: skip

_RETIRED_LEAVES = "|".join(sorted((name.split(".", 1)[1] for name in RETIRED_MODULES), key=len, reverse=True))
#: ``osa_lab.<retired>`` as a dotted path, and ``from osa_lab import <retired>`` (also in parentheses)
_RETIRED_PATH = re.compile(rf"(?<![\w.])osa_lab\.({_RETIRED_LEAVES})(?![\w])")
_FROM_PACKAGE = re.compile(r"from\s+osa_lab\s+import\s+(\([^)]*\)|[^\n]*)")


def retired_mentions(text: str) -> list[str]:
    """Every retired module path that ``text`` names, in the order it names them."""
    found = [f"osa_lab.{m.group(1)}" for m in _RETIRED_PATH.finditer(text)]
    for match in _FROM_PACKAGE.finditer(text):
        for item in re.split(r"[,()\s]+", match.group(1).split("#")[0]):
            if f"osa_lab.{item}" in RETIRED_MODULES:
                found.append(f"osa_lab.{item}")
    return found


def scanned_files() -> list[Path]:
    files = {
        path
        for folder, pattern in SCANNED
        for path in (ROOT / folder).glob(pattern if folder == "." else f"**/{pattern}")
        if path.is_file() and ".venv" not in path.parts and "__pycache__" not in path.parts
    }
    skipped = {Path(__file__).resolve(), ROOT / "CHANGELOG.md"}
    return sorted(files - skipped)


def test_no_retired_module_path_is_used_or_mentioned():
    assert len(scanned_files()) > 80
    mentions = [
        f"{path.relative_to(ROOT)}:{text.count(chr(10), 0, text.find(name)) + 1} {name}"
        for path in scanned_files()
        for text in [path.read_text(encoding="utf-8", errors="replace")]
        for name in retired_mentions(text)
    ]
    assert mentions == []
    modules = sorted(name for name in MODULES if name in RETIRED_MODULES)
    assert modules == []


@pytest.mark.parametrize(
    "text, expected",
    [
        ("import osa_lab.analysis as A", ["osa_lab.analysis"]),
        (":func:`osa_lab.train.train`", ["osa_lab.train"]),
        ("from osa_lab import (\n    jacobian,\n    osa,\n)", ["osa_lab.jacobian"]),
        ("from osa_lab import notebook as nb", ["osa_lab.notebook"]),
        ("from osa_lab.kernels import triton_osa", ["osa_lab.kernels"]),
        ("osa_lab.studies.jacobian, osa_lab.reporting.runner, osa_lab.dashboard.cli", []),
        ("from osa_lab import osa, OrthogonalSelfAttention", []),
    ],
)
def test_the_retired_path_scan_sees_every_form(text, expected):
    assert retired_mentions(text) == expected


# ---------------------------------------------------------------------------- small rooms, no history

#: the size a module should stay under
MAX_MODULE_LINES = 600

#: modules over :data:`MAX_MODULE_LINES`: (ceiling, why). A ceiling may come down, never go up; an
#: entry whose module is back under the limit must be removed.
OVERSIZED: dict[str, tuple[int, str]] = {
    "ops/triton/kernels.py": (1000, "the Triton kernels, their launch plans and tile tables load as one module "
                                    "(the interpreter and the compile check import it whole)"),
}


def _module_lines() -> dict[str, int]:
    return {path.relative_to(PACKAGE).as_posix(): len(path.read_text(encoding="utf-8").splitlines())
            for path in PACKAGE.rglob("*.py")}  # fmt: skip


def test_modules_stay_small_or_are_listed_with_a_ceiling():
    lines = _module_lines()
    too_big = {name: n for name, n in lines.items() if n > MAX_MODULE_LINES and name not in OVERSIZED}
    assert too_big == {}, f"modules over {MAX_MODULE_LINES} lines: split them by subject"
    grown = {name: (lines.get(name), ceiling) for name, (ceiling, _) in OVERSIZED.items() if lines.get(name, 0) > ceiling}
    assert grown == {}, "oversized modules grew past their ceiling"
    stale = sorted(name for name in OVERSIZED if lines.get(name, 0) <= MAX_MODULE_LINES)
    assert stale == [], f"{stale} are small now (or gone): remove them from OVERSIZED"


#: the size a function body should stay under, in code lines: its docstring, blank lines and
#: comment-only lines do not count
MAX_FUNCTION_LINES = 80

#: functions (``module.Class.function``; a nested function's lines count for its outer one too)
#: over :data:`MAX_FUNCTION_LINES`: (ceiling, why). The ceiling is the body's size now: it may
#: come down with the function, never go up; an entry back under the limit must be removed.
LONG_FUNCTIONS: dict[str, tuple[int, str]] = {}

_NOT_CODE = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENCODING,
             tokenize.ENDMARKER}  # fmt: skip


def function_lengths(source: str, module: str) -> dict[str, int]:
    """Code lines of every function body in ``source``, by qualified name (``module.Class.function``).

    A line counts when a token other than a comment is on it (a multi-line string counts every
    line it spans); the docstring does not count."""
    code: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type not in _NOT_CODE:
            code.update(range(tok.start[0], tok.end[0] + 1))
    found: dict[str, int] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                name, first = f"{prefix}.{child.name}", child.body[0]
                body = set(range(first.lineno, child.end_lineno + 1))
                if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                        and isinstance(first.value.value, str):  # fmt: skip
                    body -= set(range(first.lineno, first.end_lineno + 1))
                found[name] = len(body & code)
                visit(child, name)
            else:
                visit(child, f"{prefix}.{child.name}" if isinstance(child, ast.ClassDef) else prefix)

    visit(ast.parse(source), module)
    return found


def test_function_length_counts_code_lines_only():
    source = '''
class Box:
    def method(self):
        """A docstring
        of three lines.
        """
        # a comment

        x = 1  # a trailing comment
        text = """two
        lines"""

        def inner():
            return x

        return inner, text


async def free(a,
               b):
    return a + b
'''
    assert function_lengths(source, "m") == {"m.Box.method": 6, "m.Box.method.inner": 1, "m.free": 1}


def test_functions_stay_short_or_are_listed_with_a_ceiling():
    lengths = {name: n for module, path in MODULES.items()
               for name, n in function_lengths(path.read_text(encoding="utf-8"), module).items()}  # fmt: skip
    too_long = {name: n for name, n in lengths.items() if n > MAX_FUNCTION_LINES and name not in LONG_FUNCTIONS}
    assert too_long == {}, f"function bodies over {MAX_FUNCTION_LINES} code lines: split them by step"
    grown = {name: (lengths.get(name), ceiling) for name, (ceiling, _) in LONG_FUNCTIONS.items()
             if lengths.get(name, 0) > ceiling}  # fmt: skip
    assert grown == {}, "long functions grew past their ceiling"
    stale = sorted(name for name in LONG_FUNCTIONS if lengths.get(name, 0) <= MAX_FUNCTION_LINES)
    assert stale == [], f"{stale} are short now (or gone): remove them from LONG_FUNCTIONS"
    slack = {name: (lengths[name], ceiling) for name, (ceiling, _) in LONG_FUNCTIONS.items()
             if name in lengths and lengths[name] < ceiling}  # fmt: skip
    assert slack == {}, "long functions shrank: lower their ceilings to their length (the ratchet only comes down)"


#: an issue or pull-request number, or a date: history, which lives in git log and CHANGELOG.md
_HISTORY = re.compile(r"\b[Ii]ssues?[ -]#?\d+\b|\b(?:PR|pull request) #?\d+\b|\b20\d\d-[01]\d-[0-3]\d\b")


def history_mentions(text: str) -> list[str]:
    """Issue numbers and dates named in ``text``."""
    return [m.group(0) for m in _HISTORY.finditer(text)]


@pytest.mark.parametrize("text, expected", [
    ("# fixed in issue 13", ["issue 13"]), ("(Issue 11 item 8)", ["Issue 11"]), ("measured 2026-12-01", ["2026-12-01"]),
    ("see PR #42", ["PR #42"]), ("the issue-16 ideas", ["issue-16"]), ("an issue with 3 layers", []),
    ("version 2.13.0", []),
])  # fmt: skip
def test_the_history_scan_catches_numbers_and_dates(text, expected):
    assert history_mentions(text) == expected


def test_package_and_test_sources_speak_of_the_code_not_of_its_history():
    this = Path(__file__).resolve()
    found = [f"{path.relative_to(ROOT)}: {hit}"
             for folder in (PACKAGE, ROOT / "tests", ROOT / "benchmarks", ROOT / "dashboards", ROOT / "notebooks")
             for path in sorted(folder.rglob("*.py")) if path.resolve() != this
             for hit in history_mentions(path.read_text(encoding="utf-8"))]  # fmt: skip
    assert found == []


def test_each_resolve_function_is_defined_once():
    """One ``resolve_…`` function per concept: a name defined in two modules resolves two things
    under one name (or the same thing twice)."""
    where: dict[str, list[str]] = {}
    for name, tree in TREES.items():
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith("resolve_"):
                where.setdefault(node.name, []).append(name)
    assert {f: mods for f, mods in where.items() if len(mods) > 1} == {}


#: calls that change torch's or Python's process-wide state for everyone in the process
PROCESS_WIDE_STATE = ("sys.meta_path", "torch.set_default_dtype(", "torch.random.fork_rng(", "_SEEDED_BUILD_LOCK")


def test_the_package_changes_no_process_wide_state():
    found = [f"{path.relative_to(ROOT)}: {name}" for path in sorted(PACKAGE.rglob("*.py"))
             for name in PROCESS_WIDE_STATE if name in path.read_text(encoding="utf-8")]  # fmt: skip
    assert found == []


# ---------------------------------------------------------------------------- no private torch internals


def torch_c_uses(source: str) -> list[str]:
    """Every use of ``torch._C`` (PyTorch's private C extension) in ``source``: ``import torch._C…``,
    ``from torch._C… import …``, ``from torch import _C`` and the attribute ``<torch>._C``, where
    ``<torch>`` is any name ``torch`` is imported as. Found on the syntax tree, so a mention in a
    string or comment does not count and an alias does not hide one."""
    tree = ast.parse(source)
    torch_names = {"torch"} | {
        alias.asname
        for node in ast.walk(tree) if isinstance(node, ast.Import)
        for alias in node.names if alias.name == "torch" and alias.asname
    }  # fmt: skip
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [f"import {a.name}" for a in node.names if a.name == "torch._C" or a.name.startswith("torch._C.")]
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "torch._C" or node.module.startswith("torch._C."):
                found.append(f"from {node.module} import …")
            elif node.module == "torch" and any(a.name == "_C" for a in node.names):
                found.append("from torch import _C")
        elif isinstance(node, ast.Attribute) and node.attr == "_C":
            if isinstance(node.value, ast.Name) and node.value.id in torch_names:
                found.append(f"{node.value.id}._C")
    return found


@pytest.mark.parametrize("source, expected", [
    ("torch._C._functorch.is_functorch_wrapped_tensor(t)", ["torch._C"]),
    ("import torch as th\nth._C._are_functorch_transforms_active()", ["th._C"]),
    ("import torch._C._functorch", ["import torch._C._functorch"]),
    ("from torch._C import _functorch", ["from torch._C import …"]),
    ("from torch import _C", ["from torch import _C"]),
    ("torch.func.debug_unwrap(t, recurse=False)\n'torch._C in a string'  # torch._C in a comment", []),
])  # fmt: skip
def test_the_torch_c_scan_sees_every_form(source, expected):
    assert torch_c_uses(source) == expected


def test_the_package_uses_no_torch_c():
    """``torch._C`` is PyTorch's private C extension: its names change between releases without
    notice. The package uses public APIs only (torch.func, autograd.Function's torch.func support)."""
    found = [f"{path.relative_to(ROOT)}: {use}" for path in sorted(PACKAGE.rglob("*.py"))
             for use in torch_c_uses(path.read_text(encoding="utf-8"))]  # fmt: skip
    assert found == []
