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
# # 3 · Jacobian conditioning: the OSA initialisation and signal propagation across depth
#
# A network trains well without skip connections only if its input–output Jacobian is
# well-conditioned at initialisation (Ji et al. 2025, *Cutting the Skip*). This report measures
# the condition number κ = σ_max/σ_min of exact Jacobians (`torch.func`, float64):
#
# 1. **One OSA layer against α, N and d.** With `A` fixed the layer's Jacobian is `W_Vᵀ ⊗ A`,
#    perfectly conditioned for orthogonal `W_V`; the dependence of `A` on `X` adds a term of
#    size about `α ‖X‖²/√r` (docs/design.md §3). The expectation: κ = 1 at α = 0, growing with α,
#    and the derived initialisation `α₀ = c √r / (√N + √d)²` keeping κ near 1 for every N and d.
# 2. **κ across depth** for skipless OSA, skipless softmax attention and a skip-connected ViT:
#    of `∂X_l/∂X_0` (end to end) and of each block alone.
# 3. **Histograms** of all singular values of the whole network's Jacobian.

# %% tags=["parameters"]
# 1. the OSA layer
alphas: list = [0.0, 0.01, 0.03, 0.1, 0.3, 1.0]  # ≥ 0: OSA scale α
alpha_tokens: int = 16  # ≥ 2
alpha_dim: int = 16  # ≥ 1
grid_tokens: list = [8, 16, 32]  # ≥ 2
grid_dims: list = [8, 16, 32]  # ≥ 1
contrast_alpha: float = 0.1  # ≥ 0
layer_seeds: int = 3  # ≥ 1
# 2.–3. networks across depth
presets: list = ["skipless-osa", "skipless-ssa", "vit"]
depth: int = 8  # ≥ 1: blocks per model
tokens: int = 16  # ≥ 2: tokens N
dim: int = 16  # ≥ 1: width d
depth_seeds: int = 2  # ≥ 1

# %%
from osa_lab.reporting import kernel_setup as nb

params = nb.opening("03_jacobian_conditioning", globals())

# %%

from osa_lab.plots import depth as plots
from osa_lab.plots.style import stacked, wide_figure
from osa_lab.reporting import texts
from osa_lab.reporting.tables import Column
from osa_lab.studies import jacobian
from osa_lab.studies import summaries as depth_facts

# %% [markdown]
# ## 1 · The OSA layer against α
#
# One OSA layer (one head, Gaussian `W_Q`, `W_K` of variance 1/d, orthogonal `W_V`, `W_O`),
# input `X ~ N(0, 1)`; the sizes and seeds are stated under the table. The last row is the derived α₀.

# %%
by_alpha = jacobian.osa_layer_conditioning(
    [*alphas, "derived"], [alpha_tokens], [alpha_dim], seeds=layer_seeds
)
nb.say(texts.osa_layer_text(by_alpha))
nb.show_table(by_alpha.groupby(["alpha_source", "alpha"])["kappa"].agg(["mean", "min", "max"]).reset_index(),
              {"alpha_source": Column("α from", "text"), "alpha": "α", "mean": Column("κ mean over seeds", "kappa"),
               "min": Column("κ min", "kappa"), "max": Column("κ max", "kappa")})

# %%
nb.show(
    plots.kappa_vs_parameter(
        by_alpha[by_alpha["alpha"] > 0].assign(size=lambda t: "N = " + t["tokens"].astype(str) + ", d = " + t["dim"].astype(str)),
        "alpha", group="size", title=f"κ of one OSA layer against α (N = {alpha_tokens}, d = {alpha_dim})",
    )
)

# %% [markdown]
# ## 2 · The OSA layer against N and d
#
# At the derived α₀ (left) against a fixed α (right): with a fixed α, the term `α ‖X‖²/√r`
# grows with N and d, because `‖X‖²` does; the derived α₀ shrinks as they grow.

# %%
grid = jacobian.osa_layer_conditioning(["derived", contrast_alpha], grid_tokens, grid_dims, seeds=layer_seeds)
grid["alpha_label"] = grid["alpha_source"].map({"derived": "derived α₀", "given": f"α = {contrast_alpha:g}"})
nb.say(texts.grid_text(grid, contrast_alpha))
_worst = grid.pivot_table(index=["alpha_label", "tokens"], columns="dim", values="kappa", aggfunc="max")
nb.show_table(_worst.reset_index(), {"alpha_label": Column("α", "text"), "tokens": "N (tokens)",
                                     **{d: Column(f"largest κ, d = {d}", "kappa") for d in _worst.columns}})

# %%
grid["width"] = "d = " + grid["dim"].astype(str)
derived = grid[grid["alpha_source"] == "derived"]
fixed = grid[grid["alpha_source"] == "given"]
nb.show(
    stacked([
        plots.kappa_vs_parameter(derived, "tokens", group="width", title="κ against N at the derived α₀"),
        plots.kappa_vs_parameter(fixed, "tokens", group="width", title=f"κ against N at α = {contrast_alpha:g}"),
    ])
)

# %% [markdown]
# ## 3 · κ across depth
#
# κ(∂X_l/∂X_0) end to end and κ of each block alone, per preset. κ at or above 1/ε ≈ 4.5e15
# exceeds what float64 resolves (σ_min is rounding noise there): such a value is reported as
# "numerically singular" (column `beyond_float64` counts the seeds), never as a figure, and is
# drawn at that ceiling with a ✕.

# %%
nb.say(texts.depth_settings_text(presets, depth, tokens, dim, depth_seeds))
kappa, sigmas = depth_facts.jacobian_sweep(presets, depth, tokens, dim, depth_seeds)
kappa_summary = depth_facts.kappa_table(kappa)
nb.say(texts.kappa_depth_text(kappa_summary))
nb.show_table(kappa_summary)

# %%
nb.show(wide_figure(plots.kappa_vs_depth(kappa, scope="end_to_end")))

# %%
nb.show(wide_figure(plots.kappa_vs_depth(kappa, scope="layer")))

# %% [markdown]
# ## 4 · Singular values of the whole network's Jacobian
#
# All `N·d` singular values of `∂X_L/∂X_0` (seed 0), log scale: a narrow histogram is a
# well-conditioned network; a spread over many decades is an ill-conditioned one.

# %%
nb.show(wide_figure(plots.jacobian_histogram(sigmas)))

# %%
_sig = sigmas.groupby("preset")["sigma"].describe(percentiles=[0.01, 0.5, 0.99]).reset_index()
nb.show_table(_sig, {"preset": Column("preset", "text"), "count": "singular values", "min": "σ min", "1%": "σ 1st percentile",
                     "50%": "σ median", "99%": "σ 99th percentile", "max": "σ max"})

# %% [markdown]
# **Reading the figures.** What this run found, from its own tables (sections 1 and 3):

# %%
nb.finding(texts.kappa_finding(by_alpha, kappa_summary))

# %% [markdown]
# What it does not measure: *why*. That the OSA attention matrix is orthogonal is checked in
# notebook 01; that softmax averaging collapses rank across depth is measured in notebook 02;
# the link from either to κ is the paper's argument, not shown here.

# %%
nb.closing()
