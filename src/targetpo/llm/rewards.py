"""Verifiable rewards: reasoning-gym's own scorers, and GSM8K by exact numeric match with math-verify.

A reward is a float in [0, 1]; a completion with no extractable answer (``answer is None``) scores 0.
"""

from __future__ import annotations

import logging
from typing import Any


def score_reasoning_gym(scorer, entry: dict[str, Any], answer: str | None) -> float:
    """reasoning-gym's native score of `answer` for `entry`: ``scorer.score_answer(answer, entry=entry)``.

    graph_color: 1.0 for a valid coloring given as JSON, 0.01 for parseable-but-invalid JSON, else 0.
    knights_knaves: 1.0 all right; 0.3 + 0.7·(fraction right) when every name is present. Arithmetic tasks
    (chain_sum, basic_arithmetic): 1.0 for the right number (sign, leading zeros, commas tolerated).
    """
    if answer is None:
        return 0.0
    return float(scorer.score_answer(answer, entry=entry))


def gsm8k_gold(solution: str) -> str:
    """The final answer of a GSM8K solution: the text after the last ``#### `` with thousands separators removed."""
    if "####" not in solution:
        raise ValueError(f"GSM8K answer field has no '#### ' final answer: {solution[-80:]!r}")
    return solution.rsplit("####", 1)[1].strip().replace(",", "")


def score_gsm8k(gold: str, answer: str | None) -> float:
    """1.0 if math-verify finds `answer` equal to `gold` (``verify(parse(gold), parse(answer))``), else 0.

    Timeouts are disabled (``parsing_timeout=None``, ``timeout_seconds=None``): math-verify's timeouts use
    ``signal.alarm``, which only works on the main thread. No other fallback: a completion math-verify cannot
    parse scores 0. ``<answer>`` tags must already be stripped (the template does it).
    """
    if answer is None or not answer.strip():
        return 0.0
    from math_verify import parse, verify

    logging.getLogger("math_verify").setLevel(logging.ERROR)  # the "timeout disabled" notice is intended
    g = parse(gold, parsing_timeout=None)
    p = parse(answer, parsing_timeout=None)
    if not g or not p:
        return 0.0
    return 1.0 if verify(g, p, timeout_seconds=None) else 0.0
