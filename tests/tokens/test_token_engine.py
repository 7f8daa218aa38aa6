"""The token-experiment engine: per-seed losses and gradients, metrics, matching modes, determinism."""


import numpy as np
import pytest
import torch

from targetpo import objectives as obj
from targetpo.tokens import engine as te
from targetpo.tokens import transformer as tfm
from targetpo.tokens import tasks


pytestmark = pytest.mark.usefixtures("one_torch_thread")

SMALL = dict(length=4, vocab=2, batch=6, k=4, episodes=3, epochs=2)


def _batch(cfg, method, seeds=(0, 1)):
    spec = te.model_spec(cfg)
    params = tfm.init_params(spec, list(seeds))
    gens = te._generators(seeds, 2, "cpu")
    prompts = tasks.sample_prompts(te._generators(seeds, 1, "cpu"), te.method_batch(cfg, method), cfg.length,
                                   cfg.vocab)
    return spec, params, te.collect(params, spec, cfg, method, prompts, gens)


def _slice(batch, i):
    out = te.Batch(**{k: (v[i:i + 1] if isinstance(v, torch.Tensor) else v) for k, v in vars(batch).items()})
    return out


@pytest.mark.parametrize("method", ["ppo", "dg", "reinforce", "tpo", "tpo_no_anchor", "group_pg", "grpo",
                                    "grpo_no_kl", "grpo_masked", "tpo_token", "grpo_token"])
def test_each_seed_gets_exactly_its_own_gradient(method):
    reward = "bag" if te.METHODS[method].rollout == "token" else "terminal"
    cfg = te.TrialConfig(**SMALL, reward=reward)
    if reward == "terminal":
        cfg = te.TrialConfig(**(SMALL | {"length": 2}), reward=reward)   # some exact matches at H = 2
    spec, params, batch = _batch(cfg, method)
    params = {k: v.requires_grad_(True) for k, v in params.items()}
    grads = torch.autograd.grad(te.loss_fn(params, spec, cfg, method, batch), list(params.values()))
    for i in range(2):
        p1 = {k: v[i:i + 1].detach().requires_grad_(True) for k, v in params.items()}
        g1 = torch.autograd.grad(te.loss_fn(p1, spec, cfg, method, _slice(batch, i)), list(p1.values()),
                                 allow_unused=True)
        for g, gi in zip(grads, g1):
            assert torch.allclose(g[i:i + 1], torch.zeros_like(g[i:i + 1]) if gi is None else gi, atol=1e-5)


def test_loss_is_the_library_objective_on_the_rollout():
    cfg = te.TrialConfig(**SMALL, reward="bag")
    spec, params, batch = _batch(cfg, "tpo", seeds=(3,))
    logp = te.answer_logp(params, spec, batch.prompts, batch.actions)
    seq = logp.gather(-1, batch.actions.unsqueeze(-1)).squeeze(-1).sum(-1)
    expect = obj.tpo_loss(seq, batch.old_logp.sum(-1), batch.scores).loss
    assert torch.allclose(te.loss_fn(params, spec, cfg, "tpo", batch), expect)
    # first epoch: p_θ = p_old, so the TPO gradient on the group logits is p_old − q
    assert torch.allclose(seq, batch.old_logp.sum(-1), atol=1e-5)


def test_errors_follow_the_paper_definitions():
    cfg = te.TrialConfig(**SMALL, reward="sequential")
    _, _, b = _batch(cfg, "tpo_token")
    target = tasks.targets(b.prompts, cfg.task, cfg.vocab)
    beh = tasks.token_rewards(b.actions[:, :, 0], target, "sequential")
    assert torch.allclose(b.error, 1 - beh.mean(dim=(1, 2)))
    assert torch.equal(b.cand_rewards[..., 0], beh)
    cfg = te.TrialConfig(**SMALL, reward="terminal")
    _, _, b = _batch(cfg, "grpo")
    exact = tasks.exact_match(b.actions, tasks.targets(b.prompts, cfg.task, cfg.vocab).unsqueeze(2))
    assert b.actions.shape == (2, 6, 4, 4)
    assert torch.allclose(b.error, 1 - exact.float().mean(dim=(1, 2)))


def test_interaction_matching_changes_only_single_sample_methods():
    cfg = te.TrialConfig(**SMALL, match="interactions")
    assert te.method_batch(cfg, "ppo") == 24 and te.method_lr(cfg, "dg") == pytest.approx(2e-3)
    assert te.method_batch(cfg, "tpo") == 6 and te.method_lr(cfg, "tpo") == 1e-3
    assert te.method_batch(cfg, "tpo_token") == 6
    plain = te.TrialConfig(**SMALL, match="interactions", interaction_lr_scale=False)
    assert te.method_lr(plain, "ppo") == 1e-3
    assert te.method_epochs(cfg, "dg") == 1 and te.method_epochs(cfg, "ppo") == 2


def test_diagnostics_of_a_hand_made_group_batch():
    cfg = te.TrialConfig(**SMALL, reward="terminal")
    _, _, b = _batch(cfg, "tpo", seeds=(0,))
    target = tasks.targets(b.prompts, cfg.task, cfg.vocab)
    # force: prompt 0 → candidate 1 right; prompt 1 → all right; others all wrong
    acts = (1 - target).unsqueeze(2).expand(-1, -1, 4, -1).clone()
    acts[0, 0, 1] = target[0, 0]
    acts[0, 1] = target[0, 1]
    b.actions = acts
    b.scores = tasks.sequence_scores(tasks.token_rewards(acts, target.unsqueeze(2), "terminal"))
    d = te.diagnostics(cfg, "tpo", b)
    assert d["frac_success"].item() == pytest.approx(2 / 6)
    assert d["all_fail"].item() == pytest.approx(4 / 6)
    assert d["frac_zero_var"].item() == pytest.approx(5 / 6)          # 4 all-fail + 1 all-success
    q = obj.tpo_target(b.old_logp.sum(-1), b.scores)
    ok = b.scores > 0
    assert d["weight_winners"].item() == pytest.approx(q[ok].mean().item(), rel=1e-5)
    assert d["weight_losers"].item() == pytest.approx(q[~ok].mean().item(), rel=1e-5)
    g = te.diagnostics(cfg, "grpo", b)
    adv = obj.group_advantages(b.scores).abs()
    assert g["weight_winners"].item() == pytest.approx(adv[ok].mean().item(), rel=1e-5)


def test_run_trial_is_deterministic_and_logs_every_episode():
    cfg = te.TrialConfig(**SMALL, reward="bag")
    logged = []
    a = te.run_trial(cfg, "tpo_token", [0, 1], log=logged.append)
    b = te.run_trial(cfg, "tpo_token", [0, 1])
    assert [r["step"] for r in logged] == [0, 1, 2]
    assert set(a) == {"error", "grad_norm", "frac_success", "all_fail", "frac_zero_var", "weight_winners",
                      "weight_losers"}
    for k in a:
        assert a[k].shape == (3, 2)
        np.testing.assert_array_equal(a[k], b[k])
    one = te.run_trial(cfg, "tpo_token", [1])
    np.testing.assert_allclose(one["error"][:, 0], a["error"][:, 1], atol=1e-6)
    assert np.all(a["grad_norm"] > 0) and np.all((a["error"] >= 0) & (a["error"] <= 1))


def test_run_trial_rejects_bad_input():
    with pytest.raises(ValueError, match="dense reward"):
        te.run_trial(te.TrialConfig(**SMALL, reward="terminal"), "tpo_token", [0])
    with pytest.raises(ValueError, match="unknown method"):
        te.run_trial(te.TrialConfig(**SMALL), "sft", [0])
    with pytest.raises(ValueError, match="match"):
        te.trial_config(object(), match="both")
    with pytest.raises(ValueError, match="k"):
        te.TrialConfig(k=1).validate()
    for seeds in ([1.5], [-1], [True], "01", 3, {0, 1}):  # never truncated, wrapped, read character by character or unordered
        with pytest.raises(ValueError, match="seeds must be a sequence of integers >= 0"):
            te.run_trial(te.TrialConfig(**SMALL), "tpo_token", seeds)
    with pytest.raises(ValueError, match=r"seeds must be distinct, got \[0, 1, 0\]"):
        te.run_trial(te.TrialConfig(**SMALL), "tpo_token", [0, 1, 0])
    with pytest.raises(ValueError, match="got the string 'tpo'"):
        te.trial_config(object(), methods="tpo")
    # a device this machine lacks was an AssertionError from inside torch ("Torch not compiled with CUDA enabled")
    with pytest.raises(ValueError, match=r"device='bogus': not a torch device"):
        te.run_trial(te.TrialConfig(**SMALL), "tpo_token", [0], device="bogus")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match=r"device=cuda: this machine has 0 CUDA device\(s\)"):
            te.run_trial(te.TrialConfig(**SMALL), "tpo_token", [0], device="cuda")


def test_learning_signal_reduces_the_error():
    """A few episodes of TPO_token on copy/bag with V = 2 at a large lr must beat the uniform error 0.5."""
    cfg = te.TrialConfig(task="copy", reward="bag", length=3, vocab=2, batch=32, k=8, episodes=25, lr=3e-3)
    out = te.run_trial(cfg, "tpo_token", [0])
    assert out["error"][:3].mean() > 0.35 and out["error"][-5:].mean() < 0.2


def test_plain_torch_muon_option_trains_through_run_trial():
    cfg = te.TrialConfig(**SMALL, reward="bag", optimizer="torch")
    out = te.run_trial(cfg, "grpo_token", [0, 1])
    ref = te.run_trial(te.TrialConfig(**SMALL, reward="bag"), "grpo_token", [0, 1])
    assert np.isfinite(out["grad_norm"]).all()
    np.testing.assert_array_equal(out["error"][0], ref["error"][0])   # same initial model and first rollout
    assert not np.array_equal(out["grad_norm"][1:], ref["grad_norm"][1:])  # a different optimizer after it
