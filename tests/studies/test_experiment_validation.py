"""Hostile experiment files and results folders: refused before any work, or named and left out.

An experiment file starts hours of work and may come from anyone; a results folder is read by
``--summary-only``. Each bad experiment file must give exit status 2, one error line, no traceback,
no training and no file written; each bad run record must be named in a notice and never used.
"""

from __future__ import annotations

import errno
import json
import os
import tracemalloc
from pathlib import Path

import pytest

from osa_lab.cli import main as cli_main
from osa_lab.errors import ConfigurationError, OutputWriteError
from osa_lab.studies.depth_study import records as records_module
from osa_lab.studies.depth_study import report
from osa_lab.studies.depth_study.spec import StudySpec, load_spec, schema_table, spec_from_dict
from tests.helpers import assert_cli_user_error
from tests.studies.test_depth_study import _spec, _write_run

ROOT = Path(__file__).resolve().parents[2]

BASE = """\
name: tiny
data: mnist1d
steps: 36
batch_size: 100
model: {dim: 8, heads: 2}
cells:
  - {presets: [vit, skipless-osa], depths: [1]}
seeds: {1: 2}
tuning: {steps: 36, seeds: [1000, 1001], lr: [0.003, 0.01], alpha_lr_mult: [10], max_extensions: 1}
kappa_samples: 1
"""


def edit(old: str, new: str) -> bytes:
    assert old in BASE, old
    return BASE.replace(old, new).encode()


def many_runs() -> bytes:
    depths = list(range(1, 61))
    return (BASE.replace("depths: [1]", f"depths: {depths}")
            .replace("seeds: {1: 2}", "seeds: {" + ", ".join(f"{d}: 100" for d in depths) + "}")
            .replace("seeds: [1000, 1001]", "seeds: [5000, 5001]")).encode()  # fmt: skip


#: (case, file contents, regex the one error line must match)
BAD_EXPERIMENTS = [
    # tracebacks before
    ("binary file", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff\xfe", r"not UTF-8 text"),
    ("NUL bytes", BASE.encode() + b"\x00\x00", r"NUL bytes"),
    ("5000-deep nesting", b"name: tiny\nmodel: " + b"[" * 5000 + b"]" * 5000 + b"\n", r"nesting deeper than 16 levels"),
    ("a count that is a word", edit("seeds: {1: 2}", "seeds: {1: two}"), r"`seeds\.1`: must be a whole number ≥ 1, got 'two'"),
    ("1e308 (a string in YAML 1.1)", edit("max_extensions: 1", "max_extensions: 1, extension_factor: 1e308"),
     r"`tuning\.extension_factor`: must be a finite number in \(1, 1000\], got 1e\+308"),
    # crashes after the training before
    ("zero final seeds", edit("seeds: {1: 2}", "seeds: {1: 0}"), r"`seeds\.1`: must lie in \[1, "),
    ("a negative count", edit("seeds: {1: 2}", "seeds: {1: -3}"), r"`seeds\.1`: must lie in \[1, "),
    # failures reported as success before
    ("depth 0", edit("depths: [1]", "depths: [0]"), r"`cells\[0\]\.depths\[0\]`: must lie in \[1, "),
    ("batch 0", edit("batch_size: 100", "batch_size: 0"), r"`batch_size`: must lie in \[1, "),
    ("an unknown model key", edit("heads: 2}", "heads: 2, widht: 4}"), r"unknown key 'widht' in `model`"),
    ("a claim of an unknown kind", edit("kappa_samples: 1", "kappa_samples: 1\nclaims: [{preset: vit, other: skipless-osa, kind: better}]"),
     r"`claims\[0\]\.kind`: unknown kind 'better'.*equivalence, superiority"),
    ("a claim against itself", edit("kappa_samples: 1", "kappa_samples: 1\nclaims: [{preset: vit, other: vit, kind: superiority}]"),
     r"`claims\[0\]`: compares `vit` with itself"),
    ("a claim on an unknown endpoint", edit("kappa_samples: 1", "kappa_samples: 1\nclaims: [{preset: vit, other: skipless-osa, "
                                        "kind: superiority, endpoint: val_loss}]"), r"`claims\[0\]\.endpoint`: unknown endpoint"),
    ("a warm-up of a whole run", edit("max_extensions: 1}", "max_extensions: 1, warmup_fraction: [0.05, 1.0]}"),
     r"`tuning\.warmup_fraction\[1\]`"),
    ("heads that do not divide dim", edit("heads: 2}", "heads: 3}"),
     r"`model` with preset 'vit' at depth 1: `dim`=8 is not divisible by `heads`=3"),
    ("data: /etc/shadow", edit("data: mnist1d", "data: /etc/shadow"), r"`data`: unknown data set '/etc/shadow'"),
    ("a negative seed-group size", edit("kappa_samples: 1", "kappa_samples: 1\ngroup_size: -1"), r"`group_size`: must lie in \[0, "),
    ("a fractional seed-group size", edit("kappa_samples: 1", "kappa_samples: 1\ngroup_size: 0.5"),
     r"`group_size`: must be a whole number.*a float"),
    ("negative tuning seeds", edit("seeds: [1000, 1001]", "seeds: [-1, 1000]"), r"`tuning\.seeds\[0\]`: must lie in \[0, "),
    # late refusal before
    ("an unknown preset in a later cell", edit("depths: [1]}", "depths: [1]}\n  - {presets: [mlp, skipless-osx], depths: [1]}"),
     r"`cells\[1\]\.presets\[1\]`: unknown preset 'skipless-osx'; did you mean 'skipless-osa'"),
    # silently accepted nonsense before
    ("steps 0", edit("steps: 36\n", "steps: 0\n"), r"`steps`: must lie in \[1, "),
    ("steps -5", edit("steps: 36\n", "steps: -5\n"), r"`steps`: must lie in \[1, "),
    ("a float count of seeds", edit("seeds: {1: 2}", "seeds: {1: 2.5}"), r"`seeds\.1`: must be a whole number.*a float"),
    ("float tuning seeds", edit("seeds: [1000, 1001]", "seeds: [1000.5, 1001]"), r"`tuning\.seeds\[0\]`: .*a float"),
    ("1e12 steps", edit("steps: 36\n", "steps: 1000000000000\n"), r"`steps`: 1e\+12 is over the limit of 100000.*--allow-large"),
    ("depth 1e9", edit("depths: [1]", "depths: [1000000000]").replace(b"{1: 2}", b"{1000000000: 2}"),
     r"`cells\[0\]\.depths\[0\]`: 1e\+09 is over the limit of 256.*--allow-large"),
    ("1e9 seeds", edit("seeds: {1: 2}", "seeds: {1: 1000000000}"), r"`seeds\.1`: 1e\+09 is over the limit of 100.*--allow-large"),
    ("too many runs in all", many_runs(), r"at least \d+ training runs, over the limit of 5000.*--allow-large"),
    ("a duplicate key", BASE.encode() + b"steps: 40\n", r"the key 'steps' appears twice \(lines 3 and 11\)"),
    ("a duplicate nested key", edit("steps: 36, seeds", "steps: 36, steps: 40, seeds"), r"the key 'steps' appears twice"),
    # paths
    ("name ../../../x", edit("name: tiny", "name: ../../../x"), r"`name`: must be a plain name"),
    ("name with a slash", edit("name: tiny", "name: a/b"), r"`name`: must be a plain name"),
    # more of the same kind
    ("an unknown top-level key", BASE.encode() + b"steps_total: 5\n", r"unknown key 'steps_total' at the top level"),
    ("a top-level list", b"- name\n- tiny\n", r"must hold a mapping of settings, got list"),
    ("an empty file", b"", r"must hold a mapping of settings, got NoneType"),
    ("an alias", edit("lr: [0.003, 0.01], alpha_lr_mult: [10]", "lr: &grid [0.003, 0.01], alpha_lr_mult: *grid"),
     r"uses an alias"),
    ("yes for a boolean (YAML 1.1)", edit("heads: 2}", "heads: 2, learn_alpha: yes}"), r"`model\.learn_alpha`: must be true or false, got 'yes'"),
    ("a file over 1 MiB", BASE.encode() + b"#" * (1 << 20) + b"\n", r"over the limit of 1048576"),
    ("a broken profile (checked without --quick)", BASE.encode() + b"profiles:\n  quick: {steps: 0}\n",
     r"profile 'quick': `steps`: must lie in \[1, "),
    ("a profile that is no plain name", BASE.encode() + b"profiles:\n  ../q: {steps: 2}\n", r"`profiles key`: must be a plain name"),
    ("no name", edit("name: tiny\n", ""), r"`name`: is missing"),
    ("a depth without final seeds", edit("depths: [1]", "depths: [1, 2]"), r"`seeds`:? gives no number of final seeds for depth\(s\) \[2\]"),
    ("seeds for a depth no cell runs", edit("seeds: {1: 2}", "seeds: {1: 2, 3: 2}"), r"names depth\(s\) \[3\] that no cell runs"),
    ("tuning seeds that are final seeds", edit("seeds: [1000, 1001]", "seeds: [1, 1000]"), r"tuning seeds \[1\] are also final seeds"),
    ("one tuning seed", edit("seeds: [1000, 1001]", "seeds: [1000]"), r"`tuning\.seeds`: must hold 2 to 100 values"),
    ("a start lr outside its bounds", edit("lr: [0.003, 0.01]", "lr: [0.003, 0.5]"), r"`tuning\.lr`: start value\(s\) \[0\.5\] lie outside"),
    ("a NaN lr", edit("lr: [0.003, 0.01]", "lr: [.nan]"), r"`tuning\.lr\[0\]`: must be a finite number"),
    ("val_fraction 1", BASE.encode() + b"val_fraction: 1\n", r"`val_fraction`: must be a finite number in \(0, 1\)"),
    ("a gate over 100 %", BASE.encode() + b"gate: {mlp: 1.5}\n", r"`gate\.mlp`: must be a finite number in \[0, 1\]"),
    ("cells that are not a list", edit("cells:\n  - {presets: [vit, skipless-osa], depths: [1]}", "cells: vit"), r"`cells`: must be a list"),
    ("a cell without depths", edit(", depths: [1]}", "}"), r"`cells\[0\]`: has no `depths`"),
    ("repeated presets", edit("[vit, skipless-osa]", "[vit, vit]"), r"`cells\[0\]\.presets`: holds repeated values"),
    ("a YAML syntax error", b"name: [tiny\n", r"not valid YAML at line"),
    ("a bad results path", BASE.encode() + b"results: ''\n", r"`results`: must be a path"),
]


@pytest.fixture
def no_training(monkeypatch, tmp_path):
    """Fail the test if any training or study run starts; work in ``tmp_path`` (the scratch folder is relative)."""
    from osa_lab.studies import depth_study
    from osa_lab.studies.depth_study import runner
    from osa_lab.studies.training import loop

    def refuse(*args, **kwargs):
        raise AssertionError("training started")

    monkeypatch.setattr(depth_study, "run_study", refuse)
    monkeypatch.setattr(runner, "study_group_run", refuse)
    monkeypatch.setattr(loop, "train", refuse)
    monkeypatch.chdir(tmp_path)


@pytest.mark.parametrize(("case", "contents", "match"), BAD_EXPERIMENTS, ids=[c[0] for c in BAD_EXPERIMENTS])
def test_a_hostile_experiment_file_is_one_line_exit_2_and_trains_nothing(case, contents, match, tmp_path, no_training):
    exp = tmp_path / "exp.yaml"
    exp.write_bytes(contents)
    line = assert_cli_user_error(["train", "--experiment", str(exp), "--output", str(tmp_path / "out"), "--serial",
                                  "--quiet"], match, watch=[tmp_path])  # fmt: skip
    assert len(line) < 600, line  # one readable line, not a dump of the file


@pytest.mark.parametrize(("argv", "match"), [
    (["--quick"], r"has no profile 'quick'"),
    (["--summary-only"], r"holds no study results"),
    (["--threads", "0"], r"--threads must be a positive int"),
])  # fmt: skip
def test_a_bad_request_of_a_good_experiment_file_is_one_line(argv, match, tmp_path, no_training):
    exp = tmp_path / "exp.yaml"
    exp.write_text(BASE)
    assert_cli_user_error(["train", "--experiment", str(exp), "--output", str(tmp_path / "out"), *argv], match,
                          watch=[tmp_path])  # fmt: skip


@pytest.mark.parametrize("path, match", [("missing.yaml", r"cannot read the experiment file"),
                                         (".", r"is not a regular file")])  # fmt: skip
def test_an_experiment_path_that_is_no_file_is_one_line(path, match, tmp_path, no_training):
    assert_cli_user_error(["train", "--experiment", str(tmp_path / path), "--output", str(tmp_path / "out")], match,
                          watch=[tmp_path])  # fmt: skip


def test_a_hostile_experiment_file_gives_no_traceback_in_a_terminal(tmp_path):
    """End to end in a subprocess: what a user's terminal shows for the binary file and the deep nesting."""
    from tests.helpers import assert_cli_user_error_subprocess

    for name, contents, match in (BAD_EXPERIMENTS[0], BAD_EXPERIMENTS[2]):
        exp = tmp_path / f"{name.replace(' ', '-')}.yaml"
        exp.write_bytes(contents)
        assert_cli_user_error_subprocess(["train", "--experiment", str(exp), "--output", str(tmp_path / "o")], match,
                                         watch=[tmp_path], cwd=ROOT)  # fmt: skip


def test_allow_large_lifts_the_size_bounds_and_the_paths_are_printed_first(tmp_path, monkeypatch, capsys):
    from osa_lab.studies import depth_study

    calls = []

    def fake_study(spec, results, scratch, options=None):
        calls.append((spec, Path(results), Path(scratch)))
        return {"verdict": "fake verdict", "notices": [], "tasks": 0, "failed_tasks": 0, "failures": []}

    monkeypatch.setattr(depth_study, "run_study", fake_study)
    monkeypatch.chdir(tmp_path)
    exp = tmp_path / "exp.yaml"
    exp.write_bytes(edit("steps: 36\n", "steps: 1000000000000\n"))
    out = tmp_path / "out"
    assert cli_main(["train", "--experiment", str(exp), "--output", str(out), "--serial", "--allow-large"]) == 0
    (spec, results, scratch), = calls
    assert spec.steps == 10**12 and results == out and scratch == Path("runs/experiments/tiny-full-checkpoints")
    err = capsys.readouterr().err.splitlines()
    assert err[0] == (f"osa-lab train: study tiny (full profile, at least {spec.planned_runs()} runs): results under "
                      f"{out}/, checkpoints under runs/experiments/tiny-full-checkpoints/")  # fmt: skip
    # --checkpoints puts the checkpoint folder anywhere writable, and the first line says where
    assert cli_main(["train", "--experiment", str(exp), "--output", str(out), "--checkpoints", str(tmp_path / "c"),
                     "--serial", "--allow-large"]) == 0  # fmt: skip
    assert calls[-1][2] == tmp_path / "c"
    assert capsys.readouterr().err.splitlines()[0].endswith(f"checkpoints under {tmp_path / 'c'}/")
    # a --checkpoints that is a file is one line and exit 2, before the study starts
    (tmp_path / "f").write_text("")
    assert cli_main(["train", "--experiment", str(exp), "--checkpoints", str(tmp_path / "f"), "--serial",
                     "--allow-large"]) == 2  # fmt: skip
    assert capsys.readouterr().err.strip() == f"osa-lab train: error: --checkpoints {tmp_path / 'f'} is a file, not a directory; give a folder path"
    assert len(calls) == 2


def test_yaml_1_2_numbers_and_the_study_file_itself(tmp_path):
    """``1e-5`` is a float (YAML 1.1 reads a string), ``010`` is ten (not octal eight); the
    repository's experiment file passes every check, each of its profiles too."""
    exp = tmp_path / "e.yaml"
    exp.write_bytes(edit("max_extensions: 1", "max_extensions: 1, lr_bounds: [1e-5, 3e-1]").replace(b"steps: 36\n", b"steps: 010\n"))
    spec = load_spec(exp)
    assert spec.tuning.lr_bounds == (1e-5, 0.3) and spec.steps == 10
    for name in ("mnist1d_depth.yaml", "mnist1d_large_depth.yaml"):
        for profile in (None, "quick"):
            assert load_spec(ROOT / "experiments" / name, profile).cells, (name, profile)
    large = load_spec(ROOT / "experiments" / "mnist1d_large_depth.yaml")
    assert large.data == "mnist1d-large" and large.tuning.steps == large.steps  # tuned at the full budget
    assert len(large.tuning.seeds) >= 3 and min(large.seeds.values()) >= 8
    assert {d for _, depths in large.cells for d in depths} == {8, 16, 32}


def test_the_checks_run_on_plain_data_too():
    """:func:`spec_from_dict` (what notebooks and tests use) checks as strictly as the file reader."""
    good = {"name": "t", "cells": [{"presets": ["vit"], "depths": [2]}], "seeds": {2: 2}}
    assert spec_from_dict(good).seeds == {2: 2}
    with pytest.raises(ConfigurationError, match=r"`seeds\.2`: must be a whole number"):
        spec_from_dict({**good, "seeds": {2: 2.0}})
    with pytest.raises(ConfigurationError, match=r"`steps`: 200000 is over the limit"):
        spec_from_dict({**good, "steps": 200_000})
    assert spec_from_dict({**good, "steps": 200_000}, allow_large=True).steps == 200_000


def test_every_setting_is_in_the_documentation():
    """docs/training.md's table has one row per key the schema accepts, with the schema's own
    type, range and meaning (schema_table), so the two cannot drift apart."""
    text = (ROOT / "docs" / "training.md").read_text(encoding="utf-8")
    missing = [row for row in schema_table() if "| `{}` | {} | {} |".format(*row) not in text]
    assert missing == []


# ----------------------------------------------------------------------------- the results folder


def _complete_study(root: Path) -> None:
    noise = [0.001, -0.002, 0.002, -0.001]
    for s in range(4):
        _write_run(root, "skipless-osa", s, 0.85 + noise[s])
        _write_run(root, "vit", s, 0.85 - noise[s] / 2)
        _write_run(root, "skipless-ssa", s, 0.70 - noise[s])
        _write_run(root, "mlp", s, 0.66 + noise[s])


def _good_record() -> dict:
    return {"stage": "final", "preset": "vit", "depth": 4, "seed": 4, "lr": 0.01, "alpha_lr_mult": 1.0, "steps": 216,
            "status": "ok", "test_accuracy": 0.5, "val_accuracy": 0.5, "train_accuracy": 1.0, "train_loss": 0.1,
            "curve": [{"epoch": 1, "step": 36, "train_loss": 1.0, "train_accuracy": 0.5}], "kappa_init": 3.0}  # fmt: skip


def _with(**changes) -> bytes:
    record = {**_good_record(), **changes}
    for key in [k for k, v in changes.items() if v is _DROP]:
        del record[key]
    return json.dumps(record).encode()


_DROP = object()

#: (case, file name under the results folder, contents, regex of the notice's reason)
BAD_RECORDS = [
    ("accuracy 1e9", "final/vit-d4-lr0.01-am1-s4.json", _with(test_accuracy=1e9), r"`test_accuracy` must be an accuracy in \[0, 1\]"),
    ("negative accuracy", "final/vit-d4-lr0.01-am1-s4.json", _with(val_accuracy=-0.1), r"`val_accuracy` must be an accuracy"),
    ("an accuracy of 7 in the curve", "final/vit-d4-lr0.01-am1-s4.json",
     _with(curve=[{"epoch": 1, "step": 36, "train_loss": 1.0, "train_accuracy": 7}]), r"`curve` must be"),
    ("a depth that is text", "final/vit-d4-lr0.01-am1-s4.json", _with(depth="four"), r"`depth` must be an int ≥ 1, got 'four'"),
    ("a float seed", "final/vit-d4-lr0.01-am1-s4.json", _with(seed=1.5), r"`seed` must be an int ≥ 0"),
    ("a negative κ per layer", "final/vit-d4-lr0.01-am1-s4.json", _with(sub_block_kappa_layers_init={"mlp": [2.0, -1.0]}),
     r"`sub_block_kappa_layers_init` must be a mapping of part → a list of κ per layer"),
    ("an unknown preset", "final/vit-d4-lr0.01-am1-s4.json", _with(preset="vit; rm -rf"), r"`preset` must be a known preset"),
    ("an unknown status", "final/vit-d4-lr0.01-am1-s4.json", _with(status="great"), r"`status` must be one of ok, diverged"),
    ("a missing field", "final/vit-d4-lr0.01-am1-s4.json", _with(preset=_DROP), r"has no `preset`"),
    ("a tuning run among the final runs", "final/vit-d4-lr0.01-am1-s4.json", _with(stage="tune"), r"a tune run in the final folder"),
    ("a top-level list", "final/vit-d4-lr0.01-am1-s4.json", b"[1, 2, 3]", r"holds list, not a mapping"),
    ("100k-deep nesting", "final/vit-d4-lr0.01-am1-s4.json", b"[" * 100_000 + b"]" * 100_000, r"nested more than 8 levels deep"),
    ("deep nesting inside a mapping", "final/vit-d4-lr0.01-am1-s4.json",
     _with(rank_init={"a": 0.5})[:-1] + b', "extra": ' + b"[" * 20 + b"]" * 20 + b"}", r"nested more than 8 levels deep"),
    ("a truncated file", "final/vit-d4-lr0.01-am1-s4.json", _with()[:40], r"not valid JSON \(truncated or damaged"),
    ("an empty file", "final/vit-d4-lr0.01-am1-s4.json", b"", r"empty"),
    ("not UTF-8", "final/vit-d4-lr0.01-am1-s4.json", b'{"stage": "\xff\xfe"}', r"not UTF-8 text"),
    ("a damaged search record", "search/skipless-ssa-d4.json", b'{"preset": "skipless-ssa", "depth": 4, "chosen": ["x"]}',
     r"`chosen` must be null or \[lr, α-lr multiplier, warm-up fraction\]"),
    ("a tuning run with a bad accuracy", "tune/vit-d4-lr0.01-am1-s1000.json",
     _with(stage="tune", seed=1000, val_accuracy=2.0), r"`val_accuracy` must be an accuracy"),
]


@pytest.mark.parametrize(("case", "name", "contents", "match"), BAD_RECORDS, ids=[c[0] for c in BAD_RECORDS])
def test_a_bad_run_record_is_named_and_left_out(case, name, contents, match, tmp_path):
    _complete_study(tmp_path)
    clean = report.summarise(tmp_path, _spec(), write=False)
    assert clean["notices"] == [] and len(clean["runs"]) == 16
    path = tmp_path / name
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(contents)
    out = report.summarise(tmp_path, _spec(), write=False)
    (notice,) = out["notices"]
    assert notice.path == path
    assert __import__("re").search(match, notice.reason), notice.reason
    if name.startswith("search/"):  # the cell's choice is unknown: its final runs are not used either
        assert set(out["runs"]["preset"]) == {"vit", "skipless-osa", "mlp"}
    else:  # the record is not used: the tables are those of the clean folder
        assert out["runs"].equals(clean["runs"]) and out["tuning"].equals(clean["tuning"])
        head, _, tail = out["verdict"].partition("## Result files left out (1)")
        assert head.rstrip() == clean["verdict"].split("\nNot shown by this study")[0].rstrip()
        assert str(path) in tail
    assert "50000000022" not in out["verdict"]


def test_a_record_cache_reads_only_changed_files_again_and_gives_the_uncached_tables(tmp_path, monkeypatch):
    """A study summarises after every cell with one :class:`RecordCache`: unchanged records are not parsed
    again, and a replaced, damaged or removed file gives exactly the tables of a fresh read."""
    _complete_study(tmp_path)
    parsed: list[Path] = []
    real_parse = records_module._parse
    monkeypatch.setattr(records_module, "_parse", lambda path: parsed.append(path) or real_parse(path))
    cache, spec = records_module.RecordCache(), _spec()

    def same_as_uncached() -> tuple[dict, list[str]]:
        """The cached summary (checked against a fresh one) and the run files it parsed."""
        parsed.clear()
        cached = report.summarise(tmp_path, spec, write=False, cache=cache)
        runs_parsed = [p.name for p in parsed if p.parent.name in ("final", "tune")]
        fresh = report.summarise(tmp_path, spec, write=False)
        for name in ("runs", "curves", "sub_block_layers", "tuning", "summary", "claims"):
            assert cached[name].equals(fresh[name]), name
        assert cached["verdict"] == fresh["verdict"] and cached["notices"] == fresh["notices"]
        return cached, runs_parsed

    first, runs_parsed = same_as_uncached()
    assert len(runs_parsed) == 16
    assert same_as_uncached()[1] == []  # nothing changed: no run parsed again
    vit = tmp_path / "final" / "vit-d4-lr0.01-am1-s0.json"
    record = json.loads(vit.read_text())
    assert record["test_accuracy"] == 0.8495  # replaced below by values of the same length
    (tmp_path / "new.json").write_text(json.dumps({**record, "test_accuracy": 0.2500}))
    os.replace(tmp_path / "new.json", vit)  # as the study writes: a new file under the old name
    out, runs_parsed = same_as_uncached()
    assert runs_parsed == [vit.name]
    row = out["runs"].query("preset == 'vit' and seed == 0")
    assert row["test_accuracy"].tolist() == [0.25] and not out["runs"].equals(first["runs"])
    # rewritten in place at the same size with its times put back (as `cp -p` would): still read again
    before = vit.stat()
    vit.write_text(json.dumps({**record, "test_accuracy": 0.3500}))
    os.utime(vit, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = vit.stat()
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (before.st_ino, before.st_size, before.st_mtime_ns)
    out, runs_parsed = same_as_uncached()
    assert runs_parsed == [vit.name]
    assert out["runs"].query("preset == 'vit' and seed == 0")["test_accuracy"].tolist() == [0.35]
    with vit.open("r+b") as fh:  # damaged in place: same file, another size
        fh.truncate(40)
    out, runs_parsed = same_as_uncached()
    assert [n.path for n in out["notices"]] == [vit] and len(out["runs"]) == 15 and runs_parsed == [vit.name]
    assert same_as_uncached()[1] == [vit.name]  # a damaged file is never kept: read (and named) every time
    assert len(cache) == 15  # the damaged file is not kept
    vit.unlink()
    out, runs_parsed = same_as_uncached()
    assert out["notices"] == [] and len(out["runs"]) == 15 and runs_parsed == [] and len(cache) == 15
    other = tmp_path / "final" / "mlp-d4-lr0.01-am1-s0.json"
    other.unlink()  # a removed record is forgotten, not kept for ever
    assert len(same_as_uncached()[0]["runs"]) == 14 and len(cache) == 14


def test_a_200_mb_record_is_refused_by_its_size_without_being_read(tmp_path):
    _complete_study(tmp_path)
    big = tmp_path / "final" / "vit-d4-lr0.01-am1-s4.json"
    with big.open("wb") as fh:  # a sparse file: 200 MB on paper, nothing on disk
        fh.truncate(200 * 2**20)
    tracemalloc.start()
    try:
        out = report.summarise(tmp_path, _spec(), write=False)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    (notice,) = out["notices"]
    assert notice.path == big and "209715200 bytes, over the limit" in notice.reason
    assert peak < 50 * 2**20, peak  # reading it would take ≥ 200 MB


def test_a_fifo_in_the_results_folder_does_not_block_the_summary(tmp_path):
    _complete_study(tmp_path)
    fifo = tmp_path / "final" / "vit-d4-lr0.01-am1-s4.json"
    os.mkfifo(fifo)
    (notice,) = report.summarise(tmp_path, _spec(), write=False)["notices"]
    assert notice.path == fifo and notice.reason == "not a regular file"


def test_summary_only_names_the_files_it_left_out(tmp_path, capsys, no_training):
    _complete_study(tmp_path)
    exp = tmp_path / "exp.yaml"
    exp.write_text(BASE)
    (tmp_path / "experiment.yaml").write_text("written by the study\n")
    bad = tmp_path / "final" / "vit-d4-lr0.01-am1-s4.json"
    bad.write_bytes(_with(test_accuracy=1e9))
    assert cli_main(["train", "--experiment", str(exp), "--output", str(tmp_path), "--summary-only"]) == 0
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [f"osa-lab train: notice: left out {bad}: `test_accuracy` must be an accuracy "
                                         "in [0, 1] or NaN, got 1000000000.0"]  # fmt: skip
    assert "## Result files left out (1)" in (tmp_path / "verdict.md").read_text()


@pytest.mark.parametrize("seeds", [1, 4])
def test_a_study_with_no_claim_to_test_says_so(tmp_path, seeds):
    """No skipless-osa pair in the cells: no crash after all the training, and the verdict says
    it tests no claim (one seed per depth: no claim has two paired seeds)."""
    spec = StudySpec(name="t", cells=((("vit", "mlp"), (4,)),), seeds={4: seeds}, gate={"mlp": 0.65})
    for s in range(seeds):
        _write_run(tmp_path, "vit", s, 0.85 + 0.001 * s)
        _write_run(tmp_path, "mlp", s, 0.70)
    out = report.summarise(tmp_path, spec)
    assert "verdict" in out["claims"].columns and out["claims"].empty
    assert "**Complete**" in out["verdict"]
    assert "this study tests no claim: no depth runs both presets of a claim (`skipless-osa` with `vit`," in out["verdict"]
    assert "The study tests no claim of the paper, so it draws no conclusion about them." in out["verdict"]
    assert out["finding"].endswith("it tests no claim; no conclusion drawn.")
    assert (tmp_path / "claims.csv").exists() and (tmp_path / "runs.csv").exists()


def test_a_pair_with_one_seed_each_has_no_claim_tested_yet(tmp_path):
    spec = StudySpec(name="t", cells=((("vit", "skipless-osa"), (4,)),), seeds={4: 1})
    _write_run(tmp_path, "vit", 0, 0.8)
    _write_run(tmp_path, "skipless-osa", 0, 0.8)
    out = report.summarise(tmp_path, spec, write=False)
    assert "* no claim has two paired seeds yet" in out["verdict"] and out["claims"].empty


def test_a_damaged_record_is_trained_again_not_trusted(tmp_path, monkeypatch):
    """The study does not take a damaged JSON for a finished run: it trains the run again."""
    from osa_lab.studies.depth_study import run

    out = tmp_path / "final" / "vit-d2-lr0.01-am1-s0.json"
    out.parent.mkdir(parents=True)
    out.write_bytes(_with(test_accuracy=1e9, depth=2, seed=0))

    def data(*args):
        raise TrainingStartedError

    monkeypatch.setattr(run, "study_data", data)
    with pytest.raises(TrainingStartedError):
        run.study_run(spec={"data": "mnist1d", "val_fraction": 0.1}, stage="final", preset="vit", depth=2, seed=0,
                      lr=0.01, alpha_lr_mult=1.0, steps=36, results_dir=str(tmp_path), scratch_dir=str(tmp_path / "ck"),
                      kappa=False)  # fmt: skip
    good = _with(depth=2, seed=0)
    out.write_bytes(good)
    assert run.study_run(spec={}, stage="final", preset="vit", depth=2, seed=0, lr=0.01, alpha_lr_mult=1.0, steps=36,
                         results_dir=str(tmp_path), scratch_dir=str(tmp_path / "ck"), kappa=False) == json.loads(good)  # fmt: skip


# ----------------------------------------------------------------------------- failed grid tasks


def _fake_study_runs(monkeypatch, fail):
    from osa_lab.studies.depth_study import runner

    def fake(**kw):  # a grid task is a seed group: one call for all its seeds
        if fail(kw):
            raise RuntimeError("worker lost")
        return [{"stage": kw["stage"], "preset": kw["preset"], "depth": kw["depth"], "seed": seed, "lr": kw["lr"],
                 "alpha_lr_mult": kw["alpha_lr_mult"], "status": "ok", "val_accuracy": kw["lr"]}
                for seed in kw["seeds"]]  # fmt: skip

    monkeypatch.setattr(runner, "study_group_run", fake)


def _run_tiny(tmp_path, monkeypatch, capsys) -> tuple[int, list[str], str]:
    monkeypatch.chdir(tmp_path)
    exp = tmp_path / "exp.yaml"
    exp.write_text(BASE)
    code = cli_main(["train", "--experiment", str(exp), "--output", str(tmp_path / "out"), "--serial", "--quiet"])
    captured = capsys.readouterr()
    return code, [line for line in captured.err.splitlines() if line.startswith("osa-lab train:")], captured.out


def test_a_grid_where_every_task_failed_says_so_first_and_exits_1(tmp_path, monkeypatch, capsys):
    _fake_study_runs(monkeypatch, lambda kw: True)
    code, lines, out = _run_tiny(tmp_path, monkeypatch, capsys)
    assert code == 1
    # two presets × one tuning round of 2 lr (vit) or 2 lr × 1 mult (osa) × 2 tuning seeds, each seed a task
    # of its own (seed groups only from six seeds up); the cells stop there
    assert lines[1] == ("osa-lab train: every one of the 8 grid tasks failed; first: stage=tune preset=vit depth=1 "
                        "lr=0.003 alpha_lr_mult=1 warmup_fraction=0.05 seeds=1000: RuntimeError: worker lost")  # fmt: skip
    assert lines[-1].startswith("osa-lab train: 8 of 8 grid tasks failed")
    assert "# Verdict: tiny" in out


def test_a_grid_where_some_tasks_failed_exits_1_and_says_how_many(tmp_path, monkeypatch, capsys):
    _fake_study_runs(monkeypatch, lambda kw: kw["stage"] == "final" and kw["preset"] == "vit")
    code, lines, out = _run_tiny(tmp_path, monkeypatch, capsys)
    assert code == 1
    assert not any("every one" in line for line in lines)
    # a task per seed (two seeds are not grouped by default): tuning 2 lr × 2 seeds per preset and one
    # extension round each (the fake's optimum is the top lr); final: 2 seeds per preset, vit's 2 failed
    assert lines[-1].startswith("osa-lab train: 2 of 16 grid tasks failed")


def test_a_grid_without_failures_exits_0(tmp_path, monkeypatch, capsys):
    _fake_study_runs(monkeypatch, lambda kw: False)
    code, lines, _ = _run_tiny(tmp_path, monkeypatch, capsys)
    assert code == 0 and len(lines) == 1 and lines[0].startswith("osa-lab train: study tiny")


def test_a_scratch_folder_outside_runs_experiments_is_refused():
    from osa_lab.studies.depth_study.runner import scratch_folder

    spec = StudySpec(name="t", cells=((("vit",), (2,)),), seeds={2: 2})
    assert scratch_folder(spec) == Path("runs/experiments/t-full-checkpoints")
    sneaky = StudySpec(name="../../../x", cells=((("vit",), (2,)),), seeds={2: 2})  # built in code, past the schema
    with pytest.raises(ConfigurationError, match="outside runs/experiments/"):
        scratch_folder(sneaky)


# ----------------------------------------------------------------------------- full disks and read-only folders


def _failing_writes(monkeypatch, code: int, where: str) -> None:
    """``os.write`` raises ``code`` for temporaries (``*.tmp``) whose path contains ``where``."""
    real_write = os.write

    def write(fd, data):
        target = os.readlink(f"/proc/self/fd/{fd}")
        if target.endswith(".tmp") and where in target:
            raise OSError(code, os.strerror(code))
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", write)


@pytest.mark.parametrize(("code", "words"), [(errno.ENOSPC, "No space left on device"),
                                             (errno.EROFS, "Read-only file system")])  # fmt: skip
def test_a_checkpoint_on_a_full_or_read_only_disk_is_one_line_and_keeps_the_earlier_one(tmp_path, monkeypatch, code, words):
    """Through the real torch.save, which wraps the write error in a RuntimeError of its own."""
    import torch

    from osa_lab.studies.training.checkpoints import write_checkpoint

    path = tmp_path / "checkpoint.pt"
    write_checkpoint({"w": torch.ones(3)}, path)
    earlier = path.read_bytes()
    _failing_writes(monkeypatch, code, str(tmp_path))
    with pytest.raises(OutputWriteError) as caught:
        write_checkpoint({"w": torch.zeros(100_000)}, path)
    message = str(caught.value)
    assert f"cannot write {path} ({words})" in message and "\n" not in message
    assert ("read-only" in message) == (code == errno.EROFS)
    assert "enforce fail" not in message
    assert path.read_bytes() == earlier and sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.pt"]


def test_train_on_a_full_disk_is_one_line(tmp_path, monkeypatch, capsys):
    from tests.studies.test_training_cli import assert_one_line_error, run_cli, synthetic_args

    _failing_writes(monkeypatch, errno.ENOSPC, "checkpoint.pt")
    code, err = run_cli(synthetic_args(tmp_path / "X", "--serial"), capsys)
    assert_one_line_error(code, err, "cannot write", "checkpoint.pt", "No space left on device")


def test_sweep_in_a_read_only_folder_is_one_line(tmp_path, monkeypatch):
    from tests.test_cli_errors import SWEEP

    _failing_writes(monkeypatch, errno.EROFS, str(tmp_path))
    out = tmp_path / "r.csv"
    assert_cli_user_error([*SWEEP, "--output", str(out)], rf"cannot write {out} \(Read-only file system\).*read-only")


@pytest.mark.parametrize("where", ["search", "experiment.yaml", "verdict.md", "runs.csv"])
def test_the_study_on_a_full_disk_is_one_line_and_keeps_earlier_files(tmp_path, monkeypatch, capsys, where):
    _fake_study_runs(monkeypatch, lambda kw: False)
    out = tmp_path / "out"
    out.mkdir()
    earlier = out / ("verdict.md" if where == "search" else where)
    earlier.write_text("earlier\n")
    _failing_writes(monkeypatch, errno.ENOSPC, where)
    code, lines, _ = _run_tiny(tmp_path, monkeypatch, capsys)
    assert code == 2 and len(lines) == 2, lines
    assert lines[1].startswith("osa-lab train: error: cannot write") and "(No space left on device)" in lines[1]
    assert earlier.read_text() == "earlier\n"
    assert not [p for p in out.rglob("*.tmp")]


def test_summary_only_on_a_full_disk_is_one_line_and_keeps_the_earlier_tables(tmp_path, monkeypatch, capsys, no_training):
    _complete_study(tmp_path)
    exp = tmp_path / "exp.yaml"
    exp.write_text(BASE)
    (tmp_path / "experiment.yaml").write_text("written by the study\n")
    (tmp_path / "runs.csv").write_text("earlier\n")
    _failing_writes(monkeypatch, errno.ENOSPC, "runs.csv")
    line = assert_cli_user_error(["train", "--experiment", str(exp), "--output", str(tmp_path), "--summary-only"],
                                 r"cannot write .*runs\.csv \(No space left on device\)")  # fmt: skip
    assert "free some space" in line and (tmp_path / "runs.csv").read_text() == "earlier\n"


def test_a_user_error_inside_a_study_run_stops_the_study_with_its_line(tmp_path, monkeypatch, capsys):
    """A run that meets a full disk or missing data raises a user error inside its grid task: the
    study stops with that one line and exit status 2, not a failed task per run."""
    from osa_lab.errors import MissingDataError
    from osa_lab.studies.depth_study import runner

    def missing(**kw):
        raise MissingDataError("the MNIST-1D cache /x is missing; run `osa-lab train --data mnist1d` once online")

    monkeypatch.setattr(runner, "study_group_run", missing)
    code, lines, _ = _run_tiny(tmp_path, monkeypatch, capsys)
    assert code == 2 and len(lines) == 2
    assert lines[1] == ("osa-lab train: error: the MNIST-1D cache /x is missing; run `osa-lab train --data mnist1d` "
                        "once online")  # fmt: skip


def test_a_checkpoint_on_a_full_disk_inside_the_study_is_one_line(tmp_path, monkeypatch, capsys):
    """End to end (real training, real torch.save): the first checkpoint of the first tuning run
    meets a full disk; the study stops with one line naming the file and the reason."""
    _failing_writes(monkeypatch, errno.ENOSPC, "checkpoint.pt")
    code, lines, _ = _run_tiny(tmp_path, monkeypatch, capsys)
    assert code == 2 and len(lines) == 2, lines
    assert lines[1].startswith("osa-lab train: error: cannot write runs/experiments/tiny-full-checkpoints/tune/")
    assert "checkpoint.pt (No space left on device); nothing was written there" in lines[1]
    assert "enforce fail" not in lines[1] and not list((tmp_path / "runs").rglob("*.tmp"))


def test_a_sweep_where_every_task_failed_says_so_first_and_exits_1(tmp_path, monkeypatch, capsys):
    from osa_lab.studies.depth import sweeps
    from tests.test_cli_errors import SWEEP

    def broken(*args, **kwargs):
        raise RuntimeError("worker lost")

    monkeypatch.setattr(sweeps, "depth_profile", broken)
    assert cli_main([*SWEEP, "--output", str(tmp_path / "r.csv")]) == 1
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "osa-lab sweep: every one of the 1 tasks failed, nothing was measured; first: RuntimeError: worker lost"
    assert lines[1].startswith("osa-lab sweep: 1 of 1 tasks failed")


def test_a_record_of_another_run_under_this_runs_name_is_not_trusted(tmp_path, monkeypatch):
    from osa_lab.studies.depth_study import run

    out = tmp_path / "final" / "vit-d2-lr0.01-am1-s0.json"
    out.parent.mkdir(parents=True)
    out.write_bytes(_with(depth=2, seed=3))  # a valid record, of seed 3

    def data(*args):
        raise TrainingStartedError

    monkeypatch.setattr(run, "study_data", data)
    with pytest.raises(TrainingStartedError):
        run.study_run(spec={"data": "mnist1d", "val_fraction": 0.1}, stage="final", preset="vit", depth=2, seed=0,
                      lr=0.01, alpha_lr_mult=1.0, steps=36, results_dir=str(tmp_path), scratch_dir=str(tmp_path / "ck"),
                      kappa=False)  # fmt: skip


class TrainingStartedError(Exception):
    """Raised by a stand-in for the data loader: the run was going to train."""
