"""mnist-mechanism at its edges: the concentration bins and their per-seed statistics, the checkpoint a report
reads and the configs that can reach it, and the report on hand-made runs whose cells and verdicts follow from the
claim texts; and the MLP bank's refusal of a network without a hidden layer."""

import math

import numpy as np
import pytest
import torch

from targetpo import paper
from targetpo.experiments import load
from targetpo.mnist import mechanism as MM
from targetpo.mnist.mlp import init_bank
from targetpo.report import Section, Verdict
from targetpo.runs.config import make_config
from targetpo.runs.stats import fmt
from targetpo.runs.store import Run

SEEDS = 3
NOISE = np.array([0.0, 1e-4, -1e-4])  # a small spread over seeds, so every bin has a t-interval


# ----------------------------------------------------------------------------- diagnostics

def test_an_empty_bin_has_a_nan_mean_and_a_zero_count():
    means, counts = MM.bin_statistics(torch.tensor([[1.0, 2.0]]), torch.tensor([[0, 0]]),
                                      torch.tensor([[True, True]]), 2)
    assert counts.tolist() == [[2.0, 0.0]]
    assert means[0, 0].item() == 1.5 and math.isnan(means[0, 1].item())


def _one_image(p_true: float, wrong: dict[int, float]) -> torch.Tensor:
    """probs [S=1, M, T=1, C=10] for one image of label 0, the same policy for each of M methods."""
    p = torch.zeros(10, dtype=torch.float64)
    p[0] = p_true
    for j, v in wrong.items():
        p[j] = v
    assert abs(p.sum().item() - 1.0) < 1e-15
    return p.view(1, 1, 1, 10)


def test_a_concentration_of_exactly_a_quarter_falls_in_the_second_bin():
    """π_y = 1/16 and four wrong classes at 15/64 each: c = (15/64) / (15/16) = 1/4 exactly, the lower edge of
    [0.25, 0.5), so the misclassified image is counted there and not in [0, 0.25)."""
    probs = _one_image(1 / 16, {1: 15 / 64, 2: 15 / 64, 3: 15 / 64, 4: 15 / 64})
    rec = MM.make_diagnostics(["pg"], 1.0)(probs, torch.tensor([0]))
    assert rec["pg.count"].tolist() == [[0.0, 1.0, 0.0, 0.0]]


def test_pg_and_group_pg_have_a_zero_surplus_where_an_image_falls_and_grpo_none():
    """PG and Group PG are exactly scalar (surplus 0 in every non-empty bin); GRPO has no per-example closed form."""
    probs = _one_image(0.1, {1: 0.6, 2: 0.3}).expand(1, 3, 1, 10)
    rec = MM.make_diagnostics(["pg", "group_pg", "grpo"], 1.0)(probs, torch.tensor([0]))
    b = 2  # c = 0.6 / 0.9 = 2/3: [0.5, 0.75)
    for m in ("pg", "group_pg", "grpo"):
        assert rec[f"{m}.count"].tolist() == [[0.0, 0.0, 1.0, 0.0]]
    for m in ("pg", "group_pg"):
        s = rec[f"{m}.surplus"][0]
        assert math.isfinite(s[b].item()) and abs(s[b].item()) < 1e-12
        assert all(math.isnan(s[k].item()) for k in (0, 1, 3))  # empty bins
        assert math.isfinite(rec[f"{m}.exact"][0, b].item()) and rec[f"{m}.exact"][0, b].item() > 0
    assert torch.isnan(rec["grpo.surplus"]).all()


def test_seed_mean_averages_over_the_seeds_with_a_non_empty_bin_and_its_se_is_the_papers():
    """s.e. = std(ddof=0) / √n over the n seeds where the bin is non-empty (docs/method.md §6)."""
    mean, se, n = MM.seed_mean([[1.0, 1.0], [2.0, np.nan], [6.0, 3.0]])
    assert n.tolist() == [3, 2]
    np.testing.assert_allclose(mean, [3.0, 2.0])
    np.testing.assert_allclose(se, [math.sqrt(14 / 3) / math.sqrt(3), 1 / math.sqrt(2)])
    _, se, _ = MM.seed_mean([[1.0], [3.0]])
    assert se[0] == pytest.approx(0.5 ** 0.5)


# ----------------------------------------------------------------------------- config and checkpoint

def test_a_checkpoint_measured_at_the_last_update_is_accepted():
    """Label 60 is measured after 60 + 20 = 80 updates: steps=80 reaches it, steps=60 does not."""
    cfg = make_config(load("mnist-mechanism"), "smoke", overrides=["steps=80"])
    assert (cfg.checkpoint_label, cfg.eval_every, cfg.steps) == (60, 20, 80)
    with pytest.raises(ValueError, match="checkpoint_label=60: is measured after 80 updates, more than steps=60"):
        make_config(load("mnist-mechanism"), "smoke", overrides=["steps=60"])


def test_a_checkpoint_between_evaluations_is_refused():
    with pytest.raises(ValueError, match=r"checkpoint_label=30: must be a multiple of eval_every \(20\)"):
        make_config(load("mnist-mechanism"), "smoke", overrides=["checkpoint_label=30"])


def _mechanism_run(tmp_path, tpo, dg, labels=(0, 20, 40), checkpoint_label=20, preset="cpu"):
    """An mnist-mechanism run of 3 seeds evaluated every 20 updates at `labels`; at every point TPO's and DG's
    surplus per bin are `tpo` and `dg` (4 values each) plus a small per-seed spread."""
    records = []
    for i, label in enumerate(labels):
        rec = {"unit": MM.base.UNIT, "step": label + 20, "label": label}
        for m, bins in (("tpo", tpo), ("dg", dg)):
            spread = np.stack([np.roll(NOISE, k) for k in range(4)], axis=1)  # [seeds, bins]
            rec[f"{m}.surplus"] = (np.asarray(bins, dtype=float)[None, :] + spread).tolist()
            rec[f"{m}.count"] = [[5.0, 5.0, 5.0, 5.0]] * SEEDS
            rec[f"{m}.error"] = [0.5 - 0.1 * i] * SEEDS
        records.append(rec)
    cfg = {"methods": ["tpo", "dg"], "seeds": SEEDS, "seed": 0, "steps": labels[-1] + 20, "eval_every": 20,
           "checkpoint_label": checkpoint_label, "batch": 32, "lr": 1e-3, "hidden": 100, "eta": 1.0}
    return Run(tmp_path, {"preset": preset, "experiment": MM.NAME, "config": cfg, "status": "complete"}, records)


def _mechanism_report(tmp_path, tpo, dg):
    run = _mechanism_run(tmp_path, tpo, dg)
    section = Section("t", run, tmp_path)
    MM.report(run, section)
    return section


def _verdicts(section) -> dict[str, Verdict | None]:
    return {c.text.split(" (")[0]: c.verdict for c in section.claims}


def test_a_checkpoint_the_run_never_recorded_is_read_at_its_last_point(tmp_path):
    run = _mechanism_run(tmp_path, [0.0] * 4, [0.0] * 4, labels=(0, 20, 40), checkpoint_label=100)
    row, exact = MM.checkpoint_row(run, run.config)
    assert (row["label"], exact) == (40, False)
    row, exact = MM.checkpoint_row(run, run.config | {"checkpoint_label": 20})
    assert (row["label"], exact) == (20, True)
    section = Section("t", run, tmp_path)
    MM.report(run, section)
    assert "the last point, label 40 (after 60 updates)" in "\n".join(section.blocks)


def test_surpluses_outside_the_claimed_ranges_fail_their_claims(tmp_path):
    """TPO 0.01 in the lowest bin (outside ±0.005), 0.18 in the highest (above 2 × 0.073 = 0.146); DG 0.005
    everywhere (above 0.001). TPO still rises bin by bin, so that claim passes."""
    v = _verdicts(_mechanism_report(tmp_path, tpo=[0.01, 0.02, 0.05, 0.18], dg=[0.005] * 4))
    assert v["TPO's surplus is near zero when the wrong mass is diffuse"] is Verdict.FAIL
    assert v["TPO's highest-bin surplus is of the paper's size"] is Verdict.FAIL
    assert v["DG's surplus stays slightly negative throughout"] is Verdict.FAIL
    assert v["TPO's surplus rises with concentration and peaks in the highest bin"] is Verdict.PASS
    assert v["TPO's surplus exceeds DG's in the highest-concentration bin"] is Verdict.PASS


def test_the_papers_surpluses_pass_and_a_falling_one_fails_the_rise(tmp_path):
    v = _verdicts(_mechanism_report(tmp_path, tpo=[0.0, 0.007, 0.021, 0.073], dg=[0.0, -0.001, -0.003, -0.005]))
    assert v["TPO's surplus is near zero when the wrong mass is diffuse"] is Verdict.PASS
    assert v["TPO's highest-bin surplus is of the paper's size"] is Verdict.PASS
    assert v["DG's surplus stays slightly negative throughout"] is Verdict.PASS
    assert v["TPO's surplus rises with concentration and peaks in the highest bin"] is Verdict.PASS
    v = _verdicts(_mechanism_report(tmp_path, tpo=[0.07, 0.05, 0.03, 0.01], dg=[0.0] * 4))
    assert v["TPO's surplus rises with concentration and peaks in the highest bin"] is Verdict.FAIL


def test_each_bin_row_shows_the_papers_value_for_that_bin(tmp_path):
    """Fig. 4b: TPO 0.000, 0.007, 0.021, 0.073 and DG 0.000, −0.001, −0.003, −0.005 from the lowest bin up."""
    section = _mechanism_report(tmp_path, tpo=[0.0, 0.007, 0.021, 0.073], dg=[0.0, -0.001, -0.003, -0.005])
    table = next(b for b in section.blocks if "| concentration bin |" in b)
    rows = [[c.strip() for c in line.split("|")[1:-1]] for line in table.splitlines() if line.startswith("| [")]
    assert [r[0] for r in rows] == ["[0, 0.25)", "[0.25, 0.5)", "[0.5, 0.75)", "[0.75, 1]"]
    ref = paper.MNIST_MECHANISM_SURPLUS.values
    assert [r[2] for r in rows] == [fmt(x) for x in ref["tpo"]] == ["0", "0.007", "0.021", "0.073"]
    assert [r[5] for r in rows] == [fmt(x) for x in ref["dg"]] == ["0", "-0.001", "-0.003", "-0.005"]


# ----------------------------------------------------------------------------- MLP bank

def test_a_network_without_a_hidden_layer_is_refused():
    with pytest.raises(ValueError, match=r"at least input, one hidden and output width; got \(784, 10\)"):
        init_bank((784, 10), [torch.Generator()], 1)
    assert len(init_bank((784, 5, 10), [torch.Generator()], 1)) == 4
