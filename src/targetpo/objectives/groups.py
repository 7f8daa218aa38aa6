"""Group layout: the one set of whole-group checks used by the LLM trainer and the TRL and verl adapters.

A group objective (registry `needs_groups`; TPO's cross-entropy over each prompt's K completions, GRPO's
z-scores) is wrong on a split group, so every micro-batch that reaches the loss must hold whole groups: rows
[jK, (j+1)K) must be the K completions of one prompt. A library that shuffles rows, balances sequences across
devices or packs micro-batches by token count breaks this silently; these functions make the break visible.
Plain torch, no library imports.
"""

from __future__ import annotations

import warnings

import torch
from torch import Tensor

from targetpo.objectives._checks import check_same_shape
from targetpo.objectives.registry import get
from targetpo.objectives.scores import ZERO_VARIANCE_STD


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
            f"a group objective needs whole groups in every {where}: rows [jK, (j+1)K) must be the K = {group_size} completions "
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


def _check_rows(per_token_logps, old_per_token_logps, rewards, completion_mask, group_size) -> None:
    """The trainer-side layout in the trainer's names, before any reshape into groups: a raw reshape or broadcast
    error would name internal shapes ([G, K, T], old_logp, token_mask) the caller never passed."""
    for name, x in (("per_token_logps", per_token_logps), ("rewards", rewards)):
        if not isinstance(x, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 2:
        raise ValueError(f"group_size={group_size!r}: must be an integer >= 2 (K, the completions per prompt)")
    if per_token_logps.dim() != 2:
        raise ValueError(f"per_token_logps has shape {tuple(per_token_logps.shape)}: must be [N, T] (N completions "
                         "of T tokens)")
    check_same_shape(per_token_logps=per_token_logps, old_per_token_logps=old_per_token_logps,
                     completion_mask=completion_mask)
    if rewards.shape != per_token_logps.shape[:1]:
        raise ValueError(f"rewards has shape {tuple(rewards.shape)}: must be [N] = ({per_token_logps.shape[0]},), one "
                         "per completion row of per_token_logps")


def tpo_group_loss(per_token_logps, old_per_token_logps, rewards, completion_mask, group_size: int, *,
                   seq_logp: str = "sum", eta: float = 1.0):
    """TPO on a micro-batch of whole groups laid out as consecutive blocks of `group_size` rows.

    Args:
      per_token_logps, old_per_token_logps: [N, T] completion token log-probs (current / rollout-time).
      rewards: [N] raw rewards, NaN for unscorable completions.
      completion_mask: [N, T] 1 on completion tokens.
    Returns:
      (loss, metrics): the mean over the N/K groups of the cross-entropy to the target (a group with no valid
      candidate counts as 0), and the objective's metrics (target_entropy, kl_q_p, frac_zero_var, ...).
    """
    _check_rows(per_token_logps, old_per_token_logps, rewards, completion_mask, group_size)
    n, t = per_token_logps.shape
    if torch.isinf(rewards).any():
        raise ValueError(f"rewards contains {int(torch.isinf(rewards).sum())} ±inf value(s) (shape "
                         f"{tuple(rewards.shape)}); NaN marks an unscorable completion, inf is not a reward")
    if n % group_size:
        raise ValueError(f"per_token_logps has {n} rows, not a multiple of K = {group_size}")
    g = n // group_size
    tok = completion_mask.bool()
    has_tok = tok.any(dim=-1)
    valid = has_tok & ~torch.isnan(rewards)  # rows without a valid token are masked candidates
    keep = valid.view(g, group_size).any(dim=-1)
    n_keep = int(keep.sum())
    if n_keep == 0:
        # Keeps the graph (a 0 that still reaches every parameter) but never silently: say so and count it.
        warnings.warn(f"TPO: all {g} groups of this micro-batch were dropped (no completion with both a reward and "
                      f"a valid token); its loss is 0", stacklevel=2)
        zero = per_token_logps.sum() * 0.0
        one = torch.tensor(1.0, device=per_token_logps.device)
        return zero, {"frac_groups_dropped": one, "frac_groups_without_signal": one.clone()}

    def grouped(x):
        x = x.reshape(g, group_size, *x.shape[1:])
        return x if n_keep == g else x[keep]

    cand = grouped(valid)
    out = get("tpo").per_token_fn(
        grouped(per_token_logps), grouped(old_per_token_logps), grouped(torch.nan_to_num(rewards, nan=0.0)),
        token_mask=grouped(tok), seq_logp=seq_logp, eta=eta, mask=None if bool(cand.all()) else cand,
    )
    metrics = dict(out.metrics)
    # Fractions of the micro-batch's groups, not counts: trainers average metrics over micro-batches, and an
    # average of counts changes with the micro-batch size. On the log-probs' device: distributed trainers
    # all-gather them (NCCL refuses CPU tensors).
    dev = per_token_logps.device
    metrics["frac_groups_dropped"] = torch.tensor(1.0 - n_keep / g, device=dev)
    # All-equal rewards give q = p_old: no signal in the first pass. Count every group that carries none.
    flat = float(metrics.get("frac_zero_var", torch.tensor(0.0)))
    no_signal = (g - n_keep) + flat * n_keep
    metrics["frac_groups_without_signal"] = torch.tensor(no_signal / g, device=dev)
    if no_signal >= g - 1e-9 * g:
        warnings.warn(f"TPO: none of the {g} groups of this micro-batch carries a signal ({g - n_keep} dropped, "
                      f"the rest with all-equal rewards); the update is 0 on the first pass", stacklevel=2)
    return (out.loss if n_keep == g else out.loss * (n_keep / g)), metrics
