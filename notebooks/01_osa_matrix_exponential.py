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
# # 1 · OSA and the matrix exponential: accuracy and cost
#
# Orthogonal self-attention applies `A = exp(S)` with the skew-symmetric
# `S = α/√r (Q Kᵀ − K Qᵀ)` to the values (docs/design.md §1). This report compares the two ways
# osa_lab computes `A V`:
#
# * **dense** — `torch.linalg.matrix_exp` of the N×N matrix, O(N³): the reference;
# * **low-rank** — the rank-2r form `V + U F (Uᵀ V)` (Gram/Cholesky with a QR fallback),
#   O(N r²), never forming an N×N matrix (docs/design.md §2).
#
# It shows (1) their error against an independent float64 reference (`scipy.linalg.expm`)
# as N, α and the dtype vary, (2) how far the matrix each one applies is from orthogonal,
# and (3) forward time against N on log–log axes for dense OSA, low-rank OSA and softmax
# attention (`F.scaled_dot_product_attention`), with the fitted power laws, whose expected
# slopes are 3, 1 and 2; the slopes this run measured are stated beside the figure, flagged
# where the fit cannot be trusted.

# %% tags=["parameters"]
# Accuracy study: single head, unit-variance q, k (N × rank) and v (N × value_dim).
ns_accuracy: list = [16, 64, 256, 512]  # ≥ 2: sequence lengths N
alphas: list = [0.01, 0.1, 1.0, 10.0]  # ≥ 0: OSA scale α
dtypes: list = ["float64", "float32", "bfloat16"]
rank: int = 8  # ≥ 1: query/key width r
value_dim: int = 8  # ≥ 1
seeds: list = [0, 1]  # ≥ 0
orthogonality_max_n: int = 256  # ≥ 2: largest N of the explicit N × N check
# Timing study: (batch_heads, N, head_dim) float32 inputs, median of `repeat` runs.
ns_timing: list = [64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768]  # ≥ 2
dense_max_n: int = 1024  # ≥ 2
sdpa_max_n: int = 8192  # ≥ 2
batch_heads: int = 4  # ≥ 1
head_dim: int = 64  # ≥ 1
repeat: int = 5  # ≥ 1: median of this many timed runs
fit_points: int = 3  # ≥ 2: largest N used for each slope fit

# %%
from osa_lab.reporting import kernel_setup as nb

params = nb.opening("01_osa_matrix_exponential", globals())

# %%
import pandas as pd

from osa_lab.plots import expm as plots
from osa_lab.reporting import texts
from osa_lab.studies import expm_accuracy as expm_study

# %% [markdown]
# ## Error against the float64 reference
#
# One problem per (N, α, seed); its inputs are rounded to each dtype and the reference is
# computed from the rounded inputs in float64, so the numbers measure the method rather
# than the rounding of q, k, v. What the figures show depends on the method, the dtype and
# ‖S‖₂ (which grows with N and α); the table below the first figure gives the largest error per
# method and dtype in each ‖S‖₂ range of this run. What to expect from the code: float64 at
# rounding level, growing with ‖S‖₂; float32 on the low-rank path (its 2r×2r exponential runs
# in float64) growing with ‖S‖₂ (the float32 budget is 2e-6 up to ‖S‖₂ = 10 and 1e-7·‖S‖₂
# beyond); float32 on the dense path nearly flat, because past the short-Taylor range it forms
# and exponentiates S in float64; bfloat16 near 1e-3 (8 bits of mantissa).

# %%
acc = expm_study.accuracy_table(
    ns_accuracy,
    alphas,
    dtypes,
    ("dense", "lowrank"),
    rank=rank,
    value_dim=value_dim,
    seeds=seeds,
    orthogonality_max_n=orthogonality_max_n,
)
summary = acc.pivot_table(index=["dtype", "method"], columns="alpha", values="rel_error", aggfunc="max")
summary.columns = [f"α={a:g}" for a in summary.columns]
nb.say(texts.accuracy_text(acc))
nb.show_table(summary.reset_index(), {"dtype": "dtype", "method": "method",
                                     **{c: f"largest relative error, {c}" for c in summary.columns}})

# %%
nb.show(plots.error_vs_n(acc))

# %%
# largest relative error per method and dtype, by range of ‖S‖₂ (the statement above, measured)
_bins = pd.cut(acc["norm_s"], [0, 1, 10, 100, float("inf")], labels=["‖S‖₂ ≤ 1", "1–10", "10–100", "> 100"])
_by_norm = acc.assign(norm_range=_bins).pivot_table(index=["dtype", "method"], columns="norm_range",
                                                    values="rel_error", aggfunc="max", observed=False)
nb.show_table(_by_norm.reset_index(), {"dtype": "dtype", "method": "method",
                                       **{c: f"largest relative error, {c}" for c in _by_norm.columns}})

# %% [markdown]
# The same errors against the α axis at the largest N, and against the spectral norm of S
# for every problem; the table above gives the measured maxima per range of ‖S‖₂.

# %%
nb.show(plots.error_vs_alpha(acc))

# %%
nb.show(plots.error_vs_norm(acc))

# %% [markdown]
# ## Orthogonality of the applied matrix
#
# Applying each method to the identity gives the N×N matrix it applies; `max |AᵀA − I|`
# should sit at the dtype's rounding level. Orthogonality is what keeps the norms (and the
# Gram matrix `VᵀV`) of the values exactly, the property the rank-collapse analysis relies on.

# %%
orth = acc.dropna(subset=["orth_error"]).pivot_table(
    index=["dtype", "method"], columns="n", values="orth_error", aggfunc="max"
)
orth.columns = [f"N={n}" for n in orth.columns]
nb.show_table(orth.reset_index(), {"dtype": "dtype", "method": "method",
                                  **{c: f"orthogonality error, {c}" for c in orth.columns}})

# %%
nb.show(plots.orthogonality_vs_n(acc))

# %% [markdown]
# ## Time against N
#
# Forward time (median of `repeat` runs) on this machine, log–log. Dense OSA is O(N³), softmax
# attention O(N² d) and low-rank OSA O(N r (r + d)) plus O(r³) per head, which dominates at
# small N — so each slope is fitted on that method's largest N only.

# %%
timings = expm_study.timing_table(
    ns_timing,
    max_n={"dense": dense_max_n, "sdpa": sdpa_max_n},
    batch_heads=batch_heads,
    head_dim=head_dim,
    repeat=repeat,
)
slopes = expm_study.fit_slopes(timings, points=fit_points)
nb.say(texts.timing_text(slopes, timings))

# %%
nb.show(plots.time_vs_n(timings, slopes))

# %%
wide = timings.pivot_table(index="n", columns="method", values="seconds")
if {"lowrank", "sdpa"} <= set(wide.columns):
    wide["sdpa / lowrank"] = wide["sdpa"] / wide["lowrank"]
if {"lowrank", "dense"} <= set(wide.columns):
    wide["dense / lowrank"] = wide["dense"] / wide["lowrank"]
nb.show_table(wide.reset_index(), {"n": "N (tokens)", **{c: (f"{c} (×)" if "/" in str(c) else f"{c} (s)")
                                                        for c in wide.columns}})

# %% [markdown]
# **Reading the figures.** What this run found, from its tables:

# %%
nb.finding(texts.timing_finding(slopes))
nb.say(texts.speedup_text(timings, slopes))

# %%
nb.closing()
