r"""Tabular softmax bandits (docs/experiments.md §E1, §E2): logit-space update directions and the paper's β(p) coefficients.

Every method's expected update on a one-hot reward is a multiple of one direction, v = e_y − π, and differs
only in its weight β(p), p = π(y) (paper App. B):

    CE: 1 · v      PG: p · v      DG (η = 1): p·σ(−log p) · v = p/(1+p) · v
    GRPO: √(p/(1−p)) · v      TPO: p(λ−1)/(1 − p + λp) · v,  λ = exp(u_hot − u_cold) = exp(K/√(K−1))

TPO's weight stays O(1) as p → 0 (β_TPO(0.1, K=10) ≈ 0.73) where PG's and DG's vanish.
"""

from __future__ import annotations

import torch
from torch import Tensor

from targetpo.objectives import standardize_scores, tpo_target
from targetpo.objectives.tpo import one_hot_lambda


def beta_pg(p: Tensor) -> Tensor:
    return p


def beta_dg(p: Tensor, eta: float = 1.0) -> Tensor:
    """p·σ(−log p / η); equals p/(1+p) at η = 1."""
    return p * torch.sigmoid(-torch.log(p + 1e-30) / eta)


def beta_grpo(p: Tensor) -> Tensor:
    return torch.sqrt(p / (1.0 - p + 1e-8))


def beta_tpo(p: Tensor, num_actions: int) -> Tensor:
    lam = one_hot_lambda(num_actions)
    return p * (lam - 1.0) / (1.0 - p + lam * p)


def correct_direction(probs: Tensor, correct: int = 0) -> Tensor:
    """v = e_y − π, the CE gradient direction in logit space."""
    v = torch.neg(probs)  # a new tensor in probs' layout
    v[..., correct] += 1.0
    return v


def beta(method: str, p: Tensor, eta: float = 1.0) -> Tensor:
    """β(p) of every method but TPO (whose update is computed from its target): the weight on v = e_y − π."""
    if method == "ce":
        return torch.ones_like(p)
    if method == "pg":
        return beta_pg(p)
    if method == "dg":
        return beta_dg(p, eta)
    if method == "grpo":
        return beta_grpo(p)
    raise ValueError(f"unknown tabular method {method!r}; choose from ce, pg, dg, grpo, tpo")


def exact_update_along(method: str, probs: Tensor, v: Tensor, correct: int = 0, eta: float = 1.0) -> Tensor:
    """β(p)·v, the expected update of every method but TPO, given v = :func:`correct_direction` (probs, correct)."""
    return beta(method, probs[..., correct : correct + 1], eta) * v


def exact_update(method: str, probs: Tensor, correct: int = 0, eta: float = 1.0) -> Tensor:
    """Expected (population) logit-space update g for a one-hot reward on action `correct` (docs/experiments.md §E2).

    TPO is computed from its target (q − π with q from :func:`tpo_target`), not from β, so that the identity
    g = β_TPO(p)·v is a property we can test rather than an assumption.
    """
    if method == "tpo":
        onehot = torch.zeros_like(probs)
        onehot[..., correct] = 1.0
        # The authors' code anchors on log(π + 1e-8); any per-group constant is irrelevant to q.
        q = tpo_target(torch.log(probs + 1e-8), onehot, eta=eta)
        return q - probs
    return exact_update_along(method, probs, correct_direction(probs, correct), correct, eta)


def standardized_one_hot(num_actions: int) -> Tensor:
    """u for a one-hot score: +√(K−1) on the hot entry, −1/√(K−1) elsewhere (docs/method.md §1)."""
    onehot = torch.zeros(num_actions, dtype=torch.float64)
    onehot[0] = 1.0
    return standardize_scores(onehot)


def squared_norm(g: Tensor, dims: tuple[int, ...] = (-1,)) -> Tensor:
    """Σ g² over `dims`, kept as size-1 dims (what :func:`misalignment` and :func:`normalized_step` share)."""
    return g.square().sum(dim=dims, keepdim=True)


def misalignment(g: Tensor, ref: Tensor, dims: tuple[int, ...] = (-1,), g_sq: Tensor | None = None,
                 ref_sq: Tensor | None = None) -> Tensor:
    """1 − cos(g, ref) over `dims`, norms with +1e-12 inside the sqrt (as the paper's code). `g_sq`/`ref_sq`:
    their :func:`squared_norm`, when the caller already has them."""
    dot = (g * ref).sum(dim=dims)
    g_sq = (squared_norm(g, dims) if g_sq is None else g_sq).reshape(dot.shape)
    ref_sq = (squared_norm(ref, dims) if ref_sq is None else ref_sq).reshape(dot.shape)
    return 1.0 - dot / (torch.sqrt(g_sq + 1e-12) * torch.sqrt(ref_sq + 1e-12))


def normalized_step(logits: Tensor, g: Tensor, lr: float, dims: tuple[int, ...] = (-1,),
                    g_sq: Tensor | None = None) -> Tensor:
    """logits + α·g/‖g‖ with ‖g‖ = sqrt(Σg² + 1e-30) over `dims` (the paper's fixed-length step); `g_sq`: the
    :func:`squared_norm` of g, when the caller already has it."""
    return logits + lr * g / torch.sqrt((squared_norm(g, dims) if g_sq is None else g_sq) + 1e-30)
