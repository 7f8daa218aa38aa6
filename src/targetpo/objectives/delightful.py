r"""Delightful policy gradient (DG; Osband 2026; docs/method.md §3): a sigmoid gate on surprisal × advantage.

.. math::  w = \mathrm{sg}\big(\sigma(A\cdot\ell/\eta)\,A\big),\quad \ell = -\log\pi_\theta(a),\qquad
           L = -\mathrm{agg}(w \log\pi_\theta(a))

A surprising success (large ℓ, A > 0) keeps almost all of its weight, an expected failure (small ℓ, A < 0)
is damped to ~A/2, and a surprising failure is suppressed. The gate uses the *current* log-probs but carries
no gradient, so the paper runs DG for exactly one epoch per batch (re-using a batch changes the gate).
"""

from __future__ import annotations

import torch
from torch import Tensor

from targetpo.objectives._checks import (
    LossOutput, as_float, check_same_shape, check_token_mask, checked,
)
from targetpo.objectives.aggregation import aggregate_answers


@checked(shapes=("logp", "advantages"))
def delight_gate(logp: Tensor, advantages: Tensor, eta: float = 1.0) -> Tensor:
    """σ(A·(−log π)/η), detached (a weight, docs/method.md §3)."""
    return torch.sigmoid(advantages.detach() * (-logp.detach()) / eta)


@checked
def dg_loss(
    logp: Tensor,
    advantages: Tensor,
    *,
    eta: float = 1.0,
    token_mask: Tensor | None = None,
    loss_agg: str | None = None,
) -> LossOutput:
    """DG loss. `[B]` single actions (default agg "mean", MNIST) or `[B, H]` per-token (default "sum-mean",
    the transformer experiments)."""
    lp = as_float("logp", logp)
    a = as_float("advantages", advantages).detach()
    check_same_shape(logp=lp, advantages=a)
    check_token_mask(token_mask, lp)
    gate = delight_gate(lp, a, eta)
    w = gate * a
    loss = aggregate_answers(-w * lp, loss_agg, token_mask=token_mask)
    if token_mask is not None:  # padding holds any finite log-prob and advantage; the metrics see the valid tokens only
        gate, w = gate[token_mask], w[token_mask]
    return LossOutput(loss, {"gate_mean": gate.mean(), "weight_abs_mean": w.abs().mean()})
