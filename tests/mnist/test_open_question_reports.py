"""The stale-actor, replay and friction experiments (docs/experiments.md §E13, §E17, §E18) on cases whose answer is
known in advance: report verdicts and cells on hand-made runs, the numbers a training run logs when the policy
cannot move (learning rate 1e-12 on blank images, where the untrained network is exactly uniform), and the
steps-to-threshold and importance-corrected TPO pieces against their definitions."""

import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from targetpo import paper
from targetpo.mnist import data as mnist_data
from targetpo.mnist import friction as FR
from targetpo.mnist import replay as RP
from targetpo.mnist import staleness as ST
from targetpo.objectives import tpo_loss
from targetpo.report import Section, Verdict
from targetpo.runs.store import Run

SEEDS = 3
SPREAD = np.array([-0.01, 0.0, 0.01])  # per-seed offsets shared by every cell: paired differences are exact


# ----------------------------------------------------------------------------- helpers

def _blank_digits(n_train=500, n_test=50, labels=range(10)) -> mnist_data.MnistData:
    """All-black images: every hidden unit and every output logit of an untrained network is exactly 0 (the
    biases start at 0), so its policy is uniform over the 10 classes."""
    g = torch.Generator().manual_seed(0)
    choices = torch.tensor(list(labels))
    train_y = choices[torch.randint(len(choices), (n_train,), generator=g)]
    return mnist_data.MnistData(train_x=torch.zeros(n_train, 784), train_y=train_y, test_x=torch.zeros(n_test, 784),
                                test_y=torch.arange(n_test) % 10, dataset="mnist", protocol="official",
                                directory=Path("/blank"))


def _train(module, cfg, monkeypatch, logged, data=None) -> list[dict]:
    """Run `module`'s training unit on `data` (blank digits by default); the logged evaluation records."""
    data = data if data is not None else _blank_digits()
    monkeypatch.setattr(module, "load_data", lambda cfg, ctx: data)
    module.run_unit(cfg, module.UNIT, logged)
    return logged.records


def _staleness_report(tmp_path, final: dict, **config):
    """A cpu-preset staleness run with two evaluations: every cell at 90 % error at update 1,500, then `final`
    {method: {delay: base error}} (+ SPREAD per seed) at update 3,000."""
    delays = sorted({d for v in final.values() for d in v})
    cfg = {"methods": list(final), "delays": delays, "seeds": SEEDS, "steps": 3000, "eval_every": 1500,
           "baseline": "learner", "anchor": "learner"} | config
    cfg = {k: v for k, v in cfg.items() if v is not None}
    early = {"unit": ST.UNIT, "step": 1500}
    late = {"unit": ST.UNIT, "step": 3000}
    for m, cells in final.items():
        for d, base in cells.items():
            early[f"{m}.error.D{d}"] = [0.9] * SEEDS
            late[f"{m}.error.D{d}"] = list(base + SPREAD)
    run = Run(tmp_path, {"preset": "cpu", "experiment": ST.NAME, "config": cfg, "status": "complete"},
              [early, late])
    section = Section("t", run, tmp_path)
    ST.report(run, section)
    return run, section


# ----------------------------------------------------------------------------- staleness: report

def test_staleness_tpo_is_not_robust_when_its_error_grows_by_one_and_a_half_points(tmp_path, read_section):
    """2.0 → 3.5 % in every seed is +1.5 points, outside the claim's ±1 point; 2.0 → 2.5 % is inside."""
    _, section = _staleness_report(tmp_path, {"tpo": {0: 0.02, 1000: 0.035}})
    claim = read_section.claim(section, "TPO is robust to stale actors")
    assert claim.verdict is Verdict.FAIL and "TPO 2.0 % → 3.5 % (change 1.5 [1.5, 1.5] points)" in claim.evidence
    _, section = _staleness_report(tmp_path, {"tpo": {0: 0.02, 1000: 0.025}})
    assert read_section.claim(section, "TPO is robust to stale actors").verdict is Verdict.PASS


def test_staleness_reinforce_collapse_needs_ten_points(tmp_path, read_section):
    """6 → 13 % is +7 points, short of the 10 the claim asks; 6 → 78 % is +72 points, a collapse, and the
    evidence reads the change as D=1000 minus D=0."""
    _, section = _staleness_report(tmp_path, {"reinforce": {0: 0.06, 1000: 0.13}})
    assert read_section.claim(section, "REINFORCE collapses").verdict is Verdict.FAIL
    _, section = _staleness_report(tmp_path, {"reinforce": {0: 0.06, 1000: 0.78}})
    claim = read_section.claim(section, "REINFORCE collapses")
    assert claim.verdict is Verdict.PASS
    assert "REINFORCE 6.0 % → 78.0 % (change 72.0 [72.0, 72.0] points)" in claim.evidence, claim.evidence


def test_staleness_importance_weighting_must_beat_reinforce_by_five_points(tmp_path, read_section):
    """PG (IS) 2 points below REINFORCE at D=1000 is not "far better" (the claim asks for more than 5)."""
    final = {"reinforce": {0: 0.06, 1000: 0.78}, "pg_is": {0: 0.06, 1000: 0.76}}
    _, section = _staleness_report(tmp_path, final)
    claim = read_section.claim(section, "importance weighting limits the damage")
    assert claim.verdict is Verdict.FAIL and "PG (IS) − REINFORCE at D=1000: -2.0 [" in claim.evidence
    final["pg_is"][1000] = 0.098
    _, section = _staleness_report(tmp_path, final)
    assert read_section.claim(section, "importance weighting limits the damage").verdict is Verdict.PASS


def test_staleness_ppo_stability_allows_two_points_of_drift(tmp_path, read_section):
    _, section = _staleness_report(tmp_path, {"ppo": {0: 0.063, 1000: 0.078}})  # +1.5 points
    assert read_section.claim(section, "PPO against the behaviour snapshot stays stable").verdict is Verdict.PASS
    _, section = _staleness_report(tmp_path, {"ppo": {0: 0.063, 1000: 0.088}})  # +2.5 points
    assert read_section.claim(section, "PPO against the behaviour snapshot stays stable").verdict is Verdict.FAIL


def test_staleness_tpo_half_a_point_above_dg_is_not_the_lowest(tmp_path, read_section):
    _, section = _staleness_report(tmp_path, {"tpo": {0: 0.02, 1000: 0.030}, "dg": {0: 0.03, 1000: 0.025}})
    claim = read_section.claim(section, "TPO has the lowest final error at every delay")
    assert claim.verdict is Verdict.FAIL
    assert claim.candidates and "D=1000 vs DG" in claim.candidates[0].evidence


def test_staleness_table_shows_the_slides_value_of_each_delay(tmp_path, read_section):
    _, section = _staleness_report(tmp_path, {"reinforce": {0: 0.06, 1000: 0.78}, "tpo": {0: 0.02, 1000: 0.02}})
    ref = paper.MNIST_STALENESS.values
    assert ref["reinforce"][ref["delays"].index(1000)] == 78.1 and ref["reinforce"][0] == 6.3
    d0, d1000 = read_section.row(section, "REINFORCE")
    assert d0.endswith("(6.3)") and d1000.endswith("(78.1)"), (d0, d1000)
    assert read_section.row(section, "TPO")[1].endswith("(2.3)")


def test_staleness_report_and_summary_read_the_last_evaluation(tmp_path, read_section):
    """The first evaluation has 90 % everywhere; the final one 2 → 3.5 % (seeds 1, 2, 3 % and 2.5, 3.5, 4.5 %)."""
    run, section = _staleness_report(tmp_path, {"tpo": {0: 0.02, 1000: 0.035}})
    f = ST.finals(run)
    assert f["tpo"][0][0] == pytest.approx(0.02) and f["tpo"][1000][0] == pytest.approx(0.035)
    np.testing.assert_allclose(f["tpo"][1000][2], [0.025, 0.035, 0.045])
    assert [c.split(" ")[0] for c in read_section.row(section, "TPO")] == ["2.0", "3.5"]
    assert "after 3,000 updates" in "\n".join(section.blocks)
    assert ST.summary(run) == "final error D=0 → D=1000: TPO 2.0 % → 3.5 %"


def test_staleness_summary_gives_each_method_from_smallest_to_largest_delay(tmp_path):
    run, _ = _staleness_report(tmp_path, {"tpo": {0: 0.02, 30: 0.05, 1000: 0.035},
                                          "dg": {0: 0.04, 30: 0.06, 1000: 0.08}})
    assert ST.summary(run) == "final error D=0 → D=1000: TPO 2.0 % → 3.5 %, DG 4.0 % → 8.0 %"


def test_staleness_runs_stored_without_baseline_or_anchor_used_the_behaviour_policy(tmp_path):
    """The two settings were added later; runs from before used the stale actor's μ for both."""
    _, section = _staleness_report(tmp_path, {"tpo": {0: 0.02, 1000: 0.02}}, baseline=None, anchor=None)
    text = "\n".join(section.blocks)
    assert "**Advantage baseline:** the behaviour policy's Σπ²; **TPO's anchor:** the behaviour policy." in text
    _, section = _staleness_report(tmp_path, {"tpo": {0: 0.02, 1000: 0.02}})
    text = "\n".join(section.blocks)
    assert "**Advantage baseline:** the learner policy's Σπ²; **TPO's anchor:** the learner policy." in text


# ----------------------------------------------------------------------------- staleness: training

def test_staleness_ppo_trains_with_the_configured_clip_range(monkeypatch, logged):
    real, seen = ST.bandit_loss, []

    def spy(method, *args, **kwargs):
        seen.append((method, kwargs["clip_eps"]))
        return real(method, *args, **kwargs)

    monkeypatch.setattr(ST, "bandit_loss", spy)
    cfg = replace(ST.PRESETS["smoke"], seeds=1, steps=2, eval_every=1, batch=4, delays=(0, 1), methods=("ppo",),
                  clip_eps=0.05)
    records = _train(ST, cfg, monkeypatch, logged)
    assert [r["step"] for r in records] == [1, 2]
    assert seen == [("ppo", 0.05)] * 2


# ----------------------------------------------------------------------------- replay

def test_replay_reward_is_the_mean_over_the_batches_the_actors_acted(monkeypatch, logged):
    """A uniform policy earns 0.1 per image in expectation. With R=4 the actors act only at updates 1, 5, 9, 13,
    17 of the first 20, and the logged reward is the mean over those 5 batches (2,500 images a seed: s.e. 0.006)."""
    cfg = RP.Config(seeds=2, steps=20, eval_every=20, batch=500, lr=1e-12, replays=(1, 4), methods=("tpo",))
    (rec,) = _train(RP, cfg, monkeypatch, logged)
    for r in (1, 4):
        reward = rec[f"tpo.reward.R{r}"]
        assert reward.shape == (2,) and ((reward - 0.1).abs() < 0.03).all(), (r, reward)


def test_replay_truncation_share_covers_only_the_last_eval_every_updates(monkeypatch, logged):
    """Every ratio truncated in updates 1–20, none in 21–40: the evaluation at 40 reports 0 %."""
    real, calls = RP.tpo_is_loss, []

    def scripted(*args, **kwargs):
        out = real(*args, **kwargs)
        calls.append(1)
        return RP.LossOutput(out.loss, {**out.metrics, "frac_truncated": torch.tensor(float(len(calls) <= 20))})

    monkeypatch.setattr(RP, "tpo_is_loss", scripted)
    cfg = RP.Config(seeds=1, steps=40, eval_every=20, batch=8, replays=(1,), methods=("tpo_is",), is_clips=(1.0,))
    records = _train(RP, cfg, monkeypatch, logged)
    assert len(calls) == 40
    assert [(r["step"], r["tpo_is1.truncated.R1"]) for r in records] == [(20, 1.0), (40, 0.0)]


def test_replay_findings_sign_the_change_as_larger_ratio_minus_smaller():
    """R=4 − R=1 per seed: 0.10, 0.11, 0.12 → mean +11 points, 95 % half-width t_{0.975,2}·1/√3 = 2.48 points."""
    f = {"tpo": {1: np.array([0.1, 0.1, 0.1]), 4: np.array([0.2, 0.21, 0.22])}}
    lines = RP.findings(f, [1, 4])
    assert "TPO: R=4 vs R=1: +11.00 ± 2.48 points (higher)" in lines, lines


def test_replay_findings_name_the_method_with_the_lowest_error():
    f = {"dg": {1: np.array([0.3, 0.3, 0.3])}, "tpo": {1: np.array([0.1, 0.1, 0.1])},
         "ppo": {1: np.array([0.2, 0.2, 0.2])}}
    assert RP.findings(f, [1])[0] == "R=1: lowest final error TPO (10.00 ± 0.00 %)"


def test_replay_table_counts_the_batches_acted(tmp_path, read_section):
    """50 updates: R=1 acts 50 batches; R=4 acts at updates 1, 5, …, 49, that is 13."""
    cfg = {"methods": ["tpo"], "is_clips": [1.0], "replays": [1, 4], "seeds": SEEDS, "eval_every": 10}
    records = [{"unit": RP.UNIT, "step": s, "tpo.error.R1": [0.2] * SEEDS, "tpo.error.R4": [0.3] * SEEDS}
               for s in range(10, 51, 10)]
    run = Run(tmp_path, {"preset": "cpu", "experiment": RP.NAME, "config": cfg, "status": "complete"}, records)
    section = Section("t", run, tmp_path)
    RP.report(run, section)
    assert read_section.row(section, "batches acted") == ["50", "13"]


def test_replay_tpo_is_advantage_uses_the_behaviour_baseline():
    """Off policy, the loss is tpo_loss(logits, μ, A·onehot(a), η, c̄) × S with A = r − Σ_i μ_i² (μ, not π)."""
    gen = torch.Generator().manual_seed(3)
    s, b, c = 2, 8, 10
    logits = torch.randn(s, b, c, generator=gen)
    actions, labels = torch.randint(c, (s, b), generator=gen), torch.randint(c, (s, b), generator=gen)
    labels[:, :4] = actions[:, :4]
    mu = torch.log_softmax(logits + 2.0 * torch.randn(s, b, c, generator=gen), -1)
    adv = (actions == labels).float() - (mu.exp() ** 2).sum(-1)
    scores = torch.zeros(s, b, c).scatter(-1, actions.unsqueeze(-1), adv.unsqueeze(-1))
    for clip in (1.0, 10.0):
        want = tpo_loss(logits.reshape(-1, c), mu.reshape(-1, c), scores.reshape(-1, c), eta=0.5,
                        is_clip=clip).loss
        got = RP.tpo_is_loss(logits, actions, labels, mu, eta=0.5, is_clip=clip).loss
        torch.testing.assert_close(got, want * s)


def test_replay_tpo_is_keeps_the_actors_advantage_when_the_learner_is_certain_of_another_class():
    """The actor (μ uniform) picked the right class a, so A = 1 − Σμ² = 0.9 > 0; the learner is certain of
    another class j (Σπ² = 1 in float32, π_a ≈ e^-30). The advantage is the actor's, not 1 − Σπ² = 0, so at a
    small η the target moves to a and the loss is about −log π_a ≈ 30 per image."""
    s, b, c = 2, 4, 10
    actions = torch.arange(s * b).view(s, b) % c
    wrong = (actions + 1) % c
    logits = 30.0 * torch.nn.functional.one_hot(wrong, c).float()
    assert torch.equal((logits.softmax(-1) ** 2).sum(-1), torch.ones(s, b))
    mu = torch.full((s, b, c), -math.log(c))
    for clip in (1.0, 10.0):
        loss = RP.tpo_is_loss(logits, actions, actions.clone(), mu, eta=0.05, is_clip=clip).loss
        assert 29.0 * s < loss.item() < 31.0 * s, (clip, loss)


# ----------------------------------------------------------------------------- friction

def _friction_cfg(**changes):
    base = dict(seeds=2, steps=20, eval_every=20, batch=100, lr=1e-12, flip_fractions=(), random_fractions=(),
                uniform_actor_fractions=(), frozen_actor_fractions=(), rare_biases=(), methods=("tpo",))
    return FR.Config(**(base | changes))


def test_friction_rare_discovery_starts_with_the_decoy_bias(monkeypatch, logged):
    """Blank images and labels 1–9: the untrained policy is softmax(β·e_0), so a correct sample has probability
    1/(e^6 + 9) = 0.0025 at β = 6 (0.034 at β = 3), against 0.1 in the clean condition."""
    data = _blank_digits(labels=range(1, 10))
    (rec,) = _train(FR, _friction_cfg(rare_biases=(6.0,)), monkeypatch, logged, data)
    correct = 1 / (math.exp(6) + 9)
    assert (rec["tpo.reward.rare6"] < 4 * correct).all(), rec["tpo.reward.rare6"]  # 2,000 images a seed
    assert ((rec["tpo.reward.clean"] - 0.1).abs() < 0.03).all(), rec["tpo.reward.clean"]


def test_friction_uniform_actor_acts_the_configured_share_of_images(monkeypatch, logged):
    broken = []
    real = FR.actor_probs

    def spy(probs, mask, other):
        broken.append(mask.float().mean().item())
        return real(probs, mask, other)

    monkeypatch.setattr(FR, "actor_probs", spy)
    _train(FR, _friction_cfg(uniform_actor_fractions=(0.25,)), monkeypatch, logged)
    assert len(broken) == 20
    assert abs(np.mean(broken) - 0.25) < 0.03  # 4,000 draws: s.e. 0.007


def test_friction_logs_the_true_reward_before_corruption(monkeypatch, logged):
    """Every reward flipped (f = 1): the learner sees 1 − r, but the logged reward is still 1{a = y}, about 0.1 for
    the uniform policy, and the same as the clean condition's (same actions, same noise)."""
    (rec,) = _train(FR, _friction_cfg(flip_fractions=(1.0,)), monkeypatch, logged)
    flip, clean = rec["tpo.reward.flip1"], rec["tpo.reward.clean"]
    assert ((flip - 0.1).abs() < 0.03).all(), flip
    torch.testing.assert_close(flip, clean)


def test_friction_steps_to_counts_reaching_the_threshold_exactly():
    steps = np.array([10, 20])
    assert FR.steps_to(steps, np.array([[0.2, 0.2], [0.1, 0.1]]), 0.2) == (10, 2)
    assert FR.steps_to(steps, np.array([[0.3, 0.3], [0.21, 0.25]]), 0.2) == (None, 0)


def test_friction_steps_to_counts_a_seed_that_reaches_the_threshold_once():
    """Rows are evaluations, columns seeds. Seed 0 is at 10 % at update 10 and back at 30 % at update 20; seed 1
    stays at 30 %: the seed mean reaches 20 % at update 10, and one seed ever reaches it."""
    steps = np.array([10, 20])
    assert FR.steps_to(steps, np.array([[0.1, 0.3], [0.3, 0.3]]), 0.2) == (10, 1)
    assert FR.steps_to(steps, np.array([[0.1, 0.3], [0.3, 0.1]]), 0.2) == (10, 2)
