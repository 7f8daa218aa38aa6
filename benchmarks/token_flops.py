"""The arithmetic of the authors' `transformer --smoke` configuration against this machine's float32 GEMM peak
(BENCHMARKS.md, "Where the rest of the time goes").

Counts the matrix-multiply FLOPs of one run of the configuration (2 seeds × 50 episodes, H = 10, V = 2, B = 100,
K = 8; ppo, dg, tpo_token, grpo_token) with torch's FLOP counter, which sees every GEMM the engine dispatches
(forward, backward, sampling), and times a large square float32 GEMM at `--threads`: the count divided by that
peak is the time the configuration would take if its GEMMs ran at the machine's best rate and everything else
(GELU, LayerNorm, softmax, gathers, the optimizer, Python) took no time at all. Then it times the engine's
projection GEMMs alone at the configuration's training shapes, against that peak.

    python benchmarks/token_flops.py --threads 2
    python benchmarks/token_flops.py --threads 1
"""

from __future__ import annotations

import statistics
import time

import torch
from _args import Parser, positive_int  # benchmarks/ is on sys.path when run as a script
from tokens import SMOKE, TOKEN_METHODS  # the configuration benchmarks/tokens.py times
from torch.utils.flop_counter import FlopCounterMode

from targetpo.tokens import engine as te


def smoke_flops() -> dict[str, dict[str, int]]:
    """{method: {op: FLOPs}} of one run of the smoke configuration (deterministic: the engine's distinct rows,
    and so its GEMM shapes, depend on the seeds only)."""
    out = {}
    for m in TOKEN_METHODS[::-1]:  # the order tokens.py runs them in
        counter = FlopCounterMode(display=False)
        with counter:
            te.run_trial(SMOKE, m, [0, 1])
        out[m] = {str(op): int(n) for op, n in counter.get_flop_counts()["Global"].items()}
    return out


def gemm_peak(n: int, repeats: int) -> float:
    """Median FLOP/s of an [n, n] × [n, n] float32 matmul (after warm-up)."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    for _ in range(3):
        a @ b
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - t0)
    return 2 * n ** 3 / statistics.median(times)


# The batched GEMMs of a training pass of the configuration (2 seeds, ~900 tree rows of d = 64): the QKV, output
# and FFN projections, [S, M, K] x [S, K, N], timed as `bmm` (the engine's `baddbmm` without its bias).
ENGINE_GEMMS = ((2, 900, 64, 192), (2, 900, 64, 64), (2, 900, 64, 256), (2, 900, 256, 64))


def bmm_rate(s: int, m: int, k: int, n: int, repeats: int, calls: int = 50) -> float:
    """Median FLOP/s of torch.bmm on [s, m, k] x [s, k, n] float32 (rounds of `calls` calls, after warm-up)."""
    a, b, out = torch.randn(s, m, k), torch.randn(s, k, n), torch.empty(s, m, n)
    for _ in range(3):
        torch.bmm(a, b, out=out)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            torch.bmm(a, b, out=out)
        times.append((time.perf_counter() - t0) / calls)
    return 2 * s * m * k * n / statistics.median(times)


def main():
    ap = Parser(description=__doc__)
    ap.add_argument("--threads", type=positive_int, default=2, help="torch CPU threads")
    ap.add_argument("--size", type=positive_int, default=2048, help="side of the square GEMM timed for the peak")
    ap.add_argument("--repeats", type=positive_int, default=7, help="timed GEMMs (median reported)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    flops = smoke_flops()
    peak = gemm_peak(args.size, args.repeats)
    total = sum(sum(ops.values()) for ops in flops.values())
    print(f"torch {torch.__version__}, {args.threads} threads")
    print("| method | GEMM GFLOP (2 seeds × 50 episodes) |\n|---|---|")
    for m, ops in flops.items():
        print(f"| {m} | {sum(ops.values()) / 1e9:.1f} |")
    print(f"total {total / 1e12:.3f} TFLOP; [{args.size}, {args.size}] float32 GEMM peak {peak / 1e9:.0f} GFLOP/s "
          f"(median of {args.repeats}); the configuration's GEMMs at that peak: {total / peak:.1f} s")
    print("\n| engine GEMM [S, M, K] x [S, K, N] | GFLOP/s alone | of the peak |\n|---|---|---|")
    for s, m, k, n in ENGINE_GEMMS:
        rate = bmm_rate(s, m, k, n, args.repeats)
        print(f"| [{s}, {m}, {k}] x [{s}, {k}, {n}] | {rate / 1e9:.0f} | {rate / peak:.0%} |")


if __name__ == "__main__":
    main()
