"""How long `run --jobs` and `reproduce` take to start their worker processes (`targetpo.runs.workers`).

Each repeat is a fresh interpreter that starts --workers workers at once, --rounds times one after another (a
`reproduce` starts a worker per experiment; a test session many), each importing `targetpo.runs.runner` (what a
worker needs before its first unit), and times each round from the first start to the last exit. It does so with
the library's start method (fork server where the platform has one, with the runner preloaded) and with a fresh
interpreter per worker (spawn, what the library used before), interleaved repeat by repeat. The first round of
the fork server includes starting the server itself.

    python benchmarks/workers.py --workers 2 --rounds 4 --repeats 3
"""

from __future__ import annotations

import json
import statistics
import sys

from _args import Parser, positive_int  # benchmarks/ is on sys.path when run as a script
from _timing import run_timed

# Run with `python -c`: a worker re-imports a main *script* (spawn's rule), which would time this file's imports.
CHILD = """
import importlib, json, multiprocessing, sys, time
from targetpo.runs import workers
method, n, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
if method == "spawn":
    workers.CONTEXT = multiprocessing.get_context("spawn")
times = []
for _ in range(rounds):
    t0 = time.perf_counter()
    procs = [workers.start_worker(importlib.import_module, ("targetpo.runs.runner",), name=f"w{i}") for i in range(n)]
    for p in procs:
        p.join()
        assert p.exitcode == 0, p.exitcode
    times.append(time.perf_counter() - t0)
print(json.dumps({"method": workers.CONTEXT.get_start_method(), "rounds": times}))
"""


def main() -> None:
    parser = Parser(description=__doc__)
    parser.add_argument("--workers", type=positive_int, default=2, help="workers started at once (default 2)")
    parser.add_argument("--rounds", type=positive_int, default=4, help="rounds of starts in one interpreter "
                        "(default 4)")
    parser.add_argument("--repeats", type=positive_int, default=3, help="fresh interpreters per method, "
                        "interleaved (default 3)")
    args = parser.parse_args()
    results: dict[str, list[dict]] = {"library": [], "spawn": []}
    for _ in range(args.repeats):
        for method in results:
            out, wall, _ = run_timed([sys.executable, "-c", CHILD, method, str(args.workers), str(args.rounds)],
                                     capture_output=True, text=True)
            if out.returncode:
                sys.exit(f"the {method} child failed:\n{out.stderr}")
            results[method].append({**json.loads(out.stdout), "wall": wall})
    print(f"{args.workers} workers at once, {args.rounds} rounds, median of {args.repeats} fresh interpreters; "
          "seconds")
    print("| start method | first round | each later round | whole interpreter |")
    print("|---|---|---|---|")
    for method, runs in results.items():
        first = statistics.median(r["rounds"][0] for r in runs)
        later = statistics.median(t for r in runs for t in r["rounds"][1:]) if args.rounds > 1 else float("nan")
        print(f"| {runs[0]['method']} ({method}) | {first:.2f} | {later:.3f} | "
              f"{statistics.median(r['wall'] for r in runs):.2f} |")


if __name__ == "__main__":
    main()
