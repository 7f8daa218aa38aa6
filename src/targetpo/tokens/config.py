"""The config every token experiment extends: the run's seeds and methods plus every :class:`TrialConfig` field,
each declared once (help and bounds) in :mod:`targetpo.tokens.engine`. An experiment module adds only its sweep
fields and the defaults in which it differs. A field it sweeps per unit is marked ``swept(...)`` and one that none
of its methods reads ``unused(...)``: setting either is an error, never silently ignored. A field only some methods
read (engine.METHOD_FIELDS) is refused as a `key=value` override when no unit of the run reads it
(:meth:`TokenConfig.unread`, from :meth:`TokenConfig.unit_methods`)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from targetpo.runs.config import RunConfig, config, config_fields, default, show, unused_fields
from targetpo.tokens.engine import METHOD_FIELDS, METHODS, STD_OPTIONS, TrialConfig, reads

# Methods that are an engine method run with a different epoch count (docs/experiments.md §E8 "tpo_1ep", App. E
# "dg_4ep").
VARIANTS: dict[str, tuple[str, dict]] = {
    "tpo_1ep": ("tpo", {"epochs": 1}),
    "dg_4ep": ("dg", {"dg_epochs": 4}),
}


def method_reads(cfg: TrialConfig, method: str) -> set[str]:
    """The engine's METHOD_FIELDS that `method` (an engine method or a VARIANTS name) reads from `cfg`: a variant
    reads what its engine method reads but the fields it fixes."""
    base, fixed = VARIANTS.get(method, (method, {}))
    return reads(cfg, base) - set(fixed)


@config
class TokenConfig(TrialConfig, RunConfig):
    # Metrics that are NaN by design when their set is empty (a seed with no winners or no losers in a batch,
    # engine.diagnostics): the runner does not read those NaNs as divergence.
    NAN_MEANS_EMPTY: ClassVar[tuple[str, ...]] = ("weight_winners", "weight_losers")
    seeds = 20
    seed = default(0, help="first seed (seeds are seed, seed+1, ...); seed s alone fixes its initial model, prompts "
                           "and samples, though with another seed count the batched kernels round differently and "
                           "long runs drift apart")
    methods = default(tuple(METHODS), choices=tuple(METHODS))

    def unit_methods(self) -> list[tuple[str, dict]]:
        """(method, the TrialConfig fields its unit sets itself) for the units of a run: what :meth:`unread` checks
        the method fields against. An experiment whose units set a method field (a sweep of K, a matching)
        says so here."""
        return [(m, {}) for m in self.methods]

    def readers(self) -> dict[str, str]:
        """The experiment's methods that read each of engine.METHOD_FIELDS (at this config's matching, and those
        that read it only under match=interactions)."""
        allowed = config_fields(type(self))["methods"].metadata.get("choices") or self.methods
        interactions = dataclasses.replace(self, match="interactions")
        out = {}
        for name in METHOD_FIELDS:
            by = [m for m in allowed if name in method_reads(self, m)]
            also = [m for m in allowed if name in method_reads(interactions, m) and m not in by]
            where = [f"read by {', '.join(by)}"] if by else []
            if also:
                where.append(f"with match=interactions also by {', '.join(also)}" if by else
                             f"read with match=interactions, by {', '.join(also)}")
            if where:
                out[name] = "; ".join(where)
        return out

    def unread(self) -> dict[str, str]:
        """The fields only some methods read (engine.METHOD_FIELDS) that no unit reads from this config, with the
        experiment's methods that would."""
        out = super().unread()
        units = self.unit_methods()
        read = set().union(*(method_reads(dataclasses.replace(self, **fixed), m) - set(fixed) for m, fixed in units))
        readers = self.readers()
        budget = any(fixed.get("tpo_kl_budget", self.tpo_kl_budget) > 0 for _, fixed in units)
        for name in (f for f in METHOD_FIELDS if f not in read):
            if name == "tpo_eta" and budget:
                out[name] = "a KL budget (tpo_kl_budget > 0) chooses TPO's η per group, and no other unit reads it"
            elif name in STD_OPTIONS and budget:
                out[name] = ("a KL budget (tpo_kl_budget > 0) chooses TPO's η per group, which undoes the rescaling "
                             "of u this option makes (docs/method.md §8), and no other unit reads it")
            else:
                out[name] = (f"{readers.get(name, 'read by no method of this experiment')}; "
                             f"methods={show(self.methods)} runs none of them")
        return out


# The fields that only the baselines read, unused by an experiment that runs TPO alone.
tpo_only = unused_fields("TPO only", "clip_eps", "grpo_beta", "dg_epochs", "dg_eta", "match", "interaction_lr_scale")
# The fields that only the single-sample methods (DG's epochs and gate, the matching) read, unused by an experiment
# that runs grouped methods only.
group_only = unused_fields("group methods only", "dg_epochs", "dg_eta", "match", "interaction_lr_scale")
