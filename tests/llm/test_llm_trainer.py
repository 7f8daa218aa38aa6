"""The RLVR trainer on a tiny offline model: the gradient on the group sequence scores is exactly p − q through
the real loss path, gradient accumulation keeps groups whole and is exact, resume equals an uninterrupted run,
and the same seed gives the same metrics."""

import dataclasses
import json

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.llm
pytest.importorskip("transformers", reason="needs the llm extra: pip install -e '.[llm]'")
pytest.importorskip("reasoning_gym", reason="needs the llm extra: pip install -e '.[llm]'")

from safetensors.torch import load_file

from targetpo.experiments import run_experiment
from targetpo.llm import trainer as trainer_mod
from targetpo.llm.rollout import check_whole_groups, group_micro_batches
from targetpo.llm.templates import Template
from targetpo.llm.models import build_tiny_model
from targetpo.llm.trainer import RLVRTrainer, TrainerConfig, add_lora, micro_batch_loss
from targetpo.runs.store import read_metrics

K, B = 4, 3


@pytest.fixture(scope="module")
def setup(arithmetic_parts):  # two-digit addition
    return arithmetic_parts(max_terms=2, min_digits=2, max_digits=2, heldout=6)


def make_trainer(setup, **kw):
    tok, task, train, held = setup
    model = build_tiny_model(tok, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64)
    cfg = TrainerConfig(**{"k": K, "batch_prompts": B, "max_new_tokens": 4, "lr": 1e-2, **kw})
    return RLVRTrainer(model, tok, task, Template("plain"), train, held, cfg)


def with_rewards(batch, seed=0):
    """Distinct random rewards, so every group has variance and q differs from p_old."""
    r = torch.rand(batch.rewards.shape, generator=torch.Generator().manual_seed(seed))
    return dataclasses.replace(batch, rewards=r)


def independent_target(seq_old: np.ndarray, rewards: np.ndarray, eta: float = 1.0) -> np.ndarray:
    """q ∝ p_old·exp(u/η) with u the population z-score, in float64 numpy (independent of the library)."""
    u = (rewards - rewards.mean(-1, keepdims=True)) / rewards.std(-1, keepdims=True)
    logits = seq_old - seq_old.max(-1, keepdims=True) + u / eta
    q = np.exp(logits)
    return q / q.sum(-1, keepdims=True)


@pytest.mark.parametrize("seq_logp", ["sum", "mean"])
def test_gradient_on_group_sequence_scores_is_p_minus_q(setup, monkeypatch, seq_logp):
    tr = make_trainer(setup, seq_logp=seq_logp)
    batch = with_rewards(tr.rollout(0)[0])
    captured = []
    real = trainer_mod.token_logprobs

    def spy(*args, **kwargs):  # the trainer's own per-token log-probs, kept to read their gradient
        out = real(*args, **kwargs)
        out.retain_grad()
        captured.append(out)
        return out

    monkeypatch.setattr(trainer_mod, "token_logprobs", spy)
    loss, _ = micro_batch_loss(tr.model, tr.cfg, batch)
    loss.backward()
    logp = captured[0]
    assert torch.equal(logp.detach(), batch.old_logp)  # first epoch: p_θ = p_old exactly (same code path)

    mask = batch.completion_mask.double().numpy()
    tok_old = batch.old_logp.double().numpy()
    seq_old = (tok_old * mask).sum(-1)
    if seq_logp == "mean":
        seq_old = seq_old / mask.sum(-1)
    seq_old = seq_old.reshape(B, K)
    p = np.exp(seq_old - seq_old.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    q = independent_target(seq_old, batch.rewards.double().numpy().reshape(B, K))
    d_seq = ((p - q) / B).reshape(-1)  # d loss / d (group sequence log-score)
    # Chain rule to the tokens: d seq / d logp_t = 1 (sum) or 1/n (mean) on valid tokens, 0 on padding.
    per_tok = mask / (mask.sum(-1, keepdims=True) if seq_logp == "mean" else 1.0)
    np.testing.assert_allclose(logp.grad.double().numpy(), d_seq[:, None] * per_tok, atol=1e-6)
    assert np.abs(p - q).max() > 1e-3  # the check is not vacuous


@pytest.mark.parametrize("objective", ["tpo", "dapo", "grpo"])
def test_gradient_accumulation_over_whole_group_micro_batches_is_exact(setup, objective):
    tr = make_trainer(setup, objective=objective, kl_coef=0.1)
    batch = with_rewards(tr.rollout(0)[0])
    batch = dataclasses.replace(batch, ref_logp=batch.old_logp - 0.05)  # a reference that differs from the policy

    def grads(micro_rows):
        tr.model.zero_grad()
        rows_all, tokens_all = batch.rewards.shape[0], int(batch.completion_mask.sum())
        for rows in group_micro_batches(B, K, micro_rows, torch.tensor([2, 0, 1])):
            micro = batch.rows(rows)
            loss, _ = micro_batch_loss(tr.model, tr.cfg, micro, rows_all, tokens_all)
            loss.backward()
        return torch.cat([p.grad.reshape(-1) for p in tr.params])

    whole, per_group = grads(B * K), grads(K)
    assert whole.abs().max() > 1e-4
    torch.testing.assert_close(per_group, whole, rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("objective,options", [("grpo_masked", {}), ("dapo", {"mask_zero_var": True}),
                                               ("grpo", {"loss_agg": "token-mean"}), ("gspo", {"convention": "verl"})])
def test_micro_batches_are_refused_where_their_weights_would_not_be_the_loss_s_normaliser(setup, objective, options):
    """micro_weight weighs a micro-batch by its share of sequences (or tokens): right for each objective's default
    aggregation only. grpo_masked divides by the informative groups, and a loss_agg / convention override changes
    the divisor, so micro-batches summed to another gradient (grpo_masked: 0.67× the mini-batch's here)."""
    tr = make_trainer(setup, objective=objective, objective_options=options)
    batch = with_rewards(tr.rollout(0)[0])
    rewards = batch.rewards.clone()
    rewards[:K] = 1.0  # group 0 without signal: the informative groups differ between micro-batches
    batch = dataclasses.replace(batch, rewards=rewards)
    rows_all, tokens_all = batch.rewards.shape[0], int(batch.completion_mask.sum())

    def grads(micro_rows):
        tr.model.zero_grad()
        for rows in group_micro_batches(B, K, micro_rows):
            micro_batch_loss(tr.model, tr.cfg, batch.rows(rows), rows_all, tokens_all)[0].backward()
        return torch.cat([p.grad.reshape(-1) for p in tr.params])

    assert not torch.allclose(grads(K), grads(B * K), rtol=1e-3, atol=1e-7)  # why it is refused
    base = {"k": K, "batch_prompts": B, "objective": objective, "objective_options": options}
    for layout in ({"micro_batch_size": K}, {"micro_batch_tokens": 64}):
        with pytest.raises(ValueError, match="would not be the mini-batch's"):
            TrainerConfig(**base, **layout).validate()
    TrainerConfig(**base, micro_batch_size=B * K).validate()  # one micro-batch per mini-batch: exact


def test_layouts_that_would_split_a_group_are_rejected(setup):
    with pytest.raises(ValueError, match="multiple of K"):
        group_micro_batches(3, 4, 6)
    with pytest.raises(ValueError, match="micro_batch_size"):
        TrainerConfig(k=4, batch_prompts=3, micro_batch_size=6).validate()
    with pytest.raises(ValueError, match="updates_per_epoch"):
        TrainerConfig(k=4, batch_prompts=3, updates_per_epoch=2).validate()
    with pytest.raises(ValueError, match="mix groups"):
        check_whole_groups(torch.tensor([0, 0, 1, 1, 1, 1, 0, 0]), 4)
    with pytest.raises(ValueError, match="spread over several blocks"):
        check_whole_groups(torch.tensor([0, 0, 1, 1, 0, 0]), 2)
    with pytest.raises(ValueError, match="multiple of K"):
        check_whole_groups(torch.tensor([0, 0, 0]), 2)
    # A rollout whose rows were shuffled across groups is refused by the update itself.
    tr = make_trainer(setup)
    batch = tr.rollout(0)[0]
    perm = torch.tensor([1, 0, 2, 3, 4, 5, 6, 7, 8, 9, 11, 10])
    perm[[3, 4]] = perm[[4, 3]]  # rows 3 and 4 belong to groups 0 and 1
    with pytest.raises(ValueError, match="whole group"):
        tr.update(batch.rows(perm), 0)


def test_multi_epoch_update_moves_towards_the_target_and_grpo_first_epoch_is_unclipped(setup):
    tr = make_trainer(setup, epochs=3)
    rec = tr.step(0)
    assert {"reward", "accuracy", "frac_zero_var", "loss", "obj_kl_q_p", "obj_target_entropy", "completion_len",
            "grad_norm", "wall_step_s"} <= set(rec)
    g = make_trainer(setup, objective="grpo")
    batch = with_rewards(g.rollout(0)[0])
    _, out = micro_batch_loss(g.model, g.cfg, batch)
    assert float(out.metrics["clip_frac"]) == 0.0  # ratio exactly 1 in the first epoch


def test_lora_with_kl_to_the_frozen_base_trains_only_the_adapter(setup):
    tok, task, train, held = setup
    model = add_lora(build_tiny_model(tok, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                                      intermediate_size=64), r=4)
    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    tr = RLVRTrainer(model, tok, task, Template("plain"), train, held,
                     TrainerConfig(k=K, batch_prompts=B, max_new_tokens=4, lr=1e-2, kl_coef=0.1))
    batch = tr.rollout(0)[0]
    assert torch.equal(batch.ref_logp, batch.old_logp)  # before training the adapter is the identity (B = 0)
    tr.update(with_rewards(batch), 0)
    tr.update(with_rewards(tr.rollout(1)[0]), 1)
    assert all(torch.equal(p, frozen[n]) for n, p in model.named_parameters() if n in frozen)
    after = tr.rollout(2)[0]
    assert not torch.equal(after.ref_logp, after.old_logp)  # the adapter moved; the reference did not


def test_lora_adapter_init_depends_on_its_seed_only(setup):
    """The adapter's random A matrices came from torch's global generator, so paired units (and a unit rerun after
    a kill) started from different adapters depending on what ran before them in the process."""
    tok = setup[0]

    def adapter(seed, before):
        torch.manual_seed(before)
        model = add_lora(build_tiny_model(tok, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                                          intermediate_size=64), r=4, seed=seed)
        return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}, torch.rand(1)

    (a, after_a), (b, after_b), (c, _) = adapter(0, 1), adapter(0, 2), adapter(1, 1)
    assert a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a)
    assert not all(torch.equal(a[n], c[n]) for n in a)  # another seed, another adapter
    torch.manual_seed(1)
    assert torch.equal(after_a, torch.rand(1))  # the global generator is left as it was


def _stable(path):
    return [{k: v for k, v in r.items() if not k.startswith("wall_")} for r in read_metrics(path)]


def test_checkpoint_resume_equals_uninterrupted_run_and_same_seed_same_metrics(tmp_path, monkeypatch):
    overrides = ["steps=5", "checkpoint_every=2", "eval_every=2", "warmstart_steps=8"]
    full = run_experiment("rlvr", "smoke", out=tmp_path / "full", overrides=overrides, progress=False, quiet=True)

    calls = []
    real_step = RLVRTrainer.step

    def dying_step(self, t):
        calls.append((self.cfg.objective, t))
        if self.cfg.objective == "grpo" and t == 3:
            raise KeyboardInterrupt("killed")
        return real_step(self, t)

    monkeypatch.setattr(RLVRTrainer, "step", dying_step)
    with pytest.raises(KeyboardInterrupt):
        run_experiment("rlvr", "smoke", out=tmp_path / "cut", overrides=overrides, progress=False, quiet=True)
    assert (tmp_path / "cut" / "checkpoints" / "grpo.pt").exists()
    calls.clear()
    monkeypatch.setattr(RLVRTrainer, "step", lambda self, t: (calls.append((self.cfg.objective, t)), real_step(self, t))[1])
    run_experiment("rlvr", "smoke", out=tmp_path / "cut", resume=True, progress=False, quiet=True)
    assert calls == [("grpo", 2), ("grpo", 3), ("grpo", 4)]  # continued from the step-2 checkpoint
    meta = json.loads((tmp_path / "cut" / "run.json").read_text())
    assert "resume_mismatches" not in meta
    assert sorted(map(json.dumps, _stable(tmp_path / "cut" / "metrics.jsonl"))) == \
        sorted(map(json.dumps, _stable(full / "metrics.jsonl")))
    # Same seed, fresh run: identical metrics line for line; the RL units started from identical weights.
    again = run_experiment("rlvr", "smoke", out=tmp_path / "again", overrides=overrides, progress=False, quiet=True)
    assert _stable(again / "metrics.jsonl") == _stable(full / "metrics.jsonl")
    for unit in ("tpo_sum", "grpo"):
        wa = load_file(full / "models" / unit / "model.safetensors")
        wb = load_file(tmp_path / "cut" / "models" / unit / "model.safetensors")
        assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_rlvr_cli_documents_every_field_and_maps_flags(capsys):
    from targetpo.cli import build_parser
    from targetpo.llm import experiment as rlvr
    from targetpo.llm.cli import _methods
    from targetpo.runs.config import field_help

    with pytest.raises(SystemExit):
        build_parser().parse_args(["rlvr", "--help"])
    lines = [line.strip() for line in capsys.readouterr().out.splitlines()]
    helps = field_help(rlvr.Config)
    head = next(i for i, line in enumerate(lines) if line.startswith("config fields (key=value; defaults of the cpu"))
    fields = lines[head + 1:]
    for name in (f.name for f in dataclasses.fields(rlvr.Config)):
        documented = [line for line in fields if line.startswith(f"{name}=")]
        assert helps.get(name) and len(documented) == 1, (name, documented)
        assert documented[0].split(None, 1)[1].startswith(helps[name]), (name, documented)
    text = "\n".join(lines)
    for flag in ("--preset", "--model", "--task", "--objective", "--seq-logp", "--out", "--resume"):
        assert flag in text
    assert _methods("tpo,grpo", "both") == "tpo_sum,tpo_mean,grpo"
    assert _methods("tpo", None) == "tpo_sum"
    with pytest.raises(ValueError, match="unknown method"):
        rlvr.method_objective("tpo_median")
    with pytest.raises(ValueError, match="methods"):
        rlvr.PRESETS["smoke"].__class__(methods=("ppo",)).validate()


def test_kv_loop_sampler_gives_the_trainer_the_same_rollouts_and_metrics_as_generate(setup):
    """sampler=kv_loop is a drop-in for generate: the same step's rollout (tokens, masks, log-probs, rewards) and
    the same held-out evaluation, step after step as the weights move."""
    a, b = make_trainer(setup, max_new_tokens=8), make_trainer(setup, max_new_tokens=8, sampler="kv_loop")
    for step in range(2):
        ra, _ = a.rollout(step)
        rb, _ = b.rollout(step)
        for name in ("completion_ids", "completion_mask", "old_logp", "rewards"):
            assert torch.equal(getattr(ra, name), getattr(rb, name)), name
        a.update(ra, step)
        b.update(rb, step)
    assert a.evaluate() == b.evaluate()


def test_the_warm_starts_evaluations_use_the_configured_sampler(tmp_path, monkeypatch):
    """sampler=kv_loop drew the RL units' evaluations with the KV loop but the warm start's with generate."""
    from targetpo.llm import rollout

    used = []
    real = rollout.sample
    monkeypatch.setattr(trainer_mod, "sample", lambda *a, **kw: used.append(kw["sampler"]) or real(*a, **kw))
    run_experiment("rlvr", "smoke", out=tmp_path / "run", progress=False, quiet=True,
                   overrides=["sampler=kv_loop", "warmstart_steps=1", "steps=1", "methods=grpo"])
    assert used and set(used) == {"kv_loop"}


@pytest.mark.parametrize("layout", [{"updates_per_epoch": 2}, {"micro_batch_size": 2 * K}, {"micro_batch_tokens": 300}])
def test_first_update_sees_exactly_the_rollout_log_probs_in_any_layout(arithmetic_parts, monkeypatch, layout):
    """The old log-probs were computed over all rows in group order, the first update over a shuffled mini- or
    micro-batch with another padding trim: in bf16 its sequence log-probs differed from them by ~1e-3, so p_θ ≠
    p_old (and ratio ≠ 1) before any step. Now both passes use the first epoch's micro-batches."""
    tok, task, train, held = arithmetic_parts(max_terms=4, min_digits=1, max_digits=4, heldout=4)
    model = build_tiny_model(tok, hidden_size=64, num_layers=2).to(torch.bfloat16)
    cfg = TrainerConfig(k=K, batch_prompts=8, max_new_tokens=24, lr=1e-9, **layout)
    with pytest.warns(UserWarning, match="trainable parameter tensors are torch.bfloat16: AdamW steps them in place"):
        tr = RLVRTrainer(model, tok, task, Template("plain"), train, held, cfg)
    batch = with_rewards(tr.rollout(0)[0])
    gaps, real = [], trainer_mod.policy_loss

    def spy(cfg, logp, old, rewards, token_mask, k):
        gaps.append(float(((logp.detach() - old) * token_mask).abs().max()))
        return real(cfg, logp, old, rewards, token_mask, k)

    monkeypatch.setattr(trainer_mod, "policy_loss", spy)
    first_step = trainer_mod.torch.optim.AdamW.step
    steps = []
    monkeypatch.setattr(trainer_mod.torch.optim.AdamW, "step", lambda self, *a, **kw: (steps.append(len(gaps)),
                                                                                      first_step(self, *a, **kw))[1])
    tr.update(batch, 0)
    before_any_step = gaps[: steps[0]]
    assert before_any_step and max(before_any_step) == 0.0, gaps
