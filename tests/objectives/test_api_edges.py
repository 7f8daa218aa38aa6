"""The objectives as a user's own training loop calls them: layouts with leading dims, the public `aggregate`,
all-equal groups at any ε and any scale, the α range, candidates without tokens, meta tensors and wrong keywords.

Each test names the behaviour it replaces; every expected value is computed here from the docstring's equation.
"""

import inspect

import pytest
import torch

from targetpo import objectives as obj
from targetpo.objectives.groups import tpo_group_loss


def _rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


# ----------------------------------------------------------------------------- single-sample layouts

@pytest.mark.parametrize("name", ["reinforce", "ppo", "dg"])
def test_a_leading_seed_axis_gives_the_same_loss_with_and_without_an_all_true_token_mask(name):
    """[S, B, H] with an all-True token_mask came out B× larger (read as groups [G, K, T]: Σ over B and H), while
    the same batch without a mask summed H and averaged S·B, the paper's "sum-mean"."""
    logp, adv = -_rand(2, 4, 3).abs(), _rand(2, 4, 3, seed=1)
    o = obj.get(name)
    args = (logp, logp, adv) if name == "ppo" else (logp, adv)
    want = float((-adv * logp).sum(-1).mean()) if name == "reinforce" else float(o.fn(*args).loss)
    assert float(o.fn(*args).loss) == pytest.approx(want, rel=1e-6)
    assert float(o.fn(*args, token_mask=torch.ones(2, 4, 3, dtype=torch.bool)).loss) == pytest.approx(want, rel=1e-6)
    # a padding token is dropped from its row's sum, and the rows are still averaged over S·B
    tm = torch.ones(2, 4, 3, dtype=torch.bool)
    tm[1, 2, 0] = False
    if name == "reinforce":
        assert float(o.fn(*args, token_mask=tm).loss) == pytest.approx(float((-adv * logp * tm).sum(-1).mean()), rel=1e-6)


# ----------------------------------------------------------------------------- the public aggregate

@pytest.mark.parametrize("kwargs,message", [
    ({"token_mask": torch.ones(2, 3, 1, dtype=torch.bool), "per_token": True},
     "token_mask has shape (2, 3, 1) but values has shape (2, 3, 4)"),
    ({"token_mask": torch.tensor([True, True, False, False]), "per_token": True}, "token_mask has shape (4,)"),
    ({"token_mask": torch.ones(2, 3, 4), "per_token": True}, "token_mask must be a bool tensor"),
    ({"per_token": True, "norm_len": 0}, "norm_len=0: must be > 0"),
])
def test_aggregate_refuses_a_mask_that_would_broadcast_and_a_zero_length(kwargs, message):
    """A [2, 3, 1] or [4] mask broadcast onto the values (4.0 and 6.0 for a mean of ones), a float mask failed
    inside torch.where, and norm_len=0 returned inf. A wrong dtype is a TypeError, a wrong shape or value a
    ValueError."""
    with pytest.raises(TypeError if "bool tensor" in message else ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        obj.aggregate(torch.ones(2, 3, 4), "seq-mean-token-sum-norm", **kwargs)


def test_aggregate_reduces_half_precision_in_float32_and_refuses_integers():
    v = torch.full((4, 300), 1.001, dtype=torch.bfloat16)
    out = obj.aggregate(v, "token-sum", per_token=True)
    assert out.dtype == torch.float32 and float(out) == pytest.approx(float(v.float().sum()))
    with pytest.raises(TypeError, match="values must be a floating torch.Tensor"):
        obj.aggregate(torch.ones(2, 3, dtype=torch.long), "mean")


# ----------------------------------------------------------------------------- all-equal groups

@pytest.mark.parametrize("value", [0.7, 0.6, 1000.7, -3e4 + 0.1])
def test_an_all_equal_group_is_flat_at_any_eps_and_any_scale(value):
    """K copies of 0.7 have a float32 mean one ulp off, so σ ≈ 6e-8: with eps=0 every u was (s − s̄)/σ = ±1, and
    with scores near 1000 σ ≈ 6e-5 passed the default ε too (u = ±1, GRPO's A ≈ ±1). Equal scores are one number
    after centring (q = p_old), A = 0, and the group counts as zero-variance."""
    s = torch.full((2, 7), value)
    for eps in (0.0, 1e-6):
        u = obj.standardize_scores(s, eps=eps)
        assert torch.equal(u, (s - s.mean(-1, keepdim=True))), (eps, u)
        assert float(u.abs().max()) < 1e-2
    assert torch.equal(obj.group_advantages(s), torch.zeros_like(s))
    assert bool(obj.zero_variance_groups(s, eps=0.0).all())
    logp = torch.log_softmax(_rand(2, 7), -1)
    q = obj.tpo_target(logp, s)
    assert torch.allclose(q, logp.exp(), atol=1e-5)


def test_a_group_with_spread_is_standardized_as_before_at_eps_zero():
    s = torch.tensor([[0.0, 1.0, 1.0, 0.0], [0.0, 0.0, 0.0, 1.0]])
    u = obj.standardize_scores(s, eps=0.0)
    want = (s - s.mean(-1, keepdim=True)) / s.std(-1, unbiased=False, keepdim=True)
    assert torch.allclose(u, want)


@pytest.mark.parametrize("eps", [1e-8, 0.0])
@pytest.mark.parametrize("value", [0.7, 1 / 3, 0.1])
def test_a_batch_of_one_reward_gives_single_sample_grpo_no_gradient(value, eps):
    """`batch_standardized_pg_loss` (registry `grpo_single`) gave a batch of 7 rewards of 0.7 the advantage −0.86
    on every sample, and with eps=0 refused it as "advantages contains NaN/inf", an argument never passed."""
    lp = torch.zeros(7, requires_grad=True)
    out = obj.batch_standardized_pg_loss(lp, torch.full((7,), value), eps=eps)
    (grad,) = torch.autograd.grad(out.loss, lp)
    assert float(grad.abs().max()) == 0.0


# ----------------------------------------------------------------------------- the α range

@pytest.mark.parametrize("alpha", [1e-40, 1e-45, 5e-31])
def test_an_alpha_below_alpha_min_is_refused_where_it_gave_nan_gradients(alpha):
    z = _rand(2, 4).requires_grad_(True)
    old = torch.log_softmax(_rand(2, 4, seed=1), -1)
    s = torch.tensor([[1.0, 0, 0, 0], [0, 1, 1, 0]])
    with pytest.raises(ValueError, match=rf"alpha={alpha!r}: must be 0 or in \[1e-30, 1\]"):
        obj.tpo_loss(z, old, s, projection="alpha", alpha=alpha)
    with pytest.raises(ValueError, match="alpha="):
        obj.alpha_projection(torch.log_softmax(z, -1), old, alpha)
    out = obj.tpo_loss(z, old, s, projection="alpha", alpha=obj.ALPHA_MIN)
    (grad,) = torch.autograd.grad(out.loss, z)
    assert torch.isfinite(grad).all()


# ----------------------------------------------------------------------------- masked candidates without tokens

PER_TOKEN_GROUPED = [n for n in obj.available() if obj.get(n).per_token_fn is not None and obj.get(n).needs_groups
                     and "mask" in inspect.signature(obj.get(n).per_token_fn).parameters]


@pytest.mark.parametrize("name", PER_TOKEN_GROUPED)
def test_a_masked_candidate_may_hold_no_token(name):
    """A failed generation (masked out with mask=) that holds no token at all was refused ("token_mask leaves 1
    sequence(s) with no valid token"); its loss, metrics and gradient are those of the same batch with tokens there."""
    o = obj.get(name)
    torch.manual_seed(0)
    logp = -_rand(3, 4, 5).abs()
    s = torch.tensor([[1.0, 0, 1, 0], [0, 1, 1, 0], [0, 0, 1, 1]])
    mask = torch.ones(3, 4, dtype=torch.bool)
    mask[0, 1] = False
    results = []
    for row in (False, True):
        tm = torch.ones(3, 4, 5, dtype=torch.bool)
        tm[0, 1] = row
        lp = logp.clone().requires_grad_(True)
        args = (lp, logp) if "old_logp" in inspect.signature(o.per_token_fn).parameters else (lp,)
        torch.manual_seed(0)
        out = o.per_token_fn(*args, s, token_mask=tm, mask=mask)
        (grad,) = torch.autograd.grad(out.loss, lp)
        results.append((out.loss.detach(), {k: v for k, v in out.metrics.items()}, grad))
    (l0, m0, g0), (l1, m1, g1) = results
    assert torch.allclose(l0, l1) and torch.allclose(g0, g1), name
    assert m0.keys() == m1.keys() and all(torch.allclose(m0[k], m1[k], equal_nan=True) for k in m0), name
    # an unmasked candidate without a token is still refused, naming the way out
    tm = torch.ones(3, 4, 5, dtype=torch.bool)
    tm[2, 3] = False
    args = (logp, logp) if "old_logp" in inspect.signature(o.per_token_fn).parameters else (logp,)
    with pytest.raises(ValueError, match=r"first at index \[2, 3\]\); mask such a candidate out with mask="):
        o.per_token_fn(*args, s, token_mask=tm, mask=mask)


# ----------------------------------------------------------------------------- messages

def test_meta_tensors_are_refused_naming_the_argument():
    """torch's "Tensor.item() cannot be called on meta tensors" named neither the argument nor the cause."""
    m = torch.empty(3, 4, device="meta")
    with pytest.raises(ValueError, match="logp is on the meta device"):
        obj.tpo_loss(m, m, m)
    with pytest.raises(ValueError, match="scores is on the meta device"):
        obj.standardize_scores(m)


def test_a_wrong_keyword_names_the_function():
    """"got an unexpected keyword argument 'temperature'" did not say whose."""
    x = _rand(3, 4)
    with pytest.raises(TypeError, match=r"^tpo_loss\(\): got an unexpected keyword argument 'temperature'"):
        obj.tpo_loss(x, x, x, temperature=1)
    with pytest.raises(TypeError, match=r"^grpo_loss\(\): missing a required argument: 'scores'"):
        obj.grpo_loss(x, x)


@pytest.mark.parametrize("change,message", [
    ({"rewards": torch.rand(8, 1)}, r"rewards has shape \(8, 1\): must be \[N\] = \(8,\)"),
    ({"rewards": torch.rand(6)}, r"rewards has shape \(6,\): must be \[N\] = \(8,\)"),
    ({"group_size": 0}, r"group_size=0: must be an integer >= 2"),
    ({"old_per_token_logps": torch.zeros(8, 3)}, r"old_per_token_logps has shape \(8, 3\) but per_token_logps"),
    ({"completion_mask": torch.ones(8)}, r"completion_mask has shape \(8,\) but per_token_logps"),
    ({"per_token_logps": torch.zeros(2, 4, 4)}, r"per_token_logps has shape \(2, 4, 4\): must be \[N, T\]"),
])
def test_tpo_group_loss_names_the_trainers_arguments(change, message):
    """A reshape or broadcast error ("shape '[2, 4]' is invalid for input of size 64", ZeroDivisionError) named
    internal shapes, not the [N, T] rows a trainer passes."""
    args = {"per_token_logps": -torch.rand(8, 4), "old_per_token_logps": -torch.rand(8, 4), "rewards": torch.rand(8),
            "completion_mask": torch.ones(8, 4), "group_size": 4} | change
    with pytest.raises(ValueError, match=message):
        tpo_group_loss(**args)
    with pytest.raises(TypeError, match="rewards must be a torch.Tensor, got list"):
        tpo_group_loss(**(args | {"rewards": [0.0] * 8, "group_size": 4, "per_token_logps": -torch.rand(8, 4),
                                  "old_per_token_logps": -torch.rand(8, 4), "completion_mask": torch.ones(8, 4)}))


def test_sequence_logp_checks_its_token_mask_as_every_objective_does():
    """Its own copy of the check read the shape first: a list raised AttributeError ('list' object has no
    attribute 'shape'); and it named log-probs it was not given."""
    with pytest.raises(TypeError, match="token_mask must be a bool tensor .*got list"):
        obj.sequence_logp(torch.zeros(2, 3), [[True] * 3] * 2)
    with pytest.raises(ValueError, match=r"token_mask has shape \(2, 4\) but token_logp has shape \(2, 3\)"):
        obj.sequence_logp(torch.zeros(2, 3), torch.ones(2, 4, dtype=torch.bool))
