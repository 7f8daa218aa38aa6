"""GSM8K with TRL 1.16: TPO (``targetpo.integrations.trl.TargetPOTrainer``) and GRPO side by side, paired.

The paper's App. G GSM8K setting on one node: Qwen3-1.7B, K = 16 completions per prompt, 16 prompts per optimizer
step, AdamW lr 1e-5, LoRA rank 32, KL 1e-3 to the reference model, vLLM generation in colocate mode. Both runs
use the same seed, data order, generation and batching; they differ only in the trainer (TPO's loss and its
group-keeping batch shuffle vs GRPO's clipped surrogate). Needs a GPU and ``pip install 'trl[vllm]' peft``.

    targetpo data gsm8k /path/to/gsm8k          # once: GSM8K's train.jsonl / test.jsonl, checksum-verified
    python examples/trl/train_gsm8k.py --model /path/to/Qwen3-1.7B --gsm8k-dir /path/to/gsm8k --out runs/trl

vLLM's importance-sampling correction (TRL's ``vllm_importance_sampling_correction``) is switched off for both
runs: TPO does not apply it (docs/verl.md §6), and the pair must differ only in the loss.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

METHODS = ("tpo", "grpo")


def _number(kind, low: float, strict: bool):
    """An argparse type: a `kind` number above `low` (at or above when not `strict`), named in the error."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a{'n integer' if kind is int else ' number'}") from None
        if value < low or (strict and value == low):
            raise argparse.ArgumentTypeError(f"{text} must be {'>' if strict else '>='} {low:g}")
        return value
    return parse


POSITIVE_INT, COUNT, POSITIVE, NON_NEGATIVE = (_number(int, 0, True), _number(int, 0, False), _number(float, 0, True),
                                               _number(float, 0, False))


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = p.add_argument
    add("--model", required=True, help="local model directory, e.g. Qwen3-1.7B (never downloaded)")
    add("--gsm8k-dir", type=Path, required=True, help="directory holding GSM8K's train.jsonl")
    add("--out", type=Path, required=True, help="output directory (one subfolder per method)")
    add("--methods", nargs="+", choices=METHODS, default=list(METHODS),
        help="trainers to run one after the other, each from the same initial model (default: tpo grpo)")
    add("--max-steps", type=POSITIVE_INT, default=300, help="optimizer steps per method (default: %(default)s)")
    add("--train-size", type=POSITIVE_INT, default=None, help="first N training problems (default: all)")
    add("--num-generations", type=_number(int, 2, False), default=16,
        help="K completions per prompt, at least 2 (default: %(default)s)")
    add("--prompts-per-step", type=POSITIVE_INT, default=16, help="prompts per optimizer step (default: %(default)s)")
    add("--per-device-batch", type=POSITIVE_INT, default=16,
        help="completions per micro-batch; a multiple of K that divides prompts-per-step x K (default: %(default)s)")
    add("--max-completion-length", type=POSITIVE_INT, default=1024,
        help="new tokens per completion, at most (default: %(default)s)")
    add("--lr", type=POSITIVE, default=1e-5, help="AdamW learning rate (default: %(default)s)")
    add("--beta", type=NON_NEGATIVE, default=1e-3, help="KL coefficient to the reference model (default: %(default)s)")
    add("--lora-rank", type=COUNT, default=32,
        help="LoRA rank, alpha = 2 x rank; 0 trains every weight (default: %(default)s)")
    add("--eta", type=POSITIVE, default=1.0, help="TPO's temperature η (default: %(default)s)")
    add("--seq-logp", choices=("sum", "mean"), default="sum", help="TPO's sequence log-score (default: %(default)s)")
    add("--seed", type=COUNT, default=0, help="seed of both runs: data order, generation, init (default: %(default)s)")
    add("--no-vllm", action="store_true", help="generate with transformers instead of vLLM")
    add("--cpu", action="store_true", help="float32 on the CPU (for smoke tests with a tiny model)")
    args = p.parse_args(argv)
    if len(set(args.methods)) < len(args.methods):
        p.error(f"--methods {' '.join(args.methods)}: each method once")
    return args


def check(args: argparse.Namespace) -> None:
    """What the runs would trip on later, before a model is loaded or a file written: ValueError/FileNotFoundError
    naming the flag."""
    from targetpo.llm.models import check_model_dir

    check_model_dir(args.model)
    train = Path(args.gsm8k_dir).expanduser() / "train.jsonl"
    if not train.is_file():
        raise FileNotFoundError(f"--gsm8k-dir {args.gsm8k_dir} has no train.jsonl (fetch it: `targetpo data gsm8k DIR`)")
    if args.train_size is not None:
        with train.open(encoding="utf-8") as f:
            have = sum(1 for line in f if line.strip())
        if have < args.train_size:
            raise ValueError(f"--train-size {args.train_size}: {train} holds only {have} problems")
    if args.out.exists() and not args.out.is_dir():
        raise ValueError(f"--out {args.out} is a file; give a directory")
    for method in args.methods:
        config_kwargs(method, args)  # the batch arithmetic
    if not args.no_vllm and importlib.util.find_spec("vllm") is None:  # TRL raised it with a traceback at build time
        raise ValueError("vLLM is not installed (pip install vllm, on a GPU machine); pass --no-vllm to generate "
                         "with transformers instead")


def gsm8k_dataset(gsm8k_dir: Path, limit: int | None):
    """GSM8K's training problems as TRL conversational prompts with the gold answer in column ``gold``."""
    from datasets import Dataset

    from targetpo.llm.rewards import gsm8k_gold
    from targetpo.llm.templates import system_prompt

    rows = []
    with (Path(gsm8k_dir) / "train.jsonl").open(encoding="utf-8") as f:
        for line in f:
            if limit is not None and len(rows) >= limit:
                break
            if line.strip():
                r = json.loads(line)
                rows.append({"prompt": [{"role": "system", "content": system_prompt()},
                                        {"role": "user", "content": r["question"]}],
                             "gold": gsm8k_gold(r["answer"])})
    return Dataset.from_list(rows)


def gsm8k_reward(completions, gold, **kwargs) -> list[float]:
    """Exact match (math-verify) of the last ``<answer>`` block with the gold final answer."""
    from targetpo.llm.rewards import score_gsm8k
    from targetpo.llm.templates import extract_tagged_answer

    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return [score_gsm8k(g, extract_tagged_answer(t)) for t, g in zip(texts, gold)]


def config_kwargs(method: str, args: argparse.Namespace) -> dict:
    """The keyword arguments of `method`'s config: the shared settings, plus η and the log-score for TPO."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    k = args.num_generations
    generation_batch = args.prompts_per_step * k
    if generation_batch % args.per_device_batch:
        raise ValueError(f"--per-device-batch {args.per_device_batch} must divide --prompts-per-step x "
                         f"--num-generations = {generation_batch}")
    if args.per_device_batch % k:  # TargetPOConfig's rule: a micro-batch holds whole groups
        raise ValueError(f"--per-device-batch {args.per_device_batch} must be a multiple of --num-generations {k} "
                         "(each micro-batch holds whole groups of K completions)")
    common = dict(
        output_dir=str(args.out / method), seed=args.seed, max_steps=args.max_steps, learning_rate=args.lr,
        optim="adamw_torch", num_generations=k, per_device_train_batch_size=args.per_device_batch,
        gradient_accumulation_steps=generation_batch // args.per_device_batch,
        max_completion_length=args.max_completion_length, beta=args.beta, logging_steps=1, save_strategy="no",
        report_to="none", use_cpu=args.cpu, bf16=not args.cpu,
        use_vllm=not args.no_vllm, vllm_mode="colocate", vllm_importance_sampling_correction=False,
    )
    return {**common, "tpo_eta": args.eta, "seq_logp": args.seq_logp} if method == "tpo" else common


def build_config(method: str, args: argparse.Namespace):
    """TargetPOConfig (tpo) or GRPOConfig (grpo), validated by the config classes (bf16 needs a GPU)."""
    from trl import GRPOConfig

    from targetpo.integrations.trl import TargetPOConfig

    return (TargetPOConfig if method == "tpo" else GRPOConfig)(**config_kwargs(method, args))


def model_dtype(args: argparse.Namespace) -> str:
    """The dtype the model's weights are loaded in. bfloat16 only for a frozen base under LoRA: trained bf16
    weights lose most AdamW steps at lr 1e-5 to rounding (a step below half a bf16 spacing is a no-op), so a
    full fine-tune keeps float32 weights and computes in bf16 under the Trainer's autocast (``bf16=True``)."""
    return "bfloat16" if args.lora_rank and not args.cpu else "float32"


def build_trainer(method: str, args: argparse.Namespace, train_dataset=None, reward_funcs=gsm8k_reward):
    """The trainer for `method` (model loaded from ``--model``; LoRA adapters when ``--lora-rank > 0``)."""
    from trl import GRPOTrainer

    from targetpo.integrations.trl import TargetPOTrainer
    from targetpo.llm.models import load_model

    config = build_config(method, args)
    model, tokenizer = load_model(args.model, dtype=model_dtype(args))
    peft_config = None
    if args.lora_rank:
        from peft import LoraConfig

        peft_config = LoraConfig(r=args.lora_rank, lora_alpha=2 * args.lora_rank, target_modules="all-linear",
                                 task_type="CAUSAL_LM")
    cls = TargetPOTrainer if method == "tpo" else GRPOTrainer
    return cls(model=model, reward_funcs=reward_funcs, args=config, processing_class=tokenizer,
               train_dataset=train_dataset if train_dataset is not None else gsm8k_dataset(args.gsm8k_dir,
                                                                                            args.train_size),
               peft_config=peft_config)


def main(argv=None) -> None:
    args = parse_args(argv)
    try:
        check(args)
    except (ValueError, FileNotFoundError) as exc:  # one line and exit 2, as `targetpo` itself answers
        print(f"train_gsm8k.py: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    dataset = gsm8k_dataset(args.gsm8k_dir, args.train_size)
    for method in args.methods:
        trainer = build_trainer(method, args, dataset)
        trainer.train()
        trainer.save_model(str(args.out / method / "final"))


if __name__ == "__main__":
    main()
