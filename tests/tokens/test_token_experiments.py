"""Smoke runs of the token experiments through the shared runner: units, resume, reports, config checks."""

import json

import pytest

from targetpo.experiments import load
from targetpo.experiments import run_experiment
from targetpo.runs.config import make_config
from targetpo.report import write_report
from targetpo.runs.store import Run, read_metrics


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_token_dense_smoke_run_and_report(tmp_path):
    out = run_experiment("token-dense", "smoke", out=tmp_path / "td", progress=False, quiet=True, threads=1)
    run = Run.load(out)
    assert run.units() == [f"v{v}/{m}" for v in (2, 4) for m in ("ppo", "dg", "tpo_token", "grpo_token")]
    assert run.done_units() == set(run.units())
    steps, err = run.series("v2/tpo_token", "error")
    assert list(steps) == [0, 1, 2, 3] and err.shape == (4, 2)
    assert ((err > 0.2) & (err < 0.9)).all()     # near the uniform 1 − 1/V at the start
    _, zero_var = run.series("v2/tpo_token", "frac_zero_var")
    assert zero_var.shape == (4, 2)
    text = write_report(out).read_text()
    assert "Table 1" in text and "(58)" in text and "token_dense.png" in text
    assert (out / "token_dense.png").exists()
    assert "episodes to 1% error" in load("token-dense").summary(run)


def test_token_terminal_smoke_run_resume_and_report(tmp_path):
    out = tmp_path / "tt"
    run_experiment("token-terminal", "smoke", out=out, progress=False, quiet=True, threads=1)
    run = Run.load(out)
    assert run.units() == ["h3/ppo/prompts", "h3/ppo/interactions", "h3/dg/prompts", "h3/dg/interactions",
                           "h3/tpo", "h3/grpo", "h3/grpo_no_kl"]
    # interaction-matched single-sample runs see B·K prompts: their diagnostics exist like the others'
    _, fs = run.series("h3/ppo/interactions", "frac_success")
    assert fs.shape == (3, 2)
    # Drop the last unit's tail, resume: replayed lines match the stored ones exactly (deterministic units).
    lines = (out / "metrics.jsonl").read_text().splitlines()
    (out / "metrics.jsonl").write_text("\n".join(lines[:-3]) + "\n")
    run_experiment("token-terminal", "smoke", out=out, resume=True, progress=False, quiet=True, threads=1)
    meta = json.loads((out / "run.json").read_text())
    assert meta["status"] == "complete" and "resume_mismatches" not in meta
    assert (out / "metrics.jsonl").read_text().splitlines()[:-3] == lines[:-3]
    assert len(read_metrics(out / "metrics.jsonl")) == len(lines)
    text = write_report(out).read_text()
    assert "Table 3" in text and "P H=3" in text and "I H=3" in text
    # The authors' curves are at H = 10 only: no caption promises circles the figure does not draw.
    assert "circles" not in text.split("token_terminal.png")[1].split("\n\n")[1]


def test_token_configs_reject_bad_values():
    exp = load("token-dense")
    with pytest.raises(ValueError, match="item 'tpo' must be one of"):
        make_config(exp, "smoke", overrides=["methods=tpo"])
    with pytest.raises(ValueError, match="vocabs"):
        make_config(exp, "smoke", overrides=["vocabs=1"])
    with pytest.raises(ValueError, match="item 'sft' must be one of"):
        make_config(exp, "smoke", overrides=["methods=ppo,sft"])
    term = load("token-terminal")
    with pytest.raises(ValueError, match="matches"):
        make_config(term, "smoke", overrides=["matches=both"])
    with pytest.raises(ValueError, match="terminal"):
        make_config(term, "smoke", overrides=["reward=dense"])
    cfg = make_config(term, "paper")
    assert (cfg.seeds, cfg.episodes, cfg.lengths, cfg.lr, cfg.heads) == (20, 2000, (7, 8, 9, 10), 1e-3, 2)

