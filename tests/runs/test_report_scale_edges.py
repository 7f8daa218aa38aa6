"""The report's bookkeeping at its edges: which config fields measure a run's length, how a run's size is ranked,
which changes from a preset count as overrides, and the headline's tally of claims that got no verdict (what `-o`
refuses is in test_report_edges.py)."""

from pathlib import Path

import pytest

from targetpo.experiments import load
from targetpo.report import Section, claim_count, is_larger, length_fields, preset_overrides, run_scale
from targetpo.runs.config import make_config
from targetpo.runs.runner import Progress
from targetpo.runs.stats import Verdict
from targetpo.runs.store import Run

NOWHERE = Path("/nonexistent")
UNFINISHED = Progress(finished=(), partial={"tpo": (3, 10)}, missing=())


def _run(experiment: str, preset: str, config: dict, name: str = "r") -> Run:
    """A run as read back from run.json, with no metrics."""
    return Run(NOWHERE / name, {"experiment": experiment, "preset": preset, "status": "complete", "config": config})


def _section(preset: str, claims: int, progress: Progress | None = None, name: str = "r") -> Section:
    """A section of `claims` claims, each PASS on its seed interval."""
    s = Section("t", Run(NOWHERE / name, {"preset": preset}), NOWHERE, progress=progress)
    for i in range(claims):
        s.claim(f"claim {i}", Verdict.PASS, "e")
    return s


# --- how long a run is --------------------------------------------------------------------------------------


def test_an_unknown_experiment_is_measured_by_its_steps_or_episodes():
    """An experiment this version does not know: `steps` or `episodes`, whichever its config has."""
    assert length_fields("no-such-experiment") == ("steps", "episodes")
    run = _run("no-such-experiment", "cpu", {"episodes": 40, "seeds": 3})
    assert run_scale(run)[1:] == (40, 3)


def test_dg_epochs_is_measured_by_its_parts_lengths():
    """dg-epochs fixes `episodes` and sets a length per part: those parts' fields measure it (docstring)."""
    assert length_fields("dg-epochs") == ("terminal_episodes", "variant_episodes")


def test_a_run_s_length_adds_up_every_part():
    """run_scale counts the steps or episodes "in all": 400 terminal + 300 variant episodes are 700."""
    run = _run("dg-epochs", "cpu", {"terminal_episodes": 400, "variant_episodes": 300, "seeds": 3})
    assert run_scale(run) == (0, 700, 3)  # cpu is VERDICT_PRESETS[0]


def test_presets_rank_smoke_below_cpu_below_paper():
    """The rank is the preset's place in VERDICT_PRESETS (cpu, paper); a preset outside them ranks below both."""
    config = {"steps": 100, "seeds": 5, "methods": ["pg", "tpo"]}
    smoke, cpu, paper = (_run("tabular-single", p, config, p) for p in ("smoke", "cpu", "paper"))
    assert run_scale(smoke)[0] < run_scale(cpu)[0] < run_scale(paper)[0]
    # A larger preset is a larger run even with fewer steps and seeds.
    short_paper = _run("tabular-single", "paper", {"steps": 50, "seeds": 2, "methods": ["pg", "tpo"]}, "p2")
    assert is_larger(short_paper, cpu) and not is_larger(cpu, short_paper)
    assert is_larger(cpu, smoke) and not is_larger(smoke, cpu)


# --- overrides ----------------------------------------------------------------------------------------------


def test_a_longer_part_of_dg_epochs_keeps_the_preset_s_protocol():
    """A longer run is no override; for dg-epochs "longer" is read on its parts' lengths, a shorter part is one."""
    exp = load("dg-epochs")
    preset = exp.PRESETS["cpu"].terminal_episodes
    longer = make_config(exp, "cpu", overrides=[f"terminal_episodes={preset + 100}"])
    assert preset_overrides(exp, "cpu", longer) == {}
    shorter = make_config(exp, "cpu", overrides=[f"terminal_episodes={preset - 100}"])
    assert preset_overrides(exp, "cpu", shorter) == {"terminal_episodes": (preset - 100, preset)}


def test_every_method_in_another_order_is_no_override():
    """The preset's own methods listed in another order are a subset of them: the same protocol."""
    exp = load("tabular-single")
    methods = exp.PRESETS["cpu"].methods
    cfg = make_config(exp, "cpu", overrides=["methods=" + ",".join(reversed(methods))])
    assert tuple(cfg.methods) != tuple(methods)
    assert preset_overrides(exp, "cpu", cfg) == {}


@pytest.mark.parametrize("preset", ["custom", None])
def test_a_preset_this_version_does_not_define_has_no_overrides(preset):
    """There is no preset to compare with, so nothing is listed (and nothing raises)."""
    exp = load("tabular-single")
    assert preset_overrides(exp, preset, make_config(exp, "cpu", overrides=["lr=0.05"])) == {}


# --- the headline's tally -----------------------------------------------------------------------------------


def test_one_preset_is_named_in_the_singular():
    """The docstring's form: "... inconclusive** over the cpu preset", with no plural for one preset."""
    assert claim_count([_section("cpu", 1)]) == "**1 PASS, 0 FAIL, 0 inconclusive** over the cpu preset"


def test_an_incomplete_run_s_preset_is_not_named_among_the_judged():
    """Verdicts come only from complete runs: an incomplete paper run adds no "paper" to "over the ... preset"."""
    sections = [_section("cpu", 1, name="a"), _section("paper", 2, UNFINISHED, name="b")]
    assert claim_count(sections) == ("**1 PASS, 0 FAIL, 0 inconclusive** over the cpu preset; "
                                     "2 claims n/a on incomplete runs")


def test_no_complete_verdict_run_is_told_apart_from_no_verdict_preset():
    """A cpu run that is incomplete beside a smoke run: the cpu preset could test the claims, it is unfinished."""
    sections = [_section("smoke", 1, name="a"), _section("cpu", 2, UNFINISHED, name="b")]
    assert claim_count(sections) == ("no verdicts (no cpu or paper run is complete); 1 claim n/a on smoke runs; "
                                     "2 claims n/a on incomplete runs")


def test_claims_of_an_incomplete_smoke_run_are_counted_as_incomplete():
    """Its claims read "n/a (run incomplete)" in its section, and the headline counts them the same way."""
    s = _section("smoke", 2, UNFINISHED)
    assert "| claim 0 | n/a (run incomplete) |" in s.render()
    assert claim_count([s]) == ("no verdicts (only the cpu and paper presets can test a claim); "
                                "2 claims n/a on incomplete runs")


def test_a_run_without_claims_adds_nothing_to_the_tally():
    """A section with no claims (a NOT RUN placeholder, say) is not "0 claims n/a on smoke runs"."""
    sections = [_section("smoke", 0, name="a"), _section("cpu", 1, name="b")]
    assert claim_count(sections) == "**1 PASS, 0 FAIL, 0 inconclusive** over the cpu preset"


def test_claims_n_a_on_one_preset_add_up_over_its_runs():
    """Two smoke runs with 2 and 3 claims: 5 claims n/a on smoke runs."""
    sections = [_section("smoke", 2, name="a"), _section("smoke", 3, name="b")]
    assert claim_count(sections).endswith("; 5 claims n/a on smoke runs")
