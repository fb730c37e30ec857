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
# # 5 · The depth study: does skipless OSA train as easily as a ViT as depth grows?
#
# Test accuracy (%) per preset and depth on MNIST-1D, each preset tuned and trained on the same
# budget over several seeds; generated from the committed results (method and detail below).

# %% tags=["parameters"]
experiment: str = "experiments/mnist1d_depth.yaml"
profile: str = "full"  # "full" or "quick"
results_dir: str = "docs/results/mnist1d-depth"

# %%
from osa_lab.reporting import kernel_setup as nb

params = nb.opening("05_depth_study", globals())

# %%
from osa_lab.plots import study as plots
from osa_lab.reporting import depth_answer
from osa_lab.studies.depth_study.report import kappa_correlation_sentence

tables = depth_answer.load_study(experiment, profile, results_dir)

# %%
if tables is None:
    nb.finding(f"No study results under {results_dir} yet.")
    nb.say(f"No study results under `{results_dir}` yet: run `osa-lab train --experiment {experiment}` first.")
else:
    answer = depth_answer.answer_data(tables["summary"], tables["runs"])
    nb.finding(depth_answer.answer_finding(answer))
    nb.show_table(depth_answer.answer_table(answer), columns=None)

# %%
if tables is not None and tables["summary"]["finished"].sum():
    nb.show(plots.accuracy_vs_depth(tables["summary"], tables["runs"], chance=10.0))
    nb.say("Table: mean test accuracy of the final checkpoint over the final seeds with its 95 % t-interval"
           + (" (‡: interval cut at 0 or 100 %; the seeds spread too widely for a t-interval)"
              if answer["ci_high"].gt(1).any() or answer["ci_low"].lt(0).any() else "")
           + "; controls and baselines at depth 4 only. Figure: the same means (lines) and every seed's test "
           "accuracy (points; dotted: chance, 10 %). " + depth_answer.failures_text(tables["runs"]))

# %% [markdown]
# ## The claims
#
# Paired per-seed differences, skipless OSA minus the other preset; TOST for "comparable",
# Holm's correction over every claim tested; a claim is tested once both its cells are complete.

# %%
if tables is not None and len(tables["claims"]):
    nb.say(depth_answer.claims_text(tables["claims"]))

# %% [markdown]
# ## Method and detail
#
# This report draws the study of `experiments/mnist1d_depth.yaml` (`osa-lab train --experiment …`,
# docs/training.md) from its committed results: every preset × depth tuned on validation data by
# a grid that brackets its optimum, trained on the same budget for every preset over several
# seeds, with the end-to-end Jacobian κ measured at initialisation and after training
# (κ beyond what float64 resolves, ≥ 4.5e15, is shown as "> 4.5e15", never as a number).

# %%
if tables is not None and tables["summary"]["finished"].sum():
    cols = {c: v for c, v in depth_answer.DETAIL_COLUMNS.items() if c in tables["summary"]}
    nb.show_table(tables["summary"], cols)

# %% [markdown]
# ### The full verdict
#
# As written to `verdict.md` by `osa-lab train --experiment … --summary-only` (baselines' gate, every cell, every claim).

# %%
if tables is not None:  # its headings below this section's
    nb.say("\n".join("###" + line if line.startswith("#") else line for line in tables["verdict"].splitlines()))

# %% [markdown]
# ## Training loss per depth
#
# The primary measure of trainability: training loss against step, mean and min–max band over
# the final seeds.

# %%
if tables is not None and len(tables["curves"]):
    for depth in sorted(tables["curves"]["depth"].unique()):
        nb.show(plots.loss_curves(tables["curves"], depth))

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
# with Spearman's rank correlation over the points (κ beyond what float64 resolves, drawn as ✕ at
# that ceiling, counts as tied there). Runs that never reached 90 % have no point in the first figure and its
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
