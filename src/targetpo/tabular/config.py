"""What the two tabular bandit experiments share: their config fields (declared once), the error table of their
reports and the guard in front of their claims."""

from __future__ import annotations

from targetpo.runs.config import ETA_MIN, RunConfig, config, default, param
from targetpo.runs.stats import RATE, fmt, ours_vs_paper, steps_to_interval


@config
class TabularConfig(RunConfig):
    DEVICES = ("cpu",)  # exact updates of 1e5 numbers per step: a GPU's launch latency would dominate
    seeds = default(100, help="independent runs, vectorised as one batch")
    steps: int = param(1000, "normalized logit steps", ge=1)
    actions: int = param(10, "A, actions per context (action 0 is correct)", ge=2)
    lr: float = param(0.1, "α, the length of every normalized logit step", gt=0)
    eta: float = param(1.0, "η, temperature of DG's gate and TPO's target", ge=ETA_MIN)


def error_rows(err: dict, ref: dict, labels: dict[str, str]) -> tuple[list[int], list[list[str]]]:
    """(reference steps within the run, one row per method): error at those steps and the first steps below
    1% and 0.1%, each as "ours [95 % seed interval] (reference)"."""
    last = int(max(s[-1] for s, *_ in err.values()))
    rows = []
    for m, (steps, mean, se, _) in err.items():
        rows.append([labels[m]] + ours_vs_paper(err[m], ref["steps"], ref[m]["error"], RATE)
                    + [f"{steps_to_interval(steps, err[m].values, 0.01).show(-1)} ({fmt(ref[m]['below_1pct'])})",
                       f"{steps_to_interval(steps, err[m].values, 0.001).show(-1)} ({fmt(ref[m]['below_0.1pct'])})"])
    return [s for s in ref["steps"] if s <= last], rows


def claims_blocked_by_divergence(run, err: dict, labels: dict[str, str], section) -> bool:
    """Whether a diverged unit stopped its curve before the others' ends, in which case the claims, which compare
    every method at the same steps, cannot be checked: says so as one n/a claim and returns True. (A killed run's
    partial unit is marked by the report instead.)"""
    ends = {m: int(c.steps[-1]) for m, c in err.items()}
    if len(set(ends.values())) == 1 or not run.diverged_units():
        return False
    section.claim("the paper's claims (every method's curve over the same steps)", None,
                  "curves end at different steps (a diverged unit stops at its divergence): "
                  + ", ".join(f"{labels[m]} {e}" for m, e in ends.items()))
    return True
