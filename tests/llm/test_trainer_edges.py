"""The own loop and the adapters where a one-line bug left every other test green (a mutation audit): the KL's
direction and padding, stale gradients, which log-probs are "old" and at which temperature, a resume's optimizer
state, held-out accuracy, rewards matched to their problems, per-step metrics over mini-batches, the token budget,
trimming, and reward parsing."""

from __future__ import annotations

import dataclasses
import types

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.llm
pytest.importorskip("transformers", reason="needs the llm extra: pip install -e '.[llm]'")
pytest.importorskip("reasoning_gym", reason="needs the llm extra: pip install -e '.[llm]'")

from targetpo.llm.models import build_tiny_model  # noqa: E402
from targetpo.llm.rollout import Rollout, token_logprobs, token_micro_batches  # noqa: E402
from targetpo.llm.trainer import RLVRTrainer, evaluate_greedy, kl_penalty  # noqa: E402

K, B = 4, 3


@pytest.fixture(scope="module")
def parts(arithmetic_parts):
    return arithmetic_parts(max_terms=2, min_digits=2, max_digits=2, heldout=6)


@pytest.fixture(scope="module")
def make(tiny_trainer):
    return lambda parts, **kw: tiny_trainer(parts, num_layers=1, seed=0, **{"batch_prompts": B, "max_new_tokens": 4,
                                                                            **kw})


def random_rewards(batch, seed=0):
    return dataclasses.replace(batch, rewards=torch.rand(batch.rewards.shape,
                                                         generator=torch.Generator().manual_seed(seed)))


def test_kl_penalty_is_k3_of_the_policy_to_the_reference_over_valid_tokens():
    """d = log π − log π_ref = (0.5, −1) on the two valid tokens: k3 = e^{−d} + d − 1 = (0.106531, 0.718282), mean
    0.412406; ∂/∂log π = (1 − e^{−d})/2 = (0.196735, −0.859141), and nothing on padding."""
    lp = torch.tensor([[-1.0, -2.0, -5.0, -7.0]], requires_grad=True)
    v = kl_penalty(lp, torch.tensor([[-1.5, -1.0, 0.0, 0.0]]), torch.tensor([[True, True, False, False]]))
    v.backward()
    d = np.array([0.5, -1.0])
    assert v.item() == pytest.approx(float(np.mean(np.exp(-d) + d - 1)), abs=1e-6)
    torch.testing.assert_close(lp.grad[0], torch.tensor([*((1 - np.exp(-d)) / 2), 0.0, 0.0], dtype=torch.float32))


def test_each_update_starts_from_zero_gradients(parts, make):
    """Two updates on one batch at a negligible learning rate see the same gradient (stale ones would double it)."""
    tr = make(parts, lr=1e-12, max_grad_norm=0.0)
    b = random_rewards(tr.rollout(0)[0])
    assert tr.update(b, 0)["grad_norm"] == pytest.approx(tr.update(b, 0)["grad_norm"], rel=1e-4)


def test_the_rollouts_log_probs_are_the_sampling_temperatures(parts, make):
    """old_logp is log π at the sampling temperature (0.7 here), so the first update's ratio is exactly 1."""
    tr = make(parts, temperature=0.7)
    b = tr.rollout(0)[0]
    with torch.no_grad():
        ref = token_logprobs(tr.model, b.prompt_ids, b.prompt_mask, b.completion_ids, b.completion_mask, 0.7)
        at_one = token_logprobs(tr.model, b.prompt_ids, b.prompt_mask, b.completion_ids, b.completion_mask, 1.0)
    torch.testing.assert_close(b.old_logp, ref, rtol=0, atol=1e-6)
    assert float((at_one - ref).abs().max()) > 1e-2


def test_a_later_update_anchors_on_the_rollouts_log_probs_not_the_current_ones(parts, make, monkeypatch):
    """After one AdamW step p_θ ≠ p_old; the gradient on each group's sequence log-scores is (p_θ − q)/B with
    q ∝ p_old·exp(u) from the rollout's old_logp (docs/method.md §2), not from the current policy."""
    import targetpo.llm.trainer as trainer

    tr = make(parts)
    b = random_rewards(tr.rollout(0)[0])
    tr.update(b, 0)
    seen = []

    def keep(*a, **kw):
        out = token_logprobs(*a, **kw)
        out.retain_grad()
        seen.append(out)
        return out

    monkeypatch.setattr(trainer, "token_logprobs", keep)
    loss, _ = trainer.micro_batch_loss(tr.model, tr.cfg, b)
    loss.backward()
    mask = b.completion_mask.double().numpy()
    seq = (seen[0].detach().double().numpy() * mask).sum(-1).reshape(B, K)
    seq_old = (b.old_logp.double().numpy() * mask).sum(-1).reshape(B, K)
    p = np.exp(seq - seq.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    p_old = np.exp(seq_old - seq_old.max(-1, keepdims=True))
    p_old /= p_old.sum(-1, keepdims=True)
    r = b.rewards.double().numpy().reshape(B, K)
    q = p_old * np.exp((r - r.mean(-1, keepdims=True)) / r.std(-1, keepdims=True))
    q /= q.sum(-1, keepdims=True)
    assert np.abs(p - p_old).max() > 1e-3  # the step moved the policy, so the two anchors differ
    expected = ((p - q) / B).reshape(-1)[:, None] * mask
    np.testing.assert_allclose(seen[0].grad.double().numpy(), expected, atol=1e-6)


def test_a_resumed_trainer_continues_with_its_optimizer_state(parts, make, tmp_path):
    """Two updates straight through equal one update, a checkpoint, a fresh trainer loading it, and one update: with
    AdamW's moments lost, the second step would differ."""
    def weights(resume: bool) -> torch.Tensor:
        tr = make(parts)
        tr.update(random_rewards(tr.rollout(0)[0], 0), 0)
        if resume:
            tr.save_checkpoint(tmp_path / "c.pt", 1)
            tr = make(parts)
            tr.load_checkpoint(tmp_path / "c.pt")
        tr.update(random_rewards(tr.rollout(1)[0], 1), 1)
        return torch.cat([p.detach().reshape(-1) for p in tr.params])

    torch.testing.assert_close(weights(True), weights(False), rtol=0, atol=0)


def test_held_out_accuracy_counts_only_a_reward_of_one(parts, make):
    tr = make(parts)
    half = types.SimpleNamespace(score=lambda problem, answer: 0.5)  # partial credit for every answer
    out = evaluate_greedy(tr.model, parts[0], half, tr.template, parts[3][:2], max_new_tokens=2)
    assert out["heldout_accuracy"] == 0.0


def test_each_completion_is_scored_against_its_own_problem():
    """K completions per problem, in problem order: problem i's completions are rows i·K … i·K + K − 1."""
    fake = types.SimpleNamespace(task=types.SimpleNamespace(score=lambda p, a: float(p == a)),
                                 template=types.SimpleNamespace(extract=lambda t: t))
    assert RLVRTrainer.score(fake, ["x", "y"], ["x", "x", "y", "y"], 2).tolist() == [1.0, 1.0, 1.0, 1.0]


def test_per_step_objective_metrics_average_over_mini_batches(parts, make):
    """All rewards equal: every group is zero-variance, so frac_zero_var is 1 whether the step takes one mini-batch
    or two, and the target entropy is the same (a sum over mini-batches would double both)."""
    out = {}
    for updates in (1, 2):
        tr = make(parts, batch_prompts=4, updates_per_epoch=updates, lr=1e-12)
        b = tr.rollout(0)[0]
        b = dataclasses.replace(b, rewards=torch.ones_like(b.rewards))
        out[updates] = {k: v for k, v in tr.update(b, 0).items() if k.startswith("obj_")}
    assert out[1]["obj_frac_zero_var"] == out[2]["obj_frac_zero_var"] == 1.0
    assert out[2]["obj_target_entropy"] == pytest.approx(out[1]["obj_target_entropy"], rel=1e-5)


def test_a_token_budget_is_never_exceeded_by_adding_a_group():
    """Groups of K = 2 rows of 2 + 2 tokens cost 8 padded tokens each: a budget of 8 holds one group, not two."""
    mask = torch.ones(6, 2, dtype=torch.bool)
    assert [m.tolist() for m in token_micro_batches(mask, mask, 2, 8)] == [[0, 1], [2, 3], [4, 5]]
    assert [m.tolist() for m in token_micro_batches(mask, mask, 2, 16)] == [[0, 1, 2, 3], [4, 5]]


def test_trimming_a_rollout_trims_its_reference_log_probs_too():
    cm = torch.tensor([[True, True, False], [True, False, False]])
    r = Rollout(torch.ones(2, 1, dtype=torch.long), torch.ones(2, 1, dtype=torch.bool),
                torch.zeros(2, 3, dtype=torch.long), cm, torch.zeros(2, 3), torch.zeros(2),
                torch.zeros(2, dtype=torch.long), 2, ref_logp=torch.zeros(2, 3))
    t = r.trimmed()
    assert t.old_logp.shape == t.ref_logp.shape == (2, 2)


@pytest.mark.parametrize("answer", ["1{,}0000", "1\\,0000"])
def test_gsm8k_does_not_read_a_misplaced_separator_as_thousands(answer):
    from targetpo.llm.rewards import score_gsm8k

    assert score_gsm8k("10000", answer) == 0.0
    assert score_gsm8k("10000", "10{,}000") == 1.0


def test_kv_loop_sampling_advances_the_position():
    """The character model's logits hardly depend on position; with attention and head scaled up they do, and
    the KV-cached loop must still draw generate's greedy tokens (left-padded rows included)."""
    from targetpo.llm.models import build_char_tokenizer
    from targetpo.llm.rollout import sample

    tok = build_char_tokenizer()
    model = build_tiny_model(tok, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=64,
                             seed=3)
    with torch.no_grad():
        for name, w in model.named_parameters():
            if "q_proj.weight" in name or "k_proj.weight" in name:
                w.mul_(8.0)
        model.lm_head.weight.mul_(30.0)
    prompts = ["a4 b-1 c+7 =", "x =", "a longer prompt, so rows are left-padded"]
    kw = dict(k=1, max_new_tokens=20, greedy=True)
    a = sample(model, tok, prompts, **kw)[2]
    b = sample(model, tok, prompts, **kw, sampler="kv_loop")[2]
    assert a.shape == b.shape and torch.equal(a, b)
