"""The run folder under --force, reproduce's NOT RUN records, --resume of nothing, another device, SIGTERM,
replays that differ, and paths with spaces (docs/architecture.md, run folder format)."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from targetpo.cli import main
from targetpo.experiments import load, run_experiment
from targetpo.report import write_report
from targetpo.runs.runner import mark_not_run
from targetpo.runs.store import read_metrics

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT / "src")}


def _start(args: list[str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "targetpo.cli", *args], env=ENV, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


def _wait_for_records(proc, metrics: Path, n: int) -> None:
    """Until the run `proc` started (its run.json asks for 200,000 steps) has written `n` records."""
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        try:
            mine = json.loads((metrics.parent / "run.json").read_text())["config"]["steps"] == 200000
        except (OSError, ValueError, KeyError):
            mine = False
        if mine and metrics.exists() and metrics.stat().st_size and len(read_metrics(metrics)) >= n:
            return
        time.sleep(0.01)
    raise AssertionError("the run ended (or never wrote) before the check")


def test_force_keeps_the_folder_locked(tmp_path, capsys):
    """--force deleted the locked folder and made a new, unlocked one: a --resume beside it was accepted and both
    wrote into one metrics file (332 duplicated records in the audit)."""
    out = tmp_path / "run"
    run_experiment("tabular-multi", "smoke", out=out, progress=False, quiet=True)
    proc = _start(["run", "tabular-multi", "--preset", "smoke", "--out", str(out), "--force", "--no-progress",
                   "--no-report", "steps=200000"])
    try:
        _wait_for_records(proc, out / "metrics.jsonl", 20)
        assert main(["run", "tabular-multi", "--out", str(out), "--resume", "--no-report", "--no-progress"]) == 2
        assert "is in use by another targetpo process" in capsys.readouterr().err
    finally:
        proc.kill()
        proc.wait()


def test_sigterm_leaves_the_run_interrupted_and_resumable(tmp_path):
    """`kill` (SIGTERM) ended `targetpo run` at once, leaving run.json saying "running"."""
    out = tmp_path / "run"
    proc = _start(["run", "tabular-multi", "--preset", "smoke", "--out", str(out), "--no-progress", "--no-report",
                   "steps=200000"])
    _wait_for_records(proc, out / "metrics.jsonl", 20)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    assert json.loads((out / "run.json").read_text())["status"] == "interrupted"


def test_a_not_run_record_is_replaced_by_a_run_and_is_no_run_to_resume(tmp_path, capsys):
    """reproduce's NOT RUN record (config {}) blocked `run` ("already holds a run"), and `--resume` trained the
    config class's defaults under it and then could not be reported."""
    out = tmp_path / "tabular-single"
    mark_not_run(out, load("tabular-single"), "smoke", "no data")
    assert main(["run", "tabular-single", "--out", str(out), "--resume", "--no-report", "--no-progress"]) == 2
    assert "holds no run to continue, only the record that `reproduce` could not run it" in capsys.readouterr().err
    assert main(["run", "tabular-single", "--preset", "smoke", "--out", str(out), "--no-progress"]) == 0
    meta = json.loads((out / "run.json").read_text())
    assert meta["status"] == "complete" and meta["config"]


def test_resume_of_a_folder_without_a_run_is_refused(tmp_path, capsys):
    """A typo in --out with --resume started a new cpu run there (llm-length: ~45 min)."""
    assert main(["run", "tabular-single", "--out", str(tmp_path / "typo"), "--resume", "--no-progress"]) == 2
    assert "--resume: " in capsys.readouterr().err and not (tmp_path / "typo").exists()


def test_resume_on_another_device_is_refused(tmp_path, capsys):
    out = run_experiment("tabular-single", "smoke", out=tmp_path / "r", progress=False, quiet=True)
    meta = json.loads((out / "run.json").read_text())
    meta["device"], meta["status"] = "cuda:0", "interrupted"  # as if it had run on a GPU and been stopped
    (out / "run.json").write_text(json.dumps(meta))
    with open(out / "metrics.jsonl") as f:
        kept = [ln for ln in f if '"event"' not in ln]  # no unit finished
    (out / "metrics.jsonl").write_text("".join(kept[:3]))
    assert main(["run", "tabular-single", "--out", str(out), "--resume", "--no-progress"]) == 2
    assert "which ran on --device cuda:0; asked --device cpu: pass --device cuda:0" in capsys.readouterr().err
    assert "--resume --device cuda:0" in write_report(out).read_text()  # the report's resume hint says so


def test_a_replay_that_differs_from_disk_is_shown_in_the_report(tmp_path):
    """The runner kept the lines on disk and only printed a warning; the report showed curves mixing two
    computations as a clean complete run."""
    out = run_experiment("tabular-single", "smoke", out=tmp_path / "r", progress=False, quiet=True)
    lines = (out / "metrics.jsonl").read_text().splitlines()
    first = json.loads(lines[0])
    first["error"] = [v + 0.25 for v in first["error"]]  # a hand edit (or another torch) on a kept line
    kept = [json.dumps(first)] + [ln for ln in lines[1:] if '"event"' not in ln]
    (out / "metrics.jsonl").write_text("\n".join(kept[: len(kept) // 2]) + "\n")  # killed halfway
    meta = json.loads((out / "run.json").read_text())
    meta["status"] = "interrupted"
    (out / "run.json").write_text(json.dumps(meta))
    run_experiment("tabular-single", "smoke", out=out, resume=True, progress=False, quiet=True)
    assert "**Resumed on other numbers:** 1 replayed record of" in write_report(out).read_text()


def test_a_run_folder_with_spaces_gives_working_links_and_commands(tmp_path):
    out = tmp_path / "my runs" / "run 1"
    run_experiment("tabular-single", "smoke", out=out, progress=False, quiet=True)
    meta = json.loads((out / "run.json").read_text())
    meta["status"] = "interrupted"
    (out / "run.json").write_text(json.dumps(meta))
    with open(out / "metrics.jsonl") as f:
        kept = [ln for ln in f if '"event"' not in ln]  # no unit finished: an incomplete run, with its hint
    (out / "metrics.jsonl").write_text("".join(kept[:3]))
    text = write_report(tmp_path / "my runs").read_text(encoding="utf-8")
    assert "--out '" in text and "run 1' --resume" in text
    assert "](<run 1/tabular_single.png>)" in text or "tabular_single.png" not in text


@pytest.mark.parametrize("locale", ["C"])
def test_the_report_is_utf8_whatever_the_locale(tmp_path, locale):
    out = run_experiment("tabular-single", "smoke", out=tmp_path / "r", progress=False, quiet=True)
    env = {**ENV, "LC_ALL": locale, "LANG": locale, "PYTHONUTF8": "0", "PYTHONIOENCODING": "utf-8"}
    done = subprocess.run([sys.executable, "-m", "targetpo.cli", "report", str(out)], env=env, capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stderr
    assert "≥" in (out / "REPORT.md").read_text(encoding="utf-8") or "§" in (out / "REPORT.md").read_text(encoding="utf-8")


def test_a_failed_run_says_it_failed_not_that_it_was_killed(tmp_path):
    out = run_experiment("tabular-single", "smoke", out=tmp_path / "r", progress=False, quiet=True)
    meta = json.loads((out / "run.json").read_text())
    meta["status"] = "failed (OutOfMemoryError: CUDA out of memory)"
    (out / "run.json").write_text(json.dumps(meta))
    with open(out / "metrics.jsonl") as f:
        kept = [ln for ln in f if '"event"' not in ln]
    (out / "metrics.jsonl").write_text("".join(kept[:3]))
    text = write_report(out).read_text()
    assert "**Incomplete run** (failed (OutOfMemoryError: CUDA out of memory))" in text, text[:600]


def test_resume_refuses_config_fields_it_does_not_know(tmp_path, capsys):
    """A field in run.json's config that this version does not take (a hand edit, a removed option) was dropped
    on resume, and the replay continued as another run."""
    out = run_experiment("tabular-single", "smoke", out=tmp_path / "r", progress=False, quiet=True)
    meta = json.loads((out / "run.json").read_text())
    meta["config"]["bogus"], meta["status"] = 1, "interrupted"
    (out / "run.json").write_text(json.dumps(meta))
    assert main(["run", "tabular-single", "--out", str(out), "--resume", "--no-progress"]) == 2
    assert "has config fields tabular-single does not take (bogus)" in capsys.readouterr().err


def test_a_read_only_run_folder_is_reported_with_its_plots_beside_the_report(tmp_path, monkeypatch):
    """Plots always went into the run folder: a read-only one (an archive, `chattr +i`) could not be reported,
    even with -o elsewhere, and a multi-run report said the run "could not be read"."""
    import targetpo.report as rep

    out = run_experiment("tabular-single", "smoke", out=tmp_path / "r", progress=False, quiet=True)
    real = os.access
    monkeypatch.setattr(rep.os, "access", lambda p, mode: False if Path(p) == out else real(p, mode))
    dest = tmp_path / "elsewhere"
    dest.mkdir()
    text = write_report(out, dest / "REPORT.md").read_text()
    assert (dest / "r-tabular_single.png").exists() and not (out / "tabular_single.png").exists()
    assert "(saved beside the report: the run folder" in text


def test_run_json_keeps_the_config_s_floats_exactly(tmp_path, capsys):
    """run.json wrote lr=0.123456789 as 0.1234568: a resume then trained on another lr (3,304 replayed records
    differed), and `--resume lr=0.123456789` was refused as another config."""
    out = run_experiment("tabular-single", "smoke", out=tmp_path / "r", overrides=["lr=0.123456789"], progress=False,
                         quiet=True)
    assert json.loads((out / "run.json").read_text())["config"]["lr"] == 0.123456789
    assert main(["run", "tabular-single", "--out", str(out), "--resume", "lr=0.123456789", "--no-progress",
                 "--no-report"]) == 0
