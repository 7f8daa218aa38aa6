"""Reasoning Gym graph coloring for verl: dataset rows and the custom reward function (the paper's App. G task).

The score is reasoning-gym's own ``GraphColorDataset.score_answer`` on the last ``<answer>…</answer>`` of the
response: 1.0 for a valid coloring given as a JSON map, 0.01 for parseable JSON that is not a valid coloring,
0.0 otherwise (quasi-binary, as in the paper). Everything is generated offline by reasoning-gym.

verl usage::

    reward.custom_reward_function.path=examples/verl/graph_color_reward.py
    reward.custom_reward_function.name=compute_score

where ``examples/verl/graph_color_reward.py`` re-exports :func:`compute_score`. Rows carry the puzzle as JSON in
``reward_model.ground_truth``, so the score needs nothing but the row.
"""

from __future__ import annotations

import json
from functools import lru_cache

DATA_SOURCE = "reasoning_gym/graph_color"


@lru_cache(maxsize=1)
def _scorer():
    import reasoning_gym as rg

    return rg.create_dataset("graph_color", size=1, seed=0)  # score_answer reads only the entry passed to it


def graph_color_rows(size: int, seed: int, split: str, **dataset_config) -> list[dict]:
    """`size` graph-coloring prompts as verl RL rows (chat prompt, data_source, reward_model.ground_truth)."""
    import reasoning_gym as rg
    from reasoning_gym.utils import SYSTEM_PROMPTS

    ds = rg.create_dataset("graph_color", size=size, seed=seed, **dataset_config)
    rows = []
    for i in range(size):
        entry = ds[i]
        rows.append({
            "data_source": DATA_SOURCE,
            "prompt": [{"role": "system", "content": SYSTEM_PROMPTS["default"]},
                       {"role": "user", "content": entry["question"]}],
            "ability": "graph_coloring",
            "reward_model": {"style": "rule", "ground_truth": json.dumps(entry["metadata"]["puzzle"])},
            "extra_info": {"split": split, "index": i},
        })
    return rows


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> float:
    """verl custom reward: reasoning-gym's graph-coloring score of the response's last <answer> block."""
    from reasoning_gym.utils import extract_answer

    if data_source != DATA_SOURCE:
        raise ValueError(f"compute_score scores {DATA_SOURCE!r} rows only, got data_source={data_source!r}")
    entry = {"metadata": {"puzzle": json.loads(ground_truth)}}
    return float(_scorer().score_answer(extract_answer(solution_str), entry=entry))
