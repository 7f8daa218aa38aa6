"""The engine's fast paths give bit-for-bit the numbers of the plain computations they replace: decoding into a
preallocated KV cache vs re-concatenating the past, the rollout vs a copy-the-past reference sampler, and a
reused AnswerPlan vs recomputing it (identical numbers keep every run reproducible across engine versions)."""

import pytest
import torch

from targetpo.tokens import engine as te
from targetpo.tokens import transformer as tfm


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _spec_params(v=3, h=5, seeds=(0, 1)):
    spec = tfm.TransformerSpec(vocab=v, max_len=2 * h)
    params = tfm.init_params(spec, list(seeds))
    g = torch.Generator().manual_seed(5)
    return spec, {k: t + 0.3 * torch.randn(t.shape, generator=g) for k, t in params.items()}


@torch.no_grad()
def _reference_rollout(params, spec, prompts, streams, candidates, gens):
    """The sampler without the preallocated cache: every step gathers each state's whole past and `extend`
    concatenates it with the new token's keys/values (the engine's earlier implementation)."""
    s, b, h = prompts.shape
    g, c, v = streams, candidates, spec.vocab
    rep_p, inv_p = te._distinct(te._row_ids(prompts, [v] * h))
    logp_states, cache = tfm.prefill(params, te._take(prompts, rep_p), spec)
    state = inv_p.repeat_interleave(g, dim=1)
    acts, lps, cands, cand_lps = [], [], [], []
    for t in range(h):
        logp_t = te._take(logp_states, state)
        cand = te.sample_tokens(logp_t, te._uniform(gens, (b * g, c), prompts.device))
        cand_lp = logp_t.gather(-1, cand)
        acts.append(cand[..., 0])
        lps.append(cand_lp[..., 0])
        cands.append(cand)
        cand_lps.append(cand_lp)
        if t + 1 < h:
            rep, nxt = te._distinct(state * v + cand[..., 0])
            parent, token = te._take(state, rep), te._take(cand[..., 0], rep)
            past = [(te._take(k, parent), te._take(vv, parent)) for k, vv in cache]
            out, cache = tfm.extend(params, token.unsqueeze(-1), spec, start=h + t, past=past, keep_kv=True)
            logp_states, state = out[:, :, 0], nxt
    actions = torch.stack(acts, dim=-1).view(s, b, g, h)
    logp = torch.stack(lps, dim=-1).view(s, b, g, h)
    return actions, logp, torch.stack(cands, dim=2), torch.stack(cand_lps, dim=2)


def test_decode_into_the_cache_equals_extend_over_the_concatenated_past():
    spec, params = _spec_params()
    prompts = torch.randint(0, 3, (2, 4, 5), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        _, kv = tfm.prefill(params, prompts, spec)
        cache = tfm.kv_cache(kv, spec)
        past = kv
        for t in range(4):
            tok = torch.randint(0, 3, (2, 4, 1), generator=torch.Generator().manual_seed(t + 1))
            ref, past = tfm.extend(params, tok, spec, start=5 + t, past=past, keep_kv=True)
            ours = tfm.decode(params, tok, spec, start=5 + t, cache=cache)
            assert torch.equal(ours, ref)
            for (ck, cv), (pk, pv) in zip(cache, past):
                assert torch.equal(ck[:, :, :, :6 + t], pk) and torch.equal(cv[:, :, :, :6 + t], pv)
    with pytest.raises(ValueError, match="cache must hold"):
        tfm.decode(params, tok[:, :3], spec, start=9, cache=cache)


@pytest.mark.parametrize("streams, candidates", [(1, 1), (1, 3), (4, 1), (8, 2)])
def test_rollout_is_bit_identical_to_the_reference_sampler(streams, candidates):
    # V = 2, H = 5 and 12 prompts: repeated prompts and merged streams that later split, on both seeds.
    spec, params = _spec_params(v=2, h=5)
    prompts = torch.randint(0, 2, (2, 12, 5), generator=torch.Generator().manual_seed(3))
    prompts[1, 6:] = prompts[1, :6]
    outs = [f(params, spec, prompts, streams, candidates, [torch.Generator().manual_seed(s) for s in (7, 8)])
            for f in (te.rollout, _reference_rollout)]
    ours, ref = outs
    for a, b in zip(ours[:2], ref[:2]):
        assert torch.equal(a, b)
    if candidates > 1:
        for a, b in zip(ours[2:], ref[2:]):
            assert torch.equal(a, b)
    assert len(torch.unique(ours[0][0].reshape(-1, 5), dim=0)) > 1      # the streams did split


def test_a_reused_answer_plan_gives_identical_log_probs_and_gradients():
    spec, params = _spec_params(v=2, h=4)
    params = {k: v.requires_grad_(True) for k, v in params.items()}
    prompts = torch.randint(0, 2, (2, 8, 4), generator=torch.Generator().manual_seed(1))
    actions = torch.randint(0, 2, (2, 8, 3, 4), generator=torch.Generator().manual_seed(2))
    plan = te.answer_plan(prompts, actions, spec.vocab)
    a = te.answer_logp(params, spec, prompts, actions)
    b = te.answer_logp(params, spec, prompts, actions, plan)
    assert torch.equal(a, b)
    w = torch.randn(a.shape, generator=torch.Generator().manual_seed(3))
    for ga, gb in zip(torch.autograd.grad((a * w).sum(), list(params.values())),
                      torch.autograd.grad((b * w).sum(), list(params.values()))):
        assert torch.equal(ga, gb)
    with pytest.raises(ValueError, match="plan is for actions of shape"):
        te.answer_logp(params, spec, prompts, actions[:, :, :2], plan)
