"""`targetpo rlvr` input checks: every value the run would trip on later is refused up front, in one line with
exit 2, before the run directory exists; flags and the `key=value` fields they set never silently override each
other."""

from __future__ import annotations

import pytest

from targetpo.cli import main

pytest.importorskip("transformers", reason="needs the llm extra")
pytest.importorskip("reasoning_gym", reason="needs the llm extra")


def _refused(argv, out, capsys, command=("rlvr",)) -> str:
    code = main([*command, "--preset", "smoke", "--out", str(out), "--no-progress", *argv])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 2 and len(err) == 1 and err[0].startswith("targetpo: error: "), (code, err)
    assert not out.exists()
    return err[0]


# A two-operand one-digit sum has ~100 distinct questions: 500 held-out ones outside the pool cannot exist.
ONE_DIGIT = ("task_options=operators=+,min_terms=2,max_terms=2,min_digits=1,max_digits=1,allow_negation=false,"
             "allow_parentheses=false")


@pytest.mark.parametrize("argv,expected", [
    (["adam_betas=0.9"], "adam_betas=(0.9,): must have exactly 2 items, each >= 0 and < 1"),
    (["adam_betas=0.9,0.99,0.999"], "must have exactly 2 items"),
    (["--task", "nosuchtask"], "task='nosuchtask': neither gsm8k nor a reasoning-gym dataset"),
    (["--task", "basic_arithmetc"], "did you mean 'basic_arithmetic'"),
    (["task=nosuchtask"], "task='nosuchtask'"),
    (["tiny_heads=3"], "tiny_heads=3: must divide tiny_hidden=32"),
    (["tiny_heads=32"], "heads of an even size"),  # head size 1: rotary embeddings need pairs
    (["tiny_kv_heads=3"], "tiny_kv_heads=3: must divide tiny_heads=2"),
    # reasoning-gym's own words were Python's: "__init__() got an unexpected keyword argument 'foo'", "'>' not
    # supported between instances of 'str' and 'int'", "got multiple values for keyword argument 'size'"
    (["task_options=foo=bar"], "task_options: 'foo' is not an option of reasoning-gym task 'basic_arithmetic'; "
                               "its options: min_terms, max_terms, min_digits, max_digits, operators,"),
    (["task_options=min_term=3"], "did you mean 'min_terms'?"),
    (["task_options=min_terms=abc"], "task_options: min_terms=abc for reasoning-gym task 'basic_arithmetic': "
                                     "min_terms takes an integer"),
    (["task_options=allow_negation=1"], "allow_negation takes true or false"),
    (["task_options=operators=7"], "operators takes characters"),
    # a list of words: one word was split into letters ("Invalid tasks: _, a, d, e, ..."), a Sequence[str] unchecked
    (["--task", "fraction_simplification", "task_options=styles=3"], "styles takes words joined by '|'"),
    (["--task", "time_intervals", "task_options=task_types=date||time"], "task_types takes words joined by '|'"),
    # a length reasoning-gym checks only while drawing: its bare "The number of weights does not match ..."
    (["--task", "arc_agi", "task_options=rotations=90|180"], "task_options=rotations=90|180 of reasoning-gym task "
                                                             "'arc_agi': The number of weights"),
    # lists of numbers and of enum values were handed over as one string ("unsupported operand type(s) for +: 'int'
    # and 'str'", "The number of weights does not match the population")
    (["--task", "complex_arithmetic", "task_options=operations_weights=0.4|x"],
     "operations_weights takes numbers joined by '|' (e.g. 0.4|0.4|0.1|0.1)"),
    (["--task", "aiw", "task_options=task_types=enemies"],
     "task_types takes one or more of siblings, friends, colleagues, joined by '|'"),
    (["task_options=format_style=fancy"], "format_style takes one of simple, natural"),
    (["--task", "chain_sum", "task_options=size=4"], "task_options: size= is set by targetpo (the pool sizes are "
                                                     "train_size and eval_size); leave it out"),
    (["task_options=seed=4"], "task_options: seed= is set by targetpo"),
    # the dataset's own checks, with the options as typed rather than a Python dict
    (["task_options=min_terms=-3"], "task_options=min_terms=-3 of reasoning-gym task 'basic_arithmetic': "
                                    "min_terms must be positive"),
    (["task=graph_color", "compact=true"], "compact=true: compact prompts exist for"),
    (["eval_size=500", ONE_DIGIT], "could only find"),
    (["--objective", ""], "--objective is empty: give a value"),
    (["--objective", "tpo,,grpo"], "--objective 'tpo,,grpo': item 2 is empty"),
    # --seq-logp chooses TPO's sequence log-score: with no TPO objective it was silently unused
    (["--objective", "grpo", "--seq-logp", "mean"], "--seq-logp mean: only TPO objectives"),
    (["--objective", ","], "--objective ',': item 1 is empty"),
    # an unknown item was reported as methods=(...) with the method names, which --objective does not take
    (["--objective", "tpo,bogus"], "--objective 'tpo,bogus': 'bogus' is not an objective; allowed: tpo, "
                                   "tpo_no_anchor, grpo"),
    # a method name passed through and silently ignored --seq-logp
    (["--objective", "tpo_sum", "--seq-logp", "mean"], "'tpo_sum' is not an objective; allowed: tpo, "
                                                       "tpo_no_anchor, grpo, dr_grpo, dapo, gspo, sapo, cispo; for "
                                                       "TPO give --objective tpo --seq-logp sum (or methods=tpo_sum)"),
    (["--task", "chain_sum", "task=basic_arithmetic"], "give either --task or task=..., not both"),
    (["--model", "tiny", "model=/nonexistent"], "give either --model or model=..., not both"),
    (["--data-path", "/x", "data_path=/y"], "give either --data-path or data_path=..., not both"),
    # a GSM8K path beside a generated task would be silently unread
    (["--data-path", "/x"], "data_path='/x': only task=gsm8k reads files; task=basic_arithmetic is generated"),
    (["--task", "gsm8k"], "task gsm8k needs data_path=DIR (--data-path DIR) with train.jsonl and test.jsonl; "
                          "none was given"),
    # an alpha without an adapter was silently unused; a batch larger than the pool failed after the warm start
    (["lora_alpha=16"], "lora_alpha=16.0: scales a LoRA adapter, but lora_r=0 (full fine-tuning)"),
    (["batch_prompts=300"], "batch_prompts=300: more than the training pool's train_size=200 problems"),
    # full fine-tuning of bf16 weights: AdamW's ~1e-5 steps round away on most weights (86% of them changed in
    # fp32 after one update, 13% in bf16)
    (["dtype=bfloat16"], "dtype=bfloat16 with lora_r=0: full fine-tuning would step bfloat16 weights directly"),
    # a key given twice: the last one won silently
    (["task_options=operators=+,min_digits=2,min_digits=1"], "task option 'min_digits' is given twice"),
    # values that could only overflow (a traceback from AdamW or multinomial after the run folder was written)
    (["lr=1e300"], "lr=1e+300: must be > 0 and <= 1"),
    (["temperature=1e-300"], "temperature=1e-300: must be >= 0.001"),
])
def test_bad_rlvr_input_is_refused_before_the_run_directory_exists(tmp_path, capsys, argv, expected):
    line = _refused(argv, tmp_path / "run", capsys)
    assert expected in line, line


def _gsm8k(tmp_path, n_train=3, n_test=2):
    d = tmp_path / "gsm8k"
    d.mkdir()
    for name, n in (("train.jsonl", n_train), ("test.jsonl", n_test)):
        (d / name).write_text("".join(f'{{"question": "{i}+1?", "answer": "#### {i + 1}"}}\n' for i in range(n)))
    return d


def test_gsm8k_sizes_are_checked_against_its_files(tmp_path, capsys):
    d = _gsm8k(tmp_path)
    line = _refused(["--task", "gsm8k", "--data-path", str(d)], tmp_path / "run", capsys)
    assert "train_size=200: more than the 3 problems of GSM8K's train.jsonl" in line
    line = _refused(["--task", "gsm8k", "--data-path", str(d), "train_size=3", "batch_prompts=3"], tmp_path / "run",
                    capsys)
    assert "eval_size=16: more than the 2 problems of GSM8K's test.jsonl" in line


def test_gsm8k_refuses_compact_and_chat_needs_a_chat_template(tmp_path, capsys):
    """compact=true was silently unused on GSM8K; template=chat with a tokenizer lacking a chat template failed
    inside the first unit, after run.json was written."""
    from targetpo.llm.models import save_tiny_model

    d = _gsm8k(tmp_path)
    line = _refused(["--task", "gsm8k", "--data-path", str(d), "train_size=3", "eval_size=2", "batch_prompts=3",
                     "compact=true"], tmp_path / "run", capsys)
    assert "compact=true: compact prompts exist for" in line and "not 'gsm8k'" in line
    model = save_tiny_model(tmp_path / "model", hidden_size=8, num_layers=1, num_heads=2, num_kv_heads=1,
                            intermediate_size=8)
    (model / "chat_template.jinja").unlink()
    capsys.readouterr()  # the save's progress bar
    line = _refused(["--model", str(model), "template=chat"], tmp_path / "run", capsys)
    assert f"template=chat: the tokenizer of model '{model}' has no chat template" in line


@pytest.mark.parametrize("command", ["rlvr", "run rlvr"])
def test_task_given_as_key_value_resets_the_presets_task_options_like_the_flag(tmp_path, capsys, command):
    """`task=gsm8k` used to keep the preset's arithmetic options and fail with "task gsm8k takes no options"; under
    `targetpo run rlvr` (and reproduce) it still did, and `task=graph_color` failed with "compact=true: compact prompts
    exist for ...": the reset lived in the `rlvr` subcommand's flags only."""
    from targetpo.experiments import load
    from targetpo.runs.config import make_config

    d = _gsm8k(tmp_path)
    line = _refused(["task=gsm8k", f"data_path={d}"], tmp_path / "run", capsys, command=command.split())
    assert "takes no options" not in line and "train_size=200: more than the 3 problems" in line

    exp = load("rlvr")
    for overrides in (["task=chain_sum"], ["task=graph_color"]):
        cfg = make_config(exp, "smoke", overrides=overrides)
        assert (cfg.task_options, cfg.compact) == ((), False)
    kept = make_config(exp, "smoke", overrides=["task=chain_sum", "task_options=min_terms=3", "compact=true"])
    assert (kept.task_options, kept.compact) == (("min_terms=3",), True)
    preset = exp.PRESETS["smoke"]
    named = make_config(exp, "smoke", overrides=[f"task={preset.task}"])  # the task it has: nothing to reset
    assert (named.task_options, named.compact) == (preset.task_options, preset.compact)
    same = make_config(exp, "smoke", overrides=["steps=3"])  # no task given: the preset's options stay
    assert (same.task_options, same.compact) == (preset.task_options, preset.compact) and preset.compact


def test_rlvr_help_reads_once_and_agrees_with_the_preset_and_readme(capsys):
    from pathlib import Path

    from targetpo.llm import experiment as rlvr

    with pytest.raises(SystemExit):
        main(["rlvr", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "finished methods (done or diverged) are skipped, a partial one continues from its last checkpoint" in text
    assert "(0 = never) (0 = never" not in text and text.count("0 = never") == 1
    assert f"cpu (tiny model on 2 CPU cores, {rlvr.CPU_TIME}; default)" in text and "~10 min" not in text
    readme = " ".join((Path(__file__).resolve().parents[2] / "README.md").read_text().split())
    assert rlvr.CPU_TIME in rlvr.RUNTIME and f"GRPO, {rlvr.CPU_TIME})" in readme
    cpu = rlvr.PRESETS["cpu"]
    assert (f"warm-started until its held-out accuracy reaches {cpu.warmstart_until} (at most "
            f"{cpu.warmstart_steps} supervised steps:") in readme


def test_the_paper_preset_reads_gsm8k_only_from_a_path_given_and_runs_generated_tasks_without_one():
    from targetpo.experiments import load
    from targetpo.runs.config import make_config

    exp = load("rlvr")
    assert exp.PRESETS["paper"].data_path == ""  # a user's clone has no default data folder
    cfg = make_config(exp, "paper", overrides=["task=graph_color", "lora_r=0", "kl_coef=0", "dtype=float32"])  # README's
    assert cfg.task == "graph_color" and cfg.data_path == ""


def test_the_readmes_paper_recipe_and_its_graph_coloring_variant_are_valid_configs():
    """README's `targetpo rlvr --preset paper …` command, and the same command with the graph-coloring / Knights &
    Knaves arguments in place of `--data-path` (as the README says), give valid configs; the two together are
    refused (a GSM8K path beside a generated task would be unread)."""
    import re
    import shlex
    from pathlib import Path

    from targetpo.cli import build_parser
    from targetpo.experiments import load
    from targetpo.llm.cli import rlvr_overrides
    from targetpo.runs.config import make_config

    readme = " ".join((Path(__file__).resolve().parents[2] / "README.md").read_text().split())
    command = re.search(r"`(targetpo rlvr --preset paper [^`]*--data-path[^`]*)`", readme).group(1)
    variant = re.search(r"give `(--task graph_color [^`]*)` \(`--task knights_knaves`\) instead of `--data-path`",
                        readme).group(1)
    argv = shlex.split(command)[1:]
    i = argv.index("--data-path")
    without_path = argv[:i] + argv[i + 2:]
    parser, exp = build_parser(), load("rlvr")

    def config(a):
        return make_config(exp, "paper", overrides=rlvr_overrides(parser.parse_args(a)))

    assert config(argv).task == "gsm8k"
    for task in ("graph_color", "knights_knaves"):
        cfg = config(without_path + shlex.split(variant.replace("graph_color", task)))
        assert cfg.task == task and cfg.data_path == "" and cfg.lora_r == 0 and cfg.kl_coef == 0
    with pytest.raises(ValueError, match="only task=gsm8k reads files"):
        config(argv + shlex.split(variant))


def test_gsm8k_files_are_read_by_line_not_by_unicode_line_breaks(tmp_path):
    # A raw U+2028 inside a JSON string is valid JSON; str.splitlines would cut the row there.
    import json

    from targetpo.integrations.verl_rewards import gsm8k_rows
    from targetpo.llm.data import read_gsm8k

    row = {"question": "Tom has 2 apples\u2028and 3 pears. How many fruits?", "answer": "2 + 3 = 5\n#### 5"}
    (tmp_path / "train.jsonl").write_text(json.dumps(row, ensure_ascii=False) + "\n", encoding="utf-8")
    assert read_gsm8k(tmp_path / "train.jsonl") == [row]
    assert gsm8k_rows(tmp_path, "train")[0]["reward_model"]["ground_truth"] == "5"


@pytest.mark.parametrize("kw", [{"objective": "grpo", "eta": 0.5}, {"objective": "dr_grpo", "seq_logp": "mean"}])
def test_trainer_config_refuses_a_setting_its_objective_does_not_read(kw):
    from targetpo.llm.trainer import TrainerConfig

    name = next(k for k in kw if k != "objective")
    with pytest.raises(ValueError, match=rf"{name}=.*objective '{kw['objective']}' does not read it"):
        TrainerConfig(**kw).validate()
    TrainerConfig(objective="tpo", **{name: kw[name]}).validate()  # TPO reads both


def test_rlvr_units_of_objectives_without_eta_keep_the_default():
    # rlvr shares one η across its methods; a GRPO unit's TrainerConfig leaves it at the default it never reads.
    from targetpo.llm import experiment as rlvr
    from targetpo.runs.config import make_config

    cfg = make_config(rlvr, "smoke", overrides=["methods=tpo_sum,grpo", "eta=0.5"])
    assert rlvr.trainer_config(cfg, "tpo_sum", 0).eta == 0.5 and rlvr.trainer_config(cfg, "grpo", 0).eta == 1.0


def test_a_resume_on_other_problems_is_refused(tmp_path, capsys):
    """run.json keeps a fingerprint of the problems: GSM8K files edited between a kill and the resume (or another
    reasoning-gym version) would otherwise mix two data sets in one curve."""
    import json

    d = tmp_path / "gsm8k"
    d.mkdir()
    for name, n, op in (("train.jsonl", 50, "+"), ("test.jsonl", 40, "*")):  # held-out questions not in the pool
        (d / name).write_text("".join(f'{{"question": "{i}{op}1?", "answer": "#### {i}"}}\n' for i in range(n)))
    out = tmp_path / "run"
    argv = ["rlvr", "--preset", "smoke", "--out", str(out), "--no-progress", "--no-report", "--task", "gsm8k",
            "--data-path", str(d), "methods=grpo", "steps=2", "train_size=50"]
    assert main(argv) == 0
    meta = json.loads((out / "run.json").read_text())
    assert len(meta["data_fingerprint"]) == 16
    lines = (out / "metrics.jsonl").read_text().splitlines()
    kept = "\n".join(line for line in lines if json.loads(line).get("event") != "done"
                     or json.loads(line)["unit"] == "warmstart") + "\n"
    (out / "metrics.jsonl").write_text(kept)  # as if killed before the last unit finished
    (out / "run.json").write_text(json.dumps({**meta, "status": "interrupted"}))
    (d / "train.jsonl").write_text((d / "train.jsonl").read_text().replace('"#### 1"', '"#### 7"', 1))
    capsys.readouterr()
    assert main(["rlvr", "--out", str(out), "--resume", "--no-progress", "--no-report"]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and "was computed on other data" in err[0] and meta["data_fingerprint"] in err[0], err
    assert (out / "metrics.jsonl").read_text() == kept


def test_a_word_list_option_is_one_item_per_word():
    """`task_types=date` was handed to reasoning-gym as the string 'date', which it read as the items d, a, t, e and
    silently generated questions of another type (datetime); characters (operators=+-) stay one item each."""
    from targetpo.llm.data import ReasoningGymTask

    task = ReasoningGymTask("time_intervals", task_types="date|time")
    assert task.options == {"task_types": ["date", "time"]}
    kinds = {p.entry["metadata"]["task_type"] for p in task.problems("train", 40, 0)}
    assert kinds == {"date", "time"}
    assert ReasoningGymTask("basic_arithmetic", operators="+-").options == {"operators": "+-"}


def test_number_and_enum_list_options_become_lists():
    """A list of weights (`operations_weights=0.4|0.4|0.1|0.1`) or of enum values (aiw's `task_types=friends`)
    reached reasoning-gym as one string, which it could not use; each is now a list of the field's items."""
    from reasoning_gym.logic.aiw import TaskType

    from targetpo.llm.data import ReasoningGymTask, show_options

    task = ReasoningGymTask("complex_arithmetic", operations_weights="0.4|0.4|0.1|0.1")
    assert task.options == {"operations_weights": [0.4, 0.4, 0.1, 0.1]}
    assert len(task.problems("train", 3, 0)) == 3
    task = ReasoningGymTask("aiw", task_types="friends|colleagues", task_type_weights="0.5|0.5")
    assert task.options["task_types"] == [TaskType.FRIENDS, TaskType.COLLEAGUES]
    assert show_options(task.options) == "task_types=friends|colleagues,task_type_weights=0.5|0.5"
    questions = " ".join(p.question for p in task.problems("train", 20, 0))
    assert "colleague" in questions and "sibling" not in questions and "brother" not in questions
    # one number is a list of one (parse_options reads `1` as an int)
    assert ReasoningGymTask("intermediate_integration", problem_type_weights=1,
                            problem_types="linear").options["problem_type_weights"] == [1.0]
