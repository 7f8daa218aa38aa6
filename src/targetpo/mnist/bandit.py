r"""MNIST as a one-step contextual bandit (paper §3.3, App. C; docs/experiments.md §E3, §E3b, §E13).

The agent sees an image, samples one class a ~ π(·|x), and receives r = 1{a = y}; it never sees y. This module
holds the pieces every MNIST experiment shares:

- random streams: per-seed minibatch indices (uniform with replacement) and action noise, shared by every
  method and delay of a seed (common random numbers, as in the authors' code);
- `bandit_loss`: each method's loss on a batch, the registry objective it names (:func:`objective`);
- App. C closed forms: each method's expected logit-space update g(π, y), its one-vs-rest ("scalar")
  approximation, and the wrong-class concentration used by the mechanism analysis (Fig. 4b).

Advantage. A = r − Σ_i π_i², the expected-reward baseline (the authors' code computes it from the policy being
trained, which on-policy is also the one that acted; under staleness `bandit_loss` takes it from either,
docs/experiments.md §E13).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

from targetpo import objectives as obj
from targetpo.objectives import expected_baseline, reinforce_loss, standardize_scores
from targetpo.objectives.tpo import one_hot_inv_lambda

NUM_CLASSES = 10
STREAM_INIT, STREAM_DATA = 0, 1
_BLOCK = 100  # steps of indices/noise drawn per generator call; fixed so streams never depend on a config


def seed_generators(seeds: list[int], stream: int) -> list[torch.Generator]:
    """One independent torch.Generator per seed value for a named stream (init, data, ...)."""
    out = []
    for s in seeds:
        state = np.random.SeedSequence([int(s), stream]).generate_state(1, np.uint64)[0]
        out.append(torch.Generator().manual_seed(int(state) >> 1))
    return out


class BatchStream:
    """Minibatch indices [S, B] (uniform with replacement over `n_train`) and action noise [S, B] ~ U[0, 1),
    step by step. Seed s's stream depends only on its seed value, never on how many seeds or methods run."""

    def __init__(self, seeds: list[int], n_train: int, batch: int):
        self._gens = seed_generators(seeds, STREAM_DATA)
        self._n, self._b = n_train, batch
        self._idx = self._noise = None
        self._pos = _BLOCK

    def next(self) -> tuple[Tensor, Tensor]:
        if self._pos == _BLOCK:
            self._idx = torch.stack([torch.randint(self._n, (_BLOCK, self._b), generator=g) for g in self._gens], 1)
            self._noise = torch.stack([torch.rand(_BLOCK, self._b, generator=g, dtype=torch.float32)
                                       for g in self._gens], 1)
            self._pos = 0
        self._pos += 1
        return self._idx[self._pos - 1], self._noise[self._pos - 1]


def log_softmax(logits: Tensor) -> Tensor:
    """Max-shifted log-softmax over the last dim, written out: for C = 10 it is several times faster on CPU
    than torch.log_softmax's generic kernel (the same formula)."""
    shifted = logits - logits.detach().amax(dim=-1, keepdim=True)
    return shifted - shifted.exp().sum(dim=-1, keepdim=True).log()


def sample_actions(probs: Tensor, noise: Tensor) -> Tensor:
    """Inverse-CDF sampling a ~ probs with shared uniforms `noise` (one per context): probs [..., C],
    noise broadcastable to probs[..., 0]. The same noise drives every method's own π."""
    cdf = probs.cumsum(dim=-1)
    return (cdf < noise.unsqueeze(-1)).sum(dim=-1).clamp_max(probs.shape[-1] - 1)


# ----------------------------------------------------------------------------- losses

ON_POLICY = ("ce", "pg", "dg", "tpo", "grpo", "group_pg")
OFF_POLICY = ("reinforce", "pg_is", "ppo", "dg", "tpo")
# The methods whose bandit_loss reads η (TPO's target, DG's gate, Group PG's u/η): an experiment's READ_BY.
READS_ETA = ("tpo", "dg", "group_pg")
# MNIST method -> registry objective where the names differ: "pg" is Fig. 4a's REINFORCE and "grpo" the
# single-sample, batch-standardized GRPO of §E3. Every other method is a registry name.
OBJECTIVE_OF = {"pg": "reinforce", "grpo": "grpo_single"}


def objective(method: str) -> obj.Objective:
    """The registry objective behind an MNIST method (ValueError for a name MNIST does not run)."""
    if method not in ON_POLICY + OFF_POLICY:
        raise ValueError(f"unknown MNIST bandit method {method!r}; known: {sorted(set(ON_POLICY + OFF_POLICY))}")
    return obj.resolve(method, OBJECTIVE_OF)


def one_hot_scores(advantages: Tensor, actions: Tensor, num_classes: int = NUM_CLASSES) -> Tensor:
    """TPO's score vector over all classes: s = A · onehot(a) (docs/experiments.md §E3)."""
    return advantages.unsqueeze(-1) * torch.nn.functional.one_hot(actions, num_classes).to(advantages.dtype)


def _at_class(values: Tensor, classes: Tensor) -> Tensor:
    """values [..., C] at one class per context, classes [...] (a sampled action or a label)."""
    return values.gather(-1, classes.unsqueeze(-1)).squeeze(-1)


def bandit_loss(
    method: str,
    logits: Tensor,
    actions: Tensor,
    labels: Tensor,
    behaviour_logp: Tensor,
    *,
    eta: float = 1.0,
    clip_eps: float = 0.2,
    baseline_logp: Tensor | None = None,
    anchor_logp: Tensor | None = None,
) -> Tensor:
    r"""One method's loss on a batch of S independent networks: logits [S, B, C] (current parameters),
    actions and labels [S, B], behaviour_logp [S, B, C] (log-probs of the policy that acted, no grad).
    baseline_logp / anchor_logp [S, B, C] (no grad; default behaviour_logp): the policy whose Σπ² is the
    advantage baseline, and TPO's anchor p_old. On-policy all three are the same policy; under staleness
    (docs/experiments.md §E13) they may be the learner's own.

    Returns Σ_s (per-seed batch mean), so each seed's gradient is exactly its own network's batch-mean
    gradient. Every loss is a library objective:

    - ce: −log π(y) (oracle; sees the label).
    - pg / reinforce: REINFORCE, A = r − Σπ_b² (`reinforce_loss`). pg and reinforce are the same loss;
      "reinforce" is the name the staleness table uses.
    - dg: σ(A·(−log π_θ(a))/η)·A gate on −log π_θ(a) (`dg_loss`; the gate reads the current log-prob).
    - tpo: cross-entropy to q ∝ p_old·exp(u/η) over all C classes with scores A·onehot(a), p_old the anchor
      (`tpo_loss`).
    - grpo: single-sample GRPO, REINFORCE with rewards standardized over each seed's batch
      (`batch_standardized_pg_loss`).
    - group_pg: REINFORCE with TPO's standardized score of the sampled class, u_a = ±√(C−1)/η
      (`standardize_scores` + `reinforce_loss`; the paper's single-sample MNIST form, docs/experiments.md §E3,
      docs/differences.md §15).
    - pg_is: REINFORCE with the unclipped ratio π_θ(a)/π_b(a) (`importance_weighted_pg_loss`).
    - ppo: one clipped-surrogate step against the behaviour snapshot, ε = clip_eps (`ppo_loss`).
    """
    o = objective(method)
    s, b, c = logits.shape
    old = behaviour_logp.detach()
    # Each method computes only what its loss reads (the same operations as ever, so the same bits).
    if o.name == "ce":  # the label alone: no reward, advantage or sampled log-prob is computed
        return o.fn(logits.reshape(-1, c), labels.reshape(-1)).loss * s
    rewards = (actions == labels).to(logits.dtype)
    if o.name != "grpo_single":  # GRPO standardizes the rewards themselves
        base = old if baseline_logp is None else baseline_logp.detach()
        adv = rewards - expected_baseline(base.exp())
    flat = lambda t: t.reshape(-1)  # noqa: E731  (S·B single-sample contexts; mean = mean over seeds of means)
    if o.name == "tpo":  # the group is all C classes, scored A·onehot(a) (§E3)
        anchor = old if anchor_logp is None else anchor_logp.detach()
        scores = one_hot_scores(adv, actions, c)
        return o.fn(logits.reshape(-1, c), anchor.reshape(-1, c), scores.reshape(-1, c), eta=eta).loss * s
    logp_a = _at_class(log_softmax(logits), actions)
    if o.name == "grpo_single":
        out = o.fn(logp_a, rewards)  # standardized within each seed's batch (last dim)
    elif o.name == "group_pg":
        # The paper's single-sample form: REINFORCE on the sampled class's standardized score (§E3, §5.15).
        u_a = _at_class(standardize_scores(one_hot_scores(adv, actions, c)), actions) / eta
        out = reinforce_loss(flat(logp_a), flat(u_a))
    elif o.name == "dg":
        out = o.fn(flat(logp_a), flat(adv), eta=eta)
    elif o.name == "ppo":
        out = o.fn(flat(logp_a), flat(_at_class(old, actions)), flat(adv), clip_eps=clip_eps)
    elif o.name == "pg_is":
        out = o.fn(flat(logp_a), flat(_at_class(old, actions)), flat(adv))
    else:
        out = o.fn(flat(logp_a), flat(adv))
    return out.loss * s


# ----------------------------------------------------------------------------- App. C closed forms

def tpo_beta_plus(p: Tensor, inv_lam: float) -> Tensor:
    """β₊(p) = p(λ−1)/(1 − p + λp) = p(1 − 1/λ)/((1 − p)/λ + p): the weight on e_y − π of the update after a correct
    sample (App. C)."""
    return p * (1.0 - inv_lam) / (inv_lam * (1.0 - p) + p)


def tpo_gamma(r: Tensor, inv_lam: float) -> Tensor:
    """γ(r) = r(λ−1)/(λ(1−r) + r) = r(1 − 1/λ)/(1 − r + r/λ): the suppression of a sampled wrong class with
    probability r (App. C)."""
    return r * (1.0 - inv_lam) / (1.0 - r + inv_lam * r)


def _sigmoid(x: Tensor) -> Tensor:
    return torch.sigmoid(x)


def expected_update(method: str, probs: Tensor, labels: Tensor, eta: float = 1.0) -> Tensor:
    r"""E_a[g], the expected gradient-*descent* direction in logit space for one example (paper App. C;
    docs/experiments.md §E3b), from the policy probs [..., C] and labels [...]. v = e_y − π, p = π_y, b = Σπ²:

    - ce: v.    pg: p·v.    group_pg: 2√(C−1)/η·p·v (= 6·PG for C = 10, η = 1).
    - dg: p(1−b)σ((1−b)(−log p)/η)·v + π·Σ_j α_j − α, α_j = π_j b σ(−b(−log π_j)/η) for j ≠ y, α_y = 0.
    - tpo: p β₊(p)·v + π·Σ_j c_j − c, c_j = π_j γ(π_j) for j ≠ y, c_y = 0, λ = exp(C/√(C−1)/η).
    Logs use clip(π, 1e-8). GRPO has no per-example closed form (its weights couple the batch)."""
    c = probs.shape[-1]
    onehot = torch.nn.functional.one_hot(labels, c).to(probs.dtype)
    p = (probs * onehot).sum(-1, keepdim=True)
    v = onehot - probs
    if method == "ce":
        return v
    if method in ("pg", "reinforce"):
        return p * v
    if method == "group_pg":
        return 2.0 * math.sqrt(c - 1) / eta * p * v
    wrong = 1.0 - onehot
    if method == "dg":
        b = probs.square().sum(-1, keepdim=True)
        surprisal = -probs.clamp_min(1e-8).log()
        alpha = probs * b * _sigmoid(-b * surprisal / eta) * wrong
        right = p * (1.0 - b) * _sigmoid((1.0 - b) * (-p.clamp_min(1e-8).log()) / eta)
        return right * v + probs * alpha.sum(-1, keepdim=True) - alpha
    if method == "tpo":
        inv_lam = one_hot_inv_lambda(c, eta)
        cj = probs * tpo_gamma(probs, inv_lam) * wrong
        return p * tpo_beta_plus(p, inv_lam) * v + probs * cj.sum(-1, keepdim=True) - cj
    raise ValueError(f"no App. C closed form for method {method!r}")


def scalar_beta(method: str, p: Tensor, num_classes: int = NUM_CLASSES, eta: float = 1.0) -> Tensor:
    r"""β_sym(p): the method's weight on v = e_y − π under the symmetric one-vs-rest approximation
    π_j = q = (1−p)/(C−1) for every wrong class (App. C; docs/experiments.md §E3b). PG-type methods are exactly scalar."""
    q = (1.0 - p) / (num_classes - 1)
    if method == "ce":
        return torch.ones_like(p)
    if method in ("pg", "reinforce"):
        return p
    if method == "group_pg":
        return 2.0 * math.sqrt(num_classes - 1) / eta * p
    if method == "dg":
        b = p.square() + (num_classes - 1) * q.square()
        return (p * (1.0 - b) * _sigmoid((1.0 - b) * (-p.clamp_min(1e-8).log()) / eta)
                + p * b * _sigmoid(-b * (-q.clamp_min(1e-8).log()) / eta))
    if method == "tpo":
        inv_lam = one_hot_inv_lambda(num_classes, eta)
        return p * tpo_beta_plus(p, inv_lam) + p * tpo_gamma(q, inv_lam)
    raise ValueError(f"no scalar approximation for method {method!r}")


def first_order_gains(method: str, probs: Tensor, labels: Tensor, eta: float = 1.0) -> tuple[Tensor, Tensor]:
    """(exact, scalar) first-order gain in p_y: exact = p_y⟨e_y − π, g⟩ (dp_y for a logit step g),
    scalar = p_y β_sym(p_y) ‖e_y − π‖². Both [...]."""
    c = probs.shape[-1]
    onehot = torch.nn.functional.one_hot(labels, c).to(probs.dtype)
    p = (probs * onehot).sum(-1)
    v = onehot - probs
    g = expected_update(method, probs, labels, eta)
    exact = p * (v * g).sum(-1)
    scalar = p * scalar_beta(method, p, c, eta) * v.square().sum(-1)
    return exact, scalar


def concentration(probs: Tensor, labels: Tensor) -> Tensor:
    """Fraction of the wrong-class mass on the most likely wrong class: max_{j≠y} π_j / max(1 − π_y, 1e-8)."""
    onehot = torch.nn.functional.one_hot(labels, probs.shape[-1]).bool()
    wrong_max = probs.masked_fill(onehot, -1.0).amax(-1)
    p = _at_class(probs, labels)
    return wrong_max / (1.0 - p).clamp_min(1e-8)
