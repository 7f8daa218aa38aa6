"""Low-variance groups: near-constant noisy scores (an open question of the paper's §6; docs/method.md §8,
docs/experiments.md §E15).

TPO's u and GRPO's advantage divide by the group's score std whenever it exceeds 1e-6, so they do not depend on
the scores' scale: a group whose answers are all wrong (or all right) but whose scores carry a little noise gets
z-scores of unit size from pure noise, and with them a target q as peaked, and advantages as large, as a group
with a real winner. Task: reverse copy over V = 2 with terminal (exact-match) reward, sequence-level groups of K
answers (as token-terminal, docs/experiments.md §E6), every score plus N(0, σ_noise²) noise (σ_noise ≪ 1, so
the noise never reorders a right and a wrong answer, but it is all the signal a noise-only group has). Settings
per method (TPO, GRPO): *clean* (no noise: the paper's setting), *noise*, *noise + floor* (std_floor = σ_min:
u = (s − s̄)/max(σ, σ_min)) and *noise + shrink* (std_shrink = c: σ → √(σ² + c²)). With σ_noise ≪ σ_min, c ≪
the std of a group with a real winner (0.33 for one right answer in K = 8), both options leave informative
groups almost unchanged and turn a noise-only group's u into noise of size σ_noise/σ_min. The error is the
fraction of the episode's sampled answers with a mistake, before the update. Not a paper experiment.
"""

from __future__ import annotations

import numpy as np

from targetpo.runs.config import config, default, param, swept, unread_by
from targetpo.runs.stats import count
from targetpo.tokens import common as tc
from targetpo.tokens import open_questions as oq
from targetpo.tokens.config import group_only
from targetpo.tokens import report as tr
from targetpo.tokens.engine import SCORE_SCALE_MAX, trial_config

NAME = "token-low-variance"
TITLE = "Open question: low-variance groups (noisy near-constant scores), terminal-reward token reversal"
PAPER_REF = "§6 (open question); docs/experiments.md §E15"
SUITE = oq.SUITE
SETTINGS = ("clean", "noise", "noise+floor", "noise+shrink")
REFERENCE = "noise"
LABELS = {"clean": "clean (no noise)", "noise": "noise", "noise+floor": "noise + std floor",
          "noise+shrink": "noise + std shrinkage"}
GROUPED = ("tpo", "grpo", "grpo_no_kl")  # the sequence-level methods with a z-scored signal


@config
@group_only
class Config(oq.OpenQuestionConfig):
    settings: tuple[str, ...] = param(SETTINGS, "score settings to compare (see the module docstring)",
                                      choices=SETTINGS, unique=True)
    noise: float = param(0.01, "σ_noise of the noisy settings' N(0, σ_noise²) score noise", gt=0, le=SCORE_SCALE_MAX)
    floor: float = param(0.1, "σ_min of the noise + floor setting", gt=0, le=SCORE_SCALE_MAX)
    shrink: float = param(0.1, "c of the noise + shrink setting", gt=0, le=SCORE_SCALE_MAX)
    score_noise = swept("noise and settings")
    std_floor = swept("floor and settings")
    std_shrink = swept("shrink and settings")
    methods = default(("tpo", "grpo"), choices=GROUPED)
    reward = default("terminal", fixed="the sparse terminal reward of this experiment")
    length = 6
    episodes = 200
    seeds = 5

    def unread(self) -> dict[str, str]:
        readers = {"noise": ("noise", "noise+floor", "noise+shrink"), "floor": ("noise+floor",),
                   "shrink": ("noise+shrink",)}
        return super().unread() | unread_by(self, "settings", readers,
                                            lambda by: f"setting{'s' if len(by) > 1 else ''} {', '.join(by)}")

    def check(self) -> None:
        for s in self.settings:
            trial_config(self, **setting_options(self, s), methods=self.methods)


def setting_options(cfg, setting: str) -> dict:
    """TrialConfig overrides of a setting (cfg: the experiment's config, as an object or a stored dict)."""
    get = cfg.get if isinstance(cfg, dict) else lambda k: getattr(cfg, k)
    out = {} if setting == "clean" else {"score_noise": get("noise")}
    if setting == "noise+floor":
        out["std_floor"] = get("floor")
    if setting == "noise+shrink":
        out["std_shrink"] = get("shrink")
    return out


PRESETS = {
    "smoke": Config(seeds=2, episodes=3, length=3, batch=8, k=4),
    # H = 5 (78% of groups of 8 start with no right answer: noise-only groups once noise is added) and B = 16, so
    # the three token open-question experiments fit ~10 min of one core (Muon's step does not grow with B); 5 seeds.
    "cpu": Config(length=5, batch=16, episodes=100),
    "paper": Config(seeds=20, length=10, episodes=2000),
}
REPRODUCE_PRESET = "cpu"
RUNTIME = "TPO and GRPO × 4 score settings, H = 5, B = 16"


def units(cfg: Config) -> list[str]:
    return oq.method_setting_units(cfg)


def unit_steps(cfg: Config, unit: str) -> int:
    return cfg.episodes


def run_unit(cfg: Config, unit: str, ctx) -> None:
    method, setting = unit.split("/")
    tr.run_method(cfg, method, ctx, **setting_options(cfg, setting))


# ----------------------------------------------------------------------------- report

def _data(run, metric: str = "error") -> dict[str, dict[str, tc.Curve]]:
    return oq.method_setting_curves(run, metric)


def summary(run) -> str:
    th = run.config["threshold"]
    return f"episodes to {100 * th:g}% error — " + "; ".join(
        f"{tc.label(m)}: " + ", ".join(f"{s} {tc.fmt(tc.steps_to(c, th))}" for s, c in by_s.items())
        for m, by_s in _data(run).items())


def report(run, section) -> None:
    cfg = run.config
    data = _data(run)
    if not tc.intro(section, run, __doc__, data,
                    f"Preset `{run.meta.get('preset')}`: {count(cfg['seeds'], 'seed')} × {cfg['episodes']} episodes, "
                    f"H = {cfg['length']}, B = {cfg['batch']}, K = {cfg['k']}; σ_noise = {cfg['noise']:g}, "
                    f"σ_min = {cfg['floor']:g}, c = {cfg['shrink']:g}."):
        return
    th = cfg["threshold"]
    fails = _data(run, "all_fail")
    for m, by_s in data.items():
        oq.comparison_table(section, by_s, REFERENCE if REFERENCE in by_s else next(iter(by_s)), LABELS, th,
                            f"{tc.label(m)}: exact-match error by score setting, seed mean [95 % t-interval]; Δ = mean error "
                            "over all episodes minus the noisy setting's, paired over seeds")
    rows = []
    for m, by_s in fails.items():
        rows.append([tc.label(m)] + [oq.rate_interval(np.nanmean(by_s[s].values, axis=0)).show(1, 100)
                                     if s in by_s else "–" for s in cfg["settings"]])
    section.table(["method"] + [LABELS[s] for s in cfg["settings"]], rows,
                  "Groups with no right answer, % of groups averaged over all episodes (seed mean [95 % t-interval]): in the "
                  "noisy settings every one of them is a noise-only group whose z-scores are pure noise")
    colors = {s: tr.SWEEP_COLORS[i % len(tr.SWEEP_COLORS)] for i, s in enumerate(SETTINGS)}
    tr.panels(section, {tc.label(m): by_s for m, by_s in data.items()}, "token_low_variance",
              f"Exact-match error by episode, seed mean ± s.e. ({count(cfg['seeds'], 'seed')}); dotted line: {100 * th:g}%",
              threshold=th, labels=LABELS, colors=colors, ylabel="exact-match error")
    lines = []
    for m, by_s in data.items():
        parts = [oq.finding(by_s, s, REFERENCE, LABELS, th, section.gives_verdicts) for s in by_s
                 if s != REFERENCE and REFERENCE in by_s]
        if parts:
            lines.append(f"*{tc.label(m)}:* " + " ".join(parts))
    if lines:
        section.text("**What the data says.** " + "\n\n".join(lines))
