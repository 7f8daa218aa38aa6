"""Baselines against hand computations: clipping on hand-made ratios, normalisers, advantages, gates, β(p)."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from targetpo import objectives as O
from targetpo.objectives.tpo import one_hot_lambda
from targetpo.tabular.bandit import beta_dg, beta_tpo, correct_direction, exact_update



pytestmark = pytest.mark.usefixtures("float64")  # tests/objectives/conftest.py


# ----------------------------------------------------------------------------- exact tabular updates (paper App. B)

def _policy(p, k=10):
    probs = torch.full((1, k), (1 - p) / (k - 1))
    probs[0, 0] = p
    return probs


def test_tpo_one_hot_update_is_beta_times_correct_direction():
    probs = _policy(0.1)
    g = exact_update("tpo", probs)
    v = correct_direction(probs)
    beta = g[0, 0] / v[0, 0]
    torch.testing.assert_close(g, beta * v)
    assert abs(beta.item() - 0.730) < 5e-4
    assert abs(beta_tpo(torch.tensor(0.1), 10).item() - beta.item()) < 1e-12
    assert one_hot_lambda(10) == pytest.approx(math.exp(10 / 3)) == pytest.approx(28.03, rel=1e-3)  # λ = e^{K/√(K−1)}


@settings(max_examples=40, deadline=None)
@given(p=st.floats(0.001, 0.99), k=st.integers(3, 30), eta=st.floats(0.25, 4.0))
def test_property_beta_coefficients_match_closed_forms(p, k, eta):
    probs = _policy(p, k)
    v = correct_direction(probs)
    pt = torch.tensor(p)
    # App. B's closed forms, written out here rather than taken from the code under test.
    lam = math.exp(k / math.sqrt(k - 1))
    for method, beta in [("pg", pt), ("dg", pt / (1 + pt)), ("grpo", torch.sqrt(pt / (1 - pt))),
                         ("tpo", pt * (lam - 1) / (1 - pt + lam * pt))]:
        # TPO anchors on log(π + 1e-8) as the authors' code does, hence the 1e-5 relative tolerance.
        torch.testing.assert_close(exact_update(method, probs), beta * v, atol=1e-8, rtol=1e-5)
    # DG at any η: p·σ(−log p / η) = p / (1 + p^{1/η}).
    torch.testing.assert_close(beta_dg(pt, eta), pt / (1 + pt ** (1 / eta)))
    torch.testing.assert_close(exact_update("dg", probs, eta=eta), pt / (1 + pt ** (1 / eta)) * v)
    torch.testing.assert_close(beta_tpo(pt, k) * v, exact_update("tpo", probs), atol=1e-8, rtol=1e-5)


def test_tpo_beta_stays_order_one_where_pg_and_dg_vanish():
    probs = _policy(0.01)
    size = {m: (exact_update(m, probs)[0, 0] / correct_direction(probs)[0, 0]).item() for m in ("tpo", "pg", "dg")}
    assert size["tpo"] > 0.2 and size["pg"] == pytest.approx(0.01) and size["dg"] < 0.01


# ----------------------------------------------------------------------------- advantages

def test_group_and_rloo_advantages():
    s = torch.tensor([[1.0, 0.0, 0.0, 0.0], [2.0, 2.0, 2.0, 2.0]])
    a = O.group_advantages(s)
    torch.testing.assert_close(a[0], torch.tensor([math.sqrt(3), -1 / math.sqrt(3), -1 / math.sqrt(3), -1 / math.sqrt(3)]),
                               atol=1e-7, rtol=0)
    assert torch.all(a[1] == 0)
    torch.testing.assert_close(O.group_advantages(s, scale=False)[0], torch.tensor([0.75, -0.25, -0.25, -0.25]))
    r = O.rloo_advantages(s)
    torch.testing.assert_close(r[0], torch.tensor([1.0, -1 / 3, -1 / 3, -1 / 3]))
    torch.testing.assert_close(r, 4 / 3 * (s - s.mean(-1, keepdim=True)))


def test_expected_and_batch_mean_baselines():
    probs = torch.tensor([[0.5, 0.5], [0.9, 0.1]])
    torch.testing.assert_close(O.expected_baseline(probs), torch.tensor([0.5, 0.82]))
    r = torch.tensor([[1.0, 0.0], [0.0, 0.0], [1.0, 1.0]])
    torch.testing.assert_close(O.batch_mean_baseline(r), torch.tensor([[2 / 3, 1 / 3]] * 3))


# ----------------------------------------------------------------------------- PPO / GRPO clipping

def test_ppo_clip_on_hand_made_ratios():
    ratio = torch.tensor([0.5, 0.9, 1.0, 1.1, 1.5, 0.5, 1.5])
    adv = torch.tensor([1.0, 1.0, 1.0, 1.0, 1.0, -1.0, -1.0])
    old = torch.zeros(7)
    logp = ratio.log().requires_grad_(True)
    out = O.ppo_loss(logp, old, adv, clip_eps=0.2)
    # min(rA, clip(r)A): r=1.5,A=+1 -> 1.2 (clipped, no grad); r=0.5,A=-1 -> -0.8 (clipped, no grad);
    # r=0.5,A=+1 -> 0.5 (unclipped: pessimistic); r=1.5,A=-1 -> -1.5 (unclipped).
    expected = -torch.tensor([0.5, 0.9, 1.0, 1.1, 1.2, -0.8, -1.5]).mean()
    torch.testing.assert_close(out.loss, expected)
    out.loss.backward()
    grad_nonzero = logp.grad.abs() > 0
    assert grad_nonzero.tolist() == [True, True, True, True, False, False, True]
    assert abs(out.metrics["clip_frac"].item() - 2 / 7) < 1e-6


def _min_form_surrogate(ratio, adv, eps_low, eps_high):
    """The textbook min(ρA, clip(ρ)A), written independently of the library's form."""
    return torch.minimum(ratio * adv, ratio.clamp(1.0 - eps_low, 1.0 + eps_high) * adv)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**31 - 1), st.sampled_from([(0.2, 0.2), (0.2, 0.28), (0.1, 0.5)]))
def test_property_clipped_surrogate_equals_the_min_form_bit_for_bit(seed, eps):
    g = torch.Generator().manual_seed(seed)
    log_ratio = torch.randn(257, generator=g) * 0.5
    adv = torch.randn(257, generator=g)
    adv[::7] = 0.0
    lr1, lr2 = log_ratio.clone().requires_grad_(True), log_ratio.clone().requires_grad_(True)
    new = O.clipped_surrogate(torch.exp(lr1), adv, *eps)
    old = _min_form_surrogate(torch.exp(lr2), adv, *eps)
    assert torch.equal(new, old)
    new.sum().backward()
    old.sum().backward()
    # min() of two rounded products can tie just beyond the clip edge and pass half a gradient there; elsewhere
    # the gradients agree bit for bit (A inside the range, 0 beyond it).
    r = log_ratio.exp()
    edge = ((adv > 0) & (r > 1 + eps[1])) | ((adv < 0) & (r < 1 - eps[0]))
    assert torch.equal(lr1.grad[~edge], lr2.grad[~edge])
    assert torch.equal(lr1.grad[edge], torch.zeros_like(lr1.grad[edge]))


def test_ratio_exp_is_exp_in_value_first_and_second_derivative_and_under_vmap():
    from targetpo.objectives.clipped import ratio_exp

    x = torch.randn(64, dtype=torch.float32, requires_grad=True)
    y = ratio_exp(x)
    assert torch.equal(y, torch.exp(x.detach()))
    (g,) = torch.autograd.grad(y.sum(), x, create_graph=True)
    assert torch.equal(g, torch.exp(x.detach()))
    (h,) = torch.autograd.grad(g.sum(), x)
    torch.testing.assert_close(h, torch.exp(x.detach()))
    assert torch.equal(torch.func.vmap(ratio_exp)(x.detach().view(8, 8)), torch.exp(x.detach()).view(8, 8))
    # The one difference from torch.exp: a zero incoming gradient on an overflowed value gives 0, not NaN.
    big = torch.tensor([1000.0], requires_grad=True)
    (gb,) = torch.autograd.grad(ratio_exp(big), big, grad_outputs=torch.zeros(1))
    assert gb.item() == 0.0
    # It hides nothing else: a NaN gradient arriving from above stays NaN.
    (gn,) = torch.autograd.grad(ratio_exp(big), big, grad_outputs=torch.full((1,), math.nan))
    assert gn.isnan().all()


@pytest.mark.parametrize("dual", [None, 3.0])
def test_ppo_at_an_overflowing_ratio_has_the_exact_loss_and_no_nan_gradient(dual):
    # log ρ = 1000 overflows exp in float32 and float64 (ρ = ∞). A > 0 and A = 0 sit on flat branches (gradient 0);
    # A < 0 is unclipped (loss and gradient +∞, unless dual-clip caps it at −cA with gradient 0).
    logp = torch.zeros(4, requires_grad=True)
    old = torch.tensor([-1000.0, -1000.0, -1000.0, -0.1])
    adv = torch.tensor([1.0, 0.0, -1.0, 1.0])
    out = O.ppo_loss(logp, old, adv, clip_eps=0.2, dual_clip_c=dual)
    out.loss.backward()
    expected_grad = [0.0, 0.0, math.inf if dual is None else 0.0, -math.exp(0.1) / 4]  # ρ = e^0.1 < 1.2: −Aρ/4
    if dual is None:
        assert out.loss.item() == math.inf
    else:
        assert out.loss.item() == pytest.approx(-(1.2 + 0.0 - 3.0 + math.exp(0.1)) / 4, rel=1e-6)
    assert not logp.grad.isnan().any()
    torch.testing.assert_close(logp.grad, torch.tensor(expected_grad))
    # The flat-branch entries alone: a finite loss and an all-zero gradient on them.
    logp.grad = None
    out = O.ppo_loss(logp[:2], old[:2], adv[:2], clip_eps=0.2)
    out.loss.backward()
    assert out.loss.item() == pytest.approx(-1.2 / 2) and torch.equal(logp.grad[:2], torch.zeros(2))


def test_importance_weighted_pg_at_an_overflowing_ratio_keeps_a_zero_advantage_at_zero():
    # ρ = ∞ (log ρ = 1000): A = 0 contributes nothing, not 0·∞ = NaN; A > 0 keeps its true infinite weight.
    logp = torch.full((3,), -0.5, requires_grad=True)
    behaviour = torch.tensor([-1000.5, -0.5, -1000.5])
    out = O.importance_weighted_pg_loss(logp, behaviour, torch.tensor([0.0, 1.0, 0.0]))
    out.loss.backward()
    assert out.loss.item() == pytest.approx(0.5 / 3) and torch.equal(logp.grad, torch.tensor([0.0, -1 / 3, 0.0]))
    logp.grad = None
    O.importance_weighted_pg_loss(logp, behaviour, torch.tensor([1.0, 1.0, 0.0])).loss.backward()
    assert logp.grad[0].item() == -math.inf and not logp.grad.isnan().any()


@pytest.mark.parametrize("name", ["grpo", "gspo"])
def test_group_ratio_losses_without_a_log_ratio_clamp_give_no_nan_gradient(name):
    # The engines' conventions turn the ±20 clamp off (log_ratio_clip=None): a stale candidate with log ρ = 1000
    # on a positive advantage is clipped, so its gradient is 0, not 0·∞ = NaN.
    logp = torch.zeros(1, 2, 3, requires_grad=True)
    old = torch.zeros(1, 2, 3)
    old[0, 1] = -1000.0
    scores = torch.tensor([[0.0, 1.0]])
    mask = torch.ones(1, 2, 3, dtype=torch.bool)
    fn = O.get(name).fn
    out = fn(logp, old, scores, token_mask=mask, log_ratio_clip=None, **({"beta": 0.0} if name == "grpo" else {}))
    out.loss.backward()
    assert torch.isfinite(out.loss) and not logp.grad.isnan().any()
    assert torch.equal(logp.grad[0, 1], torch.zeros(3))


def test_grpo_sequence_level_sums_candidates_and_kl_is_zero_in_first_epoch():
    gen = torch.Generator().manual_seed(0)
    logp = torch.randn(3, 4, generator=gen).requires_grad_(True)
    scores = torch.tensor([[1.0, 0, 0, 0], [1, 1, 0, 0], [0, 0, 0, 0]])
    out = O.grpo_loss(logp, logp.detach(), scores, beta=0.04)
    out.loss.backward()
    adv = O.group_advantages(scores)
    # ratio = 1 in epoch 1: loss = −mean_g Σ_i A_i = 0; gradient = −A_i / G (KL has zero gradient).
    torch.testing.assert_close(out.loss, torch.tensor(0.0), atol=1e-12, rtol=0)
    torch.testing.assert_close(logp.grad, -adv / 3)
    assert out.metrics["kl"] == 0 and abs(out.metrics["frac_zero_var"].item() - 1 / 3) < 1e-6


def test_grpo_kl_k3_against_reference_and_log_ratio_clip():
    logp = torch.tensor([[0.0, -1.0]], requires_grad=True)
    ref = torch.tensor([[-0.5, -0.5]])
    out = O.grpo_loss(logp, logp.detach(), torch.tensor([[0.0, 0.0]]), beta=0.5, ref_logp=ref)
    d = logp.detach() - ref
    torch.testing.assert_close(out.loss, 0.5 * (torch.exp(-d) + d - 1).sum())
    k = O.k3_kl(torch.tensor([100.0]), torch.tensor([0.0]))
    torch.testing.assert_close(k, torch.exp(torch.tensor([-20.0])) + 19.0)


def test_grpo_masked_normalises_by_informative_groups():
    logp = torch.zeros(4, 2, requires_grad=True)
    scores = torch.tensor([[1.0, 0.0], [0.0, 0.0], [1.0, 1.0], [0.0, 1.0]])
    old = torch.full((4, 2), -0.1)
    plain = O.grpo_loss(logp, old, scores, beta=0.0)
    masked = O.grpo_loss(logp, old, scores, beta=0.0, mask_zero_var=True)
    # Zero-variance groups contribute 0 either way; masking changes the denominator from 4 groups to 2.
    torch.testing.assert_close(masked.loss, plain.loss * 4 / 2)
    masked_all_dead = O.grpo_loss(logp, old, torch.zeros(4, 2), beta=0.04, mask_zero_var=True)
    assert masked_all_dead.loss == 0


def test_per_token_aggregations_dapo_and_dr_grpo():
    per = torch.tensor([[[1.0, 1.0, 1.0, 0.0], [3.0, 0.0, 0.0, 0.0]]])  # [G=1, K=2, T=4]
    tm = torch.tensor([[[1, 1, 1, 0], [1, 0, 0, 0]]], dtype=torch.bool)
    assert O.aggregate(per, "token-mean", token_mask=tm, per_token=True) == (3 + 3) / 4
    assert O.aggregate(per, "seq-mean-token-mean", token_mask=tm, per_token=True) == (1 + 3) / 2
    assert O.aggregate(per, "seq-mean-token-sum", token_mask=tm, per_token=True) == (3 + 3) / 2
    assert O.aggregate(per, "seq-mean-token-sum-norm", token_mask=tm, per_token=True, norm_len=10) == (0.3 + 0.3) / 2
    assert O.aggregate(per, "sum-mean", token_mask=tm, per_token=True) == 6
    with pytest.raises(ValueError, match="loss_agg"):
        O.aggregate(per, "bogus")


def _tokens(seed=0, g=2, k=4, t=6):
    gen = torch.Generator().manual_seed(seed)
    logp = -torch.rand(g, k, t, generator=gen) * 2
    old = logp + 0.05 * torch.randn(g, k, t, generator=gen)
    tm = torch.rand(g, k, t, generator=gen) > 0.3
    tm[..., 0] = True
    scores = torch.rand(g, k, generator=gen)
    return logp.requires_grad_(True), old, tm, scores


def test_dapo_is_token_mean_clip_higher_without_kl():
    logp, old, tm, scores = _tokens()
    adv = O.group_advantages(scores).unsqueeze(-1)
    ratio = torch.exp(logp.detach() - old)
    surr = torch.minimum(ratio * adv, ratio.clamp(0.8, 1.28) * adv)
    expected = -(surr * tm).sum() / tm.sum()
    torch.testing.assert_close(O.dapo_loss(logp, old, scores, token_mask=tm).loss, expected)


def test_dr_grpo_uses_unscaled_advantages_and_constant_length():
    logp, old, tm, scores = _tokens()
    adv = (scores - scores.mean(-1, keepdim=True)).unsqueeze(-1)
    ratio = torch.exp(logp.detach() - old)
    surr = torch.minimum(ratio * adv, ratio.clamp(0.8, 1.2) * adv)
    expected = -((surr * tm).sum(-1) / 16.0).mean()
    torch.testing.assert_close(O.dr_grpo_loss(logp, old, scores, token_mask=tm, norm_len=16).loss, expected)


def test_gspo_gradient_is_sequence_ratio_times_mean_token_gradient():
    logp, old, tm, scores = _tokens()
    old = logp.detach().clone()  # on-policy: s_i = 1, unclipped
    out = O.gspo_loss(logp, old, scores, token_mask=tm)
    out.loss.backward()
    adv = O.group_advantages(scores)
    expected = -(adv.unsqueeze(-1) * tm / tm.sum(-1, keepdim=True)) / adv.numel()
    torch.testing.assert_close(logp.grad, expected)


def test_sapo_gate_is_policy_gradient_on_policy_and_soft_off_policy():
    logp, _, tm, scores = _tokens()
    out = O.sapo_loss(logp, logp.detach(), scores, token_mask=tm, loss_agg="token-mean")
    out.loss.backward()
    adv = O.group_advantages(scores).unsqueeze(-1)
    torch.testing.assert_close(logp.grad, -(adv * tm) / tm.sum())  # f'(1) = 1
    # ρ = 3 on every token: d f_τ(ρ) / d log π = ρ · 4σ(τ(ρ−1))(1 − σ(τ(ρ−1))), τ chosen by the sign of A.
    logp.grad = None
    O.sapo_loss(logp, logp.detach() - math.log(3.0), scores, token_mask=tm, loss_agg="token-mean",
                tau_pos=1.0, tau_neg=2.0).loss.backward()
    tau = torch.where(adv > 0, 1.0, 2.0)
    s = torch.sigmoid(tau * 2.0)
    gate = 4 * s * (1 - s)
    torch.testing.assert_close(logp.grad, -(3.0 * gate * adv * tm) / tm.sum())
    # Damped, not cut: every token keeps a gradient (PPO's clip would zero the positive-advantage ones).
    assert torch.all(logp.grad[tm] != 0) and gate.max() < 0.5


def test_cispo_keeps_gradient_of_every_token_with_truncated_weight():
    logp, _, tm, scores = _tokens()
    old = logp.detach() - torch.log(torch.tensor(10.0))  # ratio 10 everywhere
    O.cispo_loss(logp, old, scores, token_mask=tm, ratio_max=5.0).loss.backward()
    adv = O.group_advantages(scores).unsqueeze(-1)
    torch.testing.assert_close(logp.grad, -(5.0 * adv * tm) / tm.sum())


# ----------------------------------------------------------------------------- single-sample families

def test_dg_gate_and_loss():
    logp = torch.log(torch.tensor([0.9, 0.1, 0.9, 0.1])).requires_grad_(True)
    adv = torch.tensor([1.0, 1.0, -1.0, -1.0])
    out = O.dg_loss(logp, adv)
    gate = torch.sigmoid(adv * -logp.detach())
    torch.testing.assert_close(out.loss, -(gate * adv * logp.detach()).mean())
    out.loss.backward()
    torch.testing.assert_close(logp.grad, -(gate * adv) / 4)
    # Surprising success keeps most weight; surprising failure is suppressed.
    assert gate[1] > 0.9 and gate[3] < 0.1


def test_reinforce_2d_sums_tokens_and_averages_rows():
    logp = torch.randn(3, 5, requires_grad=True)
    adv = torch.randn(3, 5)
    torch.testing.assert_close(O.reinforce_loss(logp, adv).loss, -(adv * logp).sum(-1).mean())
    torch.testing.assert_close(O.reinforce_loss(logp[:, 0], adv[:, 0]).loss, -(adv[:, 0] * logp[:, 0]).mean())


def test_batch_standardized_pg_and_group_pg_and_is_pg():
    logp = torch.randn(6, requires_grad=True)
    r = torch.tensor([1.0, 0, 0, 1, 0, 0])
    z = (r - r.mean()) / (r.std(unbiased=False) + 1e-8)
    torch.testing.assert_close(O.batch_standardized_pg_loss(logp, r).loss, -(z * logp).mean())
    glogp = torch.randn(2, 10, requires_grad=True)
    s = torch.zeros(2, 10)
    s[:, 3] = 1.0
    out = O.group_pg_loss(glogp, s)
    out.loss.backward()
    assert abs(glogp.grad[0, 3].item() + 3.0 / 2) < 1e-12  # u_hot = +3 for K = 10, averaged over 2 groups
    b = torch.randn(6)
    lp = torch.randn(6, requires_grad=True)
    O.importance_weighted_pg_loss(lp, b, r).loss.backward()
    torch.testing.assert_close(lp.grad, -(torch.exp(lp.detach() - b) * r) / 6)


def test_ce_oracle():
    logits = torch.randn(5, 10, requires_grad=True)
    y = torch.randint(0, 10, (5,))
    torch.testing.assert_close(O.ce_loss(logits, y).loss, torch.nn.functional.cross_entropy(logits, y))


# DG and CISPO are excluded from finite differences on purpose: their weights are stop-gradient, so their
# gradient is not the derivative of their loss value (their gradients are tested in closed form above).
@pytest.mark.parametrize("name", ["reinforce", "ppo"])
def test_finite_differences_single(name):
    logp = (-torch.rand(3, 4)).requires_grad_(True)
    adv = torch.randn(3, 4)
    old = logp.detach() + 0.01
    fn = {"reinforce": lambda x: O.reinforce_loss(x, adv).loss, "ppo": lambda x: O.ppo_loss(x, old, adv).loss}[name]
    assert torch.autograd.gradcheck(fn, (logp,))


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "dapo", "gspo", "sapo", "tpo_sequence"])
def test_finite_differences_sequence_objectives(name):
    logp, old, tm, scores = _tokens(g=2, k=3, t=4)
    fn = O.get(name).fn
    assert torch.autograd.gradcheck(lambda x: fn(x, old, scores, token_mask=tm).loss, (logp.detach().requires_grad_(True),))


@settings(max_examples=30, deadline=None)
@given(g=st.integers(1, 4), k=st.integers(2, 6), t=st.integers(1, 7), seed=st.integers(0, 999))
def test_property_sequence_objectives_are_finite_and_respect_masks(g, k, t, seed):
    logp, old, tm, scores = _tokens(seed, g, k, t)
    for name in ("grpo", "dr_grpo", "dapo", "gspo", "sapo", "cispo", "tpo_sequence"):
        logp.grad = None
        out = O.get(name).fn(logp, old, scores, token_mask=tm)
        assert torch.isfinite(out.loss)
        out.loss.backward()
        assert torch.all(logp.grad[~tm] == 0), name  # padding never receives gradient


def test_registry_and_bad_inputs():
    assert {"tpo", "grpo", "dapo", "gspo", "sapo", "cispo", "dg", "ce", "rloo", "group_pg", "ppo"} <= set(O.available())
    assert O.get("grpo_no_kl").fn(torch.zeros(1, 2), torch.zeros(1, 2), torch.tensor([[1.0, 0.0]])).metrics.get("kl") is None
    with pytest.raises(KeyError, match="available"):
        O.get("nope")
    with pytest.raises(ValueError, match="logp has shape"):
        O.grpo_loss(torch.zeros(2, 3, 4, 5), torch.zeros(2, 3, 4, 5), torch.zeros(2, 3))
    with pytest.raises(ValueError, match="token_mask leaves 1 sequence"):
        tm = torch.ones(1, 2, 3, dtype=torch.bool)
        tm[0, 1] = False
        O.dapo_loss(torch.zeros(1, 2, 3), torch.zeros(1, 2, 3), torch.zeros(1, 2), token_mask=tm)
    with pytest.raises(ValueError, match="old_logp contains"):
        O.ppo_loss(torch.zeros(3), torch.tensor([0.0, float("nan"), 0.0]), torch.zeros(3))
    with pytest.raises(ValueError, match="K >= 2"):
        O.grpo_loss(torch.zeros(3, 1), torch.zeros(3, 1), torch.zeros(3, 1))
    out = O.grpo_loss(torch.zeros(2, 3, dtype=torch.float16), torch.zeros(2, 3, dtype=torch.bfloat16),
                      torch.rand(2, 3).half())
    assert out.loss.dtype == torch.float32
