"""Regenerate what is written from the config declarations: the README's experiment table (between
`<!-- experiments:start -->` and `<!-- experiments:end -->`) and docs/config.md.

    python tools/gen_docs.py            # rewrite both
    python tools/gen_docs.py --check    # exit 1 if either is out of date
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from targetpo.experiments import EXPERIMENTS, load
from targetpo.runs.config import config_doc, experiment_table

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
CONFIG_DOC = ROOT / "docs" / "config.md"
START, END = "<!-- experiments:start -->", "<!-- experiments:end -->"


def readme_text(current: str) -> str:
    """`current` with the text between the markers replaced by the generated experiment table."""
    if START not in current or END not in current:
        raise ValueError(f"README.md needs the markers {START} and {END} around the experiment table")
    head, rest = current.split(START, 1)
    _, tail = rest.split(END, 1)
    table = experiment_table([load(n) for n in EXPERIMENTS])
    return f"{head}{START}\n{table}\n{END}{tail}"


def config_text() -> str:
    return config_doc([load(n) for n in EXPERIMENTS]) + "\n"


def outputs() -> dict[Path, str]:
    return {README: readme_text(README.read_text()), CONFIG_DOC: config_text()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="regenerate the README experiment table and docs/config.md")
    parser.add_argument("--check", action="store_true", help="only report whether they are up to date")
    args = parser.parse_args(argv)
    stale = [p for p, text in outputs().items() if not p.exists() or p.read_text() != text]
    if args.check:
        for p in stale:
            print(f"{p.relative_to(ROOT)} is out of date: run python tools/gen_docs.py", file=sys.stderr)
        return 1 if stale else 0
    for p, text in outputs().items():
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
