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
(u = 0 ⇒ q = p^old) contributes nothing (up to float rounding: q is normalised once more, ~1e-8 per logit in
float32).

Three forms share that one loss:
- `tpo_loss`: group log-scores `[..., K]` (a bandit's action logits, or already-reduced sequence log-probs).
- `tpo_token_loss`: each prefix state is a group whose candidates are K next tokens (paper's TPO_token).
- `tpo_sequence_loss`: per-token log-probs `[G, K, T]` reduced to sequence log-scores by sum (the paper) or
  mean (length-normalised; better conditioned for long LLM completions, docs/method.md §2).

Options beyond the paper (its §6 open questions; docs/method.md §8), all off by default: other projections onto
q (`projection=`: reverse KL, Jensen–Shannon, the α-divergences between the two KLs), a per-group η chosen
from a KL budget (`eta="adaptive"`, `kl_budget=`), a floor or shrinkage of low-variance groups' std
(`std_floor=`, `std_shrink=`), and a truncated importance correction of the anchor for stale or replayed
rollouts (`is_clip=`).
"""

from __future__ import annotations

import math
from typing import Literal, NamedTuple

import torch
from torch import Tensor

from targetpo.objectives._checks import (
    ALPHA_MIN, LossOutput, as_float, as_mask, as_token_mask, check_group_size, check_same_shape,
    checked, group_layout, is_integer_tensor,
)
from targetpo.objectives.scores import standardized_and_zero_variance

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


# ----------------------------------------------------------------------------- options beyond the paper (§8)

Projection = Literal["forward_kl", "reverse_kl", "js", "alpha"]
PROJECTIONS: tuple[str, ...] = ("forward_kl", "reverse_kl", "js", "alpha")

# Adaptive η (docs/method.md §8): bisection on log η over this bracket, a fixed number of halvings (2^-60 of
# ln(1e7) is below float64's resolution of log η, so the result does not depend on the step count any more).
ADAPTIVE_ETA_BRACKET = (1e-3, 1e4)
ADAPTIVE_ETA_STEPS = 60
ADAPTIVE = {"eta": ("adaptive",)}  # the word TPO's η takes besides a number


def adaptive_kl_floor(k: int) -> float:
    """The smallest KL budget `eta="adaptive"` reaches in every group of k candidates: KL(q_η ‖ p_old) ≤
    (range u)²/(8η²) (Hoeffding's lemma on the log-partition), and a z-score's range is at most √(2k) (Σu² = k, so
    u_max² + u_min² ≤ k; reached by scores +a, −a, 0, …, 0), so at the bracket's top η every group's KL is at most
    2k/(8η²) (2.5e-8 for k = 10). A smaller budget may be out of reach in some group, which the bisection refuses
    only when it meets one, mid-run. (One-hot and 0/1 scores have the smaller range k/√(k−1).)"""
    return 2 * k / (8 * ADAPTIVE_ETA_BRACKET[1] ** 2)


class Target(NamedTuple):
    """TPO's target for a batch of groups: q, its log (exact where q underflows), the standardized scores u and
    the temperature used ([..., 1] when chosen per group, else the float passed)."""

    q: Tensor
    log_q: Tensor
    u: Tensor
    eta: Tensor | float
    zero_var: Tensor  # bool [...]: as zero_variance_groups decides it (docs/method.md §7)


def _valid_sum(x: Tensor, mask: Tensor | None) -> Tensor:
    """Σ over the group of x, counting valid candidates only (masked terms are 0·(finite), kept out anyway)."""
    return (x if mask is None else torch.where(mask, x, torch.zeros_like(x))).sum(dim=-1)


def kl_divergence(log_a: Tensor, log_b: Tensor, mask: Tensor | None = None) -> Tensor:
    r"""KL(a ‖ b) = Σ_i a_i (log a_i − log b_i) per group, from normalised log-probabilities [..., K]."""
    return _valid_sum(log_a.exp() * (log_a - log_b), mask)


@checked(shapes=("log_p", "log_q", "mask"))
def reverse_kl_projection(log_p: Tensor, log_q: Tensor, mask: Tensor | None = None) -> Tensor:
    r"""KL(p_θ ‖ q) per group (the projection of LPO, arXiv 2605.06139): mode-seeking.

    ∂/∂z_i = p_i (log p_i − log q_i − KL(p_θ ‖ q)) on the group logits z; zero iff p_θ = q."""
    log_q = log_q.detach()  # the target q is a constant: only p_θ is fitted
    return kl_divergence(log_p, log_q, mask)


@checked(shapes=("log_p", "log_q", "mask"))
def jensen_shannon_projection(log_p: Tensor, log_q: Tensor, mask: Tensor | None = None) -> Tensor:
    r"""JS(p_θ, q) = ½ KL(p_θ ‖ m) + ½ KL(q ‖ m), m = (p_θ + q)/2, per group; bounded by log 2.

    ∂/∂z_i = ½ p_i (log(p_i/m_i) − KL(p_θ ‖ m)) (the terms from m's dependence on p cancel)."""
    log_q = log_q.detach()  # the target q is a constant: only p_θ is fitted
    log_m = torch.logaddexp(log_p, log_q) - math.log(2.0)
    return 0.5 * (kl_divergence(log_p, log_m, mask) + kl_divergence(log_q, log_m, mask))


@checked(shapes=("log_p", "log_q", "mask"))
def alpha_projection(log_p: Tensor, log_q: Tensor, alpha: float, mask: Tensor | None = None) -> Tensor:
    r"""Amari's α-divergence in Minka's convention, D_α(q ‖ p_θ) = (1 − Σ_i q_i^α p_i^{1−α}) / (α(1 − α)), per group.

    α → 1 gives KL(q ‖ p_θ) (forward, the paper's projection up to the constant H(q)), α → 0 gives KL(p_θ ‖ q)
    (reverse); α = ½ is 2·Σ(√q_i − √p_i)², four times the squared Hellinger distance. The ends are computed
    as the KLs themselves. With r_i = q_i^α p_i^{1−α}, S = Σ r and w = r/S,
    ∂/∂z_i = (S/α)(p_i − w_i): p − q at α = 1, the reverse-KL gradient as α → 0.

    1 − S is expanded around the nearer end, using Σp = Σq = 1: 1 − S = −Σ_i p_i·expm1(α(log q_i − log p_i))
    for α ≤ ½ and −Σ_i q_i·expm1((1 − α)(log p_i − log q_i)) above. Each term is then computed to relative
    precision however close α is to 0 or 1, where 1 − S itself is far below float32's resolution of 1. An
    exponent above 40 (a candidate far likelier under one distribution) takes the term in log space instead,
    exp(α log q + (1 − α) log p) minus the weight, which cannot overflow."""
    log_q = log_q.detach()  # the target q is a constant: only p_θ is fitted
    if alpha == 1:
        return kl_divergence(log_q, log_p, mask)
    if alpha == 0:
        return kl_divergence(log_p, log_q, mask)
    if alpha <= 0.5:
        log_w, t, d = log_p, alpha, log_q - log_p
    else:
        log_w, t, d = log_q, 1 - alpha, log_p - log_q
    x = t * d
    big = x > 40.0
    near = log_w.exp() * torch.expm1(x.clamp_max(40.0))
    far = torch.exp(log_w + x.clamp_min(40.0)) - log_w.exp()
    return -_valid_sum(torch.where(big, far, near), mask) / (alpha * (1 - alpha))


@checked(shapes=("log_old", "u", "mask"))
def kl_to_old(log_old: Tensor, u: Tensor, eta: Tensor, mask: Tensor | None = None) -> Tensor:
    r"""KL(q_η ‖ p_old) per group for q_η ∝ p_old·exp(u/η); `log_old` normalised over the group, η a positive
    tensor [..., 1] (one temperature per group, or a shape that broadcasts onto [..., 1], e.g. one for all groups).

    Decreasing in η: dKL/dη = −Var_{q_η}(u)/η³ ≤ 0, from KL_max = −log p_old(argmax u) as η → 0 to 0 as η → ∞."""
    groups = tuple(u.shape[:-1]) + (1,)
    if not isinstance(eta, Tensor) or not _broadcasts_onto(eta.shape, groups):
        got = f"shape {tuple(eta.shape)}" if isinstance(eta, Tensor) else type(eta).__name__
        raise ValueError(f"eta must be a tensor of shape {groups} (one temperature per group of u {tuple(u.shape)}) "
                         f"or one that broadcasts onto it along the groups, got {got}")
    if not bool((eta > 0).all()):
        raise ValueError(f"eta must be > 0 in every group (a temperature); its smallest value is {eta.min().item()!r}")
    return _kl_to_old(log_old, u, eta, mask)


def _broadcasts_onto(shape: torch.Size, target: tuple[int, ...]) -> bool:
    try:
        return torch.broadcast_shapes(shape, target) == target
    except RuntimeError:
        return False


def _kl_to_old(log_old: Tensor, u: Tensor, eta: Tensor, mask: Tensor | None) -> Tensor:
    log_q = _masked_log_softmax(log_old + u / eta, mask)
    return kl_divergence(log_q, log_old, mask)


@checked(shapes=("log_old", "u", "mask"))
def adaptive_eta(log_old: Tensor, u: Tensor, kl_budget: float, mask: Tensor | None = None) -> Tensor:
    r"""Per group, the temperature η at which KL(q_η ‖ p_old) = `kl_budget` (the dual of REPS/MPO's
    KL-constrained improvement step, max_q E_q[u] s.t. KL(q ‖ p_old) ≤ ε), as a detached [..., 1] float64 tensor
    whatever the inputs' dtype (the bisection's precision; cast it to divide u in another dtype).

    Bisection on log η over :data:`ADAPTIVE_ETA_BRACKET` in float64 with :data:`ADAPTIVE_ETA_STEPS` halvings,
    vectorised over groups and deterministic. Where no η in the bracket reaches the budget it returns the
    dual's minimiser, the smallest η: a zero-variance group (u = 0, KL = 0 at any η; q = p_old regardless) and
    a budget above KL_max (q ≈ p_old restricted to the best candidates) both get η = 1e-3."""
    with torch.no_grad():
        lo_hi = torch.tensor(ADAPTIVE_ETA_BRACKET, dtype=torch.float64).log()
        # Renormalised in float64: a float32-normalised anchor sums to 1 only within ~1e-7, which is noise of that
        # size in every KL below (negative KLs included) and made budgets near 1e-7 unreachable.
        log_old64, u64 = _masked_log_softmax(log_old.detach().double(), mask), u.detach().double()
        lo = torch.full_like(u64[..., :1], float(lo_hi[0]))
        hi = torch.full_like(u64[..., :1], float(lo_hi[1]))
        top = _kl_to_old(log_old64, u64, hi.exp(), mask)
        if (top > kl_budget).any():  # η would stop at the bracket's top with KL above ε: the budget not kept
            raise ValueError(f"kl_budget={kl_budget!r}: below the KL(q ‖ p_old) = {float(top.max()):.3g} that even "
                             f"η = {ADAPTIVE_ETA_BRACKET[1]:g} leaves in some group; give a budget of at least that")
        for _ in range(ADAPTIVE_ETA_STEPS):
            mid = 0.5 * (lo + hi)
            over = (_kl_to_old(log_old64, u64, mid.exp(), mask) > kl_budget).unsqueeze(-1)
            lo, hi = torch.where(over, mid, lo), torch.where(over, hi, mid)
        return hi.exp()  # the end with KL ≤ ε


@checked(shapes=("log_p", "log_old"))
def truncated_is_weights(log_p: Tensor, log_old: Tensor, is_clip: float) -> Tensor:
    r"""c_i = min(c̄, p^θ_i / p^old_i) per candidate, from group-normalised log-probabilities [..., K]."""
    return (log_p - log_old).clamp_max(math.log(is_clip)).exp()


@checked(shapes=("logp", "old_logp", "mask"))
def corrected_anchor(logp: Tensor, old_logp: Tensor, is_clip: float, mask: Tensor | None = None) -> Tensor:
    r"""The log of TPO's importance-corrected anchor a ∝ p^old·c with c_i = min(c̄, p^θ_i/p^old_i), normalised
    over the group (docs/method.md §8): log a = log_softmax(min(log p^old + log c̄, log p^θ)), detached.

    p^θ (current policy) and p^old (the behaviour policy that drew the candidates) are the group-renormalised
    softmaxes of `logp` and `old_logp` [..., K]. When p^θ = p^old, a = p^old for every c̄ > 0 (plain TPO)."""
    with torch.no_grad():
        log_p = _masked_log_softmax(logp.detach(), mask)
        log_old = _masked_log_softmax(old_logp.detach(), mask)
        return _masked_log_softmax(torch.minimum(log_old + math.log(is_clip), log_p), mask)


def _check_options(eta, kl_budget, anchor: bool, projection=None, alpha=None, std_floor=0.0, std_shrink=0.0) -> None:
    if eta == "adaptive":
        if kl_budget is None:
            raise ValueError("eta='adaptive' needs kl_budget=ε > 0, the KL(q ‖ p_old) each group's η is chosen to reach")
        if not anchor:
            raise ValueError("eta='adaptive' bounds KL(q ‖ p_old), which needs the p_old anchor; got anchor=False")
        if std_floor or std_shrink:
            # A floor or shrinkage divides each group's u by a constant; the adaptive η then reaches the same KL at
            # η times that constant, so q came out the same (docs/method.md §8).
            raise ValueError(f"std_floor={std_floor!r}/std_shrink={std_shrink!r} with eta='adaptive': they rescale "
                             "each group's u, which the adaptive η undoes (it reaches the same KL budget at a "
                             "rescaled η), so they would change nothing; leave them at 0 or give a fixed eta")
    elif kl_budget is not None:
        raise ValueError(f"kl_budget={kl_budget!r} is only used with eta='adaptive'; got eta={eta!r}")
    if projection is not None and projection not in PROJECTIONS:
        raise ValueError(f"projection={projection!r}: must be one of {', '.join(map(repr, PROJECTIONS))}")
    if projection == "alpha" and alpha is None:
        raise ValueError("projection='alpha' needs alpha in [0, 1] (1: forward KL, 0: reverse KL)")
    if projection is not None and projection != "alpha" and alpha is not None:
        raise ValueError(f"alpha={alpha!r} is only used with projection='alpha'; got projection={projection!r}")


# ----------------------------------------------------------------------------- one-hot scores in closed form

def _one_hot_gap(num_candidates: int, eta: float) -> float:
    """(u_hot − u_cold)/η for a one-hot score over K candidates: u = √(K−1) and −1/√(K−1), so K/(√(K−1)·η)."""
    return num_candidates / math.sqrt(num_candidates - 1) / eta


def one_hot_lambda(num_candidates: int, eta: float = 1.0) -> float:
    """λ = exp((u_hot − u_cold)/η), the ratio of TPO's target weights w_hot/w_cold for a one-hot score (the tabular
    and MNIST closed forms, App. B–C; e^{10/3} ≈ 28.03 for K = 10); inf where it exceeds a float (η below ~0.005
    for K = 10)."""
    gap = _one_hot_gap(num_candidates, eta)
    return math.exp(gap) if gap < 709.0 else math.inf


def one_hot_inv_lambda(num_candidates: int, eta: float = 1.0) -> float:
    """1/λ (:func:`one_hot_lambda`), in [0, 1] and finite for every η > 0 (0.0 once it underflows): the form the
    closed forms compute in, since λ itself overflows float32 below η ≈ 0.04 for K = 10."""
    return math.exp(-_one_hot_gap(num_candidates, eta))


# ----------------------------------------------------------------------------- the target and the loss

@checked(words=ADAPTIVE)
def tpo_target(
    old_logp: Tensor,
    scores: Tensor,
    eta: float | Literal["adaptive"] = 1.0,
    mask: Tensor | None = None,
    *,
    anchor: bool = True,
    kl_budget: float | None = None,
    std_floor: float = 0.0,
    std_shrink: float = 0.0,
) -> Tensor:
    r"""TPO's target distribution over each group's K candidates.

    q = softmax(log_softmax(old_logp) + u/η) with u = standardize_scores(scores) (anchored, the method), or
    q = softmax(u/η) with `anchor=False` (the paper's no-anchor ablation, §3.7). Masked candidates get q = 0.

    Args:
      old_logp: [..., K] rollout-time log-scores (any additive constant per group is irrelevant).
      scores: [..., K] candidate scores; invariant to positive affine maps per group.
      eta: temperature η > 0; η → ∞ gives q → p_old, η → 0 puts all mass on the best candidates.
        "adaptive" chooses η per group so that KL(q ‖ p_old) = `kl_budget` (:func:`adaptive_eta`,
        docs/method.md §8); η is then a constant of the target, like q itself.
      mask: optional [..., K] bool, True = valid candidate.
      kl_budget: ε > 0 for `eta="adaptive"` (and only then).
      std_floor, std_shrink: low-variance groups' std floor σ_min and shrinkage c (:func:`standardize_scores`,
        docs/method.md §8); 0 = the paper's standardisation.
    Returns:
      q, [..., K], detached, float32 (float64 if inputs are float64).
    """
    return _target(old_logp, scores, eta, mask, anchor, kl_budget, std_floor, std_shrink).q


def _target(old_logp, scores, eta, mask, anchor, kl_budget=None, std_floor=0.0, std_shrink=0.0) -> Target:
    _check_options(eta, kl_budget, anchor, std_floor=std_floor, std_shrink=std_shrink)
    s = as_float("scores", scores)
    old = as_float("old_logp", old_logp)
    check_same_shape(old_logp=old, scores=s)
    check_group_size("scores", s, minimum=2)
    mask = as_mask("mask", mask, s)
    u, zero_var = standardized_and_zero_variance(s, mask, std_floor=std_floor, std_shrink=std_shrink)
    dtype = torch.promote_types(old.dtype, u.dtype)
    log_old = _masked_log_softmax(old.detach().to(dtype), mask) if anchor else None
    if eta == "adaptive":
        eta = adaptive_eta(log_old, u, kl_budget, mask)
        logits = u.to(dtype) / eta.to(dtype)
    else:
        logits = u.to(dtype) / eta
        # z-scores are at most √(K−1) in size, so only a tiny η can overflow; with a std floor or shrinkage u has
        # no such bound and is checked (a host sync, only on that path).
        bounded = std_floor == 0 and std_shrink == 0 and math.sqrt(u.shape[-1]) / eta < torch.finfo(dtype).max / 2
        if not bounded and not torch.isfinite(logits).all():
            raise ValueError(f"eta={eta!r} is too small for {dtype}: u/eta overflows (max |u| = "
                             f"{float(u.abs().max()):.4g}); use eta ≥ {float(u.abs().max()) / torch.finfo(dtype).max:.1e}")
    if anchor:
        logits = logits + log_old
    log_q = _masked_log_softmax(logits, mask).detach()
    return Target(log_q.exp(), log_q, u, eta, zero_var.squeeze(-1))


def _tpo_from_group_logp(logp: Tensor, target: Target, mask: Tensor | None, projection: str = "forward_kl",
                         alpha: float | None = None) -> LossOutput:
    q, zero_var = target.q.to(logp.dtype), target.zero_var
    log_p = _masked_log_softmax(logp, mask)
    # q is exactly 0 on masked candidates; where() keeps 0 * (-1e30 - lse) from ever mattering.
    ce = -torch.where(q > 0, q * log_p, torch.zeros_like(log_p)).sum(dim=-1)
    if projection == "forward_kl":
        loss = ce.mean()
    else:
        log_q = target.log_q.to(logp.dtype)
        if projection == "reverse_kl":
            loss = reverse_kl_projection(log_p, log_q, mask).mean()
        elif projection == "js":
            loss = jensen_shannon_projection(log_p, log_q, mask).mean()
        else:
            loss = alpha_projection(log_p, log_q, alpha, mask).mean()
    with torch.no_grad():
        q_log_q = torch.where(q > 0, q * q.clamp_min(1e-38).log(), torch.zeros_like(q)).sum(dim=-1)
        p = log_p.exp()
        metrics = {
            "target_entropy": -q_log_q.mean(),
            "kl_q_p": (ce + q_log_q).mean(),  # KL(q ‖ p_θ) = CE(q, p_θ) − H(q)
            "frac_zero_var": zero_var.to(q.dtype).mean(),
            "target_max": q.amax(dim=-1).mean(),
            "policy_max": p.amax(dim=-1).mean(),
        }
        if isinstance(target.eta, Tensor):  # adaptive η: the temperature chosen over the informative groups
            informative = (~zero_var).to(target.eta.dtype)
            eta_mean = (target.eta.squeeze(-1) * informative).sum() / informative.sum().clamp_min(1.0)
            metrics["eta_mean"] = eta_mean.to(q.dtype)
    return LossOutput(loss=loss, metrics=metrics)


@checked(words=ADAPTIVE)
def tpo_loss(
    logp: Tensor,
    old_logp: Tensor,
    scores: Tensor,
    *,
    eta: float | Literal["adaptive"] = 1.0,
    mask: Tensor | None = None,
    anchor: bool = True,
    projection: Projection = "forward_kl",
    alpha: float | None = None,
    kl_budget: float | None = None,
    std_floor: float = 0.0,
    std_shrink: float = 0.0,
    is_clip: float | None = None,
) -> LossOutput:
    r"""TPO cross-entropy to the target, averaged over groups: L = mean_g −Σ_i q_i log_softmax(logp)_i.

    Args:
      logp: [..., K] differentiable group log-scores under the current policy (logits or log-probs; only
        their within-group differences matter, the loss renormalises over the K candidates).
      old_logp: [..., K] rollout-time log-scores, frozen across epochs.
      scores: [..., K] candidate scores.
      eta, mask, anchor, kl_budget, std_floor, std_shrink: see :func:`tpo_target`.
      projection: how the policy is fitted to q (docs/method.md §8), per group, averaged over groups:
        "forward_kl" (the paper: −Σ q log p_θ, gradient p_θ − q), "reverse_kl" (KL(p_θ ‖ q),
        :func:`reverse_kl_projection`), "js" (Jensen–Shannon, :func:`jensen_shannon_projection`) or "alpha"
        (D_α(q ‖ p_θ) with `alpha` in [0, 1], :func:`alpha_projection`). Every one is zero-gradient at p_θ = q.
      alpha: the α of projection="alpha" (and only then): 1 = forward KL, 0 = reverse KL.
      is_clip: c̄ > 0 turns on the truncated importance correction of the anchor for candidates drawn by a
        behaviour policy μ = softmax(old_logp) that the current policy has since moved away from (replay,
        staleness; docs/method.md §8): q_i ∝ μ_i·min(c̄, π_i/μ_i)·exp(u_i/η) with π = softmax(logp), detached.
        None (default) is the paper's q ∝ μ·exp(u/η). On-policy (π = μ) both are the same for every c̄.
    Returns:
      LossOutput with metrics target_entropy, kl_q_p (KL(q‖p_θ)), frac_zero_var, target_max, policy_max,
      eta_mean (the adaptive η's mean over groups with a score spread) with eta="adaptive", and with is_clip
      frac_truncated (the fraction of candidates whose ratio π/μ exceeds c̄).
    """
    lp = as_float("logp", logp)
    group_layout(lp, scores, token=False)
    check_same_shape(logp=lp, old_logp=old_logp)
    _check_options(eta, kl_budget, anchor, projection, alpha, std_floor, std_shrink)
    truncated = None
    if is_clip is not None:
        if not anchor:
            raise ValueError(f"is_clip={is_clip!r} corrects the p_old anchor, which anchor=False removes")
        m = as_mask("mask", mask, lp)
        old = as_float("old_logp", old_logp)
        with torch.no_grad():
            log_p, log_old = _masked_log_softmax(lp.detach(), m), _masked_log_softmax(old.detach(), m)
            over = (log_p - log_old) > math.log(is_clip) + 1e-6  # beyond rounding: π = μ counts as untruncated
            over = over if m is None else over & m
            truncated = over.to(lp.dtype).sum() / (over.numel() if m is None else m.sum())
        old_logp = corrected_anchor(lp, old, is_clip, m)
    target = _target(old_logp, scores, eta, mask, anchor, kl_budget, std_floor, std_shrink)
    mask = as_mask("mask", mask, lp)
    out = _tpo_from_group_logp(lp, target, mask, projection, alpha)
    if truncated is not None:
        out.metrics["frac_truncated"] = truncated.to(out.loss.dtype)
    return out


@checked(words=ADAPTIVE)
def tpo_token_loss(
    token_logp: Tensor,
    candidates: Tensor,
    old_logp: Tensor,
    scores: Tensor,
    *,
    eta: float | Literal["adaptive"] = 1.0,
    mask: Tensor | None = None,
    anchor: bool = True,
    projection: Projection = "forward_kl",
    alpha: float | None = None,
    kl_budget: float | None = None,
    std_floor: float = 0.0,
    std_shrink: float = 0.0,
    is_clip: float | None = None,
) -> LossOutput:
    r"""Token-level TPO (the paper's TPO_token, docs/method.md §7): each prefix state is a group of K candidate next tokens.

    Args:
      token_logp: [..., V] log-probs (or logits) of the next token at each state, from one forward pass; −inf is
        allowed at tokens that are no candidate (a top-k or top-p masked vocabulary), never at a candidate.
      candidates: [..., K] int64 candidate token ids drawn at rollout time (i.i.d., duplicates kept as separate
        candidates, as in the paper's code).
      old_logp: [..., K] rollout-time log-probs of the candidates.
      scores: [..., K] candidate rewards (e.g. correct-token indicator; alive × correct for sequential reward).
    The loss averages over all states, including dead and zero-variance ones, as the paper's code does.
    The options (eta, mask, anchor, projection, alpha, kl_budget, std_floor, std_shrink, is_clip) are
    :func:`tpo_loss`'s.
    """
    tl = as_float("token_logp", token_logp, inf_ok=True)  # NaN refused; ±inf checked below, with the candidates
    if not is_integer_tensor(candidates):
        got = candidates.dtype if isinstance(candidates, torch.Tensor) else type(candidates).__name__
        raise TypeError(f"candidates must be an integer tensor of token ids, got {got}")
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
    if not torch.isfinite(tl.detach().sum()):
        _check_masked_vocabulary(tl.detach(), candidates.long())
    cand_logp = torch.gather(torch.log_softmax(tl, dim=-1), -1, candidates.long())
    return tpo_loss(cand_logp, old_logp, scores, eta=eta, mask=mask, anchor=anchor, projection=projection, alpha=alpha,
                    kl_budget=kl_budget, std_floor=std_floor, std_shrink=std_shrink, is_clip=is_clip)


def _check_masked_vocabulary(tl: Tensor, candidates: Tensor) -> None:
    """−inf marks tokens the sampler could not draw: harmless where no candidate is (exp(−inf) = 0 in the
    normaliser, a zero gradient), an infinite loss at a candidate; +inf has no distribution at all."""
    if (tl == math.inf).any():
        raise ValueError(f"token_logp contains {int((tl == math.inf).sum())} +inf value(s) (shape {tuple(tl.shape)}); "
                         "only −inf is allowed, at tokens that are no candidate")
    at_candidates = torch.gather(tl, -1, candidates) == -math.inf
    if at_candidates.any():
        where = [tuple(i) for i in at_candidates.nonzero()[:3].tolist()]
        raise ValueError(f"token_logp is −inf at {int(at_candidates.sum())} candidate token(s) (first at candidate "
                         f"index {where}): a drawn candidate needs a finite log-prob; −inf is allowed only at tokens "
                         "that are no candidate")


SeqReduce = Literal["sum", "mean"]


def sequence_logp(token_logp: Tensor, token_mask: Tensor | None = None, reduce: SeqReduce = "sum", *,
                  mask: Tensor | None = None) -> Tensor:
    r"""Sequence log-score from per-token log-probs: Σ_t m_t log π_t ("sum", the paper's exact sequence
    log-probability) or Σ_t m_t log π_t / Σ_t m_t ("mean", length-normalised). A sequence with no valid token
    must be a candidate the candidate mask `mask` [...] leaves out; its score is 0."""
    tl = as_float("token_logp", token_logp)
    if mask is not None:
        mask = as_mask("mask", mask, tl[..., 0], require_nonempty_groups=False)
    tm = as_token_mask(token_mask, tl, mask, like_name="token_logp")
    total = torch.where(tm, tl, torch.zeros_like(tl)).sum(dim=-1)
    if reduce == "sum":
        return total
    if reduce == "mean":
        return total / tm.sum(dim=-1).clamp_min(1).to(tl.dtype)
    raise ValueError(f"seq_logp/reduce must be 'sum' or 'mean', got {reduce!r}")


@checked(words=ADAPTIVE)
def tpo_sequence_loss(
    logp: Tensor,
    old_logp: Tensor,
    scores: Tensor,
    *,
    token_mask: Tensor | None = None,
    seq_logp: SeqReduce = "sum",
    eta: float | Literal["adaptive"] = 1.0,
    mask: Tensor | None = None,
    anchor: bool = True,
    projection: Projection = "forward_kl",
    alpha: float | None = None,
    kl_budget: float | None = None,
    std_floor: float = 0.0,
    std_shrink: float = 0.0,
    is_clip: float | None = None,
) -> LossOutput:
    r"""Sequence-level TPO: each group is K full completions of one prompt.

    Args:
      logp: [G, K, T] per-token log-probs of the completions under the current policy.
      old_logp: [G, K, T] per-token log-probs at rollout time.
      scores: [G, K] completion rewards.
      token_mask: [G, K, T] bool, True on completion tokens (False on padding).
      seq_logp: "sum" (the paper) or "mean" (length-normalised) reduction of the per-token log-probs.
    The options (eta, mask, anchor, projection, alpha, kl_budget, std_floor, std_shrink, is_clip) are
    :func:`tpo_loss`'s; with is_clip the ratios are those of the group-renormalised sequence log-scores.
    """
    lp = as_float("logp", logp)
    group_layout(lp, scores, token_mask, candidate=False)
    check_same_shape(logp=lp, old_logp=old_logp)
    seq = sequence_logp(lp, token_mask, seq_logp, mask=mask)
    old_seq = sequence_logp(as_float("old_logp", old_logp).detach(), token_mask, seq_logp, mask=mask)
    return tpo_loss(seq, old_seq, scores, eta=eta, mask=mask, anchor=anchor, projection=projection, alpha=alpha,
                    kl_budget=kl_budget, std_floor=std_floor, std_shrink=std_shrink, is_clip=is_clip)


def projection_setting(setting: str) -> dict:
    """`tpo_loss` keywords of a projection setting's name, as the open-question experiments sweep them
    (docs/experiments.md §E14): forward_kl (TPO), reverse_kl, js, alpha<α> with α in [0, 1] (e.g. alpha0.5), or
    kl<ε> with ε > 0 (forward KL with the adaptive η of KL budget ε, e.g. kl1)."""
    if setting in ("forward_kl", "reverse_kl", "js"):
        return {"projection": setting}
    for prefix, make in (("alpha", lambda v: {"projection": "alpha", "alpha": v}),
                         ("kl", lambda v: {"eta": "adaptive", "kl_budget": v})):
        if setting.startswith(prefix):
            try:
                value = float(setting[len(prefix):])
            except ValueError:
                break
            # α = 0 or α ≥ 1e-30 (a denormal α divides by ~0: the loss is NaN at step 0); a finite ε (kl<inf>
            # was refused only inside the run)
            if (prefix == "alpha" and not (value == 0 or ALPHA_MIN <= value <= 1)) or (
                    prefix == "kl" and not 0 < value < math.inf):
                break
            return make(value)
    raise ValueError(f"setting {setting!r}: must be forward_kl, reverse_kl, js, alpha<α: 0 or in [{ALPHA_MIN:g}, 1]> "
                     "(e.g. alpha0.5) or kl<finite ε > 0> (adaptive η with KL budget ε, e.g. kl1)")


def projection_key(setting: str) -> tuple:
    """What a projection setting computes, for refusing duplicates: alpha1 is forward_kl and alpha0 is reverse_kl
    exactly (:func:`alpha_projection` computes the two KLs there), alpha0.5 and alpha0.50 are one setting."""
    o = projection_setting(setting)
    if o.get("projection") == "alpha" and o["alpha"] in (0.0, 1.0):
        o = {"projection": "reverse_kl" if o["alpha"] == 0 else "forward_kl"}
    return tuple(sorted(o.items()))


def repeated_projection(settings) -> tuple[str, str] | None:
    """(a setting, the earlier one of `settings` it computes the same as, by :func:`projection_key`), or None."""
    seen: dict[tuple, str] = {}
    for s in settings:
        key = projection_key(s)
        if key in seen:
            return s, seen[key]
        seen[key] = s
    return None


def projection_label(setting: str) -> str:
    """A projection setting's name for tables and legends."""
    o = projection_setting(setting)
    if setting == "forward_kl":
        return "forward KL (TPO)"
    if "alpha" in o:
        return f"α = {o['alpha']:g}"
    if "kl_budget" in o:
        return f"adaptive η, ε = {o['kl_budget']:g}"
    return {"reverse_kl": "reverse KL", "js": "Jensen–Shannon"}[setting]
