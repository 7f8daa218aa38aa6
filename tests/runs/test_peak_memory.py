"""On a CUDA device, run.json records each segment's peak GPU memory and the report's run line shows the largest,
and the units run with torch's deterministic algorithms; on the CPU none of this happens. No GPU is needed: the
CUDA counters are replaced by a fake that a unit drives."""

import json

import torch

from targetpo.experiments import run_experiment
from targetpo.report import write_report
from targetpo.runs import runner
from targetpo.tabular import multi


class FakeCudaCounters:
    """torch.cuda's peak counter: reset by the runner, raised by the units."""

    def __init__(self):
        self.peak, self.resets = 0, 0

    def reset_peak_memory_stats(self, dev):
        assert dev.type == "cuda"
        self.peak, self.resets = 0, self.resets + 1

    def max_memory_allocated(self, dev):
        assert dev.type == "cuda"
        return self.peak


def _unit_using(counters: FakeCudaCounters, peak: int):
    def run_unit(cfg, unit, ctx):
        counters.peak = max(counters.peak, peak)
        for t in range(2):
            ctx.log({"step": t, "error": [0.5] * cfg.seeds, "misalignment": [0.1 * (unit != "tpo")] * cfg.seeds})
            ctx.advance()
    return run_unit


def test_a_cuda_run_records_its_peak_memory_per_segment(tmp_path, monkeypatch):
    counters = FakeCudaCounters()
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", counters.reset_peak_memory_stats)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", counters.max_memory_allocated)
    monkeypatch.setattr(runner, "resolve_device", lambda exp, device: torch.device("cuda"))
    out = tmp_path / "run"
    monkeypatch.delattr(multi, "run_units")  # its units one at a time, each the fake's
    monkeypatch.setattr(multi, "run_unit", _unit_using(counters, 3 * 2**30))
    run_experiment("tabular-multi", "smoke", out=out, device="cuda", progress=False, quiet=True)
    meta = json.loads((out / "run.json").read_text())
    assert meta["status"] == "complete" and counters.resets == 1
    assert meta["runs"][-1]["peak_gpu_memory_bytes"] == meta["peak_gpu_memory_bytes"] == 3 * 2**30
    assert "· device cuda, peak GPU memory 3.00 GiB" in write_report(out).read_text()

    # A resumed segment counts from its own start; the run keeps the largest.
    lines = (out / "metrics.jsonl").read_text().splitlines()
    (out / "metrics.jsonl").write_text("\n".join(lines[:3]) + "\n")
    monkeypatch.setattr(multi, "run_unit", _unit_using(counters, 2**30))
    run_experiment("tabular-multi", "smoke", out=out, device="cuda", resume=True, progress=False, quiet=True)
    meta = json.loads((out / "run.json").read_text())
    assert counters.resets == 2 and [r.get("peak_gpu_memory_bytes") for r in meta["runs"]] == [3 * 2**30, 2**30]
    assert meta["peak_gpu_memory_bytes"] == 3 * 2**30


def test_a_cpu_run_records_no_gpu_memory(tmp_path):
    out = tmp_path / "run"
    run_experiment("tabular-single", "smoke", out=out, progress=False, quiet=True)
    meta = json.loads((out / "run.json").read_text())
    assert "peak_gpu_memory_bytes" not in meta and all("peak_gpu_memory_bytes" not in r for r in meta["runs"])
    assert "peak GPU memory" not in write_report(out).read_text()


def test_a_cuda_run_computes_with_deterministic_kernels_and_restores_the_setting(tmp_path, monkeypatch):
    """A seed and config give the same numbers again on a GPU, and a resume replays exactly, only with torch's
    deterministic kernels (CUDA's index_add_ adds with atomics); a user's own setting is back after the run."""
    seen = {}

    def run_unit(cfg, unit, ctx):
        seen[unit] = (torch.are_deterministic_algorithms_enabled(),
                      torch.is_deterministic_algorithms_warn_only_enabled(),
                      runner.os.environ.get("CUBLAS_WORKSPACE_CONFIG"))
        for t in range(2):
            ctx.log({"step": t, "error": [0.5] * cfg.seeds, "misalignment": [0.1] * cfg.seeds})
            ctx.advance()

    counters = FakeCudaCounters()
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", counters.reset_peak_memory_stats)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", counters.max_memory_allocated)
    monkeypatch.delattr(multi, "run_units")
    monkeypatch.setattr(multi, "run_unit", run_unit)
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", "")  # records the variable's state, so the run's setting is undone
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG")
    assert not torch.are_deterministic_algorithms_enabled()
    run_experiment("tabular-multi", "smoke", out=tmp_path / "cpu", progress=False, quiet=True)
    assert set(seen.values()) == {(False, False, None)}                      # the CPU: nothing changes
    monkeypatch.setattr(runner, "resolve_device", lambda exp, device: torch.device("cuda"))
    run_experiment("tabular-multi", "smoke", out=tmp_path / "cuda", device="cuda", progress=False, quiet=True)
    assert set(seen.values()) == {(True, True, ":4096:8")}
    assert not torch.are_deterministic_algorithms_enabled()                  # restored
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")                   # the user's own cuBLAS setting is kept
    run_experiment("tabular-multi", "smoke", out=tmp_path / "cuda", device="cuda", force=True, progress=False,
                   quiet=True)
    assert set(seen.values()) == {(True, True, ":16:8")}
