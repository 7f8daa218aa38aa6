"""Input validation shared by every objective.

Errors name the argument and its shape, so a user who passes a broken batch learns which tensor is wrong.
Half-precision inputs are promoted to float32: softmaxes over a group and exp(log-ratio) lose too much in
bf16/fp16, and the objectives are cheap next to the model that produced their inputs.
"""

from __future__ import annotations

import functools
import inspect
import math
import numbers
from dataclasses import dataclass, field

import torch
from torch import Tensor


@dataclass(frozen=True)
class LossOutput:
    """What every objective returns: a scalar `loss` to backpropagate and detached scalar `metrics`."""

    loss: Tensor
    metrics: dict[str, Tensor] = field(default_factory=dict)


def as_float(name: str, x: Tensor, *, inf_ok: bool = False) -> Tensor:
    """Return `x` as a floating tensor of at least float32 precision, rejecting NaN/inf and empty batches.
    `inf_ok` admits ±inf (an importance ratio exp(log ρ) that overflowed: the clip handles it, docs/method.md §3)
    but still no NaN."""
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.numel() == 0:
        raise ValueError(f"{name} is empty (shape {tuple(x.shape)}): a batch needs at least one group or sample")
    if x.is_meta:  # torch's own "Tensor.item() cannot be called on meta tensors" named neither argument nor cause
        raise ValueError(f"{name} is on the meta device, which holds shapes but no values; the objectives read "
                         "values (give cpu or cuda tensors)")
    if x.is_complex():
        raise TypeError(f"{name} has the complex dtype {x.dtype}: log-probs, scores and advantages are real "
                        "(float, integer or bool)")
    if not x.is_floating_point():
        x = x.to(torch.float32)
    elif x.dtype in (torch.float16, torch.bfloat16):
        x = x.float()
    check_finite(name, x, inf_ok=inf_ok)
    return x


def check_finite(name: str, x: Tensor, *, inf_ok: bool = False) -> None:
    # One reduction instead of isfinite().all(): it allocates no bool tensor of the input's size; its value read as a
    # Python number (the same one host sync as bool() of a tensor, without an isfinite op: objectives run it on
    # every input of every call).
    if not math.isfinite(x.detach().sum().item()):
        bad = (torch.isnan(x.detach()) if inf_ok else ~torch.isfinite(x.detach())).sum().item()
        if bad:
            what = "NaN" if inf_ok else "NaN/inf"
            raise ValueError(f"{name} contains {bad} {what} value(s) (shape {tuple(x.shape)})")


def is_integer_tensor(x) -> bool:
    """Whether `x` is a tensor of integer ids (class labels, token ids): not float, complex or bool."""
    return isinstance(x, Tensor) and not (x.is_floating_point() or x.is_complex() or x.dtype == torch.bool)


def check_same_shape(**tensors: Tensor | None) -> None:
    items = [(k, v) for k, v in tensors.items() if v is not None]
    for name, t in items:
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if not items:
        return
    ref_name, ref = items[0]
    for name, t in items[1:]:
        if t.shape != ref.shape:
            raise ValueError(
                f"{name} has shape {tuple(t.shape)} but {ref_name} has shape {tuple(ref.shape)}; they must match"
            )


def group_layout(logp: Tensor, scores: Tensor, token_mask: Tensor | None = None, *, candidate: bool = True,
                 token: bool = True) -> bool:
    """Check that `logp` (and `token_mask`) line up with the groups of `scores` [..., K]; say which layout it is.

    Returns False for per-candidate `logp` [..., K] (one log-score per candidate; allowed when `candidate`) and
    True for per-token `logp` [..., K, T] (allowed when `token`). Anything else, in particular leading dims that
    differ from `scores` (they would broadcast silently), raises ValueError naming both shapes, as does a
    `token_mask` that is not exactly the shape of a per-token `logp`.
    """
    for name, x in (("logp", logp), ("scores", scores)):
        if not isinstance(x, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if candidate and logp.shape == scores.shape:
        per_token = False
    elif token and logp.dim() == scores.dim() + 1 and logp.shape[:-1] == scores.shape:
        per_token = True
    else:
        allowed = " or ".join(["[..., K] (one log-prob per candidate)"] * candidate + ["[..., K, T] (per-token)"] * token)
        raise ValueError(f"logp has shape {tuple(logp.shape)} but scores has shape {tuple(scores.shape)}: logp must "
                         f"be {allowed} with [..., K] = the shape of scores")
    if token_mask is not None:
        if not per_token:
            raise ValueError(f"token_mask (shape {tuple(token_mask.shape)}) is only for per-token logp [..., K, T]; "
                             f"logp has the per-candidate shape {tuple(logp.shape)}")
        check_token_mask(token_mask, logp)
    return per_token


def check_bool(name: str, mask: Tensor) -> None:
    """Masks must be bool: a float mask of 0.5 (or 2) would be neither a selection nor a documented weight. A wrong
    dtype is a TypeError, as for ids (:func:`is_integer_tensor`) and complex values."""
    if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
        got = mask.dtype if isinstance(mask, Tensor) else type(mask).__name__
        engines = " (TRL's completion_mask, verl's response_mask)" if name == "token_mask" else ""
        hint = f"; a 0/1 mask{engines} converts with .bool()" if isinstance(mask, Tensor) else ""
        raise TypeError(f"{name} must be a bool tensor (True = valid), got {got}{hint}")


def check_token_mask(token_mask: Tensor | None, logp: Tensor, like: str = "logp") -> None:
    """Raise ValueError unless `token_mask` (when given) has exactly the shape of the per-token `logp` (the
    argument named `like`); a mask of another shape would broadcast and weight the wrong tokens."""
    if token_mask is None:
        return
    check_bool("token_mask", token_mask)  # first: a list has no shape to compare
    if token_mask.shape != logp.shape:
        raise ValueError(
            f"token_mask has shape {tuple(token_mask.shape)} but {like} has shape {tuple(logp.shape)}; they must match"
        )


def check_group_size(name: str, x: Tensor, minimum: int = 2) -> None:
    if x.dim() < 1 or x.shape[-1] < minimum:
        raise ValueError(
            f"{name} must have a group axis (last dim) of size K >= {minimum}; got shape {tuple(x.shape)}"
        )


def as_mask(name: str, mask: Tensor | None, like: Tensor, *, require_nonempty_groups: bool = True) -> Tensor | None:
    """Validate a candidate mask (True = valid). Every group must keep at least one candidate."""
    if mask is None:
        return None
    if mask.shape != like.shape:
        raise ValueError(f"{name} has shape {tuple(mask.shape)} but the scores/log-probs have {tuple(like.shape)}")
    check_bool(name, mask)
    if require_nonempty_groups:
        empty = ~mask.any(dim=-1)
        if empty.any():
            idx = empty.nonzero()[0].tolist()
            raise ValueError(
                f"{name} masks out every candidate of {int(empty.sum())} group(s) (first at index {idx}, "
                f"mask shape {tuple(mask.shape)}); drop such groups before calling the objective"
            )
    return mask


def as_token_mask(token_mask: Tensor | None, like: Tensor, candidates: Tensor | None = None, *,
                  like_name: str = "logp") -> Tensor:
    """:func:`check_token_mask` against `like` (the argument named `like_name`); every sequence must keep at least
    one token, but those whose candidate the (checked) candidate mask `candidates` [...] leaves out: a failed
    generation may hold no token at all."""
    if token_mask is None:
        return torch.ones_like(like, dtype=torch.bool)
    check_token_mask(token_mask, like, like_name)
    empty = ~token_mask.any(dim=-1)
    if candidates is not None:
        empty = empty & candidates
    if empty.any():
        raise ValueError(
            f"token_mask leaves {int(empty.sum())} sequence(s) with no valid token (shape {tuple(token_mask.shape)}, "
            f"first at index {empty.nonzero()[0].tolist()}); mask such a candidate out with mask= (False there)"
        )
    return token_mask




ALPHA_MIN = 1e-30  # the smallest positive α of the alpha projection (α = 0 is reverse KL; below, q^α·p^{1−α} is NaN)

# The hyperparameters of every objective, by argument name: declared once, checked by `@checked` on each
# public function, so a new objective that reuses a name gets the same rule.
HYPERPARAMETERS: dict[str, tuple[str, object]] = {
    "eta": ("> 0 (a temperature)", lambda v: v > 0),
    "beta": (">= 0", lambda v: v >= 0),
    "clip_eps": ("in (0, 1) (the ratio's lower bound 1 − ε must stay positive)", lambda v: 0 < v < 1),
    "clip_eps_high": ("> 0 or None", lambda v: v is None or v > 0),
    "tau_pos": ("> 0", lambda v: v > 0),
    "tau_neg": ("> 0", lambda v: v > 0),
    "eps": (">= 0", lambda v: v >= 0),
    "adv_eps": (">= 0", lambda v: v >= 0),
    "log_ratio_clip": ("> 0 or None", lambda v: v is None or v > 0),
    "ratio_min": (">= 0", lambda v: v >= 0),
    "ratio_max": ("> 0", lambda v: v > 0),
    "norm_len": ("> 0 or None", lambda v: v is None or v > 0),
    "alpha": (f"0 or in [{ALPHA_MIN:g}, 1], or None (the α-divergence between reverse (0) and forward (1) KL)",
              lambda v: v is None or v == 0 or ALPHA_MIN <= v <= 1),
    "kl_budget": ("> 0 or None (the KL(q ‖ p_old) an adaptive η targets)", lambda v: v is None or v > 0),
    "std_floor": (">= 0", lambda v: v >= 0),
    "std_shrink": (">= 0", lambda v: v >= 0),
    "is_clip": ("> 0 or None (c̄, the truncation of TPO's anchor importance weights)", lambda v: v is None or v > 0),
    # Engine conventions and verl's objectives (docs/conventions.md).
    "std_ddof": ("0 or 1", lambda v: v in (0, 1)),
    "dual_clip_c": ("> 1 or None (dual-clip bound)", lambda v: v is None or v > 1),
    "kl_clip": ("> 0 or None", lambda v: v is None or v > 0),
    "log_ratio_max": ("> 0 or None", lambda v: v is None or v > 0),
    "clip_cov_ratio": ("> 0 and <= 1 (fraction of tokens)", lambda v: 0 < v <= 1),
    "clip_cov_lb": (">= 0", lambda v: v >= 0),
    "clip_cov_ub": ("> 0", lambda v: v > 0),
    "kl_cov_ratio": ("> 0 and <= 1 (fraction of tokens)", lambda v: 0 < v <= 1),
    "ppo_kl_coef": (">= 0", lambda v: v >= 0),
    # The public building blocks (clipped_surrogate, dual_clip).
    "eps_low": ("in [0, 1) (the ratio's lower clip bound 1 − ε_low must stay positive)", lambda v: 0 <= v < 1),
    "eps_high": (">= 0", lambda v: v >= 0),
    "c": ("> 1 or None (dual-clip bound)", lambda v: v is None or v > 1),
}


def check_hyperparameter(name: str, value, words: tuple[str, ...] = (), optional: bool = True) -> None:
    """Raise ValueError unless `value` obeys `name`'s rule in :data:`HYPERPARAMETERS` or is one of `words`.
    `optional=False` (a function whose annotation does not admit None) refuses None even where the rule allows it."""
    allowed, ok = HYPERPARAMETERS[name]
    if isinstance(value, str) and value in words:
        return
    if not optional:
        allowed = allowed.replace(" or None", "")
    if words:
        allowed = f"{allowed}, or one of {', '.join(map(repr, words))}"
    if value is None and not optional:
        raise ValueError(f"{name}=None: must be a finite number, {allowed}")
    # numbers.Real admits NumPy scalars (np.float32(1.0), np.int64(2)) as well as Python numbers.
    if value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Real)
                              or not math.isfinite(value)):
        raise ValueError(f"{name}={value!r}: must be a finite number, {allowed}")
    if not ok(value):
        raise ValueError(f"{name}={value!r}: must be {allowed}")


def check_range(low_name: str, low: float, high_name: str, high: float, *, strict: bool = False) -> None:
    """Two bounds of one interval in order (each already checked by its rule): a reversed pair would run with an
    empty interval, a constant weight or nothing selected."""
    if low > high or (strict and low == high):
        raise ValueError(f"{low_name}={low!r} and {high_name}={high!r}: need {low_name} {'<' if strict else '<='} "
                         f"{high_name} (the interval between them is empty)")


def check_one_device(arguments: dict) -> None:
    """ValueError naming two tensor arguments on different devices (a 0-dim tensor aside: torch moves those), before
    an objective computes anything with them."""
    tensors = [(n, t) for n, t in arguments.items() if isinstance(t, Tensor) and t.dim() > 0]
    for name, t in tensors[1:]:
        if t.device != tensors[0][1].device:
            raise ValueError(f"{name} is on {t.device} but {tensors[0][0]} is on {tensors[0][1].device}; every tensor "
                             "argument must be on one device")


def check_flag(name: str, value) -> None:
    """A switch annotated `bool` takes True or False: "no", None or 1 would otherwise be read by truthiness."""
    if not isinstance(value, bool):
        raise TypeError(f"{name}={value!r}: must be True or False")


def checked(fn=None, *, words: dict[str, tuple[str, ...]] | None = None, shapes: tuple[str, ...] = (),
            may_overflow: tuple[str, ...] = ()):
    """Validate `fn`'s tensor arguments (one device), hyperparameters (those named in :data:`HYPERPARAMETERS`;
    None only where `fn`'s annotation admits it) and switches (arguments annotated `bool`) before it runs.

    `@checked(words={"eta": ("adaptive",)})` lets that function (and no other) also take the listed words for a
    hyperparameter (TPO's per-group η, docs/method.md §8); the function checks the word's companion arguments.
    `@checked(shapes=("log_p", "log_q", "mask"))` makes those arguments (the ones given) tensors of one shape, and
    a mask among them bool: an elementwise building block would otherwise broadcast a misaligned pair into a wrong
    result. Those tensors (masks aside) are also held to the objectives' rules before `fn` sees them: bf16/fp16 and
    integers computed in float32, NaN and inf refused (inf allowed in the ones named in `may_overflow`)."""
    if fn is None:
        return functools.partial(checked, words=words, shapes=shapes, may_overflow=may_overflow)
    sig = inspect.signature(fn)
    # A tensor-valued argument that shares a hyperparameter's name (kl_to_old's per-group η) is an input, not a
    # number to check against the rule.
    names = [n for n, p in sig.parameters.items() if n in HYPERPARAMETERS and "Tensor" not in str(p.annotation)]
    # With `from __future__ import annotations` an annotation is its source text: "float | None" admits None.
    optional = {n: "None" in str(sig.parameters[n].annotation) for n in names}
    spread = [n for n, p in sig.parameters.items() if p.kind is p.VAR_KEYWORD]
    flags = [n for n, p in sig.parameters.items() if p.annotation in ("bool", bool)]
    unknown = (set(shapes) | set(may_overflow)) - set(sig.parameters)
    if unknown:
        raise TypeError(f"checked(shapes=...) names {sorted(unknown)}, which {fn.__name__} does not take")
    words = words or {}

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            bound = sig.bind(*args, **kwargs)
        except TypeError as exc:  # "got an unexpected keyword argument 'temperature'": say whose
            raise TypeError(f"{fn.__name__}(): {exc}") from None
        given = dict(bound.arguments)
        for n in spread:  # keyword arguments passed on through **kwargs (e.g. dr_grpo_loss's token_mask)
            given |= given.pop(n, {})
        if shapes:
            check_same_shape(**{n: given.get(n) for n in shapes})
            for n in shapes:
                if n.endswith("mask") and given.get(n) is not None:
                    check_bool(n, given[n])
        check_one_device(given)
        for n in names:
            check_hyperparameter(n, bound.arguments.get(n, sig.parameters[n].default), words.get(n, ()), optional[n])
        for n in flags:
            if n in bound.arguments:
                check_flag(n, bound.arguments[n])
        if not shapes:
            return fn(*args, **kwargs)
        for n in shapes:
            if n in bound.arguments and not n.endswith("mask"):
                bound.arguments[n] = as_float(n, bound.arguments[n], inf_ok=n in may_overflow)
        return fn(*bound.args, **bound.kwargs)

    return wrapper
