"""Torch threads: a run uses the cores idle when it starts (or --threads, or the experiment's TORCH_THREADS),
records the count in run.json, and reproduce shares the cores out among its workers."""

import json
import types

import pytest
import torch

from targetpo.experiments import load
from targetpo.runs import runner
from targetpo.runs.runner import available_cores, default_threads, run_experiment


def _threads_after(tmp_path, exp, **kw):
    before = torch.get_num_threads()
    try:
        run_experiment(exp, "smoke", out=tmp_path, progress=False, quiet=True, **kw)
        return torch.get_num_threads()
    finally:
        torch.set_num_threads(before)


def test_a_run_records_its_threads_and_obeys_threads(tmp_path):
    n = _threads_after(tmp_path / "a", load("tabular-single"))
    assert 1 <= n <= available_cores()
    assert json.loads((tmp_path / "a" / "run.json").read_text())["runs"][-1]["torch_threads"] == n
    assert _threads_after(tmp_path / "b", load("tabular-single"), threads=1) == 1


def test_an_experiment_can_fix_its_threads(tmp_path):
    module = types.ModuleType("fixed")
    module.__dict__.update({k: v for k, v in vars(load("tabular-single")).items() if not k.startswith("__")})
    module.TORCH_THREADS = 3
    assert _threads_after(tmp_path / "f", module) == 3


@pytest.mark.parametrize("idle_share,cores,expected", [
    (1.0, 2, 2),    # an idle 2-core machine: both
    (0.5, 2, 1),    # another job holds one core: one thread, not two that wait for each other
    (0.02, 2, 1),   # fully busy: still one
    (0.9, 8, 7),
])
def test_default_threads_follow_the_idle_cores(monkeypatch, idle_share, cores, expected):
    samples = iter([(0, 0), (int(1000 * idle_share), 1000)])
    monkeypatch.setattr(runner, "_cpu_times", lambda: next(samples))
    monkeypatch.setattr(runner, "available_cores", lambda: cores)
    monkeypatch.setattr(runner.os, "cpu_count", lambda: cores)
    assert default_threads(window_s=0) == expected


def test_default_threads_is_one_where_the_load_cannot_be_read(monkeypatch):
    monkeypatch.setattr(runner, "_cpu_times", lambda: None)
    assert default_threads(window_s=0) == 1


def test_more_threads_than_cores_is_run_with_a_warning(tmp_path, monkeypatch, capsys):
    # Oversubscribed OpenMP threads spin-wait for descheduled ones (BENCHMARKS.md "Threads": 10–55× slower).
    monkeypatch.setattr(runner, "available_cores", lambda: 2)
    assert _threads_after(tmp_path / "w", load("tabular-single"), threads=3) == 3
    err = capsys.readouterr().err
    assert "warning: --threads 3 is more than the 2 CPU core(s) this process may use" in err
    _threads_after(tmp_path / "q", load("tabular-single"), threads=2)
    assert "warning" not in capsys.readouterr().err
