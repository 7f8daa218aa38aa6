"""Rollouts: K sampled completions per prompt with Hugging Face ``generate``, then per-token log-probs from
one forward pass, and the masks that say which tokens belong to each completion.

Layout. A batch of B prompts gives N = B·K rows; row ``g·K + i`` is candidate i of group (prompt) g, so a
``[N, T]`` tensor reshapes to ``[B, K, T]`` without copying. ``group_ids[n] = n // K`` travels with the rows and
is checked wherever rows are split (:func:`targetpo.objectives.groups.check_whole_groups`, re-exported here).

Log-probs. The rollout's "old" log-probs come from :func:`token_logprobs` (a no-grad forward after generation),
the same function the update differentiates, so in the first epoch the ratio π_θ/π_old is exactly 1 and TPO's
p_θ equals p_old. The scores ``generate`` returns are not used: a different kernel path (KV cache, padding)
would make them differ in the last bits.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch
from torch import Tensor

from targetpo.llm.logprobs import (
    DEFAULT_CHUNK_TOKENS,
    chunked_model_token_logprobs,
    full_logits_token_logprobs,
)
from targetpo.objectives.groups import check_whole_groups

__all__ = ["Rollout", "check_whole_groups", "group_micro_batches", "token_micro_batches", "used_columns", "group_rows", "encode_prompts", "completion_mask",
           "position_ids", "token_logprobs", "sample", "kv_loop_sample", "decode_completions", "SAMPLERS"]


@dataclass
class Rollout:
    """B prompts × K completions, rows grouped by prompt (see the module docstring)."""

    prompt_ids: Tensor        # [N, P] left-padded
    prompt_mask: Tensor       # [N, P] bool
    completion_ids: Tensor    # [N, C] right-padded
    completion_mask: Tensor   # [N, C] bool: tokens up to and including the first EOS
    old_logp: Tensor          # [N, C] float32 rollout-time log-probs (0 on padding)
    rewards: Tensor           # [N] float32
    group_ids: Tensor         # [N] int64, row n belongs to group n // K
    k: int
    ref_logp: Tensor | None = None  # [N, C] frozen reference log-probs when a KL penalty is used

    @property
    def num_groups(self) -> int:
        return self.rewards.shape[0] // self.k

    def trimmed(self) -> "Rollout":
        """The same rows without the padding columns no row uses (left of the longest prompt, right of the longest
        completion), so a micro-batch of short sequences costs what it holds. Exact: padding is masked out of
        attention and positions, and causal attention never looks right."""
        p0, c1 = used_columns(self.prompt_mask, self.completion_mask)
        kw = {f.name: getattr(self, f.name) for f in fields(self)}
        kw["prompt_ids"], kw["prompt_mask"] = self.prompt_ids[:, p0:], self.prompt_mask[:, p0:]
        for name in ("completion_ids", "completion_mask", "old_logp", "ref_logp"):
            if kw[name] is not None:
                kw[name] = kw[name][:, :c1]
        return Rollout(**kw)

    def rows(self, index: Tensor) -> "Rollout":
        """The rows `index` (a 1-D long tensor) as a new Rollout; the caller keeps groups whole."""
        kw = {f.name: getattr(self, f.name) for f in fields(self)}
        for name, v in kw.items():
            if isinstance(v, Tensor):
                kw[name] = v[index]
        return Rollout(**kw)


def used_columns(prompt_mask: Tensor, completion_mask: Tensor) -> tuple[int, int]:
    """(first prompt column, end of the completion columns) that some row uses: left-padded prompts keep
    ``[:, p0:]`` and right-padded completions ``[:, :c1]`` (at least one column of each)."""
    keep_p = prompt_mask.any(0).nonzero()
    keep_c = completion_mask.any(0).nonzero()
    p0 = int(keep_p[0]) if keep_p.numel() else prompt_mask.shape[1] - 1
    c1 = int(keep_c[-1]) + 1 if keep_c.numel() else 1
    return p0, c1


def group_micro_batches(num_groups: int, k: int, micro_batch_size: int, order: Tensor | None = None) -> list[Tensor]:
    """Row indices of micro-batches that each hold whole groups, in `order` (a permutation of the groups).

    micro_batch_size: rows (completions) per micro-batch; must be a multiple of K so no group is split
    (the same constraint as TRL's ``per_device_train_batch_size % num_generations == 0``).
    """
    if micro_batch_size < k or micro_batch_size % k:
        raise ValueError(f"micro_batch_size={micro_batch_size} would split groups of K={k} completions; it must "
                         f"be a positive multiple of K")
    order = torch.arange(num_groups) if order is None else order
    micro = list(group_rows(order, k).split(micro_batch_size // k * k))
    for rows in micro:
        check_whole_groups(rows // k, k)
    return micro


def token_micro_batches(prompt_mask: Tensor, completion_mask: Tensor, k: int, max_tokens: int,
                        order: Tensor | None = None) -> list[Tensor]:
    """Row indices of micro-batches of whole groups, taken in `order`, each as large as fits in `max_tokens`
    padded tokens (rows × (longest prompt + longest completion) of the micro-batch, what a forward pass costs once
    the micro-batch is :meth:`Rollout.trimmed`). A group larger than the budget alone gets a micro-batch of its
    own. Long completions so get small micro-batches and short ones large, at a bounded activation memory."""
    if max_tokens < 1:
        raise ValueError(f"max_tokens={max_tokens}: must be >= 1")
    n = prompt_mask.shape[0]
    if n % k:
        raise ValueError(f"{n} rows cannot hold whole groups of K={k}")
    p_len = prompt_mask.sum(1).reshape(-1, k).amax(1).tolist()
    c_len = completion_mask.sum(1).reshape(-1, k).amax(1).tolist()
    order = torch.arange(n // k) if order is None else order
    out, current, p_max, c_max = [], [], 0, 0
    for g in order.tolist():
        p_new, c_new = max(p_max, p_len[g]), max(c_max, c_len[g])
        if current and (len(current) + 1) * k * (p_new + c_new) > max_tokens:
            out.append(current)
            current, p_new, c_new = [], p_len[g], c_len[g]
        current.append(g)
        p_max, c_max = p_new, c_new
    out.append(current)
    batches = [group_rows(torch.tensor(gs), k) for gs in out]
    for rows in batches:
        check_whole_groups(rows // k, k)
    return batches


def group_rows(groups: Tensor, k: int) -> Tensor:
    """Row indices of the given groups, each group's K rows together: group g -> rows gK .. gK+K−1."""
    return (groups.unsqueeze(1) * k + torch.arange(k, device=groups.device)).reshape(-1)


def encode_prompts(tokenizer, texts: list[str], device) -> tuple[Tensor, Tensor]:
    """Left-padded prompt ids and mask (left padding so every prompt ends where generation starts)."""
    old_side = tokenizer.padding_side
    tokenizer.padding_side = "left"
    try:
        enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    finally:
        tokenizer.padding_side = old_side
    return enc["input_ids"].to(device), enc["attention_mask"].to(device).bool()


def completion_mask(completion_ids: Tensor, eos_id: int) -> Tensor:
    """True on the tokens up to and including the first EOS (all tokens if there is none: a truncated
    completion still counts; its missing EOS is simply not scored as a stop)."""
    is_eos = completion_ids == eos_id
    before = torch.cumsum(is_eos.int(), dim=-1) - is_eos.int()  # EOS tokens strictly before each position
    return before == 0


def position_ids(mask: Tensor) -> Tensor:
    """Positions that skip left padding, as ``generate`` computes them from the attention mask."""
    return (mask.long().cumsum(-1) - 1).clamp_min(0)


def token_logprobs(model, prompt_ids: Tensor, prompt_mask: Tensor, completion_ids: Tensor,
                   completion_mask: Tensor, temperature: float = 1.0, *,
                   chunk_tokens: int = DEFAULT_CHUNK_TOKENS) -> Tensor:
    """log π(y_t | x, y_<t) of every completion token, [N, C] float32 (0 where ``completion_mask`` is False).

    One forward pass over [prompt; completion]; logits are divided by the sampling temperature so the
    log-probs are those of the distribution that was sampled. Differentiable when called with grad enabled.
    The LM head runs over `chunk_tokens` tokens at a time and is recomputed in backward, so the [N, C, V]
    logits never exist (:mod:`targetpo.llm.logprobs`); ``chunk_tokens=0`` takes the model's full logits instead.
    """
    if completion_ids.shape != completion_mask.shape or prompt_ids.shape != prompt_mask.shape:
        raise ValueError(f"completion_ids {tuple(completion_ids.shape)} / completion_mask "
                         f"{tuple(completion_mask.shape)} and prompt_ids {tuple(prompt_ids.shape)} / prompt_mask "
                         f"{tuple(prompt_mask.shape)}: each pair must have the same shape")
    if prompt_ids.shape[1] and not bool(prompt_mask[:, -1].all()):
        # The logit that predicts a completion's first token is read at the last prompt column: a pad there.
        rows = (~prompt_mask[:, -1]).nonzero().flatten().tolist()
        raise ValueError(f"prompt_mask: rows {rows[:5]}{'…' if len(rows) > 5 else ''} end in padding; prompts must be "
                         "left-padded (their last column a real token), as encode_prompts pads them")
    ids = torch.cat([prompt_ids, completion_ids], dim=1)
    mask = torch.cat([prompt_mask, completion_mask], dim=1)
    p = prompt_ids.shape[1]
    if chunk_tokens:
        logp = chunked_model_token_logprobs(model, ids, mask, position_ids(mask), p, completion_ids, temperature,
                                            chunk_tokens)
    else:
        logp = full_logits_token_logprobs(model, ids, mask, position_ids(mask), p, completion_ids, temperature)
    return torch.where(completion_mask, logp, torch.zeros_like(logp))


SAMPLERS = ("generate", "kv_loop")


@torch.no_grad()
def sample(model, tokenizer, prompts: list[str], *, k: int, max_new_tokens: int, temperature: float = 1.0,
           greedy: bool = False, seed: int | None = None,
           sampler: str = "generate") -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """K completions per prompt (pure sampling at `temperature`: no top-k/top-p, so the completions follow
    exactly the distribution whose log-probs the loss uses), or one greedy completion per prompt with
    ``greedy=True`` (k must then be 1).

    `sampler`: "generate" (``model.generate``, any Hugging Face causal LM) or "kv_loop" (:func:`kv_loop_sample`,
    the model's cached forward in a plain loop: the same draws without ``generate``'s per-token bookkeeping;
    measured on the 0.32M-parameter tiny model, 32 × 200 tokens on one thread: 0.41 s vs 0.45–0.61 s, the
    model's own forward being most of a token's cost).
    `seed` seeds torch's global generator right before sampling (what both samplers draw from), which makes a
    step's rollout a function of (seed, weights) alone: a resumed run resamples exactly.
    Returns (prompt_ids [N, P], prompt_mask, completion_ids [N, C], completion_mask), N = len(prompts)·k.
    """
    from transformers import GenerationConfig

    if greedy and k != 1:
        raise ValueError(f"greedy decoding gives one completion per prompt; got k={k}")
    if sampler not in SAMPLERS:
        raise ValueError(f"sampler={sampler!r}: must be one of {SAMPLERS}")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens={max_new_tokens}: must be >= 1")
    device = next(model.parameters()).device
    ids, mask = encode_prompts(tokenizer, prompts, device)
    ids, mask = ids.repeat_interleave(k, dim=0), mask.repeat_interleave(k, dim=0)
    if seed is not None:
        torch.manual_seed(seed)
    was_training = model.training
    model.eval()
    try:
        if sampler == "kv_loop":
            comp = kv_loop_sample(model, ids, mask, max_new_tokens=max_new_tokens, temperature=temperature,
                                  greedy=greedy, eos_id=tokenizer.eos_token_id, pad_id=tokenizer.pad_token_id)
        else:
            gen = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=not greedy,
                                   temperature=temperature if not greedy else None, top_k=None if greedy else 0,
                                   top_p=None if greedy else 1.0, pad_token_id=tokenizer.pad_token_id,
                                   eos_token_id=tokenizer.eos_token_id, num_return_sequences=1)
            # generate fills every field `gen` leaves unset from the model's own generation_config; a checkpoint's
            # repetition_penalty, suppress_tokens, min_new_tokens, … would then bend the samples away from π^(1/T),
            # the distribution the loss scores (and kv_loop draws from). A neutral config leaves none to inherit.
            saved, model.generation_config = model.generation_config, GenerationConfig()
            try:
                comp = model.generate(input_ids=ids, attention_mask=mask.long(), generation_config=gen)
            finally:
                model.generation_config = saved
            comp = comp[:, ids.shape[1]:]
    finally:
        model.train(was_training)
    cmask = completion_mask(comp, tokenizer.eos_token_id)
    comp = torch.where(cmask, comp, torch.full_like(comp, tokenizer.pad_token_id))
    return ids, mask, comp, cmask


@torch.no_grad()
def kv_loop_sample(model, prompt_ids: Tensor, prompt_mask: Tensor, *, max_new_tokens: int, temperature: float = 1.0,
                   greedy: bool = False, eos_id: int, pad_id: int) -> Tensor:
    """Completion ids [N, C ≤ max_new_tokens] from the model's KV-cached forward in a plain loop: one prefill over
    the left-padded prompts, then one token per step for every row, drawn from softmax(logits / temperature) with
    ``torch.multinomial`` on torch's global generator (argmax with `greedy`). A row that has emitted EOS gets
    `pad_id` from then on; the loop stops when every row has, or after `max_new_tokens`.

    This is ``generate``'s pure-sampling loop (the same inputs to the model, the same softmax and one
    ``multinomial`` draw over all rows per token), so under one seed it draws the same tokens as ``generate``
    wherever the two forwards give the same logits (tests/llm/test_llm_sampler.py checks the tiny Qwen2 and Llama).
    It needs a model whose forward takes ``attention_mask``, ``position_ids``, ``past_key_values``, ``use_cache``
    and ``logits_to_keep`` (current Hugging Face decoder-only LMs; ``generate`` stays the default for real models,
    whose forward paths the tests do not cover); the log-probs the loss uses are recomputed afterwards by
    :func:`token_logprobs`, as for ``generate``."""
    n = prompt_ids.shape[0]
    attn = prompt_mask.long()
    pos = position_ids(prompt_mask)
    out = model(input_ids=prompt_ids, attention_mask=attn, position_ids=pos, use_cache=True, logits_to_keep=1)
    pos = pos[:, -1:]
    finished = torch.zeros(n, dtype=torch.bool, device=prompt_ids.device)
    tokens = []
    for t in range(max_new_tokens):
        logits = out.logits[:, -1].float()
        if greedy:
            nxt = logits.argmax(-1)
        else:
            nxt = torch.multinomial(torch.softmax(logits / temperature, dim=-1), num_samples=1).squeeze(1)
        nxt = torch.where(finished, torch.full_like(nxt, pad_id), nxt)
        tokens.append(nxt)
        finished |= nxt == eos_id
        if bool(finished.all()) or t + 1 == max_new_tokens:
            break
        attn = torch.cat([attn, attn.new_ones(n, 1)], dim=1)
        pos = pos + 1
        out = model(input_ids=nxt[:, None], attention_mask=attn, position_ids=pos, past_key_values=out.past_key_values,
                    use_cache=True)
    return torch.stack(tokens, dim=1)


def decode_completions(tokenizer, completion_ids: Tensor, completion_mask: Tensor) -> list[str]:
    """Completion texts without special tokens (EOS, padding)."""
    return [tokenizer.decode(row[m].tolist(), skip_special_tokens=True)
            for row, m in zip(completion_ids, completion_mask)]
