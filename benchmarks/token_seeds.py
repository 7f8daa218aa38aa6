"""What the token engine would gain from batching more models into one pass: the cost of an episode per seed at
several seed counts (BENCHMARKS.md, "Speed targets on a second 2-core machine").

The engine already runs an experiment's seeds as one batch of models (a leading seed axis through the model,
optimizer and losses). Running the methods of a configuration as one batch too (the smoke configuration's four
methods × 2 seeds as 8 models) can save at most what 8 vectorised seeds save over 2: the per-episode work that
does not grow with the seed count (Python, op dispatch, small-op overhead). This times `--episodes` episodes of
one method of the authors' smoke configuration (H = 10, V = 2, B = 100, K = 8) at each seed count of `--seeds`,
`--repeats` rounds interleaved (a run's median episode after its first, from the start of training: a confident
policy repeats rows, which the engine computes once), and prints the median over the rounds per episode and per
seed-episode. Batching different methods would cost more than this bound shows: their epochs differ (DG steps
once, the others four times), and each seed's distinct rows are padded to the widest seed's, so the records would
move by rounding. `--set KEY=VALUE ...` times another configuration (any field of the engine's TrialConfig):
the small-batch units of `reproduce` pay more per-episode work that does not grow with the seeds (the second
command: `dg-epochs`' variant units, 2 seeds each). `--profile N` then lists the N costliest ops of `--episodes`
episodes at the first seed count under `torch.profiler` (after the timed runs, which warm it up), per episode.

    python benchmarks/token_seeds.py --threads 2 --method tpo_token --seeds 2,8 --repeats 3
    python benchmarks/token_seeds.py --threads 1 --method dg --seeds 2,16 --repeats 2 --episodes 12 \
        --set task=copy length=6 batch=50 dg_epochs=4
    python benchmarks/token_seeds.py --threads 2 --seeds 2 --repeats 1 --episodes 8 --profile 12
"""

from __future__ import annotations

import statistics

import torch
from _args import Parser, nonnegative_int, positive_int  # benchmarks/ is on sys.path when run as a script
from token_forward import op_table
from tokens import SMOKE, TOKEN_METHODS, episode_seconds  # the configuration benchmarks/tokens.py times

from targetpo.runs.config import apply_overrides
from targetpo.tokens.engine import check_trial, run_trial, trial_config


def seed_counts(text: str) -> list[int]:
    """A `type=` for a comma-separated list of seed counts >= 1."""
    return [positive_int(part) for part in text.split(",")]


def main() -> None:
    parser = Parser(description=__doc__)
    parser.add_argument("--method", choices=TOKEN_METHODS, default="tpo_token", help="the method timed (default "
                        "tpo_token)")
    parser.add_argument("--seeds", type=seed_counts, default=[1, 2, 4, 8], help="comma-separated seed counts "
                        "(default 1,2,4,8)")
    parser.add_argument("--episodes", type=positive_int, default=15, help="episodes timed per run, after a first "
                        "one (default 15)")
    parser.add_argument("--repeats", type=positive_int, default=3, help="rounds over the seed counts, interleaved "
                        "(default 3)")
    parser.add_argument("--threads", type=positive_int, default=2, help="torch threads (default 2)")
    parser.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE", help="fields of the smoke "
                        "configuration to change (the engine's TrialConfig, e.g. batch=50 length=6)")
    parser.add_argument("--profile", type=nonnegative_int, default=0, metavar="N", help="then the N costliest ops "
                        "of --episodes episodes at the first seed count, per episode (default 0: none)")
    args = parser.parse_args()
    try:
        cfg = apply_overrides(SMOKE, args.set)
        check_trial(cfg, args.method)
    except ValueError as e:
        parser.error(f"--set: {e}")
    torch.set_num_threads(args.threads)
    episode_seconds(cfg, args.method, [0], 2)  # warm-up: first-call allocations and lazy initialisation
    runs: dict[int, list[float]] = {s: [] for s in args.seeds}
    for _ in range(args.repeats):
        for s in args.seeds:
            runs[s].append(episode_seconds(cfg, args.method, list(range(s)), args.episodes))
    where = "smoke configuration" + (f" with {' '.join(args.set)}" if args.set else "")
    print(f"{args.method}, {where}, {args.episodes} episodes after the first, {args.threads} thread(s), "
          f"median of {args.repeats} interleaved rounds\n")
    print("| seeds | ms an episode | ms a seed-episode | runs (ms an episode) |")
    print("|---|---|---|---|")
    for s, times in runs.items():
        med = statistics.median(times)
        print(f"| {s} | {1e3 * med:.1f} | {1e3 * med / s:.1f} | {' / '.join(f'{1e3 * t:.1f}' for t in times)} |")
    if args.profile:
        seeds = list(range(args.seeds[0]))
        print(op_table(lambda: run_trial(trial_config(cfg, episodes=args.episodes), args.method, seeds), args.profile,
                       n=args.episodes, what="episode", by_shape=False))


if __name__ == "__main__":
    main()
