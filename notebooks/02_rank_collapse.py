# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 2 · Rank collapse across depth: OSA against softmax attention
#
# Random Gaussian tokens `X₀ ∈ R^{N×d}` go through freshly initialised networks (no training)
# and every hidden state `X_l` is scored with the metrics of docs/design.md §4: relative residual
# (Dong et al. 2021), token cosine (Noci et al. 2022), stable rank, effective rank (Roy &
# Vetterli 2007) and condition number (Ji et al. 2025), plus the full singular-value spectrum.
#
# The presets compare softmax self-attention (SSA) with orthogonal self-attention (OSA),
# with and without skip connections and LayerNorm: `vit` (skip + LayerNorm + SSA), `skipless-ssa`,
# `skipless-osa`, the attention-only stacks `pure-ssa` and `pure-osa`, and skipless SSA with the
# *Cutting the Skip* and *Value-SkipInit* initialisations.
#
# The literature's expectation: a pure SSA stack collapses — relative residual and effective
# rank fall towards their rank-one values within a few layers (doubly exponentially, Dong et
# al.) — while skips keep `vit` away from collapse, and a pure OSA stack (one head) keeps
# **every** singular value of its input. What this run found is stated under the headline
# tables, from them. Curves are the mean over seeds, bands the min–max range.

# %% tags=["parameters"]
presets: list = [
    "vit",
    "skipless-ssa",
    "skipless-osa",
    "pure-ssa",
    "pure-osa",
    "ssa-cutting-skip",
    "ssa-value-skipinit",
]
depth: int = 24  # ≥ 1: blocks per model
tokens: int = 64  # ≥ 2: tokens N
dim: int = 64  # ≥ 1: width d (divisible by each preset's heads)
seeds: int = 3  # ≥ 1
cache_dir: str = ""

# %%
from osa_lab.reporting import kernel_setup as nb

params = nb.opening("02_rank_collapse", globals())

# %%
import pandas as pd

from osa_lab.nn.presets import describe
from osa_lab.plots import depth as plots
from osa_lab.plots.style import wide_figure
from osa_lab.reporting import texts
from osa_lab.reporting.tables import Column
from osa_lab.studies import depth as analysis
from osa_lab.studies import summaries as depth_facts
from osa_lab.studies.metrics import METRIC_DESCRIPTIONS, METRICS

# %% [markdown]
# ## The presets

# %%
nb.show_table(pd.DataFrame({"preset": presets, "description": [describe(p) for p in presets]}),
              {"preset": Column("preset", "text"), "description": Column("what it is", "text")})

# %% [markdown]
# ## The sweep
#
# One model per preset and seed at the given depth (weights and input tokens seeded; the
# models run in float64). Layer 0 is the input; layer l is the output of block l.

# %%
result = analysis.sweep(
    presets,
    [depth],
    tokens=tokens,
    dims=dim,
    seeds=seeds,
    site="block",
    cache_dir=cache_dir or None,
    progress=False,
)
metrics, spectra = result.metrics, result.spectra
nb.say(f"Swept {texts.sweep_settings(presets, depth, tokens, dim, seeds)}: {len(metrics)} metric rows, "
       f"{len(spectra)} spectrum rows.")

# %% [markdown]
# ## Headline numbers
#
# Relative residual at the last layer against the input (mean over seeds): a ratio far below
# 1 is rank collapse. The second table gives the largest change of any singular value
# between input and output, relative to `σ₁(X₀)`. Below them, per preset, what this run measured.

# %%
nb.show_table(depth_facts.collapse_table(metrics),
              {"preset": Column("preset", "text"), "depth": "depth", "input": "relative residual, input",
               "last": "relative residual, last layer", "ratio": "last / input"})

# %%
drift = depth_facts.spectrum_drift(spectra)
nb.show_table(drift)

# %%
nb.say(texts.rank_collapse_text(metrics, drift))

# %% [markdown]
# ## Every metric against depth
#
# The condition number of a collapsed hidden state is not resolved in float64 (its smallest
# singular value is rounding noise), so values above 1/ε ≈ 4.5e15 are drawn at that cap.

# %%
shown = depth_facts.cap_condition_numbers(metrics)
hidden = texts.hidden_curves_text(metrics, METRICS)
if hidden:
    nb.say(hidden)
for metric in METRICS:
    nb.say(f"**{metric.replace('_', ' ')}**: " + METRIC_DESCRIPTIONS.get(metric, "").replace("_", "\\_"))
    nb.show(wide_figure(plots.metric_vs_depth(shown, metric)))

# %% [markdown]
# ## Singular-value spectra across depth
#
# Each panel is one preset: layer on one axis, the normalised index `i/k` of the singular value
# on the other, colour `σ_i/σ₁` on a log scale shared by all panels. A collapsing network turns
# dark everywhere but the first index; a network that keeps its spectrum looks the same at
# every layer.

# %%
nb.show(plots.spectra_heatmaps(spectra).cols(4).opts(hspace=0.7, vspace=0.35, backend="matplotlib"))

# %%
nb.show(plots.spectra_lines(spectra).cols(2).opts(hspace=0.5, vspace=0.35, backend="matplotlib"))

# %% [markdown]
# **Reading the figures.** Rank collapse reads as token cosine → 1, relative residual → 0 and
# stable and effective rank → 1 across depth, and as the spectra's σᵢ/σ₁ beyond the first
# falling towards 0. What this run found, per preset, is listed under the headline tables; in one line:

# %%
nb.finding(texts.collapse_finding(metrics))

# %% [markdown]
# An OSA layer's attention matrix is orthogonal (measured in notebook 01), so it is an isometry
# of the tokens; in `skipless-osa` the MLPs, not the attention, change the spectrum. Why softmax
# stacks collapse (products of row-stochastic averaging matrices) is the literature's account
# (Dong et al., 2021), not something this notebook measures.

# %%
nb.closing()
