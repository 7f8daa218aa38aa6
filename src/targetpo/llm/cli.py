"""`targetpo rlvr`: RLVR training of a Hugging Face causal LM with TPO or a baseline, a thin front end over the
`rlvr` experiment (so runs get run.json, append-only metrics, resume and a report like every experiment)."""

from __future__ import annotations

import argparse


def _methods(objectives: str, seq_logp: str | None) -> str:
    """`--objective tpo,grpo --seq-logp mean` -> "tpo_mean,grpo"; `--seq-logp both` gives TPO twice. An item that
    is not an objective is refused here, naming the flag: a method name such as `tpo_sum` would otherwise pass
    through and silently ignore --seq-logp."""
    from targetpo.llm.experiment import BASE_OBJECTIVES, METHODS, method_objective

    items = [x.strip() for x in objectives.split(",")]
    if objectives.strip() and "" in items:  # "tpo,,grpo": a lost item, not a shorter list
        raise ValueError(f"--objective {objectives!r}: item {items.index('') + 1} is empty")
    out = []
    for o in (x for x in items if x):
        if o not in BASE_OBJECTIVES:
            # A method name (tpo_sum) is a TPO objective with its sequence log-score: say which flags give it.
            hint = ("; for TPO give --objective {} --seq-logp {} (or methods={})".format(*method_objective(o), o)
                    if o in METHODS else "")
            raise ValueError(f"--objective {objectives!r}: {o!r} is not an objective; allowed: "
                             f"{', '.join(BASE_OBJECTIVES)}{hint}")
        if o in ("tpo", "tpo_no_anchor"):
            reds = ("sum", "mean") if seq_logp == "both" else (seq_logp or "sum",)
            out += [f"{o}_{r}" for r in reds]
        else:
            out.append(o)
    if seq_logp is not None and not {"tpo", "tpo_no_anchor"} & set(items):
        raise ValueError(f"--seq-logp {seq_logp}: only TPO objectives (tpo, tpo_no_anchor) have a sequence "
                         f"log-score, and --objective {objectives!r} has none")
    return ",".join(out)


def rlvr_overrides(args) -> list[str]:
    """The `key=value` overrides of the `rlvr` experiment that `targetpo rlvr`'s flags stand for. A flag and the
    field it sets are refused together (which one should win is a guess); an empty flag value is an error, not
    the default."""
    overrides = list(args.overrides or [])
    given = {o.split("=", 1)[0].strip().replace("-", "_") for o in overrides}
    for flag, field in (("model", "model"), ("task", "task"), ("data_path", "data_path")):
        value = getattr(args, flag)
        if value is not None and field in given:
            raise ValueError(f"--{flag.replace('_', '-')} {value} and {field}=...: give either --"
                             f"{flag.replace('_', '-')} or {field}=..., not both")
        if value is not None:
            overrides.append(f"{field}={value}")
    if args.objective is not None or args.seq_logp:
        if "methods" in given:
            raise ValueError("give either --objective/--seq-logp or methods=..., not both")
        # An empty --objective is refused with every empty flag (targetpo.cli), so there is at least one method.
        overrides.append(f"methods={_methods(args.objective if args.objective is not None else 'tpo', args.seq_logp)}")
    return overrides  # task= (from --task too) resets task_options and compact: RLVRConfig.SETS_WITH


def add_rlvr_parser(subparsers) -> argparse.ArgumentParser:
    from targetpo.llm import experiment as rlvr
    from targetpo.runs.runner import add_runner_arguments
    from targetpo.runs.config import field_lines

    lines = ["config fields (key=value; defaults of the cpu preset, [allowed]):",
             *field_lines(rlvr.PRESETS["cpu"], width=34)]
    epilog = "\n".join([
        "examples:",
        f"  targetpo rlvr --preset cpu                      # TPO (sum, mean) vs GRPO on a tiny model, {rlvr.CPU_TIME} "
        "on 2 cores",
        "  targetpo rlvr --preset smoke --out runs/s       # seconds",
        "  targetpo rlvr --preset cpu --objective tpo,grpo,dapo --seq-logp both steps=300",
        "  targetpo rlvr --preset paper --model /path/to/Qwen3-1.7B --data-path /path/to/gsm8k --device cuda",
        "  targetpo rlvr --out runs/s --resume             # continue a killed run from its last checkpoint",
        "", *lines])
    p = subparsers.add_parser(
        "rlvr", help="RLVR-train a Hugging Face causal LM with TPO or a baseline (own single-process loop)",
        description="RLVR on verifiable rewards: K sampled completions per prompt, rewards from reasoning-gym or "
                    "GSM8K (math-verify), TPO or a GRPO-family objective, optional KL and LoRA. Runs the `rlvr` "
                    "experiment: a supervised warm start (if warmstart_steps > 0) shared by every method, then one "
                    "RL unit per method; writes run.json, metrics.jsonl, checkpoints and REPORT.md to --out.",
        epilog=epilog, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default=None, choices=list(rlvr.PRESETS),
                   help=f"smoke (seconds), cpu (tiny model on 2 CPU cores, {rlvr.CPU_TIME}; default) or paper (App. G: "
                        "Qwen3-1.7B on GSM8K, K=16, LoRA r=32, KL 1e-3; needs a GPU; untested here)")
    p.add_argument("--model", default=None, help="local Hugging Face model directory, never downloaded (sets model=; "
                   "default: the preset's, 'tiny' = the offline character-level Qwen2)")
    p.add_argument("--task", default=None, help="gsm8k or a reasoning-gym dataset (basic_arithmetic, chain_sum, "
                   "graph_color, knights_knaves, ...); resets task_options and compact unless they are also given")
    p.add_argument("--data-path", default=None, help="GSM8K directory with train.jsonl and test.jsonl (sets data_path=)")
    p.add_argument("--objective", default=None, help="comma-separated objectives to compare: tpo, tpo_no_anchor, "
                   "grpo, dr_grpo, dapo, gspo, sapo, cispo (sets methods=)")
    p.add_argument("--seq-logp", default=None, choices=("sum", "mean", "both"),
                   help="TPO's sequence log-score: sum of token log-probs (the paper), mean (length-normalised) "
                        "or both (two TPO runs); default sum")
    p.add_argument("--out", default=None, help="run directory (default results/rlvr-PRESET)")
    add_runner_arguments(p, unit="methods", partial="continues from its last checkpoint (checkpoint_every) "
                         "without rewriting the lines already on disk")
    p.add_argument("overrides", nargs="*", default=[], metavar="key=value", help="config overrides (fields below)")
    return p
