"""Write Reasoning Gym graph-coloring prompts as verl parquet files (train/test), fully offline.

python examples/verl/prepare_graph_color.py --out ~/data/graph_color --train 10000 --test 200
"""

import argparse
from pathlib import Path

import pandas as pd

from targetpo.integrations.verl_rewards import graph_color_rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="output directory for train.parquet/test.parquet")
    parser.add_argument("--train", type=int, default=10_000, help="number of training prompts")
    parser.add_argument("--test", type=int, default=200, help="number of held-out prompts")
    parser.add_argument("--seed", type=int, default=0, help="reasoning-gym seed (test uses seed + 1)")
    args = parser.parse_args()
    out = args.out.expanduser()
    out.mkdir(parents=True, exist_ok=True)
    for split, size, seed in (("train", args.train, args.seed), ("test", args.test, args.seed + 1)):
        pd.DataFrame(graph_color_rows(size, seed, split)).to_parquet(out / f"{split}.parquet")
        print(f"{out / f'{split}.parquet'}: {size} prompts")


if __name__ == "__main__":
    main()
