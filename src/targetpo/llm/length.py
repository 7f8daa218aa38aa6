"""TPO's sequence log-score at completion lengths of 60–250 tokens: sum vs mean vs length-scaled η.

TPO's group distribution is p = softmax over the K completions of their sequence log-scores. The paper sums the
token log-probs (§2, docs/method.md §2); the sum's spread over a group grows with the completion length, so at
LLM lengths p and the target q ∝ p·exp(u/η) are both near one-hot on the same completion and ‖p − q‖₁, the size
of the group-logit gradient p − q, collapses. The `rlvr` experiment's completions are a few tokens, too short to
tell. Here a tiny character-level LM writes a worked scratchpad for reasoning-gym `chain_sum` problems, one
verbose line per term (`c is +7, 3 + 7 = 10, total 10`: copies of the prompt and the line above around one
one-digit addition), 3–7 terms, 60–250 tokens, and five arms train from one warm start:

- `tpo_sum`: TPO on the summed token log-probs (the paper);
- `tpo_mean`: TPO on the mean token log-prob (length-normalised);
- `tpo_sum_len`: the sum with η scaled per group, η_g = η·L_ref/L̄_g (L̄_g the group's mean completion length;
  `eta_length_ref` in llm/trainer.py), so the score tilt u/η_g grows with length as the sum log-score does;
- `grpo` and `dr_grpo` (GRPO with a constant length normaliser, Liu et al. 2025), the usual baselines.

The reward is reasoning-gym's score of the final answer (`reward=answer`, the cpu preset: its warm start is
calibrated to 20–40 % held-out accuracy) or the fraction of the gold scratchpad's lines right before the first
wrong one (`reward=prefix`, partial credit for a warm start too weak for the final answer). Rollouts and greedy
evaluations use the KV-cached sampling loop (`sampler=kv_loop`, llm/rollout.py), the same draws as `generate`.

Every step logs, next to the trainer's metrics, what TPO's target looks like on that step's groups under each
of the three reductions (whatever arm sampled them): ‖p − q‖₁ and the target entropy H(q) over the groups with a
score spread, overall and by the group's mean completion length. Held-out accuracy is greedy decoding on
problems outside the training pool, overall and split at the median gold scratchpad length; length drift is the
change of the mean sampled completion length over training.
"""

from __future__ import annotations

import re
import string
from pathlib import Path

import numpy as np

from targetpo.llm import experiment as rlvr
from targetpo.llm.data import Problem, problems_fingerprint, train_and_heldout
from targetpo.llm.trainer import TrainerConfig
from targetpo.runs import plots
from targetpo.runs.config import config, default, param, swept, unused
from targetpo.runs.stats import Verdict, above, all_of, below, count, fmt, mean_se, paired_interval

NAME = "llm-length"
REQUIRES_EXTRA = "llm"  # transformers, reasoning-gym, math-verify: checked before the run folder is written
TITLE = "LLM sequence log-score at 60–250-token completions: TPO sum vs mean vs length-scaled η"
PAPER_REF = "§2, §6 (open questions); docs/experiments.md §E19"
SUITE = "llm"  # its own suite: ~45 min of CPU, more than the open-questions suite's whole budget
WARMSTART = rlvr.WARMSTART
# method -> (objective, seq_logp, length-scaled η)
ARMS = {"tpo_sum": ("tpo", "sum", False), "tpo_mean": ("tpo", "mean", False), "tpo_sum_len": ("tpo", "sum", True),
        "grpo": ("grpo", "sum", False), "dr_grpo": ("dr_grpo", "sum", False)}
METHODS = tuple(ARMS)
REDUCTIONS = ("sum", "mean", "sum_len")  # the three ways TPO's target is diagnosed on every step's groups
LABELS = {"tpo_sum": "TPO (sum)", "tpo_mean": "TPO (mean)", "tpo_sum_len": "TPO (sum, η·L_ref/L)", "grpo": "GRPO",
          "dr_grpo": "Dr. GRPO"}
REDUCTION_LABELS = {"sum": "sum", "mean": "mean", "sum_len": "sum, η·L_ref/L"}
COLORS = {"tpo_sum": "#d62728", "tpo_mean": "#ff7f0e", "tpo_sum_len": "#8c564b", "grpo": "#2ca02c",
          "dr_grpo": "#9467bd"}
LETTERS = string.ascii_lowercase  # one label per term: at most 26 terms
MIN_BUCKET_GROUPS = 5  # a length bucket with fewer groups is shown in the table only, not plotted or judged


@config
class Config(rlvr.Config):
    methods = default(METHODS, choices=METHODS,
                      help="compared arms: tpo_sum, tpo_mean, tpo_sum_len (sum with η_g = η·L_ref/L̄_g), grpo, "
                      "dr_grpo")
    min_terms: int = param(3, "fewest chain_sum terms (scratchpad lines); ~30 tokens a line", ge=2, le=len(LETTERS))
    max_terms: int = param(7, "most chain_sum terms (one letter label each, so at most 26)", ge=2,
                           le=len(LETTERS))
    length_edges: tuple[int, ...] = param((100, 150, 200), "completion-length bucket edges (tokens) of the by-length "
                                          "breakdown", ge=1, unique=True)
    len_ref: float = param(1.0, "L_ref of tpo_sum_len: η_g = η·L_ref/L̄_g (1 = η per token of completion)", ge=1e-6,
                           le=1e6)
    reward: str = param("answer", "answer: 1 iff the final answer is right (reasoning-gym's score); prefix: the "
                        "fraction of the gold scratchpad's lines (answer line included) right before the first wrong "
                        "one, the sequential reward of the token tasks (docs/method.md §6) at line level",
                        choices=("answer", "prefix"))
    # rlvr.Config's fields this experiment fixes: the task is the scratchpad chain_sum below
    model = unused("the tiny character-level model is built from the tiny_* fields")
    task = unused("the task is reasoning-gym chain_sum with a worked scratchpad (min_terms, max_terms)")
    task_options = unused("chain_sum options come from min_terms and max_terms")
    compact = unused("prompts are the labelled expression")
    data_path = unused("no data files: chain_sum is generated offline")
    template = unused("the plain template")
    lora_r = unused("full fine-tuning of the tiny model")
    lora_alpha = unused("full fine-tuning of the tiny model")
    eta_length_ref = swept("methods")
    READ_BY = {}  # η (and len_ref) are read by every arm: the step diagnostics compute TPO's target on all groups
    # rlvr.Config's defaults, re-chosen for long completions
    tiny_hidden = 128
    tiny_layers = 2
    tiny_intermediate = 256
    train_size = 4000
    eval_size = 64
    eval_batch = 64
    # The warm-start curve of this model on this scratchpad (lr 1e-3, batch 32; greedy held-out final-answer
    # accuracy, 64 problems): 0 % to step 100, 14 % at 300, 25 / 23 / 19 / 20 / 17 / 39 / 38 / 45 / 31 % at
    # 320, 325, ..., 360, 67 % at 400, 87 % at 600 (docs/experiments.md §E19; lr 3e-3 stalls at 0–6 %). 350 steps
    # start RL inside 20–40 %: room to learn, and groups of 8 sampled at T = 1 still get a spread.
    warmstart_steps = 350
    warmstart_until = 0.0  # the 350 steps themselves: evaluated every warmstart_steps // 4, a stop would land elsewhere
    warmstart_batch = 32
    warmstart_lr = 1e-3
    steps = 150
    # RL lr: from the 350-step warm start, lr 3e-4 (rlvr's) and 1e-4 drive held-out accuracy of TPO (sum) and GRPO
    # to ≤ 6 % within 10–30 steps; 3e-5 keeps every arm stable and lets them learn (measured, 30 steps).
    lr = 3e-5
    sampler = "kv_loop"
    k = 8
    batch_prompts = 4
    max_new_tokens = 256
    eval_every = 10
    checkpoint_every = 10

    def check(self) -> None:
        if self.min_terms > self.max_terms:
            raise ValueError(f"min_terms={self.min_terms} > max_terms={self.max_terms}")
        if tuple(sorted(self.length_edges)) != tuple(self.length_edges):
            raise ValueError(f"length_edges={self.length_edges} must be increasing")
        for m in self.methods:
            trainer_config(self, m, 0).validate()


PRESETS = {
    "smoke": Config(methods=("tpo_sum", "tpo_sum_len", "grpo"), seeds=1, tiny_hidden=32, tiny_layers=1,
                    tiny_heads=2, tiny_kv_heads=1, tiny_intermediate=64, min_terms=2, max_terms=3, train_size=100,
                    eval_size=8, eval_batch=8, warmstart_steps=4, warmstart_batch=8, steps=2, k=4, batch_prompts=2,
                    max_new_tokens=96, eval_every=1, checkpoint_every=1),
    # Measured with 1 torch thread on a 2-core machine shared with another job: see docs/experiments.md §E19.
    "cpu": Config(),
    # A ~3M-parameter model for a GPU (not run here). Its warm-start length is not calibrated: read the warm-start
    # curve in its report and set warmstart_steps where held-out accuracy is 20–40 %.
    "paper": Config(seeds=3, tiny_hidden=256, tiny_layers=4, tiny_heads=8, tiny_kv_heads=4, tiny_intermediate=768,
                    train_size=20000, eval_size=256, warmstart_steps=3000, warmstart_batch=64, steps=150,
                    batch_prompts=16, eval_every=10, checkpoint_every=10),
}
REPRODUCE_PRESET = "cpu"
JOBS_BY_DEFAULT = rlvr.JOBS_BY_DEFAULT  # a model copy per worker, as in rlvr
RUNTIME = ("tiny char-level LM writing 60–250-token chain_sum scratchpads: warm start to 20–40 % accuracy, then 5 arms, "
           "~45 min on one thread")


# ----------------------------------------------------------------------------- the task

def labelled_expression(terms: list[int]) -> str:
    """The prompt: each term with its letter, signs explicit after the first, e.g. [4, -1, 7] -> "a4 b-1 c+7 =".
    The letters let the model find term i by content (copy "c" -> "+7") instead of by counting characters."""
    if not 1 <= len(terms) <= len(LETTERS):
        raise ValueError(f"terms: {len(terms)} terms; the labels allow 1 to {len(LETTERS)}")
    parts = [f"{LETTERS[0]}{terms[0]}"] + [f"{LETTERS[i]}{t:+d}" for i, t in enumerate(terms[1:], 1)]
    return " ".join(parts) + " ="


def scratchpad(terms: list[int]) -> str:
    """The worked solution, one line per term, then the answer: [4, -1, 7] ->
    "a is 4, total 4\nb is -1, 4 - 1 = 3, total 3\nc is +7, 3 + 7 = 10, total 10\nanswer 10".
    Everything on a line but one number is a copy: the term from the prompt by its label, the previous total from
    the end of the line above, the new total once more at the line's end; the one new number is a one-digit step
    of the running sum with both operands next to it. So the length (~30 tokens a line) costs attention copies,
    which a tiny model learns fast, and the arithmetic stays a single small addition per line."""
    if not 1 <= len(terms) <= len(LETTERS):
        raise ValueError(f"terms: {len(terms)} terms; the labels allow 1 to {len(LETTERS)}")
    totals = np.cumsum(terms).tolist()
    lines = [f"{LETTERS[0]} is {terms[0]}, total {totals[0]}"]
    for i in range(1, len(terms)):
        op = "+" if terms[i] >= 0 else "-"
        lines.append(f"{LETTERS[i]} is {terms[i]:+d}, {totals[i - 1]} {op} {abs(terms[i])} = {totals[i]}, "
                     f"total {totals[i]}")
    return "\n".join(lines + [f"answer {totals[-1]}"])


_ANSWER = re.compile(r"(?:^|\n)answer (-?\d+)\s*$")  # the whole last line: "total 7answer 7" is no answer


def final_answer(completion: str) -> str | None:
    """The number on the completion's last line "answer N" (None if the completion does not end that way)."""
    m = _ANSWER.search(completion.strip())
    return m.group(1) if m else None


def expression_terms(expression: str) -> list[int]:
    """reasoning-gym chain_sum's expression "4 - 1 + 7" -> [4, -1, 7]."""
    tokens = expression.split()
    if len(tokens) % 2 == 0 or not all(t in ("+", "-") for t in tokens[1::2]):
        raise ValueError(f"expression {expression!r} is not 'n (+|-) n ...'")
    return [int(tokens[0])] + [int(n) if op == "+" else -int(n) for op, n in zip(tokens[1::2], tokens[2::2])]


class ScratchpadChainSum:
    """reasoning-gym chain_sum (1-digit terms) as labelled prompts with worked scratchpads; the reward is
    reasoning-gym's own score of the number after the last "answer" (scratchpad lines are not graded)."""

    name = "chain_sum"

    def __init__(self, min_terms: int, max_terms: int, reward: str = "answer"):
        import reasoning_gym as rg

        if reward not in ("answer", "prefix"):
            raise ValueError(f"reward={reward!r}: must be 'answer' or 'prefix'")
        self.reward = reward
        self.options = {"min_terms": min_terms, "max_terms": max_terms, "min_digits": 1, "max_digits": 1}
        self._scorer = rg.create_dataset("chain_sum", size=1, seed=0, **self.options)

    def problems(self, split: str, size: int, seed: int) -> list[Problem]:
        import reasoning_gym as rg

        from targetpo.llm.data import HELDOUT_SEED_OFFSET

        if split not in ("train", "heldout"):
            raise ValueError(f"split must be 'train' or 'heldout', got {split!r}")
        s = seed if split == "train" else seed + HELDOUT_SEED_OFFSET
        out = []
        for e in rg.create_dataset("chain_sum", size=size, seed=s, **self.options):
            terms = expression_terms(e["metadata"]["expression"])
            out.append(Problem(labelled_expression(terms), scratchpad(terms), e))
        return out

    def score(self, problem: Problem, answer: str | None) -> float:
        from targetpo.llm.rewards import score_reasoning_gym

        right = score_reasoning_gym(self._scorer, problem.entry, None if answer is None else final_answer(answer))
        if self.reward == "answer" or answer is None:
            return right
        if right == 1.0:
            return right
        # 1 is for a right final answer only: the gold's lines followed by more text (no final answer read)
        # reproduce every line but are no answer, so they get the credit of all lines but the last.
        lines = len(problem.answer.strip().split("\n"))
        return min(correct_prefix(problem.answer, answer), (lines - 1) / lines)


def correct_prefix(gold: str, completion: str) -> float:
    """The fraction of `gold`'s lines that `completion` reproduces, in order, before its first wrong line."""
    want, got = gold.strip().split("\n"), completion.strip().split("\n")
    n = 0
    while n < min(len(want), len(got)) and want[n] == got[n]:
        n += 1
    return n / len(want)


def problems(cfg: Config):
    from targetpo.llm.templates import Template

    task = ScratchpadChainSum(cfg.min_terms, cfg.max_terms, cfg.reward)
    train, heldout = train_and_heldout(task, cfg.train_size, cfg.eval_size, cfg.seed)
    return task, Template("plain"), train, heldout


# ----------------------------------------------------------------------------- diagnostics (pure)

def group_target_stats(old_logp, token_mask, rewards, eta: float, reduction: str, len_ref: float):
    """Per group of a rollout ([G, K, T] token log-probs and mask, [G, K] rewards): (‖p − q‖₁, H(q)) of TPO's
    target under one sequence log-score `reduction` ("sum", "mean", or "sum_len": the sum with
    η_g = η·L_ref/L̄_g). p = softmax of the K log-scores, q = tpo_target (objectives/tpo.py)."""
    import torch

    from targetpo.llm.trainer import length_scaled_eta
    from targetpo.objectives import tpo_target
    from targetpo.objectives.tpo import sequence_logp

    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction={reduction!r}: must be one of {REDUCTIONS}")
    seq = sequence_logp(old_logp, token_mask, "mean" if reduction == "mean" else "sum").double()
    r = rewards.double()
    if reduction == "sum_len":
        etas = length_scaled_eta(eta, len_ref, token_mask).tolist()
        q = torch.cat([tpo_target(seq[i:i + 1], r[i:i + 1], e) for i, e in enumerate(etas)])
    else:
        q = tpo_target(seq, r, eta)
    p = torch.softmax(seq, dim=-1)
    ent = -torch.where(q > 0, q * q.clamp_min(1e-300).log(), torch.zeros_like(q)).sum(-1)
    return (p - q).abs().sum(-1), ent


def length_bucket_names(edges: tuple[int, ...]) -> list[str]:
    """(100, 150) -> ["<100", "100-150", ">=150"]."""
    return [f"<{edges[0]}"] + [f"{a}-{b}" for a, b in zip(edges, edges[1:])] + [f">={edges[-1]}"]


def step_diagnostics(old_logp, token_mask, rewards, k: int, eta: float, len_ref: float,
                     edges: tuple[int, ...]) -> dict[str, float]:
    """One step's target diagnostics over the groups with a score spread (a zero-variance group has q = p):
    `pq_l1_{r}` and `target_entropy_{r}` (means) for each reduction r, and per length bucket b (by the group's
    mean completion length) the sums `len{i}_pq_l1_{r}`, `len{i}_target_entropy_{r}` and the count `len{i}_groups`,
    so the report can pool buckets over steps. Rows [N, T] are grouped N = G·K."""
    import torch

    from targetpo.objectives.scores import zero_variance_groups

    g = rewards.shape[0] // k
    lp, tm, r = old_logp.reshape(g, k, -1), token_mask.reshape(g, k, -1), rewards.reshape(g, k)
    spread = ~zero_variance_groups(r)
    lengths = tm.sum(-1).float().mean(-1)
    bucket = torch.bucketize(lengths, torch.tensor(edges, dtype=lengths.dtype), right=True)
    out: dict[str, float] = {"groups_with_spread": int(spread.sum())}
    for i in range(len(edges) + 1):
        out[f"len{i}_groups"] = int((spread & (bucket == i)).sum())
    for red in REDUCTIONS:
        if spread.any():
            l1, ent = group_target_stats(lp[spread], tm[spread], r[spread], eta, red, len_ref)
        else:
            l1 = ent = torch.zeros(0, dtype=torch.float64)
        b = bucket[spread]
        # A step without a spread group has nothing to average: 0 with groups_with_spread = 0 (the report
        # weights steps by that count, so such a step adds nothing).
        out[f"pq_l1_{red}"] = float(l1.mean()) if len(l1) else 0.0
        out[f"target_entropy_{red}"] = float(ent.mean()) if len(ent) else 0.0
        for i in range(len(edges) + 1):
            out[f"len{i}_pq_l1_{red}"] = float(l1[b == i].sum())
            out[f"len{i}_target_entropy_{red}"] = float(ent[b == i].sum())
    return out


# ----------------------------------------------------------------------------- units

def unit_name(method: str, s: int, cfg: Config) -> str:
    return method if cfg.seeds == 1 else f"{method}@seed{s}"


def units(cfg: Config) -> list[str]:
    """The warm start, then arm by arm (every seed of an arm before the next arm, in the order of `methods`): a
    run cut short holds complete paired seeds of its first arms, TPO sum and mean, which decide the default."""
    rl = [unit_name(m, s, cfg) for m in cfg.methods for s in range(cfg.seeds)]
    return ([WARMSTART] if cfg.warmstart_steps > 0 else []) + rl


unit_steps, unit_needs = rlvr.unit_steps, rlvr.unit_needs  # the warm start's steps, then every arm's from it


def trainer_config(cfg: Config, method: str, s: int) -> TrainerConfig:
    """The TrainerConfig of one (arm, seed) unit: the shared fields by name, the arm's objective and reduction."""
    if method not in ARMS:
        raise ValueError(f"unknown method {method!r}; methods: {', '.join(METHODS)}")
    objective, red, scaled = ARMS[method]
    shared = rlvr.trainer_fields(cfg, objective)  # η stays in cfg for every arm's step diagnostics
    return TrainerConfig(**{**shared, "objective": objective, "seq_logp": red, "seed": cfg.seed + s,
                            "eta_length_ref": cfg.len_ref if scaled else 0.0})


def data_source(cfg: Config) -> str:
    return (f"reasoning-gym chain_sum ({cfg.min_terms}–{cfg.max_terms} one-digit terms) with a worked scratchpad, "
            f"generated offline: pool of {cfg.train_size}, {cfg.eval_size} held-out problems not in the pool")


def heldout_split(heldout: list[Problem]) -> int:
    """The median gold scratchpad length (characters = tokens): held-out accuracy is also reported below / at or
    above it."""
    return int(np.median([len(p.answer) for p in heldout]))


def make_evaluator(cfg: Config, model, tok, task, template, heldout: list[Problem]):
    """Greedy held-out accuracy overall and on the short / long halves (by gold scratchpad length)."""
    from targetpo.llm.trainer import evaluate_greedy

    cut = heldout_split(heldout)
    halves = {"short": [p for p in heldout if len(p.answer) < cut], "long": [p for p in heldout if len(p.answer) >= cut]}

    def evaluate(problems=None) -> dict[str, float]:
        if problems is not None:
            return evaluate_greedy(model, tok, task, template, problems, max_new_tokens=cfg.max_new_tokens,
                                   batch_size=cfg.eval_batch, sampler=cfg.sampler)
        out, n_correct = {}, 0.0
        for name, probs in halves.items():
            if probs:
                acc = evaluate_greedy(model, tok, task, template, probs, max_new_tokens=cfg.max_new_tokens,
                                      batch_size=cfg.eval_batch, sampler=cfg.sampler)["heldout_accuracy"]
                out[f"heldout_accuracy_{name}"] = acc
                n_correct += acc * len(probs)
        out["heldout_accuracy"] = n_correct / len(heldout)
        return out

    return evaluate


def warm_start(cfg: Config, run_dir: Path, device, ctx, problem_sets: tuple) -> Path:
    """Build (or reuse) the warm-started model in RUN_DIR/warmstart (deterministic, so a rebuild is identical); the
    warm-start unit's work, on the unit's :func:`problems`. RL units read it through :func:`rlvr.warm_started`."""
    return rlvr.build_warm_start(cfg, run_dir, device, ctx, problem_sets, make_evaluator,
                                 eval_every=max(1, cfg.warmstart_steps // 4))


def run_unit(cfg: Config, unit: str, ctx) -> None:
    from transformers.utils import logging as hf_logging

    from targetpo.llm.models import load_model
    from targetpo.llm.trainer import RLVRTrainer

    hf_logging.disable_progress_bar()
    if ctx.run_dir is None:
        raise ValueError("the llm-length experiment keeps model files in the run directory; run it through "
                         "run_experiment")
    task, template, train, heldout = problems(cfg)  # one set for the fingerprint, the warm start and the trainer
    ctx.set_data_source(data_source(cfg), problems_fingerprint(train, heldout))
    if unit == WARMSTART:
        warm_start(cfg, ctx.run_dir, ctx.device, ctx, (task, template, train, heldout))
        return
    method, s = rlvr.parse_unit(unit)
    if cfg.warmstart_steps > 0:
        model, tok = load_model(rlvr.warm_started(ctx.run_dir, unit), cfg.dtype)
        model = model.to(ctx.device)
    else:
        model, tok = rlvr.base_model(cfg, ctx.device)
    tcfg = trainer_config(cfg, method, s)
    evaluate = make_evaluator(cfg, model, tok, task, template, heldout)

    class LengthTrainer(RLVRTrainer):
        """The RLVR trainer plus each step's target diagnostics and the split held-out evaluation."""

        def update(self, batch, step):
            diag = step_diagnostics(batch.old_logp, batch.completion_mask, batch.rewards, batch.k, cfg.eta,
                                    cfg.len_ref, tuple(cfg.length_edges))
            return {**diag, **super().update(batch, step)}

        def evaluate(self, problems=None):
            return evaluate(problems)

    trainer = LengthTrainer(model, tok, task, template, train, heldout, tcfg)
    ckpt = Path(ctx.run_dir) / "checkpoints" / f"{unit}.pt"
    trainer.train(cfg.steps, log=ctx.log, advance=ctx.advance, checkpoint=ckpt)
    ckpt.unlink(missing_ok=True)


# ----------------------------------------------------------------------------- report

def _mean_se(per_seed, digits: int = 3) -> str:
    """Seed mean ± s.e. with the population std, as every report (docs/experiments.md); one seed: the mean."""
    v = np.asarray(per_seed, dtype=float)
    if v.size < 2:
        return f"{v.mean():.{digits}f}"
    mean, se = mean_se(v)
    return f"{mean:.{digits}f} ± {se:.{digits}f}"


def finished_series(run, metric: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """method -> (steps, values [steps, seeds]) over the finished units only (a run cut short leaves a unit
    half-done; its steps would truncate every seed's curve to the common ones)."""
    by: dict[str, list] = {}
    for unit in run.units():
        if unit == WARMSTART or unit not in run.done_units():
            continue
        steps, vals = run.series(unit, metric)
        if len(steps):
            by.setdefault(rlvr.parse_unit(unit)[0], []).append(dict(zip(steps.tolist(), vals[:, 0].tolist())))
    out = {}
    for method, per_seed in by.items():
        common = sorted(set.intersection(*(set(d) for d in per_seed)))
        out[method] = (np.array(common), np.array([[d[t] for d in per_seed] for t in common]).reshape(len(common), -1))
    return out


def per_seed_over(run, metric: str, steps: slice) -> dict[str, np.ndarray]:
    """method -> per-seed mean of `metric` over the slice of its recorded steps."""
    return {m: vals[steps].mean(axis=0) for m, (_, vals) in finished_series(run, metric).items() if len(vals)}


def paired(run, metric: str, a: str, b: str, mean_over_steps: bool = False):
    """(step, seeds, values of arm a, values of arm b) at the last step both recorded `metric`, over the seeds both
    ran (or each seed's mean over their common steps with `mean_over_steps`); None without a common seed and step."""
    per: dict[str, dict[int, dict]] = {a: {}, b: {}}
    for unit in run.units():
        if unit == WARMSTART:
            continue
        method, s = rlvr.parse_unit(unit)
        if method in per and unit in run.done_units():
            steps, vals = run.series(unit, metric)
            per[method][s] = dict(zip(steps.tolist(), vals[:, 0].tolist()))
    seeds = sorted(set(per[a]) & set(per[b]))
    common = sorted(set.intersection(*[set(per[m][s]) for m in (a, b) for s in seeds])) if seeds else []
    if not common:
        return None
    if mean_over_steps:
        va = np.array([np.mean([per[a][s][t] for t in common]) for s in seeds])
        vb = np.array([np.mean([per[b][s][t] for t in common]) for s in seeds])
    else:
        va, vb = (np.array([per[m][s][common[-1]] for s in seeds]) for m in (a, b))
    return common[-1], seeds, va, vb


def summary(run) -> str:
    acc = finished_series(run, "heldout_accuracy")
    if not acc:
        return "no RL unit has a held-out accuracy record yet"
    return "held-out accuracy start -> end: " + ", ".join(
        f"{LABELS.get(m, m)} {v[0].mean():.3f} -> {v[-1].mean():.3f}" for m, (s, v) in acc.items())


def report(run, section) -> None:
    cfg = run.config
    section.text(__doc__.split("\n\n", 1)[1])
    section.text(f"Tiny character-level Qwen2 ({cfg['tiny_hidden']} hidden, {count(cfg['tiny_layers'], 'layer')}); chain_sum "
                 f"with {cfg['min_terms']}–{cfg['max_terms']} one-digit terms; K = {cfg['k']}, B = "
                 f"{cfg['batch_prompts']} prompts, {cfg['steps']} RL steps, AdamW lr {cfg['lr']}, η = {cfg['eta']}, "
                 f"L_ref = {cfg['len_ref']}, warm start {cfg['warmstart_steps']} supervised steps; "
                 f"{count(cfg['seeds'], 'paired seed')}; intervals are ± s.e. over seeds.")
    acc = finished_series(run, "heldout_accuracy")
    if not acc:
        section.text("No RL unit finished yet.")
        return
    expected = [m if cfg["seeds"] == 1 else f"{m}@seed{s}" for m in cfg["methods"] for s in range(cfg["seeds"])]
    unfinished = [u for u in expected if u not in run.done_units()]
    if unfinished:
        section.text(f"Not finished (left out of the tables, the plots and the finding): {', '.join(unfinished)}.")
    ws = run.series(WARMSTART, "heldout_accuracy") if WARMSTART in run.units() else ([], [])
    lens = finished_series(run, "completion_len")
    reward = finished_series(run, "reward")
    n = max(1, cfg["steps"] // 5)
    drift_start, drift_end = per_seed_over(run, "completion_len", slice(0, n)), per_seed_over(run, "completion_len",
                                                                                               slice(-n, None))
    short, long_ = finished_series(run, "heldout_accuracy_short"), finished_series(run, "heldout_accuracy_long")
    rows = []
    for m in (m for m in METHODS if m in acc):
        a = acc[m][1]
        rows.append([LABELS[m], _mean_se(a[0]), _mean_se(a[-1]), _mean_se(a[-1] - a[0]),
                     _mean_se(short[m][1][-1]) if m in short else "–", _mean_se(long_[m][1][-1]) if m in long_ else "–",
                     _mean_se(reward[m][1].mean(axis=0)) if m in reward else "–",
                     _mean_se(drift_start[m], 1) if m in drift_start else "–",  # tokens: one decimal
                     _mean_se(drift_end[m] - drift_start[m], 1) if m in drift_end else "–"])
    section.table(["method", "held-out acc (start)", "held-out acc (end)", "Δ acc", "end: short half", "end: long half",
                   "train reward (all steps)", f"completion length, tokens (first {count(n, 'step')})", f"length drift (last {n} − first {n})"],
                  rows, "Per arm from the shared warm start (seed means ± s.e.; held-out halves split at the median "
                  "gold scratchpad length)")

    # ‖p − q‖₁ and H(q) by completion length, pooled over every arm's rollouts, per seed
    edges = tuple(cfg["length_edges"])
    names = length_bucket_names(edges)
    done = [u for u in run.units() if u != WARMSTART and u in run.done_units()]  # as the tables above
    seeds = sorted({rlvr.parse_unit(u)[1] for u in done})
    bucket_rows, l1_by, l1_seeds = [], {}, {}
    for i, b in enumerate(names):
        row = [b]
        counts = [sum(float(run.series(u, f"len{i}_groups")[1][:, 0].sum()) for u in done
                      if rlvr.parse_unit(u)[1] == s) for s in seeds]
        row.append(f"{int(sum(counts))}")
        for stat in ("pq_l1", "target_entropy"):
            for red in REDUCTIONS:
                by_seed = {}
                for s, c in zip(seeds, counts):
                    tot = sum(float(run.series(u, f"len{i}_{stat}_{red}")[1][:, 0].sum()) for u in done
                              if rlvr.parse_unit(u)[1] == s)
                    if c:
                        by_seed[s] = tot / c
                per_seed = list(by_seed.values())
                row.append(_mean_se(per_seed) if per_seed else "–")
                if stat == "pq_l1" and per_seed and sum(counts) >= MIN_BUCKET_GROUPS:
                    l1_by[(b, red)] = float(np.mean(per_seed))
                    l1_seeds[(b, red)] = by_seed
        bucket_rows.append(row)
    section.table(["mean completion length (tokens)", "groups"] + [f"‖p − q‖₁ ({REDUCTION_LABELS[r]})" for r in REDUCTIONS]
                  + [f"H(q) ({REDUCTION_LABELS[r]})" for r in REDUCTIONS], bucket_rows,
                  "TPO's target on the sampled groups with a score spread, by the group's mean completion length "
                  f"(all arms' rollouts pooled; η = {cfg['eta']}, K = {cfg['k']}, log K = {np.log(cfg['k']):.2f}; the plot and the "
                  f"claims use buckets with ≥ {MIN_BUCKET_GROUPS} groups)")

    fig, axes = plots.figure(3, nrows=2)  # five panels in one row would be too wide to read
    axes[5].set_visible(False)
    if not len(ws[0]):
        axes[4].set_visible(False)
    for m, (steps, vals) in acc.items():
        plots.curve(axes[0], steps, vals, LABELS.get(m, m), COLORS.get(m))
    plots.finish(axes[0], "Held-out accuracy (greedy)", "RL step (updates)", "accuracy (fraction correct)",
                 ylim=rlvr.ACCURACY_AXIS)
    for m, (steps, vals) in reward.items():
        plots.curve(axes[1], steps, rlvr._smooth(vals, n), LABELS.get(m, m), COLORS.get(m))
    # Rewards are in [0, 1]: the axis as rlvr's (no negative values, stops just above the data).
    top = min(1.0, max(0.05, 1.15 * max((float(rlvr._smooth(v, n).max()) for _, v in reward.values()), default=0)))
    plots.finish(axes[1], f"Training reward ({cfg.get('reward', 'answer')}; moving average, {count(n, 'step')})",
                 "RL step (updates)", "mean reward per completion", ylim=(-0.02 * top, top))
    for m, (steps, vals) in lens.items():
        plots.curve(axes[2], steps, rlvr._smooth(vals, n), LABELS.get(m, m), COLORS.get(m))
    plots.finish(axes[2], f"Completion length (moving average, {count(n, 'step')})", "RL step (updates)",
                 "mean sampled completion length (tokens)")
    centers = [edges[0] / 2] + [(a + b) / 2 for a, b in zip(edges, edges[1:])] + [edges[-1] + 25]
    for red, color in zip(REDUCTIONS, ("#d62728", "#ff7f0e", "#8c564b")):
        xs = [c for c, b in zip(centers, names) if (b, red) in l1_by]
        if not xs:  # an arm not run, or no bucket with enough groups: no empty legend entry
            continue
        axes[3].plot(xs, [l1_by[(b, red)] for b in names if (b, red) in l1_by], "o-", color=color,
                     label=f"TPO {REDUCTION_LABELS[red]}")
    if not l1_by:
        axes[3].text(0.5, 0.5, f"no length bucket with ≥ {MIN_BUCKET_GROUPS} groups", transform=axes[3].transAxes,
                     ha="center", va="center", fontsize=9, color="0.4")
    plots.finish(axes[3], "‖p − q‖₁ by completion length", "group mean completion length (tokens; bucket centre)",
                 "‖p − q‖₁ (gradient size on the group logits)", ylim=(0.0, 2.0))
    if len(ws[0]):
        axes[4].plot(ws[0], np.asarray(ws[1])[:, 0], color="k", lw=1.6, label="warm start")
        plots.finish(axes[4], "Supervised warm start", "SFT step (updates)", "held-out accuracy (fraction correct)",
                     ylim=rlvr.ACCURACY_AXIS)
    section.figure(fig, "llm_length_curves", "Held-out accuracy, training reward, completion length (mean ± s.e. "
                   "over seeds), and TPO's ‖p − q‖₁ by length (seed mean)")

    # the finding: does mean (or length-scaled η) beat sum at these lengths? Paired by seed, at the last step both
    # arms recorded (a run cut short compares what it has); a verdict needs the 95 % interval over seeds to clear 0.
    rewards = {m: paired(run, "reward", m, "tpo_sum", mean_over_steps=True) for m in ("tpo_mean", "tpo_sum_len")}
    for m, rew in rewards.items():
        pair = paired(run, "heldout_accuracy", m, "tpo_sum")
        if pair is None:
            continue
        step, seeds_, va, vb = pair
        gap = paired_interval(va, vb)
        section.claim(f"{LABELS[m]} is more accurate on held-out problems than TPO (sum) (paired over seeds, at step "
                      f"{step})", above(gap, 0),
                      f"{LABELS[m]} {_mean_se(va)} vs {_mean_se(vb)}; paired difference {gap.show(3)} over "
                      f"seed{'s' if len(seeds_) != 1 else ''} {', '.join(map(str, seeds_))}; training reward (mean over common steps) difference "
                      f"{paired_interval(rew[2], rew[3]).show(4) if rew else '–'}")
    filled = [b for b in names if (b, "sum") in l1_by and (b, "mean") in l1_by]
    if filled:
        parts = [bucket_gap(l1_seeds[(b, "sum")], l1_seeds[(b, "mean")], 0.5) for b in filled]
        section.claim("At these lengths the sum's ‖p − q‖₁ is under half the mean's in every length bucket (the "
                      "group-logit gradient collapses with the sum)",
                      all_of(below(iv, 0) for iv in parts),
                      "; ".join(f"{b}: sum {fmt(l1_by[(b, 'sum')])}, mean {fmt(l1_by[(b, 'mean')])}, sum − mean/2 "
                                f"{iv.show(3)}" for b, iv in zip(filled, parts)))
    if len(filled) > 1:
        first, last = filled[0], filled[-1]
        shrink = bucket_gap(l1_seeds[(last, "sum")], l1_seeds[(first, "sum")], 1.0)
        section.claim("With the sum, ‖p − q‖₁ shrinks from the shortest to the longest completions",
                      below(shrink, 0),
                      f"sum {fmt(l1_by[(first, 'sum')])} ({first}) -> {fmt(l1_by[(last, 'sum')])} ({last}), paired "
                      f"difference {shrink.show(3)}; mean {fmt(l1_by[(first, 'mean')])} -> "
                      f"{fmt(l1_by[(last, 'mean')])}")
    findings = [verdict(LABELS[m], rew) for m, rew in rewards.items()]
    if any(findings):
        section.text("**Finding** (training reward averaged over the common steps, paired by seed; a difference "
                     "counts when its 95 % interval over seeds excludes 0): " + " ".join(f for f in findings if f))


def bucket_gap(a: dict[int, float], b: dict[int, float], scale: float):
    """Paired interval over the seeds both hold of a − scale·b (per-seed bucket means of ‖p − q‖₁)."""
    seeds = sorted(set(a) & set(b))
    return paired_interval(np.array([a[s] for s in seeds]), scale * np.array([b[s] for s in seeds]))


def verdict(label: str, pair) -> str | None:
    """One sentence: does `label` beat TPO (sum) on the paired per-seed values of `pair` (see :func:`paired`)? Better
    or worse only when the 95 % paired interval over seeds excludes 0; one seed has no interval."""
    if pair is None:
        return None
    _, seeds, va, vb = pair
    gap = paired_interval(va, vb)
    word = ("better than" if above(gap, 0) is Verdict.PASS else "worse than" if below(gap, 0) is Verdict.PASS else
            "not distinguishable from")
    return (f"{label} is {word} TPO (sum): {fmt(float(va.mean()))} vs {fmt(float(vb.mean()))}, paired difference "
            f"{gap.show(4)} over {count(len(seeds), 'seed')}.")
