r"""TPO on verl 0.9.1's current trainer: a group-keeping ``tpo_sync`` trainer, the ``tpo`` config section, checks.

verl's current (v1) trainer balances every batch across data-parallel ranks *per sequence*
(``PPOTrainer._balance_batch``: Karmarkar–Karp over single rows), which scatters a prompt's K responses over
several GPUs; TPO's loss is one cross-entropy per group, so that split is fatal (docs/verl.md §2). This module adds:

- :func:`whole_group_order`: the same balancing over *whole groups* (verl's own Karmarkar–Karp partitioner on
  each group's workload), each group one contiguous block; a batch with groups of unequal size is refused.
- ``trainer.v1.trainer_mode=tpo_sync``: verl's synchronous trainer with ``_balance_batch`` replaced by the
  group-level one, and every TPO setting validated when it is constructed (step 0). It is registered with
  verl's ``register_trainer`` by the plugin wherever verl's v1 trainer can be imported.
- :func:`tpo_settings` / :func:`layout_problems`: the ``tpo`` section of verl's Hydra config
  (``+tpo.eta=0.5``; verl's ``AlgoConfig`` and ``PolicyLossConfig`` are closed dataclasses that reject new keys,
  so TPO's settings live in their own top-level section) and the verl settings that would split a group.
- :func:`main` (``python -m targetpo.integrations.verl_trainer``): verl's ``main_ppo`` after validating all of the
  above and handing η to every Ray worker (the loss runs in the workers, which see only ``actor_rollout_ref``).

Everything that runs without a GPU is tested on CPU (tests/integrations/test_verl_trainer.py), the trainer's
balancing and η check on verl's own ``PPOTrainerSync`` with its serving modules stubbed; a training run needs
verl's TransferQueue and GPUs.
"""

from __future__ import annotations

import difflib
import math
import numbers
import sys
from collections.abc import Mapping

from targetpo.integrations.verl_plugin import ETA_ENV, NAME, SEQ_LOGP_BY_LOSS_AGG, register_trainer_if_possible

__all__ = ["TRAINER_MODE", "TPO_DEFAULTS", "IGNORED_BY_TPO_LOSS", "tpo_settings", "uses_tpo", "layout_problems", "check_config",
           "whole_group_order", "balance_whole_groups", "register_tpo_trainer", "export_eta"]

TRAINER_MODE = "tpo_sync"
TPO_DEFAULTS = {"eta": 1.0}  # the `tpo` section of verl's config: key -> default
# actor settings (relative to actor_rollout_ref.actor) that only shape verl's other policy losses, with verl
# 0.9.1's defaults; loss_mode=tpo never reads them, so another value is refused rather than silently ignored.
IGNORED_BY_TPO_LOSS = {
    "clip_ratio": 0.2, "clip_ratio_low": 0.2, "clip_ratio_high": 0.2, "clip_ratio_c": 3.0, "tau_pos": 1.0,
    "tau_neg": 1.05, "policy_loss.clip_cov_ratio": 0.0002, "policy_loss.clip_cov_lb": 1.0,
    "policy_loss.clip_cov_ub": 5.0, "policy_loss.kl_cov_ratio": 0.0002, "policy_loss.ppo_kl_coef": 0.1,
    "policy_loss.dro_beta": None,
}


def tpo_settings(config) -> dict:
    """The validated ``tpo`` section of a verl config (defaults for missing keys).

    Unknown keys are errors naming the nearest valid key; η must be a finite float > 0.
    """
    stray = [key for key in config.keys() if str(key).lower().startswith("tpo") and key != "tpo"]
    if stray:
        near = difflib.get_close_matches(str(stray[0])[4:], list(TPO_DEFAULTS), n=1, cutoff=0.0)[0]
        raise ValueError(f"{stray[0]} is not a verl or TPO setting; TPO's settings live under tpo "
                         f"(did you mean tpo.{near}?)")
    raw = config.get("tpo", None)
    if raw is not None and not isinstance(raw, Mapping):
        raise ValueError(f"tpo={raw!r} must be a section of TPO settings (set η as +tpo.eta=0.5, not +tpo=0.5); "
                         f"valid keys: {sorted(TPO_DEFAULTS)}")
    section = dict(raw or {})
    for key in section:
        if key not in TPO_DEFAULTS:
            near = difflib.get_close_matches(key, list(TPO_DEFAULTS), n=1, cutoff=0.0)
            raise ValueError(f"tpo.{key} is not a TPO setting; did you mean tpo.{near[0]}? "
                             f"Valid keys: {sorted(TPO_DEFAULTS)}")
    out = {**TPO_DEFAULTS, **section}
    try:
        if isinstance(out["eta"], bool):  # float(True) would be η = 1
            raise TypeError
        eta = float(out["eta"])
    except (TypeError, ValueError):
        raise ValueError(f"tpo.eta={out['eta']!r} is not a number; TPO's temperature η must be a float > 0") from None
    if not (math.isfinite(eta) and eta > 0):
        raise ValueError(f"tpo.eta={out['eta']!r}: TPO's temperature η must be finite and > 0")
    out["eta"] = eta
    return out


def uses_tpo(config) -> bool:
    """Whether a verl config selects TPO's advantage estimator or policy loss."""
    loss_mode = config.actor_rollout_ref.actor.policy_loss.get("loss_mode", "vanilla")
    return config.algorithm.adv_estimator == NAME or loss_mode == NAME


def layout_problems(config) -> list[str]:
    """Each verl setting TPO cannot run with (split groups, loss shapes TPO does not have, corrections that are not
    part of it), as ``"key=value: why; set key=..."`` (empty: fine)."""
    from omegaconf import OmegaConf

    actor = config.actor_rollout_ref.actor
    loss_mode = actor.policy_loss.get("loss_mode", "vanilla")
    problems = []

    def bad(msg):
        problems.append(msg)

    def count(key, value, why, minimum=1):
        """`value` as an int >= `minimum`, or None after reporting it (no int() truncation, no division by 0)."""
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
            bad(f"{key}={value}: {why}")
            return None
        return int(value)

    k = count("actor_rollout_ref.rollout.n", config.actor_rollout_ref.rollout.n,
              "TPO needs an integer K >= 2 responses per prompt", minimum=2)

    if loss_mode == NAME and config.algorithm.adv_estimator != NAME:
        bad(f"algorithm.adv_estimator={config.algorithm.adv_estimator}: the tpo loss needs the tpo estimator's "
            f"z-scores; set algorithm.adv_estimator=tpo")
    if config.algorithm.adv_estimator == NAME and config.algorithm.get("norm_adv_by_std_in_grpo", True) is not True:
        bad(f"algorithm.norm_adv_by_std_in_grpo={config.algorithm.norm_adv_by_std_in_grpo}: has no effect on the tpo "
            f"estimator, which z-scores rewards within each group (population std); leave it True")
    if loss_mode == NAME:
        for name, default in IGNORED_BY_TPO_LOSS.items():
            value = OmegaConf.select(actor, name, default=default)
            if value != default:
                bad(f"actor_rollout_ref.actor.{name}={value}: only shapes verl's other policy losses and is ignored "
                    f"by policy_loss.loss_mode=tpo; leave it at verl's default ({default})")
    if loss_mode == NAME and actor.loss_agg_mode not in SEQ_LOGP_BY_LOSS_AGG:
        bad(f"actor_rollout_ref.actor.loss_agg_mode={actor.loss_agg_mode}: no TPO meaning; set it to one of "
            f"{sorted(SEQ_LOGP_BY_LOSS_AGG)}")
    trainer = config.trainer
    if trainer.get("use_v1", True):
        mode = trainer.v1.trainer_mode
        if mode != TRAINER_MODE:
            bad(f"trainer.v1.trainer_mode={mode}: verl's {mode!r} trainer balances rows across GPUs one sequence "
                f"at a time and splits groups; set trainer.v1.trainer_mode={TRAINER_MODE}")
    elif trainer.get("balance_batch", True):
        bad("trainer.balance_batch=True: the legacy trainer's balancing reorders single rows across GPUs; set "
            "trainer.balance_batch=False (or use the current trainer with trainer.v1.trainer_mode=tpo_sync)")
    if actor.get("use_dynamic_bsz", False):
        bad("actor_rollout_ref.actor.use_dynamic_bsz=True: token-packed micro-batches split groups; set it to False")
    if actor.get("shuffle", False):
        bad("actor_rollout_ref.actor.shuffle=True: shuffles single rows inside a mini-batch; set it to False")
    key = "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"
    mbs = count(key, actor.get("ppo_micro_batch_size_per_gpu", None), f"must be a positive multiple of K = rollout.n = {k}")
    if mbs is not None and k is not None and mbs % k:
        bad(f"{key}={mbs}: must be a multiple of K = rollout.n = {k}")
    nodes = count("trainer.nnodes", trainer.nnodes, "must be an integer >= 1")
    gpus = count("trainer.n_gpus_per_node", trainer.n_gpus_per_node, "must be an integer >= 1")
    # verl reads fsdp_config.ulysses_sequence_parallel_size; the actor-level key is deprecated and, when > 1,
    # copied over it (FSDPActorConfig.__post_init__).
    legacy = actor.get("ulysses_sequence_parallel_size", 1) or 1
    sp_key, sp_value = (("actor_rollout_ref.actor.ulysses_sequence_parallel_size", legacy) if legacy != 1 else
                        ("actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size",
                         (actor.get("fsdp_config") or {}).get("ulysses_sequence_parallel_size", 1) or 1))
    sp = count(sp_key, sp_value, "must be an integer >= 1")
    dp = None
    if None not in (nodes, gpus, sp):
        if (nodes * gpus) % sp:
            bad(f"{sp_key}={sp}: must divide the {nodes * gpus} GPUs")
        else:
            dp = nodes * gpus // sp
    mini = count("actor_rollout_ref.actor.ppo_mini_batch_size", actor.ppo_mini_batch_size,
                 "must be an integer >= 1 (prompts per mini-batch)")
    if mini is not None and dp is not None and mini % dp:
        bad(f"actor_rollout_ref.actor.ppo_mini_batch_size={mini} prompts: must be a multiple of the {dp} "
            f"data-parallel ranks so each rank's share of a mini-batch is whole groups")
    prompts = count("data.train_batch_size", config.data.train_batch_size, "must be an integer >= 1 (prompts per step)")
    if prompts is not None and mini is not None and prompts % mini:
        bad(f"data.train_batch_size={prompts}: must be a multiple of actor_rollout_ref.actor.ppo_mini_batch_size="
            f"{mini} (verl would pad the batch with filler rows that form no group)")
    rc = config.algorithm.get("rollout_correction", None) or {}
    if loss_mode == NAME and rc.get("rollout_is", None):
        bad(f"algorithm.rollout_correction.rollout_is={rc.get('rollout_is')}: importance weights are not part of "
            f"TPO; set it to null")
    if loss_mode == NAME and rc.get("rollout_rs", None):
        bad(f"algorithm.rollout_correction.rollout_rs={rc.get('rollout_rs')}: rejection sampling masks tokens or "
            f"responses by the rollout/training mismatch, which changes TPO's sequence log-scores; set it to null")
    if loss_mode == NAME and rc.get("bypass_mode", False):
        bad(f"algorithm.rollout_correction.bypass_mode={rc.get('bypass_mode')}: takes p_old from the rollout engine "
            f"(and verl's legacy trainer swaps in its own bypass loss); TPO's anchor is the training model's "
            f"old_log_prob; set it to false")
    return problems


def check_config(config) -> dict:
    """Raise ValueError listing every problem of a TPO verl config; return the ``tpo`` settings."""
    settings = tpo_settings(config)
    if uses_tpo(config):
        problems = layout_problems(config)
        if problems:
            raise ValueError("TPO cannot run with these verl settings; change them:\n  - "
                             + "\n  - ".join(problems))
    return settings


def whole_group_order(uids, seq_lens, dp_size: int) -> list[list[int]]:
    """Row indices per data-parallel rank, balancing tokens over *whole groups*.

    Rows are gathered by ``uid`` (verl's replay buffer need not return a group's rows adjacent), each group's
    rows kept in their order of arrival; every group must have the same size K >= 2 and the number of groups
    must be a multiple of ``dp_size``. Groups are assigned to ranks by verl's own Karmarkar–Karp partitioner
    (``get_seqlen_balanced_partitions``, equal group counts per rank) on the group's summed workload, as verl's
    group-level balancing for PrefixGrouper does; each rank's rows are its groups, one contiguous block each.
    """
    import torch
    from verl.utils.seqlen_balancing import calculate_workload, get_seqlen_balanced_partitions

    if len(seq_lens) != len(uids):
        raise ValueError(f"seq_lens has {len(seq_lens)} entries but uids has {len(uids)}")
    rows: dict = {}
    for i, uid in enumerate(uids):
        rows.setdefault(uid, []).append(i)
    groups = list(rows.values())
    sizes = sorted({len(g) for g in groups})
    if not groups or len(sizes) != 1 or sizes[0] < 2:
        raise ValueError(f"TPO needs every prompt's K >= 2 responses, the same K for all; got group sizes {sizes} "
                         f"over {len(uids)} rows (a filtered or partial group?)")
    if len(groups) % dp_size:
        raise ValueError(f"{len(groups)} groups cannot be split evenly over dp_size={dp_size} ranks; make "
                         f"data.train_batch_size a multiple of the data-parallel size")
    work = [int(calculate_workload(torch.tensor([int(seq_lens[i]) for i in g])).sum()) for g in groups]
    parts = get_seqlen_balanced_partitions(work, k_partitions=dp_size, equal_size=True)
    return [[i for g in sorted(part) for i in groups[g]] for part in parts]


def balance_whole_groups(batch, dp_size: int, required_multiple: int) -> list[list[int]]:
    """Reorder a v1 trainer batch (verl's ``KVBatchMeta``: ``keys``, ``tags``, ``reorder``) over whole groups.

    Replaces verl's per-row ``PPOTrainer._balance_batch``. A batch verl would pad with filler rows (its size not
    a multiple of `required_multiple`) is refused, and so is a multi-output agent loop (a key's output index
    other than 0). Returns the partitions (indices into the batch before the reorder).
    """
    if len(batch) % required_multiple:
        raise ValueError(f"batch of {len(batch)} rows is not a multiple of {required_multiple}: verl would pad it "
                         f"with filler rows that form no TPO group; make data.train_batch_size a multiple of "
                         f"actor.ppo_mini_batch_size and of the data-parallel size")
    fields = [key.rsplit("_", 2) for key in batch.keys]  # verl's keys: {uid}_{session}_{output index}
    if any(len(f) != 3 or f[2] != "0" for f in fields):
        raise ValueError("TPO scores one response per rollout session; multi-output agent loops are not supported")
    parts = whole_group_order([f[0] for f in fields], [int(tag["seq_len"]) for tag in batch.tags], dp_size)
    batch.reorder([j for part in parts for j in part])
    return parts


def export_eta(config) -> float:
    """Validate the config and put η into Ray's runtime_env so the loss in every worker reads it."""
    from omegaconf import OmegaConf

    eta = check_config(config)["eta"]
    OmegaConf.update(config, f"ray_kwargs.ray_init.runtime_env.env_vars.{ETA_ENV}", repr(eta), force_add=True)
    return eta


def register_tpo_trainer():
    """Register ``trainer.v1.trainer_mode=tpo_sync`` with verl (needs verl's v1 trainer and TransferQueue)."""
    import os

    from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY, register_trainer
    from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
    from verl.utils.seqlen_balancing import log_seqlen_unbalance

    if TRAINER_MODE in TRAINER_REGISTRY:
        return TRAINER_REGISTRY[TRAINER_MODE]

    class TPOTrainerSync(PPOTrainerSync):
        """verl's synchronous trainer; batches are balanced over whole groups, TPO settings checked at step 0."""

        # verl's base class copies config.trainer.v1.trainer_mode ("tpo_sync") into self.trainer_mode and tests it
        # against "sync" (replay buffer, prompt fetching, TransferQueue state in checkpoints): without this the
        # synchronous trainer took verl's async paths.
        trainer_mode = property(lambda self: "sync", lambda self, value: None)

        def __init__(self, config):
            eta = check_config(config)["eta"]
            exported = os.environ.get(ETA_ENV)  # this Ray actor shares the workers' runtime_env
            if uses_tpo(config) and (exported is None or float(exported) != eta):
                raise ValueError(f"tpo.eta={eta} but the Ray workers' {ETA_ENV}={exported}; launch with "
                                 f"python -m targetpo.integrations.verl_trainer so the loss gets tpo.eta")
            super().__init__(config)

        def _balance_batch(self, batch, metrics, logging_prefix="global_seqlen", keep_minibatch=False):
            worker_group = self.actor_rollout_wg
            if "actor" not in worker_group._dispatch_info:
                worker_group._dispatch_info["actor"] = worker_group._query_dispatch_info("actor")
            dp_size = max(worker_group._dispatch_info["actor"]) + 1
            seq_lens = [int(tag["seq_len"]) for tag in batch.tags]  # before the reorder, as `parts` indexes them
            parts = balance_whole_groups(batch, dp_size, self._get_required_batch_multiple(dp_size))
            metrics.update(log_seqlen_unbalance(seqlen_list=seq_lens, partitions=parts, prefix=logging_prefix))
            return batch

    return register_trainer(TRAINER_MODE)(TPOTrainerSync)


PROG = "python -m targetpo.integrations.verl_trainer"  # how its refusals are headed


def main() -> None:
    """verl's ``main_ppo`` entry point, after validating the TPO settings and exporting η to the workers."""
    import os

    import hydra
    import verl.trainer.main_ppo as verl_main

    config_dir = os.path.join(os.path.dirname(verl_main.__file__), "config")

    @hydra.main(config_path=config_dir, config_name="ppo_trainer", version_base=None)
    def _run(config):
        try:
            eta = export_eta(config)
        except ValueError as exc:  # a refused setting: one message and exit 2, not Hydra's traceback (exit 1)
            sys.stderr.write(f"{PROG}: error: {exc}\n")
            sys.exit(2)
        os.environ[ETA_ENV] = repr(eta)
        if config.trainer.get("use_v1", True) and config.trainer.v1.trainer_mode == TRAINER_MODE:
            register_tpo_trainer()  # raises here, before Ray, if verl's v1 trainer cannot be imported
        verl_main.main.__wrapped__(config)

    _run()


# Imported before verl_plugin had registered the trainer (this module imports it above, before
# register_tpo_trainer exists), the plugin leaves the registration to this line.
register_trainer_if_possible()

if __name__ == "__main__":
    main()
