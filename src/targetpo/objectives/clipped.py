r"""Ratio-based objectives: PPO and the GRPO family (GRPO, Dr. GRPO, DAPO, GSPO, SAPO, CISPO).

Conventions. ρ = π_θ/π_old is the importance ratio to the rollout snapshot. Per-candidate inputs `[..., K]`
(sequence log-probs, or a token-level state's K candidate tokens) give one ratio per candidate — the paper's
sequence-level GRPO (docs/method.md §3, §7). Per-token inputs `[G, K, T]` with a `token_mask` give one ratio per
token — the LLM convention. Advantages are constants. Masked candidates (`mask`) and padding tokens
(`token_mask`) contribute nothing.
"""

from __future__ import annotations

import torch
from torch import Tensor

from targetpo.objectives._checks import (
    LossOutput, as_float, as_mask, as_token_mask, check_group_size, check_range, check_same_shape,
    check_token_mask, checked, group_layout,
)
from targetpo.objectives.aggregation import aggregate, aggregate_answers
from targetpo.objectives.conventions import with_convention
from targetpo.objectives.scores import ZERO_VARIANCE_STD, group_advantages, zero_variance_groups


@checked(shapes=("logp", "ref_logp"))
def k3_kl(logp: Tensor, ref_logp: Tensor, *, log_ratio_clip: float | None = 20.0) -> Tensor:
    r"""Schulman's k3 estimator of KL(π_θ ‖ π_ref) per sample: exp(−Δ) + Δ − 1 with Δ = log π_θ − log π_ref.
    Non-negative, exactly 0 (with zero gradient) when the policies agree on the sample. `ref_logp` is a
    constant (detached): only the policy's log-probs receive a gradient."""
    delta = logp - ref_logp.detach()
    if log_ratio_clip is not None:
        delta = delta.clamp(-log_ratio_clip, log_ratio_clip)
    return torch.exp(-delta) + delta - 1.0


KL_ESTIMATORS = ("k1", "k2", "k3", "abs")


@checked(shapes=("logp", "ref_logp"))
def kl_estimate(logp: Tensor, ref_logp: Tensor, *, kl_estimator: str = "k3", log_ratio_clip: float | None = 20.0,
                kl_clip: float | None = None) -> Tensor:
    r"""Per-sample estimators of KL(π_θ ‖ π_ref) from Δ = log π_θ − log π_ref (Schulman 2020, "Approximating
    KL divergence"; verl `kl_penalty_forward`, core_algos.py):

    - "k1": Δ (unbiased, can be negative);  "abs": |Δ|;  "k2": Δ²/2;
    - "k3": e^{−Δ} + Δ − 1 (unbiased, non-negative), with Δ clamped to ±`log_ratio_clip` and the estimate to
      ±`kl_clip` when given (verl clamps at 20 and 10; TRL clamps neither). The clamps apply to k3 only, as in verl.
    """
    if kl_estimator not in KL_ESTIMATORS:
        raise ValueError(f"kl_estimator={kl_estimator!r}: must be one of {KL_ESTIMATORS}")
    delta = logp - ref_logp.detach()  # the reference is a constant, as in k3_kl
    if kl_estimator == "k1":
        return delta
    if kl_estimator == "abs":
        return delta.abs()
    if kl_estimator == "k2":
        return 0.5 * delta.square()
    kl = k3_kl(logp, ref_logp, log_ratio_clip=log_ratio_clip)
    return kl if kl_clip is None else kl.clamp(-kl_clip, kl_clip)


def masked_log_ratio(logp: Tensor, old_logp: Tensor, valid: Tensor | None) -> Tensor:
    """log π_θ − log π_old, set to 0 where `valid` is False. Padding tokens and masked candidates may hold any
    finite log-prob (the input checks refuse NaN and ±inf everywhere); exp() of their difference can overflow, and the zero gradient of a masked-out term times an infinite
    ratio is NaN (0·∞), which would poison the whole update."""
    delta = logp - old_logp
    return delta if valid is None else torch.where(valid, delta, torch.zeros_like(delta))


class _RatioExp(torch.autograd.Function):
    """exp(x) whose backward is 0 wherever the incoming gradient is 0, instead of 0·exp(x), which is NaN where
    exp(x) overflowed. An unclamped log-ratio above ~88 (float32) makes ρ = ∞; on a clipped, flat branch its
    true gradient is 0, and autograd's 0·∞ would otherwise poison the whole update."""

    generate_vmap_rule = True  # torch.func transforms (vmap, grad) work through it like through torch.exp

    @staticmethod
    def forward(x: Tensor) -> Tensor:
        return torch.exp(x)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        ctx.save_for_backward(output)

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:
        (y,) = ctx.saved_tensors
        return torch.where(grad == 0, grad, grad * y)  # a NaN coming from upstream still passes


def ratio_exp(log_ratio: Tensor) -> Tensor:
    """ρ = exp(log ρ), the same value bit for bit, with a zero gradient wherever ρ's gradient is zero even when ρ
    is infinite (:class:`_RatioExp`); a nonzero gradient on an infinite ρ stays infinite, as the math says."""
    return _RatioExp.apply(log_ratio)


def importance_ratio(logp: Tensor, old_logp: Tensor, valid: Tensor | None, log_ratio_clip: float | None) -> Tensor:
    """ρ = exp(log π_θ − log π_old), with the log-ratio 0 where `valid` is False (:func:`masked_log_ratio`) and
    clamped to ±`log_ratio_clip` when given (:func:`ratio_exp`: finite gradients on flat branches at any ρ)."""
    delta = masked_log_ratio(logp, old_logp, valid)
    return ratio_exp(delta if log_ratio_clip is None else delta.clamp(-log_ratio_clip, log_ratio_clip))


@checked(shapes=("ratio", "adv"), may_overflow=("ratio",))
def clipped_surrogate(ratio: Tensor, adv: Tensor, eps_low: float, eps_high: float) -> Tensor:
    """PPO's pessimistic surrogate min(ρA, clip(ρ, 1−ε_low, 1+ε_high)A) (Schulman et al. 2017), computed as
    A·min(ρ, 1+ε_high) for A ≥ 0 and A·max(ρ, 1−ε_low) for A < 0: the same values (rounding is monotone), the
    exact gradient (A inside the clip range, 0 beyond it, where min() of two rounded products could tie and pass
    half), and 0 rather than 0·∞ = NaN for A = 0 at an infinite ρ. `ratio` and `adv` have one shape (expand a
    per-sequence A over its tokens first: nothing is broadcast). `adv` is a constant (detached); `ratio` may be
    +inf (an overflowed exp(log ρ)), not NaN."""
    adv = adv.detach()
    return adv * torch.where(adv >= 0, ratio.clamp_max(1.0 + eps_high), ratio.clamp_min(1.0 - eps_low))


@checked(shapes=("surrogate", "adv"), may_overflow=("surrogate",))
def dual_clip(surrogate: Tensor, adv: Tensor, c: float | None) -> Tensor:
    r"""Dual-clip PPO (Ye et al. 2020, arXiv 1912.09729; verl `compute_policy_loss_vanilla`, core_algos.py):
    for A < 0 the surrogate is bounded below by c·A, max(min(ρA, clip(ρ)A), cA), so a huge ratio on a bad
    action cannot give an unbounded loss. `c=None` leaves the surrogate as it is. `adv` is a constant (detached)."""
    if c is None:
        return surrogate
    return torch.where(adv < 0, torch.maximum(surrogate, c * adv.detach()), surrogate)


def _clip_fraction(ratio: Tensor, adv: Tensor, eps_low: float, eps_high: float, valid: Tensor | None) -> Tensor:
    active = ((ratio > 1.0 + eps_high) & (adv > 0)) | ((ratio < 1.0 - eps_low) & (adv < 0))
    if valid is None:
        return active.to(ratio.dtype).mean()
    return (active & valid).to(ratio.dtype).sum() / valid.to(ratio.dtype).sum().clamp_min(1.0)


@with_convention("ppo", per_token_only=("loss_agg",))
@checked
def ppo_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    *,
    clip_eps: float = 0.2,
    clip_eps_high: float | None = None,
    token_mask: Tensor | None = None,
    loss_agg: str | None = None,
    dual_clip_c: float | None = None,
    log_ratio_clip: float | None = None,
) -> LossOutput:
    r"""PPO's clipped surrogate (Schulman et al. 2017), no value loss or entropy bonus:
    L = −agg(min(ρA, clip(ρ, 1−ε, 1+ε)A)), ρ = exp(log π_θ − log π_old) (unclamped, as the paper's code).

    `[B]` single actions (default agg "mean") or `[B, H]` per-token with A_{b,t} (default "sum-mean": Σ_t,
    mean_b, the paper's transformer PPO, docs/method.md §3). `dual_clip_c` bounds the loss of A < 0 at −cA
    (dual-clip PPO, :func:`dual_clip`); `log_ratio_clip` clamps log ρ to ±that value (verl clamps at 20);
    `convention="verl"` sets both and token-mean aggregation (docs/conventions.md)."""
    lp = as_float("logp", logp)
    old = as_float("old_logp", old_logp).detach()
    a = as_float("advantages", advantages).detach()
    check_same_shape(logp=lp, old_logp=old, advantages=a)
    check_token_mask(token_mask, lp)
    hi = clip_eps if clip_eps_high is None else clip_eps_high
    valid = None if token_mask is None else token_mask.bool()
    ratio = importance_ratio(lp, old, valid, log_ratio_clip)
    per = -dual_clip(clipped_surrogate(ratio, a, clip_eps, hi), a, dual_clip_c)
    loss = aggregate_answers(per, loss_agg, token_mask=token_mask)
    with torch.no_grad():
        metrics = {
            "clip_frac": _clip_fraction(ratio, a, clip_eps, hi, valid),
            "approx_kl": (k3_kl(old, lp.detach()) if valid is None else k3_kl(old, lp.detach())[valid]).mean(),
            "ratio_mean": ratio.mean() if valid is None else ratio[valid].mean(),
        }
    return LossOutput(loss, metrics)


@with_convention("grpo", per_token_only=("loss_agg",))
@checked
def grpo_loss(
    logp: Tensor,
    old_logp: Tensor,
    scores: Tensor,
    *,
    clip_eps: float = 0.2,
    clip_eps_high: float | None = None,
    beta: float = 0.04,
    ref_logp: Tensor | None = None,
    token_mask: Tensor | None = None,
    mask: Tensor | None = None,
    mask_zero_var: bool = False,
    scale_advantages: bool = True,
    adv_eps: float = 1e-8,
    loss_agg: str | None = None,
    norm_len: float | None = None,
    log_ratio_clip: float | None = 20.0,
    std_ddof: int = 0,
    singleton: str = "zero",
    dual_clip_c: float | None = None,
    kl_estimator: str = "k3",
    kl_clip: float | None = None,
    std_floor: float = 0.0,
    std_shrink: float = 0.0,
) -> LossOutput:
    r"""GRPO (Shao et al. 2024, DeepSeekMath) with the paper's conventions (docs/method.md §3).

    .. math::
        A_i = \frac{s_i - \bar s}{\sigma_s + \epsilon},\quad
        \Delta = \mathrm{clip}(\log\pi_\theta - \log\pi_{old}, \pm 20),\quad \rho = e^{\Delta},\\
        L = -\mathrm{agg}\big(\min(\rho A, \mathrm{clip}(\rho, 1-\epsilon, 1+\epsilon) A) - \beta\,\mathrm{k3}(\log\pi_\theta, \log\pi_{ref})\big)

    Args:
      logp / old_logp: `[..., K]` per-candidate log-probs (the paper's sequence-level GRPO: one ratio per
        completion, summed log-probs; or token-level GRPO_token over K candidate tokens), or `[G, K, T]`
        per-token log-probs (LLM GRPO: one ratio per token).
      scores: `[..., K]` rewards.
      beta: k3 KL weight. The KL is to `ref_logp` when given (a frozen reference), else to the rollout
        snapshot `old_logp` (the paper's code; then it is exactly 0 in the first epoch). β = 0 is "GRPO no-KL".
      mask_zero_var: the paper's "GRPO masked" (docs/experiments.md §E9): drop zero-variance groups and normalise by the number
        of informative groups instead of all groups.
      scale_advantages: False gives Dr. GRPO's unscaled s − s̄.
      std_floor, std_shrink: low-variance groups' std floor σ_min and shrinkage c, σ → max(√(σ² + c²), σ_min)
        (:func:`group_advantages`, docs/method.md §8); 0 = the paper's advantages.
      loss_agg: default "sum-mean" for per-candidate inputs (Σ_K, mean over groups: the paper) and
        "seq-mean-token-mean" for per-token inputs (the original GRPO); see `aggregation`.
      norm_len: the constant length of loss_agg="seq-mean-token-sum-norm" (Dr. GRPO; default the padded T);
        the other modes have no length to set and do not read it.

    Engine conventions (docs/conventions.md; `convention="verl"` or `"trl"` sets them, explicit flags win):
      std_ddof: 0 = population std (the paper), 1 = Bessel (verl, TRL). adv_eps: ε added to the std
        (1e-8 here, 1e-6 verl, 1e-4 TRL). singleton: a one-candidate group's advantage ("zero" or "verl").
      dual_clip_c: dual-clip bound c for A < 0 (verl: 3.0, always on). log_ratio_clip: |log ρ| clamp for the
        ratio and k3 (20 here and in verl, None in TRL). kl_estimator: "k3" (default), "k1", "k2" or "abs"
        (:func:`kl_estimate`); kl_clip: clamp of the k3 estimate (verl: 10).
    """
    if kl_estimator not in KL_ESTIMATORS:
        raise ValueError(f"kl_estimator={kl_estimator!r}: must be one of {KL_ESTIMATORS}")
    if ref_logp is not None and beta == 0.0:
        raise ValueError("ref_logp is only used by the KL term, which beta=0 turns off; pass beta > 0 or drop ref_logp")
    lp = as_float("logp", logp)
    old = as_float("old_logp", old_logp).detach()
    s = as_float("scores", scores).detach()
    check_same_shape(logp=lp, old_logp=old, ref_logp=ref_logp)
    check_group_size("scores", s)
    per_token = group_layout(lp, s, token_mask)
    mask = as_mask("mask", mask, s)
    adv = group_advantages(s, mask, eps=adv_eps, scale=scale_advantages, std_ddof=std_ddof, singleton=singleton,
                           std_floor=std_floor, std_shrink=std_shrink)
    valid = torch.ones_like(s, dtype=torch.bool) if mask is None else mask
    candidates = valid  # the metrics' denominator: masked candidates hold A = 0 and are no samples
    informative = ~zero_variance_groups(s, mask, eps=ZERO_VARIANCE_STD)
    if mask_zero_var:
        valid = valid & informative.unsqueeze(-1)
    if per_token:
        tm = as_token_mask(token_mask, lp, mask) & valid.unsqueeze(-1)
        adv_b = adv.unsqueeze(-1).expand_as(lp)  # a view: the same values per token, no silent broadcast
    else:
        tm, adv_b = valid, adv
    hi = clip_eps if clip_eps_high is None else clip_eps_high
    ratio = importance_ratio(lp, old, tm, log_ratio_clip)
    per = -dual_clip(clipped_surrogate(ratio, adv_b, clip_eps, hi), adv_b, dual_clip_c)
    kl = None
    if beta != 0.0:
        ref = old if ref_logp is None else as_float("ref_logp", ref_logp).detach()
        lp_kl = torch.where(tm, lp, ref)  # Δ = 0 on masked entries, whatever log-probs they hold (masked_log_ratio)
        if kl_estimator == "k3" and kl_clip is None:
            kl = k3_kl(lp_kl, ref, log_ratio_clip=log_ratio_clip)
        else:
            kl = kl_estimate(lp_kl, ref, kl_estimator=kl_estimator, log_ratio_clip=log_ratio_clip, kl_clip=kl_clip)
        per = per + beta * kl
    mode = loss_agg if loss_agg is not None else ("seq-mean-token-mean" if per_token else "sum-mean")
    per = torch.where(tm, per, torch.zeros_like(per))
    # Per candidate, "mean" is over the valid candidates only (masked or dropped ones do not dilute it).
    rows = tm if per_token or mask is not None or mask_zero_var else None
    loss = aggregate(per, mode, token_mask=rows, per_token=per_token, norm_len=norm_len)
    if mask_zero_var and mode == "sum-mean":
        # Normalise by informative groups, not all groups (the paper's grpo_masked). The other modes already
        # count only the valid tokens, sequences or candidates, which leave the dropped groups out.
        n_groups = informative.numel()
        loss = loss * n_groups / informative.sum().clamp_min(1).to(loss.dtype)
    with torch.no_grad():
        metrics = {
            "clip_frac": _clip_fraction(ratio, adv_b.expand_as(ratio), clip_eps, hi, tm),
            "frac_zero_var": (~informative).to(loss.dtype).mean(),
            "adv_abs_mean": adv.abs()[candidates].mean(),
        }
        if kl is not None:
            metrics["kl"] = kl[tm].mean() if tm.any() else kl.new_zeros(())
    return LossOutput(loss, metrics)


@checked
def dr_grpo_loss(logp: Tensor, old_logp: Tensor, scores: Tensor, *, beta: float = 0.0, norm_len: float | None = None,
                 **kwargs) -> LossOutput:
    r"""Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training"): GRPO without the two biases —
    advantages s − s̄ (no std division) and per-sequence token *sums* divided by a constant length
    (`norm_len`, default the padded T) instead of each sequence's own length. Per-token inputs `[G, K, T]`.
    Every other `grpo_loss` keyword passes through, `convention=` included (TRL's loss_type "dr_grpo" with
    scale_rewards="none" is `convention="trl", norm_len=max_completion_length`)."""
    group_layout(logp, scores, kwargs.get("token_mask"), candidate=False)
    if "scale_advantages" in kwargs:
        raise ValueError(f"scale_advantages={kwargs['scale_advantages']!r}: dr_grpo_loss fixes scale_advantages=False "
                         "(Dr. GRPO's unscaled advantages); call grpo_loss to choose it")
    kwargs.setdefault("loss_agg", "seq-mean-token-sum-norm")
    return grpo_loss(logp, old_logp, scores, beta=beta, scale_advantages=False, norm_len=norm_len, **kwargs)


@checked
def dapo_loss(logp: Tensor, old_logp: Tensor, scores: Tensor, *, clip_eps: float = 0.2, clip_eps_high: float = 0.28,
              **kwargs) -> LossOutput:
    r"""DAPO (Yu et al. 2025): GRPO with decoupled clip-higher (ε_low = 0.2, ε_high = 0.28), token-level
    aggregation ("token-mean": every token of the batch weighs the same) and no KL. Dynamic sampling (dropping
    zero-variance groups) is a data step; `mask_zero_var=True` gives its effect on a fixed batch. Every other
    `grpo_loss` keyword passes through, `convention=` included."""
    group_layout(logp, scores, kwargs.get("token_mask"), candidate=False)
    kwargs.setdefault("loss_agg", "token-mean")
    kwargs.setdefault("beta", 0.0)
    return grpo_loss(logp, old_logp, scores, clip_eps=clip_eps, clip_eps_high=clip_eps_high, **kwargs)


def _per_token_inputs(logp, old_logp, scores, token_mask, mask, adv_eps, std_ddof=0, singleton="zero"):
    """Checked per-token inputs of GSPO/SAPO/CISPO: (logp, old_logp, valid-token mask, group advantages [G, K])."""
    lp = as_float("logp", logp)
    old = as_float("old_logp", old_logp).detach()
    s = as_float("scores", scores).detach()
    check_same_shape(logp=lp, old_logp=old)
    check_group_size("scores", s)
    group_layout(lp, s, token_mask, candidate=False)
    mask = as_mask("mask", mask, s)
    tm = as_token_mask(token_mask, lp, mask)
    if mask is not None:
        tm = tm & mask.unsqueeze(-1)
    return lp, old, tm, group_advantages(s, mask, eps=adv_eps, std_ddof=std_ddof, singleton=singleton)


@with_convention("gspo")
@checked
def gspo_loss(
    logp: Tensor,
    old_logp: Tensor,
    scores: Tensor,
    *,
    clip_eps: float = 3e-4,
    clip_eps_high: float = 4e-4,
    token_mask: Tensor | None = None,
    mask: Tensor | None = None,
    adv_eps: float = 1e-8,
    loss_agg: str | None = None,
    log_ratio_clip: float | None = 20.0,
    log_ratio_max: float | None = None,
    std_ddof: int = 0,
    singleton: str = "zero",
) -> LossOutput:
    r"""GSPO (Zheng et al. 2025, Group Sequence Policy Optimization): one length-normalised *sequence* ratio
    s_i = exp(mean_t (log π_θ − log π_old)) per completion, clipped at the sequence level:
    L = −mean_i min(s_i A_i, clip(s_i, 1−ε_low, 1+ε_high) A_i), with GRPO's group advantages.
    The paper's clip range is tiny (3e-4, 4e-4) because s_i is a geometric mean of token ratios.

    `loss_agg=None` averages over sequences (the paper). A token mode (e.g. verl's and TRL's "token-mean") uses
    the engines' token form s_{i,t} = sg[s_i]·π_θ(y_t)/sg[π_θ(y_t)] — same value as s_i, the gradient of each
    token weighted by the aggregation (verl `compute_policy_loss_gspo`). log s is clamped to ±`log_ratio_clip`
    (20 here, None in verl and TRL) and above at `log_ratio_max` (10 in verl). docs/conventions.md."""
    lp, old, tm, adv = _per_token_inputs(logp, old_logp, scores, token_mask, mask, adv_eps, std_ddof, singleton)
    n_tok = tm.sum(dim=-1).clamp_min(1).to(lp.dtype)
    mean_delta = masked_log_ratio(lp, old, tm).sum(dim=-1) / n_tok
    valid = tm.any(dim=-1)
    if loss_agg is None:
        log_s = mean_delta
    else:
        log_s = lp - lp.detach() + mean_delta.detach().unsqueeze(-1)
    if log_ratio_clip is not None:
        log_s = log_s.clamp(-log_ratio_clip, log_ratio_clip)
    if log_ratio_max is not None:
        log_s = log_s.clamp(max=log_ratio_max)
    if loss_agg is None:
        ratio = ratio_exp(log_s)
        per = -clipped_surrogate(ratio, adv, clip_eps, clip_eps_high)
        loss = torch.where(valid, per, torch.zeros_like(per)).sum() / valid.sum().clamp_min(1)
    else:
        per = -clipped_surrogate(ratio_exp(log_s), adv.unsqueeze(-1).expand_as(log_s), clip_eps, clip_eps_high)
        loss = aggregate(per, loss_agg, token_mask=tm, per_token=True)
        ratio = torch.exp(log_s.detach()[..., 0])
    with torch.no_grad():
        metrics = {"clip_frac": _clip_fraction(ratio, adv, clip_eps, clip_eps_high, valid), "ratio_mean": ratio[valid].mean()}
    return LossOutput(loss, metrics)


@with_convention("sapo")
@checked
def sapo_loss(
    logp: Tensor,
    old_logp: Tensor,
    scores: Tensor,
    *,
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
    token_mask: Tensor | None = None,
    mask: Tensor | None = None,
    loss_agg: str = "token-mean",
    adv_eps: float = 1e-8,
    log_ratio_clip: float | None = 20.0,
    std_ddof: int = 0,
    singleton: str = "zero",
) -> LossOutput:
    r"""SAPO (Gao et al. 2025, Soft Adaptive Policy Optimization, arXiv 2511.20347): hard clipping replaced by a
    smooth gate, L = −agg(f_τ(ρ)·A) with f_τ(ρ) = σ(τ(ρ − 1))·4/τ, τ = τ_pos if A > 0 else τ_neg.
    f'_τ(1) = 1, so on-policy it is exactly the policy gradient; far off-policy tokens are softly damped.
    verl and TRL aggregate by "seq-mean-token-mean"; TRL does not clamp log ρ (`log_ratio_clip=None`)."""
    lp, old, tm, adv = _per_token_inputs(logp, old_logp, scores, token_mask, mask, adv_eps, std_ddof, singleton)
    adv = adv.unsqueeze(-1)
    ratio = importance_ratio(lp, old, tm, log_ratio_clip)
    tau = torch.where(adv > 0, torch.full_like(adv, tau_pos), torch.full_like(adv, tau_neg))
    gate = torch.sigmoid(tau * (ratio - 1.0)) * 4.0 / tau
    loss = aggregate(-gate * adv, loss_agg, token_mask=tm, per_token=True)
    return LossOutput(loss, {"gate_mean": gate.detach()[tm].mean()})


@with_convention("cispo")
@checked
def cispo_loss(
    logp: Tensor,
    old_logp: Tensor,
    scores: Tensor,
    *,
    ratio_min: float = 0.0,
    ratio_max: float = 5.0,
    token_mask: Tensor | None = None,
    mask: Tensor | None = None,
    loss_agg: str = "token-mean",
    adv_eps: float = 1e-8,
    log_ratio_clip: float | None = 20.0,
    std_ddof: int = 0,
    singleton: str = "zero",
) -> LossOutput:
    r"""CISPO (MiniMax 2025, MiniMax-M1): clip the importance *weight*, never the gradient of a token:
    L = −agg(sg[clip(ρ, ratio_min, ratio_max)]·A·log π_θ). Every token keeps a gradient, unlike PPO-style
    clipping which zeroes it outside the trust region. The default has no lower bound (as in MiniMax-M1, and TRL
    with ε_high = 5); verl bounds the weight to [1 − ε_low, 1 + ε_high] = [0.8, 1.2] by default."""
    check_range("ratio_min", ratio_min, "ratio_max", ratio_max)
    lp, old, tm, adv = _per_token_inputs(logp, old_logp, scores, token_mask, mask, adv_eps, std_ddof, singleton)
    adv = adv.unsqueeze(-1)
    ratio = importance_ratio(lp.detach(), old, tm, log_ratio_clip)
    w = ratio.clamp(ratio_min, ratio_max)
    loss = aggregate(-w * adv * lp, loss_agg, token_mask=tm, per_token=True)
    return LossOutput(loss, {"clip_frac": ((ratio > ratio_max) | (ratio < ratio_min))[tm].to(ratio.dtype).mean()})


# ----------------------------------------------------------------------------- objectives verl has (docs/conventions.md)

def _token_advantages(tm: Tensor, adv: Tensor) -> Tensor:
    """Per-token advantages [..., K, T]: the candidate's A on its valid tokens, 0 on padding (as verl's)."""
    return torch.where(tm, adv.unsqueeze(-1), torch.zeros_like(tm, dtype=adv.dtype))


def _masked_mean(x: Tensor, m: Tensor) -> Tensor:
    # verl's masked_mean (utils/torch_functional.py): Σ m·x / (Σ m + 1e-8)
    return torch.where(m, x, torch.zeros_like(x)).sum() / (m.sum() + 1e-8)


@with_convention("verl_only")
@checked
def clip_cov_loss(
    logp: Tensor,
    old_logp: Tensor,
    scores: Tensor,
    *,
    clip_eps: float = 0.2,
    clip_eps_high: float | None = None,
    clip_cov_ratio: float = 0.0002,
    clip_cov_lb: float = 1.0,
    clip_cov_ub: float = 5.0,
    token_mask: Tensor | None = None,
    mask: Tensor | None = None,
    loss_agg: str = "token-mean",
    adv_eps: float = 1e-8,
    std_ddof: int = 0,
    singleton: str = "zero",
    generator: torch.Generator | None = None,
) -> LossOutput:
    r"""Clip-Cov (Cui et al. 2025, "The Entropy Mechanism of RL for Reasoning LMs", arXiv 2505.22617; verl
    `compute_policy_loss_clip_cov`, core_algos.py): PPO's clipped surrogate, except that a random
    `clip_cov_ratio` fraction of the tokens whose centred covariance

    .. math::  \mathrm{cov}_t = (A_t - \bar A)(\log\pi_\theta(y_t) - \overline{\log\pi_\theta})

    lies in (`clip_cov_lb`, `clip_cov_ub`) (and which PPO did not already clip) get no gradient — the tokens that
    drive entropy collapse. At least one token is detached. The pick draws `torch.randperm` from `generator`
    (the global generator when None, which is what verl does, so seeding it reproduces verl's pick).
    """
    check_range("clip_cov_lb", clip_cov_lb, "clip_cov_ub", clip_cov_ub, strict=True)  # (lb, ub) is open
    lp, old, tm, adv = _per_token_inputs(logp, old_logp, scores, token_mask, mask, adv_eps, std_ddof, singleton)
    hi = clip_eps if clip_eps_high is None else clip_eps_high
    a = _token_advantages(tm, adv)
    ratio = ratio_exp(masked_log_ratio(lp, old, tm))
    with torch.no_grad():
        # verl's two branches, for which tokens PPO clipped (a NaN from A = 0 at ρ = ∞ compares False, as in verl).
        pg1, pg2 = -a * ratio.detach(), -a * ratio.detach().clamp(1.0 - clip_eps, 1.0 + hi)
        cov = (a - _masked_mean(a, tm)) * (lp - _masked_mean(lp, tm))
        eligible = tm & ~(pg2 > pg1) & (cov > clip_cov_lb) & (cov < clip_cov_ub)
        idx = torch.nonzero(eligible.reshape(-1, lp.shape[-1]))
        n_clip = max(int(clip_cov_ratio * tm.sum().item()), 1)
        corr = torch.ones_like(lp).reshape(-1, lp.shape[-1])
        if idx.shape[0] > 0:
            pick = idx[torch.randperm(idx.shape[0], generator=generator)[:min(n_clip, idx.shape[0])]]
            corr[pick[:, 0], pick[:, 1]] = 0.0
        corr = corr.reshape(lp.shape)
    # max(pg1, pg2)·corr (verl) as −clipped_surrogate, the same values, and a detached token set to 0 rather than
    # multiplied by 0 (∞·0 = NaN at an overflowed ρ).
    per = torch.where(corr == 0, torch.zeros_like(ratio), -clipped_surrogate(ratio, a, clip_eps, hi))
    loss = aggregate(per, loss_agg, token_mask=tm, per_token=True)
    with torch.no_grad():
        metrics = {"cov_clip_frac": (corr == 0)[tm].to(ratio.dtype).mean(),
                   "clip_frac": (pg2 > pg1)[tm].to(ratio.dtype).mean()}
    return LossOutput(loss, metrics)


@with_convention("verl_only")
@checked
def kl_cov_loss(
    logp: Tensor,
    old_logp: Tensor,
    scores: Tensor,
    *,
    kl_cov_ratio: float = 0.0002,
    ppo_kl_coef: float = 1.0,
    token_mask: Tensor | None = None,
    mask: Tensor | None = None,
    loss_agg: str = "token-mean",
    adv_eps: float = 1e-8,
    std_ddof: int = 0,
    singleton: str = "zero",
) -> LossOutput:
    r"""KL-Cov (Cui et al. 2025, arXiv 2505.22617; verl `compute_policy_loss_kl_cov`, core_algos.py): the
    unclipped surrogate −ρA on every token, plus a penalty `ppo_kl_coef`·|log ρ| on the `kl_cov_ratio` fraction
    (at least one) of valid tokens with the largest covariance (A_t − Ā)(log π_θ(y_t) − mean log π_θ):

    .. math::  \ell_t = -\rho_t A_t + \mathbb 1[t \in \mathrm{top}_k(\mathrm{cov})]\,c\,|\log\rho_t|

    `ppo_kl_coef` defaults to 1 (the paper; verl's `PolicyLossConfig` default is 0.1 and its loss falls back to 1
    only when the field is None)."""
    lp, old, tm, adv = _per_token_inputs(logp, old_logp, scores, token_mask, mask, adv_eps, std_ddof, singleton)
    a = _token_advantages(tm, adv)
    delta = masked_log_ratio(lp, old, tm)
    # A = 0 contributes 0 (not 0·∞ = NaN at an overflowed ρ); A ≠ 0 keeps −Aρ, ±∞ there as the math says.
    per = torch.where(a == 0, torch.zeros_like(delta), -a * ratio_exp(delta))
    with torch.no_grad():
        flat_valid = tm.reshape(-1).nonzero(as_tuple=True)[0]
        av, lv = a.reshape(-1)[flat_valid], lp.detach().reshape(-1)[flat_valid]
        cov = (av - av.mean()) * (lv - lv.mean())
        k = max(1, int(cov.numel() * kl_cov_ratio))
        penalised = torch.zeros(lp.numel(), dtype=torch.bool, device=lp.device)
        penalised[flat_valid[torch.topk(cov, k, largest=True).indices]] = True
        penalised = penalised.reshape(lp.shape)
    per = torch.where(penalised, per + ppo_kl_coef * delta.abs(), per)
    loss = aggregate(per, loss_agg, token_mask=tm, per_token=True)
    return LossOutput(loss, {"kl_cov_frac": penalised[tm].to(per.dtype).mean(), "abs_kl": delta.detach().abs()[tm].mean()})


@with_convention("verl_only")
@checked
def gmpo_loss(
    logp: Tensor,
    old_logp: Tensor,
    scores: Tensor,
    *,
    clip_eps: float = 0.4,
    clip_eps_high: float | None = None,
    token_mask: Tensor | None = None,
    mask: Tensor | None = None,
    adv_eps: float = 1e-8,
    std_ddof: int = 0,
    singleton: str = "zero",
) -> LossOutput:
    r"""GMPO (Zhao et al. 2025, Geometric-Mean Policy Optimization, arXiv 2507.20673; verl
    `compute_policy_loss_geo_mean`, core_algos.py): the *geometric* mean of the token ratios, each clipped in
    log space on the pessimistic side:

    .. math::
        \tilde\Delta_t = \mathrm{sgn}(A)\min(\mathrm{sgn}(A)\Delta_t, \mathrm{sgn}(A)\,\mathrm{clip}(\Delta_t, -\epsilon_{low}, \epsilon_{high})),\quad
        L = -\mathrm{mean}_i\; A_i \exp\Big(\tfrac{1}{|y_i| + 10^{-8}}\sum_t \tilde\Delta_t\Big)

    with Δ_t = log π_θ − log π_old (unclamped) and A_i averaged over the tokens (A_i·|y_i|/(|y_i| + 10⁻⁸), as
    verl). The paper's range is ε = 0.4 in log space (verl passes its `clip_ratio`, default 0.2). Sequences of
    masked candidates are left out of the mean."""
    lp, old, tm, adv = _per_token_inputs(logp, old_logp, scores, token_mask, mask, adv_eps, std_ddof, singleton)
    hi = clip_eps if clip_eps_high is None else clip_eps_high
    a = _token_advantages(tm, adv)
    delta = lp - old
    sgn = torch.sign(a)
    clipped = sgn * torch.minimum(sgn * delta, sgn * delta.clamp(-clip_eps, hi))
    m = tm.to(lp.dtype)
    n = m.sum(dim=-1)
    ratio = torch.exp((clipped * m).sum(dim=-1) / (n + 1e-8))
    a_seq = (a * m).sum(dim=-1) / (n + 1e-8)
    valid = tm.any(dim=-1)
    per = -a_seq * ratio
    loss = torch.where(valid, per, torch.zeros_like(per)).sum() / valid.sum().clamp_min(1)
    with torch.no_grad():
        was_clipped = (delta != delta.clamp(-clip_eps, hi)) & tm
        metrics = {"clip_frac": was_clipped.to(ratio.dtype).sum() / tm.sum().clamp_min(1), "ratio_mean": ratio[valid].mean()}
    return LossOutput(loss, metrics)
