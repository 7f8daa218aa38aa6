r"""Target Policy Optimization (Kaddour 2026, arXiv 2604.06159; docs/method.md §2).

For one context, K candidates with rollout-time log-scores ℓ^old and scores s:

.. math::
    u = \mathrm{standardize}(s), \qquad
    q_i = \frac{p^{old}_i\, e^{u_i/\eta}}{\sum_j p^{old}_j\, e^{u_j/\eta}}
        = \mathrm{softmax}_i\big(\log\mathrm{softmax}(\ell^{old})_i + u_i/\eta\big), \qquad
    L = -\sum_i q_i \log \mathrm{softmax}(\ell^\theta)_i .

q is the closed-form maximiser of E_q[u] − η·KL(q ‖ p^old) on the simplex over the K candidates. It is
stop-gradient and frozen across epochs; the gradient on the group logits is ∂L/∂ℓ^θ_i = p^θ_i − q_i, which
vanishes when the policy matches the target. In the first epoch p^θ = p^old, so a zero-variance group
(u = 0 ⇒ q = p^old) contributes exactly nothing.

Three forms share that one loss:
- `tpo_loss`: group log-scores `[..., K]` (a bandit's action logits, or already-reduced sequence log-probs).
- `tpo_token_loss`: each prefix state is a group whose candidates are K next tokens (paper's TPO_token).
- `tpo_sequence_loss`: per-token log-probs `[G, K, T]` reduced to sequence log-scores by sum (the paper) or
  mean (length-normalised; better conditioned for long LLM completions, docs/method.md §2).
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from targetpo.objectives._checks import (
    LossOutput, as_float, as_mask, as_token_mask, check_group_size, check_positive, check_same_shape,
    checked, group_layout,
)
from targetpo.objectives.scores import ZERO_VARIANCE_STD, standardize_scores

_NEG = -1e30  # log-weight of a masked candidate: exp() underflows to exactly 0 without producing NaN


def _log_softmax(x: Tensor) -> Tensor:
    # Written out: for the small group dims used here (K ≲ 100, many groups) this is several times faster on
    # CPU than torch.log_softmax's generic kernel, and it is the same max-shifted formula.
    shifted = x - x.detach().amax(dim=-1, keepdim=True)
    return shifted - shifted.exp().sum(dim=-1, keepdim=True).log()


def _masked_log_softmax(x: Tensor, mask: Tensor | None) -> Tensor:
    if mask is not None:
        x = x.masked_fill(~mask, _NEG)
    return _log_softmax(x)


@checked
def tpo_target(
    old_logp: Tensor,
    scores: Tensor,
    eta: float = 1.0,
    mask: Tensor | None = None,
    *,
    anchor: bool = True,
) -> Tensor:
    r"""TPO's target distribution over each group's K candidates.

    q = softmax(log_softmax(old_logp) + u/η) with u = standardize_scores(scores) (anchored, the method), or
    q = softmax(u/η) with `anchor=False` (the paper's no-anchor ablation, §3.7). Masked candidates get q = 0.

    Args:
      old_logp: [..., K] rollout-time log-scores (any additive constant per group is irrelevant).
      scores: [..., K] candidate scores; invariant to positive affine maps per group.
      eta: temperature η > 0; η → ∞ gives q → p_old, η → 0 puts all mass on the best candidates.
      mask: optional [..., K] bool, True = valid candidate.
    Returns:
      q, [..., K], detached, float32 (float64 if inputs are float64).
    """
    return _target_and_u(old_logp, scores, eta, mask, anchor)[0]


def _target_and_u(old_logp, scores, eta, mask, anchor) -> tuple[Tensor, Tensor]:
    check_positive("eta", eta)
    s = as_float("scores", scores)
    old = as_float("old_logp", old_logp)
    check_same_shape(old_logp=old, scores=s)
    check_group_size("scores", s, minimum=2)
    mask = as_mask("mask", mask, s)
    u = standardize_scores(s, mask)
    dtype = torch.promote_types(old.dtype, u.dtype)
    logits = u.to(dtype) / eta
    if anchor:
        logits = logits + _masked_log_softmax(old.detach().to(dtype), mask)
    return _masked_log_softmax(logits, mask).exp().detach(), u


def _tpo_from_group_logp(logp: Tensor, q: Tensor, mask: Tensor | None, u: Tensor) -> LossOutput:
    log_p = _masked_log_softmax(logp, mask)
    # q is exactly 0 on masked candidates; where() keeps 0 * (-1e30 - lse) from ever mattering.
    ce = -torch.where(q > 0, q * log_p, torch.zeros_like(log_p)).sum(dim=-1)
    loss = ce.mean()
    with torch.no_grad():
        q_log_q = torch.where(q > 0, q * q.clamp_min(1e-38).log(), torch.zeros_like(q)).sum(dim=-1)
        p = log_p.exp()
        zero_var = (u.abs().amax(dim=-1) <= ZERO_VARIANCE_STD)
        metrics = {
            "target_entropy": -q_log_q.mean(),
            "kl_q_p": (ce + q_log_q).mean(),  # KL(q ‖ p_θ) = CE(q, p_θ) − H(q)
            "frac_zero_var": zero_var.float().mean(),
            "target_max": q.amax(dim=-1).mean(),
            "policy_max": p.amax(dim=-1).mean(),
        }
    return LossOutput(loss=loss, metrics=metrics)


@checked
def tpo_loss(
    logp: Tensor,
    old_logp: Tensor,
    scores: Tensor,
    *,
    eta: float = 1.0,
    mask: Tensor | None = None,
    anchor: bool = True,
) -> LossOutput:
    r"""TPO cross-entropy to the target, averaged over groups: L = mean_g −Σ_i q_i log_softmax(logp)_i.

    Args:
      logp: [..., K] differentiable group log-scores under the current policy (logits or log-probs; only
        their within-group differences matter, the loss renormalises over the K candidates).
      old_logp: [..., K] rollout-time log-scores, frozen across epochs.
      scores: [..., K] candidate scores.
      eta, mask, anchor: see :func:`tpo_target`.
    Returns:
      LossOutput with metrics target_entropy, kl_q_p (KL(q‖p_θ)), frac_zero_var, target_max, policy_max.
    """
    lp = as_float("logp", logp)
    group_layout(lp, scores, token=False)
    check_same_shape(logp=lp, old_logp=old_logp)
    q, u = _target_and_u(old_logp, scores, eta, mask, anchor)
    mask = as_mask("mask", mask, lp)
    return _tpo_from_group_logp(lp, q.to(lp.dtype), mask, u)


@checked
def tpo_token_loss(
    token_logp: Tensor,
    candidates: Tensor,
    old_logp: Tensor,
    scores: Tensor,
    *,
    eta: float = 1.0,
    mask: Tensor | None = None,
    anchor: bool = True,
) -> LossOutput:
    r"""Token-level TPO (the paper's TPO_token, docs/method.md §7): each prefix state is a group of K candidate next tokens.

    Args:
      token_logp: [..., V] log-probs (or logits) of the next token at each state, from one forward pass.
      candidates: [..., K] int64 candidate token ids drawn at rollout time (i.i.d., duplicates kept as separate
        candidates, as in the paper's code).
      old_logp: [..., K] rollout-time log-probs of the candidates.
      scores: [..., K] candidate rewards (e.g. correct-token indicator; alive × correct for sequential reward).
    The loss averages over all states, including dead and zero-variance ones, as the paper's code does.
    """
    tl = as_float("token_logp", token_logp)
    if candidates.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"candidates must be an integer tensor of token ids, got dtype {candidates.dtype}")
    if candidates.shape[:-1] != tl.shape[:-1]:
        raise ValueError(
            f"candidates has shape {tuple(candidates.shape)} but token_logp has {tuple(tl.shape)}; "
            "their leading (state) dims must match"
        )
    check_same_shape(candidates=candidates, old_logp=old_logp, scores=scores)
    v = tl.shape[-1]
    if candidates.numel() and (candidates.min() < 0 or candidates.max() >= v):
        raise ValueError(f"candidates must lie in [0, {v}) (vocab size of token_logp); got range "
                         f"[{int(candidates.min())}, {int(candidates.max())}]")
    cand_logp = torch.gather(torch.log_softmax(tl, dim=-1), -1, candidates.long())
    return tpo_loss(cand_logp, old_logp, scores, eta=eta, mask=mask, anchor=anchor)


SeqReduce = Literal["sum", "mean"]


def sequence_logp(token_logp: Tensor, token_mask: Tensor | None = None, reduce: SeqReduce = "sum") -> Tensor:
    r"""Sequence log-score from per-token log-probs: Σ_t m_t log π_t ("sum", the paper's exact sequence
    log-probability) or Σ_t m_t log π_t / Σ_t m_t ("mean", length-normalised)."""
    tl = as_float("token_logp", token_logp)
    tm = as_token_mask("token_mask", token_mask, tl)
    total = torch.where(tm, tl, torch.zeros_like(tl)).sum(dim=-1)
    if reduce == "sum":
        return total
    if reduce == "mean":
        return total / tm.sum(dim=-1).to(tl.dtype)
    raise ValueError(f"seq_logp/reduce must be 'sum' or 'mean', got {reduce!r}")


@checked
def tpo_sequence_loss(
    logp: Tensor,
    old_logp: Tensor,
    scores: Tensor,
    *,
    token_mask: Tensor | None = None,
    seq_logp: SeqReduce = "sum",
    eta: float = 1.0,
    mask: Tensor | None = None,
    anchor: bool = True,
) -> LossOutput:
    r"""Sequence-level TPO: each group is K full completions of one prompt.

    Args:
      logp: [G, K, T] per-token log-probs of the completions under the current policy.
      old_logp: [G, K, T] per-token log-probs at rollout time.
      scores: [G, K] completion rewards.
      token_mask: [G, K, T] bool, True on completion tokens (False on padding).
      seq_logp: "sum" (the paper) or "mean" (length-normalised) reduction of the per-token log-probs.
    """
    lp = as_float("logp", logp)
    group_layout(lp, scores, token_mask, candidate=False)
    check_same_shape(logp=lp, old_logp=old_logp)
    seq = sequence_logp(lp, token_mask, seq_logp)
    old_seq = sequence_logp(as_float("old_logp", old_logp).detach(), token_mask, seq_logp)
    out = tpo_loss(seq, old_seq, scores, eta=eta, mask=mask, anchor=anchor)
    return out
