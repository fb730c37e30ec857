"""Which part of an OSA sub-block is ill-conditioned: W_V and W_O, or the input-dependent mixing.

An OSA layer maps tokens X (N × d) to ``concat_h(A_h X W_V^h) W_O`` with ``A_h = exp(S_h(X))``
orthogonal (Zhang & Martens 2026, arXiv 2602.05996, the OSA definition). Its Jacobian has two
terms: the map with the mixing held fixed, ``Z ↦ concat_h(A_h Z W_V^h) W_O`` at the point's A_h,
and the change of A_h with X (through W_Q, W_K and α). With orthogonal W_V and W_O the fixed-mixing
map is orthogonal for any number of heads (W_V, each head's orthogonal A_h on the left, then W_O:
every step keeps the Frobenius norm), so κ = 1 at the layer's initialisation (docs/design.md §3);
in general its κ is at most κ(W_V)·κ(W_O), and with one head it is exactly κ(W_V W_O), since
A ⊗ M has the singular values of M.

:func:`osa_mixing_split` puts side by side, for every OSA layer of a classifier, at the point its
own forward pass reaches: κ of the layer's whole Jacobian, κ of the fixed-mixing map, and κ of the
weights W_V and W_O, exact in float64. Where the fixed-mixing κ is near the whole one, W_V and W_O
explain the layer's conditioning; where it is far below, the input-dependent mixing adds the rest
(κ of a sum does not split into shares, so this says where the conditioning is lost, not how much
each term contributes).
"""

from __future__ import annotations

import copy
import math

import pandas as pd
import torch

from osa_lab.errors import ConfigurationError
from osa_lab.studies.jacobian.solvers import exact_jacobian

#: the columns of :func:`osa_mixing_split`
MIXING_SPLIT_COLUMNS = ["input", "layer", "kappa_attention", "kappa_fixed_mixing", "kappa_value", "kappa_output"]

#: the κ columns of :func:`osa_mixing_split`, summarised by :func:`mixing_split_summary`
MIXING_SPLIT_KAPPAS = MIXING_SPLIT_COLUMNS[2:]


def _kappa(matrix: torch.Tensor) -> float:
    s = torch.linalg.svdvals(matrix.double())
    return float(s[0] / s[-1]) if float(s[-1]) > 0 else math.inf


def _mixing(attn, x: torch.Tensor) -> torch.Tensor:
    """``A_h = exp(S_h(x))`` of every head at tokens ``x`` (N × d): ``(heads, N, N)``, exp(S) applied to I."""
    from osa_lab.ops.functional import osa

    n = x.shape[0]
    q = attn.to_q(x).view(n, attn.heads, attn.head_dim).transpose(0, 1)
    k = attn.to_k(x).view(n, attn.heads, attn.head_dim).transpose(0, 1)
    eye = torch.eye(n, dtype=x.dtype, device=x.device).expand(attn.heads, n, n)
    return osa(q, k, eye, attn.alpha.reshape(-1), method="dense")


def _fixed_mixing_map(attn, mixing: torch.Tensor):
    """``Z ↦ concat_h(A_h Z W_V^h) W_O`` with ``A_h`` held at ``mixing``."""

    def apply(z: torch.Tensor) -> torch.Tensor:
        n = z.shape[0]
        v = attn.to_v(z).view(n, attn.heads, attn.value_dim).transpose(0, 1)
        return attn.to_out((mixing @ v).transpose(0, 1).reshape(n, attn.dim))

    return apply


def osa_mixing_split(model: torch.nn.Module, inputs: torch.Tensor, *, whole: bool = True) -> pd.DataFrame:
    """For each OSA layer of ``model`` at each of ``inputs`` (a batch of the classifier's inputs): κ of the
    layer's whole Jacobian (``kappa_attention``, the attention module alone, after the block's norm
    where it has one), κ of its fixed-mixing map (``kappa_fixed_mixing``), and κ of W_V and W_O
    (``kappa_value``, ``kappa_output``). One row per input and layer (layers numbered from 1; blocks
    without OSA are skipped); columns :data:`MIXING_SPLIT_COLUMNS`. Exact float64 Jacobians of a copy
    of the model in eval mode; the model is not changed. ``whole=False`` skips the whole layer's
    Jacobian (``kappa_attention`` NaN), for a caller that has it already.

    Raises ConfigurationError for a model that is not a token classifier or has no OSA layer.
    """
    from osa_lab.nn.attention import OrthogonalSelfAttention
    from osa_lab.nn.models import ViTClassifier, functional_mode

    if not isinstance(model, ViTClassifier):
        raise ConfigurationError(f"osa_mixing_split takes a transformer classifier (ViTClassifier), got "
                                 f"{type(model).__name__}")  # fmt: skip
    m = copy.deepcopy(model).double().eval()
    blocks = list(m.encoder.blocks)
    if not any(isinstance(b.attn, OrthogonalSelfAttention) for b in blocks):
        raise ConfigurationError("osa_mixing_split needs a model with OSA layers; this one has none "
                                 "(build an OSA preset, e.g. skipless-osa)")  # fmt: skip
    rows = []
    with functional_mode(m, osa_method="dense"), torch.no_grad():
        for index, x in enumerate(inputs.double()):
            h = m.embed(x[None])[0]
            for layer, block in enumerate(blocks, start=1):
                attn = block.attn
                if isinstance(attn, OrthogonalSelfAttention):
                    z = block.norm1(h)
                    with torch.enable_grad():
                        layer_kappa = _kappa(exact_jacobian(lambda t, a=attn: a(t[None])[0], z)) if whole else math.nan
                        fixed = exact_jacobian(_fixed_mixing_map(attn, _mixing(attn, z)), z)
                    rows.append({"input": index, "layer": layer, "kappa_attention": layer_kappa,
                                 "kappa_fixed_mixing": _kappa(fixed), "kappa_value": _kappa(attn.to_v.weight),
                                 "kappa_output": _kappa(attn.to_out.weight)})  # fmt: skip
                h = block(h[None])[0]
    return pd.DataFrame(rows, columns=MIXING_SPLIT_COLUMNS)


def mixing_split_summary(table: pd.DataFrame) -> dict[str, float]:
    """The κ columns of an :func:`osa_mixing_split` table as a run records its sub-block κ
    (:func:`~osa_lab.studies.jacobian.sub_blocks.sub_block_record`): the median over inputs at each
    layer, then the median over layers. ``{column: κ}``."""
    per_layer = table.groupby("layer")[MIXING_SPLIT_KAPPAS].median()
    return {column: float(per_layer[column].median()) for column in MIXING_SPLIT_KAPPAS}


#: what a study run records of :func:`osa_mixing_split` (:func:`osa_split_record`): name → its column
SPLIT_RECORD = {"fixed_mixing": "kappa_fixed_mixing", "value": "kappa_value", "output": "kappa_output"}


def osa_split_record(model: torch.nn.Module, inputs: torch.Tensor) -> dict[str, float]:
    """What a study run records at initialisation and after training: κ of the OSA layers' fixed-mixing
    map, of W_V and of W_O, summarised by :func:`mixing_split_summary` (``{"fixed_mixing", "value",
    "output": κ}``); empty for a model without OSA layers. The whole layer's κ is not recorded: in a
    block without skip or norm (every OSA preset) it is the ``attention`` sub-block's
    (:mod:`~osa_lab.studies.jacobian.sub_blocks`); with a skip or a norm the two differ."""
    from osa_lab.nn.attention import OrthogonalSelfAttention
    from osa_lab.nn.models import ViTClassifier

    if not isinstance(model, ViTClassifier) or not any(isinstance(b.attn, OrthogonalSelfAttention)
                                                       for b in model.encoder.blocks):  # fmt: skip
        return {}
    # the whole layer's Jacobian is the attention sub-block's, which the run records already
    summary = mixing_split_summary(osa_mixing_split(model, inputs, whole=False))
    return {name: summary[column] for name, column in SPLIT_RECORD.items()}
