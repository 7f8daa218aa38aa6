"""Edges of the token open-question experiments (docs/experiments.md §E14–§E16): the per-seed report helpers on
hand-made curves (strict crossings, medians, tails, NaN rows, signs), what each setting asks the engine, the
reference setting and wording of each report, and the shape checks of the task rewards."""

import numpy as np
import pytest
import torch

from targetpo.experiments import load
from targetpo.report import write_report
from targetpo.runs.config import make_config
from targetpo.runs.stats import Curve, mean_se
from targetpo.tokens import low_variance as lv
from targetpo.tokens import open_questions as oq
from targetpo.tokens import report as tr
from targetpo.tokens import tasks
from targetpo.tokens.common import tail_values


def curve(values) -> Curve:
    values = np.asarray(values, dtype=float)
    return Curve(np.arange(len(values)), *mean_se(values), values)


def crossing(steps: int, at: int, seeds: int = 3, before: float = 0.5, after: float = 0.03) -> np.ndarray:
    """Every seed: error `before` until step `at`, then `after`."""
    return np.where(np.arange(steps)[:, None] < at, before, after) * np.ones((1, seeds))



def findings(text: str) -> str:
    return text.split("**What the data says.**", 1)[1]


class _Tables:
    def __init__(self):
        self.tables = []

    def table(self, head, rows, caption=""):
        self.tables.append((head, rows, caption))


# ----------------------------------------------------------------------------- per-seed helpers

def test_a_seed_crosses_only_strictly_below_the_threshold():
    """Exactly at the threshold is not below it: [1, .5, .4] first falls below .5 at episode 2."""
    hit = oq.seed_steps_to(curve([[1.0], [0.5], [0.4]]), 0.5, window=1)
    assert hit.tolist() == [2.0]


def test_a_seed_crossing_is_read_on_the_five_episode_trailing_mean():
    """Error 1 for episodes 0–9, then 0: the trailing 5-episode mean is 0.2 at episode 13 (episodes 9–13) and first
    0 at episode 14 (episodes 10–14)."""
    values = np.where(np.arange(30) < 10, 1.0, 0.0)[:, None]
    assert oq.seed_steps_to(curve(values), 0.05).tolist() == [14.0]


def test_seeds_lower_counts_strictly_lower_seeds():
    """A tie is not lower: of (1 vs 1, 2 vs 3) only the second seed is lower."""
    assert oq.seeds_lower(np.array([1.0, 2.0]), np.array([1.0, 3.0])) == (1, 2)


def test_the_per_seed_steps_cell_is_the_median_of_the_seeds_that_cross():
    assert oq._steps_cell(np.array([1.0, 2.0, 9.0])) == "2 (3/3)"
    assert oq._steps_cell(np.array([4.0, np.nan, 6.0, 20.0])) == "6 (3/4)"


def test_the_tail_is_the_last_tenth_of_episodes_rounded():
    """15 episodes whose error is the episode index: the last round(1.5) = 2 episodes (13, 14) average 13.5."""
    c = curve(np.arange(15.0)[:, None] * np.ones((1, 2)))
    assert oq.seed_tail(c).tolist() == [13.5, 13.5]
    assert np.array_equal(oq.seed_tail(c), tail_values(c))


def test_the_area_skips_a_missing_episode():
    c = curve([[0.2, 0.1], [np.nan, 0.3], [0.4, 0.5]])
    assert np.allclose(oq.seed_area(c), [0.3, 0.3])


def test_a_paired_interval_uses_only_seeds_where_both_are_finite():
    iv = oq.paired_rate_interval(np.array([0.1, 0.2, np.nan]), np.array([0.2, 0.3, 0.4]))
    assert iv.n == 2 and iv.estimate == pytest.approx(-0.1)


# ----------------------------------------------------------------------------- comparison table and finding

def test_the_table_shows_the_tail_and_area_and_a_lower_setting_has_a_negative_delta():
    """Setting a: error 0.5 for 9 episodes and 0.1 in the 10th (the tail, 1 episode), mean 0.46; the reference
    stays at 0.5. Every seed alike, so each interval is a point: Δ = 46 − 50 = −4 points, lower on 3/3 seeds."""
    a = np.where(np.arange(10)[:, None] < 9, 0.5, 0.1) * np.ones((1, 3))
    sec = _Tables()
    oq.comparison_table(sec, {"ref": curve(np.full((10, 3), 0.5)), "a": curve(a)}, "ref", {"ref": "R", "a": "A"},
                        0.05, "caption")
    (head, rows, _), = sec.tables
    assert head[-1] == "Δ mean error vs R (points, paired; seeds lower)"
    ref_row, a_row = rows
    assert a_row[:3] == ["A", "10.0 [10.0, 10.0]", "46.0 [46.0, 46.0]"]
    assert ref_row[1:3] == ["50.0 [50.0, 50.0]", "50.0 [50.0, 50.0]"] and ref_row[-1] == "–"
    assert a_row[-1] == "-4.00 [-4.00, -4.00] (3/3)"


def test_the_table_counts_episodes_to_the_experiment_s_threshold():
    """A curve that falls to 3 % at episode 5 reaches a 5 % threshold there, though it never reaches 1 %."""
    sec = _Tables()
    oq.comparison_table(sec, {"a": curve(crossing(20, 5))}, "a", {"a": "A"}, 0.05, "caption")
    (head, rows, _), = sec.tables
    assert head[3] == "episodes to 5%" and rows[0][3] == "5"
    assert rows[0][4] == "9 (3/3)"  # per seed on the 5-episode trailing mean: episodes 5–9 are all at 3 %


def test_a_finding_compares_crossings_at_the_experiment_s_threshold():
    """Both curves fall to 3 % (below 5 %, never below 1 %): A at episode 5, the reference at 10."""
    data = {"a": curve(crossing(20, 5)), "ref": curve(crossing(20, 10))}
    text = oq.finding(data, "a", "ref", {"a": "A", "ref": "R"}, 0.05)
    assert text.startswith("A reaches 5% error 5 episodes earlier than R (5 vs 10);"), text
    later = oq.finding(data, "ref", "a", {"a": "A", "ref": "R"}, 0.05)
    assert later.startswith("R reaches 5% error 5 episodes later than A (10 vs 5);"), later


def test_a_finding_reports_the_final_error_difference_from_the_tail():
    """A: 0.5 for 9 episodes then 0.1 (mean 0.46, tail 0.1); R: 0.5 throughout. Mean error −4 points, final −40."""
    a = np.where(np.arange(10)[:, None] < 9, 0.5, 0.1) * np.ones((1, 3))
    text = oq.finding({"a": curve(a), "ref": curve(np.full((10, 3), 0.5))}, "a", "ref", {"a": "A", "ref": "R"}, 0.05)
    assert "differs from R's by -4.00 [-4.00, -4.00] points" in text
    assert "its final error (last 10% of episodes) by -40.00 [-40.00, -40.00] points" in text


# ----------------------------------------------------------------------------- low-variance groups (§E15)

def test_low_variance_settings_set_the_noise_and_the_option_they_name():
    cfg = {"noise": 0.01, "floor": 0.1, "shrink": 0.2}
    assert lv.setting_options(cfg, "clean") == {}
    assert lv.setting_options(cfg, "noise") == {"score_noise": 0.01}
    assert lv.setting_options(cfg, "noise+floor") == {"score_noise": 0.01, "std_floor": 0.1}
    assert lv.setting_options(cfg, "noise+shrink") == {"score_noise": 0.01, "std_shrink": 0.2}


def test_low_variance_checks_every_setting():
    """zero_all_fail under terminal reward changes nothing without noise: the clean setting is refused even when
    it is not the first one listed."""
    with pytest.raises(ValueError, match="changes nothing"):
        make_config(load("token-low-variance"), "smoke", overrides=["settings=noise,clean", "zero_all_fail=true"])


def test_low_variance_report_compares_with_the_noisy_setting_and_averages_all_fail_rates_per_seed(tmp_path, fake_run):
    """The Δ column is against the noisy setting. The all-fail cell is the t-interval of each seed's mean over
    episodes: seeds at 20, 30 and 40 % give 30 ± t(0.975, 2)·10/√3 = 30 ± 24.8, i.e. [5.2, 54.8]."""
    fail = np.full((20, 3), 1.0) * np.array([0.2, 0.3, 0.4])
    curves = {f"tpo/{s}": {"error": crossing(20, 5 + i), "all_fail": fail}
              for i, s in enumerate(("clean", "noise", "noise+floor"))}
    out = fake_run(tmp_path / "lv", "token-low-variance",
                   ["seeds=3", "episodes=20", "methods=tpo", "settings=clean,noise,noise+floor"], curves)
    text = write_report(out).read_text()
    assert "Δ mean error vs noise (points, paired; seeds lower)" in text
    head = next(line for line in text.splitlines() if line.startswith("| method |"))
    assert head.split("|")[2:5] == [" clean (no noise) ", " noise ", " noise + std floor "]
    row = next(line for line in text.splitlines() if line.startswith("| TPO |"))
    assert row.split("|")[2:5] == [" 30.0 [5.2, 54.8] "] * 3, row


# ----------------------------------------------------------------------------- partial credit (§E16)

def test_partial_credit_settings_reach_the_engine(capture, unit_ctx):
    exp = load("token-partial-credit")
    cap = capture(tr)
    cfg = make_config(exp, "smoke")
    for setting, reward, zero in (("binary", "terminal", False), ("partial", "partial", False),
                                  ("partial+zero", "partial", True)):
        exp.run_unit(cfg, f"tpo/{setting}", unit_ctx)
        trial, method, _ = cap.calls[-1]
        assert (method, trial.reward, trial.zero_all_fail) == ("tpo", reward, zero), setting


def test_partial_credit_report_compares_with_binary_and_with_zeroed_groups(tmp_path, fake_run):
    out = fake_run(tmp_path / "pc", "token-partial-credit", ["seeds=3", "episodes=20", "methods=tpo"],
                   {"tpo/binary": crossing(20, 12), "tpo/partial": crossing(20, 6),
                    "tpo/partial+zero": crossing(20, 9)})
    text = write_report(out).read_text()
    assert "Δ mean error vs binary (exact match) (points, paired; seeds lower)" in text
    assert "minus binary (exact match)'s, paired over seeds" in text
    said = findings(text)
    assert "partial credit reaches 5% error 6 episodes earlier than binary (exact match) (6 vs 12)" in said
    assert "partial credit reaches 5% error 3 episodes earlier than partial credit, all-fail groups zeroed (6 vs 9)" \
        in said
    assert "differs from partial credit, all-fail groups zeroed's by" in said


# ----------------------------------------------------------------------------- projections (§E14)

def test_a_bad_projection_setting_is_named_as_the_settings_item():
    with pytest.raises(ValueError, match="settings item 'alpha2'"):
        make_config(load("token-projections"), "smoke", overrides=["settings=forward_kl,alpha2"])


def test_projections_report_compares_with_forward_kl_wherever_it_is_listed(tmp_path, fake_run):
    out = fake_run(tmp_path / "pr", "token-projections", ["seeds=3", "episodes=20", "settings=reverse_kl,forward_kl"],
                   {"reverse_kl": crossing(20, 8), "forward_kl": crossing(20, 6)})
    text = write_report(out).read_text()
    assert "Δ mean error vs forward KL (TPO) (points, paired; seeds lower)" in text
    assert "minus TPO's, paired over seeds" in text
    assert "reverse KL reaches 5% error 2 episodes later than forward KL (TPO) (8 vs 6)" in findings(text)


def test_a_smoke_projections_report_judges_no_difference(tmp_path, fake_run):
    """Seeds alike and 10 points apart: the interval excludes 0, yet a smoke run is too short to call it clear."""
    out = fake_run(tmp_path / "ps", "token-projections", ["seeds=3", "settings=forward_kl,reverse_kl"],
                   {"forward_kl": np.full((3, 3), 0.4), "reverse_kl": np.full((3, 3), 0.5)}, preset="smoke")
    said = findings(write_report(out).read_text())
    assert said.count("not judged: the preset is too short to decide") == 2
    assert "a clear difference" not in said


# ----------------------------------------------------------------------------- task rewards

def test_token_rewards_refuse_answers_and_targets_of_different_lengths():
    with pytest.raises(ValueError, match=r"actions \(2, 4\) and target \(1,\) differ in length H"):
        tasks.token_rewards(torch.zeros(2, 4), torch.zeros(1), "bag")


def test_candidate_rewards_refuse_a_target_of_another_shape():
    """Candidates [H, K] = [4, 3] need a target [H] = [4]: a target [1] would broadcast silently."""
    with pytest.raises(ValueError, match=r"candidates \(4, 3\) must be target \(1,\) \+ \[K\]"):
        tasks.candidate_rewards(torch.zeros(4, 3), torch.zeros(1), "bag")
    assert tasks.candidate_rewards(torch.zeros(4, 3), torch.zeros(4), "bag").shape == (4, 3)


@pytest.mark.parametrize("task", tasks.TASKS)
def test_every_task_is_accepted(task):
    tasks.check_task(task, "bag")


def test_an_unknown_task_is_refused():
    with pytest.raises(ValueError, match="task must be one of"):
        tasks.check_task("rotate", "bag")
