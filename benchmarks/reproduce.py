"""Wall time of the whole `targetpo reproduce` (cpu presets of a suite, report included), median of --repeats runs.

Each repeat is a fresh `targetpo reproduce --out DIR/run-i --fresh --no-progress` in its own interpreter (the venv
already installed); the table gives each run's wall and CPU seconds (user + sys of the whole process tree) and the
report's headline verdict counts, which must be the same in every run (the runs are deterministic).

    python benchmarks/reproduce.py --repeats 3 --data-dir ../shared/data/mnist
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from _args import Parser, positive_int  # benchmarks/ is on sys.path when run as a script
from _timing import run_timed

ROOT = Path(__file__).resolve().parents[1]
HEADLINE = re.compile(r"\*\*(\d+ PASS, \d+ FAIL[^*]*)\*\*")


def run_once(out: Path, args: argparse.Namespace) -> tuple[float, float, str]:
    cmd = [sys.executable, "-m", "targetpo.cli", "reproduce", "--out", str(out), "--fresh", "--no-progress",
           "--suite", args.suite]
    cmd += ["--jobs", str(args.jobs)] if args.jobs else []
    cmd += ["--data-dir", args.data_dir] if args.data_dir else []
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    _, wall, cpu = run_timed(cmd, env=env, check=True, stdout=subprocess.DEVNULL)
    m = HEADLINE.search((out / "REPORT.md").read_text())
    return wall, cpu, (m.group(1) if m else "headline not found")


def main() -> None:
    sys.path.insert(0, str(ROOT / "src"))  # SUITES of this checkout, the one the runs use
    from targetpo.experiments import SUITES

    ap = Parser(description=__doc__)
    ap.add_argument("--repeats", type=positive_int, default=3, help="fresh `targetpo reproduce` runs (median "
                    "reported; default 3)")
    ap.add_argument("--suite", default="paper", choices=list(SUITES), help="passed to reproduce: which experiments "
                    "(default paper): " + "; ".join(f"{k}: {v}" for k, v in SUITES.items()))
    ap.add_argument("--jobs", type=positive_int, default=None, help="passed to reproduce (default: its own, the CPU "
                    "cores)")
    ap.add_argument("--data-dir", default=None, help="MNIST folder, passed to reproduce")
    ap.add_argument("--out", default=None, help="where the runs go (default: a temporary directory)")
    args = ap.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="targetpo-reproduce-"))
    rows = []
    for i in range(args.repeats):
        wall, cpu, verdicts = run_once(out / f"run-{i}", args)
        rows.append((wall, cpu, verdicts))
        print(f"run {i}: {wall / 60:.1f} min wall, {cpu / 60:.1f} min CPU, {verdicts}", flush=True)
    print(f"\nmedian of {args.repeats}: {statistics.median(r[0] for r in rows) / 60:.1f} min wall, "
          f"{statistics.median(r[1] for r in rows) / 60:.1f} min CPU; load average at the end "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; verdicts the same in every run: "
          f"{len({r[2] for r in rows}) == 1}")


if __name__ == "__main__":
    main()
