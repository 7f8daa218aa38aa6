"""TPO's options beyond the paper (docs/method.md §8) against independent math: each projection's closed form, its
documented gradient on the group logits, finite differences, its fixed point, its limits and its shift invariance;
the adaptive η's achieved KL; the std floor/shrinkage of low-variance groups. Defaults are the paper's numbers."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from targetpo import objectives as obj
from targetpo.objectives import (
    adaptive_eta,
    alpha_projection,
    group_advantages,
    kl_to_old,
    standardize_scores,
    tpo_loss,
    tpo_sequence_loss,
    tpo_target,
    tpo_token_loss,
)
from targetpo.objectives.tpo import ADAPTIVE_ETA_BRACKET


pytestmark = pytest.mark.usefixtures("float64")  # tests/objectives/conftest.py


def _groups(g, k, seed, spread=1.0):
    gen = torch.Generator().manual_seed(seed)
    logits = spread * torch.randn(g, k, generator=gen)
    old = logits + 0.5 * torch.randn(g, k, generator=gen)
    scores = torch.rand(g, k, generator=gen)
    return logits, old, scores


# ----------------------------------------------------------------------------- projections

def _closed_form(projection, p, q, alpha=None):
    """Per-group divergences written from their definitions on probabilities (no log-space tricks)."""
    if projection == "reverse_kl":
        return (p * (p.log() - q.log())).sum(-1)
    if projection == "js":
        m = 0.5 * (p + q)
        return 0.5 * (p * (p / m).log()).sum(-1) + 0.5 * (q * (q / m).log()).sum(-1)
    if projection == "alpha":
        return (1 - (q ** alpha * p ** (1 - alpha)).sum(-1)) / (alpha * (1 - alpha))
    if projection == "forward_kl":
        return -(q * p.log()).sum(-1)
    raise AssertionError(projection)


def _documented_gradient(projection, p, q, alpha=None):
    """The gradient on the group logits as docs/method.md §8 states it, per group."""
    if projection == "forward_kl":
        return p - q
    if projection == "reverse_kl":
        kl = (p * (p.log() - q.log())).sum(-1, keepdim=True)
        return p * (p.log() - q.log() - kl)
    if projection == "js":
        m = 0.5 * (p + q)
        kl_pm = (p * (p / m).log()).sum(-1, keepdim=True)
        return 0.5 * p * ((p / m).log() - kl_pm)
    if projection == "alpha":
        r = q ** alpha * p ** (1 - alpha)
        s = r.sum(-1, keepdim=True)
        return s / alpha * (p - r / s)
    raise AssertionError(projection)


CASES = [("forward_kl", None), ("reverse_kl", None), ("js", None), ("alpha", 0.3), ("alpha", 0.5), ("alpha", 0.8)]


def _kw(projection, alpha):
    return {"projection": projection} | ({"alpha": alpha} if alpha is not None else {})


@pytest.mark.parametrize("projection,alpha", CASES)
@settings(max_examples=25, deadline=None)
@given(g=st.integers(1, 4), k=st.integers(2, 9), seed=st.integers(0, 10_000), eta=st.floats(0.25, 4.0))
def test_projection_matches_its_closed_form_and_documented_gradient(projection, alpha, g, k, seed, eta):
    logits, old, scores = _groups(g, k, seed)
    logits.requires_grad_(True)
    out = tpo_loss(logits, old, scores, eta=eta, **_kw(projection, alpha))
    out.loss.backward()
    q = tpo_target(old, scores, eta)
    p = torch.softmax(logits.detach(), -1)
    ref_logits = logits.detach().clone().requires_grad_(True)
    ref = _closed_form(projection, torch.softmax(ref_logits, -1), q, alpha).mean()
    ref.backward()
    assert torch.allclose(out.loss, ref, rtol=1e-10, atol=1e-12)
    assert torch.allclose(logits.grad, ref_logits.grad, rtol=1e-8, atol=1e-12)
    assert torch.allclose(logits.grad, _documented_gradient(projection, p, q, alpha) / g, rtol=1e-8, atol=1e-12)


@pytest.mark.parametrize("projection,alpha", CASES)
def test_projection_gradient_matches_finite_differences(projection, alpha):
    logits, old, scores = _groups(3, 5, seed=7)
    f = lambda z: tpo_loss(z, old, scores, **_kw(projection, alpha)).loss  # noqa: E731
    assert torch.autograd.gradcheck(f, (logits.requires_grad_(True),), eps=1e-6, atol=1e-7)


@pytest.mark.parametrize("projection,alpha", CASES)
@settings(max_examples=20, deadline=None)
@given(k=st.integers(2, 9), seed=st.integers(0, 10_000))
def test_projection_fixed_point_is_the_target(projection, alpha, k, seed):
    _, old, scores = _groups(3, k, seed)
    q = tpo_target(old, scores)
    at_q = q.log().requires_grad_(True)  # p_θ = q exactly
    out = tpo_loss(at_q, old, scores, **_kw(projection, alpha))
    out.loss.backward()
    assert at_q.grad.abs().max() < 1e-12
    if projection != "forward_kl":  # a divergence: zero at its fixed point (the cross-entropy is H(q) there)
        assert abs(float(out.loss.detach())) < 1e-12


@pytest.mark.parametrize("projection,alpha", CASES)
@settings(max_examples=20, deadline=None)
@given(k=st.integers(2, 9), seed=st.integers(0, 10_000), shift=st.floats(-50, 50))
def test_projection_is_invariant_to_a_constant_added_to_the_logits(projection, alpha, k, seed, shift):
    logits, old, scores = _groups(2, k, seed)
    a, b = logits.clone().requires_grad_(True), (logits + shift).requires_grad_(True)
    la = tpo_loss(a, old, scores, **_kw(projection, alpha)).loss
    lb = tpo_loss(b, old, scores, **_kw(projection, alpha)).loss
    la.backward()
    lb.backward()
    assert torch.allclose(la, lb, rtol=1e-9, atol=1e-12)
    assert torch.allclose(a.grad, b.grad, rtol=1e-7, atol=1e-12)


@settings(max_examples=25, deadline=None)
@given(k=st.integers(2, 9), seed=st.integers(0, 10_000))
def test_alpha_family_tends_to_the_two_kls_at_its_ends(k, seed):
    logits, old, scores = _groups(3, k, seed)

    def loss_and_grad(**kw):
        z = logits.clone().requires_grad_(True)
        loss = tpo_loss(z, old, scores, **kw).loss
        loss.backward()
        return loss.detach(), z.grad

    q = tpo_target(old, scores)
    entropy = -(q * q.log()).sum(-1).mean()
    forward, g_forward = loss_and_grad()
    reverse, g_reverse = loss_and_grad(projection="reverse_kl")
    for a, (loss, grad) in {1.0: (forward - entropy, g_forward), 0.0: (reverse, g_reverse)}.items():
        near = 1e-6 if a == 0 else 1 - 1e-6
        l_near, g_near = loss_and_grad(projection="alpha", alpha=near)
        assert torch.allclose(l_near, loss, atol=1e-5) and torch.allclose(g_near, grad, atol=1e-5), a
        l_end, g_end = loss_and_grad(projection="alpha", alpha=a)  # the ends are the KLs themselves
        assert torch.allclose(l_end, loss, atol=1e-12) and torch.allclose(g_end, grad, atol=1e-12), a


def test_alpha_half_is_twice_the_squared_hellinger_sum():
    logits, old, scores = _groups(4, 6, seed=3)
    p, q = torch.softmax(logits, -1), tpo_target(old, scores)
    d = alpha_projection(p.log(), q.log(), 0.5)
    assert torch.allclose(d, 2 * (q.sqrt() - p.sqrt()).square().sum(-1), atol=1e-12)


@pytest.mark.parametrize("projection,alpha", CASES)
def test_projection_ignores_masked_candidates(projection, alpha):
    logits, old, scores = _groups(1, 6, seed=11)
    mask = torch.tensor([[True, True, False, True, False, True]])
    z = logits.clone().requires_grad_(True)
    tpo_loss(z, old, scores, mask=mask, **_kw(projection, alpha)).loss.backward()
    keep = mask[0]
    z_small = logits[:, keep].clone().requires_grad_(True)
    tpo_loss(z_small, old[:, keep], scores[:, keep], **_kw(projection, alpha)).loss.backward()
    assert torch.isfinite(z.grad).all() and (z.grad[:, ~keep] == 0).all()
    assert torch.allclose(z.grad[:, keep], z_small.grad, atol=1e-12)


@pytest.mark.parametrize("projection,alpha", CASES)
def test_float32_projections_match_float64(projection, alpha):
    logits, old, scores = _groups(4, 8, seed=5)
    z64, z32 = logits.clone().requires_grad_(True), logits.float().requires_grad_(True)
    l64 = tpo_loss(z64, old, scores, **_kw(projection, alpha)).loss
    l32 = tpo_loss(z32, old.float(), scores.float(), **_kw(projection, alpha)).loss
    l64.backward()
    l32.backward()
    assert l32.dtype == torch.float32
    assert torch.allclose(l32.double(), l64, atol=1e-5) and torch.allclose(z32.grad.double(), z64.grad, atol=1e-5)


def test_token_and_sequence_forms_pass_the_options_through():
    logits, old, scores = _groups(3, 4, seed=2)
    # (the std options beside the adaptive η are refused: it undoes their rescaling of u)
    for kw in ({"projection": "alpha", "alpha": 0.4, "eta": "adaptive", "kl_budget": 0.05},
               {"projection": "alpha", "alpha": 0.4, "eta": 0.7, "std_shrink": 0.1, "std_floor": 0.2}):
        ref = tpo_loss(logits, old, scores, **kw).loss
        per_token = torch.stack([logits, torch.zeros_like(logits)], -1)  # [G, K, T=2], sum = logits
        old_tok = torch.stack([old, torch.zeros_like(old)], -1)
        assert torch.allclose(tpo_sequence_loss(per_token, old_tok, scores, **kw).loss, ref, atol=1e-12)
        # Token form: states [3], vocab of 4 whose log-probs are the group's log-softmax, candidates = every token.
        cand = torch.arange(4).expand(3, 4)
        assert torch.allclose(tpo_token_loss(logits, cand, old, scores, **kw).loss, ref, atol=1e-12)


def test_registered_projections_are_tpo_with_that_projection():
    logits, old, scores = _groups(3, 5, seed=9)
    for name, kw in (("tpo_reverse_kl", {"projection": "reverse_kl"}), ("tpo_js", {"projection": "js"}),
                     ("tpo_hellinger", {"projection": "alpha", "alpha": 0.5})):
        o = obj.get(name)
        assert o.needs_groups and o.multi_epoch_safe and o.per_token_fn is not None
        assert torch.equal(o.fn(logits, old, scores).loss, tpo_loss(logits, old, scores, **kw).loss)
        # ... and different from the paper's forward KL
        assert not torch.allclose(o.fn(logits, old, scores).loss, tpo_loss(logits, old, scores).loss)
        # the per-token form reduces to the same loss when each completion has one token
        seq = o.per_token_fn(logits.unsqueeze(-1), old.unsqueeze(-1), scores).loss
        assert torch.allclose(seq, o.fn(logits, old, scores).loss, atol=1e-12)


@pytest.mark.parametrize("kw,match", [
    ({"projection": "kl"}, "projection='kl'"),
    ({"projection": "alpha"}, "needs alpha"),
    ({"alpha": 0.5}, "only used with projection='alpha'"),
    ({"projection": "js", "alpha": 0.5}, "only used with projection='alpha'"),
    ({"projection": "alpha", "alpha": 1.5}, "^alpha="),
    ({"eta": "adaptive"}, "needs kl_budget"),
    ({"kl_budget": 0.1}, "only used with eta='adaptive'"),
    ({"eta": "adaptive", "kl_budget": 0.1, "anchor": False}, "anchor=False"),
    ({"eta": "fast"}, "^eta="),
    ({"std_floor": -0.1}, "^std_floor="),
    ({"std_shrink": float("nan")}, "^std_shrink="),
])
def test_bad_options_are_refused_naming_them(kw, match):
    logits, old, scores = _groups(2, 4, seed=0)
    with pytest.raises(ValueError, match=match):
        tpo_loss(logits, old, scores, **kw)


# ----------------------------------------------------------------------------- adaptive η

def _kl_max(old, scores):
    """KL(q_η ‖ p_old) as η → 0: −log of p_old's mass on the best-scoring candidates."""
    p_old = torch.softmax(old, -1)
    best = scores == scores.amax(-1, keepdim=True)
    return -(p_old * best).sum(-1).log()


@settings(max_examples=40, deadline=None)
@given(g=st.integers(1, 6), k=st.integers(2, 12), seed=st.integers(0, 10_000), budget=st.floats(1e-3, 1.0),
       spread=st.floats(0.1, 3.0))
def test_adaptive_eta_reaches_the_kl_budget(g, k, seed, budget, spread):
    _, old, scores = _groups(g, k, seed, spread)
    q = tpo_target(old, scores, "adaptive", kl_budget=budget)
    p_old = torch.softmax(old, -1)
    kl = torch.where(q > 0, q * (q.log() - p_old.log()), torch.zeros_like(q)).sum(-1)  # q may underflow at η ≈ 0
    # Reachable: the KL at the bracket's smallest η exceeds the budget. KL_max alone is not the test: a near-tie
    # with the best score (u within ~η_min of it) keeps q spread at every η of the bracket (seed=881, g=6, k=5).
    u = standardize_scores(scores)
    kl_floor = kl_to_old(torch.log_softmax(old, -1), u, torch.full_like(u[..., :1], ADAPTIVE_ETA_BRACKET[0]))
    reachable = kl_floor > budget + 1e-3
    assert torch.allclose(kl[reachable], torch.full_like(kl[reachable], budget), atol=1e-5)
    # Beyond KL_max no η reaches the budget: the smallest η of the bracket, KL just below KL_max.
    eta = adaptive_eta(p_old.log(), standardize_scores(scores), budget)
    unreachable = _kl_max(old, scores) < budget
    assert torch.allclose(eta.squeeze(-1)[unreachable], torch.tensor(ADAPTIVE_ETA_BRACKET[0]), rtol=1e-12)
    assert (kl[unreachable] <= budget).all()


def test_adaptive_eta_in_float32_reaches_the_budget():
    _, old, scores = _groups(64, 8, seed=1)
    q = tpo_target(old.float(), scores.float(), "adaptive", kl_budget=0.1)
    assert q.dtype == torch.float32
    eta = adaptive_eta(torch.log_softmax(old.float(), -1), standardize_scores(scores.float()), 0.1)
    assert eta.dtype == torch.float64 and eta.shape == (64, 1)  # as documented: the bisection's precision
    q = q.double()
    kl = (q * (q.log() - torch.log_softmax(old, -1))).sum(-1)
    assert torch.allclose(kl, torch.full_like(kl, 0.1), atol=1e-5)


@settings(max_examples=25, deadline=None)
@given(k=st.integers(2, 12), seed=st.integers(0, 10_000))
def test_kl_to_old_decreases_with_eta(k, seed):
    _, old, scores = _groups(3, k, seed)
    log_old, u = torch.log_softmax(old, -1), standardize_scores(scores)
    etas = torch.logspace(-3, 4, 200)
    kls = torch.stack([kl_to_old(log_old, u, e.reshape(1, 1)) for e in etas])  # [200, 3]
    assert (kls[1:] <= kls[:-1] + 1e-12).all()
    assert (kls[0] > kls[-1]).all()


@settings(max_examples=25, deadline=None)
@given(k=st.integers(2, 12), seed=st.integers(0, 10_000))
def test_a_larger_kl_budget_gives_a_smaller_eta_and_a_sharper_target(k, seed):
    _, old, scores = _groups(4, k, seed)
    log_old, u = torch.log_softmax(old, -1), standardize_scores(scores)
    budgets = [0.001, 0.01, 0.05, 0.2]
    etas = torch.cat([adaptive_eta(log_old, u, b) for b in budgets], -1)  # [4 groups, 4 budgets]
    assert (etas[:, 1:] <= etas[:, :-1]).all()
    gain = [(tpo_target(old, scores, "adaptive", kl_budget=b) * u).sum(-1) for b in budgets]  # E_q[u]
    assert all((hi >= lo - 1e-12).all() for lo, hi in zip(gain, gain[1:]))


def test_adaptive_eta_is_a_constant_of_the_target():
    logits, old, scores = _groups(4, 6, seed=4)
    old = old.clone().requires_grad_(True)
    z = logits.clone().requires_grad_(True)
    q = tpo_target(old, scores, "adaptive", kl_budget=0.2)
    assert not q.requires_grad
    out = tpo_loss(z, old, scores, eta="adaptive", kl_budget=0.2)
    out.loss.backward()
    assert old.grad is None  # nothing flows into the rollout-time log-probs through η or q
    assert torch.allclose(z.grad, (torch.softmax(logits, -1) - q) / 4, atol=1e-12)  # still p_θ − q
    # The per-group η reproduces q as a plain fixed temperature, and the solve is deterministic.
    eta = adaptive_eta(torch.log_softmax(old.detach(), -1), standardize_scores(scores), 0.2)
    assert not eta.requires_grad and torch.equal(eta, adaptive_eta(torch.log_softmax(old.detach(), -1),
                                                                   standardize_scores(scores), 0.2))
    for i in range(4):
        assert torch.allclose(q[i], tpo_target(old[i].detach(), scores[i], float(eta[i])), atol=1e-12)
    assert "eta_mean" in out.metrics and torch.allclose(out.metrics["eta_mean"], eta.mean())
    assert "eta_mean" not in tpo_loss(z, old, scores).metrics


def test_adaptive_eta_of_a_zero_variance_group_keeps_p_old():
    old = torch.randn(2, 5)
    scores = torch.tensor([[1.0] * 5, [0.0, 1, 0, 0, 0]])
    q = tpo_target(old, scores, "adaptive", kl_budget=0.1)
    assert torch.allclose(q[0], torch.softmax(old[0], -1), atol=1e-15)
    eta = adaptive_eta(torch.log_softmax(old, -1), standardize_scores(scores), 0.1)
    assert math.isclose(float(eta[0]), ADAPTIVE_ETA_BRACKET[0], rel_tol=1e-12)


def test_adaptive_eta_respects_the_mask():
    _, old, scores = _groups(2, 6, seed=8)
    mask = torch.tensor([[True, True, True, False, True, True], [True] * 6])
    q = tpo_target(old, scores, "adaptive", mask=mask, kl_budget=0.05)
    assert (q[0, 3] == 0).all()
    log_old = torch.log_softmax(old.masked_fill(~mask, -math.inf), -1)
    kl = torch.where(mask, q * (q.clamp_min(1e-300).log() - log_old), torch.zeros_like(q)).sum(-1)
    assert torch.allclose(kl, torch.full_like(kl, 0.05), atol=1e-5)


# ----------------------------------------------------------------------------- low-variance groups

NEAR_TIE = torch.tensor([[1.0, 1.0, 1.0, 1.0001]])


@pytest.mark.parametrize("option", [{"std_floor": 0.1}, {"std_shrink": 0.1}])
def test_a_near_tie_is_peaked_without_the_option_and_near_p_old_with_it(option):
    old = torch.zeros(1, 4)  # uniform p_old
    p_old = torch.full((1, 4), 0.25)
    peaked = tpo_target(old, NEAR_TIE, 0.5)
    assert float(peaked.max()) > 0.9  # u = (−0.58, −0.58, −0.58, 1.73): a rounding-level spread wins
    calm = tpo_target(old, NEAR_TIE, 0.5, **option)
    assert torch.allclose(calm, p_old, atol=1e-3)
    assert torch.allclose(tpo_loss(old, old, NEAR_TIE, eta=0.5, **option).metrics["target_max"],
                          torch.tensor(0.25), atol=1e-3)


@settings(max_examples=30, deadline=None)
@given(k=st.integers(2, 10), seed=st.integers(0, 10_000), floor=st.floats(0.0, 2.0), shrink=st.floats(0.0, 2.0))
def test_floor_and_shrinkage_divide_by_the_documented_scale(k, seed, floor, shrink):
    scores = torch.rand(3, k, generator=torch.Generator().manual_seed(seed)) * 3
    centred = scores - scores.mean(-1, keepdim=True)
    sigma = scores.std(-1, unbiased=False, keepdim=True)
    u = standardize_scores(scores, std_floor=floor, std_shrink=shrink)
    if floor == 0 and shrink == 0:
        expected = torch.where(sigma > 1e-6, centred / sigma, centred)
    else:
        expected = centred / torch.maximum(torch.sqrt(sigma ** 2 + shrink ** 2), torch.tensor(floor))
    assert torch.allclose(u, expected, atol=1e-12)
    a = group_advantages(scores, std_floor=floor, std_shrink=shrink)
    assert torch.allclose(a, centred / (torch.maximum(torch.sqrt(sigma ** 2 + shrink ** 2), torch.tensor(floor))
                                        + 1e-8), atol=1e-12)


def test_a_floor_below_every_std_changes_nothing_and_all_equal_groups_stay_zero():
    scores = torch.tensor([[0.0, 1, 1, 0], [2.0, 2, 2, 2]])
    assert torch.equal(standardize_scores(scores, std_floor=0.3), standardize_scores(scores))
    assert torch.equal(group_advantages(scores, std_floor=0.3), group_advantages(scores))
    assert (standardize_scores(scores, std_shrink=0.5)[1] == 0).all()
    with pytest.raises(ValueError, match="scale=False"):
        group_advantages(scores, scale=False, std_floor=0.1)


def test_defaults_are_the_papers_numbers_bit_for_bit():
    logits, old, scores = _groups(5, 8, seed=12)
    base = tpo_loss(logits.float(), old.float(), scores.float())
    same = tpo_loss(logits.float(), old.float(), scores.float(), projection="forward_kl", std_floor=0.0,
                    std_shrink=0.0, alpha=None, kl_budget=None)
    assert torch.equal(base.loss, same.loss)
    assert base.metrics.keys() == same.metrics.keys()
    # The paper's formula written out: q = softmax(log_softmax(old) + u), L = −mean Σ q log_softmax(logits).
    q = torch.softmax(torch.log_softmax(old.float(), -1) + standardize_scores(scores.float()), -1)
    assert torch.allclose(base.loss, -(q * torch.log_softmax(logits.float(), -1)).sum(-1).mean(), atol=1e-6)


def test_only_tpo_takes_the_word_adaptive_for_eta():
    with pytest.raises(ValueError, match="^eta='adaptive': must be a finite number"):
        obj.dg_loss(torch.randn(4), torch.randn(4), eta="adaptive")
    with pytest.raises(ValueError, match="or one of 'adaptive'"):
        tpo_target(torch.randn(2, 4), torch.randn(2, 4), "hot")


def test_projection_settings_map_to_tpo_loss_keywords_and_refuse_bad_names():
    from targetpo.objectives.tpo import projection_label, projection_setting

    assert projection_setting("forward_kl") == {"projection": "forward_kl"}
    assert projection_setting("alpha0.5") == {"projection": "alpha", "alpha": 0.5}
    assert projection_setting("kl2") == {"eta": "adaptive", "kl_budget": 2.0}
    assert projection_label("alpha0.5") == "α = 0.5" and projection_label("kl0.5") == "adaptive η, ε = 0.5"
    for bad in ("alpha1.5", "kl0", "klx", "hellinger"):
        with pytest.raises(ValueError, match=f"setting '{bad}'"):
            projection_setting(bad)


def test_a_kl_budget_no_eta_in_the_bracket_reaches_is_refused_not_exceeded():
    """Below the KL at η = 1e4 (~5e-9 here) bisection stopped at η = 1e4 and the target's KL was 48× a 1e-10
    budget, silently."""
    old = torch.log_softmax(torch.tensor([[0.5, -0.2, 0.1, 0.0]], dtype=torch.float64), -1)
    s = torch.tensor([[0.0, 1.0, 0.0, 1.0]], dtype=torch.float64)
    u = obj.standardize_scores(s)
    assert obj.adaptive_eta(old, u, 1e-8).item() < 1e4  # reachable: met
    with pytest.raises(ValueError, match=r"kl_budget=1e-10: below the KL\(q ‖ p_old\) = 4.79e-09 that even η = 10000"):
        obj.adaptive_eta(old, u, 1e-10)


def test_a_floor_below_the_zero_variance_threshold_keeps_a_near_tie_flat():
    """std_floor=1e-9 turned a group of σ = 1.7e-7 (a zero-variance group by the 1e-6 rule) into z-scores
    (−0.58, −0.58, −0.58, 1.73): q = 0.77 on the last candidate, the opposite of what a floor is for."""
    s = torch.tensor([[1.0, 1.0, 1.0, 1.0 + 4e-7]], dtype=torch.float64)
    for kw in ({"std_floor": 1e-9}, {"std_shrink": 1e-9}):
        assert obj.standardize_scores(s, **kw).abs().max() < 1e-6
        torch.testing.assert_close(obj.standardize_scores(s, **kw), obj.standardize_scores(s))


def test_adaptive_eta_reaches_small_budgets_from_a_float32_anchor():
    """The anchor was taken as float32-normalised (its probabilities sum to 1 within ~1e-7) into the float64
    bisection: KLs carried noise of that size, some negative, and a budget of 1e-7 was refused as below the KL
    'that even η = 1e4 leaves' although the true KL there is ~1e-8 (mnist-projections' methods=kl1e-7)."""
    import torch

    from targetpo.objectives.scores import standardize_scores
    from targetpo.objectives.tpo import _kl_to_old, adaptive_eta

    g = torch.Generator().manual_seed(0)
    # float32, as a model gives it (this folder's tests default to float64)
    log_old = torch.log_softmax(3 * torch.randn(2000, 10, generator=g, dtype=torch.float32), dim=-1)
    u = standardize_scores(torch.randn(2000, 10, generator=g, dtype=torch.float64))
    exact = torch.log_softmax(log_old.double(), dim=-1)
    for budget in (1e-7, 3e-7, 1e-6):
        eta = adaptive_eta(log_old, u, budget)
        kl = _kl_to_old(exact, u, eta, None)
        assert budget * (1 - 1e-6) <= float(kl.min()) <= float(kl.max()) <= budget * (1 + 1e-6)


@pytest.mark.parametrize("k", [2, 3, 10, 50])
def test_every_budget_above_the_floor_is_reached_in_every_group(k):
    """adaptive_kl_floor(k) bounds the KL any group of k keeps at the largest η (Hoeffding): the worst groups (one
    outlier score, the anchor's mass where it helps least) stay below it, so configs can refuse smaller budgets
    up front and never meet an unreachable one mid-run."""
    from targetpo.objectives.tpo import _kl_to_old, adaptive_kl_floor

    g = torch.Generator().manual_seed(k)
    log_old = torch.log_softmax(4 * torch.randn(5000, k, generator=g, dtype=torch.float64), dim=-1)
    scores = torch.zeros(5000, k, dtype=torch.float64)
    scores[:, 0], scores[:, 1] = 1.0, -1.0                          # the z-score range's maximum, √(2k)
    # ... with half of the anchor on each extreme, where the KL is largest (the floor used to assume the one-hot
    # range k/√(k−1), and budgets between the two were refused mid-run for k = 10)
    log_old[:2500] = torch.log(torch.tensor([0.5, 0.5] + [1e-12] * (k - 2), dtype=torch.float64))
    u = obj.standardize_scores(scores)
    kl = _kl_to_old(log_old, u, torch.tensor(ADAPTIVE_ETA_BRACKET[1], dtype=torch.float64), None)
    assert float(kl.max()) <= adaptive_kl_floor(k) and float(kl.max()) > 0.9 * adaptive_kl_floor(k)
    obj.adaptive_eta(log_old, u, adaptive_kl_floor(k))             # reached everywhere: no refusal
