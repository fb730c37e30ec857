"""Encoders and ViT classifiers built from OSA or SSA blocks, with or without skips and norms.

One configuration dataclass (:class:`ModelConfig`) and two builders:

* :func:`build_model` → :class:`Encoder`, tokens ``(B, N, dim) → (B, N, dim)``;
* :func:`build_classifier` → :class:`ViTClassifier`, images ``(B, C, H, W) → (B, classes)``
  (patch embedding + position embedding, encoder, mean pool, linear head).

A block is ``h = attn(norm₁(x)) [+ x]``, ``y = mlp(norm₂(h)) [+ h]`` (pre-norm, as in ViT;
the bracketed skips only when ``skip=True``; ``norm="none"`` makes the norms identities;
``mlp_ratio=0`` removes the MLP, giving an attention-only stack ``y = h``).

Every ``forward`` accepts ``return_hidden=True`` and then also returns :class:`HiddenStates`:
the input (layer 0), the output of every attention sub-layer and of every block, without hooks.
A non-finite hidden state raises :class:`NonFiniteHiddenStateError` naming the first layer
and site where it appears.

Initialisation schemes (``ModelConfig.init``):

``"default"``
    OSA: the core's derived init (Gaussian W_Q, W_K with variance 1/d, orthogonal W_V, W_O,
    α₀ from :func:`osa_lab.nn.attention.derived_alpha_init`). SSA and MLP: PyTorch's ``nn.Linear`` init
    (the "standard init" of a ViT).
``"orthogonal"``
    As ``"default"`` for attention except that SSA also gets Gaussian W_Q, W_K and orthogonal
    W_V, W_O (matching OSA's value path), and MLP weights are orthogonal with zero biases and a
    variance-preserving gain on the second layer (:meth:`MLP.init_orthogonal`).
``"cutting-skip"`` (SSA only)
    Ji et al. 2025, *Cutting the Skip: Training Residual-Free Transformers* (arXiv 2510.00345),
    docs/design.md §3: per head ``W_Q^h W_K^hᵀ ≈ a Z + b I`` with ``Z_ij ~ N(0, 1/d)`` (rank-r truncated
    SVD, the mimetic construction of Trockman & Kolter 2023), ``W_V W_O = c·(orthogonal)`` (κ = 1),
    a = 2, b = 0.6, c = 3 (their ViT-B values; :data:`CUTTING_SKIP_ABC`). MLP: PyTorch default.
``"value-skipinit"`` (SSA only)
    He et al. 2023, *Deep Transformers without Shortcuts* (arXiv 2302.10322): each head's
    attention matrix becomes ``a I + b softmax(q kᵀ/√r)`` with learnable ``a = 1, b = 0`` at init
    (:class:`ValueSkipInitAttention`), orthogonal W_V, W_O and the orthogonal MLP init above, so
    the network starts as a product of orthogonal maps and nonlinearities.

``ModelConfig.seed`` (optional) makes initialisation reproducible *and depth-consistent*: block
``i`` is initialised from a generator seeded by ``(seed, i)``, so the first ``l`` blocks of a
depth-L model equal a depth-l model built with the same seed (a sweep over depths needs one
forward pass of the deepest model).
"""

from __future__ import annotations

import contextlib
import functools
import math
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field, fields, replace

import numpy as np
import torch
from torch import nn

from osa_lab.errors import (
    ConfigurationError,
    NonFiniteError,
    NonFiniteHiddenStateError,
    OSAInputError,
    heads_do_not_divide,
    unknown_name,
)
from osa_lab.nn.attention import (
    OrthogonalSelfAttention,
    SoftmaxAttention,
    ValueSkipInitAttention,
    check_alpha_init,
    derived_alpha_init,
    init_cutting_skip,
)

ATTENTIONS = ("osa", "ssa", "none")
NORMS = ("none", "layernorm")
INITS = ("default", "orthogonal", "cutting-skip", "value-skipinit")
INPUTS = ("tokens", "patches", "sequence")
#: ``"transformer"``: the ViT-style encoder; ``"mlp"`` and ``"cnn1d"``: the non-attention baselines
#: of Greydanus & Kobak's MNIST-1D table (:class:`MLPClassifier`, :class:`CNN1dClassifier`)
BACKBONES = ("transformer", "mlp", "cnn1d")
#: (a, b, c) of the Cutting-the-Skip initialisation (Ji et al. 2025, ViT-B values; docs/design.md §3).
CUTTING_SKIP_ABC = (2.0, 0.6, 3.0)


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
    osa_method: str = "auto"
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
        _check_name("activation", self.activation, tuple(_ACTIVATIONS))
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


@dataclass
class HiddenStates:
    """Every hidden state of one forward pass.

    ``blocks[0]`` is the encoder input (layer 0), ``blocks[l]`` the output of block ``l``
    (``len(blocks) == depth + 1``); ``attention[l - 1]`` is the output of block ``l``'s
    attention sub-layer, after its skip if any (``len(attention) == depth``).
    """

    blocks: list[torch.Tensor] = field(default_factory=list)
    attention: list[torch.Tensor] = field(default_factory=list)

    @property
    def depth(self) -> int:
        """Number of blocks recorded."""
        return len(self.attention)

    def site(self, name: str) -> list[torch.Tensor]:
        """The list for ``"block"`` or ``"attention"``."""
        if name == "block":
            return self.blocks
        if name == "attention":
            return self.attention
        raise unknown_name("site", name, ["block", "attention"])

    def stacked(self, name: str = "block") -> torch.Tensor:
        """``(layers, batch, N, dim)`` tensor of one site (block site includes layer 0)."""
        return torch.stack(self.site(name))


# --------------------------------------------------------------------------------------
# Blocks and models
# --------------------------------------------------------------------------------------

_ACTIVATIONS = {"gelu": nn.GELU, "relu": nn.ReLU, "tanh": nn.Tanh}


def activation_second_moment(act: nn.Module, points: int = 80) -> float:
    """``E[φ(z)²]`` for ``z ~ N(0, 1)`` by Gauss–Hermite quadrature (GELU: 0.4252, ReLU: 0.5)."""
    return _second_moment(type(act), points)


@functools.cache
def _second_moment(act_type: type, points: int) -> float:
    act = act_type()
    nodes, weights = np.polynomial.hermite_e.hermegauss(points)
    z = torch.as_tensor(nodes, dtype=torch.float64)
    with torch.no_grad():
        values = act(z).double() ** 2
    return float((torch.as_tensor(weights, dtype=torch.float64) * values).sum() / math.sqrt(2 * math.pi))


class MLP(nn.Module):
    """Two-layer MLP ``fc2(act(fc1(x)))`` of hidden width ``round(dim · mlp_ratio)``."""

    def __init__(self, dim: int, hidden: int, activation: str = "gelu", dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden, dtype=dtype)
        self.act = _ACTIVATIONS[activation]()
        self.fc2 = nn.Linear(hidden, dim, dtype=dtype)

    def init_orthogonal(self) -> None:
        """Variance-preserving orthogonal init (zero biases).

        ``fc1`` is (semi-)orthogonal with gain ``√(hidden/dim)``, so the pre-activations of a token
        with i.i.d. N(0, 1) entries are again ≈ N(0, 1); ``fc2`` is (semi-)orthogonal with gain
        ``1/√E[φ(z)²]``, so the output has unit mean-square entries again. A skipless stack then
        neither shrinks nor grows the signal at init.
        """
        hidden, dim = self.fc1.weight.shape
        nn.init.orthogonal_(self.fc1.weight, gain=math.sqrt(hidden / dim))
        nn.init.orthogonal_(self.fc2.weight, gain=1.0 / math.sqrt(activation_second_moment(self.act)))
        nn.init.zeros_(self.fc1.bias)
        nn.init.zeros_(self.fc2.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # noqa: D102
        return self.fc2(self.act(self.fc1(x)))


def _make_attention(config: ModelConfig, dtype: torch.dtype | None = None) -> nn.Module:
    if config.attention == "osa":
        return OrthogonalSelfAttention(
            config.dim,
            config.heads,
            head_dim=config.head_dim,
            alpha_init=config.alpha_init,
            learn_alpha=config.learn_alpha,
            method=config.osa_method,
            tokens=config.tokens,
            dtype=dtype,
        )
    if config.init == "value-skipinit":
        return ValueSkipInitAttention(config.dim, config.heads, head_dim=config.head_dim, dtype=dtype)
    attn = SoftmaxAttention(
        config.dim,
        config.heads,
        head_dim=config.head_dim,
        init="orthogonal" if config.init == "orthogonal" else "default",
        dtype=dtype,
    )
    if config.init == "cutting-skip":
        init_cutting_skip(attn, *CUTTING_SKIP_ABC)
    return attn


class Block(nn.Module):
    """One transformer block: ``h = attn(norm₁ x) [+ x]``, ``y = mlp(norm₂ h) [+ h]`` (pre-norm).

    ``dtype``: the parameters' dtype, passed to every sub-module (default: torch's default).
    """

    def __init__(self, config: ModelConfig, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.skip = config.skip
        self.norm1 = nn.LayerNorm(config.dim, dtype=dtype) if config.norm == "layernorm" else nn.Identity()
        # attention="none" removes the attention sub-layer: h = x (the "attention removed" control)
        self.attn = _make_attention(config, dtype) if config.attention != "none" else None
        self.mlp: MLP | None = None
        self.norm2: nn.Module | None = None
        if config.mlp_ratio > 0:
            self.norm2 = nn.LayerNorm(config.dim, dtype=dtype) if config.norm == "layernorm" else nn.Identity()
            self.mlp = MLP(config.dim, round(config.dim * config.mlp_ratio), config.activation, dtype=dtype)
            if config.init in ("orthogonal", "value-skipinit"):
                self.mlp.init_orthogonal()

    def attention_part(self, x: torch.Tensor) -> torch.Tensor:
        """Output of the attention sub-layer (with its skip); ``x`` itself when attention is removed."""
        if self.attn is None:
            return x
        h = self.attn(self.norm1(x))
        return x + h if self.skip else h

    def mlp_part(self, h: torch.Tensor) -> torch.Tensor:
        """Output of the MLP sub-layer (with its skip); identity when there is no MLP."""
        if self.mlp is None:
            return h
        y = self.mlp(self.norm2(h))
        return h + y if self.skip else y

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # noqa: D102
        return self.mlp_part(self.attention_part(x))


def _block_seed(seed: int, index: int | str) -> int:
    key = [seed, index] if isinstance(index, int) else [seed, 2**31 - 1, *map(ord, index)]
    return int(np.random.SeedSequence(key).generate_state(1)[0])


#: Seeded construction draws from torch's global CPU generator (``nn.Linear``'s own init takes no
#: generator): ``fork_rng`` + ``manual_seed`` around the build of one block. Two seeded builds in
#: different threads (the dashboard's sessions) must not interleave their draws, or a model's
#: weights would depend on the other thread's timing. Held only while a seeded block is built;
#: forward passes and everything else run concurrently.
_SEEDED_BUILD_LOCK = threading.RLock()


@contextlib.contextmanager
def _seeded(seed: int | None, index: int | str) -> Iterator[None]:
    if seed is None:
        yield
        return
    with _SEEDED_BUILD_LOCK, torch.random.fork_rng(devices=[]):
        torch.manual_seed(_block_seed(seed, index))
        yield


def check_hidden_state_finite(x: torch.Tensor, layer: int, site: str) -> None:
    """Raise :class:`~osa_lab.errors.NonFiniteHiddenStateError` naming ``layer`` and ``site`` if ``x`` has NaN/Inf."""
    # one reduction (any NaN/Inf entry makes the sum non-finite); the elementwise scan only then,
    # since a sum of finite entries can overflow
    if not bool(torch.isfinite(x.sum())) and not bool(torch.isfinite(x).all()):
        n_nan, n_inf = int(torch.isnan(x).sum()), int(torch.isinf(x).sum())
        where = "the input (layer 0)" if layer == 0 else f"layer {layer} ({site} output)"
        raise NonFiniteHiddenStateError(
            f"hidden state of {where} contains {n_nan} NaN and {n_inf} Inf entries (shape {tuple(x.shape)}); "
            f"this is the first layer where they appear. Lower the depth or the init scale (alpha), or use "
            "float64.",
            layer,
            site,
        )


class Encoder(nn.Module):
    """A stack of :class:`Block` s: ``(B, N, dim) → (B, N, dim)``.

    ``forward(x, return_hidden=True)`` also returns :class:`HiddenStates`. With
    ``check_finite=True`` (default) a NaN/Inf hidden state raises
    :class:`NonFiniteHiddenStateError` naming the layer where it first appears. ``dtype`` is
    the parameters' dtype (default: torch's default).
    """

    def __init__(self, config: ModelConfig, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.config = config
        self.check_finite = True
        blocks = []
        for i in range(config.depth):
            with _seeded(config.seed, i):
                blocks.append(Block(config, dtype=dtype))
        self.blocks = nn.ModuleList(blocks)

    @property
    def depth(self) -> int:
        """Number of blocks."""
        return len(self.blocks)

    def forward(
        self, x: torch.Tensor, return_hidden: bool = False, *, layers: int | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, HiddenStates]:
        """Run the first ``layers`` blocks (all by default) on tokens ``x`` of shape (B, N, dim)."""
        if not isinstance(x, torch.Tensor) or x.dim() != 3 or x.shape[-1] != self.config.dim:
            shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise OSAInputError(
                f"`x` has shape {shape}; the encoder needs (batch, tokens, dim={self.config.dim})"
            )
        n_layers = self.depth if layers is None else layers
        if not 0 <= n_layers <= self.depth:
            raise ConfigurationError(f"`layers`={layers} must lie in [0, depth={self.depth}]")
        hidden = HiddenStates() if return_hidden else None
        if self.check_finite:
            check_hidden_state_finite(x, 0, "block")
        if hidden is not None:
            hidden.blocks.append(x)
        for i, block in enumerate(self.blocks[:n_layers], start=1):
            try:
                h = block.attention_part(x)
            except NonFiniteError as exc:
                if not self.check_finite:
                    raise
                # The layer's input was finite: its own weights produced the NaN/Inf.
                raise NonFiniteHiddenStateError(
                    f"layer {i} (attention) produced NaN/Inf from a finite input; this is the first layer "
                    f"where they appear (check its weights, e.g. alpha or W_V): {exc}",
                    i,
                    "attention",
                ) from exc
            if self.check_finite:
                check_hidden_state_finite(h, i, "attention")
            x = block.mlp_part(h)
            if self.check_finite and block.mlp is not None:
                check_hidden_state_finite(x, i, "block")
            if hidden is not None:
                hidden.attention.append(h)
                hidden.blocks.append(x)
        return (x, hidden) if hidden is not None else x


class ViTClassifier(nn.Module):
    """Patch embedding + position embedding → :class:`Encoder` → mean pool → [LayerNorm] → linear head.

    Images ``(B, channels, image_size, image_size)`` → logits ``(B, num_classes)``; the final
    LayerNorm is present only with ``norm="layernorm"``.
    """

    def __init__(self, config: ModelConfig, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.config = config
        with _seeded(config.seed, "embed"):
            conv = nn.Conv1d if config.input == "sequence" else nn.Conv2d
            self.patch_embed = conv(config.channels, config.dim, config.patch_size, stride=config.patch_size,
                                    dtype=dtype)
            self.pos_embed = nn.Parameter(torch.randn(1, config.num_patches, config.dim, dtype=dtype) * 0.02)
        self.encoder = Encoder(config, dtype=dtype)
        with _seeded(config.seed, "head"):
            self.norm = nn.LayerNorm(config.dim, dtype=dtype) if config.norm == "layernorm" else nn.Identity()
            self.head = nn.Linear(config.dim, config.num_classes, dtype=dtype)

    def embed(self, images: torch.Tensor) -> torch.Tensor:
        """Patch tokens (B, num_patches, dim) with position embedding added."""
        c = self.config
        if c.input == "sequence":
            _check_sequence(images, c)
            return self.patch_embed(images).mT + self.pos_embed
        if (
            not isinstance(images, torch.Tensor)
            or images.dim() != 4
            or tuple(images.shape[1:])
            != (
                c.channels,
                c.image_size,
                c.image_size,
            )
        ):
            shape = tuple(images.shape) if isinstance(images, torch.Tensor) else type(images).__name__
            raise OSAInputError(
                f"images have shape {shape}; the classifier needs (batch, {c.channels}, {c.image_size}, "
                f"{c.image_size}) (set channels/image_size in ModelConfig)"
            )
        return self.patch_embed(images).flatten(2).mT + self.pos_embed

    def forward(
        self, images: torch.Tensor, return_hidden: bool = False
    ) -> torch.Tensor | tuple[torch.Tensor, HiddenStates]:
        """Logits (B, num_classes), and the encoder's :class:`HiddenStates` if ``return_hidden``."""
        out = self.encoder(self.embed(images), return_hidden=return_hidden)
        tokens, hidden = out if return_hidden else (out, None)
        logits = self.head(self.norm(tokens.mean(dim=1)))
        return (logits, hidden) if return_hidden else logits


def _check_sequence(x: torch.Tensor, c: ModelConfig) -> None:
    if not isinstance(x, torch.Tensor) or x.dim() != 3 or tuple(x.shape[1:]) != (c.channels, c.image_size):
        shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise OSAInputError(
            f"sequences have shape {shape}; the classifier needs (batch, {c.channels}, {c.image_size}) "
            "(set channels/image_size in ModelConfig)"
        )


def _check_input(x: torch.Tensor, c: ModelConfig) -> None:
    if c.input == "sequence":
        _check_sequence(x, c)
        return
    want = (c.channels, c.image_size, c.image_size)
    if not isinstance(x, torch.Tensor) or x.dim() != 4 or tuple(x.shape[1:]) != want:
        shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise OSAInputError(f"images have shape {shape}; the classifier needs (batch, {', '.join(map(str, want))})")


class MLPClassifier(nn.Module):
    """MLP baseline: flattened input → ``depth`` hidden layers of width ``dim`` (``activation``) → logits.

    The MLP row of Greydanus & Kobak's MNIST-1D table (two hidden layers of 100 ReLU units, 68 %
    on the standard split) with the ``mlp`` preset's defaults. No token mixing, no position
    structure beyond what the first layer learns. ``forward(x, return_hidden=True)`` returns an
    empty :class:`HiddenStates` (there are no token matrices).
    """

    def __init__(self, config: ModelConfig, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.config = config
        n_in = config.channels * config.image_size * (1 if config.input == "sequence" else config.image_size)
        layers: list[nn.Module] = []
        width = n_in
        with _seeded(config.seed, "mlp"):
            for _ in range(config.depth):
                layers += [nn.Linear(width, config.dim, dtype=dtype), _ACTIVATIONS[config.activation]()]
                width = config.dim
            layers.append(nn.Linear(width, config.num_classes, dtype=dtype))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor, return_hidden: bool = False):  # noqa: D102
        _check_input(x, self.config)
        logits = self.net(x.flatten(1))
        return (logits, HiddenStates()) if return_hidden else logits


class CNN1dClassifier(nn.Module):
    """Small 1-D CNN baseline for MNIST-1D: three convolutions (kernel 5, 3, 3; stride 2; ``dim`` channels).

    Follows the CNN of Greydanus & Kobak's MNIST-1D table (three stride-2 convolutions of 25
    channels with ReLU, then a linear layer; 94 % on the standard split) with the ``cnn1d``
    preset's defaults (``dim=25``, ReLU). Sequences only (``input="sequence"``).
    """

    def __init__(self, config: ModelConfig, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        if config.input != "sequence":
            raise ConfigurationError(
                "backbone 'cnn1d' needs 1-D sequence input (input='sequence', e.g. --data mnist1d); use "
                "backbone 'mlp' or a transformer preset for images"
            )
        self.config = config
        act = _ACTIVATIONS[config.activation]
        c = config.dim
        with _seeded(config.seed, "cnn"):
            self.features = nn.Sequential(
                nn.Conv1d(config.channels, c, 5, stride=2, padding=1, dtype=dtype), act(),
                nn.Conv1d(c, c, 3, stride=2, padding=1, dtype=dtype), act(),
                nn.Conv1d(c, c, 3, stride=2, padding=1, dtype=dtype), act(),
            )  # fmt: skip
            with torch.no_grad():
                n_flat = self.features(torch.zeros(1, config.channels, config.image_size, dtype=dtype)).numel()
            self.head = nn.Linear(n_flat, config.num_classes, dtype=dtype)

    def forward(self, x: torch.Tensor, return_hidden: bool = False):  # noqa: D102
        _check_input(x, self.config)
        logits = self.head(self.features(x).flatten(1))
        return (logits, HiddenStates()) if return_hidden else logits


def build_model(
    config: ModelConfig, *, dtype: torch.dtype | None = None, device: torch.device | str | None = None
) -> Encoder:
    """Token encoder ``(B, N, dim) → (B, N, dim)`` for ``config``.

    ``dtype`` builds (and initialises) the parameters directly in that dtype, so e.g. orthogonal
    weights are orthogonal to float64 precision (a float32 init cast to float64 is not). The
    dtype is passed to every module's constructor; torch's process-wide default dtype is never
    touched, so builds in different threads run concurrently and independently.
    """
    if not isinstance(config, ModelConfig):
        raise ConfigurationError(f"`config` must be a ModelConfig, got {type(config).__name__}")
    if config.backbone != "transformer":
        raise ConfigurationError(
            f"backbone {config.backbone!r} is a classifier baseline without a token encoder; build it with "
            "build_classifier"
        )
    model = Encoder(config, dtype=dtype)
    return model.to(device) if device is not None else model


def build_classifier(
    config: ModelConfig, *, dtype: torch.dtype | None = None, device: torch.device | str | None = None
) -> ViTClassifier:
    """Classifier ``(B, C, H, W)`` or ``(B, C, L)`` → ``(B, num_classes)`` for ``config.backbone``.

    ``"transformer"``: :class:`ViTClassifier` (a ``input="tokens"`` config is switched to
    patches); ``"mlp"``: :class:`MLPClassifier`; ``"cnn1d"``: :class:`CNN1dClassifier`.
    """
    if not isinstance(config, ModelConfig):
        raise ConfigurationError(f"`config` must be a ModelConfig, got {type(config).__name__}")
    if config.input == "tokens":
        config = replace(config, input="patches")
    builder = {"transformer": ViTClassifier, "mlp": MLPClassifier, "cnn1d": CNN1dClassifier}[config.backbone]
    model = builder(config, dtype=dtype)
    return model.to(device) if device is not None else model


def osa_layers(model: nn.Module) -> list[OrthogonalSelfAttention]:
    """Every OSA layer in ``model``."""
    return [m for m in model.modules() if isinstance(m, OrthogonalSelfAttention)]


@contextlib.contextmanager
def functional_mode(model: nn.Module, osa_method: str = "qr") -> Iterator[nn.Module]:
    """Make ``model`` usable under ``torch.func`` transforms (jacrev, jvp, vmap) inside the block.

    OSA layers switch to ``osa_method`` (``"qr"`` or ``"dense"``: pure autograd, no custom
    ``autograd.Function``, no data-dependent branches; same function as ``"lowrank"`` to rounding),
    SSA layers to the explicit softmax, and the finiteness checks are turned off. Restored on exit.
    """
    saved_methods = [(m, m.method) for m in osa_layers(model)]
    softmax = [m for m in model.modules() if isinstance(m, SoftmaxAttention)]
    encoders = [m for m in model.modules() if isinstance(m, Encoder)]
    saved_checks = [(e, e.check_finite) for e in encoders]
    try:
        for m, _ in saved_methods:
            m.method = osa_method
        for m in softmax:
            m.explicit_softmax = True
        for e in encoders:
            e.check_finite = False
        yield model
    finally:
        for m, method in saved_methods:
            m.method = method
        for m in softmax:
            m.explicit_softmax = False
        for e, check in saved_checks:
            e.check_finite = check


# --------------------------------------------------------------------------------------
# Token-mixing diagnostics (measure mixing, not α)
# --------------------------------------------------------------------------------------


def skew_generator(q: torch.Tensor, k: torch.Tensor, alpha: torch.Tensor | float) -> torch.Tensor:
    """OSA's generator ``S = α/√r (q kᵀ − k qᵀ)`` (Zhang & Martens 2026) in float64, shape ``(…, N, N)``.

    ``alpha`` broadcasts against the leading dimensions of ``q`` (e.g. one value per head).
    """
    q64, k64 = q.double(), k.double()
    a = torch.as_tensor(alpha, dtype=torch.float64, device=q.device)
    a = a.reshape(*a.shape, 1, 1)  # α's dimensions align with q's leading (batch) dimensions
    return a / math.sqrt(q.shape[-1]) * (q64 @ k64.mT - k64 @ q64.mT)


def mixing_stats(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, alpha: torch.Tensor | float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(‖S‖₂, ‖exp(S) V − V‖_F / ‖V‖_F)`` for every leading index of ``q``, ``k``, ``v`` (float64).

    ``‖S‖₂`` is the spectral norm of the generator (the largest rotation angle of ``exp(S)``, in
    radians); the second number is the **mixing ratio**: how far OSA moves the values away from
    the identity map ``V ↦ V`` (0: no mixing). Both are computed exactly with
    ``torch.linalg.matrix_exp`` (meant for diagnostics at N ≲ 100). Example: N = 2, r = 1,
    q = (1, 0), k = (0, 1), v = (1, 0) gives ``S = α [[0, 1], [−1, 0]]``, ‖S‖₂ = |α| and the
    ratio ``‖(cos α − 1, −sin α)‖ = 2|sin(α/2)|``.
    """
    s = skew_generator(q, k, alpha)
    v64 = v.double()
    s_norm = torch.linalg.matrix_norm(s, ord=2)
    moved = torch.linalg.matrix_exp(s) @ v64 - v64
    den = torch.linalg.matrix_norm(v64)
    ratio = torch.linalg.matrix_norm(moved) / torch.where(den > 0, den, torch.ones_like(den))
    return s_norm, ratio


def mixing_table(model: nn.Module, x: torch.Tensor) -> list[tuple[int, int, str, float]]:
    """``(osa_layer, head, metric, value)`` rows: ``s_norm`` (‖S‖₂) and ``mixing_ratio`` per OSA layer and head.

    Computed on the inputs ``x`` (held-out images or sequences, or tokens for an
    :class:`Encoder`) from each OSA layer's actual input (one forward pass with hidden states),
    summarised by the **median** over the batch. ``osa_layer`` is the index of the OSA layer in
    block order (0-based), as in the ``alpha`` rows of the training metrics. Empty for models
    without OSA layers.
    """
    encoder = model.encoder if isinstance(model, ViTClassifier) else model
    if not isinstance(encoder, Encoder) or not osa_layers(encoder):
        return []
    was_training = model.training
    model.eval()
    rows: list[tuple[int, int, str, float]] = []
    try:
        with torch.no_grad():
            _, hidden = model(x, return_hidden=True)
            index = 0
            for i, block in enumerate(encoder.blocks):
                if not isinstance(block.attn, OrthogonalSelfAttention):
                    continue
                q, k, v = block.attn._split(block.norm1(hidden.blocks[i]))
                s_norm, ratio = mixing_stats(q, k, v, block.attn.alpha.reshape(-1))
                for h in range(block.attn.heads):
                    rows.append((index, h, "s_norm", float(s_norm[:, h].median())))
                    rows.append((index, h, "mixing_ratio", float(ratio[:, h].median())))
                index += 1
    finally:
        model.train(was_training)
    return rows


@contextlib.contextmanager
def alpha_zeroed(model: nn.Module) -> Iterator[nn.Module]:
    """Inside the block every OSA layer's α is 0 (exp(S) = I: no token mixing); restored on exit.

    The "α := 0 after training" ablation: evaluating a trained skipless OSA network
    this way measures how much its accuracy depends on the mixing it learned.
    """
    layers = osa_layers(model)
    saved = [m.alpha.detach().clone() for m in layers]
    try:
        with torch.no_grad():
            for m in layers:
                m.alpha.zero_()
        yield model
    finally:
        with torch.no_grad():
            for m, a in zip(layers, saved, strict=True):
                m.alpha.copy_(a)
