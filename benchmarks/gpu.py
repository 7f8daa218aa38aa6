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
   wall time, the peak GPU memory and the share of the preset's steps done.
3. Every run folder packed into one runs.tar.gz in --out, beside summary.md (the tables, also printed), so that
   `targetpo report` can be run on them elsewhere.

    python benchmarks/gpu.py --data-dir DIR_WITH_MNIST --out OUT --time-limit 150
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from _args import Parser, positive_int  # benchmarks/ is on sys.path when run as a script

from targetpo.experiments import EXPERIMENTS

ROOT = Path(__file__).resolve().parents[1]
SMOKE = ("mnist", "mnist-mechanism", "token-terminal", "token-dense")
PAIRED = ("mnist", "mnist-mechanism")  # same draws on every device (mnist.train.train)
PAPER = ("token-terminal", "token-dense", "mnist")


def run(name: str, preset: str, device: str, out: Path, data_dir: str | None, limit: float | None) -> dict:
    """One fresh `targetpo run`, stopped by SIGTERM after `limit` seconds: its run.json, with the whole command's
    seconds and exit code added."""
    cmd = [sys.executable, "-m", "targetpo.cli", "run", name, "--preset", preset, "--out", str(out), "--force",
           "--no-progress", "--no-report", "--device", device]
    cmd += ["--data-dir", data_dir] if data_dir and name.startswith("mnist") else []
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL)
    try:
        code = proc.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)  # the runner records "interrupted" and its wall time, keeping every line
        try:
            code = proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait()
    meta = json.loads((out / "run.json").read_text()) if (out / "run.json").exists() else {}
    return {**meta, "whole_s": time.perf_counter() - t0, "exit_code": code}


def steps_done(name: str, out: Path) -> tuple[int, int]:
    """(steps done, steps planned) over the run's units (targetpo.runs.runner.run_progress)."""
    from targetpo.experiments import load
    from targetpo.runs.config import config_from_dict
    from targetpo.runs.runner import run_progress, steps_of
    from targetpo.runs.store import Run

    exp, stored = load(name), Run.load(out)
    progress, cfg = run_progress(exp, stored), config_from_dict(exp, stored.config)
    done = sum(steps_of(exp, cfg, u) for u in progress.finished)
    done += sum(min(last + 1, n) for last, n in progress.partial.values())
    planned = done + sum(n - min(last + 1, n) for last, n in progress.partial.values())
    planned += sum(steps_of(exp, cfg, u) for u in progress.missing)
    return done, planned


def errors(out: Path) -> dict[tuple[int, str], list[float]]:
    """(step, metric) -> per-seed values of every `*.error` metric in a run's metrics.jsonl."""
    found = {}
    for line in (out / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        for k, v in rec.items():
            if k.endswith(".error") and isinstance(v, list):
                found[(rec["step"], k)] = v
    return found


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
    sys.path.insert(0, str(ROOT / "src"))
    import torch

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
              "| paper preset | status | runner wall (s) | whole command (s) | steps done | peak GPU memory (GiB) |",
              "|---|---|---|---|---|---|"]
    for exp in args.paper:
        folder = runs / f"{exp}-paper-{tag}"
        meta = run(exp, "paper", args.device, folder, args.data_dir, args.time_limit)
        done, planned = steps_done(exp, folder) if (folder / "metrics.jsonl").exists() else (0, 0)
        lines.append(f"| `{exp}` | {meta.get('status', 'no run.json')} | {meta.get('wall_time_s', float('nan')):.1f} | "
                     f"{meta['whole_s']:.1f} | {done:,} of {planned:,} | {gib(meta)} |")
        print(lines[-1], flush=True)
    with tarfile.open(out / "runs.tar.gz", "w:gz") as tar:
        tar.add(runs, arcname="runs")
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
