"""MNIST bandit with stale actors (talk slides "Off-policy with distributed staleness"; docs/experiments.md §E13).

Actors choose the action for batch t with the parameters from D updates ago, θ_{t−D}; the learner updates
the current θ_t on that batch. Same MNIST bandit, network, Adam and random streams as `mnist`; D = 0 is the
on-policy protocol. The slides give only a table, so every choice they leave open is fixed here:

- Delay: equivalently, at update t the current θ_t acts on batch t + D and the result joins a queue of D
  pending batches (actions and behaviour log-probs, not D parameter snapshots). Batches 0 … D−1 are acted
  by the initial θ_0 (there is no older policy). Every delay sees the same minibatch and action-noise
  sequence, and all (delay, method, seed) networks train together as one batched network.
- What an actor sends: the image, its action a, the reward r and its policy μ. Every other quantity is the
  learner's own, as in the authors' bandit losses, which take the trained policy's log-probs and, separately,
  the (action, reward) feedback.
- Advantage: A = r − Σ_i π_i², the expected-reward baseline of the learner's current π_θ (`baseline`;
  "behaviour" takes Σ μ_i² instead). DG and REINFORCE then use no behaviour probabilities at all (Osband
  2026, arXiv 2603.20521: DG needs none).
- REINFORCE: −A·log π_θ(a), no correction for the stale sampling.
- PG (IS): −sg[ρ]·A·log π_θ(a) with the *unclipped* ratio ρ = π_θ(a)/μ(a) (gradient A·∇ρ).
- PPO: the clipped surrogate min(ρA, clip(ρ, 1−ε, 1+ε)A), ε = 0.2, against the behaviour snapshot μ; one
  epoch (one gradient step per batch, like every method here), so at D = 0 it equals REINFORCE. (Against the
  learner's previous iterate a one-epoch ratio would be 1 and PPO would be REINFORCE at every D.)
- DG: the gate σ(A·(−log π_θ(a))/η) reads the learner's current log-probability; A as above.
- TPO: q ∝ p_old·exp(u/η) over the 10 classes with scores A·onehot(a); the learner fits π_θ to q. The anchor
  p_old (`anchor`) is the learner's sg[π_θ] by default, so the target is a trust region around the current
  learner; "behaviour" anchors on μ, which pulls the learner back towards the D-updates-old policy on every
  class the actor did not pick.
At D = 0 learner and behaviour coincide: REINFORCE, PG (IS) and PPO are the same update (ρ = 1), as in the
slides' first column, and `baseline`/`anchor` change nothing.
"""

from __future__ import annotations

from collections import deque

import numpy as np
import torch

from targetpo import paper
from targetpo.mnist.mlp import bank_forward
from targetpo.runs import plots
from targetpo.runs.stats import (RATE, NOT_REPRODUCED, Verdict, all_of, at_least, at_most, below, count, failure, mean_se,
                                 not_reproduced, paired_interval, seed_interval, seed_noise, within)
from targetpo.mnist.bandit import OFF_POLICY, READS_ETA, BatchStream, bandit_loss, log_softmax, sample_actions
from targetpo.mnist import train as base
from targetpo.mnist.config import MnistConfig
from targetpo.runs.config import config, default, param
from targetpo.mnist.train import LABELS, gather_batch, init_policies, load_data, pct, seed_values, test_probs

NAME = "mnist-staleness"
TITLE = "MNIST bandit with stale actors (talk slides; docs/experiments.md §E13)"
PAPER_REF = "talk slides 'Off-policy with distributed staleness'; docs/experiments.md §E13"
METHODS = OFF_POLICY
DELAYS = (0, 1, 3, 10, 30, 100, 300, 1000)
REFERENCES = ("learner", "behaviour")  # which policy supplies the baseline / TPO's anchor
check_data = base.check_data


@config
class Config(MnistConfig):
    seeds = 3
    steps = default(3000, help="learner updates (one batch each)")
    eval_every = 500
    clip_eps: float = param(0.2, "PPO's clip range ε", gt=0, lt=1)
    baseline: str = param("learner", "whose expected reward Σπ² is the advantage baseline: learner (the current "
                          "π_θ, as the authors' losses compute it) or behaviour (the stale actor's μ)",
                          choices=REFERENCES)
    anchor: str = param("learner", "TPO's anchor p_old: learner (sg π_θ, as the authors' losses compute it) or "
                        "behaviour (the stale actor's μ)", choices=REFERENCES)
    delays: tuple[int, ...] = param(DELAYS, "actor delays D (updates)", ge=0, unique=True)
    methods = default(METHODS, choices=METHODS)
    READ_BY = {"eta": tuple(m for m in READS_ETA if m in METHODS), "clip_eps": ("ppo",), "anchor": ("tpo",)}


PRESETS = {
    "smoke": Config(seeds=2, steps=60, eval_every=20, delays=(0, 3, 30)),
    # 6 seeds, not the class default of 3: with 3 the "TPO lowest at every delay" claim FAILed on seed luck
    # (docs/experiments.md §E13).
    "cpu": Config(seeds=6),
    "paper": Config(seeds=20, steps=10_000),
}
REPRODUCE_PRESET = "cpu"
RUNTIME = "8 delays × 5 methods, ~6.5 min"


UNIT = "stale"  # one unit: every (delay, method, seed) network is stacked into one batched network


def units(cfg: Config) -> list[str]:
    return [UNIT]


# ----------------------------------------------------------------------------- training

def group_params(params: list[torch.Tensor], g: int, groups: int, per_group: int) -> list[torch.Tensor]:
    """The parameters of delay group g's `per_group` networks (a view of the stacked bank, delay-major:
    network copy index = g·per_group + method)."""
    h = params[0].shape[-1] // (groups * per_group)
    cols = slice(g * per_group * h, (g + 1) * per_group * h)
    out = [params[0][:, :, cols], params[1][:, :, cols]]
    for p in params[2:]:
        s = p.shape[0] // (groups * per_group)
        out.append(p.view(s, groups, per_group, *p.shape[1:])[:, g].reshape(s * per_group, *p.shape[1:]))
    return out


class Lookahead:
    """The shared batch stream, readable up to max(delay) batches ahead; batches nobody needs are dropped."""

    def __init__(self, stream: BatchStream):
        self._stream, self._cache, self._next = stream, {}, 0

    def get(self, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        while self._next <= k:
            self._cache[self._next] = self._stream.next()
            self._next += 1
        return self._cache[k]

    def drop(self, k: int) -> None:
        self._cache.pop(k, None)


@base.without_onednn
def run_unit(cfg: Config, unit: str, ctx) -> None:
    data = load_data(cfg, ctx)
    delays, methods = list(cfg.delays), list(cfg.methods)
    groups, per = len(delays), len(methods)
    params, opt = init_policies(cfg, groups * per, inputs=data.pixels)
    batches = Lookahead(BatchStream(seed_values(cfg), len(data.train_y), cfg.batch))

    @torch.no_grad()
    def act(g: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Delay group g's current parameters act on batch k: (actions [S, K, B], log-probs [S, K, B, C])."""
        idx, noise = batches.get(k)
        logp = log_softmax(bank_forward(group_params(params, g, groups, per), gather_batch(data, idx)[0], per))
        return sample_actions(logp.exp(), noise.unsqueeze(1)), logp

    # Batches 0..D−1 are acted by θ_0; afterwards update t acts on batch t−1+D with the current θ_{t−1}.
    pending = [deque(act(g, k) for k in range(min(d, cfg.steps))) for g, d in enumerate(delays)]
    reward = torch.zeros(cfg.seeds, groups, per, dtype=torch.float32)
    s = cfg.seeds
    for t in range(1, cfg.steps + 1):
        for g, d in enumerate(delays):
            if t - 1 + d < cfg.steps:
                pending[g].append(act(g, t - 1 + d))
        acted = [pending[g].popleft() for g in range(groups)]  # batch t−1, acted by θ_{max(t−1−D, 0)}
        actions = torch.stack([a for a, _ in acted], 1)  # [S, G, K, B]
        behaviour = torch.stack([lp for _, lp in acted], 1)  # [S, G, K, B, C]
        idx, _ = batches.get(t - 1)
        batches.drop(t - 1)
        x, y = gather_batch(data, idx)
        logits = bank_forward(params, x, groups * per).view(s, groups, per, *actions.shape[-1:], -1)
        ctx.check_finite(t, {"logits": logits, "behaviour log-probs": behaviour})  # before any loss sees them
        learner = log_softmax(logits.detach())
        ref = {"learner": learner, "behaviour": behaviour}
        yy = y.unsqueeze(1).expand(s, groups, -1).reshape(s * groups, -1)
        flat = lambda v, i: v[:, :, i].reshape(s * groups, *logits.shape[-2:])  # noqa: E731  method i, [S·G, B, C]
        # One loss call per method covers all its delays: [S·G] independent batches, Σ of per-batch means.
        loss = sum(bandit_loss(m, flat(logits, i), actions[:, :, i].reshape(s * groups, -1), yy,
                               flat(behaviour, i), eta=cfg.eta, clip_eps=cfg.clip_eps,
                               baseline_logp=flat(ref[cfg.baseline], i), anchor_logp=flat(ref[cfg.anchor], i))
                   for i, m in enumerate(methods))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        reward += (actions == y[:, None, None]).float().mean(-1)
        if t % cfg.eval_every == 0:
            probs = test_probs(params, data.test_x, groups * per)
            err = (probs.argmax(-1) != data.test_y).float().mean(-1).view(s, groups, per)
            rec = {"step": t}
            for g, d in enumerate(delays):
                for i, m in enumerate(methods):
                    rec[f"{m}.error.D{d}"] = err[:, g, i]
                    rec[f"{m}.reward.D{d}"] = reward[:, g, i] / cfg.eval_every  # the actors' (behaviour) reward
            reward.zero_()
            ctx.log(rec)
            ctx.check_finite(t, {"parameters": params})  # NaN weights still give a finite test error
            ctx.advance(cfg.eval_every)


# ----------------------------------------------------------------------------- report

def finals(run) -> dict[str, dict[int, tuple[float, float, np.ndarray]]]:
    """method -> delay -> (mean, s.e., per-seed) final test error."""
    rows = run.rows(UNIT)
    out: dict[str, dict] = {}
    if not rows:
        return out
    last = rows[-1]
    for m in run.config["methods"]:
        for d in run.config["delays"]:
            key = f"{m}.error.D{d}"
            if key in last:
                v = np.asarray(last[key], dtype=float)
                mean, se = mean_se(v)
                out.setdefault(m, {})[d] = (float(mean), float(se), v)
    return out


def summary(run) -> str:
    f = finals(run)
    if not f:
        return base.NO_EVALUATION
    lo, hi = min(min(d) for d in f.values()), max(max(d) for d in f.values())
    return f"final error D={lo} → D={hi}: " + ", ".join(
        f"{LABELS[m]} {pct(f[m][lo][0])} → {pct(f[m][hi][0])}" for m in f if lo in f[m] and hi in f[m])


def report(run, section) -> None:
    cfg = run.config
    section.text(__doc__.split("\n\n", 1)[1])
    section.text(f"**Data:** {run.meta.get('data_source')}. The same data and network as `mnist`, whose section "
                 "shows the CE oracle's floor on it: no delay can bring a method below that floor.")
    # Runs stored before `baseline` and `anchor` existed used the behaviour policy for both.
    section.text(f"**Advantage baseline:** the {cfg.get('baseline', 'behaviour')} policy's Σπ²; **TPO's anchor:** "
                 f"the {cfg.get('anchor', 'behaviour')} policy.")
    f = finals(run)
    if not f:
        section.text("No evaluation points were recorded.")
        return
    ref = paper.MNIST_STALENESS.values
    delays = sorted({d for v in f.values() for d in v})
    steps = run.rows(UNIT)[-1]["step"]
    rows = []
    for m in f:
        cells = []
        for d in delays:
            paper_v = ref[m][ref["delays"].index(d)] if m in ref and d in ref["delays"] else None
            ours = seed_interval(f[m][d][2], bounds=RATE).show(1, 100) if d in f[m] else "–"
            cells.append(f"{ours} ({paper_v if paper_v is not None else '–'})")
        rows.append([LABELS[m]] + cells)
    section.table(["method"] + [f"D={d}" for d in delays], rows,
                  f"Final test error (%) after {steps:,} updates, {count(cfg['seeds'], 'seed')}: ours, mean [95 % t-interval] "
                  "(slides). The slides' "
                  "step count and data protocol are not stated")

    fig, (ax1, ax2) = plots.figure(2, width=5.4)
    x = np.arange(len(delays))
    for m in f:
        ys = np.array([f[m].get(d, (np.nan, np.nan, None))[0] for d in delays])
        se = np.array([f[m].get(d, (np.nan, np.nan, None))[1] for d in delays])
        color = plots.COLORS.get(m)
        ax1.plot(x, ys, marker="o", color=color, label=LABELS[m])
        ax1.fill_between(x, ys - se, ys + se, color=color, alpha=0.2, lw=0)
        if m in ref:
            pv = [ref[m][ref["delays"].index(d)] / 100 if d in ref["delays"] else None for d in delays]
            plots.paper_points(ax1, x, pv, color, source="slides")
    ax1.set_xticks(x, [str(d) for d in delays])
    plots.finish(ax1, "Final test error vs actor delay (circles: slides)", "delay D (updates)", "test error", log=True)
    worst = max(delays)
    rws = run.rows(UNIT)
    for m in f:
        if worst in f[m]:
            vals = np.array([r[f"{m}.error.D{worst}"] for r in rws], dtype=float)
            plots.curve(ax2, np.array([r["step"] for r in rws]), vals, LABELS[m], plots.COLORS.get(m))
    plots.finish(ax2, f"Test error during training at D={worst}", "update", "test error", log=True)
    section.figure(fig, "mnist_staleness", f"MNIST staleness: seed mean ± s.e. ({count(cfg['seeds'], 'seed')})")

    lo, hi = min(delays), max(delays)
    if lo == hi:
        return

    def err(m, d):
        return f[m][d][0] if m in f and d in f[m] else None

    def ev(*ms):
        return ", ".join(f"{LABELS[m]} {pct(err(m, lo))} → {pct(err(m, hi))} (change {drift(m).show(1, 100)} points)"
                         for m in ms if m in f)

    def drift(m):  # paired over seeds: every delay trains on the same seeds, batches and action noise
        return paired_interval(f[m][hi][2], f[m][lo][2])

    def slides(m, d):
        return ref[m][ref["delays"].index(d)] / 100 if m in ref and d in ref["delays"] else None

    def slides_drift(m):
        return None if slides(m, hi) is None or slides(m, lo) is None else slides(m, hi) - slides(m, lo)

    # What a FAIL here has been checked against (docs/verdicts.md): the paired interval (seed noise), the slides'
    # numbers, and the share of this run acted by the initial policy θ_0 (batches 0 … D−1), which shrinks with
    # the number of updates: D/steps here vs 1000/10,000 at the paper preset.
    share = f"batches 0 … {hi - 1} ({100 * hi / steps:.0f} % of this run's {steps:,} updates) are acted by θ_0"
    checked = (f"checked: paired over {count(cfg['seeds'], 'seed')}; {share}; the slides do not state their step count or "
               "data, and no larger run of this experiment is in this report")

    def drift_failure(m):
        return [seed_noise(drift(m), slides_drift(m), f"change D={lo}→{hi}", 100, " points", 1),
                not_reproduced(drift(m), slides_drift(m), f"change D={lo}→{hi}", checked, 100, " points", 1)]

    if "tpo" in f:
        section.claim(f"TPO is robust to stale actors: final error at D={hi} within 1 point of D={lo} "
                      "(slides: 2.3 % at every delay up to 1000)", within(drift("tpo"), -0.01, 0.01), ev("tpo"),
                      failure=drift_failure("tpo"))
        others = [m for m in f if m != "tpo"]
        gaps = {(m, d): paired_interval(f["tpo"][d][2], f[m][d][2]) for d in delays for m in others
                if d in f[m] and d in f["tpo"]}
        worse = [f"D={d} vs {LABELS[m]} {iv.show(1, 100)}" for (m, d), iv in gaps.items()
                 if at_most(iv, 0) is Verdict.FAIL]
        section.claim("TPO has the lowest final error at every delay (slides)",
                      all_of([at_most(iv, 0) for iv in gaps.values()]),
                      "; ".join(f"D={d}: TPO {pct(err('tpo', d))} vs best other "
                                f"{pct(min(err(m, d) for m in others if d in f[m]))}" for d in delays) if others else "",
                      failure=failure(NOT_REPRODUCED, "TPO − other wholly above 0 (points, paired): "
                                      + "; ".join(worse) + f"; {checked}") if worse else None)
    if "reinforce" in f:
        section.claim(f"REINFORCE collapses under large delay: at D={hi} at least 10 points worse than at D={lo} "
                      "(slides: 6.3 → 78.1 % at D=1000)", at_least(drift("reinforce"), 0.10), ev("reinforce"),
                      failure=drift_failure("reinforce"))
    if "dg" in f:
        section.claim(f"DG is robust: final error at D={hi} within 1 point of D={lo} (slides 2.8 → 2.5 %)",
                      within(drift("dg"), -0.01, 0.01), ev("dg"), failure=drift_failure("dg"))
    if {"pg_is", "reinforce"} <= set(f):
        gap = paired_interval(f["pg_is"][hi][2], f["reinforce"][hi][2])
        section.claim(f"importance weighting limits the damage: PG (IS) at D={hi} far better than REINFORCE "
                      "(slides 9.8 vs 78.1 %)", below(gap, -0.05),
                      ev("pg_is", "reinforce") + f"; PG (IS) − REINFORCE at D={hi}: {gap.show(1, 100)} points")
    if "ppo" in f:
        section.claim(f"PPO against the behaviour snapshot stays stable: D={hi} within 2 points of D={lo} "
                      "(slides 6.3 → 5.4 %)", within(drift("ppo"), -0.02, 0.02), ev("ppo"),
                      failure=drift_failure("ppo"))
