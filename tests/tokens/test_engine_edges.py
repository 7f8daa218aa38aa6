"""The token model against an independent plain implementation, and the engine's wiring that end-to-end curves
cannot see: which random stream feeds what, which epoch's gradient is reported, the diagnostics of every
rollout kind, the sampler's edges and the row-id fallback."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from targetpo import objectives as obj
from targetpo.tokens import engine as te
from targetpo.tokens import tasks
from targetpo.tokens import transformer as tfm

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SMALL = dict(length=4, vocab=2, batch=6, k=4, episodes=1, epochs=2)


# ----------------------------------------------------------------------------- the model, written out plainly

def _plain_layer_norm(x, scale, bias, eps):
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(var + eps) * scale + bias


def _plain_gelu_tanh(x):
    return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def _plain_forward(p, tokens, spec):
    """One seed's Flax CausalTransformer (docs/method.md §4) on one sequence [T], no batching tricks:
    next-token log-probs [T, V]."""
    t, hd = tokens.shape[0], spec.head_dim
    x = p["tok_emb"][tokens] + p["pos_emb"][:t]
    causal = torch.ones(t, t, dtype=torch.bool).tril()
    for i in range(spec.layers):
        pre = f"l{i}."
        y = _plain_layer_norm(x, p[pre + "ln1.scale"], p[pre + "ln1.bias"], spec.ln_eps)
        heads = []
        for h in range(spec.heads):
            q, k, v = (y @ p[pre + "attn.qkv"][:, j, h] + p[pre + "attn.qkv_bias"][j, h] for j in range(3))
            scores = (q @ k.T / math.sqrt(hd)).masked_fill(~causal, float("-inf"))
            heads.append(torch.softmax(scores, -1) @ v @ p[pre + "attn.out"][h])
        x = x + sum(heads) + p[pre + "attn.out_bias"]
        y = _plain_layer_norm(x, p[pre + "ln2.scale"], p[pre + "ln2.bias"], spec.ln_eps)
        x = x + _plain_gelu_tanh(y @ p[pre + "ffn.up"] + p[pre + "ffn.up_bias"]) @ p[pre + "ffn.down"] \
            + p[pre + "ffn.down_bias"]
    x = _plain_layer_norm(x, p["ln_f.scale"], p["ln_f.bias"], spec.ln_eps)
    return torch.log_softmax(x @ p["head"] + p["head_bias"], -1)


def _random_params(spec, seeds=(0, 1)):
    """float64 parameters with every scale, bias and embedding random (at init the biases are 0 and the
    LayerNorm scales 1, which would hide their wiring)."""
    params = tfm.init_params(spec, list(seeds), dtype=torch.float64)
    g = torch.Generator().manual_seed(11)
    return {k: v + 0.3 * torch.randn(v.shape, generator=g, dtype=torch.float64) for k, v in params.items()}


@pytest.mark.parametrize("ln_eps", [1e-6, 0.5])
def test_forward_matches_a_plain_implementation_of_the_flax_model(ln_eps):
    spec = tfm.TransformerSpec(vocab=3, max_len=10, heads=2, ln_eps=ln_eps)
    params = _random_params(spec)
    tokens = torch.randint(0, 3, (2, 3, 9), generator=torch.Generator().manual_seed(1))
    ours = tfm.forward(params, tokens, spec)
    for s in range(2):
        p = {k: v[s] for k, v in params.items()}
        for n in range(3):
            torch.testing.assert_close(ours[s, n], _plain_forward(p, tokens[s, n], spec), rtol=0, atol=1e-10)


def test_the_gelu_is_the_tanh_approximation_and_eps_is_read_from_the_spec():
    """Differences the float64 comparison above resolves: the exact (erf) GELU, and a LayerNorm eps other than
    the spec's, each move the log-probs by far more than its 1e-10."""
    spec = tfm.TransformerSpec(vocab=3, max_len=10)
    params = _random_params(spec, seeds=(0,))
    p = {k: v[0] for k, v in params.items()}
    tokens = torch.tensor([0, 2, 1, 1, 0, 2])
    ours = tfm.forward(params, tokens.view(1, 1, -1), spec)[0, 0]
    x = torch.linspace(-3, 3, 101, dtype=torch.float64)
    assert (F.gelu(x) - _plain_gelu_tanh(x)).abs().max() > 1e-4
    other = tfm.TransformerSpec(vocab=3, max_len=10, ln_eps=1e-5)
    assert (ours - _plain_forward(p, tokens, other)).abs().max() > 1e-8


def test_the_cpu_gelu_is_the_tanh_gelu_with_its_gradient():
    """The FFN's GELU on a CPU is x·σ(2z) with a hand-written backward (transformer._GeluTanh): in float64 its
    values and gradients are the tanh formula's (and finite differences'); in float32 it is within rounding of
    F.gelu(approximate="tanh"); without autograd (sampling) it gives the training pass's values bit for bit."""
    x = torch.linspace(-12, 8, 2001, dtype=torch.float64).requires_grad_(True)
    ours, plain = tfm._gelu(x), _plain_gelu_tanh(x)
    torch.testing.assert_close(ours, plain, rtol=1e-12, atol=1e-14)  # the tanh form cancels below x ≈ −10
    g = torch.randn(x.shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    (d_ours,) = torch.autograd.grad(ours, x, g)
    (d_plain,) = torch.autograd.grad(plain, x, g)
    torch.testing.assert_close(d_ours, d_plain, rtol=1e-10, atol=1e-12)
    assert torch.autograd.gradcheck(tfm._GeluTanh.apply, (x[::97].detach().clone().requires_grad_(True),))
    (once,) = torch.autograd.grad(tfm._gelu(x).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError):  # its saved σ is a constant: no silently wrong second derivative
        once.sum().backward()

    x32 = (4 * torch.randn(4, 300, 256, generator=torch.Generator().manual_seed(1))).requires_grad_(True)
    y32 = tfm._gelu(x32)
    ref = F.gelu(x32, approximate="tanh")
    assert (y32 - ref).abs().max() < 2e-6
    g32 = torch.randn(x32.shape, generator=torch.Generator().manual_seed(2))
    (d32,) = torch.autograd.grad(y32, x32, g32)
    (dref,) = torch.autograd.grad(ref, x32, g32)
    assert ((d32 - dref).abs() / (1 + g32.abs())).max() < 2e-5
    with torch.no_grad():
        assert torch.equal(tfm._gelu(x32), y32)
    # Where 1 + tanh z cancels (to 0 in float32 from x ≈ −5, in float64 from x ≈ −8), x·σ(2z) keeps float32's
    # relative precision: the reference is 0.5·(1 + tanh z) = σ(2z) through float64's log-sigmoid.
    tail = torch.linspace(-9, -5, 41)
    t64 = tail.double()
    exact = t64 * F.logsigmoid(2 * math.sqrt(2 / math.pi) * (t64 + 0.044715 * t64 ** 3)).exp()
    assert ((tfm._gelu(tail).double() - exact).abs() / exact.abs()).max() < 1e-5


def test_extend_over_a_prefix_shared_by_several_rows_matches_a_full_forward():
    """g = N // P > 1 rows attend to one cached prompt as a block with a block-diagonal causal mask: no row may
    see another's tokens, and the heads and rows must come back in place."""
    spec = tfm.TransformerSpec(vocab=3, max_len=11, heads=2)
    params = _random_params(spec)
    gen = torch.Generator().manual_seed(2)
    prompts = torch.randint(0, 3, (2, 2, 5), generator=gen)
    answers = torch.randint(0, 3, (2, 6, 4), generator=gen)                   # 3 rows per prompt
    _, prefix = tfm.prefill(params, prompts, spec)
    ours, kv = tfm.extend(params, answers, spec, start=5, prefix=prefix, keep_kv=True)
    full = torch.cat([prompts.repeat_interleave(3, dim=1), answers], dim=-1)
    torch.testing.assert_close(ours, tfm.forward(params, full, spec)[:, :, 5:], rtol=0, atol=1e-10)
    # then a second step over the prefix and the rows' own past
    more = torch.randint(0, 3, (2, 6, 2), generator=gen)
    nxt, _ = tfm.extend(params, more, spec, start=9, prefix=prefix, past=kv)
    full = torch.cat([full, more], dim=-1)
    torch.testing.assert_close(nxt, tfm.forward(params, full, spec)[:, :, 9:], rtol=0, atol=1e-10)


def test_extend_refuses_caches_that_do_not_end_where_the_new_tokens_start():
    spec = tfm.TransformerSpec(vocab=2, max_len=12)
    params = tfm.init_params(spec, [0])
    _, prefix = tfm.prefill(params, torch.zeros(1, 1, 5, dtype=torch.long), spec)
    for start in (4, 6, 7):  # short of, and past, the 5 cached positions
        with pytest.raises(ValueError, match="cover 5 positions but the new tokens start at"):
            tfm.extend(params, torch.zeros(1, 1, 2, dtype=torch.long), spec, start=start, prefix=prefix)


# ----------------------------------------------------------------------------- the sampler's edges

def test_sampler_never_draws_a_zero_probability_token():
    logp = torch.log(torch.tensor([[0.0, 1.0, 0.0]]))
    u = torch.tensor([[0.0, 0.5, 1.0 - 2 ** -24]])
    assert te.sample_tokens(logp, u).tolist() == [[1, 1, 1]]


def test_sampler_stays_in_the_vocabulary_when_the_cdf_rounds_below_one():
    logp = torch.log(torch.full((1, 3), 1 / 3))
    assert logp.exp().cumsum(-1)[0, -1] < 1  # float32: 0.99999994
    u = torch.tensor([[1.0 - 2 ** -24]])     # the largest float32 torch.rand can draw
    assert te.sample_tokens(logp, u).tolist() == [[2]]


# ----------------------------------------------------------------------------- rows, streams, epochs

def test_row_ids_fallback_beyond_62_bits_tells_rows_apart_by_every_column():
    x = torch.tensor([[[1, 2, 3], [1, 2, 4], [1, 2, 3], [0, 2, 3], [1, 5, 3]]])
    radices = [2 ** 21] * 3                                                  # 63 bits: the unique() fallback
    ids = te._row_ids(x, radices)
    same = (x[0, :, None] == x[0, None]).all(-1)
    assert torch.equal(ids[0, :, None] == ids[0, None], same)
    assert torch.equal(te._row_ids(x, [8] * 3)[0, :, None] == te._row_ids(x, [8] * 3)[0, None], same)


def _by_hand(cfg, method, seeds):
    """Episode 0 of run_trial rebuilt from its documented streams: prompts from stream 1, sampling from 2, score
    noise from 3, the gradient of loss_fn at the initial parameters."""
    spec = te.model_spec(cfg)
    params = {k: v.requires_grad_(True) for k, v in tfm.init_params(spec, seeds).items()}
    prompts = tasks.sample_prompts(te._generators(seeds, 1, "cpu"), te.method_batch(cfg, method), cfg.length,
                                   cfg.vocab)
    noise = te._generators(seeds, 3, "cpu") if cfg.score_noise > 0 else None
    batch = te.collect(params, spec, cfg, method, prompts, te._generators(seeds, 2, "cpu"), noise)
    grads = torch.autograd.grad(te.loss_fn(params, spec, cfg, method, batch), list(params.values()))
    return batch, te._grad_norm(grads)


@pytest.mark.parametrize("method, reward, extra", [("tpo_token", "bag", {}), ("ppo", "bag", {}),
                                                   ("tpo", "partial", {"score_noise": 0.3})])
def test_run_trial_draws_prompts_samples_and_noise_from_their_own_streams(method, reward, extra):
    cfg = te.TrialConfig(**SMALL, reward=reward, **extra)
    seeds = [3, 5]
    batch, norm = _by_hand(cfg, method, seeds)
    out = te.run_trial(cfg, method, seeds)
    np.testing.assert_array_equal(out["error"][0], batch.error.numpy())
    expected = te.diagnostics(cfg, method, batch)
    for k in ("weight_winners", "weight_losers"):  # the noisy scores reach TPO's target
        np.testing.assert_array_equal(out[k][0], expected[k].numpy())
    # grad_norm is the first epoch's (at the initial parameters), not the last one's
    np.testing.assert_allclose(out["grad_norm"][0], norm.numpy(), rtol=1e-6)


def test_ppo_ratio_is_against_the_rollout_log_probs_in_later_epochs():
    cfg = te.TrialConfig(**SMALL, reward="bag")
    seeds = [0, 1]
    batch, _ = _by_hand(cfg, "ppo", seeds)
    spec = te.model_spec(cfg)
    g = torch.Generator().manual_seed(4)
    moved = {k: v + 0.5 * torch.randn(v.shape, generator=g) for k, v in tfm.init_params(spec, seeds).items()}
    lp = te.answer_logp(moved, spec, batch.prompts, batch.actions)[:, :, 0]
    lp = lp.gather(-1, batch.actions[:, :, 0].unsqueeze(-1)).squeeze(-1)
    expect = obj.ppo_loss(lp, batch.old_logp[:, :, 0], batch.adv, clip_eps=cfg.clip_eps).loss * 2
    torch.testing.assert_close(te.loss_fn(moved, spec, cfg, "ppo", batch), expect)
    assert not torch.allclose(lp, batch.old_logp[:, :, 0], atol=1e-2)  # the ratio really moved


# ----------------------------------------------------------------------------- per-kind diagnostics

def test_single_sample_advantage_is_the_per_position_batch_mean_baseline():
    cfg = te.TrialConfig(**SMALL, reward="bag")
    batch, _ = _by_hand(cfg, "ppo", [0, 1])
    r = batch.rewards[:, :, 0]                                               # [S, B, H]
    torch.testing.assert_close(batch.adv, r - r.mean(dim=1, keepdim=True))


def _single_batch(cfg, method):
    """A hand-made single-sample batch of one seed: answer 0 exactly right, answer 1 right but for its last
    token, the others wrong everywhere."""
    batch, _ = _by_hand(cfg, method, [0])
    target = tasks.targets(batch.prompts, cfg.task, cfg.vocab)              # [1, B, H]
    acts = (1 - target).clone()
    acts[0, 0] = target[0, 0]
    acts[0, 1, :-1] = target[0, 1, :-1]
    batch.actions = acts.unsqueeze(2)
    batch.rewards = tasks.token_rewards(batch.actions, target.unsqueeze(2), cfg.reward)
    r = batch.rewards[:, :, 0]
    batch.adv = r - obj.batch_mean_baseline(r, dim=1)
    return batch


@pytest.mark.parametrize("method", ["ppo", "dg", "reinforce"])
def test_single_sample_diagnostics_on_a_hand_made_batch(method):
    cfg = te.TrialConfig(**SMALL, reward="bag", dg_eta=0.7)
    b = _single_batch(cfg, method)
    d = te.diagnostics(cfg, method, b)
    # success is an exact match (answer 0), not a positive advantage (answer 1 has one too)
    assert b.adv[0, 1].sum() > 0
    assert d["frac_success"].item() == pytest.approx(1 / 6) and d["all_fail"].item() == pytest.approx(5 / 6)
    w = b.adv if method != "dg" else obj.delight_gate(b.old_logp[:, :, 0], b.adv, 0.7) * b.adv
    w = w.abs().mean(-1)[0]                                                   # mean over positions, per answer
    assert d["weight_winners"].item() == pytest.approx(w[0].item(), rel=1e-6)
    assert d["weight_losers"].item() == pytest.approx(w[1:].mean().item(), rel=1e-6)
    assert "frac_zero_var" not in d


def test_group_pg_weight_is_u_over_eta():
    cfg = te.TrialConfig(**(SMALL | {"length": 2}), reward="terminal", tpo_eta=0.5)
    batch, _ = _by_hand(cfg, "group_pg", [0])
    target = tasks.targets(batch.prompts, cfg.task, cfg.vocab)
    acts = (1 - target).unsqueeze(2).expand(-1, -1, 4, -1).clone()
    acts[0, 0, 1] = target[0, 0]                                              # one winner in group 0
    batch.actions = acts
    batch.scores = tasks.sequence_scores(tasks.token_rewards(acts, target.unsqueeze(2), "terminal"))
    d = te.diagnostics(cfg, "group_pg", batch)
    u = obj.standardize_scores(batch.scores)
    assert d["weight_winners"].item() == pytest.approx(u[0, 0, 1].abs().item() / 0.5, rel=1e-6)
    assert d["weight_winners"].item() == pytest.approx(math.sqrt(3) / 0.5, rel=1e-6)  # u = √3 for 1 of 4


def test_an_all_wrong_token_batch_has_no_success_and_nan_winner_weight():
    cfg = te.TrialConfig(**SMALL, reward="bag")
    batch, _ = _by_hand(cfg, "tpo_token", [0, 1])
    batch.cand_rewards = torch.zeros_like(batch.cand_rewards)
    d = te.diagnostics(cfg, "tpo_token", batch)
    assert d["frac_success"].tolist() == [0.0, 0.0] and d["all_fail"].tolist() == [1.0, 1.0]
    assert d["frac_zero_var"].tolist() == [1.0, 1.0]
    assert torch.isnan(d["weight_winners"]).all() and torch.isfinite(d["weight_losers"]).all()


def test_candidate_rewards_refuse_rewards_without_per_state_credit():
    cand = torch.zeros(1, 3, 2, dtype=torch.long)
    for reward in ("terminal", "partial"):
        with pytest.raises(ValueError, match="need reward 'bag' or 'sequential'"):
            tasks.candidate_rewards(cand, torch.zeros(1, 3, dtype=torch.long), reward)
