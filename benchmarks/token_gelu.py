"""The token model's tanh-GELU on a CPU: torch's `F.gelu(approximate="tanh")` against the engine's x·σ(2z)
(`targetpo.tokens.transformer._gelu`, the same function with its backward written out), forward + backward and
forward alone (sampling), at the FFN shapes of the authors' smoke configuration (BENCHMARKS.md, "Twelfth
session"). Torch's CPU tanh costs several times its sigmoid on this machine, and the two forms round
differently, so this also prints the largest differences between them and from float64.

    python benchmarks/token_gelu.py --threads 1
    python benchmarks/token_gelu.py --threads 2
"""

from __future__ import annotations

import math
import statistics
import time

import torch
import torch.nn.functional as F
from _args import Parser, positive_int  # benchmarks/ is on sys.path when run as a script

from targetpo.tokens import transformer as tfm

# [seeds, rows, 4·d]: the training pass (2 seeds × 900 answer positions), 4 seeds of it (`token-variants`), and
# one sampling step (2 seeds × 100 prompts).
SHAPES = ((2, 900, 256), (4, 900, 256), (2, 100, 256))


def round_ms(fn, calls: int) -> float:
    """Milliseconds per call over one round of `calls` calls, after 3 warm-up calls."""
    for _ in range(3):
        fn()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return 1e3 * (time.perf_counter() - t0) / calls


def main() -> None:
    parser = Parser(description=__doc__)
    parser.add_argument("--threads", type=positive_int, default=1, help="torch threads (default 1, as reproduce's "
                        "workers)")
    parser.add_argument("--calls", type=positive_int, default=50, help="calls per timed round (default 50)")
    parser.add_argument("--repeats", type=positive_int, default=7, help="rounds, interleaved (default 7)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    forms = {"torch": lambda x: F.gelu(x, approximate="tanh"), "x·σ(2z)": tfm._gelu}
    print(f"tanh-GELU, {args.threads} thread(s), median of {args.repeats} interleaved rounds of {args.calls} calls\n")
    print("| shape | pass | torch (ms) | x·σ(2z) (ms) | ratio |")
    print("|---|---|---|---|---|")
    for shape in SHAPES:
        x = (2 * torch.randn(shape, generator=gen)).requires_grad_(True)
        g = torch.randn(shape, generator=gen)
        passes = {
            "forward + backward": {k: (lambda f=f: torch.autograd.grad(f(x), x, g)) for k, f in forms.items()},
            "forward, no autograd": {k: (lambda f=f: f(x.detach())) for k, f in forms.items()},
        }
        for name, fns in passes.items():
            times: dict[str, list[float]] = {k: [] for k in fns}
            for _ in range(args.repeats):
                for k, fn in fns.items():
                    times[k].append(round_ms(fn, args.calls))
            a, b = (statistics.median(times[k]) for k in fns)
            print(f"| {list(shape)} | {name} | {a:.3f} | {b:.3f} | {b / a:.2f} |")
    x = (4 * torch.randn(4, 900, 256, generator=gen)).requires_grad_(True)
    g = torch.randn(x.shape, generator=gen)
    x64 = x.detach().double().requires_grad_(True)
    c = math.sqrt(2 / math.pi)
    exact = x64 * F.logsigmoid(2 * c * (x64 + 0.044715 * x64 ** 3)).exp()   # σ(2z) through the log-sigmoid
    (d64,) = torch.autograd.grad(exact, x64, g.double())
    print("\nlargest absolute difference on 4·N(0, 1) inputs (forward / gradient):")
    for k, f in forms.items():
        y = f(x)
        (d,) = torch.autograd.grad(y, x, g)
        print(f"- {k} from float64: {(y.double() - exact).abs().max():.2e} / {(d.double() - d64).abs().max():.2e}")
    y_t, y_s = (f(x) for f in forms.values())
    print(f"- torch from x·σ(2z): {(y_t - y_s).abs().max():.2e}")


if __name__ == "__main__":
    main()
