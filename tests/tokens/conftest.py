"""Fixtures of the token tests."""

from types import SimpleNamespace

import pytest
import torch

from targetpo.tokens import transformer as tfm


@pytest.fixture
def tiny_model():
    """(infos, parameters [2 seeds, ...]) of a one-layer, d_model = 8 transformer: every optimizer branch and
    parameter kind at a few hundred numbers."""
    spec = tfm.TransformerSpec(vocab=4, max_len=6, d_model=8, heads=2, layers=1, ffn_mult=2)
    return tfm.param_info(spec), tfm.init_params(spec, [0, 1])


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
