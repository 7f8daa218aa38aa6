"""MNIST bandit: per-step training cost with and without vectorising seeds (and methods) into one network.

Measured side by side in one process on the same data (the shared MNIST test split), interleaved, medians:
- stacked: all S seeds × M methods as one batched network (what `targetpo run mnist` does);
- seeds only: one batched network of S seeds per method, M Python steps per update;
- none: one network per (seed, method), S·M Python steps per update (a plain per-run loop).
Evaluation is excluded (the same for every layout). Prints a markdown table; --write appends it to a file.

    python benchmarks/mnist.py --data-dir ../shared/data/mnist --seeds 20 --threads 2
"""

from __future__ import annotations

import statistics
import time
from dataclasses import replace

import torch
from _args import Parser, positive_int  # benchmarks/ is on sys.path when run as a script

from targetpo.mnist import train as E
from targetpo.mnist import data as D
from targetpo.mnist.bandit import BatchStream


def make(cfg, seeds: list[int], methods: list[str]):
    c = replace(cfg, seed=seeds[0], seeds=len(seeds), methods=tuple(methods))
    params, opt = E.init_policies(c, len(methods))
    return params, opt, methods, BatchStream(seeds, N_TRAIN, cfg.batch)


def run(setup, data, steps: int, eta: float) -> None:
    params, opt, methods, stream = setup
    for _ in range(steps):
        idx, noise = stream.next()
        E.bandit_step(params, opt, methods, *E.gather_batch(data, idx), noise, eta)


def main() -> None:
    global N_TRAIN
    ap = Parser(description=__doc__)
    ap.add_argument("--data-dir", default=None, help="MNIST folder (default: $TARGETPO_MNIST_DIR)")
    ap.add_argument("--seeds", type=positive_int, default=20, help="seeds S per network (default 20, the paper's)")
    ap.add_argument("--threads", type=positive_int, default=2, help="torch CPU threads (default 2)")
    ap.add_argument("--steps", type=positive_int, default=20, help="updates per timed repeat")
    ap.add_argument("--repeats", type=positive_int, default=5, help="interleaved timed repeats of every layout "
                    "(median reported; default 5)")
    ap.add_argument("--write", default=None, help="append the table to this markdown file")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    data = D.load(args.data_dir)
    N_TRAIN = len(data.train_y)
    cfg = E.PRESETS["paper"]
    methods, seeds = list(cfg.methods), list(range(args.seeds))
    layouts = {
        "stacked (S seeds × M methods, one network)": [make(cfg, seeds, methods)],
        "seeds only (one S-seed network per method)": [make(cfg, seeds, [m]) for m in methods],
        # One (seed, method) network per Python step; S·M of them make one update of the whole experiment.
        "none (one network per seed and method)": [make(cfg, [0], [m]) for m in methods],
    }
    scale = {k: (args.seeds if k.startswith("none") else 1) for k in layouts}
    times = {k: [] for k in layouts}
    for k, setups in layouts.items():  # warm-up
        for s in setups:
            run(s, data, 3, cfg.eta)
    for _ in range(args.repeats):
        for k, setups in layouts.items():
            t = time.perf_counter()
            for s in setups:
                run(s, data, args.steps, cfg.eta)
            times[k].append((time.perf_counter() - t) / args.steps * scale[k])
    base = statistics.median(times["stacked (S seeds × M methods, one network)"])
    lines = [f"Per-update training cost of the `mnist` paper configuration ({args.seeds} seeds × {len(methods)} methods, "
             f"B = {cfg.batch}, MLP 784-50-50-10, Adam), {args.threads} torch threads, torch {torch.__version__}; "
             f"median of {args.repeats} interleaved repeats of {args.steps} updates, evaluation excluded.",
             "", "| layout | ms per update (all networks) | × stacked | projected 10,000 updates (min) |",
             "|---|---|---|---|"]
    for k, v in times.items():
        m = statistics.median(v)
        lines.append(f"| {k} | {m * 1e3:.1f} | {m / base:.2f}× | {m * 1e4 / 60:.1f} |")
    text = "\n".join(lines)
    print(text)
    if args.write:
        with open(args.write, "a") as fh:
            fh.write(text + "\n")


if __name__ == "__main__":
    main()
