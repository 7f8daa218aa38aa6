"""The fast bootstrap of "steps to x" and of leads (runs/stats.py `first_hits`, `bootstrap_hits`) against the
resample-by-resample way it replaced: every resample's first hit, and so every interval, the same, including the
means that land on the threshold itself, where the matrix product's rounding and NumPy's sum could disagree."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from targetpo.runs.stats import (bootstrap_hits, bootstrap_indices, bootstrap_interval, first_hits, hit_step,
                                 steps_to_interval)


def resampled_one_by_one(steps, values, threshold, idx, or_equal=False):
    """The old way: each resample's curves copied, averaged over seeds, and searched."""
    out = []
    for row in idx:
        means = np.asarray(values, dtype=float)[:, row].mean(axis=-1)
        hit = np.flatnonzero(means <= threshold if or_equal else means < threshold)
        out.append(float(np.asarray(steps)[hit[0]]) if hit.size else np.inf)
    return np.array(out)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), steps=st.integers(1, 80), seeds=st.integers(2, 40),
       kind=st.sampled_from(["dyadic", "narrow", "wide", "nan", "inf"]), or_equal=st.booleans(),
       layout=st.sampled_from(["c", "fortran", "reversed"]))
def test_first_hits_are_the_resample_by_resample_answers(seed, steps, seeds, kind, or_equal, layout):
    """Curves whose resampled means tie the threshold exactly (dyadic values at threshold 0.5, or the threshold
    set to one resample's own mean), wide and narrow ranges, NaN and inf entries, any memory layout."""
    rng = np.random.default_rng(seed)
    if kind == "dyadic":
        values = rng.choice([0.0, 0.25, 0.5, 1.0], size=(steps, seeds))
    elif kind == "narrow":
        values = 0.3 + 0.1 * rng.uniform(size=(steps, seeds))
    else:
        values = 1e3 * rng.standard_normal((steps, seeds))
        if kind != "wide":
            values[rng.integers(steps), rng.integers(seeds)] = np.nan if kind == "nan" else np.inf
    values = {"c": values, "fortran": np.asfortranarray(values), "reversed": values[:, ::-1]}[layout]
    idx = bootstrap_indices(seeds, resamples=200, seed=seed % 1000)
    step_ids = 10 * np.arange(steps)
    t, r = rng.integers(steps), rng.integers(len(idx))
    threshold = 0.5 if kind == "dyadic" else float(np.asarray(values, dtype=float)[:, idx[r]].mean(axis=-1)[t])
    assert np.array_equal(first_hits(step_ids, values, threshold, idx, or_equal=or_equal),
                          resampled_one_by_one(step_ids, values, threshold, idx, or_equal))


def test_a_tie_the_matrix_product_rounds_the_other_way_is_decided_as_numpy_sums():
    """31 seeds whose resampled mean NumPy rounds to ...919 and the product to ...9191 (found by search): with
    the threshold at NumPy's value the resample does not hit (strictly below), and with ≤ it hits at once."""
    rng = np.random.default_rng(0)
    for _ in range(2000):
        values = 0.3 + 0.1 * rng.uniform(size=(4, 31))
        idx = bootstrap_indices(31, resamples=50, seed=int(rng.integers(1000)))
        numpy_means = values[:, idx[0]].mean(axis=-1)
        product = values @ np.bincount(idx[0], minlength=31).astype(float) / 31
        if numpy_means[0] != product[0]:
            break
    else:
        pytest.fail("no mean on which the two sums disagree was found")
    threshold = float(numpy_means[0])
    assert first_hits(np.arange(4), values, threshold, idx[:1])[0] == resampled_one_by_one(
        np.arange(4), values, threshold, idx[:1])[0]
    assert first_hits(np.arange(4), values, threshold, idx[:1], or_equal=True)[0] == 0.0


def test_a_lead_is_the_bootstrap_interval_of_its_statistic_over_hit_step():
    """A paired lead of two curves and steps to 1% over many seeds and steps, as the old per-resample
    statistic computed them, with "never" capped one step past the run."""
    rng = np.random.default_rng(7)
    steps = np.arange(0, 3000, 3)
    decay = np.exp(-np.outer(np.arange(len(steps)), rng.uniform(0.002, 0.02, size=60)))
    slow, fast = decay, decay ** 1.3
    end = float(steps[-1] + 1)
    old = bootstrap_interval(lambda a, b: min(hit_step(steps, a, 0.01), end) - min(hit_step(steps, b, 0.01), end),
                             slow, fast)
    new = bootstrap_hits(lambda a, b: np.minimum(a, end) - np.minimum(b, end), [(steps, slow), (steps, fast)], 0.01)
    assert new == old and new.kind == "bootstrap"
    assert steps_to_interval(steps, slow, 0.01) == bootstrap_interval(lambda v: hit_step(steps, v, 0.01), slow)


def test_one_seed_has_no_interval_and_bad_curves_are_refused():
    iv = bootstrap_hits(lambda h: h, [(np.arange(3), np.array([[1.0], [0.5], [0.0]]))], 0.6)
    assert (iv.estimate, iv.kind) == (1.0, "none")
    with pytest.raises(ValueError, match="sharing their seed axis"):
        bootstrap_hits(lambda a, b: a - b, [(np.arange(2), np.ones((2, 3))), (np.arange(2), np.ones((2, 4)))], 0.5)
    with pytest.raises(ValueError, match="at least one curve"):
        bootstrap_hits(lambda: 0.0, [], 0.5)
    with pytest.raises(ValueError, match=r"one row per step, got shape \(2, 3\) for 5 steps"):
        first_hits(np.arange(5), np.ones((2, 3)), 0.5, bootstrap_indices(3))
