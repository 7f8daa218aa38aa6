"""Seed statistics as the paper defines them (docs/method.md §1): s.e. = std(ddof=0)/√n; "steps to x" =
first 0-based index where the seed-mean curve is below x; "final" = seed mean at the last point, unsmoothed."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


def mean_se(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """values [..., seeds] -> (mean, s.e.) over the last axis."""
    v = np.asarray(values, dtype=float)
    n = v.shape[-1]
    return v.mean(axis=-1), v.std(axis=-1) / np.sqrt(max(n, 1))


def first_below(steps: np.ndarray, curve: np.ndarray, threshold: float) -> int | None:
    """First step whose value is < threshold, or None if never."""
    idx = np.flatnonzero(np.asarray(curve) < threshold)
    return int(np.asarray(steps)[idx[0]]) if idx.size else None


def value_at(steps: np.ndarray, curve: np.ndarray, step: int) -> float:
    i = int(np.searchsorted(steps, step))
    if i >= len(steps) or steps[i] != step:
        raise KeyError(f"step {step} was not recorded")
    return float(curve[i])


def fmt(x: float | int | None, digits: int = 3) -> str:
    """Compact number for tables: '–' for missing, scientific below 1e-3."""
    if x is None:
        return "–"
    if isinstance(x, (int, np.integer)):
        return str(int(x))
    if not np.isfinite(x):
        return str(x)
    if x != 0 and abs(x) < 1e-3:
        return f"{x:.1e}"
    return f"{x:.{digits}g}"


class Curve(NamedTuple):
    steps: np.ndarray
    mean: np.ndarray
    se: np.ndarray
    values: np.ndarray  # [steps, seeds]


def curves(run, metric: str) -> dict[str, Curve]:
    """Every unit's seed-mean curve of `metric` from a stored run."""
    out = {}
    for unit in run.units():
        steps, vals = run.series(unit, metric)
        if len(steps):
            out[unit] = Curve(steps, *mean_se(vals), vals)
    return out


def ours_vs_paper(curve: Curve, ref_steps, ref_values) -> list[str]:
    """'ours (paper)' cells at the paper's steps that this run recorded."""
    last = curve.steps[-1]
    return [f"{fmt(value_at(curve.steps, curve.mean, s))} ({fmt(v)})" for s, v in zip(ref_steps, ref_values) if s <= last]

