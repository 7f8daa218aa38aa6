"""The token engine's parts, this checkout against another version, timed interleaved in one process.

On a shared machine the speed drifts by ±15 % from one second to the next (BENCHMARKS.md), more than most engine
changes are worth, and runs in separate interpreters compare two different moments. Here both versions live in
one process: the other version's `targetpo` package is copied under the name `targetpo_other` (its imports
rewritten), both build the same batch from the same parameters, and their rollouts and training epochs (loss
forward + backward) alternate, so drift hits both alike; the ratio new / old of each adjacent pair is reported
(median over the pairs).

    git archive COMMIT src | tar -x -C /tmp/old
    python benchmarks/token_parts.py --against /tmp/old/src                      # TPO_token, dense, H = 10
    python benchmarks/token_parts.py --against /tmp/old/src --method tpo --task terminal6
    python benchmarks/token_parts.py --against /tmp/old/src --method ppo --task interactions6
"""

from __future__ import annotations

import importlib
import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from _args import Parser, positive_int, src_folder  # benchmarks/ is on sys.path when run as a script

from targetpo.tokens import engine as te
from targetpo.tokens import tasks
from targetpo.tokens import transformer as tfm

# The configurations timed: the authors' smoke configuration's (dense) and the cpu presets' terminal ones.
TASKS = {
    "dense10": dict(task="reverse_copy", reward="bag", length=10, vocab=2, batch=100, k=8),
    "terminal6": dict(task="reverse_copy", reward="terminal", length=6, vocab=2, batch=100, k=8),
    "interactions6": dict(task="reverse_copy", reward="terminal", length=6, vocab=2, batch=100, k=8,
                          match="interactions"),
}


def load_other(src: str, into: Path):
    """The engine of the targetpo package in `src` (checked by _args.src_folder), imported as `targetpo_other`."""
    dest = into / "targetpo_other"
    shutil.copytree(Path(src) / "targetpo", dest)
    for f in dest.rglob("*.py"):
        text = f.read_text()
        f.write_text(re.sub(r"\btargetpo\b(?=[. ])", "targetpo_other", text))
    sys.path.insert(0, str(into))
    return importlib.import_module("targetpo_other.tokens.engine")


def fresh_policy(cfg, method: str, seeds: list[int]):
    """(spec, params, prompts): a fresh policy of this checkout's engine for `seeds`, its parameters requiring
    gradients, and one batch of `method`'s prompts."""
    te.check_trial(cfg, method)
    spec = te.model_spec(cfg)
    params = tfm.init_params(spec, seeds)
    for p in params.values():
        p.requires_grad_(True)
    prompts = tasks.sample_prompts(te._generators(seeds, 1, "cpu"), te.method_batch(cfg, method), cfg.length,
                                   cfg.vocab, "cpu")
    return spec, params, prompts


def parts(engine, params, spec, cfg, method: str, prompts):
    """(rollout, epoch): zero-argument functions timing one rollout and one training epoch of `engine` (the epoch
    returns the parameters' gradients)."""
    cfg = engine.TrialConfig(**{f: getattr(cfg, f) for f in cfg.__dataclass_fields__})
    gens = engine._generators(list(range(prompts.shape[0])), 2, "cpu")
    batch = engine.collect(params, spec, cfg, method, prompts, gens)
    plan = engine.answer_plan(batch.prompts, batch.actions, cfg.vocab)
    names = list(params)

    def rollout():
        engine.collect(params, spec, cfg, method, prompts, gens)

    def epoch():
        loss = engine.loss_fn(params, spec, cfg, method, batch, None, plan)
        return torch.autograd.grad(loss, [params[k] for k in names])

    return rollout, epoch


def main():
    ap = Parser(description=__doc__)
    ap.add_argument("--against", required=True, type=src_folder, metavar="OTHER_SRC", help="the other version's src folder")
    ap.add_argument("--method", default="tpo_token", choices=list(te.METHODS), metavar="METHOD",
                    help=f"engine method: {', '.join(te.METHODS)} (default tpo_token)")
    ap.add_argument("--task", default="dense10", choices=list(TASKS), help="configuration: " + "; ".join(
        f"{k}: {v}" for k, v in TASKS.items()))
    ap.add_argument("--pairs", type=positive_int, default=30, help="interleaved (old, new) pairs per part")
    ap.add_argument("--threads", type=positive_int, default=1, help="torch CPU threads")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        other = load_other(args.against, Path(tmp))
        cfg = te.TrialConfig(**TASKS[args.task])
        spec, params, prompts = fresh_policy(cfg, args.method, [0, 1])
        timed = {"old": parts(other, params, spec, cfg, args.method, prompts),
                 "new": parts(te, params, spec, cfg, args.method, prompts)}
        for fs in timed.values():  # warm-up
            for f in fs:
                f()
        times = {(v, p): [] for v in timed for p in ("rollout", "epoch")}
        for i in range(args.pairs):
            for v in (("old", "new") if i % 2 == 0 else ("new", "old")):
                for p, f in zip(("rollout", "epoch"), timed[v]):
                    t0 = time.perf_counter()
                    f()
                    times[v, p].append(time.perf_counter() - t0)
    print(f"{args.method} on {args.task}, {args.threads} thread(s), {args.pairs} interleaved pairs:")
    print("| part | old (ms, median) | new (ms, median) | new / old (median of pairs) |\n|---|---|---|---|")
    for p in ("rollout", "epoch"):
        ratio = statistics.median(n / o for o, n in zip(times["old", p], times["new", p]))
        print(f"| {p} | {statistics.median(times['old', p]) * 1e3:.1f} | {statistics.median(times['new', p]) * 1e3:.1f} "
              f"| {ratio:.3f} |")


if __name__ == "__main__":
    main()
