"""Torch threads: a run uses every core it may (or --threads, or the experiment's TORCH_THREADS); reproduce
shares the cores out among its workers; the CLI makes idle OpenMP threads sleep (a user's setting wins)."""

import json
import os
import subprocess
import sys
import types

import torch

from targetpo.experiments import load
from targetpo.runs.runner import available_cores, run_experiment


def _threads_after(tmp_path, name, **kw):
    before = torch.get_num_threads()
    try:
        run_experiment(load(name), "smoke", out=tmp_path / name, progress=False, quiet=True, **kw)
        return torch.get_num_threads()
    finally:
        torch.set_num_threads(before)


def test_a_run_uses_every_core_unless_told(tmp_path):
    assert available_cores() >= 1
    assert _threads_after(tmp_path / "a", "tabular-single") == available_cores()
    meta = json.loads((tmp_path / "a" / "tabular-single" / "run.json").read_text())
    assert meta["runs"][-1]["torch_threads"] == available_cores()  # recorded beside the wall time
    assert _threads_after(tmp_path / "b", "tabular-single", threads=1) == 1


def test_an_experiment_can_fix_its_threads(tmp_path, monkeypatch):
    exp = load("tabular-single")
    module = types.ModuleType("fixed")
    module.__dict__.update({k: v for k, v in vars(exp).items() if not k.startswith("__")})
    module.TORCH_THREADS = 3
    before = torch.get_num_threads()
    try:
        run_experiment(module, "smoke", out=tmp_path / "f", progress=False, quiet=True)
        assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(before)


def test_the_cli_sets_a_passive_openmp_wait_policy_unless_the_user_did():
    code = "import os, targetpo.cli; print(os.environ['OMP_WAIT_POLICY'])"
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "PASSIVE"
    out = subprocess.run([sys.executable, "-c", code], env={**env, "OMP_WAIT_POLICY": "ACTIVE"},
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "ACTIVE"
