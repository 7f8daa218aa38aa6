"""Edges of the llm-length experiment the main tests leave open: the scratchpad at 0 and 26 terms, the prefix
reward's denominator, the length buckets at an edge, the target entropy in nats, the held-out halves, the arms'
trainer settings, the documented defaults, and the report's tables, claims and verdicts on a hand-made run."""

import dataclasses

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.llm
pytest.importorskip("transformers", reason="needs the llm extra: pip install -e '.[llm]'")
pytest.importorskip("reasoning_gym", reason="needs the llm extra: pip install -e '.[llm]'")

from targetpo.llm import length
from targetpo.llm import trainer as trainer_mod
from targetpo.llm.data import Problem
from targetpo.report import Section
from targetpo.runs.stats import Verdict
from targetpo.runs.store import Run

# ----------------------------------------------------------------------------- the task


def test_a_zero_term_is_added_with_a_plus_as_the_prompt_writes_it():
    """Term 0 is "+0" in the prompt, so its scratchpad line reads "+0" and adds it ("3 + 0 = 3")."""
    assert length.labelled_expression([3, 0]) == "a3 b+0 ="
    assert length.scratchpad([3, 0]) == "a is 3, total 3\nb is +0, 3 + 0 = 3, total 3\nanswer 3"


def test_twenty_six_terms_are_allowed_one_letter_each():
    """The labels allow 1 to 26 terms: the 26th term is labelled z."""
    assert length.labelled_expression([1] * 26).endswith(" y+1 z+1 =")
    lines = length.scratchpad([1] * 26).split("\n")
    assert len(lines) == 27 and lines[-2] == "z is +1, 25 + 1 = 26, total 26" and lines[-1] == "answer 26"


def test_an_expression_ending_in_an_operator_is_refused():
    """"4 +" is not 'n (+|-) n ...': it is refused, not read as [4]."""
    with pytest.raises(ValueError, match="not 'n"):
        length.expression_terms("4 +")


def test_an_operator_that_is_not_plus_or_minus_is_refused():
    """"4 +- 2" has the operator "+-": refused, not read as [4, -2] (a substring test would accept it)."""
    with pytest.raises(ValueError, match="not 'n"):
        length.expression_terms("4 +- 2")


def test_prefix_credit_is_a_fraction_of_the_gold_lines_also_for_a_short_completion():
    """A completion that stops after 2 right lines of a 4-line gold gets 2/4, not 2/2 (and does not crash)."""
    gold = length.scratchpad([4, -1, 7])  # 4 lines: a, b, c, answer 10
    assert length.correct_prefix(gold, "\n".join(gold.split("\n")[:2])) == 0.5


def test_min_terms_equal_to_max_terms_is_accepted():
    """Only min_terms > max_terms is refused: a fixed number of terms is a valid choice."""
    length.Config(min_terms=4, max_terms=4).validate()


# ----------------------------------------------------------------------------- step diagnostics


def test_length_buckets_go_by_the_groups_mean_length_and_an_edge_opens_the_upper_bucket():
    """A group of mean length 100 is in "100-150" (not "<100"), also when its longest completion reaches 150."""
    k, t = 4, 160
    mask = torch.zeros(2 * k, t, dtype=torch.bool)
    for n, n_tok in enumerate([100] * k + [50, 50, 150, 150]):  # both groups: mean length 100
        mask[n, :n_tok] = True
    rewards = torch.tensor([0, 1, 0, 1, 1, 0, 0, 1], dtype=torch.float32)
    old = -0.01 * torch.ones(2 * k, t)
    d = length.step_diagnostics(old, mask, rewards, k, eta=1.0, len_ref=1.0, edges=(100, 150))
    assert length.length_bucket_names((100, 150))[1] == "100-150"
    assert [d[f"len{i}_groups"] for i in range(3)] == [0, 2, 0]


def _entropy_case():
    """3 groups of K = 4 (mean lengths 50, 120, 130; every group has a spread) with log-probs close to 0."""
    g, k, t = 3, 4, 140
    gen = torch.Generator().manual_seed(3)
    old = -0.02 * torch.rand(g * k, t, generator=gen)
    lens = [50, 50, 50, 50, 100, 120, 130, 130, 130, 130, 130, 130]
    mask = torch.arange(t)[None, :] < torch.tensor(lens)[:, None]
    rewards = torch.tensor([0, 1, 1, 0, 1, 0, 0, 0, 0.5, 1, 0, 0.25])
    return old, mask, rewards, k


@pytest.mark.parametrize("red", length.REDUCTIONS)
def test_target_entropy_is_the_entropy_of_q_in_nats_averaged_and_bucketed(red):
    """target_entropy_r is the mean over spread groups of H(q) = −Σ q ln q; len{i}_target_entropy_r sums a bucket."""
    old, mask, rewards, k = _entropy_case()
    eta, ref = 0.5, 2.0
    d = length.step_diagnostics(old, mask, rewards, k, eta=eta, len_ref=ref, edges=(100,))
    m = mask.double().numpy()
    seq = (old.double().numpy() * m).sum(-1).reshape(3, k)
    lens = m.sum(-1).reshape(3, k)
    if red == "mean":
        seq = seq / lens
    etas = eta * ref / lens.mean(-1) if red == "sum_len" else np.full(3, eta)
    r = rewards.double().numpy().reshape(3, k)
    ent = []
    for i in range(3):
        u = (r[i] - r[i].mean()) / r[i].std()
        p = np.exp(seq[i] - seq[i].max())
        p /= p.sum()
        q = p * np.exp(u / etas[i])
        q /= q.sum()
        ent.append(-(q * np.log(q)).sum())
    assert all(0 < h < np.log(k) for h in ent)
    assert d[f"target_entropy_{red}"] == pytest.approx(np.mean(ent), abs=1e-6)
    assert d[f"len0_target_entropy_{red}"] == pytest.approx(ent[0], abs=1e-6)  # mean length 50
    assert d[f"len1_target_entropy_{red}"] == pytest.approx(ent[1] + ent[2], abs=1e-6)  # 120 and 130


# ----------------------------------------------------------------------------- units and arms


def test_no_warm_start_unit_without_warm_start_steps():
    """warmstart_steps=0 starts RL from the base model: the units are the arms alone."""
    cfg = length.Config(methods=("tpo_sum", "grpo"), seeds=1, warmstart_steps=0)
    assert length.units(cfg) == ["tpo_sum", "grpo"]


@pytest.mark.parametrize("method, objective, seq_logp", [("tpo_sum", "tpo", "sum"), ("tpo_mean", "tpo", "mean"),
                                                         ("tpo_sum_len", "tpo", "sum"), ("grpo", "grpo", "sum"),
                                                         ("dr_grpo", "dr_grpo", "sum")])
def test_each_arm_trains_its_documented_objective_and_reduction(method, objective, seq_logp):
    """tpo_mean is TPO on the mean token log-prob; dr_grpo is Dr. GRPO, not GRPO (the module docstring)."""
    tc = length.trainer_config(length.Config(), method, 0)
    assert (tc.objective, tc.seq_logp) == (objective, seq_logp)


def test_defaults_are_the_documented_ones():
    """docs/config.md (llm-length, cpu): 3–7 terms, buckets 100/150/200 tokens, L_ref = 1; smoke: 2–3 terms."""
    cfg = length.PRESETS["cpu"]
    assert (cfg.min_terms, cfg.max_terms, cfg.length_edges, cfg.len_ref) == (3, 7, (100, 150, 200), 1.0)
    assert length.Config() == cfg
    smoke = length.PRESETS["smoke"]
    assert (smoke.min_terms, smoke.max_terms) == (2, 3)


def test_data_source_names_the_pool_and_the_heldout_sizes():
    """The data line says the training pool size and the held-out count, each where it belongs."""
    text = length.data_source(length.Config(train_size=100, eval_size=8))
    assert "pool of 100," in text and "8 held-out problems" in text and "3–7 one-digit terms" in text


# ----------------------------------------------------------------------------- held-out halves


def _problems(*sizes):
    return [Problem(f"q{n}", "x" * n) for n in sizes]


def test_heldout_split_is_the_median_gold_length():
    """The cut is the median gold scratchpad length: of 10, 20, 30, 100 characters, 25."""
    assert length.heldout_split(_problems(10, 20, 30, 100)) == 25


def test_evaluator_splits_at_the_median_and_weights_the_halves_by_size(monkeypatch):
    """Short half below the median, long half at or above it; overall accuracy counts every problem once."""
    seen = {}

    def fake_greedy(model, tok, task, template, problems, **kw):
        seen[tuple(len(p.answer) for p in problems)] = True
        return {"heldout_accuracy": float(np.mean([len(p.answer) < 15 for p in problems]))}

    monkeypatch.setattr(trainer_mod, "evaluate_greedy", fake_greedy)
    evaluate = length.make_evaluator(length.Config(), None, None, None, None, _problems(10, 20, 30))
    out = evaluate()
    assert set(seen) == {(10,), (20, 30)}  # median 20: 20 is in the long half
    # 1 of 3 problems right (only the 10-character one): 1/3 overall, not the mean of the halves' accuracies
    assert out == pytest.approx({"heldout_accuracy_short": 1.0, "heldout_accuracy_long": 0.0,
                                 "heldout_accuracy": 1 / 3})


# ----------------------------------------------------------------------------- report on a hand-made run

STEPS = 5
JITTER = (0.0, 1.0, 2.0)  # seed s shifts each per-seed number by a little, so every interval has a width


def _unit_rows(unit, s, acc_end, bucket3_steps, steps=STEPS):
    """One RL unit's rows: accuracy 0.3 at step 0 rising to acc_end; completion length 100 + 2.5·step; two groups
    a step under 100 tokens (‖p − q‖₁ sum 0.6, mean 1.0) and one group ≥ 200 tokens at `bucket3_steps` (sum 0.3,
    mean 1.0), each per group and shifted per seed."""
    j = JITTER[s]
    rows = []
    for t in range(steps):
        row = {"unit": unit, "step": t, "heldout_accuracy": 0.3 + (acc_end - 0.3) * t / (steps - 1),
               "reward": 0.2 + 0.01 * j, "completion_len": 100 + 2.5 * t}
        per_group = {0: {"sum": 0.6 + 0.01 * j, "mean": 1.0 + 0.03 * j, "sum_len": 0.8},
                     3: {"sum": 0.3 + 0.02 * j, "mean": 1.0 + 0.01 * j, "sum_len": 0.9}}
        groups = {0: 2, 1: 0, 2: 0, 3: 1 if t in bucket3_steps else 0}
        for i, n in groups.items():
            row[f"len{i}_groups"] = n
            for red in length.REDUCTIONS:
                row[f"len{i}_pq_l1_{red}"] = n * per_group.get(i, {}).get(red, 0.0)
                row[f"len{i}_target_entropy_{red}"] = n * 1.0
        rows.append(row)
    return rows


def _run(tmp_path, records, **cfg_kw):
    cfg = dataclasses.asdict(length.Config(**cfg_kw))
    return Run(tmp_path, {"experiment": "llm-length", "preset": "cpu", "config": cfg}, records)


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """The report section of tpo_sum and tpo_mean, 3 seeds, 5 steps; the ≥ 200 bucket has 2 + 2 + 1 = 5 groups,
    all from tpo_sum."""
    tmp_path = tmp_path_factory.mktemp("length-report")
    records = []
    for s in range(3):
        records += _unit_rows(f"tpo_sum@seed{s}", s, 0.30 + 0.01 * JITTER[s], (0, 1) if s < 2 else (0,))
        records += _unit_rows(f"tpo_mean@seed{s}", s, 0.50 + 0.03 * JITTER[s], ())
        records += [{"unit": f"tpo_sum@seed{s}", "event": "done"}, {"unit": f"tpo_mean@seed{s}", "event": "done"}]
    run = _run(tmp_path, records, methods=("tpo_sum", "tpo_mean"), seeds=3, steps=STEPS)
    section = Section("llm-length", run, tmp_path)
    length.report(run, section)
    return section


def test_report_drift_is_last_steps_minus_first_steps(report, read_section):
    """Completion length 100 at step 0 and 110 at step 4 (n = steps // 5 = 1): the drift column reads +10.0."""
    row = read_section.row(report, "TPO (sum)")
    assert row[-2] == "100.0 ± 0.0" and row[-1] == "10.0 ± 0.0"


def test_report_bucket_means_are_per_seed_means_with_the_population_std_error(report, read_section):
    """The <100 bucket's sum ‖p − q‖₁ is 0.6, 0.61, 0.62 per group in seeds 0–2: the row shows their mean 0.610 ±
    s.e. = std(ddof=0)/√n (docs/experiments.md) = 0.01·√(2/3)/√3 = 0.0047 (the sample std would give 0.0058); the
    mean's 1.0, 1.03, 1.06 give 1.030 ± 0.0141 (not 0.0173)."""
    row = read_section.row(report, "<100")
    assert row[0] == str(3 * 2 * 2 * STEPS)  # 3 seeds × 2 arms × 2 groups a step
    assert row[1] == "0.610 ± 0.005" and row[2] == "1.030 ± 0.014"  # sum; mean


def test_report_judges_a_bucket_with_exactly_min_bucket_groups(report, read_section):
    """A bucket with 5 groups (= MIN_BUCKET_GROUPS) is in the claims: both buckets are compared."""
    claim = read_section.claim(report, "At these lengths the sum's")
    assert "<100: sum" in claim.evidence and ">=200: sum" in claim.evidence


def test_report_half_claim_fails_when_the_sum_is_above_half_the_mean(report, read_section):
    """Under 100 tokens the sum (0.6) is above half the mean (1.0 / 2): "under half ... in every bucket" fails."""
    assert read_section.claim(report, "At these lengths the sum's").verdict is Verdict.FAIL


def test_report_shrink_claim_passes_when_the_sum_falls_with_length(report, read_section):
    """The sum's ‖p − q‖₁ falls from ~0.6 (<100) to ~0.3 (>=200) in every seed: the shrink claim passes."""
    claim = read_section.claim(report, "With the sum, ‖p − q‖₁ shrinks")
    assert claim.verdict is Verdict.PASS and "(<100) ->" in claim.evidence


def test_report_accuracy_claim_is_at_the_last_step_and_passes_for_the_better_arm(report, read_section):
    """TPO (mean) ends 0.2 above TPO (sum) in every seed (equal at step 0): the claim passes, at step 4."""
    claim = read_section.claim(report, "TPO (mean) is more accurate")
    assert claim.verdict is Verdict.PASS and "at step 4)" in claim.text


# ----------------------------------------------------------------------------- series helpers and the verdict


def test_finished_series_leaves_out_an_unfinished_seed(tmp_path):
    """A unit without its done event is left out: one finished seed gives one column."""
    records = _unit_rows("tpo_sum@seed0", 0, 0.4, ()) + _unit_rows("tpo_sum@seed1", 1, 0.4, ())
    records.append({"unit": "tpo_sum@seed0", "event": "done"})
    steps, vals = length.finished_series(_run(tmp_path, records, seeds=2), "heldout_accuracy")["tpo_sum"]
    assert steps.tolist() == list(range(STEPS)) and vals.shape == (STEPS, 1)


def test_paired_compares_at_the_last_step_both_arms_recorded(tmp_path):
    """tpo_sum recorded steps 0–3, tpo_mean 0–4: the pair is at step 3 with each arm's values there."""
    records = _unit_rows("tpo_mean@seed0", 0, 0.7, ()) + _unit_rows("tpo_sum@seed0", 0, 0.5, (), steps=4)
    records += [{"unit": "tpo_mean@seed0", "event": "done"}, {"unit": "tpo_sum@seed0", "event": "done"}]
    step, seeds, va, vb = length.paired(_run(tmp_path, records, seeds=2), "heldout_accuracy", "tpo_mean", "tpo_sum")
    # tpo_mean at step 3 of 0..4: 0.3 + 0.4·3/4 = 0.6; tpo_sum at its last step 3: 0.5
    assert (step, seeds) == (3, [0]) and va == pytest.approx([0.6]) and vb == pytest.approx([0.5])


@pytest.mark.parametrize("better, word", [(True, "better than"), (False, "worse than")])
def test_verdict_says_better_or_worse_by_the_sign_of_the_paired_difference(better, word):
    """An arm above TPO (sum) in every seed is "better than" it; below in every seed, "worse than"."""
    high, low = np.array([0.5, 0.55, 0.52]), np.array([0.3, 0.32, 0.31])
    pair = (4, [0, 1, 2], high, low) if better else (4, [0, 1, 2], low, high)
    assert length.verdict("TPO (mean)", pair).startswith(f"TPO (mean) is {word} TPO (sum)")
