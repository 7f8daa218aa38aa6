"""Edges of the LLM pipeline's documented behaviour: the GSM8K final answer and its file checks, the exponent bound
of the GSM8K reward, the plain template's answer, the rollout's argument checks, trimming, token budgets, EOS
padding and decoding, the rlvr config and report (ceiling, ties, gains, the better reduction, the table's
windows), task option values, and the verl reward's puzzle check."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

pytestmark = pytest.mark.llm
pytest.importorskip("transformers", reason="needs the llm extra: pip install -e '.[llm]'")
pytest.importorskip("reasoning_gym", reason="needs the llm extra: pip install -e '.[llm]'")

from targetpo.llm import experiment as rlvr  # noqa: E402
from targetpo.llm.data import Gsm8kTask, ReasoningGymTask, read_gsm8k  # noqa: E402
from targetpo.llm.models import build_char_tokenizer, build_tiny_model  # noqa: E402
from targetpo.llm.rewards import gsm8k_gold, score_gsm8k  # noqa: E402
from targetpo.llm.rollout import (decode_completions, encode_prompts, group_micro_batches,  # noqa: E402
                                  kv_loop_sample, sample, token_micro_batches, used_columns)
from targetpo.llm.templates import Template  # noqa: E402
from targetpo.report import Section, resolve_failures  # noqa: E402
from targetpo.runs.stats import SCALE, Verdict  # noqa: E402
from targetpo.runs.store import Run  # noqa: E402


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


@pytest.fixture(scope="module")
def model(tok):
    return build_tiny_model(tok, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64)


def _ids(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


# ----------------------------------------------------------------------------- GSM8K answers and files

def test_gsm8k_gold_is_the_text_after_the_last_marker():
    assert gsm8k_gold("first try #### 1\nthen corrected #### 2") == "2"
    assert gsm8k_gold("#### 1,234") == "1234"


@pytest.mark.parametrize("exponent", [500, 1000])
def test_gsm8k_powers_up_to_the_exponent_bound_are_compared(exponent):
    """Only exponents above 1000 are left uncompared: 2^500 and 2^1000 written as powers equal their values."""
    assert score_gsm8k(str(2**exponent), f"$2^{{{exponent}}}$") == 1.0


def test_gsm8k_powers_above_the_exponent_bound_score_zero():
    assert score_gsm8k(str(2**1001), "$2^{1001}$") == 0.0


def _gsm8k_dir(tmp_path, test_rows: list[dict]):
    (tmp_path / "train.jsonl").write_text(json.dumps({"question": "1+1?", "answer": "#### 2"}) + "\n")
    (tmp_path / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in test_rows))
    return tmp_path


@pytest.mark.parametrize("seed", [0, 1, 7])
def test_gsm8k_heldout_is_the_first_test_problems_for_every_seed(tmp_path, seed):
    rows = [{"question": f"q{i}?", "answer": f"#### {i}"} for i in (1, 2, 3)]
    got = Gsm8kTask(_gsm8k_dir(tmp_path, rows)).problems("heldout", 2, seed)
    assert [(p.question, p.answer) for p in got] == [("q1?", "1"), ("q2?", "2")]


def test_gsm8k_final_answers_may_be_decimals(tmp_path):
    path = tmp_path / "test.jsonl"
    path.write_text(json.dumps({"question": "Half of 5?", "answer": "5 / 2 = 2.5\n#### 2.5"}) + "\n")
    assert [r["question"] for r in read_gsm8k(path)] == ["Half of 5?"]


@pytest.mark.parametrize("content", ["", "\n  \n\n"])
def test_a_gsm8k_file_without_problems_is_refused(tmp_path, content):
    path = tmp_path / "test.jsonl"
    path.write_text(content)
    with pytest.raises(ValueError, match="no problems in the file"):
        read_gsm8k(path)


# ----------------------------------------------------------------------------- templates

def test_plain_template_answers_after_one_space(tok):
    from targetpo.llm.warmstart import supervised_batch
    from targetpo.llm.data import Problem

    assert Template("plain").target("19") == " 19"
    ids, mask, labels = supervised_batch(tok, Template("plain"), [Problem("12 + 7 =", "19")], "cpu")
    taught = labels[0][labels[0] != -100].tolist()
    assert taught == _ids(tok, " 19") + [tok.eos_token_id]


# ----------------------------------------------------------------------------- rollouts

@pytest.mark.parametrize("size", [0, -4])
def test_group_micro_batches_need_a_positive_multiple_of_k(size):
    with pytest.raises(ValueError, match="positive multiple of K"):
        group_micro_batches(2, 4, size)


def test_token_budget_counts_each_groups_longest_completion():
    """Two groups of K = 2 rows, 1-token prompts, completions of 1 and 10 tokens: together they cost
    4 rows × (1 + 10) = 44 padded tokens, over a budget of 30, so each gets a micro-batch of its own."""
    prompt_mask = torch.ones(4, 1, dtype=torch.bool)
    completion_mask = torch.zeros(4, 10, dtype=torch.bool)
    completion_mask[[0, 2], :1] = True
    completion_mask[[1, 3], :] = True
    batches = token_micro_batches(prompt_mask, completion_mask, 2, 30)
    assert [b.tolist() for b in batches] == [[0, 1], [2, 3]]
    for rows in batches:
        longest = int(prompt_mask[rows].sum(1).max()) + int(completion_mask[rows].sum(1).max())
        assert len(rows) * longest <= 30


def test_rows_after_eos_hold_padding(tok):
    """A row that emits EOS gets padding from then on, while the other rows go on unchanged. The EOS id is taken
    as the first greedy token of the first row (in a run where no token ends a row), which the second row of this
    model never emits in three steps."""
    model = build_tiny_model(tok, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64,
                             seed=1)
    ids, mask = encode_prompts(tok, ["1 + 2 =", "40 + 5 ="], "cpu")
    kw = dict(max_new_tokens=3, greedy=True, pad_id=tok.pad_token_id)
    free = kv_loop_sample(model.eval(), ids, mask, eos_id=-1, **kw)
    eos = int(free[0, 0])
    assert free.shape == (2, 3) and not (free[1] == eos).any()
    out = kv_loop_sample(model.eval(), ids, mask, eos_id=eos, **kw)
    assert out[0].tolist() == [eos, tok.pad_token_id, tok.pad_token_id]
    assert torch.equal(out[1], free[1])


def test_decoded_completions_leave_out_eos_and_padding(tok):
    row = _ids(tok, " 19") + [tok.eos_token_id, tok.pad_token_id]
    mask = torch.tensor([[True, True, True, True, False]])
    assert decode_completions(tok, torch.tensor([row]), mask) == [" 19"]


def test_greedy_sampling_refuses_more_than_one_completion(tok, model):
    with pytest.raises(ValueError, match="greedy decoding gives one completion"):
        sample(model, tok, ["1 + 2 ="], k=2, max_new_tokens=2, greedy=True)


@pytest.mark.parametrize("sampler", ["generate", "kv_loop"])
def test_sampling_needs_at_least_one_new_token(tok, model, sampler):
    with pytest.raises(ValueError, match="max_new_tokens=0: must be >= 1"):
        sample(model, tok, ["1 + 2 ="], k=1, max_new_tokens=0, sampler=sampler)


def test_trimming_keeps_one_prompt_column_when_no_row_uses_one():
    p0, c1 = used_columns(torch.zeros(2, 5, dtype=torch.bool), torch.ones(2, 3, dtype=torch.bool))
    assert (p0, c1) == (4, 3)  # [:, 4:] keeps exactly the last of the 5 prompt columns


# ----------------------------------------------------------------------------- task options and config

@pytest.mark.parametrize("weights", ["nan|0.4|0.1|0.1", "0.4|inf|0.1|0.1"])
def test_weight_lists_must_be_finite_numbers(weights):
    with pytest.raises(ValueError, match="operations_weights takes numbers joined by '\\|'"):
        ReasoningGymTask("complex_arithmetic", operations_weights=weights)


def test_batch_prompts_may_not_exceed_the_training_pool():
    rlvr.Config(batch_prompts=4, train_size=4).check()
    with pytest.raises(ValueError, match="batch_prompts must be <= train_size"):
        rlvr.Config(batch_prompts=5, train_size=4).check()


# ----------------------------------------------------------------------------- the rlvr report

SEEDS = 2


def _report(tmp_path, steps: int, reward: dict[str, list[float]], acc: dict[str, dict[int, float]],
            warm_start: list[dict] = ()):
    """The rlvr report of a run whose every seed of method m records reward[m][t] at RL step t and held-out
    accuracy acc[m][step], after the records `warm_start`; returns ({claim text: claim}, the section's text)."""
    cfg = rlvr.PRESETS["cpu"]
    config = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)} | {
        "methods": list(reward), "steps": steps, "seeds": SEEDS}
    records = list(warm_start)
    for s in range(SEEDS):
        for m, rewards in reward.items():
            for t in range(max(len(rewards), *acc[m], 0) + 1):
                r = {"unit": f"{m}@seed{s}", "step": t}
                if t < len(rewards):
                    r |= {"reward": rewards[t], "frac_zero_var": 0.0}
                if t in acc[m]:
                    r["heldout_accuracy"] = acc[m][t]
                if len(r) > 2:
                    records.append(r)
    run = Run(tmp_path, {"preset": "cpu", "experiment": "rlvr", "config": config}, records)
    section = Section("rlvr", run, tmp_path)
    rlvr.report(run, section)
    resolve_failures([section])
    return {c.text: c for c in section.claims}, "\n".join(section.blocks)


def _claim(claims: dict, start: str):
    return next(c for text, c in claims.items() if text.startswith(start))


def test_a_warm_start_exactly_at_the_ceiling_counts_as_at_the_ceiling(tmp_path):
    """A warm start at or above the 0.8 ceiling classes a slower TPO as scale, and nothing calls it below."""
    claims, _ = _report(tmp_path, 4, {"tpo_sum": [0.5] * 4, "grpo": [0.6] * 4},
                        {"tpo_sum": {0: 0.8, 2: 0.7, 4: 0.7}, "grpo": {0: 0.8, 2: 0.9, 4: 0.9}})
    faster = _claim(claims, "TPO (sum) learns faster than GRPO")
    assert faster.verdict is Verdict.FAIL and faster.failure.kind == SCALE
    assert "reaches 0.800 held-out accuracy" in faster.failure.evidence
    said = [f.evidence for c in claims.values() for f in (*c.candidates, c.failure) if f is not None]
    assert said and not any("below the 0.8 ceiling" in e for e in said)


def test_equal_final_accuracy_is_at_least_as_accurate(tmp_path):
    """Every seed ends at the same held-out accuracy for TPO and GRPO: a paired difference of exactly 0, which
    "ends at least as accurate" (≥ 0) accepts."""
    claims, _ = _report(tmp_path, 4, {"tpo_sum": [0.5] * 4, "grpo": [0.5] * 4},
                        {"tpo_sum": {0: 0.3, 4: 0.6}, "grpo": {0: 0.3, 4: 0.6}})
    assert _claim(claims, "TPO (sum) ends at least as accurate as GRPO").verdict is Verdict.PASS


def test_the_gain_over_the_warm_start_is_measured_from_step_0(tmp_path):
    """Held-out accuracy 0.1 at step 0, 0.5 mid-run and 0.6 at the end: the gain is 0.6 − 0.1 = 0.5."""
    claims, _ = _report(tmp_path, 4, {"grpo": [0.5] * 4}, {"grpo": {0: 0.1, 2: 0.5, 4: 0.6}})
    gain = _claim(claims, "GRPO improves held-out accuracy over the warm start")
    assert "0.1 -> 0.6; gain 0.500" in gain.evidence and gain.verdict is Verdict.PASS


@pytest.mark.parametrize("sum_reward, mean_reward, better", [(0.6, 0.4, "sum"), (0.4, 0.6, "mean")])
def test_the_reduction_that_collected_more_reward_is_named(tmp_path, sum_reward, mean_reward, better):
    _, text = _report(tmp_path, 4, {"tpo_sum": [sum_reward] * 4, "tpo_mean": [mean_reward] * 4},
                      {"tpo_sum": {0: 0.3, 4: 0.5}, "tpo_mean": {0: 0.3, 4: 0.5}})
    assert f"TPO with the **{better}** learned more here" in text


def test_reward_table_windows_are_a_fifth_of_the_steps(tmp_path):
    """20 RL steps with reward t/20 at step t: the first fifth (steps 0–3) averages 1.5/20 = 0.075, the last
    (steps 16–19) 17.5/20 = 0.875."""
    rewards = [t / 20 for t in range(20)]
    _, text = _report(tmp_path, 20, {"grpo": rewards}, {"grpo": {0: 0.3, 20: 0.5}})
    assert "| train reward (first 4) | train reward (last 4) |" in text
    row = next(line for line in text.splitlines() if line.startswith("| GRPO |"))
    assert "| 0.075 | 0.875 |" in row


@pytest.mark.parametrize("done, said", [(True, "it took 300 steps"), (False, "still running, 300 steps so far")])
def test_the_warm_start_is_said_finished_only_once_its_unit_is_done(tmp_path, done, said):
    """A partial run's warm start, evaluated last at step 300, has not stopped there: only a finished unit
    "took" its last evaluation's steps."""
    ws = [{"unit": rlvr.WARMSTART, "step": t, "heldout_accuracy": [0.1, 0.1]} for t in (0, 100, 200, 300)]
    if done:
        ws.append({"unit": rlvr.WARMSTART, "event": "done"})
    _, text = _report(tmp_path, 4, {"grpo": [0.5] * 4}, {"grpo": {0: 0.3, 4: 0.5}}, ws)
    assert said in text and ("still running" in text) != done


# ----------------------------------------------------------------------------- verl reward

def test_graph_color_puzzle_without_colors_is_refused():
    from targetpo.integrations.verl_rewards import GRAPH_COLOR, compute_score

    with pytest.raises(ValueError, match=r"lacks \['color_options'\]"):
        compute_score(GRAPH_COLOR, "<answer>{}</answer>", json.dumps({"vertices": [0], "edges": []}))


# ----------------------------------------------------------------------------- warm start and its RL units

def test_rl_units_of_a_diverged_warm_start_are_not_run(tmp_path, monkeypatch, capsys):
    """The first RL unit used to rebuild a diverged warm start itself (its log a no-op, so unchecked for NaN) and
    train from it; now the RL units are recorded as diverged without being started."""
    import targetpo.llm.warmstart as ws
    from targetpo.cli import main

    def nan_warm_start(model, tok, template, train, *, log, **kw):
        log({"step": 0, "loss": float("nan")})

    monkeypatch.setattr(ws, "supervised_warmstart", nan_warm_start)
    out = tmp_path / "r"
    assert main(["run", "rlvr", "--out", str(out), "--preset", "smoke", "--no-progress", "--no-report",
                 "--jobs", "1"]) == 0
    events = {r["unit"]: (r["event"], r["metric"]) for r in Run.load(out).records if "event" in r}
    assert events == {"warmstart": ("diverged", "loss"), "tpo_sum": ("diverged", "needs warmstart, which diverged"),
                      "grpo": ("diverged", "needs warmstart, which diverged")}
    assert not (out / "warmstart").exists() and not (out / "models").exists()
    assert "no RL unit has a held-out accuracy record yet" in capsys.readouterr().out


def test_an_rl_unit_without_its_finished_warm_start_says_so(tmp_path):
    (tmp_path / rlvr.WARMSTART).mkdir()  # a folder without COMPLETE: a warm start killed while it was saved
    with pytest.raises(RuntimeError, match=r"unit grpo starts from the warm-start model in .*warmstart, which is "
                       r"not there \(the 'warmstart' unit has not finished\)"):
        rlvr.warm_started(tmp_path, "grpo")
    (tmp_path / rlvr.WARMSTART / "COMPLETE").write_text("warm start finished\n")
    assert rlvr.warm_started(tmp_path, "grpo") == tmp_path / rlvr.WARMSTART
