"""A damaged run folder is named, never a traceback or a cryptic message: a report over a directory reports the
other runs and gives the damaged one a section saying which file (and line) is wrong; a report or a resume of
that run alone stops with that one line (exit 2)."""

import json
import shutil
from pathlib import Path

import pytest

from targetpo.cli import main
from targetpo.experiments import UnknownExperiment, load, run_experiment
from targetpo.runs.store import RunFileError, read_metrics


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("runs")
    for name in ("tabular-single", "tabular-multi"):
        run_experiment(name, "smoke", out=root / name, progress=False, quiet=True)
    return root


def _err(capsys) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if line.strip()]


def _garbage_line_10(run: Path) -> None:
    lines = (run / "metrics.jsonl").read_text().splitlines(keepends=True)
    (run / "metrics.jsonl").write_text("".join(lines[:9]) + "garbage{\n" + "".join(lines[10:]))


def _truncate_run_json(run: Path) -> None:
    (run / "run.json").write_text((run / "run.json").read_text()[:195])


def _unknown_experiment(run: Path) -> None:
    meta = json.loads((run / "run.json").read_text())
    (run / "run.json").write_text(json.dumps({**meta, "experiment": "nosuch"}))


def _edit_line_10(**changes):
    def harm(run: Path) -> None:
        lines = (run / "metrics.jsonl").read_text().splitlines(keepends=True)
        rec = {k: v for k, v in {**json.loads(lines[9]), **changes}.items() if v is not None}
        (run / "metrics.jsonl").write_text("".join(lines[:9]) + json.dumps(rec) + "\n" + "".join(lines[10:]))
    return harm


def _edit_run_json(config: dict | None = None, **changes):
    def harm(run: Path) -> None:
        meta = json.loads((run / "run.json").read_text())
        (run / "run.json").write_text(json.dumps({**meta, **changes, "config": {**meta["config"], **(config or {})}}))
    return harm


# (damage, what the report names) for the tabular-single run.
DAMAGE = {
    "empty metrics": (lambda r: (r / "metrics.jsonl").write_text(""),
                      "metrics.jsonl: holds no records, but run.json says the run is complete"),
    "deleted metrics": (lambda r: (r / "metrics.jsonl").unlink(),
                        "metrics.jsonl: missing, but run.json says the run is complete"),
    "garbage line": (_garbage_line_10, "metrics.jsonl line 10: not valid JSON"),
    "a list as run.json": (lambda r: (r / "run.json").write_text("[]\n"),
                           "run.json: must be a JSON object as `targetpo run` writes it, got list"),
    "truncated run.json": (_truncate_run_json, "run.json: not valid JSON at line 6 column 3"),
    "unknown experiment": (_unknown_experiment, "run.json: unknown experiment 'nosuch'; available: tabular-single"),
    # hand-edited values: a traceback (a step "abc" compared with 0), "step 0 was not recorded", "0 seeds",
    # "Unknown format code 'f'"
    "a step that is text": (_edit_line_10(step="abc"),
                            "metrics.jsonl line 10: a metrics record needs a 'step' integer >= 0, got 'abc'"),
    "a record without a unit": (_edit_line_10(unit=None), "metrics.jsonl line 10: a metrics record needs a 'unit'"),
    "seeds that are text": (_edit_run_json({"seeds": "two"}),
                            "run.json: its config is not one tabular-single runs: seeds='two': expected an integer"),
    "an unknown method": (_edit_run_json({"methods": ["nope"]}), "run.json: its config is not one tabular-single runs"),
    "a wall time that is text": (_edit_run_json(wall_time_s="x"), "run.json: 'wall_time_s' must be a JSON number"),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_report_of_a_directory_reports_the_other_runs_and_names_the_damaged_file(runs, tmp_path, capsys, damage):
    root = tmp_path / "runs"
    shutil.copytree(runs, root)
    harm, named = DAMAGE[damage]
    harm(root / "tabular-single")
    assert main(["report", str(root)]) == 0
    text = (root / "REPORT.md").read_text()
    assert "## Tabular multi-context bandit" in text and "| paper claim | result |" in text  # the other run
    assert "## Run `tabular-single` (could not be read)" in text
    assert f"**Could not be read:** {root / 'tabular-single'}/{named}" in text
    assert "**1 run could not be reported** (its section says why)" in text
    err = _err(capsys)
    assert len(err) == 1 and err[0].startswith(f"warning: {root / 'tabular-single'} could not be read: ") and \
        named in err[0]
    # Reported alone, the run stops the report with the same line: exit 2, no traceback, no stray quotes.
    assert main(["report", str(root / "tabular-single")]) == 2
    err = _err(capsys)
    assert len(err) == 1 and err[0].startswith(f"targetpo: error: {root / 'tabular-single'}/{named}"), err


@pytest.mark.parametrize("damage", ["garbage line", "truncated run.json", "a list as run.json"])
def test_resume_of_a_damaged_run_names_the_file_in_one_line(runs, tmp_path, capsys, damage):
    out = tmp_path / "run"
    shutil.copytree(runs / "tabular-single", out)
    harm, named = DAMAGE[damage]
    harm(out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert main(["run", "tabular-single", "--out", str(out), "--resume", "--no-progress"]) == 2
    err = _err(capsys)
    assert len(err) == 1 and err[0].startswith(f"targetpo: error: {out}/{named}"), err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # nothing repaired, nothing written


def test_read_metrics_names_a_damaged_line_but_skips_a_partial_last_one(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"unit": "a", "step": 0}\n\n{"unit": "a", "step": 1}\n{"unit": "a", "st')
    assert read_metrics(path) == [{"unit": "a", "step": 0}, {"unit": "a", "step": 1}]  # a kill mid-write
    path.write_text('{"unit": "a", "step": 0}\n[1, 2]\n')
    with pytest.raises(RunFileError, match=r"metrics.jsonl line 2: must be a JSON object \(a metrics record\), got list"):
        read_metrics(path)
    path.write_bytes(b'{"unit": "a", "step": 0}\n\xff\xfe\n{"unit": "a", "step": 1}\n')
    with pytest.raises(RunFileError, match="metrics.jsonl line 2: not valid JSON"):
        read_metrics(path)


def test_unknown_experiment_message_has_no_stray_quotes():
    with pytest.raises(KeyError) as info:  # still a KeyError for callers that catch one
        load("nosuch")
    assert isinstance(info.value, UnknownExperiment)
    assert str(info.value).startswith("unknown experiment 'nosuch'; available: tabular-single, tabular-multi")
