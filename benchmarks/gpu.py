"""What a machine with a CUDA device runs first, in one call: do the experiments run there, and how long do the
paper presets take (wall time, peak GPU memory, how much of each was done within a time limit).

1. Smoke presets of `mnist`, `mnist-mechanism`, `token-terminal` and `token-dense` on the device: each must end
   complete. `mnist` and `mnist-mechanism` also run on the CPU: both devices start from the same weights and see
   the same minibatches and action noise (drawn on the CPU), so their test errors differ only through the
   arithmetic's rounding; the table gives the largest difference of any seed's error at any evaluation. (The
   token experiments draw their samples with the device's own generators, so their two runs are not paired.)
2. Paper presets (default `token-terminal`, `token-dense`, `mnist`), each stopped by SIGTERM after --time-limit
   seconds if it has not ended: run.json then says "interrupted", every record is kept, and
   `targetpo run NAME --preset paper --out DIR --device cuda --resume` continues it. The table gives the runner's
   wall time, the peak GPU memory and how far the run got.
3. Every run folder packed into one runs.tar.gz in --out, beside summary.md (the tables, also printed), so that
   `targetpo report` can be run on them elsewhere.

    python benchmarks/gpu.py --data-dir DIR_WITH_MNIST --out OUT --time-limit 150
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import torch
from _args import Parser, positive_int  # benchmarks/ is on sys.path when run as a script
from _timing import run_timed
from presets import run_command

from targetpo.experiments import EXPERIMENTS, load
from targetpo.runs.runner import run_progress
from targetpo.runs.store import Run

ROOT = Path(__file__).resolve().parents[1]
SMOKE = ("mnist", "mnist-mechanism", "token-terminal", "token-dense")
PAIRED = ("mnist", "mnist-mechanism")  # same draws on every device (mnist.train.train)
PAPER = ("token-terminal", "token-dense", "mnist")


def run(name: str, preset: str, device: str, out: Path, data_dir: str | None, limit: float | None) -> dict:
    """One fresh `targetpo run` (benchmarks/presets.py's command), stopped by SIGTERM after `limit` seconds: its
    run.json, with the whole command's seconds and exit code added."""
    extra = ["--device", device] + (["--data-dir", data_dir] if data_dir and name.startswith("mnist") else [])
    cmd, env = run_command(ROOT / "src", name, preset, out, extra)
    done, whole, _ = run_timed(cmd, stop_after=limit, env=env, stdout=subprocess.DEVNULL)
    meta = json.loads((out / "run.json").read_text()) if (out / "run.json").exists() else {}
    return {**meta, "whole_s": whole, "exit_code": done.returncode}


def progress_text(name: str, out: Path) -> str:
    """How far a run got (targetpo.runs.runner.run_progress): units finished, and each partial unit's last logged
    step against its planned steps (a step as the experiment counts it: an update for mnist, an episode from 0 for
    the token experiments)."""
    progress = run_progress(load(name), Run.load(out))
    planned = len(progress.finished) + len(progress.partial) + len(progress.missing)
    partial = "".join(f"; {u} at {last:,} of {n:,}" for u, (last, n) in progress.partial.items())
    return f"{len(progress.finished)} of {planned} units finished{partial}"


def errors(out: Path) -> dict[tuple[int, str], list[float]]:
    """(step, metric) -> per-seed values of every `*.error` metric of a run."""
    return {(r["step"], k): v for r in Run.load(out).records for k, v in r.items()
            if k.endswith(".error") and isinstance(v, list)}


def largest_difference(a: Path, b: Path) -> float:
    ea, eb = errors(a), errors(b)
    if set(ea) != set(eb) or not ea:
        return float("inf")
    return max(abs(x - y) for k in ea for x, y in zip(ea[k], eb[k], strict=True))


def share(text: str) -> float:
    """A `type=` for a number in [0, 1] (an error-rate difference)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be between 0 and 1")
    return value


def gib(meta: dict) -> str:
    peak = meta.get("peak_gpu_memory_bytes")
    return "–" if peak is None else f"{peak / 2**30:.2f}"


def main() -> None:
    ap = Parser(description=__doc__)
    ap.add_argument("--out", required=True, help="where summary.md and runs.tar.gz go")
    ap.add_argument("--data-dir", default=None, help="the MNIST IDX files (passed to the mnist runs)")
    ap.add_argument("--device", default="cuda", help="the accelerator (default cuda)")
    ap.add_argument("--time-limit", type=positive_int, default=150,
                    help="seconds after which a paper preset's run is stopped (default 150)")
    ap.add_argument("--paper", nargs="*", default=list(PAPER), metavar="NAME", choices=EXPERIMENTS,
                    help=f"experiments whose paper preset is timed (default: {' '.join(PAPER)}; none: skip)")
    ap.add_argument("--tolerance", type=share, default=0.05,
                    help="largest allowed difference of a seed's test error between the CPU and the device in the "
                    "paired smoke runs (default 0.05)")
    args = ap.parse_args()

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        ap.error(f"--device {args.device}: torch {torch.__version__} sees no CUDA device here")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    runs = Path(tempfile.mkdtemp(prefix="targetpo-gpu-"))
    name = torch.cuda.get_device_name() if args.device.startswith("cuda") else args.device
    lines = [f"device: {name}; torch {torch.__version__}; python {sys.version.split()[0]}", "",
             "| smoke preset | device status | device wall (s) | cpu wall (s) | largest error difference | peak GPU "
             "memory (GiB) |", "|---|---|---|---|---|---|"]
    failed, tag = False, args.device.replace(":", "")  # run folders: NAME-PRESET-DEVICE
    for exp in SMOKE:
        dev = run(exp, "smoke", args.device, runs / f"{exp}-smoke-{tag}", args.data_dir, None)
        cpu_wall, diff = "–", "–"
        ok = dev.get("status") == "complete"
        if exp in PAIRED:
            reference = runs / f"{exp}-smoke-cpu-reference"
            cpu = run(exp, "smoke", "cpu", reference, args.data_dir, None)
            cpu_wall = f"{cpu.get('wall_time_s', float('nan')):.1f}"
            d = largest_difference(runs / f"{exp}-smoke-{tag}", reference) if ok else float("inf")
            diff = f"{d:.3f}"
            ok = ok and d <= args.tolerance
        failed |= not ok
        lines.append(f"| `{exp}` | {dev.get('status', 'no run.json')} (exit {dev['exit_code']}) | "
                     f"{dev.get('wall_time_s', float('nan')):.1f} | {cpu_wall} | {diff} | {gib(dev)} |")
        print(lines[-1], flush=True)
    lines += ["", f"Paper presets, each stopped after {args.time_limit} s if it had not ended:", "",
              "| paper preset | status | runner wall (s) | whole command (s) | progress | peak GPU memory (GiB) |",
              "|---|---|---|---|---|---|"]
    for exp in args.paper:
        folder = runs / f"{exp}-paper-{tag}"
        meta = run(exp, "paper", args.device, folder, args.data_dir, args.time_limit)
        done = progress_text(exp, folder) if (folder / "metrics.jsonl").exists() else "nothing logged"
        lines.append(f"| `{exp}` | {meta.get('status', 'no run.json')} | {meta.get('wall_time_s', float('nan')):.1f} | "
                     f"{meta['whole_s']:.1f} | {done} | {gib(meta)} |")
        print(lines[-1], flush=True)
    with tarfile.open(out / "runs.tar.gz", "w:gz") as tar:
        tar.add(runs, arcname="runs")
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
