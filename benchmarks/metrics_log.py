"""Cost of one metrics record through the runner's log path (`RunContext.log` → `MetricsWriter.write`), the
record shape most experiments write: a step and two per-seed rows of float32.

    python benchmarks/metrics_log.py                 # 100 seeds, 5,000 records, median of 5 passes
    python benchmarks/metrics_log.py --seeds 20 --records 2000
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from _args import Parser, positive_int  # benchmarks/ is on sys.path when run as a script
from tqdm import tqdm

from targetpo.runs.runner import RunContext
from targetpo.runs.store import MetricsWriter


def us_per_record(seeds: int, records: int, repeats: int) -> list[float]:
    rng = np.random.default_rng(0)
    rows = (rng.random((records, seeds), dtype=np.float32), rng.random((records, seeds), dtype=np.float32) * 1e-3)
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(repeats):
            writer = MetricsWriter(Path(tmp) / f"metrics{r}.jsonl")
            ctx = RunContext("tpo", writer, tqdm(total=records, disable=True), torch.device("cpu"), {})
            t = time.perf_counter()
            for i in range(records):
                ctx.log({"step": i, "error": rows[0][i], "misalignment": rows[1][i]})
                ctx.advance()
            out.append((time.perf_counter() - t) / records * 1e6)
            writer.close()
    return out


def main() -> None:
    ap = Parser(description=__doc__)
    ap.add_argument("--seeds", type=positive_int, default=100, help="floats per row (per-seed values; default 100)")
    ap.add_argument("--records", type=positive_int, default=5000, help="records logged per timed pass; the time is "
                    "per record (default 5000)")
    ap.add_argument("--repeats", type=positive_int, default=5, help="timed passes, each into a fresh metrics file "
                    "(median reported; default 5)")
    args = ap.parse_args()
    times = us_per_record(args.seeds, args.records, args.repeats)
    print(f"{statistics.median(times):.1f} µs per record (median of {args.repeats}: "
          f"{' / '.join(f'{t:.1f}' for t in times)}), {args.seeds} seeds × 2 rows")


if __name__ == "__main__":
    main()
