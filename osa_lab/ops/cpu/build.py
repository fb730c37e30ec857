"""Build the CPU kernels at first use from the C source shipped in this package, and load them.

The library is compiled by the system C compiler (``$CC``, else ``cc``; compiler caches such as
ccache turned off) with ``-march=native`` and kept in this user's own cache
(:mod:`osa_lab.ops.cpu.cache`: keyed by a hash of the sources, flags, compiler and CPU; owner and
permissions checked before loading; installed atomically), so later processes load it instead of
compiling again. Where the cache is off (``OSA_LAB_CPU_CACHE=0``), unusable, or its file system
refuses to map code (``noexec``), the library is compiled into a fresh private directory
(``tempfile.mkdtemp``, mode 0700) that is removed once it is loaded, and a ``logging`` warning on
``osa_lab.ops.cpu`` says why. Every build, cache hit or fallback logs one line there. Without a
compiler, or where the build fails, :func:`library` returns None, the callers keep the PyTorch
path, and :func:`status` says why (the benchmarks record it beside their figures).

``OSA_LAB_CPU_KERNELS=0`` turns the kernels off (the PyTorch path everywhere; :func:`turned_off`
does so for the calling thread). ``OSA_LAB_CPU_MARCH`` names the instruction set to build for
(``-march=``; default ``native``): ``x86-64-v3`` builds the AVX2 kernels on an AVX-512 machine,
the way the benchmarks measure the 8-float build without an AVX2 machine. A value that is not a
plain ``-march`` name, or that the compiler refuses, leaves the PyTorch path, and :func:`status`
says so. :func:`compile_library` builds a separate copy (another target, other register blocks,
:data:`GENERIC` for the default build's last resort) and :func:`using_library` has the callers take
it for a block: how builds are timed against each other in one process.
"""

from __future__ import annotations

import contextlib
import contextvars
import ctypes
import functools
import logging
import os
import re
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from osa_lab.errors import ConfigurationError, KernelFailedError, MethodUnavailableError
from osa_lab.ops.cpu import cache

log = logging.getLogger("osa_lab.ops.cpu")

#: The C sources, compiled together into one library.
SOURCES = tuple(Path(__file__).with_name(name) for name in ("chebyshev_action.c", "gram_passes.c", "core_products.c"))

#: Seconds the compiler may take before the build is given up.
BUILD_TIMEOUT_S = 120

_COMMON_FLAGS = ["-std=gnu11", "-shared", "-fPIC", "-pthread"]

#: The target name of the default build's last resort (for a compiler that knows no
#: ``-march=native``): no ``-march`` and no OpenMP, the kernels start their own pthreads.
GENERIC = "generic"
_MARCH_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,63}")

#: The register blocks a build may set (``compile_library``'s ``defines``): name → what the
#: value must divide (None: any value from 1 to 16). ``MR``: rows of the small-N action's blocks;
#: ``TN_*``, ``NN_*``: the Gram engine's transposed and plain token products; ``CORE_*``: the
#: core's float64 products; and ``PREFETCH_AHEAD`` (0–8, not a block): how many matrices ahead
#: the small-N action prefetches the rows of its strided views (0: none). The sources check the
#: same with ``#error``.
REGISTER_BLOCKS: dict[str, int | None] = {
    "MR": None, "TN_ROWS": 16, "TN_VECS": None, "NN_ROWS": None, "NN_VECS": None, "CORE_ROWS": 8, "CORE_VECS": None,
    "PREFETCH_AHEAD": None,
}
_MAX_BLOCK = {"TN_VECS": 8, "NN_VECS": 8, "CORE_VECS": 8, "PREFETCH_AHEAD": 8}
_MIN_BLOCK = {"PREFETCH_AHEAD": 0}

_state: dict[str, str] = {"status": "not built yet"}


#: The switch of :func:`turned_off`: the calling thread's (and task's) own, never the process's.
_turned_off: contextvars.ContextVar[bool] = contextvars.ContextVar("osa_lab_cpu_kernels_off", default=False)


def enabled() -> bool:
    """False inside :func:`turned_off`, or when the process-wide default ``OSA_LAB_CPU_KERNELS``
    is ``0``, ``false``, ``no`` or ``off``."""
    if _turned_off.get():
        return False
    return os.environ.get("OSA_LAB_CPU_KERNELS", "1").strip().lower() not in {"0", "false", "no", "off"}


@contextlib.contextmanager
def turned_off() -> Iterator[None]:
    """Inside the block the calling thread takes the PyTorch path (a context variable: other
    threads, and the process environment, are untouched): the benchmarks time and count that
    path beside the kernels'. Run a forward and its backward inside the same block."""
    token = _turned_off.set(True)
    try:
        yield
    finally:
        _turned_off.reset(token)


def target_arch() -> str:
    """The ``-march`` value the kernels are built for: ``OSA_LAB_CPU_MARCH``, else ``native``."""
    return os.environ.get("OSA_LAB_CPU_MARCH", "").strip() or "native"


def _flag_sets(march: str, extra: list[str] | None = None, openmp: bool = True) -> list[list[str]]:
    """Compiler flags for ``march`` in order of preference: OpenMP (the kernels run on torch's own
    OpenMP threads, threads.h), then without it (only without it where ``openmp`` is False);
    ``extra`` flags in every set. The target itself is never replaced by another."""
    if march == GENERIC:
        return [["-O3", *(extra or []), *_COMMON_FLAGS]]
    plain = ["-O3", f"-march={march}", *(extra or []), *_COMMON_FLAGS]
    return [[*plain[:2], "-fopenmp", *plain[2:]], plain] if openmp else [plain]


def _declare(lib: ctypes.CDLL) -> ctypes.CDLL:
    i, f, p, n = ctypes.c_int, ctypes.c_float, ctypes.c_void_p, ctypes.c_int64
    view: list[Any] = [p, p, n, n]  # base, per-matrix offsets, row stride, column stride
    lib.osa_cheb_prepare.argtypes = [i, i, i, *view, *view, p, p, p, ctypes.c_double, p, i]
    lib.osa_cheb_forward.argtypes = [i, i, i, i, p, *view, p, f, p, *view, p, p, i]
    lib.osa_cheb_backward.argtypes = [i, i, i, i, i, p, p, p, f, p, *(view * 6), p, i]
    token: list[Any] = [p, p, n]  # base, per-matrix offsets, row stride (columns contiguous)
    lib.osa_gram_tn.argtypes = [i, i, i, p, *(token * 3), i, p, p, p, i]
    lib.osa_gram_nn.argtypes = [i, i, i, i, p, *(token * 4), p, *token, *token, p, i]
    lib.osa_gram_vector_floats.argtypes = []
    lib.osa_core_bmm.argtypes = [i, i, p, p, p, p, ctypes.c_double, i]
    lib.osa_core_vector_doubles.argtypes = []
    for fn in (lib.osa_cheb_prepare, lib.osa_cheb_forward, lib.osa_cheb_backward, lib.osa_gram_tn, lib.osa_gram_nn, lib.osa_gram_vector_floats,
               lib.osa_core_bmm, lib.osa_core_vector_doubles):
        fn.restype = i
    return lib


def _compile(command: list[str]) -> subprocess.CompletedProcess:
    """Run the compiler in its own process group, with compiler caches turned off (the point is
    that nothing built elsewhere is used); on a timeout the whole group is killed."""
    env = {**os.environ, "CCACHE_DISABLE": "1"}
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True
    ) as proc:
        try:
            out, err = proc.communicate(timeout=BUILD_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise
    return subprocess.CompletedProcess(command, proc.returncode, out, err)


def _compiler() -> list[str]:
    return shlex.split(os.environ.get("CC", "cc")) or ["cc"]


def _march_problem(march: str) -> str | None:
    if _MARCH_NAME.fullmatch(march):
        return None
    return f"{march!r} is not a -march name (letters, digits, '.', '_', '+', '-'; e.g. native or x86-64-v3)"


def _compile_into(workdir: Path, compiler: list[str], flag_sets: list[list[str]]) -> tuple[Path | None, str]:
    """Compile with the first flag set that builds, in ``workdir``: (the library, its flags as
    :func:`status` shows them) or (None, the last reason)."""
    errors = []
    target = workdir / "osa_lab_cpu.so"
    for flags in flag_sets:
        try:
            done = _compile([*compiler, *flags, "-o", str(target), *map(str, SOURCES)])
        except (OSError, subprocess.TimeoutExpired) as err:
            errors.append(f"{type(err).__name__}: {err}")
            continue
        if done.returncode == 0 and target.exists():
            shown = " ".join(f for f in flags if f in ("-O3", "-fopenmp") or f.startswith(("-march=", "-D")))
            return target, f"{' '.join(compiler)} {shown}"
        lines = (done.stderr or done.stdout).strip().splitlines()
        named = [line for line in lines if "error" in line]  # the compiler's reason, not its notes
        errors.append((named or lines or [f"exit code {done.returncode}"])[0 if named else -1])
    return None, errors[-1] if errors else "unknown"


def _load(path: Path) -> tuple[ctypes.CDLL | None, str]:
    """(the loaded library, "") or (None, why it cannot be mapped, e.g. a ``noexec`` file system)."""
    try:
        return _declare(ctypes.CDLL(str(path))), ""
    except (OSError, AttributeError) as err:
        return None, f"{type(err).__name__}: {err}"


def _compile_and_load(compiler: list[str], flag_sets: list[list[str]]) -> tuple[ctypes.CDLL | None, str]:
    """Uncached: compile into a fresh private (0700) directory, load, and remove the directory
    (the loaded library stays mapped). (library, its flags) or (None, the reason)."""
    workdir = tempfile.mkdtemp(prefix="osa_lab_cpu_")
    try:
        built, said = _compile_into(Path(workdir), compiler, flag_sets)
        if built is None:
            return None, said
        lib, problem = _load(built)
        return (lib, said) if lib is not None else (None, f"the library built in {workdir} cannot be loaded: {problem}")
    except Exception as err:  # noqa: BLE001 - any failure is reported by the caller
        return None, f"{type(err).__name__}: {err}"
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _cache_root(compiler: list[str]) -> tuple[Path | None, str | None, str]:
    """(the cache directory, the compiler's identity, "") where the cache can be used; (None, the
    compiler's identity, why not) where the cache was wanted but is unusable; (None, None, why
    not) where it is turned off or the compiler cannot name its version."""
    directory = cache.cache_directory()
    if directory is None:
        return None, None, "the cache is turned off (OSA_LAB_CPU_CACHE) or needs POSIX owners"
    compiler_id = cache.compiler_identity(tuple(compiler))
    if compiler_id is None:
        return None, None, f"the compiler {compiler[0]!r} does not say its version"
    root, why = cache.prepared_directory(directory)
    return root, compiler_id, why or ""  # the identity tells the caller the cache was wanted


def _cached_load(compiler: list[str], flag_sets: list[list[str]]) -> tuple[ctypes.CDLL | None, str, str]:
    """The library through the per-user cache: (library or None, its flags or the reason it failed,
    where it came from). Falls back to :func:`_compile_and_load` where the cache cannot be used or
    its library cannot be mapped, with a warning that says why."""
    root, compiler_id, why = _cache_root(compiler)
    if root is not None and compiler_id is not None:
        key = cache.build_key(SOURCES, flag_sets, compiler_id)
        hit = cache.cached_build(root, key)
        if hit is not None:
            lib, problem = _load(hit[0])
            if lib is not None:
                return lib, hit[1], f"loaded from the cache {hit[0]}"
            why = f"the cached {hit[0]} cannot be loaded ({problem}); a noexec file system?"
        else:
            workdir = None
            try:
                workdir = cache.build_directory(root)
                built, said = _compile_into(workdir, compiler, flag_sets)
                if built is None:
                    return None, said, "compiled for the cache"
                installed = cache.install(built, said, root, key)
            except OSError as err:
                installed, why = None, f"the cache {root} cannot be written ({err})"
            finally:
                if workdir is not None:
                    shutil.rmtree(workdir, ignore_errors=True)
            if installed is not None:
                lib, problem = _load(installed)
                if lib is not None:
                    return lib, said, f"compiled, cached as {installed}"
                why = f"{installed} cannot be loaded ({problem}); a noexec file system?"
    if compiler_id is not None:  # the cache was wanted and could not be used: a warning says why
        log.warning("CPU kernels not cached: %s; compiling into a private temporary directory", why)
    lib, said = _compile_and_load(compiler, flag_sets)
    return lib, said, f"compiled, not cached: {why}"


@functools.cache
def _build() -> ctypes.CDLL | None:
    compiler = _compiler()
    if shutil.which(compiler[0]) is None:
        _state["status"] = f"no C compiler ({compiler[0]!r} not found): PyTorch path"
        log.info("CPU kernels not built: %s", _state["status"])
        return None
    march = target_arch()
    problem = _march_problem(march)
    if problem:
        _state["status"] = f"OSA_LAB_CPU_MARCH={problem}: PyTorch path"
        log.warning("CPU kernels not built: %s", _state["status"])
        return None
    # the default target only: last, a compiler that knows no -march=native
    fallback = _flag_sets(GENERIC) if march == "native" else []
    start = time.perf_counter()
    lib, said, where = _cached_load(compiler, [*_flag_sets(march), *fallback])
    _state["status"] = f"built with {said}" if lib is not None else f"build failed ({said}): PyTorch path"
    if lib is not None:
        log.info("CPU kernels %s in %.1f s (%d floats per vector; %s)", _state["status"], time.perf_counter() - start,
                 lib.osa_gram_vector_floats(), where)  # fmt: skip
    else:
        log.warning("CPU kernels: %s", _state["status"])
    return lib


def compile_library(
    march: str | None = None, defines: Mapping[str, int] | None = None, *, openmp: bool = True
) -> ctypes.CDLL:
    """A separate build of the kernels, for comparing builds in one process
    (``benchmarks/cpu_build_ab.py``, with :func:`using_library`): for ``march`` (default
    :func:`target_arch`; :data:`GENERIC`: no ``-march`` and no OpenMP, the default build's last
    resort) with OpenMP where it builds (``openmp=False``: never, the kernels then
    start their own pthreads), and the register blocks set by ``defines`` (e.g. ``{"MR": 3}``;
    the names are the ``#ifndef`` blocks of the sources). Compiled from the package's own source
    through the per-user cache, like the default build.

    Raises ConfigurationError for a ``march`` that is not a ``-march`` name or a define that is not
    one of :data:`REGISTER_BLOCKS` with a value it allows, and MethodUnavailableError where the
    compiler is missing or refuses the build."""
    march = target_arch() if march is None else march
    problem = _march_problem(march)
    if problem:
        raise ConfigurationError(f"compile_library: march {problem}")
    flags = [_define_flag(name, value) for name, value in (defines or {}).items()]
    compiler = _compiler()
    if shutil.which(compiler[0]) is None:
        raise MethodUnavailableError(f"compile_library: no C compiler ({compiler[0]!r} not found); set $CC")
    lib, said, _ = _cached_load(compiler, _flag_sets(march, flags, openmp))
    if lib is None:
        raise MethodUnavailableError(f"compile_library: the build for -march={march} failed ({said})")
    _compiled.append((lib, said))  # kept alive: using_library and status() look libraries up here
    return lib


def _define_flag(name: object, value: object) -> str:
    known = ", ".join(REGISTER_BLOCKS)
    if name not in REGISTER_BLOCKS:
        raise ConfigurationError(f"compile_library: {name!r} is not a register block of the kernels (known: {known})")
    least, most = _MIN_BLOCK.get(str(name), 1), _MAX_BLOCK.get(str(name), 16)
    divides = REGISTER_BLOCKS[str(name)]
    if not (isinstance(value, int) and not isinstance(value, bool) and least <= value <= most):
        raise ConfigurationError(f"compile_library: {name}={value!r} must be an integer from {least} to {most}")
    if divides and divides % value:
        raise ConfigurationError(f"compile_library: {name}={value} must divide {divides}")
    return f"-D{name}={value}"


_compiled: list[tuple[ctypes.CDLL, str]] = []
_override: contextvars.ContextVar[ctypes.CDLL | None] = contextvars.ContextVar("osa_lab_cpu_library", default=None)


@contextlib.contextmanager
def using_library(lib: ctypes.CDLL) -> Iterator[ctypes.CDLL]:
    """Inside the block the callers take ``lib`` (from :func:`compile_library`) as the kernels,
    where they would take the default build, and :func:`status` names it; ``OSA_LAB_CPU_KERNELS=0``
    still turns them off. The choice belongs to the calling thread (a context variable): run the
    forward and its backward inside the block. For benchmarks that time builds against each other
    in one process."""
    if not any(lib is known for known, _ in _compiled):
        raise ConfigurationError("using_library takes a library from compile_library")
    token = _override.set(lib)
    try:
        yield lib
    finally:
        _override.reset(token)


def built_library() -> ctypes.CDLL | None:
    """The kernels, built on the first call, whatever ``OSA_LAB_CPU_KERNELS`` says now (for calls
    that follow a forward which used them); None where they cannot be built."""
    override = _override.get()
    return override if override is not None else _build()


def loaded_library() -> ctypes.CDLL:
    """:func:`built_library` for the calls that run only after :func:`library` said yes; raises
    :class:`~osa_lab.errors.KernelFailedError` where there is none."""
    lib = built_library()
    if lib is None:
        raise KernelFailedError(f"the CPU kernels were called but are not built ({status()})")
    return lib


def library() -> ctypes.CDLL | None:
    """The loaded kernels, built on the first call; None where they are turned off or cannot be built."""
    return built_library() if enabled() else None


def status() -> str:
    """One line: whether the CPU kernels are in use, and if not, why."""
    if _turned_off.get():
        return "turned off (osa_lab.ops.cpu.build.turned_off, this thread): PyTorch path"
    if not enabled():
        return "turned off (OSA_LAB_CPU_KERNELS=0): PyTorch path"
    override = _override.get()
    if override is not None:
        said = next(flags for known, flags in _compiled if known is override)
        return f"built with {said} (compile_library, in using_library)"
    library()
    return _state["status"]
