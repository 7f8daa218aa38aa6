"""Verifiable rewards: reasoning-gym's own scorers, and GSM8K by exact numeric match with math-verify.

A reward is a float in [0, 1]; a completion with no extractable answer (``answer is None``) scores 0.
"""

from __future__ import annotations

import logging
import re
from typing import Any


def score_reasoning_gym(scorer, entry: dict[str, Any], answer: str | None) -> float:
    """reasoning-gym's native score of `answer` for `entry`: ``scorer.score_answer(answer, entry=entry)``.

    graph_color: 1.0 for a valid coloring given as JSON, 0.01 for parseable-but-invalid JSON, else 0.
    knights_knaves: 1.0 all right; 0.3 + 0.7·(fraction right) when every name is present and at least one is
    right, else 0. chain_sum: 1.0 for the right number (sign, leading zeros, commas tolerated). Tasks without a
    scorer of their own, basic_arithmetic among them, use reasoning-gym's default: 1.0 for the gold string
    exactly, len(gold)/len(answer) when the answer contains it ("138" for 38 scores 2/3), else 0 — so the reward
    gives partial credit to some wrong answers; held-out accuracy counts a reward of 1 only.
    """
    if answer is None:
        return 0.0
    return float(scorer.score_answer(answer, entry=entry))


def gsm8k_gold(solution: str) -> str:
    """The final answer of a GSM8K solution: the text after the last ``#### `` with thousands separators removed."""
    if "####" not in solution:
        raise ValueError(f"GSM8K answer field has no '#### ' final answer: {solution[-80:]!r}")
    return solution.rsplit("####", 1)[1].strip().replace(",", "")


# Ways of writing a number that math-verify reads wrong: a Unicode minus, an escaped dollar sign, LaTeX
# thousands separators (1{,}000 and 1\,000 parse as 1).
_NUMBER_SPELLINGS = [(re.compile("\u2212"), "-"), (re.compile(r"\\\$"), ""),
                     (re.compile(r"(?<=\d)(?:\{,\}|\\,)(?=\d{3}(?!\d))"), "")]
# Expressions sympy may take unboundedly long to compare (9^9^9^9, (10^100)!): exponents and factorials beyond
# these bounds make a number far outside GSM8K's answers (all integers below 10^9), so such a candidate is not
# compared at all.
_MAX_EXPONENT = 1000
_MAX_FACTORIAL = 1000


def _bounded(expr) -> bool:
    """True when every power in the sympy expression `expr` has a plain-number exponent of size at most
    _MAX_EXPONENT and every factorial an integer argument at most _MAX_FACTORIAL (so comparing it is cheap)."""
    import sympy

    if not isinstance(expr, sympy.Basic):
        return True
    for node in sympy.preorder_traversal(expr):
        if isinstance(node, sympy.Pow):
            e = node.exp
            if not (e.is_Number and abs(e) <= _MAX_EXPONENT):
                return False
        elif isinstance(node, (sympy.factorial, sympy.factorial2, sympy.subfactorial, sympy.gamma)):
            a = node.args[0]
            if not (a.is_Integer and abs(a) <= _MAX_FACTORIAL):
                return False
    return True


def score_gsm8k(gold: str, answer: str | None) -> float:
    """1.0 if math-verify finds `answer` equal to `gold` (``verify(parse(gold), parse(answer))``), else 0.

    math-verify reads the last number (or expression) of the answer: "17 or 18" is read as 18. A Unicode minus,
    ``\\$`` and LaTeX thousands separators (``1{,}000``, ``1\\,000``) are normalised first. Timeouts are disabled
    (``parsing_timeout=None``, ``timeout_seconds=None``): math-verify's timeouts use ``signal.alarm``, which only
    works on the main thread, and would make a reward depend on the machine's load. Instead an answer whose
    expression has an exponent above 1000 or a factorial of more than 1000 (``9^9^9^9``: sympy would compare it
    for ever) scores 0 without being compared; no GSM8K answer is that large. A completion math-verify cannot
    parse scores 0. ``<answer>`` tags must already be stripped (the template does it).
    """
    if answer is None or not answer.strip():
        return 0.0
    from math_verify import parse, verify

    logging.getLogger("math_verify").setLevel(logging.ERROR)  # the "timeout disabled" notice is intended
    for pattern, repl in _NUMBER_SPELLINGS:
        answer = pattern.sub(repl, answer)
    g = parse(gold, parsing_timeout=None)
    p = parse(answer, parsing_timeout=None)
    if not g or not p or not all(_bounded(x) for x in p):
        return 0.0
    return 1.0 if verify(g, p, timeout_seconds=None) else 0.0
