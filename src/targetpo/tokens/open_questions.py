"""What the open-question experiments (docs/experiments.md §E14–§E16: token-projections, token-low-variance,
token-partial-credit) share: a config base with their comparison threshold, and report helpers that compare
settings with a reference setting paired over seeds (every setting of a seed starts from the same model and sees
the same prompts, so seed-by-seed differences cancel the seed's luck)."""

from __future__ import annotations

import numpy as np

from targetpo.runs.config import config, param
from targetpo.runs.stats import RATE, Curve, Interval, count, difference_read, fmt, paired_interval, seed_interval
from targetpo.tokens import common as tc
from targetpo.tokens import report as tr
from targetpo.tokens.config import TokenConfig

SUITE = "open-questions"
SMOOTH = 5  # episodes of trailing average before a single seed's curve is compared with the threshold


@config
class OpenQuestionConfig(TokenConfig):
    threshold: float = param(0.05, "error level whose first crossing is compared (episodes to threshold)",
                             gt=0, lt=1)


def seed_steps_to(curve: Curve, threshold: float, window: int = SMOOTH) -> np.ndarray:
    """Per seed, the first episode whose trailing `window`-episode mean error is below `threshold` (NaN: never)."""
    vals = tr.smooth(curve.values, window)
    out = np.full(vals.shape[1], np.nan)
    for s in range(vals.shape[1]):
        hit = np.flatnonzero(vals[:, s] < threshold)
        if hit.size:
            out[s] = curve.steps[hit[0]]
    return out


def seed_area(curve: Curve) -> np.ndarray:
    """Per seed, the mean error over all episodes (the area under the learning curve / episodes)."""
    return np.nanmean(curve.values, axis=0)


def seed_tail(curve: Curve, frac: float = 0.1) -> np.ndarray:
    """Per seed, the mean error over the last `frac` of episodes."""
    n = max(1, int(round(len(curve.steps) * frac)))
    return np.nanmean(curve.values[-n:], axis=0)


def seeds_lower(a: np.ndarray, b: np.ndarray) -> tuple[int, int]:
    """(seeds where a < b, seeds compared: those where both are finite)."""
    ok = np.isfinite(a) & np.isfinite(b)
    return int((a[ok] < b[ok]).sum()), int(ok.sum())


def _steps_cell(steps: np.ndarray) -> str:
    hit = steps[np.isfinite(steps)]
    if not hit.size:
        return "never"
    return f"{fmt(float(np.median(hit)))} ({hit.size}/{steps.size})"


def method_setting_units(cfg) -> list[str]:
    """Units "method/setting" of an experiment that runs every method under every setting."""
    return [f"{m}/{s}" for m in cfg.methods for s in cfg.settings]


def method_setting_curves(run, metric: str = "error") -> dict[str, dict[str, Curve]]:
    """{method: {setting: Curve}} of such an experiment, in config order, for the units that ran."""
    got = tc.unit_curves(run, metric)
    cfg = run.config
    out: dict[str, dict[str, Curve]] = {}
    for m in cfg["methods"]:
        for s in cfg["settings"]:
            if f"{m}/{s}" in got:
                out.setdefault(m, {})[s] = got[f"{m}/{s}"]
    return out


def rate_interval(values: np.ndarray) -> Interval:
    """95 % t-interval of per-seed error rates over the seeds with a finite value (a diverged seed has none)."""
    v = values[np.isfinite(values)]
    return seed_interval(v, bounds=RATE) if v.size else Interval(float("nan"), float("nan"), float("nan"), 0, "none")


def paired_rate_interval(a: np.ndarray, b: np.ndarray) -> Interval:
    """Paired 95 % t-interval of a − b over the seeds where both are finite."""
    ok = np.isfinite(a) & np.isfinite(b)
    return paired_interval(a[ok], b[ok]) if ok.any() else Interval(float("nan"), float("nan"), float("nan"), 0, "none")


def comparison_table(section, data: dict[str, Curve], ref: str, labels: dict[str, str], threshold: float,
                     caption: str) -> None:
    """One row per setting: tail and mean error, episodes to `threshold` and the paired differences to `ref`."""
    head = ["setting", "final error % (last 10%)", "mean error % (all episodes)", f"episodes to {100 * threshold:g}%",
            f"per-seed episodes to {100 * threshold:g}% (median, seeds reaching)", f"Δ mean error vs {labels[ref]} "
            "(points, paired; seeds lower)"]
    rows = []
    for k, c in data.items():
        diff = "–"
        if k != ref and ref in data:
            lower, n = seeds_lower(seed_area(c), seed_area(data[ref]))
            diff = f"{paired_rate_interval(seed_area(c), seed_area(data[ref])).show(2, 100)} ({lower}/{n})"
        rows.append([labels[k], rate_interval(seed_tail(c)).show(1, 100), rate_interval(seed_area(c)).show(1, 100),
                     fmt(tc.steps_to(c, threshold)), _steps_cell(seed_steps_to(c, threshold)), diff])
    section.table(head, rows, caption)


def finding(data: dict[str, Curve], key: str, ref: str, labels: dict[str, str], threshold: float,
            decides: bool = True) -> str:
    """One computed sentence: how `key` compares with `ref` (episodes to threshold on the seed mean, and the
    paired difference in mean error over all episodes); `decides` False (a smoke run) calls no difference clear."""
    a, b = data[key], data[ref]
    ha, hb = tc.steps_to(a, threshold), tc.steps_to(b, threshold)
    lvl = f"{100 * threshold:g}%"
    if ha is not None and hb is not None:
        when = (f"reaches {lvl} error {abs(hb - ha)} episodes {'earlier' if ha < hb else 'later'} than "
                f"{labels[ref]} ({ha} vs {hb})" if ha != hb else f"reaches {lvl} error at the same episode as "
                f"{labels[ref]} ({ha})")
    elif ha is None and hb is None:
        when = f"does not reach {lvl} error, nor does {labels[ref]}"
    elif ha is None:
        when = f"does not reach {lvl} error ({labels[ref]}: episode {hb})"
    else:
        when = f"reaches {lvl} error at episode {ha} ({labels[ref]} does not)"
    lower, n = seeds_lower(seed_area(a), seed_area(b))
    area, tail = paired_rate_interval(seed_area(a), seed_area(b)), paired_rate_interval(seed_tail(a), seed_tail(b))
    sig, tsig = difference_read(area, decides), difference_read(tail, decides)
    return (f"{labels[key]} {when}; its mean error over all episodes differs from {labels[ref]}'s by "
            f"{area.show(2, 100)} points (paired 95 % t-interval over {count(n, 'seed')}, lower on {lower}/{n}; {sig}), and "
            f"its final error (last 10% of episodes) by {tail.show(2, 100)} points ({tsig}).")
