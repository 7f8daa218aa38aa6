"""`targetpo reproduce --suite`: every experiment declares one suite, and the default runs the paper's only."""

import pytest

from targetpo import cli
from targetpo.experiments import EXPERIMENTS, SUITES, in_suite, suite_of


def test_every_experiment_declares_a_known_suite():
    assert {suite_of(n) for n in EXPERIMENTS} <= set(SUITES) - {"all"}


def test_suites_partition_the_experiments():
    parts = [in_suite(s) for s in SUITES if s != "all"]
    flat = [n for p in parts for n in p]
    assert len(flat) == len(set(flat)), "an experiment is in two suites"
    assert sorted(flat) == sorted(in_suite("all")) == sorted(EXPERIMENTS)
    paper, open_q = in_suite("paper"), in_suite("open-questions")
    assert "mnist" in paper and "mnist-replay" in open_q


def test_unknown_suite_is_refused():
    with pytest.raises(ValueError, match="suite='bogus'"):
        in_suite("bogus")


def test_reproduce_defaults_to_the_paper_suite():
    args = cli.build_parser().parse_args(["reproduce"])
    assert args.suite == "paper"


def test_the_llm_suites_time_in_reproduce_help_is_its_experiments_own():
    import re

    from targetpo.experiments import load

    times = {re.search(r"~\d+ min[^,;)]*", load(n).RUNTIME).group(0) for n in in_suite("llm")}
    assert times and all(t in SUITES["llm"] for t in times), (times, SUITES["llm"])
