"""The Runs view: a depth study's results folder, its runs, curves, tuning and trained models.

``osa-lab dashboard --results DIR`` (or the page with ``?view=runs``) opens a results folder written
by ``osa-lab train --experiment`` (``final/*.json``, ``tune/*.json``, ``search/*.json`` and, for runs
that saved them, ``final/*.weights.pt``). The tables come from the study's own readers
(:func:`osa_lab.studies.depth_study.report.run_table`, :func:`~osa_lab.studies.depth_study.report.curve_table`,
:func:`~osa_lab.studies.depth_study.report.tuning_table`); the per-layer profiles of a run at
initialisation and after training from :func:`osa_lab.studies.depth_study.layer_profiles.run_layer_profiles`.
A damaged file never stops the view: it is named in a notice and left out.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import panel as pn
import param
from matplotlib.figure import Figure

from osa_lab.dashboard.address import keep_address_on_view
from osa_lab.dashboard.state import ACCENT, markdown_literal, quoted
from osa_lab.errors import MalformedResultError, MissingDataError, UserError
from osa_lab.studies.depth_study import report
from osa_lab.studies.depth_study.layer_profiles import PROFILE_SAMPLES, STATES, run_layer_profiles
from osa_lab.studies.depth_study.records import FEWEST_FAILURES
from osa_lab.studies.depth_study.weights import weights_path
from osa_lab.studies.training.config import DEFAULT_WARMUP_FRACTION

#: the environment variable ``osa-lab dashboard --results DIR`` sets for the served page
RESULTS_ENV = "OSA_LAB_RESULTS"
#: the results folder shown when none was given (the committed MNIST-1D depth study of a source checkout)
DEFAULT_RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results" / "mnist1d-depth"
#: per-layer metrics drawn side by side (initialisation | trained), with their axis labels
LAYER_METRICS = {"effective_rank": "effective rank", "stable_rank": "stable rank",
                 "condition_number": "κ(X) = σ_max/σ_min"}  # fmt: skip
#: the most runs whose models are profiled at once (each rebuilds two models)
MAX_PROFILED_RUNS = 6

RUN_TABLE_COLUMNS = {"preset": "preset", "depth": "depth", "lr": "lr", "alpha_lr_mult": "α-lr ×", "seed": "seed",
                     "status": "status", "test_accuracy": "test acc. (%)", "val_accuracy": "val. acc. (%)",
                     "kappa_init": "κ at init", "kappa_trained": "κ trained", "weights": "weights"}  # fmt: skip


@dataclass
class StudyTables:
    """What the Runs view shows of one results folder."""

    folder: Path
    runs: pd.DataFrame
    curves: pd.DataFrame
    tuning: pd.DataFrame
    #: run label → its JSON path, for the final runs whose weights file exists
    weights: dict[str, Path] = field(default_factory=dict)
    #: one line per file or table that could not be read (named), shown above the view
    notices: list[str] = field(default_factory=list)


def run_label(preset: str, depth: int, seed: int, lr: float) -> str:
    """A final run's name in the view (``vit · depth 8 · lr 0.01 · seed 2``)."""
    return f"{preset} · depth {int(depth)} · lr {lr:.3g} · seed {int(seed)}"


def _damaged_files(folder: Path) -> list[str]:
    notices = []
    for stage in ("final", "tune", "search"):
        for path in sorted((folder / stage).glob("*.json")):
            try:
                payload = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError, ValueError) as err:
                notices.append(f"{stage}/{path.name} could not be read ({type(err).__name__}) and is left out")
                continue
            if not isinstance(payload, dict):
                notices.append(f"{stage}/{path.name} is not a run record (a JSON {type(payload).__name__}) and is "
                               "left out")  # fmt: skip
    return notices


def _readable_copy(folder: Path, tmp: Path) -> Path:
    """A folder of links to ``folder``'s readable JSON records (the report's readers expect every record to
    be an object with its keys); used only when some record is damaged."""
    for stage in ("final", "tune", "search"):
        (tmp / stage).mkdir(parents=True, exist_ok=True)
        for path in (folder / stage).glob("*.json"):
            try:
                payload = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError, ValueError):
                continue
            if isinstance(payload, dict) and all(k in payload for k in _REQUIRED[stage]):
                (tmp / stage / path.name).symlink_to(path.resolve())
    return tmp


_REQUIRED = {"final": ("preset", "depth", "seed", "lr", "alpha_lr_mult"),
             "tune": ("preset", "depth", "lr", "alpha_lr_mult"),
             "search": ("preset", "depth")}  # fmt: skip


def load_study(folder: str | os.PathLike) -> StudyTables:
    """The run, curve and tuning tables of a results folder, the runs with saved weights and a notice per
    damaged file. Raises :class:`MissingDataError` when ``folder`` holds no study results."""
    import tempfile

    folder = Path(folder)
    if not (folder / "final").is_dir() and not (folder / "tune").is_dir():
        raise MissingDataError(
            f"{folder} is not a study's results folder (no final/ or tune/ inside); give the --output folder "
            "of `osa-lab train --experiment`"
        )
    notices = _damaged_files(folder)
    incomplete = []
    for stage, keys in _REQUIRED.items():
        for path in sorted((folder / stage).glob("*.json")):
            try:
                payload = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError, ValueError):
                continue
            if isinstance(payload, dict) and not all(k in payload for k in keys):
                missing = ", ".join(k for k in keys if k not in payload)
                incomplete.append(f"{stage}/{path.name} lacks {missing} and is left out")
    notices += incomplete
    with tempfile.TemporaryDirectory() as tmp:
        source = _readable_copy(folder, Path(tmp)) if notices else folder
        runs, curves, tuning = report.run_table(source), report.curve_table(source), report.tuning_table(source)
    weights = {}
    for path in sorted((folder / "final").glob("*.json")):
        if not weights_path(path).exists():
            continue
        try:
            r = json.loads(path.read_text(encoding="utf-8"))
            weights[run_label(r["preset"], r["depth"], r["seed"], r["lr"])] = path
        except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError):
            continue  # already named above
    if len(runs):
        labels = [run_label(*v) for v in runs[["preset", "depth", "seed", "lr"]].itertuples(index=False)]
        runs = runs.assign(weights=["saved" if k in weights else "—" for k in labels])
    else:
        runs = runs.assign(weights=pd.Series(dtype=object))
    return StudyTables(folder, runs, curves, tuning, weights, notices)


@pn.cache(max_items=8)
def cached_study(folder: str, stamp: float) -> StudyTables:
    """:func:`load_study` cached per folder and its newest modification time (primitive keys)."""
    return load_study(folder)


@pn.cache(max_items=64)
def cached_profiles(result_json: str, stamp: float):
    """:func:`run_layer_profiles` cached per run JSON and its weights file's modification time."""
    return run_layer_profiles(result_json)


def folder_stamp(folder: Path) -> float:
    """The newest modification time of the folder's stage directories (a new or rewritten run changes it)."""
    return max((p.stat().st_mtime for p in (folder, folder / "final", folder / "tune", folder / "search")
                if p.exists()), default=0.0)  # fmt: skip


# -- figures (matplotlib Figure objects, never pyplot: the server draws them in threads) ---------------


def curves_figure(curves: pd.DataFrame, value: str = "train_loss") -> Figure:
    """``value`` against step per preset, one panel per depth: each seed a thin line, the mean a thick
    one and the band its min–max over seeds."""
    depths = sorted(curves["depth"].unique()) if len(curves) else []
    fig = Figure(figsize=(4.2 * max(len(depths), 1) + 2.6, 3.6), layout="constrained")
    if not depths:
        fig.text(0.5, 0.5, "no training curves in this selection", ha="center")
        return fig
    axes = fig.subplots(1, len(depths), squeeze=False)[0]
    presets = sorted(curves["preset"].unique())
    colours = {p: f"C{i % 10}" for i, p in enumerate(presets)}
    for ax, depth in zip(axes, depths, strict=True):
        at = curves[curves["depth"] == depth]
        for preset, runs in at.groupby("preset"):
            wide = runs.pivot_table(index="step", columns="seed", values=value)
            for seed in wide.columns:
                ax.plot(wide.index, wide[seed], color=colours[preset], lw=0.6, alpha=0.45)
            ax.fill_between(wide.index, wide.min(axis=1), wide.max(axis=1), color=colours[preset], alpha=0.15)
            ax.plot(wide.index, wide.mean(axis=1), color=colours[preset], lw=2, label=preset)
        ax.set_title(f"depth {depth}")
        ax.set_xlabel("training step")
        if value == "train_loss":
            ax.set_yscale("log")
    axes[0].set_ylabel(value.replace("_", " ") + " (thin: each seed; band: min–max)")
    legend: dict[str, object] = {}
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            legend.setdefault(lab, h)
    fig.legend(list(legend.values()), list(legend), loc="outside right upper", fontsize=8)
    return fig


def tuning_figure(tuning: pd.DataFrame) -> Figure:
    """Validation accuracy (%) against learning rate per preset, one panel per depth: each tuning seed a
    point, the mean over seeds a line per α-lr multiplier and warm-up, the chosen setting circled."""
    if "warmup_fraction" not in tuning:  # a study that did not tune the warm-up ran at the default
        tuning = tuning.assign(warmup_fraction=DEFAULT_WARMUP_FRACTION)
    depths = sorted(tuning["depth"].unique()) if len(tuning) else []
    fig = Figure(figsize=(4.2 * max(len(depths), 1) + 2.6, 3.6), layout="constrained")
    if not depths:
        fig.text(0.5, 0.5, "no tuning runs in this selection", ha="center")
        return fig
    axes = fig.subplots(1, len(depths), squeeze=False, sharey=True)[0]
    presets = sorted(tuning["preset"].unique())
    colours = {p: f"C{i % 10}" for i, p in enumerate(presets)}
    seen = set()
    for ax, depth in zip(axes, depths, strict=True):
        at = tuning[tuning["depth"] == depth]
        for (preset, am, warmup), runs in at.groupby(["preset", "alpha_lr_mult", "warmup_fraction"]):
            acc = 100 * runs["val_accuracy"].astype(float)
            ax.scatter(runs["lr"], acc, s=10, color=colours[preset], alpha=0.6)
            mean = acc.groupby(runs["lr"]).mean()
            label = preset if preset not in seen else None
            seen.add(preset)
            ax.plot(mean.index, mean.values, color=colours[preset], lw=1.2, label=label,
                    ls=":" if am != 1 else "--" if not math.isclose(warmup, DEFAULT_WARMUP_FRACTION) else "-")  # fmt: skip
            chosen = runs[runs["chosen"].astype(bool)]
            # a setting chosen by fewest failures (no setting trained on every tuning seed) is not an optimum
            fallback = chosen["chosen_by"].eq(FEWEST_FAILURES).any() if "chosen_by" in chosen else False
            ax.scatter(chosen["lr"], 100 * chosen["val_accuracy"].astype(float), s=70, facecolors="none",
                       edgecolors=colours[preset], lw=1.5, marker="s" if fallback else "o")  # fmt: skip
        ax.set_xscale("log")
        ax.set_title(f"depth {depth}")
        ax.set_xlabel("learning rate")
    axes[0].set_ylabel("validation accuracy (%)")
    any_fallback = "chosen_by" in tuning and bool(tuning["chosen_by"].eq(FEWEST_FAILURES).any())
    marks = "○ chosen; □ chosen by fewest failures (no setting trained)" if any_fallback else "○ chosen"
    fig.legend(loc="outside right upper", fontsize=8, title_fontsize=7,
               title=f"{marks}; dotted: α-lr ≠ 1; dashed: warm-up ≠ {DEFAULT_WARMUP_FRACTION:g}")  # fmt: skip
    return fig


def layers_figure(profiles: dict[str, pd.DataFrame], spectra: dict[str, pd.DataFrame]) -> Figure:
    """Rank, κ and the last block's spectrum across layers for each run: at initialisation (left) and
    after training (right), on shared axes so that the two columns compare directly."""
    rows = len(LAYER_METRICS) + 1
    fig = Figure(figsize=(11, 2.7 * rows), layout="constrained")
    axes = fig.subplots(rows, 2, sharey="row", squeeze=False)
    for col, state in enumerate(STATES):
        axes[0, col].set_title("at initialisation" if state == "initialisation" else "after training")
        for i, (label, table) in enumerate(profiles.items()):
            colour = f"C{i % 10}"
            at = table[table["state"] == state]
            for row, metric in enumerate(LAYER_METRICS):
                m = at[at["metric"] == metric].sort_values("layer")
                axes[row, col].plot(m["layer"], m["value"], marker="o", ms=3, color=colour,
                                    label=label if (row, col) == (0, 1) else None)  # fmt: skip
            sp = spectra[label]
            sp = sp[(sp["state"] == state) & (sp["layer"] == sp["layer"].max())].sort_values("index")
            axes[-1, col].plot(sp["index"] + 1, sp["sigma_normalized"], marker=".", color=colour)
        for row, metric in enumerate(LAYER_METRICS):
            axes[row, col].set_xlabel("layer (0 = embedding)")
            axes[row, col].xaxis.get_major_locator().set_params(integer=True)
            if metric == "condition_number":
                axes[row, col].set_yscale("log")
        axes[-1, col].set_yscale("log")
        axes[-1, col].set_xlabel("singular value index, last block")
    for row, text in enumerate([*LAYER_METRICS.values(), "σᵢ/σ₁ (last block)"]):
        axes[row, 0].set_ylabel(text)
    fig.legend(loc="outside upper center", fontsize=8, ncols=min(len(profiles), 3))
    return fig


def has_layers(preset: str) -> bool:
    """Whether ``preset`` is a transformer (its hidden tokens can be profiled layer by layer)."""
    from osa_lab.nn.presets import get_preset

    try:
        return get_preset(preset).backbone == "transformer"
    except (UserError, KeyError, ValueError, AttributeError):
        return False


def _pct(v: float) -> str:
    return "—" if v is None or not math.isfinite(float(v)) else f"{100 * float(v):.1f}"


def _kappa(v: float) -> str:
    from osa_lab.studies.summaries import KAPPA_RESOLVED

    if v is None or not math.isfinite(float(v)):
        return "—"
    return f"> {KAPPA_RESOLVED:.2g}" if float(v) >= KAPPA_RESOLVED else f"{float(v):.3g}"


def display_runs(runs: pd.DataFrame) -> pd.DataFrame:
    """The run table with human headers, accuracies in %, κ beyond float64's resolution as ``> 4.5e15``."""
    out = runs.reindex(columns=list(RUN_TABLE_COLUMNS)).copy()
    for c in ("test_accuracy", "val_accuracy"):
        out[c] = out[c].map(_pct)
    for c in ("kappa_init", "kappa_trained"):
        out[c] = out[c].map(_kappa)
    out["lr"] = out["lr"].map(lambda v: f"{v:.3g}")
    out["alpha_lr_mult"] = out["alpha_lr_mult"].map(lambda v: f"{v:.3g}")
    return out.rename(columns=RUN_TABLE_COLUMNS)


def grouped_runs(runs: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """Test accuracy (%) per group of ``by`` (preset, depth, lr, seed): runs, mean, std, min and max."""
    if not len(runs):
        return pd.DataFrame(columns=[*by, "runs", "mean (%)", "std (%)", "min (%)", "max (%)"])
    acc = runs.assign(acc=100 * runs["test_accuracy"].astype(float))
    table = acc.groupby(by)["acc"].agg(["count", "mean", "std", "min", "max"]).reset_index()
    table = table.rename(columns={"count": "runs", "mean": "mean (%)", "std": "std (%)", "min": "min (%)",
                                  "max": "max (%)"})  # fmt: skip
    return table.round(1)


class RunsView(pn.viewable.Viewer):
    """A study's results folder: run table, loss curves, tuning search and init-versus-trained layer profiles."""

    folder = param.String(default="", doc="the results folder shown")
    presets = param.ListSelector(default=[], objects=[], doc="presets shown")
    depths = param.ListSelector(default=[], objects=[], doc="depths shown")
    lrs = param.ListSelector(default=[], objects=[], doc="learning rates shown")
    seeds = param.ListSelector(default=[], objects=[], doc="seeds shown")
    group_by = param.ListSelector(default=["preset", "depth"], objects=["preset", "depth", "lr", "seed"],
                                  doc="columns the summary table groups by")  # fmt: skip
    curve = param.Selector(default="train_loss", objects=["train_loss", "train_accuracy", "val_accuracy",
                                                         "test_accuracy"], doc="the curve drawn")  # fmt: skip
    runs_compared = param.ListSelector(default=[], objects=[], doc="runs whose layers are compared (saved weights)")

    #: The filters mirrored in the page URL (``?view=runs&presets=vit,skipless-osa&depths=4,8``).
    URL_FILTERS = ("presets", "depths", "lrs", "seeds", "group_by", "curve")

    def __init__(self, folder: str | os.PathLike | None = None, **params):
        folder = str(folder or os.environ.get(RESULTS_ENV) or DEFAULT_RESULTS)
        super().__init__(folder=folder, **params)
        self.error = ""
        self.url_errors: list[str] = []
        self.study: StudyTables | None = None
        self._load()

    # -- the URL ----------------------------------------------------------------------------------

    def to_query(self) -> dict[str, str]:
        """The URL query of the filters shown (``view=runs`` first)."""
        q = {"view": "runs"}
        for name in self.URL_FILTERS:
            value = getattr(self, name)
            q[name] = ",".join(str(v) for v in value) if isinstance(value, list) else str(value)
        return q

    def apply_url(self, query: dict) -> list[str]:
        """Set the filters from a URL query (``{name: "a,b"}`` or Bokeh's ``{name: [b"a,b"]}``). Each
        item is checked on its own: an unknown one is named in :attr:`url_errors` and left out,
        the usable ones kept; other parameters (the dashboard's) are ignored here."""
        errors = []
        for name in self.URL_FILTERS:
            raw = query.get(name)
            if raw is None:
                continue
            raw = raw[-1] if isinstance(raw, list) else raw
            text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
            choices = {str(v): v for v in self.param[name].objects}
            if name == "curve":
                if text in choices:
                    self.curve = choices[text]
                else:
                    errors.append(f"curve={quoted(text)} was ignored: valid values: {', '.join(choices)}")
                continue
            items = [t.strip() for t in text.split(",") if t.strip()]
            bad = [t for t in items if t not in choices]
            if bad:
                errors.append(f"{name}: {', '.join(quoted(b, 40) for b in bad[:5])} ignored (not in this folder's "
                              f"results; valid: {', '.join(list(choices)[:12])})")  # fmt: skip
            good = [choices[t] for t in items if t in choices]
            if good:
                setattr(self, name, good)
        self.url_errors = errors
        return errors

    def link_url(self, location) -> None:
        """Keep ``location.search`` (the page's address bar) on the filters shown, also when the
        browser's own address arrives late (:func:`~osa_lab.dashboard.address.keep_address_on_view`)."""
        keep_address_on_view(location, self, self.URL_FILTERS, self.to_query)

    def _load(self) -> None:
        path = Path(self.folder)
        try:
            self.study = cached_study(str(path.resolve()), folder_stamp(path))
        except (MissingDataError, OSError) as err:
            self.study, self.error = None, str(err)
            return
        runs = self.study.runs
        for name, column in (("presets", "preset"), ("depths", "depth"), ("lrs", "lr"), ("seeds", "seed")):
            values = sorted(runs[column].unique().tolist())
            self.param[name].objects = values
            setattr(self, name, values)
        labels = sorted(self.study.weights)
        self.param.runs_compared.objects = labels
        self.runs_compared = [k for k in labels if has_layers(k.split(" · ")[0])][:2]

    def selected_runs(self) -> pd.DataFrame:
        """The final runs within the filters."""
        if self.study is None:
            return pd.DataFrame()
        r = self.study.runs
        keep = r["preset"].isin(self.presets) & r["depth"].isin(self.depths) & r["lr"].isin(self.lrs) \
            & r["seed"].isin(self.seeds)  # fmt: skip
        return r[keep]

    def _filtered(self, table: pd.DataFrame, seeds: bool = True) -> pd.DataFrame:
        if not len(table):
            return table
        keep = table["preset"].isin(self.presets) & table["depth"].isin(self.depths)
        if seeds and "seed" in table:
            keep &= table["seed"].isin(self.seeds)
        return table[keep]

    # -- panes ----------------------------------------------------------------------------------

    def header(self) -> str:
        if self.study is None:
            return f"**No results shown.** {self.error}"
        s = self.study
        lines = [f"**Results folder** `{s.folder}`: {len(s.runs)} final runs at their chosen settings, "
                 f"{len(s.tuning)} tuning runs."]  # fmt: skip
        if not s.weights:
            lines.append("**No weights were saved** in this folder, so the init-versus-trained layer comparison is "
                         "not available (a final run saves `<run>.weights.pt` beside its JSON; this folder's runs "
                         "have none: rerun the study with the current osa_lab to keep them).")  # fmt: skip
        return "\n\n".join(lines)

    def notices(self) -> str:
        parts = []
        if self.url_errors:
            parts.append("**This link had filters that could not be used:**\n\n"
                         + "\n".join(f"- {markdown_literal(e)}" for e in self.url_errors))  # fmt: skip
        if self.study is not None and self.study.notices:
            parts.append("**Some files were left out:**\n\n"
                         + "\n".join(f"- {markdown_literal(n)}" for n in self.study.notices))  # fmt: skip
        return "\n\n".join(parts)

    @param.depends("presets", "depths", "lrs", "seeds")
    def run_table(self) -> pn.widgets.Tabulator:
        return pn.widgets.Tabulator(display_runs(self.selected_runs()), show_index=False, disabled=True,
                                    pagination="local", page_size=12, sizing_mode="stretch_width")  # fmt: skip

    @param.depends("presets", "depths", "lrs", "seeds", "group_by")
    def grouped_table(self) -> pn.widgets.Tabulator:
        by = list(self.group_by) or ["preset"]
        return pn.widgets.Tabulator(grouped_runs(self.selected_runs(), by), show_index=False, disabled=True,
                                    sizing_mode="stretch_width")  # fmt: skip

    @param.depends("presets", "depths", "seeds", "curve")
    def curves(self) -> pn.pane.Matplotlib:
        curves = self._filtered(self.study.curves if self.study else pd.DataFrame())
        return pn.pane.Matplotlib(curves_figure(curves, self.curve), tight=False, format="svg",
                                  sizing_mode="stretch_width")  # fmt: skip

    @param.depends("presets", "depths")
    def tuning(self) -> pn.pane.Matplotlib:
        tuning = self._filtered(self.study.tuning if self.study else pd.DataFrame(), seeds=False)
        return pn.pane.Matplotlib(tuning_figure(tuning), tight=False, format="svg", sizing_mode="stretch_width")

    @param.depends("runs_compared")
    def layers(self) -> pn.viewable.Viewable:
        if self.study is None:
            return pn.pane.Markdown("")
        if not self.study.weights:
            return pn.pane.Alert("No weights were saved in this results folder: the layers of its trained models "
                                 "cannot be shown. Only the run table, the curves and the tuning search are "
                                 "available.", alert_type="info")  # fmt: skip
        chosen = list(self.runs_compared)[:MAX_PROFILED_RUNS]
        if not chosen:
            return pn.pane.Markdown("Choose runs with saved weights above to compare their layers.")
        profiles, spectra, problems = {}, {}, []
        for label in chosen:
            path = self.study.weights[label]
            try:
                p = cached_profiles(str(path), weights_path(path).stat().st_mtime)
            except (MalformedResultError, OSError, ValueError, KeyError) as err:
                problems.append(f"{label}: {err}")
                continue
            profiles[label], spectra[label] = p.metrics, p.spectra
        parts: list = []
        if problems:
            parts.append(pn.pane.Alert("\n".join(f"- {markdown_literal(m)}" for m in problems), alert_type="warning"))
        if profiles:
            parts.append(pn.pane.Markdown(
                f"**Left: at initialisation · right: after training** ({len(profiles)} runs: "
                f"{markdown_literal('; '.join(profiles))}). Each point is a block's output on "
                f"{PROFILE_SAMPLES} test inputs (mean over them); κ(X) is σ_max/σ_min of the tokens.",
                sizing_mode="stretch_width", css_classes=["runs-layers-caption"]))
            parts.append(pn.pane.Matplotlib(layers_figure(profiles, spectra), tight=False, format="svg",
                                            sizing_mode="stretch_width"))  # fmt: skip
        return pn.Column(*parts, sizing_mode="stretch_width")

    def controls(self) -> pn.Column:
        return pn.Column(
            pn.widgets.MultiChoice.from_param(self.param.presets),
            pn.widgets.MultiChoice.from_param(self.param.depths),
            pn.widgets.MultiChoice.from_param(self.param.lrs, label="learning rates"),
            pn.widgets.MultiChoice.from_param(self.param.seeds),
            pn.widgets.MultiChoice.from_param(self.param.group_by, label="group the summary by"),
            pn.widgets.Select.from_param(self.param.curve, label="curve"),
            sizing_mode="stretch_width",
        )

    def __panel__(self) -> pn.viewable.Viewable:
        notices = self.notices()
        layer_picker = pn.widgets.MultiChoice.from_param(self.param.runs_compared, label="runs compared (saved weights)",
                                                         max_items=MAX_PROFILED_RUNS, sizing_mode="stretch_width")
        return pn.Column(
            pn.pane.Markdown(self.header(), sizing_mode="stretch_width"),
            pn.pane.Alert(notices, alert_type="warning", visible=bool(notices), sizing_mode="stretch_width"),
            pn.Tabs(
                ("Runs", pn.Column(pn.pane.Markdown("### Test accuracy by group"), self.grouped_table,
                                   pn.pane.Markdown("### Final runs"), self.run_table, sizing_mode="stretch_width")),
                ("Curves", pn.panel(self.curves, loading_indicator=True)),
                ("Tuning", pn.panel(self.tuning, loading_indicator=True)),
                ("Init vs trained", pn.Column(layer_picker, pn.panel(self.layers, loading_indicator=True),
                                              sizing_mode="stretch_width")),
                dynamic=True, sizing_mode="stretch_width",
            ),
            sizing_mode="stretch_width",
            name="runs-view",
        )

    def template(self) -> pn.template.BootstrapTemplate:
        """The Runs page: the same offline BootstrapTemplate as the main page (a FastListTemplate fetches its
        font from the internet)."""
        return pn.template.BootstrapTemplate(
            title="osa_lab · a study's runs: initialisation against training",
            sidebar=[self.controls()], main=[self], sidebar_width=330, header_background=ACCENT,
        )


__all__ = ["RunsView", "StudyTables", "curves_figure", "display_runs", "grouped_runs", "layers_figure", "load_study",
           "run_label", "tuning_figure"]
