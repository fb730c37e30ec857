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
# # 5 · The depth study: ease of training across depth, and what κ at initialisation predicts
#
# Zhang & Martens (arXiv 2602.05996) claim that skipless, normless transformers with
# orthogonal self-attention train as easily as a skip-connected ViT, because OSA keeps signal
# propagation (rank, Jacobian conditioning) healthy. This report draws the study of
# `experiments/mnist1d_depth.yaml` (`osa-lab train --experiment …`, docs/training.md) **from its
# committed results alone**: every preset × depth tuned on validation data by a grid that
# brackets its optimum, trained on the same budget for every preset over several seeds, with
# the end-to-end Jacobian κ measured at initialisation and after training.
#
# Every number and sentence below is generated from the results folder; a study that is not
# finished says so in the verdict.

# %% tags=["parameters"]
experiment: str = "experiments/mnist1d_depth.yaml"
profile: str = "full"  # "full" or "quick"
results_dir: str = "docs/results/mnist1d-depth"

# %%
from osa_lab.reporting import kernel_setup as nb

params = nb.opening("05_depth_study", globals())

# %%
from pathlib import Path

from IPython.display import display

from osa_lab.plots import study as plots
from osa_lab.studies.depth_study import load_spec, summarise
from osa_lab.studies.depth_study.report import kappa_correlation_sentence


def in_repository(path: str) -> Path:
    """``path`` as given, or relative to the repository when papermill runs elsewhere."""
    p = Path(path)
    return p if p.is_absolute() or p.exists() else Path(nb.__file__).resolve().parents[2] / path


spec = load_spec(in_repository(experiment), profile)
results = in_repository(results_dir)
tables = summarise(results, spec, write=False) if (results / "experiment.yaml").exists() else None

# %% [markdown]
# ## Verdict
#
# Generated from the tables (baselines' gate, paired per-seed differences, TOST for
# "comparable", Holm's correction over every claim tested).

# %%
if tables is None:
    nb.finding(f"No study results under {results_dir} yet.")
    nb.say(f"No study results under `{results_dir}` yet: run `osa-lab train --experiment {experiment}` first.")
else:
    nb.finding(tables["finding"])
    nb.say(tables["verdict"])

# %% [markdown]
# ## Test accuracy against depth
#
# Mean test accuracy of the final checkpoint over the final seeds, with its 95 % interval, per
# preset and depth (controls and baselines at depth 4 only).

# %%
if tables is not None and tables["summary"]["finished"].sum():
    nb.show(plots.accuracy_vs_depth(tables["summary"]))
    table = tables["summary"][["preset", "depth", "finished", "planned", "diverged", "lr", "alpha_lr_mult",
                               "test_accuracy_mean", "ci_low", "ci_high", "steps_to_90_median",
                               "kappa_init_median", "kappa_trained_median", "edge_after_limit"]].round(4)  # fmt: skip
    # the tuned settings to 3 significant digits (3.33e-4, not 0.0003)
    table[["lr", "alpha_lr_mult"]] = tables["summary"][["lr", "alpha_lr_mult"]].map(lambda x: f"{x:.3g}")
    display(table)

# %% [markdown]
# ## Training loss per depth
#
# The primary measure of trainability: training loss against step, mean and min–max band over
# the final seeds.

# %%
if tables is not None and len(tables["curves"]):
    nb.show(plots.loss_curves_by_depth(tables["curves"]))

# %% [markdown]
# ## Tuning: validation accuracy against learning rate
#
# Each preset's search at each depth (mean and range over the tuning seeds); the grid was
# extended by ×3 steps wherever the best value sat at its edge (column `extended` of
# `tuning.csv`).

# %%
if tables is not None and len(tables["tuning"]):
    for depth in sorted(tables["tuning"]["depth"].unique()):
        nb.show(plots.tuning_curves(tables["tuning"], depth))

# %% [markdown]
# ## Does κ at initialisation predict trainability?
#
# One point per preset × depth (colour: preset, marker: depth): median end-to-end Jacobian κ at
# initialisation against median steps to 90 % training accuracy, and against test accuracy, each
# with Spearman's rank correlation over the points (κ beyond what float64 resolves counts as tied
# at that ceiling). Runs that never reached 90 % have no point in the first figure and its
# correlation, so that one leaves out the least trainable networks.

# %%
if tables is not None and len(tables["runs"]):
    for y in ("steps_to_90", "test_accuracy"):
        if len(plots.kappa_vs_trainability_data(tables["runs"], y)):
            nb.show(plots.kappa_vs_trainability(tables["runs"], y))
        else:
            nb.say(f"No finished run has both κ at initialisation and `{y}` (e.g. none reached 90 % training "
                   "accuracy): no figure.")
    for y, what in (("steps_to_90", "median steps to 90 % training accuracy"), ("test_accuracy", "median test accuracy")):
        data = plots.kappa_vs_trainability_data(tables["runs"], y)
        nb.say(kappa_correlation_sentence(data["kappa_init"], data["value"], what))

# %%
nb.closing()
