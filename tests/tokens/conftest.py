"""Fixtures of the token tests."""

import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from targetpo.experiments import load
from targetpo.runs.config import make_config

from targetpo.tokens import transformer as tfm


@pytest.fixture
def tiny_model():
    """(infos, parameters [2 seeds, ...]) of a one-layer, d_model = 8 transformer: every optimizer branch and
    parameter kind at a few hundred numbers."""
    spec = tfm.TransformerSpec(vocab=4, max_len=6, d_model=8, heads=2, layers=1, ffn_mult=2)
    return tfm.param_info(spec), tfm.init_params(spec, [0, 1])


def write_run(path: Path, name: str, overrides: list[str], curves: dict, preset: str = "cpu") -> Path:
    """A complete run folder of `name` at `preset` whose unit `u` logged `curves[u]` ([steps, seeds]) as its error,
    or each metric of `curves[u]` when that is a {metric: [steps, seeds]} dict."""
    path.mkdir(parents=True)
    cfg = make_config(load(name), preset, overrides=overrides)
    (path / "run.json").write_text(json.dumps({"experiment": name, "preset": preset, "status": "complete",
                                               "config": dataclasses.asdict(cfg)}))
    with open(path / "metrics.jsonl", "w") as f:
        for unit, metrics in curves.items():
            metrics = metrics if isinstance(metrics, dict) else {"error": metrics}
            for step in range(len(next(iter(metrics.values())))):
                f.write(json.dumps({"unit": unit, "step": step} | {k: v[step].tolist() for k, v in metrics.items()})
                        + "\n")
            f.write(json.dumps({"unit": unit, "event": "done"}) + "\n")
    return path


@pytest.fixture
def fake_run():
    """write_run: a hand-made complete run whose report's verdicts and cells a test knows in advance."""
    return write_run


@pytest.fixture
def capture(monkeypatch):
    """capture(module) replaces module.run_trial by a recorder: its `.calls` lists (TrialConfig, method, seeds) of
    every call, so a test sees what each unit asks the engine without training."""
    def make(module):
        rec = SimpleNamespace(calls=[])
        monkeypatch.setattr(module, "run_trial", lambda cfg, method, seeds, *a, **k: rec.calls.append(
            (cfg, method, list(seeds))))
        return rec
    return make


@pytest.fixture
def unit_ctx():
    """A runner context for run_unit that logs and checks nothing."""
    return SimpleNamespace(device=torch.device("cpu"), log=lambda record: None, advance=lambda n=1: None,
                           check_finite=lambda step, values: None)
