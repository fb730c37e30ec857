"""Provenance of a run: git revision, package versions, device and parameters.

Every report's first output and every benchmark CSV carries these facts, so a number can be
traced to the code and machine that produced it (docs/reports.md, after modded-nanogpt, whose
logs embed their source).

* :func:`collect` returns a nested ``dict`` (JSON-serialisable);
* :func:`as_frame` flattens it to a two-column ``DataFrame`` (``key``, ``value``);
* :func:`csv_columns` flattens it to one row of scalar columns to append to a benchmark table;
* :func:`show` prints it, or displays it as a table inside a notebook.
"""

from __future__ import annotations

import datetime as _dt
import importlib.metadata
import json
import os
import platform
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

#: Distributions whose versions are recorded (missing ones are reported as ``"not installed"``).
PACKAGES: tuple[str, ...] = (
    "osa_lab",
    "torch",
    "numpy",
    "scipy",
    "pandas",
    "matplotlib",
    "holoviews",
    "bokeh",
    "panel",
    "papermill",
    "triton",
)

_REPO_ROOT = Path(__file__).resolve().parents[2]


def _git(args: list[str], cwd: Path) -> str | None:
    try:
        out = subprocess.run(
            ["git", *args], cwd=cwd, capture_output=True, text=True, timeout=10, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()


def git_info(repo: str | Path | None = None) -> dict[str, Any]:
    """Git revision of ``repo`` (default: the checkout osa_lab is imported from).

    Returns ``commit`` (full hash or ``"unknown"`` outside a git checkout), ``branch``, and
    ``dirty`` (True when tracked files differ from the commit, i.e. the numbers may come
    from uncommitted code).
    """
    cwd = Path(repo) if repo is not None else _REPO_ROOT
    commit = _git(["rev-parse", "HEAD"], cwd)
    if commit is None:
        return {"commit": "unknown", "branch": "unknown", "dirty": None}
    status = _git(["status", "--porcelain", "--untracked-files=no"], cwd)
    return {
        "commit": commit,
        "branch": _git(["rev-parse", "--abbrev-ref", "HEAD"], cwd) or "unknown",
        "dirty": bool(status) if status is not None else None,
    }


def package_versions(packages: tuple[str, ...] = PACKAGES) -> dict[str, str]:
    """Installed version of each distribution in ``packages`` (``"not installed"`` if absent)."""
    versions: dict[str, str] = {}
    for name in packages:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


def device_info() -> dict[str, Any]:
    """The compute device: CPU model and thread counts, and the CUDA GPU when there is one."""
    import torch

    info: dict[str, Any] = {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "cuda": torch.cuda.is_available(),
    }
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
        info["cuda_version"] = torch.version.cuda
    return info


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def collect(params: Mapping[str, Any] | None = None, *, repo: str | Path | None = None) -> dict[str, Any]:
    """Everything needed to trace a result: git, versions, python, device, time and ``params``.

    ``params`` (the notebook's or benchmark's parameters) are stored as given; values that
    JSON cannot represent are stored as their ``repr``.
    """
    return {
        "git": git_info(repo),
        "python": {"version": platform.python_version(), "executable": sys.executable},
        "packages": package_versions(),
        "device": device_info(),
        "time_utc": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "params": {k: _jsonable(v) for k, v in (params or {}).items()},
    }


def _jsonable(value: Any) -> Any:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)
    return value


def _flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(_flatten(value, f"{name}."))
        elif isinstance(value, list | tuple):
            flat[name] = json.dumps(value)
        else:
            flat[name] = value
    return flat


def as_frame(info: Mapping[str, Any] | None = None) -> pd.DataFrame:
    """Flatten :func:`collect`'s dict into rows ``key`` (dotted path) → ``value`` (string)."""
    info = collect() if info is None else info
    flat = _flatten(info)
    return pd.DataFrame({"key": list(flat), "value": [str(v) for v in flat.values()]})


def csv_columns(params: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """One row of scalar provenance columns (``git_commit``, ``torch``, ``device`` …) for a CSV.

    Append them to every row of a benchmark table, e.g. ``df.assign(**csv_columns())``.
    """
    info = collect(params)
    dev = info["device"]
    row: dict[str, Any] = {
        "git_commit": info["git"]["commit"],
        "git_dirty": info["git"]["dirty"],
        "time_utc": info["time_utc"],
        "python": info["python"]["version"],
        "device": dev.get("gpu") or dev["processor"],
        "cpu_count": dev["cpu_count"],
        "torch_threads": dev["torch_threads"],
    }
    for pkg in ("osa_lab", "torch", "numpy", "triton"):
        row[pkg] = info["packages"].get(pkg, "not installed")
    for key, value in info["params"].items():
        row[f"param.{key}"] = json.dumps(value) if isinstance(value, list | dict) else value
    return row


def format_text(info: Mapping[str, Any]) -> str:
    """A compact human-readable block of :func:`collect`'s dict (used when not in a notebook)."""
    git = info["git"]
    dev = info["device"]
    dirty = " (uncommitted changes)" if git.get("dirty") else ""
    device = dev.get("gpu") or dev["processor"]
    pkgs = ", ".join(f"{k} {v}" for k, v in info["packages"].items() if v != "not installed")
    lines = [
        f"git       {git['commit']} on {git['branch']}{dirty}",
        f"python    {info['python']['version']} ({info['python']['executable']})",
        f"device    {device}; {dev['cpu_count']} CPUs, torch threads {dev['torch_threads']}, "
        f"CUDA {'yes' if dev['cuda'] else 'no'}",
        f"packages  {pkgs}",
        f"time      {info['time_utc']}",
    ]
    if info["params"]:
        lines.append("params    " + ", ".join(f"{k}={v!r}" for k, v in info["params"].items()))
    return "\n".join(lines)


def _plain(value: Any) -> str:
    """A parameter as a reader writes it: ``vit, skipless-osa`` for a list, text unquoted, ``(none)``
    for an empty value, not Python's repr."""
    if isinstance(value, list | tuple):
        return ", ".join(_plain(v) for v in value) if value else "(none)"
    if isinstance(value, dict):
        return ", ".join(f"{k}: {_plain(v)}" for k, v in value.items()) if value else "(none)"
    if value is None or value == "":
        return "(none)"
    return f"{value:g}" if isinstance(value, float) else str(value)


def summary_line(info: Mapping[str, Any]) -> str:
    """One line: run time, commit (clean or with uncommitted changes), torch, device, parameters."""
    git, dev = info["git"], info["device"]
    commit = str(git.get("commit") or "unknown")[:10]
    state = "uncommitted changes" if git.get("dirty") else "clean"
    device = dev.get("gpu") or f"CPU, {dev.get('cpu_count', '?')} cores"
    params = "; ".join(f"{k}={_plain(v)}" for k, v in info["params"].items() if k != "notebook")
    when = str(info["time_utc"]).replace("T", " ").replace("+00:00", " UTC")
    line = (f"Run {when} · git {commit} on {git.get('branch')} ({state}) · torch "
            f"{info['packages'].get('torch', '?')} · {device}")
    return line + (f" · {params}" if params else "")


def details_html(info: Mapping[str, Any]) -> str:
    """The full provenance table inside a collapsed ``<details>`` element (for the end of a report)."""
    table = as_frame(info).to_html(index=False, border=0)
    return (f"<details><summary><b>Provenance</b> ({len(as_frame(info))} entries: git, versions, device, "
            f"parameters)</summary>{table}</details>")


def _in_notebook() -> bool:
    try:
        from IPython import get_ipython

        return get_ipython() is not None and hasattr(get_ipython(), "kernel")
    except ImportError:
        return False


def show(params: Mapping[str, Any] | None = None, *, full: bool = True) -> dict[str, Any]:
    """Print (or, in a notebook, display) the provenance; return :func:`collect`'s dict.

    In a notebook ``full=False`` shows only :func:`summary_line` (the reports' opening; the
    table follows collapsed at the end, :func:`show_details`), ``full=True`` the collapsed table too.
    """
    info = collect(params)
    if _in_notebook():
        from IPython.display import HTML, Markdown, display

        more = "" if full else " — full provenance at the end of this report"
        display(Markdown(f"<small>{summary_line(info)}{more}</small>"))
        if full:
            display(HTML(details_html(info)))
    else:
        print(format_text(info))
    return info


def show_details(info: Mapping[str, Any]) -> None:
    """Display the collapsed provenance table of ``info`` (notebook) or print it (elsewhere)."""
    if _in_notebook():
        from IPython.display import HTML, display

        display(HTML(details_html(info)))
    else:
        print(format_text(info))
