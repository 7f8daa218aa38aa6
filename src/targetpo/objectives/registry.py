"""Name → objective, with what a caller needs to know to use it safely."""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from typing import Callable

from targetpo.objectives import clipped, delightful, policy_gradient, supervised, tpo


@dataclass(frozen=True)
class Objective:
    """One registered objective and what a caller needs to know to run it soundly.

    Experiments, the LLM trainer and the library adapters read these fields rather than keeping their own lists:
    `needs_groups` decides whether a caller must lay out K >= 2 candidates per context, `multi_epoch_safe`
    whether it may step several times on one batch, `per_token_fn` which function takes an LLM batch.
    """

    name: str
    fn: Callable
    needs_groups: bool        # needs K >= 2 candidates per context laid out on the last dim
    multi_epoch_safe: bool    # sound to re-use a batch for several epochs (targets/ratios frozen at rollout)
    level: str                # "group" [.., K] | "token-candidates" | "sequence" [G, K, T] | "single" [B] or [B, H]
    source: str               # where the equation comes from
    summary: str
    # The form that takes per-token log-probs logp/old_logp [G, K, T], scores [G, K] and token_mask=[G, K, T]
    # (what an LLM trainer calls); a "sequence" objective is its own; None when the objective has no such form.
    per_token_fn: Callable | None = None
    # The per-token form's default loss is a mean over all valid tokens of the batch (DAPO's "token-mean"), not
    # over sequences or groups, so gradient accumulation must weight micro-batches by their token counts.
    token_mean: bool = False

    def __post_init__(self):
        if self.per_token_fn is None and self.level == "sequence":
            object.__setattr__(self, "per_token_fn", self.fn)


_REGISTRY: dict[str, Objective] = {}


def _fixed(name: str, fn: Callable, **fixed) -> Callable:
    """`fn` with keywords fixed, as functools.partial, except that a call passing one of them with another value
    is refused: a partial would let `grpo_no_kl` run with β = 0.04 or `tpo_reverse_kl` with projection="js"."""
    base = functools.partial(fn, **fixed)

    @functools.wraps(fn)
    def call(*args, **kwargs):
        clash = {k: v for k, v in kwargs.items() if k in fixed and v != fixed[k]}
        if clash:
            k, v = next(iter(clash.items()))
            raise ValueError(f"{k}={v!r}: the objective {name!r} fixes {k}={fixed[k]!r}; call "
                             f"{fn.__module__}.{fn.__name__} to choose it")
        return base(*args, **kwargs)

    call.__signature__ = inspect.signature(base)
    call.keywords = dict(fixed)  # what it fixes, under functools.partial's name (the token engine reads it)
    return call


def _register(*objs: Objective) -> None:
    for o in objs:
        _REGISTRY[o.name] = o


_register(
    Objective("tpo", tpo.tpo_loss, True, True, "group", "Kaddour 2026 §2; docs/method.md §2",
              "cross-entropy to q ∝ p_old·exp(u/η) over the group", per_token_fn=tpo.tpo_sequence_loss),
    Objective("tpo_no_anchor", _fixed("tpo_no_anchor", tpo.tpo_loss, anchor=False), True, True, "group",
              "Kaddour 2026 §3.7 (ablation)", "TPO with q = softmax(u/η), no p_old anchor",
              per_token_fn=_fixed("tpo_no_anchor", tpo.tpo_sequence_loss, anchor=False)),
    Objective("tpo_token", tpo.tpo_token_loss, True, True, "token-candidates", "Kaddour 2026 §3.4; docs/method.md §7",
              "TPO where each prefix state's group is K candidate next tokens"),
    Objective("tpo_sequence", tpo.tpo_sequence_loss, True, True, "sequence", "Kaddour 2026 §3.6/§3.8",
              "TPO on per-token log-probs [G,K,T] reduced by sum or mean"),
    # Options beyond the paper (its §6 open questions; docs/method.md §8): other projections onto the same target.
    Objective("tpo_reverse_kl", _fixed("tpo_reverse_kl", tpo.tpo_loss, projection="reverse_kl"), True, True, "group",
              "LPO, arXiv 2605.06139; docs/method.md §8", "TPO's target fitted by reverse KL(p_θ ‖ q)",
              per_token_fn=_fixed("tpo_reverse_kl", tpo.tpo_sequence_loss, projection="reverse_kl")),
    Objective("tpo_js", _fixed("tpo_js", tpo.tpo_loss, projection="js"), True, True, "group", "docs/method.md §8",
              "TPO's target fitted by Jensen–Shannon divergence",
              per_token_fn=_fixed("tpo_js", tpo.tpo_sequence_loss, projection="js")),
    # α = ½ is the midpoint of the α-family between reverse (0) and forward (1) KL: 4 × squared Hellinger distance.
    Objective("tpo_hellinger", _fixed("tpo_hellinger", tpo.tpo_loss, projection="alpha", alpha=0.5), True, True, "group",
              "docs/method.md §8", "TPO's target fitted by the α = ½ divergence 2·Σ(√q − √p_θ)²",
              per_token_fn=_fixed("tpo_hellinger", tpo.tpo_sequence_loss, projection="alpha", alpha=0.5)),
    Objective("reinforce", policy_gradient.reinforce_loss, False, False, "single", "Williams 1992",
              "−A·log π with a caller-chosen baseline"),
    Objective("pg_is", policy_gradient.importance_weighted_pg_loss, False, True, "single", "Precup et al. 2000",
              "policy gradient with an unclipped importance ratio to the behaviour policy"),
    Objective("rloo", policy_gradient.rloo_loss, True, False, "group", "Kool et al. 2019; Ahmadian et al. 2024",
              "REINFORCE with a leave-one-out group baseline"),
    Objective("group_pg", policy_gradient.group_pg_loss, True, False, "group", "Kaddour 2026 §3.7 (ablation)",
              "−Σ_i u_i log π(y_i), not renormalised over the group"),
    Objective("grpo_single", policy_gradient.batch_standardized_pg_loss, False, False, "single",
              "Kaddour 2026 §3.3 (MNIST 'GRPO')", "REINFORCE with batch-standardized rewards"),
    Objective("ppo", clipped.ppo_loss, False, True, "single", "Schulman et al. 2017", "clipped surrogate"),
    Objective("grpo", clipped.grpo_loss, True, True, "group", "Shao et al. 2024; docs/method.md §3",
              "clipped surrogate with group z-scored advantages + β·k3 KL", per_token_fn=clipped.grpo_loss),
    Objective("grpo_no_kl", _fixed("grpo_no_kl", clipped.grpo_loss, beta=0.0), True, True, "group",
              "Kaddour 2026 §3.6", "GRPO with β = 0", per_token_fn=_fixed("grpo_no_kl", clipped.grpo_loss, beta=0.0)),
    Objective("grpo_masked", _fixed("grpo_masked", clipped.grpo_loss, mask_zero_var=True), True, True,
              "group", "Kaddour 2026 §4.2", "GRPO that drops zero-variance groups",
              per_token_fn=_fixed("grpo_masked", clipped.grpo_loss, mask_zero_var=True)),
    Objective("dr_grpo", clipped.dr_grpo_loss, True, True, "sequence", "Liu et al. 2025",
              "GRPO without std scaling and with constant-length token sums"),
    Objective("dapo", clipped.dapo_loss, True, True, "sequence", "Yu et al. 2025",
              "clip-higher, token-mean aggregation, no KL", token_mean=True),
    Objective("gspo", clipped.gspo_loss, True, True, "sequence", "Zheng et al. 2025",
              "sequence-level length-normalised ratio and clipping"),
    Objective("sapo", clipped.sapo_loss, True, True, "sequence", "Gao et al. 2025", "soft sigmoid gate instead of clip",
              token_mean=True),
    Objective("cispo", clipped.cispo_loss, True, True, "sequence", "MiniMax 2025 (MiniMax-M1)",
              "clipped, detached importance weight on every token's log-prob",
              token_mean=True),
    # Engine losses targetpo had not (verl 0.9.1 core_algos.py; docs/conventions.md).
    Objective("ppo_dual_clip", _fixed("ppo_dual_clip", clipped.ppo_loss, dual_clip_c=3.0), False, True, "single",
              "Ye et al. 2020 (arXiv 1912.09729); verl compute_policy_loss_vanilla",
              "clipped surrogate whose loss for A < 0 is capped at −c·A (c = 3)"),
    Objective("clip_cov", clipped.clip_cov_loss, True, True, "sequence", "Cui et al. 2025; verl clip_cov",
              "PPO clip plus detaching a few high-covariance tokens", token_mean=True),
    Objective("kl_cov", clipped.kl_cov_loss, True, True, "sequence", "Cui et al. 2025; verl kl_cov",
              "−ρA with a |log ρ| penalty on the highest-covariance tokens", token_mean=True),
    Objective("gmpo", clipped.gmpo_loss, True, True, "sequence", "Zhao et al. 2025; verl geo_mean",
              "geometric mean of log-clipped token ratios per sequence"),
    Objective("dg", delightful.dg_loss, False, False, "single", "Osband 2026; docs/method.md §3",
              "policy gradient gated by σ(A·surprisal/η); one epoch"),
    Objective("ce", supervised.ce_loss, False, True, "single", "supervised oracle", "cross-entropy to the true label"),
)


def get(name: str) -> Objective:
    """The registered objective called `name` (see :func:`available`)."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown objective {name!r}; available: {', '.join(available())}") from None


def available() -> list[str]:
    return sorted(_REGISTRY)


def resolve(method: str, aliases: dict[str, str]) -> Objective:
    """The objective behind an experiment's method name: `aliases[method]` when the experiment names it
    differently (e.g. MNIST's "pg" is "reinforce"), else the method name itself."""
    return get(aliases.get(method, method))
