r"""Token-sequence tasks of the paper's transformer experiments (Osband-style "token reversal" family; docs/method.md §6).

A prompt x is H tokens drawn i.i.d. uniform over {0..V−1}, fresh every episode (there is no dataset). The policy
writes an answer a of H tokens after it; the target y is a fixed function of x:

- ``copy``:          y_t = x_t
- ``flip``:          y_t = (V−1) − x_t          (a bit flip for V = 2)
- ``reverse_copy``:  y_t = x_{H−1−t}            ("token reversal")
- ``reverse_flip``:  y_t = (V−1) − x_{H−1−t}

With c_t = 1{a_t = y_t}, the per-token rewards r_t are

- ``bag``        (bag of tokens): r_t = c_t, per-token credit;
- ``sequential``: r_t = Π_{s≤t} c_s, credit only up to the first mistake;
- ``terminal``:   r_t = 1{all c_s = 1} at every t, the exact-match (RLVR-style) reward broadcast over positions;
- ``partial``:    r_t = (1/H) Σ_s c_s at every t, partial credit for the number of correct positions broadcast
  over positions (not in the paper; docs/experiments.md §E16). A sequence-level group then scores each answer
  by its fraction of correct tokens, so a group with no exact match still ranks its answers ("least bad
  teaches"); the engine measures its error as terminal reward's, the fraction of answers with a mistake.

Token-level groups (TPO_token, GRPO_token) score K candidate next tokens at each state of one behaviour
trajectory that follows candidate 0. A candidate's reward is 1{candidate = y_t} (bag) or alive_t·1{candidate =
y_t} (sequential), where alive_t = 1 iff the behaviour prefix a_{<t} is all correct: once the behaviour errs,
every later candidate scores 0 (the "dead prefix": u = 0, so TPO's target is q = p_old there).
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

TASKS = ("copy", "flip", "reverse_copy", "reverse_flip")
REWARDS = ("bag", "sequential", "terminal", "partial")


def check_task(task: str, reward: str) -> None:
    if task not in TASKS:
        raise ValueError(f"task must be one of {TASKS}, got {task!r}")
    if reward not in REWARDS:
        raise ValueError(f"reward must be one of {REWARDS}, got {reward!r}")


def sample_prompts(generators: Sequence[torch.Generator], batch: int, length: int, vocab: int,
                   device: torch.device | str = "cpu") -> Tensor:
    """[S, B, H] int64 prompts, uniform over {0..V−1}; seed s draws from its own generator, so a seed's prompts
    do not depend on which other seeds run beside it."""
    return torch.stack([torch.randint(0, vocab, (batch, length), generator=g, device=device) for g in generators])


def targets(prompts: Tensor, task: str, vocab: int) -> Tensor:
    """The answer the task asks for, same shape as `prompts` ([..., H])."""
    if task == "copy":
        return prompts.clone()
    if task == "flip":
        return (vocab - 1) - prompts
    if task == "reverse_copy":
        return prompts.flip(-1)
    if task == "reverse_flip":
        return (vocab - 1) - prompts.flip(-1)
    raise ValueError(f"task must be one of {TASKS}, got {task!r}")


def token_rewards(actions: Tensor, target: Tensor, reward: str) -> Tensor:
    """Per-token rewards r [..., H] (float32) of answers `actions` [..., H] against `target` (broadcastable)."""
    if actions.shape[-1] != target.shape[-1]:
        raise ValueError(f"actions {tuple(actions.shape)} and target {tuple(target.shape)} differ in length H")
    correct = (actions == target).to(torch.float32)
    if reward == "bag":
        return correct
    if reward == "sequential":
        return correct.cumprod(dim=-1)
    if reward == "terminal":
        return correct.amin(dim=-1, keepdim=True).expand_as(correct).contiguous()
    if reward == "partial":
        return correct.mean(dim=-1, keepdim=True).expand_as(correct).contiguous()
    raise ValueError(f"reward must be one of {REWARDS}, got {reward!r}")


def sequence_scores(rewards: Tensor) -> Tensor:
    """A sequence-level group's candidate score s = mean_t r_t (terminal: 0/1 exact match; bag: fraction right)."""
    return rewards.mean(dim=-1)


def exact_match(actions: Tensor, target: Tensor) -> Tensor:
    """Bool [...]: the whole answer is right."""
    return (actions == target).all(dim=-1)


def candidate_rewards(candidates: Tensor, target: Tensor, reward: str) -> Tensor:
    """Rewards [..., H, K] of K candidate next tokens at each of the H states of one behaviour trajectory.

    Args:
      candidates: [..., H, K] token ids; candidate 0 at state t is the behaviour action a_t.
      target: [..., H] the task's answer.
      reward: "bag" (1{c = y_t}) or "sequential" (alive_t·1{c = y_t}, alive_t = all behaviour tokens before t
        correct). Terminal reward has no per-state credit; the paper's code rejects it for token-level groups.
    """
    if reward not in ("bag", "sequential"):
        raise ValueError(f"token-level candidate groups need reward 'bag' or 'sequential', got {reward!r} "
                         "(terminal reward gives no per-state signal: use sequence-level groups)")
    if candidates.shape[:-1] != target.shape:
        raise ValueError(f"candidates {tuple(candidates.shape)} must be target {tuple(target.shape)} + [K]")
    correct = (candidates == target.unsqueeze(-1)).to(torch.float32)
    if reward == "bag":
        return correct
    behaviour_ok = correct[..., 0]
    # alive_t = Π_{s<t} 1{a_s = y_s}: a shifted cumulative product of the behaviour's correctness.
    alive = torch.cat([torch.ones_like(behaviour_ok[..., :1]), behaviour_ok[..., :-1].cumprod(dim=-1)], dim=-1)
    return correct * alive.unsqueeze(-1)


def initial_error(reward: str, vocab: int, length: int) -> float:
    """Expected error of a uniform policy (a sanity level for untrained curves; docs/method.md §6)."""
    p = 1.0 / vocab
    if reward == "bag":
        return 1.0 - p
    if reward == "sequential":
        # 1 − mean_t p^{t+1}
        return 1.0 - sum(p ** (t + 1) for t in range(length)) / length
    if reward in ("terminal", "partial"):   # partial credit's error is exact-match error too
        return 1.0 - p ** length
    raise ValueError(f"reward must be one of {REWARDS}, got {reward!r}")
