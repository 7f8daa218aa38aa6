"""The two MNIST open-question experiments (docs/experiments.md §E17 replay, §E18 friction): their pieces against
hand-made cases, config validation, 'not run' without data, and smoke runs on the real test digits."""

import json

import numpy as np
import pytest
import torch

from targetpo.experiments import load, run_experiment
from targetpo.mnist import friction as FR
from targetpo.mnist import replay as RP
from targetpo.mnist.bandit import bandit_loss
from targetpo.report import write_report
from targetpo.runs.data import MissingDataError


def records(run_dir):
    return [r for r in (json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines())
            if "step" in r]


# ----------------------------------------------------------------------------- pieces

def test_both_experiments_are_registered_in_the_open_questions_suite():
    for name in ("mnist-replay", "mnist-friction"):
        module = load(name)
        assert module.NAME == name and module.SUITE == "open-questions"
        assert set(module.PRESETS) == {"smoke", "cpu", "paper"}
        assert module.PRESETS["cpu"].seeds >= 5


def test_replay_variants_and_slots():
    assert RP.variants(("tpo", "tpo_is", "dg"), (1.0, 10.0)) == [
        ("tpo", "tpo", None), ("tpo_is1", "tpo_is", 1.0), ("tpo_is10", "tpo_is", 10.0), ("dg", "dg", None)]
    assert RP.label("tpo_is10") == "TPO + IS (c̄=10)"
    assert RP.replay_slots(torch.tensor([0.0, 0.249, 0.25, 0.999999]), 4) == [0, 0, 1, 3]
    assert RP.replay_slots(torch.tensor([0.7]), 1) == [0]


def test_seed_interval_is_the_t_interval():
    mean, half = RP.mean_ci95(np.array([[1.0, 2.0, 3.0, 4.0, 5.0], [2.0, 2.0, 2.0, 2.0, 2.0]]))
    np.testing.assert_allclose(mean, [3.0, 2.0])
    np.testing.assert_allclose(half, [2.7764451 * np.sqrt(2.5) / np.sqrt(5), 0.0], rtol=1e-7)  # t_{0.975, 4}
    assert np.isnan(RP.mean_ci95(np.array([0.3]))[1])
    assert RP.paired(np.array([0.1, 0.2, 0.3]), np.array([0.2, 0.3, 0.4]))[2] == "lower"
    assert RP.paired(np.array([0.1, 0.3, 0.2]), np.array([0.2, 0.2, 0.2]))[2] == "no detectable difference"
    # one seed has no interval: said in words, never "± nan" or a difference called undetectable
    assert RP.paired(np.array([0.1]), np.array([0.2]))[2] == "no interval"
    assert RP.pm(np.array([0.3])) == "30.00 (1 seed, no interval)"
    assert RP.pm_text(-1.5, 0.25, signed=True) == "-1.50 ± 0.25"


@pytest.mark.parametrize("name", ["mnist-replay", "mnist-friction"])
def test_a_one_seed_report_says_it_has_no_interval(name, tmp_path, mnist_dir):
    run_dir = run_experiment(name, "smoke", seeds=1, out=tmp_path / "r", progress=False, quiet=True, threads=1,
                             overrides=[f"data_dir={mnist_dir}", "steps=20"])
    text = write_report(run_dir).read_text()
    assert "nan" not in text.lower().replace("nan_", "") and "(1 seed, no interval)" in text


def test_tpo_is_loss_is_bandit_tpo_on_policy_and_differs_off_policy():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 8, 10, generator=gen)
    actions, labels = torch.randint(10, (2, 8), generator=gen), torch.randint(10, (2, 8), generator=gen)
    labels[:, :4] = actions[:, :4]  # some rewards
    mu = torch.log_softmax(logits, -1)
    plain = bandit_loss("tpo", logits, actions, labels, mu, eta=1.0)
    for c in (0.5, 1.0, 10.0):
        torch.testing.assert_close(RP.tpo_is_loss(logits, actions, labels, mu, eta=1.0, is_clip=c).loss, plain)
    stale = torch.log_softmax(logits + 2.0 * torch.randn(2, 8, 10, generator=gen), -1)
    off = RP.tpo_is_loss(logits, actions, labels, stale, eta=1.0, is_clip=10.0).loss
    assert not torch.isclose(off, bandit_loss("tpo", logits, actions, labels, stale, eta=1.0))


def test_friction_reward_corruption_and_broken_actors():
    r = torch.tensor([[[1.0, 0.0, 1.0, 0.0]]])  # [S=1, K=1, B=4]
    hit = torch.tensor([[True, True, False, False]])
    coin = torch.tensor([[0.0, 1.0, 1.0, 1.0]])
    assert FR.corrupt_rewards(r, hit, coin, "flip").tolist() == [[[0.0, 1.0, 1.0, 0.0]]]
    assert FR.corrupt_rewards(r, hit, coin, "random").tolist() == [[[0.0, 1.0, 1.0, 0.0]]]
    with pytest.raises(ValueError, match="kind='rare'"):
        FR.corrupt_rewards(r, hit, coin, "rare")
    actions = torch.tensor([[[3, 9, 0, 5]]])
    y = FR.reward_labels(actions, torch.tensor([[[1.0, 0.0, 1.0, 0.0]]]), 10)
    assert ((actions == y).float()).tolist() == [[[1.0, 0.0, 1.0, 0.0]]]
    own = torch.full((1, 2, 4, 3), 0.0)
    own[..., 0] = 1.0
    uniform = torch.full((1, 4, 3), 1 / 3)
    acting = FR.actor_probs(own, hit, uniform)
    assert torch.equal(acting[:, :, :2], uniform[:, None, :2].expand(1, 2, 2, 3)) and torch.equal(acting[:, :, 2:],
                                                                                                   own[:, :, 2:])


def test_friction_conditions_follow_the_config():
    cfg = FR.Config(flip_fractions=(0.2,), random_fractions=(), uniform_actor_fractions=(0.5,),
                    frozen_actor_fractions=(), rare_biases=(4.0, 8.0))
    assert FR.conditions(cfg) == [("clean", "clean", 0.0), ("flip0.2", "flip", 0.2), ("uniform0.5", "uniform", 0.5),
                                  ("rare4", "rare", 4.0), ("rare8", "rare", 8.0)]
    assert FR.conditions(json.loads(json.dumps(cfg.__dict__))) == FR.conditions(cfg)  # as stored in run.json


@pytest.mark.parametrize("module, field, bad", [
    (RP, "replays", (0, 4)), (RP, "replays", (4, 4)), (RP, "is_clips", (0.0,)), (RP, "is_clips", (float("inf"),)),
    (RP, "methods", ("tpo", "grpo")), (FR, "flip_fractions", (1.5,)), (FR, "uniform_actor_fractions", (1.0,)),
    (FR, "rare_biases", (-1.0,)), (FR, "thresholds", (0.0,)), (FR, "methods", ("ppo",)),
])
def test_bad_options_are_refused(module, field, bad):
    with pytest.raises(ValueError, match=field):
        module.Config(**{field: bad}).validate()


@pytest.mark.parametrize("name", ["mnist-replay", "mnist-friction"])
def test_without_data_the_experiment_is_not_run(name, tmp_path, monkeypatch):
    monkeypatch.delenv("TARGETPO_MNIST_DIR", raising=False)
    with pytest.raises(MissingDataError):
        run_experiment(name, "smoke", out=tmp_path / "r", progress=False, quiet=True, threads=1,
                       overrides=[f"data_dir={tmp_path / 'nowhere'}"])


# ----------------------------------------------------------------------------- smoke runs on real digits

def test_replay_smoke(tmp_path, mnist_dir):
    run_dir = run_experiment("mnist-replay", "smoke", out=tmp_path / "r", progress=False, quiet=True, threads=1,
                             overrides=[f"data_dir={mnist_dir}", "steps=40", "replays=1,8"])
    recs = records(run_dir)
    assert [r["step"] for r in recs] == [20, 40]
    for r in recs:
        # R = 1 is on-policy: every batch is trained on right after the current policy acted it (π = μ), so no
        # ratio is truncated and the corrected target is plain TPO's (up to rounding).
        assert r["tpo_is1.truncated.R1"] == 0.0 and r["tpo_is10.truncated.R1"] == 0.0
        assert np.allclose(r["tpo_is1.error.R1"], r["tpo.error.R1"], atol=0.01)
    # R = 8: the learner replays batches the policy has moved away from, so the ratios get truncated and the
    # corrected target trains a different network.
    assert recs[-1]["tpo_is1.truncated.R8"] > 0
    assert recs[-1]["tpo_is1.error.R8"] != recs[-1]["tpo.error.R8"]
    assert np.mean(recs[-1]["tpo.error.R1"]) < 0.8  # learning happens (chance is 0.9)
    text = write_report(run_dir).read_text()
    assert "R=8" in text and "mnist_replay.png" in text and (run_dir / "mnist_replay.png").exists()
    assert "What this run shows" in text and "TPO + IS (c̄=1) minus TPO" in text
    # a smoke run decides nothing: its paired differences read "higher"/"lower" on 2 seeds × 40 updates
    shows = text.split("What this run shows", 1)[1]
    assert "not judged: the preset is too short to decide" in shows
    assert not any(w in shows for w in ("(lower)", "(higher)", "no detectable difference"))


def test_friction_smoke(tmp_path, mnist_dir):
    run_dir = run_experiment("mnist-friction", "smoke", out=tmp_path / "f", progress=False, quiet=True, threads=1,
                             overrides=[f"data_dir={mnist_dir}", "steps=40", "frozen_actor_fractions=0.5"])
    recs = records(run_dir)
    first, last = recs[0], recs[-1]
    for m in ("tpo", "dg", "grpo", "pg"):
        for cond in ("clean", "flip0.3", "uniform0.5", "frozen0.5", "rare6"):
            assert len(last[f"{m}.error.{cond}"]) == 2
    # Rare discovery: the initial policy picks the decoy class on almost every image, so its greedy test error
    # starts near 1 − P(y = decoy) ≈ 0.9, far above the clean run's.
    assert min(first["tpo.error.rare6"]) > 0.8 > max(first["tpo.error.clean"])
    # Frozen actors act with θ_0 on half the images, the same for every method of a seed.
    assert last["tpo.error.frozen0.5"] != last["tpo.error.clean"]
    text = write_report(run_dir).read_text()
    assert "mnist_friction.png" in text and "Updates until the seed-mean test error first reaches 10 %" in text
    assert "What this run shows" in text and "rare (β = 6)" in text
    shows = text.split("What this run shows", 1)[1]
    assert "TPO − DG" in shows and "(not judged: the preset is too short to decide)" in shows
    assert not any(w in shows for w in ("TPO lower", "TPO higher", "no detectable difference"))


def test_identical_paired_seeds_show_no_detectable_difference():
    """a − b = (0, 0, 0): mean 0 and half-width 0; the interval [0, 0] includes 0."""
    assert RP.paired(np.array([0.1, 0.2, 0.3]), np.array([0.1, 0.2, 0.3])) == (0.0, 0.0, "no detectable difference")


def test_staleness_lowest_error_passes_a_gap_known_exactly(tmp_path):
    """TPO 2–4 % against DG 10–12 % per seed at every delay: TPO − DG = −8 points in each seed, an interval of zero
    width below 0, so "TPO has the lowest final error at every delay" passes."""
    import dataclasses

    from targetpo.runs.config import make_config

    run = tmp_path / "st"
    run.mkdir()
    cfg = make_config(load("mnist-staleness"), "cpu", overrides=["seeds=3", "methods=tpo,dg", "delays=0,1000"])
    (run / "run.json").write_text(json.dumps({"experiment": "mnist-staleness", "preset": "cpu", "status": "complete",
                                              "config": dataclasses.asdict(cfg)}))
    with open(run / "metrics.jsonl", "w") as f:
        for step in range(0, cfg.steps + 1, cfg.eval_every):
            rec = {"unit": "stale", "step": step}
            for d in (0, 1000):
                rec[f"tpo.error.D{d}"], rec[f"dg.error.D{d}"] = [0.02, 0.03, 0.04], [0.10, 0.11, 0.12]
            f.write(json.dumps(rec) + "\n")
        f.write(json.dumps({"unit": "stale", "event": "done"}) + "\n")
    cells = [line.split("|")[2].strip() for line in write_report(run).read_text().splitlines()
             if line.startswith("| TPO has the lowest final error")]
    assert len(cells) == 1 and cells[0].startswith("**PASS**"), cells
