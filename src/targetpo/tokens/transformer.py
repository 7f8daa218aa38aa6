r"""The paper's tiny causal transformer (docs/method.md §4), with a leading *seed* axis so S independent models run as one.

Architecture (the authors' Flax ``CausalTransformer``): token embedding + learned absolute position embedding
(no scaling) → ``layers`` × pre-LN blocks [LN → causal multi-head self-attention (separate q/k/v projections
with bias, output projection with bias) → residual; LN → Dense(ffn_mult·d) → tanh-GELU → Dense(d) → residual]
→ final LN → untied Dense(V) → log-softmax. LayerNorm eps = 1e-6 (Flax default). No dropout.

Parameters are a dict ``name → Tensor [S, *shape]``; ``shape`` is the Flax per-seed shape, so the optimizer's
Muon/AdamW partition and shape scales read directly off :data:`ParamInfo` (docs/method.md §4 table). Initialisation is
Flax's: lecun-normal (truncated at ±2σ, variance 1/fan_in) kernels with zero biases, embedding N(0, 1/d),
position embedding N(0, 0.02²). Seed s is initialised from ``torch.Generator().manual_seed(seed_s)`` alone, so a
seed's model does not depend on which other seeds share the batch.

Three entry points:

- :func:`forward` — a full causal pass over ``tokens [S, N, T]``, returning log-probs of positions ≥ ``out_from``;
- :func:`prefill` — a pass over prompts ``[S, P, Tp]`` that returns the next-token log-probs after the prompt and
  the per-layer keys/values (the KV cache);
- :func:`extend` — new tokens ``[S, N, T]`` that attend to a cached prefix shared by groups of ``N // P``
  consecutive rows (K rollouts of one prompt share its cache) and, optionally, to their own cached past.
  With T = 1 it is one KV-cached decoding step; with T > 1 and gradients on, it is the training pass of K
  answers over one prompt, computing the prompt once instead of K times.

All three give the same log-probs as one full forward over the concatenated sequence (tested).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable

from targetpo.optim import ParamInfo
from targetpo.tokens import rows

# Flax's truncated-normal initialisers divide the std by this (the std of a unit normal truncated at ±2σ), so
# the *truncated* distribution has the requested variance.
_TRUNC_STD = 0.87962566103423978


@dataclass(frozen=True)
class TransformerSpec:
    """vocab: V, token vocabulary
    max_len: longest sequence (the paper: 2H, prompt + answer)
    d_model: residual width (paper: 64)
    heads: attention heads (the authors' code: 2; the paper's text says 4)
    layers: transformer blocks (paper: 2)
    ffn_mult: FFN hidden width / d_model (paper: 4)
    ln_eps: LayerNorm epsilon (Flax default 1e-6)"""

    vocab: int
    max_len: int
    d_model: int = 64
    heads: int = 2
    layers: int = 2
    ffn_mult: int = 4
    ln_eps: float = 1e-6

    def __post_init__(self):
        for f in ("vocab", "max_len", "d_model", "heads", "layers", "ffn_mult"):
            if getattr(self, f) < 1:
                raise ValueError(f"TransformerSpec.{f} must be >= 1, got {getattr(self, f)}")
        if self.vocab < 2:
            raise ValueError(f"TransformerSpec.vocab must be >= 2, got {self.vocab}")
        if self.d_model % self.heads:
            raise ValueError(f"d_model={self.d_model} is not divisible by heads={self.heads}")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.heads

    @property
    def ffn(self) -> int:
        return self.ffn_mult * self.d_model


def param_info(spec: TransformerSpec) -> dict[str, ParamInfo]:
    """Every parameter of the model, in a fixed order (the order of :func:`init_params`)."""
    d, h, hd, f, v = spec.d_model, spec.heads, spec.head_dim, spec.ffn, spec.vocab
    out = {
        "tok_emb": ParamInfo((v, d), "muon", "embed"),
        "pos_emb": ParamInfo((spec.max_len, d), "muon", "pos"),
    }
    for i in range(spec.layers):
        p = f"l{i}."
        out |= {
            p + "ln1.scale": ParamInfo((d,), "adamw", "ones"),
            p + "ln1.bias": ParamInfo((d,), "adamw", "zeros"),
            # Flax: three DenseGeneral kernels (d, heads, head_dim) → 3-D → AdamW. Stored stacked; AdamW is
            # elementwise, so stacking them changes nothing.
            p + "attn.qkv": ParamInfo((d, 3, h, hd), "adamw", "lecun", fan_in=d),
            # Flax: three (heads, head_dim) biases → 2-D → Muon, each its own matrix.
            p + "attn.qkv_bias": ParamInfo((3, h, hd), "muon", "zeros", matrices=1),
            p + "attn.out": ParamInfo((h, hd, d), "adamw", "lecun", fan_in=h * hd),
            p + "attn.out_bias": ParamInfo((d,), "adamw", "zeros"),
            p + "ln2.scale": ParamInfo((d,), "adamw", "ones"),
            p + "ln2.bias": ParamInfo((d,), "adamw", "zeros"),
            p + "ffn.up": ParamInfo((d, f), "muon", "lecun", fan_in=d),
            p + "ffn.up_bias": ParamInfo((f,), "adamw", "zeros"),
            p + "ffn.down": ParamInfo((f, d), "muon", "lecun", fan_in=f),
            p + "ffn.down_bias": ParamInfo((d,), "adamw", "zeros"),
        }
    out |= {
        "ln_f.scale": ParamInfo((d,), "adamw", "ones"),
        "ln_f.bias": ParamInfo((d,), "adamw", "zeros"),
        "head": ParamInfo((d, v), "muon", "lecun", fan_in=d),
        "head_bias": ParamInfo((v,), "adamw", "zeros"),
    }
    return out


def num_params(spec: TransformerSpec) -> int:
    """Parameters of one seed's model (101,634 for V = 2, max_len = 20)."""
    return sum(math.prod(p.shape) for p in param_info(spec).values())


def _init_one(info: ParamInfo, spec: TransformerSpec, gen: torch.Generator) -> Tensor:
    if info.init == "zeros":
        return torch.zeros(info.shape)
    if info.init == "ones":
        return torch.ones(info.shape)
    if info.init == "embed":
        return torch.randn(info.shape, generator=gen) * (1.0 / math.sqrt(spec.d_model))
    if info.init == "pos":
        return torch.randn(info.shape, generator=gen) * 0.02
    if info.init == "lecun":
        std = math.sqrt(1.0 / info.fan_in) / _TRUNC_STD
        t = torch.empty(info.shape)
        return torch.nn.init.trunc_normal_(t, 0.0, std, -2.0 * std, 2.0 * std, generator=gen)
    raise ValueError(f"unknown init {info.init!r}")


def init_params(spec: TransformerSpec, seeds: list[int], device: torch.device | str = "cpu",
                dtype: torch.dtype = torch.float32) -> dict[str, Tensor]:
    """Parameters [S, *shape] for seeds `seeds` (seed s's values depend on seed s only)."""
    if not seeds:
        raise ValueError("init_params needs at least one seed")
    infos = param_info(spec)
    per_seed = []
    for s in seeds:
        gen = torch.Generator().manual_seed(int(s))
        per_seed.append({k: _init_one(info, spec, gen) for k, info in infos.items()})
    return {k: torch.stack([p[k] for p in per_seed]).to(device=device, dtype=dtype) for k in infos}


# ----------------------------------------------------------------------------- forward pieces

def _check_tokens(tokens: Tensor, spec: TransformerSpec, start: int, params: dict[str, Tensor]) -> None:
    if tokens.dim() != 3:
        raise ValueError(f"tokens must be [S, N, T], got shape {tuple(tokens.shape)}")
    s = params["tok_emb"].shape[0]
    if tokens.shape[0] != s:
        raise ValueError(f"tokens have {tokens.shape[0]} seeds but the parameters have {s}")
    if start + tokens.shape[2] > spec.max_len:
        raise ValueError(f"positions {start}..{start + tokens.shape[2] - 1} exceed max_len={spec.max_len}")


def _linear(x: Tensor, w: Tensor, b: Tensor) -> Tensor:
    """x [S, M, in] @ w [S, in, out] + b [S, out], one batched GEMM over seeds."""
    return torch.baddbmm(b.unsqueeze(1), x, w)


def _layer_norm(x: Tensor, scale: Tensor, bias: Tensor, eps: float) -> Tensor:
    return torch.addcmul(bias.unsqueeze(1), F.layer_norm(x, x.shape[-1:], eps=eps), scale.unsqueeze(1))


def _embed(params: dict[str, Tensor], tokens: Tensor, start: int, spec: TransformerSpec) -> Tensor:
    """[S, N, T] ids → [S, N·T, d]. A one-hot GEMM: for V ≤ a few dozen it beats a gather, forward and backward."""
    s, n, t = tokens.shape
    onehot = F.one_hot(tokens.reshape(s, n * t), spec.vocab).to(params["tok_emb"].dtype)
    x = torch.bmm(onehot, params["tok_emb"]).view(s, n, t, spec.d_model)
    return (x + params["pos_emb"][:, None, start:start + t]).view(s, n * t, spec.d_model)


_MASKS: dict[tuple, Tensor | None] = {}

def _block_mask(g: int, tq: int, q_from: int, tp: int, to: int, t_new: int, device) -> Tensor | None:
    """Bool [g·Tq, Tp + g·(To+T)], True = masked, or None when nothing is masked (one new token per row: a
    decoding step). Query (row r, new token i ≥ q_from) sees every prefix key and the own keys (row r, j) with
    j − To ≤ i; never another row's keys."""
    key = (g, tq, q_from, tp, to, t_new, str(device))
    if key not in _MASKS:
        tk = to + t_new
        q_row = torch.arange(g, device=device).repeat_interleave(tq)
        q_pos = torch.arange(q_from, q_from + tq, device=device).repeat(g)
        k_row = torch.arange(g, device=device).repeat_interleave(tk)
        k_pos = torch.arange(tk, device=device).repeat(g) - to
        own = (q_row[:, None] != k_row[None, :]) | (k_pos[None, :] > q_pos[:, None])
        m = torch.cat([torch.zeros(g * tq, tp, dtype=torch.bool, device=device), own], dim=1)
        _MASKS[key] = m if bool(m.any()) else None
    return _MASKS[key]


# The tanh-GELU's constants: √(2/π) and the cubic coefficient (docs/method.md §4).
_GELU_C, _GELU_A = math.sqrt(2.0 / math.pi), 0.044715


def _gelu_sigmoid(x: Tensor) -> Tensor:
    """σ(2z), z = √(2/π)·(x + 0.044715·x³): the tanh-GELU is 0.5·x·(1 + tanh z) = x·σ(2z)."""
    return (x * x).mul_(2 * _GELU_C * _GELU_A).add_(2 * _GELU_C).mul_(x).sigmoid_()


class _GeluTanh(torch.autograd.Function):
    """The tanh-approximate GELU (the authors' Flax default) as x·σ(2z), with its backward written out:
    σ + x·σ(1 − σ)·2z′, 2z′ = 2√(2/π)·(1 + 3·0.044715·x²). The same function as F.gelu(approximate="tanh"),
    rounded differently: its values as close to float64 as torch's (and for x ≲ −5 the tiny negative values that
    1 + tanh z cancels to 0 in float32), its gradients within about twice torch's rounding. On a CPU torch's tanh
    costs ~4× its sigmoid, so at the engine's shapes this form's forward and backward together take 0.65–0.75 of
    torch's time at one thread (0.9–1.1 at two), its forward alone 0.4–0.5 (BENCHMARKS.md, "Twelfth session").
    It saves σ beside x."""

    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:
        s = _gelu_sigmoid(x)
        ctx.save_for_backward(x, s)
        return x * s

    @staticmethod
    @once_differentiable  # σ is saved as a constant: a second derivative through it would be wrong, so it is refused
    def backward(ctx, g: Tensor) -> Tensor:
        x, s = ctx.saved_tensors
        d = (x * x).mul_(6 * _GELU_C * _GELU_A).add_(2 * _GELU_C).mul_(x).mul_(1 - s).add_(1).mul_(s)
        return d.mul_(g)


def _gelu(x: Tensor) -> Tensor:
    """The FFN's tanh-GELU. On an accelerator torch's fused kernel; on a CPU x·σ(2z) (:class:`_GeluTanh`), whose
    forward without autograd (sampling) gives the same values as with it."""
    if x.device.type != "cpu":
        return F.gelu(x, approximate="tanh")
    if torch.is_grad_enabled() and x.requires_grad:
        return _GeluTanh.apply(x)
    return _gelu_sigmoid(x).mul_(x)


class _Softmax(torch.autograd.Function):
    """torch.softmax over the last dim (the same forward), with a backward that does not depend on the thread
    count: torch's CPU softmax backward splits its rows between threads in vectorised blocks, so one row's
    gradient rounds differently with 1 and 2 threads, and a token run's curves depended on the cores idle when it
    started. y·(g − Σ y·g) with a last-dim sum is the same arithmetic in every row whatever the split."""

    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:
        y = torch.softmax(x, dim=-1)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, g: Tensor) -> Tensor:
        (y,) = ctx.saved_tensors
        gy = g * y
        return gy - y * gy.sum(dim=-1, keepdim=True)


def _attention(q: Tensor, k: Tensor, v: Tensor, q_from: int, prefix: tuple[Tensor, Tensor] | None,
               past: tuple[Tensor, Tensor] | None, t_new: int | None = None) -> Tensor:
    """Multi-head attention of new queries over [shared prefix | own past | new keys (causal)].

    q: [S, N, h, Tq, hd] (queries of new tokens q_from..T−1); k, v: [S, N, h, T, hd] (all new tokens).
    prefix: keys/values [S, P, h, Tp, hd] shared by groups of g = N // P consecutive rows.
    past: the rows' own earlier keys/values [S, N, h, To, hd].
    t_new: given when k, v already hold the rows' past followed by their T = t_new new tokens (a view of a
    preallocated cache, see :func:`decode`); `past` must then be None.
    Returns [S, N, Tq, h·hd].

    The g rows of a group are attended as one block: their g·Tq queries against the prefix's keys and all g
    rows' own keys, with a block-diagonal causal mask. The wasted cross-row scores cost little; one mid-sized
    GEMM per block is several times faster on a CPU than g tiny ones.
    """
    s, n, h, tq, hd = q.shape
    if t_new is None:
        t_new = k.shape[3]
    if past is not None:
        k = torch.cat([past[0], k], dim=3)
        v = torch.cat([past[1], v], dim=3)
    tk = k.shape[3]
    to = tk - t_new
    if prefix is None:
        tp, g = 0, 1   # independent rows: blocking them would only add masked work
    else:
        tp = prefix[0].shape[3]
        g = n // prefix[0].shape[1]
    p = n // g

    def grouped(x: Tensor) -> Tensor:  # [S, N, h, T, hd] -> [S, P, h, g·T, hd]
        t = x.shape[3]
        return x.view(s, p, g, h, t, hd).transpose(2, 3).reshape(s, p, h, g * t, hd)

    qg = grouped(q) * (1.0 / math.sqrt(hd))
    kg, vg = grouped(k), grouped(v)
    if prefix is not None:
        kg = torch.cat([prefix[0], kg], dim=3)
        vg = torch.cat([prefix[1], vg], dim=3)
    scores = torch.matmul(qg, kg.transpose(-1, -2))                         # [S, P, h, g·Tq, Tp + g·Tk]
    mask = _block_mask(g, tq, q_from, tp, to, t_new, q.device)
    if mask is not None:
        # In place: matmul's backward needs its inputs, not its output.
        scores = scores.masked_fill_(mask, float("-inf"))
    out = torch.matmul(_Softmax.apply(scores), vg)                            # [S, P, h, g·Tq, hd]
    return out.view(s, p, h, g, tq, hd).permute(0, 1, 3, 4, 2, 5).reshape(s, n, tq, h * hd)


def _blocks(params: dict[str, Tensor], x: Tensor, spec: TransformerSpec, n: int, t: int, out_from: int,
            prefix: list | None, past: list | None, keep_kv: bool, cache: list | None = None,
            start: int = 0) -> tuple[Tensor, list]:
    """Run the transformer blocks on x [S, N·T, d]. Returns (final hidden of positions ≥ out_from
    [S, N·(T−out_from), d], per-layer (k, v) of the new tokens if keep_kv). With `cache` (see :func:`decode`) the
    new keys/values are written into it at positions start..start+T−1 and attention reads the cache in place."""
    s, d, h, hd = x.shape[0], spec.d_model, spec.heads, spec.head_dim
    eps = spec.ln_eps
    kvs = []
    q_from = 0
    for i in range(spec.layers):
        p = f"l{i}."
        last = i == spec.layers - 1
        y = _layer_norm(x, params[p + "ln1.scale"], params[p + "ln1.bias"], eps)
        qkv = _linear(y, params[p + "attn.qkv"].view(s, d, 3 * d), params[p + "attn.qkv_bias"].view(s, 3 * d))
        q, k, v = qkv.view(s, n, t, 3, h, hd).unbind(dim=3)              # unbind: no zero-filled grads
        k, v = k.transpose(2, 3), v.transpose(2, 3)                        # [S, N, h, T, hd]
        if keep_kv:
            kvs.append((k, v))
        if last and out_from > 0:
            # Only positions ≥ out_from feed the output: skip the rest of the last block for earlier ones.
            q_from = out_from
            x = x.view(s, n, t, d)[:, :, out_from:].reshape(s, -1, d)
        q = q[:, :, q_from:].transpose(2, 3)
        if cache is not None:
            ck, cv = cache[i]
            ck[:, :, :, start:start + t] = k
            cv[:, :, :, start:start + t] = v
            a = _attention(q, ck[:, :, :, :start + t], cv[:, :, :, :start + t], q_from, None, None, t_new=t)
        else:
            a = _attention(q, k, v, q_from, None if prefix is None else prefix[i], None if past is None else past[i])
        x = x + _linear(a.reshape(s, -1, d), params[p + "attn.out"].view(s, d, d), params[p + "attn.out_bias"])
        y = _layer_norm(x, params[p + "ln2.scale"], params[p + "ln2.bias"], eps)
        y = _gelu(_linear(y, params[p + "ffn.up"], params[p + "ffn.up_bias"]))
        x = x + _linear(y, params[p + "ffn.down"], params[p + "ffn.down_bias"])
    return x, kvs


def _head(params: dict[str, Tensor], x: Tensor, spec: TransformerSpec) -> Tensor:
    x = _layer_norm(x, params["ln_f.scale"], params["ln_f.bias"], spec.ln_eps)
    return torch.log_softmax(_linear(x, params["head"], params["head_bias"]), dim=-1)


def forward(params: dict[str, Tensor], tokens: Tensor, spec: TransformerSpec, *, out_from: int = 0) -> Tensor:
    """Full causal pass. tokens [S, N, T] → next-token log-probs [S, N, T − out_from, V] of positions
    out_from..T−1 (position i predicts token i + 1)."""
    _check_tokens(tokens, spec, 0, params)
    s, n, t = tokens.shape
    if not 0 <= out_from < t:
        raise ValueError(f"out_from must be in [0, {t}), got {out_from}")
    x, _ = _blocks(params, _embed(params, tokens, 0, spec), spec, n, t, out_from, None, None, False)
    return _head(params, x, spec).view(s, n, t - out_from, spec.vocab)


def prefill(params: dict[str, Tensor], prompts: Tensor, spec: TransformerSpec,
            tree: rows.PrefixTree | None = None) -> tuple[Tensor, list]:
    """Pass over prompts [S, P, Tp]: returns (log-probs of the token after the prompt [S, P, V], KV cache — a
    list over layers of (k, v) [S, P, h, Tp, hd]).

    With `tree` (``rows.prefix_tree(prompts, spec.vocab)``) each distinct prefix of the prompts is computed once:
    a causal pass computes a position from its prefix alone, and prompts drawn from V^Tp share most of their
    first positions (100 binary prompts of 10 tokens hold ~450 distinct prefixes, not 1,000). The per-position
    layers (LayerNorm, the projections, the FFN) then run on the tree's nodes; attention runs on the prompts'
    rows, which gather their nodes' queries, keys and values, and each node takes its output from one row that
    holds it."""
    _check_tokens(prompts, spec, 0, params)
    s, p, t = prompts.shape
    if tree is None:
        x, kvs = _blocks(params, _embed(params, prompts, 0, spec), spec, p, t, t - 1, None, None, True)
        return _head(params, x, spec).view(s, p, spec.vocab), kvs
    tree = _checked_tree(tree, prompts)
    d, h, hd, eps = spec.d_model, spec.heads, spec.head_dim, spec.ln_eps
    onehot = F.one_hot(tree.token, spec.vocab).to(params["tok_emb"].dtype)
    x = torch.bmm(onehot, params["tok_emb"]) + params["pos_emb"].index_select(1, tree.position)  # [S, N, d]
    path = tree.path.reshape(s, p * t)
    kvs = []
    for i in range(spec.layers):
        pre = f"l{i}."
        last = i == spec.layers - 1
        y = _layer_norm(x, params[pre + "ln1.scale"], params[pre + "ln1.bias"], eps)
        qkv = _linear(y, params[pre + "attn.qkv"].view(s, d, 3 * d), params[pre + "attn.qkv_bias"].view(s, 3 * d))
        q, k, v = rows.take(qkv, path).view(s, p, t, 3, h, hd).unbind(dim=3)        # the prompts' rows
        k, v = k.transpose(2, 3), v.transpose(2, 3)                                  # [S, P, h, Tp, hd]
        kvs.append((k, v))
        # The last block feeds only the prompts' last positions.
        q_from = t - 1 if last else 0
        a = _attention(q[:, :, q_from:].transpose(2, 3), k, v, q_from, None, None).reshape(s, -1, d)
        if last:
            x = rows.take(x, tree.path[..., t - 1])                                  # [S, P, d]
        else:
            a = rows.take(a, tree.source)                                            # back to the nodes
        x = x + _linear(a, params[pre + "attn.out"].view(s, d, d), params[pre + "attn.out_bias"])
        y = _layer_norm(x, params[pre + "ln2.scale"], params[pre + "ln2.bias"], eps)
        y = _gelu(_linear(y, params[pre + "ffn.up"], params[pre + "ffn.up_bias"]))
        x = x + _linear(y, params[pre + "ffn.down"], params[pre + "ffn.down_bias"])
    return _head(params, x, spec).view(s, p, spec.vocab), kvs


def kv_cache(prefill_kv: list, spec: TransformerSpec) -> list:
    """A preallocated KV cache [S, P, h, max_len, hd] per layer holding `prefill_kv` (from :func:`prefill`) at
    positions 0..Tp−1, for :func:`decode` to append to in place (no copy of the past per step)."""
    out = []
    for k, v in prefill_kv:
        s, p, h, tp, hd = k.shape
        ck = k.new_zeros(s, p, h, spec.max_len, hd)
        cv = v.new_zeros(s, p, h, spec.max_len, hd)
        ck[:, :, :, :tp] = k
        cv[:, :, :, :tp] = v
        out.append((ck, cv))
    return out


def decode(params: dict[str, Tensor], tokens: Tensor, spec: TransformerSpec, *, start: int, cache: list) -> Tensor:
    """KV-cached decoding: new tokens [S, N, T] at positions start..start+T−1 of rows whose keys/values of
    positions 0..start−1 are in `cache` (from :func:`kv_cache`, rows gathered to match `tokens`). Writes the new
    keys/values into `cache` in place and returns the log-probs [S, N, T, V] of the token after each new token:
    the same numbers as :func:`extend` with the same past (tested), without copying the past every step."""
    _check_tokens(tokens, spec, start, params)
    s, n, t = tokens.shape
    if len(cache) != spec.layers or cache[0][0].shape[:2] != (s, n):
        raise ValueError(f"decode: cache must hold {spec.layers} layers of [S={s}, N={n}, ...] keys/values, got "
                         f"{len(cache)} layers of {tuple(cache[0][0].shape) if cache else ()}")
    x, _ = _blocks(params, _embed(params, tokens, start, spec), spec, n, t, 0, None, None, False, cache, start)
    return _head(params, x, spec).view(s, n, t, spec.vocab)


def extend(params: dict[str, Tensor], tokens: Tensor, spec: TransformerSpec, *, start: int,
           prefix: list | None = None, past: list | None = None, keep_kv: bool = False,
           tree: rows.PrefixTree | None = None) -> tuple[Tensor, list]:
    """New tokens [S, N, T] at positions start..start+T−1 after a cached prefix shared by groups of N // P rows
    (`prefix` from :func:`prefill` on [S, P, ·], or None) and the rows' own cached `past` (a list over layers of
    (k, v) [S, N, h, To, hd], or None). Earlier positions must be covered by exactly these caches. Returns
    (log-probs [S, N, T, V] of the token after each new token, and if `keep_kv` the rows' own cache extended by
    the new tokens).

    `tree` (with `past`, without `prefix` and `keep_kv`): ``rows.prefix_tree(tokens, spec.vocab, roots=...)``
    with equal roots exactly where rows have equal pasts; rows that agree on their root and their first j new
    tokens then share the per-position layers over those j positions (:func:`_extend_shared`)."""
    _check_tokens(tokens, spec, start, params)
    s, n, t = tokens.shape
    if prefix is not None:
        p = prefix[0][0].shape[1]
        if n % p:
            raise ValueError(f"extend: {n} rows cannot share a prefix of {p} rows (N must be a multiple of P)")
    covered = (0 if prefix is None else prefix[0][0].shape[3]) + (0 if past is None else past[0][0].shape[3])
    if covered != start:
        raise ValueError(f"extend: the caches cover {covered} positions but the new tokens start at {start}")
    if tree is not None:
        if past is None or prefix is not None or keep_kv:
            raise ValueError("extend: tree= needs past= and neither prefix= nor keep_kv=True")
        return _extend_shared(params, tokens, spec, start, past, _checked_tree(tree, tokens)), []
    x, kvs = _blocks(params, _embed(params, tokens, start, spec), spec, n, t, 0, prefix, past, keep_kv)
    logp = _head(params, x, spec).view(s, n, t, spec.vocab)
    if not keep_kv:
        return logp, []
    if past is not None:
        kvs = [(torch.cat([pk, k], dim=3), torch.cat([pv, v], dim=3)) for (pk, pv), (k, v) in zip(past, kvs)]
    return logp, kvs


def _checked_tree(tree: rows.PrefixTree, tokens: Tensor) -> rows.PrefixTree:
    """`tree` if it is a prefix tree of `tokens` [S, N, T] (its path has their shape and its nodes their tokens)."""
    if tuple(tree.path.shape) != tuple(tokens.shape):
        raise ValueError(f"tree: its path is {tuple(tree.path.shape)}, not the tokens' {tuple(tokens.shape)}")
    if not torch.equal(rows.take(tree.token, tree.path.flatten(1)), tokens.flatten(1)):
        raise ValueError("tree: its nodes' tokens are not these tokens (a tree of another batch?)")
    return tree


def _extend_shared(params: dict[str, Tensor], tokens: Tensor, spec: TransformerSpec, start: int, past: list,
                   tree: rows.PrefixTree) -> Tensor:
    """:func:`extend` over the prefix tree of (root, new tokens): K answers to one prompt that agree on their
    first tokens share the per-position layers there, as :func:`prefill` shares prompt prefixes; attention runs
    on the rows over their past and their own keys."""
    s, n, t = tokens.shape
    d, h, hd, eps = spec.d_model, spec.heads, spec.head_dim, spec.ln_eps
    onehot = F.one_hot(tree.token, spec.vocab).to(params["tok_emb"].dtype)
    x = torch.bmm(onehot, params["tok_emb"]) + params["pos_emb"].index_select(1, start + tree.position)  # [S, nodes, d]
    path = tree.path.reshape(s, n * t)
    for i in range(spec.layers):
        pre = f"l{i}."
        y = _layer_norm(x, params[pre + "ln1.scale"], params[pre + "ln1.bias"], eps)
        qkv = _linear(y, params[pre + "attn.qkv"].view(s, d, 3 * d), params[pre + "attn.qkv_bias"].view(s, 3 * d))
        q, k, v = rows.take(qkv, path).view(s, n, t, 3, h, hd).unbind(dim=3)          # the rows
        a = _attention(q.transpose(2, 3), k.transpose(2, 3), v.transpose(2, 3), 0, None, past[i])
        a = rows.take(a.reshape(s, n * t, d), tree.source)                             # back to the nodes
        x = x + _linear(a, params[pre + "attn.out"].view(s, d, d), params[pre + "attn.out_bias"])
        y = _layer_norm(x, params[pre + "ln2.scale"], params[pre + "ln2.bias"], eps)
        y = _gelu(_linear(y, params[pre + "ffn.up"], params[pre + "ffn.up_bias"]))
        x = x + _linear(y, params[pre + "ffn.down"], params[pre + "ffn.down_bias"])
    return rows.take(_head(params, x, spec), path).view(s, n, t, spec.vocab)
