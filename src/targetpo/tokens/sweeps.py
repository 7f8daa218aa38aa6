"""Group size, epochs per batch, and zero-variance masking on terminal reward (paper §4.2–4.3, Figs. 12, 13, 15;
docs/experiments.md §E9).

Reverse copy over V = 2 with an exact-match reward at H = 8, B = 256 prompts, K full answers per prompt, TPO vs
GRPO (β = 0.04). Three sweeps around the base configuration (K = 32, 4 epochs):
- K sweep: K ∈ {4, 8, 16, 32, 64} at 4 epochs (Fig. 12);
- masking: GRPO with zero-variance groups dropped and the loss normalised by the number of informative groups
  (Fig. 13), next to TPO and GRPO at the base configuration;
- epoch sweep: E ∈ {1, 2, 4, 8, 16} optimizer steps per batch at K = 32 (Fig. 15); 2000·E steps in all.
Configurations shared by several sweeps (K = 32 at 4 epochs) run once. The error is the fraction of the
episode's B·K sampled answers with a mistake, before the update; "final" is the seed mean at the last episode,
and the claims use the mean over the last 10% of episodes (the single last episode of few seeds is bimodal:
each seed either solved the task or is stuck).

Caveats (docs/differences.md §5–§6): the paper says 30 seeds (the `paper` preset), the authors' code defaults to 10; and the
paper reports different numbers for the same configuration (K = 32, 4 epochs: TPO 2.6% / GRPO 4.4% in the K
sweep vs 0.05% / 6.3% in the epoch sweep and masking figure), so its sweeps came from different runs.

`cpu` preset: H = 5, B = 64, base K = 8 (at initialisation 78% of groups are all-fail; 88% in the paper),
K ∈ {4, 8, 16}, E ∈ {1, 2, 4}, 2 seeds × 200 episodes (the paper: H = 8, B = 256, base K = 32, K up to 64, E up
to 16, 30 seeds × 2000 episodes). Smaller batches (B = 32) make every method's curve too noisy to rank.
"""

from __future__ import annotations

from targetpo import paper
from targetpo.tokens import common as tc
from targetpo.tokens import report as tr
from targetpo.runs.config import config, default, param, unread_by
from targetpo.runs.stats import above, all_of, below, bootstrap_interval, count
from targetpo.tokens.config import TokenConfig, group_only
from targetpo.tokens.engine import trial_config

NAME = "token-sweeps"
TITLE = "K sweep, epoch sweep and zero-variance masking, terminal reward (paper §4.2–4.3, Figs. 12, 13, 15)"
PAPER_REF = "§4.2–4.3, Figs. 12, 13, 15; docs/experiments.md §E9"
METHODS = ("tpo", "grpo")
SWEEPS = ("k", "epochs", "masking")


@config
@group_only
class Config(TokenConfig):
    sweeps: tuple[str, ...] = param(SWEEPS, "which sweeps to run: k (Fig. 12), epochs (Fig. 15), masking (Fig. 13)",
                                    choices=SWEEPS)
    ks: tuple[int, ...] = param((4, 8, 16, 32, 64), "group sizes K of the K sweep (at `epochs` epochs)", ge=2)
    epoch_counts: tuple[int, ...] = param((1, 2, 4, 8, 16), "epochs per batch E of the epoch sweep (at K = `k`)",
                                          ge=1)
    seeds = default(30, note="the paper: 30; the authors' code default: 10")
    episodes = 2000
    reward = "terminal"
    length = 8
    batch = 256
    k = default(32, help="K, the base group size (epoch sweep and masking)")
    epochs = default(4, help="the base epochs per batch (K sweep and masking)")
    methods = default(METHODS, choices=("tpo", "grpo", "grpo_no_kl", "tpo_no_anchor", "group_pg"),
                      help="methods of the K and epoch sweeps (the masking sweep always runs tpo, grpo and "
                      "grpo_masked)")

    def unit_methods(self) -> list[tuple[str, dict]]:
        return [(m, {"k": k} if sweep == "k" else {"epochs": e} if sweep == "epochs" else {})
                for sweep, runs in configs(self).items() for k, e, m in runs]

    def unread(self) -> dict[str, str]:
        readers = {"ks": ("k",), "epoch_counts": ("epochs",), "k": ("epochs", "masking"), "epochs": ("k", "masking"),
                   "methods": ("k", "epochs")}
        return super().unread() | unread_by(self, "sweeps", readers,
                                            lambda by: f"the {' and '.join(by)} sweep{'s' if len(by) > 1 else ''}")

    def check(self) -> None:
        for runs in configs(self).values():
            for k, e, m in runs:
                trial_config(self, k=k, epochs=e, methods=(m,))


PRESETS = {
    "smoke": Config(seeds=2, episodes=2, ks=(2, 4), epoch_counts=(1, 2), length=3, batch=8, k=4, epochs=2),
    "cpu": Config(seeds=2, episodes=200, ks=(4, 8, 16), epoch_counts=(1, 2, 4), length=5, batch=64, k=8),
    "paper": Config(),
}
REPRODUCE_PRESET = "cpu"
RUNTIME = "H = 5, K ∈ {4, 8, 16}, E ∈ {1, 2, 4}, masking, ~4 min"


def configs(cfg: Config) -> dict[str, list[tuple[int, int, str]]]:
    """{sweep: [(K, epochs, method), ...]} in the order of the paper's figures."""
    out: dict[str, list[tuple[int, int, str]]] = {}
    if "k" in cfg.sweeps:
        out["k"] = [(k, cfg.epochs, m) for m in cfg.methods for k in cfg.ks]
    if "epochs" in cfg.sweeps:
        out["epochs"] = [(cfg.k, e, m) for m in cfg.methods for e in cfg.epoch_counts]
    if "masking" in cfg.sweeps:
        out["masking"] = [(cfg.k, cfg.epochs, m) for m in ("tpo", "grpo", "grpo_masked")]
    return out


def _name(k: int, e: int, m: str) -> str:
    return tr.unit(f"k{k}", f"ep{e}", m)


def units(cfg: Config) -> list[str]:
    seen: dict[str, None] = {}
    for runs in configs(cfg).values():
        for r in runs:
            seen.setdefault(_name(*r), None)
    return list(seen)


def unit_steps(cfg: Config, unit: str) -> int:
    return cfg.episodes


def _parse(unit: str) -> tuple[int, int, str]:
    k, e, m = tr.parse(unit)
    return int(k[1:]), int(e[2:]), m


def run_unit(cfg: Config, unit: str, ctx) -> None:
    k, e, method = _parse(unit)
    tr.run_method(cfg, method, ctx, k=k, epochs=e)


# ----------------------------------------------------------------------------- report

def _curves(run) -> dict[tuple[int, int, str], tc.Curve]:
    return {_parse(u): c for u, c in tc.unit_curves(run, "error").items()}


def summary(run) -> str:
    cur = _curves(run)
    return "final-10% error — " + ", ".join(f"K={k} E={e} {tr.label(m)} {100 * tc.tail_mean(c)[0]:.1f}%"
                                            for (k, e, m), c in cur.items())


def _paper_value(sweep: str, x: int, m: str) -> float | None:
    if sweep == "k":
        ref, axis = paper.K_SWEEP_FINAL_ERROR_PCT.values, "K"
    elif sweep == "epochs":
        ref, axis = paper.EPOCH_SWEEP_FINAL_ERROR_PCT.values, "epochs"
    else:
        return paper.MASKING_FINAL_ERROR_PCT.values.get(m)
    return ref[m][ref[axis].index(x)] if m in ref and x in ref[axis] else None


def report(run, section) -> None:
    cfg = run.config
    cur = _curves(run)
    if not tc.intro(section, run, __doc__, cur,
                    tr.horizon_note(run, "30 seeds × 2000 episodes, H = 8, B = 256, base K = 32, 4 epochs",
                                    f"{count(cfg['seeds'], 'seed')} × {cfg['episodes']} episodes, H = {cfg['length']}, "
                                    f"B = {cfg['batch']}, base K = {cfg['k']}, {cfg['epochs']} epochs")
                    + " Paper values are at H = 8 and 2000 episodes."):
        return
    plan = configs(_cfg(cfg))
    grid = {}
    for sweep, runs in plan.items():
        present = [r for r in runs if r in cur]
        if not present:
            continue
        if sweep == "masking":
            _masking(section, cur, present)
            grid["masking"] = {m: cur[(k, e, m)] for k, e, m in present}
            continue
        axis = "K" if sweep == "k" else "epochs"
        xs = sorted({r[0] if sweep == "k" else r[1] for r in present})
        methods = [m for m in cfg["methods"] if any(r[2] == m for r in present)]
        rows = []
        for m in methods:
            row = [tr.label(m)]
            for x in xs:
                key = (x, cfg["epochs"], m) if sweep == "k" else (cfg["k"], x, m)
                ref = _paper_value(sweep, x, m)
                row.append("–" if key not in cur else
                           f"{tc.final_iv(cur[key]).show(1, 100)} / {tc.tail_iv(cur[key]).show(1, 100)} "
                           f"({'n/a' if ref is None else tc.fmt(ref)})")
            rows.append(row)
        src = paper.K_SWEEP_FINAL_ERROR_PCT.source if sweep == "k" else paper.EPOCH_SWEEP_FINAL_ERROR_PCT.source
        section.table(["method"] + [f"{axis}={x}" for x in xs], rows,
                      f"{'Fig. 12 — K sweep' if sweep == 'k' else 'Fig. 15 — epoch sweep'}: final error % "
                      f"(last episode / last-10% mean, each seed mean [95 % t-interval]) ours ({src})")
        for m in methods:
            series = {}
            for x in xs:
                key = (x, cfg["epochs"], m) if sweep == "k" else (cfg["k"], x, m)
                if key in cur:
                    series[f"{axis}={x}"] = cur[key]
            grid[f"{tr.label(m)}, {axis} sweep"] = series
    colors = {f"{a}={x}": tr.SWEEP_COLORS[i % len(tr.SWEEP_COLORS)]
              for a in ("K", "epochs") for i, x in enumerate(sorted(set(cfg["ks"]) | set(cfg["epoch_counts"])))}
    tr.panels(section, grid, "token_sweeps", "Exact-match error by episode, seed mean ± s.e.", log=False,
              colors=colors, labels={k: k for k in colors}, ncols=3)
    _claims(section, cfg, cur, plan)


def _cfg(d: dict) -> Config:
    return Config(**{k: (tuple(v) if isinstance(v, list) else v) for k, v in d.items()})


def _masking(section, cur, present) -> None:
    rows = []
    for k, e, m in present:
        c = cur[(k, e, m)]
        ref = _paper_value("masking", 0, m)
        rows.append([tr.label(m), tc.final_iv(c).show(1, 100), tr.tail_cell(c, digits=1),
                     "n/a" if ref is None else tc.fmt(ref)])
    section.table(["method", "final error % [95 % t-interval]", "last-10% error %", "paper %"], rows,
                  f"Fig. 13 — zero-variance masking at K = {present[0][0]}, {present[0][1]} epochs "
                  f"({paper.MASKING_FINAL_ERROR_PCT.source})")


def _claims(section, cfg, cur, plan) -> None:
    # Tail-mean errors; every comparison a paired interval over the shared seeds (docs/verdicts.md).
    tail = {key: tc.tail_iv(c) for key, c in cur.items()}
    # TPO below GRPO is the paper's claim for every K only: its own epoch sweep has GRPO lower at 16 epochs (1.1%
    # vs TPO's 2.0%), and it claims an absolute bound there instead (below).
    verdicts, ev = [], []
    for k, e, m in plan.get("k", []):
        if m != "tpo" or (k, e, "grpo") not in tail or (k, e, "tpo") not in tail:
            continue
        verdicts.append(below(tc.tail_gap(cur[(k, e, "tpo")], cur[(k, e, "grpo")]), 0))
        ev.append(f"K={k}: TPO {tail[(k, e, 'tpo')].show(1, 100)}% vs GRPO {tail[(k, e, 'grpo')].show(1, 100)}%")
    section.claim("TPO ends below GRPO at every K (Fig. 12)", all_of(verdicts),
                  "; ".join(ev) or "needs the k sweep with tpo and grpo")
    tpo_e = [(k, e) for k, e, m in plan.get("epochs", []) if m == "tpo" and (k, e, "tpo") in tail]
    # An absolute error is comparable only at the paper's configuration (a shorter or easier run moves it).
    at_paper = (cfg["length"], cfg["batch"], cfg["k"]) == (8, 256, 32) and cfg["episodes"] >= 2000
    section.claim("TPO's error stays below 2.3% at every epoch count (last-10% mean; Fig. 15)",
                  all_of([below(tail[(k, e, "tpo")], 0.023) for k, e in tpo_e]) if tpo_e and at_paper else None,
                  ("TPO " + ", ".join(f"E={e} {tail[(k, e, 'tpo')].show(1, 100)}%" for k, e in tpo_e)
                   + ("" if at_paper else f" (the paper's bound is for H = 8, B = 256, K = 32 over 2000 episodes; this "
                      f"run: H = {cfg['length']}, B = {cfg['batch']}, K = {cfg['k']}, {cfg['episodes']} episodes, "
                      "so undecided)")) if tpo_e else "needs the epochs sweep with tpo")
    base = (cfg["k"], cfg["epochs"])
    if (*base, "grpo") in tail and (*base, "grpo_masked") in tail:
        gap = tc.tail_gap(cur[(*base, "grpo_masked")], cur[(*base, "grpo")])
        section.claim("Masking zero-variance groups hurts GRPO: GRPO (masked) ends worse than GRPO (Fig. 13)",
                      above(gap, 0), f"GRPO {tail[(*base, 'grpo')].show(1, 100)}%, GRPO (masked) "
                                     f"{tail[(*base, 'grpo_masked')].show(1, 100)}%; masked − GRPO "
                                     f"{gap.show(1, 100)} points")
    else:
        section.claim("Masking zero-variance groups hurts GRPO", None, "needs the masking sweep")
    ep = [(k, e) for k, e, m in plan.get("epochs", []) if m == "tpo" and (k, e, "tpo") in tail]
    if len(ep) >= 2:
        t = {e: tc.tail_values(cur[(k, e, "tpo")]) for k, e in ep}
        g = {e: tc.tail_values(cur[(k, e, "grpo")]) for k, e in ep if (k, e, "grpo") in tail}
        # Bootstrap over the shared seeds of (GRPO's worst tail error over E) − (TPO's worst).
        gap = bootstrap_interval(lambda *v: max(x.mean() for x in v[len(t):]) - max(x.mean() for x in v[:len(t)]),
                                 *t.values(), *g.values()) if g else None
        section.claim("TPO is robust to the number of epochs: its worst final error over the epoch sweep is "
                      "below GRPO's worst (paper: TPO < 2.3% at every E, GRPO 1.1–37.6%) (Fig. 15)",
                      None if gap is None else above(gap, 0),
                      "TPO " + ", ".join(f"E={e} {tail[(k, e, 'tpo')].show(1, 100)}%" for k, e in ep)
                      + ("; GRPO " + ", ".join(f"E={e} {100 * v.mean():.1f}%" for e, v in g.items())
                         + f"; GRPO's worst − TPO's worst {gap.show(1, 100)} points (bootstrap)" if g else ""))
    else:
        section.claim("TPO is robust to the number of epochs", None, "needs the epoch sweep with ≥ 2 epoch counts")
