"""`targetpo run --jobs N`: an experiment's units in worker processes give each unit the records of the
sequential run, the same report, and the runner's handling of divergence, failures, data sources and Ctrl-C."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from targetpo import experiments
from targetpo.cli import main
from targetpo.report import write_report
from targetpo.runs import runner
from targetpo.runs.store import read_metrics

TOY = textwrap.dedent('''
    """A toy experiment for the `run --jobs` tests (imported by name in the workers)."""
    from targetpo.runs.config import RunConfig, config, default, param

    NAME, TITLE, PAPER_REF = "jobs-toy", "toy", "-"


    @config
    class Config(RunConfig):
        steps: int = param(5, "steps", ge=1)
        methods = default(("a", "bb", "bad", "ccc"))


    PRESETS = {"smoke": Config(), "failing": Config(methods=("a", "err", "ccc"))}


    def run_unit(cfg, unit, ctx):
        ctx.set_data_source("toy data", "fp-1")
        for t in range(cfg.steps):
            if unit == "err" and t == 1:
                raise ValueError("boom in unit err")
            ctx.log({"step": t, "x": float("nan") if unit == "bad" and t == 2 else 10.0 * len(unit) + t})
            ctx.advance()
''')


def _toy_module(tmp_path, monkeypatch, name: str, text: str):
    """`text` as module `name` that the workers can import (its folder is on sys.path, which a worker
    inherits)."""
    import importlib

    folder = tmp_path / "toy_module"
    folder.mkdir()
    (folder / f"{name}.py").write_text(text)
    monkeypatch.syspath_prepend(str(folder))
    return importlib.import_module(name)


@pytest.fixture
def toy(tmp_path, monkeypatch):
    return _toy_module(tmp_path, monkeypatch, "jobs_toy", TOY)


@pytest.fixture
def needs_toy(tmp_path, monkeypatch):
    return _toy_module(tmp_path, monkeypatch, "needs_toy", NEEDS_TOY)


def _per_unit(path) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for r in read_metrics(path):
        out.setdefault(r["unit"], []).append({k: v for k, v in r.items() if not k.startswith("wall_")})
    return out


def test_units_in_two_workers_give_the_sequential_runs_records_and_report(tmp_path, capsys):
    common = ["--preset", "smoke", "--no-progress", "--no-report"]
    assert main(["run", "token-dense", "--out", str(tmp_path / "seq"), *common, "--threads", "1"]) == 0
    assert main(["run", "token-dense", "--out", str(tmp_path / "par"), *common, "--jobs", "2"]) == 0
    seq, par = _per_unit(tmp_path / "seq" / "metrics.jsonl"), _per_unit(tmp_path / "par" / "metrics.jsonl")
    assert par == seq and len(seq) == 8 and all(v[-1] == {"unit": u, "event": "done"} for u, v in seq.items())
    meta = json.loads((tmp_path / "par" / "run.json").read_text())
    assert meta["status"] == "complete" and meta["runs"][-1]["jobs"] == 2
    assert meta["runs"][-1]["torch_threads"] == max(1, runner.available_cores() // 2)
    # The report lists the units as planned, not in the order the workers happened to write them.
    reports = [write_report(tmp_path / d, tmp_path / f"{d}.md").read_text().replace(d, "X") for d in ("seq", "par")]
    sections = [r[r.index("\n## "):].splitlines() for r in reports]      # past the header's date
    differ = [(a, b) for a, b in zip(*sections) if a != b]
    assert len(sections[0]) == len(sections[1]) > 20 and all("wall" in a or " s " in a for a, _ in differ), differ


def test_a_unit_that_diverges_in_a_worker_is_recorded_and_the_others_finish(tmp_path, toy, capsys):
    out = runner.run_experiment(toy, "smoke", out=tmp_path / "t", progress=False, quiet=True, jobs=2)
    recs = _per_unit(out / "metrics.jsonl")
    assert [r["x"] for r in recs["ccc"][:-1]] == [30.0, 31.0, 32.0, 33.0, 34.0]
    assert [r["step"] for r in recs["bad"][:-1]] == [0, 1]
    assert recs["bad"][-1] == {"unit": "bad", "event": "diverged", "step": 2, "metric": "x"}
    assert recs["a"][-1]["event"] == recs["bb"][-1]["event"] == recs["ccc"][-1]["event"] == "done"
    meta = json.loads((out / "run.json").read_text())
    assert meta["status"] == "complete (1 unit diverged)"
    assert meta["data_source"] == "toy data" and meta["data_fingerprint"] == "fp-1"   # sent by the workers
    assert "unit bad diverged at step 2" in capsys.readouterr().err
    # A resume finds every unit finished: nothing runs, nothing is written.
    before = (out / "metrics.jsonl").read_bytes()
    runner.run_experiment(toy, out=out, resume=True, progress=False, quiet=True, jobs=2)
    assert (out / "metrics.jsonl").read_bytes() == before


def test_a_unit_that_fails_in_a_worker_stops_the_run_with_its_traceback(tmp_path, toy):
    with pytest.raises(runner.UnitFailed, match="(?s)unit err failed in its worker process.*ValueError: boom"):
        runner.run_experiment(toy, "failing", out=tmp_path / "t", progress=False, quiet=True, jobs=2)
    meta = json.loads((tmp_path / "t" / "run.json").read_text())
    assert meta["status"].startswith("failed (UnitFailed: jobs-toy unit err failed in its worker process")
    recs = _per_unit(tmp_path / "t" / "metrics.jsonl")
    assert [r["step"] for r in recs["err"]] == [0]                     # what it logged before it failed is kept
    assert all(r.get("event") != "done" for r in recs["err"])


@pytest.mark.parametrize("args, message", [
    (["--jobs", "0"], "--jobs 0: must be an integer >= 1"),
    (["--jobs", "2", "--device", "cuda"], "--jobs 2 with --device cuda: worker processes share out CPU cores"),
])
def test_refused_jobs_are_one_line_before_anything_is_written(tmp_path, capsys, args, message):
    out = tmp_path / "x"
    assert main(["run", "token-dense", "--preset", "smoke", "--out", str(out), *args]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and not out.exists()


def test_an_experiment_that_batches_its_units_refuses_jobs(tmp_path, capsys):
    assert main(["run", "tabular-single", "--preset", "smoke", "--out", str(tmp_path / "x"), "--jobs", "2"]) == 2
    assert "tabular-single computes all its units together in one batch" in capsys.readouterr().err


@pytest.mark.slow
def test_ctrl_c_stops_the_workers_and_the_run_resumes_to_the_sequential_records(tmp_path):
    out = tmp_path / "run"
    # Three units for two workers (one waits for a free worker), long enough to be stopped midway.
    config = ["episodes=15", "vocabs=2", "methods=dg,tpo_token,ppo"]
    cmd = [sys.executable, "-m", "targetpo", "run", "token-dense", "--preset", "smoke", "--out", str(out),
           "--no-progress", "--no-report", "--jobs", "2", *config]
    # A shell without job control starts background jobs with SIGINT ignored and a child inherits that (`make test
    # &` in a script), so Python would install no KeyboardInterrupt handler: Ctrl-C's default is restored for it.
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    t0, deadline = time.time(), time.time() + 120
    while proc.poll() is None and time.time() < deadline and len(read_metrics(out / "metrics.jsonl")) < 5:
        time.sleep(0.2)
    lines = len(read_metrics(out / "metrics.jsonl"))
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGINT)                              # Ctrl-C reaches the whole process group
    stdout, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, (f"Ctrl-C sent {time.time() - t0:.1f} s after the start with {lines} lines "
                                    f"written; stdout: {stdout!r}; stderr: {err!r}")
    assert "Traceback" not in err
    assert json.loads((out / "run.json").read_text())["status"] == "interrupted"
    deadline = time.time() + 10  # multiprocessing's resource tracker leaves a moment after its parent
    while (leftover := subprocess.run(["pgrep", "-a", "-g", str(proc.pid)], capture_output=True,
                                      text=True).stdout.strip()) and time.time() < deadline:
        time.sleep(0.2)
    assert not leftover, f"processes outlived the run: {leftover}"
    assert subprocess.run([*cmd, "--resume"], capture_output=True).returncode == 0
    ref = tmp_path / "ref"
    assert main(["run", "token-dense", "--preset", "smoke", "--out", str(ref), "--no-progress", "--no-report",
                 "--threads", "1", *config]) == 0
    assert _per_unit(out / "metrics.jsonl") == _per_unit(ref / "metrics.jsonl")


NEEDS_TOY = textwrap.dedent('''
    """A toy experiment whose units read what its first unit wrote (imported by name in the workers)."""
    import time
    from pathlib import Path

    from targetpo.runs.config import RunConfig, config, default, param

    NAME, TITLE, PAPER_REF = "needs-toy", "toy", "-"


    @config
    class Config(RunConfig):
        steps: int = param(3, "steps", ge=1)
        base_nan_at: int = param(-1, "the step at which base logs NaN (-1: never)", ge=-1)
        methods = default(("base", "x", "y"))


    PRESETS = {"smoke": Config(), "diverging": Config(base_nan_at=1)}


    def unit_steps(cfg, unit):
        return 2 * cfg.steps if unit == "base" else cfg.steps   # the longest, so dispatched first


    def unit_needs(cfg, unit):
        return [] if unit == "base" else ["base"]


    def run_unit(cfg, unit, ctx):
        marker = Path(ctx.run_dir) / "base.out"
        if unit != "base" and not marker.exists():
            raise RuntimeError(f"unit {unit} started before base had finished")
        for t in range(unit_steps(cfg, unit)):
            time.sleep(0.2 if unit == "base" else 0.0)        # long enough for a free worker to start another unit
            ctx.log({"step": t, "x": float("nan") if unit == "base" and t == cfg.base_nan_at else float(t)})
            ctx.advance()
        if unit == "base":
            marker.write_text("done")


    def report(run, section):
        section.text("toy")
''')


def test_a_unit_waits_in_the_queue_for_the_units_it_needs(tmp_path, needs_toy):
    # The rlvr and llm-length units start from their warm-start unit's checkpoint: two workers used to start one
    # beside the warm start, both built it into the same folder, and the run failed.
    out = runner.run_experiment(needs_toy, "smoke", out=tmp_path / "t", progress=False, quiet=True, jobs=2)
    lines = read_metrics(out / "metrics.jsonl")
    base_done = lines.index({"unit": "base", "event": "done"})
    assert {r["unit"] for r in lines[:base_done]} == {"base"} and len(lines) == 7 + 4 + 4  # records + done lines
    assert json.loads((out / "run.json").read_text())["status"] == "complete"


@pytest.mark.parametrize("jobs", [1, 2])
def test_units_that_need_a_diverged_unit_are_recorded_as_diverged_and_not_started(tmp_path, monkeypatch,
                                                                                   needs_toy, jobs):
    # A diverged warm start used to be rebuilt by the first RL unit that found none (unchecked for NaN, and
    # under --jobs by several units into one folder); now its dependents are not started (the toy's x and y
    # raise if they are) and say why.
    toy = needs_toy
    monkeypatch.setitem(experiments.EXPERIMENTS, "needs-toy", "needs_toy")  # for the report
    out = runner.run_experiment(toy, "diverging", out=tmp_path / "t", progress=False, quiet=True, jobs=jobs)
    events = {r["unit"]: r for r in read_metrics(out / "metrics.jsonl") if "event" in r}
    assert events == {"base": {"unit": "base", "event": "diverged", "step": 1, "metric": "x"},
                      **{u: {"unit": u, "event": "diverged", "step": 0, "metric": "needs base, which diverged"}
                         for u in ("x", "y")}}
    assert json.loads((out / "run.json").read_text())["status"] == "complete (3 units diverged)"
    report = write_report(out, tmp_path / "report.md").read_text()
    assert "`x` at step 0 (needs base, which diverged)" in report and "a unit that needs a diverged one was not run" \
        in report
    # A resume finds every unit finished; --force replays base first, and x, y only after it.
    runner.run_experiment(toy, "diverging", out=out, progress=False, quiet=True, jobs=jobs, resume=True)
    assert len(read_metrics(out / "metrics.jsonl")) == 1 + 3


ENV_TOY = textwrap.dedent('''
    """A toy experiment whose units log an environment variable."""
    import os

    from targetpo.runs.config import RunConfig, config, default, param

    NAME, TITLE, PAPER_REF = "env-toy", "toy", "-"


    @config
    class Config(RunConfig):
        steps: int = param(1, "steps", ge=1)
        methods = default(("a", "b"))


    PRESETS = {"smoke": Config()}


    def run_unit(cfg, unit, ctx):
        ctx.log({"step": 0, "x": float(os.environ.get("ENV_TOY_X", "-1"))})
        ctx.advance()
''')


def test_workers_see_the_environment_their_parent_has_when_it_starts_them(tmp_path, monkeypatch):
    # Workers fork from one server per process, which keeps the environment of the parent's first worker start
    # (`runs.workers.start_worker`); a spawned worker would see the parent's environment of the moment.
    toy = _toy_module(tmp_path, monkeypatch, "env_toy", ENV_TOY)
    for value in ("1", "2"):
        monkeypatch.setenv("ENV_TOY_X", value)
        out = runner.run_experiment(toy, "smoke", out=tmp_path / value, progress=False, quiet=True, jobs=2)
        assert [r["x"] for r in read_metrics(out / "metrics.jsonl") if "x" in r] == [float(value)] * 2


def test_unit_needs_of_every_experiment_name_its_own_earlier_units():
    from targetpo.experiments import EXPERIMENTS, load

    seen = 0
    for name in EXPERIMENTS:
        exp = load(name)
        for preset, cfg in exp.PRESETS.items():
            units = runner.units_of(exp, cfg)
            for i, unit in enumerate(units):
                needs = runner.needs_of(exp, cfg, unit)
                seen += len(needs)
                # Earlier in the sequential order: a --jobs 1 run meets them first, and no cycle is possible.
                assert set(needs) <= set(units[:i]), (name, preset, unit, needs)
    assert seen > 0  # rlvr and llm-length declare their warm start


def test_rlvr_in_two_workers_gives_the_sequential_records(tmp_path):
    common = ["--preset", "smoke", "--no-progress", "--no-report"]
    assert main(["run", "rlvr", "--out", str(tmp_path / "par"), *common, "--jobs", "2"]) == 0
    assert main(["run", "rlvr", "--out", str(tmp_path / "seq"), *common, "--threads", "1"]) == 0
    par, seq = (_per_unit(tmp_path / d / "metrics.jsonl") for d in ("par", "seq"))
    assert par == seq and set(seq) == {"warmstart", "tpo_sum", "grpo"}


@pytest.mark.parametrize("kw, expected", [
    ({}, 2),                                  # a cpu preset on 2 idle cores: one process per core
    ({"units": 1}, 1),                        # a single unit left (e.g. after a resume)
    ({"cores": 8, "units": 5}, 5),            # no more processes than units
    ({"cores": 1}, 1),                        # another job holds the other core
    ({"preset": "smoke"}, 1),                 # seconds of work: less than starting a worker costs
    ({"device": "cuda"}, 1),
    ({"threads_asked": True}, 1),             # --threads N asks for one process of N threads
])
def test_run_without_jobs_spreads_units_over_the_idle_cores(kw, expected):
    from targetpo.experiments import load

    args = {"preset": "cpu", "device": "cpu", "units": 8, "cores": 2, "threads_asked": False, **kw}
    assert runner.auto_jobs(load("token-sweeps"), **args) == expected
    assert runner.auto_jobs(load("tabular-multi"), **args) == 1   # its units are one batch
    assert runner.auto_jobs(load("rlvr"), **args) == 1            # a model copy per worker: only when asked


def test_run_without_jobs_uses_workers_on_idle_cores_with_the_sequential_records(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(runner, "default_threads", lambda: 2)        # two idle cores, whatever this machine has
    config = ["episodes=3", "etas=0.5,2", "length=6", "batch=20"]  # a cpu preset (so workers), small
    assert main(["run", "token-temperature", "--out", str(tmp_path / "auto"), "--no-progress", "--no-report",
                 *config]) == 0
    assert "(2 seeds, 2 units, 2 processes)" in capsys.readouterr().out
    assert main(["run", "token-temperature", "--out", str(tmp_path / "one"), "--no-progress", "--no-report",
                 "--jobs", "1", *config]) == 0
    runs = [json.loads((tmp_path / d / "run.json").read_text())["runs"][-1] for d in ("auto", "one")]
    assert (runs[0]["jobs"], runs[0]["torch_threads"]) == (2, 1) and (runs[1]["jobs"], runs[1]["torch_threads"]) == (1, 2)
    assert _per_unit(tmp_path / "auto" / "metrics.jsonl") == _per_unit(tmp_path / "one" / "metrics.jsonl")
