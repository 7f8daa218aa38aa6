"""The optimizers past their first step and at their checks, and the tabular updates at arguments the paper's
protocol never uses (a correct action other than 0, an action of near-zero probability)."""

import math

import pytest
import torch

from targetpo import objectives as obj
from targetpo.optim import MuonAdamW, TorchMuonAdamW, make_optimizer, newton_schulz
from targetpo.tabular import bandit, single

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _grads(params, seed):
    g = torch.Generator().manual_seed(seed)
    return {k: torch.randn(v.shape, generator=g) for k, v in params.items()}


def test_torch_option_adamw_follows_adam_with_beta2_0_999_over_several_steps(tiny_model):
    info, params = tiny_model
    opt = TorchMuonAdamW(params, info, 1e-2)
    p = params["ln_f.bias"].clone().double()
    m, v = torch.zeros_like(p), torch.zeros_like(p)
    for t in range(1, 4):
        grads = _grads(params, t)
        opt.step(params, grads)
        g = grads["ln_f.bias"].double()
        m, v = 0.9 * m + 0.1 * g, 0.999 * v + 0.001 * g * g
        p = p - 1e-2 * (m / (1 - 0.9 ** t)) / ((v / (1 - 0.999 ** t)).sqrt() + 1e-8)
        torch.testing.assert_close(params["ln_f.bias"].double(), p, rtol=0, atol=1e-6)


def _nesterov_directions(g1, g2, momentum):
    """torch.optim.Muon's Nesterov update at step 2 (buffer b ← μb + (1 − μ)g, update g + μ(b − g))."""
    b = (1 - momentum) * g1
    b = momentum * b + (1 - momentum) * g2
    return g2 + momentum * (b - g2)


def test_torch_option_muon_uses_nesterov_momentum_0_95(tiny_model):
    info, params = tiny_model
    opt = TorchMuonAdamW(params, info, 1e-3)
    g1, g2 = _grads(params, 1), _grads(params, 2)
    opt.step(params, g1)
    before = params["l0.ffn.up"].clone()
    opt.step(params, g2)
    delta = (params["l0.ffn.up"] - before).flatten(1)

    def cos(momentum):
        d = newton_schulz(_nesterov_directions(g1["l0.ffn.up"], g2["l0.ffn.up"], momentum)).flatten(1)
        return torch.nn.functional.cosine_similarity(-delta, d).min().item()

    # bfloat16 Newton–Schulz inside torch: equal to ~1 %, and another momentum is further off
    assert cos(0.95) > 0.999 and cos(0.95) - cos(0.8) > 1e-3, (cos(0.95), cos(0.8))


def test_make_optimizer_passes_the_full_step_norm_to_muon(tiny_model):
    info, params = tiny_model
    tiny = {k: 1e-6 * v for k, v in _grads(params, 1).items()}
    steps = {}
    for tau in (0.0, 1.0):
        ps = {k: v.clone() for k, v in params.items()}
        opt = make_optimizer("optax", ps, info, 1e-3, muon_full_step_norm=tau)
        assert opt.full_step_norm == tau
        opt.step(ps, tiny)
        steps[tau] = (ps["l0.ffn.up"] - params["l0.ffn.up"]).norm().item()
    assert steps[1.0] < 1e-3 * steps[0.0]  # a vanishing gradient gives a vanishing step


@pytest.mark.parametrize("kind", ["optax", "torch"])
def test_names_must_agree_both_ways(kind, tiny_model):
    info, params = tiny_model
    with pytest.raises(ValueError, match=r"disagree on names: \['extra'\]"):
        make_optimizer(kind, params | {"extra": torch.zeros(2, 3)}, info, 1e-3)
    opt = make_optimizer(kind, params, info, 1e-3)
    before = {k: v.clone() for k, v in params.items()}
    with pytest.raises(ValueError, match=r"disagree on names: \['bogus'\]"):
        opt.step(params, _grads(params, 1) | {"bogus": torch.ones(2)})
    assert all(torch.equal(params[k], before[k]) for k in params)


def test_a_parameter_without_a_seed_axis_is_refused_by_name():
    from targetpo.optim import ParamInfo
    info = {"w": ParamInfo((3, 4), "muon", "zeros"), "b": ParamInfo((4,), "adamw", "zeros")}
    with pytest.raises(ValueError, match=r"params\['w'\] has shape \(3, 4\); expected \[S=0"):
        MuonAdamW({"b": torch.tensor(1.0), "w": torch.zeros(3, 4)}, info, 1e-3)


def test_zero_newton_schulz_steps_only_normalise():
    x = torch.randn(2, 3, 5, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(newton_schulz(x, steps=0), x / (torch.linalg.matrix_norm(x, keepdim=True) + 1e-8))


# ----------------------------------------------------------------------------- tabular

@pytest.mark.parametrize("method, weight", [("pg", 0.7), ("ce", 1.0)])
def test_exact_update_weighs_by_the_correct_actions_probability(method, weight):
    probs = torch.tensor([[0.1, 0.2, 0.7]], dtype=torch.float64)
    expected = weight * (torch.tensor([[0.0, 0.0, 1.0]], dtype=torch.float64) - probs)
    torch.testing.assert_close(bandit.exact_update(method, probs, correct=2), expected)


def test_tabular_tpo_anchors_on_pi_plus_1e_8():
    """The authors' anchor log(π + 1e-8): for an action of probability 1e-10 it is 100× the plain π, so the
    target there is set by the 1e-8."""
    logits = torch.tensor([[0.0, 0.0, math.log(1e-10)]], dtype=torch.float64)
    actions = torch.tensor([[0, 1, 0, 1]])
    rewards = (actions == 0).to(torch.float64)
    cfg = single.Config()
    g = single.direction("tpo", logits, actions, rewards, cfg)
    pi = torch.softmax(logits, -1)
    scores = torch.zeros_like(logits).scatter_add_(-1, actions, rewards - cfg.baseline) / actions.shape[-1]
    q = torch.softmax(torch.log(pi + 1e-8) + obj.standardize_scores(scores), -1)
    torch.testing.assert_close(g, q - pi, rtol=1e-9, atol=0)
