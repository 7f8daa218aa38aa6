"""The run folder's edges that whole-run tests cannot see: a line flushed before a hard exit, a read that must not
cut a live run's partial line, atomic run.json writes, the refusals of run.json and metrics fields, resume
refusals and what a refused or partial resume leaves behind, and the placeholder that must never replace a run."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from targetpo.cli import main
from targetpo.experiments import load, run_experiment
from targetpo.runs import store
from targetpo.runs.runner import RunContext, mark_not_run
from targetpo.runs.store import MetricsWriter, RunFileError, find_runs, read_metrics, read_run_json, seed_count

ROOT = Path(__file__).resolve().parents[2]


def test_each_record_reaches_the_file_before_the_process_dies(tmp_path):
    """A kill leaves no buffer behind: the writer flushes every line (os._exit skips Python's own flushing)."""
    path = tmp_path / "metrics.jsonl"
    child = ("import os, sys; from targetpo.runs.store import MetricsWriter; "
             "w = MetricsWriter(sys.argv[1]); w.write({'unit': 'a', 'step': 0, 'x': 1.5}); os._exit(0)")
    subprocess.run([sys.executable, "-c", child, str(path)], check=True,
                   env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    assert read_metrics(path) == [{"unit": "a", "step": 0, "x": 1.5}]


def test_reading_without_repair_leaves_a_partial_last_line_on_disk(tmp_path):
    """A report may read a run that is still writing its last line: only a resume (repair=True) may cut it."""
    path = tmp_path / "metrics.jsonl"
    data = b'{"unit": "a", "step": 0}\n{"unit'
    path.write_bytes(data)
    assert read_metrics(path) == [{"unit": "a", "step": 0}]
    assert path.read_bytes() == data
    assert read_metrics(path, repair=True) == [{"unit": "a", "step": 0}]
    assert path.read_bytes() == b'{"unit": "a", "step": 0}\n'


@pytest.mark.parametrize("line, problem", [
    ('{"unit": "a", "event": ["done"]}', "'event' must be a string"),
    ('{"unit": "a", "step": true}', "'step' integer >= 0"),
    ('{"unit": 3, "step": 0}', "'unit' string"),
])
def test_a_hand_edited_key_is_refused_naming_its_line(tmp_path, line, problem):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"unit": "a", "step": 0}\n' + line + "\n")
    with pytest.raises(RunFileError, match=f"line 2: a metrics record .*{problem}"):
        read_metrics(path)


def test_seed_count_reads_no_bool_as_a_count():
    assert seed_count({"config": {"seeds": 3}}) == 3
    assert seed_count({"config": {"seeds": True}}) == 0 and seed_count({"config": {}}) == 0


@pytest.mark.parametrize("field, value, kind", [("wall_time_s", True, "number"), ("wall_time_s", "3", "number"),
                                                ("status", 1, "string"), ("runs", {}, "array")])
def test_run_json_optional_fields_of_the_wrong_kind_are_refused(tmp_path, field, value, kind):
    (tmp_path / "run.json").write_text(json.dumps({"experiment": "x", "preset": "cpu", "config": {}, field: value}))
    with pytest.raises(RunFileError, match=f"'{field}' must be a JSON {kind}"):
        read_run_json(tmp_path)


def test_a_write_of_run_json_killed_halfway_leaves_the_old_one(tmp_path, monkeypatch):
    old = {"experiment": "x", "preset": "cpu", "config": {"seeds": 2}, "status": "running"}
    store.write_run_json(tmp_path, old)
    real = Path.write_bytes

    def torn(self, data):
        real(self, data[: len(data) // 2])
        raise KeyboardInterrupt

    monkeypatch.setattr(Path, "write_bytes", torn)
    with pytest.raises(KeyboardInterrupt):
        store.write_run_json(tmp_path, {**old, "status": "complete"})
    monkeypatch.undo()
    assert read_run_json(tmp_path) == old


def test_find_runs_lists_run_folders_in_name_order(tmp_path):
    names = ["m", "c", "x", "a", "q", "b", "z", "k"]
    for n in names:
        (tmp_path / n).mkdir()
        (tmp_path / n / "run.json").write_text("{}")
    (tmp_path / "not-a-run").mkdir()
    assert [p.name for p in find_runs(tmp_path)] == sorted(names)


# ----------------------------------------------------------------------------- resume and the placeholder

@pytest.fixture(scope="module")
def done_run(tmp_path_factory) -> Path:
    return run_experiment("tabular-single", "smoke", out=tmp_path_factory.mktemp("r") / "run", seeds=2,
                          progress=False, quiet=True)


def test_a_resume_asking_for_another_seed_count_is_refused(done_run, tmp_path, capsys):
    out = shutil.copytree(done_run, tmp_path / "run")
    before = {f.name: f.read_bytes() for f in out.iterdir()}
    assert main(["run", "tabular-single", "--out", str(out), "--resume", "--seeds", "3", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "seeds: stored 2, asked 3" in err[0], err
    assert {f.name: f.read_bytes() for f in out.iterdir()} == before
    # the same count is the same run: accepted
    assert main(["run", "tabular-single", "--out", str(out), "--resume", "--seeds", "2", "--no-progress",
                 "--no-report"]) == 0


def test_a_resume_after_a_kill_inside_the_first_unit_is_recorded_as_resumed(done_run, tmp_path):
    out = shutil.copytree(done_run, tmp_path / "run")
    lines = (out / "metrics.jsonl").read_text().splitlines()
    first = json.loads(lines[0])["unit"]
    kept = [ln for ln in lines if json.loads(ln)["unit"] == first and "event" not in json.loads(ln)][:3]
    (out / "metrics.jsonl").write_text("\n".join(kept) + "\n")   # a few records, no unit done
    meta = json.loads((out / "run.json").read_text())
    (out / "run.json").write_text(json.dumps({**meta, "status": "interrupted"}))
    run_experiment("tabular-single", None, out=out, resume=True, progress=False, quiet=True)
    runs = json.loads((out / "run.json").read_text())["runs"]
    assert runs[-1]["resumed"] is True and runs[-1]["units"][0] == first
    assert sorted((out / "metrics.jsonl").read_text().splitlines()) == sorted(lines)  # units run side by side


def test_mark_not_run_never_replaces_a_real_run(done_run, tmp_path):
    out = shutil.copytree(done_run, tmp_path / "run")
    before = {f.name: f.read_bytes() for f in out.iterdir()}
    mark_not_run(out, load("tabular-single"), "cpu", "its data is missing")
    assert {f.name: f.read_bytes() for f in out.iterdir()} == before
    # a damaged run.json is no placeholder either
    (out / "run.json").write_text("{")
    mark_not_run(out, load("tabular-single"), "cpu", "its data is missing")
    assert (out / "run.json").read_text() == "{"


def test_a_fingerprint_given_later_for_the_same_data_source_is_recorded(tmp_path):
    """A run that named its data before it could fingerprint it must store the fingerprint once it has one,
    or a resume on other data would not be refused."""
    meta = {"experiment": "x", "preset": "cpu", "config": {}, "data_source": "files in D"}
    store.write_run_json(tmp_path, meta)
    ctx = RunContext("u", None, None, "cpu", meta, tmp_path)
    ctx.set_data_source("files in D", "abcd")
    assert read_run_json(tmp_path)["data_fingerprint"] == "abcd"


# ----------------------------------------------------------------------------- with the MNIST data

@pytest.fixture(scope="module")
def mnist_run(tmp_path_factory, mnist_dir) -> Path:
    out = tmp_path_factory.mktemp("m") / "run"
    assert main(["run", "mnist", "--preset", "smoke", "--out", str(out), "--data-dir", str(mnist_dir),
                 "--no-progress", "--no-report"]) == 0
    return out


def test_a_forced_resume_checks_the_data_before_touching_the_run(mnist_run, tmp_path, capsys):
    """--resume --force replays units, so it needs the data: without it the run folder must stay as it was."""
    out = shutil.copytree(mnist_run, tmp_path / "run")
    meta = json.loads((out / "run.json").read_text())
    meta["config"]["data_dir"] = str(tmp_path / "gone")
    (out / "run.json").write_text(json.dumps(meta))
    before = {f.name: f.read_bytes() for f in out.iterdir()}
    capsys.readouterr()
    assert main(["run", "mnist", "--out", str(out), "--resume", "--force", "--no-progress", "--no-report"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "gone" in err[0], err
    assert {f.name: f.read_bytes() for f in out.iterdir()} == before


def test_a_resume_naming_the_data_another_way_is_the_same_run(mnist_run, tmp_path, capsys, monkeypatch,
                                                             mnist_dir):
    """The stored run read --data-dir D; a resume rebuilt from the preset (data_dir unset) that finds the same
    files through $TARGETPO_MNIST_DIR asks for the same run: where the data lies is not part of the config
    compared, its fingerprint is."""
    out = shutil.copytree(mnist_run, tmp_path / "run")
    seeds = json.loads((out / "run.json").read_text())["config"]["seeds"]
    monkeypatch.setenv("TARGETPO_MNIST_DIR", str(mnist_dir))
    capsys.readouterr()
    assert main(["run", "mnist", "--preset", "smoke", "--seeds", str(seeds), "--out", str(out), "--resume",
                 "--no-progress", "--no-report"]) == 0, capsys.readouterr().err
