"""Within-group score transforms: TPO's standardization and the baselines' advantages.

A group is the last dim of a tensor: K scored candidates for one context. An optional boolean `mask`
(True = valid) excludes candidates (padding, failed generations) from every statistic; masked entries
come back as 0.
"""

from __future__ import annotations

import torch
from torch import Tensor

from targetpo.objectives._checks import as_float, as_mask, check_group_size, checked

# The paper's code treats a group as zero-variance when its population std is at or below this.
ZERO_VARIANCE_STD = 1e-6


def _masked_moments(s: Tensor, mask: Tensor | None) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """Population mean and std over the last dim, counting only valid entries. Returns (mean, std, count, scale).

    Scores with a huge but finite range (|s| ~ 1e20) overflow the squared deviations in float32; then the
    moments are recomputed on scores divided by each group's largest |s| (`scale`, [..., 1], else None) and
    scaled back, and :func:`_centred` divides by the same scale, so u and the advantages stay finite. Ordinary
    scores never take that path, so their numbers are unchanged. Masked entries are zeroed first: a huge score
    there would otherwise overflow its (masked-out) squared deviation to inf, and inf·0 = NaN poisons the group."""
    if mask is not None:
        s = s.masked_fill(~mask, 0.0)
    m = None if mask is None else mask.to(s.dtype)
    n = torch.full_like(s[..., :1], s.shape[-1]) if m is None else m.sum(dim=-1, keepdim=True).clamp_min(1.0)

    def moments(x: Tensor) -> tuple[Tensor, Tensor]:
        if m is None:
            mean = x.mean(dim=-1, keepdim=True)
            return mean, (x - mean).square().mean(dim=-1, keepdim=True)
        mean = (x * m).sum(dim=-1, keepdim=True) / n
        return mean, ((x - mean).square() * m).sum(dim=-1, keepdim=True) / n

    mean, var = moments(s)
    if not torch.isfinite(var).all():
        scale = (s.abs() if m is None else s.abs() * m).amax(dim=-1, keepdim=True).clamp_min(1.0)
        mean_n, var_n = moments(s / scale)
        mean, std = mean_n * scale, var_n.sqrt() * scale
        return mean, std, n, scale
    return mean, var.sqrt(), n, None


def _zero_variance(s: Tensor, mask: Tensor | None, std: Tensor, eps: float) -> Tensor:
    """Bool [..., 1]: groups without signal, the one rule of standardize_scores, group_advantages,
    zero_variance_groups and TPO's frac_zero_var: population std ≤ eps, or valid scores all the same number. The
    std of equal scores is rounding (the mean of K copies of 0.7 is one ulp off, so σ ≈ 6e-8, and ≈ 6e-5 for
    1000.7), which a threshold on σ alone reads as spread once the scores are large or ε = 0."""
    if mask is None:
        low, high = torch.aminmax(s, dim=-1, keepdim=True)  # one pass for both (exact, like amin and amax)
        equal = low == high
    else:
        equal = s.masked_fill(~mask, float("-inf")).amax(dim=-1, keepdim=True) == \
            s.masked_fill(~mask, float("inf")).amin(dim=-1, keepdim=True)
    return (std <= eps) | equal


def _centred(s: Tensor, mean: Tensor, divisor: Tensor, scale: Tensor | None) -> Tensor:
    """(s − s̄)/divisor, formed in units of `scale` when the moments needed it (s − s̄ itself may overflow)."""
    if scale is None:
        return (s - mean) / divisor
    return (s / scale - mean / scale) / (divisor / scale)


def group_scale(std: Tensor, *, std_floor: float = 0.0, std_shrink: float = 0.0) -> Tensor:
    r"""The divisor of a low-variance-robust standardisation (docs/method.md §8):
    max(√(σ² + c²), σ_min) with c = `std_shrink` and σ_min = `std_floor`.

    The floor caps u at |s − s̄|/σ_min, so a group scoring 1, 1, 1, 1.0001 gets u ≈ 0 (q ≈ p_old) instead of the
    full z-scores ±√3 that its rounding-level spread would otherwise buy. The shrinkage acts smoothly: groups
    with σ ≫ c are untouched, groups with σ ≪ c are divided by ≈ c."""
    scale = std if std_shrink == 0 else torch.sqrt(std.square() + std_shrink ** 2)
    return scale if std_floor == 0 else scale.clamp_min(std_floor)


@checked
def standardize_scores(scores: Tensor, mask: Tensor | None = None, *, eps: float = ZERO_VARIANCE_STD,
                       std_floor: float = 0.0, std_shrink: float = 0.0) -> Tensor:
    r"""TPO's within-group standardized scores u (paper App. A; docs/method.md §1).

    .. math::  u_i = (s_i - \bar s) / \sigma \quad\text{if } \sigma > \epsilon, \qquad u_i = s_i - \bar s \text{ otherwise}

    with the *population* std σ (ddof = 0) over the valid candidates of the group. The fallback keeps the
    authors' code exactly: a group whose spread is below ε gets tiny centred scores instead of an exploding
    division. An all-equal group takes the fallback whatever ε (its σ is rounding): its centred scores are one
    number, 0 where float32 holds the mean exactly and the mean's rounding otherwise, so q = p_old.

    Low-variance groups (an option beyond the paper, docs/method.md §8): with `std_floor` = σ_min > 0 and/or
    `std_shrink` = c > 0, u_i = (s_i − s̄) / max(√(σ² + c²), σ_min) for every group (no ε fallback is needed:
    the divisor is at least σ_min or c). Both default to 0, the paper's rule above.

    Args:
      scores: [..., K] candidate scores (rewards). Any positive affine map of a group's scores leaves u unchanged
        (with a floor or shrinkage only maps that keep the scale, since σ_min and c are in the scores' units).
      mask: optional [..., K] bool, True for valid candidates. Masked entries get u = 0.
      std_floor: σ_min >= 0, the smallest group std divided by.
      std_shrink: c >= 0, added in quadrature to the group std.
    Returns:
      u with the shape of `scores`, float32 (or float64 if `scores` is float64).
    """
    s = as_float("scores", scores)
    check_group_size("scores", s, minimum=1)
    mask = as_mask("mask", mask, s)
    return standardized_and_zero_variance(s, mask, eps=eps, std_floor=std_floor, std_shrink=std_shrink)[0]


def standardized_and_zero_variance(s: Tensor, mask: Tensor | None, *, eps: float = ZERO_VARIANCE_STD,
                                   std_floor: float = 0.0, std_shrink: float = 0.0) -> tuple[Tensor, Tensor]:
    """:func:`standardize_scores` on checked float scores, with each group's zero-variance flag [..., 1] beside u:
    the scores, not u, say whether a group has zero variance (docs/method.md §7)."""
    mean, std, _, scale = _masked_moments(s, mask)
    # All-equal scores take the fallback whatever σ's rounding (docs/method.md §1): with ε = 0, or scores ~1000,
    # σ > ε there and every u came out ±1.
    flat = _zero_variance(s, mask, std, eps)
    spread = ~flat
    # With a floor or shrinkage the ε fallback stays: one below ε would otherwise give a near-tie (σ ≤ 1e-6,
    # counted as zero-variance) its full z-scores, the opposite of what the options are for.
    divisor = (std if std_floor == 0 and std_shrink == 0 else
               group_scale(std, std_floor=std_floor, std_shrink=std_shrink)).clamp_min(eps)
    if eps == 0:  # a tie's σ may be exactly 0; its u is the fallback's, so divide by 1 there, not 0
        divisor = torch.where(spread, divisor, torch.ones_like(divisor))
    u = torch.where(spread, _centred(s, mean, divisor, scale), s - mean)
    return (u if mask is None else u.masked_fill(~mask, 0.0)), flat


@checked
def group_advantages(scores: Tensor, mask: Tensor | None = None, *, eps: float = 1e-8, scale: bool = True,
                     std_floor: float = 0.0, std_shrink: float = 0.0, std_ddof: int = 0,
                     singleton: str = "zero") -> Tensor:
    r"""GRPO's group-relative advantages (Shao et al. 2024, DeepSeekMath; docs/method.md §3).

    .. math::  A_i = (s_i - \bar s) / (\sigma + \epsilon)

    with the population std (`std_ddof=0`), as in the paper's code; `std_ddof=1` is the Bessel-corrected std of
    verl's `compute_grpo_outcome_advantage` (`torch.std`) and TRL's `nanstd` (docs/conventions.md). A
    zero-variance group (population std ≤ 1e-6, the rule of :func:`zero_variance_groups`) gives A = 0 exactly,
    also where its equal scores are not exact in float32. `scale=False` returns s_i − s̄ (Dr. GRPO, Liu et al. 2025).
    `std_floor` / `std_shrink` replace σ by max(√(σ² + c²), σ_min) as in :func:`standardize_scores`
    (docs/method.md §8); they need `scale=True`.

    A group with one valid candidate (a `mask` that leaves one) gets A = 0 (`singleton="zero"`), or verl's
    s/(1 + ε) (`singleton="verl"`: verl sets such a group's mean to 0 and std to 1; s unscaled when `scale=False`).
    """
    s = as_float("scores", scores)
    check_group_size("scores", s, minimum=2)
    mask = as_mask("mask", mask, s)
    if not scale and (std_floor or std_shrink):
        raise ValueError(f"std_floor={std_floor!r}/std_shrink={std_shrink!r} change the std that scale=True divides "
                         "by; with scale=False there is no std (leave them at 0)")
    if singleton not in ("zero", "verl"):
        raise ValueError(f"singleton={singleton!r}: must be 'zero' or 'verl'")
    mean, std, n, big = _masked_moments(s, mask)
    # A zero-variance group (population std ≤ ZERO_VARIANCE_STD, as zero_variance_groups and TPO decide it) gets
    # A = 0 exactly. Without this, K equal scores that float32 cannot hold (0.6, 0.7, a partial-credit 3/5) have a
    # mean one ulp off each, so s − s̄ and σ are both ~6e-8 and (s − s̄)/(σ + ε) ≈ ±0.86 for the whole group.
    flat = _zero_variance(s, mask, std, ZERO_VARIANCE_STD)
    if std_ddof == 1:
        # Bessel's correction; a singleton's variance is undefined and taken as 0 (its centred score is 0 anyway).
        std = torch.where(n > 1, std * (n / (n - 1).clamp_min(1.0)).sqrt(), torch.zeros_like(std))
    if scale:
        a = _centred(s, mean, group_scale(std, std_floor=std_floor, std_shrink=std_shrink) + eps, big)
    else:
        a = s - mean
    a = a.masked_fill(flat, 0.0)
    if singleton == "verl":
        a = torch.where(n == 1, s / (1.0 + eps) if scale else s, a)
    return a if mask is None else a.masked_fill(~mask, 0.0)


def rloo_advantages(scores: Tensor, mask: Tensor | None = None) -> Tensor:
    r"""REINFORCE leave-one-out advantages (Kool et al. 2019; Ahmadian et al. 2024).

    .. math::  A_i = s_i - \frac{1}{K-1}\sum_{j\ne i} s_j = \frac{K}{K-1}(s_i - \bar s)

    over the valid candidates; needs at least two valid candidates per group.
    """
    s = as_float("scores", scores)
    check_group_size("scores", s, minimum=2)
    mask = as_mask("mask", mask, s)
    m = torch.ones_like(s) if mask is None else mask.to(s.dtype)
    if mask is not None:  # a huge masked score would make its (masked-out) term ±inf, and inf·0 = NaN
        s = s.masked_fill(~mask, 0.0)
    n = m.sum(dim=-1, keepdim=True)
    if (n < 2).any():
        raise ValueError(f"rloo needs >= 2 valid candidates per group; mask leaves fewer (mask shape {tuple(m.shape)})")
    total = (s * m).sum(dim=-1, keepdim=True)
    return ((s - (total - s) / (n - 1)) * m)


@checked
def zero_variance_groups(scores: Tensor, mask: Tensor | None = None, *, eps: float = ZERO_VARIANCE_STD) -> Tensor:
    """Bool [...]: groups whose valid scores have population std ≤ eps or are all equal (all-fail or all-success
    groups; equal scores whose mean float32 cannot hold exactly have a std of rounding, above eps = 0)."""
    s = as_float("scores", scores)
    mask = as_mask("mask", mask, s)
    _, std, _, _ = _masked_moments(s, mask)
    return _zero_variance(s, mask, std, eps).squeeze(-1)


def expected_baseline(probs: Tensor) -> Tensor:
    r"""The paper's MNIST/REINFORCE expected-reward baseline b = Σ_i π_i² (docs/experiments.md §E3).

    For a reward 1{a = y} with y unknown to the learner, Σπ² is the policy's expected reward if the label were
    drawn from the policy itself; it is stop-gradient and needs no label.
    """
    p = as_float("probs", probs)
    return p.detach().square().sum(dim=-1)


def batch_mean_baseline(rewards: Tensor, dim: int = 0) -> Tensor:
    """Per-position batch-mean baseline b_t = mean_b r_{b,t} (the paper's transformer PPO/DG/REINFORCE, docs/method.md §3)."""
    r = as_float("rewards", rewards)
    if isinstance(dim, bool) or not isinstance(dim, int) or not -r.dim() <= dim < r.dim():
        raise ValueError(f"dim={dim!r}: must be an axis of rewards {tuple(r.shape)}, an integer in [{-r.dim()}, {r.dim()})")
    return r.mean(dim=dim, keepdim=True).expand_as(r)
