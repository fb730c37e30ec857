"""The report folder's ``index.html`` and ``summary.json``: every notebook's links, status,
finding, run time, parameters and provenance.

Notebooks of earlier runs that this run did not execute (``--only``) stay listed as long as
their files are there; a damaged ``summary.json`` never stops the index from being written.
"""

from __future__ import annotations

import datetime as _dt
import html
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

import yaml

from osa_lab.fileio import atomic_write_text
from osa_lab.reporting.execution import NotebookResult

_INDEX_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }
table { border-collapse: collapse; width: 100%; }
th, td { border-bottom: 1px solid #ddd; padding: 6px 8px; text-align: left; vertical-align: top; }
th { background: #f4f4f4; }
.ok { color: #11722b; font-weight: 600; } .failed { color: #b00020; font-weight: 600; }
code, pre { font-size: 0.85em; } pre { margin: 0; white-space: pre-wrap; }
.prov { color: #555; font-size: 0.9em; }
"""


def write_index(
    results: Sequence[NotebookResult],
    output: str | Path,
    *,
    started: _dt.datetime | None = None,
    label: str = "",
) -> Path:
    """Write ``index.html`` (and ``summary.json``) linking every notebook's HTML and ``.ipynb``.

    Notebooks of earlier runs in ``output`` that this run did not execute (``--only``) stay
    listed, marked with the time and commit of the run that made them, as long as their files
    are still there (``summary.json`` keeps them under ``"earlier"``).
    """
    from osa_lab.reporting import provenance

    output = Path(output)
    info = provenance.collect({"mode": label} if label else None)
    started = started or _dt.datetime.now(_dt.UTC)
    earlier = _earlier_notebooks(output, {r.name for r in results})
    rows = []
    entries = [(r, None) for r in results] + [(NotebookResult(**e["result"]), e) for e in earlier]
    for r, origin in sorted(entries, key=lambda item: item[0].name):
        links = []
        if r.html:
            links.append(f'<a href="{html.escape(r.html)}">{html.escape(r.name)}</a>')
        else:
            links.append(html.escape(r.name))
        if r.ipynb:
            links.append(f'<a href="{html.escape(r.ipynb)}">.ipynb</a>')
        if r.ok:
            status = '<span class="ok">ok</span>'
        else:
            status = f'<span class="failed">failed</span><pre>{html.escape(r.failure_line())}</pre>'
        if origin is not None:
            status += (
                f'<br><span class="prov">earlier run {html.escape(str(origin["started_utc"]))}, '
                f"git <code>{html.escape(str(origin['commit']))}</code></span>"
            )
        params = (
            yaml.safe_dump(r.params, sort_keys=False, default_flow_style=None).strip()
            if r.params
            else "(defaults)"
        )
        found = html.escape(r.finding) if r.finding else '<span class="prov">(no finding recorded)</span>'
        rows.append(
            f"<tr><td>{' · '.join(links)}</td><td>{status}</td><td>{found}</td><td>{r.seconds:.1f} s</td>"
            f"<td><pre>{html.escape(params)}</pre></td></tr>"
        )
    total = sum(r.seconds for r in results)
    git = info["git"]
    device = info["device"].get("gpu") or info["device"]["processor"]
    title = "osa_lab reports" + (f" ({label})" if label else "")
    page = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>{_INDEX_CSS}</style></head><body>
<h1>{html.escape(title)}</h1>
<p class="prov">Run started {started.isoformat(timespec="seconds")} · total {total:.1f} s ·
git <code>{html.escape(str(git["commit"]))}</code>{" (uncommitted changes)" if git.get("dirty") else ""} ·
torch {html.escape(info["packages"].get("torch", "?"))} · {html.escape(str(device))},
{info["device"]["cpu_count"]} CPUs · Python {html.escape(info["python"]["version"])}</p>
<table><thead><tr><th>notebook</th><th>status</th><th>what it found</th><th>run time</th><th>parameters (overrides of the defaults)</th></tr></thead>
<tbody>
{chr(10).join(rows)}
</tbody></table>
</body></html>
"""
    index = atomic_write_text(output / "index.html", page)
    summary = {
        "started_utc": started.isoformat(timespec="seconds"),
        "label": label,
        "provenance": info,
        "notebooks": [asdict(r) for r in results],
        "earlier": earlier,
    }
    atomic_write_text(output / "summary.json", json.dumps(summary, indent=1, default=str))
    return index


def _earlier_notebooks(output: Path, current: set[str]) -> list[dict[str, Any]]:
    """Entries of the previous ``summary.json`` in ``output`` for notebooks not in ``current``
    whose HTML or ``.ipynb`` still exists: ``{"result": …, "started_utc": …, "commit": …}``."""
    try:
        previous = json.loads((output / "summary.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    if not isinstance(previous, dict):
        return []
    provenance = previous.get("provenance")
    git = provenance.get("git") if isinstance(provenance, dict) else None
    commit = git.get("commit") if isinstance(git, dict) else None
    notebooks, earlier = previous.get("notebooks"), previous.get("earlier")
    candidates = [
        {"result": nb, "started_utc": previous.get("started_utc"), "commit": commit}
        for nb in (notebooks if isinstance(notebooks, list) else [])
        if isinstance(nb, dict)
    ] + [
        e
        for e in (earlier if isinstance(earlier, list) else [])
        if isinstance(e, dict) and isinstance(e.get("result"), dict)
    ]
    kept: list[dict[str, Any]] = []
    for entry in candidates:
        nb = _stored_result(entry["result"])
        if nb is None:
            continue
        name = nb["name"]
        if name in current or any(e["result"]["name"] == name for e in kept):
            continue
        if not any(nb.get(key) and _inside(output, nb[key]) for key in ("html", "ipynb")):
            continue
        kept.append(
            {"result": nb, "started_utc": str(entry.get("started_utc")), "commit": str(entry.get("commit"))}
        )
    return kept


def _stored_result(stored: Mapping[str, Any]) -> dict[str, Any] | None:
    """The fields of a stored :class:`NotebookResult` that have the declared types, or ``None``
    when its name is missing or not text. A hand-edited or damaged ``summary.json`` (a number
    where a file name belongs, a list of warnings that is not a list) never stops the index
    from being written: a field of the wrong type takes its default."""
    name = stored.get("name")
    if not isinstance(name, str) or not name:
        return None
    kinds: dict[str, tuple[type, ...]] = {
        "source": (str,),
        "params": (dict,),
        "ok": (bool,),
        "seconds": (int, float),
        "ipynb": (str,),
        "html": (str,),
        "failed_cell": (int,),
        "failed_exec_count": (int,),
        "failed_source": (str,),
        "error": (str,),
        "warnings": (list,),
        "finding": (str,),
    }
    out: dict[str, Any] = {"name": name, "source": "", "params": {}}
    for f in fields(NotebookResult):
        value = stored.get(f.name)
        if f.name not in kinds or not isinstance(value, kinds[f.name]):
            continue
        if isinstance(value, bool) and f.name != "ok":
            continue  # JSON true/false where a number belongs
        if f.name == "seconds" and not math.isfinite(value):
            continue
        out[f.name] = value
    out["warnings"] = [str(w) for w in out.get("warnings", [])]
    return out


def _inside(output: Path, name: str) -> bool:
    """``name`` is a file directly in ``output`` (not a path leading elsewhere)."""
    return Path(name).name == name and name not in (".", "..") and (output / name).is_file()
