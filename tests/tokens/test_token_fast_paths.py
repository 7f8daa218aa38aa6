"""The engine's fast paths give bit-for-bit the numbers of the plain computations they replace: decoding into a
preallocated KV cache vs re-concatenating the past, the rollout vs a copy-the-past reference sampler, and a
reused AnswerPlan vs recomputing it (identical numbers keep every run reproducible across engine versions)."""

import pytest
import torch

from targetpo.tokens import engine as te
from targetpo.tokens import rows
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
    distinct = te._take(prompts, rep_p)   # the prompt pass as the engine runs it (its tree: another test)
    logp_states, cache = tfm.prefill(params, distinct, spec, te._worth_it(rows.prefix_tree(distinct, v)))
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


# ----------------------------------------------------------------------------- prefix trees

def _prefixes(seqs, roots=None):
    """{(seed, level): set of distinct (root, prefix) tuples}, counted by hand."""
    out = {}
    s, p, t = seqs.shape
    for i in range(s):
        for j in range(t):
            out[i, j] = {((-1 if roots is None else int(roots[i, r])),) + tuple(seqs[i, r, :j + 1].tolist())
                         for r in range(p)}
    return out


@pytest.mark.parametrize("vocab", [2, 2 ** 20])   # 2^20: prefix codes past 62 bits, the per-seed unique path
@pytest.mark.parametrize("with_roots", [False, True])
def test_a_prefix_tree_has_one_node_per_distinct_prefix_and_every_path_spells_its_sequence(with_roots, vocab):
    gen = torch.Generator().manual_seed(4)
    seqs = torch.randint(0, 2, (2, 9, 4), generator=gen)
    seqs[1, 5:] = seqs[1, :4]                                            # repeats in one seed only
    roots = torch.randint(0, 3, (2, 9), generator=gen) if with_roots else None
    tree = rows.prefix_tree(seqs, vocab, roots=roots, n_roots=3)
    hand = _prefixes(seqs, roots)
    widths = [max(len(hand[i, j]) for i in range(2)) for j in range(4)]
    assert tree.nodes == sum(widths)
    assert tree.position.tolist() == [j for j in range(4) for _ in range(widths[j])]
    for i in range(2):
        for r in range(9):
            nodes = tree.path[i, r]
            assert tree.token[i, nodes].tolist() == seqs[i, r].tolist()           # the path spells the row
            assert tree.position[nodes].tolist() == list(range(4))
            for j in range(4):                                                    # one node per prefix ...
                same = [q for q in range(9) if seqs[i, q, :j + 1].tolist() == seqs[i, r, :j + 1].tolist()
                        and (roots is None or roots[i, q] == roots[i, r])]
                assert {int(tree.path[i, q, j]) for q in same} == {int(nodes[j])}
        # ... and a node's source is a place that holds it
        src = tree.source[i]
        for node in set(tree.path[i].flatten().tolist()):
            r, j = divmod(int(src[node]), 4)
            assert int(tree.path[i, r, j]) == node


@pytest.mark.parametrize("v, p", [(2, 12), (3, 7)])
def test_prefill_over_the_prefix_tree_equals_the_row_by_row_pass_with_its_gradients(v, p):
    spec = tfm.TransformerSpec(vocab=v, max_len=10, heads=2)
    params = {k: t.double().requires_grad_(True) for k, t in _spec_params(v=v, h=5)[1].items()}
    prompts = torch.randint(0, v, (2, p, 5), generator=torch.Generator().manual_seed(6))
    tree = rows.prefix_tree(prompts, v)
    assert tree.nodes < p * 5                                              # there is something to share
    ref, ref_kv = tfm.prefill(params, prompts, spec)
    ours, ours_kv = tfm.prefill(params, prompts, spec, tree)
    torch.testing.assert_close(ours, ref, rtol=0, atol=1e-12)
    for (a, b), (c, d) in zip(ours_kv, ref_kv):
        torch.testing.assert_close(a, c, rtol=0, atol=1e-12)
        torch.testing.assert_close(b, d, rtol=0, atol=1e-12)
    w = torch.randn(ref.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    wk = [torch.randn(k.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(2)) for k, _ in ref_kv]

    def loss(out, kv):
        return (out * w).sum() + sum((k * c).sum() + (vv * c).sum() for (k, vv), c in zip(kv, wk))

    for a, b in zip(torch.autograd.grad(loss(ours, ours_kv), list(params.values())),
                    torch.autograd.grad(loss(ref, ref_kv), list(params.values()))):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)


def test_extend_over_the_answers_prefix_tree_equals_the_row_by_row_pass_with_its_gradients():
    """Rows that continue one prompt (equal roots, equal pasts) share their common answer prefixes; rows of other
    prompts never do, even with equal tokens."""
    spec = tfm.TransformerSpec(vocab=2, max_len=10, heads=2)
    params = {k: t.double().requires_grad_(True) for k, t in _spec_params(v=2, h=5)[1].items()}
    gen = torch.Generator().manual_seed(8)
    prompts = torch.randint(0, 2, (2, 3, 5), generator=gen)
    roots = torch.tensor([[0, 0, 0, 1, 1, 2, 2, 2], [0, 1, 1, 1, 2, 2, 0, 0]])
    answers = torch.randint(0, 2, (2, 8, 4), generator=gen)
    answers[:, 1, :2] = answers[:, 0, :2]                                  # shared prefixes within a prompt ...
    answers[:, 3] = answers[:, 0]                                          # ... and equal tokens across prompts
    _, kv = tfm.prefill(params, prompts, spec)
    past = [(te._take(k, roots), te._take(vv, roots)) for k, vv in kv]
    tree = rows.prefix_tree(answers, 2, roots=roots, n_roots=3)
    assert tree.nodes < 8 * 4
    ref, _ = tfm.extend(params, answers, spec, start=5, past=past)
    ours, _ = tfm.extend(params, answers, spec, start=5, past=past, tree=tree)
    torch.testing.assert_close(ours, ref, rtol=0, atol=1e-12)
    w = torch.randn(ref.shape, dtype=torch.float64, generator=gen)
    for a, b in zip(torch.autograd.grad((ours * w).sum(), list(params.values()), retain_graph=True),
                    torch.autograd.grad((ref * w).sum(), list(params.values()))):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)
    with pytest.raises(ValueError, match="tree= needs past="):
        tfm.extend(params, answers, spec, start=5, past=past, tree=tree, keep_kv=True)
    with pytest.raises(ValueError, match="not these tokens"):
        tfm.extend(params, 1 - answers, spec, start=5, past=past, tree=tree)
    with pytest.raises(ValueError, match="not the tokens'"):
        tfm.prefill(params, prompts, spec, tree)


@pytest.mark.parametrize("threads", [1, 2])
def test_take_has_index_selects_gradient_bit_for_bit_also_from_a_strided_gradient(threads):
    """rows.take's backward makes the incoming gradient contiguous before index_add_ (a gathered KV cache's
    gradient arrives as a slice of a concatenation); the sums stay index_select's own, in index order."""
    gen = torch.Generator().manual_seed(11)
    x = torch.randn(3, 7, 2, 6, 4, generator=gen)                        # [S, N, h, T, hd], like a prompt cache
    idx = torch.randint(0, 7, (3, 40), generator=gen)                    # [S, M]: many repeats of each row
    idx[:, :7] = torch.arange(7)                                           # every row gathered at least once
    upstream = torch.randn(3, 40, 2, 11, 4, generator=gen)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        got, want = [], []
        for slice_ in (upstream[:, :, :, :6], upstream[:, :, :, :6].contiguous()):  # strided, then contiguous
            a = x.clone().requires_grad_(True)
            out = rows.take(a, idx)
            assert torch.equal(out, a.detach()[torch.arange(3)[:, None], idx])
            got.append(torch.autograd.grad(out, a, slice_)[0])
            b = x.clone().requires_grad_(True)
            flat = (idx + 7 * torch.arange(3)[:, None]).reshape(-1)
            plain = b.reshape(21, 2, 6, 4).index_select(0, flat).view(3, 40, 2, 6, 4)
            want.append(torch.autograd.grad(plain, b, slice_)[0])
    finally:
        torch.set_num_threads(before)
    for g, w in zip(got, want):
        assert torch.equal(g, w)
    assert torch.equal(got[0], got[1])
    assert not rows.take(x, idx).requires_grad                            # no autograd node without a gradient
