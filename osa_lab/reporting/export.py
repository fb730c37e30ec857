"""An executed notebook as one self-contained HTML page, and what the page shows and fetches.

:func:`export_html` embeds the images and drops every script loaded from the network;
:func:`with_code_toggle` hides the code cells behind a "show the code" box (CSS only);
:func:`read_finding` reads the one-line finding a report displayed; :func:`external_references`
lists the resources a page would fetch (none: it renders offline).
"""

from __future__ import annotations

import re
from pathlib import Path

from osa_lab.fileio import atomic_write_text

# An nbconvert template that drops every script loaded from the network (require.js,
# MathJax, mermaid, widget manager): the reports hold only static HTML and embedded PNGs.
_OFFLINE_TEMPLATE = """{%- extends 'lab/index.html.j2' -%}
{%- block html_head_js -%}{%- endblock html_head_js -%}
{%- block html_head_js_mathjax -%}{%- endblock html_head_js_mathjax -%}
{%- block html_head_js_mermaidjs -%}{%- endblock html_head_js_mermaidjs -%}
{%- block jupyter_widgets -%}{%- endblock jupyter_widgets -%}
"""


def export_html(ipynb: str | Path, dest: str | Path) -> Path:
    """Export an executed notebook to self-contained HTML: embedded images, no network scripts."""
    import jinja2
    import nbformat
    from nbconvert import HTMLExporter

    exporter = HTMLExporter(
        extra_loaders=[jinja2.DictLoader({"osa_lab_offline.html.j2": _OFFLINE_TEMPLATE})],
        template_file="osa_lab_offline.html.j2",
        embed_images=True,
    )
    body, _ = exporter.from_notebook_node(nbformat.read(str(ipynb), as_version=4))
    return atomic_write_text(dest, with_code_toggle(body))


#: Hides the code of every code cell (and the In/Out prompts) unless the reader ticks the box
#: that :func:`with_code_toggle` puts at the top of the page: CSS only (``:has``), no script.
_CODE_TOGGLE_CSS = """<style id="osa-lab-code-toggle">
body:has(#osa-show-code:not(:checked)) .jp-CodeCell .jp-Cell-inputWrapper,
body:has(#osa-show-code:not(:checked)) .jp-CodeCell .jp-OutputPrompt,
body:has(#osa-show-code:not(:checked)) .jp-CodeCell .jp-InputPrompt { display: none; }
/* text flush with the outputs while the prompts are hidden (markdown cells keep an empty prompt) */
body:has(#osa-show-code:not(:checked)) .jp-MarkdownCell .jp-InputPrompt { display: none; }
/* the reports' tables (osa_lab.reporting.tables): compact rows, the first column (a name) left-aligned */
.osa-table td, .osa-table th { padding: 3px 10px; }
.osa-table td:first-child, .osa-table th:first-child { text-align: left; white-space: nowrap; }
.osa-code-toggle { position: sticky; top: 0; z-index: 10; display: inline-block; margin: 6px 0 0 6px;
  padding: 4px 10px; border: 1px solid #bbb; border-radius: 6px; background: #f7f7f7; font: 13px system-ui,
  sans-serif; cursor: pointer; }
</style>
"""
_CODE_TOGGLE_BOX = (
    '<label class="osa-code-toggle"><input type="checkbox" id="osa-show-code"> show the code '
    "(hidden: the executed .ipynb keeps every cell)</label>"
)


def with_code_toggle(page: str) -> str:
    """``page`` (an nbconvert HTML export) with every code cell's source hidden by default and a
    "show the code" box at the top that reveals it; outputs, text and figures stay visible."""
    page = page.replace("</head>", _CODE_TOGGLE_CSS + "</head>", 1)
    return re.sub(r"(<body[^>]*>)", lambda m: m.group(1) + "\n" + _CODE_TOGGLE_BOX, page, count=1)


def read_finding(ipynb: str | Path) -> str | None:
    """The one-line finding a report displayed with
    :func:`osa_lab.reporting.kernel_setup.finding` (the last one), or ``None``."""
    import nbformat

    from osa_lab.reporting.kernel_setup import FINDING_KEY

    try:
        nb = nbformat.read(str(ipynb), as_version=4)
    except Exception:  # noqa: BLE001 - no notebook, no finding
        return None
    found = None
    for cell in nb.cells:
        for output in cell.get("outputs", []) if cell.get("cell_type") == "code" else []:
            value = (output.get("metadata") or {}).get(FINDING_KEY)
            if isinstance(value, str) and value.strip():
                found = value.strip()
    return found


_EXTERNAL = re.compile(
    r"""(?:<script[^>]*\ssrc\s*=\s*["']?\s*(?:https?:)?//[^"'\s>]+)"""
    r"""|(?:<link[^>]*\shref\s*=\s*["']?\s*(?:https?:)?//[^"'\s>]+)"""
    r"""|(?:<(?:img|iframe|embed|source|video|audio)[^>]*\ssrc\s*=\s*["']?\s*(?:https?:)?//[^"'\s>]+)"""
    r"""|(?:url\(\s*["']?\s*(?:https?:)?//[^)"']+)"""
    r"""|(?:@import\s+["'](?:https?:)?//[^"']+)"""
    r"""|(?:\bimport\b[^;\n]*\bfrom\s*["'](?:https?:)?//[^"']+)"""
    # script or style URLs held in strings, as JavaScript loaders (bokeh, panel) build them
    r"""|(?:["'](?:https?:)?//[^"'\s]+\.(?:m?js|css)(?:\?[^"'\s]*)?["'])""",
    re.IGNORECASE,
)


def external_references(page: str) -> list[str]:
    """Resources an HTML page would fetch from the network (scripts, styles, images, imports).

    Plain hyperlinks (``<a href=…>``) are not resources and are not reported. An empty list
    means the page renders offline.
    """
    return [m.group(0)[:200] for m in _EXTERNAL.finditer(page)]
