"""Wall time of `targetpo report` over a folder of finished runs (e.g. a `make reproduce` results folder).

Each repeat copies the runs to a temporary folder (the report writes REPORT.md and its plots beside them) and
runs a fresh `targetpo report` there; the table gives medians of the whole command. With --src A --src B the same
report is written from two source trees, interleaved repeat by repeat, and their REPORT.md compared (the
"Generated <time>" line aside). --sections times each run's section in this process (this checkout's code).

    python benchmarks/report.py results --repeats 3
    python benchmarks/report.py results --repeats 3 --src /tmp/old/src --src src
    python benchmarks/report.py results --sections
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _args import Parser, positive_int, src_folder  # benchmarks/ is on sys.path when run as a script
from _timing import run_timed

ROOT = Path(__file__).resolve().parents[1]


def report_once(src: Path, runs: Path, scratch: Path) -> tuple[float, float, list[str]]:
    """(wall seconds, CPU seconds, REPORT.md lines without the "Generated" line) of one fresh report of a copy
    of `runs` made in `scratch`."""
    if scratch.exists():
        shutil.rmtree(scratch)
    shutil.copytree(runs, scratch, ignore=shutil.ignore_patterns("*.png", "REPORT.md"))
    cmd = [sys.executable, "-m", "targetpo.cli", "report", str(scratch)]
    _, wall, cpu = run_timed(cmd, env={**os.environ, "PYTHONPATH": str(src)}, check=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    lines = (scratch / "REPORT.md").read_text().splitlines()
    return wall, cpu, [line for line in lines if not line.startswith("Generated ")]


def section_seconds(runs: Path, scratch: Path) -> list[tuple[str, float]]:
    """Seconds of each run's section (statistics, tables and plots), this checkout's code, one process."""
    sys.path.insert(0, str(ROOT / "src"))
    import matplotlib

    matplotlib.use("Agg")
    from targetpo.report import build_section, find_runs
    from targetpo.runs.store import Run

    scratch.mkdir(parents=True, exist_ok=True)
    out = []
    for path in find_runs(runs):
        t0 = time.perf_counter()
        build_section(Run.load(path), scratch)
        out.append((path.name, time.perf_counter() - t0))
    return out


def main() -> None:
    ap = Parser(description=__doc__)
    ap.add_argument("runs", type=Path, help="a folder of finished runs (any folder `targetpo report` reads)")
    ap.add_argument("--repeats", type=positive_int, default=3, help="fresh reports per source tree (median "
                    "reported; default 3)")
    ap.add_argument("--src", action="append", type=src_folder, default=None,
                    help="a source tree's src/ folder (repeatable; default: this checkout's)")
    ap.add_argument("--sections", action="store_true", help="also time each run's section in this process")
    args = ap.parse_args()
    if not args.runs.is_dir():
        ap.error(f"runs: {args.runs} is not a folder")
    srcs = [Path(s).resolve() for s in (args.src or [ROOT / "src"])]
    with tempfile.TemporaryDirectory(prefix="targetpo-report-") as tmp:
        times: list[list[tuple[float, float]]] = [[] for _ in srcs]
        texts: list[list[str]] = [[] for _ in srcs]
        for _ in range(args.repeats):
            for i, src in enumerate(srcs):
                wall, cpu, texts[i] = report_once(src, args.runs, Path(tmp) / f"runs-{i}")
                times[i].append((wall, cpu))
        same = "" if len(srcs) == 1 else ("identical" if all(t == texts[0] for t in texts) else "DIFFERENT")
        print(f"median of {args.repeats} reports each, load average at the end {os.getloadavg()[0]:.1f} on "
              f"{os.cpu_count()} cores")
        print("\n| tree | whole command (s) | CPU (s) | all (s) | REPORT.md |\n|---|---|---|---|---|")
        for src, t in zip(srcs, times):
            print(f"| {src.parent.name if len(srcs) > 1 else 'this checkout'} | "
                  f"{statistics.median(w for w, _ in t):.2f} | {statistics.median(c for _, c in t):.2f} | "
                  f"{', '.join(f'{w:.2f}' for w, _ in t)} | {same} |")
        if args.sections:
            rows = section_seconds(args.runs, Path(tmp) / "sections")
            print("\n| run | section (s) |\n|---|---|")
            print("\n".join(f"| {name} | {s:.2f} |" for name, s in rows))
            print(f"| all | {sum(s for _, s in rows):.2f} |")


if __name__ == "__main__":
    main()
