# The paper's App. G settings shared by run_gsm8k.sh, run_graph_color.sh and run_knights_knaves.sh (sourced by
# them): paired GRPO and TPO runs on verl 0.9.1's current trainer with Qwen3-1.7B, K = 16 responses per prompt,
# 16 prompts per step, AdamW lr 1e-5. A task script sets TASK, PROMPT_LEN, RESPONSE_LEN, USE_KL and the array
# TASK_OVERRIDES (its own extra settings), then sources this file.
#
# The two runs differ only in algorithm.adv_estimator, policy_loss.loss_mode and TPO's η; same seed, data order,
# batching (whole groups per GPU, trainer.v1.trainer_mode=tpo_sync for both) and KL. DRY_RUN=1 prints each
# command's overrides, one per line, instead of running it.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
MODEL=${MODEL:-Qwen/Qwen3-1.7B}            # or deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B
DATA=${DATA:-$HOME/data/verl/$TASK}
GPUS=${GPUS:-4}
ETA=${ETA:-1.0}                            # TPO's temperature η
LOSS_AGG=${LOSS_AGG:-seq-mean-token-sum}   # sequence log-score: token sum (the paper) or seq-mean-token-mean
STEPS=${STEPS:-300}
SEED=${SEED:-0}

COMMON=(
  data.train_files="$DATA/train.parquet"
  data.val_files="$DATA/test.parquet"
  data.train_batch_size=16
  data.max_prompt_length="$PROMPT_LEN"
  data.max_response_length="$RESPONSE_LEN"
  data.seed="$SEED"
  actor_rollout_ref.model.path="$MODEL"
  actor_rollout_ref.model.use_remove_padding=True
  actor_rollout_ref.model.enable_gradient_checkpointing=True
  actor_rollout_ref.actor.optim.lr=1e-5
  actor_rollout_ref.actor.ppo_mini_batch_size=16
  actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16
  actor_rollout_ref.actor.use_dynamic_bsz=False
  actor_rollout_ref.actor.shuffle=False
  actor_rollout_ref.actor.ppo_epochs=1
  actor_rollout_ref.actor.loss_agg_mode="$LOSS_AGG"
  actor_rollout_ref.actor.use_kl_loss="$USE_KL"
  actor_rollout_ref.actor.entropy_coeff=0
  actor_rollout_ref.actor.data_loader_seed="$SEED"
  actor_rollout_ref.rollout.name=vllm
  actor_rollout_ref.rollout.n=16
  actor_rollout_ref.rollout.temperature=1.0
  actor_rollout_ref.rollout.tensor_model_parallel_size=1
  actor_rollout_ref.rollout.gpu_memory_utilization=0.6
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16
  actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=16
  algorithm.use_kl_in_reward=False
  critic.enable=False
  reward.custom_reward_function.path="$HERE/app_g_reward.py"
  reward.custom_reward_function.name=compute_score
  trainer.v1.trainer_mode=tpo_sync
  trainer.n_gpus_per_node="$GPUS"
  trainer.nnodes=1
  trainer.total_training_steps="$STEPS"
  trainer.test_freq=10
  trainer.save_freq=-1
  'trainer.logger=[console]'
  trainer.project_name=targetpo_app_g
  "${TASK_OVERRIDES[@]}"
)
GRPO=(algorithm.adv_estimator=grpo actor_rollout_ref.actor.policy_loss.loss_mode=vanilla
      trainer.experiment_name="$TASK"_grpo_seed"$SEED")
TPO=(algorithm.adv_estimator=tpo actor_rollout_ref.actor.policy_loss.loss_mode=tpo +tpo.eta="$ETA"
     trainer.experiment_name="$TASK"_tpo_seed"$SEED")

launch() {
  if [[ -n "${DRY_RUN:-}" ]]; then echo "--- run"; printf '%s\n' "$@"; return; fi
  python -m targetpo.integrations.verl_trainer "$@"
}
launch "${COMMON[@]}" "${GRPO[@]}"
launch "${COMMON[@]}" "${TPO[@]}"
