"""Chunked per-token log-probs: the same numbers and gradients as the full-logits path, in fp32, for plain,
tied-embedding, LoRA-wrapped and bf16 models, without ever holding the [N, C, V] logits."""

from __future__ import annotations

import warnings

import pytest
import torch

pytest.importorskip("transformers", reason="needs the llm extra (pip install 'targetpo[llm]')")

from targetpo.llm.logprobs import VOCAB_SLICE, chunked_token_logprob, lm_head_parts  # noqa: E402
from targetpo.llm.models import build_char_tokenizer, build_tiny_model  # noqa: E402
from targetpo.llm.rollout import token_logprobs  # noqa: E402


def _batch(n=6, p=5, c=7, vocab=60, seed=0):
    g = torch.Generator().manual_seed(seed)
    pi = torch.randint(5, vocab, (n, p), generator=g)
    pm = torch.ones(n, p, dtype=torch.bool)
    pm[0, :2] = False  # left padding
    ci = torch.randint(5, vocab, (n, c), generator=g)
    cm = torch.ones(n, c, dtype=torch.bool)
    cm[1, 4:] = False  # a completion that stopped early
    return pi, pm, ci, cm


def _both(model, temperature, chunk=5):
    pi, pm, ci, cm = _batch()
    w = torch.linspace(-1, 2, ci.shape[1])
    out = []
    for chunk_tokens in (0, chunk):
        lp = token_logprobs(model, pi, pm, ci, cm, temperature, chunk_tokens=chunk_tokens)
        grads = torch.autograd.grad((lp * w).sum(), [p for p in model.parameters() if p.requires_grad])
        out.append((lp.detach(), grads))
    return out


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("tied", [False, True])
def test_chunked_matches_full_logits(temperature, tied):
    tok = build_char_tokenizer()
    model = build_tiny_model(tok, seed=1)
    if tied:
        model.config.tie_word_embeddings = True
        model.lm_head.weight = model.get_input_embeddings().weight
    (a, ga), (b, gb) = _both(model, temperature)
    assert (a - b).abs().max() < 1e-5 and a.abs().max() > 0.1
    assert all(torch.allclose(x, y, atol=1e-5, rtol=1e-4) for x, y in zip(ga, gb))
    assert max(x.abs().max() for x in ga) > 1e-2  # gradients are not trivially zero


def test_chunked_matches_under_lora():
    peft = pytest.importorskip("peft", reason="needs peft (the llm extra)")
    tok = build_char_tokenizer()
    model = peft.get_peft_model(build_tiny_model(tok, seed=2),
                                peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    assert lm_head_parts(model) is not None  # the backbone under the PEFT wrapper, LoRA layers in place
    (a, ga), (b, gb) = _both(model, 1.0)
    assert (a - b).abs().max() < 1e-5
    assert len(ga) > 0 and all(torch.allclose(x, y, atol=1e-5, rtol=1e-4) for x, y in zip(ga, gb))


def test_bf16_model_is_computed_in_fp32():
    tok = build_char_tokenizer()
    model = build_tiny_model(tok, seed=3).to(torch.bfloat16)
    pi, pm, ci, cm = _batch()
    lp = token_logprobs(model, pi, pm, ci, cm, chunk_tokens=4)
    assert lp.dtype == torch.float32
    h = model.get_decoder()(input_ids=torch.cat([pi, ci], 1), attention_mask=torch.cat([pm, cm], 1).long(),
                            position_ids=(torch.cat([pm, cm], 1).long().cumsum(-1) - 1).clamp_min(0))[0]
    ref = torch.log_softmax(h[:, pi.shape[1] - 1:-1].float() @ model.lm_head.weight.float().T, -1)
    ref = ref.gather(-1, ci[..., None]).squeeze(-1)
    assert torch.allclose(lp[cm], ref[cm], atol=1e-5)


def test_chunked_function_against_autograd_in_float64():
    torch.manual_seed(0)
    h = torch.randn(7, 3, 5, dtype=torch.float64, requires_grad=True)
    w = torch.randn(11, 5, dtype=torch.float64, requires_grad=True)
    b = torch.randn(11, dtype=torch.float64, requires_grad=True)
    y = torch.randint(0, 11, (7, 3))
    for t in (1.0, 0.5):
        got = chunked_token_logprob(h, w, y, bias=b, temperature=t, chunk_tokens=4)
        ref = torch.log_softmax((h @ w.T + b) / t, -1).gather(-1, y[..., None]).squeeze(-1)
        assert torch.allclose(got.double(), ref, atol=1e-5)
    # the gradient is exact math, checked by finite differences on a small case (fp32 inside, so loose eps)
    f = lambda h_, w_, b_: chunked_token_logprob(h_, w_, y[:2, :1], bias=b_, temperature=0.7, chunk_tokens=1)
    assert torch.autograd.gradcheck(lambda h_, w_, b_: f(h_, w_, b_).double(),
                                    (h[:2, :1].detach().requires_grad_(), w.detach().requires_grad_(),
                                     b.detach().requires_grad_()), eps=1e-3, atol=1e-3, rtol=1e-2)


def test_bad_input_is_refused():
    h, w = torch.zeros(2, 3, 4), torch.zeros(9, 4)
    with pytest.raises(ValueError, match="hidden .* and targets"):
        chunked_token_logprob(h, w, torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match=r"weight \(9, 5\) must be \[V, 4\]"):
        chunked_token_logprob(h, torch.zeros(9, 5), torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="temperature=0"):
        chunked_token_logprob(h, w, torch.zeros(2, 3, dtype=torch.long), temperature=0)
    with pytest.raises(ValueError, match="chunk_tokens=0"):
        chunked_token_logprob(h, w, torch.zeros(2, 3, dtype=torch.long), chunk_tokens=0)


def test_softcapped_models_use_the_full_logits_with_a_warning():
    tok = build_char_tokenizer()
    model = build_tiny_model(tok, seed=4)
    model.config.final_logit_softcapping = 30.0
    assert lm_head_parts(model) is None
    pi, pm, ci, cm = _batch()
    with pytest.warns(UserWarning, match="full logits"):
        token_logprobs(model, pi, pm, ci, cm)


@pytest.mark.parametrize("how", ["unknown transform", "lm_head_multiplier", "text config"])
def test_a_head_whose_logits_are_transformed_is_not_split_off(how):
    """FalconH1 multiplies its logits by config.lm_head_multiplier, composite models keep the soft-cap in their text
    config, and an architecture may do anything after the head: the chunked path then scored tokens under another
    distribution than the one sampled (0.15 nats off for a multiplier of 0.25), with ratio 1 hiding it."""
    tok = build_char_tokenizer()
    model = build_tiny_model(tok, seed=5)
    if how == "unknown transform":
        forward = model.forward
        model.forward = lambda *a, **kw: forward(*a, **kw).__class__(logits=0.25 * forward(*a, **kw).logits)
    elif how == "lm_head_multiplier":
        model.config.lm_head_multiplier = 0.25
    else:
        model.config.get_text_config = lambda **kw: type("Text", (), {"final_logit_softcapping": 30.0})()
    assert lm_head_parts(model) is None
    pi, pm, ci, cm = _batch()
    if how == "unknown transform":  # the chunked path falls back to the model's own (transformed) logits
        with warnings.catch_warnings():  # warned once per class, maybe already by another test
            warnings.simplefilter("ignore")
            chunked = token_logprobs(model, pi, pm, ci, cm)
        torch.testing.assert_close(chunked, token_logprobs(model, pi, pm, ci, cm, chunk_tokens=0))


def test_a_plain_head_is_still_split_off():
    assert lm_head_parts(build_tiny_model(build_char_tokenizer(), seed=5)) is not None


def test_right_padded_prompts_are_refused():
    """The first completion token's logit is read at the last prompt column: a right-padded row scored it from a
    pad (−4.98 instead of −4.96 in the audit's example) while every other token matched."""
    model = build_tiny_model(build_char_tokenizer(), seed=5)
    pi, pm, ci, cm = _batch()
    pm = pm.flip(1)  # row 0's two pads now at the end
    with pytest.raises(ValueError, match=r"prompt_mask: rows \[0\] end in padding; prompts must be left-padded"):
        token_logprobs(model, pi, pm, ci, cm)


# ----------------------------------------------------------------------------- what is held in memory

class _VocabSized(torch.overrides.TorchFunctionMode):
    """Records the shape of every tensor an op returns whose last dim is the vocabulary (the head's logits and
    their copies) and every fp32 tensor of the head weight's shape or larger in rows."""

    def __init__(self, vocab: int, width: int, model=None):
        super().__init__()
        self.vocab, self.width, self.logits, self.weights = vocab, width, [], []
        # views of the weights themselves (the head's transpose) are no copies
        self.own = {p.untyped_storage().data_ptr() for p in model.parameters()} if model is not None else set()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and t.dim() >= 2 and t.untyped_storage().data_ptr() not in self.own:
                if t.shape[-1] == self.vocab:
                    self.logits.append(tuple(t.shape))
                if t.dtype == torch.float32 and t.shape[-1] == self.width and t.shape[0] > VOCAB_SLICE:
                    self.weights.append(tuple(t.shape))
        return out


def _vocab_model(vocab=40_000, dtype=torch.float32):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=False)
    return Qwen2ForCausalLM(cfg).to(dtype).eval()


def test_a_half_precision_head_is_upcast_slice_by_slice():
    """`weight.float()` made an fp32 copy of the whole [V, D] head on every forward and backward (1.2 GB for a
    [151,936, 2048] bf16 head), though the docs said "chunk by chunk"; the numbers stay those of fp32 math."""
    model = _vocab_model(dtype=torch.bfloat16)
    g = torch.Generator().manual_seed(1)
    pi, ci = torch.randint(0, 40_000, (3, 4), generator=g), torch.randint(0, 40_000, (3, 5), generator=g)
    pm, cm = torch.ones(3, 4, dtype=torch.bool), torch.ones(3, 5, dtype=torch.bool)
    seen = _VocabSized(40_000, 32, model)
    with seen:
        lp = token_logprobs(model, pi, pm, ci, cm, chunk_tokens=4)
        (grad,) = torch.autograd.grad(lp.sum(), [model.lm_head.weight])
    assert not seen.weights, seen.weights
    h = model.get_decoder()(input_ids=torch.cat([pi, ci], 1))[0][:, 3:-1]
    ref = torch.log_softmax(h.float() @ model.lm_head.weight.float().T, -1).gather(-1, ci[..., None]).squeeze(-1)
    assert torch.allclose(lp, ref, atol=1e-5)
    (ref_grad,) = torch.autograd.grad(ref.sum(), [model.lm_head.weight])
    assert grad.dtype == torch.bfloat16 and torch.allclose(grad.float(), ref_grad.float(), rtol=2e-2, atol=1e-4)


def test_one_chunk_of_logits_is_alive_at_a_time(monkeypatch):
    """Each loop bound the new chunk's [chunk, V] buffer while the last one was still bound: two at a time, twice
    the memory the docs promise (0.59 GB instead of 0.29 at a 151,936 vocabulary and 512 tokens)."""
    import weakref

    import targetpo.llm.logprobs as lp_mod

    made, alive_at_call = [], []
    real = lp_mod._chunk_logits

    def tracked(*args, **kwargs):
        alive_at_call.append(sum(r() is not None for r in made))
        z = real(*args, **kwargs)
        made.append(weakref.ref(z))
        return z

    monkeypatch.setattr(lp_mod, "_chunk_logits", tracked)
    h = torch.randn(20, 8, requires_grad=True)
    w = torch.randn(50, 8, requires_grad=True)
    out = chunked_token_logprob(h, w, torch.randint(0, 50, (20,)), chunk_tokens=4)
    out.sum().backward()
    assert len(alive_at_call) == 10 and max(alive_at_call) == 0, alive_at_call


def test_the_warm_start_never_holds_the_full_logits_beyond_its_budget(monkeypatch):
    """supervised_loss ran the model's own forward: [B, L, V] logits over every position (prompt included), a
    non-contiguous slice copied by reshape and cross_entropy's fp32 log-softmax: 7.9 GB for 16 rows of 288
    tokens at a 151,936 vocabulary, 12× the chunked path. Beyond FULL_LOGITS_MAX_BYTES only the labelled tokens go
    through the head; below it the loss is the full logits' cross-entropy bit for bit (the presets' warm starts)."""
    import targetpo.llm.warmstart as ws
    from targetpo.llm.warmstart import supervised_loss

    model = _vocab_model()
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(0, 40_000, (4, 12), generator=g)
    mask = torch.ones(4, 12, dtype=torch.bool)
    mask[0, :3] = False
    labels = torch.full((4, 12), -100)
    labels[:, 7:] = ids[:, 7:]
    assert lm_head_parts(model) is not None  # its one-time check of the split runs the model on 8 tokens
    small = supervised_loss(model, ids, mask, labels, chunk_tokens=8)  # 4 × 11 × 40,000 × 4 B = 7 MB: full logits
    monkeypatch.setattr(ws, "FULL_LOGITS_MAX_BYTES", 4 * 11 * 40_000 * 4 - 1)
    seen = _VocabSized(40_000, 32, model)
    with seen:
        loss = supervised_loss(model, ids, mask, labels, chunk_tokens=8)
        loss.backward()
    assert seen.logits and max(s[0] for s in seen.logits) <= 8 and all(len(s) == 2 for s in seen.logits), seen.logits
    model.zero_grad()
    from targetpo.llm.rollout import position_ids

    logits = model(input_ids=ids, attention_mask=mask.long(), position_ids=position_ids(mask)).logits
    ref = torch.nn.functional.cross_entropy(logits[:, :-1].float().reshape(-1, 40_000), labels[:, 1:].reshape(-1),
                                            ignore_index=-100)
    assert torch.allclose(loss, ref, rtol=1e-5) and torch.equal(small, ref)


def test_the_full_logits_fallback_takes_its_fp32_log_softmax_a_chunk_at_a_time():
    """A model whose head cannot be split off (soft-capped logits) took its [N, C, V] logits whole to fp32, and once
    more for a temperature: at a 256k vocabulary, 3× the bf16 logits on top of them. Now only the model's own
    logits are whole; the fp32 work runs `chunk_tokens` tokens at a time, with the numbers of the whole path."""
    model = _vocab_model(dtype=torch.bfloat16)
    model.config.final_logit_softcapping = 30.0  # Qwen2 ignores it; it only sends the log-probs to the fallback
    assert lm_head_parts(model) is None
    g = torch.Generator().manual_seed(3)
    pi, ci = torch.randint(0, 40_000, (3, 4), generator=g), torch.randint(0, 40_000, (3, 5), generator=g)
    pm, cm = torch.ones(3, 4, dtype=torch.bool), torch.ones(3, 5, dtype=torch.bool)
    ref = token_logprobs(model, pi, pm, ci, cm, 0.7, chunk_tokens=0)
    (ref_grad,) = torch.autograd.grad(ref.sum(), [model.lm_head.weight])

    class Fp32Vocab(torch.overrides.TorchFunctionMode):
        def __init__(self):
            super().__init__()
            self.rows = []

        def __torch_function__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(t, torch.Tensor) and t.dtype == torch.float32 and t.dim() and t.shape[-1] == 40_000:
                    self.rows.append(t.numel() // 40_000)
            return out

    seen = Fp32Vocab()
    with seen, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the fallback's warning, once per class
        lp = token_logprobs(model, pi, pm, ci, cm, 0.7, chunk_tokens=4)
        (grad,) = torch.autograd.grad(lp.sum(), [model.lm_head.weight])
    assert seen.rows and max(seen.rows) <= 4, seen.rows
    assert torch.equal(lp, ref) and torch.equal(grad, ref_grad)
    empty = torch.zeros(3, 0, dtype=torch.long)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert token_logprobs(model, pi, pm, empty, empty.bool(), chunk_tokens=4).shape == (3, 0)
