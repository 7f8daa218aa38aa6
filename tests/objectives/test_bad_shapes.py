"""Every registered objective rejects inputs that do not line up, with a ValueError naming the tensors and their
shapes, instead of broadcasting them into a wrong loss.

The inputs are built from each objective's `level` and the names of its positional parameters, so a newly
registered objective runs through the same table (and fails here if its level or an input name is unknown).
"""

import inspect

import pytest
import torch

from targetpo import objectives as obj
from targetpo.objectives.aggregation import TOKEN_MODES

G, K, T, V, B, C = 2, 4, 3, 5, 6, 10


def _randn(*shape):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(sum(shape)))


def good_inputs(level: str) -> dict:
    """Well-formed tensors for every positional input an objective of `level` may take."""
    if level == "group":          # [G, K] candidate log-scores (or per-token [G, K, T]) and scores [G, K]
        return {"logp": _randn(G, K), "old_logp": _randn(G, K), "scores": _randn(G, K)}
    if level == "sequence":       # per-token [G, K, T]
        return {"logp": _randn(G, K, T), "old_logp": _randn(G, K, T), "scores": _randn(G, K)}
    if level == "token-candidates":  # states [G, T], K candidate tokens each, vocabulary V
        return {"token_logp": _randn(G, T, V), "candidates": torch.randint(V, (G, T, K)),
                "old_logp": _randn(G, T, K), "scores": _randn(G, T, K)}
    if level == "single":         # [B] single actions
        return {"logp": _randn(B), "old_logp": _randn(B), "behaviour_logp": _randn(B), "advantages": _randn(B),
                "rewards": _randn(B), "logits": _randn(B, C), "labels": torch.randint(C, (B,))}
    raise AssertionError(f"no bad-shape cases for level {level!r}: add them to this table")


def positional(o: obj.Objective) -> list[str]:
    return [n for n, p in inspect.signature(o.fn).parameters.items()
            if p.default is inspect.Parameter.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]


def keywords(o: obj.Objective) -> set[str]:
    return set(inspect.signature(o.fn).parameters)


def call(o: obj.Objective, inputs: dict, **kw):
    names = positional(o)
    missing = [n for n in names if n not in inputs]
    assert not missing, f"{o.name}: no test input for parameter(s) {missing}; extend good_inputs({o.level!r})"
    return o.fn(*[inputs[n] for n in names], **kw)


def bad_cases(o: obj.Objective) -> list[tuple[str, dict, dict, list[str]]]:
    """(case, positional inputs, keyword inputs, strings the error must contain) for objective `o`."""
    good, kw = good_inputs(o.level), keywords(o)
    first = positional(o)[0]
    cases = []
    if o.level in ("group", "sequence"):
        lead = list(good["logp"].shape)
        lead[0] += 1
        wrong = {**good, "logp": _randn(*lead), "old_logp": _randn(*lead)}
        cases.append(("logp's leading dims differ from scores", wrong, {},
                      ["logp", "scores", str(tuple(lead)), str((G, K))]))
        if o.level == "group":  # a per-token logp [1, K, T] must not broadcast against scores [G, K]
            per_tok = {**good, "logp": _randn(1, K, T), "old_logp": _randn(1, K, T)}
            cases.append(("per-token logp with other leading dims", per_tok, {},
                          ["logp", "scores", str((1, K, T)), str((G, K))]))
        if "token_mask" in kw:
            tokens = {**good, "logp": _randn(G, K, T), "old_logp": _randn(G, K, T)}
            bad_tm = torch.ones(G, K, T + 1, dtype=torch.bool)
            cases.append(("token_mask of the wrong shape", tokens, {"token_mask": bad_tm},
                          ["token_mask", str((G, K, T + 1)), str((G, K, T))]))
        if o.level == "sequence":
            cases.append(("per-candidate logp where per-token is required",
                          {**good, "logp": _randn(G, K), "old_logp": _randn(G, K)}, {}, ["logp", "scores"]))
        elif "token_mask" in kw:
            cases.append(("token_mask with per-candidate logp", good,
                          {"token_mask": torch.ones(G, K, dtype=torch.bool)}, ["token_mask", str((G, K))]))
        if "mask" in kw:
            cases.append(("mask of the wrong shape", good, {"mask": torch.ones(G, K - 1, dtype=torch.bool)},
                          ["mask", str((G, K - 1))]))
    elif o.level == "token-candidates":
        cases.append(("scores do not match the candidates", {**good, "scores": _randn(G + 1, T, K)}, {},
                      ["scores", "candidates", str((G + 1, T, K)), str((G, T, K))]))
        cases.append(("candidates' states differ from token_logp", {**good, "token_logp": _randn(G + 1, T, V)}, {},
                      ["candidates", "token_logp"]))
        if "mask" in kw:
            cases.append(("mask of the wrong shape", good, {"mask": torch.ones(G, T, K - 1, dtype=torch.bool)},
                          ["mask", str((G, T, K - 1))]))
    else:  # single: the first input has one more row than the others
        shape = list(good[first].shape)
        shape[0] += 1
        wrong = {**good, first: _randn(*shape)}
        cases.append((f"{first} has more rows than the other inputs", wrong, {}, [first, str(tuple(shape))]))
        if "token_mask" in kw:  # per-token [B, H] inputs with a mask of another shape
            tokens = {n: _randn(B, T) for n in good if n not in ("logits", "labels")}
            cases.append(("token_mask of the wrong shape", tokens,
                          {"token_mask": torch.ones(B, T + 1, dtype=torch.bool)},
                          ["token_mask", str((B, T + 1)), str((B, T))]))
    # One input on another device ("meta": no data, so it runs anywhere), refused before any computation.
    cases.append((f"{first} on another device", {**good, first: good[first].to("meta")}, {},
                  [first, "meta", "cpu", "one device"]))
    return cases


@pytest.mark.parametrize("name", obj.available())
def test_objective_accepts_its_well_formed_inputs(name):
    o = obj.get(name)
    out = call(o, good_inputs(o.level))
    assert out.loss.dim() == 0 and torch.isfinite(out.loss)


@pytest.mark.parametrize("name", obj.available())
@pytest.mark.parametrize("dtype, computed", [(torch.float64, torch.float64), (torch.bfloat16, torch.float32)])
def test_loss_and_every_metric_come_in_the_computed_dtype(name, dtype, computed):
    """With float64 inputs, frac_zero_var, clip_frac, accuracy and the other fractions came out float32 beside
    float64 losses and metrics; half-precision inputs are computed (and reported) in float32."""
    o = obj.get(name)
    inputs = {k: v.to(dtype) if v.is_floating_point() else v for k, v in good_inputs(o.level).items()}
    out = call(o, inputs)
    got = {"loss": out.loss.dtype, **{k: v.dtype for k, v in out.metrics.items()}}
    assert set(got.values()) == {computed}, got


def _constants_without_gradient(fn, names: list[str], inputs: dict, **kw) -> list[str]:
    """The inputs after the first that receive a gradient from `fn`'s loss (each float input requires one). The old
    log-probs are moved off the current ones: at a ratio of 1 every candidate weighs the same and an unscaled
    advantage's gradient (Dr. GRPO's) cancels, hiding a leak."""
    given = {n: v.clone().requires_grad_(True) if v.is_floating_point() else v for n, v in inputs.items()}
    if "old_logp" in given:
        given["old_logp"] = (given["old_logp"].detach() * 0.9 - 0.05).requires_grad_(True)
    fn(*[given[n] for n in names], **kw).loss.backward()
    return [n for n in names[1:] if given[n].requires_grad and given[n].grad is not None
            and bool(given[n].grad.ne(0).any())]


@pytest.mark.parametrize("name", obj.available())
def test_only_the_policy_log_probs_receive_a_gradient(name):
    """Scores, advantages, old and behaviour log-probs are constants of every objective's equation (a stop-gradient
    in the estimator): a reward that carries a graph must not be trained by the policy loss. The GRPO family
    (grpo, dr_grpo, dapo, gspo, sapo, cispo, gmpo, clip_cov, kl_cov), RLOO and Group PG used to pass a gradient
    into `scores` through their advantages."""
    o = obj.get(name)
    assert _constants_without_gradient(o.fn, positional(o), good_inputs(o.level)) == []
    if o.per_token_fn is not None:
        assert _constants_without_gradient(o.per_token_fn, ["logp", "old_logp", "scores"], good_inputs("sequence"),
                                           token_mask=torch.ones(G, K, T, dtype=torch.bool)) == []


@pytest.mark.parametrize("name", obj.available())
def test_objective_rejects_misaligned_inputs_naming_them(name):
    o = obj.get(name)
    cases = bad_cases(o)
    assert cases, f"{name}: no bad-shape case"
    for case, inputs, kw, expected in cases:
        with pytest.raises(ValueError) as err:
            call(o, inputs, **kw)
        missing = [e for e in expected if e not in str(err.value)]
        assert not missing, f"{name}, {case}: error {str(err.value)!r} does not mention {missing}"


def test_rloo_no_longer_broadcasts_per_token_logp_over_groups():
    with pytest.raises(ValueError, match=r"logp has shape \(1, 4, 3\) but scores has shape \(2, 4\)"):
        obj.rloo_loss(torch.zeros(1, 4, 3), torch.zeros(2, 4))


@pytest.mark.parametrize("name", [n for n in obj.available() if obj.get(n).per_token_fn is not None])
def test_per_token_form_takes_an_llm_batch_and_rejects_misaligned_ones(name):
    fn = obj.get(name).per_token_fn
    good = good_inputs("sequence")
    tm = torch.ones(G, K, T, dtype=torch.bool)
    assert torch.isfinite(fn(good["logp"], good["old_logp"], good["scores"], token_mask=tm).loss)
    with pytest.raises(ValueError, match=r"logp has shape \(1, 4, 3\) but scores has shape \(2, 4\)"):
        fn(_randn(1, K, T), _randn(1, K, T), good["scores"])
    with pytest.raises(ValueError, match="token_mask"):
        fn(good["logp"], good["old_logp"], good["scores"], token_mask=tm[..., :-1])
    with pytest.raises(ValueError, match="token_mask is on meta but logp is on cpu; every tensor argument must be on "
                                         "one device"):
        fn(good["logp"], good["old_logp"], good["scores"], token_mask=tm.to("meta"))


# ----------------------------------------------------------------------------- bad values, same table

def _bad_values(name: str) -> list:
    """Values that break the rule of hyperparameter `name` (see objectives._checks.HYPERPARAMETERS)."""
    allowed, _ = obj._checks.HYPERPARAMETERS[name]
    bad = [float("nan"), float("inf"), "0.2", True]
    bad += [0.0, -1.0] if allowed.startswith(">") and not allowed.startswith(">=") else [-1e-3]
    return bad


@pytest.mark.parametrize("name", obj.available())
def test_objective_rejects_bad_values_naming_the_argument(name):
    o = obj.get(name)
    good, kw = good_inputs(o.level), keywords(o)
    first = positional(o)[0]
    empty = {k: v[:0] for k, v in good.items()}
    with pytest.raises(ValueError, match="is empty"):
        call(o, empty)
    nan = dict(good)
    nan[first] = good[first].clone().float()
    nan[first].view(-1)[0] = float("nan")
    if first != "candidates":
        with pytest.raises(ValueError, match=f"{first} contains 1 NaN"):
            call(o, nan)
    for mask_name in ("mask", "token_mask"):
        if mask_name in kw and not (mask_name == "token_mask" and o.level in ("group", "token-candidates")):
            like = good["logp"] if mask_name == "token_mask" else good.get("scores", good.get("logp"))
            half = torch.full(like.shape, 0.5)
            with pytest.raises(TypeError, match=f"{mask_name} must be a bool tensor"):
                call(o, good, **{mask_name: half})
    checked_params = [p for p in kw if p in obj._checks.HYPERPARAMETERS]
    for p in checked_params:
        for value in _bad_values(p):
            with pytest.raises(ValueError, match=f"^{p}="):
                call(o, good, **{p: value})


def test_every_temperature_and_coefficient_is_declared():
    """The hyperparameters that exist across the objectives all have a rule (a new one must be added)."""
    seen = set()
    for name in obj.available():
        seen |= {p for p, v in inspect.signature(obj.get(name).fn).parameters.items()
                 if v.kind == v.KEYWORD_ONLY and isinstance(v.default, float)}
    assert seen <= set(obj._checks.HYPERPARAMETERS), seen - set(obj._checks.HYPERPARAMETERS)


@pytest.mark.parametrize("name", [n for n in obj.available() if "scores" in positional(obj.get(n))
                                  or "advantages" in positional(obj.get(n)) or "rewards" in positional(obj.get(n))])
def test_huge_finite_scores_give_a_finite_loss(name):
    o = obj.get(name)
    good = good_inputs(o.level)
    for key in ("scores", "advantages", "rewards"):
        if key in good:
            good[key] = good[key].sign() * 1e20
            good[key].view(-1)[0] = -3e19
    out = call(o, good)
    assert torch.isfinite(out.loss), (name, out.loss)
    if "scores" in positional(o):
        # standardized within groups: the loss does not change with the scale of the scores; centred only
        # (RLOO, Dr. GRPO): it scales with them. Either way it is the small-score loss, not an overflow.
        ref = call(o, {**good, "scores": good["scores"] / 1e20}).loss
        same = torch.allclose(out.loss, ref, rtol=1e-4, atol=1e-5)
        linear = torch.allclose(out.loss / 1e20, ref, rtol=1e-4, atol=1e-5)
        assert same or linear, (name, out.loss, ref)


# ----------------------------------------------------------------------------- the exported building blocks

def _logp(*shape):
    return torch.log_softmax(_randn(*shape), -1)


def _mask():
    return torch.ones(G, K, dtype=torch.bool)


# Every exported function that takes two or more tensors and is not a registered objective: well-formed
# arguments, and the tensors among them that must share one shape (an elementwise pair broadcast by mistake
# would give a wrong result with no error).
BLOCKS: dict[str, tuple[dict, tuple[str, ...]]] = {
    "k3_kl": ({"logp": _logp(G, K), "ref_logp": _logp(G, K)}, ("logp", "ref_logp")),
    "kl_estimate": ({"logp": _logp(G, K), "ref_logp": _logp(G, K)}, ("logp", "ref_logp")),
    "clipped_surrogate": ({"ratio": _randn(G, K).exp(), "adv": _randn(G, K), "eps_low": 0.2, "eps_high": 0.28},
                          ("ratio", "adv")),
    "dual_clip": ({"surrogate": _randn(G, K), "adv": _randn(G, K), "c": 3.0}, ("surrogate", "adv")),
    "delight_gate": ({"logp": _logp(G, K), "advantages": _randn(G, K)}, ("logp", "advantages")),
    "truncated_is_weights": ({"log_p": _logp(G, K), "log_old": _logp(G, K), "is_clip": 2.0}, ("log_p", "log_old")),
    "corrected_anchor": ({"logp": _logp(G, K), "old_logp": _logp(G, K), "is_clip": 2.0, "mask": _mask()},
                         ("logp", "old_logp", "mask")),
    "reverse_kl_projection": ({"log_p": _logp(G, K), "log_q": _logp(G, K), "mask": _mask()},
                              ("log_p", "log_q", "mask")),
    "jensen_shannon_projection": ({"log_p": _logp(G, K), "log_q": _logp(G, K), "mask": _mask()},
                                  ("log_p", "log_q", "mask")),
    "alpha_projection": ({"log_p": _logp(G, K), "log_q": _logp(G, K), "alpha": 0.5, "mask": _mask()},
                         ("log_p", "log_q", "mask")),
    "kl_to_old": ({"log_old": _logp(G, K), "u": _randn(G, K), "eta": torch.ones(G, 1), "mask": _mask()},
                  ("log_old", "u", "mask")),
    "adaptive_eta": ({"log_old": _logp(G, K), "u": _randn(G, K), "kl_budget": 0.1, "mask": _mask()},
                     ("log_old", "u", "mask")),
    "tpo_target": ({"old_logp": _randn(G, K), "scores": _randn(G, K), "mask": _mask()}, ("old_logp", "scores", "mask")),
}


def _required_tensors(fn) -> list[str]:
    return [n for n, p in inspect.signature(fn).parameters.items()
            if p.default is inspect.Parameter.empty and str(p.annotation) == "Tensor"]


def test_every_exported_function_of_several_tensors_is_an_objective_or_in_the_table():
    objective_fns = {f for o in map(obj.get, obj.available()) for f in (o.fn, o.per_token_fn) if f is not None}
    objective_fns |= {getattr(f, "__wrapped__", f) for f in objective_fns}
    several = {n for n in obj.__all__ if callable(getattr(obj, n)) and not isinstance(getattr(obj, n), type)
               and len(_required_tensors(getattr(obj, n))) >= 2}
    untested = {n for n in several - set(BLOCKS) if getattr(obj, n) not in objective_fns
                and getattr(getattr(obj, n), "__wrapped__", None) not in objective_fns}
    assert not untested, f"add {sorted(untested)} to BLOCKS"


@pytest.mark.parametrize("name", BLOCKS)
def test_building_block_accepts_its_well_formed_inputs(name):
    out = getattr(obj, name)(**BLOCKS[name][0])
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("name", BLOCKS)
def test_building_block_refuses_misaligned_tensors_naming_them(name):
    """A tensor one candidate wider, and one that drops the group axis (it would broadcast over the groups)."""
    good, aligned = BLOCKS[name]
    for arg in aligned:
        for shape in ((G, K + 1), (K,)):
            bad = torch.ones(shape, dtype=torch.bool) if arg == "mask" else _randn(*shape)
            with pytest.raises(ValueError) as err:
                getattr(obj, name)(**{**good, arg: bad})
            assert arg in str(err.value) and str(tuple(shape)) in str(err.value), (name, arg, str(err.value))


@pytest.mark.parametrize("name", [n for n, (_, aligned) in BLOCKS.items() if "mask" in aligned])
def test_building_block_refuses_a_float_mask(name):
    good = BLOCKS[name][0]
    with pytest.raises(TypeError, match="mask must be a bool tensor"):
        getattr(obj, name)(**{**good, "mask": torch.ones(G, K)})


@pytest.mark.parametrize("name", BLOCKS)
def test_building_block_refuses_bad_hyperparameters_naming_them(name):
    good = BLOCKS[name][0]
    params = inspect.signature(getattr(obj, name)).parameters
    rules = [p for p in good if p in obj._checks.HYPERPARAMETERS and "Tensor" not in str(params[p].annotation)]
    numbers = [p for p, v in good.items() if not isinstance(v, torch.Tensor)]
    assert rules == numbers, f"{name}: {sorted(set(numbers) - set(rules))} have no rule in HYPERPARAMETERS"
    for p in rules:
        bad = _bad_values(p) + ([] if "None" in str(params[p].annotation) else [None])
        for value in bad:
            with pytest.raises(ValueError, match=f"^{p}="):
                getattr(obj, name)(**{**good, p: value})


OVERFLOWS = {"clipped_surrogate": "ratio", "dual_clip": "surrogate"}  # exp(log ρ) may overflow; the clip handles it
CONSTANTS = {"k3_kl": ("ref_logp",), "kl_estimate": ("ref_logp",), "clipped_surrogate": ("adv",), "dual_clip": ("adv",),
             "delight_gate": ("logp", "advantages"), "reverse_kl_projection": ("log_q",),
             "jensen_shannon_projection": ("log_q",), "alpha_projection": ("log_q",)}


@pytest.mark.parametrize("name", BLOCKS)
def test_building_block_refuses_nan_and_inf_naming_the_tensor(name):
    """The blocks computed NaN from NaN input without a word (adaptive_eta even returned η = 1e-3)."""
    good, aligned = BLOCKS[name]
    for arg in (a for a in aligned if a != "mask"):
        for value in (float("nan"), float("inf"), -float("inf")):
            bad = good[arg].clone()
            bad[0, 0] = value
            if value != value or arg != OVERFLOWS.get(name):
                with pytest.raises(ValueError, match=f"^{arg} contains 1 NaN"):
                    getattr(obj, name)(**{**good, arg: bad})
            else:
                assert not getattr(obj, name)(**{**good, arg: bad}).isnan().any()


@pytest.mark.parametrize("name", BLOCKS)
def test_building_block_computes_half_precision_in_float32(name):
    good, aligned = BLOCKS[name]
    half = {k: v.bfloat16() if k in aligned and k != "mask" else v for k, v in good.items()}
    out = getattr(obj, name)(**half)
    assert out.dtype in (torch.float32, torch.float64)  # adaptive_eta bisects in float64
    rounded = {k: v.float() if k in aligned and k != "mask" else v for k, v in half.items()}
    assert torch.equal(out, getattr(obj, name)(**rounded))


@pytest.mark.parametrize("name", CONSTANTS)
def test_building_block_passes_no_gradient_to_its_constants(name):
    """`k3_kl(logp, ref_logp)` sent a gradient into the reference, and `delight_gate`, documented as detached,
    into the advantages."""
    good = BLOCKS[name][0]
    given = {k: v.clone().requires_grad_(k in CONSTANTS[name]) if isinstance(v, torch.Tensor) and v.is_floating_point()
             else v for k, v in good.items()}
    assert not getattr(obj, name)(**given).requires_grad


def test_dual_clip_needs_a_bound_above_one_and_a_clip_range_below_one():
    """The cases that used to compute silently: c ≤ 1 would cap a negative advantage's loss at or below the
    unclipped surrogate, and ε_low ≥ 1 would let the ratio's lower bound reach 0."""
    good = BLOCKS["dual_clip"][0]
    for c in (1.0, 0.5):
        with pytest.raises(ValueError, match="^c="):
            obj.dual_clip(**{**good, "c": c})
    with pytest.raises(ValueError, match="^eps_low="):
        obj.clipped_surrogate(**{**BLOCKS["clipped_surrogate"][0], "eps_low": 1.0})


def test_kl_to_old_takes_one_temperature_per_group_or_one_for_all():
    good = BLOCKS["kl_to_old"][0]
    per_group = obj.kl_to_old(**good)
    for eta in (torch.ones(1, 1), torch.tensor(1.0)):
        assert torch.equal(obj.kl_to_old(**{**good, "eta": eta}), per_group)
    for eta in (torch.ones(G), torch.ones(G, K), 1.0):
        with pytest.raises(ValueError, match="^eta must be a tensor of shape"):
            obj.kl_to_old(**{**good, "eta": eta})
    with pytest.raises(ValueError, match="eta must be > 0 in every group"):
        obj.kl_to_old(**{**good, "eta": torch.tensor([[1.0], [0.0]])})


def test_batch_mean_baseline_refuses_an_axis_rewards_do_not_have():
    r = _randn(B, T)
    assert torch.equal(obj.batch_mean_baseline(r, dim=-1), obj.batch_mean_baseline(r, dim=1))
    for dim in (2, -3, 1.0, True):
        with pytest.raises(ValueError, match=r"^dim=.*must be an axis of rewards \(6, 3\)"):
            obj.batch_mean_baseline(r, dim=dim)


@pytest.mark.parametrize("name", obj.available())
def test_none_is_refused_where_the_signature_does_not_admit_it(name):
    """`dapo_loss(clip_eps_high=None)` or `tpo_loss(eta=None)` is refused by name, saying what is allowed (a word
    such as 'adaptive' included), never a TypeError from comparing None inside a rule."""
    o = obj.get(name)
    good = good_inputs(o.level)
    params = inspect.signature(o.fn).parameters
    for p in keywords(o) & set(obj._checks.HYPERPARAMETERS):
        if "None" in str(params[p].annotation) or p in getattr(o.fn, "keywords", {}):
            continue
        with pytest.raises(ValueError, match=f"^{p}=None: must be a finite number") as err:
            call(o, good, **{p: None})
        assert "or None" not in str(err.value)
        if p == "eta" and "adaptive" in str(params[p].annotation):
            assert "'adaptive'" in str(err.value)


# ----------------------------------------------------------------------------- masks, switches, metrics
# What a mask removes has no effect, whatever it holds; switches take True or False; metrics see the valid
# entries only.

MASKED = [o for o in map(obj.get, obj.available()) if o.level in ("group", "sequence") and "mask" in keywords(o)]
BIG = (1e20, -1e20, torch.finfo(torch.float32).max, torch.finfo(torch.float32).min)


def _drop_last_two() -> torch.Tensor:
    m = torch.ones(G, K, dtype=torch.bool)
    m[:, -2:] = False
    return m


def _loss_and_grad(o, inputs, **kw):
    logp = inputs["logp"].clone().requires_grad_(True)
    out = call(o, {**inputs, "logp": logp}, **kw)
    out.loss.backward()
    return out.loss.detach(), logp.grad


@pytest.mark.parametrize("o", MASKED, ids=lambda o: o.name)
def test_a_masked_candidates_score_has_no_effect_however_large(o):
    """A masked candidate's score used to overflow its squared deviation (inf·0 = NaN): GRPO's whole group went
    NaN and TPO's u lost its std."""
    inputs, m = good_inputs(o.level), _drop_last_two()
    ref_loss, ref_grad = _loss_and_grad(o, inputs, mask=m)
    assert torch.isfinite(ref_grad).all()
    for big in BIG:
        scores = inputs["scores"].clone()
        scores[:, -1] = big
        loss, grad = _loss_and_grad(o, {**inputs, "scores": scores}, mask=m)
        assert torch.isfinite(loss) and torch.isfinite(grad).all(), (o.name, big)
        assert torch.allclose(loss, ref_loss, rtol=1e-6, atol=1e-7), (o.name, big, loss, ref_loss)
        assert torch.allclose(grad, ref_grad, rtol=1e-6, atol=1e-7), (o.name, big)


def test_masked_scores_standardize_as_if_the_candidates_were_absent():
    s = torch.tensor([[0.0, 1.0, 2.0, -1e20]])
    m = torch.tensor([[True, True, True, False]])
    expected = obj.standardize_scores(s[:, :3])
    assert torch.allclose(obj.standardize_scores(s, m)[:, :3], expected)
    assert torch.allclose(obj.group_advantages(s, m)[:, :3], obj.group_advantages(s[:, :3]))


@pytest.mark.parametrize("mode", ["sum-mean", "mean"])
def test_grpo_per_candidate_loss_over_a_mask_equals_the_loss_without_the_masked_candidates(mode):
    """loss_agg="mean" used to divide by every candidate, masked ones included: masking two of four halved the
    gradient."""
    inputs, m = good_inputs("group"), _drop_last_two()
    kept = {k: v[:, :-2] for k, v in inputs.items()}
    for kw in ({}, {"beta": 0.0}, {"mask_zero_var": True}):
        _same_without_the_masked(inputs, kept, m, loss_agg=mode, **kw)


def _same_without_the_masked(inputs, kept, m, **kw):
    masked, grad = _loss_and_grad(obj.get("grpo"), inputs, mask=m, **kw)
    alone, grad_alone = _loss_and_grad(obj.get("grpo"), kept, **kw)
    assert torch.allclose(masked, alone, rtol=1e-6, atol=1e-6), (kw, masked, alone)
    assert torch.allclose(grad[:, :-2], grad_alone, rtol=1e-6, atol=1e-8), kw
    assert not grad[:, -2:].any() and grad_alone.abs().max() > 1e-3, kw


@pytest.mark.parametrize("mode", ["sum-mean", "mean", *TOKEN_MODES])
def test_grpo_per_token_loss_over_a_mask_equals_the_loss_without_the_masked_candidates(mode):
    inputs, m = good_inputs("sequence"), _drop_last_two()
    kept = {k: v[:, :-2] for k, v in inputs.items()}
    kw = {"norm_len": float(T)} if mode == "seq-mean-token-sum-norm" else {}
    # "token-sum" and "sum-mean" are sums: the masked candidates add 0; the rest average over what is valid.
    _same_without_the_masked(inputs, kept, m, loss_agg=mode, **kw)


SWITCHES = [(o, n) for o in map(obj.get, obj.available())
            for n, p in inspect.signature(o.fn).parameters.items() if p.annotation in ("bool", bool)
            and n not in getattr(o.fn, "keywords", {})]


@pytest.mark.parametrize("o,name", SWITCHES, ids=lambda x: x if isinstance(x, str) else x.name)
def test_a_switch_takes_true_or_false_only(o, name):
    """`scale_advantages="no"` was read as True, and None as False (Dr. GRPO's advantages), without a word."""
    inputs = good_inputs(o.level)
    for value in ("no", None, 1, 0.0):
        with pytest.raises(TypeError, match=f"^{name}={value!r}: must be True or False"):
            call(o, inputs, **{name: value})


def test_tpo_counts_zero_variance_groups_by_their_std_as_grpo_does():
    """TPO tested max|u| ≤ 1e-6, not the documented population std ≤ 1e-6 (docs/method.md §7): a group of std
    8.7e-7 counted as informative, and a std floor made informative groups count as zero-variance."""
    lp = torch.zeros(2, 4, dtype=torch.float64)
    s = torch.tensor([[0.0, 0.0, 0.0, 2e-6], [0.0, 1.0, 0.0, 1.0]], dtype=torch.float64)
    assert obj.zero_variance_groups(s).tolist() == [True, False]
    assert obj.tpo_loss(lp, lp, s).metrics["frac_zero_var"] == 0.5
    assert obj.grpo_loss(lp, lp, s).metrics["frac_zero_var"] == 0.5
    spread = torch.tensor([[0.0, 0.1, 0.2, 0.3], [0.0, 1.0, 0.0, 1.0]])
    assert obj.tpo_loss(lp.float(), lp.float(), spread, std_floor=1e6).metrics["frac_zero_var"] == 0.0


@pytest.mark.parametrize("name", ["dg", "reinforce"])
def test_metrics_ignore_padding_tokens(name):
    o = obj.get(name)
    lp, adv = _randn(G, T), _randn(G, T)
    tm = torch.ones(G, T, dtype=torch.bool)
    tm[:, -1] = False
    lp2, adv2 = lp.clone(), adv.clone()
    lp2[:, -1], adv2[:, -1] = -50.0, 100.0
    a = o.fn(lp, adv, token_mask=tm)
    b = o.fn(lp2, adv2, token_mask=tm)
    assert torch.equal(a.loss, b.loss)
    for k in a.metrics:
        assert torch.equal(a.metrics[k], b.metrics[k]), (name, k, a.metrics[k], b.metrics[k])


def test_reversed_bounds_are_refused():
    inputs = good_inputs("sequence")
    with pytest.raises(ValueError, match=r"^ratio_min=3.0 and ratio_max=1.0: need ratio_min <= ratio_max"):
        call(obj.get("cispo"), inputs, ratio_min=3.0, ratio_max=1.0)
    for lb, ub in ((5.0, 1.0), (2.0, 2.0)):  # the open interval (lb, ub) selects nothing
        with pytest.raises(ValueError, match=rf"^clip_cov_lb={lb} and clip_cov_ub={ub}: need clip_cov_lb < "):
            call(obj.get("clip_cov"), inputs, clip_cov_lb=lb, clip_cov_ub=ub)
    with pytest.raises(ValueError, match=r"^scale_advantages=True: dr_grpo_loss fixes scale_advantages=False"):
        call(obj.get("dr_grpo"), inputs, scale_advantages=True)
