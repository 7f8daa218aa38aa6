#!/usr/bin/env bash
# GSM8K, paired GRPO and TPO runs on verl 0.9.1's current trainer (the paper's App. G setting): Qwen3-1.7B,
# K = 16 responses per prompt, 16 prompts per step, AdamW lr 1e-5, LoRA rank 32 and KL 1e-3 for both methods.
# Assumes 1 node x 4 GPUs (the paper used 4 x A100-80GB); set GPUS for another count (train batch, mini-batch
# and GPU count must keep whole groups per GPU: the launcher refuses otherwise, before any model is loaded).
#
#   targetpo data gsm8k /path/to/gsm8k       # GSM8K's train.jsonl / test.jsonl, checksum-verified
#   python examples/verl/prepare_data.py gsm8k --gsm8k-dir /path/to/gsm8k --out ~/data/verl/gsm8k
#   MODEL=/path/to/Qwen3-1.7B bash examples/verl/run_gsm8k.sh
set -euo pipefail
TASK=gsm8k
PROMPT_LEN=512
RESPONSE_LEN=1024
USE_KL=True
TASK_OVERRIDES=(
  actor_rollout_ref.model.lora_rank=32
  actor_rollout_ref.model.lora_alpha=64
  actor_rollout_ref.model.target_modules=all-linear
  actor_rollout_ref.actor.kl_loss_coef=0.001
  actor_rollout_ref.actor.kl_loss_type=low_var_kl
)
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/app_g.sh"
