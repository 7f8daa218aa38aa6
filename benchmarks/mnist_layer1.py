"""MNIST bandit, first layer: which ways of computing it give bitwise the same numbers, and what each costs.

The `mnist` run's metrics must stay identical for the same seeds, so a faster formulation only counts if every
output bit is the same. Shapes of the paper preset: S = 20 seeds, M = 6 methods, B = 100 images, 784 → 50 per
network, i.e. per seed one [100, 784] @ [784, 300] product forward and its weight gradient backward. One torch
thread; times are medians of --repeats interleaved calls.

    python benchmarks/mnist_layer1.py --repeats 7
"""

from __future__ import annotations

import statistics
import time

import torch
from _args import Parser, positive_int  # benchmarks/ is on sys.path when run as a script


def main() -> None:
    ap = Parser(description=__doc__)
    ap.add_argument("--repeats", type=positive_int, default=7, help="interleaved timed calls of every formulation "
                    "(median reported; default 7)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    s, m, b, d, h = 20, 6, 100, 784, 50
    gen = torch.Generator().manual_seed(0)
    x = (torch.rand(s, b, d, generator=gen) > 0.8).float() * torch.rand(s, b, d, generator=gen)  # sparse, like digits
    w = torch.randn(s, d, m * h, generator=gen) * 0.05
    bias = torch.randn(s, 1, m * h, generator=gen) * 0.01
    g = torch.randn(s, b, m * h, generator=gen)
    wt = w.transpose(1, 2).contiguous()
    forward = {
        "baddbmm(bias, x, W) (what the run does)": lambda: torch.baddbmm(bias, x, w),
        "per-seed addmm loop": lambda: torch.stack([torch.addmm(bias[i], x[i], w[i]) for i in range(s)]),
        "(Wᵀ xᵀ)ᵀ": lambda: torch.baddbmm(bias.transpose(1, 2), wt, x.transpose(1, 2)).transpose(1, 2),
        "bmm(x, W) + bias": lambda: torch.bmm(x, w) + bias,
        "baddbmm with W stored transposed": lambda: torch.baddbmm(bias, x, wt.transpose(1, 2)),
    }
    backward = {
        "xᵀ @ grad (autograd's weight gradient)": lambda: torch.bmm(x.transpose(1, 2), g),
        "contiguous xᵀ @ grad": lambda: torch.bmm(x.transpose(1, 2).contiguous(), g),
        "(gradᵀ @ x)ᵀ": lambda: torch.bmm(g.transpose(1, 2), x).transpose(1, 2),
    }
    rows = []
    for part, fns in (("forward", forward), ("weight gradient", backward)):
        ref = next(iter(fns.values()))()
        times = {k: [] for k in fns}
        for _ in range(args.repeats):
            for k, f in fns.items():
                t = time.perf_counter()
                f()
                times[k].append(time.perf_counter() - t)
        for k, f in fns.items():
            out = f()
            same = "yes" if torch.equal(out, ref) else f"no (max diff {(out - ref).abs().max():.1e})"
            rows.append(f"| {part} | {k} | {statistics.median(times[k]) * 1e3:.1f} | {same} |")
    print(f"torch {torch.__version__}, 1 thread, median of {args.repeats}\n")
    print("| part | formulation | ms | bitwise equal to the first |\n|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
