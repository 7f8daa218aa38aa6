"""The llm-length experiment: the chain_sum scratchpad and its answer check, the length-scaled η of the trainer
(η_g = η·L_ref/L̄_g, exact against per-group TPO computed independently), the per-step target diagnostics, and a
smoke run end to end."""

import re

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.llm
pytest.importorskip("transformers", reason="needs the llm extra: pip install -e '.[llm]'")
pytest.importorskip("reasoning_gym", reason="needs the llm extra: pip install -e '.[llm]'")

from targetpo.experiments import run_experiment
from targetpo.llm import length
from targetpo.llm import trainer as trainer_mod
from targetpo.llm.models import build_char_tokenizer
from targetpo.llm.trainer import TrainerConfig, length_scaled_eta
from targetpo.runs.store import read_metrics


# ----------------------------------------------------------------------------- the scratchpad task

def test_scratchpad_and_prompt_spell_out_the_running_sum():
    assert length.labelled_expression([4, -1, 7]) == "a4 b-1 c+7 ="
    assert length.scratchpad([4, -1, 7, -12]) == ("a is 4, total 4\nb is -1, 4 - 1 = 3, total 3\n"
                                                  "c is +7, 3 + 7 = 10, total 10\nd is -12, 10 - 12 = -2, total -2\n"
                                                  "answer -2")
    # every line but its one sum is a copy: the term after "is" from the prompt, the previous total, the new one
    for i, line in enumerate(length.scratchpad([4, -1, 7, -12]).split("\n")[1:-1], 1):
        m = re.fullmatch(r"([a-z]) is ([+-]\d+), (-?\d+) ([+-]) (\d+) = (-?\d+), total (-?\d+)", line)
        label, term, prev, op, mag, new, total = m.groups()
        assert f"{label}{term}" in length.labelled_expression([4, -1, 7, -12]) and term == f"{op}{mag}"
        assert int(prev) + int(term) == int(new) == int(total)
    assert length.expression_terms("4 - 1 + 7 - 0") == [4, -1, 7, 0]
    with pytest.raises(ValueError, match="27 terms"):
        length.scratchpad([1] * 27)
    with pytest.raises(ValueError, match="not 'n"):
        length.expression_terms("4 * 2")


@pytest.mark.parametrize("text, answer", [("a4=4\nb-1=3\nanswer 3", "3"), (" answer -17\n", "-17"),
                                          ("a4=4\nb-1=3", None), ("answer 3\nb-1=3", None), ("answer x", None),
                                          ("total 7answer 7", None)])  # not a line of its own
def test_final_answer_reads_only_a_closing_answer_line(text, answer):
    assert length.final_answer(text) == answer


def test_task_scores_the_gold_scratchpad_1_and_a_wrong_or_missing_answer_0():
    task = length.ScratchpadChainSum(7, 9)
    problems = task.problems("train", 20, seed=3)
    for p in problems:
        terms = length.expression_terms(p.entry["metadata"]["expression"])
        assert 7 <= len(terms) <= 9 and p.question == length.labelled_expression(terms)
        assert p.answer.endswith(f"answer {sum(terms)}") and str(sum(terms)) == p.entry["answer"]
        assert task.score(p, p.answer) == 1.0
        assert task.score(p, p.answer.rsplit(" ", 1)[0] + f" {sum(terms) + 1}") == 0.0
        assert task.score(p, p.answer.rsplit("\n", 1)[0]) == 0.0  # no answer line
        assert task.score(p, None) == 0.0
    # the scratchpad lines are not graded: a wrong line with the right answer still scores 1
    p = problems[0]
    assert task.score(p, "a9=9\n" + p.answer.split("\n", 1)[1]) == 1.0
    assert task.problems("heldout", 5, seed=3)[0].question != problems[0].question


def test_cpu_preset_completions_span_60_to_250_tokens():
    cfg = length.PRESETS["cpu"]
    task = length.ScratchpadChainSum(cfg.min_terms, cfg.max_terms)
    tok = build_char_tokenizer()
    lens = [len(tok(" " + p.answer, add_special_tokens=False)["input_ids"]) + 1 for p in task.problems("train", 300, 0)]
    assert np.percentile(lens, 5) >= 60 and np.percentile(lens, 95) <= 250 and max(lens) <= cfg.max_new_tokens


# ----------------------------------------------------------------------------- length-scaled η

def test_length_scaled_eta_is_eta_times_ref_over_group_mean_length():
    mask = torch.zeros(2, 3, 10, dtype=torch.bool)
    mask[0, :, :4] = True             # group 0: lengths 4, 4, 4
    mask[1, 0, :2] = True             # group 1: lengths 2, 6, 10 -> mean 6
    mask[1, 1, :6] = True
    mask[1, 2, :] = True
    torch.testing.assert_close(length_scaled_eta(0.5, 2.0, mask), torch.tensor([0.5 * 2 / 4, 0.5 * 2 / 6]))
    with pytest.raises(ValueError, match="ref_len"):
        length_scaled_eta(1.0, 0.0, mask)


@pytest.mark.parametrize("kw, match", [({"objective": "grpo"}, "objective"), ({"seq_logp": "mean"}, "seq_logp"),
                                       ({"objective_options": {"eta": 2.0}}, "must not also set eta")])
def test_length_scaled_eta_is_refused_where_it_has_no_meaning(kw, match):
    with pytest.raises(ValueError, match=match):
        TrainerConfig(eta_length_ref=1.0, **kw).validate()
    assert TrainerConfig().eta_length_ref == 0  # off by default


def test_length_scaled_eta_gradient_is_p_minus_q_with_each_groups_own_eta():
    b, k, t, eta, ref = 3, 4, 12, 0.7, 5.0
    gen = torch.Generator().manual_seed(1)
    old = -0.05 * torch.rand(b * k, t, generator=gen, dtype=torch.float64)  # close sums: p is not one-hot
    logp = old.clone().requires_grad_(True)  # first epoch: p_θ = p_old
    lens = torch.tensor([3, 5, 4, 4, 8, 12, 10, 6, 2, 2, 3, 1])  # group mean lengths 4, 9, 2
    mask = torch.arange(t)[None, :] < lens[:, None]
    rewards = torch.rand(b * k, generator=gen, dtype=torch.float64)
    cfg = TrainerConfig(k=k, batch_prompts=b, eta=eta, eta_length_ref=ref)
    out = trainer_mod.policy_loss(cfg, logp, old, rewards, mask, k)
    out.loss.backward()
    m = mask.double().numpy()
    seq = (old.numpy() * m).sum(-1).reshape(b, k)
    eta_g = eta * ref / m.sum(-1).reshape(b, k).mean(-1, keepdims=True)
    np.testing.assert_allclose(eta_g[:, 0], [eta * ref / 4, eta * ref / 9, eta * ref / 2])
    r = rewards.numpy().reshape(b, k)
    u = (r - r.mean(-1, keepdims=True)) / r.std(-1, keepdims=True)
    p = np.exp(seq - seq.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    q = p * np.exp(u / eta_g)
    q /= q.sum(-1, keepdims=True)
    d_seq = ((p - q) / b).reshape(-1)  # d loss / d sequence log-score; d seq / d token = 1 on valid tokens (sum)
    np.testing.assert_allclose(logp.grad.numpy(), d_seq[:, None] * m, atol=1e-9)
    assert float(out.metrics["eta_mean"]) == pytest.approx(float(eta_g.mean()))
    # one η for every group (the default) gives another target: the option is not a no-op
    q1 = p * np.exp(u / eta)
    assert np.abs(q1 / q1.sum(-1, keepdims=True) - q).max() > 0.05


# ----------------------------------------------------------------------------- diagnostics

def test_step_diagnostics_match_an_independent_computation_and_skip_zero_variance_groups():
    g, k, t = 3, 4, 300
    gen = torch.Generator().manual_seed(0)
    old = -torch.rand(g * k, t, generator=gen) * 2
    mask = torch.zeros(g * k, t, dtype=torch.bool)
    lens = [50] * k + [120] * k + [250] * k  # mean lengths 50, 120, 250
    for n, n_tok in enumerate(lens):
        mask[n, :n_tok] = True
    rewards = torch.tensor([0, 1, 0, 1, 1, 1, 1, 1, 1, 0, 0, 0], dtype=torch.float32)  # group 1 has no spread
    d = length.step_diagnostics(old, mask, rewards, k, eta=1.0, len_ref=1.0, edges=(100, 200))
    assert d["groups_with_spread"] == 2 and [d[f"len{i}_groups"] for i in range(3)] == [1, 0, 1]
    m = mask.double().numpy()
    seq_sum = (old.double().numpy() * m).sum(-1).reshape(g, k)
    seq_mean = seq_sum / m.sum(-1).reshape(g, k)
    r = rewards.double().numpy().reshape(g, k)
    for red, seq, eta in (("sum", seq_sum, np.ones((g, 1))), ("mean", seq_mean, np.ones((g, 1))),
                          ("sum_len", seq_sum, 1.0 / np.array([[50.0], [120.0], [250.0]]))):
        l1 = []
        for i in (0, 2):
            u = (r[i] - r[i].mean()) / r[i].std()
            p = np.exp(seq[i] - seq[i].max())
            p /= p.sum()
            q = p * np.exp(u / eta[i])
            q /= q.sum()
            l1.append(np.abs(p - q).sum())
        assert d[f"pq_l1_{red}"] == pytest.approx(np.mean(l1), abs=1e-6), red
        assert d[f"len0_pq_l1_{red}"] == pytest.approx(l1[0], abs=1e-6) and d[f"len1_pq_l1_{red}"] == 0.0
        assert d[f"len2_pq_l1_{red}"] == pytest.approx(l1[1], abs=1e-6)
    # random token log-probs over 250 tokens: the summed log-scores are far apart, p is near one-hot and q stays
    # near p; the mean keeps p spread and q moves
    assert d["len2_pq_l1_sum"] < 0.2 < 0.5 < d["len2_pq_l1_mean"]


def test_length_buckets_are_named_by_their_edges():
    assert length.length_bucket_names((100, 150, 200)) == ["<100", "100-150", "150-200", ">=200"]
    with pytest.raises(ValueError, match="increasing"):
        length.Config(length_edges=(150, 100)).validate()
    with pytest.raises(ValueError, match="min_terms"):
        length.Config(min_terms=9, max_terms=8).validate()


# ----------------------------------------------------------------------------- end to end

def test_smoke_run_logs_the_diagnostics_and_writes_the_report(tmp_path):
    from targetpo.report import write_report

    out = run_experiment("llm-length", "smoke", out=tmp_path / "run", progress=False, quiet=True)
    rows = read_metrics(out / "metrics.jsonl")
    units = {r["unit"] for r in rows}
    assert units == {"warmstart", "tpo_sum", "tpo_sum_len", "grpo"}
    rl = [r for r in rows if r["unit"] == "tpo_sum_len" and "reward" in r]
    assert len(rl) == length.PRESETS["smoke"].steps
    for key in ("pq_l1_sum", "pq_l1_mean", "pq_l1_sum_len", "target_entropy_mean", "len0_groups", "completion_len"):
        assert key in rl[0], key
    assert any("heldout_accuracy_long" in r for r in rows if r["unit"] == "grpo")
    report = write_report(out, tmp_path / "REPORT.md").read_text()
    assert "‖p − q‖₁ (sum)" in report and "length drift" in report and (out / "llm_length_curves.png").exists()
    assert "over seed 0;" in report and "over seeds [" not in report and "1 steps" not in report
    lengths = [line.split(" | ")[-2:] for line in report.splitlines() if line.startswith("| TPO (sum) |")]
    assert lengths and all(re.fullmatch(r"-?\d+\.\d", c.strip(" |")) for c in lengths[0])  # tokens: 1 decimal


def test_units_run_arm_by_arm_after_the_warm_start():
    cfg = length.Config(methods=("tpo_sum", "tpo_mean", "grpo"), seeds=2)
    assert length.units(cfg) == ["warmstart", "tpo_sum@seed0", "tpo_sum@seed1", "tpo_mean@seed0", "tpo_mean@seed1",
                                 "grpo@seed0", "grpo@seed1"]
    tc = length.trainer_config(cfg, "tpo_sum_len", 1)
    assert (tc.objective, tc.seq_logp, tc.eta_length_ref, tc.seed) == ("tpo", "sum", cfg.len_ref, 1)
    assert length.trainer_config(cfg, "tpo_mean", 0).eta_length_ref == 0
    with pytest.raises(ValueError, match="unknown method"):
        length.trainer_config(cfg, "tpo_median", 0)


def test_prefix_reward_credits_the_lines_right_before_the_first_mistake():
    gold = length.scratchpad([4, -1, 7])  # 4 lines: a, b, c, answer 10
    a, b, c, ans = gold.split("\n")
    assert length.correct_prefix(gold, gold) == 1.0
    assert length.correct_prefix(gold, "\n".join([a, b, c.replace("10", "11"), "answer 11"])) == 0.5
    assert length.correct_prefix(gold, "\n".join([a, b.replace("3", "2"), c, ans])) == 0.25  # later lines do not count
    assert length.correct_prefix(gold, "") == 0.0
    task = length.ScratchpadChainSum(7, 8, reward="prefix")
    p = task.problems("train", 1, seed=0)[0]
    lines = p.answer.split("\n")
    wrong = "\n".join(lines[:3] + ["x"] + lines[4:-1] + ["answer 999"])
    assert task.score(p, wrong) == pytest.approx(3 / len(lines)) and task.score(p, p.answer) == 1.0
    assert length.ScratchpadChainSum(7, 8).score(p, wrong) == 0.0  # the answer reward gives no partial credit
    # Every gold line and then more text: no final answer is read, so not 1 (held-out accuracy counts r = 1).
    assert task.score(p, p.answer + "\nzzzz") == pytest.approx((len(lines) - 1) / len(lines))
    with pytest.raises(ValueError, match="reward="):
        length.ScratchpadChainSum(7, 8, reward="lines")


def test_cpu_preset_is_on_the_brief():
    """5 arms, >= 3 paired seeds, K = 8, ~150 RL steps, the final-answer reward, the lean sampler."""
    cfg = length.PRESETS["cpu"]
    assert set(cfg.methods) == set(length.METHODS) and len(cfg.methods) == 5
    assert cfg.seeds >= 3 and cfg.k == 8 and cfg.steps >= 150
    assert cfg.reward == "answer" and cfg.sampler == "kv_loop"
    assert 0 < cfg.warmstart_steps and cfg.lr < cfg.warmstart_lr
