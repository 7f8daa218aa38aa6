"""The GRPO family with `convention="verl"` / `"trl"` computes what verl 0.9.1 and TRL 1.16 compute: the same loss
and the same gradient on random ragged batches (random lengths, several groups, a zero-variance group, a
singleton group where the engine has them), checked by calling the engines' own code (docs/conventions.md)."""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from targetpo import objectives as obj
from targetpo.objectives import conventions

G, K, T = 4, 4, 7
TOL = dict(rtol=1e-6, atol=1e-9)


def verl():
    return pytest.importorskip("verl.trainer.ppo.core_algos", reason="verl is needed to compare with its losses")


def trl_trainer():
    return pytest.importorskip("trl.trainer.grpo_trainer", reason="TRL is needed to compare with its GRPO loss")


def ragged_batch(seed: int, *, extreme: bool = True, singleton: bool = False):
    """Per-token log-probs [G, K, T] with random lengths, scores with a zero-variance group (group 1), and with
    `singleton` a candidate mask leaving group 2 one candidate. `extreme` puts one log-ratio beyond ±20 and one
    reference 6 nats away (verl's clamps)."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, T + 1, (G, K), generator=g)
    tm = torch.arange(T) < lengths.unsqueeze(-1)
    old = -3 * torch.rand(G, K, T, generator=g, dtype=torch.float64)
    logp = old + 0.4 * torch.randn(G, K, T, generator=g, dtype=torch.float64)
    ref = old + 0.5 * torch.randn(G, K, T, generator=g, dtype=torch.float64)
    if extreme:
        logp[0, 0, 0] = old[0, 0, 0] + 25.0
        logp[3, 1, 0] = old[3, 1, 0] - 1.5
        ref[3, 2, 0] = logp[3, 2, 0] + 6.0
    scores = torch.randint(0, 3, (G, K), generator=g).to(torch.float64)
    scores[1] = 1.0
    scores[0, :2] = torch.tensor([0.0, 2.0], dtype=torch.float64)  # group 0 is informative
    mask = None
    if singleton:
        mask = torch.ones(G, K, dtype=torch.bool)
        mask[2, 1:] = False
    return logp.requires_grad_(True), old, ref, scores, tm, mask


def verl_batch(logp, old, ref, scores, tm, mask):
    """The same batch as verl lays it out: valid candidates as rows [B, T], a group index, rewards on a token."""
    rows = torch.ones(G, K, dtype=torch.bool) if mask is None else mask
    flat = rows.reshape(-1)
    index = np.repeat(np.arange(G), K)[flat.numpy()]
    rmask = tm.reshape(G * K, T)[flat].to(logp.dtype)
    rewards = torch.zeros_like(rmask)
    rewards[:, 0] = scores.reshape(-1)[flat]
    return (logp.reshape(G * K, T)[flat], old.reshape(G * K, T)[flat], ref.reshape(G * K, T)[flat],
            rewards, rmask, index)


def verl_config(loss_mode="vanilla", **kw):
    from verl.workers.config.actor import ActorConfig, PolicyLossConfig

    policy = {k: kw.pop(k) for k in list(kw) if k in ("clip_cov_ratio", "clip_cov_lb", "clip_cov_ub",
                                                      "kl_cov_ratio", "ppo_kl_coef")}
    return ActorConfig(strategy="fsdp", ppo_micro_batch_size_per_gpu=1, rollout_n=1,
                       policy_loss=PolicyLossConfig(loss_mode=loss_mode, **policy), **kw)


def grad(loss, x):
    (g,) = torch.autograd.grad(loss, x, retain_graph=True)
    return g


def assert_same(ours, theirs, x):
    torch.testing.assert_close(ours, theirs, **TOL)
    torch.testing.assert_close(grad(ours, x), grad(theirs, x), **TOL)


# ----------------------------------------------------------------------------- verl 0.9.1


@pytest.mark.parametrize("loss_agg", ["token-mean", "token-sum", "seq-mean-token-mean", "seq-mean-token-sum",
                                      "seq-mean-token-sum-norm"])
@pytest.mark.parametrize("seed", [0, 1])
def test_grpo_verl_convention_is_verl_vanilla_loss_plus_kl_loss(loss_agg, seed):
    ca = verl()
    logp, old, ref, scores, tm, mask = ragged_batch(seed, singleton=True)
    lp, o, r, rewards, rmask, index = verl_batch(logp, old, ref, scores, tm, mask)
    adv, _ = ca.compute_grpo_outcome_advantage(rewards, rmask, index, epsilon=1e-6)
    cfg = verl_config(clip_ratio=0.2, clip_ratio_low=0.2, clip_ratio_high=0.28, loss_agg_mode=loss_agg)
    pg, _ = ca.compute_policy_loss_vanilla(o, lp, adv, rmask, loss_agg_mode=loss_agg, config=cfg)
    kl = ca.agg_loss(ca.kl_penalty(lp, r, "low_var_kl"), rmask, loss_agg)
    theirs = pg + 0.05 * kl
    # verl's loss_mode "vanilla" with use_kl_loss, low_var_kl: workers/utils/losses.py ppo_loss
    ours = obj.grpo_loss(logp, old, scores, token_mask=tm, mask=mask, ref_logp=ref, beta=0.05, clip_eps=0.2,
                         clip_eps_high=0.28, loss_agg=loss_agg, convention="verl").loss
    assert_same(ours, theirs, logp)


@pytest.mark.parametrize("estimator,verl_name", [("k1", "k1"), ("k2", "k2"), ("abs", "abs")])
def test_grpo_kl_estimator_flag_is_verls_kl_loss_type(estimator, verl_name):
    ca = verl()
    logp, old, ref, scores, tm, _ = ragged_batch(4)
    lp, o, r, rewards, rmask, index = verl_batch(logp, old, ref, scores, tm, None)
    adv, _ = ca.compute_grpo_outcome_advantage(rewards, rmask, index, epsilon=1e-6)
    pg, _ = ca.compute_policy_loss_vanilla(o, lp, adv, rmask, config=verl_config(clip_ratio=0.2))
    theirs = pg + 0.05 * ca.agg_loss(ca.kl_penalty(lp, r, verl_name), rmask, "token-mean")
    ours = obj.grpo_loss(logp, old, scores, token_mask=tm, ref_logp=ref, beta=0.05, kl_estimator=estimator,
                         convention="verl").loss
    assert_same(ours, theirs, logp)


def test_float32_inputs_agree_with_verl_and_trl_to_1e_6():
    ca = verl()
    logp, old, ref, scores, tm, mask = ragged_batch(6, singleton=True)
    logp, old, ref, scores = (x.detach().float() for x in (logp, old, ref, scores))
    logp.requires_grad_(True)
    lp, o, r, rewards, rmask, index = verl_batch(logp, old, ref, scores, tm, mask)
    adv, _ = ca.compute_grpo_outcome_advantage(rewards, rmask, index, epsilon=1e-6)
    pg, _ = ca.compute_policy_loss_vanilla(o, lp, adv, rmask, config=verl_config(clip_ratio=0.2))
    theirs = pg + 0.05 * ca.agg_loss(ca.kl_penalty(lp, r, "low_var_kl"), rmask, "token-mean")
    ours = obj.grpo_loss(logp, old, scores, token_mask=tm, mask=mask, ref_logp=ref, beta=0.05, convention="verl").loss
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(grad(ours, logp), grad(theirs, logp), rtol=1e-6, atol=1e-6)
    logp, old, ref, scores, tm, _ = ragged_batch(6)
    logp, old, ref, scores = (x.detach().float() for x in (logp, old, ref, scores))
    logp.requires_grad_(True)
    theirs = trl_loss(logp, old, ref, scores, tm, loss_type="dapo", beta=0.04)
    ours = obj.grpo_loss(logp, old, scores, token_mask=tm, ref_logp=ref, beta=0.04, convention="trl").loss
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(grad(ours, logp), grad(theirs, logp), rtol=1e-6, atol=1e-6)


def test_grpo_verl_convention_differs_from_the_default_where_verl_does():
    logp, old, ref, scores, tm, mask = ragged_batch(0, singleton=True)
    kw = dict(token_mask=tm, mask=mask, ref_logp=ref, beta=0.05, loss_agg="token-mean")
    verl_loss = obj.grpo_loss(logp, old, scores, convention="verl", **kw).loss
    assert not torch.allclose(obj.grpo_loss(logp, old, scores, **kw).loss, verl_loss)
    # Each flag on its own moves the loss; all of them together give the convention.
    flags = conventions.FLAGS["grpo"]["verl"]
    together = obj.grpo_loss(logp, old, scores, **{**kw, **{k: v for k, v in flags.items() if k != "loss_agg"}})
    torch.testing.assert_close(together.loss, verl_loss, rtol=0, atol=0)
    # An explicit flag wins over the convention.
    no_dual = obj.grpo_loss(logp, old, scores, convention="verl", dual_clip_c=None, **kw).loss
    assert not torch.allclose(no_dual, verl_loss)


def test_grpo_targetpo_convention_is_the_default_bit_for_bit():
    logp, old, ref, scores, tm, mask = ragged_batch(3, singleton=True)
    for fn in (obj.grpo_loss, obj.gspo_loss, obj.sapo_loss, obj.cispo_loss, obj.dapo_loss, obj.dr_grpo_loss):
        a = fn(logp, old, scores, token_mask=tm, mask=mask)
        b = fn(logp, old, scores, token_mask=tm, mask=mask, convention="targetpo")
        assert torch.equal(a.loss, b.loss), fn.__name__
    with pytest.raises(ValueError, match="convention='deepspeed'"):
        obj.grpo_loss(logp, old, scores, convention="deepspeed")
    with pytest.raises(ValueError, match="convention='trl'"):
        obj.gmpo_loss(logp, old, scores, convention="trl")


def test_ppo_verl_convention_is_verl_vanilla_with_given_advantages():
    ca = verl()
    logp, old, _, _, tm, _ = ragged_batch(5)
    adv = torch.randn(G * K, T, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    lp, o, m = logp.reshape(G * K, T), old.reshape(G * K, T), tm.reshape(G * K, T)
    theirs, _ = ca.compute_policy_loss_vanilla(o, lp, adv * m, m.double(), config=verl_config(clip_ratio=0.2))
    ours = obj.ppo_loss(lp, o, adv * m, token_mask=m, convention="verl").loss
    assert_same(ours, theirs, logp)
    assert obj.get("ppo_dual_clip").fn(lp, o, adv * m, token_mask=m, loss_agg="token-mean",
                                       log_ratio_clip=20.0).loss.item() == pytest.approx(theirs.item(), rel=1e-12)


@pytest.mark.parametrize("loss_agg", ["token-mean", "seq-mean-token-mean"])
def test_gspo_verl_convention_is_verl_gspo(loss_agg):
    ca = verl()
    logp, old, _, scores, tm, mask = ragged_batch(7, singleton=True)
    logp.data[0, 0, 0] = old[0, 0, 0] + 12.0  # a short sequence whose log s passes verl's upper clamp of 10
    tm[0, 0] = False
    tm[0, 0, 0] = True
    lp, o, _, rewards, rmask, index = verl_batch(logp, old, old, scores, tm, mask)
    adv, _ = ca.compute_grpo_outcome_advantage(rewards, rmask, index, epsilon=1e-6)
    cfg = verl_config(clip_ratio=3e-4, clip_ratio_low=3e-4, clip_ratio_high=4e-4, loss_agg_mode=loss_agg)
    theirs, _ = ca.compute_policy_loss_gspo(o, lp, adv, rmask, loss_agg_mode=loss_agg, config=cfg)
    ours = obj.gspo_loss(logp, old, scores, token_mask=tm, mask=mask, clip_eps=3e-4, clip_eps_high=4e-4,
                         loss_agg=loss_agg, convention="verl").loss
    assert_same(ours, theirs, logp)


def test_gspo_sequence_mean_equals_the_token_form_with_seq_mean_token_mean():
    """The paper's per-sequence mean and the engines' token form have the same loss and gradient."""
    logp, old, _, scores, tm, _ = ragged_batch(8, extreme=False)
    a = obj.gspo_loss(logp, old, scores, token_mask=tm, clip_eps=0.1, clip_eps_high=0.1).loss
    b = obj.gspo_loss(logp, old, scores, token_mask=tm, clip_eps=0.1, clip_eps_high=0.1,
                      loss_agg="seq-mean-token-mean").loss
    assert_same(a, b, logp)


def test_sapo_verl_convention_is_verl_sapo():
    ca = verl()
    logp, old, _, scores, tm, mask = ragged_batch(9, singleton=True)
    lp, o, _, rewards, rmask, index = verl_batch(logp, old, old, scores, tm, mask)
    adv, _ = ca.compute_grpo_outcome_advantage(rewards, rmask, index, epsilon=1e-6)
    cfg = verl_config(tau_pos=1.0, tau_neg=1.05)
    # verl's SAPO aggregates by seq-mean-token-mean whatever loss_agg_mode says
    theirs, _ = ca.compute_policy_loss_sapo(o, lp, adv, rmask, loss_agg_mode="token-mean", config=cfg)
    ours = obj.sapo_loss(logp, old, scores, token_mask=tm, mask=mask, convention="verl").loss
    assert_same(ours, theirs, logp)


def test_cispo_verl_convention_is_verl_cispo():
    ca = verl()
    logp, old, _, scores, tm, mask = ragged_batch(10, singleton=True)
    lp, o, _, rewards, rmask, index = verl_batch(logp, old, old, scores, tm, mask)
    adv, _ = ca.compute_grpo_outcome_advantage(rewards, rmask, index, epsilon=1e-6)
    theirs, _ = ca.compute_policy_loss_cispo(o, lp, adv, rmask, config=verl_config(clip_ratio=0.2))
    ours = obj.cispo_loss(logp, old, scores, token_mask=tm, mask=mask, convention="verl").loss
    assert_same(ours, theirs, logp)


@pytest.mark.parametrize("seed", [11, 12])
def test_clip_cov_is_verl_clip_cov_with_the_same_random_pick(seed):
    ca = verl()
    logp, old, _, scores, tm, mask = ragged_batch(seed, extreme=False, singleton=True)
    lp, o, _, rewards, rmask, index = verl_batch(logp, old, old, scores, tm, mask)
    adv, _ = ca.compute_grpo_outcome_advantage(rewards, rmask, index, epsilon=1e-6)
    cfg = verl_config("clip_cov", clip_ratio=0.2, clip_cov_ratio=0.2, clip_cov_lb=0.0, clip_cov_ub=5.0)
    torch.manual_seed(seed)
    theirs, _ = ca.compute_policy_loss_clip_cov(o, lp, adv, rmask, config=cfg)
    torch.manual_seed(seed)
    out = obj.clip_cov_loss(logp, old, scores, token_mask=tm, mask=mask, clip_cov_ratio=0.2, clip_cov_lb=0.0,
                            convention="verl")
    assert out.metrics["cov_clip_frac"] > 0  # some tokens were detached: the pick is exercised
    assert_same(out.loss, theirs, logp)


def test_clip_cov_detaches_exactly_the_picked_tokens():
    logp, old, _, scores, tm, _ = ragged_batch(13, extreme=False)
    plain = obj.clip_cov_loss(logp, old, scores, token_mask=tm, clip_cov_ratio=0.2, clip_cov_lb=1e9,
                              clip_cov_ub=2e9)  # no token's covariance is in range: nothing is detached
    ppo = obj.ppo_loss(logp, old, obj.group_advantages(scores).unsqueeze(-1).expand_as(logp) * tm,
                       token_mask=tm, loss_agg="token-mean")
    assert_same(plain.loss, ppo.loss, logp)
    out = obj.clip_cov_loss(logp, old, scores, token_mask=tm, clip_cov_ratio=0.2, clip_cov_lb=0.0,
                            generator=torch.Generator().manual_seed(0))
    g, g_ppo = grad(out.loss, logp), grad(ppo.loss, logp)
    changed = (g != g_ppo) & tm
    assert 0 < changed.sum() <= max(int(0.2 * tm.sum()), 1)
    assert (g[changed] == 0).all()  # a picked token keeps its value in the loss but loses its gradient


@pytest.mark.parametrize("seed", [14, 15])
def test_kl_cov_is_verl_kl_cov(seed):
    ca = verl()
    logp, old, _, scores, tm, mask = ragged_batch(seed, extreme=False, singleton=True)
    lp, o, _, rewards, rmask, index = verl_batch(logp, old, old, scores, tm, mask)
    adv, _ = ca.compute_grpo_outcome_advantage(rewards, rmask, index, epsilon=1e-6)
    cfg = verl_config("kl_cov", kl_cov_ratio=0.2, ppo_kl_coef=0.5)
    theirs, _ = ca.compute_policy_loss_kl_cov(o, lp, adv, rmask, config=cfg)
    ours = obj.kl_cov_loss(logp, old, scores, token_mask=tm, mask=mask, kl_cov_ratio=0.2, ppo_kl_coef=0.5,
                           convention="verl").loss
    assert_same(ours, theirs, logp)


def test_kl_cov_closed_form_on_a_hand_picked_token():
    """One group, one candidate's tokens: the top-covariance token gets c·|log ρ| added, every other −ρA."""
    logp = torch.tensor([[[-1.0, -2.0], [-0.5, -3.0]]], dtype=torch.float64, requires_grad=True)
    old = torch.full_like(logp, -1.2)
    scores = torch.tensor([[1.0, 0.0]], dtype=torch.float64)
    out = obj.kl_cov_loss(logp, old, scores, kl_cov_ratio=0.25, ppo_kl_coef=0.5)
    a = torch.tensor([[1.0, 1.0], [-1.0, -1.0]], dtype=torch.float64) * 0.5 / (0.5 + 1e-8)  # (s − s̄)/(σ + ε)
    cov = (a - a.mean()) * (logp.detach()[0] - logp.detach().mean())
    top = cov.reshape(-1).argmax()
    per = (-a * torch.exp(logp[0] - old[0])).reshape(-1)
    per = per + 0.5 * (logp[0] - old[0]).abs().reshape(-1) * (torch.arange(4) == top)
    torch.testing.assert_close(out.loss, per.mean(), **TOL)


def test_gmpo_is_verl_geo_mean():
    ca = verl()
    logp, old, _, scores, tm, mask = ragged_batch(16, singleton=True)
    lp, o, _, rewards, rmask, index = verl_batch(logp, old, old, scores, tm, mask)
    adv, _ = ca.compute_grpo_outcome_advantage(rewards, rmask, index, epsilon=1e-6)
    theirs, _ = ca.compute_policy_loss_geo_mean(o, lp, adv, rmask, config=verl_config(clip_ratio=0.2))
    ours = obj.gmpo_loss(logp, old, scores, token_mask=tm, mask=mask, clip_eps=0.2, convention="verl").loss
    assert_same(ours, theirs, logp)


def test_gmpo_closed_form_one_sequence():
    """A > 0: the log-ratio is clipped above only; the loss is −A·exp(mean of the clipped log-ratios)."""
    logp = torch.tensor([[[0.5, -0.1, 0.05], [0.0, 0.0, 0.0]]], dtype=torch.float64, requires_grad=True)
    old = torch.zeros_like(logp)
    scores = torch.tensor([[1.0, 0.0]], dtype=torch.float64)
    out = obj.gmpo_loss(logp, old, scores, clip_eps=0.2)
    a = 0.5 / (0.5 + 1e-8)
    expected = -a * 3 / (3 + 1e-8) * np.exp((0.2 - 0.1 + 0.05) / (3 + 1e-8)) / 2 + a * 3 / (3 + 1e-8) / 2
    assert out.loss.item() == pytest.approx(expected, rel=1e-12)
    g = grad(out.loss, logp)
    assert g[0, 0, 0] == 0 and g[0, 0, 1] != 0  # the clipped token gets no gradient


@pytest.mark.parametrize("estimator,verl_name", [("k1", "k1"), ("k2", "k2"), ("k3", "low_var_kl"), ("abs", "abs")])
def test_kl_estimators_are_verls(estimator, verl_name):
    ca = verl()
    logp, _, ref, _, tm, _ = ragged_batch(17)
    theirs = ca.kl_penalty(logp, ref, verl_name)
    ours = obj.kl_estimate(logp, ref, kl_estimator=estimator, log_ratio_clip=20.0, kl_clip=10.0)
    assert_same((ours * tm).sum(), (theirs * tm).sum(), logp)
    # closed forms, Δ = log π − log π_ref
    d = (logp - ref).detach()
    closed = {"k1": d, "k2": d.square() / 2, "abs": d.abs(),
              "k3": (torch.exp(-d.clamp(-20, 20)) + d.clamp(-20, 20) - 1).clamp(max=10.0)}[estimator]
    torch.testing.assert_close(ours.detach(), closed, **TOL)
    if estimator == "k3":
        assert (ours.detach() == 10.0).any()  # the batch reaches verl's KL clamp
    with pytest.raises(ValueError, match="kl_estimator='k4'"):
        obj.kl_estimate(logp, ref, kl_estimator="k4")


def test_token_sum_aggregation_is_verls():
    ca = verl()
    x = torch.randn(3, 5, dtype=torch.float64)
    m = torch.rand(3, 5) > 0.3
    theirs = ca.agg_loss(x, m.double(), "token-sum")
    assert obj.aggregate(x, "token-sum", token_mask=m, per_token=True).item() == pytest.approx(theirs.item(), rel=1e-12)
    assert obj.aggregate(x, "token-sum", token_mask=m, per_token=True).item() == pytest.approx(x[m].sum().item())


# ----------------------------------------------------------------------------- TRL 1.16


class _Accelerator:
    num_processes = 1

    @staticmethod
    def reduce(x, reduction="sum"):
        return x

    @staticmethod
    def gather(x):
        return x


def trl_loss(logp, old, ref, scores, tm, *, loss_type, beta=0.0, epsilon=0.2, epsilon_high=None,
             importance_sampling_level="token", max_completion_length=T, scale_rewards="group"):
    """TRL's `GRPOTrainer._compute_loss` on a trainer object holding only what it reads, with advantages from
    the formula of `_generate_and_score_completions` (TRL's own `nanstd`, + 1e-4)."""
    gt = trl_trainer()
    from trl.trainer.utils import nanstd

    rewards = scores.reshape(-1)
    mean = torch.nanmean(rewards.view(-1, K), dim=1).repeat_interleave(K)
    std = nanstd(rewards.view(-1, K), dim=1).repeat_interleave(K)
    advantages = rewards - mean
    if scale_rewards != "none":
        advantages = advantages / (std + 1e-4)

    trainer = object.__new__(gt.GRPOTrainer)
    per_token = logp.reshape(G * K, T)
    entropies = torch.zeros_like(per_token)
    trainer.__dict__.update(
        top_entropy_quantile=1.0, off_policy_mask_threshold=None, importance_sampling_level=importance_sampling_level,
        beta=beta, loss_type=loss_type, epsilon_low=epsilon,
        epsilon_high=epsilon if epsilon_high is None else epsilon_high, use_vllm=False,
        vllm_importance_sampling_correction=False, model=SimpleNamespace(training=True),
        current_gradient_accumulation_steps=1, accelerator=_Accelerator(), max_completion_length=max_completion_length,
        _entropy_bonus_enabled=False, aux_loss_enabled=False, _metrics={"train": defaultdict(list)},
        args=SimpleNamespace(use_bias_correction_kl=False, delta=None, sapo_temperature_pos=1.0,
                             sapo_temperature_neg=1.05, steps_per_generation=1),
        _get_per_token_logps_and_entropies=lambda *a, **k: (per_token, entropies, None),
    )
    m = tm.reshape(G * K, T).long()
    inputs = {"prompt_ids": torch.zeros(G * K, 1, dtype=torch.long), "prompt_mask": torch.ones(G * K, 1),
              "completion_ids": torch.zeros(G * K, T, dtype=torch.long), "completion_mask": m,
              "advantages": advantages, "old_per_token_logps": old.reshape(G * K, T),
              "ref_per_token_logps": ref.reshape(G * K, T), "num_items_in_batch": m.sum()}
    return trainer._compute_loss(None, inputs)


TRL_AGG = {"grpo": "seq-mean-token-mean", "bnpo": "token-mean", "dapo": "token-mean",
           "dr_grpo": "seq-mean-token-sum-norm"}


@pytest.mark.parametrize("loss_type", list(TRL_AGG))
@pytest.mark.parametrize("seed", [20, 21])
def test_grpo_trl_convention_is_trls_loss(loss_type, seed):
    logp, old, ref, scores, tm, _ = ragged_batch(seed)
    theirs = trl_loss(logp, old, ref, scores, tm, loss_type=loss_type, beta=0.04, epsilon_high=0.28)
    kw = {"norm_len": T} if loss_type == "dr_grpo" else {}
    ours = obj.grpo_loss(logp, old, scores, token_mask=tm, ref_logp=ref, beta=0.04, clip_eps=0.2,
                         clip_eps_high=0.28, loss_agg=TRL_AGG[loss_type], convention="trl", **kw).loss
    assert_same(ours, theirs, logp)


def test_grpo_trl_convention_default_aggregation_is_trls_default_loss_type():
    logp, old, ref, scores, tm, _ = ragged_batch(22)
    theirs = trl_loss(logp, old, ref, scores, tm, loss_type="dapo", beta=0.04)  # GRPOConfig.loss_type default
    ours = obj.grpo_loss(logp, old, scores, token_mask=tm, ref_logp=ref, beta=0.04, convention="trl").loss
    assert_same(ours, theirs, logp)


def test_dr_grpo_trl_convention_is_trls_dr_grpo_without_reward_scaling():
    logp, old, _, scores, tm, _ = ragged_batch(26)
    theirs = trl_loss(logp, old, old, scores, tm, loss_type="dr_grpo", scale_rewards="none")
    ours = obj.dr_grpo_loss(logp, old, scores, token_mask=tm, norm_len=T, convention="trl").loss
    assert_same(ours, theirs, logp)


def test_gspo_trl_convention_is_trls_sequence_level_importance_sampling():
    logp, old, _, scores, tm, _ = ragged_batch(23)
    theirs = trl_loss(logp, old, old, scores, tm, loss_type="dapo", epsilon=3e-4, epsilon_high=4e-4,
                      importance_sampling_level="sequence")
    ours = obj.gspo_loss(logp, old, scores, token_mask=tm, clip_eps=3e-4, clip_eps_high=4e-4, convention="trl").loss
    assert_same(ours, theirs, logp)


def test_sapo_trl_convention_is_trls_sapo():
    logp, old, _, scores, tm, _ = ragged_batch(24)
    theirs = trl_loss(logp, old, old, scores, tm, loss_type="sapo")
    ours = obj.sapo_loss(logp, old, scores, token_mask=tm, convention="trl").loss
    assert_same(ours, theirs, logp)


def test_cispo_trl_convention_is_trls_cispo():
    logp, old, _, scores, tm, _ = ragged_batch(25)
    theirs = trl_loss(logp, old, old, scores, tm, loss_type="cispo", epsilon_high=5.0)
    ours = obj.cispo_loss(logp, old, scores, token_mask=tm, ratio_max=5.0, convention="trl").loss
    assert_same(ours, theirs, logp)


# ----------------------------------------------------------------------------- the flags on their own


def test_bessel_std_and_singleton_flags_closed_form():
    s = torch.tensor([[0.0, 1.0, 2.0], [3.0, 5.0, 7.0]], dtype=torch.float64)
    mask = torch.tensor([[True, True, True], [False, True, False]])
    a = obj.group_advantages(s, mask, eps=1e-6, std_ddof=1, singleton="verl")
    torch.testing.assert_close(a[0], (s[0] - 1.0) / (1.0 + 1e-6))  # Bessel std of (0, 1, 2) is 1
    torch.testing.assert_close(a[1], torch.tensor([0.0, 5.0 / (1 + 1e-6), 0.0], dtype=torch.float64))
    assert obj.group_advantages(s, mask, std_ddof=1)[1].abs().max() == 0  # singleton="zero"
    with pytest.raises(ValueError, match="singleton='one'"):
        obj.group_advantages(s, singleton="one")
    with pytest.raises(ValueError, match="^std_ddof="):
        obj.group_advantages(s, std_ddof=2)


def test_dual_clip_caps_the_loss_of_negative_advantages_closed_form():
    ratio = torch.tensor([0.5, 1.0, 5.0, 5.0], dtype=torch.float64)
    adv = torch.tensor([-1.0, -1.0, -1.0, 1.0], dtype=torch.float64)
    surr = obj.clipped_surrogate(ratio, adv, 0.2, 0.2)
    out = obj.dual_clip(surr, adv, 3.0)
    # A < 0: max(min(ρA, clip(ρ)A), 3A); ρ = 5 would give −5, capped at −3. A > 0 is untouched.
    torch.testing.assert_close(out, torch.tensor([-0.8, -1.0, -3.0, 1.2], dtype=torch.float64))
    with pytest.raises(ValueError, match="^dual_clip_c="):
        obj.ppo_loss(torch.zeros(3), torch.zeros(3), torch.ones(3), dual_clip_c=1.0)
