"""The TPO group loss the TRL and verl adapters share never returns a silent 0: a micro-batch whose groups are all
dropped, or all without signal (equal rewards), warns with the count and reports it as a metric."""

import pytest
import torch

from targetpo.objectives.groups import tpo_group_loss

K, G, T = 4, 3, 5


def _batch(rewards):
    torch.manual_seed(0)
    lp = torch.randn(G * K, T, requires_grad=True)
    return lp, lp.detach(), torch.tensor(rewards, dtype=torch.float32), torch.ones(G * K, T)


def test_every_group_dropped_warns_and_counts():
    lp, old, r, m = _batch([float("nan")] * (G * K))
    with pytest.warns(UserWarning, match=f"all {G} groups of this micro-batch were dropped"):
        loss, metrics = tpo_group_loss(lp, old, r, m, K)
    assert float(loss.detach()) == 0.0 and loss.requires_grad
    assert float(metrics["groups_dropped"]) == G and float(metrics["groups_without_signal"]) == G


def test_all_equal_rewards_warn_that_there_is_no_signal():
    lp, old, r, m = _batch([1.0] * (G * K))
    with pytest.warns(UserWarning, match=f"none of the {G} groups of this micro-batch carries a signal"):
        _, metrics = tpo_group_loss(lp, old, r, m, K)
    assert float(metrics["groups_without_signal"]) == G and float(metrics["groups_dropped"]) == 0


def test_a_batch_with_signal_is_quiet_and_counts_the_flat_groups(recwarn):
    rewards = [1.0, 1.0, 1.0, 1.0] + [0.0, 1.0, 0.0, 0.0] + [float("nan")] * K
    lp, old, r, m = _batch(rewards)
    loss, metrics = tpo_group_loss(lp, old, r, m, K)
    assert not [w for w in recwarn if "TPO" in str(w.message)]
    assert float(metrics["groups_dropped"]) == 1 and float(metrics["groups_without_signal"]) == 2
    loss.backward()
    assert lp.grad.abs().sum() > 0
