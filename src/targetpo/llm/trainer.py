"""A single-process RLVR trainer for any Hugging Face causal LM: TPO or a GRPO-family baseline on verifiable
rewards.

One step t:
  1. rollout: B prompts from the training pool (drawn from a generator seeded by (seed, t)), K completions each,
     sampled at temperature T (``generate``, pure sampling); rewards from the task's verifier; per-token
     log-probs from a no-grad forward (:func:`~targetpo.llm.rollout.token_logprobs`, the path the update
     differentiates, on the first epoch's own micro-batches: the same rows, order and padding trim, so the first
     update has ratio exactly 1 and TPO's p_θ = p_old, in bf16 too); optional log-probs of a frozen reference.
  2. update: μ epochs over the batch. Each epoch shuffles whole groups, splits them into `updates_per_epoch`
     mini-batches (one AdamW step each) and each mini-batch into micro-batches of `micro_batch_size` rows
     (a multiple of K: groups are never split, and every micro-batch is checked). Micro-batch losses are
     weighted so their gradients add up to the mini-batch loss's gradient exactly (see :func:`micro_weight`),
     for every objective whose loss is a sum over sequences or tokens. Clip-Cov and KL-Cov pick the tokens they
     treat specially by a covariance rank within the batch they see, so with micro-batches they pick per
     micro-batch (as verl, which computes the policy loss per micro-batch, does) and the update depends on the
     micro-batching.
  3. metrics: mean reward, accuracy (reward = 1), fraction of zero-variance groups, the objective's metrics
     (`obj_*`; TPO: target entropy, KL(q‖p_θ)) from the first epoch, loss, completion length, grad norm, wall
     time; greedy held-out accuracy every `eval_every` steps. With micro-batches an `obj_*` metric is the
     average of the micro-batches' values weighted as their losses are (share of sequences, or of tokens for
     token-mean objectives): a group fraction of DAPO, or a token fraction such as GRPO's `obj_clip_frac`, can
     then differ slightly from the whole mini-batch's; the top-level `frac_zero_var` is always exact.

The loss is ``objective(logp [G, K, T], old_logp, rewards [G, K], token_mask) + β·KL`` with the objective from
:mod:`targetpo.objectives` (never re-implemented here) and β·KL = β · mean over sequences of the per-token mean
of k3(log π_θ, log π_ref) against a frozen reference (the base weights; with LoRA, the adapter switched off). The
KL term is the same for every objective, so paired runs differ only in the policy loss (the paper's App. G).

Checkpoints hold the trainable parameters, the optimizer state, the step and the RNG state; rollouts are seeded
per step, so a run resumed from a checkpoint reproduces the uninterrupted run exactly.
"""

from __future__ import annotations

import copy
import functools
import inspect
import logging
import math
import os
import random
import time
import warnings
from contextlib import contextmanager
from dataclasses import field
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from torch import Tensor

from targetpo import objectives as obj
from targetpo.objectives.groups import check_whole_groups
from targetpo.objectives.scores import zero_variance_groups
from targetpo.llm.logprobs import DEFAULT_CHUNK_TOKENS
from targetpo.llm.warmstart import FULL_LOGITS_MAX_BYTES
from targetpo.llm.rollout import (
    SAMPLERS,
    Rollout,
    decode_completions,
    group_micro_batches,
    group_rows,
    sample,
    token_logprobs,
    token_micro_batches,
    used_columns,
)
from targetpo.runs.config import ETA_MIN, Validated, config, config_fields, param

logger = logging.getLogger(__name__)

# Objectives the trainer can call: the registry's group objectives with a per-token [G, K, T] form.
OBJECTIVES = tuple(n for n in obj.available() if obj.get(n).needs_groups and obj.get(n).per_token_fn is not None)
# Objectives whose η `eta_length_ref` may scale per group: TPO and its no-anchor ablation (a numeric η).
LENGTH_SCALED_ETA = tuple(n for n in ("tpo", "tpo_no_anchor") if n in OBJECTIVES)


# Trainer fields only some objectives read: passed to the objective's per-token form when it takes them
# (:func:`objective_options`).
OBJECTIVE_FIELDS = ("eta", "seq_logp")


@functools.lru_cache(maxsize=None)
def per_token_keywords(objective: str) -> frozenset[str]:
    """The keywords `objective`'s per-token form takes: which trainer settings it is passed."""
    return frozenset(inspect.signature(obj.get(objective).per_token_fn).parameters)


def objective_fields(objective: str) -> set[str]:
    """The OBJECTIVE_FIELDS that `objective`'s per-token form takes."""
    return set(OBJECTIVE_FIELDS) & per_token_keywords(objective)


@config
class TrainerConfig(Validated):
    """Every setting of :class:`RLVRTrainer`, declared once (the `rlvr` experiment extends this)."""

    objective: str = param("tpo", "a group objective of targetpo.objectives with a per-token form",
                           choices=OBJECTIVES)
    seq_logp: str = param("sum", "TPO's sequence log-score: sum of token log-probs (the paper) or mean "
                          "(length-normalised)", choices=("sum", "mean"))
    eta: float = param(1.0, "TPO target temperature η", ge=ETA_MIN)
    eta_length_ref: float = param(0.0, "TPO with seq_logp=sum: per group, η_g = η·L_ref/L̄_g with L̄_g the group's "
                                  "mean completion length in tokens, so the score tilt u/η_g grows with length as "
                                  "the sum log-score does (docs/experiments.md §E19); 0 = off, one η", ge=0, le=1e6)
    objective_options: dict = field(default_factory=dict, metadata={
        "help": "extra keyword arguments of the objective, e.g. {\"clip_eps\": 0.2} (Python API only)"})
    k: int = param(8, "completions per prompt (K)", ge=2)
    batch_prompts: int = param(8, "prompts per step (B); a step samples B·K completions", ge=1)
    epochs: int = param(1, "μ, passes over each rollout batch (targets and old log-probs stay frozen)", ge=1)
    updates_per_epoch: int = param(1, "AdamW steps per epoch (whole-group mini-batches; must divide B)", ge=1)
    micro_batch_size: int = param(0, "rows per forward/backward, a multiple of k (0 = whole mini-batch); gradients "
                                  "accumulate", ge=0)
    micro_batch_tokens: int = param(0, "instead of micro_batch_size: micro-batches of whole groups of at most this "
                                    "many padded tokens, padding trimmed (0 = off)", ge=0)
    gradient_checkpointing: bool = param(False, "recompute decoder-layer activations in backward (less memory, "
                                         "~1 more forward; dropout stays off)")
    chunk_tokens: int = param(DEFAULT_CHUNK_TOKENS, "log-probs put this many tokens at a time through the LM head, "
                              "recomputed in backward, so one [chunk, vocabulary] fp32 buffer exists at a time "
                              f"(targetpo.llm.logprobs; the warm start too, once its logits pass "
                              f"{FULL_LOGITS_MAX_BYTES // 2**20} MiB); 0 = the model's full logits", ge=0)
    # Upper bounds where a larger value can only overflow the weights (AdamW on lr·wd ≥ 1 flips their sign).
    lr: float = param(1e-5, "RL AdamW learning rate", gt=0, le=1)
    weight_decay: float = param(0.0, "AdamW weight decay", ge=0, le=100)
    adam_betas: tuple[float, float] = param((0.9, 0.999), "AdamW (β1, β2)", ge=0, lt=1)
    max_grad_norm: float = param(1.0, "gradient clipping by global norm (0 = off)", ge=0)
    kl_coef: float = param(0.0, "β of the k3 KL to the frozen starting model (0 = off, no reference is kept)", ge=0)
    temperature: float = param(1.0, "sampling temperature (log-probs use the same); below 1e-3 logits/T overflow",
                               ge=1e-3, le=1e3)
    max_new_tokens: int = param(32, "completion length limit", ge=1)
    sampler: str = param("generate", "how rollouts and greedy evaluations are drawn: generate (Hugging Face "
                         "generate, any causal LM) or kv_loop (the model's KV-cached forward in a plain loop: the "
                         "same tokens under one seed, faster for tiny models)", choices=SAMPLERS)
    eval_every: int = param(0, "held-out evaluation every N RL steps (and before and after training; 0 = only "
                            "then)", ge=0)
    eval_batch: int = param(64, "prompts per held-out generation batch", ge=1)
    checkpoint_every: int = param(0, "save a resumable trainer checkpoint every N steps (0 = never)", ge=0)
    seed: int = param(0, "seeds prompt draws, sampling and epoch shuffles (a step's randomness depends on "
                      "(seed, step) only)", ge=0)

    def check(self) -> None:
        fields = config_fields(TrainerConfig)
        for name in set(OBJECTIVE_FIELDS) - objective_fields(self.objective):  # never passed, so never silently set
            if getattr(self, name) != fields[name].default:
                raise ValueError(f"{name}={getattr(self, name)!r}: objective {self.objective!r} does not read it (its "
                                 f"per-token form takes no {name}); leave it at {fields[name].default!r}")
        if self.epochs > 1 and not obj.get(self.objective).multi_epoch_safe:
            raise ValueError(f"epochs={self.epochs}: {self.objective} is not sound on a re-used batch "
                             f"(targetpo.objectives registry: multi_epoch_safe=False); use epochs=1")
        if self.batch_prompts % self.updates_per_epoch:
            raise ValueError(f"updates_per_epoch={self.updates_per_epoch} must divide batch_prompts="
                             f"{self.batch_prompts} (mini-batches hold whole groups)")
        mini_rows = self.batch_prompts // self.updates_per_epoch * self.k
        if self.micro_batch_size and (self.micro_batch_size % self.k or mini_rows % self.micro_batch_size):
            raise ValueError(f"micro_batch_size={self.micro_batch_size} must be a multiple of k={self.k} (whole "
                             f"groups) that divides the mini-batch of {mini_rows} rows")
        if self.eta_length_ref and (self.objective not in LENGTH_SCALED_ETA or self.seq_logp != "sum"):
            raise ValueError(f"eta_length_ref={self.eta_length_ref} scales TPO's η for the sum sequence log-score: "
                             f"it needs objective in {LENGTH_SCALED_ETA} and seq_logp='sum', got objective="
                             f"{self.objective!r}, seq_logp={self.seq_logp!r}")
        if self.eta_length_ref and "eta" in self.objective_options:
            raise ValueError(f"eta_length_ref={self.eta_length_ref} sets η per group; objective_options must not also "
                             f"set eta (got {self.objective_options['eta']!r})")
        if self.micro_batch_tokens and self.micro_batch_size:
            raise ValueError(f"micro_batch_size={self.micro_batch_size} and micro_batch_tokens="
                             f"{self.micro_batch_tokens}: set one of them (the other to 0)")
        if (self.micro_batch_tokens or 0 < self.micro_batch_size < mini_rows) and (why := inexact_accumulation(self)):
            raise ValueError(f"micro_batch_size={self.micro_batch_size}, micro_batch_tokens={self.micro_batch_tokens}: "
                             f"{why}, so summed micro-batch gradients would not be the mini-batch's; leave both at 0 "
                             "(one forward per mini-batch) or use more updates_per_epoch instead")


def inexact_accumulation(cfg: TrainerConfig) -> str:
    """Why gradient accumulation over micro-batches would not be exact for `cfg`'s loss ('' when it is):
    :func:`micro_weight` weighs a micro-batch by its share of the mini-batch's sequences or valid tokens, which is
    the loss's own normaliser only for the objective's default aggregation over all groups."""
    fixed = getattr(obj.get(cfg.objective).per_token_fn, "keywords", {})
    if fixed.get("mask_zero_var") or cfg.objective_options.get("mask_zero_var"):
        return (f"objective {cfg.objective!r} with {dict(cfg.objective_options)} normalises by the informative "
                "groups (mask_zero_var), which differ between micro-batches")
    changed = sorted(set(cfg.objective_options) & {"loss_agg", "convention"})
    if changed:
        return (f"objective_options sets {', '.join(changed)}, which changes what the loss divides by from the "
                f"objective's default")
    return ""


def step_seed(seed: int, step: int, salt: int = 0) -> int:
    """A 63-bit seed for one step's randomness, from (seed, step, salt) only."""
    return int(np.random.SeedSequence([seed, step, salt]).generate_state(1, np.uint64)[0]) & ((1 << 63) - 1)


# ----------------------------------------------------------------------------- the loss

def policy_loss(cfg: TrainerConfig, logp: Tensor, old_logp: Tensor, rewards: Tensor, token_mask: Tensor,
                k: int) -> obj.LossOutput:
    """The objective on one micro-batch of whole groups: rows [n, T] are reshaped to [n/K, K, T]."""
    g = rewards.shape[0] // k
    lp, old, tm = (x.reshape(g, k, -1) for x in (logp, old_logp, token_mask))
    r = rewards.reshape(g, k)
    fn = obj.get(cfg.objective).per_token_fn
    if cfg.eta_length_ref:
        return _length_scaled_eta_loss(cfg, fn, lp, old, r, tm)
    return fn(lp, old, r, token_mask=tm, **objective_options(cfg))


def length_scaled_eta(eta: float, ref_len: float, token_mask: Tensor) -> Tensor:
    """η_g = η·L_ref/L̄_g per group from a [G, K, T] token mask (L̄_g: the group's mean completion length). The sum
    log-score's spread over a group grows with length, so a fixed η lets p_old's near one-hot shape swamp the score
    tilt u/η at LLM lengths; scaling η down with L̄ keeps the tilt in step (docs/experiments.md §E19)."""
    if not (eta > 0 and ref_len > 0):
        raise ValueError(f"eta={eta!r} and ref_len={ref_len!r} must both be > 0")
    mean_len = token_mask.sum(-1).to(torch.float32).mean(-1)
    return eta * ref_len / mean_len.clamp_min(1.0)


def _length_scaled_eta_loss(cfg: TrainerConfig, fn, lp: Tensor, old: Tensor, r: Tensor, tm: Tensor) -> obj.LossOutput:
    """The objective with η_g = :func:`length_scaled_eta` per group: one call per group (the objective takes one
    η), averaged over groups as the objective averages its groups, so the loss is the batched loss's exactly."""
    etas = length_scaled_eta(cfg.eta, cfg.eta_length_ref, tm).tolist()
    opts = objective_options(cfg)
    outs = [fn(lp[i:i + 1], old[i:i + 1], r[i:i + 1], token_mask=tm[i:i + 1], **{**opts, "eta": e})
            for i, e in enumerate(etas)]
    metrics = {m: torch.stack([o.metrics[m] for o in outs]).mean() for m in outs[0].metrics}
    metrics["eta_mean"] = torch.tensor(float(np.mean(etas)))
    return obj.LossOutput(loss=torch.stack([o.loss for o in outs]).mean(), metrics=metrics)


def objective_options(cfg: TrainerConfig) -> dict:
    """Keyword arguments for `cfg.objective`'s per-token form: the trainer's settings that it takes (TPO's η and
    sequence log-score; β = 0, as the trainer's KL term replaces an objective's own so it is the same for every
    objective; Dr. GRPO's constant length = the generation budget), then `objective_options` on top."""
    params = per_token_keywords(cfg.objective)
    run = {"eta": cfg.eta, "seq_logp": cfg.seq_logp, "beta": 0.0, "norm_len": float(cfg.max_new_tokens)}
    return {k: v for k, v in run.items() if k in params} | dict(cfg.objective_options)


def micro_weight(cfg: TrainerConfig, micro: Rollout, mini_rows: int, mini_tokens: int) -> float:
    """Factor that makes Σ_micro weight·loss(micro) equal loss(mini-batch), so gradient accumulation is exact:
    the share of the mini-batch's sequences (objectives that average over sequences/groups) or of its valid
    tokens (token-mean objectives) held by this micro-batch."""
    if obj.get(cfg.objective).token_mean:
        return float(micro.completion_mask.sum()) / mini_tokens
    return micro.rewards.shape[0] / mini_rows


def kl_penalty(logp: Tensor, ref_logp: Tensor, token_mask: Tensor) -> Tensor:
    """Mean over sequences of the per-token mean of k3(log π_θ, log π_ref) (Schulman's estimator of KL(π_θ‖π_ref))."""
    kl = obj.k3_kl(logp, ref_logp)
    m = token_mask.to(kl.dtype)
    return ((kl * m).sum(-1) / m.sum(-1).clamp_min(1.0)).mean()


def micro_batch_loss(model, cfg: TrainerConfig, micro: Rollout, mini_rows: int | None = None,
                     mini_tokens: int | None = None) -> tuple[Tensor, obj.LossOutput]:
    """Forward one micro-batch (whole groups, checked) and return its share of the mini-batch loss,
    w·objective + β·w_rows·KL (weights from :func:`micro_weight`; 1 when the micro-batch is the whole
    mini-batch), and the objective's output."""
    check_whole_groups(micro.group_ids, micro.k)
    micro = micro.trimmed()
    rows = micro.rewards.shape[0]
    mini_rows = rows if mini_rows is None else mini_rows
    mini_tokens = int(micro.completion_mask.sum()) if mini_tokens is None else mini_tokens
    logp = token_logprobs(model, micro.prompt_ids, micro.prompt_mask, micro.completion_ids, micro.completion_mask,
                          cfg.temperature, chunk_tokens=cfg.chunk_tokens)
    out = policy_loss(cfg, logp, micro.old_logp, micro.rewards, micro.completion_mask, micro.k)
    loss = out.loss * micro_weight(cfg, micro, mini_rows, mini_tokens)
    if cfg.kl_coef > 0:
        if micro.ref_logp is None:
            raise ValueError("kl_coef > 0 but the rollout has no reference log-probs")
        loss = loss + cfg.kl_coef * kl_penalty(logp, micro.ref_logp, micro.completion_mask) * rows / mini_rows
    return loss, out


# ----------------------------------------------------------------------------- models

def add_lora(model, r: int, alpha: float | None = None, dropout: float = 0.0, target_modules="all-linear",
             seed: int | None = None):
    """Wrap `model` with a PEFT LoRA adapter of rank r (only the adapter is trained). With `seed`, the adapter's
    random A matrices are drawn from that seed alone (torch's global generator is left as it was), so paired
    units start from the same adapter whatever ran before them in the process."""
    from peft import LoraConfig, get_peft_model

    if r < 1:
        raise ValueError(f"LoRA rank must be >= 1, got {r}")
    config = LoraConfig(r=r, lora_alpha=alpha if alpha is not None else 2 * r, lora_dropout=dropout,
                        target_modules=target_modules, task_type="CAUSAL_LM")
    if seed is None:
        return get_peft_model(model, config)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return get_peft_model(model, config)


def enable_gradient_checkpointing(model) -> None:
    """transformers' non-reentrant gradient checkpointing on every decoder layer (the model's own switch)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if not getattr(base, "supports_gradient_checkpointing", False):
        raise ValueError(f"{type(base).__name__} does not support gradient checkpointing")
    base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def checkpointed_layers(model) -> list:
    """The decoder layers transformers can checkpoint (found once; the trainer reuses the list every step)."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    layers = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]
    if not layers:
        raise ValueError(f"gradient_checkpointing=True but {type(model).__name__} has no checkpointable layers")
    return layers


@contextmanager
def _checkpointing(layers: list):
    """transformers checkpoints a layer only while that layer is in training mode; the trainer keeps the model
    in eval mode (no dropout: the update's log-probs must be the rollout's), so switch on the layers' own flag
    alone, never their submodules'. An empty list does nothing (checkpointing off)."""
    before = [m.training for m in layers]
    try:
        for m in layers:
            m.training = True
        yield
    finally:
        for m, b in zip(layers, before):
            m.training = b


@contextmanager
def _reference(model, ref_model):
    """The frozen reference: a separate copy, or (LoRA) the same model with its adapter switched off."""
    if ref_model is not None:
        yield ref_model
    elif hasattr(model, "disable_adapter"):
        with model.disable_adapter():
            yield model
    else:
        raise ValueError("kl_coef > 0 needs a reference: pass ref_model or use a LoRA (peft) model")


# ----------------------------------------------------------------------------- evaluation

@torch.no_grad()
def evaluate_greedy(model, tokenizer, task, template, problems: list, *, max_new_tokens: int,
                    batch_size: int = 64, sampler: str = "generate") -> dict[str, float]:
    """Greedy decoding on `problems`: {"heldout_reward": mean reward, "heldout_accuracy": fraction with reward 1}."""
    if not problems:
        return {}
    rewards = []
    for i in range(0, len(problems), batch_size):
        chunk = problems[i:i + batch_size]
        prompts = [template.prompt(p.question, tokenizer) for p in chunk]
        _, _, comp, cmask = sample(model, tokenizer, prompts, k=1, max_new_tokens=max_new_tokens, greedy=True,
                                   sampler=sampler)
        texts = decode_completions(tokenizer, comp, cmask)
        rewards += [task.score(p, template.extract(t)) for p, t in zip(chunk, texts)]
    r = torch.tensor(rewards, dtype=torch.float32)
    return {"heldout_reward": float(r.mean()), "heldout_accuracy": float((r >= 1.0).float().mean())}


# ----------------------------------------------------------------------------- the trainer

class RLVRTrainer:
    """RLVR on one process. `task.score(problem, answer)` gives rewards; `template` renders prompts and
    extracts answers; `train_problems` is the prompt pool, `heldout` the fixed greedy-evaluation set."""

    def __init__(self, model, tokenizer, task, template, train_problems: list, heldout: list,
                 cfg: TrainerConfig):
        cfg.validate()
        if len(train_problems) < cfg.batch_prompts:
            raise ValueError(f"the training pool has {len(train_problems)} problems; batch_prompts="
                             f"{cfg.batch_prompts} needs at least that many")
        self.model, self.tokenizer, self.task, self.template, self.cfg = model, tokenizer, task, template, cfg
        self.train_problems, self.heldout = train_problems, heldout
        model.eval()  # dropout off: the update's log-probs must be those the rollout scored
        self._checkpoint_layers = []
        if cfg.gradient_checkpointing:
            enable_gradient_checkpointing(model)
            self._checkpoint_layers = checkpointed_layers(model)
        self.ref_model = None
        if cfg.kl_coef > 0 and not hasattr(model, "disable_adapter"):
            self.ref_model = copy.deepcopy(model).requires_grad_(False)
        self.params = [p for p in model.parameters() if p.requires_grad]
        if not self.params:
            raise ValueError("the model has no trainable parameters")
        half = [p.dtype for p in self.params if p.dtype in (torch.bfloat16, torch.float16)]
        if half:  # no fp32 master weights: an AdamW step far below a weight's spacing rounds away
            warnings.warn(f"{len(half)} trainable parameter tensors are "
                          f"{', '.join(sorted(set(map(str, half))))}: AdamW steps them in place, so updates smaller "
                          "than half their spacing (lr 1e-5 on |w| > ~2.6e-3 in bf16) are lost; train float32 "
                          "weights or a LoRA adapter", stacklevel=2)
        self.optimizer = torch.optim.AdamW(self.params, lr=cfg.lr, betas=tuple(cfg.adam_betas),
                                           weight_decay=cfg.weight_decay)
        self.device = next(model.parameters()).device

    # ---- rollout
    def batch_problems(self, step: int) -> list:
        rng = np.random.default_rng([self.cfg.seed, step, 1])
        idx = rng.choice(len(self.train_problems), size=self.cfg.batch_prompts, replace=False)
        return [self.train_problems[i] for i in idx]

    def score(self, problems: list, texts: list[str], k: int) -> Tensor:
        return torch.tensor([self.task.score(problems[n // k], self.template.extract(t)) for n, t in enumerate(texts)],
                            dtype=torch.float32)

    def _micro_batches(self, prompt_mask: Tensor, completion_mask: Tensor) -> list[Tensor]:
        """Row indices of the micro-batches of whole groups for these rows: by token budget
        (`micro_batch_tokens`) or by a fixed row count (`micro_batch_size`, 0 = all rows at once)."""
        cfg, n = self.cfg, prompt_mask.shape[0]
        if cfg.micro_batch_tokens:
            return token_micro_batches(prompt_mask, completion_mask, cfg.k, cfg.micro_batch_tokens)
        return group_micro_batches(n // cfg.k, cfg.k, cfg.micro_batch_size or n)

    def _epoch_orders(self, step: int, groups: int) -> list[Tensor]:
        """Each epoch's shuffle of the groups at `step` (seeded by the step alone)."""
        gen = torch.Generator().manual_seed(step_seed(self.cfg.seed, step, 3))
        return [torch.randperm(groups, generator=gen) for _ in range(self.cfg.epochs)]

    def _update_batches(self, order: Tensor, prompt_mask: Tensor, completion_mask: Tensor) -> list[list[Tensor]]:
        """The mini-batches of an epoch whose groups come in `order`, each as the row indices (into the whole
        batch) of its micro-batches."""
        out = []
        for mini_groups in order.split(order.numel() // self.cfg.updates_per_epoch):
            mini = group_rows(mini_groups, self.cfg.k).to(prompt_mask.device)
            out.append([mini[rows.to(mini.device)]
                        for rows in self._micro_batches(prompt_mask[mini], completion_mask[mini])])
        return out

    @torch.no_grad()
    def _logprobs(self, model, ids, mask, comp, cmask, parts: list[Tensor]) -> Tensor:
        """Rollout-time log-probs [N, C], computed on `parts`: the first epoch's micro-batches. The same rows, in
        the same order and with the same padding trim, are what the first update differentiates, so its ratio is
        exactly 1 and TPO's p_θ = p_old (other batches change the last bits, ~1e-3 in bf16); and the pass needs
        no more memory than the update."""
        out = torch.zeros(comp.shape, dtype=torch.float32, device=ids.device)
        for rows in parts:
            rows = rows.to(ids.device)
            p0, c1 = used_columns(mask[rows], cmask[rows])
            out[rows, :c1] = token_logprobs(model, ids[rows, p0:], mask[rows, p0:], comp[rows, :c1],
                                            cmask[rows, :c1], self.cfg.temperature, chunk_tokens=self.cfg.chunk_tokens)
        return out

    def rollout(self, step: int) -> tuple[Rollout, list[str]]:
        cfg = self.cfg
        problems = self.batch_problems(step)
        prompts = [self.template.prompt(p.question, self.tokenizer) for p in problems]
        ids, mask, comp, cmask = sample(self.model, self.tokenizer, prompts, k=cfg.k, max_new_tokens=cfg.max_new_tokens,
                                        temperature=cfg.temperature, seed=step_seed(cfg.seed, step, 2),
                                        sampler=cfg.sampler)
        texts = decode_completions(self.tokenizer, comp, cmask)
        rewards = self.score(problems, texts, cfg.k).to(self.device)
        first = self._update_batches(self._epoch_orders(step, ids.shape[0] // cfg.k)[0], mask, cmask)
        parts = [rows for mini in first for rows in mini]
        old = self._logprobs(self.model, ids, mask, comp, cmask, parts)
        ref = None
        if cfg.kl_coef > 0:
            with _reference(self.model, self.ref_model) as ref_model:
                ref = self._logprobs(ref_model, ids, mask, comp, cmask, parts)
        n = ids.shape[0]
        group_ids = torch.arange(n, device=self.device) // cfg.k
        return Rollout(ids, mask, comp, cmask, old, rewards, group_ids, cfg.k, ref), texts

    # ---- update
    def update(self, batch: Rollout, step: int) -> dict[str, float]:
        cfg = self.cfg
        first_epoch: dict[str, float] = {}
        losses, norms = [], []
        for epoch, order in enumerate(self._epoch_orders(step, batch.num_groups)):
            for micros in self._update_batches(order, batch.prompt_mask, batch.completion_mask):
                mini = batch.rows(torch.cat(micros).to(self.device))
                mini_rows, mini_tokens = mini.rewards.shape[0], int(mini.completion_mask.sum())
                self.optimizer.zero_grad(set_to_none=True)
                total = 0.0
                for rows in micros:
                    micro = batch.rows(rows.to(self.device))
                    with _checkpointing(self._checkpoint_layers):
                        loss, out = micro_batch_loss(self.model, cfg, micro, mini_rows, mini_tokens)
                    loss.backward()
                    total += float(loss.detach())
                    w = micro_weight(cfg, micro, mini_rows, mini_tokens)
                    if epoch == 0:
                        for name, v in out.metrics.items():
                            first_epoch[name] = first_epoch.get(name, 0.0) + float(v) * w / cfg.updates_per_epoch
                norm = torch.nn.utils.clip_grad_norm_(self.params, cfg.max_grad_norm if cfg.max_grad_norm > 0 else math.inf)
                self.optimizer.step()
                losses.append(total)
                norms.append(float(norm))
        return {"loss": float(np.mean(losses)), "grad_norm": float(np.mean(norms)),
                **{f"obj_{k}": v for k, v in first_epoch.items()}}

    def step(self, step: int) -> dict[str, float]:
        """One rollout + update; returns the step's metrics."""
        t0 = time.perf_counter()
        batch, _ = self.rollout(step)
        t1 = time.perf_counter()
        upd = self.update(batch, step)
        r = batch.rewards.reshape(-1, batch.k)
        no_signal = int(zero_variance_groups(r).sum())
        if no_signal == r.shape[0]:
            # Every group scored all-equal: TPO's target is p_old and GRPO's advantages are 0, so only a KL term
            # (or an objective without TPO's anchor, whose target is then uniform) moves the weights. Say so rather
            # than look like training.
            logger.warning("step %d: all %d groups have zero-variance rewards; the rewards carry no signal this "
                           "step", step, no_signal)
        return {"reward": float(r.mean()), "accuracy": float((r >= 1.0).float().mean()),
                "frac_zero_var": no_signal / r.shape[0], "groups_without_signal": no_signal,
                "completion_len": float(batch.completion_mask.sum(-1).float().mean()), **upd,
                "wall_rollout_s": t1 - t0, "wall_step_s": time.perf_counter() - t0}

    # ---- evaluation
    def evaluate(self, problems: list | None = None) -> dict[str, float]:
        """Greedy held-out accuracy and mean reward (see :func:`evaluate_greedy`)."""
        return evaluate_greedy(self.model, self.tokenizer, self.task, self.template,
                               self.heldout if problems is None else problems,
                               max_new_tokens=self.cfg.max_new_tokens, batch_size=self.cfg.eval_batch,
                               sampler=self.cfg.sampler)

    # ---- checkpoints
    def save_checkpoint(self, path: str | Path, step: int) -> None:
        """Atomically write the state after `step` updates (trainable weights, optimizer, RNG)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        state = {"step": step, "trainable": {n: p.detach().cpu().clone() for n, p in self.model.named_parameters()
                                             if p.requires_grad},
                 "optimizer": self.optimizer.state_dict(), "torch_rng": torch.get_rng_state(),
                 "python_rng": random.getstate(), "numpy_rng": np.random.get_state()}
        tmp = path.with_suffix(".tmp")
        torch.save(state, tmp)
        os.replace(tmp, path)

    def load_checkpoint(self, path: str | Path) -> int:
        """Restore a checkpoint written by :meth:`save_checkpoint`; returns the number of updates it holds."""
        state = torch.load(Path(path), map_location="cpu", weights_only=False)
        named = dict(self.model.named_parameters())
        missing = set(state["trainable"]) ^ {n for n, p in named.items() if p.requires_grad}
        if missing:
            raise ValueError(f"checkpoint {path} does not match the model's trainable parameters: {sorted(missing)[:5]}")
        with torch.no_grad():
            for n, v in state["trainable"].items():
                named[n].copy_(v)
        self.optimizer.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["torch_rng"])
        random.setstate(state["python_rng"])
        np.random.set_state(state["numpy_rng"])
        return int(state["step"])

    # ---- the loop
    def train(self, steps: int, log: Callable[[dict], None] = lambda r: None, advance: Callable[[int], None] = lambda n: None,
              checkpoint: str | Path | None = None) -> None:
        """Run steps 0..steps−1, calling `log` with each step's record (held-out metrics at evaluation steps,
        measured before that step's update, and once more after the last update at step = steps).
        With `checkpoint`, resume from it when it exists and save it every `checkpoint_every` steps."""
        cfg = self.cfg
        start = 0
        if checkpoint is not None and Path(checkpoint).exists():
            start = self.load_checkpoint(checkpoint)
            advance(start)
        for t in range(start, steps):
            rec: dict = {"step": t}
            if t == 0 or (cfg.eval_every and t % cfg.eval_every == 0):
                rec.update(self.evaluate())
            rec.update(self.step(t))
            log(rec)
            advance(1)
            if checkpoint is not None and cfg.checkpoint_every and (t + 1) % cfg.checkpoint_every == 0 and t + 1 < steps:
                self.save_checkpoint(checkpoint, t + 1)
        log({"step": steps, **self.evaluate()})
