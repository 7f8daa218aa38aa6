r"""TPO for verl 0.9.1: a ``tpo`` advantage estimator and a ``tpo`` policy loss, loaded as a verl plugin.

``pip install targetpo[verl]`` registers this module under the ``verl.plugins`` entry-point group, so
``import verl`` (in the driver and in every Ray worker) imports it, which registers:

- ``algorithm.adv_estimator=tpo``: the within-group population z-score u of each response's summed reward
  (grouped by verl's ``uid``; a zero-variance group gives u = 0), broadcast over the response tokens.
- ``actor_rollout_ref.actor.policy_loss.loss_mode=tpo``: TPO's cross-entropy to the target
  q ∝ p_old · exp(u/η) over each group's K = ``actor.rollout_n`` responses
  (:func:`targetpo.objectives.tpo_sequence_loss`), with p_old from verl's ``old_log_prob``.

The loss sees one micro-batch [N, T] and no group ids, so it *proves* what it can: N is a multiple of K, every
row's advantage is constant over its tokens, and every block of K consecutive rows is a group's z-scores (sums
to 0 with population variance 1, or is all 0). A shuffled, balanced or token-packed micro-batch fails this and
the loss raises ``ValueError``. The check is necessary, not sufficient (K rows from different groups whose
scores happen to have mean 0 and variance 1 pass), so the layout is also kept whole upstream: verl's current
trainer with ``trainer.v1.trainer_mode=tpo_sync`` (:mod:`targetpo.integrations.verl_trainer`, which balances
GPUs over whole groups and refuses at step 0 any setting that splits one), or the legacy trainer with
``trainer.balance_batch=False``. The advantage estimator already refuses a batch whose groups are not contiguous.

Settings (docs/verl.md §3, §4):

- ``actor.loss_agg_mode`` picks the sequence log-score: ``seq-mean-token-sum`` → sum of token log-probs (the
  paper), ``seq-mean-token-mean`` → their mean (length-normalised). Token-level modes (``token-mean``,
  ``token-sum``) and ``seq-mean-token-sum-norm`` have no TPO meaning and are rejected. Across groups the loss is
  always the mean over the groups of verl's global mini-batch (using ``config.global_batch_info``). The same
  mode also aggregates verl's own KL (``use_kl_loss``) and entropy terms, which verl adds to this loss in
  ``workers/utils/losses.py::ppo_loss`` through ``agg_loss``: with ``seq-mean-token-sum`` each response
  contributes the *sum* of its per-token KL (entropy) and the sum is averaged over the global mini-batch's
  responses, so ``kl_loss_coef`` weighs a whole response's KL and the term grows with response length; with
  ``seq-mean-token-mean`` each response contributes its per-token *mean*, so ``kl_loss_coef`` weighs an average
  token's KL, as in verl's default ``token-mean`` up to how responses of different length are weighted.
- η is ``tpo.eta`` in verl's Hydra config (``+tpo.eta=0.5``; verl's ``AlgoConfig`` and ``PolicyLossConfig``
  are closed dataclasses, so TPO's settings have their own top-level section, validated by
  :func:`targetpo.integrations.verl_trainer.tpo_settings`). The loss runs in the Ray workers, which see only
  ``actor_rollout_ref``; ``python -m targetpo.integrations.verl_trainer`` validates ``tpo.eta`` and exports it
  to every worker as ``TARGETPO_TPO_ETA``. The loss refuses to run without it (no default) and rejects a
  ``TARGETPO_*`` variable that looks like a misspelling of it, so a typo cannot silently train with η = 1.
- Rollout-correction importance weights (``rollout_is_weights``) are not part of TPO and are rejected.
"""

from __future__ import annotations

import difflib
import importlib.util
import logging
import math
import os

import numpy as np
import torch

from targetpo.objectives.groups import standardized_block_violations, tpo_group_loss
from targetpo.objectives import standardize_scores
from targetpo.runs.data import extra_of, needs_extra

logger = logging.getLogger(__name__)

try:
    from verl.trainer.ppo import core_algos
except Exception as exc:  # verl swallows plugin import errors at DEBUG level: make this one visible
    logger.warning("targetpo's verl plugin could not import verl.trainer.ppo.core_algos (%s); `tpo` is not "
                   "registered. targetpo needs verl==0.9.1.", exc)
    missing, extra = extra_of(exc)
    if isinstance(exc, ModuleNotFoundError) and extra == "verl":
        raise ModuleNotFoundError(needs_extra(__name__, "verl", missing), name=missing) from exc
    raise

__all__ = ["NAME", "ETA_ENV", "SEQ_LOGP_BY_LOSS_AGG", "compute_tpo_advantage",
           "compute_policy_loss_tpo", "verify_registration", "tpo_eta_from_env"]

NAME = "tpo"
ETA_ENV = "TARGETPO_TPO_ETA"
SEQ_LOGP_BY_LOSS_AGG = {"seq-mean-token-sum": "sum", "seq-mean-token-mean": "mean"}
_TOKEN_CONSTANT_ATOL = 1e-5


def _looks_like_eta_env(key: str) -> bool:
    """A misspelling of ETA_ENV: mentions TPO or ETA, or is within a few edits of it (other TARGETPO_* variables,
    such as the data folders, are left alone)."""
    rest = key.removeprefix("TARGETPO_")
    return "TPO" in rest or "ETA" in rest or difflib.SequenceMatcher(None, key, ETA_ENV).ratio() >= 0.8


def tpo_eta_from_env() -> float:
    """η as exported to this process by ``python -m targetpo.integrations.verl_trainer`` (from ``tpo.eta``).

    Missing, non-numeric, non-finite or non-positive values are errors, and so is a ``TARGETPO_*`` variable
    that looks like a misspelling of it (it would otherwise be ignored).
    """
    for key in sorted(os.environ):
        if key.startswith("TARGETPO_") and key != ETA_ENV and _looks_like_eta_env(key):
            raise ValueError(f"environment variable {key} is not read by targetpo; did you mean {ETA_ENV}? "
                             f"(set η as tpo.eta in the verl config)")
    raw = os.environ.get(ETA_ENV)
    if raw is None:
        raise ValueError(f"TPO's temperature η is not set in this process: set tpo.eta in the verl config and launch "
                         f"with python -m targetpo.integrations.verl_trainer, which exports it as {ETA_ENV} to "
                         f"every Ray worker")
    try:
        eta = float(raw)
    except ValueError:
        raise ValueError(f"{ETA_ENV}={raw!r} is not a number; TPO's temperature η must be a float > 0") from None
    if not (math.isfinite(eta) and eta > 0):
        raise ValueError(f"{ETA_ENV}={raw!r}: TPO's temperature η must be finite and > 0")
    return eta


def compute_tpo_advantage(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index=None,
                          config=None, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
    """TPO's standardized scores u as verl advantages (and returns), [bs, response_length].

    A response's score is its summed token-level reward; u is the population z-score within its ``uid`` group
    (``targetpo.objectives.standardize_scores``). Groups must be contiguous blocks of one size K >= 2, the
    layout the TPO loss needs; otherwise this raises ValueError naming the setting that reorders the batch.
    """
    if index is None:
        raise ValueError("adv_estimator=tpo needs the group ids (verl's non_tensor_batch['uid'])")
    index = np.asarray(index)
    n = token_level_rewards.shape[0]
    if len(index) != n:
        raise ValueError(f"index has {len(index)} entries but token_level_rewards has {n} rows")
    # Contiguous equal-size blocks: a new id starts exactly every K rows and never repeats.
    starts = np.flatnonzero(np.r_[True, index[1:] != index[:-1]])
    sizes = np.diff(np.r_[starts, n])
    k = int(sizes[0])
    if k < 2 or (sizes != k).any() or len(set(index[starts].tolist())) != len(starts):
        raise ValueError(
            f"adv_estimator=tpo needs each prompt's responses as one contiguous block of K >= 2 rows (got block sizes "
            f"{sizes[:8].tolist()}{'...' if len(sizes) > 8 else ''} over {n} rows, {len(set(index.tolist()))} groups). "
            f"Something reordered the batch: use trainer.v1.trainer_mode=tpo_sync (current trainer) or "
            f"trainer.balance_batch=False (legacy trainer)."
        )
    with torch.no_grad():  # in float32 at least: half-precision z-scores fail the loss's whole-group check
        dtype = torch.promote_types(token_level_rewards.dtype, torch.float32)
        scores = token_level_rewards.to(dtype).sum(dim=-1).view(-1, k)
        u = standardize_scores(scores).reshape(-1).to(dtype)
        adv = u[:, None] * response_mask.to(u.dtype)
    return adv, adv


def _row_scores(advantages: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Each row's advantage, checked to be constant over its valid tokens (a sequence-level score)."""
    m = mask.to(advantages.dtype)
    n_tok = m.sum(dim=-1)
    u = (advantages * m).sum(dim=-1) / n_tok.clamp(min=1.0)
    spread = ((advantages - u[:, None]).abs() * m).amax(dim=-1)
    if (spread > _TOKEN_CONSTANT_ATOL * (1 + u.abs())).any():
        row = int(spread.argmax())
        raise ValueError(
            f"policy_loss.loss_mode=tpo needs one score per response, but the advantages of row {row} vary over its "
            f"tokens (spread {float(spread[row]):.3g}); use algorithm.adv_estimator=tpo"
        )
    return u


def compute_policy_loss_tpo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "seq-mean-token-sum",
    config=None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict]:
    """TPO policy loss on one verl micro-batch of whole groups (shapes [N, T]); returns (loss, metrics)."""
    if config is None:
        raise ValueError("policy_loss.loss_mode=tpo needs the actor config (for rollout_n = K)")
    k = int(config.rollout_n)
    if loss_agg_mode not in SEQ_LOGP_BY_LOSS_AGG:
        raise ValueError(
            f"actor.loss_agg_mode={loss_agg_mode!r} has no meaning for TPO, whose loss is one cross-entropy per group; "
            f"use 'seq-mean-token-sum' (sequence log-prob = sum of token log-probs, the paper) or "
            f"'seq-mean-token-mean' (mean of token log-probs)"
        )
    if rollout_is_weights is not None:
        raise ValueError("rollout-correction importance weights are not part of TPO; disable "
                         "algorithm.rollout_correction.rollout_is for policy_loss.loss_mode=tpo")
    n = log_prob.shape[0]
    if k < 2 or n % k:
        raise ValueError(
            f"policy_loss.loss_mode=tpo: micro-batch of {n} responses is not a multiple of K = rollout_n = {k}; set "
            f"actor.ppo_micro_batch_size_per_gpu to a multiple of K and actor.use_dynamic_bsz=False"
        )
    mask = response_mask.bool()
    u = _row_scores(advantages.float(), mask)
    problems = standardized_block_violations(u, k)
    if problems:
        raise ValueError(
            f"policy_loss.loss_mode=tpo needs whole groups: rows [jK, (j+1)K) of every micro-batch must be one "
            f"prompt's K = {k} responses with adv_estimator=tpo scores, but {problems[0]}. The batch was shuffled or "
            f"split below group level: use trainer.v1.trainer_mode=tpo_sync (or trainer.balance_batch=False on the "
            f"legacy trainer), actor.shuffle=False, actor.use_dynamic_bsz=False and micro/mini-batches that are "
            f"multiples of K."
        )
    loss, metrics = tpo_group_loss(log_prob, old_log_prob, u, mask, k,
                                   seq_logp=SEQ_LOGP_BY_LOSS_AGG[loss_agg_mode], eta=tpo_eta_from_env())
    # tpo_group_loss averages over this micro-batch's groups; verl wants this micro-batch's share of the mean over
    # the global mini-batch (summed over micro-batches, averaged over data-parallel ranks).
    info = dict(config.get("global_batch_info", None) or {})
    if info.get("global_batch_size") is not None:
        loss = loss * (n / float(info["global_batch_size"])) * float(info.get("dp_size", 1))
    elif int(info.get("dp_size", 1) or 1) > 1:
        raise ValueError("global_batch_size is required in config.global_batch_info when dp_size > 1")
    out = {f"actor/tpo_{name}": float(v) for name, v in metrics.items()}
    out["actor/ppo_kl"] = float(((old_log_prob - log_prob.detach()) * mask).sum() / mask.sum().clamp(min=1))
    return loss, out


def _register() -> None:
    losses, estimators = core_algos.POLICY_LOSS_REGISTRY, core_algos.ADV_ESTIMATOR_REGISTRY
    ours = f"{__name__}.compute_policy_loss_tpo"
    prev = losses.get(NAME)
    if prev is not None and f"{prev.__module__}.{prev.__qualname__}" != ours:
        logger.warning("verl already has a policy loss named %r (%s.%s); targetpo replaces it", NAME,
                       prev.__module__, prev.__qualname__)
    core_algos.register_policy_loss(NAME)(compute_policy_loss_tpo)
    prev = estimators.get(NAME)
    if prev is not None and prev is not compute_tpo_advantage:
        if f"{prev.__module__}.{prev.__qualname__}" != f"{__name__}.compute_tpo_advantage":
            raise ValueError(f"verl already has an advantage estimator named {NAME!r}: {prev.__module__}.{prev.__qualname__}")
        del estimators[NAME]  # this module imported again (reload): replace our own earlier registration
    core_algos.register_adv_est(NAME)(compute_tpo_advantage)
    register_trainer_if_possible()


def register_trainer_if_possible() -> None:
    """Register the group-keeping trainer (trainer.v1.trainer_mode=tpo_sync). It needs verl's v1 trainer, which
    needs TransferQueue; without it verl cannot run its current trainer at all, so there is nothing to register.
    A failure here must not unregister the loss in the workers; the launcher registers the trainer again in the
    driver and raises there, and verl's get_trainer_cls names the trainers it has."""
    import sys

    trainer = sys.modules.get("targetpo.integrations.verl_trainer")
    if trainer is not None and not hasattr(trainer, "register_tpo_trainer"):
        # verl_trainer imported first: it imports this module before defining register_tpo_trainer, and calls
        # this function again at its end (importing it from here gave a circular-import warning and no trainer).
        return
    if importlib.util.find_spec("transfer_queue") is not None:
        try:
            from targetpo.integrations.verl_trainer import register_tpo_trainer

            register_tpo_trainer()
        except Exception as exc:
            logger.warning("targetpo could not register verl's trainer.v1.trainer_mode=tpo_sync: %r", exc)


def verify_registration() -> None:
    """Raise RuntimeError (and log at WARNING) unless verl's registries resolve ``tpo`` to this module."""
    try:
        ok = (core_algos.get_policy_loss_fn(NAME) is compute_policy_loss_tpo
              and core_algos.get_adv_estimator_fn(NAME) is compute_tpo_advantage)
    except ValueError:
        ok = False
    if not ok:
        msg = (f"targetpo's verl plugin did not register {NAME!r} in verl's policy-loss and advantage-estimator "
               f"registries (verl {getattr(__import__('verl'), '__version__', '?')}; targetpo needs verl==0.9.1)")
        logger.warning(msg)
        raise RuntimeError(msg)


_register()
verify_registration()
