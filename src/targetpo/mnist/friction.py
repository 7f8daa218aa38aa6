"""MNIST bandit under distributed friction (an open question of the paper's §6; docs/experiments.md §E18).

Osband (2026, arXiv 2603.20521) studies DG when the actors of a distributed learner misbehave. Here the MNIST
bandit of `mnist` (same network, Adam, minibatch and action-noise streams) is run under one kind of friction at
a time, every condition and method of a seed stacked into one batched network:

- clean: the `mnist` protocol.
- flip f: each reward is flipped (r → 1 − r) with probability f.
- random f: each reward is replaced by a fair coin with probability f.
- uniform-actor f / frozen-actor f: each image is acted, with probability f, by a broken actor that samples
  uniformly over the 10 classes (uniform) or from the initial network θ_0 that never receives new weights
  (frozen). The learner does not know which samples those are: it trains on every sample as if its own policy
  had acted (behaviour log-probs = the learner's, so the baseline A = r − Σπ² and every method see an
  on-policy batch).
- rare β: discovery is rare at the start: the output bias of a decoy class (class 0) starts at β instead of 0,
  so the initial policy puts almost all mass on it and a correct sample on any other digit has probability
  about 1/(e^β + 9) (β = 6: 0.2 %).
The corruption, broken-actor and coin draws come from their own per-seed stream, shared by every method of a
seed (paired comparisons). Measured: greedy test error every `eval_every` updates and the actors' true reward
(1{a = y}, before corruption); reported: final error and the first update at which the seed-mean error reaches
each of `thresholds`.
"""

from __future__ import annotations

import numpy as np
import torch

from targetpo.mnist import data as mnist_data
from targetpo.mnist import train as base
from targetpo.mnist.bandit import (
    READS_ETA, BatchStream, bandit_loss, log_softmax, sample_actions, seed_generators,
)
from targetpo.mnist.config import MnistConfig
from targetpo.mnist.mlp import bank_forward
from targetpo.mnist.replay import paired, pm, pm_text
from targetpo.mnist.train import (LABELS, gather_batch, init_policies, initial_networks, load_data, seed_values,
                                  test_probs)
from targetpo.runs import plots
from targetpo.runs.config import check_named_values, config, default, param
from targetpo.runs.stats import count, fmt

NAME = "mnist-friction"
TITLE = "MNIST bandit under distributed friction (open question, §6; docs/experiments.md §E18)"
PAPER_REF = "§6 Limitations (open question); Osband 2026 (arXiv 2603.20521); docs/experiments.md §E18"
SUITE = "open-questions"
METHODS = ("tpo", "dg", "grpo", "pg")
STREAM_FRICTION = 3  # per-seed stream of the broken-actor, corruption and coin draws
DECOY = 0  # the class the rare-discovery policy starts on
check_data = base.check_data


@config
class Config(MnistConfig):
    seeds = 5
    steps = default(2000, help="Adam updates (one batch each)")
    eval_every = 200
    flip_fractions: tuple[float, ...] = param((0.1, 0.3), "reward-flip probabilities f (r → 1 − r), one condition "
                                              "each", gt=0, le=1, nonempty=False, unique=True)
    random_fractions: tuple[float, ...] = param((0.3,), "probabilities f that a reward is replaced by a fair coin, "
                                                "one condition each", gt=0, le=1, nonempty=False, unique=True)
    uniform_actor_fractions: tuple[float, ...] = param((0.5,), "fractions of images acted by a uniform-random "
                                                       "actor, one condition each", gt=0, lt=1, nonempty=False,
                                                       unique=True)
    frozen_actor_fractions: tuple[float, ...] = param((0.5,), "fractions of images acted by an actor stuck at the "
                                                      "initial network, one condition each", gt=0, lt=1,
                                                      nonempty=False, unique=True)
    rare_biases: tuple[float, ...] = param((6.0,), "initial output bias β of the decoy class 0 (rare discovery: "
                                           "p(correct) ≈ 1/(e^β + 9) at the start), one condition each", gt=0,
                                           le=30, nonempty=False, unique=True)
    thresholds: tuple[float, ...] = param((0.2, 0.1), "test-error levels for steps-to-threshold", gt=0, lt=1,
                                          unique=True)
    methods = default(METHODS, choices=METHODS + ("group_pg",))
    READ_BY = {"eta": READS_ETA}

    def check(self) -> None:
        super().check()
        for field in ("flip_fractions", "random_fractions", "uniform_actor_fractions", "frozen_actor_fractions",
                      "rare_biases"):
            check_named_values(field, getattr(self, field))  # <kind><level:g> names the metrics


PRESETS = {
    "smoke": Config(seeds=2, steps=60, eval_every=20, flip_fractions=(0.3,), random_fractions=(),
                    frozen_actor_fractions=()),
    "cpu": Config(),
    "paper": Config(seeds=20, steps=10_000, eval_every=200, flip_fractions=(0.1, 0.2, 0.3, 0.4),
                    random_fractions=(0.3, 0.6), uniform_actor_fractions=(0.25, 0.5, 0.75),
                    frozen_actor_fractions=(0.25, 0.5, 0.75), rare_biases=(4.0, 6.0, 8.0),
                    thresholds=(0.2, 0.1, 0.05)),
}
REPRODUCE_PRESET = "cpu"
RUNTIME = "7 conditions × 4 methods, ~2 min of CPU time on one core"
UNIT = "friction"  # one unit: every (condition, method, seed) network is stacked into one batched network


def units(cfg: Config) -> list[str]:
    return [UNIT]


def conditions(cfg) -> list[tuple[str, str, float]]:
    """(name, kind, level) of every condition, clean first; names are metric-key suffixes (flip0.3, rare6, ...)."""
    get = cfg.get if isinstance(cfg, dict) else lambda k: getattr(cfg, k)
    out = [("clean", "clean", 0.0)]
    for kind, field in (("flip", "flip_fractions"), ("random", "random_fractions"),
                        ("uniform", "uniform_actor_fractions"), ("frozen", "frozen_actor_fractions"),
                        ("rare", "rare_biases")):
        out += [(f"{kind}{v:g}", kind, float(v)) for v in get(field)]
    return out


def describe(kind: str, level: float) -> str:
    return {"clean": "clean", "flip": f"flip {level:g}", "random": f"random reward {level:g}",
            "uniform": f"uniform actor {level:g}", "frozen": f"frozen actor {level:g}",
            "rare": f"rare (β = {level:g})"}[kind]


# ----------------------------------------------------------------------------- friction

def actor_probs(probs: torch.Tensor, broken: torch.Tensor, broken_probs: torch.Tensor) -> torch.Tensor:
    """The acting distribution: `broken_probs` [S, B, C] on the rows where broken [S, B] is True, the learner's
    own `probs` [S, K, B, C] elsewhere."""
    return torch.where(broken[:, None, :, None], broken_probs[:, None], probs)


def corrupt_rewards(rewards: torch.Tensor, hit: torch.Tensor, coin: torch.Tensor, kind: str) -> torch.Tensor:
    """rewards [S, K, B] in {0, 1}; on the rows where hit [S, B] is True: 1 − r ("flip") or coin [S, B] ("random")."""
    if kind == "flip":
        new = 1.0 - rewards
    elif kind == "random":
        new = coin[:, None].expand_as(rewards)
    else:
        raise ValueError(f"kind={kind!r}: reward corruption is 'flip' or 'random'")
    return torch.where(hit[:, None], new, rewards)


def reward_labels(actions: torch.Tensor, rewards: torch.Tensor, num_classes: int) -> torch.Tensor:
    """Labels y' with 1{a = y'} = rewards: the action itself where the (possibly corrupted) reward is 1, another
    class where it is 0; `bandit_loss` then sees exactly the corrupted reward."""
    return torch.where(rewards > 0.5, actions, (actions + 1) % num_classes)


@base.without_onednn
def run_unit(cfg: Config, unit: str, ctx) -> None:
    data = load_data(cfg, ctx)
    conds, methods = conditions(cfg), list(cfg.methods)
    groups, per, s, c = len(conds), len(methods), cfg.seeds, mnist_data.NUM_CLASSES
    params, opt = init_policies(cfg, groups * per, inputs=data.pixels)
    with torch.no_grad():  # rare discovery: the decoy class starts with bias β (Adam's state is still empty)
        bias = params[-1].view(s, groups, per, c)
        for g, (_, kind, level) in enumerate(conds):
            if kind == "rare":
                bias[:, g, :, DECOY] = level
    frozen = None
    if any(kind == "frozen" for _, kind, _ in conds):  # θ_0, the same initial weights as every learner of a seed
        frozen = [p.detach() for p in initial_networks(cfg, 1, data.pixels)]
    stream = BatchStream(seed_values(cfg), len(data.train_y), cfg.batch)
    draws = seed_generators(seed_values(cfg), STREAM_FRICTION)
    reward = torch.zeros(s, groups, per)
    for t in range(1, cfg.steps + 1):
        idx, noise = stream.next()
        v, w, z = torch.stack([torch.rand(3, cfg.batch, generator=gen) for gen in draws], 1)  # each [S, B]
        x, y = gather_batch(data, idx)
        logits = bank_forward(params, x, groups * per).view(s, groups, per, cfg.batch, c)
        ctx.check_finite(t, {"logits": logits})  # before any loss sees them
        with torch.no_grad():
            logp = log_softmax(logits.detach())
            probs = logp.exp()
            acting = probs.clone()
            frozen_probs = None if frozen is None else torch.softmax(bank_forward(frozen, x, 1)[:, 0], -1)
            for g, (_, kind, level) in enumerate(conds):
                if kind in ("uniform", "frozen"):
                    other = torch.full_like(probs[:, g, 0], 1.0 / c) if kind == "uniform" else frozen_probs
                    acting[:, g] = actor_probs(probs[:, g], v < level, other)
            actions = sample_actions(acting, noise[:, None, None])  # [S, G, K, B]
            true = (actions == y[:, None, None]).float()
            seen = true.clone()
            for g, (_, kind, level) in enumerate(conds):
                if kind in ("flip", "random"):
                    seen[:, g] = corrupt_rewards(true[:, g], w < level, (z < 0.5).float(), kind)
            labels = reward_labels(actions, seen, c)
        flat = lambda x, i: x[:, :, i].reshape(s * groups, *x.shape[3:])  # noqa: E731  (one method, all conditions)
        loss = sum(bandit_loss(m, flat(logits, i), flat(actions, i), flat(labels, i), flat(logp, i), eta=cfg.eta)
                   for i, m in enumerate(methods))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        reward += true.mean(-1)
        if t % cfg.eval_every == 0:
            probs_test = test_probs(params, data.test_x, groups * per)
            err = (probs_test.argmax(-1) != data.test_y).float().mean(-1).view(s, groups, per)
            rec = {"step": t}
            for g, (name, _, _) in enumerate(conds):
                for i, m in enumerate(methods):
                    rec[f"{m}.error.{name}"] = err[:, g, i]
                    rec[f"{m}.reward.{name}"] = reward[:, g, i] / cfg.eval_every
            reward.zero_()
            ctx.log(rec)
            ctx.check_finite(t, {"parameters": params})
            ctx.advance(cfg.eval_every)


# ----------------------------------------------------------------------------- report

def error_values(run) -> tuple[np.ndarray, dict[str, dict[str, np.ndarray]]]:
    """(steps, method -> condition -> errors [points, seeds])."""
    rows = run.rows(UNIT)
    steps = np.array([r["step"] for r in rows])
    out: dict[str, dict] = {}
    for m in run.config["methods"]:
        for name, _, _ in conditions(run.config):
            key = f"{m}.error.{name}"
            if rows and key in rows[-1]:
                out.setdefault(m, {})[name] = np.array([r[key] for r in rows], dtype=float)
    return steps, out


def steps_to(steps: np.ndarray, values: np.ndarray, threshold: float) -> tuple[int | None, int]:
    """(first update at which the seed-mean error is ≤ threshold, number of seeds that ever reach it)."""
    mean = values.mean(-1)
    hit = np.flatnonzero(mean <= threshold)
    return (int(steps[hit[0]]) if hit.size else None), int((values <= threshold).any(0).sum())


def summary(run) -> str:
    _, e = error_values(run)
    if not e:
        return base.NO_EVALUATION
    return "final error: " + "; ".join(
        f"{LABELS[m]} " + ", ".join(f"{n} {100 * v[-1].mean():.1f} %" for n, v in conds.items()) for m, conds in e.items())


def report(run, section) -> None:
    cfg = run.config
    section.text(__doc__.split("\n\n", 1)[1])
    section.text(f"**Data:** {run.meta.get('data_source')}.")
    steps, e = error_values(run)
    if not e:
        section.text("No evaluation points were recorded.")
        return
    conds = [cd for cd in conditions(cfg) if any(cd[0] in v for v in e.values())]
    names = [n for n, _, _ in conds]
    desc = {n: describe(k, lv) for n, k, lv in conds}
    section.table(["method"] + [desc[n] for n in names],
                  [[LABELS[m]] + [pm(v[n][-1]) if n in v else "–" for n in names] for m, v in e.items()],
                  f"Final test error (%) after {int(steps[-1]):,} updates: mean ± 95 % t interval over "
                  f"{count(cfg['seeds'], 'paired seed')}")
    for th in cfg["thresholds"]:
        cells = []
        for m, v in e.items():
            row = [LABELS[m]]
            for n in names:
                first, n_hit = steps_to(steps, v[n], th) if n in v else (None, 0)
                row.append(f"{fmt(first)} ({n_hit}/{v[n].shape[-1] if n in v else 0})")
            cells.append(row)
        section.table(["method"] + [desc[n] for n in names], cells,
                      f"Updates until the seed-mean test error first reaches {100 * th:g} % ('–': never in this run; "
                      "in brackets, the seeds that ever reach it)")

    fig, (ax1, ax2) = plots.figure(2, width=5.6)
    x = np.arange(len(names))
    for m, v in e.items():
        final = [v[n][-1] for n in names]
        mean = np.array([f.mean() for f in final])
        se = np.array([f.std() / np.sqrt(len(f)) for f in final])
        ax1.errorbar(x + 0.08 * (list(e).index(m) - len(e) / 2), mean, yerr=se, marker="o", ls="none",
                     color=plots.COLORS.get(m), label=LABELS[m], capsize=2)
    ax1.set_xticks(x, [desc[n] for n in names], rotation=35, ha="right", fontsize=7)
    plots.finish(ax1, "Final test error by condition (± s.e.)", "", "test error", log=True)
    rare = next((n for n, k, _ in conds if k == "rare"), None)
    shown = rare or names[-1]
    for m, v in e.items():
        plots.curve(ax2, steps, v[shown], LABELS[m], plots.COLORS.get(m))
    plots.finish(ax2, f"Test error during training: {desc[shown]}", "update", "test error", log=True)
    section.figure(fig, "mnist_friction", f"MNIST friction: seed mean ± s.e. ({count(cfg['seeds'], 'seed')})")

    section.text("**What this run shows** (computed from the per-seed final errors; paired differences with 95 % "
                 "t intervals):\n\n" + "\n".join(f"- {line}" for line in findings(e, names, desc, section.gives_verdicts)))


def findings(e: dict[str, dict[str, np.ndarray]], names: list[str], desc: dict[str, str],
             decides: bool = True) -> list[str]:
    out = []
    for n in names:
        have = {m: v[n][-1] for m, v in e.items() if n in v}
        best = min(have, key=lambda m: have[m].mean())
        line = f"{desc[n]}: lowest final error {LABELS[best]} ({pm(have[best])} %)"
        if n != "clean":
            costs = []
            for m, v in e.items():
                if n in v and "clean" in v:
                    d, h, word = paired(v[n][-1], v["clean"][-1])
                    costs.append(f"{LABELS[m]} {pm_text(100 * d, 100 * h, signed=True)}")
            line += "; cost vs clean, points: " + ", ".join(costs)
        if {"tpo", "dg"} <= set(e) and n in e["tpo"] and n in e["dg"]:
            d, h, word = paired(e["tpo"][n][-1], e["dg"][n][-1], decides)
            verdict = f"TPO {word}" if word in ("lower", "higher") else word
            line += f"; TPO − DG {pm_text(100 * d, 100 * h, signed=True)} ({verdict})"
        out.append(line)
    return out
