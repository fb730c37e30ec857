"""Time one dashboard update: the work between moving a control and the new figures being ready.

Issue 5's target: at depth 24, N = 64, d = 64, 2 presets, 3 seeds an update shows within 1.5 s
on the 2-core CPU machine. Measured here, in one process, on the dashboard's own objects:

* ``sweep``: :func:`osa_lab.analysis.sweep` for the new settings (uncached),
* ``osa_check``: the OSA-check badges (:mod:`osa_lab.checks`),
* ``figures``: building the rank-collapse, spectra-heatmap and spectra-line figures and
  rendering them to Bokeh models (what the server serialises to the browser),
* ``update_total``: a full update of a built app (a depth change; every step above, uncached),
* ``cached_update``: returning to settings already computed (``pn.cache`` hit).

Browser-side drawing is not included (see ``tests/test_dashboard_browser.py`` for the served
path). Medians of ``--repeat`` runs; no assertion on time (shared machines are noisy).

    python benchmarks/dashboard_update.py [--presets pure-ssa pure-osa] [--depth 24] [--tokens 64]
        [--dim 64] [--seeds 3] [--repeat 3] [--threads 1] [--csv bench_results/dashboard_update.csv]
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from pathlib import Path

import holoviews as hv
import torch

from osa_lab.benchtools import emit_table, machine_info

ROOT = Path(__file__).resolve().parents[1]


def load_dashboard():
    """Import dashboards/osa_dashboard.py as a module (it is a script, not part of the package)."""
    name = "osa_dashboard_bench"
    spec = importlib.util.spec_from_file_location(name, ROOT / "dashboards" / "osa_dashboard.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _median(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", nargs="+", default=["pure-ssa", "pure-osa"])
    parser.add_argument("--depth", type=int, default=24)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads, as the served dashboard uses (OSA_DASHBOARD_TORCH_THREADS)")
    parser.add_argument("--csv", default="bench_results/dashboard_update.csv")
    args = parser.parse_args(argv)

    torch.set_num_threads(args.threads)
    dash = load_dashboard()
    from osa_lab.analysis import sweep
    from osa_lab.checks import osa_check
    from osa_lab.plots import depth as plots

    cfg = dict(presets=tuple(args.presets), depth=args.depth, tokens=args.tokens, dim=args.dim, heads=args.heads,
               alpha=None, seeds=args.seeds)
    print("machine:", machine_info())
    print("config:", cfg)

    def run_sweep():
        return sweep(list(cfg["presets"]), [args.depth], [args.tokens], [args.dim], [args.heads], [None],
                     list(range(args.seeds)), site="both", progress=False)

    result = run_sweep()  # warm-up (imports, first-call costs)
    rows = []
    t_sweep = _median(run_sweep, args.repeat)
    rows.append({"step": "sweep", "seconds": t_sweep})
    t_check = _median(lambda: osa_check(args.tokens, args.dim, args.heads, None), args.repeat)
    rows.append({"step": "osa_check", "seconds": t_check})

    def figures():
        objs = [plots.metric_vs_depth(result.metrics, "relative_residual"), plots.spectra_heatmaps(result.spectra),
                plots.spectra_lines(result.spectra)]
        for obj in objs:
            hv.render(obj, backend="bokeh")

    figures()
    rows.append({"step": "figures", "seconds": _median(figures, args.repeat)})

    # a full update of a built app: change depth, uncached (fresh cache each time), figures rendered
    app = dash.build_app(presets=list(args.presets), depth=max(args.depth - 1, 1), tokens=args.tokens, dim=args.dim,
                         heads=args.heads, seeds=args.seeds)
    import panel as pn

    pn.panel(app)
    depths = [args.depth, max(args.depth - 1, 1)]

    def full_update(i=[0]):  # noqa: B006 - a counter across calls
        dash.compute_sweep.clear()
        dash.compute_osa_check.clear()
        app.controls.depth = depths[i[0] % 2]
        i[0] += 1
        for view, key in ((app.rank_view, "metric"), (app.spectra_view, "heatmaps"), (app.spectra_view, "lines")):
            hv.render(view.panes[key].object, backend="bokeh")
        assert app.state.error == "", app.state.error

    rows.append({"step": "update_total", "seconds": _median(full_update, args.repeat)})

    def cached_update(i=[0]):  # noqa: B006
        app.controls.depth = depths[i[0] % 2]
        i[0] += 1
        for view, key in ((app.rank_view, "metric"), (app.spectra_view, "heatmaps"), (app.spectra_view, "lines")):
            hv.render(view.panes[key].object, backend="bokeh")

    cached_update()
    cached_update()
    rows.append({"step": "cached_update", "seconds": _median(cached_update, args.repeat)})
    for row in rows:
        row.update({k: (",".join(v) if isinstance(v, tuple) else v) for k, v in cfg.items()}, threads=args.threads,
                   target_s=1.5 if row["step"] == "update_total" else None)
    emit_table(rows, args.csv, title="dashboard update (median seconds)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
