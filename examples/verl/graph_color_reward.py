"""verl custom reward function for Reasoning Gym graph coloring (reasoning-gym's own scorer).

reward.custom_reward_function.path=examples/verl/graph_color_reward.py
reward.custom_reward_function.name=compute_score
"""

from targetpo.integrations.verl_rewards import compute_score

__all__ = ["compute_score"]
