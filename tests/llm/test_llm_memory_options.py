"""The own loop's memory options change memory, never the update: token-budget micro-batches (with padding
trimmed per micro-batch) and gradient checkpointing give the same gradients as one whole-batch pass."""

from __future__ import annotations

import dataclasses

import pytest
import torch

pytestmark = pytest.mark.llm
pytest.importorskip("transformers", reason="needs the llm extra: pip install -e '.[llm]'")
pytest.importorskip("reasoning_gym", reason="needs the llm extra: pip install -e '.[llm]'")

from targetpo.llm.rollout import token_micro_batches  # noqa: E402
from targetpo.llm.trainer import TrainerConfig  # noqa: E402

K, B = 4, 4


@pytest.fixture(scope="module")
def trainer_parts(arithmetic_parts):  # mixed lengths: 2–3 terms of 1–3 digits
    return arithmetic_parts(max_terms=3, min_digits=1, max_digits=3, heldout=4)


@pytest.fixture(scope="module")
def make(tiny_trainer):
    return lambda parts, **kw: tiny_trainer(parts, num_layers=2, seed=5, **{"batch_prompts": B, "max_new_tokens": 8,
                                                                            **kw})


def update_grads(tr, batch) -> torch.Tensor:
    """The gradient the trainer's update accumulates (lr = 0 step, so weights stay and grads are kept)."""
    for g in tr.optimizer.param_groups:
        g["lr"] = 0.0
    tr.update(batch, 0)
    return torch.cat([p.grad.reshape(-1) for p in tr.params])


@pytest.mark.parametrize("objective", ["tpo", "dapo"])
def test_token_budget_micro_batches_and_checkpointing_give_the_same_gradient(make, trainer_parts, objective):
    base = make(trainer_parts, objective=objective)
    batch, _ = base.rollout(0)
    r = torch.rand(batch.rewards.shape, generator=torch.Generator().manual_seed(1))
    batch = dataclasses.replace(batch, rewards=r)
    ref = update_grads(base, batch)
    assert ref.abs().max() > 1e-5
    lengths = batch.completion_mask.sum(1)
    assert lengths.min() < lengths.max(), "the test needs completions of different lengths"
    for kw in ({"micro_batch_tokens": 40}, {"gradient_checkpointing": True},
               {"micro_batch_tokens": 60, "gradient_checkpointing": True}):
        other = make(trainer_parts, objective=objective, **kw)
        torch.testing.assert_close(update_grads(other, batch), ref, rtol=1e-4, atol=1e-6, msg=str(kw))


def test_token_micro_batches_hold_whole_groups_within_the_budget(make, trainer_parts):
    tr = make(trainer_parts)
    batch, _ = tr.rollout(0)
    order = torch.tensor([3, 1, 0, 2])
    budget = 60
    micros = token_micro_batches(batch.prompt_mask, batch.completion_mask, K, budget, order)
    groups = [sorted(set((m // K).tolist())) for m in micros]
    assert [g for gs in groups for g in gs] != [] and sorted(g for gs in groups for g in gs) == [0, 1, 2, 3]
    assert [int(m[0]) // K for m in micros] == [gs[0] for gs in groups] and int(micros[0][0]) // K == 3  # in order
    for m in micros:
        sub = batch.rows(m).trimmed()
        cost = sub.prompt_ids.shape[0] * (sub.prompt_ids.shape[1] + sub.completion_ids.shape[1])
        assert cost <= budget or len(m) == K  # a lone group over budget gets its own micro-batch
    assert len(micros) > 1
    with pytest.raises(ValueError, match="max_tokens=0"):
        token_micro_batches(batch.prompt_mask, batch.completion_mask, K, 0)


def test_trimmed_rollout_drops_only_unused_padding(make, trainer_parts):
    tr = make(trainer_parts)
    batch, _ = tr.rollout(0)
    sub = batch.rows(torch.arange(K)).trimmed()
    assert sub.prompt_mask[:, 0].any() and sub.completion_mask[:, -1].any()
    assert int(sub.completion_mask.sum()) == int(batch.rows(torch.arange(K)).completion_mask.sum())


def test_the_lm_head_chunk_is_a_setting_and_changes_only_memory(make, trainer_parts, monkeypatch):
    """chunk_tokens was fixed at 512 inside the trainer: a user could not shrink the [chunk, V] buffer nor take the
    full logits. It now reaches every log-prob pass (rollout and update), which gives the same gradient."""
    import targetpo.llm.rollout as rollout

    seen = []
    real = rollout.chunked_model_token_logprobs
    monkeypatch.setattr(rollout, "chunked_model_token_logprobs",
                        lambda *a: seen.append(a[-1]) or real(*a))
    base = make(trainer_parts)
    batch, _ = base.rollout(0)
    batch = dataclasses.replace(batch, rewards=torch.rand(batch.rewards.shape,
                                                          generator=torch.Generator().manual_seed(2)))
    ref = update_grads(base, batch)
    assert seen and set(seen) == {512}
    for chunk in (3, 0):
        seen.clear()
        other = make(trainer_parts, chunk_tokens=chunk)
        other_batch, _ = other.rollout(0)
        torch.testing.assert_close(other_batch.old_logp, batch.old_logp, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(update_grads(other, batch), ref, rtol=1e-4, atol=1e-6, msg=f"chunk_tokens={chunk}")
        assert seen == ([] if chunk == 0 else [3] * len(seen)) and (chunk == 0 or seen)
    with pytest.raises(ValueError, match="chunk_tokens=-1"):
        TrainerConfig(chunk_tokens=-1).validate()


def test_memory_options_are_validated():
    with pytest.raises(ValueError, match="set one of them"):
        TrainerConfig(micro_batch_size=8, micro_batch_tokens=100).validate()
    with pytest.raises(ValueError, match="micro_batch_tokens=-1"):
        TrainerConfig(micro_batch_tokens=-1).validate()


def test_gradient_checkpointing_recomputes_the_decoder_layers(make, trainer_parts, monkeypatch):
    tr = make(trainer_parts, gradient_checkpointing=True)
    batch, _ = tr.rollout(0)
    from transformers.modeling_layers import GradientCheckpointingLayer

    layers = [m for m in tr.model.modules() if isinstance(m, GradientCheckpointingLayer)]
    assert len(layers) == 2 and all(m.gradient_checkpointing for m in layers)
    calls = []
    for m in layers:
        inner = m._gradient_checkpointing_func
        monkeypatch.setattr(m, "_gradient_checkpointing_func", lambda *a, _f=inner, **k: calls.append(1) or _f(*a, **k))
    update_grads(tr, batch)
    assert len(calls) == 2  # each of the 2 layers, once for the one (whole) micro-batch
    assert not any(m.training for m in tr.model.modules())  # eval mode (no dropout) restored after the update


def test_a_step_whose_groups_all_have_equal_rewards_is_reported(make, trainer_parts, caplog, monkeypatch):
    tr = make(trainer_parts)
    monkeypatch.setattr(tr, "score", lambda problems, texts, k: torch.zeros(len(texts)))  # every completion fails
    with caplog.at_level("WARNING", logger="targetpo.llm.trainer"):
        metrics = tr.step(0)
    assert metrics["groups_without_signal"] == B and metrics["frac_zero_var"] == 1.0
    assert f"all {B} groups have zero-variance rewards" in caplog.text
