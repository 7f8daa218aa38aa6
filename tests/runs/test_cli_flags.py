"""The runner's own flags and the shapes of a command line: each bad one exits 2 with one line before anything is
written, and nothing a user typed is silently dropped, collapsed or ignored."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from targetpo.cli import main
from targetpo.experiments import load
from targetpo.runs.runner import computes_on, resolve_device


def _run(argv, capsys) -> tuple[int, list[str]]:
    code = main(argv)
    return code, [line for line in capsys.readouterr().err.splitlines() if line.strip()]


def _usage_error(argv, capsys) -> tuple[int, list[str]]:
    """argparse's own usage errors exit from inside main: the exit status and the lines written to stderr."""
    with pytest.raises(SystemExit) as exc:
        main(argv)
    return exc.value.code, [line for line in capsys.readouterr().err.splitlines() if line.strip()]


SMOKE = ["--preset", "smoke", "--no-progress", "--no-report"]


@pytest.mark.parametrize("argv", [["run", "tabular-single", "--seed", "2"], ["run", "tabular-single", "--pre", "smoke"],
                                  ["reproduce", "--onl", "tabular-single"]])
def test_an_abbreviated_option_is_refused(argv, tmp_path, capsys):
    """argparse would take `--seed 2` as `--seeds 2` (and `--pre` as `--preset`) without a word; the config
    field is `seed=2`, so an abbreviation is refused instead, before anything is written."""
    code, err = _usage_error([*argv, "--out", str(tmp_path / "r")], capsys)
    flag = next(a for a in argv if a.startswith("--"))
    assert code == 2 and len(err) == 1 and f"unrecognized arguments: {flag}" in err[0], err
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("argv,expected", [
    (["--device", "nosuch"], "--device 'nosuch': not a torch device"),
    (["--threads", "0"], "--threads 0: must be an integer >= 1"),
    (["--threads", "-1"], "--threads -1: must be an integer >= 1"),
    (["--seeds", "2", "seeds=3"], "give either --seeds 2 or seeds=..., not both"),
    (["seeds=2", "seeds=3"], "seeds is set twice (seeds=2 and seeds=3); give it once"),
    (["methods=tpo,tpo"], "methods=('tpo', 'tpo'): items must be distinct ('tpo' is given twice)"),
])
def test_bad_runner_flags_exit_2_with_one_line_and_no_run_folder(tmp_path, capsys, argv, expected):
    out = tmp_path / "run"
    code, err = _run(["run", "tabular-single", "--out", str(out), *SMOKE, *argv], capsys)
    assert code == 2 and len(err) == 1 and expected in err[0], err
    assert not out.exists()


@pytest.mark.parametrize("argv", [["run"], ["rlvr", "--preset", "nosuch"]])
def test_overrides_are_never_called_required(argv, capsys):
    """`targetpo run` alone said "the following arguments are required: name, key=value"; overrides are optional."""
    code, err = _usage_error(argv, capsys)
    assert code == 2 and len(err) == 1 and "key=value" not in err[0], err


def test_a_folder_that_holds_no_run_is_never_written_into_without_force(tmp_path, capsys):
    """--out pointing at a user's folder replaced its REPORT.md (and would have replaced checkpoints/) silently."""
    out = tmp_path / "mine"
    out.mkdir()
    (out / "REPORT.md").write_text("my notes")
    code, err = _run(["run", "tabular-single", "--out", str(out), "--preset", "smoke", "--no-progress"], capsys)
    assert code == 2 and len(err) == 1 and "is not empty (REPORT.md) and holds no targetpo run" in err[0], err
    assert sorted(p.name for p in out.iterdir()) == ["REPORT.md"] and (out / "REPORT.md").read_text() == "my notes"
    code, _ = _run(["run", "tabular-single", "--out", str(out), "--force", *SMOKE], capsys)
    assert code == 0 and (out / "run.json").exists() and (out / "REPORT.md").read_text() == "my notes"


def test_a_list_field_refuses_a_repeated_item_in_every_experiment(tmp_path, capsys):
    """Before, `lengths=3,3` printed 14 units and ran 7: repeated items collapsed into one unit."""
    code, err = _run(["run", "token-terminal", "--out", str(tmp_path / "r"), *SMOKE, "lengths=3,3"], capsys)
    assert code == 2 and err == ["targetpo: error: lengths=(3, 3): items must be distinct (3 is given twice)"]


def test_an_empty_out_is_refused_instead_of_writing_into_the_working_directory(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, err = _run(["run", "tabular-single", "--out", "", *SMOKE], capsys)
    assert code == 2 and "--out is empty" in err[0]
    code, err = _run(["reproduce", "--out", "", "--only", "tabular-single", "--preset", "smoke", "--no-progress"],
                     capsys)
    assert code == 2 and "--out is empty" in err[0]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_a_device_this_machine_lacks_is_refused_before_the_run_folder(tmp_path, capsys):
    out = tmp_path / "run"
    code, err = _run(["run", "token-terminal", "--out", str(out), *SMOKE, "--device", "cuda"], capsys)
    assert code == 2 and len(err) == 1 and "--device cuda: this machine has 0 CUDA device(s)" in err[0]
    assert not out.exists()


def test_experiments_refuse_a_device_they_do_not_compute_on_instead_of_ignoring_it():
    """The tabular bandits and most MNIST experiments keep their tensors on the CPU: `--device cuda` was recorded
    in run.json and ignored. `mnist` and `mnist-mechanism` compute on the CPU or a CUDA device; the token and LLM
    experiments on the device they are given."""
    meta, cuda = torch.device("meta"), torch.device("cuda")  # both can be named on any torch build
    for name in ("tabular-single", "tabular-multi", "mnist", "mnist-mechanism", "mnist-staleness"):
        assert not computes_on(load(name), meta)
        assert computes_on(load(name), torch.device("cpu"))
    for name in ("mnist", "mnist-mechanism"):
        assert computes_on(load(name), cuda)
    for name in ("tabular-single", "mnist-staleness", "mnist-replay", "mnist-friction", "mnist-projections"):
        assert not computes_on(load(name), cuda)
    for name in ("token-terminal", "token-dense"):
        assert computes_on(load(name), meta)
    with pytest.raises(ValueError, match="--device meta: mnist computes on cpu or cuda only; give --device cpu or "
                       "cuda"):
        resolve_device(load("mnist"), "meta")
    with pytest.raises(ValueError, match="--device meta: mnist-staleness computes on cpu only; drop --device"):
        resolve_device(load("mnist-staleness"), "meta")


def test_data_flag_and_its_field_together_are_refused(tmp_path, capsys):
    code, err = _run(["run", "mnist", "--out", str(tmp_path / "r"), *SMOKE, "--data-dir", str(tmp_path),
                      f"data_dir={tmp_path / 'other'}"], capsys)
    assert code == 2 and err == ["targetpo: error: give either --data-dir or data_dir=..., not both"]


@pytest.mark.parametrize("argv,expected", [
    (["--only"], "--only needs at least one experiment name"),
    (["--only", "tabular-single", "tabular-single"], "--only names tabular-single twice"),
    (["--only", "tabular-single", "--device", "nosuch"], "--device 'nosuch': not a torch device"),
])
def test_reproduce_refuses_an_empty_or_repeated_only_before_running_anything(tmp_path, capsys, argv, expected):
    out = tmp_path / "results"
    code, err = _run(["reproduce", "--out", str(out), "--preset", "smoke", "--no-progress", *argv], capsys)
    assert code == 2 and len(err) == 1 and expected in err[0], err
    assert not out.exists()


def test_an_unknown_experiment_in_a_key_error_reads_without_quotes(capsys, monkeypatch):
    def boom(args):
        raise KeyError("unknown experiment 'nosuch'; available: a, b")

    monkeypatch.setattr("targetpo.cli.cmd_list", boom)
    code, err = _run(["list"], capsys)
    assert code == 2 and err == ["targetpo: error: unknown experiment 'nosuch'; available: a, b"]


def test_ctrl_c_prints_one_line_exits_130_and_the_run_resumes(tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "targetpo", "run", "tabular-multi", "--out", str(out), *SMOKE, "steps=8000",
           "--threads", "1"]
    # A shell without job control starts background jobs with SIGINT ignored, and the child would inherit that
    # (`pytest … &` in a script): Ctrl-C's default, which is what the test is about, is restored for the child.
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + 120
    while time.time() < deadline and not ((out / "metrics.jsonl").exists() and (out / "metrics.jsonl").stat().st_size):
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    lines = [line for line in err.splitlines() if line.strip()]
    assert proc.returncode == 130, err
    assert "Traceback" not in err and lines[-1].startswith("targetpo: interrupted; every metrics line written is kept")
    meta = json.loads((out / "run.json").read_text())
    assert meta["status"] == "interrupted" and meta["runs"][0]["wall_time_s"] > 0  # the stopped segment's time
    assert subprocess.run([*cmd, "--resume"], capture_output=True).returncode == 0
    meta = json.loads((out / "run.json").read_text())
    assert meta["status"] == "complete" and len(meta["runs"]) == 2
    assert meta["wall_time_s"] == pytest.approx(sum(r["wall_time_s"] for r in meta["runs"]))  # every segment counted


def test_ctrl_c_while_the_cli_starts_prints_one_line_and_exits_130(tmp_path):
    # The CLI's imports (torch, every experiment module for --help) take seconds. A Ctrl-C there printed
    # KeyboardInterrupt's traceback; later, raised inside torch's import, it sometimes ended the process by SIGINT
    # (-2) after the line was printed, or aborted it ("terminate called after throwing ... pybind11"). Sent at
    # three moments of the start (three processes at once), each lands in the imports on a 2-core machine or in
    # the run's own handler; either answers in one line with 130.
    procs = []
    for delay in (0.3, 1.2, 2.1):
        cmd = [sys.executable, "-m", "targetpo", "run", "token-dense", "--preset", "cpu", "--out",
               str(tmp_path / f"r{delay}"), "--no-progress", "--no-report", "--jobs", "1"]
        procs.append((delay, subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                              preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))))
    t0 = time.time()
    for delay, proc in procs:
        time.sleep(max(0.0, t0 + delay - time.time()))
        proc.send_signal(signal.SIGINT)
    for delay, proc in procs:
        _, err = proc.communicate(timeout=120)
        lines = [line for line in err.splitlines() if line.strip()]
        assert proc.returncode == 130 and "Traceback" not in err, (delay, proc.returncode, err)
        assert len(lines) == 1 and lines[0].startswith("targetpo: interrupted"), (delay, err)


def test_the_script_entry_point_is_the_one_that_answers_ctrl_c_during_the_imports():
    import tomllib

    from targetpo.__main__ import script

    scripts = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"targetpo": "targetpo.__main__:script"} and callable(script)


def test_an_interrupt_while_the_metrics_file_is_created_leaves_the_run_interrupted(tmp_path, monkeypatch):
    """The window between run.json saying "running" and the first record: a SIGTERM there (a reproduce worker whose
    parent died just as it started) left a stale "running" for a run no process writes."""
    from targetpo.experiments import run_experiment
    from targetpo.runs import runner

    class Stopped(runner.MetricsWriter):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            raise SystemExit(143)  # what the worker's SIGTERM handler raises

    monkeypatch.setattr(runner, "MetricsWriter", Stopped)
    with pytest.raises(SystemExit):
        run_experiment("tabular-multi", "smoke", out=tmp_path / "run", progress=False, quiet=True)
    assert json.loads((tmp_path / "run" / "run.json").read_text())["status"] == "interrupted"


def test_a_killed_run_keeps_the_wall_time_of_its_finished_units(tmp_path):
    """SIGKILL cannot be caught: run.json holds the time up to the last unit that finished (units run one after
    another: token-dense's; the tabular bandits run theirs as one batch)."""
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "targetpo", "run", "token-dense", "--out", str(out), *SMOKE, "episodes=40",
           "vocabs=2", "--threads", "1", "methods=dg,ppo"]
    proc = subprocess.Popen(cmd, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline and '"v2/ppo"' not in ((out / "metrics.jsonl").read_text() if (out / "metrics.jsonl").exists() else ""):
        time.sleep(0.1)
    proc.kill()
    proc.wait(timeout=60)
    meta = json.loads((out / "run.json").read_text())
    assert meta["status"] == "running" and meta["runs"][0]["wall_time_s"] > 0 and meta["wall_time_s"] > 0


def test_counts_of_one_read_in_the_singular(tmp_path, capsys):
    from targetpo.runs.stats import count

    assert [count(n, "seed") for n in (0, 1, 2, 1000)] == ["0 seeds", "1 seed", "2 seeds", "1,000 seeds"]
    assert main(["run", "tabular-single", *SMOKE, "--seeds", "1", "methods=tpo", "--out", str(tmp_path / "r")]) == 0
    assert "(1 seed, 1 unit)" in capsys.readouterr().out


def test_a_run_folder_in_use_is_refused_to_a_second_process(tmp_path, capsys):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "targetpo", "run", "tabular-multi", "--out", str(out), *SMOKE, "steps=20000",
           "--threads", "1"]
    proc = subprocess.Popen(cmd, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 120
        while time.time() < deadline and not ((out / "metrics.jsonl").exists() and (out / "metrics.jsonl").stat().st_size):
            time.sleep(0.1)
        for flag in ("--resume", "--force"):  # neither interleaves records nor deletes the folder under the run
            code, err = _run(["run", "tabular-multi", "--out", str(out), *SMOKE, "steps=20000", "--threads", "1",
                              flag], capsys)
            assert code == 2 and len(err) == 1 and "is in use by another targetpo process" in err[0], err
            assert (out / "run.json").exists() and proc.poll() is None
    finally:
        proc.kill()
        proc.wait(timeout=60)
    # the lock dies with its process: the folder is free again
    assert main(["run", "tabular-multi", "--out", str(out), *SMOKE, "steps=200", "--threads", "1", "--force"]) == 0


def test_a_sequential_reproduce_stopped_by_sigterm_leaves_its_run_interrupted(tmp_path):
    """`reproduce --jobs 1` had no SIGTERM handler: the process died at once and run.json kept saying "running"."""
    out = tmp_path / "r"
    cmd = [sys.executable, "-m", "targetpo", "reproduce", "--out", str(out), "--only", "tabular-multi", "--preset",
           "paper", "--jobs", "1", "--no-progress"]
    proc = subprocess.Popen(cmd, stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    metrics = out / "tabular-multi" / "metrics.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and not (metrics.exists() and metrics.stat().st_size > 0):
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    assert json.loads((out / "tabular-multi" / "run.json").read_text())["status"] == "interrupted"


@pytest.mark.parametrize("group", [True, False], ids=["process-group", "parent-only"])
def test_a_parallel_reproduce_stopped_by_sigterm_ends_quietly_with_its_runs_interrupted(tmp_path, group):
    """`kill -TERM -PGID` (a scheduler, a terminal's hang-up) reached each worker twice, once from the group and once
    from its parent-watch: the second landed in the interpreter's exit and printed "Exception ignored in atexit
    callback ... SystemExit: 143". SIGTERM to the parent alone killed it at once, leaving the workers to notice."""
    out = tmp_path / "r"
    cmd = [sys.executable, "-m", "targetpo", "reproduce", "--out", str(out), "--only", "token-dense",
           "token-terminal", "--preset", "cpu", "--jobs", "2", "--no-progress"]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
                            start_new_session=True)
    metrics = [out / name / "metrics.jsonl" for name in ("token-dense", "token-terminal")]
    deadline = time.time() + 180
    while time.time() < deadline and not all(m.exists() and m.stat().st_size > 0 for m in metrics):
        time.sleep(0.05)
    if group:
        os.killpg(proc.pid, signal.SIGTERM)
    else:
        proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM
    assert "Traceback" not in err and "Exception ignored" not in err, err
    stopped = next(line for line in err.splitlines() if line.startswith("interrupted: stopped the running"))
    assert "token-dense" in stopped and "token-terminal" in stopped, err
    for m in metrics:
        assert json.loads((m.parent / "run.json").read_text())["status"] == "interrupted"
