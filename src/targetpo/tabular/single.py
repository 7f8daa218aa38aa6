"""Tabular single-context bandit (paper §3.1, Fig. 2; docs/experiments.md §E1).

One context, A = 100 actions, correct action 0, reward 1{a = 0}. Logits start at zero. Each step draws B
actions from π, forms a logit-space direction g from the method's objective, and takes a fixed-length step
logits += α·g/‖g‖ (no optimizer, so only the *direction* of each method matters).

Directions are the negative gradients of the library's objectives with respect to the logits:
- PG: REINFORCE with the code's constant baseline 0.5;
- DG: the same advantages through the delight gate;
- GRPO: REINFORCE with batch z-scored rewards (√(var + 1e-8), as the authors' tabular code, docs/differences.md §12);
- TPO: the group is the *full* action set, scored by the batch-averaged advantage of each action
  (S[a] = mean_j A_j·1{a_j = a}; unsampled actions score 0), so g = q − π.
All methods see the same uniform draws at every step (common random numbers). Error ε_t = 1 − π_t(0) is
recorded *before* the step; misalignment is 1 − cos(g, g*_PG) with g*_PG = π(0)(e_0 − π) the exact expected PG.
"""

from __future__ import annotations

import numpy as np
import torch

from targetpo import paper
from targetpo.runs.config import config, default, param
from targetpo.tabular.config import TabularConfig, claims_blocked_by_divergence, error_rows
from targetpo.objectives import dg_loss, reinforce_loss, tpo_loss
from targetpo.runs import plots
from targetpo.runs.stats import (MISALIGNMENT, above, all_of, below, bootstrap_hits, bootstrap_interval, curves,
                                 final_interval, first_below, fmt, ours_vs_paper, paired_interval, reached_by_any,
                                 steps_to_interval)
from targetpo.tabular.bandit import correct_direction, misalignment, normalized_step, squared_norm

NAME = "tabular-single"
TITLE = "Tabular single-context bandit (paper §3.1, Fig. 2)"
PAPER_REF = "§3.1, Fig. 2; docs/experiments.md §E1"
METHODS = ("pg", "dg", "tpo", "grpo")


@config
class Config(TabularConfig):
    steps = 150
    actions = 100
    # As the authors' code: one generator for all seeds, so a seed's draws depend on how many seeds run.
    seed = default(0, help="seeds the one generator every seed's draws come from (as the authors' code): seed s of "
                           "a run with n seeds is not the run of seed=s with one seed")
    batch: int = param(100, "B, actions sampled per step", ge=1)
    # Rewards are 0 or 1; past ~1e150 the squared step overflows (PG froze silently, TPO's scores became inf).
    baseline: float = param(0.5, "the constant baseline of PG, DG and TPO's per-action scores (the authors' code "
                            "uses 0.5)", ge=-1e6, le=1e6)
    eta = default(1.0, help="DG gate temperature")
    methods = default(METHODS, choices=METHODS)
    READ_BY = {"eta": ("dg",), "baseline": ("pg", "dg", "tpo")}


# The paper's protocol runs in seconds on a CPU, so the cpu preset is the paper's.
PRESETS = {"smoke": Config(seeds=2, steps=20), "cpu": Config(), "paper": Config()}
REPRODUCE_PRESET = "paper"
RUNTIME = "~0.5 s"


def direction(method: str, logits: torch.Tensor, actions: torch.Tensor, rewards: torch.Tensor, cfg: Config) -> torch.Tensor:
    """Per-seed logit-space update g = −∂L/∂logits for a batch of sampled actions ([S, B] each)."""
    logits = logits.detach().requires_grad_(True)
    log_pi = torch.log_softmax(logits, dim=-1)
    logp_a = log_pi.gather(-1, actions)
    adv = rewards - cfg.baseline
    n_seeds = logits.shape[0]
    if method == "pg":
        loss = reinforce_loss(logp_a, adv, loss_agg="mean").loss * n_seeds
    elif method == "dg":
        loss = dg_loss(logp_a, adv, eta=cfg.eta, loss_agg="mean").loss * n_seeds
    elif method == "grpo":
        centred = rewards - rewards.mean(dim=-1, keepdim=True)
        z = centred / torch.sqrt(centred.square().mean(dim=-1, keepdim=True) + 1e-8)
        loss = reinforce_loss(logp_a, z, loss_agg="mean").loss * n_seeds
    elif method == "tpo":
        per_action = torch.zeros_like(logits).scatter_add_(-1, actions, adv) / actions.shape[-1]
        old = torch.log(log_pi.detach().exp() + 1e-8)  # the authors' anchor, log(π + 1e-8)
        loss = tpo_loss(logits, old, per_action).loss * n_seeds
    else:
        raise ValueError(method)
    (grad,) = torch.autograd.grad(loss, logits)
    return -grad


def run_units(cfg: Config, units: list[str], ctxs: dict) -> None:
    """The methods `units` side by side, [M, seeds, A] like seeds: they share the uniform draws (common random
    numbers), and every row is computed as it would be alone, so a method's numbers do not depend on which
    others run with it (tested)."""
    gen = torch.Generator().manual_seed(cfg.seed)  # same draws for every method: common random numbers
    logits = torch.zeros(len(units), cfg.seeds, cfg.actions, dtype=torch.float64)
    for t in range(cfg.steps):
        probs = torch.softmax(logits, dim=-1)
        uniform = torch.rand(cfg.seeds, cfg.batch, generator=gen, dtype=torch.float64)
        cdf = probs.cumsum(dim=-1)
        actions = torch.searchsorted(cdf, uniform * cdf[..., -1:]).clamp_max(cfg.actions - 1)
        rewards = (actions == 0).to(torch.float64)
        g = torch.stack([direction(u, logits[i], actions[i], rewards[i], cfg) for i, u in enumerate(units)])
        g_sq = squared_norm(g)  # shared by the misalignment and the step (the same sums as each would take)
        exact_pg = probs[..., :1] * correct_direction(probs)
        error, mis = 1.0 - probs[..., 0], misalignment(g, exact_pg, g_sq=g_sq)
        for i, u in enumerate(units):
            ctxs[u].log({"step": t, "error": error[i], "misalignment": mis[i]})
            ctxs[u].advance()
        logits = normalized_step(logits, g, cfg.lr, g_sq=g_sq)


def run_unit(cfg: Config, unit: str, ctx) -> None:
    run_units(cfg, [unit], {unit: ctx})


# ----------------------------------------------------------------------------- report

LABELS = {"pg": "PG", "dg": "DG", "tpo": "TPO", "grpo": "GRPO"}


def summary(run) -> str:
    err = curves(run, "error")
    parts = [f"{LABELS[m]} final {fmt(err[m][1][-1])} first<1% {fmt(first_below(err[m][0], err[m][1], 0.01))}"
             for m in err]
    return "error: " + "; ".join(parts)


def report(run, section) -> None:
    section.text(__doc__.split("\n\n", 1)[1])
    ref_e, ref_m = paper.TABULAR_SINGLE_ERROR.values, paper.TABULAR_SINGLE_MISALIGNMENT.values
    err, mis = curves(run, "error"), curves(run, "misalignment")
    last = int(max(s[-1] for s, *_ in err.values()))
    steps_e, rows = error_rows(err, ref_e, LABELS)
    section.table(["method"] + [f"ε@{s}" for s in steps_e] + ["first ε<1%", "first ε<0.1%"], rows,
                  f"Error 1 − π(y*): ours (reference: {paper.TABULAR_SINGLE_ERROR.source})")

    steps_m = [s for s in ref_m["steps"] if s <= last]
    rows = [[LABELS[m]] + ours_vs_paper(mis[m], ref_m["steps"], ref_m[m], MISALIGNMENT) for m in mis]
    section.table(["method"] + [f"@{s}" for s in steps_m], rows, "Misalignment 1 − cos(g, g*_PG): ours (reference)")

    fig, (ax1, ax2) = plots.figure(2)
    for m, (steps, mean, se, vals) in err.items():
        plots.curve(ax1, steps, vals, LABELS[m], plots.COLORS[m], floor=1e-6)
        plots.paper_points(ax1, steps_e, [v for s, v in zip(ref_e["steps"], ref_e[m]["error"]) if s <= last],
                           plots.COLORS[m], source="authors' code")
    plots.finish(ax1, "Error (circles: reference)", "step", "1 − π(y*)", log=True)
    for m, (steps, mean, se, vals) in mis.items():
        plots.curve(ax2, steps, vals, LABELS[m], plots.COLORS[m], floor=1e-6)
    plots.finish(ax2, "Misalignment to the exact PG direction", "step", "1 − cos", log=True)
    section.figure(fig, "tabular_single", "Tabular single-context bandit: seed mean ± s.e.")

    if not claims_blocked_by_divergence(run, err, LABELS, section):
        _claims(err, mis, section)


def _claims(err, mis, section) -> None:
    need = {"tpo", "dg", "pg", "grpo"}
    if not need <= set(err):
        section.claim("all four methods present", None, f"ran {sorted(err)}")
        return
    steps = err["tpo"].steps
    hits = {m: steps_to_interval(err[m].steps, err[m].values, 0.01) for m in err}
    # Paired bootstrap over the shared seeds of the lead (in steps) of the slower of TPO/DG over the faster of
    # PG/GRPO; "never" counts as one step past the run, so the lead is always a number.
    end = float(steps[-1] + 1)
    lead = bootstrap_hits(lambda t, d, p, g: np.minimum(np.minimum(p, g), end) - np.minimum(np.maximum(t, d), end),
                          [(err[m].steps, err[m].values) for m in ("tpo", "dg", "pg", "grpo")], 0.01)
    section.claim("TPO and DG converge fastest (first ε < 1% before PG and GRPO)",
                  above(lead, 0) if reached_by_any(hits.values()) else None,
                  "first step < 1%: " + ", ".join(f"{LABELS[m]} {h.show(-1)}" for m, h in hits.items())
                  + f"; lead in steps (bootstrap over seeds): {lead.show(-1)}")
    final = {m: final_interval(err[m]) for m in err}
    section.claim("TPO and DG keep improving below 1% (final ε < 0.1%)",
                  all_of([below(final["tpo"], 1e-3), below(final["dg"], 1e-3)]),
                  ", ".join(f"{LABELS[m]} {v.show(-1)}" for m, v in final.items()))
    ratio = bootstrap_interval(lambda t, p, g: min(g[-1].mean(), p[-1].mean()) / max(t[-1].mean(), 1e-12),
                               *(err[m].values for m in ("tpo", "pg", "grpo")))
    section.claim("GRPO and PG plateau at higher error (final ≥ 5× TPO's)", above(ratio, 5),
                  f"min(GRPO, PG)/TPO (bootstrap over seeds): {ratio.show(-1)}")
    late = mis["tpo"].steps >= min(25, mis["tpo"].steps[-1])
    avg = {m: mis[m].values[late].mean(axis=0) for m in mis}  # per seed: mean misalignment over steps ≥ 25
    gaps = {m: paired_interval(avg["tpo"], avg[m]) for m in mis if m != "tpo"}
    section.claim("TPO has the lowest misalignment (from step 25 on: per-seed mean over those steps)",
                  all_of([below(g, 0) for g in gaps.values()]),
                  "TPO − other: " + ", ".join(f"{LABELS[m]} {g.show(-1)}" for m, g in gaps.items())
                  + f"; at step 0 TPO {fmt(mis['tpo'].mean[0])}, GRPO {fmt(mis['grpo'].mean[0])} (the reference run "
                  "also has TPO above GRPO at step 0)")
    g = mis["grpo"].values
    mid = min(50, len(g) - 1)
    rise = paired_interval(g[-1], g[mid])
    # A run that ends at step 50 or before would compare its last step with itself.
    section.claim("GRPO becomes increasingly misaligned (misalignment at the end > at step 50)",
                  above(rise, 0) if mis["grpo"].steps[-1] > 50 else None,
                  f"GRPO {fmt(mis['grpo'].mean[mid])} at step {mid} → {fmt(mis['grpo'].mean[-1])} at the end; "
                  f"end − step {mid}: {rise.show(-1)}")
