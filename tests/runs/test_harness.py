"""The runner and store: determinism, kill + resume without losing or duplicating lines, overrides, reports."""

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
from targetpo.experiments import EXPERIMENTS, load, run_experiment
from targetpo.runs.config import apply_overrides
from targetpo.tabular.multi import PRESETS
from targetpo.report import write_report
from targetpo.runs import store
from targetpo.runs.store import Run, read_metrics, record_key

ROOT = Path(__file__).resolve().parents[2]


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines()


def test_same_seed_and_config_give_identical_metrics(tmp_path):
    a = run_experiment("tabular-single", "smoke", out=tmp_path / "a", progress=False, quiet=True)
    b = run_experiment("tabular-single", "smoke", out=tmp_path / "b", progress=False, quiet=True)
    assert _lines(a / "metrics.jsonl") == _lines(b / "metrics.jsonl")
    c = run_experiment("tabular-single", "smoke", out=tmp_path / "c", overrides=["seed=1"], progress=False, quiet=True)
    assert _lines(a / "metrics.jsonl") != _lines(c / "metrics.jsonl")


def test_killed_run_resumes_to_the_uninterrupted_result(tmp_path):
    # 5 units × 2,000 steps: the kill lands long before the end even when a loaded machine polls late (at 400
    # steps a busy CI machine once saw all 2,005 records written before the kill).
    overrides = ["steps=2000", "seeds=50"]
    full = run_experiment("tabular-multi", "paper", out=tmp_path / "full", overrides=overrides, progress=False, quiet=True)
    killed = tmp_path / "killed"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.Popen([sys.executable, "-m", "targetpo.cli", "run", "tabular-multi", "--preset", "paper",
                             "--out", str(killed), "--no-progress", "--no-report", *overrides], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    metrics = killed / "metrics.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if metrics.exists() and metrics.stat().st_size and len(read_metrics(metrics)) >= 700:
            break
        time.sleep(0.01)
    assert proc.poll() is None, "the run finished before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    before = read_metrics(metrics)
    assert 700 <= len(before) < 5 * 2000
    assert json.loads((killed / "run.json").read_text())["status"] == "running"

    run_experiment("tabular-multi", "paper", out=killed, resume=True, progress=False, quiet=True)
    after = read_metrics(metrics)
    assert after[: len(before)] == before  # nothing written before the kill was lost or rewritten
    keys = [record_key(r) for r in after]
    assert len(keys) == len(set(keys))  # nothing duplicated
    by_key = lambda recs: {record_key(r): r for r in recs}  # noqa: E731
    assert by_key(after) == by_key(read_metrics(full / "metrics.jsonl"))
    meta = json.loads((killed / "run.json").read_text())
    assert meta["status"] == "complete" and "resume_mismatches" not in meta and len(meta["runs"]) == 2


def test_partial_trailing_line_is_repaired_on_resume(tmp_path):
    out = run_experiment("tabular-single", "smoke", out=tmp_path / "r", progress=False, quiet=True)
    metrics = out / "metrics.jsonl"
    lines = metrics.read_bytes().splitlines(keepends=True)
    # Keep the first unit's lines and half of the next line, as a kill mid-write would leave them.
    metrics.write_bytes(b"".join(lines[:25]) + lines[25][:10])
    run_experiment("tabular-single", "smoke", out=out, resume=True, progress=False, quiet=True)
    assert metrics.read_bytes() == b"".join(lines)


def test_existing_run_needs_resume_or_force_and_resume_refuses_new_overrides(tmp_path):
    out = run_experiment("tabular-single", "smoke", out=tmp_path / "x", progress=False, quiet=True)
    with pytest.raises(FileExistsError, match="--resume"):
        run_experiment("tabular-single", "smoke", out=out, progress=False, quiet=True)
    with pytest.raises(ValueError, match="--resume continues"):
        run_experiment("tabular-single", "smoke", out=out, resume=True, overrides=["steps=3"], progress=False)
    run_experiment("tabular-single", "smoke", out=out, force=True, overrides=["steps=3"], progress=False, quiet=True)
    assert max(r["step"] for r in Run.load(out).rows("tpo")) == 2


def test_overrides_are_typed_and_unknown_fields_rejected():
    cfg = apply_overrides(PRESETS["smoke"], ["steps=7", "lr=0.5", "methods=tpo,ce"])
    assert cfg.steps == 7 and cfg.lr == 0.5 and cfg.methods == ("tpo", "ce")
    with pytest.raises(ValueError, match="valid fields"):
        apply_overrides(PRESETS["smoke"], ["stepz=7"])
    with pytest.raises(ValueError, match="expected an integer"):
        apply_overrides(PRESETS["smoke"], ["steps=seven"])
    with pytest.raises(ValueError, match="must be one of"):
        run_experiment("tabular-multi", "smoke", out="/nonexistent/never", overrides=["methods=tpo,magic"])


def test_cli_run_writes_run_json_metrics_and_report(tmp_path, capsys):
    out = tmp_path / "cli"
    assert main(["run", "tabular-multi", "--preset", "smoke", "--out", str(out), "--no-progress"]) == 0
    meta = json.loads((out / "run.json").read_text())
    assert meta["config"]["steps"] == 50 and meta["status"] == "complete"
    assert meta["versions"]["torch"] == torch.__version__
    assert meta["versions"]["cpu"].endswith(f"{torch.backends.cpu.get_cpu_capability()} kernels")
    assert meta["data_source"] and meta["wall_time_s"] > 0
    report = (out / "REPORT.md").read_text()
    assert f"torch {torch.__version__} on {meta['versions']['cpu']}" in report  # records depend on the CPU
    assert "| paper claim | result |" in report and (out / "tabular_multi.png").stat().st_size > 1000
    assert "first step below 1%" in capsys.readouterr().out
    assert main(["run", "tabular-multi", "--preset", "nope", "--out", str(tmp_path / "bad")]) == 2
    capsys.readouterr()
    assert main(["list"]) == 0
    listed = capsys.readouterr().out
    for name in EXPERIMENTS:  # every experiment with its title and every preset
        exp = load(name)
        assert f"{name} " in listed and exp.TITLE in listed and all(f"{p} (" in listed for p in exp.PRESETS), name


def test_report_over_a_directory_of_runs_marks_claims(tmp_path):
    for name in ("tabular-single", "tabular-multi"):
        run_experiment(name, "smoke", out=tmp_path / name, progress=False, quiet=True)
    text = write_report(tmp_path).read_text()
    assert text.count("## Tabular") == 2
    # The smoke presets are far too short for the paper's claims: no verdict, and the headline says so.
    assert "**FAIL**" not in text and "**PASS**" not in text
    assert text.count("| n/a (smoke preset) |") >= 5
    assert "no verdicts (only the cpu and paper presets can test a claim)" in text


def _batched_experiment(calls: list):
    """A toy experiment that runs its units side by side (run_units); unit "bad" turns NaN at step 2."""
    from types import ModuleType

    from targetpo.runs.config import RunConfig, config, default, param

    @config
    class Config(RunConfig):
        steps: int = param(5, "steps", ge=1)
        methods = default(("a", "bad", "c"))

    def run_units(cfg, units, ctxs):
        calls.append(list(units))
        for t in range(cfg.steps):
            for u in units:
                value = float("nan") if u == "bad" and t == 2 else 10.0 * "abc".index(u[0]) + t
                ctxs[u].log({"step": t, "x": value})
                ctxs[u].advance()

    exp = ModuleType("toy")
    exp.NAME, exp.TITLE, exp.PAPER_REF = "toy", "toy", "-"
    exp.Config, exp.PRESETS, exp.run_units = Config, {"smoke": Config()}, run_units
    return exp


def test_units_run_side_by_side_keep_per_unit_records_divergence_and_resume(tmp_path, capsys):
    from targetpo.runs.runner import run_experiment as run_module

    calls: list = []
    out = run_module(_batched_experiment(calls), "smoke", out=tmp_path / "t", progress=False, quiet=True)
    # The diverged unit leaves the batch; the others replay without writing a line twice.
    assert calls == [["a", "bad", "c"], ["a", "c"]]
    recs = read_metrics(out / "metrics.jsonl")
    keys = [record_key(r) for r in recs]
    assert len(keys) == len(set(keys))
    steps = {u: [r["step"] for r in recs if r["unit"] == u and "x" in r] for u in "a bad c".split()}
    assert steps == {"a": [0, 1, 2, 3, 4], "bad": [0, 1], "c": [0, 1, 2, 3, 4]}
    assert [r["x"] for r in recs if r["unit"] == "c" and "x" in r] == [20.0, 21.0, 22.0, 23.0, 24.0]
    events = {r["unit"]: r for r in recs if "event" in r}
    assert events["bad"] == {"unit": "bad", "event": "diverged", "step": 2, "metric": "x"}
    assert events["a"]["event"] == events["c"]["event"] == "done"
    meta = json.loads((out / "run.json").read_text())
    assert meta["status"] == "complete (1 unit diverged)" and "resume_mismatches" not in meta
    assert "unit bad diverged at step 2" in capsys.readouterr().err
    # Resume: every unit is finished (done or diverged), so nothing runs and nothing is written.
    before = (out / "metrics.jsonl").read_bytes()
    calls.clear()
    run_module(_batched_experiment(calls), "smoke", out=out, resume=True, progress=False, quiet=True)
    assert calls == [] and (out / "metrics.jsonl").read_bytes() == before
    # A run cut after a's first lines resumes with the unfinished units only, to the same records.
    lines = before.splitlines(keepends=True)
    (out / "metrics.jsonl").write_bytes(b"".join(lines[:4]))
    run_module(_batched_experiment(calls), "smoke", out=out, resume=True, progress=False, quiet=True)
    assert calls == [["a", "bad", "c"], ["a", "c"]]
    after = read_metrics(out / "metrics.jsonl")
    assert {record_key(r): r for r in after} == {record_key(r): r for r in recs}


def test_two_runs_of_one_experiment_get_distinct_contents_links(tmp_path):
    for name in ("a", "b"):
        run_experiment("tabular-single", "smoke", out=tmp_path / name, progress=False, quiet=True, threads=1)
    text = write_report(tmp_path).read_text()
    assert "from 2 runs in" in text
    contents = text.split("## Contents", 1)[1].split("\n## ", 1)[0]
    links = [line.rsplit("](#", 1)[1].rstrip(")") for line in contents.splitlines() if line.startswith("- [")]
    assert len(links) == 2 and links[1] == links[0] + "-1"  # the numbering renderers give a repeated heading


def test_a_report_killed_while_writing_leaves_the_previous_one_whole(tmp_path, monkeypatch):
    run_experiment("tabular-single", "smoke", out=tmp_path / "a", progress=False, quiet=True, threads=1)
    before = write_report(tmp_path).read_text()
    real_write = Path.write_text

    def killed_halfway(self, text, *args, **kwargs):
        real_write(self, text[: len(text) // 2], *args, **kwargs)
        raise KeyboardInterrupt  # the process dies with half the text written

    monkeypatch.setattr(Path, "write_text", killed_halfway)
    with pytest.raises(KeyboardInterrupt):
        write_report(tmp_path)
    monkeypatch.undo()
    assert (tmp_path / "REPORT.md").read_text() == before


def test_a_run_started_beside_another_on_a_new_folder_is_refused(tmp_path, monkeypatch):
    """Two runs started together on a new --out both found no folder; the second then wrote beside the first
    without the lock (every record twice). The other process is simulated filling the folder in between."""
    from targetpo.runs import runner

    out, make = tmp_path / "run", runner.make_run_dir

    def made_by_another_process_meanwhile(run_dir):
        make(run_dir)
        (run_dir / "run.json").write_text("{}")

    monkeypatch.setattr(runner, "make_run_dir", made_by_another_process_meanwhile)
    with pytest.raises(FileExistsError, match="was filled by another targetpo process while this one started"):
        run_experiment("tabular-single", "smoke", out=out, progress=False, quiet=True)
    assert not (out / "metrics.jsonl").exists()


def test_the_data_source_is_in_run_json_as_soon_as_a_unit_reads_it(tmp_path):
    from targetpo.runs.runner import RunContext

    meta = {"experiment": "mnist", "data_source": "generated (no external data)", "status": "running"}
    ctx = RunContext("u", writer=None, bar=None, device=torch.device("cpu"), meta=meta, run_dir=tmp_path)
    ctx.set_data_source("MNIST from /data", "abc")
    stored = json.loads((tmp_path / "run.json").read_text())  # a kill -9 now keeps it
    assert stored["data_source"] == "MNIST from /data" and stored["data_fingerprint"] == "abc"


def _relabelled_copy(src: Path, dst: Path) -> Path:
    import gzip
    import shutil

    dst.mkdir()
    for f in src.iterdir():
        if f.name.startswith("t10k-images"):
            shutil.copy(f, dst / f.name)
        elif f.name.startswith("t10k-labels"):
            raw = gzip.decompress(f.read_bytes()) if f.suffix == ".gz" else f.read_bytes()
            (dst / "t10k-labels-idx1-ubyte").write_bytes(raw[:8] + bytes((b + 1) % 10 for b in raw[8:]))
    return dst


def test_a_resume_on_other_data_is_refused(tmp_path, capsys, monkeypatch, mnist_dir):
    """The data directory came from $TARGETPO_MNIST_DIR (config data_dir=None): a resume with the variable
    pointing at relabelled data was accepted, and the curves mixed two data sets."""
    out = tmp_path / "run"
    monkeypatch.setenv("TARGETPO_MNIST_DIR", str(mnist_dir))
    assert main(["run", "mnist", "--preset", "smoke", "--out", str(out), "--no-progress", "--no-report"]) == 0
    meta = json.loads((out / "run.json").read_text())
    assert len(meta["data_fingerprint"]) == 16
    # As if killed after the first half: the later records and the done lines gone, the status "interrupted".
    lines = (out / "metrics.jsonl").read_text().splitlines()
    kept = "\n".join(lines[: len(lines) // 2]) + "\n"
    (out / "metrics.jsonl").write_text(kept)
    (out / "run.json").write_text(json.dumps({**meta, "status": "interrupted"}))
    stored = (out / "run.json").read_bytes()
    capsys.readouterr()
    monkeypatch.setenv("TARGETPO_MNIST_DIR", str(_relabelled_copy(mnist_dir, tmp_path / "relabelled")))
    assert main(["run", "mnist", "--out", str(out), "--resume", "--no-progress", "--no-report"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "was computed on other data" in err[0] and meta["data_fingerprint"] in err[0], err
    assert (out / "metrics.jsonl").read_text() == kept
    assert (out / "run.json").read_bytes() == stored  # no segment, wall time or status of the refused resume
    monkeypatch.setenv("TARGETPO_MNIST_DIR", str(mnist_dir))  # its own data: it resumes
    assert main(["run", "mnist", "--out", str(out), "--resume", "--no-progress", "--no-report"]) == 0
    assert (out / "metrics.jsonl").read_text().splitlines() == lines


def test_a_run_folder_named_otherwise_and_an_open_questions_claims_are_labelled(tmp_path):
    """A run in `--out m` was headed "Run `m`" alone, and the open questions' claims sat in a "paper claim"
    column (llm-length's), as if the paper had made them."""
    from targetpo.experiments import run_experiment
    from targetpo.report import Section
    from targetpo.runs.store import Run

    out = run_experiment("tabular-single", "smoke", out=tmp_path / "m", progress=False, quiet=True)
    section = Section("t", Run.load(out), tmp_path)
    section.claim("a claim", None, "evidence")
    assert "Run `m` (`tabular-single`) · preset" in section.render() and "| paper claim |" in section.render()
    run = Run.load(out)
    run.meta["experiment"] = "llm-length"  # a suite other than the paper's
    section = Section("t", run, tmp_path)
    section.claim("a claim", None, "evidence")
    assert "| claim (an open question's, not the paper's) |" in section.render()
    from targetpo.report import claims_heading

    assert claims_heading([section]) == "Claims (the paper's, and 1 claim of the open questions)"
    assert claims_heading([Section("t", Run.load(out), tmp_path)]) == "Paper claims"


def test_the_cpu_is_described_by_model_family_and_torch_kernels():
    """A run names the CPU its numbers came from: two CPUs with other kernels give other curves."""
    info = "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 26\nmodel name\t: AMD EPYC\n\nprocessor\t: 1\n"
    kernels = torch.backends.cpu.get_cpu_capability()
    assert store.cpu_description(info) == f"AMD EPYC (family 26), {kernels} kernels"
    assert store.cpu_description("model name : Some CPU\n") == f"Some CPU, {kernels} kernels"
    assert store.cpu_description("").endswith(f", {kernels} kernels")  # no /proc/cpuinfo: platform's name
