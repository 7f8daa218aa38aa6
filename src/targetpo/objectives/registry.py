"""Name → objective, with what a caller needs to know to use it safely."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Callable

from targetpo.objectives import clipped, delightful, policy_gradient, supervised, tpo


@dataclass(frozen=True)
class Objective:
    name: str
    fn: Callable
    needs_groups: bool        # needs K >= 2 candidates per context laid out on the last dim
    multi_epoch_safe: bool    # sound to re-use a batch for several epochs (targets/ratios frozen at rollout)
    level: str                # "group" [.., K] | "token-candidates" | "sequence" [G, K, T] | "single" [B] or [B, H]
    source: str               # where the equation comes from
    summary: str


_REGISTRY: dict[str, Objective] = {}


def _register(*objs: Objective) -> None:
    for o in objs:
        _REGISTRY[o.name] = o


_register(
    Objective("tpo", tpo.tpo_loss, True, True, "group", "Kaddour 2026 §2; docs/method.md §2",
              "cross-entropy to q ∝ p_old·exp(u/η) over the group"),
    Objective("tpo_no_anchor", partial(tpo.tpo_loss, anchor=False), True, True, "group",
              "Kaddour 2026 §3.7 (ablation)", "TPO with q = softmax(u/η), no p_old anchor"),
    Objective("tpo_token", tpo.tpo_token_loss, True, True, "token-candidates", "Kaddour 2026 §3.4; docs/method.md §7",
              "TPO where each prefix state's group is K candidate next tokens"),
    Objective("tpo_sequence", tpo.tpo_sequence_loss, True, True, "sequence", "Kaddour 2026 §3.6/§3.8",
              "TPO on per-token log-probs [G,K,T] reduced by sum or mean"),
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
              "clipped surrogate with group z-scored advantages + β·k3 KL"),
    Objective("grpo_no_kl", partial(clipped.grpo_loss, beta=0.0), True, True, "group",
              "Kaddour 2026 §3.6", "GRPO with β = 0"),
    Objective("grpo_masked", partial(clipped.grpo_loss, mask_zero_var=True), True, True,
              "group", "Kaddour 2026 §4.2", "GRPO that drops zero-variance groups"),
    Objective("dr_grpo", clipped.dr_grpo_loss, True, True, "sequence", "Liu et al. 2025",
              "GRPO without std scaling and with constant-length token sums"),
    Objective("dapo", clipped.dapo_loss, True, True, "sequence", "Yu et al. 2025",
              "clip-higher, token-mean aggregation, no KL"),
    Objective("gspo", clipped.gspo_loss, True, True, "sequence", "Zheng et al. 2025",
              "sequence-level length-normalised ratio and clipping"),
    Objective("sapo", clipped.sapo_loss, True, True, "sequence", "Gao et al. 2025", "soft sigmoid gate instead of clip"),
    Objective("cispo", clipped.cispo_loss, True, True, "sequence", "MiniMax 2025 (MiniMax-M1)",
              "clipped, detached importance weight on every token's log-prob"),
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
