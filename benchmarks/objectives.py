"""Forward+backward time and peak memory of TPO's sequence objective vs GRPO's at LLM-like shapes.

Inputs are per-token log-probs [G, K, T] (the leaf a model would produce), rollout-time log-probs, a token
mask with ragged lengths and group scores. Time: median over repeated runs, objectives interleaved so machine
noise hits both alike. Memory: the peak of the running sum of the profiler's allocation/free events during one
forward+backward (allocations made by the step only).

    python benchmarks/objectives.py                # print
    python benchmarks/objectives.py --write BENCHMARKS.md   # also replace this benchmark's section there
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from _args import Parser, positive_int  # benchmarks/ is on sys.path when run as a script
from _markdown import replace_section

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from targetpo.objectives import grpo_loss, tpo_sequence_loss  # noqa: E402

OBJECTIVES = {
    "tpo (seq_logp=sum)": lambda lp, old, s, tm: tpo_sequence_loss(lp, old, s, token_mask=tm, seq_logp="sum"),
    "tpo (seq_logp=mean)": lambda lp, old, s, tm: tpo_sequence_loss(lp, old, s, token_mask=tm, seq_logp="mean"),
    "grpo (per-token ratio, β=0.04)": lambda lp, old, s, tm: grpo_loss(lp, old, s, token_mask=tm, beta=0.04),
}
BASELINE = "grpo (per-token ratio, β=0.04)"


def shape_arg(text: str) -> tuple[int, int, int]:
    """--shape G,K,T: G >= 1 groups, K >= 2 candidates (the objectives refuse a group of one), T >= 4 tokens (a
    completion is T//4 to T tokens long, so every one has a token)."""
    try:
        g, k, t = (int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: must be three integers G,K,T, e.g. 64,16,1024") from None
    if g < 1 or k < 2 or t < 4:
        raise argparse.ArgumentTypeError(f"{text!r}: needs G >= 1, K >= 2 and T >= 4")
    return g, k, t


def make_inputs(g: int, k: int, t: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    logp = (-torch.rand(g, k, t, generator=gen) * 3).requires_grad_(True)
    old = logp.detach() + 0.01 * torch.randn(g, k, t, generator=gen)
    lengths = torch.randint(t // 4, t + 1, (g, k), generator=gen)
    tm = torch.arange(t) < lengths.unsqueeze(-1)
    scores = (torch.rand(g, k, generator=gen) < 0.4).float()
    return logp, old, scores, tm


def step(name, inputs):
    logp = inputs[0]
    logp.grad = None
    OBJECTIVES[name](*inputs).loss.backward()


def time_all(g, k, t, repeats):
    inputs = make_inputs(g, k, t)
    times = {n: [] for n in OBJECTIVES}
    for n in OBJECTIVES:  # warm-up
        step(n, inputs)
    for _ in range(repeats):
        for n in OBJECTIVES:
            t0 = time.perf_counter()
            step(n, inputs)
            times[n].append(time.perf_counter() - t0)
    return {n: statistics.median(v) for n, v in times.items()}


def peak_memory(name, inputs) -> float:
    """Peak MiB allocated during one forward+backward, from the profiler's allocation events (alloc/free in
    time order; the running sum's maximum). Inputs already alive before the step are not counted."""
    from torch.profiler import ProfilerActivity, profile

    inputs[0].grad = None  # the previous objective's gradient, freed inside the window, made the sum start negative
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step(name, inputs)
    events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events() if e.name() == "[memory]")
    running = peak = 0
    for _, nbytes in events:
        running += nbytes
        peak = max(peak, running)
    return peak / 2**20


def main():
    ap = Parser(description=__doc__)
    ap.add_argument("--shape", default="64,16,1024", type=shape_arg, help="G,K,T: groups (>= 1), candidates per "
                    "group (>= 2), tokens (>= 4) (default 64,16,1024)")
    ap.add_argument("--repeats", type=positive_int, default=15, help="timed repetitions per objective (median "
                    "reported)")
    ap.add_argument("--threads", type=positive_int, default=2, help="torch CPU threads")
    ap.add_argument("--write", default=None, help="markdown file whose '## Objectives' section is replaced")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    g, k, t = args.shape
    times = time_all(g, k, t, args.repeats)
    inputs = make_inputs(g, k, t)
    mem = {n: peak_memory(n, inputs) for n in OBJECTIVES}
    rows = []
    for n in OBJECTIVES:
        rows.append(f"| {n} | {times[n] * 1e3:.1f} | {times[n] / times[BASELINE]:.2f}× | {mem[n]:.0f} | "
                    f"{mem[n] / mem[BASELINE]:.2f}× |")
    cmd = f"python benchmarks/objectives.py --shape {g},{k},{t} --repeats {args.repeats} --threads {args.threads}"
    section = "\n".join([
        "## Objectives: TPO vs GRPO at LLM-like shapes", "",
        f"Forward + backward of the loss on per-token log-probs [G, K, T] = [{g}, {k}, {t}] with ragged token "
        f"masks, {args.threads} CPU threads, torch {torch.__version__}. Time is the median of {args.repeats} "
        "interleaved runs; memory is the peak of live allocations during one forward+backward (profiler allocation events; the inputs themselves are not counted).",
        "", f"Command: `{cmd}`", "",
        "| objective | time (ms) | vs GRPO | peak memory (MiB) | vs GRPO |", "|---|---|---|---|---|", *rows, ""])
    print(section)
    print(json.dumps({"times_s": times, "peak_mib": mem}))
    if args.write:
        replace_section(args.write, "## Objectives", section)


if __name__ == "__main__":
    main()
