"""What the two tabular bandit experiments share: their config fields (declared once) and the error table
of their reports."""

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
