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
