"""Forward + backward step time of timm's ViT-Tiny with timm's attention against OSA, side by side.

``vit_tiny_patch16_224`` (random init, N = 197 tokens, d = 192, 3 heads, 12 blocks) at batch 8:

* ``timm Attention``: timm's model as built (softmax attention, ``F.scaled_dot_product_attention``);
* ``OSA (convert_to_osa)``: the same model and weights with every attention layer swapped by
  :func:`osa_lab.integrations.timm.convert_to_osa` (skips and LayerNorms kept);
* ``OSA skipless normless``: the paper's model, :func:`osa_lab.integrations.timm.create_osa_vit`
  (no skips, no norms; same sizes).

A step is forward, cross-entropy against random labels, and backward (no optimizer update). The
configurations are timed interleaved round by round (:func:`osa_lab.benchmarking.timing.time_interleaved`),
so load that comes and goes on a shared machine hits all of them alike; read the ratio column.

    .venv/bin/python benchmarks/timm_step.py                     # batch 8, 2 threads, 5 rounds
    .venv/bin/python benchmarks/timm_step.py --threads 1 --repeat 10

Prints a table and writes ``bench_results/timm_step.csv`` (with provenance columns). Needs the
``timm`` extra (installed by ``make setup``); no weights are downloaded.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from osa_lab.benchmarking.timing import emit_table, machine_info, time_interleaved


def step_fn(model: torch.nn.Module, batch: int, seed: int = 0):
    """A closure running forward + cross-entropy + backward of ``model`` on a fixed random batch."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, 3, 224, 224, generator=gen)
    y = torch.randint(0, 1000, (batch,), generator=gen)
    model.train()

    def step() -> None:
        model.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()

    return step


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="vit_tiny_patch16_224", help="timm ViT name")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--repeat", type=int, default=5, help="interleaved rounds")
    parser.add_argument("--no-skipless", action="store_true", help="leave out the skipless normless row")
    parser.add_argument("--out", default="bench_results/timm_step.csv")
    args = parser.parse_args(argv)
    if args.batch < 1 or args.repeat < 1 or (args.threads is not None and args.threads < 1):
        parser.error("--batch, --repeat and --threads must be at least 1")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    from osa_lab.integrations.timm import convert_to_osa, create_osa_vit, import_timm, num_tokens

    timm = import_timm()
    torch.manual_seed(0)
    try:
        base = timm.create_model(args.model, pretrained=False)
    except RuntimeError as exc:
        print(f"timm_step.py: error: {exc}", file=sys.stderr)
        return 2
    converted = timm.create_model(args.model, pretrained=False)
    converted.load_state_dict(base.state_dict())
    report = convert_to_osa(converted)
    models = {"timm Attention": base, "OSA (convert_to_osa)": converted}
    if not args.no_skipless:
        models["OSA skipless normless"] = create_osa_vit(args.model)
    fns = {name: step_fn(m, args.batch) for name, m in models.items()}
    load_before = os.getloadavg()
    start = time.perf_counter()
    seconds = time_interleaved(fns, repeat=args.repeat, warmup=1)
    wall = time.perf_counter() - start
    load_after = os.getloadavg()
    ref = seconds["timm Attention"]
    rows = [
        {
            "model": args.model,
            "attention": name,
            "tokens": num_tokens(models[name]),
            "batch": args.batch,
            "params": sum(p.numel() for p in models[name].parameters()),
            "ms_per_step": 1e3 * s,
            "ratio_to_timm": s / ref,
        }
        for name, s in seconds.items()
    ]
    print(report.__str__().splitlines()[0])
    try:
        from osa_lab.reporting.provenance import csv_columns

        prov = csv_columns(vars(args))
    except ImportError:  # pragma: no cover
        prov = {k: str(v) for k, v in machine_info().items()}
    title = (
        f"forward+backward step, batch {args.batch}, {torch.get_num_threads()} thread(s), median of "
        f"{args.repeat} interleaved rounds; load average {load_before[0]:.1f} → {load_after[0]:.1f} "
        f"({wall:.0f} s)"
    )
    table = emit_table(rows, None, title=title)
    out = table.assign(load_avg_before=load_before[0], load_avg_after=load_after[0], **prov)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    out.to_csv(args.out, index=False)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
