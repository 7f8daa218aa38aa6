"""The rlvr report's claims on synthetic metrics: "learns faster" is the paired held-out accuracy area, training
reward is a separate claim, and a FAIL is classed from the data (a warm start at the ceiling is scale, headroom is
does-not-reproduce)."""

import dataclasses

import numpy as np
import pytest

from targetpo.llm import experiment as rlvr
from targetpo.report import Section, resolve_failures
from targetpo.runs.stats import NOT_REPRODUCED, SCALE, Verdict
from targetpo.runs.store import Run

STEPS, EVERY, SEEDS = 40, 10, 3


def _run(tmp_path, start: float, acc_lift: float, reward_lift: float) -> Run:
    """grpo and tpo_sum from a warm start at `start` held-out accuracy; tpo_sum's held-out accuracy is GRPO's +
    `acc_lift` (± a per-seed wobble) and its training reward GRPO's + `reward_lift`."""
    cfg = rlvr.PRESETS["cpu"]
    config = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)} | {
        "methods": ["tpo_sum", "grpo"], "steps": STEPS, "seeds": SEEDS}
    wobble = np.array([-0.01, 0.0, 0.01])
    records = [{"unit": "warmstart", "step": 0, "heldout_accuracy": 0.0},
               {"unit": "warmstart", "step": cfg.warmstart_steps, "heldout_accuracy": start}]
    for s in range(SEEDS):
        for m, da, dr in (("grpo", 0.0, 0.0), ("tpo_sum", acc_lift + wobble[s], reward_lift + wobble[s] / 2)):
            for t in range(STEPS):
                r = {"unit": f"{m}@seed{s}", "step": t, "reward": min(1.0, start + t / 200 + dr),
                     "frac_zero_var": 0.1}
                if t % EVERY == 0:
                    r["heldout_accuracy"] = start if t == 0 else min(1.0, start + t / 100 + da)
                records.append(r)
            records.append({"unit": f"{m}@seed{s}", "step": STEPS,
                            "heldout_accuracy": min(1.0, start + STEPS / 100 + da)})
    return Run(tmp_path, {"preset": "cpu", "experiment": "rlvr", "config": config}, records)


def _claims(tmp_path, **kw) -> tuple[dict, str]:
    run = _run(tmp_path, **kw)
    section = Section("rlvr", run, tmp_path)
    rlvr.report(run, section)
    resolve_failures([section])
    return {c.text.split(":")[0]: c for c in section.claims}, "\n".join(section.blocks)


def test_learns_faster_is_the_held_out_area_and_disagreeing_reward_is_said(tmp_path):
    claims, text = _claims(tmp_path, start=0.3, acc_lift=0.05, reward_lift=-0.04)
    faster = claims["TPO (sum) learns faster than GRPO (§3.8)"]
    reward = claims["TPO (sum) collects more training reward than GRPO (§3.8)"]
    assert faster.verdict is Verdict.PASS and "paired difference 0.050 [" in faster.evidence
    assert reward.verdict is Verdict.FAIL and reward.failure.kind == NOT_REPRODUCED
    assert "RL starts at 0.300 held-out accuracy" in reward.failure.evidence
    assert "differ in opposite directions" in text


@pytest.mark.parametrize("start, kind", [(0.3, NOT_REPRODUCED), (0.9, SCALE)])
def test_a_slower_tpo_is_scale_only_when_the_warm_start_sits_at_the_ceiling(tmp_path, start, kind):
    claims, text = _claims(tmp_path, start=start, acc_lift=-0.05, reward_lift=-0.04)
    faster = claims["TPO (sum) learns faster than GRPO (§3.8)"]
    assert faster.verdict is Verdict.FAIL and faster.failure.kind == kind
    assert (f"reaches {start:.3f} held-out accuracy" in faster.failure.evidence) == (kind == SCALE)
    assert "differ in opposite directions" not in text  # both worse: no disagreement to explain


def test_area_compares_only_the_evaluations_both_methods_recorded(tmp_path):
    run = _run(tmp_path, start=0.3, acc_lift=0.05, reward_lift=0.0)
    # a partial run: GRPO's last evaluation (step 40) is missing, TPO's is there
    run.records = [r for r in run.records if not (r["unit"].startswith("grpo") and r["step"] == STEPS)]
    section = Section("rlvr", run, tmp_path)
    rlvr.report(run, section)
    faster = next(c for c in section.claims if c.text.startswith("TPO (sum) learns faster"))
    assert "paired difference 0.050 [" in faster.evidence  # steps 10–30 of both, not TPO's step 40 too
