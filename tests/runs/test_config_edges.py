"""Config parsing and the CLI at their edges: inclusive bounds, the words a bool or None may be written as, fixed
fields set to their own value, a stored config read back, empty arguments, a report path that is the user's file,
and the plots' tick and legend rules."""

import dataclasses
import json

import numpy as np
import pytest

from targetpo.cli import main
from targetpo.experiments import load, run_experiment
from targetpo.runs import plots
from targetpo.runs.config import INT_MAX, apply_overrides, config_from_dict, make_config, validate, validated


def _smoke(name):
    return make_config(load(name), "smoke")


def test_an_inclusive_upper_bound_admits_its_value():
    assert make_config(load("tabular-single"), "smoke", overrides=["baseline=1e6"]).baseline == 1e6
    with pytest.raises(ValueError, match="baseline"):
        make_config(load("tabular-single"), "smoke", overrides=["baseline=1.0000001e6"])


def test_the_last_seed_may_be_the_largest_integer():
    cfg = make_config(load("tabular-single"), "smoke", overrides=[f"seed={INT_MAX - 1}", "seeds=2"])
    assert cfg.seed + cfg.seeds - 1 == INT_MAX
    with pytest.raises(ValueError, match="seed"):
        make_config(load("tabular-single"), "smoke", overrides=[f"seed={INT_MAX}", "seeds=2"])


@pytest.mark.parametrize("word, value", [("false", False), ("False", False), ("off", False), ("no", False),
                                         ("0", False), ("true", True), ("True", True), ("YES", True), ("On", True),
                                         ("1", True)])
def test_bool_overrides_read_every_spelling(word, value):
    assert apply_overrides(_smoke("mnist"), [f"download={word}"]).download is value


@pytest.mark.parametrize("word", ["none", "None", "NULL", "null"])
def test_none_may_be_written_in_any_case(word):
    cfg = apply_overrides(_smoke("mnist"), ["data_dir=/somewhere"])
    assert apply_overrides(cfg, [f"data_dir={word}"]).data_dir is None


def test_a_fixed_pair_may_repeat_a_value():
    assert make_config(load("rlvr"), "smoke", overrides=["adam_betas=0.9,0.9"]).adam_betas == (0.9, 0.9)


def test_a_fixed_field_set_to_its_own_value_is_accepted_and_a_stored_config_reads_back():
    """An unused field keeps the base's default (token-ablations' dg_eta): its default read back from run.json is
    another float object of the same value, no change, so the round trip of a config (floats through JSON, tuples
    as lists) must validate on resume; another value is refused."""
    exp = load("token-ablations")
    cfg = _smoke("token-ablations")
    with pytest.raises(ValueError, match="dg_eta=2.0"):
        validate(dataclasses.replace(cfg, dg_eta=2.0))
    stored = json.loads(json.dumps(dataclasses.asdict(cfg)))
    assert validated(config_from_dict(exp, stored)) == cfg
    rlvr = _smoke("rlvr")
    assert validated(config_from_dict(load("rlvr"), json.loads(json.dumps(dataclasses.asdict(rlvr))))) == rlvr


def test_a_stored_config_with_a_field_this_version_dropped_still_reads():
    exp = load("tabular-single")
    cfg = _smoke("tabular-single")
    assert config_from_dict(exp, dataclasses.asdict(cfg) | {"gone_field": 1}) == cfg


@pytest.mark.parametrize("field, value, expected", [("lr", None, "lr=None"), ("seeds", True, "seeds=True"),
                                                    ("steps", 2.0, "steps=2.0")])
def test_validate_refuses_none_and_bool_where_a_number_is_expected(field, value, expected):
    with pytest.raises(ValueError, match=f"{expected}: expected"):
        validate(dataclasses.replace(_smoke("tabular-single"), **{field: value}))


def test_an_unknown_preset_is_named_with_the_presets_there_are():
    with pytest.raises(ValueError, match="has no preset 'nope'; presets: smoke, cpu, paper"):
        make_config(load("tabular-single"), "nope")


# ----------------------------------------------------------------------------- the CLI

@pytest.mark.parametrize("argv, message", [(["data", "gsm8k", "  "], "DIR is empty"),
                                           (["report", "RUNS", "-o", " "], "--output is empty")])
def test_blank_arguments_are_refused_before_anything_is_written(argv, message, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert list(tmp_path.iterdir()) == []


def test_words_after_rlvr_flags_are_overrides(tmp_path, capsys):
    pytest.importorskip("transformers")
    assert main(["rlvr", "steps=3", "--preset", "smoke", "--out", str(tmp_path / "r"), "lrr=1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown config field 'lrr'" in err[0], err
    assert not (tmp_path / "r").exists()


def test_reproduce_fresh_writes_into_a_folder_holding_other_files(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    argv = ["reproduce", "--only", "tabular-single", "--preset", "smoke", "--jobs", "1", "--out", str(out),
            "--no-progress"]
    assert main(argv) == 2                       # refused without --fresh
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]
    assert main(argv + ["--fresh"]) == 0
    assert (out / "notes.txt").read_text() == "mine" and (out / "REPORT.md").is_file()


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    return run_experiment("tabular-single", "smoke", out=tmp_path_factory.mktemp("t") / "run", progress=False,
                          quiet=True)


def test_report_replaces_its_own_default_file_but_never_a_user_file_given_with_o(tiny_run, tmp_path, capsys):
    (tiny_run / "REPORT.md").write_text("notes")
    assert main(["report", str(tiny_run)]) == 0  # the run's own REPORT.md is the report's to write
    assert (tiny_run / "REPORT.md").read_text().startswith("# targetpo report")
    mine = tmp_path / "notes.md"
    mine.write_text("# My notes\n")
    capsys.readouterr()
    assert main(["report", str(tiny_run), "-o", str(mine)]) == 2
    assert "holds a file that is not a targetpo report" in capsys.readouterr().err
    assert mine.read_text() == "# My notes\n"


# ----------------------------------------------------------------------------- plots

def test_x_ticks_are_integers_only_when_every_curve_is_on_integer_steps():
    fig, (ax,) = plots.figure(1)
    plots.curve(ax, np.linspace(0, 1, 5), np.linspace(0.9, 0.1, 5)[:, None] * np.ones((1, 2)), "fractional")
    plots.curve(ax, np.arange(2), np.array([[0.5, 0.5], [0.4, 0.4]]), "integer")
    plots.finish(ax, "t", "x", "y")
    fig.canvas.draw()
    ticks = ax.get_xticks()
    assert np.any(ticks != np.round(ticks)), ticks
    plots.pyplot().close(fig)


def test_each_reference_source_gets_its_legend_entry():
    fig, (ax,) = plots.figure(1)
    plots.curve(ax, np.arange(3), np.array([[0.5] * 2, [0.3] * 2, [0.1] * 2]), "TPO")
    plots.paper_points(ax, [1], [0.3], source="paper")
    plots.paper_points(ax, [2], [0.1], source="authors' code")
    plots.finish(ax, "t", "x", "y")
    plots.finish_figure(fig)
    texts = [t.get_text() for t in fig.legends[0].get_texts()]
    assert texts == ["TPO", "paper (hollow circles)", "authors' code (hollow circles)"]
    plots.pyplot().close(fig)


@pytest.mark.parametrize("lo, hi, one_two_five", [(0.01, 3.0, True), (0.01, 0.5, True), (1e-4, 0.5, False)])
def test_log_panels_under_three_decades_get_1_2_5_ticks(lo, hi, one_two_five):
    fig, (ax,) = plots.figure(1)
    plots.curve(ax, np.arange(2), np.array([[hi, hi], [lo, lo]]), "TPO")
    plots.finish(ax, "t", "x", "y", log=True, ylim=(lo, hi))
    lo_t, hi_t = ax.get_ylim()
    major = [t for t in ax.get_yticks() if lo_t <= t <= hi_t]
    mantissas = {round(t / 10 ** np.floor(np.log10(t)), 6) for t in major}
    assert ({2.0, 5.0} <= mantissas) is one_two_five, major
    plots.pyplot().close(fig)
