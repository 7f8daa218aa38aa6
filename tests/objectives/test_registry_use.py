"""The objective registry is the one table of objective properties: every method name the token engine, the MNIST
experiments and the LLM experiment run resolves to a registry entry, and how each slice runs the method agrees
with that entry's `needs_groups` and `multi_epoch_safe`."""

import pytest

from targetpo import objectives as obj
from targetpo.llm import experiment as rlvr
from targetpo.llm.trainer import OBJECTIVES, TrainerConfig
from targetpo.mnist import bandit
from targetpo.tokens import engine as te


@pytest.mark.parametrize("method", sorted(te.METHODS))
def test_token_engine_method_runs_as_its_objective_says(method):
    m = te.METHODS[method]
    o = obj.get(m.objective)
    # Grouped rollouts (K answers, or K candidate tokens per state) exactly for objectives that need groups.
    assert (m.rollout == "single") == (not o.needs_groups)
    assert m.per_state == (m.rollout == "token")
    if o.level == "token-candidates":
        assert m.per_state
    # Several optimizer steps per batch only for multi-epoch-safe objectives, plus the paper's REINFORCE.
    cfg = te.TrialConfig(epochs=4, dg_epochs=1)
    expected = 4 if (o.multi_epoch_safe or o.name in te.REUSED_ANYWAY) else 1
    assert te.method_epochs(cfg, method) == expected


def test_token_engine_keeps_the_papers_epochs_and_rollouts():
    assert {m for m, v in te.METHODS.items() if v.epochs_field == "dg_epochs"} == {"dg"}
    assert {m for m, v in te.METHODS.items() if v.rollout == "single"} == {"reinforce", "ppo", "dg"}
    assert {m for m, v in te.METHODS.items() if v.rollout == "token"} == {"tpo_token", "grpo_token",
                                                                         "grpo_token_no_kl"}


def test_mnist_methods_resolve_and_group_over_the_classes():
    methods = set(bandit.ON_POLICY + bandit.OFF_POLICY)
    objectives = {m: bandit.objective(m) for m in methods}
    # The methods that use all C classes as their group (TPO's target, Group PG's standardized score).
    assert {m for m, o in objectives.items() if o.needs_groups} == {"tpo", "group_pg"}
    # Under stale actors the objectives that correct for an old behaviour policy (frozen target or ratio) are the
    # multi-epoch-safe ones; REINFORCE and DG are the uncorrected controls.
    assert {m for m in bandit.OFF_POLICY if objectives[m].multi_epoch_safe} == {"pg_is", "ppo", "tpo"}
    with pytest.raises(ValueError, match="unknown MNIST bandit method"):
        bandit.objective("grpo_single")


@pytest.mark.parametrize("method", rlvr.METHODS)
def test_llm_methods_are_group_objectives_with_a_per_token_form(method):
    name, _ = rlvr.method_objective(method)
    o = obj.get(name)
    assert o.needs_groups and o.per_token_fn is not None and name in OBJECTIVES
    # The experiment may step several epochs on a batch (μ), which needs a multi-epoch-safe objective.
    assert o.multi_epoch_safe
    TrainerConfig(objective=name, epochs=2).validate()


def test_llm_trainer_refuses_objectives_without_a_per_token_group_form():
    assert {n for n in OBJECTIVES if obj.get(n).token_mean} == {"dapo", "sapo", "cispo", "clip_cov", "kl_cov"}
    for name in ("rloo", "reinforce", "dg"):
        with pytest.raises(ValueError, match="objective='.*': must be one of"):
            TrainerConfig(objective=name).validate()
