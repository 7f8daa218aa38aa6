"""How a per-element loss becomes one scalar: the conventions differ between papers and libraries.

Layout: per-candidate values `[..., K]` (sequence level, or a 2-D `[rows, cols]` batch such as `[B, H]`
tokens), or per-token values `[..., K, T]` with a token mask.

- ``"sum-mean"``: sum over the last dim (candidates, or tokens of a row) and over T if present, mean over the
  remaining leading dims. The paper's convention for PPO/GRPO/REINFORCE/DG (docs/method.md §3,
  docs/differences.md §14): candidates and tokens are *summed*, prompts/states averaged.
- ``"mean"``: mean over every element (single-sample batches `[B]`, RLOO's 1/K), over the valid ones when a
  mask is given; with per-token values, the mean of each sequence's token mean, as ``"seq-mean-token-mean"``.
- ``"token-mean"``: Σ m·x / Σ m over all tokens of the batch (DAPO, Yu et al. 2025; verl's default).
- ``"token-sum"``: Σ m·x over all tokens of the batch, unnormalised (verl `agg_loss`, core_algos.py).
- ``"seq-mean-token-mean"``: mean over tokens within a sequence, then over sequences (GRPO, Shao et al. 2024).
- ``"seq-mean-token-sum"``: sum over tokens within a sequence, mean over sequences.
- ``"seq-mean-token-sum-norm"``: sum over tokens divided by a constant length (default T), mean over sequences
  (Dr. GRPO, Liu et al. 2025), which removes the length bias of per-sequence means.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from targetpo.objectives._checks import check_hyperparameter, check_token_mask

LossAgg = Literal["sum-mean", "mean", "token-mean", "token-sum", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]
TOKEN_MODES = ("token-mean", "token-sum", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")
MODES = ("sum-mean", "mean") + TOKEN_MODES


def aggregate(
    values: Tensor,
    mode: str,
    *,
    token_mask: Tensor | None = None,
    per_token: bool = False,
    norm_len: float | None = None,
) -> Tensor:
    """Reduce per-element losses to a scalar. `per_token=True` means the last dim of `values` is T (tokens)
    and `token_mask` (same shape, bool) marks valid tokens; otherwise `values` holds one value per row/candidate.
    Half-precision values are reduced in float32; NaN/inf values pass through (an overflowed PPO loss is +inf,
    docs/method.md §3)."""
    if mode not in MODES:
        raise ValueError(f"loss_agg must be one of {MODES}, got {mode!r}")
    if not isinstance(values, Tensor) or not values.is_floating_point():
        got = values.dtype if isinstance(values, Tensor) else type(values).__name__
        raise TypeError(f"values must be a floating torch.Tensor of per-element losses, got {got}")
    if values.dtype in (torch.float16, torch.bfloat16):
        values = values.float()
    check_token_mask(token_mask, values, "values")  # a mask of another shape would broadcast onto the wrong elements
    check_hyperparameter("norm_len", norm_len)
    if token_mask is not None:
        values = torch.where(token_mask, values, torch.zeros_like(values))
    if not per_token:
        if mode in TOKEN_MODES:
            raise ValueError(f"loss_agg={mode!r} needs per-token inputs [..., T]; got per-candidate values {tuple(values.shape)}")
        if values.dim() == 0:
            return values
        if mode == "mean":  # over the valid rows: masked candidates do not dilute the mean
            return values.mean() if token_mask is None else values.sum() / token_mask.sum().clamp_min(1).to(values.dtype)
        return values.sum(dim=-1).mean()
    m = torch.ones_like(values) if token_mask is None else token_mask.to(values.dtype)
    if mode == "token-mean":
        return values.sum() / m.sum().clamp_min(1.0)
    if mode == "token-sum":
        return values.sum()
    if mode == "sum-mean":
        # Sum tokens and candidates, average groups: [G, K, T] -> Σ_{K,T}, mean_G; [B, T] -> Σ_T, mean_B.
        summed = values.sum(dim=-1)
        return summed.sum(dim=-1).mean() if summed.dim() >= 2 else summed.mean()
    per_seq = values.sum(dim=-1)
    n_tok = m.sum(dim=-1)
    if mode in ("mean", "seq-mean-token-mean"):  # per-token "mean" is the mean over each sequence's tokens
        per_seq = per_seq / n_tok.clamp_min(1.0)
    elif mode == "seq-mean-token-sum-norm":
        per_seq = per_seq / float(norm_len if norm_len is not None else values.shape[-1])
    # Average over sequences that keep at least one token (masked candidates do not dilute the mean).
    return per_seq.sum() / (n_tok > 0).sum().clamp_min(1).to(values.dtype)


def aggregate_answers(values: Tensor, mode: str | None, *, token_mask: Tensor | None = None) -> Tensor:
    """:func:`aggregate` for single-sample objectives, whose rows are answers: `values` [B] (one action each) or
    [..., B, H] (H tokens each, any leading dims such as seeds). `mode` None is the paper's: "mean" for [B],
    "sum-mean" otherwise (docs/method.md §3). "sum-mean" sums each answer's tokens and averages over every other
    dim, with or without `token_mask`; the token modes read the last dim as tokens. Through :func:`aggregate`
    directly, a masked [S, B, H] was read as groups [G, K, T] and came out B× larger."""
    if mode is None:
        mode = "mean" if values.dim() == 1 else "sum-mean"
    per_token = mode != "sum-mean" and (token_mask is not None or (mode in TOKEN_MODES and values.dim() >= 2))
    return aggregate(values, mode, token_mask=token_mask, per_token=per_token)
