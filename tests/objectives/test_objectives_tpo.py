"""TPO against independent math: the closed-form gradient, the variational characterisation of q, invariances."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from targetpo.objectives import (
    sequence_logp,
    standardize_scores,
    tpo_loss,
    tpo_sequence_loss,
    tpo_target,
    tpo_token_loss,
)



pytestmark = pytest.mark.usefixtures("float64")  # tests/objectives/conftest.py


def _group(g=5, k=8, seed=0):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(g, k, generator=gen)
    old = logits + 0.3 * torch.randn(g, k, generator=gen)
    scores = torch.rand(g, k, generator=gen)
    return logits, old, scores


def test_gradient_on_group_logits_is_p_minus_q():
    logits, old, scores = _group()
    logits.requires_grad_(True)
    tpo_loss(logits, old, scores, eta=0.7).loss.backward()
    p = torch.softmax(logits.detach(), -1)
    q = tpo_target(old, scores, eta=0.7)
    # The loss averages over G groups, so each group's gradient carries 1/G.
    torch.testing.assert_close(logits.grad * logits.shape[0], p - q)


def test_target_is_anchor_times_exponentiated_scores():
    logits, old, scores = _group()
    u = (scores - scores.mean(-1, keepdim=True)) / scores.std(-1, unbiased=False, keepdim=True)
    w = torch.softmax(old, -1) * torch.exp(u / 1.5)
    torch.testing.assert_close(tpo_target(old, scores, eta=1.5), w / w.sum(-1, keepdim=True))


def test_zero_variance_group_gives_exactly_zero_gradient_in_first_epoch():
    logits = torch.randn(3, 6, requires_grad=True)
    scores = torch.full((3, 6), 0.25)
    out = tpo_loss(logits, logits.detach(), scores)
    out.loss.backward()
    assert torch.all(logits.grad.abs() < 1e-15)
    assert out.metrics["frac_zero_var"] == 1.0


def test_zero_variance_group_pulls_back_toward_old_policy_in_later_epochs():
    old = torch.randn(1, 6)
    logits = (old + torch.randn(1, 6)).requires_grad_(True)
    tpo_loss(logits, old, torch.zeros(1, 6)).loss.backward()
    torch.testing.assert_close(-logits.grad, torch.softmax(old, -1) - torch.softmax(logits.detach(), -1))


def test_target_invariant_to_constant_shift_of_old_logp_and_affine_maps_of_scores():
    _, old, scores = _group()
    q = tpo_target(old, scores)
    torch.testing.assert_close(tpo_target(old + torch.randn(old.shape[0], 1) * 10, scores), q)
    a = torch.rand(old.shape[0], 1) * 5 + 0.1
    b = torch.randn(old.shape[0], 1) * 3
    torch.testing.assert_close(tpo_target(old, a * scores + b), q)


def _objective(q, u, p_old, eta):
    return (q * u).sum(-1) - eta * (q * (q.log() - p_old.log())).sum(-1)


@pytest.mark.parametrize("eta", [0.3, 1.0, 4.0])
def test_target_maximises_expected_score_minus_kl_to_anchor(eta):
    _, old, scores = _group(g=4, k=6, seed=3)
    q = tpo_target(old, scores, eta=eta)
    u = standardize_scores(scores)
    p_old = torch.softmax(old, -1)
    best = _objective(q, u, p_old, eta)
    gen = torch.Generator().manual_seed(1)
    for scale in (1e-3, 1e-2, 0.1, 1.0):
        for _ in range(50):
            other = torch.softmax(q.log() + scale * torch.randn(q.shape, generator=gen), -1)
            assert torch.all(_objective(other, u, p_old, eta) <= best + 1e-12)


def test_large_eta_recovers_anchor_and_small_eta_concentrates_on_best():
    _, old, scores = _group()
    torch.testing.assert_close(tpo_target(old, scores, eta=1e8), torch.softmax(old, -1), atol=1e-7, rtol=0)
    q = tpo_target(old, scores, eta=1e-6)
    assert torch.equal(q.argmax(-1), scores.argmax(-1))
    assert torch.all(q.max(-1).values > 0.999)


def test_no_anchor_target_ignores_old_policy():
    _, old, scores = _group()
    q = tpo_target(old, scores, anchor=False)
    torch.testing.assert_close(q, torch.softmax(standardize_scores(scores), -1))
    # The authors' unit test: with p_old = [0.7, 0.2, 0.1] and scores [1, 0, -1] the anchor adds mass to candidate 0.
    lp = torch.log(torch.tensor([[0.7, 0.2, 0.1]]))
    s = torch.tensor([[1.0, 0.0, -1.0]])
    assert tpo_target(lp, s)[0, 0] > tpo_target(lp, s, anchor=False)[0, 0]


def test_binary_scores_closed_form_u():
    scores = torch.zeros(1, 8)
    scores[0, 0] = 1.0
    u = standardize_scores(scores)
    assert math.isclose(u[0, 0].item(), math.sqrt(7), rel_tol=1e-12)
    assert math.isclose(u[0, 1].item(), -1 / math.sqrt(7), rel_tol=1e-12)


def test_near_zero_variance_uses_centred_scores():
    s = torch.tensor([[1.0, 1.0 + 1e-7, 1.0]])
    u = standardize_scores(s)
    torch.testing.assert_close(u, s - s.mean())


def test_masked_candidates_get_zero_target_and_gradient_p_minus_q():
    logits, old, scores = _group(g=3, k=5)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [0, 1, 0, 1, 1]], dtype=torch.bool)
    q = tpo_target(old, scores, mask=mask)
    assert torch.all(q[~mask] == 0)
    torch.testing.assert_close(q.sum(-1), torch.ones(3))
    # Identical to dropping the masked candidates.
    keep = mask[0]
    torch.testing.assert_close(q[0, keep], tpo_target(old[0:1, keep], scores[0:1, keep])[0])
    logits.requires_grad_(True)
    tpo_loss(logits, old, scores, mask=mask).loss.backward()
    p = torch.softmax(logits.detach().masked_fill(~mask, -torch.inf), -1)
    torch.testing.assert_close(logits.grad * 3, p - q)


@settings(max_examples=60, deadline=None)
@given(g=st.integers(1, 6), k=st.integers(2, 12), eta=st.floats(0.05, 20.0), seed=st.integers(0, 10_000),
       binary=st.booleans())
def test_property_gradient_and_normalisation(g, k, eta, seed, binary):
    gen = torch.Generator().manual_seed(seed)
    logits = (3 * torch.randn(g, k, generator=gen)).requires_grad_(True)
    old = 3 * torch.randn(g, k, generator=gen)
    scores = (torch.rand(g, k, generator=gen) < 0.3).double() if binary else torch.randn(g, k, generator=gen)
    mask = torch.rand(g, k, generator=gen) < 0.8
    mask[:, 0] = True
    out = tpo_loss(logits, old, scores, eta=eta, mask=mask)
    out.loss.backward()
    q = tpo_target(old, scores, eta=eta, mask=mask)
    assert torch.all(q >= 0) and torch.all(q[~mask] == 0)
    torch.testing.assert_close(q.sum(-1), torch.ones(g))
    p = torch.softmax(logits.detach().masked_fill(~mask, -torch.inf), -1)
    torch.testing.assert_close(logits.grad * g, p - q, atol=1e-10, rtol=1e-7)
    assert out.metrics["kl_q_p"] >= -1e-9 and out.metrics["target_entropy"] >= -1e-9


def test_finite_differences():
    logits, old, scores = _group(g=2, k=4)
    logits.requires_grad_(True)
    assert torch.autograd.gradcheck(lambda x: tpo_loss(x, old, scores, eta=0.8).loss, (logits,))


def test_token_loss_equals_group_loss_on_gathered_candidates():
    gen = torch.Generator().manual_seed(0)
    token_logits = torch.randn(4, 3, 5, generator=gen, requires_grad=True)  # [B, H, V]
    cands = torch.randint(0, 5, (4, 3, 8), generator=gen)  # duplicates are kept
    old = torch.randn(4, 3, 8, generator=gen)
    scores = (cands == 2).double()
    a = tpo_token_loss(token_logits, cands, old, scores)
    gathered = torch.gather(torch.log_softmax(token_logits, -1), -1, cands)
    b = tpo_loss(gathered, old, scores)
    torch.testing.assert_close(a.loss, b.loss)
    with pytest.raises(ValueError, match="candidates"):
        tpo_token_loss(token_logits, cands + 5, old, scores)


def test_sequence_loss_reductions_and_gradient_on_sequence_scores():
    gen = torch.Generator().manual_seed(0)
    tok = torch.randn(3, 4, 6, generator=gen).log_softmax(-1)[..., :5].clone().requires_grad_(True)
    tm = torch.ones(3, 4, 5, dtype=torch.bool)
    tm[:, :, 3:] = torch.rand(3, 4, 2, generator=gen) > 0.5
    old = tok.detach() + 0.05 * torch.randn(3, 4, 5, generator=gen)
    scores = torch.rand(3, 4, generator=gen)
    for red in ("sum", "mean"):
        seq = sequence_logp(tok, tm, red)
        ref = (tok * tm).sum(-1) / (tm.sum(-1) if red == "mean" else 1)
        torch.testing.assert_close(seq, ref)
        out = tpo_sequence_loss(tok, old, scores, token_mask=tm, seq_logp=red)
        torch.testing.assert_close(out.loss, tpo_loss(ref, sequence_logp(old, tm, red), scores).loss)
    # The gradient on each sequence's score is p − q.
    seq = sequence_logp(tok, tm).detach().requires_grad_(True)
    tpo_loss(seq, sequence_logp(old, tm), scores).loss.backward()
    q = tpo_target(sequence_logp(old, tm), scores)
    torch.testing.assert_close(seq.grad * 3, torch.softmax(seq.detach(), -1) - q)


def test_half_precision_inputs_are_computed_in_float32():
    logits, old, scores = _group()
    out16 = tpo_loss(logits.bfloat16(), old.bfloat16(), scores.bfloat16())
    assert out16.loss.dtype == torch.float32
    ref = tpo_loss(logits.bfloat16().double(), old.bfloat16().double(), scores.bfloat16().double())
    assert abs(out16.loss.item() - ref.loss.item()) < 1e-5


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(logp=torch.randn(2, 4), old_logp=torch.randn(2, 5), scores=torch.randn(2, 4)), "shape"),
        (dict(logp=torch.randn(2, 1), old_logp=torch.randn(2, 1), scores=torch.randn(2, 1)), "K >= 2"),
        (dict(logp=torch.randn(2, 4), old_logp=torch.randn(2, 4), scores=torch.tensor([[0.0, float("nan"), 1, 1]] * 2)),
         "scores contains 2 NaN"),
        (dict(logp=torch.tensor([[0.0, float("inf"), 1, 1]]), old_logp=torch.randn(1, 4), scores=torch.randn(1, 4)),
         "logp contains 1 NaN/inf"),
        (dict(logp=torch.randn(2, 4), old_logp=torch.randn(2, 4), scores=torch.randn(2, 4),
              mask=torch.tensor([[True] * 4, [False] * 4])), "masks out every candidate"),
        (dict(logp=torch.randn(2, 4), old_logp=torch.randn(2, 4), scores=torch.randn(2, 4), eta=0.0), "eta"),
    ],
)
def test_bad_input_raises_a_clear_error(kwargs, match):
    with pytest.raises(ValueError, match=match):
        tpo_loss(**kwargs)
