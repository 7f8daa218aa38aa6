"""The TPO group loss the TRL and verl adapters share never returns a silent 0: a micro-batch whose groups are all
dropped, or all without signal (equal rewards), warns with the count and reports it as a metric (a fraction of
the micro-batch's groups: trainers average metrics over micro-batches)."""

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
    assert float(metrics["frac_groups_dropped"]) == 1 and float(metrics["frac_groups_without_signal"]) == 1


def test_all_equal_rewards_warn_that_there_is_no_signal():
    lp, old, r, m = _batch([1.0] * (G * K))
    with pytest.warns(UserWarning, match=f"none of the {G} groups of this micro-batch carries a signal"):
        _, metrics = tpo_group_loss(lp, old, r, m, K)
    assert float(metrics["frac_groups_without_signal"]) == 1 and float(metrics["frac_groups_dropped"]) == 0


def test_a_batch_with_signal_is_quiet_and_counts_the_flat_groups(recwarn):
    rewards = [1.0, 1.0, 1.0, 1.0] + [0.0, 1.0, 0.0, 0.0] + [float("nan")] * K
    lp, old, r, m = _batch(rewards)
    loss, metrics = tpo_group_loss(lp, old, r, m, K)
    assert not [w for w in recwarn if "TPO" in str(w.message)]
    assert float(metrics["frac_groups_dropped"]) == pytest.approx(1 / G)
    assert float(metrics["frac_groups_without_signal"]) == pytest.approx(2 / G)
    loss.backward()
    assert lp.grad.abs().sum() > 0


@pytest.mark.parametrize("rewards", [[0.0, 1.0, 0.0, 0.0] * G, [float("nan")] * (G * K)])
def test_metrics_live_on_the_log_probs_device(rewards, recwarn):
    """TRL and verl all-gather every metric across ranks, and NCCL refuses CPU tensors: a metric built without a
    device (on the default one) broke multi-GPU runs. With the default device moved away from the inputs', a
    metric made without `device=` shows up on the wrong one."""
    lp, old, r, m = _batch(rewards)
    torch.set_default_device("meta")
    try:
        _, metrics = tpo_group_loss(lp, old, r, m, K)
    finally:
        torch.set_default_device(None)
    assert {k: v.device.type for k, v in metrics.items()} == {k: "cpu" for k in metrics}
