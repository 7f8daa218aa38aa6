"""TPO and its baselines as pure functions on tensors.

Every objective takes tensors plus keyword hyperparameters and returns a :class:`LossOutput` with a scalar
``.loss`` and detached ``.metrics``. Nothing here samples, steps an optimizer or reads global state.
"""

from targetpo.objectives._checks import LossOutput
from targetpo.objectives.aggregation import aggregate
from targetpo.objectives.clipped import (
    cispo_loss,
    clip_cov_loss,
    clipped_surrogate,
    dapo_loss,
    dr_grpo_loss,
    dual_clip,
    gmpo_loss,
    grpo_loss,
    gspo_loss,
    k3_kl,
    kl_cov_loss,
    kl_estimate,
    ppo_loss,
    sapo_loss,
)
from targetpo.objectives.conventions import CONVENTIONS
from targetpo.objectives.delightful import delight_gate, dg_loss
from targetpo.objectives.policy_gradient import (
    batch_standardized_pg_loss,
    group_pg_loss,
    importance_weighted_pg_loss,
    reinforce_loss,
    rloo_loss,
)
from targetpo.objectives.registry import Objective, available, get, resolve
from targetpo.objectives.scores import (
    batch_mean_baseline,
    expected_baseline,
    group_advantages,
    rloo_advantages,
    standardize_scores,
    zero_variance_groups,
)
from targetpo.objectives.supervised import ce_loss
from targetpo.objectives.tpo import (
    ALPHA_MIN,
    PROJECTIONS,
    adaptive_eta,
    adaptive_kl_floor,
    alpha_projection,
    corrected_anchor,
    jensen_shannon_projection,
    kl_to_old,
    reverse_kl_projection,
    sequence_logp,
    tpo_loss,
    tpo_sequence_loss,
    tpo_target,
    tpo_token_loss,
    truncated_is_weights,
)

__all__ = [
    "LossOutput", "Objective", "aggregate", "available", "get", "resolve",
    "standardize_scores", "group_advantages", "rloo_advantages", "zero_variance_groups",
    "expected_baseline", "batch_mean_baseline",
    "tpo_target", "tpo_loss", "tpo_token_loss", "tpo_sequence_loss", "sequence_logp",
    "PROJECTIONS", "ALPHA_MIN", "reverse_kl_projection", "jensen_shannon_projection", "alpha_projection", "adaptive_eta",
    "adaptive_kl_floor",
    "kl_to_old", "corrected_anchor", "truncated_is_weights",
    "reinforce_loss", "importance_weighted_pg_loss", "batch_standardized_pg_loss", "rloo_loss", "group_pg_loss",
    "ppo_loss", "grpo_loss", "dr_grpo_loss", "dapo_loss", "gspo_loss", "sapo_loss", "cispo_loss",
    "clip_cov_loss", "kl_cov_loss", "gmpo_loss", "dual_clip", "kl_estimate", "CONVENTIONS",
    "clipped_surrogate", "k3_kl", "dg_loss", "delight_gate", "ce_loss",
]
