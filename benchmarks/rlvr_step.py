"""Per-step time of the RLVR trainer on the `cpu` preset's tiny model: rollout (generate + scoring + old
log-probs) and update, for TPO (sum, mean) and GRPO, at 1 and 2 torch threads.

Settings interleave within one process (each repetition runs every setting once), so machine noise hits all
alike; times are medians. The model is the preset's untrained tiny Qwen2 (the step cost does not depend on the
weights except through completion lengths, which max_new_tokens bounds).

    python benchmarks/rlvr_step.py --repeats 15
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch
from _args import Parser, positive_int  # benchmarks/ is on sys.path when run as a script

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from targetpo.llm import experiment as rlvr  # noqa: E402
from targetpo.llm.trainer import RLVRTrainer  # noqa: E402


def main() -> None:
    ap = Parser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=positive_int, default=15, help="timed steps of every setting, after one "
                    "warm-up step (median reported; default 15)")
    args = ap.parse_args()
    cfg = rlvr.PRESETS["cpu"]
    task, template, train, heldout = rlvr.problems(cfg)
    trainers = {}
    for method in ("tpo_sum", "tpo_mean", "grpo"):
        model, tok = rlvr.base_model(cfg, "cpu")
        trainers[method] = RLVRTrainer(model, tok, task, template, train, heldout, rlvr.trainer_config(cfg, method, 0))
    times: dict[tuple[str, int], list[float]] = {}
    for rep in range(args.repeats + 1):
        for threads in (1, 2):
            torch.set_num_threads(threads)
            for method, tr in trainers.items():
                t0 = time.perf_counter()
                tr.step(rep)
                if rep:  # the first repetition warms up
                    times.setdefault((method, threads), []).append(time.perf_counter() - t0)
    print(f"K = {cfg.k}, B = {cfg.batch_prompts}, max_new_tokens = {cfg.max_new_tokens}, "
          f"median of {args.repeats} steps, torch {torch.__version__}")
    print("| method | 1 thread (s/step) | 2 threads (s/step) |\n|---|---|---|")
    for method in trainers:
        print(f"| {method} | {statistics.median(times[(method, 1)]):.3f} | {statistics.median(times[(method, 2)]):.3f} |")


if __name__ == "__main__":
    main()
