"""Engine conventions: the flag values that make a GRPO-family objective compute what verl 0.9.1 or TRL 1.16 computes.

Each objective of the family takes the flags one by one (`std_ddof`, `adv_eps`, `singleton`, `dual_clip_c`,
`log_ratio_clip`, `kl_clip`, `kl_estimator`, `loss_agg`, ...) and a `convention=` switch that sets them all:
``None``/"targetpo" changes nothing (the paper's conventions), "verl" and "trl" set the values of the table
below. A flag passed explicitly always wins over the convention. docs/conventions.md lists every value with the
engine source it is read from.
"""

from __future__ import annotations

import functools
import inspect

CONVENTIONS = ("targetpo", "verl", "trl")

# Flags per objective family and convention. "targetpo" is empty: the functions' own defaults are its values.
_GRPO_VERL = {"std_ddof": 1, "adv_eps": 1e-6, "singleton": "verl", "dual_clip_c": 3.0, "log_ratio_clip": 20.0,
              "kl_clip": 10.0, "kl_estimator": "k3", "loss_agg": "token-mean"}
_GRPO_TRL = {"std_ddof": 1, "adv_eps": 1e-4, "dual_clip_c": None, "log_ratio_clip": None, "kl_clip": None,
             "kl_estimator": "k3", "loss_agg": "token-mean"}
_ADV_VERL = {"std_ddof": 1, "adv_eps": 1e-6, "singleton": "verl"}
_ADV_TRL = {"std_ddof": 1, "adv_eps": 1e-4}

FLAGS: dict[str, dict[str, dict]] = {
    "ppo": {"verl": {"dual_clip_c": 3.0, "log_ratio_clip": 20.0, "loss_agg": "token-mean"},
            "trl": {}},
    "grpo": {"verl": _GRPO_VERL, "trl": _GRPO_TRL},
    "gspo": {"verl": {**_ADV_VERL, "log_ratio_clip": None, "log_ratio_max": 10.0, "loss_agg": "token-mean"},
             "trl": {**_ADV_TRL, "log_ratio_clip": None, "loss_agg": "token-mean"}},
    "sapo": {"verl": {**_ADV_VERL, "log_ratio_clip": 20.0, "loss_agg": "seq-mean-token-mean"},
             "trl": {**_ADV_TRL, "log_ratio_clip": None, "loss_agg": "seq-mean-token-mean"}},
    "cispo": {"verl": {**_ADV_VERL, "log_ratio_clip": 20.0, "ratio_min": 0.8, "ratio_max": 1.2,
                       "loss_agg": "token-mean"},
              "trl": {**_ADV_TRL, "log_ratio_clip": None, "ratio_min": 0.0, "loss_agg": "token-mean"}},
    # The objectives only verl has (clip-cov, KL-cov, GMPO): "trl" has no such loss.
    "verl_only": {"verl": _ADV_VERL},
}


def convention_flags(convention: str | None, family: str) -> dict:
    """The flags `convention` sets on an objective of `family` (empty for None/"targetpo")."""
    if convention is None or convention == "targetpo":
        return {}
    if convention not in CONVENTIONS:
        raise ValueError(f"convention={convention!r}: must be None or one of {CONVENTIONS}")
    if convention not in FLAGS[family]:
        raise ValueError(f"convention={convention!r}: this objective has no {convention} counterpart; "
                         f"allowed: None, 'targetpo', {', '.join(repr(c) for c in FLAGS[family])}")
    return dict(FLAGS[family][convention])


def with_convention(family: str, *, per_token_only: tuple[str, ...] = ()):
    """Add a keyword `convention=` to an objective: the convention's flags fill in every flag the caller did not
    pass. Flags named in `per_token_only` (the engines' token aggregation) are set only for per-token `logp`
    (one more dim than the candidates), since a per-candidate batch has no tokens to aggregate."""

    def decorate(fn):
        sig = inspect.signature(fn)

        @functools.wraps(fn)
        def wrapper(*args, convention: str | None = None, **kwargs):
            flags = convention_flags(convention, family)
            if flags:
                given = sig.bind_partial(*args, **kwargs).arguments
                per_token = _is_per_token(given)
                for name, value in flags.items():
                    if name in sig.parameters and name not in given and (per_token or name not in per_token_only):
                        kwargs[name] = value
            return fn(*args, **kwargs)

        params = list(sig.parameters.values())
        extra = inspect.Parameter("convention", inspect.Parameter.KEYWORD_ONLY, default=None, annotation="str | None")
        at = next((i for i, p in enumerate(params) if p.kind == p.VAR_KEYWORD), len(params))
        wrapper.__signature__ = sig.replace(parameters=params[:at] + [extra] + params[at:])
        return wrapper

    return decorate


def _is_per_token(given: dict) -> bool:
    lp = given.get("logp")
    ref = given.get("scores", given.get("advantages"))
    if lp is None or ref is None or not hasattr(lp, "dim"):
        return False
    return lp.dim() == ref.dim() + 1 or (lp.dim() == ref.dim() and "advantages" in given and lp.dim() >= 2)
