"""verl custom reward function for the App. G tasks (GSM8K, graph coloring, Knights & Knaves), by data_source.

reward.custom_reward_function.path=examples/verl/app_g_reward.py
reward.custom_reward_function.name=compute_score
"""

from targetpo.integrations.verl_rewards import compute_score

__all__ = ["compute_score"]
