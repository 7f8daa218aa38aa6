"""All-negative groups: partial credit versus binary reward (an open question of the paper's talk and §6;
docs/experiments.md §E16).

With a binary (terminal, exact-match) reward, a group in which no answer is right has equal scores, u = 0, and
TPO's target is q = p_old: it teaches nothing. A partial-credit reward scores each answer by its fraction of
correct tokens, so such a group still ranks its answers and TPO moves probability toward the least bad ones
("least bad teaches"). Task: reverse copy over V = 2, sequence-level groups of K answers per prompt (as
token-terminal, docs/experiments.md §E6). Settings: *binary* (terminal reward), *partial* (partial credit) and
*partial, all-fail zeroed* (partial credit, but a group with no exactly right answer gets equal scores, so u = 0
and A = 0 there: the partial credit acts only inside groups that contain a success). All three are measured
alike: the error is the fraction of the episode's sampled answers that are not exactly right, before the update.
Not a paper experiment.
"""

from __future__ import annotations

from targetpo.runs.config import config, default, param, swept
from targetpo.runs.stats import count
from targetpo.tokens import common as tc
from targetpo.tokens import open_questions as oq
from targetpo.tokens.config import group_only
from targetpo.tokens import report as tr
from targetpo.tokens.engine import trial_config

NAME = "token-partial-credit"
TITLE = "Open question: partial credit in all-fail groups, token reversal"
PAPER_REF = "§6 and talk (open question); docs/experiments.md §E16"
SUITE = oq.SUITE
SETTINGS = {"binary": {"reward": "terminal"},
            "partial": {"reward": "partial"},
            "partial+zero": {"reward": "partial", "zero_all_fail": True}}
LABELS = {"binary": "binary (exact match)", "partial": "partial credit",
          "partial+zero": "partial credit, all-fail groups zeroed"}
GROUPED = ("tpo", "grpo", "grpo_no_kl")


@config
@group_only
class Config(oq.OpenQuestionConfig):
    settings: tuple[str, ...] = param(tuple(SETTINGS), "reward settings to compare (see the module docstring)",
                                      choices=tuple(SETTINGS), unique=True)
    reward = swept("settings")
    zero_all_fail = swept("settings")
    methods = default(("tpo", "grpo"), choices=GROUPED)
    length = 6
    episodes = 200
    seeds = 5

    def check(self) -> None:
        for s in self.settings:
            trial_config(self, **SETTINGS[s], methods=self.methods)


PRESETS = {
    "smoke": Config(seeds=2, episodes=3, length=3, batch=8, k=4),
    # H = 5: a uniform policy's group of 8 contains an exact match only 22% of the time, so most early groups are
    # all-fail; B = 16, so the three token open-question experiments fit ~10 min of one core (Muon's step does not
    # grow with B); 5 seeds.
    "cpu": Config(length=5, batch=16, episodes=100),
    "paper": Config(seeds=20, length=10, episodes=2000),
}
REPRODUCE_PRESET = "cpu"
RUNTIME = "TPO and GRPO × 3 reward settings, H = 5, B = 16"


def units(cfg: Config) -> list[str]:
    return oq.method_setting_units(cfg)


def unit_steps(cfg: Config, unit: str) -> int:
    return cfg.episodes


def run_unit(cfg: Config, unit: str, ctx) -> None:
    method, setting = unit.split("/")
    tr.run_method(cfg, method, ctx, **SETTINGS[setting])


# ----------------------------------------------------------------------------- report

def _data(run) -> dict[str, dict[str, tc.Curve]]:
    return oq.method_setting_curves(run)


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
                    f"H = {cfg['length']}, B = {cfg['batch']}, K = {cfg['k']}."):
        return
    th = cfg["threshold"]
    for m, by_s in data.items():
        ref = "binary" if "binary" in by_s else next(iter(by_s))
        oq.comparison_table(section, by_s, ref, LABELS, th,
                            f"{tc.label(m)}: exact-match error by reward setting, seed mean [95 % t-interval]; Δ = mean error "
                            f"over all episodes minus {LABELS[ref]}'s, paired over seeds")
    colors = {s: tr.SWEEP_COLORS[i % len(tr.SWEEP_COLORS)] for i, s in enumerate(SETTINGS)}
    tr.panels(section, {tc.label(m): by_s for m, by_s in data.items()}, "token_partial_credit",
              f"Exact-match error by episode, seed mean ± s.e. ({count(cfg['seeds'], 'seed')}); dotted line: {100 * th:g}%",
              threshold=th, labels=LABELS, colors=colors, ylabel="exact-match error")
    lines = []
    for m, by_s in data.items():
        parts = [oq.finding(by_s, "partial", ref, LABELS, th, section.gives_verdicts)
                 for ref in ("binary", "partial+zero") if "partial" in by_s and ref in by_s]
        if parts:
            lines.append(f"*{tc.label(m)}:* " + " ".join(parts))
    if lines:
        section.text("**What the data says.** " + "\n\n".join(lines))
