"""Anchor and target-matching ablations on terminal-reward token reversal (paper §3.7, Fig. 8; docs/experiments.md §E7).

Reverse copy over V = 2 with an exact-match reward, prompt-matched: every method samples K = 8 full answers for
each of B = 100 prompts and scores each 0/1. TPO fits q ∝ p_old · exp(u/η) over the K sequence log-probabilities;
the ablations take one ingredient away: TPO without the anchor (q = softmax(u/η), no p_old), Group PG (the
score-weighted log-likelihood −Σ_i u_i log π(y_i), 4 epochs on the same batch with no ratio, clip or
renormalisation), and GRPO with and without its KL term. The error is the fraction of the episode's B·K sampled
answers with any mistake, before the update; "final" is the seed mean at the last episode, and the claims use the
mean over the last 10% of episodes (less noisy with few seeds).

`cpu` preset: H = 5 (a uniform policy succeeds once in 32 answers) instead of 7, 8, 10, B = 64, 2 seeds,
300 episodes (the paper: H ∈ {7, 8, 10}, B = 100, 20 seeds, 2000 episodes). At H = 5 TPO's error falls below
1% within ~150 episodes, so 300 episodes separate the methods.
"""

from __future__ import annotations

from targetpo import paper
from targetpo.tokens import common as tc
from targetpo.tokens import report as tr
from targetpo.runs.config import config, default, param, swept
from targetpo.runs.stats import above, all_of, at_least, at_most, count
from targetpo.tokens.config import TokenConfig, group_only
from targetpo.tokens.engine import trial_config

NAME = "token-ablations"
TITLE = "Anchor and target-matching ablations, terminal reward (paper §3.7, Fig. 8)"
PAPER_REF = "§3.7, Fig. 8; docs/experiments.md §E7"
METHODS = ("tpo", "grpo", "grpo_no_kl", "tpo_no_anchor", "group_pg")
# "Worst" allows a tie within this many error points: several ablations sit at ≈ 100% error.
TIE = 0.01


@config
@group_only
class Config(TokenConfig):
    lengths: tuple[int, ...] = param((7, 8, 10), "answer lengths H to sweep", ge=1)
    length = swept("lengths")
    episodes = 2000
    reward = "terminal"
    methods = default(METHODS, choices=METHODS)

    def check(self) -> None:
        for h in self.lengths:
            trial_config(self, length=h, methods=self.methods)


PRESETS = {
    "smoke": Config(seeds=2, episodes=3, lengths=(3,), batch=8, k=4),
    "cpu": Config(seeds=2, episodes=300, lengths=(5,), batch=64),
    "paper": Config(),
}
REPRODUCE_PRESET = "cpu"
RUNTIME = "terminal reward, H = 5, B = 64, ~4 min"


def units(cfg: Config) -> list[str]:
    return [tr.unit(f"h{h}", m) for h in cfg.lengths for m in cfg.methods]


def unit_steps(cfg: Config, unit: str) -> int:
    return cfg.episodes


def run_unit(cfg: Config, unit: str, ctx) -> None:
    h, method = tr.parse(unit)
    tr.run_method(cfg, method, ctx, length=int(h[1:]))


# ----------------------------------------------------------------------------- report

def _data(run) -> dict[int, dict[str, tc.Curve]]:
    raw = tr.by_parts(run, "error", key=lambda p: (int(p[0][1:]), p[1]))
    return dict(sorted(raw.items()))


def _paper(method: str, h: int) -> float | None:
    ref = paper.FIG8_FINAL_ERROR.values
    return ref[method][ref["H"].index(h)] if method in ref and h in ref["H"] else None


def summary(run) -> str:
    return "final-10% error — " + "; ".join(
        f"H={h}: " + ", ".join(f"{tr.label(m)} {100 * tc.tail_mean(c)[0]:.1f}%" for m, c in by_m.items())
        for h, by_m in _data(run).items())


def report(run, section) -> None:
    cfg = run.config
    data = _data(run)
    if not tc.intro(section, run, __doc__, data,
                    tr.horizon_note(run, "20 seeds × 2000 episodes, H ∈ {7, 8, 10}, B = 100, K = 8",
                                    f"{count(cfg['seeds'], 'seed')} × {cfg['episodes']} episodes, H ∈ "
                                    f"{{{', '.join(map(str, cfg['lengths']))}}}, B = {cfg['batch']}, K = {cfg['k']}")
                    + " Paper values appear only where the paper has the same H."):
        return
    hs = list(data)
    methods = [m for m in cfg["methods"] if any(m in d for d in data.values())]

    def final_cell(h, m):
        c = data[h].get(m)
        ref = _paper(m, h)
        return "–" if c is None else f"{tc.final_iv(c).show(-1)} ({'n/a' if ref is None else tc.fmt(ref)})"

    section.table(["method"] + [f"H={h}" for h in hs], [[tr.label(m)] + [final_cell(h, m) for h in hs]
                                                          for m in methods],
                  f"Fig. 8 — final exact-match error (fraction), last episode, seed mean [95 % t-interval]: ours "
                  f"({paper.FIG8_FINAL_ERROR.source}, read from the figure)")
    ref = paper.FIG8_FINAL_ERROR.values
    if not set(hs) & set(ref["H"]):
        section.table(["method"] + [f"H={h}" for h in ref["H"]],
                      [[tr.label(m)] + [tc.fmt(v) for v in ref[m]] for m in methods if m in ref],
                      "The paper's Fig. 8 final errors at its H, for reference (no H in common with this run)")
    section.table(["method"] + [f"H={h}" for h in hs],
                  [[tr.label(m)] + [tr.tail_cell(data[h].get(m), digits=1) for h in hs] for m in methods],
                  "Mean error % over the last 10% of episodes (seed mean [95 % t-interval])")
    refs = {f"H = {h}": {m: [(cfg["episodes"] - 1, _paper(m, h))] for m in methods if _paper(m, h) is not None}
            for h in hs if cfg["episodes"] == 2000}
    tr.panels(section, {f"H = {h}": data[h] for h in hs}, "token_ablations",
              "Exact-match error by episode, seed mean ± s.e. (circles: the paper's final values, Fig. 8, "
              "shown at the paper's horizon only)", log=False, refs=refs)

    # Each comparison: a paired interval over the shared seeds of the tail-mean error difference.
    tails = {h: {m: tc.tail_iv(c) for m, c in by_m.items()} for h, by_m in data.items()}
    verdicts, ev = [], []
    for h, t in tails.items():
        if "tpo" in t and len(t) > 1:
            verdicts += [at_most(tc.tail_gap(data[h]["tpo"], c), 0) for m, c in data[h].items() if m != "tpo"]
            ev.append(f"H={h}: " + ", ".join(f"{tr.label(m)} {v.show(1, 100)}%" for m, v in t.items()))
    section.claim("TPO has the lowest error of all ablations at every H (Fig. 8)", all_of(verdicts),
                  "; ".join(ev) or "needs tpo and another method")
    verdicts, ev = [], []
    for h, t in tails.items():
        if "tpo" in t and "tpo_no_anchor" in t:
            gap = tc.tail_gap(data[h]["tpo_no_anchor"], data[h]["tpo"])
            verdicts.append(above(gap, 0))
            ev.append(f"H={h}: no anchor − TPO {gap.show(1, 100)} points")
    section.claim("Removing the anchor p_old is harmful: TPO (no anchor) ends worse than TPO at every H",
                  all_of(verdicts), "; ".join(ev) or "needs tpo and tpo_no_anchor")
    verdicts, ev = [], []
    for h, t in tails.items():
        if "group_pg" in t and len(t) > 1:
            gaps = {m: tc.tail_gap(data[h]["group_pg"], c) for m, c in data[h].items() if m != "group_pg"}
            verdicts += [at_least(g, -TIE) for g in gaps.values()]
            ev.append(f"H={h}: Group PG − " + ", ".join(f"{tr.label(m)} {g.show(1, 100)}" for m, g in gaps.items()))
    section.claim(f"Group PG is the worst method at every H (ties within {100 * TIE:.0f} point count)",
                  all_of(verdicts), "; ".join(ev) or "needs group_pg and another method")
