"""Wall time of whole experiment presets: the runner's `wall_time_s` (run.json) and the whole command.

Each repeat is a fresh `targetpo run NAME --preset P --force --no-progress --no-report` in its own interpreter
(the runner's defaults unless --threads / --jobs: every idle core, as threads of one process or, for experiments
whose units run apart, as one worker process each); the table gives medians. With --src A --src B the same
presets run from two source trees (e.g. a checkout of an older commit), interleaved repeat by repeat so that both
see the same machine load, and their metrics.jsonl are compared record by record (wall_* keys ignored). --jobs 1 --jobs 2
does the same for `run --jobs` values (one process with every core's threads vs two 1-thread worker processes).

    python benchmarks/presets.py tabular-single:paper tabular-multi:paper --repeats 3
    python benchmarks/presets.py mnist:paper --repeats 3 --data-dir ../shared/data/mnist
    python benchmarks/presets.py token-sweeps --repeats 3 --jobs 1 --jobs 2
    python benchmarks/presets.py token-terminal:paper mnist:paper --device cuda --data-dir ../shared/data/mnist

On a CUDA device the table adds the peak GPU memory each run recorded in run.json (the largest of the repeats).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from _args import Parser, positive_int, src_folder  # benchmarks/ is on sys.path when run as a script
from _timing import run_timed

ROOT = Path(__file__).resolve().parents[1]


def run_command(src: Path, name: str, preset: str, out: Path, extra: list[str]) -> tuple[list[str], dict[str, str]]:
    """(command, environment) of one fresh `targetpo run NAME --preset PRESET` into `out` from the tree `src`."""
    cmd = [sys.executable, "-m", "targetpo.cli", "run", name, "--preset", preset, "--out", str(out), "--force",
           "--no-progress", "--no-report", *extra]
    return cmd, {**os.environ, "PYTHONPATH": str(src)}


def run_once(src: Path, name: str, preset: str, out: Path, extra: list[str]) -> tuple[float, float, float, int | None]:
    """(runner wall_time_s, whole-command seconds, whole-command CPU seconds, peak GPU memory in bytes or None off
    a GPU) of one fresh run. On a shared machine the CPU time (user + sys) is the steadier number: it leaves out
    the time spent waiting for a core."""
    cmd, env = run_command(src, name, preset, out, extra)
    _, whole, cpu = run_timed(cmd, env=env, check=True, stdout=subprocess.DEVNULL)
    meta = json.loads((out / "run.json").read_text())
    return meta["wall_time_s"], whole, cpu, meta.get("peak_gpu_memory_bytes")


def stable_lines(path: Path) -> list[dict]:
    """The records without their wall_* keys, in (unit, step) order: units computed side by side interleave
    their lines, which changes the file's order but not a record."""
    recs = [{k: v for k, v in json.loads(line).items() if not k.startswith("wall_")}
            for line in path.read_text().splitlines()]
    return sorted(recs, key=lambda r: (str(r.get("unit")), r.get("step", -1), str(r.get("event"))))


def preset_arg(text: str) -> tuple[str, str]:
    """NAME[:PRESET] -> (name, preset): an experiment of this checkout and one of its presets (a bare NAME: cpu),
    refused here rather than by the first run's traceback."""
    if str(ROOT / "src") not in sys.path:
        sys.path.insert(0, str(ROOT / "src"))
    from targetpo.experiments import EXPERIMENTS, load

    name, _, preset = text.partition(":")
    if name not in EXPERIMENTS:
        raise argparse.ArgumentTypeError(f"{text!r}: unknown experiment {name!r}; available: "
                                         f"{', '.join(EXPERIMENTS)}")
    presets = load(name).PRESETS
    if (preset or "cpu") not in presets:
        raise argparse.ArgumentTypeError(f"{text!r}: experiment {name} has no preset {preset!r}; available: "
                                         f"{', '.join(presets)}")
    return name, preset


def main() -> None:
    ap = Parser(description=__doc__)
    ap.add_argument("presets", nargs="+", metavar="NAME:PRESET", type=preset_arg,
                    help="experiment and preset to time, e.g. mnist:paper (a bare NAME runs its cpu preset)")
    ap.add_argument("--repeats", type=positive_int, default=3, help="fresh runs of each preset per source tree "
                    "(median reported; default 3)")
    ap.add_argument("--src", action="append", type=src_folder, default=None,
                    help="a source tree's src/ folder (repeatable; "
                    "default: this checkout's)")
    ap.add_argument("--data-dir", default=None, help="passed to experiments that read MNIST")
    ap.add_argument("--threads", type=positive_int, default=None, help="torch threads per run (default: the "
                    "runner's: the idle cores)")
    ap.add_argument("--jobs", action="append", type=positive_int, default=None, help="run --jobs value "
                    "(repeatable: each value is timed, interleaved, and its metrics compared; default: run's own, 1)")
    ap.add_argument("--device", default=None, help="passed to every run (e.g. cuda); default: the CPU")
    ap.add_argument("--out", default=None, help="where the runs go (default: a temporary directory)")
    args = ap.parse_args()
    srcs = [Path(s).resolve() for s in (args.src or [ROOT / "src"])]
    variants = [(s, j) for s in srcs for j in (args.jobs or [None])]  # timed interleaved, repeat by repeat
    out = Path(args.out or tempfile.mkdtemp(prefix="targetpo-presets-"))
    rows = []
    for name, preset in args.presets:
        extra = ["--data-dir", args.data_dir] if args.data_dir and name.startswith("mnist") else []
        extra += ["--threads", str(args.threads)] if args.threads else []
        extra += ["--device", args.device] if args.device else []
        times: list[list[tuple]] = [[] for _ in variants]
        for r in range(args.repeats):
            for i, (s, jobs) in enumerate(variants):
                times[i].append(run_once(s, name, preset or "cpu", out / f"{name}-{preset}-{i}",
                                         extra + (["--jobs", str(jobs)] if jobs else [])))
        same = ""
        if len(variants) > 1:
            ref = stable_lines(out / f"{name}-{preset}-0" / "metrics.jsonl")
            same = all(stable_lines(out / f"{name}-{preset}-{i}" / "metrics.jsonl") == ref
                       for i in range(1, len(variants)))
            same = "identical" if same else "DIFFERENT"
        for i, (s, jobs) in enumerate(variants):
            wall = statistics.median(t[0] for t in times[i])
            whole = statistics.median(t[1] for t in times[i])
            cpu = statistics.median(t[2] for t in times[i])
            peaks = [t[3] for t in times[i] if t[3] is not None]
            gpu = f" {max(peaks) / 2**30:.2f} |" if peaks else ""
            tree = " ".join(x for x in (s.parent.name if len(srcs) > 1 else "", f"--jobs {jobs}" if jobs else "") if x)
            rows.append(f"| `{name}` | {preset} | {tree} | {wall:.2f} | {whole:.2f} | {cpu:.2f} | "
                        f"{', '.join(f'{t[0]:.2f}' for t in times[i])} | {same} |{gpu}")
    threads = args.threads or len(os.sched_getaffinity(0))
    print(f"median of {args.repeats} runs each, {threads} torch thread(s), load average at the end "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    gpu = " peak GPU memory (GiB) |" if args.device and args.device.startswith("cuda") else ""
    print("\n| experiment | preset | tree / jobs | wall_time_s | whole command (s) | whole command CPU (s) | all wall_time_s "
          "| metrics |" + gpu)
    print("|---|---|---|---|---|---|---|---|" + ("---|" if gpu else ""))
    print("\n".join(rows))


if __name__ == "__main__":
    main()
