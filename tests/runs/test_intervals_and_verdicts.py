"""Seed intervals (runs/stats.py) checked against independent computations, the three-valued verdict logic, the
classification of FAILs and how the report renders and counts them (docs/verdicts.md)."""

import math
from pathlib import Path

import numpy as np
import pytest

from targetpo.report import Section, claim_count, resolve_failures
from targetpo.runs.stats import (NOISE, NOT_REPRODUCED, SCALE, Interval, Verdict, above, all_of, any_of, at_least,
                                 at_most, below, bootstrap_interval, failure, not_reproduced, oracle_floor,
                                 paired_interval, seed_interval, seed_noise, steps_to_interval, t_cdf, t_quantile,
                                 within)
from targetpo.runs.store import Run

P, F, I = Verdict.PASS, Verdict.FAIL, Verdict.INCONCLUSIVE

# Two-sided 95 % Student-t critical values t_{0.975, df}, from a printed table (e.g. NIST/SEMATECH e-Handbook 1.3.6.7.2).
T_TABLE = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 9: 2.262, 10: 2.228, 19: 2.093, 30: 2.042}


@pytest.mark.parametrize("df, expected", sorted(T_TABLE.items()))
def test_t_quantile_matches_the_printed_table(df, expected):
    assert t_quantile(0.975, df) == pytest.approx(expected, abs=6e-4)
    assert t_quantile(0.025, df) == pytest.approx(-expected, abs=6e-4)


@pytest.mark.parametrize("df", [1, 2, 3, 7, 12])
def test_t_cdf_matches_numerical_integration_of_the_density(df):
    # Independent of the closed form: the t density integrated with the trapezoid rule.
    def pdf(x):
        c = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(df * math.pi)
        return c * (1 + x * x / df) ** (-(df + 1) / 2)

    for t in (-3.0, -0.4, 0.0, 0.7, 2.5):
        xs = np.linspace(0, abs(t), 20001)
        half = np.trapezoid(pdf(xs), xs)
        assert t_cdf(t, df) == pytest.approx(0.5 + math.copysign(half, t), abs=1e-7)


def test_t_functions_reject_bad_arguments():
    with pytest.raises(ValueError, match="df must be an integer ≥ 1, got 0"):
        t_cdf(1.0, 0)
    with pytest.raises(ValueError, match=r"p must be in \(0, 1\), got 1.0"):
        t_quantile(1.0, 3)


def test_seed_interval_is_mean_plus_minus_t_times_standard_error():
    v = np.array([0.052, 0.061, 0.049, 0.058, 0.070])
    iv = seed_interval(v)
    half = T_TABLE[4] * v.std(ddof=1) / math.sqrt(5)
    assert iv.estimate == pytest.approx(v.mean()) and iv.n == 5 and iv.kind == "t"
    assert (iv.lo, iv.hi) == (pytest.approx(v.mean() - half, abs=1e-5), pytest.approx(v.mean() + half, abs=1e-5))
    assert seed_interval(v, level=0.5).hi - seed_interval(v, level=0.5).lo < iv.hi - iv.lo
    assert iv.show(1, 100, " %") == f"{100 * v.mean():.1f} % [{100 * iv.lo:.1f}, {100 * iv.hi:.1f}]"


def test_t_interval_covers_the_true_mean_at_its_level():
    rng = np.random.default_rng(1)
    samples = rng.normal(3.0, 2.0, size=(4000, 4))  # 4 seeds, as the cpu presets have
    hits = sum(seed_interval(s).covers(3.0) for s in samples)
    assert 0.935 <= hits / len(samples) <= 0.965  # binomial s.e. of the rate ≈ 0.0034


def test_one_seed_gives_no_interval_and_never_a_pass():
    iv = seed_interval([0.03])
    assert not iv.has_interval and iv.kind == "none" and iv.show(3) == "0.030 (1 seed, no interval)"
    assert below(iv, 1.0) is I and above(iv, -1.0) is I and within(iv, 0, 1) is I and at_most(iv, 1) is I
    assert bootstrap_interval(np.mean, np.array([1.0])).kind == "none"


def test_paired_interval_is_the_interval_of_per_seed_differences():
    a, b = np.array([0.10, 0.12, 0.09, 0.11]), np.array([0.08, 0.11, 0.08, 0.08])
    iv = paired_interval(a, b)
    assert iv.kind == "paired t" and iv[:4] == seed_interval(a - b)[:4]
    # Pairing removes the shared seed-to-seed spread: narrower than either method's own interval here.
    assert iv.hi - iv.lo < seed_interval(a).hi - seed_interval(a).lo
    with pytest.raises(ValueError, match=r"a and b must hold one value per seed each, got shapes \(4,\) and \(3,\)"):
        paired_interval(a, b[:3])


def test_interval_inputs_are_checked():
    with pytest.raises(ValueError, match="values must hold at least one seed's value"):
        seed_interval([])
    with pytest.raises(ValueError, match=r"values must be finite per seed, got \[1.0, nan\]"):
        seed_interval([1.0, float("nan")])
    with pytest.raises(ValueError, match=r"level must be in \(0, 1\), got 95"):
        seed_interval([1.0, 2.0], level=95)
    with pytest.raises(ValueError, match="samples must share their seed axis"):
        bootstrap_interval(lambda a, b: 0.0, np.ones(3), np.ones(4))


def test_bootstrap_is_reproducible_and_matches_an_independent_resampling():
    x = np.random.default_rng(7).exponential(size=12)
    iv = bootstrap_interval(np.median, x)
    assert iv == bootstrap_interval(np.median, x) and iv.kind == "bootstrap"
    idx = np.random.default_rng(0).integers(0, 12, size=(2000, 12))  # the documented fixed generator
    lo, hi = np.quantile(np.median(x[idx], axis=1), [0.025, 0.975], method="inverted_cdf")
    assert (iv.lo, iv.hi) == (pytest.approx(lo), pytest.approx(hi)) and iv.estimate == np.median(x)


def test_bootstrap_interval_of_a_mean_covers_the_true_mean_near_its_level():
    rng = np.random.default_rng(3)
    hits = sum(bootstrap_interval(np.mean, rng.normal(size=25), resamples=400, seed=i).covers(0.0)
               for i in range(300))
    # The percentile bootstrap runs slightly short of its level at small n (why means get a t-interval).
    assert 0.88 <= hits / 300 <= 0.98


def test_steps_to_interval_reads_never_and_agreeing_seeds():
    steps = np.arange(10)
    same = np.repeat(np.linspace(1, 0, 10)[:, None], 4, axis=1)  # every seed crosses 0.5 at step 5
    assert steps_to_interval(steps, same, 0.5)[:3] == (5.0, 5.0, 5.0)
    never = steps_to_interval(steps, np.ones((10, 3)), 0.5)
    assert never.estimate == np.inf and never.show(-1) == "never"
    assert below(never, 100) is F  # a "within 100 steps" claim fails when no resample ever gets there


VERDICT_TABLE = [  # (lo, hi, threshold, below, above, at_most, at_least)
    (0.1, 0.2, 0.3, P, F, P, F),
    (0.4, 0.5, 0.3, F, P, F, P),
    (0.2, 0.4, 0.3, I, I, I, I),  # straddles: inconclusive
    (0.1, 0.3, 0.3, I, F, P, I),  # touches: ≤ holds, < is not shown
    (0.3, 0.5, 0.3, F, I, I, P),
]


@pytest.mark.parametrize("lo, hi, t, v_below, v_above, v_at_most, v_at_least", VERDICT_TABLE)
def test_verdict_logic_table(lo, hi, t, v_below, v_above, v_at_most, v_at_least):
    iv = Interval((lo + hi) / 2, lo, hi, 5, "t")
    assert (below(iv, t), above(iv, t), at_most(iv, t), at_least(iv, t)) == (v_below, v_above, v_at_most, v_at_least)


@pytest.mark.parametrize("lo, hi, verdict", [(-0.5, 0.5, P), (1.5, 2.0, F), (-3, -2, F), (0.5, 1.5, I), (-2, 2, I)])
def test_within_is_pass_inside_fail_outside_inconclusive_across_an_edge(lo, hi, verdict):
    assert within(Interval((lo + hi) / 2, lo, hi, 3, "t"), -1.0, 1.0) is verdict


def test_three_valued_and_or():
    assert all_of([P, P]) is P and all_of([P, I]) is I and all_of([I, F, P]) is F and all_of([None, P]) is P
    assert all_of([]) is None and all_of([None]) is None and all_of([True, False]) is F
    assert any_of([F, P]) is P and any_of([F, I]) is I and any_of([F, F]) is F and any_of([]) is None


def _section(experiment, preset, claims, name="run", steps=None, seeds=0):
    run = Run(path=Path(f"/nonexistent/{name}"), meta={"preset": preset, "experiment": experiment,
                                                        "config": {"steps": steps, "seeds": seeds}})
    s = Section("t", run, run.path)
    for c in claims:
        s.claim(*c[:3], **(c[3] if len(c) > 3 else {}))
    return s


def test_seed_noise_and_oracle_floor_are_computed_from_the_intervals():
    iv = Interval(0.06, 0.02, 0.10, 3, "t")
    assert seed_noise(iv, 0.05, "gap").kind == NOISE and "gap 0.060 [0.020, 0.100] covers the paper's 0.050" in \
        seed_noise(iv, 0.05, "gap").evidence
    assert seed_noise(iv, 0.2, "gap") is None and seed_noise(iv, None, "gap") is None
    floor = Interval(0.054, 0.052, 0.056, 10, "t")
    assert oracle_floor(floor, 0.029, "TPO final", 100, " %").kind == SCALE
    assert oracle_floor(floor, 0.06, "TPO final") is None  # the oracle gets below the paper's number: no excuse
    f = not_reproduced(Interval(0.02, 0.015, 0.025, 3, "paired t"), 0.0, "change", "checked: x")
    assert f.kind == NOT_REPRODUCED and "excludes the paper's 0.000; checked: x" in f.evidence
    with pytest.raises(ValueError, match="a FAIL's kind must be one of"):
        failure("bad luck", "x")


def test_fail_classes_resolve_in_order_and_render_with_their_evidence():
    gap = Interval(0.02, 0.015, 0.025, 3, "paired t")
    declared = failure(NOT_REPRODUCED, "checked: the slides' protocol")
    cpu = _section("mnist-staleness", "cpu", [
        ("noisy", F, "e1", {"failure": [seed_noise(Interval(0.3, 0.1, 0.5, 3, "t"), 0.4, "x"), declared]}),
        ("bigger run passes", F, "e2", {"failure": declared}),
        ("declared only", F, "e3", {"failure": [None, declared]}),
        ("nothing declared", F, "e4"),
        ("straddles", within(gap, -0.02, 0.02), "e5"),
        ("passes", P, "e6"),
    ], name="cpu-run")
    paper = _section("mnist-staleness", "paper", [("bigger run passes", P, "p")], name="paper-run")
    other = _section("mnist", "paper", [("declared only", P, "other experiment: no bearing")])
    resolve_failures([cpu, paper, other])
    kinds = [c.failure.kind if c.failure else None for c in cpu.claims]
    assert kinds == [NOISE, SCALE, NOT_REPRODUCED, NOT_REPRODUCED, None, None]
    text = cpu.render()
    assert "| noisy | **FAIL** (seed noise) | e1. **Seed noise:** x 0.300 [0.100, 0.500] covers the paper's 0.400 |" in text
    assert "| bigger run passes | **FAIL** (scale or data) | e2. **Scale or data:** the same claim is PASS in the " \
           "larger run `paper-run` (preset paper, 0 steps, 0 seeds); this run has 0 steps and 0 seeds |" in text
    assert "| declared only | **FAIL** (does not reproduce) | e3. **Does not reproduce:** checked: the slides' protocol |" in text
    assert "**Does not reproduce:** no oracle floor, larger run or seed interval" in text
    assert "| straddles | inconclusive | e5 |" in text and "| passes | **PASS** | e6 |" in text
    assert claim_count([cpu, paper]) == ("**2 PASS, 4 FAIL (1 scale or data, 1 seed noise, 2 does not reproduce), "
                                         "1 inconclusive** over the cpu and paper presets")


def test_claim_rejects_a_verdict_it_does_not_know():
    s = _section("x", "cpu", [])
    with pytest.raises(ValueError, match="a claim's verdict must be a bool, None or one of"):
        s.claim("c", "maybe", "e")
    with pytest.raises(ValueError, match="failure entries must be Failure or None, got 'scale or data'"):
        s.claim("c", F, "e", failure=[SCALE])
    assert Section.claim.__code__.co_varnames[:4] == ("self", "text", "passed", "evidence")  # the old call still works


def test_a_longer_run_at_the_same_preset_counts_as_larger_and_a_failing_one_is_reported():
    short = _section("mnist-staleness", "cpu", [("drift", F, "e", {"failure": failure(NOT_REPRODUCED, "checked: x")}),
                                                ("order", F, "e")], name="short", steps=3000, seeds=3)
    long = _section("mnist-staleness", "cpu", [("drift", P, "e"), ("order", F, "e")], name="long", steps=10000, seeds=3)
    fewer = _section("mnist-staleness", "cpu", [("drift", P, "e")], name="fewer", steps=10000, seeds=2)
    resolve_failures([short, long, fewer])
    drift, order = short.claims
    assert drift.failure.kind == SCALE and "PASS in the larger run `long` (preset cpu, 10,000 steps, 3 seeds); this " \
        "run has 3,000 steps and 3 seeds" in drift.failure.evidence
    assert order.failure.kind == NOT_REPRODUCED and order.failure.evidence.endswith(
        "; the same claim also FAILs in the larger run `long` (preset cpu, 10,000 steps, 3 seeds)")
    assert long.claims[1].failure.kind == NOT_REPRODUCED and "also FAILs" not in long.claims[1].failure.evidence

    # A longer run of fewer methods does not test the same claim: no class from it.
    subset = _section("mnist-staleness", "cpu", [("drift", P, "e")], name="subset", steps=10000, seeds=3)
    subset.run.meta["config"]["methods"] = ["tpo"]
    short = _section("mnist-staleness", "cpu", [("drift", F, "e")], name="short", steps=3000, seeds=3)
    short.run.meta["config"]["methods"] = ["tpo", "dg"]
    resolve_failures([short, subset])
    assert short.claims[0].failure.kind == NOT_REPRODUCED


def test_bounds_cut_an_interval_to_the_quantitys_range():
    raw, cut = seed_interval([0.01, 0.30]), seed_interval([0.01, 0.30], bounds=(0.0, 1.0))
    assert raw.lo < 0 and raw.hi > 1 and (cut.lo, cut.hi) == (0.0, 1.0) and cut.estimate == raw.estimate
    assert seed_interval([0.4, 0.5, 0.45], bounds=(0, 1))[:3] == seed_interval([0.4, 0.5, 0.45])[:3]
    with pytest.raises(ValueError, match=r"bounds must be \(low, high\) around the seed mean 2.0"):
        seed_interval([1.0, 3.0], bounds=(0, 1))


def test_prose_reads_a_difference_by_the_verdict_rule_and_never_decides_on_smoke():
    from targetpo.runs.stats import difference_read

    clear, straddles = Interval(0.1, 0.05, 0.15, 3, "paired t"), Interval(0.1, -0.01, 0.21, 3, "paired t")
    assert difference_read(clear) == "a clear difference"
    assert difference_read(straddles) == "not resolved: the interval includes 0"
    assert difference_read(seed_interval([0.1])) == "not resolved: no interval"  # one seed
    assert "too short to decide" in difference_read(clear, decides=False)


def test_report_cells_keep_intervals_inside_what_the_quantity_can_take():
    """A misalignment (1 − cos, in [0, 2]) of two seeds was shown as 0.583 [-3.46, 4.63]."""
    import numpy as np

    from targetpo.runs.stats import MISALIGNMENT, Curve, mean_se, ours_vs_paper

    vals = np.array([[0.1, 1.07]])
    curve = Curve(np.array([0]), *mean_se(vals), vals)
    assert ours_vs_paper(curve, [0], [0.42], MISALIGNMENT) == ["0.585 [0, 2] (0.42)"]
    assert ours_vs_paper(curve, [0], [0.42]) != ["0.585 [0, 2] (0.42)"]  # unbounded: the t interval as is
