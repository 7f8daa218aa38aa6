"""Section-4 diagnostics: why TPO learns from sparse terminal reward (paper §4.1–4.3, Figs. 10, 11, 14;
docs/experiments.md §E8).

Reverse copy over V = 2 with an exact-match reward at H = 8, B = 256 prompts, K = 32 full answers per prompt for
the grouped methods (TPO with 4 epochs per batch and with 1, GRPO with and without its KL term) and B = 256
single answers for PPO and DG (prompt-matched). At initialisation an answer is right with probability 2^−H, so
a group of K contains no success at all with probability (1 − 2^−H)^K ≈ 0.88: most groups carry no signal.
Every episode logs, per seed, before the update: the error (fraction of sampled answers with a mistake), the
L2 norm of the first epoch's raw gradient, the all-fail fraction (groups with no success; single-sample methods:
failed rollouts), the zero-variance fraction (all-fail and all-success groups), and the update weight on winners
and losers (TPO: mean q_i; GRPO: |A_i|; PPO: |A|; DG: |gate·A|). Curves are smoothed with a trailing moving
average over episodes/40 per seed, as in the authors' figure.

`cpu` preset: H = 6 and K = 8 instead of H = 8 and K = 32 — the same all-fail fraction at initialisation
(1 − (63/64)^8 = 0.118 success vs 1 − (255/256)^32 = 0.118) at 1/8 of the rollouts — with B = 64, 4 seeds and
300 episodes (the paper: 10 seeds × 2000 episodes). Four, not two: GRPO's residual all-fail fraction shows on
some seeds only, and 2 seeds without it FAILed the claim on seed luck (docs/experiments.md §E8).
"""

from __future__ import annotations

import numpy as np

from targetpo import paper
from targetpo.tokens import common as tc
from targetpo.tokens import report as tr
from targetpo.runs.config import config, default
from targetpo.runs.stats import (NOT_REPRODUCED, RATE, SCALE, Verdict, above, all_of, at_least, below,
                                 bootstrap_interval, count, failure, paired_interval, seed_interval, within)
from targetpo.tokens.config import TokenConfig

NAME = "token-diagnostics"
TITLE = "Section-4 diagnostics: all-fail groups, gradient norms, update weights (paper §4, Figs. 10, 11, 14)"
PAPER_REF = "§4.1–4.3, Figs. 10, 11, 14; docs/experiments.md §E8"
METHODS = ("tpo", "tpo_1ep", "grpo", "grpo_no_kl", "ppo", "dg")
ALLOWED = METHODS + ("tpo_no_anchor", "group_pg", "grpo_masked", "reinforce")
PANELS = {"error": "error", "grad_norm": "first-epoch gradient norm", "all_fail": "all-fail fraction",
          "frac_zero_var": "zero-variance fraction", "weight_winners": "weight on winners",
          "weight_losers": "weight on losers"}


@config
class Config(TokenConfig):
    seeds = 10
    episodes = 2000
    reward = "terminal"
    length = 8
    batch = 256
    k = 32
    methods = default(METHODS, choices=ALLOWED, help="which methods to run; tpo_1ep is TPO with 1 epoch per batch "
                      "(Fig. 14)")

    def check(self) -> None:
        tr.check_methods(self, self.methods)


PRESETS = {
    "smoke": Config(seeds=2, episodes=3, length=3, batch=8, k=4),
    "cpu": Config(seeds=4, episodes=300, length=6, batch=64, k=8),
    "paper": Config(),
}
REPRODUCE_PRESET = "cpu"
RUNTIME = "H = 6, K = 8, B = 64, ~6 min"


def run_unit(cfg: Config, unit: str, ctx) -> None:
    tr.run_method(cfg, unit, ctx)


def unit_steps(cfg: Config, unit: str) -> int:
    return cfg.episodes


# ----------------------------------------------------------------------------- report

def theory_all_fail(cfg) -> float:
    """P(no exact match among K uniform answers) = (1 − V^−H)^K."""
    return (1.0 - float(cfg["vocab"]) ** -cfg["length"]) ** cfg["k"]


def _window(cfg) -> int:
    return max(1, cfg["episodes"] // 40)


def _sm(c: tc.Curve, w: int) -> np.ndarray:
    """Seed-mean of the per-seed smoothed curve."""
    return np.nanmean(tr.smooth(c.values, w), axis=1)


def summary(run) -> str:
    err = tc.unit_curves(run, "error")
    return "final-10% error — " + ", ".join(f"{tr.label(m)} {100 * tc.tail_mean(c)[0]:.1f}%" for m, c in err.items())


def report(run, section) -> None:
    cfg = run.config
    metrics = {k: tc.unit_curves(run, k) for k in PANELS}
    err = metrics["error"]
    if not tc.intro(section, run, __doc__, err,
                    tr.horizon_note(run, "10 seeds × 2000 episodes, H = 8, B = 256, K = 32",
                                    f"{count(cfg['seeds'], 'seed')} × {cfg['episodes']} episodes, H = {cfg['length']}, "
                                    f"B = {cfg['batch']}, K = {cfg['k']}")
                    + " Episode counts of the paper (e.g. 'by episode 250') are compared after scaling by "
                      "this run's horizon only where stated."):
        return
    w = _window(cfg)
    grid = {title: metrics[k] for k, title in PANELS.items() if metrics[k]}
    tr.panels(section, grid, "token_diagnostics",
              f"Diagnostics by episode (per-seed trailing mean over {count(w, 'episode')}, then seed mean ± s.e.). "
              "Zero-variance fraction: grouped methods only.", ncols=3,
              log={"error": True, "first-epoch gradient norm": True, "all-fail fraction": False,
                   "zero-variance fraction": False, "weight on winners": True, "weight on losers": True},
              ylabel="", ylabels={t: t for t in PANELS.values()})
    _tables(section, cfg, metrics, w)
    _claims(section, cfg, metrics, w)


def _tables(section, cfg, metrics, w) -> None:
    err, af, gn = metrics["error"], metrics["all_fail"], metrics["grad_norm"]
    ref = paper.SECTION4_DIAGNOSTICS.values
    checkpoint = min(400, cfg["episodes"] - 1)
    rows = []
    for m, c in err.items():
        a = af.get(m)
        g = gn.get(m)
        rows.append([tr.label(m), tr.tail_cell(c),
                     seed_interval(c.values[checkpoint], bounds=RATE).show(2, 100),
                     "–" if a is None else seed_interval(a.values[0], bounds=RATE).show(3),
                     "–" if a is None else tc.tail_iv(a).show(3),
                     "–" if g is None else f"{float(np.nanmax(_sm(g, w))):.3g}",
                     "–" if g is None else f"{tc.tail_mean(g)[0]:.3g}"])
    section.table(["method", "final-10% error %", f"error % at ep. {checkpoint}", "all-fail at ep. 0",
                   "final-10% all-fail", "peak grad norm (smoothed)", "final-10% grad norm"], rows,
                  "Diagnostics summary (seed mean [95 % t-interval]; grad norms: seed means). Single-sample "
                  "methods: all-fail = fraction of failed "
                  "rollouts")
    measured = next((m for m in ("tpo", *af) if m in af and tr.rollout(m) == "group"), None)  # TPO's if it ran
    rows = [["all-fail fraction at initialisation",
             ("–" if measured is None else f"{seed_interval(af[measured].values[0], bounds=RATE).show(3)} "
              f"({tr.label(measured)}, episode 0); ")
             + f"theory (1 − V^−H)^K {theory_all_fail(cfg):.3f}",
             f"{ref['initial_all_fail_fraction']} (theory {1 - ref['theory_frac_success_at_init']:.3f})"],
            ["TPO (4 ep) vs TPO (1 ep) error at episode 400",
             " vs ".join(f"{100 * float(err[m].mean[checkpoint]):.2f}%" for m in ("tpo", "tpo_1ep") if m in err)
             + f" (at ep. {checkpoint})",
             f"{100 * ref['tpo_4ep_error_at_400']:.1f}% vs {100 * ref['tpo_1ep_error_at_400']:.1f}%"],
            ["GRPO error plateau (final-10%)",
             "–" if "grpo" not in err else tc.tail_iv(err["grpo"]).show(1, 100, "%"),
             f"{100 * ref['grpo_error_plateau']:.1f}%"],
            ["DG error plateau (final-10%)", "–" if "dg" not in err else tc.tail_iv(err["dg"]).show(1, 100, "%"),
             f"{100 * ref['dg_plateau']:.0f}%"],
            ["TPO all-fail ≈ 0 by episode", _first_below(af.get("tpo"), 0.01, w),
             f"{ref['tpo_all_fail_near_zero_by_episode']} (of 2000)"]]
    section.table(["quantity", "ours", "paper"], rows,
                  f"Key numbers ours vs the paper ({paper.SECTION4_DIAGNOSTICS.source}; paper at H = 8, K = 32, "
                  "B = 256, 2000 episodes)")


def _first_below(c: tc.Curve | None, x: float, w: int) -> str:
    if c is None:
        return "–"
    return tc.fmt(tc.first_below(c.steps, _sm(c, w), x)) + f" (of {len(c.steps)}, smoothed)"


def _claims(section, cfg, metrics, w) -> None:
    err, af, gn = metrics["error"], metrics["all_fail"], metrics["grad_norm"]
    theory = theory_all_fail(cfg)
    grouped = [m for m in af if tr.rollout(m) == "group"]
    ref = paper.SECTION4_DIAGNOSTICS.values
    paper_cfg = PRESETS["paper"]
    setting = (f"checked: {count(cfg['seeds'], 'seed')} at H = {cfg['length']}, K = {cfg['k']}, B = {cfg['batch']}, "
               f"{cfg['episodes']} episodes (the paper: H = {paper_cfg.length}, K = {paper_cfg.k}, "
               f"B = {paper_cfg.batch}, {paper_cfg.episodes} episodes); no larger run of this experiment is in "
               "this report")
    if grouped:
        start = {m: seed_interval(af[m].values[0], bounds=RATE) for m in grouped}
        # The paper's ≈ 90% is this theory at its H = 8, K = 32; a preset with other H, K predicts another level.
        section.claim(f"At initialisation the all-fail fraction of groups is what theory (1 − V^−H)^K predicts, "
                      f"here {theory:.3f} (the paper: ≈ 90% at H = 8, K = 32; within ±0.05, episode 0, every "
                      "grouped method)",
                      all_of([within(v, theory - 0.05, theory + 0.05) for v in start.values()]),
                      ", ".join(f"{tr.label(m)} {v.show(3)}" for m, v in start.items()))
    else:
        section.claim("At initialisation the all-fail fraction of groups is what theory (1 − V^−H)^K predicts",
                      None, "needs a grouped method")

    learned = "tpo" in err and tc.tail_mean(err["tpo"])[0] < 0.05
    if "tpo" in af and "grpo" in af:
        t, g = tc.tail_values(af["tpo"]), tc.tail_values(af["grpo"])
        parts = {"TPO final-10% all-fail < 0.01": below(seed_interval(t, bounds=RATE), 0.01),
                 "GRPO's > 0.01": above(seed_interval(g, bounds=RATE), 0.01),
                 "GRPO's > 2× TPO's": above(paired_interval(g, 2 * t), 0)}
        failed = [k for k, v in parts.items() if v is Verdict.FAIL]
        section.claim("TPO's all-fail fraction falls to ≈ 0 (final-10% < 0.01) while GRPO keeps a residual "
                      "(final-10% > 2× TPO's and > 0.01) (Fig. 11)", all_of(parts.values()),
                      f"final-10% all-fail: TPO {seed_interval(t, bounds=RATE).show(4)}, GRPO {seed_interval(g, bounds=RATE).show(4)}",
                      failure=failure(NOT_REPRODUCED, f"failing part(s): {', '.join(failed) or 'none'}; the paper's "
                                      f"TPO is at ≈ 0 by episode {ref['tpo_all_fail_near_zero_by_episode']}; "
                                      f"{setting}"))
    else:
        section.claim("TPO's all-fail fraction falls to ≈ 0 while GRPO keeps a residual", None, "needs tpo and grpo")
    if "tpo" in gn and "grpo" in gn and learned:
        # Bootstrap over the shared seeds: TPO's final / its smoothed peak, and GRPO's final / TPO's final.
        decay = bootstrap_interval(lambda v: v[-_tail(v):].mean() / np.nanmax(np.nanmean(tr.smooth(v, w), axis=1)),
                                   gn["tpo"].values)
        ratio = bootstrap_interval(lambda gv, tv: gv[-_tail(gv):].mean() / tv[-_tail(tv):].mean(),
                                   gn["grpo"].values, gn["tpo"].values)
        section.claim("After learning TPO's gradient norm decays to ≈ 0 (final-10% < 10% of its smoothed peak) "
                      "while GRPO's stays large (> 10× TPO's) (Fig. 10a)",
                      all_of([below(decay, 0.1), above(ratio, 10)]),
                      f"TPO final/peak {decay.show(-1)}; GRPO/TPO final {ratio.show(-1)} (bootstrap)")
    else:
        section.claim("After learning TPO's gradient norm decays to ≈ 0 while GRPO's stays large", None,
                      "needs tpo and grpo, with TPO's final-10% error < 5%")
    if "tpo" in err and "tpo_1ep" in err:
        hits = {(m, x): tc.steps_iv(err[m], x) for m in ("tpo", "tpo_1ep") for x in (0.05, 0.01)}
        decided = any(np.isfinite(h.estimate) for h in hits.values())
        # Per threshold: 4 epochs strictly first (paired bootstrap lead > 0), or neither reached it (skipped).
        leads = [above(tc.lead_iv(err["tpo_1ep"], err["tpo"], x), 0) for x in (0.05, 0.01)
                 if np.isfinite(hits[("tpo", x)].estimate) or np.isfinite(hits[("tpo_1ep", x)].estimate)]
        area = paired_interval(err["tpo"].values.mean(axis=0), err["tpo_1ep"].values.mean(axis=0))
        section.claim("TPO with 4 epochs per batch learns faster than with 1: reaches 5% and 1% error first and "
                      "has the lower mean error over the run (Fig. 14)",
                      all_of(leads + [below(area, 0)]) if decided else None,
                      ", ".join(f"{tr.label(m)} to {100 * x:.0f}%: {h.show(-1)}" for (m, x), h in hits.items())
                      + f"; mean error over the run, 4 ep − 1 ep: {area.show(1, 100)} points")
    else:
        section.claim("TPO with 4 epochs per batch learns faster than with 1", None, "needs tpo and tpo_1ep")
    if "dg" in err and "tpo" in err:
        d, t = tc.tail_values(err["dg"]), tc.tail_values(err["tpo"])
        n = len(err["dg"].steps)
        sel = (err["dg"].steps >= n - n // 5) & (err["dg"].steps < n - n // 10)
        # Per seed: the previous 10% of episodes (none in a run too short to have one: that part is undecided).
        prev = err["dg"].values[sel].mean(axis=0) if sel.any() else None
        d_iv = seed_interval(d, bounds=RATE)
        section.claim("DG plateaus well above TPO: final-10% error ≥ 1% and > 3× TPO's, no longer falling "
                      "(within 20% of the previous 10% of episodes) (Fig. 14)",
                      all_of([at_least(d_iv, 0.01), above(paired_interval(d, 3 * t), 0),
                              None if prev is None else at_least(paired_interval(d, 0.8 * prev), 0)]),
                      f"DG final-10% {d_iv.show(1, 100, '%')} (previous 10%: "
                      f"{'–' if prev is None else f'{100 * prev.mean():.1f}%'}), TPO "
                      f"{seed_interval(t, bounds=RATE).show(1, 100, '%')}",
                      failure=[failure(SCALE, f"DG's final-10% error {d_iv.show(1, 100, '%')} is still wholly above "
                                              f"the paper's plateau {100 * ref['dg_plateau']:.0f}% and falling: this "
                                              f"run's {cfg['episodes']} episodes end before DG reaches any plateau "
                                              f"(the paper's runs have {paper_cfg.episodes})")
                               if d_iv.lo > ref["dg_plateau"] and cfg["episodes"] < paper_cfg.episodes else None,
                               failure(NOT_REPRODUCED, setting)])
    else:
        section.claim("DG plateaus well above TPO", None, "needs dg and tpo")


def _tail(values: np.ndarray, frac: float = 0.1) -> int:
    return max(1, int(round(len(values) * frac)))
