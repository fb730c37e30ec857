"""The dashboard's process-wide caches, shared by every session of the server and kept by Panel.

:class:`SharedCache` stores values in Panel's memo store (:func:`panel.cache`, bounded, least
recently used evicted first); :data:`FIGURES`, :data:`JACOBIANS`, :data:`SWEEPS`,
:data:`SWEEP_UNITS` and :data:`CHECKS` are the dashboard's caches. ``pn.state.clear_caches()``
empties them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import panel as pn

__all__ = ["CHECKS", "FIGURES", "JACOBIANS", "SWEEPS", "SWEEP_UNITS", "SharedCache"]


class _Slot:
    """One entry of a :class:`SharedCache`: empty (``None``) until a value is put in it."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value: Any = None


class SharedCache:
    """A bounded cache shared by every session of the server process, kept by Panel's
    :func:`panel.cache`: ``slot`` is a function memoized with ``pn.cache(max_items=…,
    policy="LRU")`` that returns an empty :class:`_Slot` for a key it has not seen, so Panel owns
    the storage, the sharing across sessions and the eviction of the least recently used key;
    :meth:`get` reads a slot without computing anything (a view can apply a cached result at
    once) and :meth:`put` fills it. Keys are compared by their ``repr`` (tuples of primitives and
    frozen dataclasses of primitives). Calls are serialised: Panel's memo store is a plain dict."""

    def __init__(self, slot: Callable[[str], _Slot]) -> None:
        self._slot, self._lock = slot, threading.Lock()

    def _at(self, key: Any) -> _Slot:
        with self._lock:
            return self._slot(repr(key))

    def get(self, key: Any) -> Any:
        """The value stored for ``key``, or ``None``."""
        return self._at(key).value

    def put(self, key: Any, value: Any) -> None:
        self._at(key).value = value

    def __contains__(self, key: Any) -> bool:
        return self.get(key) is not None

    def clear(self) -> None:
        with self._lock:
            self._slot.clear()


# One memoized slot function per cache: pn.cache keeps one store per function (by module and name).
@pn.cache(max_items=96, policy="LRU")
def _figure_slot(key: str) -> _Slot:
    return _Slot()


@pn.cache(max_items=256, policy="LRU")
def _jacobian_slot(key: str) -> _Slot:
    return _Slot()


@pn.cache(max_items=32, policy="LRU")
def _sweep_slot(key: str) -> _Slot:
    return _Slot()


@pn.cache(max_items=256, policy="LRU")
def _sweep_unit_slot(key: str) -> _Slot:
    return _Slot()


@pn.cache(max_items=64, policy="LRU")
def _check_slot(key: str) -> _Slot:
    return _Slot()


#: Built figures (HoloViews objects and the reduced tables they draw), keyed by view, settings
#: and options: returning to computed settings needs no rebuild.
FIGURES = SharedCache(_figure_slot)
#: Jacobian results per :class:`osa_lab.dashboard.jobs.Unit` (preset × seed × resolved algorithm).
JACOBIANS = SharedCache(_jacobian_slot)
#: Sweep results by :class:`~osa_lab.dashboard.sweep.SweepSettings`, filled by
#: :func:`~osa_lab.dashboard.sweep.compute_sweep` and by long sweeps' workers: what
#: :meth:`SweepState.refresh` can apply at once.
SWEEPS = SharedCache(_sweep_slot)
#: Tables of single model runs (:class:`~osa_lab.studies.settings.StudyPoint`) computed by a long
#: sweep's worker: a sweep cancelled and asked for again, or one more preset, runs only the missing ones.
SWEEP_UNITS = SharedCache(_sweep_unit_slot)
#: OSA check results by the arguments of :func:`compute_osa_check`.
CHECKS = SharedCache(_check_slot)
