"""The lean KV-cached sampling loop (rollout.kv_loop_sample): under one seed it draws exactly the tokens
``generate`` draws, stops rows at EOS the same way, and its completions are scored like generate's."""

import pytest
import torch

pytestmark = pytest.mark.llm
pytest.importorskip("transformers", reason="needs the llm extra: pip install -e '.[llm]'")

from targetpo.llm.models import build_char_tokenizer, build_tiny_model
from targetpo.llm.rollout import sample, token_logprobs

PROMPTS = ["a4 b-1 c+7 =", "x =", "a longer prompt, so rows are left-padded"]


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
@pytest.mark.parametrize("greedy, k, temperature", [(False, 4, 1.0), (False, 3, 0.7), (True, 1, 1.0)])
def test_kv_loop_draws_the_same_tokens_as_generate(tok, arch, greedy, k, temperature):
    model = build_tiny_model(tok, arch=arch, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2,
                             intermediate_size=64, seed=3)
    kw = dict(k=k, max_new_tokens=30, temperature=temperature, greedy=greedy, seed=11)
    a = sample(model, tok, PROMPTS, **kw)
    b = sample(model, tok, PROMPTS, **kw, sampler="kv_loop")
    for x, y in zip(a, b):
        assert x.shape == y.shape and torch.equal(x, y)
    if not greedy:  # the draws depend on the seed (the test would pass for a sampler that ignored it otherwise)
        c = sample(model, tok, PROMPTS, **{**kw, "seed": 12}, sampler="kv_loop")
        assert not torch.equal(c[2], b[2])


def test_kv_loop_stops_each_row_at_eos_like_generate(tok):
    model = build_tiny_model(tok, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64)
    with torch.no_grad():  # an EOS logit of a few nats either way: rows end at different, early steps
        model.lm_head.weight[tok.eos_token_id] = 0.5 * torch.randn(32, generator=torch.Generator().manual_seed(0))
    kw = dict(k=8, max_new_tokens=200, seed=4)
    a = sample(model, tok, PROMPTS, **kw)
    ids, mask, comp, cmask = sample(model, tok, PROMPTS, **kw, sampler="kv_loop")
    assert torch.equal(a[2], comp) and torch.equal(a[3], cmask)
    lengths = cmask.sum(1)
    ended = (comp == tok.eos_token_id).any(1)
    assert ended.any() and lengths.min() < lengths.max()  # rows stop at different steps
    # after a row's EOS only padding follows, and the completion mask ends at that EOS
    for row, m, e in zip(comp, cmask, ended):
        if e:
            first = int((row == tok.eos_token_id).nonzero()[0])
            assert m[:first + 1].all() and not m[first + 1:].any()
            assert (row[first + 1:] == tok.pad_token_id).all()


def test_kv_loop_draws_follow_the_teacher_forced_log_probs(tok):
    """The rollout recomputes log-probs by a teacher-forced forward (token_logprobs) at the sampling temperature;
    the loop's draws must follow exactly those probabilities: first-token frequencies over 4000 draws within 4
    binomial standard errors of exp(log-prob) for every token, and not within them of the T = 1 probabilities."""
    model = build_tiny_model(tok, hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=32,
                             seed=1)
    with torch.no_grad():  # concentrate the first token on a few choices so frequencies are measurable
        model.lm_head.weight.mul_(40.0)
    n, temp = 4000, 1.5
    ids, mask, comp, cmask = sample(model, tok, ["a1 ="], k=n, max_new_tokens=1, temperature=temp, seed=0,
                                    sampler="kv_loop")
    freq = torch.bincount(comp[:, 0], minlength=len(tok)).double() / n
    vocab = torch.arange(len(tok))[:, None]
    ones = torch.ones_like(vocab, dtype=torch.bool)
    with torch.no_grad():
        def probs(t):
            return token_logprobs(model, ids[:1].expand(len(tok), -1), mask[:1].expand(len(tok), -1), vocab, ones,
                                  temperature=t)[:, 0].double().exp()
        p, p1 = probs(temp), probs(1.0)
    assert p.sum() == pytest.approx(1.0, abs=1e-5) and 0.05 < p.max() < 0.95  # a real choice among tokens
    se = (p * (1 - p) / n).sqrt().clamp_min(1e-3)
    assert ((freq - p).abs() < 4 * se).all()
    assert not ((freq - p1).abs() < 4 * se).all()


def test_unknown_sampler_is_refused(tok):
    model = build_tiny_model(tok, hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=32)
    with pytest.raises(ValueError, match="sampler='beam'"):
        sample(model, tok, PROMPTS, k=1, max_new_tokens=4, sampler="beam")


@pytest.mark.parametrize("setting", [{"repetition_penalty": 50.0}, {"min_new_tokens": 30}, {"no_repeat_ngram_size": 1},
                                     "suppress"])
def test_generate_ignores_the_checkpoint_s_own_generation_config(tok, setting):
    """generate fills what sample's GenerationConfig leaves unset from model.generation_config: a checkpoint's
    repetition penalty (Qwen2.5-Instruct ships 1.05–1.1) or suppressed tokens bent the samples away from
    π^(1/T), the distribution the loss scores, and from kv_loop's draws."""
    model = build_tiny_model(tok, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64)
    kw = dict(k=4, max_new_tokens=12, seed=5)
    plain = sample(model, tok, PROMPTS, **kw)
    if setting == "suppress":
        keep = tok.convert_tokens_to_ids("7")
        setting = {"suppress_tokens": [i for i in range(len(tok)) if i not in (keep, tok.eos_token_id)]}
    for name, value in setting.items():
        setattr(model.generation_config, name, value)
    poisoned = sample(model, tok, PROMPTS, **kw)
    assert all(torch.equal(x, y) for x, y in zip(plain, poisoned))
    assert getattr(model.generation_config, name) == value  # the model's own config is left as it was
