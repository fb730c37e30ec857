"""The study's settings, read from an experiment file (YAML) with optional named profiles.

An experiment file names the data, the shared budget (``steps`` at ``batch_size``), the model
overrides, which presets run at which depths, the final seeds per depth, the tuning grid and its
extension rule, the baselines' gate and the equivalence margin. A profile (``--quick``) overrides
any of these keys. :meth:`StudySpec.to_dict` and :func:`load_spec` round-trip.

Every setting is checked before any work starts (:mod:`.schema`): its type and range, the
relations between settings (every preset × depth builds a model, heads divide the width, every
depth has its final seeds, tuning seeds are not final seeds, start values lie inside their
bounds), and bounds on sizes that only ``--allow-large`` lifts. Each setting is one line of
:class:`StudySpec`, :class:`TuningSpec` or :data:`MODEL_SETTINGS`: its default, its check and
what it means (``docs/training.md`` shows the table :func:`schema_table` returns).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from osa_lab.errors import ConfigurationError
from osa_lab.studies.depth_study.claims import DEFAULT_CLAIMS, Claim, Claims
from osa_lab.studies.depth_study.schema import (
    Bounds,
    Choice,
    Context,
    Flag,
    Int,
    ListOf,
    PlainName,
    Real,
    Section,
    Text,
    check_mapping,
    check_section,
    read_yaml_file,
    refuse,
    schema_rows,
    section_fields,
    setting,
    unknown_key,
)
from osa_lab.studies.training.config import DEFAULT_WARMUP_FRACTION

#: sizes above which a study needs ``--allow-large`` (beyond them a study runs for days on a CPU)
MAX_STEPS = 100_000
MAX_DEPTH = 256
MAX_WIDTH = 1024
MAX_BATCH = 4096
MAX_SEEDS = 100  # final seeds per depth
HARD_MAX_SEEDS = 100_000  # final seeds per depth even with --allow-large (their list is built in memory)
MAX_RUNS = 5_000  # training runs of the whole study, tuning included (first round of each grid)
MAX_KAPPA_SAMPLES = 64
MAX_GROUP_SIZE = 100  # a group holds every member's model, activations and AdamW state at once
MAX_EXTENSIONS = 10


def _presets() -> list[str]:
    from osa_lab.nn.presets import preset_names

    return preset_names(training=True)


def _datasets() -> tuple[str, ...]:
    from osa_lab.studies.data import DATASETS

    return DATASETS


def _osa_methods() -> list[str]:
    from osa_lab.ops.functional import OSA_METHODS

    return [*OSA_METHODS, "auto"]


_SEED = Int(0)
_POSITIVE = Real(0.0, 1e6, low_open=True)
_FRACTION = Real(0.0, 1.0, low_open=True, high_open=True)
#: the tuned axes, in the order of a setting ``(lr, alpha_lr_mult, warmup_fraction)``
AXES = ("lr", "alpha_lr_mult", "warmup_fraction")


@dataclass(frozen=True)
class TuningSpec:
    """The tuning grid: start values, the ×``extension_factor`` rule and its limit, the tuning seeds."""

    steps: int = setting(2000, Int(1, large=MAX_STEPS), "training steps of each tuning run")
    seeds: tuple[int, ...] = setting((1000, 1001), ListOf(_SEED, 2, 100, distinct=True),
                                     "tuning seeds (≥ 2), none of them a final seed")  # fmt: skip
    lr: tuple[float, ...] = setting((1e-3, 3e-3, 1e-2), ListOf(Real(0.0, 10.0, low_open=True), 1, 32, distinct=True),
                                    "start grid of learning rates, inside `lr_bounds`")  # fmt: skip
    alpha_lr_mult: tuple[float, ...] = setting((1.0, 10.0), ListOf(_POSITIVE, 1, 32, distinct=True),
                                               "start grid of OSA's α-lr multipliers, inside `alpha_lr_mult_bounds`")  # fmt: skip
    extension_factor: float = setting(3.0, Real(1.0, 1000.0, low_open=True),
                                      "a grid whose optimum lies at an edge is extended by this factor")  # fmt: skip
    max_extensions: int = setting(3, Int(0, large=MAX_EXTENSIONS), "extensions per grid edge")
    lr_bounds: tuple[float, float] = setting((1e-5, 0.3), Bounds(Real(0.0, 10.0, low_open=True)),
                                             "no extension goes past these learning rates")  # fmt: skip
    alpha_lr_mult_bounds: tuple[float, float] = setting((0.1, 1000.0), Bounds(_POSITIVE),
                                                        "no extension goes past these multipliers")  # fmt: skip
    warmup_fraction: tuple[float, ...] = setting((DEFAULT_WARMUP_FRACTION,), ListOf(_FRACTION, 1, 32, distinct=True),
                                                 "start grid of warm-up lengths (fraction of the steps), "
                                                 "inside `warmup_fraction_bounds`")  # fmt: skip
    warmup_fraction_bounds: tuple[float, float] = setting((0.005, 0.5), Bounds(_FRACTION),
                                                          "no extension goes past these warm-up fractions")  # fmt: skip
    tie_margin: float = setting(0.0, Real(0.0, 1.0, high_open=True),
                                "settings whose mean validation accuracy is within this of the best tie; the tie "
                                "goes to the smallest lr, then the smallest α-lr multiplier, then the longest warm-up")  # fmt: skip

    def __post_init__(self) -> None:
        if len(self.seeds) < 2 or len(set(self.seeds)) != len(self.seeds):
            raise ConfigurationError(f"tuning needs ≥ 2 distinct seeds, got {list(self.seeds)}")
        for name in AXES:
            vals = getattr(self, name)
            if not vals or any(not (v == v and 0 < v < float("inf")) for v in vals):
                raise ConfigurationError(f"tuning `{name}` must be a non-empty list of positive numbers, got {vals}")
        if not self.extension_factor > 1:
            raise ConfigurationError(f"`extension_factor` must be > 1, got {self.extension_factor}")
        if self.max_extensions < 0 or self.steps < 1:
            raise ConfigurationError("tuning `max_extensions` must be ≥ 0 and `steps` ≥ 1")


@dataclass(frozen=True)
class ModelSettings:
    """The model overrides a study may set (the same for every transformer preset; ``mlp`` and
    ``cnn1d`` keep their published sizes). Depth comes from the cells."""

    dim: int = setting(None, Int(1, large=MAX_WIDTH), "model width d (heads must divide it)")
    heads: int = setting(None, Int(1, large=MAX_WIDTH), "attention heads")
    head_dim: int = setting(None, Int(1, large=MAX_WIDTH), "width of each head (default dim / heads)")
    mlp_ratio: float = setting(None, Real(0.0, 64.0), "MLP width / d (0: no MLP)")
    osa_method: str = setting(None, Choice(_osa_methods, "OSA method"), "how OSA's exponential is computed")
    alpha_init: float = setting(None, Real(-1e3, 1e3), "OSA's α at initialisation (OSA presets only)")
    learn_alpha: bool = setting(None, Flag(), "whether OSA's α is learned")


@dataclass(frozen=True)
class _Cell:
    presets: tuple[str, ...] = setting((), ListOf(Choice(_presets, "preset"), 1, 64, distinct=True), "model presets")
    depths: tuple[int, ...] = setting((), ListOf(Int(1, large=MAX_DEPTH), 1, 64, distinct=True), "depths")


@dataclass(frozen=True)
class Cells:
    """``[{presets: [...], depths: [...]}, …]``: every preset of a cell runs at every depth of it."""

    def __call__(self, value: Any, where: str, ctx: Context) -> tuple:
        cells = ListOf(lambda v, w, c: v, 1, 64)(value, where, ctx)
        out = []
        for i, cell in enumerate(cells):
            checked = check_section(_Cell, check_mapping(cell, f"{where}[{i}]"), f"{where}[{i}]", ctx)
            missing = [k for k in ("presets", "depths") if k not in checked]
            if missing:
                raise refuse(f"{where}[{i}]", f"has no `{missing[0]}`", "write {presets: [vit, skipless-osa], depths: [4, 8]}")
            out.append((checked["presets"], checked["depths"]))
        return tuple(out)

    def describe(self) -> str:
        return "list of {presets: [preset, …], depths: [int ≥ 1, …]}"


@dataclass(frozen=True)
class SeedCounts:
    """``{depth: number of final seeds}``; the final seeds at a depth are 0, 1, …, n − 1."""

    def __call__(self, value: Any, where: str, ctx: Context) -> dict[int, int]:
        value = check_mapping(value, where)
        out = {}
        for depth, n in value.items():
            depth = Int(1)(depth, f"{where} key {depth!r}", ctx)
            out[depth] = Int(1, HARD_MAX_SEEDS, large=MAX_SEEDS)(n, f"{where}.{depth}", ctx)
        return out

    def describe(self) -> str:
        return f"mapping depth → int ≥ 1 (over {MAX_SEEDS} with --allow-large)"


@dataclass(frozen=True)
class Gate:
    """``{preset: floor}``: the baselines' mean test accuracy must reach its floor in [0, 1]."""

    def __call__(self, value: Any, where: str, ctx: Context) -> dict[str, float]:
        value = check_mapping(value, where)
        return {Choice(_presets, "preset")(k, f"{where} key", ctx): Real(0.0, 1.0)(v, f"{where}.{k}", ctx)
                for k, v in value.items()}  # fmt: skip

    def describe(self) -> str:
        return "mapping preset → accuracy in [0, 1]"


@dataclass(frozen=True)
class StudySpec:
    """One named experiment (see ``experiments/mnist1d_depth.yaml``)."""

    name: str = setting(dataclasses.MISSING, PlainName(), "the study's name (names its checkpoint folder)")
    data: str = setting("mnist1d", Choice(_datasets, "data set"), "the data set")
    results: str = setting("docs/results/mnist1d-depth", Text(), "results folder (`--output` overrides it)")
    steps: int = setting(6000, Int(1, large=MAX_STEPS), "training steps of each final run (whole epochs)")
    batch_size: int = setting(100, Int(1, large=MAX_BATCH), "examples per step")
    val_fraction: float = setting(0.1, Real(0.0, 1.0, low_open=True, high_open=True), "validation split")
    model: Mapping[str, Any] = setting(None, Section(ModelSettings, as_dict=True, merge=False),
                                       "model overrides (below)", factory=dict)  # fmt: skip
    cells: tuple[tuple[tuple[str, ...], tuple[int, ...]], ...] = setting((), Cells(), "presets × depths to run")
    seeds: Mapping[int, int] = setting(None, SeedCounts(), "final seeds per depth", factory=dict)
    tuning: TuningSpec = setting(None, Section(TuningSpec), "the tuning grid (below)", factory=TuningSpec)
    gate: Mapping[str, float] = setting(None, Gate(), "baselines' accuracy floors", factory=dict)
    equivalence_margin: float = setting(0.02, Real(0.0, 1.0, low_open=True, high_open=True),
                                        "'comparable' means within ± this accuracy (TOST)")  # fmt: skip
    claims: tuple[Claim, ...] = setting(DEFAULT_CLAIMS, Claims(),
                                        "the claims tested (default: the depth study's four, on test accuracy)")  # fmt: skip
    log_loss_margin: float = setting(0.3, Real(0.0, 10.0, low_open=True),
                                     "'comparable' training loss means within ± this many decades (0.3: a factor 2)")  # fmt: skip
    kappa_samples: int = setting(4, Int(1, large=MAX_KAPPA_SAMPLES), "inputs of the Jacobian κ (median)")
    group_size: int = setting(0, Int(0, large=MAX_GROUP_SIZE),
                              "seeds of one setting trained together in one task (0: the default rule, one group "
                              "from six seeds up, each seed alone below; 1: every seed alone, so a cell's final "
                              "seeds spread over the workers)")  # fmt: skip
    profile: str = setting("full", PlainName(), "the profile the settings come from (written by the study)")

    def __post_init__(self) -> None:
        if not self.cells:
            raise ConfigurationError("the experiment names no `cells` (presets × depths)")
        for _, depths in self.cells:
            missing = [d for d in depths if d not in self.seeds]
            if missing:
                raise ConfigurationError(f"`seeds` gives no number of final seeds for depth(s) {missing}")
        overlap = set(self.tuning.seeds) & set(range(max(self.seeds.values(), default=0)))
        if overlap:
            raise ConfigurationError(
                f"tuning seeds {sorted(overlap)} are also final seeds (0 … {max(self.seeds.values()) - 1}); "
                "choose tuning seeds outside that range so the reported runs are not the ones the choice was made on"
            )
        if not 0 < self.val_fraction < 1:
            raise ConfigurationError(f"`val_fraction` must lie in (0, 1), got {self.val_fraction}")

    def final_seeds(self, depth: int) -> list[int]:
        """The final seeds at ``depth``: 0, 1, …, n − 1."""
        return list(range(int(self.seeds[depth])))

    def run_order(self) -> list[tuple[str, int]]:
        """Every (preset, depth) of the study in the order it runs: by depth; at each depth the gated
        baselines first (cheap, and they decide whether the study is on the published scale),
        then the presets of the first cell, then the rest."""
        seen: dict[tuple[str, int], int] = {}
        for c, (presets, depths) in enumerate(self.cells):
            for depth in depths:
                for preset in presets:
                    seen.setdefault((preset, depth), 0 if preset in self.gate else 1 + c)
        return sorted(seen, key=lambda key: (key[1], seen[key], list(seen).index(key)))

    def first_round_runs(self, preset: str) -> int:
        """The tuning runs of a cell's first round: every start point of the grid on every tuning seed
        (the α-lr multipliers only for a preset that learns α)."""
        from osa_lab.studies.training.config import learns_alpha

        t = self.tuning
        points = len(t.lr) * (len(t.alpha_lr_mult) if learns_alpha(preset) else 1) * len(t.warmup_fraction)
        return points * len(t.seeds)

    def planned_runs(self) -> int:
        """Training runs the study starts at least: each cell's final seeds and its first tuning round."""
        return sum(self.seeds[depth] + self.first_round_runs(preset) for preset, depth in self.run_order())

    def to_dict(self) -> dict[str, Any]:
        """The settings as plain YAML-able data (what :func:`spec_from_dict` reads)."""
        d = dataclasses.asdict(self)
        d["model"] = dict(self.model)
        d["cells"] = [{"presets": list(p), "depths": list(ds)} for p, ds in self.cells]
        d["seeds"] = {int(k): int(v) for k, v in self.seeds.items()}
        d["tuning"] = {k: list(v) if isinstance(v, tuple) else v for k, v in d["tuning"].items()}
        d["gate"] = dict(self.gate)
        return d


def schema_table() -> list[tuple[str, str, str]]:
    """``(key, type and range, meaning)`` of every setting of an experiment file (docs/training.md)."""
    return schema_rows(StudySpec)


def check_relations(spec: StudySpec, ctx: Context) -> None:
    """The checks between settings, before any work: seeds per depth, disjoint tuning seeds,
    start values inside their bounds, a model for every preset × depth,
    and the study's size."""
    depths = {d for _, ds in spec.cells for d in ds}
    missing = sorted(depths - set(spec.seeds))
    if missing:
        raise refuse("seeds", f"gives no number of final seeds for depth(s) {missing} of the cells",
                     f"add e.g. {{{missing[0]}: 4}}")  # fmt: skip
    extra = sorted(set(spec.seeds) - depths)
    if extra:
        raise refuse("seeds", f"names depth(s) {extra} that no cell runs", "remove them or add them to a cell")
    top = max(spec.seeds.values())
    overlap = sorted(set(spec.tuning.seeds) & set(range(top)))
    if overlap:
        raise refuse("tuning.seeds", f"tuning seeds {overlap} are also final seeds (0 … {top - 1})",
                     f"choose tuning seeds ≥ {top} so the reported runs are not the ones the choice was made on")  # fmt: skip
    for axis in AXES:
        low, high = getattr(spec.tuning, f"{axis}_bounds")
        outside = [v for v in getattr(spec.tuning, axis) if not low <= v <= high]
        if outside:
            raise refuse(f"tuning.{axis}", f"start value(s) {outside} lie outside `tuning.{axis}_bounds` [{low:g}, {high:g}]",
                         "move them inside or widen the bounds")  # fmt: skip
    from osa_lab.nn.presets import get_preset

    for preset, depth in spec.run_order():
        if get_preset(preset).backbone != "transformer":
            continue  # the model overrides are all transformer settings: mlp and cnn1d keep their published sizes
        try:
            get_preset(preset, **spec.model, depth=depth)
        except ConfigurationError as err:
            raise ConfigurationError(f"`model` with preset {preset!r} at depth {depth}: {err}") from None
    runs = spec.planned_runs()
    if runs > MAX_RUNS and not ctx.allow_large:
        raise ConfigurationError(f"the study starts at least {runs} training runs, over the limit of {MAX_RUNS}; "
                                 "fewer cells, seeds or tuning points, or pass --allow-large if you really mean it")  # fmt: skip


def spec_from_dict(d: Mapping[str, Any], profile: str = "full", *, allow_large: bool = False) -> StudySpec:
    """A :class:`StudySpec` from the plain data of an experiment file, every setting and relation
    checked (:class:`~osa_lab.errors.ConfigurationError` on one line naming the key and the fix)."""
    ctx = Context(allow_large=allow_large)
    if not isinstance(d, Mapping):
        raise ConfigurationError(f"an experiment must be a mapping of settings, got {type(d).__name__}")
    d = dict(d)
    values = check_section(StudySpec, d, "", ctx)
    if "name" not in values:
        raise refuse("name", "is missing", "give the study a plain name, e.g. name: mnist1d-depth")
    if "cells" not in values:
        raise refuse("cells", "is missing", "name the presets × depths, e.g. cells: [{presets: [vit], depths: [4]}]")
    values["profile"] = PlainName()(profile, "profile", ctx)
    spec = StudySpec(**values)
    check_relations(spec, ctx)
    return spec


def _merge(base: dict, override: Mapping[str, Any]) -> dict:
    """The file's settings with a profile's on top: sections that merge (``tuning``) key by key,
    everything else (``model`` included) replaced whole."""
    fields = section_fields(StudySpec)
    out = dict(base)
    for k, v in override.items():
        check = fields[k].metadata["check"] if k in fields else None
        merge = isinstance(check, Section) and check.merge
        out[k] = {**out[k], **v} if merge and isinstance(v, Mapping) and isinstance(out.get(k), Mapping) else v
    return out


def load_spec(path: str | Path, profile: str | None = None, *, allow_large: bool = False) -> StudySpec:
    """Read an experiment file and apply ``profile`` (e.g. ``"quick"``) if given; every check
    runs before anything else (:mod:`.schema`). Every profile of the file is checked too (the
    size bounds only for the one that runs), so a broken file is refused whole."""
    path = Path(path)
    raw = read_yaml_file(path)
    if not isinstance(raw, dict):
        raise ConfigurationError(f"the experiment file {path} must hold a mapping of settings, got "
                                 f"{type(raw).__name__}; see experiments/mnist1d_depth.yaml")  # fmt: skip
    profiles = raw.pop("profiles", None)
    profiles = {} if profiles is None else profiles
    if not isinstance(profiles, dict):
        raise ConfigurationError(f"the experiment file {path}: `profiles` must be a mapping name → settings")
    for name, override in profiles.items():
        try:
            PlainName()(name, "profiles key", Context())
            check_mapping(override, f"profiles.{name}")
            if "profiles" in override:
                raise unknown_key(f"profiles.{name}", "profiles", [])
        except ConfigurationError as err:
            raise ConfigurationError(f"the experiment file {path}: {err}") from None
    chosen = profile if profile not in (None, "full") else "full"
    if chosen != "full" and chosen not in profiles:
        raise ConfigurationError(f"the experiment file {path} has no profile {profile!r}; it has {sorted(profiles)}")
    spec = None
    for name in [chosen, *(n for n in ["full", *profiles] if n != chosen)]:
        data = raw if name == "full" else _merge(raw, profiles[name])
        try:
            checked = spec_from_dict(data, name, allow_large=allow_large or name != chosen)
        except ConfigurationError as err:
            where = "" if name == "full" else f", profile {name!r}"
            raise ConfigurationError(f"the experiment file {path}{where}: {err}") from None
        if name == chosen:
            spec = checked
    assert spec is not None
    return spec
