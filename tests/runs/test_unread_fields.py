"""A field that only some methods (or parts, or sweeps) read is refused when set for a run that reads it nowhere:
`key=value` overrides go through `make_config`, which asks the config's `unread()`. The token engine's map of
which method reads which field (`engine.reads`) is checked against what `run_trial` actually reads."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from targetpo.cli import main
from targetpo.experiments import EXPERIMENTS, load
from targetpo.runs.config import config_fields, make_config
from targetpo.tokens import engine
from targetpo.tokens.engine import METHOD_FIELDS, METHODS, TrialConfig, reads, run_trial

REFUSED = [
    ("token-dense", "methods=tpo_token clip_eps=0.5", "clip_eps=0.5: not read by this run (read by ppo, "
                                                       "grpo_token, grpo_token_no_kl; methods=tpo_token runs none"),
    ("token-dense", "methods=ppo k=16", "k=16: not read by this run (read by tpo_token, grpo_token, "
                                        "grpo_token_no_kl; with match=interactions also by reinforce, ppo, dg"),
    ("token-dense", "methods=ppo interaction_lr_scale=false", "read with match=interactions, by reinforce, "
                                                              "ppo, dg; methods=ppo runs none"),
    ("token-dense", "methods=tpo_token dg_eta=2", "dg_eta=2.0: not read by this run (read by dg;"),
    ("token-dense", "methods=ppo tpo_eta=2", "tpo_eta=2.0: not read by this run (read by tpo_token;"),
    ("token-dense", "methods=grpo_token_no_kl grpo_beta=0.1", "grpo_beta=0.1: not read by this run (read by "
                                                              "grpo_token;"),
    ("token-dense", "methods=dg epochs=2", "epochs=2: not read"),
    ("token-dense", "methods=ppo dg_epochs=2", "dg_epochs=2: not read by this run (read by dg;"),
    ("token-diagnostics", "methods=tpo_1ep,dg epochs=2", "epochs=2: not read"),  # tpo_1ep fixes its epochs
    ("token-terminal", "methods=ppo,dg matches=prompts k=16", "k=16: not read"),
    ("token-terminal", "methods=tpo,grpo matches=interactions", "matches=interactions: not read by this run (read "
                                                                "only by single-sample methods"),
    ("token-variants", "methods=ppo,dg match=interactions k=16", "interaction matching, which applies only beside "
                                                                 "a sequence-level group method"),
    ("token-sweeps", "sweeps=k k=16", "k=16: not read by this run (read only by the epochs and masking sweeps, "
                                      "and sweeps=k)"),
    ("token-sweeps", "sweeps=epochs ks=4,8", "ks=4,8: not read by this run (read only by the k sweep"),
    ("token-sweeps", "sweeps=k epoch_counts=1,2", "epoch_counts=1,2: not read"),
    ("token-sweeps", "sweeps=epochs epochs=2", "epochs=2: not read by this run (read only by the k and masking"),
    ("token-sweeps", "sweeps=masking methods=tpo", "methods=tpo: not read by this run (read only by the k and "
                                                   "epochs sweeps"),
    ("dg-epochs", "parts=terminal variant_episodes=5", "variant_episodes=5: not read by this run (read only by "
                                                       "part variants, and parts=terminal)"),
    ("dg-epochs", "parts=variants terminal_length=3", "terminal_length=3: not read by this run (read only by part "
                                                      "terminal"),
    ("tabular-single", "methods=pg,grpo eta=2", "eta=2.0: not read by this run (read by dg; "
                                                "methods=pg,grpo runs none of them)"),
    ("tabular-single", "methods=grpo baseline=0.3", "baseline=0.3: not read by this run (read by pg, "
                                                    "dg, tpo"),
    ("tabular-multi", "methods=pg,ce eta=2", "eta=2.0: not read"),
    ("mnist", "methods=pg,ce eta=2", "eta=2.0: not read"),
    ("mnist-mechanism", "methods=grpo,pg eta=0.5", "eta=0.5: not read"),
    ("mnist-friction", "methods=grpo,pg eta=0.5", "eta=0.5: not read"),
    ("mnist-replay", "methods=tpo,dg clip_eps=0.3", "clip_eps=0.3: not read by this run (read by ppo"),
    ("mnist-replay", "methods=tpo,dg is_clips=2", "is_clips=2.0: not read by this run (read by tpo_is"),
    ("mnist-staleness", "methods=ppo,dg anchor=behaviour", "anchor=behaviour: not read"),
    ("rlvr", "model=/tmp/m tiny_hidden=128", "tiny_hidden=128: not read by this run (read only with model=tiny, "
                                             "and model=/tmp/m)"),
    ("rlvr", "warmstart_steps=0 warmstart_lr=0.01", "warmstart_lr=0.01: not read by this run (read only by the "
                                                    "warm start, and warmstart_steps=0)"),
    ("rlvr", "task=gsm8k data_path=/tmp task_options=a=1", "task_options=a=1: not read by this run (reasoning-gym "
                                                           "options, and task=gsm8k is read from files)"),
    ("llm-length", "warmstart_steps=0 warmstart_batch=8", "warmstart_batch=8: not read"),
    ("mnist-projections", "methods=kl0.5,kl2 eta=2", "eta=2.0: not read by this run (read only by fixed-η settings, "
                                                     "and methods=kl0.5,kl2 are all kl<ε>)"),
]

ACCEPTED = [
    ("token-dense", "methods=tpo_token,grpo_token clip_eps=0.5"),
    ("token-dense", "methods=ppo,dg match=interactions k=16"),
    ("token-dense", "methods=ppo match=interactions interaction_lr_scale=false"),
    ("token-diagnostics", "methods=tpo_1ep,grpo epochs=2"),
    ("token-terminal", "methods=ppo,dg k=16"),  # both matchings by default: interaction-matched PPO/DG read K
    ("token-variants", "methods=tpo_token,ppo match=interactions"),  # a no-op the report names (docs/differences.md §4)
    ("token-variants", "methods=tpo,ppo match=interactions k=16"),
    ("token-sweeps", "sweeps=masking clip_eps=0.3"),  # the masking sweep always runs grpo
    ("token-sweeps", "sweeps=k epochs=2"),
    ("dg-epochs", "parts=variants variants=bag/copy"),
    ("tabular-single", "methods=tpo baseline=0.3"),
    ("tabular-multi", "methods=tpo eta=2"),
    ("mnist", "methods=group_pg eta=2"),
    ("mnist-staleness", "methods=tpo anchor=behaviour"),
    ("llm-length", "methods=grpo,dr_grpo eta=2"),  # every arm's step diagnostics compute TPO's target at η
    ("rlvr", "task=gsm8k data_path=/tmp task_options="),  # what --task sets: no options, nothing ignored
    ("rlvr", "tiny_hidden=64 warmstart_lr=0.01"),
    ("mnist-projections", "methods=js,kl2 eta=2"),
]


@pytest.mark.parametrize("name,overrides,expected", REFUSED)
def test_a_field_no_unit_reads_is_refused(name, overrides, expected):
    with pytest.raises(ValueError) as err:
        make_config(load(name), "smoke", overrides=overrides.split())
    assert expected in str(err.value) and str(err.value).endswith("; drop it")


@pytest.mark.parametrize("name,overrides", ACCEPTED)
def test_a_field_some_unit_reads_is_accepted(name, overrides):
    cfg = make_config(load(name), "smoke", overrides=overrides.split())
    assert cfg.methods  # built and validated


def test_a_preset_value_for_methods_not_run_is_left_alone():
    # token-variants' smoke preset sets K = 4 for its grouped methods; choosing PPO and DG alone does not turn it
    # into an error (only a key=value the user gives is checked).
    cfg = make_config(load("token-variants"), "smoke", overrides=["methods=ppo,dg"])
    assert cfg.k == 4 and "k" in cfg.unread()


def test_the_cli_refuses_in_one_line_before_writing(tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["run", "token-dense", "--preset", "smoke", "--out", str(out), "--no-progress", "methods=tpo_token",
                 "clip_eps=0.5"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "clip_eps=0.5: not read by this run" in err[0] and not out.exists()


# ----------------------------------------------------------------------------- engine.reads vs run_trial

@dataclasses.dataclass(frozen=True)
class _Spy(TrialConfig):
    """A TrialConfig that records which METHOD_FIELDS are read from it."""

    def __getattribute__(self, name):
        if name in METHOD_FIELDS:
            object.__getattribute__(self, "_read").add(name)
        return object.__getattribute__(self, name)


@pytest.mark.parametrize("match", ["prompts", "interactions"])
@pytest.mark.parametrize("method", list(METHODS))
def test_reads_is_what_run_trial_reads(monkeypatch, method, match):
    reward = "bag" if METHODS[method].rollout == "token" else "terminal"
    cfg = _Spy(task="copy", reward=reward, length=2, vocab=2, batch=2, k=2, episodes=1, epochs=1, match=match)
    object.__setattr__(cfg, "_read", set())
    # check_trial validates every field (reading all of them); the spy is for what the trial itself reads.
    monkeypatch.setattr(engine, "check_trial", lambda c, m: None)
    run_trial(cfg, method, [0])
    read = set(object.__getattribute__(cfg, "_read"))  # a copy: reads() below reads the spy too
    assert {"epochs", "dg_epochs"} & read  # the spy sees reads at all
    assert read == reads(cfg, method)


# ----------------------------------------------------------------------------- READ_BY vs the updates

class _Rows:
    def __init__(self):
        self.rows = []

    def log(self, row):
        self.rows.append({k: np.asarray(v).tolist() for k, v in row.items()})

    def advance(self):
        pass


CHANGED = {"eta": 0.5, "baseline": 0.3, "clip_eps": 0.05, "anchor": "behaviour"}


@pytest.mark.parametrize("name", ["tabular-single", "tabular-multi"])
def test_tabular_read_by_is_what_the_updates_read(name):
    exp = load(name)
    base = exp.PRESETS["smoke"]
    for field, by in type(base).READ_BY.items():
        for m in exp.METHODS:
            runs = []
            for cfg in (dataclasses.replace(base, methods=(m,)),
                        dataclasses.replace(base, methods=(m,), **{field: CHANGED[field]})):
                ctx = _Rows()
                exp.run_unit(cfg, m, ctx)
                runs.append(ctx.rows)
            assert (runs[0] != runs[1]) == (m in by), (field, m)


@pytest.mark.parametrize("name", ["mnist", "mnist-mechanism", "mnist-friction", "mnist-replay", "mnist-staleness"])
def test_mnist_read_by_is_what_bandit_loss_reads(name):
    # eta, clip_eps and anchor reach the methods through bandit_loss's keywords: the loss of a method that reads
    # one changes with it (a behaviour policy away from the learner, so PPO's clip is active), the others' do not.
    from targetpo.mnist.bandit import bandit_loss
    cfg_cls = type(load(name).PRESETS["smoke"])
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 64, 10, generator=g, dtype=torch.float64)
    behaviour = torch.log_softmax(3 * torch.randn(2, 64, 10, generator=g, dtype=torch.float64), -1)
    learner = torch.log_softmax(logits, -1)
    actions = torch.randint(0, 10, (2, 64), generator=g)
    labels = torch.randint(0, 10, (2, 64), generator=g)
    keyword = {"eta": lambda v: {"eta": v}, "clip_eps": lambda v: {"clip_eps": v},
               "anchor": lambda v: {"anchor_logp": learner if v == "learner" else behaviour}}
    methods = config_fields(cfg_cls)["methods"].metadata["choices"]
    for field, by in cfg_cls.READ_BY.items():
        if field not in keyword:
            continue
        default = config_fields(cfg_cls)[field].default
        for m in (m for m in methods if m != "tpo_is"):  # tpo_is is replay's own loss, not bandit_loss
            a, b = (float(bandit_loss(m, logits, actions, labels, behaviour, **keyword[field](v)))
                    for v in (default, CHANGED[field]))
            assert (a != b) == (m in by), (name, field, m)


def test_rlvr_read_by_is_the_objectives_that_take_eta():
    import inspect

    from targetpo import objectives as obj
    from targetpo.llm import experiment as rlvr

    takes = {m for m in rlvr.METHODS
             if "eta" in inspect.signature(obj.get(rlvr.method_objective(m)[0]).per_token_fn).parameters}
    assert takes == set(rlvr.Config.READ_BY["eta"])
    with pytest.raises(ValueError, match=r"eta=0.5: not read by this run \(read by tpo_sum, "):
        make_config(rlvr, "smoke", overrides=["methods=grpo", "eta=0.5"])


@pytest.mark.parametrize("overrides,expected", [
    ("settings=clean,noise floor=0.2", "floor=0.2: not read by this run (read only by setting noise+floor"),
    ("settings=clean noise=0.2", "noise=0.2: not read by this run (read only by settings noise, noise+floor, "
                                 "noise+shrink, and settings=clean)"),
    ("settings=clean,noise shrink=0.2", "shrink=0.2: not read"),
])
def test_low_variance_setting_fields_are_refused_without_their_setting(overrides, expected):
    with pytest.raises(ValueError) as err:
        make_config(load("token-low-variance"), "smoke", overrides=overrides.split())
    assert expected in str(err.value)
    make_config(load("token-low-variance"), "smoke", overrides=["settings=clean,noise+shrink", "shrink=0.2"])


@pytest.mark.parametrize("name", sorted(EXPERIMENTS))
def test_no_preset_sets_a_field_its_own_run_leaves_unread(name):
    for preset, cfg in load(name).PRESETS.items():
        fields = config_fields(type(cfg))
        unread = cfg.unread() if hasattr(cfg, "unread") else {}
        assert not [k for k in unread if getattr(cfg, k) != fields[k].default], (name, preset)


def test_mnist_projections_eta_reaches_the_fixed_eta_settings_only():
    # As mnist.projections.step builds each setting's tpo_loss call: kl<ε> keeps its adaptive η whatever `eta` is.
    from targetpo.mnist.projections import setting_options
    from targetpo.objectives import tpo_loss

    g = torch.Generator().manual_seed(1)
    logits, old = torch.randn(16, 10, generator=g), torch.log_softmax(torch.randn(16, 10, generator=g), -1)
    scores = torch.randn(16, 10, generator=g)

    def loss(name, eta):
        kw = setting_options(name)
        kw.setdefault("eta", eta)
        return float(tpo_loss(logits, old, scores, **kw).loss)

    for name in ("forward_kl", "reverse_kl", "js", "alpha0.5", "kl0.5", "kl2"):
        reads = not name.startswith("kl")
        assert (loss(name, 1.0) != loss(name, 2.0)) == reads, name
        assert ("eta" in load("mnist-projections").Config(methods=(name,)).unread()) != reads, name
