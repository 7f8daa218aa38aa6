"""The training pass of the token engine against one full causal forward (BENCHMARKS.md, "Token engine").

`engine.answer_logp` runs each distinct prompt once (its keys and values cached, prompts sharing a prefix
sharing the pass over it) and then each distinct (prompt, answer) pair over that cache, answers sharing a prefix
sharing it too. The simpler alternative runs every distinct pair as one sequence, prompt and answer, through
`transformer.forward`: more positions, fewer and larger ops. This builds one batch of a method from a fresh
policy (the same parameters, prompts and samples for both) and times one epoch's loss forward and backward each
way, `--pairs` interleaved pairs, 1 thread by default (what `reproduce` workers run); it prints the median of
each, their ratio and how far the full forward's gradients are from the engine's (it rounds differently).
`--profile N` then lists the N costliest ops of the engine's epoch (`torch.profiler`, five epochs).

    python benchmarks/token_forward.py --config variants diagnostics dg-epochs
    python benchmarks/token_forward.py --config diagnostics --profile 12
"""

from __future__ import annotations

import statistics
import time

import torch
from _args import Parser, nonnegative_int, positive_int  # benchmarks/ is on sys.path when run as a script
from token_parts import fresh_policy, parts  # the batch and the epoch token_parts.py times

from targetpo.tokens import engine, rows
from targetpo.tokens import transformer as tfm

# The costliest kinds of unit of `reproduce`'s token experiments: (method, TrialConfig fields, seeds), as the
# cpu presets of token-variants, token-diagnostics and dg-epochs (its variant units) set them when written.
CONFIGS = {
    "variants": ("tpo_token", dict(task="reverse_copy", reward="bag", length=10, vocab=2, batch=100, k=8), 4),
    "diagnostics": ("tpo", dict(task="reverse_copy", reward="terminal", length=6, vocab=2, batch=64, k=8), 4),
    "dg-epochs": ("dg", dict(task="copy", reward="bag", length=6, vocab=2, batch=50, k=8, dg_epochs=4), 2),
}


def full_answer_logp(params, spec, prompts, actions, plan=None):
    """answer_logp's log-probs from one causal forward over each distinct (prompt, answer) pair."""
    plan = plan if plan is not None else engine.answer_plan(prompts, actions, spec.vocab)
    s, b, g, h = actions.shape
    seq = torch.cat([rows.take(plan.prompts, plan.row_prompt), plan.answers], dim=2)   # [S, U, 2H − 1]
    logp = tfm.forward(params, seq, spec, out_from=h - 1)                              # [S, U, H, V]
    return rows.take(logp, plan.inverse).view(s, b, g, h, spec.vocab)


def op_table(work, top: int, n: int = 5, what: str = "epoch", by_shape: bool = True) -> str:
    """The `top` costliest ops (self CPU time) of `work()`, which runs `n` epochs (or episodes: `what`), per one
    of them, as markdown rows; with `by_shape`, each op's input shapes apart."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU], record_shapes=by_shape) as prof:
        work()
    ops = prof.key_averages(group_by_input_shape=by_shape)
    total = sum(e.self_cpu_time_total for e in ops)
    lines = [f"\nengine {what}s under the profiler: {total / n / 1e3:.1f} ms of op time per {what}\n",
             f"| op | ms per {what} | share | calls per {what} | input shapes |", "|---|---|---|---|---|"]
    for e in sorted(ops, key=lambda e: -e.self_cpu_time_total)[:top]:
        shapes = str(e.input_shapes)[:100] if by_shape else "–"
        lines.append(f"| {e.key} | {e.self_cpu_time_total / n / 1e3:.2f} | {100 * e.self_cpu_time_total / total:.1f} % "
                     f"| {e.count // n} | {shapes} |")
    return "\n".join(lines)


def time_config(name: str, pairs: int, top: int = 0) -> str:
    method, fields, n_seeds = CONFIGS[name]
    cfg = engine.TrialConfig(**fields, episodes=1)
    spec, params, prompts = fresh_policy(cfg, method, list(range(n_seeds)))
    _, engine_epoch = parts(engine, params, spec, cfg, method, prompts)
    cached = engine.answer_logp

    def epoch(logp_fn):
        engine.answer_logp = logp_fn   # loss_fn looks it up at call time
        try:
            return engine_epoch()
        finally:
            engine.answer_logp = cached

    ref, alt = epoch(cached), epoch(full_answer_logp)
    rel = max(float((a - r).abs().max() / r.abs().max().clamp_min(1e-30)) for r, a in zip(ref, alt))
    times: dict[str, list[float]] = {"cached": [], "full": []}
    for _ in range(pairs):
        for key, fn in (("cached", cached), ("full", full_answer_logp)):
            t = time.perf_counter()
            epoch(fn)
            times[key].append(time.perf_counter() - t)
    c, f = statistics.median(times["cached"]), statistics.median(times["full"])
    shape = ", ".join(f"{k}={v}" for k, v in fields.items())
    row = f"| {name} ({method}, {n_seeds} seeds, {shape}) | {1e3 * c:.1f} | {1e3 * f:.1f} | {f / c:.2f}× | {rel:.1e} |"
    return row + ("\n" + op_table(lambda: [epoch(cached) for _ in range(5)], top) if top else "")


def main() -> None:
    parser = Parser(description=__doc__)
    parser.add_argument("--config", nargs="+", choices=list(CONFIGS), default=list(CONFIGS),
                        help="configurations to time (default: all)")
    parser.add_argument("--pairs", type=positive_int, default=15, help="interleaved (cached, full) pairs (default 15)")
    parser.add_argument("--threads", type=positive_int, default=1, help="torch threads (default 1)")
    parser.add_argument("--profile", type=nonnegative_int, default=0, metavar="N", help="after each configuration's "
                        "row, its engine epoch's N costliest ops (default 0: none)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"one epoch's loss forward + backward, median of {args.pairs} interleaved pairs, {args.threads} thread(s)\n")
    print("| configuration | engine (ms) | full forward (ms) | full / engine | max gradient difference (relative) |")
    print("|---|---|---|---|---|")
    for name in args.config:
        print(time_config(name, args.pairs, args.profile), flush=True)


if __name__ == "__main__":
    main()
