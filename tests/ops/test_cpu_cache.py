"""The per-user cache of built CPU kernels (``osa_lab.ops.cpu.cache``, used by
``osa_lab.ops.cpu.build``): a second build loads the first one's library without compiling;
the key changes with the sources, flags, compiler and CPU; a library or directory that another
user owns, that others can write or that is a link is never loaded; installs are atomic; and
where the cache's file system cannot map code (``noexec``) the build falls back to a private
temporary directory with a logged warning."""

from __future__ import annotations

import logging
import os
import shutil
import stat
from pathlib import Path

import pytest

from osa_lab.ops.cpu import build, cache

HAVE_COMPILER = shutil.which(os.environ.get("CC", "cc")) is not None
pytestmark = pytest.mark.skipif(not HAVE_COMPILER, reason="no C compiler: the kernels cannot be built here")


@pytest.fixture
def counted(monkeypatch, tmp_path):
    """The cache in ``tmp_path/cache`` and a count of compiler runs; the module's status restored."""
    root = tmp_path / "cache"
    monkeypatch.setenv("OSA_LAB_CPU_CACHE", str(root))
    monkeypatch.delenv("OSA_LAB_CPU_MARCH", raising=False)
    calls: list[list[str]] = []
    real = build._compile

    def counting(command):
        calls.append(command)
        return real(command)

    monkeypatch.setattr(build, "_compile", counting)
    state = dict(build._state)
    yield root, calls
    build._state.clear()
    build._state.update(state)


def _libraries(root: Path) -> list[Path]:
    return sorted(root.glob("*.so"))


def test_a_second_build_loads_the_cached_library_without_compiling(counted, caplog):
    root, calls = counted
    with caplog.at_level(logging.INFO, logger="osa_lab.ops.cpu"):
        first = build._build.__wrapped__()
        assert first is not None and len(calls) == 1
        second = build._build.__wrapped__()
    assert second is not None and len(calls) == 1  # no second compile
    assert second.osa_gram_vector_floats() == first.osa_gram_vector_floats()
    assert build._state["status"].startswith("built with") and "-march=native" in build._state["status"]
    assert stat.S_IMODE(os.stat(root).st_mode) == 0o700
    (library,) = _libraries(root)
    assert cache.untrusted(library, directory=False) is None
    assert not list(root.glob(".build-*"))  # the private build directory is gone
    said = [r.getMessage() for r in caplog.records if r.name == "osa_lab.ops.cpu"]
    assert len(said) == 2 and "cached as" in said[0] and "loaded from the cache" in said[1], said


def test_the_key_follows_sources_flags_compiler_and_cpu(tmp_path, monkeypatch):
    sources = []
    for source in build.SOURCES:
        copy = tmp_path / source.name
        copy.write_bytes(source.read_bytes())
        sources.append(copy)
    flags = [["-O3", "-march=native"]]
    base = cache.build_key(sources, flags, "gcc 13")
    assert cache.build_key(sources, flags, "gcc 13") == base
    assert cache.build_key(sources, [["-O3", "-march=x86-64-v3"]], "gcc 13") != base
    assert cache.build_key(sources, flags, "gcc 14") != base
    sources[0].write_bytes(sources[0].read_bytes() + b"\n/* edited */\n")
    assert cache.build_key(sources, flags, "gcc 13") != base
    sources[0].write_bytes(build.SOURCES[0].read_bytes())
    monkeypatch.setattr(cache, "cpu_identity", lambda: "another CPU")
    assert cache.build_key(sources, flags, "gcc 13") != base


def test_a_library_others_can_write_is_not_loaded_but_rebuilt(counted):
    root, calls = counted
    assert build._build.__wrapped__() is not None
    (library,) = _libraries(root)
    os.chmod(library, 0o777)
    assert "writable by its group or others" in cache.untrusted(library, directory=False)
    assert build._build.__wrapped__() is not None
    assert len(calls) == 2  # compiled again, and installed in its place with the owner's mode
    assert cache.untrusted(library, directory=False) is None


def test_a_library_of_another_owner_or_a_link_is_not_trusted(counted, monkeypatch, tmp_path):
    root, _ = counted
    assert build._build.__wrapped__() is not None
    (library,) = _libraries(root)
    link = tmp_path / "link.so"
    link.symlink_to(library)
    assert "not a plain file" in cache.untrusted(link, directory=False)
    uid = os.getuid()
    monkeypatch.setattr(cache.os, "getuid", lambda: uid + 1)
    assert f"owned by uid {uid}" in cache.untrusted(library, directory=False)
    key = library.name.removesuffix(".so")
    assert cache.cached_build(root, key) is None


def test_a_cache_directory_others_can_write_is_not_used(counted, caplog):
    root, calls = counted
    root.mkdir(mode=0o777)
    os.chmod(root, 0o777)
    with caplog.at_level(logging.WARNING, logger="osa_lab.ops.cpu"):
        assert build._build.__wrapped__() is not None
    assert _libraries(root) == [] and len(calls) == 1
    assert any("not cached" in r.getMessage() and "writable by its group or others" in r.getMessage()
               for r in caplog.records), caplog.text  # fmt: skip


def test_a_noexec_cache_falls_back_to_a_private_directory_with_a_warning(counted, monkeypatch, caplog):
    """A library in the cache that cannot be mapped (as on a ``noexec`` mount) is not the end:
    the kernels are compiled into a private temporary directory and loaded from there, and a
    warning says why."""
    root, calls = counted
    real = build.ctypes.CDLL

    def noexec(name, *args, **kwargs):
        if str(name).startswith(str(root)):
            raise OSError(f"{name}: failed to map segment from shared object")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(build.ctypes, "CDLL", noexec)
    with caplog.at_level(logging.WARNING, logger="osa_lab.ops.cpu"):
        lib = build._build.__wrapped__()
    assert lib is not None and build._state["status"].startswith("built with")
    assert len(calls) == 2  # once for the cache, once in the private directory
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and "noexec" in warned[0] and "private temporary directory" in warned[0], warned


def test_a_cache_that_cannot_be_written_falls_back_with_a_warning(counted, monkeypatch, caplog):
    root, calls = counted

    def read_only(_root):
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(cache, "build_directory", read_only)
    with caplog.at_level(logging.WARNING, logger="osa_lab.ops.cpu"):
        assert build._build.__wrapped__() is not None
    assert _libraries(root) == [] and len(calls) == 1
    assert any("cannot be written" in r.getMessage() and "Read-only" in r.getMessage() for r in caplog.records)


def test_the_cache_turned_off_builds_in_a_private_directory(counted, monkeypatch):
    root, calls = counted
    monkeypatch.setenv("OSA_LAB_CPU_CACHE", "0")
    assert cache.cache_directory() is None
    assert build._build.__wrapped__() is not None
    assert not root.exists() and len(calls) == 1


def test_install_writes_the_description_before_the_library_and_keeps_at_most_keep(tmp_path, monkeypatch):
    root, _ = cache.prepared_directory(tmp_path / "cache")
    assert root is not None
    order: list[str] = []
    real = os.replace

    def recording(src, dst):
        order.append(Path(dst).suffix)
        real(src, dst)

    monkeypatch.setattr(cache.os, "replace", recording)
    monkeypatch.setattr(cache, "KEEP", 3)
    for i in range(5):
        work = cache.build_directory(root)
        built = work / "osa_lab_cpu.so"
        built.write_bytes(b"\x7fELF")
        os.utime(work, None)
        installed = cache.install(built, f"cc -O3 #{i}", root, f"key{i}")
        os.utime(installed, (1000 + i, 1000 + i))
        work.rmdir()
    assert order == [".flags", ".so"] * 5
    assert sorted(p.name for p in _libraries(root)) == ["key2.so", "key3.so", "key4.so"]
    assert sorted(p.name for p in root.glob("*.flags")) == ["key2.flags", "key3.flags", "key4.flags"]
    assert cache.cached_build(root, "key4") == (root / "key4.so", "cc -O3 #4")
