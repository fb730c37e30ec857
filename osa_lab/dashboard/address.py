"""The page's address bar kept on the view shown (Panel's ``pn.state.location``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from urllib.parse import quote, urlencode

import param


def query_string(query: Mapping[str, object]) -> str:
    """``?a=1&b=x,y`` (commas kept, so a list of presets reads as written)."""
    return "?" + urlencode(query, quote_via=quote, safe=",")


def keep_address_on_view(location, owner: param.Parameterized, names: Sequence[str],
                         query: Callable[[], Mapping[str, object]]) -> None:  # fmt: skip
    """Write ``query()`` into ``location.search`` now and whenever one of ``owner``'s parameters
    ``names`` changes.

    The browser's own address can reach the server after the view's was written (on a loaded
    machine); a ``search`` that differs from the view's is written over again, so the address bar
    never keeps a link's unusable values (an unknown preset, say).
    """

    def write(*_events) -> None:
        location.search = query_string(query())

    def restore(event) -> None:
        wanted = query_string(query())
        if event.new != wanted:
            location.search = wanted

    owner.param.watch(write, list(names))
    location.param.watch(restore, "search")
    write()
