"""Text of the dashboard's messages: Markdown that renders exactly as typed, quoted URL values,
labels of choices, and the number patterns a URL may use."""

from __future__ import annotations

import re
from collections.abc import Mapping

#: ASCII punctuation, every character of which CommonMark lets a backslash make literal.
_MARKDOWN_PUNCTUATION = frozenset("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~")
#: Most characters of one URL key or value quoted in a message (longer ones are cut with "…").
QUOTE_LIMIT = 80
#: Most unusable URL values named one by one (the rest are counted).
MESSAGE_LIMIT = 12


def markdown_literal(text: str) -> str:
    """``text`` as Markdown that renders exactly as these characters, never as markup.

    Every ASCII punctuation character is backslash-escaped (CommonMark: an escaped character is
    literal text), so no HTML tag, code span, link, image, emphasis or heading can start from
    ``text``: a ``<script>``, ``<img onerror=…>``, a backtick closing a code span or a
    ``[x](javascript:…)`` link in a URL or an error message is shown as typed. Line breaks are
    kept (paragraphs of a message).
    """
    return "".join("\\" + c if c in _MARKDOWN_PUNCTUATION else c for c in str(text))


def quoted(text: object, limit: int = QUOTE_LIMIT) -> str:
    """``text`` between typographic quotes for a message: control characters (line breaks, tabs,
    NUL) shown as ``\\xNN`` escapes and anything longer than ``limit`` characters cut with "…".
    Quote marks cannot be confused with Markdown; pass the message through
    :func:`markdown_literal` before it reaches the page."""
    text = "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in str(text))
    if len(text) > limit:
        text = text[:limit] + "…"
    return f"“{text}”"


def label_of(labels: Mapping[str, str], value: str) -> str:
    """The human label of ``value`` in a ``{label: value}`` mapping (the value itself if absent)."""
    return next((k for k, v in labels.items() if v == value), str(value))


#: A whole number as a URL writes it (ASCII digits only).
INTEGER_PATTERN = re.compile(r"[+-]?[0-9]+")
#: A decimal number as a URL writes it (no nan, inf, hex, underscores or non-ASCII digits).
DECIMAL_PATTERN = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
