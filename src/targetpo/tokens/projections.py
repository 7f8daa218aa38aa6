"""Other projections onto TPO's target, sparse terminal reward (an open question of the paper's §6;
docs/method.md §8, docs/experiments.md §E14).

TPO builds q ∝ p_old·exp(u/η) over a group and fits the policy to it by forward KL, −Σ q log p_θ (gradient
p_θ − q on the group logits). The same q can be fitted by any divergence that is zero exactly at p_θ = q: reverse
KL(p_θ ‖ q) (mode-seeking), Jensen–Shannon (bounded), the α-divergence between the two (α = ½: four times the
squared Hellinger distance), or the forward KL with a per-group η chosen so that KL(q ‖ p_old) equals a budget ε
("adaptive η", the dual of a KL-constrained improvement step). Task: reverse copy over V = 2 with terminal
(exact-match) reward, sequence-level TPO with K full answers per prompt (as token-terminal, docs/experiments.md
§E6), every setting run on the same seeds; only the projection (or η) differs. The error is the fraction of the
episode's sampled answers with a mistake, before the update. Not a paper experiment: no paper numbers exist.
"""

from __future__ import annotations

from targetpo.objectives.tpo import projection_label, projection_setting, repeated_projection
from targetpo.runs import plots
from targetpo.runs.config import config, default, param, swept
from targetpo.runs.stats import count
from targetpo.tokens import common as tc
from targetpo.tokens import open_questions as oq
from targetpo.tokens import report as tr
from targetpo.tokens.config import tpo_only
from targetpo.tokens.engine import trial_config

NAME = "token-projections"
TITLE = "Open question: other projections onto TPO's target, terminal-reward token reversal"
PAPER_REF = "§6 (open question); docs/experiments.md §E14"
SUITE = oq.SUITE
REFERENCE = "forward_kl"


# The engine's TrialConfig field of each tpo_loss keyword of a setting (objectives/tpo.py: projection_setting).
TRIAL_FIELD = {"projection": "tpo_projection", "alpha": "tpo_alpha", "kl_budget": "tpo_kl_budget"}
setting_label = projection_label


def setting_options(setting: str) -> dict:
    """TrialConfig overrides of a setting name (`projection_setting`; the adaptive η is on when its budget is)."""
    return {TRIAL_FIELD[k]: v for k, v in projection_setting(setting).items() if k != "eta"}


@config
@tpo_only
class Config(oq.OpenQuestionConfig):
    settings: tuple[str, ...] = param(("forward_kl", "reverse_kl", "js", "alpha0.5", "kl0.5", "kl2"),
                                      "projections to compare: forward_kl (TPO), reverse_kl, js, alpha<α> or kl<ε> "
                                      "(forward KL with adaptive η, KL(q ‖ p_old) = ε per group)", unique=True)
    tpo_projection = swept("settings")
    tpo_alpha = swept("settings")
    tpo_kl_budget = swept("settings")
    methods = default(("tpo",), fixed="TPO with each setting's projection")
    reward = default("terminal", fixed="the sparse terminal reward of this experiment")
    length = 6
    episodes = 200
    seeds = 5

    def unit_methods(self) -> list[tuple[str, dict]]:
        return [("tpo", setting_options(s)) for s in self.settings]  # a kl<ε> unit reads no tpo_eta

    def check(self) -> None:
        for s in self.settings:
            try:
                trial_config(self, **setting_options(s), methods=self.methods)
            except ValueError as exc:  # name the setting the user typed, not only the field it sets
                raise ValueError(f"settings item {s!r}: {exc}") from None
        repeated = repeated_projection(self.settings)  # alpha1 is forward_kl, alpha0 reverse_kl: one run twice
        if repeated:
            raise ValueError(f"settings={self.settings!r}: {repeated[0]!r} is the same setting as {repeated[1]!r}")


PRESETS = {
    "smoke": Config(seeds=2, episodes=3, length=3, batch=8, k=4, settings=("forward_kl", "reverse_kl", "alpha0.5",
                                                                          "kl1")),
    # H = 6, the sparse terminal reward of token-terminal's cpu preset (a uniform policy succeeds once in 64
    # answers; 88% of groups of 8 start all-fail), with B = 32 and 150 episodes so TPO's descent fits; 5 seeds.
    "cpu": Config(length=6, batch=32, episodes=150),
    "paper": Config(seeds=20, length=10, episodes=2000),
}
REPRODUCE_PRESET = "cpu"
RUNTIME = "6 projections, H = 6, B = 32"


def units(cfg: Config) -> list[str]:
    return list(cfg.settings)


def unit_steps(cfg: Config, unit: str) -> int:
    return cfg.episodes


def run_unit(cfg: Config, unit: str, ctx) -> None:
    tr.run_method(cfg, "tpo", ctx, **setting_options(unit))


# ----------------------------------------------------------------------------- report

def _data(run) -> dict[str, tc.Curve]:
    got = tc.unit_curves(run, "error")
    return {s: got[s] for s in run.config["settings"] if s in got}


def summary(run) -> str:
    cfg, data = run.config, _data(run)
    return f"episodes to {100 * cfg['threshold']:g}% error — " + ", ".join(
        f"{setting_label(s)}: {tc.fmt(tc.steps_to(c, cfg['threshold']))}" for s, c in data.items())


def report(run, section) -> None:
    cfg = run.config
    data = _data(run)
    if not tc.intro(section, run, __doc__, data,
                    f"Preset `{run.meta.get('preset')}`: {count(cfg['seeds'], 'seed')} × {cfg['episodes']} episodes, "
                    f"H = {cfg['length']}, B = {cfg['batch']}, K = {cfg['k']}, η = {cfg['tpo_eta']:g} for the fixed-η "
                    "settings."):
        return
    labels = {s: setting_label(s) for s in data}
    th = cfg["threshold"]
    ref = REFERENCE if REFERENCE in data else next(iter(data))  # forward KL, unless the run left it out
    oq.comparison_table(section, data, ref, labels, th,
                        "Exact-match error by projection: seed mean [95 % t-interval]; episodes to the threshold on the seed-mean "
                        f"curve and per seed ({oq.SMOOTH}-episode trailing mean); Δ = this setting's mean error over "
                        f"all episodes minus {'TPO' if ref == REFERENCE else labels[ref]}'s, paired over seeds")
    # TPO (forward KL) in TPO's colour of every other figure; the other projections from the sweep palette.
    colors = {s: tr.SWEEP_COLORS[i % len(tr.SWEEP_COLORS)] for i, s in enumerate(s for s in data if s != REFERENCE)}
    if REFERENCE in data:
        colors[REFERENCE] = plots.COLORS["tpo"]
    tr.panels(section, {f"terminal reward, H = {cfg['length']}": data}, "token_projections",
              f"Exact-match error by episode for each projection, seed mean ± s.e. ({count(cfg['seeds'], 'seed')}); dotted "
              f"line: {100 * th:g}%", threshold=th, labels=labels, colors=colors, ylabel="exact-match error")
    if REFERENCE in data:
        section.text("**What the data says.** " + " ".join(
            oq.finding(data, s, REFERENCE, labels, th, section.gives_verdicts) for s in data if s != REFERENCE))
