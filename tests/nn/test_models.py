"""Models and presets: configuration checks, hidden states, initialisations and the depth facts."""

from __future__ import annotations

import math

import pytest
import torch

from osa_lab.errors import ConfigurationError, OSAInputError, UnknownNameError
from osa_lab.nn.attention import (
    OrthogonalSelfAttention,
    SoftmaxSelfAttention,
    ValueSkipInitAttention,
    derived_alpha_init,
)
from osa_lab.nn.models import (
    CUTTING_SKIP_ABC,
    ModelConfig,
    NonFiniteHiddenStateError,
    build_classifier,
    build_model,
)
from osa_lab.nn.presets import PRESETS, describe, get_preset, preset_names

EXPECTED_PRESETS = [
    "vit",
    "skipless-ssa",
    "skipless-osa",
    "skipless-osa-shaped",
    "skipless-ssa-shaped",
    "pure-ssa",
    "pure-osa",
    "ssa-cutting-skip",
    "ssa-value-skipinit",
]


pytestmark = pytest.mark.usefixtures("one_torch_thread")

def _tokens(b, n, d, seed=0, dtype=torch.float64):
    return torch.randn(b, n, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).to(dtype)


# ---------------------------------------------------------------- configuration


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"dim": 30, "heads": 4}, "not divisible by `heads`=4"),
        ({"depth": 0}, "`depth` must be a positive int"),
        ({"mlp_ratio": -1}, "mlp_ratio"),
        ({"input": "patches", "image_size": 8, "patch_size": 3}, "does not divide `image_size`=8"),
        ({"attention": "osa", "init": "cutting-skip"}, "SSA initialisation"),
        ({"attention": "ssa", "alpha_init": 0.1}, "only applies to attention='osa'"),
    ],
)
def test_impossible_configs(kwargs, match):
    with pytest.raises(ConfigurationError, match=match):
        ModelConfig(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"mlp_ratio": math.nan}, "mlp_ratio.*finite"),
        ({"mlp_ratio": math.inf}, "mlp_ratio.*finite"),
        ({"alpha_init": math.nan}, "alpha_init.*finite"),
        ({"alpha_init": -math.inf}, "alpha_init.*finite"),
        ({"alpha_init": "0.5"}, "alpha_init.*real number"),
        ({"alpha_init": True}, "alpha_init.*real number"),
    ],
    ids=["mlp-nan", "mlp-inf", "alpha-nan", "alpha-minus-inf", "alpha-str", "alpha-bool"],
)
def test_non_finite_float_fields_are_refused(kwargs, match):
    """mlp_ratio=nan passed `< 0` and built a model with no MLP; every float field of
    ModelConfig must be a finite number (typed ConfigurationError, never a silent default)."""
    with pytest.raises(ConfigurationError, match=match):
        ModelConfig(**kwargs)


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_layer_refuses_non_finite_alpha_init_at_construction(value):
    """OrthogonalSelfAttention(alpha_init=nan/inf) fails when built, with ModelConfig's error type."""
    with pytest.raises(ConfigurationError, match="alpha_init.*finite"):
        OrthogonalSelfAttention(8, 2, alpha_init=value, tokens=4)


@pytest.mark.parametrize("field", ["attention", "norm", "init", "input"])
def test_unknown_names_list_valid_ones(field):
    with pytest.raises(UnknownNameError, match="valid"):
        ModelConfig(**{field: "nope"})


def relative_residual(x: torch.Tensor) -> float:
    """``‖X − 1 x̄ᵀ‖_{1,∞} / ‖X‖_{1,∞}`` (Dong et al. 2021), written here so that these core tests
    need no laboratory module (``osa_lab.studies.metrics`` holds the library's copy, tested there)."""

    def composite(m: torch.Tensor) -> float:
        m = m.double().abs()
        return float((m.sum(dim=-2).amax() * m.sum(dim=-1).amax()).sqrt())

    return composite(x - x.mean(dim=-2, keepdim=True)) / composite(x)


def test_presets_names_and_docs():
    assert preset_names() == EXPECTED_PRESETS
    for name, preset in PRESETS.items():
        assert "arXiv" in preset.reference or "et al." in preset.reference, name
        assert name in describe(name)
    with pytest.raises(UnknownNameError, match="pure-osa") as exc:
        get_preset("pure-osaa")
    assert all(n in str(exc.value) for n in EXPECTED_PRESETS)
    with pytest.raises(ConfigurationError, match="valid fields"):
        get_preset("vit", depht=3)


def test_preset_architectures():
    vit = get_preset("vit")
    assert vit.skip and vit.norm == "layernorm" and vit.attention == "ssa" and vit.mlp_ratio > 0
    for name in ("skipless-ssa", "skipless-osa"):
        c = get_preset(name)
        assert not c.skip and c.norm == "none" and c.mlp_ratio > 0
    for name, att in (("pure-ssa", "ssa"), ("pure-osa", "osa")):
        c = get_preset(name)
        assert not c.skip and c.norm == "none" and c.mlp_ratio == 0 and c.attention == att
    assert get_preset("ssa-cutting-skip").init == "cutting-skip"
    assert get_preset("ssa-value-skipinit").init == "value-skipinit"
    assert get_preset("pure-osa", depth=3).depth == 3


# ---------------------------------------------------------------- forward and hidden states


@pytest.mark.parametrize("name", EXPECTED_PRESETS)
def test_every_preset_builds_and_returns_hidden_states(name):
    cfg = get_preset(name, depth=3, dim=16, heads=2, tokens=8, seed=0)
    model = build_model(cfg)
    x = _tokens(2, 8, 16, dtype=torch.float32)
    y, hidden = model(x, return_hidden=True)
    assert y.shape == x.shape
    assert len(hidden.blocks) == 4 and len(hidden.attention) == 3
    assert hidden.blocks[0] is x
    assert torch.equal(hidden.blocks[-1], y)
    assert torch.equal(model(x), y)
    attn_cls = OrthogonalSelfAttention if cfg.attention == "osa" else SoftmaxSelfAttention
    assert isinstance(model.blocks[0].attn, attn_cls)


def test_attention_site_is_attention_output():
    cfg = get_preset("skipless-osa", depth=2, dim=16, heads=2, tokens=8, seed=0)
    model = build_model(cfg, dtype=torch.float64)
    x = _tokens(1, 8, 16)
    _, hidden = model(x, return_hidden=True)
    with torch.no_grad():
        h1 = model.blocks[0].attn(x)
        assert torch.allclose(hidden.attention[0], h1)
        assert torch.allclose(hidden.blocks[1], model.blocks[0].mlp(h1))


def test_seeded_models_are_depth_consistent():
    shallow = build_model(get_preset("skipless-ssa", depth=2, dim=16, heads=2, tokens=8, seed=3))
    deep = build_model(get_preset("skipless-ssa", depth=5, dim=16, heads=2, tokens=8, seed=3))
    other = build_model(get_preset("skipless-ssa", depth=2, dim=16, heads=2, tokens=8, seed=4))
    x = _tokens(1, 8, 16, dtype=torch.float32)
    assert torch.equal(shallow(x), deep(x, layers=2))
    assert not torch.allclose(shallow(x), other(x))


def test_nan_reports_first_layer():
    model = build_model(get_preset("skipless-osa", depth=4, dim=16, heads=2, tokens=8, seed=0))
    with torch.no_grad():
        model.blocks[2].mlp.fc2.weight[0, 0] = float("nan")
    with pytest.raises(NonFiniteHiddenStateError, match="layer 3") as exc:
        model(_tokens(1, 8, 16, dtype=torch.float32), return_hidden=True)
    assert exc.value.layer == 3 and exc.value.site == "block"
    bad = _tokens(1, 8, 16, dtype=torch.float32)
    bad[0, 0, 0] = float("inf")
    with pytest.raises(NonFiniteHiddenStateError, match="input \\(layer 0\\)"):
        model(bad)


def test_wrong_input_shape():
    model = build_model(get_preset("pure-osa", depth=1, dim=16, tokens=8))
    with pytest.raises(OSAInputError, match="dim=16"):
        model(torch.randn(1, 8, 15))


def test_classifier():
    cfg = get_preset("skipless-osa", depth=2, dim=16, heads=2, image_size=8, patch_size=2, channels=1, seed=0)
    clf = build_classifier(cfg)
    assert clf.config.input == "patches" and clf.config.tokens == 16
    # the OSA layers were initialised for N = 16 patch tokens
    assert float(clf.encoder.blocks[0].attn.alpha.detach()[0, 0]) == pytest.approx(
        derived_alpha_init(16, 16, 8)
    )
    images = torch.randn(5, 1, 8, 8)
    logits, hidden = clf(images, return_hidden=True)
    assert logits.shape == (5, 10)
    assert hidden.blocks[0].shape == (5, 16, 16)
    # per-sample independence: the batch does not mix samples
    assert torch.allclose(clf(images[2:3]), logits[2:3], atol=1e-5)
    with pytest.raises(OSAInputError, match="classifier needs"):
        clf(torch.randn(2, 3, 8, 8))


def test_value_skipinit_starts_as_identity_attention():
    cfg = get_preset("ssa-value-skipinit", depth=1, dim=16, heads=2, tokens=8, seed=0)
    attn = build_model(cfg, dtype=torch.float64).blocks[0].attn
    assert isinstance(attn, ValueSkipInitAttention)
    x = _tokens(2, 8, 16)
    with torch.no_grad():
        expected = attn.to_out(attn.to_v(x))  # A = I at init
        assert torch.allclose(attn(x), expected, atol=1e-12)
        attn.skip_b.fill_(1.0)
        assert not torch.allclose(attn(x), expected, atol=1e-3)


def test_cutting_skip_init_products():
    a, b, c = CUTTING_SKIP_ABC
    d, heads = 16, 1  # one head of width r = d: W_Q W_Kᵀ = a Z + b I exactly
    cfg = get_preset("ssa-cutting-skip", depth=1, dim=d, heads=heads, tokens=8, seed=0)
    attn = build_model(cfg, dtype=torch.float64).blocks[0].attn
    wq, wk = attn.to_q.weight.detach(), attn.to_k.weight.detach()
    m = wq.mT @ wk  # logits = x M xᵀ (before the 1/√r of SDPA)
    z = (m - b * torch.eye(d, dtype=torch.float64)) / a
    # the off-identity part looks like N(0, 1/d) entries
    assert float(z.std() * math.sqrt(d)) == pytest.approx(1.0, abs=0.2)
    vo = attn.to_out.weight @ attn.to_v.weight
    sv = torch.linalg.svdvals(vo)
    assert torch.allclose(sv, torch.full_like(sv, c), rtol=1e-10)  # scaled orthogonal: κ = 1


# ---------------------------------------------------------------- the depth facts


def test_pure_ssa_collapses_and_skips_prevent_it():
    """Dong et al. 2021: pure SSA loses rank doubly exponentially; skip connections prevent it."""
    x = _tokens(1, 32, 64, seed=0)
    pure = build_model(
        get_preset("pure-ssa", depth=12, dim=64, heads=4, tokens=32, seed=0), dtype=torch.float64
    )
    with torch.no_grad():
        _, hidden = pure(x, return_hidden=True)
    r0 = float(relative_residual(hidden.blocks[0]))
    r12 = float(relative_residual(hidden.blocks[12]))
    assert r12 < 1e-3 * r0
    skip = build_model(
        get_preset("pure-ssa", depth=12, dim=64, heads=4, tokens=32, seed=0, skip=True), dtype=torch.float64
    )
    with torch.no_grad():
        _, hidden = skip(x, return_hidden=True)
    assert float(relative_residual(hidden.blocks[12])) > 0.1 * r0


@pytest.mark.parametrize(("dtype", "tol"), [(torch.float64, 1e-10), (torch.float32, 1e-4)])
def test_pure_osa_keeps_every_singular_value(dtype, tol):
    """Zhang & Martens 2026: X ↦ A X W_V W_O with A, W_V W_O orthogonal keeps σ(X) at every depth."""
    # Error is measured per singular value, relative to that σ_i (not to σ_1); N > d keeps
    # κ(X) ≈ (√N + √d)/(√N − √d) ≈ 6, as for tokens of a transformer with N ≥ 2d.
    cfg = get_preset("pure-osa", depth=48, dim=32, tokens=64, seed=0)
    assert cfg.heads == 1
    model = build_model(cfg, dtype=dtype)
    x = _tokens(2, 64, 32, seed=1, dtype=dtype)
    with torch.no_grad():
        _, hidden = model(x, return_hidden=True)
    s0 = torch.linalg.svdvals(x.double())
    worst = max(float(((torch.linalg.svdvals(h.double()) - s0).abs() / s0).max()) for h in hidden.blocks)
    assert worst <= tol
    # and the stack is not the identity: tokens really are mixed
    assert float((hidden.blocks[48].double() - x.double()).norm() / x.double().norm()) > 0.1


def test_concurrent_builds_get_their_own_dtype():
    """build_model(dtype=...) passes the dtype to every module; builds in two threads (the
    dashboard's sessions) run concurrently and neither sees the other's dtype."""
    import threading

    from osa_lab.nn.models import build_model
    from osa_lab.nn.presets import get_preset

    config = get_preset("skipless-osa", depth=2, tokens=8, dim=16, heads=2)
    seen: dict[str, set] = {"float64": set(), "default": set()}

    def build(kind: str) -> None:
        for _ in range(20):
            model = build_model(config, dtype=torch.float64 if kind == "float64" else None)
            seen[kind].update(p.dtype for p in model.parameters())

    threads = [threading.Thread(target=build, args=(kind,)) for kind in ("float64", "default")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen == {"float64": {torch.float64}, "default": {torch.float32}}
    assert torch.get_default_dtype() == torch.float32


@pytest.mark.parametrize("builder", ["build_model", "build_classifier"])
def test_a_float64_build_leaves_the_default_dtype_of_other_threads_alone(monkeypatch, builder):
    """no process-wide default-dtype switch. While a float64 model is half built in one
    thread (paused inside its first block), another thread still sees float32 as the default
    and creates float32 tensors; the float64 model's parameters are all float64, initialised in
    float64 (orthogonal W_V to float64 rounding, not float32's)."""
    import threading

    from osa_lab.nn import models

    paused, resume, seen = threading.Event(), threading.Event(), {}

    class PausingBlock(models.Block):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            if not paused.is_set():
                paused.set()
                assert resume.wait(30)

    monkeypatch.setattr(models.builders, "Block", PausingBlock)
    config = get_preset("pure-osa", depth=2, tokens=8, dim=16)
    built = {}

    def build() -> None:
        built["model"] = getattr(models, builder)(config, dtype=torch.float64)

    t = threading.Thread(target=build)
    t.start()
    try:
        assert paused.wait(30)
        seen["default"], seen["zeros"] = torch.get_default_dtype(), torch.zeros(1).dtype
        seen["linear"] = torch.nn.Linear(2, 2).weight.dtype
    finally:
        resume.set()
        t.join(30)
    assert seen == {"default": torch.float32, "zeros": torch.float32, "linear": torch.float32}
    model = built["model"]
    assert {p.dtype for p in model.parameters()} | {b.dtype for b in model.buffers()} == {torch.float64}
    w = models.osa_layers(model)[0].to_v.weight.detach()
    assert float((w @ w.mT - torch.eye(16, dtype=torch.float64)).abs().max()) < 1e-13
    assert torch.get_default_dtype() == torch.float32


def test_seeded_builds_in_concurrent_threads_match_sequential_builds():
    """Seeded builds draw from local generators; builds in several threads at once (the
    dashboard's sessions, which compute concurrently) give exactly the sequential weights."""
    import threading

    from osa_lab.nn.models import build_model

    configs = [get_preset(p, depth=3, tokens=8, dim=16, seed=s) for p in ("vit", "pure-osa") for s in (0, 1)]
    want = [[t.clone() for t in build_model(c, dtype=torch.float64).state_dict().values()] for c in configs]
    got: dict[int, list] = {}
    barrier = threading.Barrier(len(configs))

    def build(i: int) -> None:
        barrier.wait()
        for _ in range(5):
            got[i] = list(build_model(configs[i], dtype=torch.float64).state_dict().values())

    threads = [threading.Thread(target=build, args=(i,)) for i in range(len(configs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in range(len(configs)):
        assert all(torch.equal(a, b) for a, b in zip(want[i], got[i], strict=True)), configs[i]


def test_a_seeded_build_is_immune_to_another_thread_using_the_global_generator(monkeypatch):
    """While a seeded build is half done (paused between its attention and its MLP), another thread
    reseeds torch's global generator and draws from it: the build's weights do not change (they come
    from its local generator) and the other thread's draws are its own."""
    import threading

    from osa_lab.nn.models import blocks

    config = get_preset("skipless-osa", depth=1, tokens=8, dim=16, heads=2, seed=5)
    want = build_model(config).state_dict()
    paused, resume, built = threading.Event(), threading.Event(), {}

    class PausingMLP(blocks.MLP):
        def __init__(self, *args, **kwargs):
            paused.set()
            assert resume.wait(30)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(blocks, "MLP", PausingMLP)
    thread = threading.Thread(target=lambda: built.update(model=build_model(config)))
    thread.start()
    try:
        assert paused.wait(30)
        torch.manual_seed(123)
        drawn = torch.rand(5)
    finally:
        resume.set()
        thread.join(30)
    got = built["model"].state_dict()
    assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)
    torch.manual_seed(123)
    assert torch.equal(drawn, torch.rand(5))


def test_a_seeded_build_neither_reads_nor_advances_the_global_generator():
    from osa_lab.nn.models import build_classifier

    config = get_preset("vit", depth=2, dim=16, heads=2, input="patches", image_size=8, patch_size=2, seed=4)
    models_built = []
    for global_seed in (1, 2):
        torch.manual_seed(global_seed)
        state = torch.get_rng_state()
        models_built.append(build_classifier(config, dtype=torch.float64).state_dict())
        assert torch.equal(torch.get_rng_state(), state)
    assert all(torch.equal(models_built[0][k], models_built[1][k]) for k in models_built[0])


def test_random_draws_from_a_generator_equal_the_seeded_global_stream():
    """The weights of a seeded build are those of a build after torch.manual_seed: a local
    generator seeded with s yields the global generator's stream after manual_seed(s)."""
    from osa_lab.nn.models import random_draws_from

    with random_draws_from(torch.Generator().manual_seed(7)):
        local = (torch.nn.Linear(6, 5).weight.detach().clone(), torch.randn(4), torch.empty(3, 3).normal_())
    torch.manual_seed(7)
    global_ = (torch.nn.Linear(6, 5).weight.detach().clone(), torch.randn(4), torch.empty(3, 3).normal_())
    assert all(torch.equal(a, b) for a, b in zip(local, global_, strict=True))


# ---------------------------------------------------------------- sequences, baselines, controls


def test_training_presets_are_separate_from_the_sweep_presets():
    from osa_lab.nn.presets import TRAINING_PRESETS

    assert preset_names() == EXPECTED_PRESETS
    assert preset_names(training=True) == [*EXPECTED_PRESETS, *TRAINING_PRESETS]
    assert set(TRAINING_PRESETS) == {"skipless-osa-alpha0", "vit-no-attn", "mlp", "cnn1d"}
    a0 = get_preset("skipless-osa-alpha0")
    assert a0.alpha_init == 0.0 and not a0.learn_alpha and a0.attention == "osa"
    assert get_preset("vit-no-attn").attention == "none" and get_preset("vit-no-attn").skip


@pytest.mark.parametrize("name", ["vit", "skipless-osa", "skipless-osa-alpha0", "vit-no-attn", "mlp", "cnn1d"])
def test_sequence_classifiers(name):
    from osa_lab.nn.models import build_classifier

    cfg = get_preset(name, input="sequence", image_size=40, patch_size=2, seed=0,
                     **({"depth": 2, "dim": 16, "heads": 2} if name not in ("mlp", "cnn1d") else {}))  # fmt: skip
    model = build_classifier(cfg)
    x = torch.randn(3, 1, 40)
    logits, hidden = model(x, return_hidden=True)
    assert logits.shape == (3, 10)
    if cfg.backbone == "transformer":
        assert cfg.tokens == 20 and hidden.blocks[0].shape == (3, 20, 16)
    with pytest.raises(OSAInputError, match=r"\(batch, 1, 40\)"):
        model(torch.randn(3, 1, 41))


def test_baselines_follow_the_mnist1d_table_sizes():
    from osa_lab.nn.models import CNN1dClassifier, MLPClassifier, build_classifier

    mlp = build_classifier(get_preset("mlp", input="sequence", image_size=40, patch_size=2))
    assert isinstance(mlp, MLPClassifier)
    assert [m.out_features for m in mlp.net if isinstance(m, torch.nn.Linear)] == [100, 100, 10]
    cnn = build_classifier(get_preset("cnn1d", input="sequence", image_size=40, patch_size=2))
    assert isinstance(cnn, CNN1dClassifier)
    convs = [m for m in cnn.features if isinstance(m, torch.nn.Conv1d)]
    assert [c.out_channels for c in convs] == [25, 25, 25] and [c.stride[0] for c in convs] == [2, 2, 2]
    with pytest.raises(ConfigurationError, match="sequence"):
        build_classifier(get_preset("cnn1d", input="patches", image_size=8, patch_size=2))
    with pytest.raises(ConfigurationError, match="build_classifier"):
        build_model(get_preset("mlp"))
