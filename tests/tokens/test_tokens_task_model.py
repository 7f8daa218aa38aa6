"""Token tasks, the seed-batched transformer, its KV cache, and the optimizer against hand computations."""

import math

import numpy as np
import pytest
import torch

from targetpo.tokens import engine as te
from targetpo.tokens import transformer as tfm
from targetpo.objectives import tpo_target
from targetpo.optim import MuonAdamW, TorchMuonAdamW, make_optimizer, muon_shape_scale, newton_schulz
from targetpo.tokens import tasks


pytestmark = pytest.mark.usefixtures("one_torch_thread")


# ----------------------------------------------------------------------------- tasks

def test_targets_on_hand_made_prompt():
    x = torch.tensor([[0, 2, 1, 1]])
    assert tasks.targets(x, "copy", 3).tolist() == [[0, 2, 1, 1]]
    assert tasks.targets(x, "flip", 3).tolist() == [[2, 0, 1, 1]]
    assert tasks.targets(x, "reverse_copy", 3).tolist() == [[1, 1, 2, 0]]
    assert tasks.targets(x, "reverse_flip", 3).tolist() == [[1, 1, 0, 2]]
    with pytest.raises(ValueError, match="task"):
        tasks.targets(x, "rotate", 3)


def test_rewards_on_hand_made_answers():
    y = torch.tensor([1, 0, 1, 1])
    a = torch.tensor([[1, 0, 0, 1],   # wrong at t = 2
                      [1, 0, 1, 1],   # all right
                      [0, 0, 1, 1]])  # wrong at t = 0
    assert tasks.token_rewards(a, y, "bag").tolist() == [[1, 1, 0, 1], [1, 1, 1, 1], [0, 1, 1, 1]]
    assert tasks.token_rewards(a, y, "sequential").tolist() == [[1, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]]
    assert tasks.token_rewards(a, y, "terminal").tolist() == [[0, 0, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]]
    assert tasks.sequence_scores(tasks.token_rewards(a, y, "bag")).tolist() == [0.75, 1.0, 0.75]
    with pytest.raises(ValueError, match="reward"):
        tasks.token_rewards(a, y, "dense")


def test_initial_error_levels_match_the_spec():
    assert tasks.initial_error("bag", 16, 10) == pytest.approx(0.9375)
    assert tasks.initial_error("sequential", 2, 10) == pytest.approx(0.900, abs=1e-3)
    for h, e in [(5, 0.969), (7, 0.992), (8, 0.996), (10, 0.999)]:
        assert tasks.initial_error("terminal", 2, h) == pytest.approx(e, abs=1e-3)


def test_candidate_rewards_and_the_dead_prefix_rule():
    y = torch.tensor([1, 0, 1, 0])
    # candidate 0 (the behaviour) is right at t = 0, 1, wrong at t = 2, right again at t = 3
    cand = torch.tensor([[1, 0, 1], [0, 0, 1], [0, 1, 1], [0, 0, 1]])   # [H, K]
    bag = tasks.candidate_rewards(cand, y, "bag")
    seq = tasks.candidate_rewards(cand, y, "sequential")
    assert bag.tolist() == [[1, 0, 1], [1, 1, 0], [0, 1, 1], [1, 1, 0]]
    # t = 0..2 alive (prefix right so far); t = 3 comes after the behaviour's mistake at t = 2: all zero
    assert seq.tolist() == [[1, 0, 1], [1, 1, 0], [0, 1, 1], [0, 0, 0]]
    # Behaviour rewards = the sequential token rewards of the behaviour trajectory.
    assert seq[:, 0].tolist() == tasks.token_rewards(cand[:, 0], y, "sequential").tolist()
    # Dead state: u = 0, so TPO's target is p_old renormalised over the K sampled candidates.
    old = torch.log(torch.tensor([0.6, 0.6, 0.4]))
    q = tpo_target(old.unsqueeze(0), seq[3:4])
    assert torch.allclose(q[0], torch.tensor([0.375, 0.375, 0.25]), atol=1e-6)
    with pytest.raises(ValueError, match="terminal"):
        tasks.candidate_rewards(cand, y, "terminal")


def test_prompts_are_uniform_and_per_seed():
    gens = [torch.Generator().manual_seed(s) for s in (0, 1)]
    p = tasks.sample_prompts(gens, 2000, 5, 4)
    assert p.shape == (2, 2000, 5) and p.min() == 0 and p.max() == 3
    assert abs(p.float().mean().item() - 1.5) < 0.05
    alone = tasks.sample_prompts([torch.Generator().manual_seed(1)], 2000, 5, 4)
    assert torch.equal(alone[0], p[1])


# ----------------------------------------------------------------------------- model

@pytest.mark.parametrize("v, h, n", [(2, 10, 101_634), (2, 8, 101_378), (16, 10, 103_440)])
def test_parameter_count_matches_the_flax_model(v, h, n):
    assert tfm.num_params(tfm.TransformerSpec(vocab=v, max_len=2 * h)) == n


def test_partition_and_shape_scales_match_the_spec_table():
    spec = tfm.TransformerSpec(vocab=2, max_len=20)
    info = tfm.param_info(spec)
    muon = {k for k, i in info.items() if i.optimizer == "muon"}
    expect = {"tok_emb", "pos_emb", "head"} | {f"l{i}.{n}" for i in range(2)
                                                for n in ("attn.qkv_bias", "ffn.up", "ffn.down")}
    assert muon == expect
    # the 3-D attention kernels and all 1-D parameters are on AdamW
    assert info["l0.attn.qkv"].optimizer == "adamw" and info["l0.attn.qkv"].shape == (64, 3, 2, 32)
    assert info["l1.attn.out"].optimizer == "adamw" and info["l1.attn.out"].shape == (2, 32, 64)
    scale = {k: muon_shape_scale(*info[k].shape[-2:]) for k in muon}
    assert scale["tok_emb"] == pytest.approx(5.657, abs=1e-3)
    assert scale["pos_emb"] == pytest.approx(1.789, abs=1e-3)
    assert scale["l0.attn.qkv_bias"] == pytest.approx(4.0)
    assert scale["l0.ffn.up"] == pytest.approx(2.0) and scale["l0.ffn.down"] == 1.0 and scale["head"] == 1.0
    for v, s in [(4, 4.0), (8, 2.828), (16, 2.0)]:
        assert muon_shape_scale(v, 64) == pytest.approx(s, abs=1e-3)


def test_initialisation_follows_flax_defaults_and_is_per_seed():
    spec = tfm.TransformerSpec(vocab=2, max_len=20)
    p = tfm.init_params(spec, [0, 1, 2, 3])
    assert p["tok_emb"].std().item() == pytest.approx(0.125, rel=0.25)
    assert p["pos_emb"].std().item() == pytest.approx(0.02, rel=0.1)
    up = p["l0.ffn.up"]
    assert up.std().item() == pytest.approx(1 / 8, rel=0.05)                  # variance 1/fan_in
    assert up.abs().max().item() <= 2 / 8 / 0.87962566103423978 + 1e-6        # truncated at ±2σ
    assert float(p["l0.attn.qkv_bias"].abs().sum()) == 0 and float(p["ln_f.scale"].min()) == 1
    alone = tfm.init_params(spec, [2])
    assert all(torch.equal(alone[k][0], p[k][2]) for k in p)
    assert not torch.equal(p["l0.ffn.up"][0], p["l0.ffn.up"][1])


def _spec_params(v=3, h=5, seeds=(0, 1)):
    spec = tfm.TransformerSpec(vocab=v, max_len=2 * h)
    params = tfm.init_params(spec, list(seeds))
    # Larger-than-init random weights so the log-probs are far from uniform.
    g = torch.Generator().manual_seed(5)
    return spec, {k: t + 0.3 * torch.randn(t.shape, generator=g) for k, t in params.items()}


def test_model_is_causal_and_seeds_are_independent():
    spec, params = _spec_params()
    tok = torch.randint(0, 3, (2, 4, 10))
    out = tfm.forward(params, tok, spec)
    tok2 = tok.clone()
    tok2[:, :, 6:] = (tok2[:, :, 6:] + 1) % 3
    out2 = tfm.forward(params, tok2, spec)
    assert torch.allclose(out[:, :, :6], out2[:, :, :6], atol=1e-6) and not torch.allclose(out, out2)
    one = tfm.forward({k: v[1:] for k, v in params.items()}, tok[1:], spec)
    assert torch.allclose(one[0], out[1], atol=1e-5)
    assert torch.allclose(out.exp().sum(-1), torch.ones(()), atol=1e-5)


@pytest.mark.parametrize("streams, candidates", [(1, 1), (4, 1), (1, 3)])
def test_kv_cached_sampler_matches_a_full_forward(streams, candidates):
    spec, params = _spec_params()
    gens = [torch.Generator().manual_seed(s) for s in (0, 1)]
    prompts = torch.randint(0, 3, (2, 6, 5))
    actions, logp, cand, cand_lp = te.rollout(params, spec, prompts, streams, candidates, gens)
    assert actions.shape == (2, 6, streams, 5)
    seq = torch.cat([prompts.unsqueeze(2).expand(-1, -1, streams, -1), actions], dim=-1).reshape(2, 6 * streams, 10)
    full = tfm.forward(params, seq, spec)[:, :, 4:9].reshape(2, 6, streams, 5, 3)
    ref = full.gather(-1, actions.unsqueeze(-1)).squeeze(-1)
    assert torch.allclose(logp, ref, atol=1e-5)
    # the training pass (prompt cache shared by the G answers) gives the same log-probs with gradients
    assert torch.allclose(te.answer_logp(params, spec, prompts, actions), full, atol=1e-5)
    if candidates > 1:
        assert cand.shape == (2, 6, 5, candidates) and torch.equal(cand[..., 0], actions[:, :, 0])
        assert torch.allclose(cand_lp, full[:, :, 0].gather(-1, cand), atol=1e-5)


def test_one_pass_gives_every_prefix_states_distribution():
    """The authors run one forward per prefix state on a zero-padded buffer; one pass over the behaviour
    trajectory gives the same next-token distributions (what the engine trains token-level methods with)."""
    spec, params = _spec_params()
    h = 5
    prompts = torch.randint(0, 3, (2, 3, h))
    actions = torch.randint(0, 3, (2, 3, 1, h))
    ours = te.answer_logp(params, spec, prompts, actions)[:, :, 0]                # [S, B, H, V]
    for t in range(h):
        buf = torch.zeros(2, 3, 2 * h, dtype=torch.long)
        buf[:, :, :h] = prompts
        buf[:, :, h:h + t] = actions[:, :, 0, :t]
        per_state = tfm.forward(params, buf, spec)[:, :, h - 1 + t]
        assert torch.allclose(ours[:, :, t], per_state, atol=1e-5)


def test_sampler_frequencies_follow_the_probabilities():
    logp = torch.log(torch.tensor([0.1, 0.6, 0.3])).expand(1, 3)
    u = torch.rand(1, 200_000, generator=torch.Generator().manual_seed(0))
    idx = te.sample_tokens(logp, u)
    freq = torch.bincount(idx.flatten(), minlength=3).float() / idx.numel()
    assert torch.allclose(freq, torch.tensor([0.1, 0.6, 0.3]), atol=5e-3)


# ----------------------------------------------------------------------------- optimizer

def _ns_np(x, steps=5, coeffs=(3.4445, -4.7750, 2.0315), eps=1e-8):
    t = x.shape[0] > x.shape[1]
    if t:
        x = x.T
    x = x / (np.linalg.norm(x) + eps)
    a, b, c = coeffs
    for _ in range(steps):
        A = x @ x.T
        x = a * x + (b * A + c * A @ A) @ x
    return x.T if t else x


def test_optimizer_matches_a_hand_computation_of_optax_muon():
    """Three optax-0.2.8 `contrib.muon` steps written out in float64 numpy, per seed and per matrix."""
    spec = tfm.TransformerSpec(vocab=4, max_len=6, d_model=8, heads=2, layers=1, ffn_mult=2)
    info = tfm.param_info(spec)
    params = tfm.init_params(spec, [0, 1])
    ref = {k: v.double().numpy().copy() for k, v in params.items()}
    lr, beta, b1, b2 = 1e-3, 0.95, 0.9, 0.999
    opt = MuonAdamW(params, info, lr)
    mu = {k: np.zeros_like(v) for k, v in ref.items()}
    m = {k: np.zeros_like(v) for k, v in ref.items()}
    vv = {k: np.zeros_like(v) for k, v in ref.items()}
    g = torch.Generator().manual_seed(3)
    for t in range(1, 4):
        grads = {k: torch.randn(v.shape, generator=g) for k, v in params.items()}
        opt.step(params, grads)
        for k, i in info.items():
            gr = grads[k].double().numpy()
            if i.optimizer == "muon":
                mu[k] = beta * mu[k] + (1 - beta) * gr
                mhat = beta * mu[k] / (1 - beta ** (t + 1)) + (1 - beta) * gr / (1 - beta ** t)
                r, c = i.shape[-2:]
                mats = mhat.reshape(-1, r, c)
                upd = np.stack([_ns_np(mm) for mm in mats]).reshape(mhat.shape)
                ref[k] -= lr * math.sqrt(max(1.0, c / r)) * upd
            else:
                m[k] = b1 * m[k] + (1 - b1) * gr
                vv[k] = b2 * vv[k] + (1 - b2) * gr ** 2
                mhat = b1 * m[k] / (1 - b1 ** (t + 1)) + (1 - b1) * gr / (1 - b1 ** t)
                vhat = vv[k] / (1 - b2 ** t)
                ref[k] -= lr * mhat / (np.sqrt(vhat) + 1e-8)
    for k in params:
        assert np.allclose(params[k].double().numpy(), ref[k], atol=2e-6, rtol=1e-5), k
    assert not torch.equal(params["ln_f.scale"], torch.ones_like(params["ln_f.scale"]))


def test_muon_full_step_norm_shrinks_only_small_steps():
    """τ = full_step_norm scales each seed's Muon step by min(1, ‖M̂‖/τ); AdamW is untouched; τ = 0 is optax's
    Muon, whose step keeps its full length when the gradient vanishes."""
    spec = tfm.TransformerSpec(vocab=4, max_len=6, d_model=8, heads=2, layers=1, ffn_mult=2)
    info = tfm.param_info(spec)
    params = tfm.init_params(spec, [0, 1])
    g = torch.Generator().manual_seed(5)
    first = {k: torch.randn(v.shape, generator=g) for k, v in params.items()}
    # Seed 1's gradient 1e-6 of seed 0's: optax's Muon gives both the same step length.
    first = {k: v * torch.tensor([1.0, 1e-6]).view(2, *[1] * (v.dim() - 1)) for k, v in first.items()}
    zero = {k: torch.zeros_like(v) for k, v in params.items()}
    muon = [k for k, i in info.items() if i.optimizer == "muon"]
    adam = [k for k, i in info.items() if i.optimizer == "adamw"]

    def norms(upd, keys):
        return torch.stack([upd[k].reshape(2, -1).square().sum(1) for k in keys]).sum(0).sqrt()

    plain, tiny, damped = (MuonAdamW(params, info, 1e-3, full_step_norm=tau) for tau in (0.0, 1e-12, 1.0))
    up, ut, ud = plain.updates(first), tiny.updates(first), damped.updates(first)
    for k in params:
        torch.testing.assert_close(ut[k], up[k])           # τ far below ‖M̂‖: the paper's step
    for k in adam:
        torch.testing.assert_close(ud[k], up[k])
    # Step 1: μ = (1−β)g, so M̂ = βμ/(1−β²) + g = g·(1+2β)/(1+β).
    mhat_norm = torch.stack([first[k].reshape(2, -1).square().sum(1) for k in muon]).sum(0).sqrt() * 2.9 / 1.95
    torch.testing.assert_close(norms(ud, muon), norms(up, muon) * mhat_norm.clamp(max=1.0), rtol=1e-4, atol=0)
    assert norms(up, muon)[1] > 0.5 * norms(up, muon)[0]   # optax: full length for a 1e-6 gradient
    assert norms(ud, muon)[1] < 1e-3 * norms(up, muon)[1]
    # Zero gradients afterwards: optax keeps stepping along the momentum at full length, τ > 0 winds down.
    for _ in range(20):
        up, ud = plain.updates(zero), damped.updates(zero)
    assert norms(up, muon)[0] > 0.5 * norms(plain.updates(first), muon)[0]
    assert norms(ud, muon)[0] < 0.5 * norms(up, muon)[0]
    with pytest.raises(ValueError, match="full_step_norm"):
        MuonAdamW(params, info, 1e-3, full_step_norm=-1.0)
    with pytest.raises(ValueError, match="optax"):
        make_optimizer("torch", params, info, 1e-3, muon_full_step_norm=0.1)
    with pytest.raises(ValueError, match="muon_full_step_norm"):
        te.TrialConfig(optimizer="torch", muon_full_step_norm=0.1).validate()


def test_newton_schulz_orthogonalises_per_matrix():
    x = torch.randn(6, 4, 9, generator=torch.Generator().manual_seed(0))
    o = newton_schulz(x * torch.tensor([1e-3, 1, 10, 1e3, 1, 1]).view(6, 1, 1))
    sv = torch.linalg.svdvals(o)
    assert sv.min() > 0.5 and sv.max() < 1.3      # the quintic's known band around 1
    # scale-invariant per matrix (Frobenius pre-normalisation), transpose-equivariant
    assert torch.allclose(newton_schulz(x[:1] * 7), newton_schulz(x[:1]), atol=1e-5)
    assert torch.allclose(newton_schulz(x[:1].transpose(1, 2)), newton_schulz(x[:1]).transpose(1, 2), atol=1e-5)


def test_torch_muon_option_first_step_equals_orthogonalised_gradient():
    spec = tfm.TransformerSpec(vocab=4, max_len=6, d_model=8, heads=2, layers=1, ffn_mult=2)
    info = tfm.param_info(spec)
    params = tfm.init_params(spec, [0, 1])
    before = {k: v.clone() for k, v in params.items()}
    grads = {k: torch.randn(v.shape, generator=torch.Generator().manual_seed(1)) for k, v in params.items()}
    TorchMuonAdamW(params, info, 1e-3).step(params, grads)
    r, c = info["l0.ffn.up"].shape
    delta = params["l0.ffn.up"] - before["l0.ffn.up"]
    expect = -1e-3 * math.sqrt(max(1, c / r)) * newton_schulz(grads["l0.ffn.up"])
    # torch.optim.Muon runs Newton–Schulz in bfloat16: equal to ~1%, not to float32 precision
    cos = torch.nn.functional.cosine_similarity(delta.flatten(1), expect.flatten(1)).min()
    assert cos > 0.999 and torch.allclose(delta.norm(), expect.norm(), rtol=0.03)
    # AdamW's first step is lr·sign(g) (bias-corrected m/√v = g/|g|)
    d_ln = params["ln_f.bias"] - before["ln_f.bias"]
    assert torch.allclose(d_ln, -1e-3 * grads["ln_f.bias"].sign(), atol=1e-6)


@pytest.mark.parametrize("kind", ["optax", "torch"])
def test_optimizers_refuse_bad_parameters_and_gradients_before_moving_their_state(kind, tiny_model):
    """A transposed gradient of the right size was stepped as if it were right; a wrong size failed mid-step
    after the Muon momentum and the step count had moved. Both are now refused up front, naming the tensor."""
    info, params = tiny_model
    opt = make_optimizer(kind, params, info, 1e-3)
    before = {k: v.clone() for k, v in params.items()}
    grads = {k: torch.ones_like(v) for k, v in params.items()}
    for bad, match in [({"l0.ffn.up": torch.ones(2, *info["l0.ffn.up"].shape[::-1])}, r"grads\['l0.ffn.up'\]"),
                       ({"ln_f.bias": torch.ones(2, 9)}, r"grads\['ln_f.bias'\] has shape \(2, 9\)")]:
        with pytest.raises(ValueError, match=match):
            opt.step(params, grads | bad)
    with pytest.raises(ValueError, match="disagree on names.*head_bias"):
        opt.step(params, {k: v for k, v in grads.items() if k != "head_bias"})
    if kind == "optax":
        assert opt.count == 0 and not opt.mu.any() and not opt.m.any()
    assert all(torch.equal(params[k], before[k]) for k in params)
    opt.step(params, grads)                                   # and a right step still goes through
    assert not torch.equal(params["l0.ffn.up"], before["l0.ffn.up"])
    # Parameters that do not match their infos, or a rate that is not a finite positive number.
    cases = [({**params, "head": params["head"][:1]}, 1e-3, r"params\['head'\] has shape \(1,"),
             (params, 0.0, "lr=0.0: must be a finite number > 0"),
             (params, float("inf"), "lr=inf"), (params, True, "lr=True")]
    for ps, lr, match in cases:
        with pytest.raises(ValueError, match=match):
            make_optimizer(kind, ps, info, lr)
    with pytest.raises(ValueError, match="at least one parameter"):
        make_optimizer(kind, {}, {}, 1e-3)


def test_optimizer_infos_must_say_how_a_parameter_splits_into_matrices():
    """`matrices` is what the Muon branch's split relies on: a shape that is not `matrices` dims + one matrix
    (a 1-D Muon leaf, a 4-D one with matrices=0) or an AdamW leaf with matrices set is refused."""
    from targetpo.optim import ParamInfo
    for info, match in [(ParamInfo((5,), "muon", "zeros"), "matrices=0 on muon"),
                        (ParamInfo((2, 3, 4, 5), "muon", "zeros"), "matrices=0 on muon"),
                        (ParamInfo((3, 4), "adamw", "zeros", matrices=1), "matrices=1 on adamw"),
                        (ParamInfo((3, 4), "sgd", "zeros"), "must be one of")]:
        with pytest.raises(ValueError, match=match):
            MuonAdamW({"w": torch.zeros(2, *info.shape)}, {"w": info}, 1e-3)
    with pytest.raises(ValueError, match="full_step_norm=inf"):
        MuonAdamW({"w": torch.zeros(2, 3, 4)}, {"w": ParamInfo((3, 4), "muon", "zeros")}, 1e-3,
                  full_step_norm=float("inf"))
    with pytest.raises(ValueError, match="steps=-1"):
        newton_schulz(torch.ones(1, 2, 2), steps=-1)


def test_torch_optimizer_steps_the_parameter_itself_or_refuses():
    """A non-contiguous stacked Muon parameter made `reshape` copy: the optimizer stepped the copy and the
    parameter never moved. It is refused; a model with one branch only (no AdamW leaf) steps."""
    from targetpo.optim import ParamInfo
    info = {"qkvb": ParamInfo((3, 2, 8), "muon", "zeros", matrices=1)}
    with pytest.raises(ValueError, match="contiguous"):
        TorchMuonAdamW({"qkvb": torch.randn(3, 2, 2, 8).transpose(0, 1)}, info, 1e-2)
    p = {"qkvb": torch.randn(2, 3, 2, 8)}
    before = p["qkvb"].clone()
    TorchMuonAdamW(p, info, 1e-2).step(p, {"qkvb": torch.randn(2, 3, 2, 8)})
    assert not torch.equal(p["qkvb"], before)


def test_training_pass_is_exact_with_repeated_prompts_and_answers():
    """answer_logp runs each distinct prompt and (prompt, answer) once; duplicates must get identical values
    and the summed gradient of all their copies. Exact in float64; in float32 the two orders of summation
    round apart by a few ulps of the gradients' scale (up to ~60 here: 1.2e-4 absolute on an AVX-512 CPU)."""
    spec, params = _spec_params(v=2, h=4)
    prompts = torch.randint(0, 2, (2, 8, 4), generator=torch.Generator().manual_seed(1))
    prompts[:, 4:] = prompts[:, :4]                                           # every prompt twice
    actions = torch.randint(0, 2, (2, 8, 3, 4), generator=torch.Generator().manual_seed(2))
    actions[:, :, 2] = actions[:, :, 0]                                       # repeated answers
    seq = torch.cat([prompts.unsqueeze(2).expand(-1, -1, 3, -1), actions], dim=-1).reshape(2, 24, 8)
    for dtype, tol in ((torch.float64, 1e-12), (torch.float32, 1e-5)):
        p1 = {k: v.to(dtype).clone().requires_grad_(True) for k, v in params.items()}
        p2 = {k: v.to(dtype).clone().requires_grad_(True) for k, v in params.items()}
        full = tfm.forward(p1, seq, spec)[:, :, 3:7].reshape(2, 8, 3, 4, 2)
        ours = te.answer_logp(p2, spec, prompts, actions)
        torch.testing.assert_close(ours, full, rtol=0, atol=tol)
        w = torch.randn(full.shape, generator=torch.Generator().manual_seed(3)).to(dtype)
        g1 = torch.autograd.grad((full * w).sum(), list(p1.values()))
        g2 = torch.autograd.grad((ours * w).sum(), list(p2.values()))
        for a, b in zip(g1, g2):  # relative to each gradient's scale
            torch.testing.assert_close(b, a, rtol=0, atol=tol * float(a.abs().max()))


@pytest.mark.parametrize("method, seeds", [("ppo", [0, 1]), ("tpo_token", [0, 1, 2])])
def test_a_token_run_gives_the_same_numbers_with_any_thread_count(method, seeds):
    """torch's CPU softmax backward splits its rows between threads in vectorised blocks: the attention's
    gradients rounded differently with 1 and 2 threads, and the authors' smoke configuration ended at PPO error
    0.380 with one thread and 0.299 with two (the runner picks the idle cores, so a run's numbers depended on
    the machine's load when it started). Likewise advanced indexing's backward (`index_put_` with accumulate,
    the gathers of cached rows and of position embeddings) splits its rows over the threads: with 3 seeds on 2
    threads the middle seed's gradients rounded differently from the first episode on (BENCHMARKS.md)."""
    cfg = te.TrialConfig(task="reverse_copy", reward="bag", length=10, vocab=2, batch=100, k=8, episodes=3)
    before = torch.get_num_threads()
    try:
        runs = []
        for threads in (1, 2):
            torch.set_num_threads(threads)
            runs.append(te.run_trial(cfg, method, seeds))
    finally:
        torch.set_num_threads(before)
    for key in runs[0]:
        np.testing.assert_array_equal(runs[0][key], runs[1][key], err_msg=key)
