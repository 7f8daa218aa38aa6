"""One training step of TargetPOTrainer vs stock GRPOTrainer (TRL 1.16.0) on the same tiny model and batch.

Both trainers wrap identical tiny Qwen2 models (same seed) and see the same prompts; each step re-seeds torch
before generating, and the learning rate is 0 (AdamW still runs), so both trainers generate exactly the same
completions every step. Two timings, each the median over repeated steps, trainers interleaved (alternating
which goes first) so machine noise hits both alike:

- full step: generation + reward + (group) shuffle + forward/backward of the loss + optimizer step;
- loss step: forward/backward of the loss alone (`compute_loss` + backward on one fixed, generated micro-batch),
  the only part where the two trainers differ in work.

    python benchmarks/trl_step.py                         # defaults: 8 prompts x K = 8, 32 new tokens
    python benchmarks/trl_step.py --repeats 21 --threads 2
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
import torch  # noqa: E402
# benchmarks/ is on sys.path when run as a script
from _args import Parser, int_at_least, nonnegative_int, positive_int  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))


HEADS = 4  # build_tiny_model's default num_heads


def hidden_size(text: str) -> int:
    value = positive_int(text)
    if value % HEADS:
        raise argparse.ArgumentTypeError(f"{text!r}: must be a multiple of {HEADS} (the tiny model's attention heads)")
    return value


def build(cls, config_cls, out, args):
    from datasets import Dataset

    from targetpo.llm.models import build_char_tokenizer, build_tiny_model

    tok = build_char_tokenizer()
    model = build_tiny_model(tok, hidden_size=args.hidden, num_layers=args.layers, seed=0)
    prompts = Dataset.from_dict({"prompt": [f"{i}+{2 * i}=" for i in range(args.prompts * 4)]})

    def digits(completions, **kwargs):
        return [float(sum(c.isdigit() for c in text)) for text in completions]

    cfg = config_cls(output_dir=str(out), use_cpu=True, bf16=False, report_to="none", num_generations=args.k,
                     per_device_train_batch_size=args.prompts * args.k, gradient_accumulation_steps=1,
                     max_completion_length=args.tokens, learning_rate=0.0, max_steps=10_000, save_strategy="no",
                     logging_steps=10_000, disable_tqdm=True, seed=0)
    trainer = cls(model=model, reward_funcs=digits, args=cfg, train_dataset=prompts, processing_class=tok)
    trainer.create_optimizer_and_scheduler(num_training_steps=10_000)
    trainer.current_gradient_accumulation_steps = 1
    trainer.model.train()
    batch = [prompts[i] for i in range(args.prompts) for _ in range(args.k)]  # RepeatSampler's layout
    return trainer, batch


def full_step(trainer, batch, seed):
    torch.manual_seed(seed)
    trainer._buffered_inputs = None  # force a fresh generation
    t0, c0 = time.perf_counter(), time.process_time()
    trainer.training_step(trainer.model, batch, None)  # generates, scores, shuffles, loss forward + backward
    trainer.optimizer.step()
    trainer.optimizer.zero_grad()
    return (time.perf_counter() - t0, time.process_time() - c0), trainer._buffered_inputs[0]


def loss_step(trainer, inputs):
    t0, c0 = time.perf_counter(), time.process_time()
    trainer.accelerator.backward(trainer.compute_loss(trainer.model, inputs))
    elapsed = (time.perf_counter() - t0, time.process_time() - c0)
    trainer.optimizer.zero_grad()
    return elapsed


def main() -> None:
    ap = Parser(description=__doc__)
    ap.add_argument("--prompts", type=positive_int, default=8, help="prompts per step (one micro-batch of whole "
                    "groups)")
    ap.add_argument("--k", type=int_at_least(2), default=8, help="completions per prompt (num_generations, >= 2)")
    ap.add_argument("--tokens", type=positive_int, default=32, help="max_completion_length")
    ap.add_argument("--hidden", type=hidden_size, default=64, help="tiny Qwen2 hidden size (a multiple of its "
                    f"{HEADS} attention heads)")
    ap.add_argument("--layers", type=positive_int, default=2, help="tiny Qwen2 layers")
    ap.add_argument("--repeats", type=positive_int, default=15, help="timed steps per trainer (median reported)")
    ap.add_argument("--warmup", type=nonnegative_int, default=2, help="untimed steps per trainer first")
    ap.add_argument("--threads", type=positive_int, default=2, help="torch CPU threads")
    ap.add_argument("--build-tpo-first", action="store_true", help="construct TargetPOTrainer before the stock one")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from trl import GRPOConfig, GRPOTrainer

    from targetpo.integrations.trl import TargetPOConfig, TargetPOTrainer

    with tempfile.TemporaryDirectory() as tmp:
        specs = {"GRPOTrainer (stock)": (GRPOTrainer, GRPOConfig), "TargetPOTrainer": (TargetPOTrainer, TargetPOConfig)}
        order = list(specs)[::-1] if args.build_tpo_first else list(specs)
        built = {name: build(*specs[name], Path(tmp) / name.split()[0], args) for name in order}
        trainers = {name: built[name] for name in specs}
        full = {name: [] for name in trainers}
        loss = {name: [] for name in trainers}
        fixed = {}
        names = list(trainers)
        for r in range(args.warmup + args.repeats):
            for name in names if r % 2 == 0 else names[::-1]:
                trainer, batch = trainers[name]
                elapsed, inputs = full_step(trainer, batch, seed=r)
                fixed.setdefault(name, inputs)
                if r >= args.warmup:
                    full[name].append(elapsed)
        # The same completions as rows, in any order (sorting each column on its own would match other rows).
        same = (sorted(map(tuple, fixed[names[0]]["completion_ids"].tolist()))
                == sorted(map(tuple, fixed[names[1]]["completion_ids"].tolist())))
        for r in range(args.warmup + args.repeats):
            for name in names if r % 2 == 0 else names[::-1]:
                elapsed = loss_step(trainers[name][0], fixed[name])
                if r >= args.warmup:
                    loss[name].append(elapsed)

    base = names[0]
    rows = args.prompts * args.k
    print(f"tiny Qwen2 (hidden {args.hidden}, {args.layers} layers), {args.prompts} prompts x K = {args.k} = {rows} "
          f"completions of up to {args.tokens} tokens, {args.threads} threads, median of {args.repeats} interleaved "
          f"steps; identical completions in both trainers: {same}\n")
    # Times are medians; "vs stock" is the median over repeats of the paired ratio (same repeat, back to back),
    # robust to drifting machine load. CPU time (process_time, all threads) is less sensitive than wall time to
    # other processes sharing the cores.
    print("| trainer | measure | full step (ms) | vs stock | loss fwd+bwd (ms) | vs stock |")
    print("|---|---|---|---|---|---|")
    for name in names:
        for i, measure in enumerate(("wall", "CPU")):
            f = statistics.median(x[i] for x in full[name])
            l_ = statistics.median(x[i] for x in loss[name])
            rf = statistics.median(a[i] / b[i] for a, b in zip(full[name], full[base]))
            rl = statistics.median(a[i] / b[i] for a, b in zip(loss[name], loss[base]))
            print(f"| {name} | {measure} | {1e3 * f:.1f} | {rf:.2f}× | {1e3 * l_:.1f} | {rl:.2f}× |")


if __name__ == "__main__":
    main()
