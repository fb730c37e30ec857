"""osa_lab.integrations.timm: OSA in timm's Vision Transformers.

Random initialisation only: no weights are downloaded. ViT-Tiny runs at small image sizes where
the claim allows (forward/backward, state dicts, compile) and at its full 224 px (N = 197) for
the rank-collapse comparison at depth 12.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from osa_lab.errors import CausalMaskError, ConfigurationError, UnknownNameError
from osa_lab.nn.attention import derived_alpha_init
from tests.helpers import skip_without_inductor_compiler

ot = pytest.importorskip("osa_lab.integrations.timm")

#: a stand-in torchvision whose every name refuses to be used (see its ``_stub.py``)
STAND_IN = Path(__file__).resolve().parent / "torchvision_stand_in"


def _torchvision_or_stand_in() -> str:
    """Where no torchvision imports (none matches the pinned CPU torch on the project's machines),
    put the stand-in on ``sys.path`` and return its folder for child processes; else ``""``."""
    try:
        import torchvision  # noqa: F401

        return ""
    except Exception:  # missing, or a build for another torch that fails while loading
        for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
            del sys.modules[name]
        sys.path.insert(0, str(STAND_IN))
        return str(STAND_IN)


TORCHVISION_PATH = _torchvision_or_stand_in()
try:
    timm = ot.import_timm()
except ImportError as exc:  # timm (the timm extra) or the torchvision it imports is missing: the error says which
    pytest.skip(f"timm does not import here: {exc}", allow_module_level=True)

from timm.layers import Attention  # noqa: E402
from timm.models.vision_transformer import Block  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


pytestmark = pytest.mark.usefixtures("one_torch_thread")

def _tiny(img_size: int = 32, **kw) -> nn.Module:
    """ViT-Tiny (dim 192, 3 heads) at a small image size: (img/16)² patches + the class token."""
    return timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=img_size, **kw)


def _reference_osa_attention(layer: ot.OSAAttention, x: torch.Tensor) -> torch.Tensor:
    """exp(S_h) V_h per head by torch.linalg.matrix_exp of the dense N×N S_h (float64 reference)."""
    b, n, _ = x.shape
    h, r = layer.num_heads, layer.head_dim
    qkv = layer.qkv(x).reshape(b, n, 3, h, r).permute(2, 0, 3, 1, 4)
    q, k, v = qkv.unbind(0)
    alpha = layer.alpha.reshape(1, h, 1, 1)
    s = alpha / math.sqrt(r) * (q @ k.mT - k @ q.mT)
    y = torch.linalg.matrix_exp(s) @ v
    return layer.proj(y.transpose(1, 2).reshape(b, n, h * r))


# --------------------------------------------------------------------------------------
# Import and build without process-wide state
# --------------------------------------------------------------------------------------


def test_timm_imports_and_builds_a_vit_here():
    model = _tiny()
    assert type(model).__name__ == "VisionTransformer"


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_create_osa_vit_builds_in_its_dtype_without_switching_the_default(dtype, monkeypatch):
    """The dtype reaches timm's constructors: no call to torch.set_default_dtype, every parameter
    and buffer in that dtype, the orthogonal W_O orthogonal to that dtype's precision."""
    calls = []
    monkeypatch.setattr(torch, "set_default_dtype", lambda d: calls.append(d))
    model = ot.create_osa_vit("vit_tiny_patch16_224", img_size=16, patch_size=4, depth=2, embed_dim=24, num_heads=2,
                              dtype=dtype)  # fmt: skip
    assert calls == [] and torch.get_default_dtype() == torch.float32
    assert {p.dtype for p in model.parameters()} == {dtype}
    assert {b.dtype for b in model.buffers() if b.is_floating_point()} <= {dtype}
    w = model.blocks[0].attn.proj.weight.detach()
    eye = torch.eye(w.shape[0], dtype=dtype)
    assert float((w @ w.T - eye).abs().max()) < 100 * torch.finfo(dtype).eps


# --------------------------------------------------------------------------------------
# The attention layer
# --------------------------------------------------------------------------------------


def test_osa_attention_matches_the_dense_float64_reference_values_and_gradients():
    torch.manual_seed(0)
    layer = ot.OSAAttention(24, num_heads=3, qkv_bias=True, tokens=10).double()
    with torch.no_grad():
        layer.alpha.copy_(torch.tensor([0.3, 0.7, 1.1], dtype=torch.float64))  # well away from 0
        layer.qkv.bias.normal_()
    x = torch.randn(2, 10, 24, dtype=torch.float64, requires_grad=True)
    y = layer(x)
    ref = _reference_osa_attention(layer, x)
    torch.testing.assert_close(y, ref, rtol=1e-10, atol=1e-10)
    g = torch.randn_like(y)
    grads = torch.autograd.grad(y, (x, layer.alpha, layer.qkv.weight), g)
    grads_ref = torch.autograd.grad(ref, (x, layer.alpha, layer.qkv.weight), g)
    for got, want in zip(grads, grads_ref, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)


def test_osa_attention_has_timm_parameter_names_plus_alpha():
    timm_attn = Attention(48, num_heads=4, qkv_bias=True, qk_norm=True, norm_layer=nn.LayerNorm)
    osa_attn = ot.OSAAttention(48, num_heads=4, qkv_bias=True, qk_norm=True, norm_layer=nn.LayerNorm)
    assert set(osa_attn.state_dict()) == set(timm_attn.state_dict()) | {"alpha"}
    for name, tensor in timm_attn.state_dict().items():
        assert osa_attn.state_dict()[name].shape == tensor.shape, name
    assert osa_attn.alpha.shape == (4,)


def test_osa_attention_init_is_the_presets_derived_init():
    torch.manual_seed(0)
    layer = ot.OSAAttention(64, num_heads=4, qkv_bias=True, tokens=65, dtype=torch.float64)
    a = layer.attn_dim
    wv, wo = layer.qkv.weight[2 * a :], layer.proj.weight
    eye = torch.eye(64, dtype=torch.float64)
    torch.testing.assert_close(wv @ wv.T, eye, atol=1e-12, rtol=0)
    torch.testing.assert_close(wo @ wo.T, eye, atol=1e-12, rtol=0)
    wq = layer.qkv.weight[:a].detach()
    assert abs(float(wq.var()) * 64 - 1.0) < 0.1  # N(0, 1/d): 4096 samples, std error ≈ 0.02
    assert float(layer.qkv.bias.detach().abs().max()) == 0.0 and float(layer.proj.bias.detach().abs().max()) == 0.0
    expected = derived_alpha_init(65, 64, 16)
    torch.testing.assert_close(layer.alpha, torch.full((4,), expected, dtype=torch.float64))


def test_state_dict_round_trips_between_timm_attention_and_osa():
    torch.manual_seed(0)
    timm_attn = Attention(48, num_heads=4, qkv_bias=True, qk_norm=True, norm_layer=nn.LayerNorm)
    original = {k: v.clone() for k, v in timm_attn.state_dict().items()}
    osa_attn = ot.OSAAttention(48, num_heads=4, qkv_bias=True, qk_norm=True, norm_layer=nn.LayerNorm, tokens=17)
    alpha_before = osa_attn.alpha.detach().clone()
    osa_attn.load_state_dict(timm_attn.state_dict())  # strict: α is kept at its derived init
    torch.testing.assert_close(osa_attn.alpha.detach(), alpha_before, rtol=0, atol=0)
    for name, tensor in original.items():
        assert torch.equal(osa_attn.state_dict()[name], tensor), name
    back = Attention(48, num_heads=4, qkv_bias=True, qk_norm=True, norm_layer=nn.LayerNorm)
    back.load_state_dict(ot.to_timm_state_dict(osa_attn))  # strict
    for name, tensor in original.items():
        assert torch.equal(back.state_dict()[name], tensor), name
    # A full OSA state dict (with α) round-trips too.
    again = ot.OSAAttention(48, num_heads=4, qkv_bias=True, qk_norm=True, norm_layer=nn.LayerNorm)
    again.load_state_dict(osa_attn.state_dict())
    assert torch.equal(again.alpha, osa_attn.alpha)


def test_whole_model_state_dicts_round_trip_through_convert():
    torch.manual_seed(0)
    model = _tiny()
    original = {k: v.clone() for k, v in model.state_dict().items()}
    ot.convert_to_osa(model)
    converted = model.state_dict()
    assert set(converted) - set(original) == {f"blocks.{i}.attn.alpha" for i in range(12)}
    for name, tensor in original.items():
        assert torch.equal(converted[name], tensor), name
    plain = _tiny()
    plain.load_state_dict(ot.to_timm_state_dict(model))  # strict, back into an unconverted timm ViT
    other = _tiny()
    ot.convert_to_osa(other)
    other.load_state_dict(original)  # strict, a timm checkpoint into a converted model
    for name, tensor in original.items():
        assert torch.equal(other.state_dict()[name], tensor), name


def test_alpha_zero_osa_attention_is_the_identity_attention():
    torch.manual_seed(0)
    layer = ot.OSAAttention(48, num_heads=4, qkv_bias=True, alpha_init=0.0).double()
    x = torch.randn(3, 9, 48, dtype=torch.float64)
    v = layer.qkv(x)[..., 2 * layer.attn_dim :]  # V of every head, concatenated: A_h = I
    torch.testing.assert_close(layer(x), layer.proj(v), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("skip,norm", [(False, False), (True, True)])
def test_alpha_zero_osa_block_equals_the_block_with_identity_attention(skip, norm):
    torch.manual_seed(0)
    blk = ot.block_fn(skip=skip, norm=norm)(48, 4, qkv_bias=True, attn_layer=ot.osa_attention(alpha_init=0.0))
    blk = blk.double()
    x = torch.randn(2, 9, 48, dtype=torch.float64)
    attn = blk.attn

    def identity_attention(z: torch.Tensor) -> torch.Tensor:
        return attn.proj(attn.qkv(z)[..., 2 * attn.attn_dim :])

    h = identity_attention(blk.norm1(x))
    h = x + h if skip else h
    y = blk.mlp(blk.norm2(h))
    y = h + y if skip else y
    torch.testing.assert_close(blk(x), y, rtol=1e-12, atol=1e-12)
    if skip and norm:
        # timm's own Block with the OSA layer computes the same function.
        timm_block = Block(48, 4, qkv_bias=True, attn_layer=ot.osa_attention(alpha_init=0.0)).double()
        timm_block.load_state_dict(blk.state_dict())
        torch.testing.assert_close(timm_block(x), y, rtol=1e-12, atol=1e-12)


def test_masks_are_refused():
    layer = ot.OSAAttention(16, num_heads=2)
    x = torch.randn(1, 5, 16)
    with pytest.raises(CausalMaskError, match="non-causal"):
        layer(x, attn_mask=torch.zeros(5, 5))
    with pytest.raises(CausalMaskError, match="is_causal"):
        layer(x, is_causal=True)
    model = ot.create_osa_vit("vit_tiny_patch16_224", img_size=32, depth=1)
    with pytest.raises(CausalMaskError):
        model.forward_features(torch.randn(1, 3, 32, 32), attn_mask=torch.zeros(5, 5))


def test_neutral_masks_are_accepted_and_key_padding_is_exact():
    torch.manual_seed(0)
    layer = ot.OSAAttention(16, num_heads=2).double()
    x = torch.randn(2, 9, 16, dtype=torch.float64)
    torch.testing.assert_close(layer(x, attn_mask=None, is_causal=False), layer(x), rtol=0, atol=0)
    pad = torch.arange(9)[None, :] >= torch.tensor([[9], [4]])  # the second row: 4 valid tokens
    y = layer(x, key_padding_mask=pad)
    torch.testing.assert_close(y[1:, :4], layer(x[1:, :4]), rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(y[:1], layer(x[:1]), rtol=1e-10, atol=1e-12)


def test_bad_arguments_get_typed_errors_that_name_the_fix():
    with pytest.raises(ConfigurationError, match="attn_drop"):
        ot.OSAAttention(16, num_heads=2, attn_drop=0.1)
    with pytest.raises(ConfigurationError, match="num_heads"):
        ot.OSAAttention(10, num_heads=3)
    with pytest.raises(UnknownNameError, match="valid methods"):
        ot.OSAAttention(16, num_heads=2, method="fast")
    with pytest.raises(ConfigurationError, match="drop_path_rate=0"):
        ot.create_osa_vit("vit_tiny_patch16_224", img_size=32, depth=2, drop_path_rate=0.1)
    with pytest.raises(UnknownNameError, match="vit_tiny_patch16_224"):
        ot.create_osa_vit("vit_tiny_patch16_244")
    with pytest.raises(UnknownNameError, match="valid attentions"):
        ot.create_osa_vit("vit_tiny_patch16_224", attention="linear")
    model = _tiny(attn_drop_rate=0.1)
    with pytest.raises(ConfigurationError, match="nothing was converted"):
        ot.convert_to_osa(model)
    assert not ot.osa_attention_layers(model)


# --------------------------------------------------------------------------------------
# Building and converting models
# --------------------------------------------------------------------------------------


def test_converted_vit_tiny_runs_forward_and_backward_close_to_float64():
    torch.manual_seed(0)
    model = _tiny(img_size=32)
    report = ot.convert_to_osa(model)
    assert report.swapped == [f"blocks.{i}.attn" for i in range(12)]
    assert report.tokens == 5 and report.parameters_added == 12 * 3
    assert report.alpha == pytest.approx(derived_alpha_init(5, 192, 64))
    assert "converted 12 attention layer(s)" in str(report)
    x = torch.randn(2, 3, 32, 32)
    model64 = _tiny(img_size=32).double()
    ot.convert_to_osa(model64)
    model64.load_state_dict(model.state_dict())
    y = model(x)
    y64 = model64(x.double())
    torch.testing.assert_close(y.double(), y64, rtol=1e-4, atol=1e-4)
    y.square().sum().backward()
    y64.square().sum().backward()
    for (name, p), p64 in zip(model.named_parameters(), model64.parameters(), strict=True):
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        scale = float(p64.grad.abs().max()) + 1e-12
        assert float((p.grad.double() - p64.grad).abs().max()) / scale < 1e-3, name
    assert float(model.blocks[0].attn.alpha.grad.abs().sum()) > 0


def test_convert_keeps_the_weights_and_reports_other_attention_classes():
    torch.manual_seed(0)
    model = _tiny(img_size=32, depth=2, global_pool="map")  # attention-pool head: not a timm Attention
    qkv = model.blocks[0].attn.qkv
    report = ot.convert_to_osa(model)
    assert model.blocks[0].attn.qkv is qkv  # the same module: weights kept, nothing copied
    assert isinstance(model.blocks[0].attn, ot.OSAAttention)
    assert report.swapped == ["blocks.0.attn", "blocks.1.attn"]
    assert [name for name, _ in report.skipped] == ["attn_pool"]
    again = ot.convert_to_osa(model)
    assert again.swapped == [] and [n for n, _ in again.skipped][:2] == ["blocks.0.attn", "blocks.1.attn"]


def test_create_osa_vit_builds_the_papers_model_with_the_presets_init():
    torch.manual_seed(0)
    model = ot.create_osa_vit("vit_tiny_patch16_224", img_size=64, depth=3, dtype=torch.float64)
    n = 17  # (64/16)² patches + the class token
    assert ot.num_tokens(model) == n
    assert isinstance(model.norm, nn.Identity) and isinstance(model.fc_norm, nn.Identity)
    eye = torch.eye(192, dtype=torch.float64)
    for blk in model.blocks:
        assert isinstance(blk, ot.SkiplessBlock) and not blk.skip and not blk.use_norm
        assert isinstance(blk.norm1, nn.Identity) and isinstance(blk.norm2, nn.Identity)
        attn = blk.attn
        assert isinstance(attn, ot.OSAAttention)
        torch.testing.assert_close(attn.alpha, torch.full((3,), derived_alpha_init(n, 192, 64), dtype=torch.float64))
        # timm's trunc-normal init ran first; the presets' init was applied after it.
        torch.testing.assert_close(attn.proj.weight @ attn.proj.weight.T, eye, atol=1e-12, rtol=0)
        fc1 = blk.mlp.fc1.weight  # (768, 192), orthogonal columns with gain √(768/192) = 2
        torch.testing.assert_close(fc1.T @ fc1, 4 * eye, atol=1e-11, rtol=0)
    x = torch.randn(2, 3, 64, 64, dtype=torch.float64)
    assert model(x).shape == (2, 1000)
    plain = ot.create_osa_vit("vit_tiny_patch16_224", skipless=False, normless=False, img_size=32, depth=2)
    assert type(plain.blocks[0]) is Block and isinstance(plain.blocks[0].attn, ot.OSAAttention)
    assert not isinstance(plain.norm, nn.Identity)


def test_torch_compile_of_a_converted_vit_runs():
    skip_without_inductor_compiler()
    torch.manual_seed(0)
    model = _tiny(img_size=32, depth=1).eval()
    ot.convert_to_osa(model)
    x = torch.randn(2, 3, 32, 32)
    expected = model(x)
    compiled = torch.compile(model)
    y = compiled(x)
    torch.testing.assert_close(y, expected, rtol=1e-4, atol=1e-5)
    y.sum().backward()
    assert model.blocks[0].attn.alpha.grad is not None


@pytest.mark.filterwarnings("ignore::UserWarning:torch._dynamo.utils")
@pytest.mark.filterwarnings("ignore::UserWarning:torch._dynamo.variables.functions")
def test_torch_compile_of_a_converted_vit_above_4r_matches_eager():
    """N = 257 tokens (256 px) against r = 64 per head: the low-rank path and its output check,
    compiled (aot_eager: Dynamo and AOTAutograd, no C++ build), give eager's outputs and
    gradients; the CPU kernels run as graph breaks."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = _tiny(img_size=256, depth=1).double().eval()
    ot.convert_to_osa(model)
    x = torch.randn(1, 3, 256, 256, dtype=torch.float64)
    alpha = model.blocks[0].attn.alpha
    expected = model(x)
    (expected_grad,) = torch.autograd.grad(expected.sum(), alpha)
    out = torch.compile(model, backend="aot_eager")(x)
    (grad,) = torch.autograd.grad(out.sum(), alpha)
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(grad, expected_grad, rtol=1e-9, atol=1e-11)


# --------------------------------------------------------------------------------------
# Rank collapse and conditioning with osa_lab's metrics
# --------------------------------------------------------------------------------------


def test_skipless_normless_osa_vit_tiny_keeps_rank_at_depth_12_while_softmax_collapses():
    """ViT-Tiny at 224 px (N = 197, d = 192), depth 12, float64, random init, seed 0.

    Measured (2 images): OSA at layer 12 effective rank 74.5, relative residual 0.74, numerical
    rank 192; softmax effective rank 1.000, relative residual 6.6e-16 (collapsed from layer 4 on),
    numerical rank 1. Input (layer 0) effective rank 150.7 for both.
    """
    from osa_lab.studies.depth import depth_profile
    from osa_lab.studies.metrics import normalized_spectrum

    images = torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    results = {}
    for attention in ("osa", "softmax"):
        torch.manual_seed(0)
        model = ot.create_osa_vit("vit_tiny_patch16_224", attention=attention, dtype=torch.float64)
        assert len(model.blocks) == 12 and ot.num_tokens(model) == 197
        prof = depth_profile(model, images, site="block", spectra=False, label=attention)
        table = prof.pivot("block")
        with torch.no_grad():
            last = ot.timm_hidden_states(model.eval(), images).blocks[-1]
        numerical_rank = (normalized_spectrum(last) > 1e-8).sum(-1)
        results[attention] = (table, numerical_rank)
    osa_t, osa_rank = results["osa"]
    ssa_t, ssa_rank = results["softmax"]
    assert osa_t.loc[0, "effective_rank"] > 140 and ssa_t.loc[0, "effective_rank"] > 140
    assert osa_t.loc[12, "effective_rank"] > 50  # measured 74.5
    assert osa_t.loc[12, "relative_residual"] > 0.5  # measured 0.74
    assert bool((osa_rank == 192).all())
    assert ssa_t.loc[12, "effective_rank"] < 1.01  # measured 1.000
    assert ssa_t.loc[12, "relative_residual"] < 1e-10  # measured 6.6e-16
    assert bool((ssa_rank == 1).all())


def test_depth_profile_and_hidden_states_of_a_timm_vit():
    from osa_lab.studies.depth import depth_profile, hidden_states

    torch.manual_seed(0)
    model = ot.create_osa_vit("vit_tiny_patch16_224", img_size=32, depth=3, dtype=torch.float64)
    prof = depth_profile(model, seed=1, batch=2, label="mine")
    m = prof.metrics
    assert set(m["site"]) == {"block", "attention"}
    assert sorted(set(m.loc[m["site"] == "block", "layer"])) == [0, 1, 2, 3]
    assert sorted(set(m.loc[m["site"] == "attention", "layer"])) == [1, 2, 3]
    row = m.iloc[0]
    assert (row["preset"], row["depth"], row["tokens"], row["dim"], row["heads"]) == ("mine", 3, 5, 192, 3)
    assert row["alpha"] == pytest.approx(derived_alpha_init(5, 192, 64))
    assert not prof.spectra.empty
    images = ot.default_images(model, 2, seed=1)
    hidden = hidden_states(model, images)
    with torch.no_grad():
        torch.testing.assert_close(hidden.blocks[-1], model.forward_features(images), rtol=0, atol=0)
    # timm's own Block is profiled too (attention site with its skip).
    plain = _tiny(img_size=32, depth=2).double()
    prof2 = depth_profile(plain, batch=1)
    assert sorted(set(prof2.metrics["layer"])) == [0, 1, 2]
    assert math.isnan(prof2.metrics["alpha"].iloc[0])


def test_jacobian_kappa_of_a_timm_vit_exact_and_matrix_free_agree():
    from osa_lab.studies.jacobian import KAPPA_COLUMNS

    torch.manual_seed(0)
    model = ot.create_osa_vit(
        "vit_tiny_patch16_224", img_size=8, patch_size=4, in_chans=1, embed_dim=16, num_heads=2, depth=2,
        class_token=False, global_pool="avg", dtype=torch.float64,
    )  # fmt: skip  (N = 4 tokens, d = 16: an 64 × 64 Jacobian per block)
    exact = ot.timm_jacobian_profile(model, algorithm="exact")
    assert list(exact.columns) == KAPPA_COLUMNS
    assert len(exact) == 4 and set(exact["algorithm"]) == {"exact"}
    # The end-to-end Jacobian at layer 1 is block 1's own.
    first = exact[exact["layer"] == 1].set_index("scope")["kappa"]
    assert first["end_to_end"] == pytest.approx(first["layer"], rel=1e-12)
    assert all(exact["kappa"] >= 1.0) and all(exact["kappa"] < 1e6)
    # Matrix-free (ARPACK on jvp/vjp products) finds the same extremes. Measured κ of block 2: 292.4
    # (the end-to-end κ ≈ 3e3 is near where ARPACK's σ_min through JᵀJ stops converging, so not used).
    free = ot.timm_jacobian_profile(model, algorithm="matrix-free", layers=[2], scopes=("layer",))
    assert bool(free["converged"].all())
    want = exact[(exact["layer"] == 2) & (exact["scope"] == "layer")]
    for col in ("sigma_max", "sigma_min", "kappa"):
        assert float(free[col].iloc[0]) == pytest.approx(float(want[col].iloc[0]), rel=1e-4), col
    assert ot.osa_attention_layers(model)[0].method == "auto"  # functional mode was undone


def test_timm_analyses_run_in_eval_mode_and_restore_the_callers_mode():
    """Dropout must not perturb the profiles: both analyses see the model in eval mode, and the
    caller's mode (train or eval) comes back afterwards, also when the analysis raises."""
    from osa_lab.errors import JacobianTooLargeError

    torch.manual_seed(0)
    model = ot.create_osa_vit(
        "vit_tiny_patch16_224", img_size=8, patch_size=4, in_chans=1, embed_dim=16, num_heads=2, depth=2,
        class_token=False, global_pool="avg", dtype=torch.float64,
    )  # fmt: skip
    seen = []
    model.blocks[0].register_forward_pre_hook(lambda mod, args: seen.append(mod.training))
    for training in (True, False):
        model.train(training)
        ot.timm_depth_profile(model, spectra=False)
        ot.timm_jacobian_profile(model, algorithm="exact", layers=[1], scopes=("layer",))
        assert model.training is training and all(m.training is training for m in model.modules())
        with pytest.raises(JacobianTooLargeError):  # refused inside the analysis: too large for "exact"
            ot.timm_jacobian_profile(model, algorithm="exact", max_bytes=16)
        assert model.training is training and all(m.training is training for m in model.modules())
    assert seen and not any(seen)  # every forward the analyses ran was in eval mode


# --------------------------------------------------------------------------------------
# The example script and the example of docs/timm.md
# --------------------------------------------------------------------------------------


def test_example_trains_a_skipless_osa_vit_on_digits():
    cmd = [
        sys.executable, str(ROOT / "examples" / "timm_vit.py"),
        "--steps", "60", "--depth", "2", "--log-every", "20",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    if TORCHVISION_PATH:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [TORCHVISION_PATH, env.get("PYTHONPATH", "")]))
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    match = re.search(r"first 10 steps ([\d.]+), of the last 10 steps ([\d.]+)", out.stdout)
    assert match, out.stdout
    first, last = map(float, match.groups())
    assert first > 2.0 and last < first - 0.4, out.stdout  # measured: 2.29 → 1.56 (seed 0)
    assert "test accuracy" in out.stdout


def test_example_rejects_bad_arguments_in_one_line():
    cmd = [sys.executable, str(ROOT / "examples" / "timm_vit.py"), "--dim", "30", "--heads", "4"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 2
    assert "not divisible" in out.stderr and "Traceback" not in out.stderr


def test_docs_timm_example_runs():
    text = (ROOT / "docs" / "timm.md").read_text()
    assert text.startswith("# OSA in timm Vision Transformers"), "docs/timm.md is not the timm page"
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert blocks, "docs/timm.md has no python example"
    small = ", img_size=32, depth=2)"  # the same calls at a small size, to keep the test cheap
    code = blocks[0].replace('_224")', '_224"' + small).replace("pretrained=False)", "pretrained=False" + small)
    assert code.count(small) == 2, code
    namespace: dict = {}
    exec(compile(code, "docs/timm.md", "exec"), namespace)  # noqa: S102
    assert isinstance(namespace["model"], nn.Module)
    assert "effective_rank" in namespace["profile"].pivot("block").columns
    assert ot.osa_attention_layers(namespace["vit"]), "convert_to_osa swapped no attention layer"


@pytest.mark.parametrize("name", ["beit_base_patch16_224", "eva02_tiny_patch14_224"])
def test_convert_refuses_a_model_with_no_timm_attention(name):
    """Models whose attention is not timm's Attention (BEiT relative positions, EVA rotary) would
    convert 0 layers and keep training softmax attention: a typed error names what was found."""
    model = timm.create_model(name, pretrained=False, img_size=32, patch_size=16, embed_dim=32, depth=1, num_heads=2)
    found = sorted({type(m).__name__ for m in model.modules() if "Attention" in type(m).__name__})
    with pytest.raises(ConfigurationError, match="no timm.layers.Attention") as info:
        ot.convert_to_osa(model, tokens=5)
    assert found and all(cls in str(info.value) for cls in found)
    assert not ot.osa_attention_layers(model)


# --------------------------------------------------------------------------------------
# pip install "osa_lab[timm]": the integration without the laboratory
# --------------------------------------------------------------------------------------

#: the laboratory's packages that neither timm nor its requirements (pyyaml, huggingface_hub,
#: whose progress bars are tqdm) bring: blocked as if not installed
_LAB_ONLY = ("pandas", "scipy", "matplotlib", "holoviews", "bokeh", "panel", "dask", "distributed", "sklearn",
             "mnist1d", "papermill")  # fmt: skip


def test_the_timm_integration_needs_only_the_timm_extra(tmp_path):
    """The layer, conversion and a training step work with timm's requirements and no laboratory;
    an analysis name raises the one error that names the lab extra."""
    code = f"""
import sys
for name in {_LAB_ONLY!r}:
    sys.modules[name] = None
import torch
import osa_lab.integrations.timm as ot
from osa_lab.errors import OptionalDependencyError
model = ot.create_osa_vit("vit_tiny_patch16_224", img_size=32, patch_size=8, depth=2, num_classes=3)
y = model(torch.randn(2, 3, 32, 32))
y.sum().backward()
assert len(ot.osa_attention_layers(model)) == 2 and "timm_hidden_states" in dir(ot)
assert "pandas" not in [m for m in sys.modules if sys.modules[m] is not None]
try:
    ot.timm_hidden_states
except OptionalDependencyError as exc:
    print("refused:", exc)
print("timm ok", tuple(y.shape))
"""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [TORCHVISION_PATH, str(ROOT)]))}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                         env=env)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert "timm ok (2, 3)" in out.stdout, out.stdout
    assert "refused:" in out.stdout and 'pip install "osa_lab[lab]"' in out.stdout, out.stdout
