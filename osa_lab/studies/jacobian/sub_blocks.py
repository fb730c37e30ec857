"""Where a network loses its conditioning: κ of every sub-block's Jacobian, per layer.

End-to-end κ(∂X_L/∂X_0) (Ji et al. 2025, arXiv 2510.00345) says how badly a skipless network is
conditioned, not where. :func:`sub_block_kappas` takes the exact float64 Jacobian of each part at
the point the network's own forward pass reaches it:

* ``embedding``: the patch embedding, input features → tokens X_0 (a linear map, one per input);
* ``attention`` (layer l): h_l = attention_part(X_{l-1}), the whole (N·d) × (N·d) map, tokens mixed;
* ``mlp`` (layer l): X_l = mlp_part(h_l), (N·d) × (N·d), block-diagonal over tokens;
* ``readout``: X_L → logits (norm, mean pool, head).

κ = σ_max / σ_min over the min(rows, columns) singular values of each Jacobian (for the
rectangular embedding and readout, the conditioning of the map on its row or column space).
The OSA sub-block's κ is the paper's object (Zhang & Martens 2026, arXiv 2602.05996: exp(S) is
orthogonal, so the attention Jacobian is well conditioned at the right α); an MLP whose two
matrices are drawn independently is not, whatever attention does.
"""

from __future__ import annotations

import copy
import math

import pandas as pd
import torch

from osa_lab.errors import ConfigurationError
from osa_lab.studies.jacobian.solvers import exact_jacobian

#: the columns of :func:`sub_block_kappas`
SUB_BLOCK_COLUMNS = ["input", "part", "layer", "kappa", "sigma_max", "sigma_min"]

#: the parts, in the order a token meets them
PARTS = ("embedding", "attention", "mlp", "readout")


def _kappa_row(jac: torch.Tensor, index: int, part: str, layer: int) -> dict:
    s = torch.linalg.svdvals(jac.double())
    top, low = float(s[0]), float(s[-1])
    kappa = top / low if low > 0 else math.inf
    return {"input": index, "part": part, "layer": layer, "kappa": kappa, "sigma_max": top, "sigma_min": low}


def sub_block_kappas(model: torch.nn.Module, inputs: torch.Tensor) -> pd.DataFrame:
    """κ of the embedding, each layer's attention and MLP sub-block, and the readout, exact in
    float64, at each of ``inputs`` (a batch of the classifier's inputs): one row per input, part
    and layer (``layer`` 0 for the embedding, L + 1 for the readout). Columns
    :data:`SUB_BLOCK_COLUMNS`. The model is copied to float64 in eval mode; it is not changed.

    Raises ConfigurationError for a model that is not a token classifier
    (:class:`osa_lab.nn.models.ViTClassifier`)."""
    from osa_lab.nn.models import ViTClassifier, functional_mode

    if not isinstance(model, ViTClassifier):
        raise ConfigurationError(
            f"sub_block_kappas takes a transformer classifier (ViTClassifier), got {type(model).__name__}; "
            "the mlp and cnn1d baselines have no attention or MLP sub-blocks"
        )
    m = copy.deepcopy(model).double().eval()
    blocks = list(m.encoder.blocks)
    rows = []
    with functional_mode(m):
        for index, x in enumerate(inputs.double()):
            rows.append(_kappa_row(exact_jacobian(lambda z: m.embed(z[None])[0].reshape(-1), x), index, "embedding", 0))
            with torch.no_grad():
                h = m.embed(x[None])[0]
            for layer, block in enumerate(blocks, start=1):
                if block.attn is not None:
                    rows.append(_kappa_row(exact_jacobian(lambda z, b=block: b.attention_part(z[None])[0], h),
                                           index, "attention", layer))  # fmt: skip
                    with torch.no_grad():
                        h = block.attention_part(h[None])[0]
                if block.mlp is not None:
                    rows.append(_kappa_row(exact_jacobian(lambda z, b=block: b.mlp_part(z[None])[0], h),
                                           index, "mlp", layer))  # fmt: skip
                    with torch.no_grad():
                        h = block.mlp_part(h[None])[0]
            readout = exact_jacobian(lambda z: m.head(m.norm(z.mean(dim=0))), h)
            rows.append(_kappa_row(readout, index, "readout", len(blocks) + 1))
    return pd.DataFrame(rows, columns=SUB_BLOCK_COLUMNS)


def sub_block_medians(model: torch.nn.Module, inputs: torch.Tensor) -> dict[str, float]:
    """Median κ per part over ``inputs`` and layers (:func:`sub_block_kappas`): ``{part: κ}`` for
    the parts the model has; NaN for every part of a model without them (the mlp and cnn1d
    baselines)."""
    return sub_block_record(model, inputs)[0]


def sub_block_record(model: torch.nn.Module, inputs: torch.Tensor) -> tuple[dict[str, float], dict[str, list[float]]]:
    """What a study run records at initialisation and after training, from one :func:`sub_block_kappas`:
    the median κ per part over ``inputs`` and layers (as :func:`sub_block_medians`), and per part the
    median over ``inputs`` at each layer in order (``{part: [κ at its first layer, …]}``; one value for
    the embedding and the readout). A model without sub-blocks gives NaN medians and no layers."""
    from osa_lab.nn.models import ViTClassifier

    if not isinstance(model, ViTClassifier):
        return {part: math.nan for part in PARTS}, {}
    table = sub_block_kappas(model, inputs)
    summary = sub_block_summary(table).set_index("part")["kappa_median"]
    per_layer = table.groupby(["part", "layer"])["kappa"].median()
    layers = {part: [float(v) for v in per_layer.loc[part].sort_index()] for part in PARTS
              if part in per_layer.index.get_level_values(0)}  # fmt: skip
    return {part: float(summary.get(part, math.nan)) for part in PARTS}, layers


def sub_block_summary(table: pd.DataFrame) -> pd.DataFrame:
    """Median κ over inputs and layers per part, and the largest per-layer median: one row per part
    present, in :data:`PARTS` order (columns ``part``, ``kappa_median``, ``kappa_worst_layer``)."""
    per_layer = table.groupby(["part", "layer"])["kappa"].median().reset_index()
    out = per_layer.groupby("part")["kappa"].agg(kappa_median="median", kappa_worst_layer="max").reset_index()
    order = {part: i for i, part in enumerate(PARTS)}
    return out.sort_values("part", key=lambda p: p.map(order)).reset_index(drop=True)
