"""Helpers shared by the token-experiment modules of §3.5, §3.7, §4 and Apps. D–E (token-variants,
token-ablations, token-diagnostics, token-sweeps, token-temperature, dg-epochs), on top of
:mod:`.common`: unit names, named method variants (``tpo_1ep``), labels and colours for them, a general
curve-panel figure (seed mean ± s.e., optional smoothing), and interval table cells (docs/verdicts.md)."""

from __future__ import annotations

import dataclasses

import numpy as np

from targetpo.runs import plots
from targetpo.runs.stats import Curve, fmt
from targetpo.tokens import common as tc
from targetpo.tokens.config import VARIANTS
from targetpo.tokens.engine import METHODS as ENGINE_METHODS, TrialConfig, check_trial, run_trial, trial_config

EXTRA_LABELS = {"tpo_1ep": "TPO (1 ep)", "dg_4ep": "DG (4 ep)"}
EXTRA_COLORS = {"tpo_1ep": "#ff9896", "dg_4ep": "#aec7e8", "tpo_no_anchor": "#e377c2"}
# A colour cycle for swept settings (K, epochs, η) of one method.
SWEEP_COLORS = ("#1b9e77", "#d95f02", "#7570b3", "#e7298a", "#66a61e", "#e6ab02", "#a6761d")


def resolve(cfg, method: str, **overrides) -> tuple[TrialConfig, str]:
    """(TrialConfig, engine method) for `method`, a METHODS key or a VARIANTS name, with extra overrides."""
    base, fixed = VARIANTS.get(method, (method, {}))
    return trial_config(cfg, **(overrides | fixed)), base


def check_methods(cfg, methods, **overrides) -> None:
    """ValueError unless run_method would run each of `methods` (variants included) with `overrides`, each as its
    own trial: two that resolve to the same run (tpo and tpo_1ep at epochs=1) are refused."""
    seen: dict[tuple[TrialConfig, str], str] = {}
    for m in methods:
        trial, base = resolve(cfg, m, **overrides)
        check_trial(trial, base)
        if (trial, base) in seen:
            a, b = sorted((seen[trial, base], m), key=lambda x: x in VARIANTS)  # b: the named variant
            fixed = ", ".join(f"{k}={v}" for k, v in VARIANTS.get(b, (b, {}))[1].items())
            raise ValueError(f"methods={tuple(methods)!r}: {b} ({base} at {fixed}) would run the same trial as {a} "
                             "here; drop one")
        seen[trial, base] = m


def run_method(cfg, method: str, ctx, **overrides) -> dict[str, np.ndarray]:
    """run_trial for `method` (variants included) on cfg's seeds, logging through the runner's ctx."""
    trial, base = resolve(cfg, method, **overrides)
    return run_trial(trial, base, tc.seed_list(cfg), ctx.device, ctx.log, ctx.advance, ctx.check_finite)


def label(method: str) -> str:
    return EXTRA_LABELS.get(method) or tc.label(method)


def color(method: str) -> str | None:
    return EXTRA_COLORS.get(method) or plots.COLORS.get(method)


def rollout(method: str) -> str:
    return ENGINE_METHODS[VARIANTS.get(method, (method,))[0]].rollout


# ----------------------------------------------------------------------------- units

def unit(*parts) -> str:
    return "/".join(str(p) for p in parts)


def parse(u: str) -> list[str]:
    return u.split("/")


def by_parts(run, metric: str = "error", key=lambda parts: (tuple(parts[:-1]), parts[-1])) -> dict:
    """{config key: {series key: Curve}} from unit names "a/b/.../method" (key splits a unit's parts)."""
    out: dict = {}
    for u, c in tc.unit_curves(run, metric).items():
        k, m = key(parse(u))
        out.setdefault(k, {})[m] = c
    return out


# ----------------------------------------------------------------------------- numbers

def smooth(values: np.ndarray, window: int) -> np.ndarray:
    """Trailing moving average along axis 0 over `window` points (shorter at the start), per seed."""
    if window <= 1:
        return values
    c = np.cumsum(np.nan_to_num(values, nan=0.0), axis=0)
    n = np.cumsum(np.isfinite(values), axis=0)
    c = np.concatenate([np.zeros_like(c[:1]), c])
    n = np.concatenate([np.zeros_like(n[:1]), n])
    idx = np.arange(1, len(values) + 1)
    lo = np.maximum(idx - window, 0)
    with np.errstate(invalid="ignore", divide="ignore"):
        return (c[idx] - c[lo]) / (n[idx] - n[lo])


def tail_cell(curve: Curve | None, scale: float = 100.0, digits: int = 2) -> str:
    """Tail-mean error as 'mean [95 % t-interval]' ('–' when the method did not run)."""
    return "–" if curve is None else tc.tail_iv(curve).show(digits, scale)


def horizon_note(run, paper_protocol: str, ours: str) -> str:
    return (f"Preset `{run.meta.get('preset')}`: {ours} (the paper: {paper_protocol}). Claims are evaluated "
            "on this run's data; where a claim needs more than this run has, it reads n/a.")


# ----------------------------------------------------------------------------- figures

def panels(section, grid: dict[str, dict[str, Curve]], name: str, caption: str, *, ylabel: str = "error",
           log: bool | dict[str, bool] = True, threshold: float | None = None, smooth_window: int = 1,
           labels: dict[str, str] | None = None, colors: dict[str, str] | None = None,
           refs: dict[str, dict[str, list[tuple[float, float]]]] | None = None, xlabel: str = "episode",
           ylabels: dict[str, str] | None = None, ncols: int = 4) -> None:
    """One panel per key of `grid` ({panel title: {series: Curve}}): seed mean ± s.e. of each series (after a
    trailing moving average of `smooth_window` episodes per seed when > 1). Series are labelled and coloured by
    `labels`/`colors` or else as methods; `refs` adds the paper's points as hollow markers."""
    plt = plots.pyplot()
    n = len(grid)
    cols = min(n, ncols)
    rows = (n + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4.4 * cols, 3.4 * rows), squeeze=False)
    axes = list(axes.ravel())
    for ax, (title, series) in zip(axes, grid.items()):
        is_log = log.get(title, True) if isinstance(log, dict) else log
        for key, c in series.items():
            col = (colors or {}).get(key) or color(key)
            vals = smooth(c.values, smooth_window)
            plots.curve(ax, c.steps, vals, (labels or {}).get(key) or label(key), col,
                        floor=1e-4 if is_log else None)
            pts = (refs or {}).get(title, {}).get(key)
            if pts:
                plots.paper_points(ax, *zip(*pts), color=col)
        if threshold is not None:
            ax.axhline(threshold, color="k", lw=0.6, ls=":")
        plots.finish(ax, title, xlabel, (ylabels or {}).get(title, ylabel), log=is_log)
    for ax in axes[n:]:
        ax.set_visible(False)
    fig.tight_layout()
    section.figure(fig, name, caption)


def steps_cell(curve: Curve | None, paper_value, in_paper: bool, threshold: float = 0.01) -> str:
    """'ours [bootstrap interval over seeds] (paper)' for an episodes-to-threshold table; ours 'never' = not
    reached in this run; paper '−' = never, 'n/a' = not in the paper."""
    ours = tc.steps_iv(curve, threshold).show(-1) if curve is not None else "not run"
    ref = "n/a" if not in_paper else ("−" if paper_value is None else fmt(paper_value))
    return f"{ours} ({ref})"


def replace(cfg, **changes):
    return dataclasses.replace(cfg, **changes)
