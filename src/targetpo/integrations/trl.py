r"""TPO for Hugging Face TRL 1.16.0: ``TargetPOConfig`` and ``TargetPOTrainer`` (subclasses of GRPO's).

Not to be confused with ``trl.experimental.tpo``, which is *Triple Preference Optimization*, a different method.

TPO (Kaddour 2026, arXiv 2604.06159) on a prompt's K completions with rewards r and sequence log-scores ℓ:

.. math::
    u = \frac{r - \bar r}{\sigma_{pop}(r)}, \qquad q_i \propto p^{old}_i\, e^{u_i/\eta}, \qquad
    L = -\sum_i q_i \log \mathrm{softmax}(\ell^\theta)_i \quad\Rightarrow\quad \partial L/\partial \ell^\theta = p_\theta - q,

with ℓ the sum (the paper) or mean of the completion's token log-probs (``seq_logp``). The loss itself is
:func:`targetpo.objectives.tpo_sequence_loss`; this module only feeds it whole groups. What changes w.r.t.
``GRPOTrainer`` (pinned to ``trl==1.16.0``, whose private API this relies on):

1. ``_prepare_inputs`` shuffles the generation batch by *whole groups* (seeded permutation of prompts) before
   splitting it into micro-batches. Stock GRPO shuffles rows, so a prompt's K completions land in different
   micro-batches and no micro-batch can form the group softmax.
2. ``_generate_and_score_completions`` adds two columns to the batch: ``tpo_rewards`` (the raw weighted reward
   sum, exactly as GRPO forms it before normalisation; NaN where every reward function returned None) and
   ``tpo_group`` (a group id per row). They are stashed from ``_calculate_rewards`` rather than recovered
   from ``advantages``: GRPO zeroes the advantage of unscorable completions, which would be indistinguishable
   from a completion at the group mean, and its std is Bessel-corrected. The extra columns travel through
   GRPO's own split/shuffle code like every other tensor.
3. ``_compute_loss`` checks group integrity at run time (consecutive blocks of K rows share one group id),
   computes per-token log-probs, and calls ``tpo_sequence_loss`` on [G, K, T]. Old log-probs are
   ``old_per_token_logps`` when TRL computed them (gradient accumulation not a multiple of
   ``steps_per_generation × num_iterations``, or vLLM importance sampling),
   otherwise the detached current ones (first pass: p_θ = p_old). With ``beta > 0`` it adds GRPO's k3 KL to
   the reference model (in float32; weighted by the ratio π_θ/π_old when ``use_bias_correction_kl``, TRL's
   default, as GRPO does), averaged per sequence over tokens, then over sequences. The loss is divided by
   ``current_gradient_accumulation_steps`` in training, as GRPO's is.

Completions that no reward function could score (NaN reward) and completions with no valid token
(``mask_truncated_completions``) are masked out of their group's softmax; a group with no valid candidate is
dropped from the loss (it counts as 0 in the mean over the micro-batch's groups).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass, field

import torch

from targetpo.runs.data import extra_of, needs_extra

try:
    from accelerate.utils import is_peft_model
    from trl import GRPOConfig, GRPOTrainer
    from trl.trainer.utils import (get_config_model_id, split_pixel_values_by_grid, split_tensor_dict,
                                   unsplit_pixel_values_by_grid)
except ModuleNotFoundError as exc:  # name the extra, not the first of its modules that is missing
    missing, extra = extra_of(exc)
    if extra not in ("llm", "trl"):  # the trl extra brings the llm extra's modules too
        raise
    raise ModuleNotFoundError(needs_extra(__name__, "trl", missing), name=missing) from exc

from targetpo.objectives import get
from targetpo.objectives.clipped import masked_log_ratio
from targetpo.objectives.groups import check_whole_groups, tpo_group_loss

__all__ = ["TargetPOConfig", "TargetPOTrainer", "shuffle_whole_groups", "tpo_group_loss", "IGNORED_GRPO_SETTINGS"]

TPO = get("tpo")  # the registry entry of the objective this adapter trains with

# GRPO settings that only shape GRPO's surrogate loss (clipping, SAPO/VESPO, vLLM importance weights) or its
# extras (entropy bonus); TPO's loss does not read them, so a non-default value would be silently ignored.
# Raise instead.
IGNORED_GRPO_SETTINGS = (
    "loss_type", "epsilon", "epsilon_high", "delta", "importance_sampling_level", "top_entropy_quantile",
    "off_policy_mask_threshold", "entropy_coef", "use_adaptive_entropy",
    "sapo_temperature_neg", "sapo_temperature_pos", "vespo_k_pos", "vespo_lambda_pos", "vespo_k_neg",
    "vespo_lambda_neg", "entropy_coef_min", "entropy_coef_max", "entropy_coef_delta", "entropy_target",
    "vllm_importance_sampling_mode", "vllm_importance_sampling_clip_min", "vllm_importance_sampling_clip_max",
    "vllm_importance_sampling_cap",
)


@dataclass
class TargetPOConfig(GRPOConfig):
    r"""Configuration for :class:`TargetPOTrainer`; every other field is `GRPOConfig`'s.

    Parameters:
        tpo_eta (`float`, defaults to `1.0`):
            Temperature η > 0 of the target q ∝ p_old · exp(u/η); smaller η puts more mass on the best
            completions. The paper uses 1.
        seq_logp (`str`, defaults to `"sum"`):
            How a completion's token log-probs form its group log-score: `"sum"` (the paper: the exact sequence
            log-probability) or `"mean"` (length-normalised). With long completions the group softmax of sums
            is nearly one-hot, the target collapses onto p_old's favourite and updates are tiny; `"mean"` is
            better conditioned there. Measure both.
        scale_rewards (`str`, defaults to `"none"`):
            Must stay `"none"`: TPO standardises the raw rewards within each group itself (population std).

    Validation (`ValueError` naming the setting): `tpo_eta` a finite number > 0, `beta` a finite number >= 0,
    `reward_weights` finite; `per_device_train_batch_size` (and `per_device_eval_batch_size` when evaluating,
    with `num_generations_eval` >= 2) must be a multiple of `num_generations` so every micro-batch holds whole
    groups; GRPO-only settings (`IGNORED_GRPO_SETTINGS`) must keep their defaults;
    `multi_objective_aggregation` must be `"sum_then_normalize"`; the vLLM importance-sampling correction is not
    applied by TPO and must be switched off when `use_vllm=True`.
    """

    tpo_eta: float = field(default=1.0, metadata={"help": "TPO target temperature η > 0 (q ∝ p_old·exp(u/η))."})
    seq_logp: str = field(
        default="sum",
        metadata={"help": "Sequence log-score from token log-probs: 'sum' (the paper) or 'mean' (length-normalised)."},
    )
    scale_rewards: str = field(
        default="none",
        metadata={"help": "Must be 'none': TPO z-scores the raw rewards within each group itself."},
    )

    def __post_init__(self):
        super().__post_init__()
        validate_tpo_config(self)


def _grpo_default(name: str):
    f = next(f for f in dataclasses.fields(GRPOConfig) if f.name == name)
    return f.default if f.default is not dataclasses.MISSING else f.default_factory()


def validate_tpo_config(args) -> None:
    """Raise ValueError for any setting that would silently break TPO (see :class:`TargetPOConfig`)."""
    eta = args.tpo_eta
    if isinstance(eta, bool) or not isinstance(eta, numbers.Real) or not (math.isfinite(eta) and eta > 0):
        raise ValueError(f"tpo_eta must be a finite number > 0 (TPO's temperature η), got {eta!r}")
    if isinstance(args.beta, bool) or not isinstance(args.beta, numbers.Real) or not (
            math.isfinite(args.beta) and args.beta >= 0):
        raise ValueError(f"beta must be a finite number >= 0 (the KL coefficient TPO adds), got {args.beta!r}")
    weights = args.reward_weights
    if weights is not None and not all(
            isinstance(w, numbers.Real) and not isinstance(w, bool) and math.isfinite(w) for w in weights):
        raise ValueError(f"reward_weights must be finite numbers (TPO scores a completion by the weighted sum of its "
                         f"rewards; a NaN weight would silently drop that reward function), got {weights!r}")
    if args.seq_logp not in ("sum", "mean"):
        raise ValueError(f"seq_logp must be 'sum' or 'mean', got {args.seq_logp!r}")
    k = args.num_generations
    if args.num_iterations > 1 and not TPO.multi_epoch_safe:
        raise ValueError(f"num_iterations={args.num_iterations} re-uses each generation batch, which {TPO.name} is not "
                         f"sound for (multi_epoch_safe=False); set num_iterations=1")
    if TPO.needs_groups and args.per_device_train_batch_size % k:
        raise ValueError(
            f"per_device_train_batch_size ({args.per_device_train_batch_size}) must be a multiple of num_generations "
            f"({k}): TPO's loss is a softmax over each prompt's K completions, so every micro-batch must hold whole "
            f"groups."
        )
    if args.do_eval and args.eval_strategy != "no":
        k_eval = args.num_generations_eval or k
        if k_eval < 2:
            raise ValueError(f"num_generations_eval must be >= 2 (TPO's loss is a softmax over each prompt's K "
                             f"completions), got {k_eval}")
        if args.per_device_eval_batch_size % k_eval:
            raise ValueError(
                f"per_device_eval_batch_size ({args.per_device_eval_batch_size}) must be a multiple of "
                f"num_generations_eval ({k_eval}) so every evaluation batch holds whole groups."
            )
    if args.scale_rewards != "none":
        raise ValueError(
            f"scale_rewards={args.scale_rewards!r} has no effect on TPO, which standardises the raw rewards within "
            f"each group (population std); set scale_rewards='none'."
        )
    if args.multi_objective_aggregation != "sum_then_normalize":
        raise ValueError(
            f"multi_objective_aggregation={args.multi_objective_aggregation!r} is not supported: TPO scores a "
            f"completion by the weighted sum of its raw rewards ('sum_then_normalize')."
        )
    for name in IGNORED_GRPO_SETTINGS:
        value, default = getattr(args, name), _grpo_default(name)
        if value != default:
            raise ValueError(
                f"{name}={value!r} only affects GRPO's surrogate loss and is ignored by TPO; leave it at its "
                f"default ({default!r})."
            )
    if args.use_vllm and args.vllm_importance_sampling_correction:
        raise ValueError(
            "vllm_importance_sampling_correction=True is not applied by TPO (its anchor p_old is the training "
            "model's log-prob of each completion); set vllm_importance_sampling_correction=False."
        )


def shuffle_whole_groups(batch: dict, group_size: int, generator: torch.Generator) -> dict:
    """Permute the rows of a generation batch by whole groups of `group_size` consecutive rows.

    Tensors (ndim ≥ 1) and lists are permuted along their first dim; scalars and None pass through, as in TRL's
    ``shuffle_sequence_dict``.
    """
    n = len(next(v for v in batch.values() if v is not None and not (isinstance(v, torch.Tensor) and v.ndim == 0)))
    if n % group_size:
        raise ValueError(f"generation batch has {n} rows, not a multiple of num_generations ({group_size})")
    groups = torch.randperm(n // group_size, generator=generator)
    perm = (groups[:, None] * group_size + torch.arange(group_size)).reshape(-1)

    def permute(v):
        if v is None or (isinstance(v, torch.Tensor) and v.ndim == 0):
            return v
        if isinstance(v, torch.Tensor):
            return v[perm.to(v.device)]
        return [v[i] for i in perm.tolist()]

    return {key: permute(val) for key, val in batch.items()}


def _check_reference_model(model, args: TargetPOConfig, peft_config) -> None:
    """With beta > 0 and no PEFT adapter, GRPOTrainer builds the KL's reference model by loading
    `model.config._name_or_path` again; a model built in memory has none, and the load fails deep in the Hub
    client ("Repo id must use alphanumeric chars ... ''"). Say so, and what to do, before anything is built."""
    if args.beta == 0 or isinstance(model, str) or peft_config is not None:
        return
    if is_peft_model(model):  # accelerate's test, the one GRPOTrainer uses
        return
    if not get_config_model_id(model.config):  # what GRPOTrainer would load the reference from
        raise ValueError(f"beta={args.beta} needs a reference model, which GRPOTrainer loads from "
                         "model.config._name_or_path; this model has none (it was built in memory, not loaded): "
                         "save it with model.save_pretrained(DIR) and pass DIR or the model loaded from it, give "
                         "peft_config= (the adapter switched off is the reference), or set beta=0")


class TargetPOTrainer(GRPOTrainer):
    """GRPOTrainer with TPO's loss on whole groups (see the module docstring for exactly what changes)."""

    _tag_names = ["trl", "targetpo", "tpo"]

    def __init__(self, model, reward_funcs, args: TargetPOConfig | None = None, **kwargs):
        if args is None:
            raise ValueError("TargetPOTrainer needs args=TargetPOConfig(...) (output_dir, batch sizes, η, seq_logp)")
        if not isinstance(args, TargetPOConfig):
            raise ValueError(f"args must be a TargetPOConfig, got {type(args).__name__}")
        validate_tpo_config(args)  # again: a field set after the config was built was never checked
        _check_reference_model(model, args, kwargs.get("peft_config"))
        super().__init__(model, reward_funcs, args=args, **kwargs)
        self._tpo_rewards_per_func = None
        self._tpo_generations = 0  # generation batches produced so far; offsets group ids and seeds the shuffle

    def _group_size(self, mode: str) -> int:
        return self.num_generations if mode == "train" else self.num_generations_eval

    # 1. Whole-group shuffling of the generation batch.
    def _prepare_inputs(self, generation_batch):
        mode = "train" if self.model.training else "eval"
        if mode != "train":  # eval batches are neither shuffled nor split
            return self._generate_and_score_completions(generation_batch)
        generate_every = self.args.steps_per_generation * self.num_iterations
        if self._step % generate_every == 0 or self._buffered_inputs is None:
            batch = self._generate_and_score_completions(generation_batch)
            batch = split_pixel_values_by_grid(batch)
            rng = torch.Generator().manual_seed(self.args.seed * 1_000_003 + self._tpo_generations)
            batch = shuffle_whole_groups(batch, self.num_generations, rng)
            batches = split_tensor_dict(batch, self.args.steps_per_generation)
            self._buffered_inputs = [unsplit_pixel_values_by_grid(b) for b in batches]
        return self._buffered_inputs[self._step % self.args.steps_per_generation]

    # 2. Raw rewards and group ids travel with the batch.
    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._tpo_rewards_per_func = rewards_per_func  # gathered over processes, [N_global, n_funcs]
        return rewards_per_func

    def _generate_and_score_completions(self, inputs):
        self._tpo_rewards_per_func = None
        output = super()._generate_and_score_completions(inputs)
        per_func = self._tpo_rewards_per_func
        if per_func is None:
            raise RuntimeError("GRPOTrainer._calculate_rewards was not called; TRL's internals differ from 1.16.0")
        mode = "train" if self.model.training else "eval"
        k = self._group_size(mode)
        # Same weighted sum GRPO forms before normalising; NaN where every reward function returned None.
        rewards = (per_func * self.reward_weights.to(per_func.device).unsqueeze(0)).nansum(dim=1)
        rewards[torch.isnan(per_func).all(dim=1)] = torch.nan
        n_local = len(inputs)
        start = self.accelerator.process_index * n_local
        if n_local % k:
            raise ValueError(f"generation batch of {n_local} rows is not a multiple of K = {k}; groups would split")
        rows = torch.arange(start, start + n_local, device=rewards.device)
        output["tpo_rewards"] = rewards[start:start + n_local]
        groups_per_batch = per_func.shape[0] // k
        output["tpo_group"] = rows // k + self._tpo_generations * groups_per_batch
        self._tpo_generations += 1
        self._tpo_rewards_per_func = None
        return output

    # 3. The TPO loss on [G, K, T].
    def _compute_loss(self, model, inputs):
        mode = "train" if self.model.training else "eval"
        k = self._group_size(mode)
        check_whole_groups(inputs["tpo_group"], k)

        prompt_ids, prompt_mask = inputs["prompt_ids"], inputs["prompt_mask"]
        completion_ids, completion_mask = inputs["completion_ids"], inputs["completion_mask"]
        input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
        attention_mask = torch.cat([prompt_mask, completion_mask], dim=1)
        mask = completion_mask if "tool_mask" not in inputs else completion_mask * inputs["tool_mask"]
        per_token_logps, entropies, aux_loss = self._get_per_token_logps_and_entropies(
            model,
            input_ids,
            attention_mask,
            completion_ids.size(1),
            compute_entropy=True,
            compute_aux_loss=self.aux_loss_enabled,
            pixel_values=inputs.get("pixel_values"),
            image_grid_thw=inputs.get("image_grid_thw"),
            num_images=inputs.get("num_images"),
            pixel_attention_mask=inputs.get("pixel_attention_mask"),
            spatial_shapes=inputs.get("spatial_shapes"),
            num_tiles=inputs.get("num_tiles"),
            image_sizes=inputs.get("image_sizes"),
            token_type_ids=inputs.get("token_type_ids"),
            mm_token_type_ids=inputs.get("mm_token_type_ids"),
            image_position_ids=inputs.get("image_position_ids"),
        )
        old = inputs.get("old_per_token_logps")
        old = per_token_logps.detach() if old is None else old

        loss, metrics = tpo_group_loss(
            per_token_logps, old, inputs["tpo_rewards"], mask, k,
            seq_logp=self.args.seq_logp, eta=self.args.tpo_eta,
        )
        if self.beta != 0.0:
            logps, ref = per_token_logps.float(), inputs["ref_per_token_logps"].float()  # fp32 for bf16/fp16 models
            valid = mask.bool()  # padding may hold any log-prob: 0 there, so exp() cannot make 0·∞ = NaN
            delta = masked_log_ratio(ref, logps, valid)
            per_token_kl = torch.exp(delta) - delta - 1
            if self.args.use_bias_correction_kl:  # as GRPO (TRL's default): weighted by the ratio π_θ/π_old
                per_token_kl = per_token_kl * torch.exp(masked_log_ratio(logps, old.float(), valid))
            m = mask.to(per_token_kl.dtype)
            seq_kl = (per_token_kl * m).sum(-1) / m.sum(-1).clamp(min=1.0)
            loss = loss + self.beta * seq_kl.mean()
            self._metrics[mode]["kl"].append(self._global_mean((per_token_kl * m).sum(), m.sum()))
        normalizer = self.current_gradient_accumulation_steps if mode == "train" else 1.0
        loss = loss / normalizer
        if self.aux_loss_enabled:
            loss = loss + self.router_aux_loss_coef * aux_loss / normalizer
            self._metrics[mode]["aux_loss"].append(self.accelerator.gather_for_metrics(aux_loss).mean().item())

        m = mask.to(entropies.dtype)
        self._metrics[mode]["entropy"].append(self._global_mean((entropies * m).sum(), m.sum()))
        for name, value in metrics.items():
            self._metrics[mode][f"tpo/{name}"].append(self.accelerator.gather(value.detach().float()).mean().item())
        return loss

    def _global_mean(self, total, count) -> float:
        totals = self.accelerator.reduce(torch.stack([total.detach().float(), count.detach().float()]), reduction="sum")
        return (totals[0] / totals[1].clamp(min=1.0)).item()
