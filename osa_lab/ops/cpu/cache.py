"""The per-user cache of built CPU kernels: a process loads the library an earlier process built
from the same source, flags, compiler and CPU, instead of compiling again (1.5–1.8 s per process:
every pytest worker, Dask worker, report kernel and dashboard).

Where: ``$OSA_LAB_CPU_CACHE`` (a directory; ``0``, ``off``, ``false`` or ``no`` turns the cache
off and every process builds for itself in a private temporary directory), else
``$XDG_CACHE_HOME/osa_lab/cpu-kernels``, else ``~/.cache/osa_lab/cpu-kernels``.

A library is cached under :func:`build_key`: a SHA-256 over the C sources' bytes, the compiler
flags tried, the compiler (its resolved path and ``--version`` text) and the CPU (architecture,
model and instruction-set flags), so an edited source, another flag, another compiler or a
machine with other instructions never loads a library built for something else.

What is loaded is checked first (:func:`untrusted`): the cache directory and the library must be
this user's own (owner = the process's uid), not symbolic links, and writable by no one else
(no group or other write bit); the directory is created with mode 0700. A library is built in a
private subdirectory of the cache and moved into place with ``os.replace`` (atomic on one file
system), with its description written the same way first, so a reader sees a whole library or
none, and two processes building at once each install a whole one. Platforms without POSIX
owners (no ``os.getuid``) get no cache.
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

#: Values of ``OSA_LAB_CPU_CACHE`` that turn the cache off.
OFF = frozenset({"0", "off", "false", "no"})

#: Libraries kept in the cache; the least recently built beyond this are removed.
KEEP = 16

LIBRARY_SUFFIX = ".so"
DESCRIPTION_SUFFIX = ".flags"


def cache_directory() -> Path | None:
    """The cache directory this process would use (not created here), or None where the cache is
    turned off (``OSA_LAB_CPU_CACHE=0``) or the platform has no POSIX owners."""
    raw = os.environ.get("OSA_LAB_CPU_CACHE", "").strip()
    if raw.lower() in OFF or not hasattr(os, "getuid"):
        return None
    if raw:
        return Path(raw).expanduser()
    base = os.environ.get("XDG_CACHE_HOME", "").strip()
    return (Path(base) if base else Path.home() / ".cache") / "osa_lab" / "cpu-kernels"


def untrusted(path: Path, *, directory: bool) -> str | None:
    """Why ``path`` must not be used (a sentence), or None: it must exist, be a plain directory or
    file (``directory``) and not a symbolic link, be owned by this process's user, and have no
    group or other write permission."""
    try:
        info = os.lstat(path)
    except OSError as err:
        return f"{path} cannot be read ({err.strerror or err})"
    kind_ok = stat.S_ISDIR(info.st_mode) if directory else stat.S_ISREG(info.st_mode)
    if stat.S_ISLNK(info.st_mode) or not kind_ok:
        return f"{path} is not a plain {'directory' if directory else 'file'}"
    if info.st_uid != os.getuid():
        return f"{path} is owned by uid {info.st_uid}, not by this user (uid {os.getuid()})"
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"{path} is writable by its group or others (mode {stat.S_IMODE(info.st_mode):o})"
    return None


def prepared_directory(root: Path) -> tuple[Path | None, str | None]:
    """``(root, None)`` once ``root`` exists (created with mode 0700 where missing) and passes
    :func:`untrusted`; else ``(None, why)``."""
    try:
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as err:
        return None, f"the cache directory {root} cannot be created ({err.strerror or err})"
    why = untrusted(root, directory=True)
    return (None, why) if why else (root, None)


@functools.cache
def compiler_identity(compiler: tuple[str, ...]) -> str | None:
    """The compiler's resolved path and ``--version`` text, or None where it cannot be asked (then
    nothing is cached: a build keyed without the compiler's version could outlive an upgrade)."""
    path = shutil.which(compiler[0])
    if path is None:
        return None
    try:
        done = subprocess.run([*compiler, "--version"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0 or not done.stdout.strip():
        return None
    return f"{os.path.realpath(path)} {' '.join(compiler[1:])}\n{done.stdout.strip()}"


@functools.cache
def cpu_identity() -> str:
    """The machine's architecture and, where ``/proc/cpuinfo`` tells them, its CPU model and
    instruction-set flags (what ``-march=native`` builds for)."""
    lines = [platform.machine(), platform.processor()]
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        text = ""
    for field in ("model name", "flags", "Features", "CPU part"):
        found = next((line for line in text.splitlines() if line.split(":")[0].strip() == field), "")
        lines.append(" ".join(sorted(found.partition(":")[2].split())) if field in ("flags", "Features") else found)
    return "\n".join(lines)


def build_key(sources: Sequence[Path], flag_sets: Sequence[Sequence[str]], compiler_id: str) -> str:
    """The cache key of a build: SHA-256 over the sources' names and bytes, the flag sets in order,
    the compiler's identity and :func:`cpu_identity`."""
    digest = hashlib.sha256()
    for source in sources:
        digest.update(source.name.encode() + b"\0" + source.read_bytes() + b"\0")
    digest.update(repr([list(flags) for flags in flag_sets]).encode())
    digest.update(compiler_id.encode() + b"\0" + cpu_identity().encode())
    return digest.hexdigest()[:40]


def cached_build(root: Path, key: str) -> tuple[Path, str] | None:
    """``(library path, its description)`` where ``root`` holds a whole, trusted build under
    ``key``, else None (a file that fails :func:`untrusted` is treated as absent)."""
    library, description = root / f"{key}{LIBRARY_SUFFIX}", root / f"{key}{DESCRIPTION_SUFFIX}"
    if not library.exists() or untrusted(library, directory=False) or untrusted(description, directory=False):
        return None
    try:
        return library, description.read_text().strip()
    except OSError:
        return None


def build_directory(root: Path) -> Path:
    """A fresh private (0700) directory inside ``root`` to build in, on the cache's file system."""
    return Path(tempfile.mkdtemp(prefix=".build-", dir=root))


def install(built: Path, description: str, root: Path, key: str) -> Path:
    """Move the library ``built`` (inside a :func:`build_directory`) into place under ``key``,
    description first, each with ``os.replace``; remove builds beyond :data:`KEEP`. Returns the
    installed library's path."""
    staged = built.with_name("description")
    staged.write_text(description + "\n")
    os.chmod(built, 0o700)
    os.chmod(staged, 0o600)
    os.replace(staged, root / f"{key}{DESCRIPTION_SUFFIX}")
    target = root / f"{key}{LIBRARY_SUFFIX}"
    os.replace(built, target)
    _prune(root)
    return target


def _prune(root: Path) -> None:
    def built_at(path: Path) -> float:
        try:
            return path.stat().st_mtime
        except OSError:  # removed meanwhile by another process's prune
            return 0.0

    libraries = sorted(root.glob(f"*{LIBRARY_SUFFIX}"), key=built_at, reverse=True)
    for old in libraries[KEEP:]:
        for path in (old, old.with_suffix(DESCRIPTION_SUFFIX)):
            path.unlink(missing_ok=True)
