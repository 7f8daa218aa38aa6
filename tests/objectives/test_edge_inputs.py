"""Inputs at the edges of what an objective takes: padding that holds any log-prob, temperatures and divergences
near their limits, labels and rewards of the wrong kind, and layouts that must give the same loss.

Each test states the contract it checks (module docstrings of `targetpo.objectives`): masked entries contribute
nothing, not even a NaN gradient; float32 agrees with float64 where the math is finite; bad input raises an
error naming the argument; nothing is silently dropped or cast.
"""

import inspect
import math

import numpy as np
import pytest
import torch

from targetpo import objectives as obj
from targetpo.objectives.groups import tpo_group_loss

G, K, T = 2, 4, 3


def _randn(*shape, seed=0, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


# ----------------------------------------------------------------------------- padding holds any log-prob

PER_TOKEN = [n for n in obj.available() if obj.get(n).per_token_fn is not None]


def _padded_call(fn, pad_logp: float, pad_old: float):
    """The objective's per-token form on a batch whose one padding token holds (pad_logp, pad_old); returns the
    loss and the gradient on logp. The log-ratio clamp is off where the objective has one (TRL's setting)."""
    logp, old = _randn(G, K, T, seed=1) - 1.0, _randn(G, K, T, seed=2) - 1.0
    logp[0, 0, -1], old[0, 0, -1] = pad_logp, pad_old
    logp.requires_grad_(True)
    tm = torch.ones(G, K, T, dtype=torch.bool)
    tm[0, 0, -1] = False
    kw = {"log_ratio_clip": None} if "log_ratio_clip" in inspect.signature(fn).parameters else {}
    torch.manual_seed(0)  # Clip-Cov draws the tokens it detaches from the global generator
    out = fn(logp, old, _randn(G, K, seed=3), token_mask=tm, **kw)
    out.loss.backward()
    return out, logp.grad


@pytest.mark.parametrize("name", PER_TOKEN)
def test_a_padding_token_with_an_extreme_log_ratio_changes_nothing(name):
    """log π − log π_old = 199 on a masked token: exp() overflows there, and before the fix the masked term's
    zero gradient times ∞ made the whole gradient NaN (PPO, Clip-Cov, KL-Cov; GRPO/DAPO/SAPO with TRL's settings)."""
    fn = obj.get(name).per_token_fn
    ref, ref_grad = _padded_call(fn, -1.0, -1.0)
    out, grad = _padded_call(fn, -1.0, -200.0)
    assert torch.isfinite(grad).all(), (name, grad)
    assert torch.allclose(out.loss, ref.loss, atol=1e-6), (name, out.loss, ref.loss)
    assert torch.allclose(grad, ref_grad, atol=1e-6), name
    assert grad[0, 0, -1] == 0
    for k, v in out.metrics.items():
        assert torch.isfinite(v).all() and torch.allclose(v, ref.metrics[k], atol=1e-6), (name, k, v, ref.metrics[k])


@pytest.mark.parametrize("name", PER_TOKEN)
@pytest.mark.parametrize("first", ["best", "worst", "tied"])
def test_a_valid_token_with_an_overflowing_ratio_gives_no_nan(name, first):
    """log π − log π_old = 199 on a *valid* token (a very stale sample; the log-ratio clamp off, TRL's setting):
    ρ is ∞ there. The loss may be ±∞ where the math is (an unclipped ratio term), but neither it nor any gradient is
    NaN: on a clipped or zero-advantage branch, or a detached Clip-Cov token, the term and its gradient are 0, not
    0·∞. Its candidate is the group's best, worst, or in a tied group (A = 0)."""
    fn = obj.get(name).per_token_fn
    logp, old = _randn(G, K, T, seed=1) - 1.0, _randn(G, K, T, seed=2) - 1.0
    old[0, 0, 1] = -200.0
    logp.requires_grad_(True)
    scores = _randn(G, K, seed=3)
    if first == "tied":
        scores[0] = 1.0
    else:
        scores[0, 0] = 5.0 if first == "best" else -5.0
    kw = {"log_ratio_clip": None} if "log_ratio_clip" in inspect.signature(fn).parameters else {}
    torch.manual_seed(0)  # Clip-Cov's pick
    out = fn(logp, old, scores, token_mask=torch.ones(G, K, T, dtype=torch.bool), **kw)
    out.loss.backward()
    assert not out.loss.isnan() and not logp.grad.isnan().any(), (name, out.loss, logp.grad)
    # A finite loss unless an unclipped term holds ρ = ∞: A < 0 in the GRPO family, any A ≠ 0 in KL-Cov's −Aρ.
    # TPO reads old log-probs only through its target, so it stays finite.
    may_be_infinite = (first == "worst" and not name.startswith("tpo")) or (name == "kl_cov" and first != "tied")
    assert torch.isfinite(out.loss) or may_be_infinite, (name, out.loss)


def test_ppo_ratio_metric_counts_valid_tokens_only():
    lp = torch.full((2, 3), -1.0, requires_grad=True)
    old = torch.full((2, 3), -1.0)
    old[0, 2] = -200.0
    tm = torch.ones(2, 3, dtype=torch.bool)
    tm[0, 2] = False
    out = obj.ppo_loss(lp, old, torch.ones(2, 3), token_mask=tm)
    out.loss.backward()
    assert out.metrics["ratio_mean"] == 1.0 and lp.grad[0, 2] == 0 and torch.isfinite(lp.grad).all()


def test_grpo_kl_ignores_padding_reference_log_probs():
    """The k3 term on a padding token whose reference log-prob is far off stays out of the loss and the gradient."""
    logp = _randn(G, K, T, seed=4).requires_grad_(True)
    ref = logp.detach().clone()
    tm = torch.ones(G, K, T, dtype=torch.bool)
    tm[1, 2, 0] = False
    far = ref.clone()
    far[1, 2, 0] = -300.0
    scores = _randn(G, K, seed=5)
    a = obj.grpo_loss(logp, logp.detach(), scores, token_mask=tm, ref_logp=ref, log_ratio_clip=None)
    b = obj.grpo_loss(logp, logp.detach(), scores, token_mask=tm, ref_logp=far, log_ratio_clip=None)
    (g,) = torch.autograd.grad(b.loss, logp)
    assert torch.allclose(a.loss, b.loss) and torch.isfinite(g).all() and g[1, 2, 0] == 0


# ----------------------------------------------------------------------------- limits of η and α

def test_a_temperature_so_small_that_u_over_eta_overflows_is_refused():
    x = torch.zeros(1, 4, requires_grad=True)
    with pytest.raises(ValueError, match=r"eta=1e-40 is too small for torch.float32: u/eta overflows"):
        obj.tpo_loss(x, torch.zeros(1, 4), torch.tensor([[0.0, 1, 0, 0]]), eta=1e-40)
    # The smallest η that fits still gives the finite loss of a one-hot target (q on the best candidate).
    out = obj.tpo_loss(x, torch.zeros(1, 4), torch.tensor([[0.0, 1, 0, 0]]), eta=1e-37)
    out.loss.backward()
    assert torch.allclose(out.loss, torch.tensor(np.log(4.0), dtype=torch.float32))
    assert torch.allclose(x.grad, torch.tensor([[0.25, -0.75, 0.25, 0.25]]))


@pytest.mark.parametrize("alpha", [1e-9, 1e-7, 1e-4, 1 - 1e-4, 1 - 1e-7])
def test_alpha_projection_in_float32_is_accurate_near_both_ends(alpha):
    """D_α = (1 − S)/(α(1 − α)) with 1 − S ~ α: float32 cannot hold S = 1 − 1e-9, so 1 − S must be formed
    from terms that can (before: α = 1e-9 gave a loss of 0 and a gradient 50× too large)."""
    z, old, s = _randn(3, 5, seed=0, dtype=torch.float64), _randn(3, 5, seed=1, dtype=torch.float64), \
        _randn(3, 5, seed=2, dtype=torch.float64)
    z64, z32 = z.clone().requires_grad_(True), z.float().requires_grad_(True)
    l64 = obj.tpo_loss(z64, old, s, projection="alpha", alpha=alpha).loss
    l32 = obj.tpo_loss(z32, old.float(), s.float(), projection="alpha", alpha=alpha).loss
    l64.backward()
    l32.backward()
    assert abs(l32.item() - l64.item()) < 1e-6 * abs(l64.item()) + 1e-7, (l32.item(), l64.item())
    assert torch.allclose(z32.grad.double(), z64.grad, atol=1e-6)


def test_alpha_projection_survives_a_candidate_far_likelier_under_one_distribution():
    """An exponent α·(log q − log p) of several hundred (logits ±1e3) takes the log-space branch: finite loss
    and gradient, equal to the float64 value."""
    z = _randn(3, 5, seed=6, dtype=torch.float64) * 1e3
    old, s = _randn(3, 5, seed=7, dtype=torch.float64), _randn(3, 5, seed=8, dtype=torch.float64)
    for alpha in (0.3, 0.8):
        z64, z32 = z.clone().requires_grad_(True), z.float().requires_grad_(True)
        l64 = obj.tpo_loss(z64, old, s, projection="alpha", alpha=alpha).loss
        l32 = obj.tpo_loss(z32, old.float(), s.float(), projection="alpha", alpha=alpha).loss
        l64.backward()
        l32.backward()
        assert torch.isfinite(l32) and torch.isfinite(z32.grad).all()
        assert torch.allclose(l32.double(), l64, rtol=1e-5) and torch.allclose(z32.grad.double(), z64.grad, atol=1e-5)


# ----------------------------------------------------------------------------- scores at the edge of float32

def test_scores_near_float32_max_standardize_to_finite_z_scores():
    s = torch.tensor([-3e38, 3e38, 3e38, 1.0])
    u = obj.standardize_scores(s)
    ref = obj.standardize_scores(s.double()).float()
    assert torch.isfinite(u).all() and torch.allclose(u, ref, atol=1e-6)
    a = obj.group_advantages(s)
    assert torch.isfinite(a).all() and torch.allclose(a, u, atol=1e-6)
    loss = obj.grpo_loss(torch.zeros(1, 4), torch.zeros(1, 4), s[None]).loss
    assert torch.isfinite(loss)


# ----------------------------------------------------------------------------- bad values, named

def test_ce_loss_takes_integer_labels_in_range_only():
    logits = torch.tensor([[0.0, 5, 0, 0]])
    with pytest.raises(TypeError, match="labels must be an integer tensor of class ids, got torch.float32"):
        obj.ce_loss(logits, torch.tensor([1.9]))
    for bad in (4, -1):
        with pytest.raises(ValueError, match=r"labels must lie in \[0, 4\)"):
            obj.ce_loss(logits, torch.tensor([bad]))
    assert torch.allclose(obj.ce_loss(logits, torch.tensor([1], dtype=torch.int32)).loss,
                          -torch.log_softmax(logits, -1)[0, 1])


def test_an_infinite_reward_is_refused_and_nan_still_means_unscorable():
    lp = -_randn(4, 3, seed=9).abs()
    with pytest.raises(ValueError, match=r"rewards contains 1 ±inf value"):
        tpo_group_loss(lp, lp, torch.tensor([1.0, float("inf"), 0, 0]), torch.ones(4, 3), 4)
    loss, metrics = tpo_group_loss(lp, lp, torch.tensor([1.0, float("nan"), 0, 0]), torch.ones(4, 3), 4)
    assert torch.isfinite(loss)


def test_complex_inputs_are_refused_not_cast():
    with pytest.raises(TypeError, match="scores has the complex dtype"):
        obj.tpo_loss(_randn(2, 3), _randn(2, 3), torch.randn(2, 3, dtype=torch.complex64))


def test_a_list_where_a_tensor_belongs_is_a_type_error_naming_it():
    with pytest.raises(TypeError, match="old_logp must be a torch.Tensor, got list"):
        obj.tpo_loss(_randn(2, 3), [[0.0, 0, 0]] * 2, _randn(2, 3))


def test_anchor_must_be_a_bool():
    with pytest.raises(TypeError, match="anchor='no'"):
        obj.tpo_loss(_randn(2, 3), _randn(2, 3), _randn(2, 3), anchor="no")


def test_numpy_scalars_are_numbers():
    a = obj.tpo_loss(_randn(2, 3), _randn(2, 3, seed=1), _randn(2, 3, seed=2), eta=0.5).loss
    b = obj.tpo_loss(_randn(2, 3), _randn(2, 3, seed=1), _randn(2, 3, seed=2), eta=np.float32(0.5)).loss
    c = obj.grpo_loss(_randn(2, 3), _randn(2, 3), _randn(2, 3), std_ddof=np.int64(1)).loss
    assert a == b and torch.isfinite(c)


@pytest.mark.parametrize("clip_eps", [1.0, 1.5])
def test_clip_range_must_keep_the_lower_bound_positive(clip_eps):
    with pytest.raises(ValueError, match=rf"^clip_eps={clip_eps}: must be in \(0, 1\)"):
        obj.ppo_loss(_randn(3), _randn(3), _randn(3), clip_eps=clip_eps)


def test_grpo_refuses_a_reference_it_would_ignore():
    with pytest.raises(ValueError, match="ref_logp is only used by the KL term, which beta=0 turns off"):
        obj.grpo_loss(_randn(2, 3), _randn(2, 3), _randn(2, 3), beta=0.0, ref_logp=_randn(2, 3))
    with pytest.raises(ValueError, match="ref_logp is only used"):
        obj.get("grpo_no_kl").fn(_randn(2, 3), _randn(2, 3), _randn(2, 3), ref_logp=_randn(2, 3))


def test_candidate_ids_of_any_integer_dtype_give_the_same_loss():
    tl, old, s = _randn(2, 6), _randn(2, 3, seed=1), _randn(2, 3, seed=2)
    ids = torch.tensor([[0, 1, 5], [2, 3, 3]])
    ref = obj.tpo_token_loss(tl, ids, old, s).loss
    for dtype in (torch.int16, torch.uint8, torch.int32):
        assert obj.tpo_token_loss(tl, ids.to(dtype), old, s).loss == ref
    with pytest.raises(TypeError, match="candidates must be an integer tensor"):
        obj.tpo_token_loss(tl, ids.float(), old, s)


def test_a_top_k_masked_vocabulary_may_hold_minus_inf_where_no_candidate_is():
    """−inf anywhere in token_logp was refused, even at tokens a top-k sampler never draws: the loss and gradient
    are those of any finite stand-in whose exp underflows to 0. At a candidate, and +inf anywhere, it is refused."""
    tl, old, s = _randn(2, 6), _randn(2, 3, seed=1), _randn(2, 3, seed=2)
    ids = torch.tensor([[0, 1, 5], [2, 3, 3]])
    masked = torch.tensor([[False, False, True, True, False, False], [True, False, False, False, True, True]])
    outs = []
    for fill in (-math.inf, -1e4):  # exp(−1e4 − max) is 0 in float32 too
        x = tl.masked_fill(masked, fill).requires_grad_(True)
        out = obj.tpo_token_loss(x, ids, old, s)
        out.loss.backward()
        outs.append((out.loss.detach(), x.grad))
    (a, ga), (b, gb) = outs
    assert torch.isfinite(a) and torch.equal(a, b) and torch.equal(ga, gb) and not ga[masked].any()
    with pytest.raises(ValueError, match=r"token_logp is −inf at 1 candidate token\(s\) \(first at candidate "
                                         r"index \[\(0, 1\)\]\)"):
        obj.tpo_token_loss(tl.masked_fill(masked, -math.inf).index_put((torch.tensor(0), torch.tensor(1)),
                                                                        torch.tensor(-math.inf)), ids, old, s)
    with pytest.raises(ValueError, match=r"token_logp contains 1 \+inf value"):
        obj.tpo_token_loss(tl.index_put((torch.tensor(1), torch.tensor(0)), torch.tensor(math.inf)), ids, old, s)


# ----------------------------------------------------------------------------- one loss, whatever the layout

def test_rloo_with_a_mask_is_the_same_per_candidate_and_per_token():
    logp, scores = _randn(2, 4), _randn(2, 4, seed=1)
    mask = torch.ones(2, 4, dtype=torch.bool)
    mask[0, 1] = False
    a = obj.rloo_loss(logp, scores, mask=mask).loss
    b = obj.rloo_loss(logp.unsqueeze(-1), scores, mask=mask).loss
    assert torch.allclose(a, b), (a, b)


@pytest.mark.parametrize("loss_agg", ["sum-mean", "mean"])
def test_grpo_masked_normalises_by_informative_groups_in_every_candidate_mode(loss_agg):
    logp, scores = _randn(2, 4), torch.tensor([[1.0, 0, 1, 0], [1, 1, 1, 1]])
    old = logp * 1.1
    both = obj.grpo_loss(logp, old, scores, mask_zero_var=True, loss_agg=loss_agg, beta=0.0).loss
    informative = obj.grpo_loss(logp[:1], old[:1], scores[:1], loss_agg=loss_agg, beta=0.0).loss
    assert torch.allclose(both, informative), (both, informative)


# ----------------------------------------------------------------------------- what a registered variant fixes

@pytest.mark.parametrize("name,keyword,other", [("grpo_no_kl", "beta", 0.04), ("tpo_reverse_kl", "projection", "js"),
                                                ("tpo_hellinger", "alpha", 0.3), ("grpo_masked", "mask_zero_var", False)])
def test_a_registered_variant_refuses_to_be_overridden(name, keyword, other):
    o = obj.get(name)
    fixed = inspect.signature(o.fn).parameters[keyword].default
    args = (_randn(2, 4), _randn(2, 4, seed=1), _randn(2, 4, seed=2))
    for fn in (o.fn, o.per_token_fn):
        with pytest.raises(ValueError, match=rf"^{keyword}={other!r}: the objective '{name}' fixes {keyword}="):
            fn(*args, **{keyword: other})
    # Passing the value it fixes is what a generic caller (the LLM trainer) does, and stays allowed.
    assert o.fn(*args, **{keyword: fixed}).loss == o.fn(*args).loss


@pytest.mark.parametrize("name", PER_TOKEN)
def test_an_integer_0_1_token_mask_is_refused_with_how_to_convert_it(name):
    """TRL's completion_mask and verl's response_mask are 0/1 integers: refused (masks are bool), saying how."""
    logp = -torch.rand(G, K, T)
    mask = torch.ones(G, K, T, dtype=torch.long)
    with pytest.raises(TypeError, match=r"token_mask must be a bool tensor .*got torch.int64; "
                                         r"a 0/1 mask \(TRL.s completion_mask.*\.bool\(\)"):
        obj.get(name).per_token_fn(logp, logp, torch.rand(G, K), token_mask=mask)


GROUPED = [n for n in obj.available() if obj.get(n).needs_groups and obj.get(n).level in ("group", "sequence")
           and n != "tpo_no_anchor"]  # tpo_no_anchor's target is softmax(u/η): uniform, not p_old, on a flat group


@pytest.mark.parametrize("name", GROUPED)
@pytest.mark.parametrize("score", [0.6, 0.7, 0.1, 0.3])
def test_a_group_of_equal_scores_float32_cannot_hold_gives_no_gradient(name, score):
    """K = 8 equal scores of 0.6: the float32 mean is one ulp off, so s − s̄ and σ were both ~6e-8 and GRPO's
    A = (s − s̄)/(σ + 1e-8) ≈ ±0.86 for the whole group: a push from a group with no signal (docs/method.md §3)."""
    o = obj.get(name)
    g = torch.Generator().manual_seed(0)
    shape = (3, 8) if o.level == "group" else (3, 8, 5)
    logp = -torch.rand(shape, generator=g)
    lp = logp.clone().requires_grad_(True)
    sig = inspect.signature(o.fn).parameters
    args = [lp, logp] if "old_logp" in sig else [lp]
    out = o.fn(*args, torch.full((3, 8), score))
    (grad,) = torch.autograd.grad(out.loss, lp)
    assert float(grad.abs().max()) < 1e-6, (name, float(grad.abs().max()))


def test_advantage_metrics_average_the_valid_candidates_only():
    """Masked candidates (A = u = 0) were counted: every valid |A| = |u| = 1 here, but grpo_loss reported
    adv_abs_mean 0.75 and group_pg_loss u_abs_mean 0.75 (and |u|/η rather than |u|)."""
    s = torch.tensor([[0.0, 1.0, 5.0, 5.0], [0.0, 1.0, 0.0, 1.0]])
    mask = torch.tensor([[True, True, False, False], [True, True, True, True]])
    lp = -torch.rand(2, 4)
    assert obj.grpo_loss(lp, lp, s, mask=mask).metrics["adv_abs_mean"].item() == pytest.approx(1.0, abs=1e-6)
    assert obj.group_pg_loss(lp, s, eta=0.5, mask=mask).metrics["u_abs_mean"].item() == pytest.approx(1.0, abs=1e-6)
