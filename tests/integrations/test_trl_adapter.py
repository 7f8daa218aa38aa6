"""TargetPOTrainer (TRL 1.16.0): whole groups in every micro-batch, real training steps, gradient = p − q."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch

pytestmark = [pytest.mark.integration, pytest.mark.llm]
pytest.importorskip("trl", reason="needs the trl extra: pip install -e '.[trl]'")

from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer

from targetpo.objectives.groups import check_whole_groups, layout_counts, whole_group_violations
from targetpo.integrations.trl import TargetPOConfig, TargetPOTrainer, shuffle_whole_groups, tpo_group_loss
from targetpo.llm.models import build_char_tokenizer, build_tiny_model, load_tiny_model, save_tiny_model

K = 4
TOKENIZER = build_char_tokenizer()
PROMPTS = Dataset.from_dict({"prompt": [f"{i}*{i + 1}=" for i in range(12)]})



def digit_reward(completions, **kwargs):
    return [float(sum(c.isdigit() for c in text)) for text in completions]


def tiny_model():
    return build_tiny_model(TOKENIZER, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                            intermediate_size=64, seed=0)


def common_args(out, **overrides):
    kw = dict(output_dir=str(out), use_cpu=True, bf16=False, report_to="none", num_generations=K,
              per_device_train_batch_size=2 * K, gradient_accumulation_steps=3, max_completion_length=6,
              max_steps=1, learning_rate=1e-2, logging_steps=1, save_strategy="no", seed=0, disable_tqdm=True)
    kw.update(overrides)
    return kw


def recording(cls):
    """A subclass of `cls` that records, per micro-batch reaching the loss, which prompt each row belongs to."""

    class Recording(cls):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            self.micro_batches, self._prompt_key = [], {}

        def _compute_loss(self, model, inputs):
            rows = [tuple(r[m.bool()].tolist()) for r, m in zip(inputs["prompt_ids"], inputs["prompt_mask"])]
            ids = [self._prompt_key.setdefault(r, len(self._prompt_key)) for r in rows]
            self.micro_batches.append(torch.tensor(ids))
            return super()._compute_loss(model, inputs)

    return Recording


def test_layout_checker_accepts_whole_groups_and_names_broken_ones():
    whole = torch.tensor([3, 3, 3, 3, 0, 0, 0, 0])
    assert whole_group_violations(whole, 4) == []
    check_whole_groups(whole, 4)
    with pytest.raises(ValueError, match="mix groups"):
        check_whole_groups(torch.tensor([3, 3, 0, 0, 0, 0, 3, 3]), 4)
    with pytest.raises(ValueError, match="spread over several blocks"):
        check_whole_groups(torch.tensor([1, 1, 2, 2, 1, 1, 2, 2]), 2)
    with pytest.raises(ValueError, match="multiple of K"):
        check_whole_groups(torch.tensor([1, 1, 1]), 2)
    assert layout_counts([torch.tensor([0, 0, 1, 1]), torch.tensor([1, 1, 0, 0])]) == [[2, 2], [2, 2]]


def test_shuffle_whole_groups_permutes_groups_not_rows():
    batch = {"x": torch.arange(12), "names": [f"r{i}" for i in range(12)], "scalar": torch.tensor(5), "none": None}
    out = shuffle_whole_groups(batch, 4, torch.Generator().manual_seed(1))
    blocks = out["x"].view(3, 4)
    assert sorted(blocks[:, 0].tolist()) == [0, 4, 8] and bool((blocks.diff(dim=1) == 1).all())
    assert out["names"] == [f"r{i}" for i in out["x"].tolist()]
    assert out["scalar"] is batch["scalar"] and out["none"] is None


def test_stock_grpo_splits_groups_and_targetpo_keeps_them_whole(tmp_path):
    # One generation batch of 6 prompts × K = 4 rows, split into 3 micro-batches of 8 rows.
    stock = recording(GRPOTrainer)(model=tiny_model(), reward_funcs=digit_reward, train_dataset=PROMPTS,
                                   processing_class=TOKENIZER, args=GRPOConfig(**common_args(tmp_path / "g")))
    stock.train()
    ours = recording(TargetPOTrainer)(model=tiny_model(), reward_funcs=digit_reward, train_dataset=PROMPTS,
                                      processing_class=TOKENIZER, args=TargetPOConfig(**common_args(tmp_path / "t")))
    ours.train()
    assert len(stock.micro_batches) == len(ours.micro_batches) == 3
    stock_layout, our_layout = layout_counts(stock.micro_batches), layout_counts(ours.micro_batches)
    assert any(len(c) > 1 for c in stock_layout), stock_layout  # some prompt's K rows span micro-batches
    assert any(whole_group_violations(ids, K) for ids in stock.micro_batches)
    assert our_layout == [[K]] * 6
    for ids in ours.micro_batches:
        check_whole_groups(ids, K)


def test_train_runs_steps_changes_parameters_and_logs_tpo_metrics(tmp_path):
    # Saved locally so that beta > 0 can load the frozen reference model from the same directory (offline).
    model, tokenizer = load_tiny_model(save_tiny_model(tmp_path / "model", hidden_size=32, num_layers=1,
                                                       num_heads=2, num_kv_heads=1, intermediate_size=64))
    before = [p.detach().clone() for p in model.parameters()]
    # num_iterations=2 reuses each generation batch, so TRL computes old_per_token_logps (p_old != p_θ).
    args = TargetPOConfig(**common_args(tmp_path, max_steps=3, seq_logp="mean", beta=0.01, num_iterations=2))
    trainer = TargetPOTrainer(model=model, reward_funcs=digit_reward, train_dataset=PROMPTS,
                              processing_class=tokenizer, args=args)
    assert trainer.ref_model is not None
    trainer.train()
    assert trainer.state.global_step == 3
    assert "old_per_token_logps" in trainer._buffered_inputs[0]
    changed = [not torch.equal(a, b) for a, b in zip(before, model.parameters())]
    assert sum(changed) >= len(changed) // 2
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert len(logs) == 3
    for h in logs:
        assert torch.isfinite(torch.tensor(h["loss"]))
        assert 0 <= h["tpo/target_entropy"] <= torch.log(torch.tensor(float(K))) + 1e-5
        assert h["tpo/kl_q_p"] >= 0 and 0 <= h["tpo/frac_zero_var"] <= 1 and "kl" in h
        assert 0 <= h["tpo/frac_groups_dropped"] <= h["tpo/frac_groups_without_signal"] <= 1


@pytest.fixture(scope="module")
def trainer(tmp_path_factory):
    args = TargetPOConfig(**common_args(tmp_path_factory.mktemp("grad"), tpo_eta=0.7))
    return TargetPOTrainer(model=tiny_model(), reward_funcs=digit_reward, train_dataset=PROMPTS,
                           processing_class=TOKENIZER, args=args)


def _fake_inputs(g, t, *, seed=0):
    gen = torch.Generator().manual_seed(seed)
    n = g * K
    lengths = torch.randint(1, t + 1, (n,), generator=gen)
    mask = (torch.arange(t)[None, :] < lengths[:, None]).long()
    return {
        "prompt_ids": torch.ones(n, 2, dtype=torch.long), "prompt_mask": torch.ones(n, 2, dtype=torch.long),
        "completion_ids": torch.ones(n, t, dtype=torch.long), "completion_mask": mask,
        "advantages": torch.zeros(n),
        "old_per_token_logps": -torch.rand(n, t, generator=gen) * 2,
        "tpo_rewards": torch.randint(0, 3, (n,), generator=gen).float(),
        "tpo_group": torch.arange(n) // K,
    }


@pytest.mark.parametrize("seq_logp", ["sum", "mean"])
def test_loss_gradient_on_sequence_scores_is_p_minus_q(trainer, seq_logp):
    g, t = 3, 5
    inputs = _fake_inputs(g, t)
    logps = (-torch.rand(g * K, t, generator=torch.Generator().manual_seed(7)) * 2).requires_grad_()
    trainer._get_per_token_logps_and_entropies = lambda *a, **k: (logps, torch.zeros_like(logps), None)
    trainer.args.seq_logp = seq_logp
    trainer.current_gradient_accumulation_steps = 3
    trainer.model.train()
    loss = trainer._compute_loss(trainer.model, inputs)
    loss.backward()

    # Independent math, float64: u = population z-score, q ∝ p_old·exp(u/η), p = softmax(ℓ_θ).
    m = inputs["completion_mask"].double()
    n_tok = m.sum(-1) if seq_logp == "mean" else torch.ones(g * K, dtype=torch.float64)
    seq = ((logps.detach().double() * m).sum(-1) / n_tok).view(g, K)
    old = ((inputs["old_per_token_logps"].double() * m).sum(-1) / n_tok).view(g, K)
    r = inputs["tpo_rewards"].double().view(g, K)
    sd = r.std(dim=1, unbiased=False, keepdim=True)
    u = torch.where(sd > 1e-6, (r - r.mean(1, keepdim=True)) / sd, torch.zeros_like(r))
    q = torch.softmax(torch.log_softmax(old, 1) + u / 0.7, 1)
    p = torch.softmax(seq, 1)
    expected_seq_grad = (p - q) / g / 3  # mean over groups, divided by gradient-accumulation steps
    expected = (expected_seq_grad.reshape(-1, 1) / n_tok[:, None]) * m
    torch.testing.assert_close(logps.grad.double(), expected, atol=1e-6, rtol=1e-4)
    trainer.args.seq_logp = "sum"


@pytest.mark.parametrize("bias_correction", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kl_term_is_grpos_in_float32_with_its_bias_correction(trainer, monkeypatch, bias_correction, dtype):
    g, t, beta = 3, 5, 0.5
    inputs = _fake_inputs(g, t, seed=3)
    gen = torch.Generator().manual_seed(11)
    logps = (-torch.rand(g * K, t, generator=gen) * 2).to(dtype)
    inputs["ref_per_token_logps"] = (logps.float() + 0.3 * torch.randn(g * K, t, generator=gen)).to(dtype)
    trainer._get_per_token_logps_and_entropies = lambda *a, **k: (logps, torch.zeros_like(logps), None)
    monkeypatch.setattr(trainer.args, "use_bias_correction_kl", bias_correction)
    monkeypatch.setattr(trainer, "current_gradient_accumulation_steps", 1, raising=False)
    trainer.model.train()
    monkeypatch.setattr(trainer, "beta", 0.0)
    base = trainer._compute_loss(trainer.model, inputs)
    monkeypatch.setattr(trainer, "beta", beta)
    with_kl = trainer._compute_loss(trainer.model, inputs)

    # GRPO's k3 with its importance weight π_θ/π_old when use_bias_correction_kl (TRL's default), float64.
    lp, ref, old = logps.double(), inputs["ref_per_token_logps"].double(), inputs["old_per_token_logps"].double()
    kl = torch.exp(ref - lp) - (ref - lp) - 1
    if bias_correction:
        kl = kl * torch.exp(lp - old)
    m = inputs["completion_mask"].double()
    expected = beta * ((kl * m).sum(-1) / m.sum(-1)).mean()
    torch.testing.assert_close((with_kl - base).double(), expected, atol=1e-7, rtol=1e-4)


def test_kl_term_ignores_whatever_padding_holds(trainer, monkeypatch):
    """Padding log-probs are garbage: a difference over 88 there made exp() inf and the gradient 0·∞ = NaN."""
    g, t = 2, 6
    inputs = _fake_inputs(g, t, seed=5)
    pad = inputs["completion_mask"] == 0
    assert pad.any()
    logps = (-torch.rand(g * K, t, generator=torch.Generator().manual_seed(2)) * 2).requires_grad_()
    inputs["ref_per_token_logps"] = torch.where(pad, torch.tensor(200.0), logps.detach() + 0.1)
    inputs["old_per_token_logps"] = torch.where(pad, torch.tensor(-200.0), inputs["old_per_token_logps"])
    trainer._get_per_token_logps_and_entropies = lambda *a, **k: (logps, torch.zeros_like(logps), None)
    monkeypatch.setattr(trainer.args, "use_bias_correction_kl", True)
    monkeypatch.setattr(trainer, "current_gradient_accumulation_steps", 1, raising=False)
    monkeypatch.setattr(trainer, "beta", 0.5)
    trainer.model.train()
    loss = trainer._compute_loss(trainer.model, inputs)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(logps.grad).all() and (logps.grad[pad] == 0).all()


def test_compute_loss_rejects_a_micro_batch_with_split_groups(trainer):
    inputs = _fake_inputs(2, 4)
    inputs["tpo_group"] = inputs["tpo_group"][torch.tensor([0, 1, 4, 5, 2, 3, 6, 7])]
    trainer.model.train()
    with pytest.raises(ValueError, match="whole groups"):
        trainer._compute_loss(trainer.model, inputs)


def test_unscorable_and_empty_completions_leave_the_group_softmax():
    g, t = 2, 3
    logps = -torch.rand(g * K, t, generator=torch.Generator().manual_seed(0))
    mask = torch.ones(g * K, t, dtype=torch.long)
    rewards = torch.tensor([1.0, 0.0, float("nan"), 2.0, float("nan")] + [float("nan")] * 3)
    loss, metrics = tpo_group_loss(logps, logps, rewards, mask, K)
    # Group 1 has no scorable completion: dropped (counts as 0); group 0 is TPO over its 3 scored candidates.
    keep = torch.tensor([0, 1, 3])
    ref, _ = tpo_group_loss(logps[keep], logps[keep], rewards[keep], mask[keep], 3)
    torch.testing.assert_close(loss, ref / 2)
    assert float(metrics["frac_groups_dropped"]) == 0.5
    empty = mask.clone()
    empty[2] = 0  # a truncated completion masked to no tokens behaves like an unscorable one
    rewards2 = rewards.clone()
    rewards2[2] = 5.0
    loss2, _ = tpo_group_loss(logps, logps, rewards2, empty, K)
    torch.testing.assert_close(loss2, ref / 2)


@pytest.mark.parametrize("override, setting", [
    (dict(per_device_train_batch_size=2, gradient_accumulation_steps=2), "per_device_train_batch_size"),  # TRL accepts it
    (dict(scale_rewards="group"), "scale_rewards"),
    (dict(loss_type="grpo"), "loss_type"),
    (dict(epsilon=0.3), "epsilon"),
    (dict(multi_objective_aggregation="normalize_then_sum"), "multi_objective_aggregation"),
    (dict(seq_logp="max"), "seq_logp"),
    (dict(tpo_eta=0.0), "tpo_eta"),
    (dict(tpo_eta=float("inf")), "tpo_eta"),  # q = p_old: no signal; the loss would refuse it only at step 1
    (dict(tpo_eta=True), "tpo_eta"),
    (dict(tpo_eta="0.5"), "tpo_eta"),
    (dict(tpo_eta="adaptive"), "tpo_eta"),  # the objective's adaptive η needs a KL budget this adapter has no field for
    (dict(num_generations_eval=1, eval_strategy="steps", eval_steps=1, per_device_eval_batch_size=8),
     "num_generations_eval"),  # TRL accepts it; TPO would fail at the first evaluation
    (dict(reward_weights=[float("nan")]), "reward_weights"),  # nansum would silently drop that reward function
    (dict(reward_weights=[float("inf")]), "reward_weights"),
    (dict(reward_weights=["1"]), "reward_weights"),
    (dict(beta=float("nan")), "beta"),
    (dict(beta=-0.1), "beta"),
    # Read only by GRPO's SAPO/VESPO losses, its adaptive entropy bonus or its vLLM importance weights.
    (dict(sapo_temperature_neg=2.0), "sapo_temperature_neg"),
    (dict(vespo_k_pos=1.0), "vespo_k_pos"),
    (dict(entropy_target=0.5), "entropy_target"),
    (dict(vllm_importance_sampling_mode="token_truncate"), "vllm_importance_sampling_mode"),
    (dict(vllm_importance_sampling_clip_max=5.0), "vllm_importance_sampling_clip_max"),
])
def test_config_rejects_settings_that_break_or_are_ignored_by_tpo(tmp_path, override, setting):
    with pytest.raises(ValueError, match=setting):
        TargetPOConfig(**common_args(tmp_path, **override))


@pytest.mark.parametrize("field, value", [("loss_type", "grpo"), ("epsilon", 0.5), ("scale_rewards", "group"),
                                          ("tpo_eta", -1.0)])
def test_a_setting_changed_after_the_config_was_built_is_refused_by_the_trainer(tmp_path, field, value):
    """The config checked itself only when built: a field set afterwards (a common way to tweak a recipe) was
    silently ignored by TPO."""
    args = TargetPOConfig(**common_args(tmp_path))
    setattr(args, field, value)
    with pytest.raises(ValueError, match=field):
        TargetPOTrainer(model=tiny_model(), reward_funcs=digit_reward, args=args, train_dataset=PROMPTS,
                        processing_class=TOKENIZER)


def test_kl_to_a_model_built_in_memory_is_refused_naming_the_fixes(tmp_path):
    """GRPOTrainer builds the reference model by reloading model.config._name_or_path: for a model built in memory
    that failed inside the Hub client ("Repo id must use alphanumeric chars ... ''")."""
    args = TargetPOConfig(**common_args(tmp_path / "out", beta=0.04))
    with pytest.raises(ValueError, match=r"beta=0\.04 needs a reference model.*model\.save_pretrained\(DIR\).*"
                                         r"peft_config=.*beta=0"):
        TargetPOTrainer(model=tiny_model(), reward_funcs=digit_reward, args=args, train_dataset=PROMPTS,
                        processing_class=TOKENIZER)
    model, tokenizer = load_tiny_model(save_tiny_model(tmp_path / "model"))
    trainer = TargetPOTrainer(model=model, reward_funcs=digit_reward, args=args,
                              train_dataset=PROMPTS, processing_class=tokenizer)
    assert trainer.ref_model is not None


def test_train_and_eval_group_sizes_are_read_from_their_own_settings():
    """num_generations is K in training, num_generations_eval in evaluation; the tests elsewhere set them equal."""
    import types

    from targetpo.integrations.trl import TargetPOTrainer

    ns = types.SimpleNamespace(num_generations=4, num_generations_eval=2)
    assert (TargetPOTrainer._group_size(ns, "train"), TargetPOTrainer._group_size(ns, "eval")) == (4, 2)
