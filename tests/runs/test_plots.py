"""Shared plot finishing: legends never inside a panel, one 'paper' entry for the hollow markers, integer step
ticks, plain log tick labels."""

import numpy as np

from targetpo.runs import plots


def _panel(ax, labels, steps=np.arange(5)):
    for lab in labels:
        plots.curve(ax, steps, np.linspace(0.9, 0.05, len(steps))[:, None] * np.ones((1, 2)), lab)


def test_panels_with_the_same_series_share_one_legend_outside():
    fig, axes = plots.figure(2)
    for ax in axes:
        _panel(ax, ["TPO", "GRPO"])
        plots.finish(ax, "t", "episode", "error", log=True)
    plots.paper_points(axes[0], [2], [0.3], color="r")
    plots.finish_figure(fig)
    assert all(ax.get_legend() is None for ax in axes) and len(fig.legends) == 1
    texts = [t.get_text() for t in fig.legends[0].get_texts()]
    assert texts == ["TPO", "GRPO", "paper (hollow circles)"]
    ticks = axes[0].get_xticks()
    assert np.all(ticks == np.round(ticks))  # no 0.5 episodes
    fig.canvas.draw()
    labels = [t.get_text() for t in axes[0].get_yticklabels() if t.get_text()]
    assert labels and not any("10^" in lab or "times" in lab for lab in labels), labels
    plots.pyplot().close(fig)


def test_panels_with_different_series_get_their_own_legend_below():
    fig, axes = plots.figure(2)
    _panel(axes[0], ["K=2", "K=4"])
    _panel(axes[1], ["epochs=1"])
    for ax in axes:
        plots.finish(ax, "t", "episode", "error")
    plots.finish_figure(fig)
    assert not fig.legends
    for ax, want in zip(axes, (["K=2", "K=4"], ["epochs=1"])):
        legend = ax.get_legend()
        assert [t.get_text() for t in legend.get_texts()] == want
        fig.canvas.draw()
        # Entirely below the panel: it covers no data.
        assert legend.get_window_extent().y1 <= ax.get_window_extent().y0
    plots.pyplot().close(fig)
