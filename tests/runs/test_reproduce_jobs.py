"""`targetpo reproduce --jobs N`: experiments in parallel worker processes give the sequential run's metrics."""

import json
import math

import pytest

from targetpo.cli import estimated_seconds, main
from targetpo.experiments import load
from targetpo.runs.runner import available_cores


def _stable_records(path) -> list[dict]:
    return [{k: v for k, v in json.loads(line).items() if not k.startswith("wall_")}
            for line in path.read_text().splitlines()]


def test_parallel_reproduce_matches_sequential(tmp_path, capsys):
    # Two experiments plus one without its data set, on two workers: the third waits for a free worker.
    names = ["tabular-single", "tabular-multi", "mnist"]
    (tmp_path / "no-data").mkdir()  # a folder without the IDX files (a path that does not exist is refused)
    common = ["--only", *names, "--preset", "smoke", "--no-progress", "--data-dir", str(tmp_path / "no-data")]
    assert main(["reproduce", "--out", str(tmp_path / "seq"), "--jobs", "1", *common]) == 0
    assert main(["reproduce", "--out", str(tmp_path / "par"), "--jobs", "2", *common]) == 0
    out, err = capsys.readouterr()
    for name in names[:2]:
        seq, par = (_stable_records(tmp_path / d / name / "metrics.jsonl") for d in ("seq", "par"))
        assert par == seq and len(seq) > 10
        meta = json.loads((tmp_path / "par" / name / "run.json").read_text())
        assert meta["status"] == "complete"
        assert meta["runs"][-1]["torch_threads"] == max(1, available_cores() // 2)  # the cores shared out
        assert f"] {name} [smoke] done in" in out
    for d in ("seq", "par"):  # the missing data set is reported as not run either way
        assert json.loads((tmp_path / d / "mnist" / "run.json").read_text())["status"] == "not run"
        assert (tmp_path / d / "REPORT.md").exists()
    assert "mnist NOT RUN" in err and out.count("reproduce: 2 done, 1 NOT RUN of 3 experiments in ") == 2
    # finished lines are numbered 1, 2, ... in the order they end, also without the progress bar
    assert "[2/3]" in out or "[3/3]" in out


def test_a_finished_experiments_core_goes_to_a_running_one_with_the_sequential_records(tmp_path, capsys):
    # tabular-single ends in a second; its core then runs token-sweeps' units in a second worker process (on a
    # machine of many cores, the last experiments of a reproduce no longer run on one core each while the others
    # idle). The records are the sequential run's.
    common = ["--only", "token-sweeps", "tabular-single", "--preset", "smoke", "--no-progress"]
    assert main(["reproduce", "--out", str(tmp_path / "seq"), "--jobs", "1", *common]) == 0
    assert main(["reproduce", "--out", str(tmp_path / "par"), "--jobs", "2", *common]) == 0
    capsys.readouterr()
    seq, par = (sorted(map(json.dumps, _stable_records(tmp_path / d / "token-sweeps" / "metrics.jsonl")))
                for d in ("seq", "par"))
    assert par == seq and len(seq) > 10
    run = json.loads((tmp_path / "par" / "token-sweeps" / "run.json").read_text())["runs"][-1]
    assert run["workers"] == 2 and run["jobs"] == 1  # started on one core, given the finished one's
    assert "workers" not in json.loads((tmp_path / "seq" / "token-sweeps" / "run.json").read_text())["runs"][-1]
    # An experiment whose units are batched together (run_units) has nothing to spread: one process.
    assert "workers" not in json.loads((tmp_path / "par" / "tabular-single" / "run.json").read_text())["runs"][-1]


def test_jobs_must_be_positive(tmp_path, capsys):
    assert main(["reproduce", "--out", str(tmp_path / "x"), "--only", "tabular-single", "--jobs", "0"]) == 2
    assert "--jobs=0" in capsys.readouterr().err and not (tmp_path / "x").exists()


def test_longest_first_order_reads_the_runtime_note():
    assert estimated_seconds(load("tabular-single")) == 0.5
    assert estimated_seconds(load("tabular-multi")) == 1
    assert estimated_seconds(load("mnist")) == 120
    assert estimated_seconds(type("E", (), {"RUNTIME": "~3–4 s"})) == 3  # a range: the lower end
    assert estimated_seconds(type("E", (), {"RUNTIME": "no estimate"})) == math.inf


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_a_failing_experiment_is_reported_and_the_others_finish(tmp_path, capsys, jobs):
    """With --jobs 1 the first failure ended the whole reproduce (exit 2, no report) where --jobs 2 went on."""
    bad = tmp_path / "bad-data"  # files with the right names and wrong contents: a ValueError, not missing data
    bad.mkdir()
    for name in ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"):
        (bad / name).write_bytes(b"not an IDX file")
    out = tmp_path / "par"
    rc = main(["reproduce", "--out", str(out), "--only", "mnist", "tabular-single", "--preset", "smoke",
               "--jobs", jobs, "--no-progress", "--data-dir", str(bad)])
    captured = capsys.readouterr()
    assert rc == 1
    assert json.loads((out / "tabular-single" / "run.json").read_text())["status"] == "complete"
    assert "1 experiment FAILED: mnist" in captured.err
    assert ("mnist [smoke] FAILED" if jobs == "2" else "mnist FAILED (the other experiments go on)") in captured.err
    assert (out / "REPORT.md").exists()


def test_workers_stop_when_the_reproduce_process_is_killed(tmp_path):
    # An orphaned worker would go on appending to the run folder that the next reproduce resumes: both would
    # write the same records.
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    out = tmp_path / "par"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")}
    proc = subprocess.Popen([sys.executable, "-m", "targetpo", "reproduce", "--out", str(out), "--only",
                             "token-dense", "token-terminal", "--jobs", "2", "--no-progress"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    folders = [out / "token-dense", out / "token-terminal"]
    deadline = time.time() + 60
    while time.time() < deadline and not all((f / "metrics.jsonl").exists() for f in folders):
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)  # the parent alone, as `kill -9 PID` does
    proc.wait()
    deadline = time.time() + 20
    while time.time() < deadline and not all(json.loads((f / "run.json").read_text())["status"] == "interrupted"
                                             for f in folders):
        time.sleep(0.1)
    assert [json.loads((f / "run.json").read_text())["status"] for f in folders] == ["interrupted"] * 2
    sizes = [(f / "metrics.jsonl").stat().st_size for f in folders]
    time.sleep(1)
    assert [(f / "metrics.jsonl").stat().st_size for f in folders] == sizes


def test_a_stop_whose_signal_exception_was_lost_still_ends_the_run_at_its_next_record(tmp_path):
    """A `reproduce` worker whose parent died gets SIGTERM, whose SystemExit may be discarded (raised while a
    finalizer runs): the run's next record raises it again and the run is marked interrupted, not left writing."""
    from types import ModuleType

    import pytest

    from targetpo.runs import runner
    from targetpo.runs.config import RunConfig, config, default, param
    from targetpo.runs.store import read_metrics

    @config
    class Config(RunConfig):
        steps: int = param(6, "steps", ge=1)
        methods = default(("a",))

    def run_unit(cfg, unit, ctx):
        for t in range(cfg.steps):
            if t == 2:
                runner.request_stop()  # what the parent watcher does before its SIGTERM; the SystemExit is lost
            ctx.log({"step": t, "x": float(t)})
            ctx.advance()

    exp = ModuleType("toy")
    exp.NAME, exp.TITLE, exp.PAPER_REF = "toy", "toy", "-"
    exp.Config, exp.PRESETS, exp.run_unit = Config, {"smoke": Config()}, run_unit
    try:
        with pytest.raises(SystemExit) as stop:
            runner.run_experiment(exp, "smoke", out=tmp_path / "t", progress=False, quiet=True)
    finally:
        runner._STOP.clear()
    assert stop.value.code == 128 + 15
    assert json.loads((tmp_path / "t" / "run.json").read_text())["status"] == "interrupted"
    assert [r["step"] for r in read_metrics(tmp_path / "t" / "metrics.jsonl")] == [0, 1]


def test_an_experiment_whose_model_is_not_on_disk_is_not_run_and_says_how(tmp_path, capsys):
    """`reproduce --preset paper` reached rlvr's paper preset (model=Qwen/Qwen3-1.7B, a hub id) and stopped with
    "no such directory" (exit 2, no report), since reproduce cannot pass a model directory."""
    pytest.importorskip("transformers", reason="needs the llm extra: pip install -e '.[llm]'")
    out = tmp_path / "r"
    assert main(["reproduce", "--out", str(out), "--only", "rlvr", "--preset", "paper", "--jobs", "1",
                 "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert "rlvr NOT RUN: model 'Qwen/Qwen3-1.7B': no such directory" in err
    assert f"targetpo run rlvr --preset paper --out {out / 'rlvr'} --force model=DIR data_path=DIR" in err
    assert json.loads((out / "rlvr" / "run.json").read_text())["status"] == "not run"
    assert "**NOT RUN.** model 'Qwen/Qwen3-1.7B'" in (out / "REPORT.md").read_text()


def test_a_missing_optional_extra_is_one_line_naming_it(tmp_path, capsys, monkeypatch):
    """Without the llm extra, `rlvr` ended in a ModuleNotFoundError traceback."""
    monkeypatch.setitem(__import__("sys").modules, "reasoning_gym", None)  # import fails as if not installed
    assert main(["rlvr", "--preset", "smoke", "--out", str(tmp_path / "x"), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("targetpo: error: rlvr needs the llm extra (no module named 'reasoning_gym')"), err
    assert "\n" not in err and not (tmp_path / "x").exists()


def test_a_finished_reproduce_continues_wherever_its_data_is_named(tmp_path, capsys, mnist_dir, monkeypatch):
    """Run once through $TARGETPO_MNIST_DIR, again with --data-dir (Makefile's MNIST_DIR) or with no data at all:
    the second reproduce stopped before anything ran ("data_dir: stored None, asked '...'"), and the only way out
    it named, --fresh, threw every run away. The content fingerprint still guards against other data."""
    out = tmp_path / "r"
    argv = ["reproduce", "--out", str(out), "--only", "mnist", "tabular-single", "--preset", "smoke", "--jobs", "1",
            "--no-progress"]
    monkeypatch.setenv("TARGETPO_MNIST_DIR", str(mnist_dir))
    assert main(argv) == 0
    before = (out / "mnist" / "metrics.jsonl").read_bytes()
    monkeypatch.delenv("TARGETPO_MNIST_DIR")
    assert main(argv + ["--data-dir", str(mnist_dir)]) == 0
    assert main(argv) == 0  # complete: no data needed, and not called NOT RUN
    err = capsys.readouterr().err
    assert "NOT RUN" not in err and "would not continue" not in err
    assert (out / "mnist" / "metrics.jsonl").read_bytes() == before


def test_reproduce_out_must_be_a_folder_of_its_own(tmp_path, capsys):
    """--out under a file printed one traceback per experiment; --out a user's folder had its REPORT.md replaced."""
    (tmp_path / "afile").write_text("")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "REPORT.md").write_text("my notes")
    for out, message in [(tmp_path / "afile" / "r", "is a file, not a directory"),
                         (mine, "not empty (REPORT.md) and holds no targetpo runs")]:
        code = main(["reproduce", "--out", str(out), "--only", "tabular-single", "--preset", "smoke", "--no-progress"])
        err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
        assert code == 2 and len(err) == 1 and message in err[0], err
    assert (mine / "REPORT.md").read_text() == "my notes" and sorted(p.name for p in mine.iterdir()) == ["REPORT.md"]


def test_the_report_headline_names_experiments_not_run(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("TARGETPO_MNIST_DIR", raising=False)
    out = tmp_path / "r"
    assert main(["reproduce", "--out", str(out), "--only", "tabular-single", "mnist", "--preset", "smoke",
                 "--jobs", "1", "--no-progress"]) == 0
    text = (out / "REPORT.md").read_text()
    assert "**1 experiment NOT RUN** (mnist: its section says why and how to run it" in text.splitlines()[2]
    assert "(#mnist-contextual-bandit-paper-33-fig-4a) — NOT RUN" in text


def test_reproduce_reports_an_experiment_without_its_extra_as_not_run(tmp_path, capsys, monkeypatch):
    """In a base install `reproduce` (whose paper suite holds rlvr) printed a ModuleNotFoundError traceback, called
    rlvr FAILED (exit 1), told the user to resume it, and left it out of the report."""
    monkeypatch.setitem(__import__("sys").modules, "reasoning_gym", None)  # as if the llm extra were missing
    out = tmp_path / "r"
    assert main(["reproduce", "--out", str(out), "--only", "rlvr", "tabular-single", "--preset", "smoke",
                 "--jobs", "1", "--no-progress"]) == 0
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err and "FAILED" not in captured.err + captured.out
    assert "rlvr NOT RUN: rlvr needs the llm extra (no module named 'reasoning_gym'): pip install 'targetpo[llm]'" \
        in captured.err
    assert f"run it with: targetpo reproduce --out {out} --only rlvr --preset smoke" in captured.err
    assert "reproduce: 1 done, 1 NOT RUN of 2 experiments" in captured.out
    assert json.loads((out / "rlvr" / "run.json").read_text())["status"] == "not run"
    assert "**NOT RUN.** rlvr needs the llm extra" in (out / "REPORT.md").read_text()


def test_a_reproduce_worker_without_the_extra_answers_not_run(tmp_path, monkeypatch):
    """The parallel path's worker sent ("failed", traceback) for a missing extra."""
    import multiprocessing
    import signal

    from targetpo import cli

    monkeypatch.setitem(__import__("sys").modules, "math_verify", None)
    handlers = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    recv, send = multiprocessing.Pipe(duplex=False)
    try:
        cli._reproduce_worker(send, cli._plan(tmp_path, "llm-length", "smoke", [], False, "cpu"), threads=1)
    finally:
        signal.signal(signal.SIGINT, handlers[0])
        signal.signal(signal.SIGTERM, handlers[1])
    status, detail = recv.recv()
    assert status == "missing extra", detail
    assert detail.startswith("llm-length needs the llm extra (no module named 'math_verify')")
    assert not (tmp_path / "llm-length").exists()


def test_run_without_the_extra_writes_no_run_folder(tmp_path, capsys, monkeypatch):
    """`targetpo run llm-length` without the llm extra printed the right line but left a "failed" run.json, which
    then refused the same command ("already holds a run") once the extra was installed."""
    monkeypatch.setitem(__import__("sys").modules, "transformers", None)
    assert main(["run", "llm-length", "--preset", "smoke", "--out", str(tmp_path / "x"), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("targetpo: error: llm-length needs the llm extra (no module named 'transformers')"), err
    assert "\n" not in err and not (tmp_path / "x").exists()


def test_reproduce_refuses_a_data_dir_that_is_not_a_folder(tmp_path, capsys):
    """A mistyped --data-dir ran nothing, wrote a NOT RUN placeholder and a report, and exited 0."""
    (tmp_path / "afile").write_text("")
    for given, what in [(tmp_path / "nope", "does not exist"), (tmp_path / "afile", "is a file, not a directory")]:
        out = tmp_path / "r"
        code = main(["reproduce", "--out", str(out), "--only", "mnist", "--preset", "smoke", "--data-dir", str(given),
                     "--no-progress"])
        err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
        assert code == 2 and len(err) == 1 and f"--data-dir {given}: {what}" in err[0], err
        assert not out.exists()


def test_a_workers_log_lines_name_its_experiment(capsys):
    """Warnings from two reproduce workers (rlvr's "all groups have zero-variance rewards") said not whose they were."""
    import logging

    from targetpo import cli

    handler = cli._name_worker_logs("rlvr")
    try:
        logging.getLogger("targetpo.llm.trainer").warning("step %d: all %d groups have zero-variance rewards", 0, 2)
    finally:
        logging.getLogger("targetpo").removeHandler(handler)
    assert "rlvr: WARNING: step 0: all 2 groups have zero-variance rewards" in capsys.readouterr().err
