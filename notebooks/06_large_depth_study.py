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
# # 6 · The large-depth study: do shaped skipless networks train as easily as a ViT?
#
# Trainability apart from generalisation: the final training loss per preset and depth on
# MNIST-1D with 45,000 training examples (50,000 less the validation split), each preset tuned
# at the full budget and trained over several seeds; generated from the committed results (method
# and detail below). A study that is not finished says PARTIAL here, in every table and above
# every section of figures.

# %% tags=["parameters"]
experiment: str = "experiments/mnist1d_large_depth.yaml"
profile: str = "full"  # "full" or "quick"
results_dir: str = "docs/results/mnist1d-large-depth"

# %%
from osa_lab.reporting import kernel_setup as nb

params = nb.opening("06_large_depth_study", globals())

# %%
from osa_lab.plots import study as plots
from osa_lab.reporting import depth_answer, trainability_answer

tables = depth_answer.load_study(experiment, profile, results_dir)
# said above each section of figures while the study is unfinished
partial = trainability_answer.partial_note(tables["summary"]) if tables is not None else ""

# %%
if tables is None:
    nb.finding(f"No study results under {results_dir} yet.")
    nb.say(f"No study results under `{results_dir}` yet: run `osa-lab train --experiment {experiment}` first.")
else:
    nb.finding(trainability_answer.progress_line(tables["summary"], tables["claims"]))
    nb.show_table(trainability_answer.trainability_table(trainability_answer.trainability_data(tables["summary"])),
                  columns=None)
    nb.say("Table: median final training loss of the final runs that did not diverge, with the seeds finished of "
           "those planned and the runs that failed; a cell without final runs says how far its tuning got, and "
           "a cell where no tuning setting trained on every tuning seed says its final seeds ran at an untuned "
           "setting, the one with the fewest tuning failures. "
           + (depth_answer.failures_text(tables["runs"]) if len(tables["runs"]) else "No final run has finished yet."))

# %% [markdown]
# ## The claims
#
# Stated in the experiment file before any final run: paired per-seed differences, the claim's
# preset minus the other, on the final training loss (in decades) first and test accuracy second;
# Holm's correction over every claim tested; a claim is tested once both its cells are complete.

# %%
if tables is not None:
    nb.say(depth_answer.claims_text(tables["claims"]) if len(tables["claims"])
           else "No claim has two paired final seeds yet: nothing is tested.")

# %% [markdown]
# ## Where each network loses its conditioning
#
# κ of each sub-block (embedding, attention, MLP, readout; median over layers) at initialisation
# and after training, from exact float64 Jacobians of every final run.

# %%
if partial:
    nb.say(partial)
if tables is not None and len(tables["runs"]):
    for depth in sorted(tables["runs"]["depth"].unique()):
        for when in ("init", "trained"):
            if len(plots.sub_block_kappa_data(tables["runs"], depth, when)):
                nb.show(plots.sub_block_kappa(tables["runs"], depth, when))
elif tables is not None:
    nb.say("No final run yet: no κ per sub-block to show.")

# %% [markdown]
# The same κ layer by layer, in the order a token meets the sub-blocks (embedding, attention 1,
# MLP 1, …, readout): where along the network the conditioning is lost.

# %%
if partial:
    nb.say(partial)
if tables is not None and len(tables["sub_block_layers"]):
    layers = tables["sub_block_layers"]
    for depth in sorted(layers["depth"].unique()):
        for when in ("init", "trained"):
            if len(plots.sub_block_layer_data(layers, depth, when)):
                nb.show(plots.sub_block_kappa_by_layer(layers, depth, when))
elif tables is not None:
    nb.say("No final run records κ per sub-block and layer yet (runs recorded before the study kept it have "
           "only the medians above).")

# %% [markdown]
# ## Training loss per depth
#
# Training loss against step, mean and min–max band over the final seeds.

# %%
if partial:
    nb.say(partial)
if tables is not None and len(tables["curves"]):
    for depth in sorted(tables["curves"]["depth"].unique()):
        nb.show(plots.loss_curves(tables["curves"], depth))

# %% [markdown]
# ## Tuning: validation accuracy against learning rate
#
# Each preset's search at each depth (mean and range over the tuning seeds), one line per
# α-lr multiplier and warm-up tried; the grid was extended by ×3 steps wherever the best value
# sat at its edge (column `extended` of `tuning.csv`).

# %%
if partial:
    nb.say(partial)
if tables is not None and len(tables["tuning"]):
    for depth in sorted(tables["tuning"]["depth"].unique()):
        nb.show(plots.tuning_curves(tables["tuning"], depth))

# %% [markdown]
# ## Tuning: κ after training against learning rate
#
# κ of the attention and the MLP sub-blocks (median over layers) of every tuning run after
# training, against its learning rate: the median and range over the tuning seeds, one line per
# setting. Only runs that did not fail count: a run that diverged, collapsed to chance or never
# recovered from a loss jump is left out.

# %%
if partial:
    nb.say(partial)
if tables is not None and len(tables["tuning"]):
    drawn = 0
    for depth in sorted(tables["tuning"]["depth"].unique()):
        for part in ("attention", "mlp"):
            if len(plots.tuning_kappa_data(tables["tuning"], depth, part)):
                nb.show(plots.tuning_kappa(tables["tuning"], depth, part))
                drawn += 1
    if not drawn:
        nb.say("No tuning run records κ after training yet.")

# %% [markdown]
# ## Method and the full verdict
#
# The study of `experiments/mnist1d_large_depth.yaml` (`osa-lab train --experiment …`,
# docs/training.md), as written to `verdict.md`: the budget, every cell, every claim.

# %%
if tables is not None:  # its headings below this section's
    nb.say("\n".join("###" + line if line.startswith("#") else line for line in tables["verdict"].splitlines()))

# %%
nb.closing()
