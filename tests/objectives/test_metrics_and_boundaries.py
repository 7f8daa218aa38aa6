"""Metrics, thresholds and rarely used arguments, each against a value worked out by hand: the places where a
one-character change to an objective (a sign, `>` for `>=`, a forgotten mask or η) left every other test green."""

from __future__ import annotations

import math

import pytest
import torch

from targetpo import objectives as obj
from targetpo.objectives.scores import ZERO_VARIANCE_STD


def test_kl_q_p_is_the_targets_kl_to_the_policy():
    """Uniform p_θ and p_old over two candidates, u = (−1, 1), η = 1: q = (e⁻¹, e)/(e⁻¹ + e) and
    KL(q ‖ p_θ) = log 2 − H(q) = 0.32781 (CE + H would be log 2 + H = 1.05848)."""
    out = obj.tpo_loss(torch.zeros(1, 2), torch.zeros(1, 2), torch.tensor([[0.0, 1.0]]), eta=1.0)
    q = torch.tensor([math.exp(-1), math.exp(1)], dtype=torch.float64)
    q = q / q.sum()
    h = float(-(q * q.log()).sum())
    assert float(out.metrics["kl_q_p"]) == pytest.approx(math.log(2) - h, abs=1e-6)
    assert float(out.metrics["target_entropy"]) == pytest.approx(h, abs=1e-6)
    assert float(out.metrics["kl_q_p"]) == pytest.approx(0.32781, abs=1e-5)


def _std_exactly_eps() -> torch.Tensor:
    """Two scores whose population std is ε itself in float32: (0, 2ε), std = ε."""
    x = torch.tensor(ZERO_VARIANCE_STD, dtype=torch.float32)
    s = torch.stack([torch.tensor(0.0), 2 * x]).unsqueeze(0)
    assert float(s.std(dim=-1, unbiased=False)) == float(x)
    return s


def test_a_group_whose_std_equals_eps_takes_the_zero_variance_fallback():
    """σ ≤ ε is the documented fallback (u = s − s̄, docs/method.md §1), not a z-score of ±1; TPO counts the group
    in frac_zero_var."""
    s = _std_exactly_eps()
    u = obj.standardize_scores(s)
    torch.testing.assert_close(u, s - s.mean(dim=-1, keepdim=True))
    assert float(u.abs().max()) < 1e-5
    out = obj.tpo_loss(torch.zeros(1, 2), torch.zeros(1, 2), s)
    assert float(out.metrics["frac_zero_var"]) == 1.0


def test_eta_mean_averages_the_informative_groups_only():
    """A zero-variance group gets η = 1e-3 from the bisection, and no say in eta_mean: the mean over a batch of
    one informative and one tied group is the informative group's η alone."""
    s = torch.tensor([[0.0, 1.0], [1.0, 1.0]])
    both = obj.tpo_loss(torch.zeros(2, 2), torch.zeros(2, 2), s, eta="adaptive", kl_budget=0.1)
    alone = obj.tpo_loss(torch.zeros(1, 2), torch.zeros(1, 2), s[:1], eta="adaptive", kl_budget=0.1)
    eta = obj.adaptive_eta(torch.log_softmax(torch.zeros(1, 2), -1), obj.standardize_scores(s[:1]), 0.1)
    assert float(both.metrics["eta_mean"]) == float(alone.metrics["eta_mean"]) == pytest.approx(float(eta))
    assert float(both.metrics["frac_zero_var"]) == 0.5


def test_a_masked_score_does_not_break_the_tie_of_the_valid_ones():
    """Eight copies of 1000.7 and a masked 5000: the valid scores are all equal, so the group has no signal,
    whatever the masked candidate holds (its score must not enter the all-equal test)."""
    s = torch.full((1, 9), 1000.7)
    s[0, -1] = 5000.0
    m = torch.ones(1, 9, dtype=torch.bool)
    m[0, -1] = False
    assert bool(obj.zero_variance_groups(s, m, eps=0.0).all())
    assert float(obj.group_advantages(s, m).abs().max()) == 0.0
    assert float(obj.standardize_scores(s, m).abs().max()) < 1e-3  # the mean's rounding, not ±1
    q = obj.tpo_target(torch.zeros(1, 9), s, mask=m)
    torch.testing.assert_close(q[0, :8], torch.full((8,), 1 / 8))


def test_grpo_kl_on_a_padding_token_gives_no_nan_gradient():
    """A padding token whose stale log-prob overflows exp (TRL passes no log-ratio clamp) must stay out of the k3 KL:
    0·∞ in backward would make its gradient NaN."""
    lp = torch.zeros(1, 2, 2, requires_grad=True)
    old = torch.tensor([[[0.0, 100.0], [0.0, 0.0]]])  # row 0's second token is padding
    tm = torch.tensor([[[True, False], [True, True]]])
    out = obj.grpo_loss(lp, old, torch.tensor([[0.0, 1.0]]), token_mask=tm, beta=0.04, log_ratio_clip=None)
    out.loss.backward()
    assert torch.isfinite(lp.grad).all() and float(lp.grad[0, 0, 1]) == 0.0


@pytest.mark.parametrize("log_ratio, adv, clipped", [(math.log(0.5), -1.0, 1.0), (math.log(0.5), 1.0, 0.0),
                                                     (math.log(1.5), 1.0, 1.0), (math.log(1.5), -1.0, 0.0)])
def test_clip_frac_counts_each_side_of_the_trust_region_by_the_advantage_sign(log_ratio, adv, clipped):
    """PPO clips ρ < 1 − ε only where A < 0 and ρ > 1 + ε only where A > 0 (ε = 0.2 here)."""
    out = obj.ppo_loss(torch.tensor([log_ratio]), torch.zeros(1), torch.tensor([adv]), clip_eps=0.2)
    assert float(out.metrics["clip_frac"]) == clipped


def test_clip_cov_interval_is_open_at_its_lower_bound():
    """A = ±1 and centred log-probs ±1 give each token cov = 1 = clip_cov_lb exactly: outside the open interval
    (lb, ub), so no token loses its gradient (loss 0, gradient ∓A/2 per token)."""
    lp = torch.tensor([[[-2.0], [0.0]]], requires_grad=True)
    out = obj.clip_cov_loss(lp, lp.detach().clone(), torch.tensor([[0.0, 1.0]]), adv_eps=0.0, clip_cov_lb=1.0,
                            clip_cov_ub=5.0)
    out.loss.backward()
    assert out.loss.item() == 0.0 and float(out.metrics["cov_clip_frac"]) == 0.0
    torch.testing.assert_close(lp.grad.flatten(), torch.tensor([0.5, -0.5]))


def test_group_pg_divides_u_by_eta():
    """u = (−1, 1) and log π = (0, −1): L = −Σ (u/η)·log π = 1/η, so 0.5 at η = 2."""
    out = obj.group_pg_loss(torch.tensor([[0.0, -1.0]]), torch.tensor([[0.0, 1.0]]), eta=2.0)
    assert float(out.loss) == pytest.approx(0.5)


def test_every_objective_reads_a_tie_of_large_scores_as_zero_variance():
    """Eight copies of 1000.7 have σ ≈ 6e-5 (rounding, above ε): zero_variance_groups and GRPO counted the group
    as zero-variance, TPO's frac_zero_var did not (its own σ ≤ ε test). One rule now decides it for all."""
    s = torch.full((1, 8), 1000.7)
    assert bool(obj.zero_variance_groups(s).all())
    assert float(obj.grpo_loss(torch.zeros(1, 8), torch.zeros(1, 8), s).metrics["frac_zero_var"]) == 1.0
    assert float(obj.tpo_loss(torch.zeros(1, 8), torch.zeros(1, 8), s).metrics["frac_zero_var"]) == 1.0
