"""Depth sweeps: presets × depths × sizes × α × seeds as one grid of model runs, tidy tables out.

:func:`sweep` turns its settings into :class:`~osa_lab.studies.settings.StudyPoint` s (one per
model, at the largest depth), refuses unreasonable grids (:func:`check_sweep_size`), runs one
grid task per point (:func:`osa_lab.studies.grid.run_grid`: in-process, local Dask or a
cluster; finished tasks cached on disk) and slices every model's profile for each requested depth.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import math
import numbers
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import torch

from osa_lab.errors import ConfigurationError, unknown_name
from osa_lab.fileio import write_all_or_nothing
from osa_lab.nn.presets import PRESETS, preset_names
from osa_lab.studies.depth.profiles import (
    COLUMN_DTYPES,
    METRIC_COLUMNS,
    SPECTRA_COLUMNS,
    check_batch,
    check_tokens,
    depth_profile,
    resolve_sites,
)
from osa_lab.studies.grid import GridOptions, Task, run_grid
from osa_lab.studies.metrics import METRICS
from osa_lab.studies.settings import StudyPoint, as_list, seed_list

#: Bounds of what :func:`sweep` runs without ``allow_large=True`` (``osa-lab sweep --allow-large``):
#: beyond them a sweep takes hours or runs out of memory, which is almost always a typo.
MAX_DEPTH = 1024
MAX_WIDTH = 4096  # tokens N and width d
MAX_BATCH = 1024
MAX_MODELS = 10_000  # model runs: presets × N × d × heads × α × seeds
MAX_HIDDEN_BYTES = 4 * 2**30  # hidden states of one model run (all layers and sites)


@dataclass
class SweepResult:
    """Tidy tables of a :func:`sweep`; ``.metrics`` and ``.spectra`` follow the module schema."""

    metrics: pd.DataFrame
    spectra: pd.DataFrame
    parameters: dict = field(default_factory=dict)
    #: Jacobian κ across depth (``osa_lab.studies.jacobian.KAPPA_COLUMNS``) when ``sweep(jacobian=…)``; else None
    jacobian: pd.DataFrame | None = None
    #: one row per grid task (its settings, ``kind``, status, error …; see :mod:`osa_lab.studies.grid`)
    tasks: pd.DataFrame | None = None

    @property
    def failures(self) -> pd.DataFrame:
        """The rows of :attr:`tasks` that failed (settings, ``error_type``, ``error``); empty if none."""
        if self.tasks is None or self.tasks.empty:
            return pd.DataFrame()
        return self.tasks[self.tasks["status"] != "ok"].reset_index(drop=True)

    def summary(self) -> pd.DataFrame:
        """Mean, std, min and max over seeds of every metric (one row per preset/config/layer/site/metric)."""
        return summarize_over_seeds(self.metrics)

    def to_csv(self, path: str | Path, spectra_path: str | Path | None = None) -> tuple[Path, Path | None]:
        """Write the metrics CSV to ``path`` and the spectra CSV beside it (``<stem>_spectra.csv``);
        both files are replaced together or not at all."""
        path = Path(path)
        if spectra_path is None:
            spectra_path = path.with_name(f"{path.stem}_spectra{path.suffix or '.csv'}")
        spectra_path = Path(spectra_path)
        write_tables([(path, self.metrics), (spectra_path, self.spectra)])
        return path, spectra_path


def summarize_over_seeds(metrics: pd.DataFrame) -> pd.DataFrame:
    """Aggregate a tidy metrics table over seeds: columns ``mean, std, min, max, n`` per key."""
    keys = [c for c in METRIC_COLUMNS if c not in ("seed", "value")]
    grouped = metrics.groupby(keys, dropna=False, sort=True)["value"]
    return grouped.agg(["mean", "std", "min", "max", "count"]).rename(columns={"count": "n"}).reset_index()


def _check_sweep_values(tokens_l: list, dims_l: list, heads_l: list, alphas_l: list, batch: object) -> None:
    """Refuse values the models would misuse silently (before anything is built)."""
    check_batch(batch)
    for name, values in (("tokens", tokens_l), ("dims", dims_l), ("heads", heads_l)):
        for v in values:
            if v is None and name == "heads":
                continue
            if not isinstance(v, numbers.Integral) or isinstance(v, bool) or v < 1:
                raise ConfigurationError(f"`{name}` must be ints ≥ 1, got {v!r}")
    for n in tokens_l:
        check_tokens(n)
    for a in alphas_l:
        if a is not None and not math.isfinite(a):
            raise ConfigurationError(
                f"`alphas` must be finite numbers (None for the derived initialisation), got {a!r}"
            )


def check_sweep_size(
    units: Sequence[StudyPoint | tuple],
    sites: Sequence[str],
    batch: int,
    dtype: torch.dtype,
    allow_large: bool = False,
) -> None:
    """Refuse clearly unreasonable sweeps unless ``allow_large``: depth > :data:`MAX_DEPTH`, N or d >
    :data:`MAX_WIDTH`, batch > :data:`MAX_BATCH`, more than :data:`MAX_MODELS` model runs, or hidden
    states of one run over :data:`MAX_HIDDEN_BYTES`. ``units`` are the sweep's
    :class:`~osa_lab.studies.settings.StudyPoint` s (or ``(preset, depth, N, d, heads, α, seed)``
    tuples). Raises :class:`ConfigurationError` naming the override."""
    if allow_large or not units:
        return
    points = [StudyPoint(*u) for u in units]
    hint = "pass allow_large=True (osa-lab sweep --allow-large) if you really mean it"
    depth = max(p.depth for p in points)
    n = max(p.tokens for p in points)
    d = max(p.dim for p in points)
    if depth > MAX_DEPTH:
        raise ConfigurationError(f"depth {depth} is over the limit of {MAX_DEPTH} layers; {hint}")
    if max(n, d) > MAX_WIDTH:
        raise ConfigurationError(f"tokens N = {n}, dim d = {d}: over the limit of {MAX_WIDTH}; {hint}")
    if batch > MAX_BATCH:
        raise ConfigurationError(f"batch {batch} is over the limit of {MAX_BATCH} inputs per model; {hint}")
    if len(units) > MAX_MODELS:
        raise ConfigurationError(
            f"the sweep runs {len(units)} models, over the limit of {MAX_MODELS}; {hint}"
        )
    itemsize = torch.finfo(dtype).bits // 8
    need = max((p.depth + 1) * len(sites) * batch * p.tokens * p.dim * itemsize for p in points)
    if need > MAX_HIDDEN_BYTES:
        raise ConfigurationError(
            f"one model's hidden states would take {need / 2**30:.1f} GiB (depth {depth}, N = {n}, d = {d}, "
            f"batch {batch}, {len(sites)} site(s)), over {MAX_HIDDEN_BYTES / 2**30:.0f} GiB; "
            f"lower the depth, sizes or batch, or {hint}"
        )


def _cache_key(params: dict) -> str:
    from osa_lab.version import __version__

    blob = json.dumps(
        {**params, "osa_lab": __version__, "torch": torch.__version__}, sort_keys=True, default=str
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def _units(settings: dict) -> Iterator[StudyPoint]:
    """One :class:`StudyPoint` per model to run, at the largest depth; SSA presets ignore α."""
    max_depth = max(settings["depths"])
    seen = set()
    grid = (settings[k] for k in ("presets", "tokens", "dims", "heads", "alphas", "seeds"))
    for preset, n, d, h, a, s in itertools.product(*grid):
        attention = PRESETS[preset].config.attention
        a_key = a if attention == "osa" else None
        key = (preset, n, d, h, a_key, s)
        if key in seen:
            continue
        seen.add(key)
        yield StudyPoint(preset, max_depth, n, d, h, a_key, s)


def sweep(
    presets: str | Sequence[str],
    depths: int | Sequence[int],
    tokens: int | Sequence[int] = 64,
    dims: int | Sequence[int] = 64,
    heads: int | Sequence[int] | None = None,
    alphas: float | Sequence[float | None] | None = None,
    seeds: int | Sequence[int] = 3,
    *,
    site: str | Sequence[str] = "block",
    metrics: Sequence[str] | None = None,
    spectra: bool = True,
    batch: int = 1,
    dtype: torch.dtype = torch.float64,
    cache_dir: str | Path | None = None,
    progress: bool = True,
    threads: int | None = 1,
    allow_large: bool = False,
    jacobian: str = "none",
    grid: GridOptions | None = None,
) -> SweepResult:
    """Depth profiles over presets × depths × tokens × dims × heads × α × seeds, as tidy tables.

    Args:
        presets: preset names (:func:`osa_lab.nn.presets.preset_names`).
        depths: model depths; each model is run once at the largest depth and sliced (see module
            docstring), so ``depth`` in the tables is the depth of the model the row belongs to.
        tokens, dims: N and d values.
        heads: head counts (``None``: each preset's default).
        alphas: OSA α values (``None`` entries: the derived init). SSA presets run once, α = NaN.
        seeds: a number of seeds (``3`` → 0, 1, 2) or an explicit list.
        site: ``"block"``, ``"attention"`` or ``"both"``.
        cache_dir: folder of finished model runs, one ``.npz`` file per run (read without pickle,
            so a file from elsewhere never runs code), keyed by every parameter and the osa_lab
            and torch versions; a damaged or foreign file is computed again with a warning.
        progress: show a tqdm progress bar (on stderr).
        threads: torch intra-op threads while sweeping (default 1: the matrices are small and
            extra threads only contend, ~8× slower on a loaded 2-core machine); ``None`` keeps
            the current setting.
        allow_large: run sweeps beyond the bounds of :func:`check_sweep_size` (depth > 1024, …).
        jacobian: also compute Jacobian κ across depth per model into ``.jacobian``, by this
            algorithm (``"auto"``, ``"exact"``, ``"matrix-free"``;
            :func:`osa_lab.studies.jacobian.jacobian_depth_profile`); ``"none"``: no Jacobians.
        grid: where the model runs go (:class:`osa_lab.studies.grid.GridOptions`: in-process, a local
            Dask cluster, or an existing one); default in-process with ``threads`` torch threads
            and ``progress``. Each model run (and each Jacobian profile) is one task; with
            ``cache_dir`` finished tasks are stored there and skipped on a rerun. A task that
            fails is listed in ``.tasks``/``.failures`` (with a ``GridTaskFailedWarning``)
            and the others finish. The tables do not depend on where the tasks ran.

    Returns:
        :class:`SweepResult` with ``.metrics`` and ``.spectra`` (schema in the module docstring).

    Raises:
        UnknownNameError: unknown preset, metric or site (lists the valid ones).
        ConfigurationError: an impossible configuration (e.g. dim not divisible by heads, batch < 1,
            a non-finite α) or one over the bounds of :func:`check_sweep_size`, raised before any
            computation.
    """
    settings = _sweep_settings(
        presets, depths, tokens, dims, heads, alphas, seeds, site, metrics, batch, dtype
    )
    units = list(_units(settings))
    # Validate every configuration before computing anything.
    check_sweep_size(units, settings["sites"], batch, dtype, allow_large)
    for point in units:
        point.config()
    cache = Path(cache_dir) if cache_dir is not None else None
    # The task store is created by run_grid with the first finished task, not here: a sweep that
    # fails before any task finishes (an unreachable scheduler) leaves no empty folder behind.
    if cache is not None and cache.exists() and not cache.is_dir():
        raise ConfigurationError(f"`cache_dir` {str(cache)!r} is a file; give a folder")
    if jacobian != "none":
        from osa_lab.studies.jacobian import JACOBIAN_ALGORITHMS

        if jacobian not in JACOBIAN_ALGORITHMS:
            raise unknown_name("Jacobian algorithm", jacobian, [*JACOBIAN_ALGORITHMS, "none"])
    options = grid if grid is not None else GridOptions.in_process(threads=threads, progress=progress)
    tasks = sweep_tasks(units, settings, spectra, dtype, jacobian, allow_large)
    outcome = run_grid(tasks, options, store=cache, desc="sweep")
    result = _collect(outcome, settings, spectra, jacobian)
    outcome.warn_failures("sweep")
    return result


def _sweep_settings(presets, depths, tokens, dims, heads, alphas, seeds, site, metrics, batch, dtype) -> dict:
    """The sweep's settings as checked lists (the ``parameters`` of its :class:`SweepResult`, plus
    the metric names); refuses unknown presets, sites and metrics and misusable values."""
    presets_l = as_list("presets", presets)
    for p in presets_l:
        if p not in PRESETS:
            raise unknown_name("preset", p, preset_names())
    depths_l = as_list("depths", depths)
    if any(isinstance(x, bool) or not isinstance(x, numbers.Integral) or x < 1 for x in depths_l):
        raise ConfigurationError(f"`depths` must be positive ints, got {depths_l}")
    tokens_l, dims_l, heads_l = as_list("tokens", tokens), as_list("dims", dims), as_list("heads", heads)
    alphas_l = [None if a is None else float(a) for a in as_list("alphas", alphas)]
    seeds_l = seed_list(seeds)
    _check_sweep_values(tokens_l, dims_l, heads_l, alphas_l, batch)
    sites = resolve_sites(site)
    metric_names = list(METRICS) if metrics is None else list(metrics)
    for name in metric_names:
        if name not in METRICS:
            raise unknown_name("metric", name, list(METRICS))
    return {
        "presets": presets_l,
        "depths": [int(x) for x in depths_l],
        "tokens": tokens_l,
        "dims": dims_l,
        "heads": heads_l,
        "alphas": alphas_l,
        "seeds": seeds_l,
        "sites": sites,
        "batch": batch,
        "dtype": str(dtype).removeprefix("torch."),
        "metrics": metric_names,
    }


def _collect(outcome, settings: dict, spectra: bool, jacobian: str) -> SweepResult:
    """The :class:`SweepResult` of a finished grid: every model's profile sliced at each requested
    depth, the Jacobian tables, and the task table."""
    metric_parts, spectra_parts, jacobian_parts = [], [], []
    for o in outcome.outcomes:
        if not o.ok:
            continue
        if o.task.settings["kind"] == "jacobian":
            jacobian_parts.append(o.value)
            continue
        prof_m, prof_s = o.value
        for depth in sorted(set(settings["depths"])):
            m = prof_m[prof_m["layer"] <= depth].copy()
            m["depth"] = depth
            metric_parts.append(m)
            if spectra:
                sp = prof_s[prof_s["layer"] <= depth].copy()
                sp["depth"] = depth
                spectra_parts.append(sp)
    parameters = {k: v for k, v in settings.items() if k != "metrics"}
    result = _finish(metric_parts, spectra_parts, parameters)
    result.tasks = outcome.table()
    if jacobian != "none":
        from osa_lab.studies.jacobian import KAPPA_COLUMNS

        result.jacobian = (
            pd.concat(jacobian_parts, ignore_index=True)
            if jacobian_parts
            else pd.DataFrame(columns=KAPPA_COLUMNS)
        )
    return result


def _profile_task(
    point: StudyPoint,
    sites: list[str],
    metrics: list[str],
    spectra: bool,
    batch: int,
    dtype: torch.dtype,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """One grid task of :func:`sweep`: the depth profile of one model (metrics and spectra tables)."""
    prof = depth_profile(point, batch=batch, site=sites, metrics=metrics, spectra=spectra, dtype=dtype)
    return prof.metrics, prof.spectra


def _check_table(value: object, columns: list[str], what: str) -> None:
    if not isinstance(value, pd.DataFrame):
        raise TypeError(f"{what} must be a DataFrame, got {type(value).__name__}")
    missing = [c for c in columns if c not in value.columns]
    if missing:
        raise ValueError(f"{what} lacks the columns {missing}")


def check_profile_result(value: object) -> None:
    """Raise ``TypeError``/``ValueError`` unless ``value`` is a sweep task's result: a pair of
    (metrics, spectra) tables with :data:`METRIC_COLUMNS` and :data:`SPECTRA_COLUMNS`."""
    if not isinstance(value, tuple) or len(value) != 2:
        raise TypeError(f"a depth profile is a pair of tables (metrics, spectra), got {type(value).__name__}")
    _check_table(value[0], METRIC_COLUMNS, "the metrics table")
    _check_table(value[1], SPECTRA_COLUMNS, "the spectra table")


def check_jacobian_result(value: object) -> None:
    """Raise ``TypeError``/``ValueError`` unless ``value`` is a κ-profile table (``KAPPA_COLUMNS``)."""
    from osa_lab.studies.jacobian import KAPPA_COLUMNS

    _check_table(value, list(KAPPA_COLUMNS), "the Jacobian κ table")


def sweep_tasks(
    units: list[StudyPoint],
    settings: dict,
    spectra: bool,
    dtype: torch.dtype,
    jacobian: str,
    allow_large: bool = False,
) -> list[Task]:
    """The grid of a sweep: one task per model run (its store key is a hash of every setting that
    changes its result) and, with ``jacobian``, one κ-profile task per model; ``allow_large``
    lifts the matrix-free Jacobian's input-size bound for exactly these sizes."""
    tasks = []
    for point in units:
        params = {
            **point._asdict(),
            "sites": settings["sites"],
            "metrics": settings["metrics"],
            "spectra": spectra,
            "batch": settings["batch"],
            "dtype": settings["dtype"],
        }
        kwargs = {"point": point, "sites": settings["sites"], "metrics": settings["metrics"], "spectra": spectra,
                  "batch": settings["batch"], "dtype": dtype}  # fmt: skip
        tasks.append(Task(_profile_task, kwargs, {"kind": "profile", **point._asdict()},
                          key=f"profile-{_cache_key(params)}", check=check_profile_result))  # fmt: skip
    if jacobian != "none":
        from osa_lab.studies.jacobian import jacobian_depth_profile

        for point in units:
            key = f"jacobian-{_cache_key({**point._asdict(), 'algorithm': jacobian, 'kind': 'jacobian'})}"
            kwargs = {"preset": point, "algorithm": jacobian}
            if allow_large:  # not part of the key: it changes whether a task runs, not its result
                kwargs["max_input_dim"] = point.tokens * point.dim
            tasks.append(Task(jacobian_depth_profile, kwargs, {"kind": "jacobian", **point._asdict()}, key=key,
                              progress_kwarg="progress", check=check_jacobian_result))  # fmt: skip
    return tasks


@contextlib.contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """Temporarily set ``torch.set_num_threads(n)`` (``None``: leave it)."""
    if n is None:
        yield
        return
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def _finish(
    metric_parts: list[pd.DataFrame], spectra_parts: list[pd.DataFrame], parameters: dict
) -> SweepResult:
    """The sweep's tables (typed empty tables when nothing ran) with the parameters that made them."""
    metrics_df = (
        pd.concat(metric_parts, ignore_index=True)
        if metric_parts
        else pd.DataFrame({c: pd.Series(dtype=COLUMN_DTYPES.get(c, "float64")) for c in METRIC_COLUMNS})
    )
    spectra_df = (
        pd.concat(spectra_parts, ignore_index=True)
        if spectra_parts
        else pd.DataFrame({c: pd.Series(dtype=COLUMN_DTYPES.get(c, "float64")) for c in SPECTRA_COLUMNS})
    )
    return SweepResult(metrics_df, spectra_df, parameters)


def write_tables(tables: list[tuple[Path, pd.DataFrame]]) -> None:
    """Write every CSV to a uniquely named temporary beside it, then move them all into place:
    either every table is replaced or none is, and a failed write (a full disk) leaves no
    temporary behind (:func:`osa_lab.fileio.write_all_or_nothing`)."""
    write_all_or_nothing([(path, lambda fh, df=df: df.to_csv(fh, index=False), "w") for path, df in tables])
