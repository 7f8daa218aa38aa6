r"""Score-function (REINFORCE-family) objectives: −A·log π with different advantages A.

All are *surrogates*: their value is meaningless, their gradient is the estimator. Advantages, and the scores
they are computed from, are treated as constants (detached).
"""

from __future__ import annotations

import torch
from torch import Tensor

from targetpo.objectives._checks import (
    LossOutput, as_float, as_mask, as_token_mask, check_group_size, check_same_shape,
    check_token_mask, checked, group_layout,
)
from targetpo.objectives.aggregation import aggregate, aggregate_answers
from targetpo.objectives.scores import rloo_advantages, standardize_scores, zero_variance_groups


@checked
def reinforce_loss(
    logp: Tensor,
    advantages: Tensor,
    *,
    token_mask: Tensor | None = None,
    loss_agg: str | None = None,
) -> LossOutput:
    r"""REINFORCE (Williams 1992): L = −agg(A · log π_θ(a)).

    `logp` and `advantages` share a shape: `[B]` single actions (default agg "mean", the paper's 1-D form) or
    `[B, H]` per-token (default "sum-mean": Σ_t, mean_b — the paper's 2-D form, docs/method.md §3). Pair with a baseline:
    :func:`expected_baseline` (Σπ², MNIST) or :func:`batch_mean_baseline` (per-position, transformer).
    """
    lp = as_float("logp", logp)
    a = as_float("advantages", advantages).detach()
    check_same_shape(logp=lp, advantages=a)
    check_token_mask(token_mask, lp)
    loss = aggregate_answers(-a * lp, loss_agg, token_mask=token_mask)
    valid = a if token_mask is None else a[token_mask]  # padding's advantages are not the batch's
    return LossOutput(loss, {"adv_mean": valid.mean(), "adv_abs_mean": valid.abs().mean()})


@checked
def importance_weighted_pg_loss(
    logp: Tensor,
    behaviour_logp: Tensor,
    advantages: Tensor,
    *,
    loss_agg: str | None = None,
) -> LossOutput:
    r"""Off-policy policy gradient with an (unclipped) importance ratio ρ = π_θ(a)/μ(a):
    L = −agg(sg[ρ]·A·log π_θ(a)), whose gradient is ρ·A·∇log π_θ(a) = A·∇ρ (Precup et al. 2000)."""
    lp = as_float("logp", logp)
    b = as_float("behaviour_logp", behaviour_logp).detach()
    a = as_float("advantages", advantages).detach()
    check_same_shape(logp=lp, behaviour_logp=b, advantages=a)
    ratio = (lp.detach() - b).exp()
    # The constant weight ρ·A is 0 for A = 0, not 0·∞ = NaN where a very stale sample's ρ overflowed (as in
    # kl_cov_loss); −(ρA)·log π is the same value bit for bit as (−ρ)·A·log π.
    weight = torch.where(a == 0, torch.zeros_like(a), ratio * a)
    loss = aggregate_answers(-weight * lp, loss_agg)
    return LossOutput(loss, {"ratio_mean": ratio.mean(), "ratio_max": ratio.max()})


@checked
def batch_standardized_pg_loss(logp: Tensor, rewards: Tensor, *, eps: float = 1e-8) -> LossOutput:
    r"""Single-sample "GRPO" of the paper's MNIST bandit (docs/experiments.md §E3): REINFORCE with batch-standardized rewards,
    Â = (r − mean_B r)/(std_B r + ε) with the population std; L = −mean(Â·log π(a)). No clipping, no KL.

    `logp` and `rewards` are `[B]` (one batch) or `[..., B]` (independent batches, e.g. one per seed of a
    vectorised run): each batch is standardized over its own last dim, and the loss is the mean over all
    elements, i.e. the mean of the per-batch losses."""
    lp = as_float("logp", logp)
    r = as_float("rewards", rewards)
    check_same_shape(logp=lp, rewards=r)
    if lp.dim() < 1 or lp.shape[-1] < 2:
        raise ValueError(f"batch_standardized_pg_loss needs batches of >= 2 samples along the last dim; "
                         f"got logp shape {tuple(lp.shape)}")
    mean = r.mean(dim=-1, keepdim=True)
    std = r.std(dim=-1, unbiased=False, keepdim=True)
    adv = (r - mean) / (std + eps)
    # A batch with one reward throughout has no signal: A = 0, as group_advantages gives a zero-variance group
    # (B copies of 0.7 have a mean one ulp off, so (r − r̄)/(σ + ε) was ≈ −0.86 for every sample, NaN at ε = 0).
    flat = zero_variance_groups(r)
    adv = adv.masked_fill(flat.unsqueeze(-1), 0.0)
    return reinforce_loss(lp.reshape(-1), adv.reshape(-1))


@checked
def rloo_loss(
    logp: Tensor,
    scores: Tensor,
    *,
    mask: Tensor | None = None,
    token_mask: Tensor | None = None,
    loss_agg: str = "mean",
) -> LossOutput:
    r"""RLOO (Kool et al. 2019; Ahmadian et al. 2024): A_i = s_i − mean_{j≠i} s_j, L = −agg(A_i·log π(y_i)).

    `logp` is `[G, K]` sequence log-probs or `[G, K, T]` per-token log-probs (then `loss_agg` may be any
    token mode); the default "mean" is the estimator's 1/(G·K) average."""
    lp = as_float("logp", logp)
    s = as_float("scores", scores).detach()
    per_token = group_layout(lp, s, token_mask)
    adv = rloo_advantages(s, mask)
    if per_token:
        mask = as_mask("mask", mask, s)
        tm = as_token_mask(token_mask, lp, mask)
        if mask is not None:
            tm = tm & mask.unsqueeze(-1)
        return LossOutput(aggregate(-adv.unsqueeze(-1) * lp, loss_agg, token_mask=tm, per_token=True), {})
    per = -adv * lp
    if mask is not None:
        m = as_mask("mask", mask, s)
        per = per.masked_fill(~m, 0.0)
        if loss_agg == "mean":
            return LossOutput(per.sum() / m.sum(), {})
    return LossOutput(aggregate(per, loss_agg), {})


@checked
def group_pg_loss(
    logp: Tensor,
    scores: Tensor,
    *,
    eta: float = 1.0,
    mask: Tensor | None = None,
) -> LossOutput:
    r"""Group PG, the paper's same-signal scalar ablation (§3.7; docs/differences.md §15): L = −mean_g Σ_i (u_i/η)·log π(y_i).

    u is TPO's standardized score; unlike TPO the group log-probs are *not* renormalised over the K
    candidates and nothing anchors the update, so its fixed point is not p = q.
    """
    lp = as_float("logp", logp)
    s = as_float("scores", scores).detach()
    group_layout(lp, s, token=False)
    check_group_size("scores", s)
    u = standardize_scores(s, mask)
    valid = torch.ones_like(u, dtype=torch.bool) if mask is None else mask
    # |u| over the valid candidates (a masked one holds u = 0 and is no sample), before the 1/η of the weight.
    return LossOutput(-(u / eta * lp).sum(dim=-1).mean(), {"u_abs_mean": u.abs()[valid].mean()})
