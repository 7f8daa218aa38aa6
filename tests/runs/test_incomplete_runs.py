"""A run that has not finished every unit (stopped, or still running) is reported as incomplete: its section says
which units are done, partial (up to which step) and not started, and whether a process still writes it; table
rows of a partial unit are marked, and its claims read n/a instead of a verdict drawn from values that are not
final."""

import json
import shutil
from pathlib import Path

import pytest

from targetpo.experiments import load, run_experiment
from targetpo.report import Section, claim_count, write_report
from targetpo.runs.runner import Progress, _run_dir_lock, run_is_live, run_progress
from targetpo.runs.store import Run


@pytest.fixture(scope="module")
def complete(tmp_path_factory) -> Path:
    """A complete tabular-multi run (smoke length) labelled cpu, so its claims get PASS/FAIL verdicts."""
    out = run_experiment("tabular-multi", "smoke", out=tmp_path_factory.mktemp("multi") / "run", progress=False,
                         quiet=True)
    meta = json.loads((out / "run.json").read_text())
    (out / "run.json").write_text(json.dumps({**meta, "preset": "cpu"}))
    write_report(out)
    return out


def _killed(complete: Path, dest: Path, keep) -> Path:
    """A copy of `complete` as a kill would leave it: status running and only the records `keep` accepts."""
    shutil.copytree(complete, dest)
    lines = (dest / "metrics.jsonl").read_text().splitlines(keepends=True)
    (dest / "metrics.jsonl").write_text("".join(line for line in lines if keep(json.loads(line))))
    meta = json.loads((dest / "run.json").read_text())
    (dest / "run.json").write_text(json.dumps({**meta, "status": "running"}))
    return dest


def _cut_in_tpo(rec: dict) -> bool:
    """PG and DG finished, TPO killed after step 20 of 50, GRPO and CE not started."""
    return rec["unit"] in ("pg", "dg") or (rec["unit"] == "tpo" and rec.get("step", 99) <= 20)


def test_complete_run_has_verdicts_and_no_incomplete_note(complete):
    text = (complete / "REPORT.md").read_text()
    assert "**PASS**" in text and "**FAIL**" in text and "Incomplete run" not in text and "partial" not in text
    assert run_progress(load("tabular-multi"), Run.load(complete)).complete


def test_killed_run_says_which_units_are_done_partial_and_missing(complete, tmp_path):
    run = _killed(complete, tmp_path / "killed", _cut_in_tpo)
    assert run_progress(load("tabular-multi"), Run.load(run)) == Progress(
        finished=("pg", "dg"), partial={"tpo": (20, 50)}, missing=("grpo", "ce"))
    text = write_report(run).read_text()
    section = text.split("## Tabular multi-context bandit", 1)[1]
    # At the top of the section, before the claims and tables.
    # run.json still says "running", but no process holds the folder's lock.
    assert "· status stopped before the end (killed or interrupted) ·" in section
    assert section.index("**Incomplete run** (stopped before the end): 2 of 5 units finished (`pg`, `dg`); "
                         "partial: `tpo` (last logged step 20 of 50); not started: `grpo`, `ce`.") < \
        section.index("| paper claim |")
    assert f"`targetpo run tabular-multi --out {run} --resume`" in section
    assert "| TPO *(partial: `tpo` at step 20 of 50)* |" in section and "| PG |" in section
    assert "**1 run incomplete** (its section says which units are missing)" in text


def _cut_in_ce(rec: dict) -> bool:
    """Every method but CE finished, CE killed after step 20 of 50: every claim can be computed, from a partial CE."""
    return rec["unit"] != "ce" or rec.get("step", 99) <= 20


def test_claims_of_a_killed_run_get_no_verdict_from_a_partial_unit(complete, tmp_path):
    run = _killed(complete, tmp_path / "killed", _cut_in_ce)
    text = write_report(run).read_text()
    assert "| CE *(partial: `ce` at step 20 of 50)* |" in text
    assert "**PASS**" not in text and "**FAIL**" not in text and "| inconclusive |" not in text
    verdicts = (complete / "REPORT.md").read_text()
    claims = sum(verdicts.count(v) for v in ("| **PASS**", "| **FAIL**", "| inconclusive |"))
    # The complete run decides 4 of its 5 claims (no method reaches 1 % in 50 steps: "CE is fastest" is n/a);
    # the killed one decides none of the 5.
    assert claims == 4 and text.count("| n/a (run incomplete) |") == 5
    assert "no verdicts (no cpu or paper run is complete); 5 claims n/a on incomplete runs" in text


def test_resumed_run_is_complete_again(complete, tmp_path):
    run = _killed(complete, tmp_path / "killed", _cut_in_tpo)
    run_experiment("tabular-multi", out=run, resume=True, progress=False, quiet=True)
    text = write_report(run).read_text()
    assert "Incomplete run" not in text and "**PASS**" in text
    # Every unit's records as the uninterrupted run wrote them (the units run as one batch, so the lines of
    # different units interleave in another order after a resume).
    assert _lines_by_unit(run) == _lines_by_unit(complete)


def _lines_by_unit(run: Path) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in (run / "metrics.jsonl").read_text().splitlines():
        out.setdefault(json.loads(line)["unit"], []).append(line)
    return out


def test_run_with_no_record_yet_is_reported_as_not_started(complete, tmp_path):
    run = _killed(complete, tmp_path / "started", lambda rec: False)
    text = write_report(run).read_text()
    assert "0 of 5 units finished; not started: `pg`, `dg`, `tpo`, `grpo`, `ce`. Units not started are absent" in text
    assert "**No metrics to report yet:** no unit has logged a step" in text


def test_a_report_that_needs_finished_units_says_so_instead_of_failing(tmp_path):
    # tabular-single runs its methods side by side, so a kill leaves them one step apart; its report compares
    # curves of equal length and cannot be drawn from such a run.
    out = run_experiment("tabular-single", "smoke", out=tmp_path / "full", progress=False, quiet=True)
    lines = (out / "metrics.jsonl").read_text().splitlines(keepends=True)
    (out / "metrics.jsonl").write_text("".join(line for line in lines[: len(lines) // 2] if '"event"' not in line))
    text = write_report(out).read_text()
    assert "**No tables yet:** the tabular-single report needs its units finished (IndexError" in text
    assert "**Incomplete run**" in text


def _section(progress: Progress, config: dict) -> Section:
    run = Run(path=Path("/nonexistent/run"), meta={"preset": "cpu", "experiment": "x", "config": config})
    return Section("t", run, run.path, progress=progress)


def test_rows_are_marked_by_unit_name_or_the_table_says_which_values_are_partial():
    s = _section(Progress(("v2/tpo",), {"v4/grpo_no_kl": (7, 30)}, ("v4/ce",)), {"episodes": 30})
    s.table(["method", "V=2", "V=4"], [["TPO", 1, 2], ["GRPO (no KL)", 3, 4], ["GRPO", 5, 6]])
    assert "| GRPO (no KL) *(partial: `v4/grpo_no_kl` at episode 7 of 30)* | 3 | 4 |" in s.blocks[-1]
    assert "| GRPO | 5 | 6 |" in s.blocks[-1] and "| TPO | 1 | 2 |" in s.blocks[-1]
    # Units in the columns: no row names them, so a line under the table does.
    s.table(["variant", "TPO", "GRPO (no KL)"], [["bag", 1, 2]])
    assert "| bag | 1 | 2 |" in s.blocks[-1]
    assert "*Incomplete run: values of `v4/grpo_no_kl` are from episode 7 of 30, not final.*" in s.blocks[-1]
    # Two units: a row of the finished one is not marked (only a run of one unit marks every row).
    two = _section(Progress(("tpo",), {"grpo": (3, 10)}, ()), {"steps": 10})
    two.table(["method", "error"], [["TPO", 1], ["GRPO", 2]])
    assert "| TPO | 1 |" in two.blocks[-1] and "| GRPO *(partial: `grpo` at step 3 of 10)* | 2 |" in two.blocks[-1]
    # A run of one unit: every row comes from it.
    single = _section(Progress((), {"train": (3, 10)}, ()), {"steps": 10})
    single.table(["method", "error"], [["CE (oracle)", 1], ["TPO", 2]])
    assert "| CE (oracle) *(partial: `train` at step 3 of 10)* | 1 |" in single.blocks[-1]
    # The claims of an incomplete run are counted apart from the verdicts.
    single.claim("c", True, "e")
    assert single.verdicts() == [None] and "| c | n/a (run incomplete) | e |" in single.render()
    assert claim_count([single]) == "no verdicts (no cpu or paper run is complete); 1 claim n/a on incomplete runs"


def test_a_run_that_a_process_still_writes_is_reported_as_running(complete, tmp_path):
    run = _killed(complete, tmp_path / "live", _cut_in_tpo)
    assert run_is_live(run) is False
    with _run_dir_lock(run):  # what a live run holds while it writes
        assert run_is_live(run) is True
        section = write_report(run).read_text().split("## Tabular multi-context bandit", 1)[1]
    assert "· status running ·" in section and "**Incomplete run** (still running): 2 of 5 units" in section
    assert run_is_live(tmp_path / "no-such-run") is None
