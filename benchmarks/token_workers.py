"""Would the token smoke configuration gain from two 1-thread workers that each run a stack of models?

One 1-thread process with 4 seeds stacked costs less per seed-episode than one 2-thread process with 2 seeds
(`token_seeds.py`), so the configuration's four methods × 2 seeds, batched as two stacks of 4 models and run in
two 1-thread processes at once, might beat the one 2-thread process that `benchmarks/tokens.py` times. This
measures the best case without writing that engine: (a) the configuration as `tokens.py` runs it (one process,
2 threads, each method's 2 seeds vectorised, the methods one after another) against (b) two 1-thread processes
started together, one running `tpo_token` with 4 seeds (a stand-in for {tpo_token, grpo_token} × 2 seeds, whose
episodes cost about the same), the other `ppo` with 4 seeds and then `dg` with 2 (for {ppo, dg} × 2, DG's three
missing epochs left out). A stacked engine would add DG's padding and per-method losses, so (b) bounds it from
below. Rounds alternate (a) and (b); each run is a fresh interpreter.

    python benchmarks/token_workers.py --repeats 3
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time

from _args import Parser, positive_int  # benchmarks/ is on sys.path when run as a script
from tokens import TOKEN_METHODS

# One process: `threads` torch threads, then each "method:seed,seed" trial of the smoke configuration in turn; run
# from benchmarks/, so it imports the configuration from tokens.py.
_CHILD = """
import json, sys, time, torch
torch.set_num_threads(int(sys.argv[1]))
from targetpo.tokens import engine as te
from tokens import SMOKE
t0 = time.perf_counter()
for spec in sys.argv[2:]:
    method, seeds = spec.split(":")
    te.run_trial(SMOKE, method, [int(s) for s in seeds.split(",")])
print(json.dumps({"wall": time.perf_counter() - t0}))
"""

ONE_PROCESS = [("2", *(f"{m}:0,1" for m in TOKEN_METHODS))]
TWO_WORKERS = [("1", "tpo_token:0,1,2,3"), ("1", "ppo:0,1,2,3", "dg:0,1")]


def timed_together(children: list[tuple[str, ...]]) -> tuple[float, list[float]]:
    """Start every child at once; the wall seconds until the last ends, and each child's own seconds."""
    t0 = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, "-c", _CHILD, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, cwd=sys.path[0]) for args in children]
    outs = [p.communicate() for p in procs]
    wall = time.perf_counter() - t0
    for p, (out, err), args in zip(procs, outs, children):
        if p.returncode:
            raise RuntimeError(f"child {' '.join(args)} failed:\n{err.strip()}")
    return wall, [json.loads(out.strip().splitlines()[-1])["wall"] for out, _ in outs]


def main() -> None:
    parser = Parser(description=__doc__)
    parser.add_argument("--repeats", type=positive_int, default=3, help="rounds of (a) then (b) (default 3)")
    args = parser.parse_args()
    walls: dict[str, list[float]] = {"one": [], "two": []}
    for r in range(args.repeats):
        for name, children in (("one", ONE_PROCESS), ("two", TWO_WORKERS)):
            wall, own = timed_together(children)
            walls[name].append(wall)
            print(f"round {r}: {name:3} {wall:5.1f} s wall (children {', '.join(f'{x:.1f}' for x in own)} s)",
                  flush=True)
    one, two = statistics.median(walls["one"]), statistics.median(walls["two"])
    print(f"one 2-thread process {one:.1f} s, two 1-thread 4-model workers {two:.1f} s (medians of "
          f"{args.repeats}): {two / one:.2f}x")


if __name__ == "__main__":
    main()
