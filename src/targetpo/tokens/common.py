"""What the token-sequence experiment modules share besides the engine and their config base
(:mod:`targetpo.tokens.config`): method labels, seed lists, and report helpers (steps-to-x and final-error
tables next to the paper's numbers, curve grids with ± s.e. bands, and seed intervals for claims and tables:
docs/verdicts.md)."""

from __future__ import annotations

import numpy as np

from targetpo.runs import plots
from targetpo.runs.stats import (RATE, Curve, Interval, Verdict, above, all_of, bootstrap_hits, curves, first_below, fmt,
                                 mean_se, paired_interval, reached_by_any, seed_interval, steps_to_interval)

LABELS = {"reinforce": "REINFORCE", "ppo": "PPO", "dg": "DG", "tpo": "TPO", "tpo_no_anchor": "TPO (no anchor)",
          "group_pg": "Group PG", "grpo": "GRPO", "grpo_no_kl": "GRPO (no KL)", "grpo_masked": "GRPO (masked)",
          "tpo_token": "TPO_token", "grpo_token": "GRPO_token", "grpo_token_no_kl": "GRPO_token (no KL)"}


def seed_list(cfg) -> list[int]:
    return list(range(cfg.seed, cfg.seed + cfg.seeds))


def label(method: str) -> str:
    return LABELS.get(method, method)


# ----------------------------------------------------------------------------- report helpers

def unit_curves(run, metric: str = "error") -> dict[str, Curve]:
    """{unit: Curve} of one metric (units that logged it)."""
    return curves(run, metric)


def steps_to(curve: Curve | None, threshold: float = 0.01) -> int | None:
    """First 0-based episode whose seed-mean is below `threshold` (the paper's "steps to 1%"), or None."""
    if curve is None:
        return None
    return first_below(curve.steps, curve.mean, threshold)


def final(curve: Curve) -> tuple[float, float]:
    """(seed mean, s.e.) at the last episode, unsmoothed: the paper's "final error"."""
    return float(curve.mean[-1]), float(curve.se[-1])


def tail_mean(curve: Curve, frac: float = 0.1) -> tuple[float, float]:
    """(mean, s.e.) over seeds of each seed's mean over the last `frac` of episodes: a less noisy final error."""
    n = max(1, int(round(len(curve.steps) * frac)))
    m, se = mean_se(curve.values[-n:].mean(axis=0))
    return float(m), float(se)


def curve_grid(section, panels: dict[str, dict[str, Curve]], name: str, caption: str, ylabel: str = "error",
               log: bool = True, refs: dict[str, dict[str, list[tuple[int, float]]]] | None = None,
               threshold: float | None = 0.01) -> None:
    """One panel per key of `panels` ({panel title: {method: Curve}}), seed mean ± s.e.; `refs` adds the
    paper's points ({panel: {method: [(episode, value), ...]}}) as hollow markers."""
    fig, axes = plots.figure(len(panels), width=4.6)
    for ax, (title, by_method) in zip(axes, panels.items()):
        for m, c in by_method.items():
            plots.curve(ax, c.steps, c.values, label(m), plots.COLORS.get(m), floor=1e-4 if log else None)
            # The paper's points inside this run's episodes only: a short run is not stretched to the paper's.
            for_m = [(e, v) for e, v in (refs or {}).get(title, {}).get(m, []) if e <= c.steps[-1]]
            if for_m:
                plots.paper_points(ax, *zip(*for_m), color=plots.COLORS.get(m))
        if threshold is not None:
            ax.axhline(threshold, color="k", lw=0.6, ls=":")
        plots.finish(ax, title, "episode", ylabel, log=log)
    section.figure(fig, name, caption)


def pct(x: float | None) -> float | None:
    return None if x is None else 100.0 * x


def finite(x) -> bool:
    return x is not None and np.isfinite(x)


def intro(section, run, doc: str, data, preset_note: str) -> bool:
    """A report's opening: the protocol (the experiment module's docstring after its title) and, for any preset
    but `paper`, how this run's preset differs from the paper's protocol. False (and says so) when the run has
    no metrics yet, so the caller stops there."""
    section.text(doc.split("\n\n", 1)[1])
    if run.meta.get("preset") != "paper":
        section.text(preset_note)
    if not data:
        section.text("No metrics recorded yet.")
    return bool(data)


# ----------------------------------------------------------------------------- seed intervals (docs/verdicts.md)

def tail_values(curve: Curve, frac: float = 0.1) -> np.ndarray:
    """Per seed: the mean over the last `frac` of episodes (what tail_mean averages)."""
    n = max(1, int(round(len(curve.steps) * frac)))
    return curve.values[-n:].mean(axis=0)


def tail_iv(curve: Curve, frac: float = 0.1) -> Interval:
    """Seed t-interval of the tail mean (of an error or a fraction: cut to [0, 1])."""
    return seed_interval(tail_values(curve, frac), bounds=RATE)


def final_iv(curve: Curve) -> Interval:
    """Seed t-interval of the last episode's error (the paper's "final error"), cut to [0, 1]."""
    return seed_interval(curve.values[-1], bounds=RATE)


def tail_gap(a: Curve, b: Curve, frac: float = 0.1) -> Interval:
    """Paired (same seeds) interval of a's tail mean minus b's."""
    return paired_interval(tail_values(a, frac), tail_values(b, frac))


def steps_iv(curve: Curve | None, threshold: float = 0.01) -> Interval | None:
    """Episodes to `threshold` of the seed-mean curve with a bootstrap interval over seeds (inf = never)."""
    return None if curve is None else steps_to_interval(curve.steps, curve.values, threshold)


def lead_iv(slow: Curve, fast: Curve, threshold: float = 0.01) -> Interval:
    """Paired bootstrap over seeds of slow's episodes-to-threshold minus fast's; "never" counts as one episode past
    the run so the lead stays a number (a method that never gets there loses to one that does)."""
    end = float(max(slow.steps[-1], fast.steps[-1]) + 1)
    return bootstrap_hits(lambda a, b: np.minimum(a, end) - np.minimum(b, end),
                          [(slow.steps, slow.values), (fast.steps, fast.values)], threshold)


def fastest_verdict(by_method: dict[str, Curve], method: str, threshold: float = 0.01) -> tuple[Verdict | None, str]:
    """Whether `method` reaches `threshold` strictly first: every other method's lead over it (paired bootstrap)
    is above 0. None when no method reaches it."""
    hits = {m: steps_iv(c, threshold) for m, c in by_method.items()}
    if method not in by_method or len(by_method) < 2 or not reached_by_any(hits.values()):
        return None, ", ".join(f"{label(m)} {h.show(-1)}" for m, h in hits.items())
    leads = {m: lead_iv(c, by_method[method], threshold) for m, c in by_method.items() if m != method}
    return (all_of([above(iv, 0) for iv in leads.values()]),
            ", ".join(f"{label(m)} {h.show(-1)}" for m, h in hits.items()))


def steps_cell(curve: Curve | None, paper: float | int | None, threshold: float = 0.01, never: str = "–") -> str:
    """'ours [bootstrap interval] (paper)' for an episodes-to-threshold table."""
    o = "not run" if curve is None else steps_iv(curve, threshold).show(-1)
    return f"{o} ({never if paper is None else fmt(paper)})"
