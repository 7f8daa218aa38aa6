"""The fields the two tabular bandit experiments share, declared once."""

from __future__ import annotations

from targetpo.runs.config import RunConfig, config, default, param


@config
class TabularConfig(RunConfig):
    seeds = default(100, help="independent runs, vectorised as one batch")
    steps: int = param(1000, "normalized logit steps", ge=1)
    actions: int = param(10, "A, actions per context (action 0 is correct)", ge=2)
    lr: float = param(0.1, "α, the length of every normalized logit step", gt=0)
    eta: float = param(1.0, "η, temperature of DG's gate and TPO's target", gt=0)
