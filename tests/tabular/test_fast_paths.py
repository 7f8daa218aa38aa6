"""The multi-context loop's shared pieces (v, ‖g‖², TPO's constant u/η computed once) give bitwise the updates
and metrics of the plain formulas: the speed-up changes no number."""

import pytest
import torch

from targetpo.tabular import multi
from targetpo.tabular.bandit import (
    correct_direction, exact_update, exact_update_along, misalignment, normalized_step, one_hot_target_shift,
    squared_norm, tpo_update,
)


def _probs(dtype, action_major: bool) -> torch.Tensor:
    logits = 3 * torch.randn(4, 7, 10, generator=torch.Generator().manual_seed(0), dtype=dtype)
    if action_major:  # the layout multi.run_unit uses
        logits = logits.transpose(-1, -2).contiguous().transpose(-1, -2)
    return multi.softmax(logits)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("action_major", [False, True])
@pytest.mark.parametrize("eta", [1.0, 0.3])
def test_tpo_update_is_bitwise_the_target_based_update(dtype, action_major, eta):
    probs = _probs(dtype, action_major)
    fast = tpo_update(probs, one_hot_target_shift(probs, eta=eta))
    assert torch.equal(fast, exact_update("tpo", probs, eta=eta))
    assert not torch.equal(fast, exact_update("tpo", probs, eta=2 * eta))  # the shift carries η


@pytest.mark.parametrize("method", ["ce", "pg", "dg", "grpo"])
def test_update_along_a_given_direction_and_shared_norms_are_bitwise_the_plain_formulas(method):
    probs, every = _probs(torch.float32, True), (-2, -1)
    v = correct_direction(probs)
    g = exact_update_along(method, probs, v, eta=0.7)
    assert torch.equal(g, exact_update(method, probs, eta=0.7))
    g_sq, v_sq = squared_norm(g, every), squared_norm(v, every)
    assert torch.equal(misalignment(g, v, every, g_sq=g_sq, ref_sq=v_sq), misalignment(g, v, every))
    assert torch.equal(normalized_step(probs, g, 0.1, every, g_sq=g_sq), normalized_step(probs, g, 0.1, every))
    with pytest.raises(ValueError, match="tpo"):
        exact_update_along("tpo", probs, v)


class _Log:
    def __init__(self):
        self.records = []

    def log(self, rec):
        self.records.append({k: torch.as_tensor(v).clone() for k, v in rec.items()})

    def advance(self, n=1):
        pass


@pytest.mark.parametrize("method", multi.METHODS)
def test_multi_run_unit_matches_the_plain_loop(method):
    cfg = multi.PRESETS["smoke"]
    ctx = _Log()
    multi.run_unit(cfg, method, ctx)
    # The loop as the formulas read: exact_update → misalignment → normalized_step → softmax.
    gen = torch.Generator().manual_seed(cfg.seed)
    logits = torch.randn(cfg.seeds, cfg.contexts, cfg.actions, generator=gen, dtype=torch.float32)
    logits = logits.transpose(-1, -2).contiguous().transpose(-1, -2)
    probs = multi.softmax(logits)
    for t in range(cfg.steps):
        g = exact_update(method, probs, eta=cfg.eta)
        mis = misalignment(g, correct_direction(probs), dims=(-2, -1))
        logits = normalized_step(logits, g, cfg.lr, dims=(-2, -1))
        probs = multi.softmax(logits)
        rec = ctx.records[t]
        assert torch.equal(rec["error"], 1.0 - probs[..., 0].mean(dim=-1)) and torch.equal(rec["misalignment"], mis)
    assert len(ctx.records) == cfg.steps
