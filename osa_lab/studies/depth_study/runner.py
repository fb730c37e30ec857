"""The study's driver: per preset × depth, a bracketing tuning search, then the final seeds.

Cells run one after the other in :meth:`StudySpec.run_order`; within a cell every tuning round
and the final seeds are one :func:`osa_lab.studies.grid.run_grid` each (in-process, a local Dask
cluster, or ``--scheduler``). Each finished run writes its JSON under the results folder at
once, the cell's search record goes to ``search/``, and the tables and verdict are regenerated
after every cell — so the folder is always a consistent (possibly partial) study, and a rerun,
here or on another machine, continues from it.

A task that fails with a user error (:class:`~osa_lab.errors.UserError`: a full disk or a
read-only folder, missing data) stops the study with that error's one line. Any other failed
task (an exception inside a run, not a diverged loss) is counted; :func:`run_study`
returns the count (``"failed_tasks"`` of ``"tasks"``, with the first failure's line) so the
command line exits with status 1 and says how many. The checkpoint scratch folder is
``runs/experiments/<name>-<profile>-checkpoints`` unless given (``--checkpoints``); a study name is
a plain name (:mod:`.spec`), so the default folder stays inside ``runs/experiments/``. One study at
a time owns a checkpoint folder (its ``study.lock``): a second one is refused before any work.
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

import yaml

from osa_lab.errors import ConfigurationError
from osa_lab.fileio import OutputLock, atomic_write_text
from osa_lab.studies.depth_study.bracket import BracketState
from osa_lab.studies.depth_study.records import FEWEST_FAILURES, TIE_RULE, RecordCache
from osa_lab.studies.depth_study.report import run_outcome, summarise
from osa_lab.studies.depth_study.run import budget_error, budget_mismatch, result_name, study_group_run
from osa_lab.studies.depth_study.spec import AXES, StudySpec
from osa_lab.studies.depth_study.tuning_checks import setting_words
from osa_lab.studies.grid import GridOptions, Task, run_grid, shared_cluster
from osa_lab.studies.grid.results import first_line
from osa_lab.studies.training.compare import seed_groups, user_error_from_name
from osa_lab.studies.training.config import comparable_json, learns_alpha


def is_user_error_name(name: str) -> bool:
    """True if ``name`` is a :class:`~osa_lab.errors.UserError` type of :mod:`osa_lab.errors` (a task's error type)."""
    import osa_lab.errors as errors_module

    cls = getattr(errors_module, name, None)
    return isinstance(cls, type) and issubclass(cls, errors_module.UserError)


def _say(text: str) -> None:
    print(f"[study {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


class StudyRunner:
    """Runs :class:`StudySpec` into ``results`` (JSON per run) with checkpoints under ``scratch``."""

    def __init__(self, spec: StudySpec, results: Path, scratch: Path, options: GridOptions) -> None:
        self.spec, self.results, self.scratch, self.options = spec, results, scratch, options
        self.tasks = 0  # grid tasks run (cached ones included)
        self.failures: list[str] = []  # one line per failed task
        self.records = RecordCache()  # the tables are regenerated after every cell; each record is parsed once
        self.spec_dict = {"data": spec.data, "val_fraction": spec.val_fraction, "batch_size": spec.batch_size,
                          "model": dict(spec.model), "kappa_samples": spec.kappa_samples}  # fmt: skip

    def _tasks(self, stage: str, preset: str, depth: int, points, seeds, steps: int) -> list[Task]:
        """One task per seed group of each setting (:func:`study_group_run`), in seed order: groups of
        the study's ``group_size``, or by :func:`seed_groups`' default rule when it is 0 (the setting's
        seeds in one group from six seeds up, each seed alone below). Every run, tuning runs included,
        records κ end to end, per sub-block and the OSA split at initialisation and after training."""
        tasks = []
        for lr, mult, warmup in points:
            for group in seed_groups(seeds, self.spec.group_size or None):
                kwargs = {"spec": self.spec_dict, "stage": stage, "preset": preset, "depth": depth,
                          "seeds": group, "lr": lr, "alpha_lr_mult": mult, "warmup_fraction": warmup, "steps": steps,
                          "results_dir": str(self.results), "scratch_dir": str(self.scratch), "kappa": True}  # fmt: skip
                name = result_name(stage, preset, depth, 0, lr, mult, warmup)
                key = name.replace("/", "-").removesuffix("-s0.json") + "-s" + "_".join(str(s) for s in group)
                tasks.append(Task(study_group_run, kwargs, {"stage": stage, "preset": preset, "depth": depth, "lr": lr,
                                                            "alpha_lr_mult": mult, "warmup_fraction": warmup,
                                                            "seeds": ",".join(str(s) for s in group)},
                                  key=key, progress_kwarg="progress"))  # fmt: skip
        return tasks

    def _run(self, tasks: list[Task], desc: str) -> list[dict | None]:
        """The runs' results, seed by seed in task order (None for each seed of a failed task)."""
        result = run_grid(tasks, self.options, desc=desc)
        for o in result.failed:  # bad input or environment (a full disk, missing data): stop with its one line
            if is_user_error_name(o.error_type):
                raise user_error_from_name(o.error_type, first_line(o.error, limit=2000))
        self.tasks += len(result.outcomes)
        for line in result.failure_lines():
            self.failures.append(line)
            _say(f"failed (rerun retries it): {line}")
        values: list[dict | None] = []
        for o in result.outcomes:
            values.extend(o.value if o.ok else [None] * len(o.task.kwargs["seeds"]))
        return values

    def tune(self, preset: str, depth: int) -> tuple[float, float, float] | None:
        """The bracketing search of one cell; returns the chosen (lr, α-lr multiplier, warm-up
        fraction), None if a tuning task failed to run. Where no point trained on every tuning seed, the
        point that failed on the fewest is chosen (``chosen_by`` "fewest failures" in the search record),
        so that the final seeds measure the cell's failure rate. The α-lr multiplier is an axis for
        presets that learn α (1 for the others), the warm-up for every preset."""
        t = self.spec.tuning
        axes = tuple(a for a in AXES if a != "alpha_lr_mult" or learns_alpha(preset))
        state = BracketState(axes, {a: getattr(t, a) for a in axes}, {a: getattr(t, f"{a}_bounds") for a in axes},
                             factor=t.extension_factor, max_extensions=t.max_extensions,
                             tie_margin=t.tie_margin)  # fmt: skip

        def as_setting(p: tuple[float, ...]) -> list[float]:
            named = dict(zip(axes, p, strict=True))
            return [named["lr"], named.get("alpha_lr_mult", 1.0), named["warmup_fraction"]]

        points, rounds = state.initial_points(), 0
        while points:
            settings = [tuple(as_setting(p)) for p in points]
            values = self._run(self._tasks("tune", preset, depth, settings, t.seeds, t.steps),
                               f"tune {preset} d{depth} r{rounds}")  # fmt: skip
            n = len(t.seeds)
            if any(v is None for v in values):  # a run failed (not diverged): choosing now would be on missing data
                _say(f"{preset} depth {depth}: {sum(v is None for v in values)} tuning run(s) failed; the cell is "
                     "skipped and a rerun retries them")  # fmt: skip
                return None
            for i, point in enumerate(points):
                runs = values[i * n : (i + 1) * n]
                # a run that collapsed or never recovered from a loss jump is a failure, like a divergence
                finished = [r["val_accuracy"] for r in runs if run_outcome(r)[0] == "ok"]
                state.failures[point] = n - len(finished)
                state.finished_scores[point] = sum(finished) / len(finished) if finished else math.nan
                state.scores[point] = state.finished_scores[point] if len(finished) == n else math.nan
            points, rounds = state.next_points(), rounds + 1
        best, chosen_by = state.best(), TIE_RULE
        if best is None:
            best, chosen_by = state.least_failed(), FEWEST_FAILURES
            _say(f"{preset} depth {depth}: no tuning point trained on every tuning seed; the final seeds run at "
                 "the one that failed on the fewest, to measure the failure rate")  # fmt: skip
        top = state.top()
        record = {"preset": preset, "depth": depth, "axes": list(axes), "rounds": rounds,
                  "scores": [[*as_setting(p), s] for p, s in sorted(state.scores.items())],
                  "extension_points": [as_setting(p) for p in sorted(state.added_by_extension)],
                  "extensions": {f"{a} {s}": n for (a, s), n in state.extensions.items()},
                  "tie_margin": t.tie_margin, "top": as_setting(top) if top is not None else None,
                  "chosen": as_setting(best) if best is not None else None, "chosen_by": chosen_by,
                  "chosen_failures": state.failures.get(best, 0) if best is not None else 0,
                  "edge_after_limit": state.edge_after_limit()}  # fmt: skip
        atomic_write_text(self.results / "search" / f"{preset}-d{depth}.json", json.dumps(record, indent=1))
        return tuple(record["chosen"]) if best is not None else None

    def run(self) -> dict:
        """Every cell in order; the tables are regenerated after each. A results folder of another budget is
        refused first (:func:`check_results_budget`), before anything in it changes."""
        check_results_budget(self.spec, self.results, self.spec_dict)
        atomic_write_text(self.results / "experiment.yaml", yaml.safe_dump(self.spec.to_dict(), sort_keys=False))
        t0 = time.perf_counter()
        out = None
        for preset, depth in self.spec.run_order():
            _say(f"{preset} depth {depth}: tuning")
            chosen = self.tune(preset, depth)
            if chosen is None:
                _say(f"{preset} depth {depth}: no setting chosen; no final runs")
            else:
                seeds = self.spec.final_seeds(depth)
                _say(f"{preset} depth {depth}: {setting_words(chosen)}; {len(seeds)} final seeds")
                self._run(self._tasks("final", preset, depth, [chosen], seeds, self.spec.steps),
                          f"final {preset} d{depth}")  # fmt: skip
            out = summarise(self.results, self.spec, cache=self.records)  # the last cell's are the study's tables
        if out is None:  # a study without cells still gets its (empty) tables
            out = summarise(self.results, self.spec, cache=self.records)
        failed = f"; {len(self.failures)} of {self.tasks} tasks failed" if self.failures else ""
        _say(f"done in {time.perf_counter() - t0:.0f} s{failed}; tables and verdict under {self.results}/")
        return {**out, "tasks": self.tasks, "failed_tasks": len(self.failures), "failures": list(self.failures)}


#: the fields of a recorded ``experiment.yaml`` that fix a run's budget (``tuning.steps`` for the tuning runs)
BUDGET_FIELDS = ("data", "batch_size", "val_fraction", "model", "steps", "tuning.steps")


def check_results_budget(spec: StudySpec, results: Path, spec_dict: dict) -> None:
    """Refuse (:class:`ConfigurationError`, one line) a results folder whose ``experiment.yaml`` or finished
    runs have another budget than ``spec``: another profile's folder, or the same one after ``steps``,
    the data or the model changed. The runs would otherwise be reused, or joined by runs of the new
    budget in the same tables. Damaged records are left to the run that trains them again."""
    from osa_lab.studies.depth_study.records import RecordProblem, read_run

    recorded = results / "experiment.yaml"
    try:
        old = yaml.safe_load(recorded.read_text(encoding="utf-8")) if recorded.is_file() else None
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        old = None  # unreadable: it is rewritten; the runs below are still checked
    if isinstance(old, dict):
        new = spec.to_dict()
        for field in BUDGET_FIELDS:
            head, _, tail = field.partition(".")
            was, now = old.get(head), new.get(head)
            if tail:
                was, now = (was or {}).get(tail) if isinstance(was, dict) else None, (now or {}).get(tail)
            if comparable_json(was) != comparable_json(now):
                raise ConfigurationError(
                    f"{recorded} records `{field}` {was!r}, but this study has {now!r}: the results folder holds "
                    "another study's runs; give this study its own `results` folder (--output)")  # fmt: skip
    for stage, steps in (("tune", spec.tuning.steps), ("final", spec.steps)):
        for path in sorted((results / stage).glob("*.json")):
            try:
                record = read_run(path, stage)
            except RecordProblem:
                continue
            differs = budget_mismatch(record, spec_dict, int(record["depth"]), steps)
            if differs:
                raise budget_error(path, differs)


SCRATCH_ROOT = Path("runs") / "experiments"

#: the lock file by which one study owns its checkpoint folder
STUDY_LOCK_NAME = "study.lock"


def scratch_folder(spec: StudySpec) -> Path:
    """The checkpoint scratch folder of ``spec``: ``runs/experiments/<name>-<profile>-checkpoints``,
    refused (:class:`ConfigurationError`) if it would lie outside ``runs/experiments/``."""
    scratch = SCRATCH_ROOT / f"{spec.name}-{spec.profile}-checkpoints"
    root = SCRATCH_ROOT.resolve()
    if scratch.resolve().parent != root:
        raise ConfigurationError(f"`name` {spec.name!r} would put the checkpoint folder outside {SCRATCH_ROOT}/; "
                                 "give a plain name (letters, digits, '-', '_')")  # fmt: skip
    return scratch


def run_study(spec: StudySpec, results: str | Path | None = None, scratch: str | Path | None = None,
              options: GridOptions | None = None) -> dict:  # fmt: skip
    """Run (or resume) the study; returns the tables of :func:`osa_lab.studies.depth_study.report.summarise`
    and ``"tasks"``, ``"failed_tasks"`` and ``"failures"`` (one line per failed grid task).

    The study owns ``scratch`` while it runs: a second study given the same checkpoint folder gets
    :class:`~osa_lab.errors.RunLockedError` naming the first before it trains anything."""
    results = Path(results or spec.results)
    scratch = Path(scratch) if scratch is not None else scratch_folder(spec)
    options = options or GridOptions.in_process(progress=False)
    lock = OutputLock(scratch / STUDY_LOCK_NAME, f"checkpoint folder {scratch}",
                      instead="another checkpoint folder (--checkpoints)")  # fmt: skip
    with lock, shared_cluster(options) as shared:
        return StudyRunner(spec, results, scratch, shared or options).run()
