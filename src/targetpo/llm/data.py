"""Prompt sources: reasoning-gym tasks by name, and GSM8K from a jsonl path.

A :class:`Problem` holds the question text, the gold answer as text (what the supervised warm start teaches)
and whatever the scorer needs. :func:`load_task` builds a task; :func:`train_and_heldout` draws a training pool
and a disjoint held-out set from it, deterministically from a seed.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from targetpo.llm.rewards import gsm8k_gold, score_gsm8k, score_reasoning_gym
from targetpo.runs.download import Remote

# The GSM8K authors' public release (Cobbe et al. 2021), fetched only by `targetpo data gsm8k DIR`.
GSM8K_BASE_URL = "https://raw.githubusercontent.com/openai/grade-school-math/master/grade_school_math/data"
GSM8K_SHA256 = {
    "train.jsonl": "17f347dc51477c50d4efb83959dbb7c56297aba886e5544ee2aaed3024813465",  # 7,473 problems
    "test.jsonl": "3730d312f6e3440559ace48831e51066acaca737f6eabec99bccb9e4b3c39d14",   # 1,319 problems
}


def gsm8k_remotes(base_url: str | None = None) -> list[Remote]:
    """GSM8K's train.jsonl and test.jsonl with their SHA-256 checksums."""
    base = (base_url or GSM8K_BASE_URL).rstrip("/")
    return [Remote(f"{base}/{name}", f"sha256:{digest}", name) for name, digest in GSM8K_SHA256.items()]


# Tasks whose reasoning-gym entries carry a short `expression` ("12 + 7"): `compact` prompts use it.
ARITHMETIC_TASKS = ("chain_sum", "basic_arithmetic")
HELDOUT_SEED_OFFSET = 1_000_003  # held-out problems come from another generator seed


@dataclass(frozen=True)
class Problem:
    question: str
    answer: str
    entry: dict[str, Any] | None = field(default=None, compare=False, repr=False)


def problems_fingerprint(*pools: list[Problem]) -> str:
    """The first 16 hex digits of a SHA-256 over every problem's question and answer, pool by pool: a resume
    whose problems differ (another GSM8K file, another reasoning-gym version) is refused by it (docs/architecture.md)."""
    h = hashlib.sha256()
    for pool in pools:
        for p in pool:
            h.update(p.question.encode() + b"\0" + p.answer.encode() + b"\0")
        h.update(b"\1")
    return h.hexdigest()[:16]


class ReasoningGymTask:
    """A reasoning-gym dataset by name, scored by its own ``score_answer``.

    compact: for arithmetic tasks, use the bare expression ``"12 + 7 ="`` as the question instead of the
    dataset's sentence (a tiny character model learns it in minutes). options: the dataset's config fields,
    e.g. ``min_terms=2, max_terms=2, max_digits=2`` for chain_sum.
    """

    def __init__(self, name: str, compact: bool = False, **options):
        import reasoning_gym as rg

        self.name = name
        self.compact = compact
        self.options = options
        from reasoning_gym.factory import DATASETS

        if name not in DATASETS:
            near = difflib.get_close_matches(name, [*DATASETS, "gsm8k"], n=3)
            hint = f"did you mean {', '.join(map(repr, near))}? " if near else ""
            raise ValueError(f"task={name!r}: neither gsm8k nor a reasoning-gym dataset; {hint}reasoning-gym has "
                             f"{len(DATASETS)}, e.g. {', '.join(ARITHMETIC_TASKS)}, graph_color, knights_knaves")
        if compact and name not in ARITHMETIC_TASKS:
            raise ValueError(f"compact=true: compact prompts exist for {', '.join(ARITHMETIC_TASKS)}, not {name!r}")
        self.options = check_task_options(name, DATASETS[name][1], options)
        try:
            self._scorer = rg.create_dataset(name, size=1, seed=0, **self.options)  # scoring reads only the entry
        except Exception as exc:  # the dataset's own checks (min_terms must be positive, ...): say which options
            raise ValueError(f"task_options={show_options(options)} of reasoning-gym task {name!r}: {exc}") from None

    def problems(self, split: str, size: int, seed: int) -> list[Problem]:
        import reasoning_gym as rg

        if split not in ("train", "heldout"):
            raise ValueError(f"split must be 'train' or 'heldout', got {split!r}")
        s = seed if split == "train" else seed + HELDOUT_SEED_OFFSET
        try:
            ds = rg.create_dataset(self.name, size=size, seed=s, **self.options)
            return [self._problem(e) for e in ds]
        except (ValueError, TypeError, KeyError, IndexError) as exc:  # raised while drawing: options it checks late
            raise ValueError(f"task_options={show_options(self.options)} of reasoning-gym task {self.name!r}: "
                             f"{exc}") from None

    def _problem(self, e: dict) -> Problem:
        if self.name == "graph_color":  # no `answer`: any valid coloring scores 1; teach the generator's one
            gold = json.dumps({str(k): v for k, v in e["metadata"]["possible_answer"].items()})
        else:
            gold = str(e["answer"])
        question = f"{e['metadata']['expression']} =" if self.compact else e["question"]
        return Problem(question, gold, e)

    def score(self, problem: Problem, answer: str | None) -> float:
        return score_reasoning_gym(self._scorer, problem.entry, answer)


# Config fields a task's pools set themselves: the pool size (train_size, eval_size) and its seed (`seed`).
SET_BY_TARGETPO = {"size": "the pool sizes are train_size and eval_size", "seed": "pools are drawn from seed="}


def show_options(options: dict) -> str:
    """{"min_terms": 2, "allow_negation": False, "task_types": ["date", "time"]} ->
    'min_terms=2,allow_negation=false,task_types=date|time', as the user typed it."""
    return ",".join(f"{k}={show_option_value(v)}" for k, v in options.items()) or "(none)"


def show_option_value(v) -> str:
    """One task option's value as the user typed it (false, 3, date|time, 0.5|0.5, friends|siblings)."""
    if isinstance(v, (list, tuple)):
        return "|".join(show_option_value(i) for i in v)
    return str(v).lower() if isinstance(v, bool) else str(v.value) if isinstance(v, enum.Enum) else str(v)


def check_task_options(name: str, config_cls: type, options: dict) -> dict:
    """`options` as the dataset takes them, after refusing, naming the option and what is allowed, an option that
    `config_cls` (a reasoning-gym dataset's config dataclass) lacks, one targetpo sets itself, or a value of the
    wrong kind. Without this, reasoning-gym answered with Python's own words ("__init__() got an unexpected keyword
    argument", "'>' not supported between instances of 'str' and 'int"). A list of words is given joined by '|'
    (`task_types=date|time`; a comma separates options) and becomes a list; a list of characters is given as one
    word (`operators=+-`). Fields of other types are left to reasoning-gym's checks."""
    import typing

    hints = typing.get_type_hints(config_cls)
    defaults = {f.name: f.default if f.default is not dataclasses.MISSING else
                f.default_factory() if f.default_factory is not dataclasses.MISSING else None
                for f in dataclasses.fields(config_cls)}
    allowed = [k for k in hints if k not in SET_BY_TARGETPO]
    out = dict(options)
    for key, value in options.items():
        if key in SET_BY_TARGETPO:
            raise ValueError(f"task_options: {key}= is set by targetpo ({SET_BY_TARGETPO[key]}); leave it out")
        if key not in hints:
            near = difflib.get_close_matches(key, allowed, n=1)
            hint = f"did you mean {near[0]!r}? " if near else ""
            raise ValueError(f"task_options: {key!r} is not an option of reasoning-gym task {name!r}; {hint}"
                             f"its options: {', '.join(allowed)}")
        want = _option_kind(hints[key], defaults.get(key))
        if want is None:
            continue
        words, test, convert = want
        if not test(value):
            raise ValueError(f"task_options: {key}={show_option_value(value)} for reasoning-gym task {name!r}: "
                             f"{key} takes {words}")
        out[key] = convert(value)
    return out


def _option_kind(hint, default=None) -> tuple[str, Any, Any] | None:
    """(what a field of this type takes, in words; a test of a parsed value; the value the dataset is given), or None
    where it is not checked. A sequence field holds characters when every item of its default is one character
    (operators), else words (task types, names)."""
    import collections.abc
    import typing

    same = lambda v: v  # noqa: E731
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Union and type(None) in args and len(args) == 2:  # Optional[X]: X (none cannot be typed)
        return _option_kind(next(a for a in args if a is not type(None)), default)
    if origin is typing.Literal:
        return f"one of {', '.join(map(str, args))}", lambda v: v in args, same
    if origin in (list, tuple, collections.abc.Sequence) or hint in (list, tuple):
        kind = tuple if (origin is tuple or hint is tuple) else list
        of = {a for a in args if a is not Ellipsis}
        item = next(iter(of)) if len(of) == 1 else None  # the one type every item has
        if item in (int, float):  # weights: 0.4|0.4|0.2
            return (f"{'integers' if item is int else 'numbers'} joined by '|' (e.g. {_number_example(default, item)})",
                    lambda v: _numbers(v, item) is not None, lambda v: kind(_numbers(v, item)))
        if isinstance(item, type) and issubclass(item, enum.Enum):
            members = {str(m.value): m for m in item}
            return (f"one or more of {', '.join(members)}, joined by '|'",
                    lambda v: isinstance(v, str) and all(w.strip() in members for w in v.split("|")),
                    lambda v: kind(members[w.strip()] for w in v.split("|")))
        if not all(a in (str, Ellipsis) for a in args):
            return None  # pairs, nested specs: reasoning-gym checks them
        items = list(default) if isinstance(default, (list, tuple)) else []
        if not args and not all(isinstance(i, str) for i in items):
            return None
        if items and all(isinstance(i, str) and len(i) == 1 for i in items):
            return ("characters, each one an item (e.g. operators=+-)", lambda v: isinstance(v, str) and v != "",
                    same)
        return ("words joined by '|' (e.g. task_types=date|time)",
                lambda v: isinstance(v, str) and all(w.strip() for w in v.split("|")),
                lambda v: kind(w.strip() for w in v.split("|")))
    if hint is bool:
        return "true or false", lambda v: isinstance(v, bool), same
    if hint is int:
        return "an integer", lambda v: isinstance(v, int) and not isinstance(v, bool), same
    if hint is float:
        return "a number", lambda v: isinstance(v, (int, float)) and not isinstance(v, bool), same
    if hint is str:
        return "text", lambda v: isinstance(v, str), same
    return None


def _numbers(v, num: type) -> list | None:
    """'0.4|0.6' (or one number, already parsed) as a list of `num`, or None when an item is not one."""
    parts = [v] if isinstance(v, (int, float)) and not isinstance(v, bool) else v.split("|") if isinstance(v, str) else None
    if parts is None:
        return None
    try:
        out = [num(p.strip()) if isinstance(p, str) else p for p in parts]
    except ValueError:
        return None
    if num is int and not all(isinstance(x, int) and not isinstance(x, bool) for x in out):
        return None
    return [num(x) for x in out] if all(math.isfinite(x) for x in out) else None


def _number_example(default, num: type) -> str:
    """The field's default written as the user would type it, or a made-up pair."""
    if isinstance(default, (list, tuple)) and default and all(isinstance(x, (int, float)) for x in default):
        return "|".join(map(str, default))
    return "1|2" if num is int else "0.5|0.5"


def gsm8k_lines(path: str | Path) -> Iterator[tuple[int, dict]]:
    """(line number, row) of a GSM8K JSONL file, read line by line (a caller may stop early) and each checked: a
    JSON object with string "question" and "answer", the answer ending in ``#### `` and a number (a row whose
    final answer is missing or not a number could never be scored right); a ValueError names the file and the
    line. Blank lines are skipped. The one parser of GSM8K files (rlvr's task, the verl data script)."""
    with Path(path).open("rb") as f:
        for n, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise ValueError(f"{path}:{n}: not UTF-8 text ({exc.reason} at byte {exc.start} of the line); "
                                 "GSM8K files are UTF-8 JSON lines") from None
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{n}: not valid JSON ({exc.msg} at column {exc.colno})") from None
            if not isinstance(row, dict):
                raise ValueError(f"{path}:{n}: not a JSON object ({line.strip()[:80]!r})")
            missing = [k for k in ("question", "answer") if not isinstance(row.get(k), str)]
            if missing:
                raise ValueError(f"{path}:{n}: lacks {' and '.join(map(repr, missing))} (a GSM8K row is an object "
                                 "with string 'question' and 'answer' fields)")
            if "####" not in row["answer"]:
                raise ValueError(f"{path}:{n}: the answer has no '#### ' final answer ({row['answer'][-60:]!r})")
            final = gsm8k_gold(row["answer"])
            try:
                float(final)
            except ValueError:
                raise ValueError(f"{path}:{n}: the final answer after '####' is {final!r}, not a number") from None
            yield n, row


def read_gsm8k(path: str | Path) -> list[dict]:
    """Every row of a GSM8K JSONL file, checked by :func:`gsm8k_lines`; a file with none is refused."""
    rows = [row for _, row in gsm8k_lines(path)]
    if not rows:
        raise ValueError(f"{path}: no problems in the file")
    return rows


class Gsm8kTask:
    """GSM8K from a directory holding ``train.jsonl`` and ``test.jsonl`` (lines ``{"question", "answer"}``, final
    answer after ``#### ``). The held-out split is the test file; training draws from the train file."""

    name = "gsm8k"

    def __init__(self, path: str | Path):
        self.path = Path(path)
        for f in ("train.jsonl", "test.jsonl"):
            if not (self.path / f).is_file():
                raise FileNotFoundError(f"GSM8K directory {self.path} has no {f} (pass data_path=DIR holding "
                                        "train.jsonl and test.jsonl)")

    def problems(self, split: str, size: int, seed: int) -> list[Problem]:
        import random

        if split not in ("train", "heldout"):
            raise ValueError(f"split must be 'train' or 'heldout', got {split!r}")
        rows = read_gsm8k(self.path / ("train.jsonl" if split == "train" else "test.jsonl"))
        if size > len(rows):
            field = "train_size" if split == "train" else "eval_size"
            raise ValueError(f"{field}={size}: more than the {len(rows)} problems of GSM8K's "
                             f"{'train' if split == 'train' else 'test'}.jsonl in {self.path}")
        if split == "train":
            rows = random.Random(seed).sample(rows, size)
        else:
            rows = rows[:size]  # the first `size` test problems: the same held-out set for every seed
        return [Problem(r["question"], gsm8k_gold(r["answer"]), {"solution": r["answer"]}) for r in rows]

    def score(self, problem: Problem, answer: str | None) -> float:
        return score_gsm8k(problem.answer, answer)


def load_task(name: str, *, data_path: str | None = None, compact: bool = False, options: dict | None = None):
    """`gsm8k` (needs `data_path`) or any reasoning-gym dataset name (graph_color, knights_knaves, chain_sum,
    basic_arithmetic, ...)."""
    if name == "gsm8k":
        if not data_path:
            raise ValueError("task gsm8k needs data_path=DIR (a directory with train.jsonl and test.jsonl)")
        if options:
            raise ValueError(f"task_options={show_options(options)}: task gsm8k takes no options")
        if compact:
            raise ValueError(f"compact=true: compact prompts exist for {', '.join(ARITHMETIC_TASKS)}, not 'gsm8k'")
        return Gsm8kTask(data_path)
    return ReasoningGymTask(name, compact=compact, **(options or {}))


def parse_options(items: tuple[str, ...] | list[str]) -> dict[str, Any]:
    """``("min_terms=2", "allow_negation=false")`` -> ``{"min_terms": 2, "allow_negation": False}``."""
    out: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise ValueError(f"task option {item!r} must look like key=value")
        key, value = (s.strip() for s in item.split("=", 1))
        if key in out:  # the last would win silently (min_digits=2, ..., min_digits=1 ran with 1)
            same = [i for i in items if i.split("=", 1)[0].strip() == key]
            raise ValueError(f"task option {key!r} is given twice ({', '.join(same)}); give each key once")
        low = value.lower()
        if low in ("true", "false"):
            out[key] = low == "true"
        else:
            try:
                out[key] = int(value)
            except ValueError:
                try:
                    out[key] = float(value)
                except ValueError:
                    out[key] = value
    return out


def train_and_heldout(task, train_size: int, eval_size: int, seed: int) -> tuple[list[Problem], list[Problem]]:
    """A training pool and a held-out set whose questions never occur in the pool (deterministic in `seed`).

    Small generated spaces (two 1-digit operands) repeat questions; held-out candidates that also occur in the
    pool are dropped, and more are drawn until `eval_size` remain (ValueError if the space is too small).
    """
    train = task.problems("train", train_size, seed)
    seen = {p.question for p in train}
    heldout: list[Problem] = []
    draw = eval_size
    for _ in range(6):
        try:
            drawn = task.problems("heldout", draw, seed)
        except ValueError:
            if draw == eval_size:
                raise
            break  # a finite held-out split (GSM8K's test file) has no more: say why eval_size is not reached
        found = len(heldout)
        heldout = [p for p in dict((p.question, p) for p in drawn).values() if p.question not in seen][:eval_size]
        if len(heldout) == eval_size:
            return train, heldout
        if draw > eval_size and len(heldout) == found:
            break  # twice the draw found no new question: the space is exhausted, more doublings only cost time
        draw *= 2
    raise ValueError(f"could only find {len(heldout)} held-out problems outside the {train_size}-problem training "
                     f"pool (eval_size={eval_size}): the others repeat a held-out question or occur in the pool; "
                     "widen the task, or shrink train_size or eval_size")
