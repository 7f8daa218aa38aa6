r"""Per-token log-probabilities of sampled tokens without materialising the full-vocabulary logits.

An LLM update needs :math:`\log \pi(y_t \mid x, y_{<t}) = z_{t, y_t}/T - \operatorname{logsumexp}_v z_{t,v}/T`
for every completion token, where :math:`z_t = W h_t (+ b)` are the LM head's logits. Computed the obvious way
this holds an [N, C, V] tensor (and its fp32 copy, its temperature-scaled copy and the softmax saved for
backward): at 32 sequences × 1,024 tokens × 151,936 vocabulary that is ~20 GB per copy.

:class:`ChunkedTokenLogprob` instead walks the tokens in chunks through the LM head, keeps only each token's
chosen logit and log-normaliser (two floats a token), and recomputes a chunk's logits in backward, where the
gradient on the logits is :math:`(\mathbb 1[v = y_t] - \mathrm{softmax}(z_t/T)_v)\, g_t / T`. Peak memory is one
chunk's [chunk, V] fp32 logits instead of the whole batch's. The math is computed in fp32 whatever the model's
dtype: bf16/fp16 hidden states are upcast chunk by chunk, and bf16/fp16 head weights slice by slice of
:data:`VOCAB_SLICE` rows (an fp32 copy of a [151,936, 2048] head would be 1.2 GB on every forward and backward).
"""

from __future__ import annotations

import inspect
import warnings
import weakref

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

DEFAULT_CHUNK_TOKENS = 512  # one [512, 151,936] fp32 buffer = 0.3 GB, next to a 1.7B model's 3.4 GB of bf16 weights


VOCAB_SLICE = 16384  # rows of a half-precision head upcast at a time: [16384, 2048] fp32 = 128 MB


def _fp32(weight: Tensor) -> Tensor | None:
    """The head weight in fp32 (itself when it is fp32), or None for a half-precision one, upcast per slice."""
    return None if weight.dtype in (torch.float16, torch.bfloat16) else weight.float()


def _vocab_slices(weight: Tensor):
    """(rows, that slice of `weight` in fp32) over the vocabulary."""
    for v in range(0, weight.shape[0], VOCAB_SLICE):
        yield slice(v, v + VOCAB_SLICE), weight[v:v + VOCAB_SLICE].float()


def _head_slices(weight: Tensor, w32: Tensor | None):
    """(rows, those rows of the head in fp32): the whole fp32 head at once, or a half-precision one slice by slice."""
    return [(slice(None), w32)] if w32 is not None else _vocab_slices(weight)


def _chunk_logits(h: Tensor, weight: Tensor, w32: Tensor | None, b32: Tensor | None, temperature: float) -> Tensor:
    """fp32 logits / T of one chunk of rows, the only [chunk, V] buffer the forward or backward holds."""
    h32 = h.float()
    if w32 is not None:
        z = h32 @ w32.T
    else:
        z = torch.empty(h.shape[0], weight.shape[0], dtype=torch.float32, device=h.device)
        for rows, w in _vocab_slices(weight):
            z[:, rows] = h32 @ w.T
    if b32 is not None:
        z.add_(b32)
    return z.div_(temperature) if temperature != 1.0 else z


class ChunkedTokenLogprob(torch.autograd.Function):
    """log-softmax(W h / T)[target] for rows of `hidden` [M, D], chunked over M; differentiable in `hidden`,
    `weight` and `bias`. Returns [M] fp32. Every [chunk, V] operation is done in place on one buffer."""

    @staticmethod
    def forward(ctx, hidden: Tensor, weight: Tensor, bias: Tensor | None, targets: Tensor, temperature: float,
                chunk: int) -> Tensor:
        w32, b32 = _fp32(weight), None if bias is None else bias.float()
        out = torch.empty(hidden.shape[0], dtype=torch.float32, device=hidden.device)
        lse = torch.empty_like(out)
        for s in range(0, hidden.shape[0], chunk):
            z = _chunk_logits(hidden[s:s + chunk], weight, w32, b32, temperature)
            chosen = z.gather(-1, targets[s:s + chunk, None]).squeeze(-1)
            top = z.amax(-1)
            lse[s:s + chunk] = top + z.sub_(top[:, None]).exp_().sum(-1).log_()
            out[s:s + chunk] = chosen - lse[s:s + chunk]
            del z  # before the next chunk's buffer exists: one [chunk, V] buffer at a time, not two
        ctx.save_for_backward(hidden, weight, bias, targets, lse)
        ctx.temperature, ctx.chunk = temperature, chunk
        return out

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        hidden, weight, bias, targets, lse = ctx.saved_tensors
        t, chunk = ctx.temperature, ctx.chunk
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        w32, b32 = _fp32(weight), None if bias is None else bias.float()
        grad_h = torch.empty_like(hidden) if need_h else None
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_w else None
        grad_b = torch.zeros(weight.shape[0], dtype=torch.float32, device=weight.device) if need_b else None
        for s in range(0, hidden.shape[0], chunk):
            h = hidden[s:s + chunk]
            # d logp / d z = onehot(target) − softmax(z), chained through z = (W h + b) / T
            g = _chunk_logits(h, weight, w32, b32, t).sub_(lse[s:s + chunk, None]).exp_().neg_()
            g.scatter_add_(-1, targets[s:s + chunk, None], torch.ones_like(lse[s:s + chunk, None]))
            g.mul_(grad_out[s:s + chunk, None] / t)
            h32, gh = h.float(), None
            for rows, w in _head_slices(weight, w32):
                if need_h:
                    gh = g[:, rows] @ w if gh is None else gh.addmm_(g[:, rows], w)
                if need_w:
                    grad_w[rows].addmm_(g[:, rows].T, h32)
            if need_h:
                grad_h[s:s + chunk] = gh.to(hidden.dtype)
            if need_b:
                grad_b.add_(g.sum(0))
            del g  # one [chunk, V] buffer at a time
        return (grad_h, None if grad_w is None else grad_w.to(weight.dtype),
                None if grad_b is None else grad_b.to(bias.dtype), None, None, None)


def chunked_token_logprob(hidden: Tensor, weight: Tensor, targets: Tensor, *, bias: Tensor | None = None,
                          temperature: float = 1.0, chunk_tokens: int = DEFAULT_CHUNK_TOKENS) -> Tensor:
    """log-softmax((hidden @ weight.T + bias) / temperature)[..., targets] in fp32, shape of `targets`.

    hidden: [..., D]; weight: [V, D]; targets: [...] int64 in [0, V). Never holds more than `chunk_tokens`
    rows of logits at once, in forward or backward.
    """
    if hidden.shape[:-1] != targets.shape:
        raise ValueError(f"hidden {tuple(hidden.shape)} and targets {tuple(targets.shape)}: hidden must be "
                         f"targets' shape plus a feature dim")
    if weight.ndim != 2 or weight.shape[1] != hidden.shape[-1]:
        raise ValueError(f"weight {tuple(weight.shape)} must be [V, {hidden.shape[-1]}] for hidden "
                         f"{tuple(hidden.shape)}")
    if not temperature > 0 or temperature == float("inf"):
        raise ValueError(f"temperature={temperature}: must be > 0 and finite")
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens={chunk_tokens}: must be >= 1")
    flat = ChunkedTokenLogprob.apply(hidden.reshape(-1, hidden.shape[-1]), weight, bias,
                                     targets.reshape(-1), float(temperature), int(chunk_tokens))
    return flat.reshape(targets.shape)


# ----------------------------------------------------------------------------- Hugging Face causal LMs

def _unwrap(model):
    """The transformers model under a PEFT wrapper (LoRA layers are injected in place, so they still run)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


# Config attributes by which known architectures change their logits after the head.
LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier_scale",
                    "lm_head_multiplier")
_split_checked: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def lm_head_parts(model):
    """(backbone, lm_head) of a Hugging Face causal LM whose logits are exactly ``lm_head(backbone(...)[0])``,
    or None when the model changes its logits after the head (soft-capping, logit scaling) or has no such
    split; :func:`token_logprobs` then uses the full-logits path.

    A config attribute names the known transforms (on the model's config or its text config); any other is
    caught by comparing the two paths once per model on a few tokens, so an unknown architecture falls back to
    the full logits instead of scoring tokens under another distribution than the one sampled."""
    base = _unwrap(model)
    get_decoder = getattr(base, "get_decoder", None)
    head = base.get_output_embeddings() if hasattr(base, "get_output_embeddings") else None
    if get_decoder is None or not isinstance(head, torch.nn.Linear):
        return None
    cfg = getattr(base, "config", None)
    configs = [cfg] + ([cfg.get_text_config()] if hasattr(cfg, "get_text_config") else [])
    for c in configs:
        for attr in LOGIT_TRANSFORMS:
            if getattr(c, attr, None) not in (None, 1, 1.0):
                return None
    if base not in _split_checked:
        _split_checked[base] = _split_matches(base, get_decoder(), head)
    return (get_decoder(), head) if _split_checked[base] else None


@torch.no_grad()
def _split_matches(base, backbone, head) -> bool:
    """Whether lm_head(backbone(x)) equals the model's own logits on a few tokens (eval mode: no dropout)."""
    vocab = head.weight.shape[0]
    ids = (torch.arange(8, device=head.weight.device) * 7919 % vocab).unsqueeze(0)
    was_training = base.training
    base.eval()
    try:
        ours = head(backbone(input_ids=ids, use_cache=False)[0]).float()
        theirs = base(input_ids=ids, use_cache=False).logits.float()
    finally:
        base.train(was_training)
    tol = 1e-4 if head.weight.dtype == torch.float32 else 2e-2
    return ours.shape == theirs.shape and torch.allclose(ours, theirs, rtol=tol, atol=tol)


_warned: set[str] = set()


def full_logits_token_logprobs(model, ids: Tensor, mask: Tensor, pos: Tensor, p: int, completion_ids: Tensor,
                               temperature: float, chunk_tokens: int = 0) -> Tensor:
    """The model's own logits of the completion, [N, C, V] in the model's dtype: the path of models whose head
    cannot be split off, and the reference the chunked path is tested against. ``chunk_tokens=0`` takes their
    log-softmax in fp32 at once; otherwise `chunk_tokens` tokens at a time, recomputed in backward, so the fp32
    copy (twice the size of bf16 logits, and a third copy for a temperature) never exists whole."""
    keep = {}
    if "logits_to_keep" in inspect.signature(_unwrap(model).forward).parameters:
        keep = {"logits_to_keep": ids.shape[1] - p + 1}  # not the prompt's columns (all but the last one's)
    out = model(input_ids=ids, attention_mask=mask.long(), position_ids=pos, use_cache=False, **keep)
    logits = out.logits[:, -(ids.shape[1] - p + 1):-1]  # the logits that predict each completion token
    n, c = completion_ids.shape
    if not chunk_tokens or not n * c:
        return _logits_logprob(logits, completion_ids, temperature)
    rows, cols = max(1, chunk_tokens // c), min(c, chunk_tokens)  # whole rows, or one row in column chunks
    return torch.cat([torch.cat([_checkpointed(_logits_logprob, logits[i:i + rows, j:j + cols],
                                               completion_ids[i:i + rows, j:j + cols], temperature)
                                 for j in range(0, c, cols)], dim=1)
                      for i in range(0, n, rows)], dim=0)


def _logits_logprob(logits: Tensor, targets: Tensor, temperature: float) -> Tensor:
    lg = logits.float()
    if temperature != 1.0:
        lg = lg / temperature
    return lg.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(lg, dim=-1)


def _checkpointed(fn, logits: Tensor, *args) -> Tensor:
    """fn(logits, *args), keeping only `logits` (a view of the model's) for backward, which recomputes fn."""
    if not (torch.is_grad_enabled() and logits.requires_grad):
        return fn(logits, *args)
    return checkpoint(fn, logits, *args, use_reentrant=False)


def chunked_model_token_logprobs(model, ids: Tensor, mask: Tensor, pos: Tensor, p: int, completion_ids: Tensor,
                                 temperature: float, chunk_tokens: int) -> Tensor:
    """Per-token log-probs [N, C] through the backbone's hidden states and the chunked LM head."""
    parts = lm_head_parts(model)
    if parts is None:
        name = type(_unwrap(model)).__name__
        if name not in _warned:
            _warned.add(name)
            warnings.warn(f"{name}: its logits are not lm_head(hidden states) alone (soft-capping or scaling) or "
                          f"it has no get_decoder(); computing log-probs from the full logits (more memory)",
                          stacklevel=3)
        return full_logits_token_logprobs(model, ids, mask, pos, p, completion_ids, temperature, chunk_tokens)
    backbone, head = parts
    hidden = backbone(input_ids=ids, attention_mask=mask.long(), position_ids=pos, use_cache=False)[0]
    h = hidden[:, p - 1:-1]  # the hidden states that predict each completion token
    return chunked_token_logprob(h, head.weight, completion_ids, bias=head.bias, temperature=temperature,
                                 chunk_tokens=chunk_tokens)
