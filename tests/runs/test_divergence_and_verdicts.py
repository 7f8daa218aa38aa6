"""Every output tells the truth: a run that diverges says where (metrics, run.json, resume, report), and the
report gives verdicts only on presets that can test a claim."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from targetpo.experiments import run_experiment
from targetpo.report import Section, claim_count, resolve_failures, write_report
from targetpo.runs.runner import first_non_finite
from targetpo.runs.stats import Verdict, curves
from targetpo.runs.store import Run, read_metrics

# Muon at lr = 1e6 overflows the tiny transformer's logits within the first two episodes, deterministically.
HUGE_LR = ["lr=1e6"]


@pytest.fixture(scope="module")
def diverged_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("div") / "dense"
    run_experiment("token-dense", "smoke", out=out, overrides=HUGE_LR, progress=False, quiet=True)
    return out


def test_first_non_finite_names_the_value_and_honours_nan_means_empty():
    assert first_non_finite({"a": 1, "b": [1.0, float("nan")], "c": float("inf")}) == "b"
    assert first_non_finite({"p": {"w": torch.tensor([1.0, float("inf")])}}) == "p"
    assert first_non_finite({"n": np.float32("-inf")}) == "n"
    assert first_non_finite({"i": torch.tensor([1, 2]), "s": "nan", "ok": True, "x": np.ones(3)}) is None
    # A mean over an empty set may be NaN, but never inf.
    assert first_non_finite({"weight_winners": torch.tensor([float("nan")])}, ("weight_winners",)) is None
    assert first_non_finite({"weight_winners": torch.tensor([float("inf")])}, ("weight_winners",)) == "weight_winners"


def test_huge_lr_diverges_every_unit_and_records_the_step(diverged_run, capsys):
    recs = read_metrics(diverged_run / "metrics.jsonl")
    events = {r["unit"]: r for r in recs if "event" in r}
    assert events and all(e["event"] == "diverged" for e in events.values())  # never "done"
    assert set(events) == {f"v{v}/{m}" for v in (2, 4) for m in ("ppo", "dg", "tpo_token", "grpo_token")}
    # DG (one epoch) gets one finite update in, then its next rollout's log-probs are NaN; PPO's second epoch
    # already sees overflowed logits.
    assert events["v2/dg"]["step"] == 1 and events["v2/dg"]["metric"] == "rollout log-probs"
    assert events["v2/ppo"]["step"] == 0 and events["v2/ppo"]["metric"] == "log-probs"
    for r in recs:  # no metrics record at or after the divergence step, and none non-finite
        if "event" not in r:
            assert r["step"] < events[r["unit"]]["step"]
            assert first_non_finite({k: v for k, v in r.items() if k != "unit"}, ("weight_winners", "weight_losers")) is None
    meta = json.loads((diverged_run / "run.json").read_text())
    assert meta["status"] == "complete (8 units diverged)" and len(meta["diverged"]) == 8
    run = Run.load(diverged_run)
    assert run.done_units() == set() and run.diverged_units()["v2/dg"] == (1, "rollout log-probs")
    assert run.units() == ["v2/dg", "v4/dg"]  # event lines are not metrics rows
    assert set(curves(run, "error")) == {"v2/dg", "v4/dg"}


def test_diverged_units_count_as_finished_on_resume_unless_force(diverged_run, capsys):
    before = (diverged_run / "metrics.jsonl").read_bytes()
    run_experiment("token-dense", "smoke", out=diverged_run, resume=True, progress=False, quiet=True)
    meta = json.loads((diverged_run / "run.json").read_text())
    assert meta["runs"][-1]["units"] == [] and meta["status"] == "complete (8 units diverged)"
    assert (diverged_run / "metrics.jsonl").read_bytes() == before
    # --force replays them: deterministic, so they diverge at the same steps and nothing new is written.
    run_experiment("token-dense", "smoke", out=diverged_run, resume=True, force=True, progress=False, quiet=True)
    meta = json.loads((diverged_run / "run.json").read_text())
    assert len(meta["runs"][-1]["units"]) == 8 and "resume_mismatches" not in meta
    assert (diverged_run / "metrics.jsonl").read_bytes() == before
    assert "warning: token-dense unit v2/dg diverged at step 1" in capsys.readouterr().err


def test_report_lists_diverged_units_and_does_not_crash(diverged_run, tmp_path):
    text = write_report(diverged_run, tmp_path / "REPORT.md").read_text()
    assert "status complete (8 units diverged)" in text
    assert "**Diverged (8 units):** `v2/ppo` at step 0 (log-probs), `v2/dg` at step 1 (rollout log-probs)" in text
    assert "8 units diverged (listed in their sections)" in text


def test_tabular_run_that_diverges_before_its_first_record(tmp_path):
    out = run_experiment("tabular-multi", "smoke", out=tmp_path / "m", overrides=["lr=1e300", "methods=tpo,pg"],
                         progress=False, quiet=True)
    assert Run.load(out).diverged_units() == {"tpo": (0, "error"), "pg": (0, "error")}
    text = write_report(out).read_text()
    assert "every unit diverged before its first record" in text and "`tpo` at step 0 (error)" in text


def test_tabular_multi_run_with_a_unit_that_diverges_later_is_reported(tmp_path):
    """lr=1e20: GRPO diverges at step 1 and the others run on; the report indexed every curve at step 49 and
    failed (IndexError), so no REPORT.md was written."""
    out = run_experiment("tabular-multi", "smoke", out=tmp_path / "m", overrides=["lr=1e20"], progress=False,
                         quiet=True)
    assert "grpo" in Run.load(out).diverged_units()
    text = write_report(out).read_text()
    assert "curves end at different steps (a diverged unit stops at its divergence)" in text


def _section(preset: str, verdicts: list[bool | None]) -> Section:
    run = Run(path=Path("/nonexistent"), meta={"preset": preset})
    s = Section("t", run, run.path)
    for i, v in enumerate(verdicts):
        s.claim(f"claim {i}", v, "evidence")
    return s


def test_verdicts_only_on_presets_that_can_test_the_claims():
    smoke, cpu = _section("smoke", [True, False, None]), _section("cpu", [True, True, False])
    paper = _section("paper", [True, None])
    assert smoke.verdicts() == [None, None, None] and cpu.verdicts() == [Verdict.PASS, Verdict.PASS, Verdict.FAIL]
    assert "| claim 0 | n/a (smoke preset) |" in smoke.render() and "**PASS**" not in smoke.render()
    # A plain bool is a verdict on point estimates, and says so.
    assert "| claim 2 | **FAIL** (point estimate) |" in cpu.render()
    assert "| claim 1 | n/a |" in paper.render()
    resolve_failures([smoke, cpu, paper])
    assert "| claim 2 | **FAIL** (does not reproduce; point estimate) |" in cpu.render()
    assert claim_count([smoke, cpu, paper]) == (
        "**3 PASS, 1 FAIL (1 does not reproduce), 0 inconclusive** over the cpu and paper presets; 4 of these "
        "decided on point estimates (no seed interval); 1 n/a (not decidable from the data); 3 claims n/a on smoke runs")
    assert claim_count([cpu]).startswith("**2 PASS, 1 FAIL (1 does not reproduce), 0 inconclusive** over the cpu preset")
    assert claim_count([smoke]).startswith("no verdicts")


def test_a_longer_run_at_other_settings_never_explains_a_fail(tmp_path):
    """An lr=0.03 run beside a longer run at the preset's lr: its 4 FAILs were classed "scale or data" ("the same
    claim is PASS in the larger run"), though the gap came from the lr, not the length."""
    d = tmp_path / "report"
    run_experiment("tabular-single", "cpu", out=d / "lr", overrides=["lr=0.03", "seeds=20"], progress=False,
                   quiet=True)
    run_experiment("tabular-single", "cpu", out=d / "long", overrides=["steps=200", "seeds=20"], progress=False,
                   quiet=True)
    text = write_report(d).read_text()
    section = text.split("Run `lr`")[1].split("Run `long`")[0] if text.index("Run `lr`") < text.index("Run `long`") \
        else text.split("Run `lr`")[1]
    fails = [ln for ln in section.splitlines() if "| **FAIL**" in ln]
    assert fails and all("(settings differ from the preset)" in ln for ln in fails), fails


def test_a_run_with_overrides_says_so_and_its_fails_are_not_called_irreproducible(tmp_path):
    """`seeds=20 lr=0.05` (the README's override example) gave "2 FAIL (2 does not reproduce)" with lr=0.05 shown
    nowhere, next to the reference's lr-0.1 numbers."""
    out = run_experiment("tabular-single", "cpu", out=tmp_path / "o", overrides=["lr=0.05", "seeds=5"],
                         progress=False, quiet=True)
    text = write_report(out).read_text()
    assert "**Overrides:** lr=0.05 (cpu preset: 0.1);" in text and "seeds=5" not in text.split("**Overrides:**")[1][:80]
    fails = [ln for ln in text.splitlines() if "| **FAIL**" in ln]
    assert fails and all("(settings differ from the preset)" in ln for ln in fails), fails
    assert "does not reproduce" not in text
    # A seed count, a subset of the methods and a longer run keep the preset's protocol for what runs.
    plain = run_experiment("tabular-single", "cpu", out=tmp_path / "p", overrides=["seeds=5", "methods=tpo,pg",
                                                                                   "steps=160"], progress=False, quiet=True)
    assert "**Overrides:**" not in write_report(plain).read_text()
    short = run_experiment("tabular-single", "cpu", out=tmp_path / "s", overrides=["seeds=5", "steps=20"],
                           progress=False, quiet=True)
    assert "**Overrides:** steps=20 (cpu preset: 150);" in write_report(short).read_text()


def test_where_the_data_is_read_from_is_no_override():
    """Every MNIST run of `make reproduce` (--data-dir ../shared/data/mnist) was listed as overriding its preset."""
    from targetpo.experiments import load
    from targetpo.report import preset_overrides
    from targetpo.runs.config import make_config

    exp = load("mnist")
    cfg = make_config(exp, "cpu", overrides=["data_dir=/somewhere/mnist", "lr=0.5"])
    assert list(preset_overrides(exp, "cpu", cfg)) == ["lr"]


MNIST_EXPERIMENTS = ["mnist", "mnist-mechanism", "mnist-staleness", "mnist-replay", "mnist-friction",
                     "mnist-projections"]


@pytest.mark.parametrize("name", MNIST_EXPERIMENTS)
def test_mnist_training_that_blows_up_between_evaluations_is_diverged_not_failed(name, mnist_dir, tmp_path):
    """lr = 1e20: the weights overflow after the first Adam step, long before the first evaluation. The losses'
    input checks raised ("probs contains 2000 NaN/inf value(s)"), so the run was "failed" with a message naming
    neither the method nor divergence, and --resume replayed it into the same failure; the one-line summary and
    mnist-mechanism's report then indexed records that did not exist."""
    from targetpo.experiments import load

    out = run_experiment(name, "smoke", out=tmp_path / "r", overrides=["lr=1e20", f"data_dir={mnist_dir}"],
                         progress=False, quiet=True)
    run = Run.load(out)
    assert run.meta["status"].startswith("complete (") and "diverged)" in run.meta["status"]
    assert {m for _, m in run.diverged_units().values()} <= {"logits", "behaviour log-probs"}
    assert "no evaluation was recorded" in load(name).summary(run)
    assert "every unit diverged before its first record" in write_report(out).read_text()


def test_tabular_single_report_with_a_unit_that_diverged_midway(tmp_path):
    """A unit stopped by a NaN at step 100 of 150: the claims indexed every curve with TPO's steps and the section
    failed (IndexError), so the run was left out of its report."""
    out = run_experiment("tabular-single", "cpu", out=tmp_path / "s", overrides=["seeds=5"], progress=False,
                         quiet=True)
    path = out / "metrics.jsonl"
    kept = [ln for ln in path.read_text().splitlines()
            if not (json.loads(ln).get("unit") == "grpo" and (json.loads(ln).get("step", 0) >= 100
                                                                or json.loads(ln).get("event") == "done"))]
    kept.append(json.dumps({"unit": "grpo", "event": "diverged", "step": 100, "metric": "error"}))
    path.write_text("\n".join(kept) + "\n")
    text = write_report(out).read_text()
    assert "could not be reported" not in text and "curves end at different steps" in text
    assert "`grpo` at step 100 (error)" in text
