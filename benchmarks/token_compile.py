"""What `torch.compile` (inductor, CPU) would buy the token engine on this machine: one full causal pass of the
authors' transformer (forward and backward through `targetpo.tokens.transformer.forward`, the engine's own code)
eager against compiled with dynamic shapes, at the shapes of the smoke configuration (BENCHMARKS.md, "Eleventh
session").

The engine's non-GEMM work (the tanh-GELU and its backward, LayerNorm, softmax, concatenations) is what a
compiler fuses; its GEMMs already run near this CPU's per-core peak. Compiled kernels round differently, so a
compiled engine would move every record; this measures whether it would pay first. Prints the first call's
compile time, a second row count's (dynamic shapes: no recompile expected), the median step time of each
(`--repeats` rounds of `--calls` steps, interleaved) and the largest gradient difference.

    python benchmarks/token_compile.py --threads 1
    python benchmarks/token_compile.py --threads 2 --seeds 4
"""

from __future__ import annotations

import logging
import statistics
import time

import torch
from _args import Parser, int_at_least, positive_int  # benchmarks/ is on sys.path when run as a script
from tokens import SMOKE  # the configuration benchmarks/tokens.py times

from targetpo.tokens import engine as te
from targetpo.tokens import transformer as tfm


def main() -> None:
    parser = Parser(description=__doc__)
    parser.add_argument("--threads", type=positive_int, default=1, help="torch threads (default 1, as reproduce's "
                        "workers)")
    parser.add_argument("--seeds", type=positive_int, default=2, help="models batched on the seed axis (default 2)")
    parser.add_argument("--rows", type=int_at_least(8), default=100, help="sequences per seed (default 100: the "
                        "smoke configuration's prompts; the second row count is 7 fewer)")
    parser.add_argument("--length", type=positive_int, default=10, help="H: prompt and answer length (default 10)")
    parser.add_argument("--calls", type=positive_int, default=10, help="steps per timed round (default 10)")
    parser.add_argument("--repeats", type=positive_int, default=5, help="interleaved rounds (default 5)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    cfg = te.trial_config(SMOKE, length=args.length)
    spec = te.model_spec(cfg)
    params = tfm.init_params(spec, list(range(args.seeds)))
    for p in params.values():
        p.requires_grad_(True)
    names = list(params)
    gen = torch.Generator().manual_seed(0)

    def batch(rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        tokens = torch.randint(0, cfg.vocab, (args.seeds, rows, 2 * args.length), generator=gen)
        weights = torch.randn(args.seeds, rows, args.length, cfg.vocab, generator=gen)
        return tokens, weights

    def step(fn, tokens, weights):
        logp = fn(params, tokens, spec, out_from=args.length)
        loss = (logp * weights).sum()
        return torch.autograd.grad(loss, [params[k] for k in names])

    # The causal mask's `bool(m.any())` (cached per shape) is a graph break; dynamo warns of it at length.
    logging.getLogger("torch._dynamo").setLevel(logging.ERROR)
    compiled = torch.compile(tfm.forward, dynamic=True)
    tokens, weights = batch(args.rows)
    t0 = time.perf_counter()
    step(compiled, tokens, weights)
    first = time.perf_counter() - t0
    other = batch(args.rows - 7)
    t0 = time.perf_counter()
    step(compiled, *other)
    second = time.perf_counter() - t0
    step(tfm.forward, tokens, weights)
    times: dict[str, list[float]] = {"eager": [], "compiled": []}
    for _ in range(args.repeats):
        for name, fn in (("eager", tfm.forward), ("compiled", compiled)):
            t0 = time.perf_counter()
            for _ in range(args.calls):
                step(fn, tokens, weights)
            times[name].append((time.perf_counter() - t0) / args.calls)
    diff = max((a - b).abs().max().item() for a, b in zip(step(tfm.forward, tokens, weights),
                                                            step(compiled, tokens, weights)))
    eager, comp = statistics.median(times["eager"]), statistics.median(times["compiled"])
    print(f"full causal pass, forward + backward: {args.seeds} seeds × {args.rows} rows × {2 * args.length} tokens, "
          f"{args.threads} thread(s), median of {args.repeats} rounds of {args.calls} steps\n")
    print(f"first compiled call {first:.1f} s; another row count {second:.2f} s")
    print(f"eager {1e3 * eager:.2f} ms, compiled {1e3 * comp:.2f} ms: compiled / eager {comp / eager:.2f}")
    print(f"largest gradient difference {diff:.2e}")


if __name__ == "__main__":
    main()
