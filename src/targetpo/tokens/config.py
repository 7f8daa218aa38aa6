"""The config every token experiment extends: the run's seeds and methods plus every :class:`TrialConfig` field,
each declared once (help and bounds) in :mod:`targetpo.tokens.engine`. An experiment module adds only its sweep
fields and the defaults in which it differs. A field it sweeps per unit is marked ``swept(...)`` and one that none
of its methods reads ``unused(...)``: setting either is an error, never silently ignored."""

from __future__ import annotations

from typing import ClassVar

from targetpo.runs.config import RunConfig, config, default, unused_fields
from targetpo.tokens.engine import METHODS, TrialConfig


@config
class TokenConfig(TrialConfig, RunConfig):
    # Metrics that are NaN by design when their set is empty (a seed with no winners or no losers in a batch,
    # engine.diagnostics): the runner does not read those NaNs as divergence.
    NAN_MEANS_EMPTY: ClassVar[tuple[str, ...]] = ("weight_winners", "weight_losers")
    seeds = 20
    seed = default(0, help="first seed (seeds are seed, seed+1, ...); seed s alone fixes its initial model and "
                           "prompts")
    methods = default(tuple(METHODS), choices=tuple(METHODS))


# The fields that only the baselines read, unused by an experiment that runs TPO alone.
tpo_only = unused_fields("TPO only", "clip_eps", "grpo_beta", "dg_epochs", "dg_eta", "match", "interaction_lr_scale")
