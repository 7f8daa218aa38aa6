"""The statistics behind every verdict (docs/verdicts.md) at their edges, against numbers worked by hand: a
population-std standard error for the curves, strict thresholds, paired (not sorted) differences, closed intervals
and decision boundaries that an interval merely touches."""

from __future__ import annotations

import math

import numpy as np
import pytest

from targetpo.runs.stats import (Curve, Interval, Verdict, difference_read, final_interval, first_below, hit_step,
                                 mean_se, oracle_floor, paired_interval, seed_noise, within)

T_975_DF2 = 4.302652729911275  # Student t quantile, 0.975, 2 degrees of freedom


def test_a_curves_standard_error_is_the_population_std_over_root_n():
    """Seeds 1 and 3: mean 2, population std 1, s.e. 1/√2 (the sample std would give 1)."""
    m, se = mean_se(np.array([[1.0, 3.0]]))
    assert m.tolist() == [2.0] and se.tolist() == pytest.approx([1 / math.sqrt(2)])


def test_steps_to_a_threshold_count_the_first_step_strictly_below_it():
    """A curve that only touches 0.01 at step 10 reaches "below 0.01" at step 20."""
    steps = np.array([0, 10, 20])
    assert first_below(steps, np.array([0.5, 0.01, 0.0]), 0.01) == 20
    assert hit_step(steps, np.array([[0.5, 0.5], [0.01, 0.01], [0.0, 0.0]]), 0.01) == 20


def test_paired_interval_pairs_the_seeds():
    """a − b per seed = (−1, −1, 2): mean 0, sample std √3, half-width t·√3/√3 = 4.3027. Sorting each side first
    would pair (1, 1), (2, 2), (3, 3) and give [0, 0]."""
    iv = paired_interval([1.0, 2.0, 3.0], [2.0, 3.0, 1.0])
    assert (iv.estimate, iv.lo, iv.hi) == pytest.approx((0.0, -T_975_DF2, T_975_DF2))


def test_an_interval_touching_an_edge_of_within_is_not_outside_it():
    """within(−1, 1) fails only an interval wholly outside [−1, 1]; [−2, −1] and [1, 2] touch it."""
    assert within(Interval(-1.5, -2.0, -1.0, 3, "t"), -1.0, 1.0) is Verdict.INCONCLUSIVE
    assert within(Interval(1.5, 1.0, 2.0, 3, "t"), -1.0, 1.0) is Verdict.INCONCLUSIVE
    assert within(Interval(1.5, 1.01, 2.0, 3, "t"), -1.0, 1.0) is Verdict.FAIL


def test_an_interval_is_closed():
    """[0, 0.1] includes 0: no clear difference; [0.02, 0.10] includes the paper's 0.10, so a miss is seed noise."""
    iv = Interval(0.05, 0.0, 0.1, 3, "paired t")
    assert iv.covers(0.0) and difference_read(iv) == "not resolved: the interval includes 0"
    assert seed_noise(Interval(0.06, 0.02, 0.10, 3, "t"), 0.10, "gap") is not None


def test_the_final_interval_is_over_the_last_recorded_step():
    """Last row (0.1, 0.2, 0.3): mean 0.2, sample std 0.1, half 4.3027·0.1/√3 = 0.24841, an error cut at 0."""
    vals = np.array([[0.9, 0.9, 0.9], [0.5, 0.5, 0.5], [0.1, 0.2, 0.3]])
    iv = final_interval(Curve(np.array([0, 1, 2]), *mean_se(vals), vals))
    half = T_975_DF2 * 0.1 / math.sqrt(3)
    assert (iv.estimate, iv.lo, iv.hi) == pytest.approx((0.2, 0.0, 0.2 + half))


def test_an_oracle_floor_straddling_the_papers_value_is_no_scale_class():
    """SCALE is for a floor wholly above the paper's value: [0.04, 0.06] against 0.05 is not."""
    assert oracle_floor(Interval(0.05, 0.04, 0.06, 5, "t"), 0.05, "TPO final") is None
    assert oracle_floor(Interval(0.07, 0.06, 0.08, 5, "t"), 0.05, "TPO final") is not None
