"""Group-layout checks shared by the TRL and verl adapters (plain torch, no library imports).

TPO's loss is a cross-entropy over each prompt's K completions, so every micro-batch that reaches the loss
must hold whole groups: rows [jK, (j+1)K) must be the K completions of one prompt. A library that shuffles
rows, balances sequences across devices or packs micro-batches by token count breaks this silently; these
functions make the break visible.
"""

from __future__ import annotations

import torch
from torch import Tensor

from targetpo.objectives.scores import ZERO_VARIANCE_STD


def group_ids_from_rows(rows: Tensor) -> Tensor:
    """Integer group ids [N] from per-row keys: rows that are equal get the same id.

    `rows` is [N] (e.g. a prompt index) or [N, L] (e.g. left-padded prompt token ids; two completions belong to
    the same group iff their prompt rows are identical). Ids are numbered in order of first appearance.
    """
    if rows.dim() == 1:
        rows = rows.unsqueeze(1)
    if rows.dim() != 2:
        raise ValueError(f"rows must be [N] or [N, L], got shape {tuple(rows.shape)}")
    _, inverse = torch.unique(rows, dim=0, return_inverse=True)
    # Renumber by first appearance so ids read naturally in error messages.
    first = {}
    return torch.tensor([first.setdefault(int(i), len(first)) for i in inverse.tolist()], dtype=torch.long)


def layout_counts(micro_batches: list[Tensor]) -> list[list[int]]:
    """For each group, how many of its rows each micro-batch holds (only the micro-batches that hold any).

    `micro_batches` lists the group ids of each micro-batch in the order they reach the loss. A whole-group
    layout with K = 4 reads ``[[4], [4], ...]``; a shuffled one reads e.g. ``[[4], [2, 2], [1, 3], ...]``.
    """
    per_group: dict[int, list[int]] = {}
    for ids in micro_batches:
        values, counts = torch.unique(ids, return_counts=True)
        for g, c in zip(values.tolist(), counts.tolist()):
            per_group.setdefault(g, []).append(c)
    return [per_group[g] for g in sorted(per_group)]


def whole_group_violations(group_ids: Tensor, group_size: int) -> list[str]:
    """Reasons why `group_ids` [N] is not K-contiguous whole groups (empty list = layout is whole).

    Whole means: N is a multiple of K, each consecutive block of K rows carries one id, and no id appears in
    two blocks (a group is never split, even into two whole-looking halves).
    """
    if group_size < 2:
        return [f"group size K must be >= 2, got {group_size}"]
    ids = group_ids.reshape(-1).to(torch.long)
    n = ids.numel()
    if n == 0 or n % group_size:
        return [f"micro-batch has {n} rows, not a positive multiple of K = {group_size}"]
    blocks = ids.view(-1, group_size)
    problems = []
    mixed = (blocks != blocks[:, :1]).any(dim=1).nonzero().flatten().tolist()
    if mixed:
        j = mixed[0]
        problems.append(f"{len(mixed)} block(s) of K = {group_size} rows mix groups (block {j}: ids "
                        f"{blocks[j].tolist()})")
    heads = blocks[:, 0]
    if torch.unique(heads).numel() != heads.numel():
        problems.append(f"a group is spread over several blocks (block group ids {heads.tolist()})")
    return problems


def check_whole_groups(group_ids: Tensor, group_size: int, *, where: str = "micro-batch") -> None:
    """Raise ValueError (naming the layout) unless `group_ids` forms whole, contiguous groups of K."""
    problems = whole_group_violations(group_ids, group_size)
    if problems:
        raise ValueError(
            f"TPO needs whole groups in every {where}: rows [jK, (j+1)K) must be the K = {group_size} completions "
            f"of one prompt, but " + "; ".join(problems) + ". The batch was shuffled or split below group level."
        )


def standardized_block_violations(u: Tensor, group_size: int, *, atol: float = 1e-3) -> list[str]:
    """Reasons why per-row scores `u` [N] are not K-blocks of within-group population z-scores.

    A true group's z-scores sum to 0 and have population variance 1, or are all 0 (a zero-variance group);
    K rows taken from different groups generally fail both. This is a necessary condition only: a mixed block
    whose scores happen to have mean 0 and variance 1 passes.
    """
    u = u.reshape(-1).double()
    n = u.numel()
    if group_size < 2 or n == 0 or n % group_size:
        return [f"{n} rows is not a positive multiple of K = {group_size}"]
    blocks = u.view(-1, group_size)
    mean = blocks.mean(dim=1)
    var = (blocks - mean[:, None]).square().mean(dim=1)
    # standardize_scores leaves a group with population std <= 1e-6 merely centred (std below the threshold).
    zero = var.sqrt() <= 1.5 * ZERO_VARIANCE_STD
    bad = (mean.abs() > atol) | ~(zero | ((var - 1.0).abs() <= atol))
    if bad.any():
        j = int(bad.nonzero()[0])
        return [f"{int(bad.sum())} of {blocks.shape[0]} block(s) are not a group's z-scores (block {j}: mean "
                f"{float(mean[j]):.4g}, population variance {float(var[j]):.4g}; a whole group has mean 0 and "
                f"variance 1, or is all 0)"]
    return []
