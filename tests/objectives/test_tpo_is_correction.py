"""TPO's truncated importance correction of the anchor (`is_clip`, docs/method.md §8) against independent math:
the target q_i ∝ μ_i·min(c̄, π_i/μ_i)·exp(u_i/η) written out in numpy, autograd's gradient p − q, the on-policy
case (π = μ) equal to plain TPO for every c̄, the truncation bound and both limits of c̄, option validation."""

import math

import numpy as np
import pytest
import torch

from targetpo.objectives import (
    corrected_anchor, tpo_loss, tpo_sequence_loss, tpo_token_loss, truncated_is_weights,
)

pytestmark = pytest.mark.usefixtures("float64")  # tests/objectives/conftest.py


def _batch(g=6, k=5, seed=0, drift=1.5):
    gen = torch.Generator().manual_seed(seed)
    old = torch.randn(g, k, generator=gen)  # behaviour logits (μ)
    logits = old + drift * torch.randn(g, k, generator=gen) + 3.0  # current logits: moved on (+ a per-group shift)
    scores = torch.rand(g, k, generator=gen)
    return logits, old, scores


def _numpy_target(logits, old, scores, eta, c_bar):
    """q_i = μ_i c_i e^{u_i/η} / Σ_j μ_j c_j e^{u_j/η}, c_i = min(c̄, π_i/μ_i), u the population z-score."""
    z, zo, s = (np.asarray(t.detach(), dtype=np.float64) for t in (logits, old, scores))
    pi = np.exp(z - z.max(-1, keepdims=True))
    pi /= pi.sum(-1, keepdims=True)
    mu = np.exp(zo - zo.max(-1, keepdims=True))
    mu /= mu.sum(-1, keepdims=True)
    u = (s - s.mean(-1, keepdims=True)) / s.std(-1, keepdims=True)
    c = np.minimum(c_bar, pi / mu)
    w = mu * c * np.exp(u / eta)
    return w / w.sum(-1, keepdims=True), pi, mu, c, u


@pytest.mark.parametrize("c_bar", [0.3, 1.0, 2.0, 50.0])
@pytest.mark.parametrize("eta", [0.5, 1.0])
def test_gradient_is_p_minus_the_corrected_target(c_bar, eta):
    logits, old, scores = _batch()
    z = logits.clone().requires_grad_(True)
    out = tpo_loss(z, old, scores, eta=eta, is_clip=c_bar)
    out.loss.backward()
    loss = float(out.loss.detach())
    q, pi, mu, c, _ = _numpy_target(logits, old, scores, eta, c_bar)
    np.testing.assert_allclose(z.grad.numpy(), (pi - q) / len(q), rtol=1e-10, atol=1e-13)
    # The loss is the cross-entropy to that q, averaged over groups.
    assert math.isclose(loss, float(-(q * np.log(pi)).sum(-1).mean()), rel_tol=1e-10)
    assert math.isclose(float(out.metrics["frac_truncated"]), float((pi / mu > c_bar).mean()), rel_tol=1e-12)
    if c_bar <= 2:
        assert 0 < float(out.metrics["frac_truncated"]) < 1  # the batch exercises both branches of the min


@pytest.mark.parametrize("c_bar", [1e-3, 0.5, 1.0, 4.0, 1e6])
def test_on_policy_is_plain_tpo(c_bar):
    _, old, scores = _batch(seed=1)
    for logits in (old, old - 7.0):  # π = μ (logits differ by a per-group constant only)
        a = logits.clone().requires_grad_(True)
        b = logits.clone().requires_grad_(True)
        plain, corrected = tpo_loss(a, old, scores), tpo_loss(b, old, scores, is_clip=c_bar)
        plain.loss.backward()
        corrected.loss.backward()
        assert math.isclose(float(plain.loss.detach()), float(corrected.loss.detach()), rel_tol=1e-13, abs_tol=1e-14)
        torch.testing.assert_close(a.grad, b.grad, rtol=0, atol=1e-14)
        assert float(corrected.metrics["frac_truncated"]) == (1.0 if c_bar < 1 else 0.0)


def test_truncation_bound_and_limits():
    logits, old, scores = _batch(seed=2, drift=3.0)
    log_p, log_mu = torch.log_softmax(logits, -1), torch.log_softmax(old, -1)
    for c_bar in (0.5, 1.0, 3.0):
        c = truncated_is_weights(log_p, log_mu, c_bar)
        ratio = (log_p - log_mu).exp()
        assert float(c.max()) <= c_bar * (1 + 1e-12)
        torch.testing.assert_close(c, torch.minimum(ratio, torch.full_like(ratio, c_bar)))
        # The anchor is μ·c renormalised: a_i / μ_i ∝ c_i, so no candidate's anchor weight exceeds c̄ times its
        # weight under μ relative to the least-weighted candidate's.
        a = corrected_anchor(logits, old, c_bar).exp()
        implied = a / log_mu.exp()
        torch.testing.assert_close(implied / implied.amax(-1, keepdim=True), c / c.amax(-1, keepdim=True))
    # c̄ → ∞: the anchor is the current policy (full correction); c̄ → 0: it is μ again (plain TPO).
    torch.testing.assert_close(corrected_anchor(logits, old, 1e12), log_p)
    torch.testing.assert_close(corrected_anchor(logits, old, 1e-12), log_mu)
    plain = tpo_loss(logits, old, scores).loss
    assert math.isclose(float(tpo_loss(logits, old, scores, is_clip=1e-12).loss), float(plain), rel_tol=1e-12)
    full = tpo_loss(logits, logits, scores).loss  # plain TPO anchored on the current policy
    assert math.isclose(float(tpo_loss(logits, old, scores, is_clip=1e12).loss), float(full), rel_tol=1e-12)
    assert not math.isclose(float(plain), float(full), rel_tol=1e-3)  # the case distinguishes the limits


def test_masked_candidates_keep_zero_target():
    logits, old, scores = _batch(seed=3)
    mask = torch.ones_like(scores, dtype=torch.bool)
    mask[:, -1] = False
    z = logits.clone().requires_grad_(True)
    out = tpo_loss(z, old, scores, mask=mask, is_clip=2.0)
    out.loss.backward()
    q, pi, *_ = _numpy_target(logits[:, :-1], old[:, :-1], scores[:, :-1], 1.0, 2.0)
    np.testing.assert_allclose(z.grad[:, :-1].numpy(), (pi - q) / len(q), rtol=1e-10, atol=1e-13)
    assert float(z.grad[:, -1].abs().max()) < 1e-300


def test_sequence_and_token_forms_forward_the_option():
    gen = torch.Generator().manual_seed(4)
    lp, old = -torch.rand(3, 4, 6, generator=gen), -torch.rand(3, 4, 6, generator=gen)
    scores = torch.rand(3, 4, generator=gen)
    seq = tpo_sequence_loss(lp, old, scores, is_clip=1.5).loss
    assert math.isclose(float(seq), float(tpo_loss(lp.sum(-1), old.sum(-1), scores, is_clip=1.5).loss), rel_tol=1e-12)
    assert not math.isclose(float(seq), float(tpo_sequence_loss(lp, old, scores).loss), rel_tol=1e-6)
    token_logp = torch.randn(5, 9, generator=gen)
    cand = torch.randint(9, (5, 3), generator=gen)
    old_c, sc = torch.randn(5, 3, generator=gen), torch.rand(5, 3, generator=gen)
    direct = tpo_loss(torch.log_softmax(token_logp, -1).gather(-1, cand), old_c, sc, is_clip=2.0).loss
    assert math.isclose(float(tpo_token_loss(token_logp, cand, old_c, sc, is_clip=2.0).loss), float(direct),
                        rel_tol=1e-12)


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf"), True, "1"])
def test_bad_is_clip_is_refused(bad):
    logits, old, scores = _batch()
    with pytest.raises(ValueError, match="is_clip"):
        tpo_loss(logits, old, scores, is_clip=bad)


def test_is_clip_needs_the_anchor():
    logits, old, scores = _batch()
    with pytest.raises(ValueError, match="is_clip=2.0.*anchor=False"):
        tpo_loss(logits, old, scores, is_clip=2.0, anchor=False)
