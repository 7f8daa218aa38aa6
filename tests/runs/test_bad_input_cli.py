"""Bad input at the command line: exit code 2, one readable line, and nothing written to disk."""

from __future__ import annotations

import pytest

from targetpo.cli import main


def _run(argv, capsys) -> tuple[int, list[str]]:
    code = main(argv)
    return code, [line for line in capsys.readouterr().err.splitlines() if line.strip()]


def test_resume_with_another_preset_or_overrides_is_refused_naming_the_fields(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["run", "tabular-multi", "--preset", "smoke", "--out", str(out), "--no-progress", "--no-report"]) == 0
    capsys.readouterr()
    before = (out / "metrics.jsonl").read_bytes()
    code, err = _run(["run", "tabular-multi", "--out", str(out), "--resume", "--preset", "paper", "--no-progress"],
                     capsys)
    assert code == 2 and len(err) == 1
    assert "smoke run" in err[0] and "preset 'paper' differs" in err[0] and "steps: stored 50, asked 1000" in err[0]
    code, err = _run(["run", "tabular-multi", "--out", str(out), "--resume", "steps=70", "--no-progress"], capsys)
    assert code == 2 and "steps: stored 50, asked 70" in err[0]
    assert (out / "metrics.jsonl").read_bytes() == before
    # no preset given: the stored one is continued
    assert main(["run", "tabular-multi", "--out", str(out), "--resume", "--no-progress", "--no-report"]) == 0


def test_unwritable_output_path_is_named(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    code, err = _run(["run", "tabular-single", "--preset", "smoke", "--out", str(blocker / "run"), "--no-progress"],
                     capsys)
    assert code == 2 and len(err) == 1
    assert f"cannot write the run directory {blocker / 'run'}" in err[0] and "is a file, not a directory" in err[0]


@pytest.mark.parametrize("argv,expected", [
    (["lr=-1"], "lr=-1.0: must be > 0"),
    (["lr=nan"], "lr=nan"),
    (["eta=0"], "eta=0.0: must be >= 1e-30"),
    # an η so small that u/η leaves float32 passed "> 0" and failed inside the objective, after the folder existed
    (["eta=1e-300"], "eta=1e-300: must be >= 1e-30 and finite"),
    (["seeds=0"], "seeds=0: must be >= 1"),
    (["steps=ten"], "steps='ten': expected an integer"),
    (["lrr=0.1"], "did you mean 'lr'"),
    (["methods=tpo,foo"], "'foo' must be one of"),
    # an empty item was dropped, so "tpo,,grpo" ran two methods without a word
    (["methods=tpo,,grpo"], "methods='tpo,,grpo': item 2 is empty"),
    # beyond int64 a count passed every bound and failed inside torch after the run folder was written
    (["actions=99999999999999999999"], "actions=99999999999999999999: must fit in 64 bits"),
    (["seed=9223372036854775807"], "seed=9223372036854775807 with seeds="),
    # past ~1e150 PG's squared step overflowed and it froze, reported complete; 1e308 failed after the folder
    (["baseline=1e308"], "baseline=1e+308: must be >= -1e+06 and <= 1e+06"),
])
def test_bad_config_values_exit_2_and_leave_no_run_folder(tmp_path, capsys, argv, expected):
    out = tmp_path / "run"
    code, err = _run(["run", "tabular-single", "--preset", "smoke", "--out", str(out), "--no-progress", *argv], capsys)
    assert code == 2 and len(err) == 1 and expected in err[0], err
    assert not out.exists()


def test_rlvr_model_path_must_exist_and_is_never_downloaded(tmp_path, capsys):
    pytest.importorskip("transformers", reason="needs the llm extra")
    out = tmp_path / "run"
    code, err = _run(["rlvr", "--preset", "smoke", "--model", str(tmp_path / "nope"), "--out", str(out),
                      "--no-progress"], capsys)
    assert code == 2 and len(err) == 1
    assert "no such directory" in err[0] and "never downloads models implicitly" in err[0]
    assert f"hf download ORG/NAME --local-dir {tmp_path / 'nope'}" in err[0]  # a path is where to download to
    code, err = _run(["rlvr", "--preset", "smoke", "--model", "Qwen/Qwen3-1.7B", "--out", str(out), "--no-progress"],
                     capsys)
    assert code == 2 and "hf download Qwen/Qwen3-1.7B --local-dir DIR" in err[0]  # a hub id is what to download
    (tmp_path / "notamodel").mkdir()
    code, err = _run(["rlvr", "--preset", "smoke", "--model", str(tmp_path / "notamodel"), "--out", str(out),
                      "--no-progress"], capsys)
    assert code == 2 and "no config.json" in err[0]
    code, err = _run(["rlvr", "--preset", "smoke", "model=", "--out", str(out), "--no-progress"], capsys)
    assert code == 2 and len(err) == 1 and "model is empty" in err[0] and "--local-dir DIR" in err[0], err
    assert not out.exists()
    code, err = _run(["rlvr", "--preset", "smoke", "--task", "gsm8k", "--data-path", str(tmp_path), "--out", str(out),
                      "--no-progress"], capsys)
    assert code == 2 and "lacks train.jsonl, test.jsonl" in err[0]
    assert not out.exists()


def test_malformed_data_files_are_named_before_a_run_folder_exists(tmp_path, capsys):
    mnist = tmp_path / "mnist"
    mnist.mkdir()
    for name in ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"):
        (mnist / name).write_bytes(b"garbage!" * 4)
    out = tmp_path / "run"
    code, err = _run(["run", "mnist", "--preset", "smoke", "--data-dir", str(mnist), "--out", str(out),
                      "--no-progress"], capsys)
    assert code == 2 and len(err) == 1 and "t10k-images-idx3-ubyte: magic number" in err[0]
    assert not out.exists()
    pytest.importorskip("transformers", reason="needs the llm extra")
    gsm = tmp_path / "gsm8k"
    gsm.mkdir()
    (gsm / "test.jsonl").write_text('{"question": "1+1?", "answer": "#### 2"}\n')
    (gsm / "train.jsonl").write_text('{"question": "1+1?", "answer": "#### 2"}\n{"question": oops}\n')
    code, err = _run(["rlvr", "--preset", "smoke", "--task", "gsm8k", "--data-path", str(gsm), "--out", str(out),
                      "--no-progress"], capsys)
    assert code == 2 and len(err) == 1 and f"{gsm / 'train.jsonl'}:2: not valid JSON" in err[0]
    (gsm / "train.jsonl").write_text('{"question": "1+1?"}\n')
    code, err = _run(["rlvr", "--preset", "smoke", "--task", "gsm8k", "--data-path", str(gsm), "--out", str(out),
                      "--no-progress"], capsys)
    assert code == 2 and "train.jsonl:1: lacks 'answer' (a GSM8K row is an object with string 'question'" in err[0]
    assert not out.exists()


def test_force_with_missing_data_keeps_the_existing_run(tmp_path, capsys, mnist_dir):
    out = tmp_path / "run"
    assert main(["run", "mnist", "--preset", "smoke", "--data-dir", str(mnist_dir), "--out", str(out),
                 "--no-progress", "--no-report"]) == 0
    before = (out / "metrics.jsonl").read_bytes()
    code, err = _run(["run", "mnist", "--preset", "smoke", "--data-dir", str(tmp_path / "nope"), "--out", str(out),
                      "--force", "--no-progress"], capsys)
    assert code == 2 and "does not exist" in err[-1]
    assert (out / "metrics.jsonl").read_bytes() == before


@pytest.mark.parametrize("argv,expected", [
    (["run", "nope"], "targetpo run: error: argument name: invalid choice: 'nope'"),
    (["run", "tabular-single", "--bogus"], "targetpo run: error: unrecognized arguments: --bogus"),
    (["reproduce", "--suite", "nope"], "targetpo reproduce: error: argument --suite: invalid choice: 'nope'"),
    (["data", "gsm8k"], "targetpo data: error: the following arguments are required: dir"),
    (["list", "extra"], "targetpo list: error: unrecognized arguments: extra"),
    ([], "targetpo: error: the following arguments are required: command"),
])
def test_argument_errors_are_one_line_naming_the_subcommand_help(argv, expected, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    command = " ".join(["targetpo"] + argv[:1])
    assert exit_.value.code == 2 and len(err) == 1, err
    assert err[0].startswith(expected) and err[0].endswith(f"(usage: {command} --help)")


@pytest.mark.parametrize("words", [
    ["steps", "--preset", "smoke"], ["--preset", "smoke", "steps"], ["--preset", "smoke", "steps=3", "steps"],
    ["--preset", "smoke", "=4"], ["=4", "--preset", "smoke"],
])
def test_an_override_without_a_key_reads_the_same_wherever_it_stands(tmp_path, capsys, words):
    """After a flag, `steps` read "unrecognized arguments: steps=3 steps" and `=4` "unknown config field ''"."""
    bad = next(w for w in reversed(words) if not w.startswith("-") and w != "smoke" and w != "steps=3")
    code, err = _run(["run", "tabular-single", *words, "--out", str(tmp_path / "run")], capsys)
    assert code == 2 and len(err) == 1 and f"override {bad!r} must look like key=value" in err[0], err
    assert not any(tmp_path.iterdir())


def test_an_unknown_flag_beside_overrides_is_named_alone(capsys):
    with pytest.raises(SystemExit):
        main(["run", "tabular-single", "steps=3", "--preset", "smoke", "steps=4", "--bogus"])
    assert "unrecognized arguments: --bogus (usage" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # with its value, which would otherwise come back as "override '3' must ..."
        main(["run", "tabular-single", "--preset", "smoke", "--bogus", "3", "steps=4"])
    assert "unrecognized arguments: --bogus 3 (usage" in capsys.readouterr().err


@pytest.mark.parametrize("argv,expected", [
    # each empty value used to mean its default: the cpu preset, DIR/REPORT.md, the current directory
    (["run", "tabular-single", "--preset", "", "--out", "{tmp}/run"], "--preset is empty: give a value"),
    (["report", "{tmp}", "-o", ""], "--output is empty: give a value"),
    (["data", "gsm8k", ""], "DIR is empty: give a value"),
    (["data", "gsm8k", "{tmp}/d", "--base-url", ""], "--base-url is empty: give a value"),
])
def test_an_empty_value_is_refused_naming_it(tmp_path, capsys, argv, expected):
    code, err = _run([a.format(tmp=tmp_path) for a in argv], capsys)
    assert code == 2 and len(err) == 1 and expected in err[0], err
    assert not any(tmp_path.iterdir())


def test_report_output_must_be_a_file_in_an_existing_folder(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["run", "tabular-single", "--preset", "smoke", "--out", str(run), "--no-progress", "--no-report"]) == 0
    capsys.readouterr()
    code, err = _run(["report", str(run), "-o", str(tmp_path)], capsys)
    assert code == 2 and len(err) == 1 and f"-o {tmp_path}: is a directory" in err[0], err
    code, err = _run(["report", str(run), "-o", str(tmp_path / "nodir" / "R.md")], capsys)
    assert code == 2 and len(err) == 1 and f"the folder {tmp_path / 'nodir'} does not exist" in err[0], err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # no stray REPORT.md.tmp or folder


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_reproduce_over_runs_of_another_preset_is_refused_before_any_run(tmp_path, capsys, jobs):
    """With --jobs 2 every worker used to fail with a traceback about `run --resume`, and REPORT.md was rewritten."""
    only = ["--only", "tabular-single", "tabular-multi", "--out", str(tmp_path), "--no-progress", "--jobs", jobs]
    assert main(["reproduce", "--preset", "smoke", *only]) == 0
    capsys.readouterr()
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    code, err = _run(["reproduce", "--preset", "cpu", *only], capsys)
    assert code == 2 and len(err) == 1, err
    assert "tabular-single holds a smoke run that this reproduce (preset cpu) would not continue" in err[0]
    assert "seeds: stored 2, asked 100" in err[0] and "pass --fresh" in err[0]
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before


def test_report_o_never_replaces_a_file_of_the_users(tmp_path, capsys):
    """`report RUN -o F` replaced any existing file F; with F a file, `-o F/x.md` said "the folder F does not exist"."""
    run = tmp_path / "run"
    assert main(["run", "tabular-single", "--preset", "smoke", "--out", str(run), "--no-progress", "--no-report"]) == 0
    capsys.readouterr()
    mine = tmp_path / "notes.md"
    mine.write_text("my notes")
    for target, message in [(mine, "holds a file that is not a targetpo report"),
                            (mine / "x.md", f"{mine} is a file, not a folder")]:
        code, err = _run(["report", str(run), "-o", str(target)], capsys)
        assert code == 2 and len(err) == 1 and message in err[0], err
    assert mine.read_text() == "my notes"
    again = tmp_path / "R.md"  # a report of ours is replaced
    assert main(["report", str(run), "-o", str(again)]) == 0 and main(["report", str(run), "-o", str(again)]) == 0


def test_a_closed_stdout_ends_the_cli_quietly():
    """`targetpo list | head -1` printed "targetpo: error: [Errno 32] Broken pipe" and exited 2."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    read, write = os.pipe()
    os.close(read)  # the reader is gone before anything is written: the first write fails with EPIPE
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2] / "src"))
    proc = subprocess.run([sys.executable, "-m", "targetpo", "list"], stdout=write, stderr=subprocess.PIPE,
                          env=env, timeout=120)
    os.close(write)
    assert proc.returncode == 141 and proc.stderr == b"", proc.stderr.decode()
