"""A run that an exception ends says so in run.json ("failed (...)"), not "running", and its report shows it. Running
out of memory is one line from the CLI (exit 2) naming the seed count; any other exception is a bug and keeps its
traceback. run.json stays small for any seed count (the seeds are the config's `seed` and `seeds`)."""

import json

import pytest

from targetpo.cli import main
from targetpo.experiments import load, run_experiment
from targetpo.report import write_report
from targetpo.tabular import multi

TORCH_OOM = ("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: you tried "
             "to allocate 40000000000 bytes. Error code 12 (Cannot allocate memory)")


def _fail_at_step(monkeypatch, exc: Exception, step: int = 3) -> None:
    """tabular-multi's units raise `exc` after `step` records (run one at a time: without `run_units`)."""
    def run_unit(cfg, unit, ctx):
        for t in range(step):
            ctx.log({"step": t, "error": [0.5] * cfg.seeds})
            ctx.advance()
        raise exc
    monkeypatch.delattr(multi, "run_units")
    monkeypatch.setattr(multi, "run_unit", run_unit)


def test_out_of_memory_is_one_line_and_the_run_records_it(tmp_path, monkeypatch, capsys):
    _fail_at_step(monkeypatch, RuntimeError(TORCH_OOM))
    out = tmp_path / "run"
    rc = main(["run", "tabular-multi", "--preset", "smoke", "--out", str(out), "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert err.startswith("targetpo: error: tabular-multi: out of memory with seeds=2 ([enforce fail")
    meta = json.loads((out / "run.json").read_text())
    assert meta["status"] == "failed (out of memory)"
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 3  # what it wrote before is kept
    assert "· status failed (out of memory) ·" in write_report(out).read_text()


def test_out_of_memory_with_one_seed_does_not_ask_for_fewer_seeds(tmp_path, monkeypatch, capsys):
    _fail_at_step(monkeypatch, MemoryError())
    rc = main(["run", "tabular-multi", "--preset", "smoke", "--seeds", "1", "--out", str(tmp_path / "r"),
               "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2 and "out of memory with seeds=1" in err and "fewer seeds" not in err
    assert "run a smaller config (one seed is the least)" in err


def test_a_crash_records_failed_and_keeps_its_traceback(tmp_path, monkeypatch):
    _fail_at_step(monkeypatch, ZeroDivisionError("a bug"))
    out = tmp_path / "run"
    with pytest.raises(ZeroDivisionError, match="a bug"):
        run_experiment("tabular-multi", "smoke", out=out, progress=False, quiet=True)
    assert json.loads((out / "run.json").read_text())["status"] == "failed (ZeroDivisionError: a bug)"
    # The report's headline counts it as failed, not also as incomplete, and its contents line says so.
    head, contents = write_report(out).read_text().split("## Contents", 1)
    assert "**1 run failed** (its section says the error and how to resume)" in head
    assert "incomplete**" not in head
    assert contents.split("\n")[2].endswith(" — failed")


def test_run_json_does_not_list_the_seeds(tmp_path):
    """Listing every seed made run.json grow with `seeds` (129 MB and 10 s to write for 10⁷ seeds, before the run
    could fail); the count and the first seed are in the config, and the report reads the count there."""
    out = run_experiment("tabular-single", "smoke", out=tmp_path / "run", progress=False, quiet=True)
    meta = json.loads((out / "run.json").read_text())
    assert "seeds" not in meta and meta["config"]["seeds"] == load("tabular-single").PRESETS["smoke"].seeds == 2
    assert "· 2 seeds ·" in write_report(out).read_text()
