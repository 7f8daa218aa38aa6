"""Seed statistics as the paper defines them (docs/method.md §6): s.e. = std(ddof=0)/√n; "steps to x" =
the first recorded step at which the seed-mean curve is below x; "final" = seed mean at the last point,
unsmoothed.
Seed intervals and three-valued claim verdicts (docs/verdicts.md) are at the end of the file."""

from __future__ import annotations

from enum import Enum
from typing import NamedTuple

import numpy as np


def mean_se(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """values [..., seeds] -> (mean, s.e.) over the last axis."""
    v = np.asarray(values, dtype=float)
    n = v.shape[-1]
    return v.mean(axis=-1), v.std(axis=-1) / np.sqrt(max(n, 1))


def first_below(steps: np.ndarray, curve: np.ndarray, threshold: float, *, or_equal: bool = False) -> int | None:
    """First step whose value is < threshold (≤ with `or_equal`), or None if never."""
    curve = np.asarray(curve)
    idx = np.flatnonzero(curve <= threshold if or_equal else curve < threshold)
    return int(np.asarray(steps)[idx[0]]) if idx.size else None


def value_at(steps: np.ndarray, curve: np.ndarray, step: int) -> float:
    i = int(np.searchsorted(steps, step))
    if i >= len(steps) or steps[i] != step:
        raise KeyError(f"step {step} was not recorded")
    return float(curve[i])


def count(n: int, noun: str) -> str:
    """'1 seed', '3 seeds': a count with its noun (English plural by an added s)."""
    return f"{n:,} {noun}" if n == 1 else f"{n:,} {noun}s"


def fmt(x: float | int | None, digits: int = 3) -> str:
    """Compact number for tables: '–' for missing, scientific below 1e-3."""
    if x is None:
        return "–"
    if isinstance(x, (int, np.integer)):
        return str(int(x))
    if not np.isfinite(x):
        return str(x)
    if x != 0 and abs(x) < 1e-3:
        return f"{x:.1e}"
    return f"{x:.{digits}g}"


class Curve(NamedTuple):
    steps: np.ndarray
    mean: np.ndarray
    se: np.ndarray
    values: np.ndarray  # [steps, seeds]


def curves(run, metric: str) -> dict[str, Curve]:
    """Every unit's seed-mean curve of `metric` from a stored run."""
    out = {}
    for unit in run.units():
        steps, vals = run.series(unit, metric)
        if len(steps):
            out[unit] = Curve(steps, *mean_se(vals), vals)
    return out


def ours_vs_paper(curve: Curve, ref_steps, ref_values, bounds: tuple[float, float] | None = None) -> list[str]:
    """'ours [lo, hi] (paper)' cells at the paper's steps that this run recorded: the seed mean with its 95 %
    seed interval (`seed_interval`, cut to `bounds`, the range the quantity cannot leave), then the reference."""
    last = curve.steps[-1]
    return [f"{interval_at(curve, s, bounds=bounds).show(-1)} ({fmt(v)})" for s, v in zip(ref_steps, ref_values)
            if s <= last]


def interval_at(curve: Curve, step: int, level: float = 0.95, bounds: tuple[float, float] | None = None) -> "Interval":
    """Seed interval of the curve at a recorded step (cut to `bounds`, see `seed_interval`, where every seed's value
    lies within them: a value outside, as a hand-edited record holds, is shown with its plain interval)."""
    i = int(np.searchsorted(curve.steps, step))
    if i >= len(curve.steps) or curve.steps[i] != step:
        raise KeyError(f"step {step} was not recorded")
    v = np.asarray(curve.values[i], dtype=float)
    if bounds is not None and not np.all((v >= bounds[0]) & (v <= bounds[1])):
        bounds = None
    return seed_interval(v, level, bounds=bounds)


# ----------------------------------------------------------------------------- seed intervals and verdicts
#
# Every measured number a verdict rests on carries a 95 % interval over seeds (docs/verdicts.md). Means over
# seeds get a Student-t interval: mean ± t_{n-1} · s/√n with the unbiased s. We prefer it to a percentile
# bootstrap for means because the cpu presets run 2-10 seeds: with n = 3 a bootstrap over seeds has only 10 distinct
# resamples and its percentile interval is too narrow (it cannot be wider than the seeds' own range), while the
# t-interval keeps its level when the per-seed values are roughly normal, which final errors averaged over many
# test points are. Statistics that are not a mean of per-seed numbers (the step at which the seed-mean curve
# first crosses a level) get a percentile bootstrap over seeds with a fixed generator, so a report is
# reproducible. One seed gives no interval: its verdict is INCONCLUSIVE, never PASS.

LEVEL = 0.95
BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 0


class Interval(NamedTuple):
    """A seed statistic with its interval: `estimate` (the seed mean, or the statistic on all seeds), [lo, hi]
    (NaN when there is no interval: one seed), the number of seeds and how the interval was made."""
    estimate: float
    lo: float
    hi: float
    n: int
    kind: str  # "t" (Student-t over seeds), "paired t" (over per-seed differences), "bootstrap", "none"

    @property
    def has_interval(self) -> bool:
        return not (np.isnan(self.lo) or np.isnan(self.hi))  # ±inf is a bound ("never"), NaN is none

    def covers(self, value: float) -> bool:
        return self.has_interval and self.lo <= value <= self.hi

    def show(self, digits: int = 3, scale: float = 1.0, unit: str = "") -> str:
        """'mean [lo, hi]' with `digits` decimals (−1: three significant digits, as `fmt`), after `scale` (e.g. 100
        for percent); 'mean (1 seed, no interval)' without an interval; +inf (a step never reached) reads 'never'."""
        e, lo, hi = (self.estimate * scale, self.lo * scale, self.hi * scale)
        if not self.has_interval:
            return f"{_num(e, digits)}{unit} ({count(self.n, 'seed')}, no interval)"
        if e == lo == hi == np.inf:
            return "never"  # in every resample
        return f"{_num(e, digits)}{unit} [{_num(lo, digits)}, {_num(hi, digits)}]"


def _num(x: float, digits: int) -> str:
    if not np.isfinite(x):
        return "never" if x == np.inf else str(x)
    return f"{x:.{digits}f}" if digits >= 0 else fmt(float(x))


def t_cdf(t: float, df: int) -> float:
    """Student-t CDF for integer df ≥ 1, in closed form (Abramowitz & Stegun 26.7.3-4)."""
    if int(df) != df or df < 1:
        raise ValueError(f"df must be an integer ≥ 1, got {df!r}")
    df = int(df)
    theta = np.arctan(abs(t) / np.sqrt(df))
    s, c2 = np.sin(theta), np.cos(theta) ** 2
    if df % 2:  # odd
        series, term = 0.0, 1.0
        for k in range(1, (df - 1) // 2 + 1):  # 1 + 2/3 c² + (2·4)/(3·5) c⁴ + ... up to c^{df-3}
            series += term
            term *= c2 * (2 * k) / (2 * k + 1)
        a = 2 / np.pi * (theta + (s * np.cos(theta) * series if df > 1 else 0.0))
    else:
        series, term = 0.0, 1.0
        for k in range(1, df // 2 + 1):  # 1 + 1/2 c² + (1·3)/(2·4) c⁴ + ... up to c^{df-2}
            series += term
            term *= c2 * (2 * k - 1) / (2 * k)
        a = s * series
    return float(0.5 + 0.5 * a if t >= 0 else 0.5 - 0.5 * a)


def t_quantile(p: float, df: int) -> float:
    """The p-quantile of Student's t with integer df (bisection on t_cdf to 1e-12)."""
    if not 0 < p < 1:
        raise ValueError(f"p must be in (0, 1), got {p!r}")
    if p < 0.5:
        return -t_quantile(1 - p, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        hi *= 2
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if t_cdf(mid, df) < p else (lo, mid)
        if hi - lo < 1e-12:
            break
    return 0.5 * (lo + hi)


def _per_seed(values, name: str) -> np.ndarray:
    v = np.asarray(values, dtype=float).ravel()
    if v.size == 0:
        raise ValueError(f"{name} must hold at least one seed's value, got an empty array")
    if not np.all(np.isfinite(v)):
        raise ValueError(f"{name} must be finite per seed, got {v.tolist()}")
    return v


def _check_level(level: float) -> None:
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level!r}")


def seed_interval(values, level: float = LEVEL, kind: str = "t", bounds: tuple[float, float] | None = None) -> Interval:
    """Student-t interval for the mean of per-seed values (one number per seed): mean ± t_{n-1,(1+level)/2}·s/√n,
    s with ddof = 1. One seed: no interval (lo = hi = NaN). `bounds`: the range the quantity cannot leave (an error
    rate is in [0, 1]); the interval is cut to it, which keeps its coverage (the true mean is inside the bounds)
    and spares a reader "−240 %" at two seeds."""
    _check_level(level)
    v = _per_seed(values, "values")
    n, mean = v.size, float(v.mean())
    if n == 1:
        return Interval(mean, float("nan"), float("nan"), 1, "none")
    half = t_quantile((1 + level) / 2, n - 1) * float(v.std(ddof=1)) / np.sqrt(n)
    lo, hi = mean - half, mean + half
    if bounds is not None:
        if bounds[0] > bounds[1] or not bounds[0] <= mean <= bounds[1]:
            raise ValueError(f"bounds must be (low, high) around the seed mean {mean}, got {bounds!r}")
        lo, hi = max(lo, bounds[0]), min(hi, bounds[1])
    return Interval(mean, float(lo), float(hi), n, kind)


RATE = (0.0, 1.0)  # bounds of an error rate or a fraction
MISALIGNMENT = (0.0, 2.0)  # bounds of 1 − cos


def paired_interval(a, b, level: float = LEVEL) -> Interval:
    """Interval for mean(a − b) where a[i], b[i] come from the same seed (same initialisation and data order):
    a t-interval over the per-seed differences, narrower than comparing two independent intervals."""
    a, b = _per_seed(a, "a"), _per_seed(b, "b")
    if a.shape != b.shape:
        raise ValueError(f"a and b must hold one value per seed each, got shapes {a.shape} and {b.shape}")
    return seed_interval(a - b, level, kind="paired t")


def bootstrap_indices(n: int, resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED) -> np.ndarray:
    """[resamples, n] seed indices of a percentile bootstrap over n seeds, from a fixed generator: every statistic
    of n seeds is resampled by the same rows, so paired samples stay paired and a report is reproducible."""
    return np.random.default_rng(seed).integers(0, n, size=(resamples, n))


def _percentile_interval(estimate: float, stats: np.ndarray, n: int, level: float) -> Interval:
    lo, hi = np.quantile(stats, [(1 - level) / 2, (1 + level) / 2], method="inverted_cdf")
    return Interval(estimate, float(lo), float(hi), n, "bootstrap")


def bootstrap_interval(statistic, *samples, level: float = LEVEL, resamples: int = BOOTSTRAP_RESAMPLES,
                       seed: int = BOOTSTRAP_SEED) -> Interval:
    """Percentile bootstrap over seeds for a statistic that is not a plain mean. Each sample is an array whose
    last axis is seeds (all the same length: resampled together, so paired samples stay paired);
    `statistic(*samples)` returns a float (inf allowed, e.g. "never"). Fixed generator: same data, same interval.
    A statistic of first-hit steps ("steps to x", leads) is :func:`bootstrap_hits`, the same numbers faster."""
    _check_level(level)
    if not samples:
        raise ValueError("bootstrap_interval needs at least one sample")
    arrays = [np.asarray(s, dtype=float) for s in samples]
    n = arrays[0].shape[-1]
    if any(a.shape[-1] != n for a in arrays):
        raise ValueError(f"samples must share their seed axis (last), got shapes {[a.shape for a in arrays]}")
    estimate = float(statistic(*arrays))
    if n == 1:
        return Interval(estimate, float("nan"), float("nan"), 1, "none")
    idx = bootstrap_indices(n, resamples, seed)
    stats = np.array([statistic(*(a[..., i] for a in arrays)) for i in idx], dtype=float)
    return _percentile_interval(estimate, stats, n, level)


def hit_step(steps, values, threshold: float, *, or_equal: bool = False) -> float:
    """First step at which the seed mean of `values` [steps, seeds] is below `threshold` (at or below with
    `or_equal`); inf = never."""
    s = first_below(np.asarray(steps), np.asarray(values, dtype=float).mean(axis=-1), threshold, or_equal=or_equal)
    return np.inf if s is None else float(s)


# Elements of the [steps, resamples] means first_hits computes at once (2 MB: the fastest block here).
_HIT_BLOCK = 1 << 18
_TWO_U = 2.0 ** -52  # twice float64's unit roundoff


def first_hits(steps, values, threshold: float, idx: np.ndarray, *, or_equal: bool = False) -> np.ndarray:
    """[R] first step at which the mean of `values` [steps, seeds] over the seeds of each row of `idx` [R, n] is
    below `threshold` (at or below with `or_equal`); inf = never: for every row the answer of :func:`hit_step`
    on ``values[:, row]``, whose means NumPy sums in an order of its own.

    All resamples' means come from one matrix product with the seed counts (values @ countsᵀ / n), thousands of
    times cheaper than resampling the curves one by one. Its rounding differs from NumPy's, so a mean within
    their joint error bound of the threshold (2·(n + 16)·u·Σ c_j |v_j| / n with u the unit roundoff: a bound for
    any order of summation, products and the division included) is recomputed the old way; every comparison is
    then the old one's. Curves with a NaN or inf (0 · inf in the product) are resampled the old way throughout."""
    steps, values = np.asarray(steps), np.asarray(values, dtype=float)
    if values.ndim != 2 or len(steps) != len(values):
        raise ValueError(f"values must be [steps, seeds] with one row per step, got shape {values.shape} for "
                         f"{len(steps)} steps")
    if not np.isfinite(values).all():
        return np.array([hit_step(steps, values[:, row], threshold, or_equal=or_equal) for row in idx])
    resamples, n = idx.shape
    counts = np.bincount((idx + n * np.arange(resamples)[:, None]).ravel(),
                         minlength=resamples * n).reshape(resamples, n).T.astype(float)  # [n, R]
    old: dict[int, np.ndarray] = {}  # a resample's means as the old way computes them, where a tie needs them
    out, pending = np.full(resamples, np.inf), np.ones(resamples, dtype=bool)
    block = max(1, _HIT_BLOCK // resamples)
    for start in range(0, len(values), block):
        rows = values[start:start + block]
        means = rows @ counts / n
        unsure = np.abs(means - threshold) <= (np.abs(rows) @ counts) * ((n + 16) * _TWO_U / n)
        for t, r in zip(*np.nonzero(unsure)):
            if r not in old:
                old[r] = values[:, idx[r]].mean(axis=-1)
            means[t, r] = old[r][start + t]
        hit = (means <= threshold if or_equal else means < threshold) & pending
        found = hit.any(axis=0)
        out[found] = steps[start + hit.argmax(axis=0)[found]]
        pending &= ~found
        if not pending.any():
            break
    return out


def bootstrap_hits(statistic, curves, threshold: float, *, or_equal: bool = False, level: float = LEVEL) -> Interval:
    """Percentile bootstrap over seeds of a statistic of first-hit steps: `curves` is a list of (steps, values
    [steps, seeds]) sharing their seeds (resampled together, so paired curves stay paired); `statistic(*hits)`
    gets each curve's first step below `threshold` (at or below with `or_equal`; inf = never) as arrays of one
    shape, 0-d for the estimate and [resamples] for the bootstrap (:func:`first_hits`), so it is written with
    NumPy's elementwise functions (np.minimum, not min). The numbers are those of :func:`bootstrap_interval` with
    a statistic that takes :func:`hit_step` of each resample (the same resamples, the same comparisons; tested)."""
    _check_level(level)
    if not curves:
        raise ValueError("bootstrap_hits needs at least one curve")
    curves = [(np.asarray(s), np.asarray(v, dtype=float)) for s, v in curves]
    n = curves[0][1].shape[-1]
    if any(v.ndim != 2 or v.shape[-1] != n for _, v in curves):
        raise ValueError(f"curves must be [steps, seeds] sharing their seed axis, got shapes "
                         f"{[v.shape for _, v in curves]}")
    estimate = float(statistic(*(np.asarray(hit_step(s, v, threshold, or_equal=or_equal)) for s, v in curves)))
    if n == 1:
        return Interval(estimate, float("nan"), float("nan"), 1, "none")
    idx = bootstrap_indices(n)
    stats = np.asarray(statistic(*(first_hits(s, v, threshold, idx, or_equal=or_equal) for s, v in curves)),
                       dtype=float)
    return _percentile_interval(estimate, stats, n, level)


def steps_to_interval(steps, values, threshold: float, level: float = LEVEL) -> Interval:
    """The first step at which the seed-mean curve is below `threshold` ("steps to x", docs/method.md §6), with a
    percentile-bootstrap interval over seeds; inf = never within the run."""
    return bootstrap_hits(lambda hit: hit, [(steps, values)], threshold, level=level)


def reached_by_any(hits) -> bool:
    """Whether any of these steps-to-threshold intervals has a finite estimate. Where none has, every "never" is the
    same step past the run, and a lead or order between them is a zero-width 0 that tests no claim."""
    return any(np.isfinite(h.estimate) for h in hits)


class Verdict(str, Enum):
    PASS = "PASS"
    FAIL = "FAIL"
    INCONCLUSIVE = "INCONCLUSIVE"


def below(iv: Interval, threshold: float) -> Verdict:
    """The claim "quantity < threshold": PASS when the whole interval is below, FAIL when the whole interval is at
    or above, INCONCLUSIVE when it straddles the threshold or there is no interval (one seed)."""
    if not iv.has_interval:
        return Verdict.INCONCLUSIVE
    if iv.hi < threshold:
        return Verdict.PASS
    return Verdict.FAIL if iv.lo >= threshold else Verdict.INCONCLUSIVE


def above(iv: Interval, threshold: float) -> Verdict:
    """The claim "quantity > threshold" (see `below`)."""
    if not iv.has_interval:
        return Verdict.INCONCLUSIVE
    if iv.lo > threshold:
        return Verdict.PASS
    return Verdict.FAIL if iv.hi <= threshold else Verdict.INCONCLUSIVE


def at_most(iv: Interval, threshold: float) -> Verdict:
    """The claim "quantity ≤ threshold" (ties allowed, e.g. step counts): PASS when hi ≤ threshold, FAIL when
    lo > threshold, else INCONCLUSIVE."""
    if not iv.has_interval:
        return Verdict.INCONCLUSIVE
    if iv.hi <= threshold:
        return Verdict.PASS
    return Verdict.FAIL if iv.lo > threshold else Verdict.INCONCLUSIVE


def at_least(iv: Interval, threshold: float) -> Verdict:
    """The claim "quantity ≥ threshold" (see `at_most`)."""
    return at_most(iv._replace(estimate=-iv.estimate, lo=-iv.hi, hi=-iv.lo), -threshold)


def within(iv: Interval, lo: float, hi: float) -> Verdict:
    """The claim "lo ≤ quantity ≤ hi": PASS when the interval lies inside [lo, hi], FAIL when it lies wholly
    outside, INCONCLUSIVE when it overlaps an edge or there is no interval."""
    if lo > hi:
        raise ValueError(f"within needs lo ≤ hi, got lo={lo!r}, hi={hi!r}")
    if not iv.has_interval:
        return Verdict.INCONCLUSIVE
    if lo <= iv.lo and iv.hi <= hi:
        return Verdict.PASS
    return Verdict.FAIL if (iv.hi < lo or iv.lo > hi) else Verdict.INCONCLUSIVE


def exact(holds: bool) -> Verdict:
    """The verdict on a quantity with no seed dependence (read off an update rule, a closed form)."""
    return Verdict.PASS if holds else Verdict.FAIL


def all_of(verdicts) -> Verdict | None:
    """Every part holds (three-valued AND): FAIL if any part fails, PASS if all pass, else INCONCLUSIVE.
    None parts (not decidable at this configuration) are skipped; no decidable part → None."""
    vs = [Verdict(v) if not isinstance(v, bool) else (Verdict.PASS if v else Verdict.FAIL)
          for v in verdicts if v is not None]
    if not vs:
        return None
    if Verdict.FAIL in vs:
        return Verdict.FAIL
    return Verdict.PASS if all(v is Verdict.PASS for v in vs) else Verdict.INCONCLUSIVE


def any_of(verdicts) -> Verdict | None:
    """Some part holds (three-valued OR): PASS if any part passes, FAIL if all fail, else INCONCLUSIVE."""
    vs = [Verdict(v) if not isinstance(v, bool) else (Verdict.PASS if v else Verdict.FAIL)
          for v in verdicts if v is not None]
    if not vs:
        return None
    if Verdict.PASS in vs:
        return Verdict.PASS
    return Verdict.FAIL if all(v is Verdict.FAIL for v in vs) else Verdict.INCONCLUSIVE


def difference_read(iv: Interval, decides: bool = True) -> str:
    """How a report's prose reads a paired difference, by the rule its verdicts use (docs/verdicts.md): "a clear
    difference" only when the 95 % interval excludes 0, and nothing decisive on a preset too short to test
    anything (`decides` False: smoke) or with one seed (no interval)."""
    if not decides:
        return "not judged: the preset is too short to decide"
    if not iv.has_interval:
        return "not resolved: no interval"
    return "a clear difference" if not iv.covers(0.0) else "not resolved: the interval includes 0"


def final_interval(curve: Curve, level: float = LEVEL, bounds: tuple[float, float] | None = RATE) -> Interval:
    """Seed interval of a curve's last recorded value (the paper's "final", unsmoothed); by default of an error
    rate, cut to [0, 1]."""
    return seed_interval(curve.values[-1], level, bounds=bounds)


# ----------------------------------------------------------------------------- why a claim fails

# The three classes of a FAIL (docs/verdicts.md).
SCALE = "scale or data"
NOISE = "seed noise"
NOT_REPRODUCED = "does not reproduce"
SETTINGS = "settings differ from the preset"  # a run with overrides: its FAILs say how they fare, not the paper's
FAIL_CLASSES = (SCALE, NOISE, NOT_REPRODUCED, SETTINGS)


class Failure(NamedTuple):
    """Why a claim FAILs at this preset: one of FAIL_CLASSES and the evidence for it."""

    kind: str
    evidence: str


def failure(kind: str, evidence: str) -> Failure:
    """A declared explanation for a FAIL, e.g. failure(NOT_REPRODUCED, "checked: ...")."""
    if kind not in FAIL_CLASSES:
        raise ValueError(f"a FAIL's kind must be one of {FAIL_CLASSES}, got {kind!r}")
    if not evidence:
        raise ValueError("a FAIL's class needs its evidence (what shows it, or what was checked), got ''")
    return Failure(kind, evidence)


def seed_noise(iv: Interval, paper_value: float | None, what: str, scale: float = 1.0, unit: str = "",
               digits: int = 3) -> Failure | None:
    """NOISE when the seed interval of the claim's quantity covers the paper's value: our seeds cannot tell our
    number from the paper's, so the FAIL is a property of these seeds, not a disagreement with the paper."""
    if paper_value is None or not iv.covers(paper_value):
        return None
    return Failure(NOISE, f"{what} {iv.show(digits, scale, unit)} covers the paper's "
                          f"{paper_value * scale:.{digits}f}{unit}")


def oracle_floor(floor: Interval, paper_value: float, what: str, scale: float = 1.0, unit: str = "",
                 digits: int = 1) -> Failure | None:
    """SCALE when an oracle that sees the answer (the supervised CE model) ends wholly above the paper's value on
    this data: no method can reach the paper's number here, so the gap is the data's, not the method's."""
    if not floor.has_interval or floor.lo <= paper_value:
        return None
    return Failure(SCALE, f"the CE oracle ends at {floor.show(digits, scale, unit)} on this data, above the paper's "
                          f"{what} {paper_value * scale:.{digits}f}{unit}: the paper's level is out of reach here")


def not_reproduced(iv: Interval, paper_value: float | None, what: str, checked: str, scale: float = 1.0,
                   unit: str = "", digits: int = 3) -> Failure:
    """NOT_REPRODUCED with what was checked: the seed interval (which excludes the paper's value, so the FAIL is
    not seed noise) plus the experiment's own note on what else was ruled out or is still open."""
    where = (f"{what} {iv.show(digits, scale, unit)}"
             + ("" if paper_value is None else f" {'covers' if iv.covers(paper_value) else 'excludes'} the "
                                                f"paper's {paper_value * scale:.{digits}f}{unit}"))
    return failure(NOT_REPRODUCED, f"{where}; {checked}")
