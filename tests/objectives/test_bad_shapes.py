"""Every registered objective rejects inputs that do not line up, with a ValueError naming the tensors and their
shapes, instead of broadcasting them into a wrong loss.

The inputs are built from each objective's `level` and the names of its positional parameters, so a newly
registered objective runs through the same table (and fails here if its level or an input name is unknown).
"""

import inspect

import pytest
import torch

from targetpo import objectives as obj

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
    return cases


@pytest.mark.parametrize("name", obj.available())
def test_objective_accepts_its_well_formed_inputs(name):
    o = obj.get(name)
    out = call(o, good_inputs(o.level))
    assert out.loss.dim() == 0 and torch.isfinite(out.loss)


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
