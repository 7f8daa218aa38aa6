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


def figure(ncols: int = 1, width: float = 5.0, height: float = 3.6, nrows: int = 1):
    """A figure of nrows × ncols panels of width × height inches each; the axes as one list, row by row."""
    fig, axes = pyplot().subplots(nrows, ncols, figsize=(width * ncols, height * nrows), squeeze=False)
    return fig, list(axes.ravel())


def curve(ax, steps: np.ndarray, values: np.ndarray, label: str, color: str | None = None, floor: float | None = None,
          ls: str = "-"):
    """Seed mean with a ± s.e. band. `values` is [steps, seeds]. `floor` clips for log axes."""
    m, se = mean_se(values)
    lo, hi = m - se, m + se
    raw = m
    if floor is not None:
        if np.any(m < floor) and not any(line.get_gid() == FLOOR for line in ax.get_lines()):
            # A mean drawn at the floor is not its value: a dotted line there, and finish names it on the y label.
            ax.axhline(floor, color="0.5", lw=0.8, ls=(0, (1, 3)), gid=FLOOR)
        m, lo, hi = (np.maximum(x, floor) for x in (m, lo, hi))
    color = color or COLORS.get(label.lower().replace(" ", "_"))
    (line,) = ax.plot(steps, m, label=label, color=color, lw=1.6, ls=ls)
    line.targetpo_mean = raw  # before the floor: hidden_curves tells identical curves from ones clipped alike
    ax.fill_between(steps, lo, hi, color=color, alpha=0.2, lw=0)


FLOOR = "floor"  # gid of the line at a log axis's floor, drawn by curve when a mean is clipped to it
PAPER = "paper"  # gid prefix of the hollow reference markers ("paper:SOURCE"): finish_figure gives them one entry
HOLLOW = " (hollow circles)"


def paper_points(ax, steps, values, color: str | None = None, label: str | None = None, source: str = "paper"):
    """The reference numbers as hollow markers over our curves; `source` names them in the legend ("paper",
    "authors' code", "slides")."""
    pts = [(s, v) for s, v in zip(steps, values) if v is not None]
    if pts:
        xs, ys = zip(*pts)
        ax.scatter(xs, ys, marker="o", facecolors="none", edgecolors=color or "k", s=28, zorder=5, label=label,
                   gid=f"{PAPER}:{source}")


def finish(ax, title: str, xlabel: str, ylabel: str, log: bool = False, ylim: tuple[float, float] | None = None):
    """Title, axis labels, grid and scale of one panel. The legend is drawn once per figure by
    :func:`finish_figure` (outside the panels, so it never covers data)."""
    from matplotlib import ticker

    if log:
        ax.set_yscale("log")
    if ylim is not None:
        ax.set_ylim(*ylim)
    if log:
        # Plain numbers (0.05, 0.1, ...) rather than 5×10⁻², and enough of them to read a value off a short axis:
        # every minor tick under one decade, 1-2-5 steps under three.
        lo, hi = ax.get_ylim()
        decades = np.log10(hi / max(lo, 1e-300))
        if 1 <= decades < 3:
            ax.yaxis.set_major_locator(ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(ticker.FuncFormatter(_plain))
        ax.yaxis.set_minor_formatter(ticker.FuncFormatter(_plain) if decades < 1 else ticker.NullFormatter())
    if ax.get_xscale() == "linear" and _integer_x(ax):
        ax.xaxis.set_major_locator(ticker.MaxNLocator(integer=True))  # steps and episodes: no 0.5 ticks
    floors = [line.get_ydata()[0] for line in ax.get_lines() if line.get_gid() == FLOOR]
    if floors:
        ylabel = f"{ylabel}\n(values < {floors[0]:g} drawn at {floors[0]:g}, dotted)"
    hidden = hidden_curves(ax)
    if hidden:  # a legend entry whose line lies exactly under another's showed no line at all
        title = f"{title}\n({'; '.join(f'{a} under {b}: {how}' for a, b, how in hidden)})"
    ax.set_title(title, fontsize=10)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)


def hidden_curves(ax) -> list[tuple[str, str, str]]:
    """(label, label of the curve drawn over it, "identical" or "the same where drawn") for each labelled curve
    whose drawn points are exactly those of a curve drawn after it (two methods that never leave the start; two
    means clipped alike at a log floor)."""
    lines = [ln for ln in ax.get_lines() if not ln.get_label().startswith("_") and ln.get_gid() != FLOOR]

    def same(a, b) -> bool:
        return np.shape(a) == np.shape(b) and np.array_equal(a, b, equal_nan=True)

    out = []
    for i, under in enumerate(lines):
        over = next((ln for ln in reversed(lines[i + 1:]) if same(ln.get_xdata(), under.get_xdata())
                     and same(ln.get_ydata(), under.get_ydata())), None)
        if over is not None:
            raw = [getattr(ln, "targetpo_mean", ln.get_ydata()) for ln in (under, over)]
            out.append((under.get_label(), over.get_label(), "identical" if same(*raw) else "the same where drawn"))
    return out


def finish_figure(fig) -> None:
    """Legends outside the panels, so they never cover data, with a "paper" entry wherever the paper's hollow
    markers are drawn; then a tight layout so no label overlaps its neighbour. Panels that show the same series
    share one legend (right of a single panel, below a row); panels with different series (sweeps, a warm-start
    panel) each get theirs below their x label. Section.figure calls this for every report plot."""
    panels = [(ax, _legend_entries(ax)) for ax in fig.axes]
    panels = [(ax, entries) for ax, entries in panels if entries]
    for ax in fig.axes:
        if ax.get_legend() is not None:
            ax.get_legend().remove()
    series = [[k for k in e if not k.endswith(HOLLOW)] for _, e in panels]
    if panels and all(s == series[0] for s in series):
        entries = {k: h for _, e in panels for k, h in e.items()}  # the reference entry if any panel has one
        fig.tight_layout()
        if len(fig.axes) == 1:
            fig.legend(entries.values(), entries.keys(), loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8,
                       frameon=False)
        else:
            fig.legend(entries.values(), entries.keys(), loc="upper center", bbox_to_anchor=(0.5, 0.0), fontsize=8,
                       frameon=False, ncol=min(len(entries), 8))
        return
    for ax, entries in panels:
        ax.legend(entries.values(), entries.keys(), loc="upper center", bbox_to_anchor=(0.5, -0.2), fontsize=8,
                  frameon=False, ncol=min(len(entries), 3))
    fig.tight_layout()


def _legend_entries(ax) -> dict[str, object]:
    from matplotlib.lines import Line2D

    entries: dict[str, object] = {}
    for h, lab in zip(*ax.get_legend_handles_labels()):
        if not lab.startswith("_"):
            entries.setdefault(lab, h)
    sources = [gid.split(":", 1)[1] for c in ax.collections if (gid := c.get_gid() or "").startswith(PAPER + ":")]
    for source in dict.fromkeys(sources):
        entries[source + HOLLOW] = Line2D([], [], ls="none", marker="o", markerfacecolor="none", markeredgecolor="k")
    return entries


def _plain(v: float, _pos=None) -> str:
    return f"{v:g}"


def _integer_x(ax) -> bool:
    xs = [np.asarray(line.get_xdata(), dtype=float) for line in ax.get_lines()]
    xs = [x for x in xs if x.size]
    return bool(xs) and all(np.all(x == np.round(x)) for x in xs)
