"""The token experiments of §3.5, §3.7, §4 and Apps. D–E: smoke runs through the shared runner and reports, unit
naming, what each unit hands to the engine, config checks, and the shared report helpers."""

import numpy as np
import pytest
import torch

from targetpo.experiments import load
from targetpo.tokens import engine as te
from targetpo.tokens import report as tr
from targetpo.experiments import run_experiment
from targetpo.runs.config import make_config
from targetpo.report import write_report
from targetpo.runs.store import Run


@pytest.fixture(autouse=True)
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _smoke(name, tmp_path):
    out = run_experiment(name, "smoke", out=tmp_path / name, progress=False, quiet=True, threads=1)
    run = Run.load(out)
    assert run.done_units() == set(run.units())
    return out, run, write_report(out).read_text()


# ----------------------------------------------------------------------------- smoke runs + reports

def test_token_variants_smoke(tmp_path):
    out, run, text = _smoke("token-variants", tmp_path)
    methods = ("tpo_token", "grpo_token", "dg", "ppo")
    assert run.units() == [f"{v}/{m}" for v in ("bag/copy", "sequential/reverse_flip") for m in methods]
    steps, err = run.series("sequential/reverse_flip/tpo_token", "error")
    assert list(steps) == [0, 1, 2] and err.shape == (3, 2) and ((err >= 0) & (err <= 1)).all()
    assert "Table 2" in text and "(81)" in text and "(276)" in text and "applied as **prompts**" in text
    assert (out / "token_variants.png").exists()
    assert text.count("| Under sequential reward") == 2
    assert "episodes to 1% error" in load("token-variants").summary(run)


def test_token_ablations_smoke(tmp_path):
    out, run, text = _smoke("token-ablations", tmp_path)
    assert run.units() == [f"h3/{m}" for m in ("tpo", "grpo", "grpo_no_kl", "tpo_no_anchor", "group_pg")]
    assert "Fig. 8" in text and "Removing the anchor" in text and (out / "token_ablations.png").exists()
    # terminal error of K full answers: at H = 3 some answers are right, some wrong
    _, err = run.series("h3/tpo", "error")
    assert err.shape == (3, 2) and 0 < err.mean() < 1


def test_token_diagnostics_smoke(tmp_path):
    out, run, text = _smoke("token-diagnostics", tmp_path)
    assert run.units() == ["tpo", "tpo_1ep", "grpo", "grpo_no_kl", "ppo", "dg"]
    for metric in ("error", "grad_norm", "all_fail", "weight_winners", "weight_losers"):
        assert run.series("tpo_1ep", metric)[1].shape == (3, 2)
    assert run.series("tpo", "frac_zero_var")[1].shape == (3, 2)
    assert "all-fail fraction at initialisation" in text and "0.586" in text     # (7/8)^4 at H = 3, K = 4
    assert "trailing mean over 1 episode," in text
    assert (out / "token_diagnostics.png").exists()


def test_token_sweeps_smoke(tmp_path):
    out, run, text = _smoke("token-sweeps", tmp_path)
    # K sweep at 2 epochs (k2, k4), epoch sweep at K = 4 (ep1; ep2 is shared with the K sweep), masking adds
    # grpo_masked: shared configurations run once.
    assert run.units() == ["k2/ep2/tpo", "k4/ep2/tpo", "k2/ep2/grpo", "k4/ep2/grpo", "k4/ep1/tpo", "k4/ep1/grpo",
                           "k4/ep2/grpo_masked"]
    assert "Fig. 12" in text and "Fig. 13" in text and "Fig. 15" in text and "| 29.7 |" in text
    assert (out / "token_sweeps.png").exists()


def test_token_temperature_smoke(tmp_path):
    out, run, text = _smoke("token-temperature", tmp_path)
    assert run.units() == ["eta0.5", "eta2"]
    assert "Table 5" in text and "(67)" in text and "level=token" in text
    assert (out / "token_temperature.png").exists()


def test_dg_epochs_smoke(tmp_path):
    out, run, text = _smoke("dg-epochs", tmp_path)
    assert run.units() == ["terminal/ep1", "terminal/ep4", "bag/copy/ep1", "bag/copy/ep4", "sequential/flip/ep1",
                           "sequential/flip/ep4"]
    assert run.series("terminal/ep4", "error")[1].shape == (3, 2)
    assert run.series("bag/copy/ep4", "error")[1].shape == (3, 1)            # variant_seeds = 1
    assert "Fig. 17" in text and "(48.3)" in text and "(4.56)" in text and (out / "dg_epochs.png").exists()


# ----------------------------------------------------------------------------- what each unit asks the engine

def test_variants_interaction_matching_is_a_noop_with_token_methods(capture, unit_ctx):
    exp = load("token-variants")
    cap = capture(tr)
    cfg = make_config(exp, "smoke", overrides=["match=interactions"])
    exp.run_unit(cfg, "bag/copy/dg", unit_ctx)
    assert cap.calls[-1][0].match == "prompts"
    cfg = make_config(exp, "smoke", overrides=["match=interactions", "methods=dg,tpo"])
    exp.run_unit(cfg, "sequential/flip/dg", unit_ctx)
    trial, method, seeds = cap.calls[-1]
    assert (trial.match, trial.task, trial.reward, method, seeds) == ("interactions", "flip", "sequential", "dg",
                                                                      [0, 1])


def test_named_variants_and_sweep_units_reach_the_engine(capture, unit_ctx):
    cap = capture(tr)
    diag = load("token-diagnostics")
    diag.run_unit(make_config(diag, "smoke"), "tpo_1ep", unit_ctx)
    assert (cap.calls[-1][0].epochs, cap.calls[-1][1]) == (1, "tpo")
    diag.run_unit(make_config(diag, "smoke"), "tpo", unit_ctx)
    assert (cap.calls[-1][0].epochs, cap.calls[-1][1]) == (4, "tpo")
    sweeps = load("token-sweeps")
    sweeps.run_unit(make_config(sweeps, "smoke"), "k16/ep8/grpo_masked", unit_ctx)
    assert (cap.calls[-1][0].k, cap.calls[-1][0].epochs, cap.calls[-1][1]) == (16, 8, "grpo_masked")
    temp = load("token-temperature")
    temp.run_unit(make_config(temp, "smoke", overrides=["level=sequence"]), "eta0.25", unit_ctx)
    assert (cap.calls[-1][0].tpo_eta, cap.calls[-1][1]) == (0.25, "tpo")
    temp.run_unit(make_config(temp, "smoke"), "eta4", unit_ctx)
    assert (cap.calls[-1][0].tpo_eta, cap.calls[-1][1]) == (4.0, "tpo_token")


def test_dg_epochs_units_set_dg_epochs_and_seeds(capture, unit_ctx):
    exp = load("dg-epochs")
    cap = capture(exp)
    cfg = make_config(exp, "paper")
    exp.run_unit(cfg, "terminal/ep4", unit_ctx)
    trial, method, seeds = cap.calls[-1]
    assert (method, trial.dg_epochs, trial.reward, trial.length, trial.batch, trial.episodes, len(seeds)) == \
        ("dg", 4, "terminal", 5, 256, 2000, 20)
    exp.run_unit(cfg, "sequential/reverse_copy/ep1", unit_ctx)
    trial, method, seeds = cap.calls[-1]
    assert (trial.dg_epochs, trial.task, trial.length, trial.batch, trial.episodes, seeds) == \
        (1, "reverse_copy", 10, 100, 1000, list(range(10)))


# ----------------------------------------------------------------------------- presets and config checks

def test_paper_presets_follow_the_paper():
    c = make_config(load("token-variants"), "paper")
    assert (c.seeds, c.episodes, len(c.variants), c.length, c.batch, c.k, c.match) == (10, 1000, 8, 10, 100, 8,
                                                                                      "prompts")
    c = make_config(load("token-ablations"), "paper")
    assert (c.seeds, c.episodes, c.lengths, c.batch, c.k) == (20, 2000, (7, 8, 10), 100, 8)
    c = make_config(load("token-diagnostics"), "paper")
    assert (c.seeds, c.episodes, c.length, c.batch, c.k, c.epochs) == (10, 2000, 8, 256, 32, 4)
    c = make_config(load("token-sweeps"), "paper")
    assert (c.seeds, c.ks, c.epoch_counts, c.k, c.epochs, c.batch) == (30, (4, 8, 16, 32, 64), (1, 2, 4, 8, 16),
                                                                       32, 4, 256)
    c = make_config(load("token-temperature"), "paper")
    assert (c.seeds, c.episodes, c.etas, c.level, c.task, c.reward) == (10, 1000, (0.25, 0.5, 1.0, 2.0, 4.0),
                                                                        "token", "reverse_copy", "bag")


def test_configs_reject_bad_values():
    with pytest.raises(ValueError, match="variants"):
        make_config(load("token-variants"), "smoke", overrides=["variants=bag/copy,terminal/copy"])
    with pytest.raises(ValueError, match="item 'ppo' must be one of"):
        make_config(load("token-ablations"), "smoke", overrides=["methods=tpo,ppo"])
    with pytest.raises(ValueError, match="item 'tpo_2ep' must be one of"):
        make_config(load("token-diagnostics"), "smoke", overrides=["methods=tpo,tpo_2ep"])
    with pytest.raises(ValueError, match="sweeps"):
        make_config(load("token-sweeps"), "smoke", overrides=["sweeps=k,lr"])
    with pytest.raises(ValueError, match="ks"):
        make_config(load("token-sweeps"), "smoke", overrides=["ks=1,4"])
    with pytest.raises(ValueError, match="level"):
        make_config(load("token-temperature"), "smoke", overrides=["level=both"])
    with pytest.raises(ValueError, match="terminal"):
        make_config(load("token-temperature"), "smoke", overrides=["reward=terminal"])
    with pytest.raises(ValueError, match="variant_seeds"):
        make_config(load("dg-epochs"), "smoke", overrides=["variant_seeds=5"])
    # part (b, c) runs variant_seeds: seeds=5 with parts=variants ran one seed while saying five
    with pytest.raises(ValueError, match="seeds=5: not read by this run"):
        make_config(load("dg-epochs"), "smoke", overrides=["parts=variants", "seeds=5"])


# ----------------------------------------------------------------------------- shared helpers

def test_smooth_is_a_trailing_mean_per_seed():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(12, 3))
    x[4, 1] = np.nan
    got = tr.smooth(x, 4)
    for t in range(12):
        for s in range(3):
            assert np.isclose(got[t, s], np.nanmean(x[max(0, t - 3):t + 1, s]))
    assert tr.smooth(x, 1) is x


def test_resolve():  # claim parts are joined by runs.stats.all_of (tests/runs/test_intervals_and_verdicts.py)
    cfg = make_config(load("token-diagnostics"), "paper")
    trial, method = tr.resolve(cfg, "dg_4ep", length=5)
    assert (method, trial.dg_epochs, trial.epochs, trial.length) == ("dg", 4, 4, 5)
    assert tr.label("tpo_1ep") == "TPO (1 ep)" and tr.label("grpo") == "GRPO"


@pytest.mark.parametrize("name,overrides,match", [
    # what run_trial refuses for a unit's method is refused by the config, before a run folder exists
    ("token-dense", ["reward=terminal"], "tpo_token needs a dense reward"),
    ("token-dense", ["methods=ppo,dg", "tpo_projection=js"], "tpo_projection=js: not read by this run"),
    ("token-dense", ["score_noise=0.1"], "score_noise=0.1: fixed"),
    ("token-terminal", ["zero_all_fail=true", "score_noise=0.1"], "which method 'ppo' .single rollouts. does not have"),
    # 0/1 scores: zeroing all-fail groups changed nothing (the metrics were byte-identical)
    ("token-terminal", ["methods=tpo,grpo", "zero_all_fail=true"], "zero_all_fail=True with reward='terminal' and no "
                                                                   "score_noise changes nothing"),
    # c² or the noise overflowed float32 inside the objective, after the run folder was written
    ("token-terminal", ["methods=tpo", "std_shrink=1e160"], "std_shrink=1e.160: must be >= 0 and <= 1e.06"),
    ("token-variants", ["score_noise=0.1"], "which method 'tpo_token' .token rollouts. does not have"),
    ("token-ablations", ["methods=grpo,group_pg", "tpo_projection=js"], "tpo_projection=js: not read by this run"),
    ("token-diagnostics", ["score_noise=0.1"], "which method 'ppo' .single rollouts. does not have"),
    ("token-diagnostics", ["methods=tpo,tpo_1ep", "epochs=1"], "same trial as tpo"),
    ("token-temperature", ["score_noise=0.1"], "which method 'tpo_token' .token rollouts. does not have"),
    ("token-temperature", ["tpo_kl_budget=0.5"], "tpo_kl_budget=0.5: fixed"),
    ("token-temperature", ["etas=0.1,0.10000000001"], "at most 6 significant digits"),
    ("dg-epochs", ["tpo_projection=js"], "tpo_projection='js': fixed"),
    ("dg-epochs", ["k=4"], "match=interactions"),
])
def test_a_unit_the_engine_would_refuse_is_refused_by_the_config(name, overrides, match):
    with pytest.raises(ValueError, match=match):
        make_config(load(name), "smoke", overrides=overrides)


def test_an_adaptive_eta_refuses_a_tpo_eta_it_would_not_read():
    """Refused by the run when no unit reads tpo_eta; with Group PG beside TPO it is read (it was refused per
    trial, though Group PG reads it)."""
    exp = load("token-terminal")
    with pytest.raises(ValueError, match="tpo_eta=2.0: not read by this run .a KL budget"):
        make_config(exp, "smoke", overrides=["methods=tpo", "tpo_kl_budget=0.5", "tpo_eta=2"])
    cfg = make_config(exp, "smoke", overrides=["methods=tpo,group_pg", "tpo_kl_budget=0.5", "tpo_eta=2"])
    assert "tpo_eta" in te.reads(cfg, "group_pg") and "tpo_eta" not in te.reads(cfg, "tpo")
    with pytest.raises(ValueError, match="which method 'ppo' .single rollouts. does not have"):
        te.trial_config(te.TrialConfig(), methods=("tpo", "ppo"), score_noise=0.1)
