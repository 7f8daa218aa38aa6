"""Verdicts of the token reports on hand-made curves: a FAIL is classed from the part that failed, a larger run is
larger in the lengths the experiment uses, and a one-seed run decides nothing (docs/verdicts.md §1, §3); each
report's claims at their edges (which way a gap is taken, the bounds and tie allowances the claims state, when
there is too little data to decide) and the configurations each experiment accepts."""

import json
from pathlib import Path

import numpy as np

import pytest

from targetpo import paper
from targetpo.experiments import load
from targetpo.report import write_report
from targetpo.runs.config import make_config
from targetpo.runs.stats import Curve, Verdict, mean_se
from targetpo.runs.runner import steps_of, units_of
from targetpo.tokens import report as tr
from targetpo.tokens.ablations import _paper as _fig8
from targetpo.tokens.common import fastest_verdict, final, final_iv, lead_iv, tail_mean, tail_values
from targetpo.tokens.dg_epochs import _paper_pct
from targetpo.tokens.terminal import _grpo_final_bound




def crossing(steps: int, at: list[int]) -> np.ndarray:
    """Per seed: error 0.5 until step at[s], then 0.001."""
    return np.where(np.arange(steps)[:, None] < np.array(at)[None, :], 0.5, 0.001)


def row(text: str, claim: str) -> str:
    return next(line for line in text.splitlines() if line.startswith(f"| {claim}"))


def test_a_fail_is_not_classed_seed_noise_by_a_part_that_passed(tmp_path, fake_run):
    """V=2 fails (205–215 episodes vs 2 × 58); V=4 passes and its interval covers the paper's 74. The FAIL was
    classed "seed noise" from V=4."""
    flat = np.full((300, 4), 0.5)
    out = fake_run(tmp_path / "td", "token-dense", ["seeds=4", "episodes=300", "methods=dg,tpo_token"],
                   {"v2/dg": flat, "v2/tpo_token": crossing(300, [200, 205, 210, 215]),
                    "v4/dg": flat, "v4/tpo_token": crossing(300, [70, 73, 76, 79])})
    line = row(write_report(out).read_text(), "TPO_token's episodes to 1% are within 2× the paper's")
    assert "**FAIL** (does not reproduce)" in line and "seed noise" not in line.lower(), line


def test_a_one_seed_run_does_not_fail_the_bag_speed_claim(tmp_path, fake_run):
    """TPO_token's single seed never reaching 1 % while PPO's does was a FAIL from one point estimate."""
    never, ppo = np.full((100, 1), 0.3), crossing(100, [60])
    out = fake_run(tmp_path / "tv", "token-variants", ["seeds=1", "episodes=100", "variants=bag/copy"],
                   {"bag/copy/tpo_token": never, "bag/copy/grpo_token": never, "bag/copy/dg": never,
                    "bag/copy/ppo": ppo})
    line = row(write_report(out).read_text(), "Under bag reward TPO_token is ≥ 2× faster")
    assert "| inconclusive |" in line and "never vs 60" in line, line


def test_a_run_with_fewer_episodes_is_not_the_larger_run(tmp_path, fake_run):
    """dg-epochs fixes `episodes` (1000) and trains terminal_episodes / variant_episodes: a 10-episode run with one
    more seed counted as larger than a 400 + 300-episode one, and its PASS reclassed the big run's FAILs."""
    rng = np.random.default_rng(0)

    def dg_run(name, seeds, te, ve, four_epochs_level):
        curves = {}
        for unit, steps, n in (("terminal", te, seeds), ("bag/copy", ve, 2), ("sequential/flip", ve, 2)):
            for ep, level in (("ep1", 0.3), ("ep4", four_epochs_level)):
                curves[f"{unit}/{ep}"] = level + 0.01 * rng.standard_normal((steps, n))
        return fake_run(tmp_path / "runs" / name, "dg-epochs",
                        [f"seeds={seeds}", f"terminal_episodes={te}", f"variant_episodes={ve}", "variant_seeds=2",
                         "variants=bag/copy,sequential/flip"], curves)

    dg_run("big", 3, 400, 300, 0.1)  # 4 epochs clearly better: FAILs
    dg_run("tiny", 4, 10, 10, 0.6)   # 4 epochs clearly worse: PASSes, but over 10 episodes
    text = write_report(tmp_path / "runs").read_text()
    line = row(text, "On the terminal task 4-epoch DG ends clearly worse")
    assert "**FAIL** (does not reproduce)" in line and "larger run `tiny`" not in line, line
    assert "400 + 300 episodes" in text or "does not reproduce" in line


def test_the_paper_s_own_table2_ratio_passes_the_bag_speed_claim(tmp_path, fake_run):
    """bag/flip: the paper's Table 2 has TPO_token 56 vs GRPO_token 104 episodes (1.86×), which its text calls
    "2–6×". A run reproducing 1.9× there was a FAIL against a flat 2×."""
    late = crossing(300, [290, 290, 290])
    out = fake_run(tmp_path / "tv", "token-variants", ["seeds=3", "episodes=300", "variants=bag/flip"],
                   {"bag/flip/tpo_token": crossing(300, [50, 50, 50]),
                    "bag/flip/grpo_token": crossing(300, [95, 95, 95]), "bag/flip/dg": late, "bag/flip/ppo": late})
    line = row(write_report(out).read_text(), "Under bag reward TPO_token is ≥ 2× faster")
    assert "**PASS**" in line and "needs ≥ 1.86×" in line, line


def test_the_paper_s_own_epoch_sweep_does_not_fail_the_epoch_claims(tmp_path, fake_run):
    """The paper's epoch sweep (K = 32, H = 8): TPO 0.02 / 2.0 / 0.05 / 2.2 / 2.0 %, GRPO 4.3 / 37.6 / 6.3 / 3.3 /
    1.1 %. "TPO ends below GRPO at every epoch count" failed on GRPO's 1.1 % at 16 epochs, a claim the paper does not
    make; its claim, TPO below 2.3 % everywhere, passes."""
    rng = np.random.default_rng(0)
    levels = {"tpo": (0.0002, 0.02, 0.0005, 0.022, 0.02), "grpo": (0.043, 0.376, 0.063, 0.033, 0.011)}
    def curves(k):
        return {f"k{k}/ep{e}/{m}": np.clip(lv + 0.0003 * rng.standard_normal((2000, 3)), 0, 1)
                for m, lvs in levels.items() for e, lv in zip((1, 2, 4, 8, 16), lvs)}

    common = ["seeds=3", "episodes=2000", "sweeps=epochs", "epoch_counts=1,2,4,8,16"]
    paper_scale = common + ["length=8", "batch=256", "k=32"]
    text = write_report(fake_run(tmp_path / "ts", "token-sweeps", paper_scale, curves(32))).read_text()
    assert "**FAIL**" not in text, [ln for ln in text.splitlines() if "FAIL" in ln]
    assert "**PASS**" in row(text, "TPO's error stays below 2.3% at every epoch count")
    small = fake_run(tmp_path / "small", "token-sweeps", common, curves(8))  # the cpu preset's H = 5, B = 64, K = 8
    line = row(write_report(small).read_text(), "TPO's error stays below 2.3% at every epoch count")
    assert "| n/a |" in line and "undecided" in line, line


def _kl_claim(fake_run, tmp_path, name, episodes, grpo_level, seeds=3):
    """GRPO without its KL clearly better at the end of the run; GRPO with it at `grpo_level` per seed."""
    rng = np.random.default_rng(1)
    grpo = np.array(grpo_level)[None, :] + 0.01 * rng.random((episodes, seeds))
    out = fake_run(tmp_path / name, "token-terminal", [f"seeds={seeds}", f"episodes={episodes}",
                                                       "methods=grpo,grpo_no_kl"],
                   {"h6/grpo": grpo, "h6/grpo_no_kl": 0.01 * rng.random((episodes, seeds))})
    return row(write_report(out).read_text(), "Removing GRPO's KL term makes it worse")


def test_a_short_run_whose_grpo_has_not_converged_fails_the_kl_claim_as_scale(tmp_path, fake_run):
    """At the cpu preset's 200 episodes GRPO with its KL is still near the uniform policy's error, far above where
    the paper's GRPO ends at 2000 episodes on a harder task (14.5% at H = 7): the FAIL is the run's length, and
    was classed "does not reproduce" (2000 episodes reverse it: docs/experiments.md §E6)."""
    line = _kl_claim(fake_run, tmp_path, "short", 200, [0.97, 0.6, 0.95])
    assert "**FAIL** (scale or data)" in line, line
    assert "is wholly above the paper's final GRPO error at H = 7 (14.5%): 200 episodes, not the paper's 2000" in line
    # GRPO already at the paper's level: the short run's FAIL is not explained by its length
    assert "**FAIL** (does not reproduce)" in _kl_claim(fake_run, tmp_path, "converged", 200, [0.05, 0.1, 0.08])
    # a run of the paper's length is not excused
    assert "**FAIL** (does not reproduce)" in _kl_claim(fake_run, tmp_path, "long", 2000, [0.97, 0.6, 0.95])


def test_a_short_runs_scale_class_does_not_stand_against_a_longer_run_that_fails_too(tmp_path, fake_run):
    """With a 2000-episode run in the same report failing the KL claim as well, the 200-episode run kept "scale or
    data: ... GRPO has not yet ended where the claim compares it", which the longer run contradicts."""
    _kl_claim(fake_run, tmp_path / "runs", "short", 200, [0.97, 0.6, 0.95])
    _kl_claim(fake_run, tmp_path / "runs", "long", 2000, [0.97, 0.6, 0.95])
    text = write_report(tmp_path / "runs").read_text()
    lines = [line for line in text.splitlines() if line.startswith("| Removing GRPO's KL term makes it worse")]
    assert len(lines) == 2 and all("**FAIL** (does not reproduce)" in line for line in lines), lines
    short = next(line for line in lines if "the same claim also FAILs in the larger run `long`" in line)
    assert "scale or data" not in short.lower()


# ----------------------------------------------------------------------------- claims at their edges


def _curve(values: np.ndarray) -> Curve:
    return Curve(np.arange(len(values)), *mean_se(values), values)


@pytest.mark.parametrize("episodes, expected", [(20, 18.5), (17, 15.5)])  # tails of round(0.1·n) = 2 episodes
def test_the_tail_is_the_last_tenth_of_the_episodes(episodes, expected):
    c = _curve(np.repeat(np.arange(float(episodes))[:, None], 3, axis=1))  # value = episode index
    assert tail_values(c).tolist() == [expected] * 3 and tail_mean(c)[0] == expected


def test_a_tie_is_not_strictly_first():
    """Both methods cross at episode 5 in every seed: the lead is 0, so "TPO reaches it first" fails."""
    c = {m: _curve(crossing(10, [5, 5, 5])) for m in ("tpo", "dg")}
    assert tuple(lead_iv(c["dg"], c["tpo"])[:3]) == (0.0, 0.0, 0.0)
    assert fastest_verdict(c, "tpo")[0] is Verdict.FAIL


def test_a_method_that_never_crosses_counts_one_episode_past_the_run():
    """TPO crosses at the last episode (9), DG never (counted as 10): a lead of 1 in every seed."""
    c = {"tpo": _curve(crossing(10, [9, 9, 9])), "dg": _curve(np.full((10, 3), 0.5))}
    assert tuple(lead_iv(c["dg"], c["tpo"])[:3]) == (1.0, 1.0, 1.0)
    assert fastest_verdict(c, "tpo")[0] is Verdict.PASS


def test_lowest_final_error_allows_a_tie(tmp_path, fake_run):
    """TPO and GRPO both end at error 0 in every seed: "TPO ends with the lowest error" (ties allowed) passes."""
    v = np.where(np.arange(50)[:, None] < 20, 0.5, 0.0) * np.ones((1, 3))
    run = fake_run(tmp_path / "tt", "token-terminal", ["seeds=3", "episodes=50", "methods=tpo,grpo"],
                   {"h6/tpo": v, "h6/grpo": v})
    text = write_report(run).read_text()
    cells = [line.split("|")[2].strip() for line in text.splitlines()
             if line.startswith("| TPO ends with the lowest error")]
    assert cells == ["**PASS**", "**PASS**"], cells


def test_group_pg_worst_counts_a_tie(tmp_path, fake_run):
    """Group PG equal to TPO in every seed: the gap is 0 ≥ −1 point, so "Group PG is the worst" passes."""
    v = np.where(np.arange(50)[:, None] < 20, 0.5, 0.1) * np.ones((1, 3))
    run = fake_run(tmp_path / "ta", "token-ablations", ["seeds=3", "episodes=50", "methods=tpo,group_pg"],
                   {"h5/tpo": v, "h5/group_pg": v})
    assert row(write_report(run).read_text(), "Group PG is the worst").split("|")[2].strip() == "**PASS**"


def test_one_configuration_of_two_is_no_majority(tmp_path, fake_run):
    """4-epoch DG clearly worse on terminal (that part passes) and clearly better on bag/copy (fails): 1 of 2 is
    not "most configurations"."""
    rng = np.random.default_rng(0)
    levels = {"terminal/ep1": 0.3, "terminal/ep4": 0.6, "bag/copy/ep1": 0.6, "bag/copy/ep4": 0.3}
    curves = {u: level + 0.01 * rng.standard_normal((50, 3)) for u, level in levels.items()}
    run = fake_run(tmp_path / "dg", "dg-epochs", ["seeds=3", "terminal_episodes=50", "variant_episodes=50",
                                                  "variant_seeds=3", "variants=bag/copy"], curves)
    line = next(line for line in write_report(run).read_text().splitlines()
                if "ends worse than 1-epoch DG in most configurations" in line)
    assert line.split("|")[2].strip().startswith("**FAIL**"), line


def test_the_papers_numbers_are_read_under_their_keys():
    (reward, task), (one, four) = next(iter(paper.DG_EPOCHS_VARIANTS_PCT.values.items()))
    assert (_paper_pct(f"{reward}/{task}", 1), _paper_pct(f"{reward}/{task}", 4)) == (one, four)
    assert _paper_pct("terminal", 4) == 100 * paper.DG_EPOCHS_TERMINAL.values["dg_4ep"]
    ref = paper.TABLE3_FINAL_ERROR_PCT.values
    for match in ("prompts", "interactions"):
        for h, v in zip(ref["H"], ref[match]["grpo"]):  # a length of the table is its own bound, where it has one
            if v is not None:
                assert _grpo_final_bound(h, match) == (h, v)


# ----------------------------------------------------------------------------- report helpers and claims at their edges


def test_the_final_error_is_the_last_episodes_unsmoothed():
    v = np.full((6, 3), 0.5)
    v[-1] = [0.19, 0.2, 0.21]
    c = _curve(v)
    assert final(c)[0] == pytest.approx(0.2) and final_iv(c).estimate == pytest.approx(0.2)


def test_the_preset_note_is_shown_for_every_preset_but_paper(tmp_path, fake_run):
    flat = np.full((20, 3), 0.5)
    out = fake_run(tmp_path / "td", "token-dense", ["seeds=3", "episodes=20", "vocabs=2", "methods=dg,tpo_token"],
                   {"v2/dg": flat, "v2/tpo_token": flat})
    assert "Preset `cpu`: 3 seeds × 20 episodes" in write_report(out).read_text()
    meta = json.loads((out / "run.json").read_text())
    (out / "run.json").write_text(json.dumps({**meta, "preset": "paper"}))
    assert "Preset `paper`" not in write_report(out).read_text()


def test_table1_puts_each_papers_number_under_its_v_and_the_2x_claim_is_strict(tmp_path, fake_run):
    """TPO_token crosses V=2 at 130–136 episodes: above 2 × 58 = 116, so the 2× claim FAILs (a 3× bound would
    pass it); each V column shows the paper's number for that V (Table 1)."""
    ref = paper.TABLE1_STEPS_TO_1PCT.values
    p2, p4 = (ref["tpo_token"][ref["V"].index(v)] for v in (2, 4))
    assert 2 * p2 < 130 < 3 * p2
    flat = np.full((300, 4), 0.5)
    out = fake_run(tmp_path / "td", "token-dense", ["seeds=4", "episodes=300", "vocabs=2,4", "methods=dg,tpo_token"],
                   {"v2/dg": flat, "v2/tpo_token": crossing(300, [130, 132, 134, 136]),
                    "v4/dg": flat, "v4/tpo_token": crossing(300, [70, 73, 76, 79])})
    text = write_report(out).read_text()
    cells = [c.strip() for c in row(text, "TPO_token |").split("|")[2:4]]
    assert cells[0].endswith(f"({p2})") and cells[1].endswith(f"({p4})"), cells
    assert "**FAIL**" in row(text, "TPO_token's episodes to 1% are within 2× the paper's")


def test_terminal_reads_matches_only_with_a_single_sample_method():
    exp = load("token-terminal")
    assert "matches" not in make_config(exp, "smoke").unread()  # ppo and dg are single-sample
    assert "matches" in make_config(exp, "smoke", overrides=["methods=tpo,grpo"]).unread()


def test_a_kl_fail_whose_grpo_interval_reaches_the_papers_level_is_not_scale(tmp_path, fake_run):
    """GRPO's tail interval straddles the paper's 14.5 %: not wholly above it, so the short run's FAIL is not put
    down to its length."""
    assert "**FAIL** (does not reproduce)" in _kl_claim(fake_run, tmp_path, "straddles", 200, [0.12, 0.16, 0.20])


def test_the_masking_sweep_runs_tpo_and_both_grpos():
    exp = load("token-sweeps")
    cfg = make_config(exp, "cpu", overrides=["sweeps=masking"])
    assert units_of(exp, cfg) == [f"k{cfg.k}/ep{cfg.epochs}/{m}" for m in ("tpo", "grpo", "grpo_masked")]


def test_masked_grpo_ending_worse_passes_the_masking_claim(tmp_path, fake_run):
    rng = np.random.default_rng(2)
    exp = load("token-sweeps")
    cfg = make_config(exp, "cpu", overrides=["sweeps=masking", "seeds=3", "episodes=50"])
    base = f"k{cfg.k}/ep{cfg.epochs}"
    levels = {"tpo": 0.05, "grpo": 0.1, "grpo_masked": 0.5}
    out = fake_run(tmp_path / "ts", "token-sweeps", ["sweeps=masking", "seeds=3", "episodes=50"],
                   {f"{base}/{m}": lv + 0.01 * rng.random((50, 3)) for m, lv in levels.items()})
    assert row(write_report(out).read_text(), "Masking zero-variance groups hurts GRPO").split("|")[2].strip() \
        == "**PASS**"


def test_never_reaching_1pct_is_undecided_when_some_seeds_reach_it(tmp_path, fake_run):
    """PPO crosses 1 % at episode 500 in one seed of three and never in the others: its seed mean never gets there,
    but the bootstrap's low end is finite, so "PPO does not reach 1 % within 1000 episodes" is not a PASS."""
    flat = np.full((1000, 3), 0.5)
    ppo = np.where(np.arange(1000)[:, None] < 500, 0.5, np.array([[0.001, 0.5, 0.5]]))
    out = fake_run(tmp_path / "tv", "token-variants", ["seeds=3", "episodes=1000", "variants=sequential/copy",
                                                       "methods=tpo_token,ppo"],
                   {"sequential/copy/tpo_token": crossing(1000, [100, 110, 120]), "sequential/copy/ppo": ppo})
    line = row(write_report(out).read_text(), "Under sequential reward GRPO_token and PPO do not reach 1%")
    assert line.split("|")[2].strip() == "inconclusive", line


def test_grpo_all_fail_at_2_5x_tpos_passes_the_residual_claim(tmp_path, fake_run):
    """TPO's final all-fail ≈ 0.008 (< 0.01) and GRPO's ≈ 0.02: above 0.01 and above 2× TPO's (the claim's
    bound; 3× would fail it)."""
    rng = np.random.default_rng(3)
    n = 300
    err = 0.02 + 0.001 * rng.random((n, 3))
    units = {m: {"error": err, "grad_norm": np.ones((n, 3)),
                 "all_fail": lv + 0.0002 * rng.standard_normal((n, 3))}
             for m, lv in (("tpo", 0.008), ("grpo", 0.02))}
    out = fake_run(tmp_path / "tdg", "token-diagnostics", ["seeds=3", f"episodes={n}", "methods=tpo,grpo"],
                           units)
    line = row(write_report(out).read_text(), "TPO's all-fail fraction falls to ≈ 0")
    assert line.split("|")[2].strip() == "**PASS**", line


# ----------------------------------------------------------------------------- DG epochs, ablations, temperature


def flat(steps: int, levels: list[float]) -> np.ndarray:
    """Per seed s: error levels[s] at every step."""
    return np.ones((steps, 1)) * np.array(levels)[None, :]


def verdict(line: str) -> str:
    return line.split("|")[2].strip()


# ----------------------------------------------------------------------------- DG epochs (App. E, Fig. 17)


def _dg_run(fake_run, path: Path, levels: dict[str, float | list[float]], overrides: tuple[str, ...] = ()) -> Path:
    """dg-epochs with 3 seeds × 50 episodes in both parts, variants bag/copy; unit u at error levels[u]."""
    rng = np.random.default_rng(0)
    curves = {u: np.clip(flat(50, lv if isinstance(lv, list) else [lv] * 3) + 0.001 * rng.standard_normal((50, 3)),
                         0, 1) for u, lv in levels.items()}
    return fake_run(path, "dg-epochs", ["seeds=3", "terminal_episodes=50", "variant_episodes=50", "variant_seeds=3",
                                        "variants=bag/copy", *overrides], curves)


DG_MOST = "4-epoch DG ends worse than 1-epoch DG in most configurations"


def test_each_part_trains_its_own_number_of_episodes():
    exp = load("dg-epochs")
    cfg = make_config(exp, "cpu")
    assert (cfg.terminal_episodes, cfg.variant_episodes) == (400, 300)  # the module docstring's cpu preset
    assert steps_of(exp, cfg, "terminal/ep1") == 400
    assert steps_of(exp, cfg, "bag/copy/ep1") == 300


def test_four_epochs_worse_in_every_configuration_is_most(tmp_path, fake_run):
    """4 epochs at 0.6 vs 1 epoch at 0.3 on both the terminal task and bag/copy: 2 of 2 is a majority."""
    run = _dg_run(fake_run, tmp_path / "dg", {"terminal/ep1": 0.3, "terminal/ep4": 0.6, "bag/copy/ep1": 0.3,
                                    "bag/copy/ep4": 0.6})
    text = write_report(run).read_text()
    assert verdict(row(text, DG_MOST)) == "**PASS**"
    assert verdict(row(text, "On the terminal task 4-epoch DG ends clearly worse")) == "**PASS**"


def test_the_claim_compares_the_largest_epoch_count_with_one(tmp_path, fake_run):
    levels = {f"{w}/ep{e}": lv for w in ("terminal", "bag/copy") for e, lv in ((1, 0.3), (2, 0.4), (4, 0.6))}
    text = write_report(_dg_run(fake_run, tmp_path / "dg", levels, ("dg_epoch_counts=1,2,4",))).read_text()
    assert verdict(row(text, "4-epoch DG ends worse than 1-epoch DG in most configurations")) == "**PASS**"
    assert not any(line.startswith("| 2-epoch DG ends worse") for line in text.splitlines())


def test_an_undecided_terminal_gap_is_compared_with_the_papers_gap_in_points(tmp_path, fake_run):
    """Terminal: per-seed gaps −0.3, +0.5, +1.0 (mean 0.4, a wide interval around 0) cover the paper's 48.3 − 2.0
    = +46.3 points, i.e. 0.463 as a fraction; bag/copy: 4 epochs clearly better. 0 clearly worse of 2 fails."""
    curves = {"terminal/ep1": flat(400, [0.5, 0.2, 0.0]), "terminal/ep4": flat(400, [0.2, 0.7, 1.0]),
              "bag/copy/ep1": flat(300, [0.6, 0.62]), "bag/copy/ep4": flat(300, [0.3, 0.31])}
    run = fake_run(tmp_path / "dg", "dg-epochs", ["seeds=3", "variants=bag/copy"], curves)  # the cpu preset's scale
    line = row(write_report(run).read_text(), DG_MOST)
    assert verdict(line).startswith("**FAIL**"), line
    assert "terminal (a) covers the paper's +46.3" in line, line


def test_k_is_accepted_with_interaction_matching_only():
    """DG reads K only with match=interactions (B·K prompts)."""
    exp = load("dg-epochs")
    assert make_config(exp, "smoke", overrides=["k=4", "match=interactions"]).k == 4
    with pytest.raises(ValueError, match="match=interactions"):
        make_config(exp, "smoke", overrides=["k=4", "match=prompts"])


def test_the_paper_has_dg_errors_only_for_one_and_four_epochs():
    assert _paper_pct("terminal", 2) is None
    assert _paper_pct("bag/copy", 2) is None
    assert _paper_pct("terminal", 1) == pytest.approx(2.0) and _paper_pct("terminal", 4) == pytest.approx(48.3)


def test_without_one_epoch_there_is_nothing_to_compare(tmp_path, fake_run):
    levels = {f"{w}/ep{e}": lv for w in ("terminal", "bag/copy") for e, lv in ((2, 0.3), (4, 0.6))}
    text = write_report(_dg_run(fake_run, tmp_path / "dg", levels, ("dg_epoch_counts=2,4",))).read_text()
    line = row(text, DG_MOST)
    assert "| n/a |" in line and "needs dg_epoch_counts with 1" in line, line


def test_the_fig17_table_starts_with_the_terminal_task(tmp_path, fake_run):
    run = _dg_run(fake_run, tmp_path / "dg", {"terminal/ep1": 0.3, "terminal/ep4": 0.6, "bag/copy/ep1": 0.3,
                                    "bag/copy/ep4": 0.6})
    lines = write_report(run).read_text().splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("| task | DG 1 ep | DG 4 ep"))
    assert lines[header + 2].startswith("| terminal (a) |"), lines[header:header + 4]
    assert lines[header + 3].startswith("| bag copy |"), lines[header:header + 4]


# ----------------------------------------------------------------------------- ablations (§3.7, Fig. 8)


def _ablation_report(fake_run, tmp_path: Path, levels: dict[str, float], lengths: int = 5,
                     episodes: int = 50) -> str:
    """token-ablations at one H, 3 seeds, method m at constant error levels[m]."""
    run = fake_run(tmp_path / "ta", "token-ablations", ["seeds=3", f"episodes={episodes}", f"lengths={lengths}",
                                                        "methods=" + ",".join(levels)],
                   {f"h{lengths}/{m}": flat(episodes, [lv] * 3) for m, lv in levels.items()})
    return write_report(run).read_text()


def test_group_pg_clearly_better_than_tpo_by_more_than_the_tie_is_not_the_worst(tmp_path, fake_run):
    """Group PG 1.5 points below TPO: beyond the 1-point tie allowance, so "Group PG is the worst" fails."""
    line = row(_ablation_report(fake_run, tmp_path, {"tpo": 0.1, "group_pg": 0.085}), "Group PG is the worst")
    assert verdict(line).startswith("**FAIL**"), line


def test_group_pg_within_the_tie_of_tpo_still_counts_as_worst(tmp_path, fake_run):
    line = row(_ablation_report(fake_run, tmp_path, {"tpo": 0.1, "group_pg": 0.095}), "Group PG is the worst")
    assert verdict(line) == "**PASS**", line


def test_tpo_without_the_anchor_ending_worse_passes_the_anchor_claim(tmp_path, fake_run):
    line = row(_ablation_report(fake_run, tmp_path, {"tpo": 0.1, "tpo_no_anchor": 0.5}),
               "Removing the anchor p_old is harmful")
    assert verdict(line) == "**PASS**", line


def test_tpo_below_grpo_is_the_lowest_with_two_methods(tmp_path, fake_run):
    line = row(_ablation_report(fake_run, tmp_path, {"tpo": 0.1, "grpo": 0.3}), "TPO has the lowest error")
    assert verdict(line) == "**PASS**", line


def test_fig8_values_are_read_at_their_own_h():
    """Fig. 8: TPO ends at 0.06 at H = 7; GRPO at 0.15, 0.28, 0.5 at H = 7, 8, 10."""
    assert _fig8("tpo", 7) == pytest.approx(0.06)
    assert [_fig8("grpo", h) for h in (7, 8, 10)] == pytest.approx([0.15, 0.28, 0.5])
    ref = paper.FIG8_FINAL_ERROR.values
    for m in ("tpo", "grpo", "grpo_no_kl", "tpo_no_anchor", "group_pg"):
        assert {h: _fig8(m, h) for h in ref["H"]} == dict(zip(ref["H"], ref[m]))
    assert _fig8("tpo", 5) is None


def test_the_papers_fig8_table_is_added_only_without_an_h_in_common(tmp_path, fake_run):
    assert "no H in common" not in _ablation_report(fake_run, tmp_path / "h7", {"tpo": 0.1, "grpo": 0.3}, lengths=7)
    assert "no H in common" in _ablation_report(fake_run, tmp_path / "h5", {"tpo": 0.1, "grpo": 0.3}, lengths=5)


@pytest.mark.parametrize("episodes, circles", [(300, {}), (2000, {"H = 7": {"tpo": 0.06, "grpo": 0.15}})])
def test_the_papers_circles_are_drawn_only_at_its_2000_episodes(tmp_path, monkeypatch, episodes, circles, fake_run):
    seen = []
    real = tr.panels

    def spy(section, grid, name, caption, **kw):
        if name == "token_ablations":
            seen.append(kw.get("refs"))
        return real(section, grid, name, caption, **kw)

    monkeypatch.setattr(tr, "panels", spy)
    _ablation_report(fake_run, tmp_path, {"tpo": 0.1, "grpo": 0.3}, lengths=7, episodes=episodes)
    assert len(seen) == 1
    assert {k: {m: pts[0][1] for m, pts in by_m.items()} for k, by_m in seen[0].items()} == circles


# ----------------------------------------------------------------------------- temperature (App. D, Table 5)


ETAS = (0.25, 0.5, 1.0, 2.0, 4.0)
WITHIN = "Every η in [0.25, 2] reaches 1% error within 141 episodes"
SLOWEST = "η = 4 is the slowest to reach 1%"


def _temperature_report(fake_run, tmp_path: Path, at: dict[float, int | None], episodes: int = 150) -> str:
    """token-temperature with 3 seeds; η crosses 1% at episode at[η] in every seed (None: never)."""
    exp = load("token-temperature")
    overrides = ["seeds=3", f"episodes={episodes}", "etas=" + ",".join(f"{eta:g}" for eta in at)]
    names = units_of(exp, make_config(exp, "cpu", overrides=overrides))
    curves = {u: flat(episodes, [0.5] * 3) if at[eta] is None else crossing(episodes, [at[eta]] * 3)
              for u, eta in zip(names, at)}
    return write_report(fake_run(tmp_path / "tt", "token-temperature", overrides, curves)).read_text()


def test_the_temperature_units_are_named_by_eta():
    exp = load("token-temperature")
    assert units_of(exp, make_config(exp, "cpu")) == ["eta0.25", "eta0.5", "eta1", "eta2", "eta4"]


def test_reaching_1pct_after_141_episodes_fails_the_table5_bound(tmp_path, fake_run):
    line = row(_temperature_report(fake_run, tmp_path, {eta: 145 for eta in ETAS}), WITHIN)
    assert verdict(line).startswith("**FAIL**"), line


def test_reaching_1pct_at_episode_141_is_within_141(tmp_path, fake_run):
    """The first episode below 1% is 141 (0-based) in every seed: "within 141" allows the tie."""
    line = row(_temperature_report(fake_run, tmp_path, {eta: 141 for eta in ETAS}), WITHIN)
    assert verdict(line) == "**PASS**", line


def test_eta_2_is_inside_the_range_of_the_bound(tmp_path, fake_run):
    """Only η = 2 (the range's upper end) is late: [0.25, 2] includes it, so the claim fails."""
    line = row(_temperature_report(fake_run, tmp_path, {0.25: 50, 0.5: 50, 1.0: 50, 2.0: 145, 4.0: 50}), WITHIN)
    assert verdict(line).startswith("**FAIL**"), line


def test_a_run_of_141_episodes_cannot_check_the_bound(tmp_path, fake_run):
    line = row(_temperature_report(fake_run, tmp_path, {eta: 50 for eta in ETAS}, episodes=141), WITHIN)
    assert "| n/a |" in line and "more than 141 episodes" in line, line


def test_eta_4_slowest_is_undecided_when_another_eta_never_reaches_1pct(tmp_path, fake_run):
    """η = 4 and η = 0.5 both never get there: which of them is slower is unknown."""
    line = row(_temperature_report(fake_run, tmp_path, {0.5: None, 1.0: 60, 4.0: None}), SLOWEST)
    assert "| n/a |" in line, line


def test_eta_4_reaching_1pct_last_is_the_slowest(tmp_path, fake_run):
    line = row(_temperature_report(fake_run, tmp_path, {0.25: 50, 0.5: 50, 1.0: 50, 2.0: 50, 4.0: 130}), SLOWEST)
    assert verdict(line) == "**PASS**", line


def test_a_terminal_reward_needs_sequence_level_tpo():
    exp = load("token-temperature")
    assert make_config(exp, "smoke", overrides=["level=sequence", "reward=terminal"]).reward == "terminal"
    with pytest.raises(ValueError, match="dense reward"):
        make_config(exp, "smoke", overrides=["level=token", "reward=terminal"])


def test_the_temperature_preset_note_is_shown_for_every_preset_but_paper(tmp_path, fake_run):
    _temperature_report(fake_run, tmp_path, {eta: 50 for eta in ETAS})
    out = tmp_path / "tt"
    assert "Preset `cpu`: 3 seeds × 150 episodes" in write_report(out).read_text()
    meta = json.loads((out / "run.json").read_text())
    (out / "run.json").write_text(json.dumps({**meta, "preset": "paper"}))
    assert "Preset `paper`" not in write_report(out).read_text()
