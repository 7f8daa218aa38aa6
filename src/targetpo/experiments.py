"""The paper's experiments, one module each, all run by :mod:`targetpo.runs.runner`.

An experiment module defines:
- ``NAME`` (the CLI name), ``TITLE``, ``PAPER_REF`` (section / figure);
- ``Config``: a frozen dataclass with every hyperparameter, each declared once with its help and bounds
  (:func:`targetpo.runs.config.param`; shared fields come from a base such as ``RunConfig`` or ``TokenConfig``);
- optionally ``RUNTIME``: a note on the reproduce preset's wall time, for the README's experiment table;
- optionally ``Config.DEVICES``: the torch device types its units compute on (``("cpu",)`` for MNIST and the
  tabular bandits); the runner refuses any other ``--device`` instead of recording and ignoring it;
- ``PRESETS``: ``{"smoke": Config(...), "cpu": Config(...), "paper": Config(...)}``;
- ``REPRODUCE_PRESET``: the preset ``targetpo reproduce`` uses;
- optionally ``units(cfg) -> list[str]``: resumable pieces of work (default: one per entry of
  ``cfg.methods``; seeds are vectorised inside a unit) and ``unit_steps(cfg, unit) -> int``, a unit's
  progress-bar length (default ``cfg.steps``);
- optionally ``unit_needs(cfg, unit) -> list[str]``: earlier units whose output the unit reads (a shared warm
  start); ``run --jobs`` starts it only once they have finished, and no run starts it if one diverged
  (default: none);
- ``run_unit(cfg, unit, ctx)``: does the work, calling ``ctx.log({"step": t, ...})`` as metrics are produced;
  it must be deterministic given (cfg, unit) so a resumed run replays it exactly;
- optionally ``run_units(cfg, units, ctxs)``: several units at once (methods batched like seeds), each logging
  through its own context ``ctxs[unit]``. The runner then calls it instead of ``run_unit``, with the unfinished
  units, and again without a unit that diverged; so each unit's records must not depend on which others run
  beside it;
- ``report(run, section)``: tables next to the paper's numbers, plots and claim checks, from the metrics only;
- optionally ``summary(run) -> str``: the one-line result printed at the end of a run;
- optionally ``REQUIRES_EXTRA``: the optional extra it needs (a key of :data:`targetpo.runs.data.EXTRA_MODULES`),
  checked before a run folder is written (``targetpo reproduce`` reports the experiment NOT RUN without it);
- optionally ``SUITE``: which ``targetpo reproduce --suite`` runs it (one of :data:`SUITES`; default ``"paper"``).
"""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType

from targetpo.runs import runner

# CLI name -> module. Imported lazily so `targetpo list` and `--help` stay fast.
EXPERIMENTS: dict[str, str] = {
    "tabular-single": "targetpo.tabular.single",
    "tabular-multi": "targetpo.tabular.multi",
    "mnist": "targetpo.mnist.train",
    "mnist-mechanism": "targetpo.mnist.mechanism",
    "mnist-staleness": "targetpo.mnist.staleness",
    "token-dense": "targetpo.tokens.dense",
    "token-terminal": "targetpo.tokens.terminal",
    "token-variants": "targetpo.tokens.variants",
    "token-ablations": "targetpo.tokens.ablations",
    "token-diagnostics": "targetpo.tokens.diagnostics",
    "token-sweeps": "targetpo.tokens.sweeps",
    "token-temperature": "targetpo.tokens.temperature",
    "dg-epochs": "targetpo.tokens.dg_epochs",
    "rlvr": "targetpo.llm.experiment",
    # Open questions of the paper's §6 (SUITE = "open-questions"; docs/experiments.md §E14–§E18).
    "token-projections": "targetpo.tokens.projections",
    "mnist-projections": "targetpo.mnist.projections",
    "token-low-variance": "targetpo.tokens.low_variance",
    "token-partial-credit": "targetpo.tokens.partial_credit",
    "mnist-replay": "targetpo.mnist.replay",
    "mnist-friction": "targetpo.mnist.friction",
    # TPO's sequence log-score at 60–250-token completions (SUITE = "llm"; docs/experiments.md §E19).
    "llm-length": "targetpo.llm.length",
}


# `targetpo reproduce --suite`: the paper's experiments (the default, what `make reproduce` runs), the
# experiments on its §6 open questions (docs/experiments.md §E14–§E18) and the LLM length study (§E19), which
# alone needs ~45 min of CPU.
SUITES: dict[str, str] = {
    "paper": "the paper's experiments (the default)",
    "open-questions": "the experiments on the paper's §6 open questions",
    "llm": "the LLM sequence-log-score length study (~45 min on one thread)",
    "all": "every suite",
}


class UnknownExperiment(KeyError):
    """A name not in EXPERIMENTS. A KeyError for callers that catch one, whose str() is the message itself (a
    plain KeyError's str() is the repr of its argument, quotes included)."""

    def __str__(self) -> str:
        return str(self.args[0])


def load(name: str) -> ModuleType:
    if name not in EXPERIMENTS:
        raise UnknownExperiment(f"unknown experiment {name!r}; available: {', '.join(EXPERIMENTS)}")
    return importlib.import_module(EXPERIMENTS[name])


def suite_of(name: str) -> str:
    """The suite experiment `name` belongs to: its module's ``SUITE`` (default "paper")."""
    suite = getattr(load(name), "SUITE", "paper")
    if suite not in SUITES or suite == "all":
        raise ValueError(f"experiment {name!r} declares SUITE={suite!r}: must be one of "
                         f"{', '.join(repr(k) for k in SUITES if k != 'all')}")
    return suite


def in_suite(suite: str) -> list[str]:
    """The experiments `targetpo reproduce --suite SUITE` runs, in the list's order."""
    if suite not in SUITES:
        raise ValueError(f"suite={suite!r}: must be one of {', '.join(map(repr, SUITES))}")
    return [n for n in EXPERIMENTS if suite == "all" or suite_of(n) == suite]


def run_experiment(name: str, preset: str = "cpu", **kwargs) -> Path:
    """Run (or resume) experiment `name`; keyword arguments as :func:`targetpo.runs.runner.run_experiment`."""
    return runner.run_experiment(load(name), preset, **kwargs)
