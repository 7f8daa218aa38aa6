"""The paper's App. G tasks for verl: dataset rows in verl's RL parquet layout and one custom reward function.

Tasks (``data_source`` → score of the response's last ``<answer>…</answer>``):

- ``openai/gsm8k``: 1.0 when math-verify finds the answer equal to the final answer after ``#### `` (exact
  match, :func:`targetpo.llm.rewards.score_gsm8k`), else 0. Rows come from the ``train.jsonl``/``test.jsonl``
  files (``{"question", "answer"}`` per line) of the GSM8K release.
- ``reasoning_gym/graph_color``: reasoning-gym's own ``score_answer``: 1.0 for a valid coloring given as a JSON
  map, 0.01 for parseable JSON that is not a valid coloring, 0.0 otherwise (quasi-binary, as in the paper).
- ``reasoning_gym/knights_knaves``: reasoning-gym's own ``score_answer``: 1.0 all right, 0.3 + 0.7 · (fraction
  right) when every inhabitant is named, 0 otherwise (partial credit, as in the paper).

Every row is ``{data_source, prompt (chat messages: reasoning-gym's default system prompt + the question),
ability, reward_model {style: "rule", ground_truth}, extra_info {split, index}}``, the columns verl's
``RLHFDataset`` and reward loop read; ``ground_truth`` holds all the scorer needs, so scoring needs only the row.

verl usage (``examples/verl/*_reward.py`` re-export :func:`compute_score`)::

    reward.custom_reward_function.path=examples/verl/app_g_reward.py
    reward.custom_reward_function.name=compute_score
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

from targetpo.llm.data import gsm8k_lines
from targetpo.llm.rewards import gsm8k_gold, score_gsm8k, score_reasoning_gym
from targetpo.llm.templates import extract_tagged_answer, system_prompt

GSM8K = "openai/gsm8k"
GRAPH_COLOR = "reasoning_gym/graph_color"
KNIGHTS_KNAVES = "reasoning_gym/knights_knaves"
DATA_SOURCE = GRAPH_COLOR  # kept for callers of the graph-coloring-only version
DATA_SOURCES = (GSM8K, GRAPH_COLOR, KNIGHTS_KNAVES)
SPLITS = ("train", "test")


def _row(data_source: str, question: str, ability: str, ground_truth: str, split: str, index: int) -> dict:
    return {
        "data_source": data_source,
        "prompt": [{"role": "system", "content": system_prompt()}, {"role": "user", "content": question}],
        "ability": ability,
        "reward_model": {"style": "rule", "ground_truth": ground_truth},
        "extra_info": {"split": split, "index": index},
    }


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")


def gsm8k_rows(data_dir: str | Path, split: str, limit: int | None = None) -> list[dict]:
    """GSM8K's `split` file (``DIR/train.jsonl`` or ``DIR/test.jsonl``) as verl rows; the first `limit` lines."""
    _check_split(split)
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ValueError(f"limit must be None (the whole file) or an int >= 1, got {limit!r}")
    path = Path(data_dir).expanduser() / f"{split}.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"GSM8K file {path} not found (data_dir must hold train.jsonl and test.jsonl)")
    rows = []
    for lineno, r in gsm8k_lines(path):
        try:
            gold = gsm8k_gold(r["answer"])
        except ValueError as exc:
            raise ValueError(f"{path}:{lineno}: {exc}") from None
        rows.append(_row(GSM8K, r["question"], "math", gold, split, len(rows)))
        if limit is not None and len(rows) >= limit:
            break
    return rows


def reasoning_gym_rows(name: str, size: int, seed: int, split: str, **dataset_config) -> list[dict]:
    """`size` prompts of reasoning-gym's `name` (graph_color or knights_knaves) as verl rows, generated offline."""
    import reasoning_gym as rg

    _check_split(split)
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"size must be an int >= 1, got {size!r}")
    if f"reasoning_gym/{name}" not in DATA_SOURCES:
        raise ValueError(f"name must be graph_color or knights_knaves, got {name!r}")
    ds = rg.create_dataset(name, size=size, seed=seed, **dataset_config)
    rows = []
    for i in range(size):
        e = ds[i]
        # graph_color's answer is None (many colorings are right): the scorer reads the puzzle from the metadata.
        truth = json.dumps(e["metadata"]["puzzle"]) if name == "graph_color" else e["answer"]
        rows.append(_row(f"reasoning_gym/{name}", e["question"], name, truth, split, i))
    return rows


def graph_color_rows(size: int, seed: int, split: str, **dataset_config) -> list[dict]:
    """`size` graph-coloring prompts as verl rows."""
    return reasoning_gym_rows("graph_color", size, seed, split, **dataset_config)


@lru_cache(maxsize=None)
def _scorer(name: str):
    import reasoning_gym as rg

    return rg.create_dataset(name, size=1, seed=0)  # score_answer reads only the entry passed to it


_PUZZLE_KEYS = ("vertices", "edges", "color_options")  # what reasoning-gym's graph_color scorer reads


def _graph_color_puzzle(ground_truth: str) -> dict:
    """The puzzle of a graph_color row; its scorer would silently score 0 for a puzzle it cannot read."""
    try:
        puzzle = json.loads(ground_truth)
    except json.JSONDecodeError:
        puzzle = None
    if not isinstance(puzzle, dict):
        raise ValueError(f"ground_truth of a {GRAPH_COLOR} row must be the puzzle as a JSON object, got "
                         f"{ground_truth[:80]!r}")
    missing = [k for k in _PUZZLE_KEYS if k not in puzzle]
    if missing:
        raise ValueError(f"ground_truth of a {GRAPH_COLOR} row lacks {missing} (a puzzle has {list(_PUZZLE_KEYS)})")
    return puzzle


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> float:
    """verl custom reward: the task's score of the response's last ``<answer>`` block (0 without one).

    A malformed row (unknown data_source, a ground_truth that is not a non-empty string or, for graph_color, not
    a puzzle) raises ValueError rather than giving every response the same score.
    """
    if data_source not in DATA_SOURCES:
        raise ValueError(f"compute_score scores {DATA_SOURCES} rows only, got data_source={data_source!r}")
    if not isinstance(solution_str, str):
        raise ValueError(f"solution_str must be the decoded response (str), got {type(solution_str).__name__}")
    if not isinstance(ground_truth, str) or not ground_truth.strip():
        raise ValueError(f"ground_truth of a {data_source} row must be a non-empty string (reward_model.ground_truth), "
                         f"got {ground_truth!r}")
    answer = extract_tagged_answer(solution_str)
    if data_source == GSM8K:
        return score_gsm8k(ground_truth, answer)
    if data_source == GRAPH_COLOR:
        puzzle = _graph_color_puzzle(ground_truth)
        return score_reasoning_gym(_scorer("graph_color"), {"metadata": {"puzzle": puzzle}}, answer)
    return score_reasoning_gym(_scorer("knights_knaves"), {"answer": ground_truth}, answer)
