"""``osa-lab train``: the command line of training, comparison and tuning."""

from __future__ import annotations

import argparse
import dataclasses
import shutil
import sys
from pathlib import Path

import pandas as pd
import torch

from osa_lab.errors import (
    ConfigurationError,
    RunLockedError,
    UserError,
    unknown_name,
)
from osa_lab.studies.data import (
    DATA_DIR_DATASETS,
    DATASETS,
)
from osa_lab.studies.grid import (
    add_grid_arguments,
    options_from_args,
    shared_cluster,
)
from osa_lab.studies.training.checkpoints import CHECKPOINT_NAME
from osa_lab.studies.training.compare import compare, format_summary
from osa_lab.studies.training.config import (
    CONTROLS,
    DEFAULT_COMPARISON,
    TrainConfig,
    comparison_presets,
    resolve_device,
)
from osa_lab.studies.training.lock import RunLock, check_output_dir
from osa_lab.studies.training.tune import TuneGrid, tune


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``osa-lab train``, in the help's groups: the named study, the presets and their
    tuning, the data, the optimisation, the model, and the run's output; then the Dask grid's."""
    d = TrainConfig()  # the defaults every group shows
    _add_study_arguments(parser.add_argument_group("named study"))
    _add_preset_arguments(parser.add_argument_group("presets, comparison and tuning"), d)
    _add_data_arguments(parser.add_argument_group("data"), d)
    _add_optimisation_arguments(parser.add_argument_group("optimisation"), d)
    _add_model_arguments(parser.add_argument_group("model"))
    _add_run_arguments(parser.add_argument_group("output and run"), d)
    add_grid_arguments(parser)  # runs of --compare/--tune/several presets go to a Dask grid


def _add_study_arguments(group: argparse._ArgumentGroup) -> None:
    group.add_argument(
        "--experiment",
        default=None,
        metavar="FILE",
        help="run (or resume) a named study from an experiment file, e.g. experiments/mnist1d_depth.yaml: "
        "tuning that brackets each optimum, the final seeds, and tables + verdict in the file's results folder "
        "(--output overrides it); the other training options are ignored",
    )
    group.add_argument("--quick", action="store_true",
                       help="--experiment: use the file's `quick` profile (a few minutes; what CI runs)")  # fmt: skip
    group.add_argument("--summary-only", action="store_true",
                       help="--experiment: regenerate the tables and verdict from the results folder, train nothing")  # fmt: skip
    group.add_argument("--checkpoints", default=None, metavar="DIR",
                       help="--experiment: the checkpoint folder (default runs/experiments/<name>-<profile>-checkpoints); "
                       "a study resumes from it, and one study at a time owns it")  # fmt: skip
    group.add_argument("--allow-large", action="store_true",
                       help="--experiment: run a study beyond the sanity bounds of the experiment file "
                       "(steps, depth, width, seeds, runs; docs/training.md lists them)")  # fmt: skip


def _add_preset_arguments(group: argparse._ArgumentGroup, d: TrainConfig) -> None:
    g = TuneGrid()
    group.add_argument("--preset", nargs="+", default=[d.preset], metavar="NAME",
                       help=f"model preset(s) (default {d.preset}); several presets are compared")  # fmt: skip
    group.add_argument(
        "--compare",
        action="store_true",
        help=f"compare the presets {', '.join(DEFAULT_COMPARISON)} and the controls {', '.join(CONTROLS)} "
        "(+ cnn1d on MNIST-1D) (overrides --preset)",
    )
    group.add_argument(
        "--tune",
        action="store_true",
        help="choose each preset's lr (and OSA's α-lr multiplier) on validation accuracy from the grids "
        "below, then train --seeds with the chosen setting and report test accuracy, paired differences "
        "against skipless-osa and a verdict (osa_lab.studies.training.tune)",
    )
    group.add_argument("--lr-grid", type=float, nargs="+", default=list(g.lrs), metavar="LR",
                       help=f"--tune: learning rates tried for every preset (default {list(g.lrs)})")  # fmt: skip
    group.add_argument("--alpha-lr-mult-grid", type=float, nargs="+", default=list(g.alpha_lr_mults), metavar="M",
                       help=f"--tune: α-lr multipliers for learned-α OSA presets (default {list(g.alpha_lr_mults)})")  # fmt: skip
    group.add_argument("--tune-seeds", type=int, nargs="+", default=list(g.seeds), metavar="SEED",
                       help=f"--tune: seeds of the tuning runs (default {list(g.seeds)}, disjoint from --seeds)")  # fmt: skip
    group.add_argument("--seeds", type=int, nargs="+", default=[0],
                       help="seeds (default 0); from six seeds up, the seeds of a preset train together as one seed group")  # fmt: skip
    group.add_argument(
        "--group-size",
        type=int,
        default=None,
        metavar="G",
        help="train the seeds of a preset in groups of G (default: all seeds in one group from six seeds up, each "
        "seed alone below, as smaller groups measured no cheaper per seed than solo runs; 1: each seed alone). "
        "Each member trains exactly as a solo run of its seed, in one batched forward and backward",
    )


def _add_data_arguments(group: argparse._ArgumentGroup, d: TrainConfig) -> None:
    group.add_argument("--data", default=d.data, help=f"data set: {', '.join(DATASETS)} (default {d.data})")
    group.add_argument("--data-dir", default=None,
                       help="--data mnist: directory with the MNIST IDX files or mnist.npz; MNIST-1D: its cache folder")  # fmt: skip
    group.add_argument("--train-limit", type=int, default=None, help="MNIST: use a fixed stratified subset")
    group.add_argument(
        "--val-fraction",
        type=float,
        default=d.val_fraction,
        help="hold out this fraction of the training data as a validation split (default 0: none)",
    )


def _add_optimisation_arguments(group: argparse._ArgumentGroup, d: TrainConfig) -> None:
    group.add_argument("--epochs", type=int, default=d.epochs)
    group.add_argument("--batch-size", type=int, default=d.batch_size)
    group.add_argument("--lr", type=float, default=d.lr, help="peak AdamW learning rate")
    group.add_argument("--weight-decay", type=float, default=d.weight_decay)
    group.add_argument("--warmup-fraction", type=float, default=d.warmup_fraction)
    group.add_argument("--grad-clip", type=float, default=d.grad_clip, help="global norm clip (0: off)")
    group.add_argument(
        "--alpha-lr-mult",
        type=float,
        default=d.alpha_lr_mult,
        help="learning-rate multiplier of OSA's α (its own AdamW group, no weight decay; default 1)",
    )


def _add_model_arguments(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--patch-size", type=int, default=None, help="default: 2 for 8×8, 4 for 28×28")
    for name in ("depth", "dim", "heads"):
        group.add_argument(f"--{name}", type=int, default=None, help=f"override the preset's {name}")
    group.add_argument(
        "--osa-method",
        default=None,
        help="OSA computation method of the model (osa_lab.ops.functional.OSA_METHODS; default: the preset's 'auto')",
    )


def _add_run_arguments(group: argparse._ArgumentGroup, d: TrainConfig) -> None:
    group.add_argument("--diag-every", type=int, default=d.diag_every, help="hidden-state diagnostics every K steps")
    group.add_argument("--diag-samples", type=int, default=d.diag_samples)
    group.add_argument("--output", default="runs/train", help="output directory (default runs/train)")
    group.add_argument("--no-resume", action="store_true", help="start over even if checkpoints exist")
    group.add_argument("--device", default="cpu")
    group.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    group.add_argument("--quiet", action="store_true", help="no progress bars")


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    """The :class:`TrainConfig` (preset and seed filled in later) that the CLI arguments describe."""
    model = {k: getattr(args, k) for k in ("depth", "dim", "heads") if getattr(args, k) is not None}
    if args.osa_method:
        from osa_lab.ops.functional import OSA_METHODS

        if args.osa_method not in (*OSA_METHODS, "auto"):
            raise unknown_name("OSA method", args.osa_method, [*OSA_METHODS, "auto"])
        model["osa_method"] = args.osa_method
    data_options = {}
    if args.data_dir is not None and args.data not in DATA_DIR_DATASETS:
        raise ConfigurationError(
            f"--data-dir is used only by --data {', '.join(DATA_DIR_DATASETS)}; --data {args.data} needs no "
            "directory: drop --data-dir"
        )
    if args.train_limit is not None:
        if args.data != "mnist":
            raise ConfigurationError(f"--train-limit applies to --data mnist only, not {args.data!r}")
        if args.train_limit < 1:
            raise ConfigurationError(f"--train-limit must be a positive number of images, got {args.train_limit}")
        data_options["train_limit"] = args.train_limit
    if args.grad_clip is not None and args.grad_clip < 0:
        raise ConfigurationError(
            f"--grad-clip must be ≥ 0 (0: off), got {args.grad_clip:g}; a negative clip flips the gradient "
            "into gradient ascent"
        )
    if args.diag_samples is not None and args.diag_samples < 1:
        raise ConfigurationError(f"--diag-samples must be a positive number of images, got {args.diag_samples}")
    if args.group_size is not None and args.group_size < 1:
        raise ConfigurationError(
            f"--group-size must be a positive number of seeds (1: each seed alone), got {args.group_size}"
        )
    bad_seeds = [s for s in args.seeds if s < 0]
    if bad_seeds:
        raise ConfigurationError(f"--seeds must be ints ≥ 0, got {bad_seeds}")
    if len(set(args.seeds)) != len(args.seeds):
        raise ConfigurationError(f"--seeds has repeated values {args.seeds}; give each seed once")
    for name in ("depth", "dim", "heads"):
        val = getattr(args, name)
        if val is not None and val < 1:
            raise ConfigurationError(f"--{name} must be a positive int, got {val}")
    return TrainConfig(
        data=args.data,
        epochs=args.epochs,
        batch_size=args.batch_size,
        lr=args.lr,
        weight_decay=args.weight_decay,
        warmup_fraction=args.warmup_fraction,
        grad_clip=args.grad_clip or None,
        alpha_lr_mult=args.alpha_lr_mult,
        val_fraction=args.val_fraction,
        diag_every=args.diag_every,
        diag_samples=args.diag_samples,
        patch_size=args.patch_size,
        model=model,
        data_options=data_options,
    )


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split())


def _holds_results(folder: Path) -> bool:
    """True when a run under ``folder`` got as far as writing metrics or a checkpoint (never delete those)."""
    return any(folder.rglob("metrics.csv")) or any(folder.rglob(CHECKPOINT_NAME))


def run(args: argparse.Namespace) -> int:
    """``osa-lab train``: train presets × seeds, write CSVs to ``--output``, print the summary.

    A user error (bad argument, missing or corrupt data, unusable device or output folder, a
    folder owned by another run) prints one line naming the problem and the fix and returns 2;
    an output folder this call created is removed again if no run wrote anything into it yet
    (what a finished run wrote is never deleted).
    """
    if args.experiment is not None:
        return run_experiment(args)
    presets = comparison_presets(args.data) if args.compare else list(args.preset)
    out = Path(args.output)
    existed = out.exists()
    try:
        if args.threads is not None:
            if args.threads < 1:
                raise ConfigurationError(f"--threads must be a positive int, got {args.threads}")
            torch.set_num_threads(args.threads)
        resolve_device(args.device)
        base = config_from_args(args)
        check_output_dir(out)
        grid_options = options_from_args(args, progress=not args.quiet)
        if args.threads is not None:  # --threads: torch threads of each run (also on grid workers)
            grid_options = dataclasses.replace(grid_options, threads_per_worker=args.threads)
        if args.tune:
            grid = TuneGrid(tuple(args.lr_grid), tuple(args.alpha_lr_mult_grid), tuple(args.tune_seeds))
            with shared_cluster(grid_options) as shared:  # one cluster start for all of tune's grids
                result = tune(presets, args.seeds, base, args.output, grid=grid, resume=not args.no_resume,
                              device=args.device, progress=not args.quiet, data_dir=args.data_dir,
                              grid_options=shared, group_size=args.group_size)  # fmt: skip
            with pd.option_context("display.width", 200, "display.max_columns", 20):
                print(result.chosen.to_string(index=False))
                print(format_summary(result.summary).to_string(index=False))
            print(result.verdict)
            print(f"wrote tuning.csv, chosen.csv, metrics.csv, summary.csv, paired.csv, verdict.md, summary.png "
                  f"under {out}/ in {result.wall_time_s:.0f} s")  # fmt: skip
            return 0
        metrics, summary = compare(
            presets,
            args.seeds,
            base,
            args.output,
            resume=not args.no_resume,
            device=args.device,
            progress=not args.quiet,
            data_dir=args.data_dir,
            grid_options=grid_options,
            group_size=args.group_size,
        )
    except UserError as err:
        if not existed and out.is_dir() and not isinstance(err, RunLockedError) and not _holds_results(out):
            shutil.rmtree(out, ignore_errors=True)
        print(f"osa-lab train: error: {_one_line(err)}", file=sys.stderr)
        return 2
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(format_summary(summary).to_string(index=False))
    out = Path(args.output)
    print(f"wrote {out / 'metrics.csv'}, {out / 'summary.csv'} and per-run checkpoints under {out}/")
    runs = pd.read_csv(out / "runs.csv")
    failed = runs[runs["status"] != "ok"]
    for _, r in failed.iterrows():
        print(f"osa-lab train: {r['preset']} seed {r['seed']} {r['status']}: {r['error']}", file=sys.stderr)
    return 1 if len(failed) else 0


def run_experiment(args: argparse.Namespace) -> int:
    """``osa-lab train --experiment FILE [--quick] [--summary-only] [--allow-large]``: the named study
    (osa_lab.studies.depth_study).

    Every setting of the file is checked before any work (one line and exit status 2 for a bad
    one); the results and checkpoint folders are printed before training starts. Exit status 1
    when grid tasks failed (the verdict is written all the same; a rerun retries them); result
    files left out of the summary are named on stderr.
    """
    from osa_lab.studies.depth_study import load_spec, run_study, summarise
    from osa_lab.studies.depth_study.runner import scratch_folder

    try:
        spec = load_spec(args.experiment, "quick" if args.quick else None, allow_large=args.allow_large)
        explicit_output = args.output != "runs/train"
        results = check_output_dir(args.output if explicit_output else spec.results)
        if args.summary_only:
            if not (results / "experiment.yaml").exists():
                raise ConfigurationError(f"{results} holds no study results (no experiment.yaml); run the study first")
            out = summarise(results, spec)
        else:
            if args.threads is not None:
                if args.threads < 1:
                    raise ConfigurationError(f"--threads must be a positive int, got {args.threads}")
                torch.set_num_threads(args.threads)
            options = options_from_args(args, progress=not args.quiet)
            scratch = check_output_dir(args.checkpoints, "--checkpoints") if args.checkpoints else scratch_folder(spec)
            print(f"osa-lab train: study {spec.name} ({spec.profile} profile, at least {spec.planned_runs()} runs): "
                  f"results under {results}/, checkpoints under {scratch}/", file=sys.stderr, flush=True)  # fmt: skip
            with RunLock(results):
                out = run_study(spec, results, scratch, options=options)
    except UserError as err:
        print(f"osa-lab train: error: {_one_line(err)}", file=sys.stderr)
        return 2
    tasks, failed = out.get("tasks", 0), out.get("failed_tasks", 0)
    if failed and failed == tasks:
        print(f"osa-lab train: every one of the {tasks} grid tasks failed; first: {out['failures'][0]}", file=sys.stderr)
    for notice in out["notices"]:
        print(f"osa-lab train: notice: {notice}", file=sys.stderr)
    print(out["verdict"])
    print(f"wrote runs.csv, curves.csv, sub_block_layers.csv, tuning.csv, summary.csv, claims.csv and verdict.md under {results}/")
    if failed:
        print(f"osa-lab train: {failed} of {tasks} grid tasks failed (their lines are above); the tables leave "
              "them out and a rerun retries them", file=sys.stderr)  # fmt: skip
        return 1
    return 0
