"""The open-question options of the token engine (docs/experiments.md §E14–§E16) and their experiments: partial
credit, zeroed all-fail groups, score noise, the TPO/GRPO options routed to the objectives, and smoke runs."""

import numpy as np
import pytest
import torch

from targetpo import objectives as obj
from targetpo.experiments import load, run_experiment
from targetpo.report import write_report
from targetpo.runs.config import make_config
from targetpo.runs.stats import Curve, mean_se
from targetpo.runs.store import Run
from targetpo.tokens import engine as te
from targetpo.tokens import open_questions as oq
from targetpo.tokens import tasks
from targetpo.tokens import transformer as tfm

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SMALL = dict(length=3, vocab=2, batch=6, k=4, episodes=3, epochs=2, reward="terminal")


def _run(method="tpo", seeds=(0, 1), **kw):
    return te.run_trial(te.TrialConfig(**(SMALL | kw)), method, list(seeds))


# ----------------------------------------------------------------------------- rewards


def test_partial_credit_counts_correct_positions():
    target = torch.tensor([[0, 1, 1, 0]])
    answers = torch.tensor([[0, 1, 1, 0], [0, 1, 0, 0], [1, 0, 0, 1], [1, 1, 1, 1]])
    r = tasks.token_rewards(answers, target, "partial")
    assert r.shape == answers.shape
    assert torch.equal(r, torch.tensor([[1.0] * 4, [0.75] * 4, [0.0] * 4, [0.5] * 4]))  # same at every position
    assert torch.equal(tasks.sequence_scores(r), torch.tensor([1.0, 0.75, 0.0, 0.5]))
    # binary reward scores the same answers 1, 0, 0, 0
    assert torch.equal(tasks.sequence_scores(tasks.token_rewards(answers, target, "terminal")),
                       torch.tensor([1.0, 0.0, 0.0, 0.0]))
    assert tasks.initial_error("partial", 2, 6) == tasks.initial_error("terminal", 2, 6) == 1 - 2 ** -6


def test_partial_credit_error_is_exact_match_error():
    cfg = te.TrialConfig(**(SMALL | {"reward": "partial"}))
    spec = te.model_spec(cfg)
    params = tfm.init_params(spec, [0])
    prompts = tasks.sample_prompts(te._generators([0], 1, "cpu"), cfg.batch, cfg.length, cfg.vocab)
    batch = te.collect(params, spec, cfg, "tpo", prompts, te._generators([0], 2, "cpu"))
    ok = tasks.exact_match(batch.actions, tasks.targets(prompts, cfg.task, cfg.vocab).unsqueeze(2))
    assert torch.allclose(batch.error, 1 - ok.float().mean())
    # ... while the scores are the fractions of correct tokens (strictly between 0 and 1 for some answers)
    assert ((batch.scores > 0) & (batch.scores < 1)).any()


def test_zeroing_all_fail_groups():
    scores = torch.tensor([[0.5, 0.25, 0.75, 0.0], [1.0, 0.5, 0.25, 0.5], [0.0, 0.0, 0.0, 0.0]])
    success = torch.tensor([[False] * 4, [True, False, False, False], [False] * 4])
    z = te.zero_all_fail_groups(scores, success)
    assert torch.equal(z[0], torch.zeros(4)) and torch.equal(z[1], scores[1]) and torch.equal(z[2], scores[2])
    # a zeroed group teaches nothing: TPO's target is p_old, GRPO's advantages are 0
    old = torch.log_softmax(torch.randn(3, 4, generator=torch.Generator().manual_seed(0)), -1)
    assert torch.allclose(obj.tpo_target(old, z)[0], old[0].exp(), atol=1e-7)
    assert not torch.allclose(obj.tpo_target(old, scores)[0], old[0].exp(), atol=1e-3)
    assert torch.equal(obj.group_advantages(z)[0], torch.zeros(4))


def test_zeroing_all_fail_groups_under_binary_reward_is_refused_as_a_no_op():
    """Under exact-match reward an all-fail group's scores are all 0 already: the option changed no bit, silently."""
    with pytest.raises(ValueError, match="zero_all_fail=True with reward='terminal' and no score_noise changes nothing"):
        _run(length=2, zero_all_fail=True)
    _run(length=2, zero_all_fail=True, score_noise=0.1)  # with noisy scores it is read


@pytest.mark.parametrize("reward", ["terminal", "partial"])
def test_zeroing_all_fail_groups_silences_them_under_score_noise_too(reward):
    """The zeroing ran before the noise, so with terminal reward and score_noise it changed no bit, and under
    partial credit the all-fail groups still got |u| up to 1.7: their scores were equal, then noisy again."""
    cfg = te.TrialConfig(**(SMALL | {"reward": reward, "score_noise": 0.01, "zero_all_fail": True, "length": 2,
                                     "batch": 12}))
    spec = te.model_spec(cfg)
    params = tfm.init_params(spec, [0, 1])
    prompts = tasks.sample_prompts(te._generators([0, 1], 1, "cpu"), cfg.batch, cfg.length, cfg.vocab)
    batch = te.collect(params, spec, cfg, "tpo", prompts, te._generators([0, 1], 2, "cpu"),
                       te._generators([0, 1], 3, "cpu"))
    fail = ~tasks.exact_match(batch.actions, tasks.targets(prompts, cfg.task, cfg.vocab).unsqueeze(2)).any(-1)
    assert fail.any() and (~fail).any()
    assert torch.equal(batch.scores[fail], torch.zeros_like(batch.scores[fail]))
    assert bool((obj.standardize_scores(batch.scores)[fail] == 0).all())
    assert (batch.scores[~fail].std(-1) > 0).all()                     # the other groups keep their noise
    a, b = _run(reward=reward, score_noise=0.01), _run(reward=reward, score_noise=0.01, zero_all_fail=True)
    assert not np.array_equal(a["error"], b["error"]) or not np.array_equal(a["frac_zero_var"], b["frac_zero_var"])


def test_zeroing_all_fail_groups_changes_partial_credit_training():
    a, b = _run(reward="partial"), _run(reward="partial", zero_all_fail=True)
    assert not np.array_equal(a["error"], b["error"])


# ----------------------------------------------------------------------------- options routed to the objectives


def test_defaults_given_explicitly_change_nothing():
    plain = _run()
    explicit = _run(tpo_projection="forward_kl", tpo_kl_budget=0.0, std_floor=0.0, std_shrink=0.0, score_noise=0.0,
                    zero_all_fail=False)
    assert all(np.array_equal(plain[k], explicit[k], equal_nan=True) for k in plain)


@pytest.mark.parametrize("kw", [{"tpo_projection": "reverse_kl"}, {"tpo_projection": "alpha", "tpo_alpha": 0.5},
                                {"tpo_kl_budget": 0.5}, {"std_shrink": 0.3}])
def test_tpo_options_reach_the_loss(kw):
    cfg, opt = te.TrialConfig(**SMALL), te.TrialConfig(**(SMALL | kw))
    spec = te.model_spec(cfg)
    params = tfm.init_params(spec, [0, 1])
    prompts = tasks.sample_prompts(te._generators([0, 1], 1, "cpu"), cfg.batch, cfg.length, cfg.vocab)
    batch = te.collect(params, spec, cfg, "tpo", prompts, te._generators([0, 1], 2, "cpu"))
    batch.scores = torch.rand(batch.scores.shape, generator=torch.Generator().manual_seed(1))  # spread everywhere
    # In the first epoch p_θ = p_old, so compare gradients (every projection has gradient 0 only at p_θ = q).
    p = {k: v.clone().requires_grad_(True) for k, v in params.items()}
    g0 = torch.autograd.grad(te.loss_fn(p, spec, cfg, "tpo", batch), list(p.values()))
    g1 = torch.autograd.grad(te.loss_fn(p, spec, opt, "tpo", batch), list(p.values()))
    assert any(not torch.allclose(a, b) for a, b in zip(g0, g1))
    seq, old = te.answer_logp(params, spec, batch.prompts, batch.actions), batch.old_logp.sum(-1)
    lp = seq.gather(-1, batch.actions.unsqueeze(-1)).squeeze(-1).sum(-1)
    ref = obj.tpo_loss(lp, old, batch.scores, **te.tpo_kwargs(opt)).loss * 2
    assert torch.allclose(te.loss_fn(params, spec, opt, "tpo", batch), ref)


def test_grpo_reads_the_std_options():
    scores = torch.tensor([[1.0, 1.0, 1.0, 1.0001], [1.0, 0.0, 0.0, 0.0]])
    logp = torch.zeros(2, 4, requires_grad=True)
    out = obj.grpo_loss(logp, torch.zeros(2, 4), scores, std_floor=0.1)
    out.loss.backward()
    a = obj.group_advantages(scores, std_floor=0.1)
    assert torch.allclose(logp.grad, -a / 2)                    # first epoch: ∂L/∂logp_i = −A_i / groups
    assert a[0].abs().max() < 1e-3 and a[1].abs().max() > 1     # the noise-level group is silenced, the real one not
    plain = obj.group_advantages(scores)
    assert plain[0].abs().max() > 1                             # without the floor it gets full-size advantages


def test_score_noise_is_its_own_stream_and_breaks_zero_variance():
    a, b = _run(score_noise=0.01), _run(score_noise=0.01)
    assert all(np.array_equal(a[k], b[k], equal_nan=True) for k in a)   # deterministic
    plain = _run()
    assert plain["frac_zero_var"].mean() > 0.5 and (a["frac_zero_var"] == 0).all()
    # seed 0 alone gives seed 0's numbers with another seed beside it (one generator per seed)
    solo = _run(seeds=(0,), score_noise=0.01)
    assert np.array_equal(solo["error"][:, 0], a["error"][:, 0])


@pytest.mark.parametrize("kw,method,match", [
    ({"score_noise": 0.1}, "ppo", "score_noise=0.1: changes the sequence-level group scores, which method 'ppo' "
                                  "\\(single rollouts\\) does not have"),
    ({"zero_all_fail": True}, "dg", "zero_all_fail=True"),
    # tpo_no_anchor's objective takes kl_budget but refuses it without the anchor: that was only found at the
    # first step, after the run folder was written.
    ({"tpo_kl_budget": 0.5}, "tpo_no_anchor", "tpo_kl_budget=0.5 with method 'tpo_no_anchor'"),
])
def test_options_a_method_does_not_read_are_refused(kw, method, match):
    with pytest.raises(ValueError, match=match):
        _run(method, **kw)


@pytest.mark.parametrize("override", ["tpo_projection=js", "tpo_kl_budget=1", "std_floor=0.1"])
def test_an_objective_option_is_refused_only_when_no_method_of_the_run_reads_it(tmp_path, override):
    """Like tpo_eta: `methods=tpo,group_pg tpo_projection=js` was refused because Group PG does not read it, so TPO's
    options could not be compared against a baseline in one run. It is refused when no method reads it, and a
    method that does not read it runs exactly as without it."""
    from targetpo.experiments import load
    from targetpo.runs.config import make_config
    from targetpo.runs.runner import run_experiment
    from targetpo.runs.store import Run

    exp = load("token-terminal")
    with pytest.raises(ValueError, match=f"{override.split('=')[0]}=.*: not read by this run .*methods=group_pg"):
        make_config(exp, "smoke", overrides=["methods=group_pg", override])
    both, plain = tmp_path / "both", tmp_path / "plain"
    run_experiment(exp, "smoke", out=both, overrides=["methods=tpo,group_pg", "episodes=3", override],
                   progress=False, quiet=True)
    run_experiment(exp, "smoke", out=plain, overrides=["methods=group_pg", "episodes=3"], progress=False, quiet=True)
    rows = {name: Run.load(d).rows(next(u for u in Run.load(d).units() if u.endswith("group_pg")))
            for name, d in (("both", both), ("plain", plain))}
    assert len(rows["both"]) == 3 and rows["both"] == rows["plain"]


def test_std_options_beside_a_kl_budget_are_refused_where_tpo_alone_would_read_them(tmp_path):
    """A floor or shrinkage divides each group's u by a constant, and the adaptive η reaches the same KL at η times
    that constant: `methods=tpo tpo_kl_budget=0.5 std_floor=0.1` ran as if the floor were off. The objective
    refuses the pair; a run refuses the option when no other method reads it, and GRPO beside TPO still reads it."""
    from targetpo.experiments import load
    from targetpo.runs.config import make_config

    exp = load("token-terminal")
    for opt in ("std_floor=0.1", "std_shrink=0.3"):
        with pytest.raises(ValueError, match=f"{opt}: not read by this run \\(a KL budget .* undoes the rescaling"):
            make_config(exp, "smoke", overrides=["methods=tpo", "tpo_kl_budget=0.5", opt])
    make_config(exp, "smoke", overrides=["methods=tpo,grpo", "tpo_kl_budget=0.5", "std_floor=0.1"])
    cfg = te.TrialConfig(**(SMALL | {"tpo_kl_budget": 0.5, "std_floor": 0.1}))
    assert "std_floor" not in te.reads(cfg, "tpo") and "std_floor" in te.reads(cfg, "grpo")
    assert "std_floor" not in te.tpo_kwargs(cfg)
    old = torch.log_softmax(torch.randn(4, 8, generator=torch.Generator().manual_seed(0)), -1)
    s = torch.rand(4, 8, generator=torch.Generator().manual_seed(1))
    with pytest.raises(ValueError, match="std_floor=0.1/std_shrink=0.0 with eta='adaptive': they rescale"):
        obj.tpo_loss(old.clone().requires_grad_(True), old, s, eta="adaptive", kl_budget=0.05, std_floor=0.1)
    with pytest.raises(ValueError, match="with eta='adaptive'"):
        obj.tpo_target(old, s, eta="adaptive", kl_budget=0.05, std_shrink=0.3)


@pytest.mark.parametrize("kw,match", [
    ({"tpo_projection": "alpha"}, "tpo_alpha=None"),
    ({"tpo_alpha": 0.5}, "tpo_alpha=0.5"),
    ({"tpo_projection": "alpha", "tpo_alpha": 1.5}, "tpo_alpha"),
    ({"tpo_projection": "hellinger"}, "tpo_projection"),
    ({"score_noise": -0.1}, "score_noise"),
    ({"tpo_kl_budget": -1.0}, "tpo_kl_budget"),
    ({"tpo_kl_budget": 1e-9}, r"tpo_kl_budget=1e-09: below .* the KL that a group of K = "),
])
def test_bad_option_values_are_refused(kw, match):
    with pytest.raises(ValueError, match=match):
        te.TrialConfig(**(SMALL | kw)).validate()


def test_token_level_methods_refuse_partial_credit():
    with pytest.raises(ValueError, match="partial reward has no per-state credit"):
        _run("tpo_token", reward="partial")


# ----------------------------------------------------------------------------- report helpers


def test_paired_differences_and_per_seed_crossings():
    assert oq.seeds_lower(np.array([1.0, 2.0, np.nan]), np.array([2.0, 2.5, 1.0])) == (2, 2)
    assert oq.seeds_lower(np.array([3.0, 2.0, 0.5]), np.array([2.0, 2.5, 1.0])) == (2, 3)
    steps = np.arange(10)
    vals = np.stack([np.linspace(1, 0, 10), np.ones(10)], 1)  # seed 0 falls below 0.5, seed 1 never
    c = Curve(steps, vals.mean(1), vals.std(1), vals)
    hit = oq.seed_steps_to(c, 0.5, window=1)
    assert hit[0] == 5 and np.isnan(hit[1])


# ----------------------------------------------------------------------------- experiments


@pytest.mark.parametrize("name,units,figure", [
    ("token-projections", ["forward_kl", "reverse_kl", "alpha0.5", "kl1"], "token_projections.png"),
    ("token-low-variance", [f"{m}/{s}" for m in ("tpo", "grpo") for s in ("clean", "noise", "noise+floor",
                                                                          "noise+shrink")], "token_low_variance.png"),
    ("token-partial-credit", [f"{m}/{s}" for m in ("tpo", "grpo") for s in ("binary", "partial", "partial+zero")],
     "token_partial_credit.png"),
])
def test_open_question_smoke_runs_and_reports(tmp_path, name, units, figure):
    exp = load(name)
    assert exp.SUITE == "open-questions" and set(exp.PRESETS) == {"smoke", "cpu", "paper"}
    out = run_experiment(name, "smoke", out=tmp_path / name, progress=False, quiet=True, threads=1)
    run = Run.load(out)
    assert run.units() == units and run.done_units() == set(units)
    _, err = run.series(units[0], "error")
    assert err.shape == (3, 2) and ((err >= 0) & (err <= 1)).all()
    text = write_report(out).read_text()
    assert figure in text and (out / figure).exists() and "What the data says" in text
    assert "paired 95 % t-interval over 2 seeds" in text
    assert "**PASS**" not in text and "**FAIL**" not in text  # no paper claims are made for these


def test_open_question_settings_are_checked():
    with pytest.raises(ValueError, match="setting 'alpha2'"):
        make_config(load("token-projections"), "smoke", overrides=["settings=forward_kl,alpha2"])
    with pytest.raises(ValueError, match="setting 'kl'"):
        make_config(load("token-projections"), "smoke", overrides=["settings=kl"])
    with pytest.raises(ValueError, match="tpo_projection"):
        make_config(load("token-projections"), "smoke", overrides=["tpo_projection=js"])   # swept by settings
    with pytest.raises(ValueError, match="settings"):
        make_config(load("token-low-variance"), "smoke", overrides=["settings=noise,loud"])
    with pytest.raises(ValueError, match="reward"):
        make_config(load("token-partial-credit"), "smoke", overrides=["reward=terminal"])    # swept by settings
    with pytest.raises(ValueError, match="methods"):
        make_config(load("token-partial-credit"), "smoke", overrides=["methods=ppo"])


def test_the_paper_suite_leaves_the_open_questions_out():
    from targetpo.experiments import EXPERIMENTS
    suites = {n: getattr(load(n), "SUITE", None) for n in EXPERIMENTS}
    assert {n for n, s in suites.items() if s == "open-questions"} >= {
        "token-projections", "mnist-projections", "token-low-variance", "token-partial-credit"}
    assert suites["token-terminal"] is None and suites["mnist"] is None


def test_token_level_tpo_reads_the_projection():
    cfg = te.TrialConfig(**(SMALL | {"reward": "bag"}))
    opt = te.TrialConfig(**(SMALL | {"reward": "bag", "tpo_projection": "reverse_kl", "std_floor": 0.2}))
    spec = te.model_spec(cfg)
    params = tfm.init_params(spec, [0])
    prompts = tasks.sample_prompts(te._generators([0], 1, "cpu"), cfg.batch, cfg.length, cfg.vocab)
    batch = te.collect(params, spec, cfg, "tpo_token", prompts, te._generators([0], 2, "cpu"))
    tok = te.answer_logp(params, spec, batch.prompts, batch.actions)[:, :, 0]
    ref = obj.tpo_token_loss(tok, batch.candidates, batch.cand_logp, batch.cand_rewards, projection="reverse_kl",
                             std_floor=0.2).loss
    assert torch.allclose(te.loss_fn(params, spec, opt, "tpo_token", batch), ref)
    assert not torch.allclose(te.loss_fn(params, spec, cfg, "tpo_token", batch), ref)


def test_the_options_a_method_reads_come_from_its_objective():
    """TPO's options are read by the TPO family, the std options by TPO and GRPO, nothing by the single-sample
    methods or Group PG: derived from each registered objective's keywords, so a new objective needs no list."""
    from targetpo.tokens import engine as te

    values = {"tpo_projection": "js", "tpo_kl_budget": 1.0, "std_floor": 0.1, "std_shrink": 0.1}
    accepted = {}
    for method in te.METHODS:
        reward = "bag" if te.METHODS[method].rollout == "token" else "terminal"
        ok = set()
        for field, value in values.items():
            cfg = te.TrialConfig(reward=reward, **{field: value})
            try:
                te.check_method_options(cfg, method)
            except ValueError:
                continue
            if field in te.reads(cfg, method):
                ok.add(field)
        accepted[method] = ok
    tpo_family = {"tpo", "tpo_no_anchor", "tpo_token"}
    grpo_family = {m for m in te.METHODS if m.startswith("grpo")}
    for method, ok in accepted.items():
        expected = set(values) if method in tpo_family else {"std_floor", "std_shrink"} if method in grpo_family \
            else set()
        if method == "tpo_no_anchor":  # its objective takes kl_budget, but a budget is a KL to the anchor it drops
            expected -= {"tpo_kl_budget"}
        assert ok == expected, (method, ok)


def test_a_finding_calls_a_difference_clear_only_by_its_interval_and_never_on_smoke():
    def curve(values):
        return Curve(np.arange(len(values)), *mean_se(values), values)

    data = {"a": curve(np.full((10, 3), 0.2) + [0.0, 0.01, 0.02]), "ref": curve(np.full((10, 3), 0.5))}
    labels = {"a": "A", "ref": "R"}
    assert oq.finding(data, "a", "ref", labels, 0.01).count("a clear difference") == 2
    smoke = oq.finding(data, "a", "ref", labels, 0.01, decides=False)
    assert "clear difference" not in smoke and smoke.count("too short to decide") == 2


def test_projection_settings_are_distinct_and_forward_kl_is_optional(tmp_path):
    exp = load("token-projections")
    with pytest.raises(ValueError, match="'alpha0.50' is the same setting as 'alpha0.5'"):
        make_config(exp, "smoke", overrides=["settings=alpha0.5,alpha0.50"])
    with pytest.raises(ValueError, match="tpo_eta=2.0: not read by this run .a KL budget .tpo_kl_budget > 0. "
                                         "chooses TPO's η per group, and no other unit reads it"):
        make_config(exp, "smoke", overrides=["settings=kl1,kl2", "tpo_eta=2"])
    # the forward_kl unit reads it (was refused: the kl1 unit does not)
    assert make_config(exp, "smoke", overrides=["settings=forward_kl,kl1", "tpo_eta=2"]).tpo_eta == 2
    out = run_experiment(exp.NAME, "smoke", out=tmp_path / "p", progress=False, quiet=True, threads=1,
                         overrides=["settings=reverse_kl,js", "episodes=2"])
    assert "vs reverse KL" in write_report(out).read_text()


def test_a_finite_gradient_has_a_finite_norm():
    """Group PG at tpo_eta=1e-30 has gradients up to ~1e30, finite in float32, whose squares are not: grad_norm
    was inf and the runner ended a healthy unit as diverged at step 0."""
    from targetpo.tokens import engine as te

    cfg = te.TrialConfig(reward="terminal", length=3, batch=8, k=4, episodes=2, tpo_eta=1e-30)
    out = te.run_trial(cfg, "group_pg", [0, 1], check=lambda ep, values: None)
    assert np.isfinite(out["grad_norm"]).all() and out["grad_norm"].max() > 1e25
