"""Delightful PG with 1 vs 4 optimizer steps per batch (paper App. E, Fig. 17; docs/experiments.md §E11).

The authors' code runs DG for exactly one optimizer step per batch while PPO, GRPO and TPO take four. App. E
shows why: with four, DG's gate and weights are recomputed from the moving log-probs on a stale batch, and it
ends worse. Two parts, each DG with `dg_epoch_counts` = (1, 4) steps per batch:
- (a) reverse copy with a terminal (exact-match) reward at H = 5 (the paper's curve starts at 0.97 = 1 − 2^−5),
  V = 2, `terminal_batch` prompts per episode (B is not stated; 256 as in the authors' smoke preset), 20 seeds,
  2000 episodes; the error is the fraction of answers with a mistake;
- (b, c) the eight dense variants of Table 2 (copy / flip / reverse copy / reverse flip × bag / sequential),
  H = 10, B = 100, 10 seeds, 1000 episodes; the error is 1 − mean behaviour reward.
Errors are measured on the episode's sampled rollouts before the update; the paper's "final error" is the seed
mean at the last episode, and the claim uses the mean over the last 10% of episodes (less noisy with few seeds).

`cpu` preset: (a) at H = 5, B = 256, 3 seeds × 400 episodes and (b, c) at H = 6, B = 50, 2 seeds × 300 episodes
(the paper: 20 seeds × 2000 episodes; H = 10, B = 100, 10 seeds × 1000 episodes). DG is the cheapest method
(one rollout per prompt, one step per batch), so all 8 variants fit. Part (a) separates clearly within 400
episodes; in part (b, c) 4-epoch DG takes 4× the optimizer steps and is often still ahead after 300 episodes,
so at this scale it compares runs that have not settled (the paper compares after 1000 episodes at H = 10).
"""

from __future__ import annotations

from targetpo import paper
from targetpo.tokens import common as tc
from targetpo.tokens import report as tr
from targetpo.runs.config import config, config_fields, default, param, swept, unread_by, unused
from targetpo.runs.stats import NOT_REPRODUCED, Verdict, above, count, failure
from targetpo.tokens.config import TokenConfig
from targetpo.tokens.engine import run_trial, trial_config
from targetpo.tokens.variants import ALL_VARIANTS

NAME = "dg-epochs"
TITLE = "DG with 1 vs 4 epochs per batch (paper App. E, Fig. 17)"
PAPER_REF = "App. E, Fig. 17; docs/experiments.md §E11"
PARTS = ("terminal", "variants")


@config
class Config(TokenConfig):
    seeds = default(20, help="seeds of part (a), the terminal task (the paper: 20); part (b, c) uses the first "
                    "variant_seeds of them")
    parts: tuple[str, ...] = param(PARTS, "terminal (App. E a: reverse copy, exact-match reward) and/or variants "
                                   "(App. E b, c: the 8 dense variants)", choices=PARTS)
    dg_epoch_counts: tuple[int, ...] = param((1, 4), "DG optimizer steps per batch to compare (the authors' code: "
                                             "1; App. E: 4)", ge=1)
    terminal_episodes: int = param(2000, "episodes of part (a)", ge=1)
    terminal_length: int = param(5, "H of part (a) (5: the paper's curve starts at 1 − 2^−5)", ge=1)
    terminal_batch: int = param(256, "prompts per episode of part (a) (not stated in the paper; 256 as in the "
                                "authors' smoke preset)", ge=1)
    variant_seeds: int = param(10, "seeds of part (b, c) (the paper: 10)", ge=1)
    variant_episodes: int = param(1000, "episodes of part (b, c)", ge=1)
    variants: tuple[str, ...] = param(ALL_VARIANTS, "reward/task pairs of part (b, c) (the paper: all 8)",
                                      choices=ALL_VARIANTS)
    length = default(10, help="H of part (b, c) (the paper: 10)")
    batch = default(100, help="B of part (b, c) (the paper: 100)")
    episodes = swept("terminal_episodes and variant_episodes")
    dg_epochs = swept("dg_epoch_counts")
    task = swept("parts and variants")
    reward = swept("parts and variants")
    methods = default(("dg",), choices=("dg",))
    epochs = unused("DG only; its steps per batch are dg_epoch_counts")
    clip_eps = unused("DG only")
    grpo_beta = unused("DG only")
    tpo_eta = unused("DG only")
    tpo_projection = unused("DG only")
    tpo_alpha = unused("DG only")
    tpo_kl_budget = unused("DG only")
    std_floor = unused("DG only")
    std_shrink = unused("DG only")
    score_noise = unused("DG only")
    zero_all_fail = unused("DG only")

    def unread(self) -> dict[str, str]:
        # seeds counts part (a)'s seeds; part (b, c) runs variant_seeds of them (seeds=5 with parts=variants ran one)
        readers = ({n: ("terminal",) for n in ("seeds", "terminal_episodes", "terminal_length", "terminal_batch")}
                   | {n: ("variants",) for n in ("variant_seeds", "variant_episodes", "variants", "length", "batch")})
        return super().unread() | unread_by(self, "parts", readers, lambda by: f"part {by[0]}")

    def check(self) -> None:
        k = config_fields(Config)["k"].default
        if self.k != k and self.match == "prompts":
            raise ValueError(f"k={self.k}: DG reads K only with match=interactions (B·K prompts), got match=prompts")
        if "variants" in self.parts and self.variant_seeds > self.seeds:
            raise ValueError(f"variant_seeds ({self.variant_seeds}) must be <= seeds ({self.seeds}): the "
                             "variants run the first variant_seeds of the run's seeds")
        trial_config(self, task="reverse_copy", reward="terminal", length=self.terminal_length,
                     batch=self.terminal_batch, methods=self.methods)
        for v in self.variants:
            reward, task = v.split("/")
            trial_config(self, task=task, reward=reward, methods=self.methods)


PRESETS = {
    "smoke": Config(seeds=2, variant_seeds=1, terminal_episodes=3, terminal_length=3, terminal_batch=8,
                    variant_episodes=3, variants=("bag/copy", "sequential/flip"), length=4, batch=8),
    "cpu": Config(seeds=3, variant_seeds=2, terminal_episodes=400, variant_episodes=300, length=6, batch=50),
    "paper": Config(),
}
REPRODUCE_PRESET = "cpu"
RUNTIME = "DG 1 vs 4 epochs: terminal H = 5 and the 8 variants at H = 6, ~7 min"


def units(cfg: Config) -> list[str]:
    out = []
    if "terminal" in cfg.parts:
        out += [tr.unit("terminal", f"ep{e}") for e in cfg.dg_epoch_counts]
    if "variants" in cfg.parts:
        out += [tr.unit(v, f"ep{e}") for v in cfg.variants for e in cfg.dg_epoch_counts]
    return out


def unit_steps(cfg: Config, unit: str) -> int:
    return cfg.terminal_episodes if unit.startswith("terminal/") else cfg.variant_episodes


def run_unit(cfg: Config, unit: str, ctx) -> None:
    *where, ep = tr.parse(unit)
    e = int(ep[2:])
    if where == ["terminal"]:
        trial = trial_config(cfg, task="reverse_copy", reward="terminal", length=cfg.terminal_length,
                             batch=cfg.terminal_batch, episodes=cfg.terminal_episodes, dg_epochs=e)
        seeds = tc.seed_list(cfg)
    else:
        reward, task = where
        trial = trial_config(cfg, task=task, reward=reward, episodes=cfg.variant_episodes, dg_epochs=e)
        seeds = tc.seed_list(cfg)[:cfg.variant_seeds]
    run_trial(trial, "dg", seeds, ctx.device, ctx.log, ctx.advance, ctx.check_finite)


# ----------------------------------------------------------------------------- report

def _data(run) -> dict[str, dict[int, tc.Curve]]:
    """{"terminal" | "reward/task": {epochs: Curve}} in run order."""
    raw = tr.by_parts(run, "error", key=lambda p: ("/".join(p[:-1]), int(p[-1][2:])))
    order = ["terminal"] + list(run.config["variants"])
    return {k: dict(sorted(raw[k].items())) for k in order if k in raw}


def _name(where: str) -> str:
    if where == "terminal":
        return "terminal (a)"
    reward, task = where.split("/")
    return f"{'seq' if reward == 'sequential' else 'bag'} {task.replace('reverse_', 'rev. ')}"


def _paper_pct(where: str, e: int) -> float | None:
    """The paper's final error in % for `e` epochs (1 or 4)."""
    if e not in (1, 4):
        return None
    if where == "terminal":
        return 100 * paper.DG_EPOCHS_TERMINAL.values[f"dg_{e}ep"]
    pair = paper.DG_EPOCHS_VARIANTS_PCT.values.get(tuple(where.split("/")))
    return None if pair is None else pair[0 if e == 1 else 1]


def summary(run) -> str:
    return "final-10% DG error — " + "; ".join(
        f"{_name(w)}: " + " vs ".join(f"{e}ep {100 * tc.tail_mean(c)[0]:.2f}%" for e, c in by_e.items())
        for w, by_e in _data(run).items())


def report(run, section) -> None:
    cfg = run.config
    data = _data(run)
    note = tr.horizon_note(
        run, "(a) H = 5, 20 seeds × 2000 episodes; (b, c) H = 10, B = 100, 10 seeds × 1000 episodes",
        f"(a) H = {cfg['terminal_length']}, B = {cfg['terminal_batch']}, {count(cfg['seeds'], 'seed')} × "
        f"{cfg['terminal_episodes']} episodes; (b, c) H = {cfg['length']}, B = {cfg['batch']}, "
        f"{count(cfg['variant_seeds'], 'seed')} × {cfg['variant_episodes']} episodes")
    if not tc.intro(section, run, __doc__, data, note):
        return
    counts = sorted({e for by_e in data.values() for e in by_e})
    rows = []
    for w, by_e in data.items():
        row = [_name(w)]
        for e in counts:
            c, ref = by_e.get(e), _paper_pct(w, e)
            row.append("–" if c is None else f"{tc.final_iv(c).show(2, 100)} / {tr.tail_cell(c)} "
                                              f"({'n/a' if ref is None else tc.fmt(ref)})")
        rows.append(row)
    section.table(["task"] + [f"DG {e} ep" for e in counts], rows,
                  "Fig. 17 — final error %: last episode / last-10% mean, each seed mean [95 % t-interval], ours "
                  f"({paper.DG_EPOCHS_TERMINAL.source}, {paper.DG_EPOCHS_VARIANTS_PCT.source})")
    labels = {e: f"DG ({e} ep)" for e in counts}
    colors = {e: tr.SWEEP_COLORS[i % len(tr.SWEEP_COLORS)] for i, e in enumerate(counts)}
    tr.panels(section, {_name(w): by_e for w, by_e in data.items()}, "dg_epochs",
              "DG error by episode, seed mean ± s.e.", labels=labels, colors=colors)

    if len(counts) < 2 or 1 not in counts:
        section.claim("4-epoch DG ends worse than 1-epoch DG in most configurations", None,
                      "needs dg_epoch_counts with 1 and another count")
        return
    many = max(e for e in counts if e != 1)
    # Per configuration: a paired interval over the shared seeds of (many-epoch − 1-epoch) tail error.
    worse, ev, noise = [], [], []
    for w, by_e in data.items():
        if 1 in by_e and many in by_e:
            gap = tc.tail_gap(by_e[many], by_e[1])
            worse.append(above(gap, 0))
            ev.append(f"{_name(w)}: {gap.show(2, 100)}")
            ref_1, ref_many = _paper_pct(w, 1), _paper_pct(w, many)
            if ref_1 is not None and ref_many is not None and worse[-1] is not Verdict.PASS:
                noise.append(f"{_name(w)} {'covers' if gap.covers((ref_many - ref_1) / 100) else 'excludes'} the "
                             f"paper's {ref_many - ref_1:+.1f}")
    counts_by = {v: sum(1 for x in worse if x is v) for v in Verdict}
    # "Most" of n: PASS when the clearly-worse ones alone are a majority, FAIL when even counting every
    # undecided one as worse they are not, else INCONCLUSIVE.
    need = len(worse) / 2
    verdict = (None if not worse else Verdict.PASS if counts_by[Verdict.PASS] > need else
               Verdict.FAIL if counts_by[Verdict.PASS] + counts_by[Verdict.INCONCLUSIVE] <= need else
               Verdict.INCONCLUSIVE)
    section.claim(f"{many}-epoch DG ends worse than 1-epoch DG in most configurations (paper: 7 of 8 variants "
                  "and the terminal task)", verdict,
                  f"clearly worse in {counts_by[Verdict.PASS]} of {len(worse)}, clearly not in "
                  f"{counts_by[Verdict.FAIL]}, undecided in {counts_by[Verdict.INCONCLUSIVE]} (final-10% error, "
                  f"{many} ep − 1 ep, points, paired): " + "; ".join(ev),
                  failure=failure(NOT_REPRODUCED, "where not clearly worse, the paired gap vs the paper's gap "
                                  "(points): " + ("; ".join(noise) or "none of these is in the paper")
                                  + f"; checked: {count(cfg['variant_seeds'], 'seed')} × {cfg['variant_episodes']} episodes at "
                                  f"H = {cfg['length']} (the paper: 10 × 1000 at H = 10); no larger run of this "
                                  "experiment is in this report"))
    t = data.get("terminal", {})
    if 1 in t and many in t:
        gap = tc.tail_gap(t[many], t[1])
        section.claim(f"On the terminal task {many}-epoch DG ends clearly worse than 1-epoch DG (paper: 48.3% vs "
                      "2.0%; checked: the paired 95 % interval of the final-10% error difference is above 0)",
                      above(gap, 0), f"1 ep {tc.tail_iv(t[1]).show(1, 100)}%, {many} ep "
                                     f"{tc.tail_iv(t[many]).show(1, 100)}%; difference {gap.show(1, 100)} points")
    else:
        section.claim("On the terminal task 4-epoch DG ends clearly worse than 1-epoch DG", None,
                      "needs the terminal part")
