r"""The paper's optimizer for the transformer experiments: ``optax.contrib.muon`` (optax 0.2.8) with every argument
at its default, on seed-batched parameters (docs/method.md §5).

**Partition.** Every parameter that is 2-D in the authors' Flax model goes to Muon; every other one goes to
Nesterov AdamW. In Flax the attention q/k/v/out kernels are 3-D, so they are on AdamW, while the q/k/v biases
are (heads, head_dim) matrices on Muon; embeddings, FFN kernels and the output head are on Muon
(:func:`targetpo.tokens.transformer.param_info` records each parameter's branch). Both branches share one
constant learning rate (the paper's effective 1e-3 = the code's ``10 × 1e-4``).

**Muon branch**, per matrix G (fan_in × fan_out) at step t = 1, 2, …:

.. math::
    m_t = \beta m_{t-1} + (1-\beta) G,\qquad
    \hat M = \beta\,\frac{m_t}{1-\beta^{t+1}} + (1-\beta)\,\frac{G}{1-\beta^{t}},\\
    X_0 = \hat M^{(\top)} / (\lVert \hat M\rVert_F + 10^{-8}),\qquad
    X \leftarrow aX + (bA + cA^2)X,\ A = XX^\top \ (5\times),\qquad
    \Delta = -\mathrm{lr}\,\sqrt{\max(1, \text{fan\_out}/\text{fan\_in})}\; X^{(\top)}

with β = 0.95, (a, b, c) = (3.4445, −4.7750, 2.0315), the transpose taken when rows > cols, all in float32.

**AdamW branch** (optax's Nesterov form, weight decay 0; *not* torch's NAdam, which has a momentum schedule):

.. math::
    m_t = b_1 m + (1-b_1) g,\quad v_t = b_2 v + (1-b_2) g^2,\quad
    \hat m = b_1\frac{m_t}{1-b_1^{t+1}} + (1-b_1)\frac{g}{1-b_1^t},\quad \hat v = \frac{v_t}{1-b_2^t},\quad
    \Delta = -\mathrm{lr}\,\frac{\hat m}{\sqrt{\hat v} + 10^{-8}}

Every statistic (momenta, Frobenius norms, Newton–Schulz) is per seed and per matrix: the S seeds of a batch
are S independent optimizers. ``make_optimizer(..., kind="torch")`` is the plain alternative: PyTorch's own
``torch.optim.Muon`` (no bias correction, Newton–Schulz in bfloat16, eps 1e-7, weight decay 0) on each seed's matrices plus
``torch.optim.AdamW``; it is not the paper's optimizer.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class ParamInfo:
    """One parameter: its per-seed (Flax) shape, which optimizer branch the paper's code gives it, and its init.

    optimizer: "muon" (2-D in Flax) or "adamw" (every other ndim, incl. the 3-D attention kernels).
    matrices: for Muon, how many leading per-seed dims index independent matrices (the stacked q/k/v biases are
      three separate (heads, head_dim) matrices); the last two dims are each matrix's (fan_in, fan_out).
    init: "lecun" (truncated normal, var 1/fan_in), "embed" (N(0, 1/d)), "pos" (N(0, 0.02²)), "zeros", "ones".
    fan_in: fan_in for lecun init."""

    shape: tuple[int, ...]
    optimizer: str
    init: str
    fan_in: int = 0
    matrices: int = 0


NS_COEFFS = (3.4445, -4.7750, 2.0315)
OPTIMIZERS = ("optax", "torch")
BRANCHES = ("muon", "adamw")


def check_positive(name: str, value, *, zero_ok: bool = False) -> None:
    """ValueError unless `value` is a finite real number > 0 (≥ 0 with `zero_ok`)."""
    bound = ">= 0" if zero_ok else "> 0"
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < 0 or (value == 0 and not zero_ok):
        raise ValueError(f"{name}={value!r}: must be a finite number {bound}")


def check_params(params: dict[str, Tensor], infos: dict[str, ParamInfo]) -> int:
    """The seed count S of `params` ({name: [S, *info.shape]}), after checking them against `infos`: the same
    names, every tensor [S, *shape] for one S, every branch known, and a Muon parameter's shape `matrices`
    leading dims + one (fan_in, fan_out) matrix (optax sends exactly the 2-D Flax leaves to Muon)."""
    if not infos:
        raise ValueError("the optimizer needs at least one parameter; params and infos are empty")
    missing = set(infos) ^ set(params)
    if missing:
        raise ValueError(f"params and infos disagree on names: {sorted(missing)}")
    for k, info in infos.items():
        if info.optimizer not in BRANCHES:
            raise ValueError(f"infos[{k!r}].optimizer={info.optimizer!r}: must be one of {BRANCHES}")
        want = info.matrices + 2 if info.optimizer == "muon" else len(info.shape)
        if len(info.shape) != want or (info.optimizer == "adamw" and info.matrices):
            raise ValueError(f"infos[{k!r}]: shape {info.shape} with matrices={info.matrices} on {info.optimizer}; "
                             "a muon parameter is `matrices` leading dims + one 2-D matrix, an adamw one has "
                             "matrices=0")
    seeds = next(iter(params.values())).shape[0] if next(iter(params.values())).dim() else 0
    for k, info in infos.items():
        if tuple(params[k].shape) != (seeds, *info.shape):
            raise ValueError(f"params[{k!r}] has shape {tuple(params[k].shape)}; expected [S={seeds}, *{info.shape}] "
                             "(one leading seed axis, the same S for every parameter)")
    return seeds


def check_grads(grads: dict[str, Tensor], infos: dict[str, ParamInfo], seeds: int) -> None:
    """ValueError unless `grads` has exactly the parameters' names and shapes [S, *shape] (checked before the
    optimizer's state moves, so a refused step leaves it as it was)."""
    if set(grads) != set(infos):
        raise ValueError(f"grads and params disagree on names: {sorted(set(grads) ^ set(infos))}")
    for k, info in infos.items():
        if tuple(grads[k].shape) != (seeds, *info.shape):
            raise ValueError(f"grads[{k!r}] has shape {tuple(grads[k].shape)}; expected {(seeds, *info.shape)}, "
                             "the parameter's")


def newton_schulz(x: Tensor, steps: int = 5, coeffs: tuple[float, float, float] = NS_COEFFS,
                  eps: float = 1e-8) -> Tensor:
    """Approximate orthogonalisation of a batch of matrices [N, r, c] (optax ``orthogonalize_via_newton_schulz``):
    transpose if r > c, divide by the Frobenius norm + eps, run `steps` quintic iterations, transpose back."""
    if x.dim() != 3:
        raise ValueError(f"newton_schulz expects a batch of matrices [N, r, c], got shape {tuple(x.shape)}")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        raise ValueError(f"steps={steps!r}: must be an integer >= 0")
    transposed = x.shape[1] > x.shape[2]
    if transposed:
        x = x.transpose(1, 2)
    x = x.float()
    x = x / (torch.linalg.matrix_norm(x, keepdim=True) + eps)
    a, b, c = coeffs
    for _ in range(steps):
        gram = torch.bmm(x, x.transpose(1, 2))
        poly = torch.baddbmm(gram, gram, gram, beta=b, alpha=c)   # b·A + c·A·A
        x = torch.baddbmm(x, poly, x, beta=a, alpha=1.0)           # a·X + (bA + cA²)·X
    return x.transpose(1, 2) if transposed else x


def muon_shape_scale(fan_in: int, fan_out: int) -> float:
    """optax's per-matrix scale √max(1, fan_out/fan_in) (dim 0 = fan_in, dim 1 = fan_out)."""
    return math.sqrt(max(1.0, fan_out / fan_in))


def muon_step_scale(mhat: Tensor, full_step_norm: float) -> Tensor:
    """Per-seed factor min(1, ‖M̂‖/τ) on Muon's orthogonalised step, ‖M̂‖ the seed's Nesterov-momentum norm over
    all its Muon matrices ([S, n] → [S]); τ = full_step_norm, 0 = always 1 (optax). Orthogonalisation gives
    every step the same length however small the gradient, so once a policy is nearly solved (all groups
    zero-variance, gradient ~1e-9) optax's Muon keeps walking at full speed along stale momentum and noise;
    with τ > 0 a step below τ shrinks in proportion, like SGD with momentum (docs/experiments.md §E6)."""
    if full_step_norm == 0:
        return torch.ones(mhat.shape[0], dtype=mhat.dtype, device=mhat.device)
    return (mhat.norm(dim=1) / full_step_norm).clamp(max=1.0)


class MuonAdamW:
    """optax-0.2.8 ``contrib.muon(learning_rate=lr)`` on seed-batched parameters ``{name: [S, *shape]}``.

    ``step(params, grads)`` updates the parameters in place (under no_grad). One call = one optax update; the
    paper takes one per epoch and keeps this state for the whole run.
    """

    def __init__(self, params: dict[str, Tensor], infos: dict[str, ParamInfo], lr: float, *, beta: float = 0.95,
                 ns_steps: int = 5, eps: float = 1e-8, adam_b1: float = 0.9, adam_b2: float = 0.999,
                 adam_eps: float = 1e-8, full_step_norm: float = 0.0):
        check_positive("lr", lr)
        check_positive("full_step_norm", full_step_norm, zero_ok=True)  # 0 = optax's Muon
        s = check_params(params, infos)
        self.full_step_norm = full_step_norm
        self.lr, self.beta, self.ns_steps, self.eps = lr, beta, ns_steps, eps
        self.b1, self.b2, self.adam_eps = adam_b1, adam_b2, adam_eps
        self.muon_names = [k for k, i in infos.items() if i.optimizer == "muon"]
        self.adam_names = [k for k, i in infos.items() if i.optimizer == "adamw"]
        self.infos = infos
        self.count = 0
        self.seeds = s
        like = next(iter(params.values()))
        n_muon = sum(params[k][0].numel() for k in self.muon_names)
        n_adam = sum(params[k][0].numel() for k in self.adam_names)
        # Flat per-seed state buffers: a handful of large elementwise ops instead of one per parameter.
        self.mu = torch.zeros(s, n_muon, dtype=torch.float32, device=like.device)
        self.m = torch.zeros(s, n_adam, dtype=torch.float32, device=like.device)
        self.v = torch.zeros(s, n_adam, dtype=torch.float32, device=like.device)
        # Matrices of one shape (after optax's rows ≤ cols transpose) are orthogonalised in one batched call.
        self._groups: dict[tuple[int, int], list[str]] = defaultdict(list)
        for k in self.muon_names:
            r, c = infos[k].shape[-2:]
            self._groups[(min(r, c), max(r, c))].append(k)

    @staticmethod
    def _flat(ts: list[Tensor], s: int) -> Tensor:
        return torch.cat([t.reshape(s, -1).float() for t in ts], dim=1)

    def updates(self, grads: dict[str, Tensor]) -> dict[str, Tensor]:
        """The optax update (already multiplied by −lr) for each parameter; advances the state."""
        s = self.seeds
        check_grads(grads, self.infos, s)
        self.count += 1
        t = self.count
        out: dict[str, Tensor] = {}
        if self.muon_names:
            g = self._flat([grads[k] for k in self.muon_names], s)
            self.mu.lerp_(g, 1.0 - self.beta)
            mhat = self.mu * (self.beta / (1.0 - self.beta ** (t + 1))) + g * ((1.0 - self.beta) / (1.0 - self.beta ** t))
            scale = muon_step_scale(mhat, self.full_step_norm).view(s, 1, 1, 1) if self.full_step_norm else None
            mats: dict[str, Tensor] = {}
            off = 0
            for k in self.muon_names:
                info = self.infos[k]
                n = math.prod(info.shape)
                r, c = info.shape[-2:]
                m = mhat[:, off:off + n].reshape(-1, r, c)
                mats[k] = m.transpose(1, 2) if r > c else m
                off += n
            for keys in self._groups.values():
                batch = torch.cat([mats[k] for k in keys], dim=0)
                orth = newton_schulz(batch, self.ns_steps, NS_COEFFS, self.eps)
                for k, o in zip(keys, orth.split([mats[k].shape[0] for k in keys], dim=0)):
                    r, c = self.infos[k].shape[-2:]
                    o = o.transpose(1, 2) if r > c else o
                    if scale is not None:
                        o = o.reshape(s, -1, *o.shape[1:]) * scale              # [S, matrices, r, c]
                    out[k] = o.reshape(s, *self.infos[k].shape) * (-self.lr * muon_shape_scale(r, c))
        if self.adam_names:
            g = self._flat([grads[k] for k in self.adam_names], s)
            b1, b2 = self.b1, self.b2
            self.m.lerp_(g, 1.0 - b1)
            self.v.mul_(b2).addcmul_(g, g, value=1.0 - b2)
            mhat = self.m * (b1 / (1.0 - b1 ** (t + 1))) + g * ((1.0 - b1) / (1.0 - b1 ** t))
            denom = (self.v / (1.0 - b2 ** t)).sqrt_().add_(self.adam_eps)
            upd = mhat.div_(denom).mul_(-self.lr)
            off = 0
            for k in self.adam_names:
                n = math.prod(self.infos[k].shape)
                out[k] = upd[:, off:off + n].reshape(s, *self.infos[k].shape)
                off += n
        return out

    @torch.no_grad()
    def step(self, params: dict[str, Tensor], grads: dict[str, Tensor]) -> None:
        upd = self.updates(grads)
        keys = list(upd)
        torch._foreach_add_([params[k] for k in keys], [upd[k].to(params[k].dtype) for k in keys])


class TorchMuonAdamW:
    """The plain alternative: ``torch.optim.Muon`` on every seed's Muon-branch matrices (given in (fan_out,
    fan_in) layout, so its shape adjustment √max(1, rows/cols) equals optax's √max(1, fan_out/fan_in)) and
    ``torch.optim.AdamW`` on the rest. Weight decay 0 in both, as in the paper."""

    def __init__(self, params: dict[str, Tensor], infos: dict[str, ParamInfo], lr: float):
        if not hasattr(torch.optim, "Muon"):
            raise ValueError("optimizer='torch' needs torch.optim.Muon (torch >= 2.9)")
        check_positive("lr", lr)
        self.seeds = check_params(params, infos)
        self.infos = infos
        self._views: dict[str, list[Tensor]] = {}
        muon_leaves, adam_leaves = [], []
        for k, info in infos.items():
            data = params[k].detach()
            if info.optimizer == "muon":
                r, c = info.shape[-2:]
                if not data.is_contiguous():  # reshape would copy, and the optimizer would step the copy
                    raise ValueError(f"params[{k!r}] must be contiguous for optimizer='torch' (its matrices are "
                                     "updated through views of its storage)")
                views = [m.T for m in data.view(-1, r, c)]   # shares storage with params[k]
                self._views[k] = views
                muon_leaves += views
            else:
                self._views[k] = [data]
                adam_leaves.append(data)
        # torch refuses an optimizer over no parameters: a model with one branch only gets one optimizer.
        self.muon = torch.optim.Muon(muon_leaves, lr=lr, weight_decay=0.0) if muon_leaves else None
        self.adam = (torch.optim.AdamW(adam_leaves, lr=lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
                     if adam_leaves else None)

    @torch.no_grad()
    def step(self, params: dict[str, Tensor], grads: dict[str, Tensor]) -> None:
        check_grads(grads, self.infos, self.seeds)
        for k, info in self.infos.items():
            views = self._views[k]
            if info.optimizer == "muon":
                r, c = info.shape[-2:]
                for v, g in zip(views, grads[k].to(views[0].dtype).reshape(-1, r, c)):
                    v.grad = g.T
            else:
                views[0].grad = grads[k].to(views[0].dtype)
        for opt in (self.muon, self.adam):
            if opt is not None:
                opt.step()


def make_optimizer(kind: str, params: dict[str, Tensor], infos: dict[str, ParamInfo], lr: float, *,
                   muon_full_step_norm: float = 0.0):
    """``"optax"``: the paper's optimizer (:class:`MuonAdamW`, `muon_full_step_norm` its `full_step_norm`);
    ``"torch"``: :class:`TorchMuonAdamW`."""
    if kind == "optax":
        return MuonAdamW(params, infos, lr, full_step_norm=muon_full_step_norm)
    if kind == "torch":
        if muon_full_step_norm:
            raise ValueError(f"muon_full_step_norm={muon_full_step_norm} needs optimizer 'optax' (torch.optim.Muon "
                             "has no such option)")
        return TorchMuonAdamW(params, infos, lr)
    raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {kind!r}")
