"""Would the token engine's linear layers gain from oneDNN's float32 GEMM on a CPU? On an AMD CPU with AVX-512
torch's MKL takes its AVX2 kernels, oneDNN its AVX-512 ones (BENCHMARKS.md, "Fourteenth session"). Three
measurements, at the shapes of the authors' smoke configuration:

1. the linear layers' GEMMs of a training pass (2 seeds × `--rows` rows): the engine's batched MKL call
   (`torch.baddbmm` / `torch.bmm` over the seed axis) against oneDNN (`torch.ops.mkldnn._linear_pointwise`, one
   call per seed, stacked), for the forward, the input gradient and the weight gradient;
2. what a shape oneDNN has not seen costs (it builds a kernel per shape): milliseconds per call over 200 row
   counts, the first pass and the second;
3. the smoke configuration end to end in fresh interpreters, the engine as it is against its training passes'
   linear layers on oneDNN (sampling unchanged), alternating, `--repeats` each.

    python benchmarks/token_onednn.py --threads 2
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time

import torch
from _args import Parser, positive_int  # benchmarks/ is on sys.path when run as a script

# (in, out) of the model's linear layers: q/k/v, attention output, FFN up and down (d = 64).
LINEARS = ((64, 192), (64, 64), (64, 256), (256, 64))


def per_seed(x, w, b=None):
    """x [S, M, k] @ w[s]ᵀ (+ b[s]) for each seed s, w [S, n, k]: one oneDNN call per seed, stacked."""
    return torch.stack([torch.ops.mkldnn._linear_pointwise(x[s], w[s], None if b is None else b[s], "none", [], "")
                        for s in range(x.shape[0])])


class Linear(torch.autograd.Function):
    """The engine's `_linear` (x [S, M, in] @ w [S, in, out] + b) with every GEMM on oneDNN."""

    @staticmethod
    def forward(ctx, x, w, b):
        ctx.save_for_backward(x, w)
        return per_seed(x, w.transpose(1, 2), b)

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        g = g.contiguous()
        return per_seed(g, w), per_seed(x.transpose(1, 2), g.transpose(1, 2)), g.sum(dim=1)


# The smoke configuration's four methods in one process, with or without the oneDNN linear in the training passes
# (argv: threads, mode); run from benchmarks/, so it imports this module and tokens.py.
_CHILD = """
import sys, time, torch
torch.set_num_threads(int(sys.argv[1]))
from targetpo.tokens import engine as te, transformer as tfm
from token_onednn import Linear
from tokens import SMOKE, TOKEN_METHODS
mkl = tfm._linear
if sys.argv[2] == "onednn":
    tfm._linear = lambda x, w, b: Linear.apply(x.contiguous(), w, b) if torch.is_grad_enabled() else mkl(x, w, b)
t0 = time.perf_counter()
errors = [te.run_trial(SMOKE, m, [0, 1])["error"][-1].tolist() for m in TOKEN_METHODS]
print(time.perf_counter() - t0, errors)
"""


def median_us(fn, calls: int = 50) -> float:
    for _ in range(5):
        fn()
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e6 * statistics.median(times)


def main() -> None:
    parser = Parser(description=__doc__)
    parser.add_argument("--threads", type=positive_int, default=2, help="torch threads (default 2)")
    parser.add_argument("--rows", type=positive_int, default=900, help="rows per seed of a training pass (default "
                        "900: the smoke configuration's answer positions)")
    parser.add_argument("--repeats", type=positive_int, default=3, help="end-to-end runs of each (default 3)")
    args = parser.parse_args()
    if not torch.backends.mkldnn.is_available():
        parser.error(f"this torch ({torch.__version__}) was built without oneDNN: nothing to compare")
    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    s, m = 2, args.rows

    print(f"1. GEMMs of the linear layers, 2 seeds × {m} rows, {args.threads} thread(s), µs (median of 50)\n")
    print("| in → out | pass | MKL, batched | oneDNN, per seed | ratio | largest difference |")
    print("|---|---|---|---|---|---|")
    for k, n in LINEARS:
        x, w, b = (torch.randn(s, m, k, generator=gen), torch.randn(s, k, n, generator=gen),
                   torch.randn(s, n, generator=gen))
        g = torch.randn(s, m, n, generator=gen)
        passes = {
            "forward": (lambda: torch.baddbmm(b.unsqueeze(1), x, w), lambda: per_seed(x, w.transpose(1, 2), b)),
            "input gradient": (lambda: torch.bmm(g, w.transpose(1, 2)), lambda: per_seed(g, w)),
            "weight gradient": (lambda: torch.bmm(x.transpose(1, 2), g),
                                lambda: per_seed(x.transpose(1, 2), g.transpose(1, 2))),
        }
        for name, (ref, new) in passes.items():
            a, c = median_us(ref), median_us(new)
            print(f"| {k} → {n} | {name} | {a:.0f} | {c:.0f} | {a / c:.2f} | {(ref() - new()).abs().max():.1e} |")

    w, b = torch.randn(s, 256, 64, generator=gen), torch.randn(s, 256, generator=gen)
    xs = [torch.randn(s, rows, 64, generator=gen) for rows in range(800, 1000)]
    print("\n2. a new row count each call (64 → 256 forward, rows 800–999), µs per call")
    for name, fn in (("MKL", lambda x: torch.baddbmm(b.unsqueeze(1), x, w.transpose(1, 2))),
                     ("oneDNN", lambda x: per_seed(x, w, b))):
        for attempt in ("first pass", "second pass"):
            t0 = time.perf_counter()
            for x in xs:
                fn(x)
            print(f"- {name}, {attempt}: {1e6 * (time.perf_counter() - t0) / len(xs):.0f}")

    print(f"\n3. the smoke configuration, {args.threads} thread(s), seconds in one process (alternating)")
    runs: dict[str, list[float]] = {"MKL": [], "oneDNN": []}
    errors: dict[str, set] = {"MKL": set(), "oneDNN": set()}
    for _ in range(args.repeats):
        for name in runs:
            out = subprocess.run([sys.executable, "-c", _CHILD, str(args.threads), name.lower()], check=True,
                                 capture_output=True, text=True, cwd=sys.path[0]).stdout.split(" ", 1)
            runs[name].append(float(out[0]))
            errors[name].add(out[1].strip())
    for name, times in runs.items():
        print(f"- {name}: {statistics.median(times):.1f} s ({' / '.join(f'{t:.1f}' for t in times)}); errors at "
              f"episode 50 {' | '.join(sorted(errors[name]))}")


if __name__ == "__main__":
    main()
