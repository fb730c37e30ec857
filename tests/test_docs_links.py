"""Relative links in README.md and docs/*.md lead to files that exist and to headings they have."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: the pages whose links are checked: the front door and the guides beside it
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

_FENCE = re.compile(r"^\s*(```|~~~)")
_CODE_SPAN = re.compile(r"(`+).+?\1", flags=re.S)
#: ``[text](target)`` and ``![alt](target)``, with an optional "title"
_LINK = re.compile(r"\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def _prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks."""
    lines, fenced = [], False
    for line in text.splitlines():
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(line)
    return lines


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: inline markup dropped, lower case, punctuation other
    than ``-`` and ``_`` removed, spaces turned into ``-``."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text stays
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading anchor of a Markdown file; repeated headings get ``-1``, ``-2``, … as on GitHub."""
    seen: dict[str, int] = {}
    found = set()
    for line in _prose_lines(path.read_text()):
        match = _HEADING.match(line)
        if not match:
            continue
        slug = github_anchor(match.group(2))
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def relative_links(path: Path) -> list[str]:
    """The link targets of a Markdown file that are not URLs (code blocks and code spans left out)."""
    prose = _CODE_SPAN.sub("", "\n".join(_prose_lines(path.read_text())))
    return [target for target in _LINK.findall(prose) if not _SCHEME.match(target)]


def broken_links(path: Path) -> list[str]:
    """``"target: why"`` for every relative link of ``path`` that leads nowhere."""
    problems = []
    for target in relative_links(path):
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        if not dest.exists():
            problems.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            problems.append(f"{target}: {dest.name} has no heading with anchor #{anchor}")
    return problems


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_lead_somewhere(page):
    assert not broken_links(page), broken_links(page)


def test_the_pages_have_links_to_check():
    assert (ROOT / "docs" / "osa.md") in PAGES
    readme = relative_links(ROOT / "README.md")
    assert "docs/osa.md" in readme and "docs/commands.md" in readme and "docs/dask.md" in readme


def test_a_broken_link_or_missing_anchor_is_reported(tmp_path):
    (tmp_path / "other.md").write_text(
        "# Using OSA: methods, accuracy, layers\n\n## The `osa()` call\n\n## Notes\n\n## Notes\n"
    )
    page = tmp_path / "page.md"
    page.write_text(
        "# Page\n\nSee [ok](other.md#using-osa-methods-accuracy-layers), [call](other.md#the-osa-call),\n"
        "[second notes](other.md#notes-1), [self](#page), [web](https://example.org/x.md).\n"
        "Broken: [gone](missing.md), [no heading](other.md#no-such-heading), [self](#nowhere).\n"
        "Not links: `[x](nope.md)` and\n\n```\n[y](nope-either.md)\n```\n"
    )  # fmt: skip
    problems = broken_links(page)
    assert len(problems) == 3, problems
    assert problems[0] == "missing.md: no such file"
    assert problems[1] == "other.md#no-such-heading: other.md has no heading with anchor #no-such-heading"
    assert problems[2] == "#nowhere: page.md has no heading with anchor #nowhere"


def test_github_anchor():
    assert github_anchor("Using OSA: methods, accuracy, layers") == "using-osa-methods-accuracy-layers"
    assert github_anchor("Depth profiles and sweeps (`osa_lab.studies.depth`)") == (
        "depth-profiles-and-sweeps-osa_labstudiesdepth"
    )
    assert github_anchor("1. Orthogonal Self-Attention (OSA)") == "1-orthogonal-self-attention-osa"
    assert github_anchor("Accuracy (float32, ‖S‖₂ ≤ 10)") == "accuracy-float32-s₂--10"
