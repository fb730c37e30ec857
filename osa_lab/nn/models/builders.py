"""Encoders and classifiers built from :class:`~osa_lab.nn.models.blocks.Block` s, and their builders.

:func:`build_model` → :class:`Encoder` (tokens ``(B, N, dim) → (B, N, dim)``);
:func:`build_classifier` → :class:`ViTClassifier` (patch and position embedding, encoder, mean
pool, linear head), or the MNIST-1D baselines :class:`MLPClassifier` and :class:`CNN1dClassifier`.
A seeded configuration builds each part from its own local generator
(:mod:`osa_lab.nn.models.seeding`); :func:`functional_mode` readies a model for ``torch.func``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import replace
from typing import Any, cast

import torch
from torch import nn

from osa_lab.errors import ConfigurationError, NonFiniteError, NonFiniteHiddenStateError, OSAInputError
from osa_lab.nn.attention import OrthogonalSelfAttention, SoftmaxAttention
from osa_lab.nn.models.blocks import Block, HiddenStates, check_hidden_state_finite
from osa_lab.nn.models.config import ACTIVATIONS, ModelConfig
from osa_lab.nn.models.seeding import part_generator, random_draws_from
from osa_lab.ops.functional import OSAMethod


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
            with random_draws_from(part_generator(config.seed, i)):
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
        blocks = cast("list[Block]", list(self.blocks[:n_layers]))
        for i, block in enumerate(blocks, start=1):
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
        with random_draws_from(part_generator(config.seed, "embed")):
            conv = nn.Conv1d if config.input == "sequence" else nn.Conv2d
            self.patch_embed = conv(
                config.channels, config.dim, config.patch_size, stride=config.patch_size, dtype=dtype
            )
            self.pos_embed = nn.Parameter(torch.randn(1, config.num_patches, config.dim, dtype=dtype) * 0.02)
        self.encoder = Encoder(config, dtype=dtype)
        with random_draws_from(part_generator(config.seed, "head")):
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
    ) -> Any:  # logits, or (logits, HiddenStates) with return_hidden
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
        raise OSAInputError(
            f"images have shape {shape}; the classifier needs (batch, {', '.join(map(str, want))})"
        )


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
        with random_draws_from(part_generator(config.seed, "mlp")):
            for _ in range(config.depth):
                layers += [nn.Linear(width, config.dim, dtype=dtype), ACTIVATIONS[config.activation]()]
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
        act = ACTIVATIONS[config.activation]
        c = config.dim
        with random_draws_from(part_generator(config.seed, "cnn")):
            self.features = nn.Sequential(
                nn.Conv1d(config.channels, c, 5, stride=2, padding=1, dtype=dtype), act(),
                nn.Conv1d(c, c, 3, stride=2, padding=1, dtype=dtype), act(),
                nn.Conv1d(c, c, 3, stride=2, padding=1, dtype=dtype), act(),
            )  # fmt: skip
            with torch.no_grad():
                n_flat = self.features(
                    torch.zeros(1, config.channels, config.image_size, dtype=dtype)
                ).numel()
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
) -> nn.Module:
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
def functional_mode(model: nn.Module, osa_method: OSAMethod = "qr") -> Iterator[nn.Module]:
    """Make ``model`` usable under ``torch.func`` transforms (jacrev, jvp, vmap) inside the block.

    OSA layers switch to ``osa_method`` (``"qr"`` or ``"dense"``: pure autograd, no custom
    ``autograd.Function``, no data-dependent branches; same function as ``"lowrank"`` to rounding),
    SSA layers to the explicit softmax. Restored on exit. The finiteness checks stay on: under
    ``vmap`` they decide on the whole vmapped batch (:func:`osa_lab.ops.guards.whole_batch`) and
    raise the errors a loop over the batch would raise.
    """
    saved_methods = [(m, m.method) for m in osa_layers(model)]
    softmax = [m for m in model.modules() if isinstance(m, SoftmaxAttention)]
    try:
        for layer, _ in saved_methods:
            layer.method = osa_method
        for ssa in softmax:
            ssa.explicit_softmax = True
        yield model
    finally:
        for layer, method in saved_methods:
            layer.method = method
        for ssa in softmax:
            ssa.explicit_softmax = False
