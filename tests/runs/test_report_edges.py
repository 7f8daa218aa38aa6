"""Report details at their edges: a claim's pass state, plots of a folder that can be read but not written, claims
matched across runs by key, a run whose liveness cannot be told, which run is larger, which errors are about
writing, another file at the report's path, the suite an experiment declares, and the paper's published tables
as typed into targetpo.paper (checked against the numbers printed in the paper)."""

import errno
import json
import os
from pathlib import Path

import pytest

import targetpo.report as rep
from targetpo import paper
from targetpo.experiments import run_experiment, suite_of
from targetpo.report import (REPORT_HEADING, Claim, Section, failure_reason, incomplete_note, is_larger,
                             resolve_failures, write_report)
from targetpo.runs import plots
from targetpo.runs.runner import Progress
from targetpo.runs.stats import SCALE, Verdict
from targetpo.runs.store import Run


def _run(name: str, steps: int = 100, seeds: int = 5, preset: str = "cpu", status: str = "complete",
         root: Path = Path("/nonexistent")) -> Run:
    """A tabular-single run as read back from run.json, with no metrics."""
    return Run(root / name, {"experiment": "tabular-single", "preset": preset, "status": status,
                             "config": {"steps": steps, "seeds": seeds, "methods": ["pg", "tpo"]}})


# --- claims -------------------------------------------------------------------------------------------------


def test_only_pass_and_fail_are_decided_claims():
    """An inconclusive claim (its interval straddles the threshold) is neither passed nor failed."""
    assert Claim("t", Verdict.PASS, "e").passed is True
    assert Claim("t", Verdict.FAIL, "e").passed is False
    assert Claim("t", Verdict.INCONCLUSIVE, "e").passed is None
    assert Claim("t", None, "e").passed is None


def test_a_claim_key_matches_claims_with_other_texts_across_runs():
    """The key, not the text, says which claims are the same across presets: a FAIL in a smaller run is *scale
    or data* when the claim with the same key passes in a larger run of the same experiment."""
    small = Section("s", _run("small", steps=100), Path("/nonexistent"))
    large = Section("l", _run("large", steps=200), Path("/nonexistent"))
    small.claim("TPO beats PG by step 100", False, "e", key="k")
    large.claim("TPO beats PG by step 200", True, "e", key="k")
    resolve_failures([small, large])
    failure = small.claims[0].failure
    assert failure is not None and failure.kind == SCALE
    assert failure.evidence.startswith("the same claim is PASS in the larger run `large` (preset cpu, 200 steps")
    assert large.claims[0].failure is None


# --- which run is larger ------------------------------------------------------------------------------------


def test_a_longer_run_with_fewer_seeds_is_not_larger():
    """Same preset: larger means at least as many steps *and* seeds, and more of one of them."""
    long_few, short_many = _run("a", steps=200, seeds=2), _run("b", steps=100, seeds=5)
    assert not is_larger(long_few, short_many) and not is_larger(short_many, long_few)
    assert is_larger(_run("c", steps=200, seeds=5), short_many)
    assert is_larger(_run("d", steps=100, seeds=6), short_many)
    assert not is_larger(_run("e", steps=100, seeds=5), short_many)  # the same size is not larger


# --- a run still marked running -----------------------------------------------------------------------------


def test_a_running_run_whose_liveness_cannot_be_told_is_not_called_stopped(monkeypatch):
    """run_is_live returns None where it cannot tell (no flock, a folder it cannot open): the section then keeps
    run.json's status instead of saying the run was killed."""
    monkeypatch.setattr(rep, "run_is_live", lambda path: None)
    text = Section("t", _run("r", status="running"), Path("/nonexistent")).render()
    assert "· status running ·" in text
    assert "stopped before the end" not in text


def test_a_running_run_that_no_process_holds_is_called_stopped(monkeypatch):
    monkeypatch.setattr(rep, "run_is_live", lambda path: False)
    text = Section("t", _run("r", status="running"), Path("/nonexistent")).render()
    assert "· status stopped before the end (killed or interrupted) ·" in text


def test_the_incomplete_banner_says_killed_or_running_when_liveness_is_unknown():
    run = _run("r", status="running")
    progress = Progress(finished=("pg",), partial={}, missing=("tpo",))
    assert incomplete_note(run, progress, live=None).startswith("**Incomplete run** (killed, or still running): ")
    assert incomplete_note(run, progress, live=True).startswith("**Incomplete run** (still running): ")
    assert incomplete_note(run, progress, live=False).startswith("**Incomplete run** (stopped before the end): ")


# --- files that cannot be written -----------------------------------------------------------------------------


def test_plots_of_a_readable_but_unwritable_run_folder_go_beside_the_report(tmp_path, monkeypatch):
    """What decides where a plot goes is whether the run folder can be written, not whether it can be read."""
    out, dest = tmp_path / "r", tmp_path / "elsewhere"
    out.mkdir()
    dest.mkdir()
    real = os.access
    monkeypatch.setattr(rep.os, "access", lambda p, mode: (mode != os.W_OK) if Path(p) == out else real(p, mode))
    section = Section("t", Run(out, {"preset": "cpu"}), dest)
    fig, _ = plots.figure()
    path = section.figure(fig, "curves", "Error by step")
    assert path == dest / "r-curves.png" and path.exists()
    assert not (out / "curves.png").exists()
    assert f"(saved beside the report: the run folder {out} is read-only)" in section.blocks[-1]


@pytest.mark.parametrize("code", [errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC], ids=errno.errorcode.get)
def test_a_refused_or_full_file_system_is_a_file_that_could_not_be_written(code):
    """No permission, a read-only file system and a full disk all stop a write, not a read."""
    exc = OSError(code, os.strerror(code), "/x/REPORT.md")
    assert failure_reason(exc) == ("written", str(exc))


def test_a_missing_file_is_a_file_that_could_not_be_read():
    exc = OSError(errno.ENOENT, os.strerror(errno.ENOENT), "/x/run.json")
    assert failure_reason(exc) == ("read", str(exc))


def _not_run(root: Path) -> Path:
    run = root / "run"
    run.mkdir()
    (run / "run.json").write_text(json.dumps({"experiment": "tabular-single", "preset": "smoke", "config": {},
                                              "status": "not run"}))
    return run


def test_a_file_whose_first_line_is_not_the_report_heading_is_not_overwritten(tmp_path):
    """Every report starts with REPORT_HEADING on its first line; a file holding that heading further down is
    the user's, and -o refuses to replace it."""
    run = _not_run(tmp_path)
    notes = tmp_path / "notes.md"
    mine = f"my notes\n{REPORT_HEADING}\n"
    notes.write_text(mine, encoding="utf-8")
    with pytest.raises(ValueError, match="not a targetpo report"):
        write_report(run, notes)
    assert notes.read_text(encoding="utf-8") == mine


def test_a_binary_file_at_o_is_refused_as_not_a_report(tmp_path):
    """A file that is not UTF-8 text (an image, say) is the user's file: refused with the usual message, kept."""
    run = _not_run(tmp_path)
    image = tmp_path / "figure.png"
    data = b"\x89PNG\r\n\x1a\n\xff\xfe\x00\x80"
    image.write_bytes(data)
    with pytest.raises(ValueError, match="holds a file that is not a targetpo report"):
        write_report(run, image)
    assert image.read_bytes() == data


def test_a_refused_o_writes_nothing_into_the_run_folder(tmp_path):
    """The -o checks come before the sections are built: a refused report leaves no plot behind."""
    run = run_experiment("tabular-single", "smoke", out=tmp_path / "run", progress=False, quiet=True)
    before = sorted(p.name for p in run.iterdir())
    mine = tmp_path / "notes.md"
    mine.write_text(f"my notes\n{REPORT_HEADING}\n")
    with pytest.raises(ValueError, match="not a targetpo report"):
        write_report(run, mine)
    assert sorted(p.name for p in run.iterdir()) == before


# --- suites -------------------------------------------------------------------------------------------------


def test_an_experiment_cannot_declare_the_all_suite(monkeypatch):
    """"all" is what `reproduce --suite all` runs, not a suite an experiment can belong to."""
    import targetpo.tabular.single as single

    monkeypatch.setattr(single, "SUITE", "all", raising=False)
    with pytest.raises(ValueError, match="declares SUITE='all'"):
        suite_of("tabular-single")


# --- the paper's tables -------------------------------------------------------------------------------------


def test_table1_is_the_paper_s_table_1():
    """Episodes to 1 % error, one column per vocabulary size V (paper §3.4, Table 1)."""
    values = paper.TABLE1_STEPS_TO_1PCT.values
    assert {k: v for k, v in values.items() if k != "V"} == {
        "tpo_token": (58, 74, 103, 102),
        "grpo_token": (904, 141, 124, 148),
        "dg": (199, 273, 314, 393),
        "ppo": (872, 181, 191, 259),
    }
    assert len(values["V"]) == 4


def test_mnist_final_errors_are_the_paper_s():
    """Paper §3.3: TPO 2.9 %, GRPO 5.9 % vs PG 5.3 %, Group PG 7.2 % (DG is read from Fig. 4a, not printed)."""
    values = paper.MNIST_FINAL_ERROR.values
    assert {k: v for k, v in values.items() if k != "dg"} == {"tpo": 0.029, "pg": 0.053, "grpo": 0.059,
                                                              "group_pg": 0.072}


def test_table3_is_the_paper_s_table_3():
    """Final exact-match error (%), one column per sequence length H, prompt- then interaction-matched (paper
    §3.6, Table 3); a blank cell (> 95 %) is None."""
    values = paper.TABLE3_FINAL_ERROR_PCT.values
    assert len(values["H"]) == 4
    assert {k: v for k, v in values.items() if k != "H"} == {
        "prompts": {"tpo": (6.9, 8.6, 6.1, 7.4), "grpo": (14.5, 27.6, 30.0, 50.4),
                    "grpo_no_kl": (66.6, 92.5, None, None), "ppo": (12.0, 26.3, 90.6, None),
                    "dg": (33.8, 58.8, None, None)},
        "interactions": {"tpo": (1.8, 2.8, 5.3, 19.0), "grpo": (9.6, 23.2, 36.2, 48.7),
                         "grpo_no_kl": (78.1, 83.8, None, None), "ppo": (38.6, 62.1, 66.2, None),
                         "dg": (47.7, 69.4, None, None)},
    }


def test_table5_is_the_paper_s_table_5():
    """TPO final error (%) and steps to 1 % by η (paper App. D, Table 5)."""
    assert paper.TABLE5_TEMPERATURE.values == {
        "eta": (0.25, 0.5, 1.0, 2.0, 4.0),
        "final_error_pct": (1.0, 0.0, 0.7, 1.0, 0.8),
        "steps_to_1pct": (72, 67, 96, 141, 260),
    }
