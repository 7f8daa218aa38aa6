r"""The engine of every token-sequence experiment (paper §3.4–§3.7, §4, App. D–E; docs/method.md §4–§7,
docs/experiments.md §E4–§E11).

One call, :func:`run_trial`, trains one method on one task for S seeds at once (a seed axis through the model,
the optimizer and the losses) and reports per-episode metrics. Experiment modules call it once per unit.

API
---
``TrialConfig``
    Every knob of one trial (fields below). Build it with ``TrialConfig(...)`` or, from an experiment's
    config, ``trial_config(cfg, **overrides)`` (copies the fields the two share by name; ``methods=[...]`` also
    checks it for those methods, as ``check_trial(cfg, method)`` and run_trial do).

``run_trial(cfg, method, seeds, device="cpu", log=None, advance=None, check=None) -> dict[str, np.ndarray]``
    Trains ``method`` (a key of :data:`METHODS`) for ``cfg.episodes`` episodes on seeds ``seeds`` (a list of
    ints; seed s's initial parameters and prompts depend on s only). After each episode it calls
    ``log({"step": t, metric: [S values], ...})`` and ``advance()``; it returns ``{metric: [episodes, S]}``.
    Deterministic on CPU given (cfg, method, seeds). A seed's curve depends on the whole seed list, not on the
    seed alone: each seed's distinct rows are padded to the widest seed's count, and the padded length changes
    the summation order of the weight gradients (GEMMs reducing over rows) in the last bits, which training
    amplifies. Its initial model and prompts depend on the seed alone. ``device`` may be "cuda".

Metrics (per seed, measured on the episode's training rollout *before* the update, as the paper does):

- ``error`` — token-level and single-sample methods: 1 − mean behaviour reward over B·H tokens (bag: fraction
  of tokens wrong; sequential: 1 − normalised correct-prefix length; terminal: fraction of sequences with a
  mistake). Grouped methods: 1 − mean reward over all B·K·H sampled tokens (terminal: fraction of the B·K
  sequences with any mistake). Partial-credit reward is measured as terminal: the fraction of answers with a
  mistake.
- ``grad_norm`` — global L2 norm of the first epoch's raw gradient (per seed, before the optimizer; docs/experiments.md §E8).
- ``frac_success`` — grouped: fraction of groups with ≥ 1 successful candidate (sequence level: exact match;
  token level: a candidate with reward > 0, so under sequential reward only at states before the behaviour's
  first mistake); single-sample: fraction of exact-match rollouts.
- ``all_fail`` — 1 − frac_success (the paper's Fig. 11 "all-fail fraction"; docs/differences.md §7).
- ``frac_zero_var`` — grouped only: fraction of groups whose scores have population std ≤ 1e-6 or are all equal
  (``zero_variance_groups``: all-fail *and* all-success groups).
- ``weight_winners`` / ``weight_losers`` — the update weight on successful / failed samples, pooled over the
  batch (NaN when there are none): TPO q_i; GRPO |A_i|; Group PG |u_i|/η; PPO and REINFORCE mean_t |A|; DG
  mean_t |gate·A| (first epoch).

Methods (:data:`METHODS`; each names its loss in the objective registry ``targetpo.objectives.get``, whose
``needs_groups`` gives the rollout kind and ``multi_epoch_safe`` the epochs field; never re-implemented here):

====================  ==========  ============================================================  ===========
name                  rollout     loss (recomputed under θ every epoch; q / A / old log-probs frozen)  epochs
====================  ==========  ============================================================  ===========
reinforce             single      ``reinforce_loss``, A = r − mean_b r per position              epochs
ppo                   single      ``ppo_loss`` (ε = clip_eps), same A                            epochs
dg                    single      ``dg_loss`` (η = dg_eta), same A; gate from current log-probs  dg_epochs
tpo                   group       ``tpo_loss`` on sequence log-probs (Σ_t), η = tpo_eta          epochs
tpo_no_anchor         group       ``tpo_loss(anchor=False)``                                     epochs
group_pg              group       ``group_pg_loss`` (u/η, not renormalised)                      epochs
grpo / grpo_no_kl     group       ``grpo_loss`` on the sequence ratio, β = grpo_beta / 0          epochs
grpo_masked           group       ``grpo_loss(mask_zero_var=True)`` per seed                     epochs
tpo_token             token       ``tpo_token_loss`` over K candidate next tokens per state      epochs
grpo_token(_no_kl)    token       ``grpo_loss`` over K candidate tokens per state                epochs
====================  ==========  ============================================================  ===========

Rollouts: *single* samples one answer per prompt; *group* samples K independent full answers per prompt
(scores s_i = mean_t r_{i,t}, old log-score Σ_t log π_old); *token* follows one behaviour trajectory that takes
candidate 0 of K i.i.d. next-token samples at every state, each candidate scored at once (bag: correct token;
sequential: alive × correct, so every state after the behaviour's first mistake is a zero-variance group with
q = p_old). Sampling is temperature 1 with a preallocated KV cache (one row per distinct state, written in place;
a state keeps its row, and a split copies only the new rows); the prompt's keys/values are computed once and
shared by the K rollouts of a group, in sampling. Training runs every distinct prompt once and every distinct
(prompt, answer) pair once over its cached keys/values (identical inputs, identical log-probs), and shares
common prefixes too: the per-position layers run once per node of the prompts' prefix tree and of the
answers' prefix tree under their prompt (``AnswerPlan.prompt_tree`` / ``answer_tree``, used where they skip at
least 10 % of the positions; ``tokens.rows.PrefixTree``), which changes the numbers by float rounding only.
Token-level training reads all H states' next-token distributions from that one pass over the behaviour
trajectory (causal masking makes it identical to the authors' one pass per prefix state, H× cheaper).

Building an experiment on it: see ``dense.py`` / ``terminal.py``. A module's ``Config`` extends
``tokens.config.TokenConfig`` (every :class:`TrialConfig` field, declared once with help and bounds, plus seeds
and methods) with its sweep fields; its units name a (configuration, method) pair, and ``run_unit`` is one call:
``run_trial(trial_config(cfg, vocab=v), method, seed_list(cfg), ctx.device, ctx.log, ctx.advance,
ctx.check_finite)``.
``tokens.common`` also has the report helpers (steps-to-x, final and tail-mean errors, "ours (paper)" cells,
fastest-method claims, curve grids with ± s.e. bands). Lower-level pieces are public for diagnostics work:
``rollout``, ``answer_logp``, ``collect`` (→ ``Batch``), ``loss_fn``, ``diagnostics``.

Paper-vs-code choices (docs/differences.md), each a field: ``heads`` (2 as in the code, which reproduces the paper's
numbers; the text says 4), ``lr`` (1e-3 effective = the code's 10 × 1e-4), ``match`` + ``interaction_lr_scale``
(interaction-matched single-sample methods run B·K prompts at lr·√K), ``dg_epochs`` (1 in the code; App. E
uses 4), ``optimizer`` ("optax" = the paper's Muon/AdamW partition; "torch" = torch.optim.Muon + AdamW).
Losses of S seeds are summed (each seed's own mean), so each seed's gradient is exactly its own.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import torch
from torch import Tensor

from targetpo import objectives as obj
from targetpo.tokens import transformer as tfm
from targetpo.optim import OPTIMIZERS, make_optimizer
from targetpo.tokens import rows, tasks
from targetpo.runs.config import ETA_MIN, config_fields, param, validate
from targetpo.runs.runner import parse_device


@dataclass(frozen=True)
class Method:
    """An engine method: its loss is the registry objective `objective` (``targetpo.objectives.get``), whose
    `needs_groups` and `multi_epoch_safe` decide how the engine runs it."""

    objective: str
    summary: str
    per_state: bool = False  # groups are K candidate next tokens at every state, not K full answers

    @property
    def rollout(self) -> str:
        """"single" (one answer per prompt) when the objective needs no groups, else "token" (K candidate next
        tokens per state) or "group" (K full answers per prompt)."""
        if not obj.get(self.objective).needs_groups:
            return "single"
        return "token" if self.per_state else "group"

    @property
    def epochs_field(self) -> str:
        """The TrialConfig field giving its optimizer steps per episode: `dg_epochs` for an objective that is not
        multi-epoch safe (the paper's code: 1), `epochs` otherwise and for REUSED_ANYWAY."""
        o = obj.get(self.objective)
        return "epochs" if o.multi_epoch_safe or o.name in REUSED_ANYWAY else "dg_epochs"


# The paper's code steps REINFORCE and Group PG `epochs` times on each batch like the multi-epoch-safe methods,
# although neither has a ratio or frozen target to correct for the drift; kept so the paper's numbers reproduce.
REUSED_ANYWAY = ("reinforce", "group_pg")

METHODS: dict[str, Method] = {
    "reinforce": Method("reinforce", "REINFORCE, per-position batch-mean baseline"),
    "ppo": Method("ppo", "PPO clipped surrogate, per token"),
    "dg": Method("dg", "Delightful PG (sigmoid gate on surprisal × advantage)"),
    "tpo": Method("tpo", "TPO over K full rollouts (sequence level)"),
    "tpo_no_anchor": Method("tpo_no_anchor", "TPO with q = softmax(u/η), no p_old anchor"),
    "group_pg": Method("group_pg", "−Σ u_i log π(y_i), not renormalised"),
    "grpo": Method("grpo", "GRPO, sequence-level ratio, k3 KL to the rollout policy"),
    "grpo_no_kl": Method("grpo_no_kl", "GRPO with β = 0"),
    "grpo_masked": Method("grpo_masked", "GRPO dropping zero-variance groups"),
    "tpo_token": Method("tpo_token", "TPO over K candidate next tokens at each state", per_state=True),
    "grpo_token": Method("grpo", "GRPO over K candidate next tokens at each state", per_state=True),
    "grpo_token_no_kl": Method("grpo_no_kl", "GRPO_token with β = 0", per_state=True),
}
MATCHES = ("prompts", "interactions")
METRICS = ("error", "grad_norm", "frac_success", "all_fail", "frac_zero_var", "weight_winners", "weight_losers")

# Scores are rewards in [0, 1]: a std floor, shrinkage or noise beyond this overflows float32 (c² at 1e160, a
# noise of 1e300) inside the objectives, after the run folder is written.
SCORE_SCALE_MAX = 1e6


@dataclass(frozen=True)
class TrialConfig:
    """Every knob of one trial; :func:`trial_config` builds one from an experiment's config."""

    task: str = param("reverse_copy", "target of the answer", choices=tasks.TASKS)
    reward: str = param("bag", "bag (per-token), sequential (up to the first mistake), terminal (exact match) or "
                        "partial (fraction of correct tokens per answer; not in the paper)",
                        choices=tasks.REWARDS)
    length: int = param(10, "H, prompt length = answer length", ge=1)
    vocab: int = param(2, "V, token vocabulary size", ge=2)
    batch: int = param(100, "B, prompts per episode", ge=1)
    k: int = param(8, "K, candidates per group (full rollouts for sequence-level methods, next tokens for "
                   "token-level)", ge=2)
    episodes: int = param(1000, "episodes (one rollout batch + its update each)", ge=1)
    epochs: int = param(4, "optimizer steps per episode on the same batch (all methods but DG)", ge=1)
    dg_epochs: int = param(1, "DG's optimizer steps per episode (the authors' code: 1; App. E: 4)", ge=1)
    lr: float = param(1e-3, "effective learning rate of Muon and AdamW (the code's 10 × 1e-4)", gt=0)
    clip_eps: float = param(0.2, "PPO/GRPO clip range ε", gt=0, lt=1)
    grpo_beta: float = param(0.04, "GRPO's k3-KL weight β (to the rollout policy)", ge=0)
    dg_eta: float = param(1.0, "DG gate temperature η", ge=ETA_MIN)
    tpo_eta: float = param(1.0, "TPO target temperature η", ge=ETA_MIN)
    # Options beyond the paper (its §6 open questions; docs/method.md §8, docs/experiments.md §E14–§E16), all off
    # by default.
    tpo_projection: str = param("forward_kl", "how TPO fits its target: forward_kl (the paper), reverse_kl, js or "
                                "alpha (docs/method.md §8)", choices=obj.PROJECTIONS)
    tpo_alpha: float | None = param(None, "α of tpo_projection=alpha (1: forward KL, 0: reverse KL); only then",
                                    ge=0, le=1)
    tpo_kl_budget: float = param(0.0, "0: TPO's η is tpo_eta; > 0: η chosen per group so that KL(q ‖ p_old) is "
                                 "this budget (eta='adaptive', docs/method.md §8)", ge=0)
    std_floor: float = param(0.0, "σ_min, the smallest group std TPO's u and GRPO's A divide by (0: the paper's "
                             "z-score; docs/method.md §8)", ge=0, le=SCORE_SCALE_MAX)
    std_shrink: float = param(0.0, "c, TPO's and GRPO's group std becomes √(σ² + c²) (0: the paper's z-score)",
                              ge=0, le=SCORE_SCALE_MAX)
    score_noise: float = param(0.0, "σ of Gaussian noise added to every sequence-level candidate's score (0: none)",
                               ge=0, le=SCORE_SCALE_MAX)
    zero_all_fail: bool = param(False, "sequence-level groups in which no candidate is exactly right get equal "
                                "scores, so u = 0 and A = 0 (for partial-credit reward)")
    match: str = param("prompts", "prompts (every method sees B prompts) or interactions (single-sample methods "
                       "see B·K prompts)", choices=MATCHES)
    interaction_lr_scale: bool = param(True, "in interaction-matched runs, multiply single-sample methods' lr by "
                                       "√K (the code)")
    heads: int = param(2, "attention heads, a divisor of d_model = 64 (2 = the authors' code, which reproduces "
                       "the paper's numbers; the text says 4)", ge=1)
    optimizer: str = param("optax", "optax (the paper's Muon + Nesterov-AdamW partition) or torch "
                           "(torch.optim.Muon + AdamW)", choices=OPTIMIZERS)
    muon_full_step_norm: float = param(0.0, "τ: Muon's step is scaled by min(1, ‖M̂‖/τ), ‖M̂‖ a seed's momentum "
                                       "norm, so a vanishing gradient gives a vanishing step (late-training "
                                       "spikes, docs/experiments.md §E6); 0 = the paper's Muon (optax only)", ge=0)

    def validate(self) -> None:
        validate(self)
        self.check()

    def check(self) -> None:
        if 64 % self.heads:
            raise ValueError(f"heads={self.heads}: must divide d_model = 64")
        if self.muon_full_step_norm and self.optimizer != "optax":
            raise ValueError(f"muon_full_step_norm={self.muon_full_step_norm} needs optimizer='optax', got "
                             f"{self.optimizer!r}")
        if self.tpo_alpha is not None and 0 < self.tpo_alpha < obj.ALPHA_MIN:  # a denormal α: NaN at step 0
            raise ValueError(f"tpo_alpha={self.tpo_alpha!r}: must be 0 (reverse KL) or at least {obj.ALPHA_MIN:g}")
        if (self.tpo_projection == "alpha") != (self.tpo_alpha is not None):
            raise ValueError(f"tpo_alpha={self.tpo_alpha!r} with tpo_projection={self.tpo_projection!r}: tpo_alpha "
                             "is required by, and only read with, tpo_projection='alpha'")
        if self.zero_all_fail and self.reward == "terminal" and self.score_noise == 0:
            # 0/1 scores: an all-fail group already has equal scores, so zeroing it changes nothing
            raise ValueError("zero_all_fail=True with reward='terminal' and no score_noise changes nothing (an "
                             "all-fail group's exact-match scores are all 0 already); it is for partial credit or "
                             "noisy scores")
        if 0 < self.tpo_kl_budget < obj.adaptive_kl_floor(self.k):
            raise ValueError(f"tpo_kl_budget={self.tpo_kl_budget!r}: below {obj.adaptive_kl_floor(self.k):.3g}, the KL "
                             f"that a group of K = {self.k} may still have at the largest η the adaptive η tries "
                             "(docs/method.md §8), so it may be out of reach mid-run")


# Options of the objectives (hyperparameters, like tpo_eta: a run refuses one that none of its methods reads) and of
# the group scores (a change to the task: run_trial refuses one for a method that would not see it, since a run's
# methods would then be compared on different rewards).
TPO_OPTIONS = ("tpo_projection", "tpo_alpha", "tpo_kl_budget")
STD_OPTIONS = ("std_floor", "std_shrink")
GROUP_OPTIONS = ("score_noise", "zero_all_fail")
OPTION_KEYWORDS = {"tpo_projection": "projection", "tpo_alpha": "alpha", "tpo_kl_budget": "kl_budget",
                   "std_floor": "std_floor", "std_shrink": "std_shrink"}  # field -> the objective's keyword


def tpo_kwargs(cfg: "TrialConfig", target_only: bool = False) -> dict[str, Any]:
    """TPO's keyword options from the trial: η and the std options (or the adaptive η and its KL budget, which
    undoes any rescaling of u), and unless `target_only` the projection."""
    out: dict[str, Any] = ({"eta": "adaptive", "kl_budget": cfg.tpo_kl_budget} if cfg.tpo_kl_budget > 0
                           else {"eta": cfg.tpo_eta, "std_floor": cfg.std_floor, "std_shrink": cfg.std_shrink})
    if not target_only:
        out["projection"] = cfg.tpo_projection
        if cfg.tpo_alpha is not None:
            out["alpha"] = cfg.tpo_alpha
    return out


@functools.lru_cache(maxsize=None)
def objective_keywords(method: str) -> frozenset[str]:
    """The keywords `method`'s registry objective takes: what decides which of the trial's fields it reads (the
    registry's function, not a list kept here)."""
    return frozenset(inspect.signature(obj.get(METHODS[method].objective).fn).parameters)


def check_method_options(cfg: "TrialConfig", method: str) -> None:
    """ValueError when a change to the group scores (GROUP_OPTIONS) is set for a method that would not see it, or a
    KL budget for a method without the anchor it bounds. The objectives' options are METHOD_FIELDS: refused by a
    run's config when none of its methods reads them (tokens.config.TokenConfig.unread)."""
    fields = config_fields(TrialConfig)
    kind = METHODS[method].rollout
    bad = [f"{n}={getattr(cfg, n)!r}" for n in GROUP_OPTIONS if kind != "group" and getattr(cfg, n) != fields[n].default]
    if bad:
        raise ValueError(f"{', '.join(bad)}: changes the sequence-level group scores, which method {method!r} "
                         f"({kind} rollouts) does not have; the methods of one run must see the same rewards: run "
                         f"{method} without it")
    if cfg.tpo_kl_budget > 0 and getattr(obj.get(METHODS[method].objective).fn, "keywords", {}).get("anchor") is False:
        # The objective would refuse it at the first step, after the run folder is written.
        raise ValueError(f"tpo_kl_budget={cfg.tpo_kl_budget!r} with method {method!r}: a KL budget bounds "
                         "KL(q ‖ p_old), which needs the p_old anchor this method drops; use tpo or tpo_token")


# TrialConfig fields only some methods read (GROUP_OPTIONS, which change the rewards, are checked per method).
METHOD_FIELDS = ("k", "epochs", "dg_epochs", "clip_eps", "grpo_beta", "dg_eta", "tpo_eta", "match",
                 "interaction_lr_scale", *TPO_OPTIONS, *STD_OPTIONS)


def reads(cfg: "TrialConfig", method: str) -> set[str]:
    """The METHOD_FIELDS that `method` reads under `cfg`, read off how loss_fn calls its objective: K for grouped
    methods (single-sample ones only when interaction-matched), its epochs field, ε and β where the objective
    takes them (β unless the registry entry fixes it), η as DG's gate or TPO's target, the matching fields
    for single-sample methods, and the TPO and score options its objective takes."""
    m = METHODS[method]
    takes = objective_keywords(method)
    single = m.rollout == "single"
    out = {m.epochs_field}
    if "clip_eps" in takes:
        out.add("clip_eps")
    if "beta" in takes and _beta(cfg, obj.get(m.objective)):  # what loss_fn passes: β unless the entry fixes it
        out.add("grpo_beta")
    budget = not single and cfg.tpo_kl_budget > 0 and "kl_budget" in takes
    if "eta" in takes and not budget:
        out.add("dg_eta" if single else "tpo_eta")  # a KL budget chooses TPO's η per group instead
    # ... and undoes the std options' rescaling of u (docs/method.md §8)
    out |= {f for f in TPO_OPTIONS + STD_OPTIONS if OPTION_KEYWORDS[f] in takes and not (budget and f in STD_OPTIONS)}
    if not single:
        out.add("k")
    else:
        out.add("match")
        if cfg.match == "interactions":
            out |= {"k", "interaction_lr_scale"}
    return out


def check_trial(cfg: "TrialConfig", method: str) -> None:
    """ValueError for what run_trial(cfg, method, ...) refuses: an unknown method, a field out of bounds, a
    token-level method on a reward without per-state credit, a group option the method does not read."""
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; available: {', '.join(METHODS)}")
    cfg.validate()
    if METHODS[method].rollout == "token" and cfg.reward in ("terminal", "partial"):
        raise ValueError(f"{method} needs a dense reward (bag or sequential); {cfg.reward} reward has no per-state "
                         "credit: use the sequence-level methods (tpo, grpo, ...)")
    check_method_options(cfg, method)


def trial_config(cfg: Any, *, methods: Sequence[str] = (), **overrides) -> TrialConfig:
    """A TrialConfig from any config object carrying some of its fields by name, plus explicit overrides;
    checked for each engine method of `methods` as run_trial will (so a config's `check` refuses before a run)."""
    if isinstance(methods, str):  # a lone name would be read letter by letter
        raise ValueError(f"methods must be a sequence of method names, got the string {methods!r}; "
                         f"write methods=({methods!r},)")
    names = {f.name for f in dataclasses.fields(TrialConfig)}
    given = {n: getattr(cfg, n) for n in names if hasattr(cfg, n)}
    bad = set(overrides) - names
    if bad:
        raise ValueError(f"unknown TrialConfig fields {sorted(bad)}")
    tc = TrialConfig(**(given | overrides))
    tc.validate()
    for method in methods:
        check_trial(tc, method)
    return tc


def model_spec(cfg: TrialConfig) -> tfm.TransformerSpec:
    return tfm.TransformerSpec(vocab=cfg.vocab, max_len=2 * cfg.length, heads=cfg.heads)


def method_batch(cfg: TrialConfig, method: str) -> int:
    """Prompts per episode: interaction-matched single-sample methods see B·K (as many rollouts as a group)."""
    single = METHODS[method].rollout == "single"
    return cfg.batch * cfg.k if (single and cfg.match == "interactions") else cfg.batch


def method_lr(cfg: TrialConfig, method: str) -> float:
    single = METHODS[method].rollout == "single"
    if single and cfg.match == "interactions" and cfg.interaction_lr_scale:
        return cfg.lr * math.sqrt(cfg.k)
    return cfg.lr


def method_epochs(cfg: TrialConfig, method: str) -> int:
    return getattr(cfg, METHODS[method].epochs_field)


# ----------------------------------------------------------------------------- randomness

def _generators(seeds: Sequence[int], stream: int, device: torch.device) -> list[torch.Generator]:
    """One generator per seed and stream (prompts / sampling), seeded from (seed, stream) only."""
    out = []
    for s in seeds:
        state = int(np.random.SeedSequence([int(s), stream]).generate_state(1, dtype=np.uint64)[0] >> 1)
        out.append(torch.Generator(device=device).manual_seed(state))
    return out


def _uniform(gens: list[torch.Generator], shape: tuple[int, ...], device) -> Tensor:
    return torch.stack([torch.rand(shape, generator=g, device=device) for g in gens])


def sample_tokens(logp: Tensor, u: Tensor) -> Tensor:
    """Inverse-CDF categorical samples: logp [..., V], uniforms u [..., C] → token ids [..., C] (temperature 1)."""
    cdf = logp.exp().cumsum(dim=-1)
    idx = (u.unsqueeze(-1) >= cdf.unsqueeze(-2)).sum(dim=-1)
    return idx.clamp_max(logp.shape[-1] - 1)


# ----------------------------------------------------------------------------- rollouts

@dataclass
class Rollout:
    prompts: Tensor            # [S, B, H]
    target: Tensor             # [S, B, H]
    actions: Tensor            # [S, B, G, H]   G = K for group rollouts, else 1
    logp: Tensor               # [S, B, G, H]   rollout-time log-probs of the actions
    candidates: Tensor | None  # [S, B, H, C]   token rollouts: candidate 0 = the action
    cand_logp: Tensor | None   # [S, B, H, C]


@torch.no_grad()
def rollout(params: dict[str, Tensor], spec: tfm.TransformerSpec, prompts: Tensor, streams: int, candidates: int,
            gens: list[torch.Generator]) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None]:
    """KV-cached sampling of `streams` answers per prompt (each sampled independently), drawing `candidates`
    i.i.d. next tokens at every state of each stream and following candidate 0.

    Streams in the same state (same prompt, same tokens so far) share one model evaluation and one cache
    row: the K rollouts of a prompt start from one prompt pass, and a confident policy's streams stay merged.
    A state keeps its cache row for good: when its streams split, its first next state (the smallest token)
    stays in the row and each other one is copied to a new row after the rows in use (:func:`split_states`), so
    a step copies only the new rows' past. The cache grows to the widest seed's row count as it is reached
    (exactly, so that attention reads it without a copy), or holds the B·G rows streams can reach from the start
    where that is at most a quarter more than the prompts' (one stream per prompt: only repeated prompts split).

    Returns actions [S, B, G, H], their log-probs, and (if candidates > 1) candidates / their log-probs
    [S, B·G, H, C] (G = streams)."""
    s, b, h = prompts.shape
    g, c, dev, v = streams, candidates, prompts.device, spec.vocab
    rep_p, inv_p = _distinct(_row_ids(prompts, [v] * h))
    distinct_prompts = _take(prompts, rep_p)                                  # one pass per distinct prompt prefix
    logp_states, prompt_kv = tfm.prefill(params, distinct_prompts, spec,
                                         _worth_it(rows.prefix_tree(distinct_prompts, v)))
    cache = tfm.kv_cache(prompt_kv, spec)                                     # one row per distinct state
    if b * g <= 1.25 * cache[0][0].shape[1]:                                  # rows past the widest seed's are
        cache = _grown(cache, b * g)                                          # decoded too, and never read
    state = inv_p.repeat_interleave(g, dim=1)                                 # [S, B·G] each stream's row
    used = inv_p.amax(dim=1) + 1                                              # [S] rows in use
    acts, lps, cands, cand_lps = [], [], [], []
    for t in range(h):
        logp_t = _take(logp_states, state)                                    # [S, B·G, V]
        cand = sample_tokens(logp_t, _uniform(gens, (b * g, c), dev))          # [S, B·G, C]
        cand_lp = logp_t.gather(-1, cand)
        acts.append(cand[..., 0])
        lps.append(cand_lp[..., 0])
        if c > 1:
            cands.append(cand)
            cand_lps.append(cand_lp)
        if t + 1 < h:
            split = split_states(state, cand[..., 0], used, v)
            width = split.tokens.shape[1]
            if width > cache[0][0].shape[1]:                                  # grown exactly: read without a copy
                cache = _grown(cache, width)
            if split.copies is not None:                                      # new rows start as their parent
                seed, src, dst = split.copies
                for kv in cache:
                    for x in kv:
                        x[seed, dst] = x[seed, src]
            tokens = split.tokens
            if tokens.shape[1] < cache[0][0].shape[1]:
                tokens = torch.cat([tokens, tokens.new_zeros(s, cache[0][0].shape[1] - tokens.shape[1])], dim=1)
            out = tfm.decode(params, tokens.unsqueeze(-1), spec, start=h + t, cache=cache)
            logp_states, state, used = out[:, :, 0], split.state, split.used
    actions = torch.stack(acts, dim=-1).view(s, b, g, h)
    logp = torch.stack(lps, dim=-1).view(s, b, g, h)
    if c == 1:
        return actions, logp, None, None
    return actions, logp, torch.stack(cands, dim=2), torch.stack(cand_lps, dim=2)


_row_ids, _distinct, _is_identity, _take = rows.row_ids, rows.distinct, rows.is_identity, rows.take


def _grown(cache: list, rows: int) -> list:
    """The KV cache with zero rows added up to `rows` per seed."""
    return [tuple(torch.cat([x, x.new_zeros(x.shape[0], rows - x.shape[1], *x.shape[2:])], dim=1) for x in kv)
            for kv in cache]


@dataclass(frozen=True)
class Split:
    """The next states of a sampling step (:func:`split_states`)."""

    state: Tensor           # [S, M] each stream's cache row after the step
    used: Tensor            # [S] rows in use after the step
    tokens: Tensor          # [S, W] the token each row in use feeds next (W = the widest seed's rows; 0 past them)
    copies: tuple[Tensor, Tensor, Tensor] | None  # (seed, parent row, new row) of each new row, or None


def split_states(state: Tensor, token: Tensor, used: Tensor, vocab: int) -> Split:
    """Streams in cache rows `state` [S, M] take tokens `token` [S, M] in [0, vocab); `used` [S] rows are in use.
    The distinct (row, token) pairs are the next states: a row's pair with the smallest token keeps the row,
    each further pair of it takes the next free row."""
    s, m = state.shape
    rep, nxt = _distinct(state * vocab + token)               # pairs sorted by (row, token), so a row's are adjacent
    parent, tok = _take(state, rep), _take(token, rep)        # [S, U]
    u = rep.shape[1]
    valid = torch.arange(u, device=state.device) <= nxt.amax(dim=1, keepdim=True)   # a narrower seed's padding
    first = torch.ones_like(valid)
    first[:, 1:] = parent[:, 1:] != parent[:, :-1]
    extra = valid & ~first                                    # pairs that need a new row
    row = torch.where(extra, used.unsqueeze(1) + extra.long().cumsum(dim=1) - 1, parent)
    used_next = used + extra.sum(dim=1)
    width = int(used_next.max())
    # Padding pairs write their token to a scratch column past the last row, dropped after.
    tokens = torch.zeros(s, width + 1, dtype=token.dtype, device=token.device)
    tokens.scatter_(1, torch.where(valid, row, width), tok)
    copies = None
    if bool(extra.any()):
        seed = torch.arange(s, device=state.device).unsqueeze(1).expand(s, u)
        copies = (seed[extra], parent[extra], row[extra])
    return Split(_take(row, nxt), used_next, tokens[:, :width], copies)


@dataclass(frozen=True)
class AnswerPlan:
    """Which rows :func:`answer_logp` evaluates for one batch: integer bookkeeping that depends on the batch only,
    so an episode computes it once and every epoch reuses it."""

    prompts: Tensor     # [S, P, H] each seed's distinct prompts (padded with a repeat of the first)
    answers: Tensor     # [S, U, H−1] the inputs of each distinct (prompt, answer) pair after its prompt
    row_prompt: Tensor  # [S, U] the distinct prompt of each pair
    inverse: Tensor     # [S, B·G] the distinct pair of each batch row
    shape: tuple[int, int, int, int]  # actions' [S, B, G, H]
    prompt_tree: rows.PrefixTree | None = None  # the prompts' prefix tree, when sharing prefixes saves enough
    answer_tree: rows.PrefixTree | None = None  # the answers' prefix tree under their prompts, likewise


# A prefix tree replaces a row-by-row pass when it computes at most this share of the positions: below that
# saving its gathers cost more than the positions it skips (BENCHMARKS.md, "Token engine").
TREE_MAX_SHARE = 0.9


def _worth_it(tree: rows.PrefixTree) -> rows.PrefixTree | None:
    return tree if tree.nodes <= TREE_MAX_SHARE * tree.path[0].numel() else None


def answer_plan(prompts: Tensor, actions: Tensor, vocab: int) -> AnswerPlan:
    """The distinct prompts and distinct (prompt, answer) pairs of a batch (prompts [S, B, H], actions
    [S, B, G, H]), for :func:`answer_logp`."""
    s, b, g, h = actions.shape
    rep_p, inv_p = _distinct(_row_ids(prompts, [vocab] * h))                  # distinct prompts
    flat = actions.reshape(s, b * g, h)
    pid = inv_p.repeat_interleave(g, dim=1)                                    # prompt of each (b, g) row
    rows_ = torch.cat([pid.unsqueeze(-1), flat], dim=-1)
    rep_r, inv_r = _distinct(_row_ids(rows_, [rep_p.shape[1]] + [vocab] * h))  # distinct (prompt, answer) pairs
    distinct_prompts, answers, row_prompt = _take(prompts, rep_p), _take(flat, rep_r)[..., :-1], _take(pid, rep_r)
    answer_tree = None
    if h > 1:
        answer_tree = _worth_it(rows.prefix_tree(answers, vocab, roots=row_prompt, n_roots=rep_p.shape[1]))
    return AnswerPlan(distinct_prompts, answers, row_prompt, inv_r, (s, b, g, h),
                      _worth_it(rows.prefix_tree(distinct_prompts, vocab)), answer_tree)


def answer_logp(params: dict[str, Tensor], spec: tfm.TransformerSpec, prompts: Tensor, actions: Tensor,
                plan: AnswerPlan | None = None) -> Tensor:
    """Next-token log-probs [S, B, G, H, V] at every answer position under `params` (differentiable).

    Each distinct prompt of a seed is run once (its keys/values cached), then each distinct (prompt, answer)
    pair once over that cache; the results are gathered back to all B·G rows. Identical inputs have identical
    log-probs, so this is exact, and it is much cheaper once a policy repeats itself (K samples of a confident
    policy, or prompts that recur when V^H is small); autograd sums the gradients of duplicates. `plan`
    (:func:`answer_plan` of the same prompts and actions) skips recomputing which rows are distinct."""
    if plan is None:
        plan = answer_plan(prompts, actions, spec.vocab)
    elif plan.shape != tuple(actions.shape):
        raise ValueError(f"plan is for actions of shape {plan.shape}, got {tuple(actions.shape)}")
    s, b, g, h = actions.shape
    v = spec.vocab
    logp0, prefix = tfm.prefill(params, plan.prompts, spec, plan.prompt_tree)  # [S, P, V]
    first = _take(logp0, plan.row_prompt).unsqueeze(2)                         # [S, U, 1, V]
    if h > 1:
        past = [(_take(k, plan.row_prompt), _take(vv, plan.row_prompt)) for k, vv in prefix]
        rest, _ = tfm.extend(params, plan.answers, spec, start=h, past=past, tree=plan.answer_tree)
        first = torch.cat([first, rest], dim=2)                                 # [S, U, H, V]
    return _take(first, plan.inverse).view(s, b, g, h, v)


# ----------------------------------------------------------------------------- per-seed statistics

def _seed_mean(x: Tensor) -> Tensor:
    return x.reshape(x.shape[0], -1).float().mean(dim=1)


def _masked_seed_mean(x: Tensor, mask: Tensor) -> Tensor:
    """Per-seed mean of x over entries where mask is True; NaN for a seed with none."""
    m = mask.reshape(mask.shape[0], -1).float()
    return (x.reshape(x.shape[0], -1) * m).sum(dim=1) / m.sum(dim=1)


def _grad_norm(grads: list[Tensor]) -> Tensor:
    """Per-seed global L2 norm, summed in float64: squares of a finite float32 gradient above ~1e19 (Group PG at a
    tiny η) overflowed, and the inf marked a healthy unit diverged. Returned in the gradients' dtype."""
    sq = torch.stack([gr.reshape(gr.shape[0], -1).double().square().sum(dim=1) for gr in grads]).sum(dim=0)
    return sq.sqrt().to(grads[0].dtype)


# ----------------------------------------------------------------------------- one episode's batch and loss

@dataclass
class Batch:
    """Everything an episode's loss needs, frozen at rollout time."""

    prompts: Tensor
    actions: Tensor                  # [S, B, G, H]
    old_logp: Tensor                 # [S, B, G, H]
    rewards: Tensor                  # [S, B, G, H] per-token rewards of the actions
    error: Tensor                    # [S]
    scores: Tensor | None = None     # group: [S, B, K] sequence scores
    adv: Tensor | None = None        # single: [S, B, H]
    candidates: Tensor | None = None  # token: [S, B, H, K]
    cand_logp: Tensor | None = None
    cand_rewards: Tensor | None = None


def collect(params, spec: tfm.TransformerSpec, cfg: TrialConfig, method: str, prompts: Tensor,
            gens: list[torch.Generator], noise_gens: list[torch.Generator] | None = None) -> Batch:
    """Sample an episode's rollouts for `method` and compute its rewards, scores/advantages and error.
    `noise_gens` (one per seed) draw the score noise of `cfg.score_noise` > 0."""
    kind = METHODS[method].rollout
    target = tasks.targets(prompts, cfg.task, cfg.vocab)
    streams = cfg.k if kind == "group" else 1
    cands = cfg.k if kind == "token" else 1
    actions, logp, cand, cand_lp = rollout(params, spec, prompts, streams, cands, gens)
    rewards = tasks.token_rewards(actions, target.unsqueeze(2), cfg.reward)     # [S, B, G, H]
    # Partial credit is scored like terminal reward: the error is the fraction of answers with a mistake.
    err = rewards if cfg.reward != "partial" else tasks.token_rewards(actions, target.unsqueeze(2), "terminal")
    batch = Batch(prompts, actions, logp, rewards, error=1.0 - _seed_mean(err))
    if kind == "group":
        batch.scores = tasks.sequence_scores(rewards)
        if cfg.score_noise > 0:
            if noise_gens is None:
                raise ValueError(f"score_noise={cfg.score_noise}: collect needs noise_gens, one generator per seed")
            batch.scores = batch.scores + cfg.score_noise * _normal(noise_gens, batch.scores.shape[1:], prompts.device)
        if cfg.zero_all_fail:  # after the noise: an all-fail group's scores are equal (u = 0), noisy or not
            batch.scores = zero_all_fail_groups(batch.scores, tasks.exact_match(actions, target.unsqueeze(2)))
    elif kind == "single":
        r = rewards[:, :, 0]
        batch.adv = r - obj.batch_mean_baseline(r, dim=1)
    else:
        batch.candidates, batch.cand_logp = cand, cand_lp
        batch.cand_rewards = tasks.candidate_rewards(cand, target, cfg.reward)
        batch.error = 1.0 - _seed_mean(batch.cand_rewards[..., 0])
    return batch


def zero_all_fail_groups(scores: Tensor, success: Tensor) -> Tensor:
    """Scores [..., K] with every group that has no successful candidate (`success` [..., K] bool) set to 0:
    an equal-score group, so TPO's u = 0 (q = p_old) and GRPO's A = 0 there (docs/experiments.md §E16)."""
    return torch.where(success.any(dim=-1, keepdim=True), scores, torch.zeros_like(scores))


def _normal(gens: list[torch.Generator], shape: tuple[int, ...], device) -> Tensor:
    return torch.stack([torch.randn(shape, generator=g, device=device) for g in gens])


def _beta(cfg: TrialConfig, o: obj.Objective) -> dict[str, float]:
    """GRPO's β from the trial, unless the registry entry fixes it (grpo_no_kl: β = 0)."""
    return {} if "beta" in getattr(o.fn, "keywords", {}) else {"beta": cfg.grpo_beta}


def _std(cfg: TrialConfig) -> dict[str, float]:
    """GRPO's low-variance options, passed only when set (the paper's call is unchanged otherwise)."""
    return {k: getattr(cfg, k) for k in STD_OPTIONS if getattr(cfg, k) != 0}


def loss_fn(params, spec: tfm.TransformerSpec, cfg: TrialConfig, method: str, batch: Batch,
            check_logp: Callable[[Tensor], None] | None = None, plan: AnswerPlan | None = None) -> Tensor:
    """The method's loss on `batch` under `params`: the sum over seeds of each seed's own objective value.
    `check_logp` sees the log-probs before the objective does (the runner's divergence check); `plan` is
    ``answer_plan(batch.prompts, batch.actions, spec.vocab)``, computed once for all epochs on the batch."""
    s = batch.actions.shape[0]
    logp_v = answer_logp(params, spec, batch.prompts, batch.actions, plan)      # [S, B, G, H, V]
    if check_logp is not None:
        check_logp(logp_v)
    kind, o = METHODS[method].rollout, obj.get(METHODS[method].objective)
    if kind == "token":
        tok = logp_v[:, :, 0]                                                     # [S, B, H, V]
        if o.level == "token-candidates":
            out = o.fn(tok, batch.candidates, batch.cand_logp, batch.cand_rewards, **tpo_kwargs(cfg))
        else:
            lp = tok.gather(-1, batch.candidates)
            out = o.fn(lp, batch.cand_logp, batch.cand_rewards, clip_eps=cfg.clip_eps, **_beta(cfg, o),
                       **_std(cfg))
        return out.loss * s
    lp = logp_v.gather(-1, batch.actions.unsqueeze(-1)).squeeze(-1)               # [S, B, G, H]
    if kind == "single":
        lp, old = lp[:, :, 0], batch.old_logp[:, :, 0]
        if o.name == "ppo":
            out = o.fn(lp, old, batch.adv, clip_eps=cfg.clip_eps)
        elif o.name == "dg":
            out = o.fn(lp, batch.adv, eta=cfg.dg_eta)
        else:
            out = o.fn(lp, batch.adv)
        return out.loss * s
    seq, old_seq = lp.sum(dim=-1), batch.old_logp.sum(dim=-1)                    # [S, B, K]
    if o.name in ("tpo", "tpo_no_anchor"):
        out = o.fn(seq, old_seq, batch.scores, **tpo_kwargs(cfg))
    elif o.name == "group_pg":
        out = o.fn(seq, batch.scores, eta=cfg.tpo_eta)
    elif o.name == "grpo_masked":
        # Normalised by each seed's own number of informative groups (the paper's per-seed run), so per seed.
        return sum(o.fn(seq[i], old_seq[i], batch.scores[i], clip_eps=cfg.clip_eps, **_beta(cfg, o),
                        **_std(cfg)).loss for i in range(s))
    else:
        out = o.fn(seq, old_seq, batch.scores, clip_eps=cfg.clip_eps, **_beta(cfg, o), **_std(cfg))
    return out.loss * s


@torch.no_grad()
def diagnostics(cfg: TrialConfig, method: str, batch: Batch) -> dict[str, Tensor]:
    """Per-seed diagnostics (docs/experiments.md §E8) of an episode's batch (grad_norm is added by the training step)."""
    kind, name = METHODS[method].rollout, METHODS[method].objective
    out: dict[str, Tensor] = {}
    if kind == "single":
        ok = tasks.exact_match(batch.actions[:, :, 0], tasks.targets(batch.prompts, cfg.task, cfg.vocab))  # [S, B]
        out["frac_success"] = _seed_mean(ok)
        if name == "dg":
            w = obj.delight_gate(batch.old_logp[:, :, 0], batch.adv, cfg.dg_eta) * batch.adv
        else:
            w = batch.adv
        w = w.abs().mean(dim=-1)
    else:
        if kind == "group":
            scores, old = batch.scores, batch.old_logp.sum(dim=-1)
            ok = tasks.exact_match(batch.actions, tasks.targets(batch.prompts, cfg.task, cfg.vocab).unsqueeze(2))
        else:
            scores, old = batch.cand_rewards, batch.cand_logp
            ok = scores > 0
        out["frac_success"] = _seed_mean(ok.any(dim=-1))
        out["frac_zero_var"] = _seed_mean(obj.zero_variance_groups(scores))
        if name in ("tpo", "tpo_token", "tpo_no_anchor"):
            w = obj.tpo_target(old, scores, anchor=name != "tpo_no_anchor", **tpo_kwargs(cfg, target_only=True))
        elif name == "group_pg":
            w = obj.standardize_scores(scores).abs() / cfg.tpo_eta
        else:
            w = obj.group_advantages(scores, **_std(cfg)).abs()
    out["all_fail"] = 1.0 - out["frac_success"]
    out["weight_winners"] = _masked_seed_mean(w, ok)
    out["weight_losers"] = _masked_seed_mean(w, ~ok)
    return out


# ----------------------------------------------------------------------------- the trial

def run_trial(cfg: TrialConfig, method: str, seeds: Sequence[int], device: str | torch.device = "cpu",
              log: Callable[[dict], None] | None = None, advance: Callable[[], None] | None = None,
              check: Callable[[int, dict], None] | None = None) -> dict[str, np.ndarray]:
    """Train `method` on `cfg`'s task for seeds `seeds` (vectorised) and return {metric: [episodes, S]}.
    `check(episode, values)` (the runner's divergence check) sees the rollout and update log-probs and the
    parameters after each update."""
    check_trial(cfg, method)
    if isinstance(seeds, (str, bytes)) or not isinstance(seeds, Sequence) or not all(
            isinstance(x, (int, np.integer)) and not isinstance(x, bool) and x >= 0 for x in seeds):
        raise ValueError(f"seeds must be a sequence of integers >= 0 (one per vectorised seed), got {seeds!r}")
    seeds = [int(x) for x in seeds]
    if not seeds:
        raise ValueError("run_trial needs at least one seed")
    if len(set(seeds)) != len(seeds):  # a repeated seed is a copied row, counted twice in every seed interval
        raise ValueError(f"seeds must be distinct, got {seeds!r}")
    device = parse_device(device, name="device=")  # "no CUDA device", not an assertion deep inside torch
    spec = model_spec(cfg)
    params = tfm.init_params(spec, seeds, device)
    infos = tfm.param_info(spec)
    opt = make_optimizer(cfg.optimizer, params, infos, method_lr(cfg, method),
                         muon_full_step_norm=cfg.muon_full_step_norm)
    for p in params.values():
        p.requires_grad_(True)
    names = list(params)
    prompt_gens = _generators(seeds, 1, device)
    sample_gens = _generators(seeds, 2, device)
    noise_gens = _generators(seeds, 3, device) if cfg.score_noise > 0 else None
    batch_size, epochs = method_batch(cfg, method), method_epochs(cfg, method)
    history: dict[str, list[np.ndarray]] = {}
    for episode in range(cfg.episodes):
        prompts = tasks.sample_prompts(prompt_gens, batch_size, cfg.length, cfg.vocab, device)
        batch = collect(params, spec, cfg, method, prompts, sample_gens, noise_gens)
        if check is not None:
            check(episode, {"rollout log-probs": batch.old_logp})
        record = {"error": batch.error, **diagnostics(cfg, method, batch)}
        plan = answer_plan(batch.prompts, batch.actions, cfg.vocab)
        for e in range(epochs):
            # Finite weights can still overflow the logits; the check sees them before the objective does.
            loss = loss_fn(params, spec, cfg, method, batch,
                           None if check is None else lambda lp: check(episode, {"log-probs": lp}), plan)
            grads = torch.autograd.grad(loss, [params[k] for k in names])
            if e == 0:
                record["grad_norm"] = _grad_norm(grads)
            opt.step(params, dict(zip(names, grads)))
        values = {k: v.detach().cpu().numpy() for k, v in record.items()}
        for k, v in values.items():
            history.setdefault(k, []).append(v)
        if log is not None:
            log({"step": episode, **values})
        if check is not None:
            check(episode, {"parameters": params})
        if advance is not None:
            advance()
    return {k: np.stack(v) for k, v in history.items()}
