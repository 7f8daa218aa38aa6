r"""A bank of independent ReLU MLPs run as one batched network (the MNIST policy, docs/experiments.md §E3).

Networks are indexed (seed s, copy m): S seeds × M copies (e.g. one copy per method, or per method × delay).
All copies of a seed start from the *same* initial weights (common random numbers), and each network is
trained independently: with parameters held as tensors with a leading network axis, one forward/backward
computes every network's own gradient, and Adam, being elementwise, is exactly per-network Adam.

Layout, chosen for CPU speed. Every copy of seed s reads the same input batch x_s, so the first layer of all
M copies is one matmul x_s [B, in] @ W1_s [in, M·h] per seed (no copy of the input per network); later layers
are per-network batched matmuls [S·M, B, h] @ [S·M, h, h'].
A network's numbers are reproducible for a given M, but not across M: the first layer's gradient is one
[in, B] @ [B, M·h] matmul whose kernel, and so its rounding (~1e-10 after one step), depends on M·h; a run
of a method alone and beside others can part in the last bits, which training may amplify.

The experiments feed only the pixels with ink somewhere in their data (``MnistData.inked``) and keep the
matching rows of W1 (``init_bank(inputs=)``): the same network on that data, with a shorter first-layer sum.

Init is Flax's ``lecun_normal`` (variance scaling 1/fan_in, truncated normal at ±2σ with the std corrected
for the truncation) for kernels and zeros for biases, as the authors' ``PolicyMLP``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

# std of a standard normal truncated to [-2, 2]; Flax divides by it so the kernel variance is exactly 1/fan_in.
_TRUNC_STD = 0.87962566103423978


def lecun_normal(fan_in: int, shape: tuple[int, ...], generator: torch.Generator) -> Tensor:
    std = math.sqrt(1.0 / fan_in) / _TRUNC_STD
    w = torch.empty(shape, dtype=torch.float32)
    return torch.nn.init.trunc_normal_(w, 0.0, std, -2.0 * std, 2.0 * std, generator=generator)


def init_bank(sizes: tuple[int, ...], generators: list[torch.Generator], copies: int,
              inputs: Tensor | None = None) -> list[Tensor]:
    """Parameters for len(generators) seeds × `copies` networks of layer widths `sizes` (e.g. 784, 50, 50, 10).

    Seed s's weights come from generators[s] alone (so a seed's network does not depend on how many seeds run
    beside it) and are repeated for its `copies`. Returns [W1 [S, in, M·h1], b1 [S, 1, M·h1], then for each
    later layer W [S·M, h, h'], b [S·M, 1, h']], all leaf tensors requiring grad.

    `inputs` (ascending indices into the `sizes[0]` inputs, e.g. `MnistData.pixels`) keeps only those rows of W1,
    for inputs that hold only those columns: the weights are drawn for all `sizes[0]` inputs first, so every kept
    weight is the one the full network starts from."""
    if len(sizes) < 3:
        raise ValueError(f"sizes needs at least input, one hidden and output width; got {sizes}")
    if inputs is not None and (inputs.dim() != 1 or len(inputs) == 0 or int(inputs.min()) < 0
                               or int(inputs.max()) >= sizes[0] or bool((inputs.diff() <= 0).any())):
        shown = inputs.tolist() if inputs.numel() <= 8 else f"{inputs.numel()} values, {inputs.flatten()[:4].tolist()} …"
        raise ValueError(f"inputs must be ascending indices in [0, {sizes[0]}), one or more; got {shown}")
    per_seed = []
    for g in generators:
        layers = [lecun_normal(i, (i, o), g) for i, o in zip(sizes[:-1], sizes[1:])]
        per_seed.append(layers)
    s, m, h1 = len(generators), copies, sizes[1]
    w1 = torch.stack([ls[0] for ls in per_seed])  # [S, in, h1]
    if inputs is not None:
        w1 = w1.index_select(1, inputs)
    w1 = w1.repeat(1, 1, m)  # [S, in, M·h1], copy-major columns
    params = [w1, torch.zeros(s, 1, m * h1, dtype=torch.float32)]
    for k, (i, o) in enumerate(zip(sizes[1:-1], sizes[2:]), start=1):
        w = torch.stack([ls[k] for ls in per_seed]).repeat_interleave(m, dim=0)  # [S·M, i, o], seed-major
        params += [w, torch.zeros(s * m, 1, o, dtype=torch.float32)]
    return [p.requires_grad_(True) for p in params]


def _hidden_layers(h: Tensor, rest: list[Tensor]) -> Tensor:
    """Layers 2.. of every network: batched affine maps [S·M, B, ·] with ReLU between them (none after the last)."""
    for k in range(0, len(rest), 2):
        h = torch.baddbmm(rest[k + 1], h, rest[k])
        if k + 2 < len(rest):
            h = torch.relu(h)
    return h


def bank_forward(params: list[Tensor], x: Tensor, copies: int) -> Tensor:
    """Logits [S, M, B, out] for inputs x [S, B, in] (every copy of seed s sees x_s)."""
    s, b, _ = x.shape
    w1, b1 = params[0], params[1]
    h1 = w1.shape[-1] // copies
    h = torch.relu(torch.baddbmm(b1, x, w1))  # [S, B, M·h1]
    h = h.view(s, b, copies, h1).transpose(1, 2).reshape(s * copies, b, h1)
    h = _hidden_layers(h, params[2:])
    return h.view(s, copies, b, -1)


def network_params(params: list[Tensor], seed: int, copy: int, copies: int) -> list[Tensor]:
    """One network's [W1 [in, h1], b1 [h1], W2, b2, ...] (detached views), e.g. to test the layout."""
    h1 = params[0].shape[-1] // copies
    cols = slice(copy * h1, (copy + 1) * h1)
    out = [params[0][seed, :, cols].detach(), params[1][seed, 0, cols].detach()]
    n = seed * copies + copy
    for k in range(2, len(params), 2):
        out += [params[k][n].detach(), params[k + 1][n, 0].detach()]
    return out


def bank_forward_shared(params: list[Tensor], x: Tensor, copies: int) -> Tensor:
    """Logits [S, M, T, out] for one input batch x [T, in] that every network sees (e.g. the test set): the
    first layer of all S·M networks is a single [T, in] @ [in, S·M·h1] matmul."""
    w1, b1 = params[0], params[1]
    s, d, mh = w1.shape
    t = x.shape[0]
    h = torch.addmm(b1.reshape(1, s * mh), x, w1.transpose(0, 1).reshape(d, s * mh))  # [T, S·M·h1]
    h = torch.relu(h).view(t, s * copies, mh // copies).transpose(0, 1)  # [S·M, T, h1], seed-major
    h = _hidden_layers(h, params[2:])
    return h.view(s, copies, t, -1)
