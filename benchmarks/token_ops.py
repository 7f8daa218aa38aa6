"""The token engine's heaviest ops timed inside a training episode and alone on the same shapes (BENCHMARKS.md,
"Where the rest of the time goes").

A dispatch hook times every call of the listed ops during `--episodes` episodes of one method of the authors'
smoke configuration (H = 10, V = 2, B = 100, K = 8, 2 seeds); then each of the `--top` costliest (op, shapes,
strides) is re-run alone in a loop on fresh inputs of the same shapes and strides. A ratio above 1 is time the
op loses to its surroundings (cache misses, thread hand-offs), which only fused or cache-blocked kernels recover.
First it times the episodes without the hook, so a preloaded allocator can be compared side by side:

    python benchmarks/token_ops.py --threads 2 --method tpo_token
    LD_PRELOAD=/lib/x86_64-linux-gnu/libtcmalloc.so.4 python benchmarks/token_ops.py --threads 2
"""

from __future__ import annotations

import collections
import resource
import statistics
import time

import torch
from _args import Parser, nonnegative_int, positive_int  # benchmarks/ is on sys.path when run as a script
from torch.utils._python_dispatch import TorchDispatchMode

from targetpo.tokens import engine as te

OPS = ("aten.bmm", "aten.baddbmm", "aten.gelu", "aten.gelu_backward", "aten.native_layer_norm", "aten._softmax")


class OpTimer(TorchDispatchMode):
    """Wall time of each (op, shapes, strides) of the listed ops, the example arguments of its first call."""

    def __init__(self):
        super().__init__()
        self.calls: dict[tuple, list] = collections.defaultdict(lambda: [0, 0.0, None])

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if str(func).rsplit(".", 1)[0] not in OPS:
            return func(*args, **kwargs)
        key = (str(func),) + tuple((tuple(a.shape), a.stride()) if isinstance(a, torch.Tensor) else repr(a)
                                   for a in args)
        t0 = time.perf_counter()
        out = func(*args, **kwargs)
        entry = self.calls[key]
        entry[0] += 1
        entry[1] += time.perf_counter() - t0
        if entry[2] is None:
            entry[2] = (func, args, kwargs)
        return out


def alone_us(func, args, kwargs, repeats: int = 50) -> float:
    """Median µs of `func` on fresh tensors shaped and strided like `args`, run back to back."""
    fresh = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]  # clone keeps a dense tensor's strides
    for _ in range(5):
        func(*fresh, **kwargs)
    runs = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(repeats):
            func(*fresh, **kwargs)
        runs.append((time.perf_counter() - t0) / repeats * 1e6)
    return statistics.median(runs)


def main() -> None:
    ap = Parser(description=__doc__)
    ap.add_argument("--threads", type=positive_int, default=2, help="torch threads (default 2)")
    ap.add_argument("--method", default="tpo_token", choices=list(te.METHODS), metavar="METHOD",
                    help=f"token-experiment method: {', '.join(te.METHODS)} (default tpo_token)")
    ap.add_argument("--episodes", type=positive_int, default=10, help="episodes timed after a warm-up run (default 10)")
    ap.add_argument("--top", type=nonnegative_int, default=8,
                    help="how many of the costliest (op, shapes) to re-time alone (default 8; a large N: all; 0: "
                    "only the episode time)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    cfg = te.TrialConfig(task="reverse_copy", reward="bag", length=10, vocab=2, batch=100, k=8,
                         episodes=args.episodes)
    te.run_trial(te.trial_config(cfg, episodes=2), args.method, [0, 1])  # warm-up
    before, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    te.run_trial(cfg, args.method, [0, 1])  # unhooked, for the episode's own time (e.g. under another malloc)
    wall, after = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF)
    print(f"{args.method}, {args.threads} threads: {wall / args.episodes * 1e3:.1f} ms an episode, "
          f"{(after.ru_minflt - before.ru_minflt) / args.episodes:.0f} minor page faults an episode")
    timer = OpTimer()
    with timer:
        te.run_trial(cfg, args.method, [0, 1])
    rows = sorted(timer.calls.items(), key=lambda kv: -kv[1][1])[:args.top]
    print("| op | shapes | calls | in episode (µs) | alone (µs) | ratio |")
    print("|---|---|---|---|---|---|")
    sum_inside = sum_alone = 0.0
    for key, (n, total, (func, fargs, fkwargs)) in rows:
        inside = total / n * 1e6
        alone = alone_us(func, fargs, fkwargs)
        sum_inside, sum_alone = sum_inside + total * 1e6, sum_alone + n * alone
        shapes = ", ".join(str(list(k[0])) for k in key[1:] if isinstance(k, tuple))
        print(f"| {key[0]} | {shapes} | {n} | {inside:.0f} | {alone:.0f} | {inside / alone:.2f} |")
    print(f"these {len(rows)} rows: {sum_inside / args.episodes / 1e3:.1f} ms an episode inside, "
          f"{sum_alone / args.episodes / 1e3:.1f} ms alone")


if __name__ == "__main__":
    main()
