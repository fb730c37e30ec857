"""Model configuration: :class:`ModelConfig`, the architecture and initialisation of an encoder or classifier.

Validated on construction (impossible combinations raise
:class:`~osa_lab.errors.ConfigurationError`, unknown names
:class:`~osa_lab.errors.UnknownNameError` listing the valid ones); the names it accepts are the
tuples below. The schemes themselves are described in :mod:`osa_lab.nn.models`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from torch import nn

from osa_lab.errors import ConfigurationError, heads_do_not_divide, unknown_name
from osa_lab.nn.attention import check_alpha_init, derived_alpha_init
from osa_lab.nn.shaping import TATLeakyReLU
from osa_lab.ops.functional import OSAMethod

ATTENTIONS = ("osa", "ssa", "none")
NORMS = ("none", "layernorm")
INITS = ("default", "orthogonal", "cutting-skip", "value-skipinit")
INPUTS = ("tokens", "patches", "sequence")
#: ``"transformer"``: the ViT-style encoder; ``"mlp"`` and ``"cnn1d"``: the non-attention baselines
#: of Greydanus & Kobak's MNIST-1D table (:class:`MLPClassifier`, :class:`CNN1dClassifier`)
BACKBONES = ("transformer", "mlp", "cnn1d")
#: (a, b, c) of the Cutting-the-Skip initialisation (Ji et al. 2025, ViT-B values; docs/design.md §3).
CUTTING_SKIP_ABC = (2.0, 0.6, 3.0)


#: The MLP activations by name (``ModelConfig.activation``).
#: ``"tat-leaky-relu"``: TAT's normalised leaky ReLU, its slope set from the depth
#: (:func:`osa_lab.nn.shaping.shaped_slope`); with init ``"orthogonal"`` or ``"value-skipinit"`` it
#: comes with TAT's tied orthogonal MLP init (:meth:`osa_lab.nn.models.MLP.init_tied_orthogonal`).
ACTIVATIONS = {"gelu": nn.GELU, "relu": nn.ReLU, "tanh": nn.Tanh, "tat-leaky-relu": TATLeakyReLU}


def _check_name(kind: str, value: object, valid: tuple[str, ...]) -> None:
    if value not in valid:
        raise unknown_name(kind, value, list(valid))


def _positive_int(name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigurationError(f"`{name}` must be a positive int, got {value!r}")


@dataclass(frozen=True)
class ModelConfig:
    """Architecture and initialisation of an encoder / ViT (see module docstring).

    Validated on construction: impossible combinations raise :class:`ConfigurationError`
    and unknown names raise :class:`~osa_lab.errors.UnknownNameError` listing the valid ones.
    With ``input="patches"``, ``tokens`` is set to the number of patches ``(image_size/patch_size)²``.
    """

    depth: int = 6
    dim: int = 64
    heads: int = 4
    head_dim: int | None = None
    mlp_ratio: float = 4.0
    attention: str = "osa"
    skip: bool = False
    norm: str = "none"
    init: str = "default"
    alpha_init: float | None = None
    tokens: int = 64
    input: str = "tokens"
    image_size: int = 8
    patch_size: int = 2
    channels: int = 1
    num_classes: int = 10
    learn_alpha: bool = True
    osa_method: OSAMethod = "auto"
    activation: str = "gelu"
    seed: int | None = None
    backbone: str = "transformer"

    def __post_init__(self) -> None:
        for name in (
            "depth",
            "dim",
            "heads",
            "tokens",
            "image_size",
            "patch_size",
            "channels",
            "num_classes",
        ):
            _positive_int(name, getattr(self, name))
        if self.head_dim is not None:
            _positive_int("head_dim", self.head_dim)
        if self.dim % self.heads != 0:
            raise heads_do_not_divide(self.dim, self.heads)
        if (
            not isinstance(self.mlp_ratio, (int, float))
            or isinstance(self.mlp_ratio, bool)
            or not math.isfinite(self.mlp_ratio)  # NaN passed `< 0` and silently built no MLP
            or self.mlp_ratio < 0
        ):
            raise ConfigurationError(
                f"`mlp_ratio` must be a finite number ≥ 0 (0 = no MLP), got {self.mlp_ratio!r}"
            )
        if self.mlp_ratio > 0 and round(self.dim * self.mlp_ratio) < 1:
            raise ConfigurationError(
                f"`mlp_ratio`={self.mlp_ratio} gives an MLP of width 0 at dim={self.dim}"
            )
        _check_name("attention", self.attention, ATTENTIONS)
        _check_name("norm", self.norm, NORMS)
        _check_name("init", self.init, INITS)
        _check_name("input", self.input, INPUTS)
        _check_name("backbone", self.backbone, BACKBONES)
        _check_name("activation", self.activation, tuple(ACTIVATIONS))
        if not isinstance(self.skip, bool):
            raise ConfigurationError(f"`skip` must be True or False, got {self.skip!r}")
        if self.attention == "osa" and self.init in ("cutting-skip", "value-skipinit"):
            raise ConfigurationError(
                f"`init`={self.init!r} is an SSA initialisation; with attention='osa' use init='default' "
                "or 'orthogonal' (or set attention='ssa')"
            )
        if self.alpha_init is not None:
            if self.attention != "osa":
                raise ConfigurationError(
                    f"`alpha_init`={self.alpha_init!r} only applies to attention='osa' (got "
                    f"attention={self.attention!r}); leave it None"
                )
            check_alpha_init(self.alpha_init)
        if self.seed is not None and (
            not isinstance(self.seed, int) or isinstance(self.seed, bool) or self.seed < 0
        ):
            raise ConfigurationError(f"`seed` must be a non-negative int or None, got {self.seed!r}")
        if self.input in ("patches", "sequence"):
            if self.image_size % self.patch_size != 0:
                raise ConfigurationError(
                    f"`patch_size`={self.patch_size} does not divide `image_size`={self.image_size}; choose a "
                    f"patch size from {[p for p in range(1, self.image_size + 1) if self.image_size % p == 0]}"
                )
            object.__setattr__(self, "tokens", self.num_patches)

    @property
    def num_patches(self) -> int:
        """Number of patch tokens: ``(image_size / patch_size)²`` for images, ``image_size / patch_size``
        for 1-D sequences (``input="sequence"``, where ``image_size`` is the sequence length)."""
        if self.input == "sequence":
            return self.image_size // self.patch_size
        return (self.image_size // self.patch_size) ** 2

    @property
    def resolved_head_dim(self) -> int:
        """Query/key width r per head (``head_dim`` or ``dim // heads``)."""
        return self.head_dim if self.head_dim is not None else self.dim // self.heads

    @property
    def resolved_alpha(self) -> float:
        """The OSA α used at initialisation (NaN for SSA)."""
        if self.attention != "osa":
            return math.nan
        if self.alpha_init is not None:
            return float(self.alpha_init)
        return derived_alpha_init(self.tokens, self.dim, self.resolved_head_dim)

    @classmethod
    def field_names(cls) -> list[str]:
        """Names of the configuration fields (valid ``get_preset`` overrides)."""
        return [f.name for f in fields(cls)]
