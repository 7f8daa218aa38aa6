"""Edges of the LLM set-up steps: `targetpo rlvr`'s flags as `methods=` and the other overrides, the supervised
warm start (argument checks, batches, logging, the full-logits budget, the atomic checkpoint), the tiny model
builders and the loading of a local model directory (its checks, messages, dtype and padding token)."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.llm
pytest.importorskip("transformers", reason="needs the llm extra: pip install -e '.[llm]'")
pytest.importorskip("reasoning_gym", reason="needs the llm extra: pip install -e '.[llm]'")

import targetpo.llm.warmstart as ws  # noqa: E402
from targetpo.llm.cli import _methods, rlvr_overrides  # noqa: E402
from targetpo.llm.data import Problem  # noqa: E402
from targetpo.llm.models import (build_char_tokenizer, build_tiny_model, check_model_dir, load_model,  # noqa: E402
                                 load_tokenizer, save_tiny_model)
from targetpo.llm.templates import Template  # noqa: E402

SMALL = dict(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64)
PROBLEMS = [Problem(f"{i} + 1 =", str(i + 1)) for i in range(10)]


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("tiny") / "m", **SMALL)


def _overrides(argv: list[str]) -> list[str]:
    from targetpo.cli import build_parser

    return rlvr_overrides(build_parser().parse_args(["rlvr", *argv]))


def _warm(tok, model, problems=PROBLEMS, **kw):
    """supervised_warmstart on `problems` with small settings; returns the records it logged."""
    records = []
    ws.supervised_warmstart(model, tok, Template("plain"), problems, log=records.append,
                            **{"steps": 2, "batch_size": 3, "lr": 1e-3, "seed": 0, **kw})
    return records


# ----------------------------------------------------------------------------- targetpo rlvr flags

def test_tpo_no_anchor_takes_the_sequence_log_score_like_tpo():
    """tpo_no_anchor is a TPO objective: it gets --seq-logp's reduction (default sum), and --seq-logp is read."""
    assert _methods("tpo_no_anchor", "mean") == "tpo_no_anchor_mean"
    assert _methods("tpo_no_anchor,grpo", None) == "tpo_no_anchor_sum,grpo"
    assert _methods("tpo_no_anchor", "both") == "tpo_no_anchor_sum,tpo_no_anchor_mean"


def test_seq_logp_alone_gives_tpo_runs():
    """--help: `--seq-logp both` is "two TPO runs" (a single reduction, one), whatever the preset's methods."""
    assert _overrides(["--seq-logp", "both"]) == ["methods=tpo_sum,tpo_mean"]
    assert _overrides(["--seq-logp", "mean"]) == ["methods=tpo_mean"]


def test_objective_and_methods_together_are_refused():
    """A flag and the field it sets are refused together: --objective/--seq-logp with methods=."""
    for argv in (["--objective", "grpo", "methods=tpo_sum"], ["--seq-logp", "mean", "methods=tpo_sum"]):
        with pytest.raises(ValueError, match=r"give either --objective/--seq-logp or methods=\.\.\., not both"):
            _overrides(argv)


def test_a_flag_and_its_field_written_with_a_dash_are_refused():
    """`data-path=...` names the field data_path (config keys take dashes): beside --data-path it is refused."""
    from targetpo.experiments import load
    from targetpo.runs.config import make_config

    assert make_config(load("rlvr"), "smoke", overrides=["task=gsm8k", "data-path=/y"]).data_path == "/y"
    with pytest.raises(ValueError, match="give either --data-path or data_path=..., not both"):
        _overrides(["--data-path", "/x", "data-path=/y"])


# ----------------------------------------------------------------------------- warm start

@pytest.mark.parametrize("kw", [{"steps": -1}, {"batch_size": 0}, {"lr": 0.0}, {"lr": float("nan")}])
def test_warm_start_settings_out_of_range_are_refused(tok, kw):
    """steps >= 0, batch_size >= 1 and lr > 0, as the message says (a NaN lr is not > 0)."""
    model = build_tiny_model(tok, **SMALL)
    with pytest.raises(ValueError, match="warm start needs steps >= 0, batch_size >= 1, lr > 0"):
        _warm(tok, model, **kw)


def test_warm_start_without_problems_is_refused(tok):
    with pytest.raises(ValueError, match="warm start needs at least one training problem"):
        _warm(tok, build_tiny_model(tok, **SMALL), problems=[])


def test_zero_warm_start_steps_log_one_final_record_and_leave_the_model(tok):
    """steps = 0 is allowed (steps >= 0): no update, and the last record (step = steps) is logged."""
    model = build_tiny_model(tok, **SMALL)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    records = _warm(tok, model, steps=0, evaluate=lambda: {"acc": 0.5}, eval_every=1)
    assert records == [{"step": 0, "acc": 0.5}]
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())


def test_warm_start_logs_each_step_and_evaluates_before_the_update_and_after_the_last(tok):
    """`log` gets {step, sft_loss} every step, evaluate()'s metrics every eval_every steps (taken before that
    step's update: step 0's is the untrained model) and after the last step, at step = steps."""
    model = build_tiny_model(tok, **SMALL)
    first = next(model.parameters())
    start = first.detach().clone()
    seen = []

    def evaluate():
        seen.append(torch.equal(first.detach(), start))
        return {"calls": len(seen)}

    records = _warm(tok, model, steps=4, evaluate=evaluate, eval_every=2)
    assert [r["step"] for r in records] == [0, 1, 2, 3, 4]
    assert all("sft_loss" in r for r in records[:4]) and "sft_loss" not in records[4]
    assert [r.get("calls") for r in records] == [1, None, 2, None, 3]
    assert seen == [True, False, False]


def test_warm_start_until_stops_at_the_first_evaluation_that_reaches_it_with_the_fixed_run_records(tok):
    """until > 0: the fit stops at the first evaluation with heldout_accuracy >= until, logged at that step
    with no update after it, and returns the steps taken; every record before is the fixed-step run's, and the
    model the fixed-step run's at that step (evaluations draw no random numbers). Never reached: all `steps`."""
    def curve():
        accs = iter([0.0, 0.1, 0.3, 0.9, 0.9])
        return lambda: {"heldout_accuracy": next(accs)}

    fixed_model, stopped_model = build_tiny_model(tok, **SMALL), build_tiny_model(tok, **SMALL)
    fixed = _warm(tok, fixed_model, steps=4, evaluate=curve(), eval_every=2)
    advanced, stopped = [], []
    took = ws.supervised_warmstart(stopped_model, tok, Template("plain"), PROBLEMS, steps=8, batch_size=3, lr=1e-3,
                                   seed=0, log=stopped.append, advance=advanced.append, evaluate=curve(),
                                   eval_every=2, until=0.25)
    assert took == 4 and sum(advanced) == 8  # the progress bar over `steps` ends full
    assert stopped[:4] == fixed[:4] and stopped[4] == {"step": 4, "heldout_accuracy": 0.3} == fixed[4]
    assert all(torch.equal(v, stopped_model.state_dict()[k]) for k, v in fixed_model.state_dict().items())
    never = _warm(tok, build_tiny_model(tok, **SMALL), steps=4, evaluate=curve(), eval_every=2, until=0.95)
    assert [r["step"] for r in never] == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("kw, match", [
    ({"until": 1.5, "evaluate": lambda: {"heldout_accuracy": 0}, "eval_every": 1}, r"until=1\.5: a held-out accuracy in \[0, 1\]"),
    ({"until": 0.2}, r"until=0\.2 stops at a held-out evaluation: give `evaluate` and eval_every >= 1 \(got eval_every=0, no evaluate\)"),
    ({"until": 0.2, "evaluate": lambda: {"acc": 0.5}, "eval_every": 1}, r"its evaluation gave \['acc'\], no heldout_accuracy"),
])
def test_warm_start_until_without_a_held_out_accuracy_is_refused(tok, kw, match):
    with pytest.raises(ValueError, match=match):
        _warm(tok, build_tiny_model(tok, **SMALL), **kw)


def test_warm_start_batches_depend_on_the_seed_and_the_step(tok, monkeypatch):
    """Batches come from a generator seeded by (seed, step): a rerun draws the same ones, each step another."""
    drawn, real = [], ws.supervised_batch

    def spy(tokenizer, template, problems, device):
        drawn.append(problems)
        return real(tokenizer, template, problems, device)

    monkeypatch.setattr(ws, "supervised_batch", spy)
    _warm(tok, build_tiny_model(tok, **SMALL), steps=2, lr=1e-9)
    first, drawn[:] = list(drawn), []
    _warm(tok, build_tiny_model(tok, **SMALL), steps=2, lr=1e-9)
    assert drawn == first and len(first) == 2 and all(len(b) == 3 for b in first)
    assert first[0] != first[1]


def _loss_path(tok, monkeypatch, budget, chunk_tokens=8) -> str:
    """Which path supervised_loss takes for 2 rows × 6 tokens of the tiny model under a logits budget."""
    model = build_tiny_model(tok, **SMALL)
    ids, mask, labels = ws.supervised_batch(tok, Template("plain"), [Problem("1+1", "2"), Problem("3", "9")],
                                            "cpu")
    assert ids.shape == (2, 6)  # "1+1" + " 2" + EOS and "3" + " 9" + EOS (one token per character), padded to 6
    chunked = []
    real = ws.chunked_token_logprob
    monkeypatch.setattr(ws, "chunked_token_logprob", lambda *a, **kw: chunked.append(1) or real(*a, **kw))
    monkeypatch.setattr(ws, "FULL_LOGITS_MAX_BYTES", budget)
    ws.supervised_loss(model, ids, mask, labels, chunk_tokens=chunk_tokens)
    return "chunked" if chunked else "full"


def test_the_full_logits_budget_holds_logits_of_exactly_its_size(tok, monkeypatch):
    """Logits that fit the budget (2 rows × 5 shifted positions × vocabulary × 4 bytes of fp32) are taken whole;
    one byte less and only the labelled tokens go through the head in chunks; chunk_tokens=0 is always whole."""
    size = 2 * 5 * len(tok) * 4
    assert _loss_path(tok, monkeypatch, size) == "full"
    assert _loss_path(tok, monkeypatch, size - 1) == "chunked"
    assert _loss_path(tok, monkeypatch, 0, chunk_tokens=0) == "full"


class _Saveable:
    """Stands for a model or tokenizer: save_pretrained writes one file named after it."""

    def __init__(self, name):
        self.name = name

    def save_pretrained(self, path):
        path.mkdir(parents=True, exist_ok=True)
        (path / self.name).write_text("x")


def test_checkpoint_is_marked_complete_and_replaces_a_stale_tmp_and_an_old_checkpoint(tmp_path):
    """The checkpoint is written to a sibling .tmp folder (emptied first: a killed run's leftovers must not end up
    in it), marked COMPLETE, then renamed over the old one."""
    out = tmp_path / "warmstart"
    (tmp_path / "warmstart.tmp").mkdir()
    (tmp_path / "warmstart.tmp" / "stale.safetensors").write_text("killed")
    out.mkdir()
    (out / "old").write_text("old")
    assert ws.save_checkpoint(_Saveable("model"), _Saveable("tokenizer"), out) == out
    assert sorted(p.name for p in out.iterdir()) == ["COMPLETE", "model", "tokenizer"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["warmstart"]


# ----------------------------------------------------------------------------- tiny models

def test_tiny_model_needs_whole_heads_and_kv_groups(tok):
    with pytest.raises(ValueError, match=r"num_heads \(4\) and num_heads by num_kv_heads \(3\)"):
        build_tiny_model(tok, hidden_size=32, num_heads=4, num_kv_heads=3)
    with pytest.raises(ValueError, match=r"hidden_size \(30\) must be divisible by num_heads \(4\)"):
        build_tiny_model(tok, hidden_size=30, num_heads=4, num_kv_heads=2)


def test_tiny_model_weights_are_a_function_of_its_seed(tok):
    a, b, c = (build_tiny_model(tok, **SMALL, seed=s) for s in (1, 1, 2))
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not all(torch.equal(sa[k], sc[k]) for k in sa)


def test_tiny_model_pads_left_and_generates_up_to_eos(tok):
    """Special tokens: <pad> id 0, <eos> id 1; generation pads with <pad> and stops at <eos>."""
    model = build_tiny_model(tok, **SMALL)
    assert (model.generation_config.pad_token_id, model.generation_config.eos_token_id) == (0, 1)
    assert tok(["12", "3"], padding=True)["input_ids"][1] == [0] + tok("3")["input_ids"]


# ----------------------------------------------------------------------------- model directories

def test_a_blank_model_path_is_called_empty():
    with pytest.raises(FileNotFoundError, match="model is empty"):
        check_model_dir("   ")


def test_download_hint_treats_only_a_missing_org_slash_name_as_a_hub_id(tmp_path, monkeypatch):
    """A hub id (org/name) is fetched by its id; a local path (an existing folder, or more than org/name) names
    where the download should go."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match="hf download Org/Name --local-dir DIR"):
        check_model_dir("Org/Name")
    with pytest.raises(FileNotFoundError, match="hf download ORG/NAME --local-dir Org/Name/sub"):
        check_model_dir("Org/Name/sub")
    (tmp_path / "org" / "name").mkdir(parents=True)  # exists, but is no model (no config.json)
    with pytest.raises(FileNotFoundError, match="no config.json.*hf download ORG/NAME --local-dir org/name"):
        check_model_dir("org/name")


def test_a_model_path_under_home_is_expanded(saved, monkeypatch):
    monkeypatch.setenv("HOME", str(saved.parent))
    assert check_model_dir("~/m") == saved


def test_load_model_keeps_the_tiny_pad_token_and_the_dtype_asked_for(saved):
    """The character tokenizer's own <pad> (id 0) stays (only a tokenizer without one pads with EOS); dtype= sets
    the weights' dtype; the tokenizer keeps spaces and newlines."""
    model, tok = load_model(saved, "bfloat16")
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert (tok.pad_token_id, tok.eos_token_id) == (0, 1)
    assert load_tokenizer(saved).decode(load_tokenizer(saved)("a b\nc")["input_ids"]) == "a b\nc"
