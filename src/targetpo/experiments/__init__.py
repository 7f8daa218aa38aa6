"""The paper's experiments, one module each, all run by :mod:`targetpo.experiments.runner`.

An experiment module defines:
- ``NAME`` (the CLI name), ``TITLE``, ``PAPER_REF`` (section / figure);
- ``Config``: a dataclass with every hyperparameter (docstring lines ``field: help`` document each one);
- ``PRESETS``: ``{"smoke": Config(...), "cpu": Config(...), "paper": Config(...)}``;
- ``REPRODUCE_PRESET``: the preset ``targetpo reproduce`` uses;
- optionally ``units(cfg) -> list[str]``: resumable pieces of work (default: one per entry of
  ``cfg.methods``; seeds are vectorised inside a unit) and ``unit_steps(cfg, unit) -> int``, a unit's
  progress-bar length (default ``cfg.steps``);
- ``run_unit(cfg, unit, ctx)``: does the work, calling ``ctx.log({"step": t, ...})`` as metrics are produced;
  it must be deterministic given (cfg, unit) so a resumed run replays it exactly;
- ``report(run, section)``: tables next to the paper's numbers, plots and claim checks, from the metrics only;
- optionally ``summary(run) -> str``: the one-line result printed at the end of a run.
"""

from __future__ import annotations

import importlib
from types import ModuleType

# CLI name -> module. Imported lazily so `targetpo list` and `--help` stay fast.
EXPERIMENTS: dict[str, str] = {
    "tabular-single": "targetpo.experiments.tabular_single",
    "tabular-multi": "targetpo.experiments.tabular_multi",
    "mnist": "targetpo.experiments.mnist",
    "mnist-mechanism": "targetpo.experiments.mnist_mechanism",
    "mnist-staleness": "targetpo.experiments.mnist_staleness",
    "token-dense": "targetpo.experiments.token_dense",
    "token-terminal": "targetpo.experiments.token_terminal",
    "token-variants": "targetpo.experiments.token_variants",
    "token-ablations": "targetpo.experiments.token_ablations",
    "token-diagnostics": "targetpo.experiments.token_diagnostics",
    "token-sweeps": "targetpo.experiments.token_sweeps",
    "token-temperature": "targetpo.experiments.token_temperature",
    "dg-epochs": "targetpo.experiments.dg_epochs",
    "rlvr": "targetpo.experiments.rlvr",
}


def load(name: str) -> ModuleType:
    if name not in EXPERIMENTS:
        raise KeyError(f"unknown experiment {name!r}; available: {', '.join(EXPERIMENTS)}")
    return importlib.import_module(EXPERIMENTS[name])


def config_class(exp: ModuleType) -> type:
    """The experiment's Config dataclass (the type of its presets)."""
    return type(next(iter(exp.PRESETS.values())))
