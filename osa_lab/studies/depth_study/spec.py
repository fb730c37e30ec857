"""The study's settings, read from an experiment file (YAML) with optional named profiles.

An experiment file names the data, the shared budget (``steps`` at ``batch_size``), the model
overrides, which presets run at which depths, the final seeds per depth, the tuning grid and its
extension rule, the baselines' gate and the equivalence margin. A profile (``--quick``) overrides
any of these keys. :meth:`StudySpec.to_dict` and :func:`load_spec` round-trip.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from osa_lab.errors import ConfigurationError


@dataclass(frozen=True)
class TuningSpec:
    """The tuning grid: start values, the ×``extension_factor`` rule and its limit, the tuning seeds."""

    steps: int = 2000
    seeds: tuple[int, ...] = (1000, 1001)
    lr: tuple[float, ...] = (1e-3, 3e-3, 1e-2)
    alpha_lr_mult: tuple[float, ...] = (1.0, 10.0)
    extension_factor: float = 3.0
    max_extensions: int = 3
    lr_bounds: tuple[float, float] = (1e-5, 0.3)
    alpha_lr_mult_bounds: tuple[float, float] = (0.1, 1000.0)

    def __post_init__(self) -> None:
        if len(self.seeds) < 2 or len(set(self.seeds)) != len(self.seeds):
            raise ConfigurationError(f"tuning needs ≥ 2 distinct seeds, got {list(self.seeds)}")
        for name in ("lr", "alpha_lr_mult"):
            vals = getattr(self, name)
            if not vals or any(not (math.isfinite(v) and v > 0) for v in vals):
                raise ConfigurationError(f"tuning `{name}` must be a non-empty list of positive numbers, got {vals}")
        if not self.extension_factor > 1:
            raise ConfigurationError(f"`extension_factor` must be > 1, got {self.extension_factor}")
        if self.max_extensions < 0 or self.steps < 1:
            raise ConfigurationError("tuning `max_extensions` must be ≥ 0 and `steps` ≥ 1")


@dataclass(frozen=True)
class StudySpec:
    """One named experiment (see ``experiments/mnist1d_depth.yaml``)."""

    name: str
    data: str = "mnist1d"
    results: str = "docs/results/mnist1d-depth"
    steps: int = 6000
    batch_size: int = 100
    val_fraction: float = 0.1
    model: Mapping[str, Any] = field(default_factory=dict)
    cells: tuple[tuple[tuple[str, ...], tuple[int, ...]], ...] = ()
    seeds: Mapping[int, int] = field(default_factory=dict)
    tuning: TuningSpec = field(default_factory=TuningSpec)
    gate: Mapping[str, float] = field(default_factory=dict)
    equivalence_margin: float = 0.02
    kappa_samples: int = 4
    profile: str = "full"

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

    def to_dict(self) -> dict[str, Any]:
        """The settings as plain YAML-able data (what :func:`spec_from_dict` reads)."""
        d = dataclasses.asdict(self)
        d["model"] = dict(self.model)
        d["cells"] = [{"presets": list(p), "depths": list(ds)} for p, ds in self.cells]
        d["seeds"] = {int(k): int(v) for k, v in self.seeds.items()}
        d["tuning"] = {k: list(v) if isinstance(v, tuple) else v for k, v in d["tuning"].items()}
        d["gate"] = dict(self.gate)
        return d


def spec_from_dict(d: Mapping[str, Any], profile: str = "full") -> StudySpec:
    """A :class:`StudySpec` from the plain data of an experiment file (unknown keys are refused)."""
    known = {f.name for f in dataclasses.fields(StudySpec)}
    unknown = sorted(set(d) - known)
    if unknown:
        raise ConfigurationError(f"unknown key(s) {unknown} in the experiment; valid keys are {sorted(known)}")
    d = dict(d)
    tuning_known = {f.name for f in dataclasses.fields(TuningSpec)}
    tuning = dict(d.get("tuning") or {})
    bad = sorted(set(tuning) - tuning_known)
    if bad:
        raise ConfigurationError(f"unknown tuning key(s) {bad}; valid keys are {sorted(tuning_known)}")
    tuning = {k: tuple(v) if isinstance(v, list) else v for k, v in tuning.items()}
    try:
        cells = tuple((tuple(c["presets"]), tuple(int(x) for x in c["depths"])) for c in d.get("cells") or ())
    except (KeyError, TypeError) as err:
        raise ConfigurationError(f"each cell needs `presets` and `depths` lists ({err})") from None
    d.update(
        cells=cells,
        tuning=TuningSpec(**tuning),
        seeds={int(k): int(v) for k, v in (d.get("seeds") or {}).items()},
        model=dict(d.get("model") or {}),
        gate={str(k): float(v) for k, v in (d.get("gate") or {}).items()},
        profile=profile,
    )
    return StudySpec(**d)


def _merge(base: dict, override: Mapping[str, Any]) -> dict:
    out = dict(base)
    for k, v in override.items():
        out[k] = _merge(out[k], v) if isinstance(v, Mapping) and isinstance(out.get(k), Mapping) and k == "tuning" else v
    return out


def load_spec(path: str | Path, profile: str | None = None) -> StudySpec:
    """Read an experiment file (YAML, safe loader) and apply ``profile`` (e.g. ``"quick"``) if given."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except OSError as err:
        raise ConfigurationError(f"cannot read the experiment file {path} ({err.strerror or err})") from None
    except yaml.YAMLError as err:
        raise ConfigurationError(f"the experiment file {path} is not valid YAML ({err})") from None
    if not isinstance(raw, dict):
        raise ConfigurationError(f"the experiment file {path} must hold a mapping of settings")
    profiles = raw.pop("profiles", None) or {}
    if profile is not None and profile != "full":
        if profile not in profiles:
            raise ConfigurationError(f"the experiment file {path} has no profile {profile!r}; it has {sorted(profiles)}")
        raw = _merge(raw, profiles[profile])
    return spec_from_dict(raw, profile or "full")
