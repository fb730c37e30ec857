"""The run and search records of a results folder, read as untrusted input.

A results folder may come from another machine or another person, so every JSON file under
``tune/``, ``final/`` and ``search/`` is checked before the tables use it: its size (at most
:data:`MAX_RECORD_BYTES`, looked up before reading), that it is a regular file, UTF-8 JSON, a
mapping nested at most :data:`MAX_NESTING` deep, with the fields a run of this study writes, of
the right types and ranges (accuracies in [0, 1], a known preset, a depth ≥ 1, …). A file that
fails is left out and named in a :class:`Notice`; it is never used, and the study (not the
summary) trains that run again.
"""

from __future__ import annotations

import json
import math
import stat
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from osa_lab.errors import MalformedResultError
from osa_lab.studies.training.config import DEFAULT_WARMUP_FRACTION

#: the largest run or search record read (a final run's JSON with its curve is a few kB)
MAX_RECORD_BYTES = 4 << 20
#: the deepest nesting of mappings and lists in a record (a run's is 3 deep)
MAX_NESTING = 8

STAGES = ("tune", "final")
STATUSES = ("ok", "diverged")


#: why a record is left out (one line): a damaged or foreign result, never used
RecordProblem = MalformedResultError


@dataclass(frozen=True)
class Notice:
    """A file of the results folder that was left out, and why."""

    path: Path
    reason: str

    def __str__(self) -> str:
        return f"left out {self.path}: {self.reason}"


@dataclass
class Records:
    """The checked records of a results folder: runs per stage, search records, and notices."""

    runs: dict[str, list[dict]] = field(default_factory=lambda: {s: [] for s in STAGES})
    search: list[dict] = field(default_factory=list)
    notices: list[Notice] = field(default_factory=list)


def _nesting(value: Any, limit: int) -> int:
    """The nesting depth of ``value`` (iterative; stops counting past ``limit``)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            deepest = max(deepest, depth)
            if deepest > limit:
                return deepest
            stack.extend((v, depth + 1) for v in (item.values() if isinstance(item, dict) else item))
    return deepest


def _parse(path: Path) -> dict:
    """The JSON mapping in ``path``, size, type and nesting bounded (:class:`RecordProblem` otherwise)."""
    try:
        info = path.stat()
        if not stat.S_ISREG(info.st_mode):
            raise RecordProblem("not a regular file")
        if info.st_size > MAX_RECORD_BYTES:
            raise RecordProblem(f"{info.st_size} bytes, over the limit of {MAX_RECORD_BYTES} for a run record")
        if info.st_size == 0:
            raise RecordProblem("empty (a run that was interrupted while writing?)")
        with path.open("rb") as fh:
            data = fh.read(MAX_RECORD_BYTES + 1)
    except OSError as err:
        raise RecordProblem(f"cannot be read ({err.strerror or err})") from None
    if len(data) > MAX_RECORD_BYTES:
        raise RecordProblem(f"over the limit of {MAX_RECORD_BYTES} bytes for a run record")
    try:
        value = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise RecordProblem("not UTF-8 text") from None
    except ValueError as err:
        raise RecordProblem(f"not valid JSON (truncated or damaged: {err})") from None
    except RecursionError:
        raise RecordProblem(f"nested more than {MAX_NESTING} levels deep") from None
    if not isinstance(value, dict):
        raise RecordProblem(f"holds {type(value).__name__}, not a mapping of a run's fields")
    if _nesting(value, MAX_NESTING) > MAX_NESTING:
        raise RecordProblem(f"nested more than {MAX_NESTING} levels deep")
    return value


# ---------------------------------------------------------------------------------- field checks


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _int(minimum: int) -> Callable[[Any], bool]:
    return lambda v: _is_int(v) and v >= minimum


def _positive(v: Any) -> bool:
    return _is_num(v) and math.isfinite(v) and v > 0


def _accuracy(v: Any) -> bool:
    """An accuracy in [0, 1], or NaN (a run that did not finish has none)."""
    return _is_num(v) and (math.isnan(v) or 0.0 <= v <= 1.0)


def _nonneg_or_missing(v: Any) -> bool:
    """A number ≥ 0 (inf allowed: an infinite κ), NaN, or null."""
    return v is None or (_is_num(v) and (math.isnan(v) or v >= 0))


def _nonneg(v: Any) -> bool:
    """A number ≥ 0 (inf allowed: an infinite κ) or NaN."""
    return _is_num(v) and (math.isnan(v) or v >= 0)


def _number_or_missing(v: Any) -> bool:
    return v is None or _is_num(v)


def _preset(v: Any) -> bool:
    from osa_lab.nn.presets import preset_names

    return isinstance(v, str) and v in preset_names(training=True)


def _ratios(v: Any) -> bool:
    return isinstance(v, list) and all(_nonneg(x) for x in v)


def _rank(v: Any) -> bool:
    return isinstance(v, dict) and all(isinstance(k, str) and _nonneg(x) for k, x in v.items())


def _split(v: Any) -> bool:
    return _rank(v) and set(v) <= {"fixed_mixing", "value", "output"}


def _layer_kappas(v: Any) -> bool:
    return isinstance(v, dict) and all(isinstance(k, str) and isinstance(x, list) and 0 < len(x) <= 10_000
                                       and all(_nonneg(y) for y in x) for k, x in v.items())  # fmt: skip


def _curve(v: Any) -> bool:
    if not isinstance(v, list):
        return False
    for row in v:
        if not isinstance(row, dict) or not _int(0)(row.get("epoch")) or not _int(0)(row.get("step")):
            return False
        for k, x in row.items():
            if k.endswith("accuracy") and not _accuracy(x):
                return False
            if k == "train_loss" and not _is_num(x):
                return False
    return True


#: field → (required, check, what it must be): the fields of a run record (:func:`study_run` writes them)
RUN_FIELDS: dict[str, tuple[bool, Callable[[Any], bool], str]] = {
    "stage": (True, lambda v: v in STAGES, f"one of {', '.join(STAGES)}"),
    "preset": (True, _preset, "a known preset"),
    "depth": (True, _int(1), "an int ≥ 1"),
    "seed": (True, _int(0), "an int ≥ 0"),
    "lr": (True, _positive, "a positive number"),
    "alpha_lr_mult": (True, _positive, "a positive number"),
    "warmup_fraction": (False, lambda v: _is_num(v) and 0 < v < 1, "a number in (0, 1)"),
    "status": (True, lambda v: v in STATUSES, f"one of {', '.join(STATUSES)}"),
    "steps": (False, _int(1), "an int ≥ 1"),
    "epochs": (False, _int(1), "an int ≥ 1"),
    "train_accuracy": (False, _accuracy, "an accuracy in [0, 1] or NaN"),
    "val_accuracy": (False, _accuracy, "an accuracy in [0, 1] or NaN"),
    "test_accuracy": (False, _accuracy, "an accuracy in [0, 1] or NaN"),
    "train_loss": (False, _number_or_missing, "a number"),
    "steps_to_90": (False, _nonneg_or_missing, "a number ≥ 0, NaN or null"),
    "kappa_init": (False, _nonneg, "a number ≥ 0 or NaN"),
    "kappa_trained": (False, _nonneg, "a number ≥ 0 or NaN"),
    "sub_block_kappa_init": (False, _rank, "a mapping of part → κ"),
    "sub_block_kappa_trained": (False, _rank, "a mapping of part → κ"),
    "osa_split_init": (False, _split, "a mapping of fixed_mixing, value, output → κ"),
    "osa_split_trained": (False, _split, "a mapping of fixed_mixing, value, output → κ"),
    "sub_block_kappa_layers_init": (False, _layer_kappas, "a mapping of part → a list of κ per layer"),
    "sub_block_kappa_layers_trained": (False, _layer_kappas, "a mapping of part → a list of κ per layer"),
    "epoch_time_s": (False, _nonneg, "a number ≥ 0 or NaN"),
    "rank_init": (False, _rank, "a mapping of numbers"),
    "rank_trained": (False, _rank, "a mapping of numbers"),
    "mixing_ratio_init": (False, _ratios, "a list of numbers"),
    "mixing_ratio_trained": (False, _ratios, "a list of numbers"),
    "curve": (False, _curve, "a list of {epoch, step, train_loss, …accuracy in [0, 1]}"),
    "error": (False, lambda v: isinstance(v, str), "text"),
}


def _setting(v: Any) -> bool:
    """[lr, α-lr multiplier] or [lr, α-lr multiplier, warm-up fraction] (a search record of a study
    that did not tune the warm-up has pairs)."""
    return (isinstance(v, list) and len(v) in (2, 3) and all(_positive(x) for x in v)
            and (len(v) == 2 or v[2] < 1))  # fmt: skip


def setting_of(values: Sequence[float]) -> tuple[float, float, float]:
    """(lr, α-lr multiplier, warm-up fraction) from a search record's list (a pair: the default warm-up)."""
    lr, mult, *rest = (float(v) for v in values)
    return lr, mult, rest[0] if rest else DEFAULT_WARMUP_FRACTION


def run_setting(record: Mapping[str, Any]) -> tuple[float, float, float]:
    """(lr, α-lr multiplier, warm-up fraction) of a run record (one without a warm-up had the default)."""
    return (float(record["lr"]), float(record["alpha_lr_mult"]),
            float(record.get("warmup_fraction", DEFAULT_WARMUP_FRACTION)))  # fmt: skip


#: how a search chose its setting: the tie rule among points that trained on every tuning seed, or (none did)
#: the point that failed on the fewest tuning seeds
TIE_RULE, FEWEST_FAILURES = "tie rule", "fewest failures"
CHOSEN_BY = (TIE_RULE, FEWEST_FAILURES)

#: the fields of a search record (:meth:`StudyRunner.tune` writes them)
SEARCH_FIELDS: dict[str, tuple[bool, Callable[[Any], bool], str]] = {
    "preset": (True, _preset, "a known preset"),
    "depth": (True, _int(1), "an int ≥ 1"),
    "chosen": (True, lambda v: v is None or _setting(v), "null or [lr, α-lr multiplier, warm-up fraction]"),
    "top": (False, lambda v: v is None or _setting(v), "null or [lr, α-lr multiplier, warm-up fraction]"),
    "extension_points": (False, lambda v: isinstance(v, list) and all(_setting(p) for p in v),
                         "a list of [lr, mult, warm-up]"),
    "edge_after_limit": (False, lambda v: isinstance(v, list) and all(isinstance(s, str) for s in v), "a list of text"),
    "chosen_by": (False, lambda v: v in CHOSEN_BY, " or ".join(f"{w!r}" for w in CHOSEN_BY)),
    "chosen_failures": (False, _int(0), "an int ≥ 0"),
}


def check_record(value: dict, fields: dict[str, tuple[bool, Callable[[Any], bool], str]]) -> dict:
    """``value`` if every field of ``fields`` it has passes its check and the required ones are there."""
    for name, (required, check, what) in fields.items():
        if name not in value:
            if required:
                raise RecordProblem(f"has no `{name}`")
            continue
        if not check(value[name]):
            shown = repr(value[name])
            raise RecordProblem(f"`{name}` must be {what}, got {shown[:60] + '…' if len(shown) > 60 else shown}")
    return value


def read_run(path: str | Path, stage: str | None = None) -> dict:
    """One run record, checked (:class:`RecordProblem` naming the first problem otherwise)."""
    record = check_record(_parse(Path(path)), RUN_FIELDS)
    if stage is not None and record["stage"] != stage:
        raise RecordProblem(f"a {record['stage']} run in the {stage} folder")
    return record


class RecordCache:
    """Checked run records kept between reads of one results folder, keyed by each file's identity.

    A study regenerates its tables after every cell, so without it every record would be parsed and
    checked again each time. The key is the file's device, inode, size, modification time and
    status-change time: a file replaced (records are written atomically, as a new file) or
    rewritten in place, even at the same size with its modification time put back (``cp -p``), has
    another key and is read again, since every write sets the status-change time and nothing can put
    it back (only an in-place rewrite at the same size within one tick of the file system's clock
    after the last read would go unseen; the study writes atomically). A file that fails its checks
    is never kept. The records are shared between reads: read them, never change them.
    """

    def __init__(self) -> None:
        self._kept: dict[tuple[Path, str], tuple[tuple[int, ...], dict]] = {}
        self._seen: set[tuple[Path, str]] = set()

    def __len__(self) -> int:
        """The number of records kept."""
        return len(self._kept)

    def read_run(self, path: Path, stage: str) -> dict:
        """:func:`read_run` of ``path``, from the cache while the file is unchanged."""
        try:
            info = path.stat()  # before reading: a file replaced after this is read again next time
        except OSError:
            return read_run(path, stage)  # names the problem
        key = (path, stage)
        identity = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)
        self._seen.add(key)
        kept = self._kept.get(key)
        if kept is not None and kept[0] == identity:
            return kept[1]
        self._kept.pop(key, None)
        record = read_run(path, stage)
        self._kept[key] = (identity, record)
        return record

    def forget_unseen(self) -> None:
        """Drop the records of files not read since the last call (removed from the folder)."""
        self._kept = {k: v for k, v in self._kept.items() if k in self._seen}
        self._seen = set()


def read_records(results: str | Path, cache: RecordCache | None = None) -> Records:
    """Every record under ``results`` (``tune/``, ``final/``, ``search/``), checked; the others named in notices.

    With ``cache``, run records unchanged since the cache last read them are not parsed again."""
    results = Path(results)
    out = Records()
    for stage in STAGES:
        for path in sorted((results / stage).glob("*.json")):
            try:
                out.runs[stage].append(cache.read_run(path, stage) if cache is not None else read_run(path, stage))
            except RecordProblem as err:
                out.notices.append(Notice(path, str(err)))
    if cache is not None:
        cache.forget_unseen()
    for path in sorted((results / "search").glob("*.json")):
        try:
            out.search.append(check_record(_parse(path), SEARCH_FIELDS))
        except RecordProblem as err:
            out.notices.append(Notice(path, str(err)))
    return out
