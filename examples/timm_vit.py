"""Train a skipless, normless OSA Vision Transformer built with timm on the 8×8 digits for a few steps.

The model is timm's ``VisionTransformer`` (``vit_tiny_patch16_224`` resized to the task) with
every block's skip connections and LayerNorms removed and softmax attention replaced by
orthogonal self-attention (Zhang & Martens, arXiv 2602.05996), built by
:func:`osa_lab.integrations.timm.create_osa_vit`; ``--attention softmax`` trains the same
skipless, normless model with timm's softmax attention for comparison.

    .venv/bin/python examples/timm_vit.py                  # 200 steps on digits (~1 min on a CPU)
    .venv/bin/python examples/timm_vit.py --steps 20 --depth 2 --dim 32

Prints the training loss every ``--log-every`` steps, the rank metrics of the hidden states at
initialisation (osa_lab's depth profile of the timm model), and the test accuracy at the end.
Needs the ``timm`` extra (installed by ``make setup``).
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
import torch.nn.functional as F


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200, help="optimizer steps")
    parser.add_argument("--batch", type=int, default=64, help="batch size")
    parser.add_argument("--depth", type=int, default=4, help="number of blocks")
    parser.add_argument("--dim", type=int, default=64, help="embedding width")
    parser.add_argument("--heads", type=int, default=4, help="attention heads")
    parser.add_argument("--patch", type=int, default=2, help="patch size (8×8 images)")
    parser.add_argument("--lr", type=float, default=1e-3, help="AdamW learning rate")
    parser.add_argument("--attention", choices=["osa", "softmax"], default="osa")
    parser.add_argument("--data", choices=["digits", "synthetic"], default="digits")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (small models: 1 is fastest)")
    parser.add_argument("--log-every", type=int, default=20)
    args = parser.parse_args(argv)
    for name in ("steps", "batch", "depth", "dim", "heads", "patch", "threads", "log_every"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if args.dim % args.heads:
        parser.error(f"--dim {args.dim} is not divisible by --heads {args.heads}")
    if 8 % args.patch:
        parser.error(f"--patch {args.patch} does not divide the image size 8; use 1, 2, 4 or 8")
    if not args.lr > 0:
        parser.error(f"--lr must be positive, got {args.lr}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from osa_lab.errors import OptionalDependencyError
    from osa_lab.integrations.timm import create_osa_vit, timm_depth_profile
    from osa_lab.studies.data import load_data

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    data = load_data(args.data)
    try:
        model = create_osa_vit(
            "vit_tiny_patch16_224",
            skipless=True,
            normless=True,
            attention=args.attention,
            img_size=data.image_size,
            patch_size=args.patch,
            in_chans=data.channels,
            num_classes=data.num_classes,
            embed_dim=args.dim,
            depth=args.depth,
            num_heads=args.heads,
            class_token=False,
            global_pool="avg",
        )
    except OptionalDependencyError as exc:
        print(f"timm_vit.py: error: {exc}", file=sys.stderr)
        return 2
    n_params = sum(p.numel() for p in model.parameters())
    print(
        f"skipless, normless {args.attention.upper()} ViT from timm: depth {args.depth}, dim {args.dim}, "
        f"{args.heads} heads, {n_params} parameters, {data.name} {tuple(data.x_train.shape)}"
    )
    profile = timm_depth_profile(model, data.x_train[:64], site="block", spectra=False, label=args.attention)
    table = profile.pivot("block")[["effective_rank", "relative_residual"]]
    print("hidden states at initialisation (first 64 training images):")
    print(table.to_string(float_format=lambda x: f"{x:.4g}"))

    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    gen = torch.Generator().manual_seed(args.seed)
    n = data.x_train.shape[0]
    losses: list[float] = []
    start = time.perf_counter()
    model.train()
    for step in range(1, args.steps + 1):
        idx = torch.randint(0, n, (args.batch,), generator=gen)
        loss = F.cross_entropy(model(data.x_train[idx]), data.y_train[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        if step % args.log_every == 0 or step in (1, args.steps):
            print(f"step {step:4d}  loss {losses[-1]:.4f}")
    elapsed = time.perf_counter() - start
    model.eval()
    with torch.no_grad():
        accuracy = float((model(data.x_test).argmax(-1) == data.y_test).float().mean())
    k = max(1, min(10, args.steps // 4))
    first, last = sum(losses[:k]) / k, sum(losses[-k:]) / k
    print(f"mean loss of the first {k} steps {first:.4f}, of the last {k} steps {last:.4f}")
    print(f"test accuracy {accuracy:.4f} after {args.steps} steps ({elapsed:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
