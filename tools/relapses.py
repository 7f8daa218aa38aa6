"""Count relapses in per-seed error curves: after a seed first reaches `--solved` error, every later stretch
at or above `--relapse` (stretches closer than `--gap` episodes merged) is one relapse. The late-training
spikes of token-terminal (docs/experiments.md §E6) are such relapses.

    python tools/relapses.py RUN_DIR [--metric error]   # every unit of a stored run
    python tools/relapses.py FILE.npz                   # every [seeds, episodes] array named *_errors
                                                        # (the authors' saved hero-figure curves)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from targetpo.runs.config import OneLineParser


def relapses(errors: np.ndarray, solved: float = 0.01, relapse: float = 0.05, gap: int = 10
             ) -> list[tuple[int, float]] | None:
    """(first episode, peak error) of each relapse of one seed's curve [episodes]; None if it never reaches
    `solved`."""
    errors = np.asarray(errors, dtype=float)
    if errors.ndim != 1:
        raise ValueError(f"errors must be one seed's curve [episodes], got shape {errors.shape}")
    reached = np.flatnonzero(errors <= solved)
    if not reached.size:
        return None
    high = np.flatnonzero(errors[reached[0]:] >= relapse) + reached[0]
    events: list[list[int]] = []
    for t in high:
        if events and t - events[-1][-1] <= gap:
            events[-1].append(int(t))
        else:
            events.append([int(t)])
    return [(e[0], float(errors[e].max())) for e in events]


def summary(values: np.ndarray, solved: float, relapse: float, gap: int) -> str:
    """One line for a [episodes, seeds] array: seeds that reach `solved`, relapses per seed, largest peak."""
    per_seed = [relapses(values[:, s], solved, relapse, gap) for s in range(values.shape[1])]
    hit = [r for r in per_seed if r is not None]
    counts = [len(r) for r in hit]
    peaks = [p for r in hit for _, p in r]
    final = values[-1]
    return (f"{len(hit)}/{len(per_seed)} seeds reach ≤ {solved:g}; relapses ≥ {relapse:g} per such seed: "
            f"{counts} (total {sum(counts)})" + (f", highest peak {max(peaks):.3f}" if peaks else "")
            + f"; final error per seed {np.round(final, 4).tolist()}")


def _level(text: str) -> float:
    """An error level: a number in [0, 1]."""
    value = float(text)
    if not 0.0 <= value <= 1.0:  # also refuses nan
        raise argparse.ArgumentTypeError(f"{text!r} is not an error level in [0, 1]")
    return value


def _episodes(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is negative; give a number of episodes >= 0")
    return value


def main(argv: list[str] | None = None) -> int:
    ap = OneLineParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("source", help="a run folder (run.json + metrics.jsonl) or an .npz of [seeds, episodes] curves")
    ap.add_argument("--metric", default="error", help="the run metric to read (run folders only)")
    ap.add_argument("--solved", type=_level, default=0.01, help="error level in [0, 1] a seed must reach first")
    ap.add_argument("--relapse", type=_level, default=0.05, help="error level in [0, 1] that counts as a relapse "
                    "(above --solved)")
    ap.add_argument("--gap", type=_episodes, default=10, help="relapse stretches this close (episodes) are one")
    args = ap.parse_args(argv)
    if args.relapse <= args.solved:
        ap.error(f"--relapse {args.relapse:g} must be above --solved {args.solved:g}")
    src = Path(args.source)
    if not src.exists():
        ap.error(f"{src}: no such run folder or .npz file")
    if src.suffix == ".npz":
        data = np.load(src)
        series = {k: np.asarray(data[k], dtype=float).T for k in data.files if k.endswith("_errors")}
    else:
        from targetpo.runs.stats import curves
        from targetpo.runs.store import Run

        run = Run.load(src)
        try:
            series = {u: c.values for u, c in curves(run, args.metric).items()}
        except (KeyError, ValueError) as exc:
            ap.error(f"--metric {args.metric!r}: {exc}")
    if not series:
        ap.error(f"{src}: no per-seed curves found (npz: arrays named *_errors; run: metric {args.metric!r})")
    for name, values in series.items():
        print(f"{name}: {summary(values, args.solved, args.relapse, args.gap)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
