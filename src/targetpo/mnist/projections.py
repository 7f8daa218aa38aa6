"""Other projections onto TPO's target, MNIST contextual bandit (an open question of the paper's §6;
docs/method.md §8, docs/experiments.md §E14).

The MNIST bandit of `mnist` (paper §3.3; docs/experiments.md §E3): an MLP 784-50-50-10 samples one class per
image and is told only whether it was right; TPO's group is all 10 classes with scores A·onehot(a),
A = r − Σπ². Every setting fits the same target q ∝ π_b·exp(u/η), differing only in the projection: forward KL
(TPO, −Σ q log p_θ), reverse KL(p_θ ‖ q), Jensen–Shannon, the α-divergence (α = ½: four times the squared
Hellinger distance), or forward KL with a per-image η chosen so that KL(q ‖ π_b) equals a budget ε ("adaptive
η"). All settings of a seed start from the same weights and see the same minibatches and action noise; one Adam
step per batch; greedy test error every `eval_every` updates. Not a paper experiment: no paper numbers exist.
"""

from __future__ import annotations

import numpy as np
import torch

from targetpo.mnist import train as base
from targetpo.mnist.bandit import BatchStream, log_softmax, one_hot_scores, sample_actions
from targetpo.mnist.config import MnistConfig
from targetpo.mnist.data import NUM_CLASSES
from targetpo.mnist.mlp import bank_forward
from targetpo.objectives import expected_baseline, tpo_loss
from targetpo.objectives.tpo import (ALPHA_MIN, adaptive_kl_floor, projection_label, projection_setting,
                                     repeated_projection)
from targetpo.runs import plots
from targetpo.runs.config import config, default, param
from targetpo.runs.stats import count, difference_read, fmt, mean_se, paired_interval

NAME = "mnist-projections"
TITLE = "Open question: other projections onto TPO's target, MNIST bandit"
PAPER_REF = "§6 (open question); docs/experiments.md §E14"
SUITE = "open-questions"
UNIT = "bandit"  # one unit: all settings and seeds are stacked into one batched network
REFERENCE = "forward_kl"
check_data = base.check_data


# A setting's tpo_loss keywords and its label (declared once, with the token experiment, in objectives/tpo.py).
setting_options = projection_setting
setting_label = projection_label


@config
class Config(MnistConfig):
    methods = default(("forward_kl", "reverse_kl", "js", "alpha0.5", "kl0.5", "kl2"),
                      help="projections to compare: forward_kl (TPO), reverse_kl, js, alpha<α> or kl<ε> (forward KL "
                           "with adaptive η, KL(q ‖ π_b) = ε per image)", unique=True)
    threshold: float = param(0.05, "test-error level whose first crossing is compared", gt=0, lt=1)
    seeds = 5

    def readers(self) -> dict[str, str]:
        return {"eta": "read by the fixed-η settings (all but kl<ε>, which choose η per image)"}

    def unread(self) -> dict[str, str]:
        out = super().unread()
        if all("eta" in setting_options(s) for s in self.methods):
            out["eta"] = f"read only by fixed-η settings, and methods={','.join(self.methods)} are all kl<ε>"
        return out

    def check(self) -> None:
        super().check()
        for s in self.methods:
            try:
                options = setting_options(s)
            except ValueError:
                raise ValueError(f"methods={self.methods!r}: item {s!r} must be one of forward_kl, reverse_kl, js, "
                                 f"alpha<α: 0 or in [{ALPHA_MIN:g}, 1]> (e.g. alpha0.5) or kl<finite ε > 0> (e.g. "
                                 "kl1)") from None
            budget, floor = options.get("kl_budget", 1.0), adaptive_kl_floor(NUM_CLASSES)
            if budget < floor:
                raise ValueError(f"methods={self.methods!r}: {s!r} has a budget below {floor:.3g}, the KL that an "
                                 f"image's group of {NUM_CLASSES} classes may still have at the largest η the adaptive "
                                 "η tries (docs/method.md §8), so it may be out of reach mid-run")
        repeated = repeated_projection(self.methods)  # alpha0.5 and alpha0.50, or alpha1 and forward_kl: one run
        if repeated:
            raise ValueError(f"methods={self.methods!r}: {repeated[0]!r} is the same setting as {repeated[1]!r}")


PRESETS = {
    "smoke": Config(seeds=2, steps=40, eval_every=20, methods=("forward_kl", "reverse_kl", "alpha0.5", "kl1")),
    "cpu": Config(),
    "paper": Config(seeds=20, steps=10_000),
}
REPRODUCE_PRESET = "cpu"
RUNTIME = "6 projections"


def units(cfg: Config) -> list[str]:
    return [UNIT]


def step(params, opt, settings: list[str], x, y, noise, eta: float, check=None) -> None:
    """One update of every network (as `mnist.train.bandit_step`, with each setting's TPO projection)."""
    logits = bank_forward(params, x, len(settings))  # [S, M, B, C]
    if check is not None:
        check({"logits": logits})
    with torch.no_grad():
        logp = log_softmax(logits.detach())
        actions = sample_actions(logp.exp(), noise.unsqueeze(1))
    s, _, b, c = logits.shape
    loss = 0.0
    for i, name in enumerate(settings):
        old = logp[:, i]
        adv = (actions[:, i] == y).to(logits.dtype) - expected_baseline(old.exp())
        scores = one_hot_scores(adv, actions[:, i], c)
        kw = setting_options(name)
        kw.setdefault("eta", eta)
        loss = loss + tpo_loss(logits[:, i].reshape(-1, c), old.reshape(-1, c), scores.reshape(-1, c), **kw).loss * s
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()


@base.without_onednn
def run_unit(cfg: Config, unit: str, ctx) -> None:
    data = base.load_data(cfg, ctx)
    settings = list(cfg.methods)
    params, opt = base.init_policies(cfg, len(settings), inputs=data.pixels)
    stream = BatchStream(base.seed_values(cfg), len(data.train_y), cfg.batch)
    for t in range(1, cfg.steps + 1):
        idx, noise = stream.next()
        x, y = base.gather_batch(data, idx)
        step(params, opt, settings, x, y, noise, cfg.eta, lambda v: ctx.check_finite(t, v))
        if t % cfg.eval_every == 0:
            probs = base.test_probs(params, data.test_x, len(settings))
            err = (probs.argmax(-1) != data.test_y).float().mean(-1)  # [S, M]
            ctx.log({"step": t, **{f"{m}.error": err[:, i] for i, m in enumerate(settings)}})
            ctx.check_finite(t, {"parameters": params})
            ctx.advance(cfg.eval_every)


# ----------------------------------------------------------------------------- report

def _curves(run) -> dict[str, dict]:
    """setting -> {'step', 'values' [points, seeds], 'mean', 'se'}."""
    rows = run.rows(UNIT)
    out = {}
    for m in run.config["methods"]:
        r = [row for row in rows if f"{m}.error" in row]
        if r:
            vals = np.array([row[f"{m}.error"] for row in r], dtype=float)
            out[m] = {"step": np.array([row["step"] for row in r]), "values": vals, **dict(zip(("mean", "se"),
                                                                                             mean_se(vals)))}
    return out


def _first(c: dict, th: float) -> int | None:
    return base.first_at_or_below(c["step"], c["mean"], th)


def _seeds_lower(a: np.ndarray, b: np.ndarray) -> int:
    return int((a < b).sum())


def summary(run) -> str:
    if not _curves(run):
        return base.NO_EVALUATION
    return "final test error: " + ", ".join(f"{setting_label(m)} {base.pct(c['mean'][-1])}"
                                            for m, c in _curves(run).items())


def report(run, section) -> None:
    cfg = run.config
    cur = _curves(run)
    section.text(__doc__.split("\n\n", 1)[1])
    section.text(f"**Data:** {run.meta.get('data_source')}. Preset `{run.meta.get('preset')}`: {count(cfg['seeds'], 'seed')} × "
                 f"{cfg['steps']:,} updates, η = {cfg['eta']:g} for the fixed-η settings.")
    if not cur:
        section.text("No evaluation points were recorded.")
        return
    th = cfg["threshold"]
    labels = {m: setting_label(m) for m in cur}
    ref = cur.get(REFERENCE)
    rows = []
    for m, c in cur.items():
        diff = "–"
        if ref is not None and m != REFERENCE:
            lower = _seeds_lower(c["values"].mean(0), ref["values"].mean(0))
            diff = (f"{paired_interval(c['values'].mean(0), ref['values'].mean(0)).show(2, 100)} "
                    f"({lower}/{c['values'].shape[1]})")
        rows.append([labels[m], base.pct(c["mean"][-1], c["se"][-1]),
                     "{:.2f} ± {:.2f} %".format(*(100 * v for v in mean_se(c["values"].mean(0)))),
                     fmt(_first(c, th)), diff])
    section.table(["setting", "final test error", "mean test error (all evaluations)",
                   f"updates to ≤ {100 * th:g} % (seed mean)",
                   "Δ mean test error vs TPO (points, paired; seeds lower)"], rows,
                  "MNIST bandit test error by projection, seed mean ± s.e.; Δ = this setting's mean test error over "
                  "all evaluations minus TPO's, paired over seeds: mean [95 % t-interval]")
    fig, (ax,) = plots.figure(1, width=6.5, height=4.2)
    # TPO (forward KL) in TPO's colour of every other figure; the other projections from a sweep palette.
    palette = ("#1b9e77", "#d95f02", "#7570b3", "#e7298a", "#66a61e", "#e6ab02", "#a6761d")
    colors = dict(zip((m for m in cur if m != REFERENCE), palette * len(cur)), **{REFERENCE: plots.COLORS["tpo"]})
    for m, c in cur.items():
        plots.curve(ax, c["step"], c["values"], labels[m], colors[m])
    ax.axhline(th, color="k", lw=0.6, ls=":")
    plots.finish(ax, "MNIST bandit, TPO's target fitted by each projection", "updates", "test error (log scale)",
                 log=True)
    section.figure(fig, "mnist_projections", f"Test error by update, seed mean ± s.e. ({count(cfg['seeds'], 'seed')}); dotted "
                   f"line: {100 * th:g} %")
    if ref is None:
        return
    parts = []
    for m, c in cur.items():
        if m == REFERENCE:
            continue
        # Paired 95 % t-intervals over seeds, read by the report's own rule (docs/verdicts.md): no ±2 s.e. shortcut,
        # and nothing decisive on a smoke run.
        final, area = (paired_interval(c["values"][-1], ref["values"][-1]),
                       paired_interval(c["values"].mean(0), ref["values"].mean(0)))
        lower_a = _seeds_lower(c["values"].mean(0), ref["values"].mean(0))
        hm, hr = _first(c, th), _first(ref, th)
        when = (f"never reaches {100 * th:g} %" if hm is None else f"reaches {100 * th:g} % at update {hm:,}") + \
            (f" (TPO: {hr:,})" if hr is not None else ", nor does TPO")
        parts.append(f"{labels[m]} {when}; final test error {final.show(2, 100)} points from TPO's "
                     f"({difference_read(final, section.gives_verdicts)}), mean over all evaluations "
                     f"{area.show(2, 100)} (paired 95 % t-interval over {count(area.n, 'seed')}, lower on {lower_a}/"
                     f"{area.n}; {difference_read(area, section.gives_verdicts)}).")
    section.text("**What the data says.** " + " ".join(parts))
