"""Supervised warm start: a short cross-entropy fit on the task's gold answers, so that RL starts from a policy
with non-zero reward (a random tiny model never produces a correct answer, and with all-zero rewards every
group has zero variance: TPO and GRPO both get no signal).

The loss is the mean token cross-entropy of ``template.target(answer) + EOS`` given the rendered prompt; prompt
tokens are not trained. Batches are drawn from a generator seeded by (seed, step), so the result is a function of
(model, problems, settings, seed) alone.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from targetpo.llm.logprobs import DEFAULT_CHUNK_TOKENS, chunked_token_logprob, lm_head_parts
from targetpo.llm.rollout import position_ids


def supervised_batch(tokenizer, template, problems: list, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask, labels) for prompt + gold completion + EOS, left-padded; labels are −100 on
    the prompt and padding."""
    rows, targets = [], []
    for p in problems:
        prompt = tokenizer(template.prompt(p.question, tokenizer), add_special_tokens=False)["input_ids"]
        answer = tokenizer(template.target(p.answer), add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        rows.append(prompt + answer)
        targets.append([-100] * len(prompt) + answer)
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.bool)
    for i, (r, t) in enumerate(zip(rows, targets)):
        ids[i, width - len(r):] = torch.tensor(r)
        labels[i, width - len(r):] = torch.tensor(t)
        mask[i, width - len(r):] = True
    return ids.to(device), mask.to(device), labels.to(device)


# The warm start takes the model's own logits while the batch's fit in this (a character model's always do:
# 64 rows × 30 tokens × 100 symbols is 0.8 MB); above, only the labelled tokens go through the LM head, in chunks.
FULL_LOGITS_MAX_BYTES = 64 * 2**20


def supervised_loss(model, ids: torch.Tensor, mask: torch.Tensor, labels: torch.Tensor, *,
                    chunk_tokens: int = DEFAULT_CHUNK_TOKENS) -> torch.Tensor:
    """Mean cross-entropy over the labelled (answer) tokens. Beyond FULL_LOGITS_MAX_BYTES of logits, only their
    hidden states go through the LM head, in chunks (:mod:`targetpo.llm.logprobs`): the model's own [B, L, V]
    logits over every position, prompt included, took 12× the memory (7.9 GB for 16 rows of 288 tokens at a
    151,936 vocabulary). Small batches keep the full logits, whose numbers the rlvr presets' warm starts were
    measured with (the same loss to rounding, but 600 steps of it end at another checkpoint). A model whose head
    cannot be split off (soft-capped or scaled logits) takes its full logits, as the RL loop does, and so does
    ``chunk_tokens=0``."""
    pos = position_ids(mask)
    targets = labels[:, 1:]
    parts = lm_head_parts(model)
    vocab = parts[1].weight.shape[0] if parts is not None else 0
    if not chunk_tokens or parts is None or ids.shape[0] * (ids.shape[1] - 1) * vocab * 4 <= FULL_LOGITS_MAX_BYTES:
        logits = model(input_ids=ids, attention_mask=mask.long(), position_ids=pos, use_cache=False).logits
        return torch.nn.functional.cross_entropy(logits[:, :-1].float().reshape(-1, logits.shape[-1]),
                                                 targets.reshape(-1), ignore_index=-100)
    backbone, head = parts
    keep = targets != -100
    hidden = backbone(input_ids=ids, attention_mask=mask.long(), position_ids=pos, use_cache=False)[0][:, :-1]
    logp = chunked_token_logprob(hidden[keep], head.weight, targets[keep], bias=head.bias, chunk_tokens=chunk_tokens)
    return -logp.mean()


def supervised_warmstart(model, tokenizer, template, problems: list, *, steps: int, batch_size: int, lr: float,
                         seed: int, log: Callable[[dict], None] = lambda r: None,
                         advance: Callable[[int], None] = lambda n: None,
                         evaluate: Callable[[], dict] | None = None, eval_every: int = 0,
                         chunk_tokens: int = DEFAULT_CHUNK_TOKENS, until: float = 0.0) -> int:
    """Fit `model` in place for `steps` AdamW steps on the gold answers of `problems`; returns the steps taken.

    `log` receives {"step", "sft_loss"} every step, plus `evaluate()`'s metrics every `eval_every` steps and
    after the last step (at step = steps). `chunk_tokens`: as in :func:`supervised_loss`. With `until` > 0 the
    fit stops at the first evaluation whose "heldout_accuracy" is at least `until` (logged as the last record,
    at that step), and `steps` is the most it takes: where a supervised learning curve climbs steeply, a fixed
    step count lands at quite different accuracies on CPUs that round differently, and RL's room to learn with
    it (docs/experiments.md §E12). Evaluations draw no random numbers, so every record up to the stop is the
    fixed-step run's."""
    if steps < 0 or batch_size < 1 or not lr > 0:
        raise ValueError(f"warm start needs steps >= 0, batch_size >= 1, lr > 0; got {steps}, {batch_size}, {lr}")
    if not 0.0 <= until <= 1.0:
        raise ValueError(f"until={until}: a held-out accuracy in [0, 1] (0 = run all `steps`)")
    if until > 0 and (evaluate is None or eval_every < 1):
        raise ValueError(f"until={until} stops at a held-out evaluation: give `evaluate` and eval_every >= 1 "
                         f"(got eval_every={eval_every}{', no evaluate' if evaluate is None else ''})")
    if not problems:
        raise ValueError("warm start needs at least one training problem")
    device = next(model.parameters()).device
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr, weight_decay=0.0)
    model.eval()  # no dropout: the same deterministic forward the RL trainer uses
    for t in range(steps):
        rec: dict = {"step": t}
        if evaluate is not None and eval_every and t % eval_every == 0:
            metrics = evaluate()
            rec.update(metrics)
            if until > 0 and _accuracy(metrics) >= until:
                log(rec)
                advance(steps - t)  # the steps not taken: a progress bar over `steps` ends full
                return t
        idx = np.random.default_rng([seed, t, 7]).choice(len(problems), size=batch_size,
                                                         replace=len(problems) < batch_size)
        ids, mask, labels = supervised_batch(tokenizer, template, [problems[i] for i in idx], device)
        loss = supervised_loss(model, ids, mask, labels, chunk_tokens=chunk_tokens)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        rec["sft_loss"] = float(loss.detach())
        log(rec)
        advance(1)
    log({"step": steps, **(evaluate() if evaluate is not None else {})})
    return steps


def _accuracy(metrics: dict) -> float:
    if "heldout_accuracy" not in metrics:
        raise ValueError(f"the warm start stops on held-out accuracy, but its evaluation gave {sorted(metrics)}, "
                         "no heldout_accuracy")
    return float(metrics["heldout_accuracy"])


def save_checkpoint(model, tokenizer, out: Path) -> Path:
    """Save model and tokenizer to `out` atomically: written to a sibling `.tmp` folder, marked COMPLETE, then
    renamed, so a killed run never leaves a half-written checkpoint that a resumed run would load."""
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    (tmp / "COMPLETE").write_text("warm start finished\n")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out
