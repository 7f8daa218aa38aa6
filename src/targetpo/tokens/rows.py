"""Rows of seed-batched integer tensors [S, N, ...]: ids of equal rows, one representative per distinct row,
gathers over the seed axis, and the prefix tree of a batch of sequences.

The token engine computes identical inputs once (docs/experiments.md §Compute): the K rollouts of a prompt share
its pass, a confident policy's repeated answers are one row, and prompts that share a prefix share the pass over
it (:class:`PrefixTree`). Everything here is integer bookkeeping, exact by construction.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor


def row_ids(x: Tensor, radices: list[int]) -> Tensor:
    """ids [S, N] (int64) with equal ids ⇔ equal rows within a seed, for rows x [S, N, L] whose column j takes
    values in [0, radices[j]). A mixed-radix code when it fits in 62 bits, else per-seed `unique(dim=0)`."""
    if sum(math.log2(max(r, 2)) for r in radices) < 62:
        w, acc = [], 1
        for r in radices:
            w.append(acc)
            acc *= r
        return (x * torch.tensor(w, dtype=torch.int64, device=x.device)).sum(dim=-1)
    return torch.stack([torch.unique(xi, dim=0, return_inverse=True)[1] for xi in x])


def distinct(ids: Tensor) -> tuple[Tensor, Tensor]:
    """ids [S, N] → (rep [S, U]: the index of one row per distinct id of each seed, padded with index 0;
    inverse [S, N]: each row's position in rep). One batched sort for all seeds (a single host sync)."""
    sorted_ids, order = ids.sort(dim=1)
    new = torch.ones_like(sorted_ids, dtype=torch.bool)
    new[:, 1:] = sorted_ids[:, 1:] != sorted_ids[:, :-1]
    group = new.long().cumsum(dim=1) - 1                                      # distinct index, in sorted order
    inverse = torch.empty_like(group).scatter_(1, order, group)
    width = int(group[:, -1].max()) + 1
    # Any row of a group represents it (they are identical), so the scatter's choice among duplicates is moot.
    rep = torch.zeros(ids.shape[0], width, dtype=torch.int64, device=ids.device).scatter_(1, group, order)
    return rep, inverse


def is_identity(idx: Tensor, n: int) -> bool:
    """idx [S, M] is arange(n) for every seed (each of n rows maps to itself)."""
    return idx.shape[1] == n and bool((idx == torch.arange(n, device=idx.device)).all())


class _SelectRows(torch.autograd.Function):
    """`x.index_select(0, flat)` whose backward hands `index_add_` a contiguous gradient. The gradient of a gathered
    key/value cache arrives as a slice of the concatenation with the rows' own keys, and `index_add_` (a
    `scatter_add_` in this torch) over that strided slice took ~4× a copy plus the contiguous call (BENCHMARKS.md,
    "Tenth session"). The sums are the same: each element's repeats are added in index order whatever the layout."""

    @staticmethod
    def forward(ctx, x: Tensor, flat: Tensor) -> Tensor:
        ctx.save_for_backward(flat)
        ctx.rows = x.shape[0]
        return x.index_select(0, flat)

    @staticmethod
    def backward(ctx, grad: Tensor):
        (flat,) = ctx.saved_tensors
        return grad.new_zeros(ctx.rows, *grad.shape[1:]).index_add_(0, flat, grad.contiguous()), None


def take(x: Tensor, idx: Tensor) -> Tensor:
    """x [S, N, ...], idx [S, M] → x[s, idx[s]] as [S, M, ...].

    One `index_select` over the flattened seeds: its backward (`index_add_`) sums a row's repeats in index order
    at any thread count. Advanced indexing's backward (`index_put_` with accumulate) splits the rows over the
    threads, so with 3 seeds on 2 threads the middle seed's gradients rounded differently (BENCHMARKS.md)."""
    s, n = x.shape[:2]
    flat = (idx + n * torch.arange(s, device=x.device).unsqueeze(1)).reshape(-1)
    rows = x.reshape(s * n, *x.shape[2:])
    out = _SelectRows.apply(rows, flat) if rows.requires_grad else rows.index_select(0, flat)
    return out.view(s, idx.shape[1], *x.shape[2:])


@dataclass(frozen=True)
class PrefixTree:
    """The distinct prefixes of sequences [S, P, T], one node each: level j holds the prefixes of length j + 1,
    as many in every seed (the widest seed's count; a narrower seed repeats one of its nodes, never read).

    token: [S, N] each node's last token; position: [N] its position (its level); path: [S, P, T] the node of
    each sequence's prefix of length j + 1; source: [S, N] one place of each node in the sequences, as the flat
    index p·T + j into [P, T] (a causal pass computes a position from its prefix alone, so any sequence that
    holds the prefix gives the node's value)."""

    token: Tensor
    position: Tensor
    path: Tensor
    source: Tensor

    @property
    def nodes(self) -> int:
        return self.token.shape[1]


def prefix_tree(seqs: Tensor, vocab: int, roots: Tensor | None = None, n_roots: int = 1) -> PrefixTree:
    """The :class:`PrefixTree` of token sequences seqs [S, P, T] with tokens in [0, vocab). With `roots` [S, P]
    (values in [0, n_roots)), sequences continue different contexts: two prefixes are one node only when their
    roots are equal too (an answer's prefix is one node per prompt)."""
    s, p, t = seqs.shape
    tokens, positions, paths, sources = [], [], [], []
    start = 0
    exact = (t * math.log2(max(vocab, 2)) + math.log2(max(n_roots, 2))) < 62
    ids = torch.zeros(s, p, dtype=torch.int64, device=seqs.device) if roots is None else roots.long()
    for j in range(t):
        if exact:
            ids = ids * vocab + seqs[..., j]
        else:
            cols = seqs[..., :j + 1] if roots is None else torch.cat([roots.unsqueeze(-1), seqs[..., :j + 1]], -1)
            ids = row_ids(cols, ([] if roots is None else [n_roots]) + [vocab] * (j + 1))
        rep, inverse = distinct(ids)
        width = rep.shape[1]
        tokens.append(take(seqs[..., j], rep))
        positions.append(torch.full((width,), j, dtype=torch.int64, device=seqs.device))
        paths.append(start + inverse)
        sources.append(rep * t + j)
        start += width
    return PrefixTree(torch.cat(tokens, dim=1), torch.cat(positions), torch.stack(paths, dim=-1),
                      torch.cat(sources, dim=1))
