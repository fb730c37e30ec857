"""The ``osa-lab`` command line: one sub-command per capability, each in its own module.

Each module listed in ``SUBCOMMANDS`` provides ``add_arguments(parser)`` and
``run(args) -> int``; modules are imported only when their sub-command runs, so
``osa-lab bench`` does not import Panel or papermill.
"""

from __future__ import annotations

import argparse
import importlib
import sys

#: sub-command → (module, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "bench": ("osa_lab.bench", "CPU/GPU speed and memory benchmark of OSA vs SDPA (table + CSV)"),
    "sweep": ("osa_lab.analysis", "rank-collapse / spectrum sweep across depth (tidy CSV)"),
    "report": ("osa_lab.report", "execute the report notebooks with papermill into reports/"),
    "dashboard": ("osa_lab.dashboard_cli", "serve the Panel dashboard"),
    "train": ("osa_lab.train", "train a (skipless) ViT preset on digits / MNIST / synthetic data"),
}


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser; sub-command arguments are added lazily in :func:`main`."""
    parser = argparse.ArgumentParser(prog="osa-lab", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_, help_text) in SUBCOMMANDS.items():
        sub.add_parser(name, help=help_text, add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``osa-lab`` console script."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in SUBCOMMANDS:
        parser = build_parser()
        if argv and argv[0] not in ("-h", "--help"):
            parser.error(f"unknown command {argv[0]!r}; choose from {', '.join(SUBCOMMANDS)}")
        parser.print_help()
        return 0 if argv else 2
    name = argv[0]
    module = importlib.import_module(SUBCOMMANDS[name][0])
    parser = argparse.ArgumentParser(prog=f"osa-lab {name}", description=SUBCOMMANDS[name][1])
    module.add_arguments(parser)
    args = parser.parse_args(argv[1:])
    return int(module.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
