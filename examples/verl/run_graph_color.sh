#!/usr/bin/env bash
# Reasoning Gym graph coloring, paired GRPO and TPO runs on verl 0.9.1's current trainer (the paper's App. G
# setting): Qwen3-1.7B, K = 16 responses per prompt, 16 prompts per step, AdamW lr 1e-5; no LoRA and no
# KL (the paper used them for GSM8K only).
# Assumes 1 node x 4 GPUs (the paper used 4 x A100-80GB); set GPUS for another count (train batch, mini-batch
# and GPU count must keep whole groups per GPU: the launcher refuses otherwise, before any model is loaded).
#
#   python examples/verl/prepare_data.py graph_color --out ~/data/verl/graph_color
#   MODEL=/path/to/Qwen3-1.7B bash examples/verl/run_graph_color.sh
set -euo pipefail
TASK=graph_color
PROMPT_LEN=1024
RESPONSE_LEN=4096
USE_KL=False
TASK_OVERRIDES=(
)
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/app_g.sh"
