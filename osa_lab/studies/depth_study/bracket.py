"""A tuning grid that brackets its optimum: an edge optimum extends the grid by one ×factor step.

The grid is a set of points on named log-scale axes (``lr``, ``alpha_lr_mult``,
``warmup_fraction``). After each round of evaluations the top point (highest mean validation
accuracy over the tuning seeds; exact ties: the smaller learning rate) is looked at along each
axis, through the points that share its other coordinates (its line). Where it is the smallest
(largest) value on its line, the next round tries it at the nearest value below (above) it that
was tried elsewhere on that axis (a fill point: a top found by extending one axis is bracketed
along the others too, within the range already explored), or, where no such value was tried, at
one factor below (above) it: an extension, unless that edge was already extended
``max_extensions`` times or the value would leave the axis' bounds. An axis with one start value
is not tuned. The search ends when no line needs a fill or an extension; a top point still on an
edge is reported as such. A point that diverged or failed
(:func:`~osa_lab.studies.training.failures.classify_run`) on any tuning seed scores NaN: it can
bound an optimum but never be chosen. When no point trained on every tuning seed (each failed or
diverged on some seed), the learning-rate axis is extended downwards. Where the search ends so,
:meth:`BracketState.least_failed` names the point that failed on the fewest: the cell's final
seeds run there, so that its failure rate is measured on them rather than left unmeasured.

The chosen point (:meth:`BracketState.best`) follows the stated tie rule: every point whose score
lies within ``tie_margin`` of the top score ties with it, and the tie goes to the smallest
learning rate, then the smallest α-lr multiplier, then the longest warm-up (the setting farthest
from the stability edge). With ``tie_margin`` 0 the chosen point is the top point.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

Point = tuple[float, ...]

#: axes on which the tie rule prefers the larger value (a longer warm-up is the more cautious setting)
PREFER_LARGER = frozenset({"warmup_fraction"})


@dataclass
class BracketState:
    """The search on one cell: axes, evaluated scores, and how often each edge was extended."""

    axes: tuple[str, ...]
    start: Mapping[str, Sequence[float]]
    bounds: Mapping[str, tuple[float, float]]
    factor: float = 3.0
    max_extensions: int = 3
    tie_margin: float = 0.0
    scores: dict[Point, float] = field(default_factory=dict)
    extensions: dict[tuple[str, str], int] = field(default_factory=dict)
    added_by_extension: set[Point] = field(default_factory=set)
    #: per evaluated point: the tuning seeds on which it failed or diverged, and the mean score of the others
    failures: dict[Point, int] = field(default_factory=dict)
    finished_scores: dict[Point, float] = field(default_factory=dict)

    def initial_points(self) -> list[Point]:
        """The full product of the start values."""
        points: list[Point] = [()]
        for axis in self.axes:
            points = [(*p, float(v)) for p in points for v in sorted(self.start[axis])]
        return points

    def top(self) -> Point | None:
        """The evaluated point of the highest score (exact ties: the smaller learning rate; None while
        every point diverged). The search brackets this point."""
        finite = [(s, p) for p, s in self.scores.items() if not math.isnan(s)]
        if not finite:
            return None
        return max(finite, key=lambda sp: (sp[0], -sp[1][0]))[1]

    def best(self) -> Point | None:
        """The chosen point: of the points within ``tie_margin`` of the top score, the one the tie
        rule prefers (smallest lr, then smallest α-lr multiplier, then longest warm-up)."""
        top = self.top()
        if top is None:
            return None
        floor = self.scores[top] - self.tie_margin - 1e-12
        tied = [p for p, s in self.scores.items() if not math.isnan(s) and s >= floor]
        return min(tied, key=self._preference)

    def least_failed(self) -> Point | None:
        """Where :meth:`best` is None (no point trained on every tuning seed): the point that failed on the
        fewest seeds, then the one of the highest mean score over its finished seeds, then the one the tie
        rule prefers; None before any point was evaluated."""
        if not self.failures:
            return None

        def key(point: Point) -> tuple[float, ...]:
            score = self.finished_scores.get(point, math.nan)
            return (self.failures[point], math.inf if math.isnan(score) else -score, *self._preference(point))

        return min(self.failures, key=key)

    def _preference(self, point: Point) -> tuple[float, ...]:
        return tuple(-v if axis in PREFER_LARGER else v for axis, v in zip(self.axes, point, strict=True))

    def _line(self, best: Point, i: int) -> list[float]:
        return sorted({p[i] for p in self.scores if all(p[j] == best[j] for j in range(len(best)) if j != i)})

    def _open_sides(self, top: Point) -> list[tuple[int, str, float | None]]:
        """``(axis index, "low"/"high", value)`` for each side of each tuned axis (more than one start
        value) where the top's line has no value beyond the top: ``value`` is the nearest one tried
        beyond it elsewhere on that axis (a fill), or None when none was (an edge)."""
        out: list[tuple[int, str, float | None]] = []
        for i, axis in enumerate(self.axes):
            if len(set(self.start[axis])) < 2:
                continue  # one start value: the axis is not tuned
            line, tried = self._line(top, i), sorted({p[i] for p in self.scores})
            if top[i] == line[0]:
                below = [v for v in tried if v < top[i]]
                out.append((i, "low", below[-1] if below else None))
            if top[i] == line[-1]:
                above = [v for v in tried if v > top[i]]
                out.append((i, "high", above[0] if above else None))
        return out

    def edges(self) -> list[tuple[str, str]]:
        """The (axis, "low"/"high") edges on which the top point sits now: no value beyond it was tried on
        that axis anywhere."""
        best = self.top()
        if best is None:
            return [("lr", "low")] if "lr" in self.axes else []
        return [(self.axes[i], side) for i, side, value in self._open_sides(best) if value is None]

    def fill_points(self) -> list[Point]:
        """The top point at the nearest values tried elsewhere beyond it, on each side of each tuned axis
        where its own line has none: a top found along one axis is bracketed along the others."""
        top = self.top()
        if top is None:
            return []
        new: list[Point] = []
        for i, _, value in self._open_sides(top):
            if value is None:
                continue  # an edge: next_points extends it
            point = top[:i] + (value,) + top[i + 1 :]
            if point not in self.scores and point not in new:
                new.append(point)
        return new

    def next_points(self) -> list[Point]:
        """Points of the next round (empty when the optimum is bracketed or the limits are reached):
        the fill points of :meth:`fill_points`, then one ×factor step past each edge the top sits on."""
        best = self.top()
        new: list[Point] = self.fill_points()
        for axis, side in self.edges():
            i = self.axes.index(axis)
            if self.extensions.get((axis, side), 0) >= self.max_extensions:
                continue
            lo, hi = self.bounds[axis]
            if best is None:  # everything diverged: go below the smallest learning rate at every other setting
                anchors = {p[:i] + (min(q[i] for q in self.scores),) + p[i + 1 :] for p in self.scores}
            else:
                anchors = {best}
            added = 0
            for anchor in sorted(anchors):
                edge = anchor[i]
                value = edge / self.factor if side == "low" else edge * self.factor
                if not lo * (1 - 1e-9) <= value <= hi * (1 + 1e-9):
                    continue
                point = anchor[:i] + (float(f"{value:.6g}"),) + anchor[i + 1 :]
                if point not in self.scores and point not in new:
                    new.append(point)
                    added += 1
            if added:
                self.extensions[(axis, side)] = self.extensions.get((axis, side), 0) + 1
        self.added_by_extension.update(new)
        return new

    def edge_after_limit(self) -> list[str]:
        """Edges the top point still sits on (after the search): ``["lr low", …]``; empty when bracketed."""
        return [f"{axis} {side}" for axis, side in self.edges()]
