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


def test_a_mean_clipped_at_the_log_floor_is_marked_and_named_on_the_y_label():
    fig, axes = plots.figure(2)
    steps = np.arange(4)
    plots.curve(axes[0], steps, np.array([[0.5], [0.1], [0.0], [-1e-9]]) * np.ones((1, 2)), "TPO", floor=1e-6)
    plots.curve(axes[1], steps, np.array([[0.5], [0.1], [0.05], [0.01]]) * np.ones((1, 2)), "TPO", floor=1e-6)
    for ax in axes:
        plots.finish(ax, "t", "step", "1 − cos", log=True)
    floors = [[line for line in ax.get_lines() if line.get_gid() == plots.FLOOR] for ax in axes]
    assert len(floors[0]) == 1 and list(floors[0][0].get_ydata()) == [1e-6, 1e-6] and not floors[1]
    assert axes[0].get_ylabel() == "1 − cos\n(values < 1e-06 drawn at 1e-06, dotted)"
    assert axes[1].get_ylabel() == "1 − cos"
    plots.pyplot().close(fig)


def test_reference_markers_are_named_by_their_source():
    fig, axes = plots.figure(2)
    for ax in axes:
        _panel(ax, ["TPO"])
        plots.paper_points(ax, [2], [0.3], color="r", source="authors' code")
        plots.finish(ax, "t", "step", "error", log=True)
    plots.finish_figure(fig)
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["TPO", "authors' code (hollow circles)"]
    plots.pyplot().close(fig)


def test_figure_rows_give_every_panel_in_reading_order():
    fig, axes = plots.figure(3, nrows=2)
    assert len(axes) == 6 and axes[0].get_position().y0 > axes[3].get_position().y0
    assert axes[0].get_position().x0 < axes[1].get_position().x0 < axes[2].get_position().x0
    w, h = fig.get_size_inches()
    assert (w, h) == (15.0, 7.2)
    plots.pyplot().close(fig)


def test_a_curve_lying_exactly_under_another_is_named_in_the_panel_title():
    """Two methods that never leave the start drew one line, and the legend entry of the lower one showed no line
    anywhere (seen in smoke reports: TPO under GRPO)."""
    fig, axes = plots.figure(2)
    _panel(axes[0], ["TPO", "GRPO", "DG"])
    _panel(axes[1], ["TPO"])
    plots.curve(axes[1], np.arange(5), np.full((5, 2), 0.5), "GRPO")
    for ax in axes:
        plots.finish(ax, "H = 3", "episode", "error")
    assert axes[0].get_title() == "H = 3\n(TPO under DG: identical; GRPO under DG: identical)"
    assert axes[1].get_title() == "H = 3"
    plots.pyplot().close(fig)
    # two different means clipped alike at a log floor, and identical curves with a missing (NaN) step
    fig, axes = plots.figure(2)
    steps = np.arange(3)
    plots.curve(axes[0], steps, np.array([[0.5], [1e-6], [1e-6]]) * np.ones((1, 2)), "TPO", floor=1e-3)
    plots.curve(axes[0], steps, np.array([[0.5], [1e-5], [1e-5]]) * np.ones((1, 2)), "GRPO", floor=1e-3)
    for label in ("TPO", "GRPO"):
        plots.curve(axes[1], steps, np.array([[0.5], [np.nan], [0.2]]) * np.ones((1, 2)), label)
    for ax in axes:
        plots.finish(ax, "t", "episode", "error", log=True)
    assert axes[0].get_title() == "t\n(TPO under GRPO: the same where drawn)"
    assert axes[1].get_title() == "t\n(TPO under GRPO: identical)"
    plots.pyplot().close(fig)
