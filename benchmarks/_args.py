"""The benchmarks' command lines: the main CLI's one-line argument errors and small `type=` validators."""

from __future__ import annotations

import argparse
from pathlib import Path

from targetpo.runs.config import OneLineParser


class Parser(OneLineParser):
    """The CLI's one-line errors (targetpo.runs.config.OneLineParser), with the description printed as written."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(*args, **kwargs)


def int_at_least(minimum: int):
    """A `type=` for an integer >= `minimum` (argparse names the option in its error)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{text!r}: must be at least {minimum}")
        return value

    parse.__name__ = f"integer >= {minimum}"  # argparse's fallback message names the type
    return parse


positive_int = int_at_least(1)
nonnegative_int = int_at_least(0)


def comma_choices(choices):
    """A `type=` for a comma-separated, non-empty list of names out of `choices` (returned as given)."""

    def parse(text: str) -> str:
        names = text.split(",")
        bad = [n for n in names if n not in choices]
        if bad:
            raise argparse.ArgumentTypeError(f"{', '.join(map(repr, bad))} not among {', '.join(choices)} "
                                             "(comma-separated)")
        return text

    return parse


def src_folder(text: str) -> str:
    """A `type=` for a source tree's src/ folder (e.g. `git archive COMMIT src | tar -x -C /tmp/old`, then
    /tmp/old/src). It must hold the targetpo package: a child run with it as PYTHONPATH would otherwise import the
    installed (editable) targetpo and time this checkout instead."""
    if not (Path(text) / "targetpo" / "__init__.py").is_file():
        raise argparse.ArgumentTypeError(f"{text!r}: not a src folder holding the targetpo package")
    return text
