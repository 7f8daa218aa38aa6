"""tools/relapses.py: the relapse count behind docs/experiments.md §E6."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest

_spec = importlib.util.spec_from_file_location("relapses", Path(__file__).resolve().parent.parent / "tools" / "relapses.py")
relapses = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(relapses)


def test_relapses_counts_stretches_above_the_level_after_first_solving():
    x = np.array([0.9, 0.2, 0.08, 0.005, 0.3, 0.4, 0.0, 0.0, 0.06, 0.0] + [0.0] * 20 + [0.5, 0.01])
    # the 0.08 before the first ≤ 1% is not a relapse; 0.3/0.4 and 0.06 are 4 episodes apart: one stretch
    assert relapses.relapses(x, gap=10) == [(4, 0.4), (30, 0.5)]
    assert relapses.relapses(x, gap=2) == [(4, 0.4), (8, 0.06), (30, 0.5)]
    assert relapses.relapses(np.full(5, 0.5)) is None
    with pytest.raises(ValueError, match="one seed's curve"):
        relapses.relapses(np.zeros((2, 3)))


def test_relapses_reads_npz_curves(tmp_path, capsys):
    np.savez(tmp_path / "c.npz", tpo_errors=np.array([[0.5, 0.0, 0.2], [0.5, 0.5, 0.5]]))
    assert relapses.main([str(tmp_path / "c.npz")]) == 0
    out = capsys.readouterr().out
    assert "tpo_errors: 1/2 seeds reach ≤ 0.01" in out and "[1] (total 1)" in out


@pytest.mark.parametrize("flags, message", [
    (["--solved", "2"], "argument --solved: '2' is not an error level in [0, 1]"),
    (["--solved", "nan"], "argument --solved: 'nan' is not an error level in [0, 1]"),
    (["--gap", "-1"], "argument --gap: '-1' is negative"),
    (["--solved", "0.1", "--relapse", "0.05"], "--relapse 0.05 must be above --solved 0.1"),
])
def test_bad_levels_are_one_line_errors(tmp_path, capsys, flags, message):
    """--solved 2, nan or a negative --gap ran and printed "reach ≤ nan" or "highest peak nan"."""
    np.savez(tmp_path / "c.npz", tpo_errors=np.array([[0.5, 0.0, 0.0]]))
    with pytest.raises(SystemExit) as stop:
        relapses.main([str(tmp_path / "c.npz"), *flags])
    err = capsys.readouterr().err.strip()
    assert stop.value.code == 2 and "\n" not in err and message in err, err


def test_no_relapse_prints_no_peak(tmp_path, capsys):
    np.savez(tmp_path / "c.npz", tpo_errors=np.array([[0.5, 0.0, 0.0]]))
    assert relapses.main([str(tmp_path / "c.npz")]) == 0
    out = capsys.readouterr().out
    assert "(total 0);" in out and "nan" not in out
