"""MNIST bandit with replayed rollouts (an open question of the paper's §6; docs/experiments.md §E17).

The staleness experiment (§E13) delays the actors but trains on every batch once. Here each acted batch is
*replayed*: with replay ratio R the actors act one new batch every R updates with the current parameters, the
learner keeps the R newest acted batches and trains each update on one of them drawn uniformly (per seed), so
a batch is used R times in expectation, at ages of 0 … about R² − 1 updates while the policy moves on. R = 1 is
the on-policy protocol of `mnist`. Same MNIST bandit, network, Adam and random streams as `mnist`; every
replay ratio sees the same minibatch and action-noise sequence (ratio R acts stream batch k at update kR + 1),
and all (R, method, seed) networks train together as one batched network.

Methods, each against the behaviour policy μ that acted (its log-probs are stored with the batch):
- TPO: the anchor is μ, q ∝ μ·exp(u/η) over the 10 classes with scores A·onehot(a), A = r − Σ_i μ_i².
- TPO + IS (c̄): the same target with the truncated importance correction of the anchor (docs/method.md §8),
  q_i ∝ μ_i·min(c̄, π_i/μ_i)·exp(u_i/η), π the learner's current policy; one run per c̄ in `is_clips`.
- DG (gate on the learner's current log-prob), PPO (clipped surrogate against μ, ε = clip_eps), PG (IS)
  (unclipped ratio π(a)/μ(a)) and, if asked for, REINFORCE (no correction); A as above, as in §E13.
Measured: greedy test error every `eval_every` updates, the actors' reward on the batches they acted and, for
TPO + IS, the fraction of truncated ratios; reported: final error per (method, R) with paired differences. Every
method does one Adam step per update, so at a given update count a larger R has seen R times fewer samples.
"""

from __future__ import annotations

from collections import deque

import numpy as np
import torch

from targetpo.mnist import train as base
from targetpo.mnist.bandit import (
    BatchStream, bandit_loss, log_softmax, one_hot_scores, sample_actions, seed_generators,
)
from targetpo.mnist.config import MnistConfig
from targetpo.mnist.mlp import bank_forward
from targetpo.mnist.staleness import Lookahead, group_params
from targetpo.mnist.train import LABELS, gather_batch, init_policies, load_data, seed_values, test_probs
from targetpo.objectives import expected_baseline, tpo_loss
from targetpo.objectives._checks import LossOutput
from targetpo.runs import plots
from targetpo.runs.config import check_named_values, config, default, param
from targetpo.runs.stats import count, mean_se, t_quantile

NAME = "mnist-replay"
TITLE = "MNIST bandit with replayed rollouts (open question, §6; docs/experiments.md §E17)"
PAPER_REF = "§6 Limitations (open question); docs/experiments.md §E17"
SUITE = "open-questions"
METHODS = ("tpo", "tpo_is", "dg", "ppo", "pg_is")
CHOICES = METHODS + ("reinforce",)
REPLAYS = (1, 4, 16, 32)
STREAM_REPLAY = 2  # the per-seed stream that picks which buffered batch an update replays
check_data = base.check_data


@config
class Config(MnistConfig):
    seeds = 5
    steps = default(2000, help="learner updates (one replayed batch each)")
    eval_every = 200
    clip_eps: float = param(0.2, "PPO's clip range ε", gt=0, lt=1)
    replays: tuple[int, ...] = param(REPLAYS, "replay ratios R: one new acted batch every R updates, each update "
                                     "trains on one of the R newest drawn uniformly (1 = on-policy)", ge=1, le=1000,
                                     unique=True)
    is_clips: tuple[float, ...] = param((1.0, 10.0), "c̄ of TPO's truncated importance correction of the anchor "
                                        "(method tpo_is runs once per value)", gt=0, le=1e6, unique=True)
    methods = default(METHODS, choices=CHOICES)
    READ_BY = {"eta": ("tpo", "tpo_is", "dg"), "clip_eps": ("ppo",), "is_clips": ("tpo_is",)}

    def check(self) -> None:
        super().check()
        check_named_values("is_clips", self.is_clips)  # tpo_is<c̄:g> names the metrics


PRESETS = {
    "smoke": Config(seeds=2, steps=60, eval_every=20, replays=(1, 4)),
    "cpu": Config(),
    "paper": Config(seeds=20, steps=10_000, eval_every=500, replays=(1, 4, 16, 32, 64)),
}
REPRODUCE_PRESET = "cpu"
RUNTIME = "4 replay ratios × 6 methods, ~3 min of CPU time on one core"
UNIT = "replay"  # one unit: every (replay ratio, method, seed) network is stacked into one batched network


def units(cfg: Config) -> list[str]:
    return [UNIT]


# ----------------------------------------------------------------------------- methods

def variants(methods, is_clips) -> list[tuple[str, str, float | None]]:
    """(metric key, method, c̄): tpo_is runs once per c̄ (keys tpo_is1, tpo_is10, ...)."""
    out = []
    for m in methods:
        out += [(f"tpo_is{c:g}", m, float(c)) for c in is_clips] if m == "tpo_is" else [(m, m, None)]
    return out


def label(key: str) -> str:
    return f"TPO + IS (c̄={key[len('tpo_is'):]})" if key.startswith("tpo_is") else LABELS[key]


_IS_COLORS = ("#ff7f0e", "#8c564b", "#e377c2", "#17becf")  # TPO + IS, one per c̄ (TPO itself is red)


def tpo_is_loss(logits: torch.Tensor, actions: torch.Tensor, labels: torch.Tensor, behaviour_logp: torch.Tensor, *,
                eta: float, is_clip: float) -> LossOutput:
    """`bandit_loss`'s TPO (the group is all C classes, scores A·onehot(a), A = r − Σμ²) with the anchor's
    truncated importance correction `is_clip` (docs/method.md §8). Shapes as bandit_loss; the loss is Σ over
    the S seeds of each seed's batch mean."""
    s, _, c = logits.shape
    old = behaviour_logp.detach()
    adv = (actions == labels).to(logits.dtype) - expected_baseline(old.exp())
    out = tpo_loss(logits.reshape(-1, c), old.reshape(-1, c), one_hot_scores(adv, actions, c).reshape(-1, c),
                   eta=eta, is_clip=is_clip)
    return LossOutput(out.loss * s, out.metrics)


# ----------------------------------------------------------------------------- training

def replay_slots(u: torch.Tensor, size: int) -> list[int]:
    """Which of the `size` buffered batches each seed replays, from one uniform per seed u [S]."""
    return (u * size).long().clamp_max(size - 1).tolist()


@base.without_onednn
def run_unit(cfg: Config, unit: str, ctx) -> None:
    data = load_data(cfg, ctx)
    reps, var = list(cfg.replays), variants(cfg.methods, cfg.is_clips)
    groups, per, s = len(reps), len(var), cfg.seeds
    params, opt = init_policies(cfg, groups * per, inputs=data.pixels)
    batches = Lookahead(BatchStream(seed_values(cfg), len(data.train_y), cfg.batch))
    draws = seed_generators(seed_values(cfg), STREAM_REPLAY)
    buffers = [deque(maxlen=r) for r in reps]  # (indices [S, B], actions [S, K, B], behaviour log-probs [S, K, B, C])
    reward = torch.zeros(s, groups, per)
    acted = torch.zeros(groups)
    truncated = {(g, i): [] for g in range(groups) for i, (_, m, _) in enumerate(var) if m == "tpo_is"}
    slowest = max(reps)
    for t in range(1, cfg.steps + 1):
        u = torch.stack([torch.rand((), generator=gen) for gen in draws])
        loss = 0.0
        for g, r in enumerate(reps):
            gp = group_params(params, g, groups, per)
            if (t - 1) % r == 0:  # the actors act stream batch (t−1)/R with the current parameters
                k = (t - 1) // r
                idx, noise = batches.get(k)
                if r == slowest:
                    batches.drop(k)
                with torch.no_grad():
                    x, y = gather_batch(data, idx)
                    logp = log_softmax(bank_forward(gp, x, per))
                    actions = sample_actions(logp.exp(), noise.unsqueeze(1))
                buffers[g].append((idx, actions, logp))
                reward[:, g] += (actions == y.unsqueeze(1)).float().mean(-1)
                acted[g] += 1
            picked = [buffers[g][j] for j in replay_slots(u, len(buffers[g]))]
            idx = torch.stack([b[0][i] for i, b in enumerate(picked)])
            actions = torch.stack([b[1][i] for i, b in enumerate(picked)])
            behaviour = torch.stack([b[2][i] for i, b in enumerate(picked)])
            x, y = gather_batch(data, idx)
            logits = bank_forward(gp, x, per)  # [S, K, B, C]
            ctx.check_finite(t, {"logits": logits, "behaviour log-probs": behaviour})  # before any loss sees them
            for i, (_, m, clip) in enumerate(var):
                if m == "tpo_is":
                    out = tpo_is_loss(logits[:, i], actions[:, i], y, behaviour[:, i], eta=cfg.eta, is_clip=clip)
                    truncated[g, i].append(float(out.metrics["frac_truncated"]))
                    loss = loss + out.loss
                else:
                    loss = loss + bandit_loss(m, logits[:, i], actions[:, i], y, behaviour[:, i], eta=cfg.eta,
                                              clip_eps=cfg.clip_eps)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if t % cfg.eval_every == 0:
            probs = test_probs(params, data.test_x, groups * per)
            err = (probs.argmax(-1) != data.test_y).float().mean(-1).view(s, groups, per)
            rec = {"step": t}
            for g, r in enumerate(reps):
                for i, (key, _, _) in enumerate(var):
                    rec[f"{key}.error.R{r}"] = err[:, g, i]
                    if acted[g] > 0:
                        rec[f"{key}.reward.R{r}"] = reward[:, g, i] / acted[g]  # the actors' (behaviour) reward
                    if (g, i) in truncated:
                        rec[f"{key}.truncated.R{r}"] = float(np.mean(truncated[g, i]))
                        truncated[g, i].clear()
            reward.zero_()
            acted.zero_()
            ctx.log(rec)
            ctx.check_finite(t, {"parameters": params})
            ctx.advance(cfg.eval_every)


# ----------------------------------------------------------------------------- report

def finals(run) -> dict[str, dict[int, np.ndarray]]:
    """metric key -> replay ratio -> per-seed final test error."""
    rows = run.rows(UNIT)
    if not rows:
        return {}
    last, out = rows[-1], {}
    for key, _, _ in variants(run.config["methods"], run.config["is_clips"]):
        for r in run.config["replays"]:
            if f"{key}.error.R{r}" in last:
                out.setdefault(key, {})[r] = np.asarray(last[f"{key}.error.R{r}"], dtype=float)
    return out


def mean_ci95(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """values [..., seeds] -> (mean, half-width of the 95 % t interval of the mean, t·std(ddof=1)/√n) over the last
    axis; NaN half-width for a single seed (no interval)."""
    v = np.asarray(values, dtype=float)
    n = v.shape[-1]
    if n < 2:
        return v.mean(axis=-1), np.full(v.shape[:-1], np.nan)
    return v.mean(axis=-1), t_quantile(0.975, n - 1) * v.std(axis=-1, ddof=1) / np.sqrt(n)


def pm(values: np.ndarray, scale: float = 100.0) -> str:
    """'mean ± half-width of the 95 % t interval' of per-seed values, in percent."""
    mean, half = mean_ci95(values)
    return pm_text(scale * mean, scale * half)


def pm_text(mean: float, half: float, signed: bool = False) -> str:
    """'mean ± half', or 'mean (1 seed, no interval)' where one seed gives no half-width (NaN)."""
    text = f"{mean:+.2f}" if signed else f"{mean:.2f}"
    return f"{text} ± {half:.2f}" if np.isfinite(half) else f"{text} (1 seed, no interval)"


def paired(a: np.ndarray, b: np.ndarray, decides: bool = True) -> tuple[float, float, str]:
    """Mean of a − b over paired seeds, its 95 % half-width, and 'lower' / 'higher' / 'no detectable difference'
    ('no interval' for one seed; on a preset too short to decide, `decides` False, the word of
    runs.stats.difference_read, as the report's verdicts, docs/verdicts.md)."""
    mean, half = mean_ci95(np.asarray(a) - np.asarray(b))
    word = ("not judged: the preset is too short to decide" if not decides else "no interval"
            if not np.isfinite(half) else "no detectable difference" if abs(mean) <= half else (
                "lower" if mean < 0 else "higher"))
    return float(mean), float(half), word


def summary(run) -> str:
    f = finals(run)
    if not f:
        return base.NO_EVALUATION
    lo, hi = min(run.config["replays"]), max(run.config["replays"])
    return f"final error R={lo} → R={hi}: " + ", ".join(
        f"{label(k)} {100 * v[lo].mean():.1f} → {100 * v[hi].mean():.1f} %" for k, v in f.items() if lo in v and hi in v)


def report(run, section) -> None:
    cfg = run.config
    section.text(__doc__.split("\n\n", 1)[1])
    section.text(f"**Data:** {run.meta.get('data_source')}.")
    f = finals(run)
    if not f:
        section.text("No evaluation points were recorded.")
        return
    reps = sorted({r for v in f.values() for r in v})
    rows_all = run.rows(UNIT)
    steps = rows_all[-1]["step"]
    section.table(["method"] + [f"R={r}" for r in reps],
                  [[label(k)] + [pm(v[r]) if r in v else "–" for r in reps] for k, v in f.items()]
                  + [["batches acted"] + [f"{-(-steps // r):,}" for r in reps]],
                  f"Final test error (%) after {steps:,} updates: mean ± 95 % t interval over {count(cfg['seeds'], 'seed')} "
                  "(paired: every method and ratio shares a seed's initial weights and streams)")
    trunc = {k: {r: rows_all[-1].get(f"{k}.truncated.R{r}") for r in reps} for k in f if k.startswith("tpo_is")}
    if trunc:
        section.table(["method"] + [f"R={r}" for r in reps],
                      [[label(k)] + [f"{100 * v:.1f}" if v is not None else "–" for v in tr.values()]
                       for k, tr in trunc.items()],
                      f"TPO + IS: candidates whose ratio π/μ exceeded c̄ (%, last {cfg['eval_every']} updates)")

    is_keys = [k for k in f if k.startswith("tpo_is")]
    color = lambda k: _IS_COLORS[is_keys.index(k) % len(_IS_COLORS)] if k in is_keys else plots.COLORS.get(k)  # noqa: E731
    fig, (ax1, ax2) = plots.figure(2, width=5.4)
    x = np.arange(len(reps))
    dashed = lambda k: "--" if k.startswith("tpo_is") else "-"  # noqa: E731  (the IS variants, in both panels)
    for k, v in f.items():
        # Per ratio, the seed mean ± s.e. as on the right (a t-interval of 2 seeds spans the whole axis), kept
        # inside the test error's range (0, 1] on the log axis.
        mean = np.array([v[r].mean() if r in v else np.nan for r in reps])
        se = np.array([mean_se(np.asarray(v[r], dtype=float))[1] if r in v else np.nan for r in reps])
        ax1.plot(x, mean, marker="o", color=color(k), label=label(k), ls=dashed(k))
        ax1.fill_between(x, np.clip(mean - se, mean / 2, 1), np.clip(mean + se, 0, 1), color=color(k), alpha=0.15,
                         lw=0)
    ax1.set_xticks(x, [str(r) for r in reps])
    plots.finish(ax1, "Final test error vs replay ratio (± s.e.)", "replay ratio R", "test error", log=True)
    worst = max(reps)
    st = np.array([row["step"] for row in rows_all])
    for k in f:
        key = f"{k}.error.R{worst}"
        if key in rows_all[-1]:
            plots.curve(ax2, st, np.array([row[key] for row in rows_all], dtype=float), label(k), color(k),
                        ls=dashed(k))
    plots.finish(ax2, f"Test error during training at R={worst}", "update", "test error", log=True)
    section.figure(fig, "mnist_replay", f"MNIST replay: seed mean ± s.e. ({count(cfg['seeds'], 'seed')}; the "
                   "tables give 95 % intervals)")

    section.text("**What this run shows** (computed from the per-seed final errors above; paired differences "
                 "with 95 % t intervals):\n\n" + "\n".join(f"- {line}" for line in findings(f, reps, section.gives_verdicts)))


def findings(f: dict[str, dict[int, np.ndarray]], reps: list[int], decides: bool = True) -> list[str]:
    lo, hi = min(reps), max(reps)
    out = []
    for r in reps:
        have = {k: v[r] for k, v in f.items() if r in v}
        best = min(have, key=lambda k: have[k].mean())
        out.append(f"R={r}: lowest final error {label(best)} ({pm(have[best])} %)")
    if lo != hi:
        for k, v in f.items():
            if lo in v and hi in v:
                d, h, word = paired(v[hi], v[lo], decides)
                out.append(f"{label(k)}: R={hi} vs R={lo}: {pm_text(100 * d, 100 * h, signed=True)} points ({word})")
    for k, v in f.items():
        if k.startswith("tpo_is") and "tpo" in f:
            parts = []
            for r in reps:
                if r in v and r in f["tpo"]:
                    d, h, word = paired(v[r], f["tpo"][r], decides)
                    parts.append(f"R={r} {pm_text(100 * d, 100 * h, signed=True)} ({word})")
            out.append(f"{label(k)} minus TPO (anchor μ), points: " + "; ".join(parts))
    return out
