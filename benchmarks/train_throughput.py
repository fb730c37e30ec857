"""Training-step throughput: skipless OSA against a skip-connected ViT of the same size (CPU).

Targets (``TARGETS``): one skipless-OSA training step costs at most 1.35× a ``vit`` step of the
same depth, width, heads and MLP at N = 49 (MNIST patches), 1.2× at N = 20 (MNIST-1D) and 1.5×
at N = 16 (digits). A "step" is what :func:`osa_lab.studies.training.train` does per batch:
forward, cross-entropy, backward, gradient clip and an AdamW update.

Both models (and ``skipless-ssa`` for reference, and OSA with each ``--osa-methods`` entry of
:data:`osa_lab.ops.functional.OSA_METHODS`) are timed side by side in one process, interleaved
in rounds (one call of every configuration per round), median
of ``--repeat`` rounds of wall time and of process CPU time. Times depend on the machine's
load; the ratio columns are what to read, and on a loaded machine ``cpu_ratio_to_vit`` (CPU
time excludes the time the scheduler gives other processes) is the steadier one.
``minor_faults_per_step`` (median of the rounds) counts the step's first touches of memory
freshly mapped from the kernel, each a trip into it (``getrusage``).

    .venv/bin/python benchmarks/train_throughput.py                       # digits + MNIST sizes
    .venv/bin/python benchmarks/train_throughput.py --threads 2 --repeat 10

Writes a table to stdout and ``bench_results/train_throughput.csv`` (with provenance columns).

Between processes the ratios move more than within one: on the project's 2-core VM four quiet
processes of the same code gave 1.31–1.51 at N = 49 (BENCHMARKS.md). ``--processes K`` repeats
the whole measurement in K fresh Python processes, one after another, writes every process's
rows (column ``process``) and prints the median, lowest and highest CPU-time ratio per row
across them, also written to ``<out stem>_spread.csv``.

Where the time goes: the row ``skipless-osa / exp(S) skipped`` times the same network with each
OSA head's ``exp(S_h) V_h`` replaced by ``V_h`` (projections, MLP, head, optimiser unchanged), so
``osa row − skipped row`` is the cost of the exponential's forward and backward, and
``skipped row − vit row`` is what the rest of the skipless network costs against the ViT.
``--no-breakdown`` leaves it out.

Before/after of the small-N action: the row ``skipless-osa / auto (previous)``
times ``auto`` without it (``expm.qr._small_n_action(..., action=False)`` and the fused
``expm.osa_chebyshev_action`` off: short Taylor series of the N×N ``exp(S)``, then ``exp(S) V``,
S formed as ``U J Uᵀ``), side by side with
the current one under the same load. ``--no-previous`` leaves it out. The row
``skipless-osa / auto (PyTorch path)`` runs ``auto`` with the compiled CPU kernels of the small-N
action turned off (``OSA_LAB_CPU_KERNELS=0``, their PyTorch reference path), side by side with
``auto``, which uses them where they are built; ``--no-pytorch-path`` leaves it out. ``--alpha-scale C``
multiplies every OSA layer's initial α by C, so that ``‖S‖₂`` is nearer a trained network's
(≈ 1 in the deep layers, docs/training.md) than the tiny value at initialisation.

Before/after of a change, in one process: ``--baseline REV`` adds the row ``skipless-osa / auto
at REV``, the same network built from the package as it was at git revision ``REV``
(:mod:`osa_lab.benchmarking.baseline`; its CPU kernels built from its own sources), timed in the
same rounds. The ``auto`` row's ``paired_ratio`` (median, with ``paired_ratio_q1``/``_q3``, of the
per-round CPU-time ratios current ÷ baseline) is the change's measurement.

    .venv/bin/python benchmarks/train_throughput.py --sizes mnist1d mnist --alpha-scale 30 \
        --osa-methods auto --no-previous --no-pytorch-path --repeat 15 --baseline HEAD~1
"""

from __future__ import annotations

import contextlib
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F

from osa_lab.arguments import ArgumentParser, positive_int
from osa_lab.benchmarking.baseline import baseline_package, baseline_problem, paired_quartiles
from osa_lab.benchmarking.timing import emit_table, interleaved_rounds, machine_info
from osa_lab.fileio import atomic_to_csv
from osa_lab.nn.models import build_classifier
from osa_lab.nn.presets import get_preset
from osa_lab.ops import cpu as cpu_kernels

#: (name, image_size or sequence length, patch_size, 1-D?): digits (16 tokens), MNIST-1D (40 steps,
#: 2 per token → 20 tokens) and MNIST (49 tokens); the target is ≤ 1.5× at N = 20–49
SIZES = (
    ("digits 8×8 / patch 2", 8, 2, False),
    ("mnist1d 40 / patch 2", 40, 2, True),
    ("mnist 28×28 / patch 4", 28, 4, False),
)
#: the largest skipless-OSA step ÷ ``vit`` step each setting aims for
TARGETS = {"digits": "≤ 1.5", "mnist1d": "≤ 1.2", "mnist": "≤ 1.35"}


def step_fn(
    preset: str, image_size: int, patch: int, batch: int, model_overrides: dict, sequence: bool = False, lab=None
):
    """A closure that runs one training step of ``preset`` on a fixed random batch; ``lab``: the
    package to build the model from (default ``osa_lab``; a ``--baseline`` revision's)."""
    torch.manual_seed(0)
    presets, models = (get_preset, build_classifier) if lab is None else (lab.nn.presets.get_preset, lab.nn.models.build_classifier)
    cfg = presets(
        preset, input="sequence" if sequence else "patches", image_size=image_size, patch_size=patch, channels=1,
        **model_overrides,
    )  # fmt: skip
    model = models(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(batch, 1, image_size) if sequence else torch.randn(batch, 1, image_size, image_size)
    y = torch.randint(0, 10, (batch,))

    def step() -> None:
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    step.model = model
    return step, sum(p.numel() for p in model.parameters()), cfg.tokens


def _within(step, context):
    """``step`` run inside ``context()`` (a monkeypatch active only during this configuration's calls)."""

    def run() -> None:
        with context():
            step()

    return run


@contextlib.contextmanager
def previous_small_n_path():
    """Inside the block the small-N path runs as before any action (N×N short Taylor series of
    ``exp(S)``, then ``exp(S) V``): the fused Chebyshev action is switched off too."""
    from osa_lab.ops import expm

    original, fused = expm.qr._small_n_action, expm.osa_chebyshev_action

    def previous(u, j, v, **_):
        return original(u, j, v, action=False, osa_core=False)

    expm.qr._small_n_action = previous
    expm.osa_chebyshev_action = lambda *args, **kwargs: None
    try:
        yield
    finally:
        expm.qr._small_n_action, expm.osa_chebyshev_action = original, fused


def scale_alpha(step, factor: float) -> None:
    """Multiply the α of every OSA layer of the model behind ``step`` by ``factor`` (the layers
    of a ``--baseline`` revision's model too: they are matched by class name)."""
    if factor == 1.0:
        return
    with torch.no_grad():
        for module in step.model.modules():
            if type(module).__name__ == "OrthogonalSelfAttention":
                module.alpha.mul_(factor)


@contextlib.contextmanager
def exp_skipped():
    """Inside the block every OSA layer returns its values unmixed (exp(S) replaced by I, not computed)."""
    from osa_lab.nn.attention import OrthogonalSelfAttention

    original = OrthogonalSelfAttention.attend

    def attend(self, x, key_padding_mask=None):
        return self._split(x)[2]

    OrthogonalSelfAttention.attend = attend
    try:
        yield
    finally:
        OrthogonalSelfAttention.attend = original


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--depth", type=int, default=6)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--osa-methods", nargs="+", default=["auto", "dense", "qr", "lowrank"])
    parser.add_argument("--sizes", nargs="+", default=[s[0].split()[0] for s in SIZES], help="digits, mnist1d, mnist")
    parser.add_argument("--out", default="bench_results/train_throughput.csv")
    parser.add_argument("--no-breakdown", action="store_true", help="leave out the 'exp(S) skipped' row")
    parser.add_argument("--no-previous", action="store_true", help="leave out the 'auto (previous)' row")
    parser.add_argument(
        "--no-pytorch-path", action="store_true",
        help="leave out the 'auto (PyTorch path)' row (the small-N action without the compiled CPU kernels)",
    )  # fmt: skip
    parser.add_argument("--alpha-scale", type=float, default=1.0, help="multiply OSA's initial α by this")
    parser.add_argument(
        "--processes", type=positive_int, default=1, help="repeat the measurement in this many fresh processes, report the spread"
    )
    parser.add_argument(
        "--baseline", metavar="REV", help="also time skipless OSA ('auto') as of this git revision, interleaved (see above)"
    )
    args = parser.parse_args(argv)
    if problem := baseline_problem(args.baseline, args.repeat):
        parser.error(problem)
    if args.baseline and "auto" not in args.osa_methods:
        parser.error("--baseline compares the 'auto' method: keep auto in --osa-methods")
    if args.processes > 1:
        return _across_processes(list(sys.argv[1:] if argv is None else argv), args.processes, args.out)
    torch.set_num_threads(args.threads)
    with baseline_package(args.baseline, parser.error) as lab:
        rows = _measure(args, lab)
    try:
        from osa_lab.reporting.provenance import csv_columns

        prov = csv_columns(vars(args))
    except ImportError:  # pragma: no cover
        prov = {k: str(v) for k, v in machine_info().items()}
    # the kernels' build and torch's instruction set (ATEN_CPU_CAPABILITY can lower it) beside the figures
    prov.update(cpu_kernels=cpu_kernels.status(), torch_cpu_isa=torch.backends.cpu.get_cpu_capability())
    table = emit_table(rows, None, title=f"training step, batch {args.batch}, {args.threads} thread(s)")
    out = table.assign(**prov)  # provenance goes to the CSV only; stdout keeps the readable table
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    out.to_csv(args.out, index=False)
    print(f"wrote {args.out}")
    return 0


def _measure(args, lab) -> list[dict]:
    """One row per size and configuration (``lab``: the ``--baseline`` revision's package, or None)."""
    overrides = {"depth": args.depth, "dim": args.dim, "heads": args.heads}
    rows = []
    for name, size, patch, sequence in SIZES:
        if name.split()[0] not in args.sizes:
            continue
        runs = [("vit", "—"), ("skipless-ssa", "—")] + [("skipless-osa", m) for m in args.osa_methods]
        if "auto" in args.osa_methods and not args.no_previous:
            runs.append(("skipless-osa", "auto (previous)"))
        if "auto" in args.osa_methods and not args.no_pytorch_path and cpu_kernels.enabled():
            runs.append(("skipless-osa", "auto (PyTorch path)"))
        if not args.no_breakdown:
            runs.append(("skipless-osa", "exp(S) skipped"))
        if lab is not None:
            runs.append(("skipless-osa", f"auto at {args.baseline}"))
        built = {}
        for preset, method in runs:
            skipped = method == "exp(S) skipped"
            previous = method == "auto (previous)"
            reference = method == "auto (PyTorch path)"
            at_baseline = lab is not None and method == f"auto at {args.baseline}"
            same = previous or reference or at_baseline
            use = {"osa_method": "auto" if same else method} if preset == "skipless-osa" and not skipped else {}
            extra = dict(overrides, **use)
            try:
                step, n_params, tokens = step_fn(
                    preset, size, patch, args.batch, extra, sequence, lab if at_baseline else None
                )
                scale_alpha(step, args.alpha_scale)
                context = (
                    exp_skipped if skipped else previous_small_n_path if previous else cpu_kernels.turned_off if reference
                    else contextlib.nullcontext
                )  # fmt: skip
                timed = _within(step, context)
                timed()  # a method that cannot run here is a row, not a crash
            except Exception as err:  # noqa: BLE001
                print(f"{preset} ({method}) at {name}: {type(err).__name__}: {err}", file=sys.stderr)
                continue
            built[(preset, method)] = (timed, n_params, tokens)
        # Interleaved rounds: load that comes and goes hits every configuration alike.
        faults: dict = {}
        wall, rounds = interleaved_rounds({key: fn for key, (fn, _, _) in built.items()}, args.repeat, warmup=2, faults=faults)
        seconds = {key: statistics.median(v) for key, v in wall.items()}
        cpu = {key: statistics.median(v) for key, v in rounds.items()}
        base, cpu_base = seconds.get(("vit", "—")), cpu.get(("vit", "—"))
        before = ("skipless-osa", f"auto at {args.baseline}")
        paired = {}
        if before in rounds and ("skipless-osa", "auto") in rounds:  # both ran in every round, under the same load
            paired = paired_quartiles(rounds[("skipless-osa", "auto")], rounds[before])
        for (preset, method), (_, n_params, tokens) in built.items():
            rows.append(
                {
                    "setting": name,
                    "tokens": tokens,
                    "preset": preset,
                    "osa_method": method,
                    "params": n_params,
                    "ms_per_step": 1e3 * seconds[(preset, method)],
                    "ratio_to_vit": seconds[(preset, method)] / base if base else float("nan"),
                    "cpu_ms_per_step": 1e3 * cpu[(preset, method)],
                    "cpu_ratio_to_vit": cpu[(preset, method)] / cpu_base if cpu_base else float("nan"),
                    "minor_faults_per_step": statistics.median(faults[(preset, method)]),
                    "target": TARGETS[name.split()[0]] if preset == "skipless-osa" and method != "exp(S) skipped" else "",
                    **(paired if method == "auto" else dict.fromkeys(paired, float("nan"))),
                }
            )
    return rows


def _across_processes(argv: list[str], processes: int, out: str) -> int:
    """Run this benchmark ``processes`` times, each in a fresh Python process (the same arguments),
    and report the spread of the CPU-time ratios across them."""
    import pandas as pd

    frames = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(processes):
            print(f"process {i + 1}/{processes} …", file=sys.stderr, flush=True)
            part = Path(tmp) / f"process{i}.csv"
            # argparse keeps the last of a repeated option: these override the caller's
            cmd = [sys.executable, __file__, *argv, "--processes", "1", "--out", str(part)]
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
            frames.append(pd.read_csv(part).fillna({"target": ""}).assign(process=i + 1))
    rows = pd.concat(frames, ignore_index=True)
    keys = ["setting", "tokens", "preset", "osa_method"]
    spread = (
        rows.groupby(keys, sort=False)["cpu_ratio_to_vit"]
        .agg(cpu_ratio_median="median", cpu_ratio_min="min", cpu_ratio_max="max")
        .reset_index()
        .merge(rows[[*keys, "target"]].drop_duplicates(keys), on=keys)
        .assign(processes=processes)
    )
    emit_table(spread.to_dict("records"), None, title=f"CPU-time ratio to vit across {processes} processes")
    atomic_to_csv(rows, out)
    spread_path = atomic_to_csv(spread, Path(out).with_name(Path(out).stem + "_spread.csv"))
    print(f"wrote {out} and {spread_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
