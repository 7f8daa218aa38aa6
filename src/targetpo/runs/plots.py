"""Plot helpers shared by every report: seed-mean curves with ± s.e. bands, and the paper's numbers as markers."""

from __future__ import annotations

import numpy as np

from targetpo.runs.stats import mean_se


def pyplot():
    """matplotlib.pyplot on the file-only Agg backend, imported on first use: experiments import this module,
    and a training run should not pay matplotlib's ~0.5 s import before it starts."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt

# One colour per method across every figure of the report.
COLORS = {
    "tpo": "#d62728", "tpo_token": "#d62728", "dg": "#1f77b4", "grpo": "#2ca02c", "grpo_token": "#2ca02c",
    "pg": "#7f7f7f", "reinforce": "#7f7f7f", "ppo": "#9467bd", "ce": "#000000", "group_pg": "#ff7f0e",
    "grpo_no_kl": "#8c564b", "tpo_no_anchor": "#e377c2", "grpo_masked": "#17becf", "pg_is": "#bcbd22",
}


def figure(ncols: int = 1, width: float = 5.0, height: float = 3.6):
    fig, axes = pyplot().subplots(1, ncols, figsize=(width * ncols, height), squeeze=False)
    return fig, list(axes[0])


def curve(ax, steps: np.ndarray, values: np.ndarray, label: str, color: str | None = None, floor: float | None = None):
    """Seed mean with a ± s.e. band. `values` is [steps, seeds]. `floor` clips for log axes."""
    m, se = mean_se(values)
    lo, hi = m - se, m + se
    if floor is not None:
        m, lo, hi = (np.maximum(x, floor) for x in (m, lo, hi))
    color = color or COLORS.get(label.lower().replace(" ", "_"))
    ax.plot(steps, m, label=label, color=color, lw=1.6)
    ax.fill_between(steps, lo, hi, color=color, alpha=0.2, lw=0)


def paper_points(ax, steps, values, color: str | None = None, label: str | None = None):
    """The paper's reference numbers as hollow markers over our curves."""
    pts = [(s, v) for s, v in zip(steps, values) if v is not None]
    if pts:
        xs, ys = zip(*pts)
        ax.scatter(xs, ys, marker="o", facecolors="none", edgecolors=color or "k", s=28, zorder=5, label=label)


def finish(ax, title: str, xlabel: str, ylabel: str, log: bool = False):
    if log:
        ax.set_yscale("log")
    ax.set_title(title, fontsize=10)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
