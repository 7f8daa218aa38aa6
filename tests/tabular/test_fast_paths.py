"""The tabular fast paths. tabular-single and tabular-multi run their methods side by side (run_units) with the
numbers of each method alone, bit for bit. The multi-context loop's per-context closed forms (multi.context_stats_,
multi.population_step_, multi.misalignment_from_sums) give the updates and metrics of the plain formulas —
exact_update (TPO's from tpo_target) → misalignment → normalized_step — to rounding: float64 to 1e-12 over a
whole run, float32 to the precision of float32; how many steps it computes between writes changes no number."""

import pytest
import torch

from targetpo.tabular import multi, single
from targetpo.objectives.tpo import one_hot_inv_lambda
from targetpo.tabular.bandit import correct_direction, exact_update, misalignment, normalized_step

EVERY = (-2, -1)


def _logits(dtype, scale=3.0, seed=0) -> torch.Tensor:
    """[seeds, N, A] logits (the formulas' layout); multi's functions take them as [seeds, A, N]."""
    return scale * torch.randn(4, 7, 10, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def _fast_step(logits, method, lr, eta, inv_lam, shift_by_max=False):
    ws = multi.Workspace(logits.transpose(-1, -2).contiguous())
    ws.shift_by_max = shift_by_max
    multi.context_stats_(ws)
    sums = logits.new_empty(3, logits.shape[0])
    multi.population_step_(ws, method, lr, eta, inv_lam, sums)
    return ws.logits.transpose(-1, -2), multi.misalignment_from_sums(*sums)


def _plain_step(logits, method, lr, eta):
    probs = torch.softmax(logits, dim=-1)
    g = exact_update(method, probs, eta=eta)
    return normalized_step(logits, g, lr, dims=EVERY), misalignment(g, correct_direction(probs), dims=EVERY)


@pytest.mark.parametrize("method", multi.METHODS)
@pytest.mark.parametrize("eta", [1.0, 0.3, 0.01])  # 0.01: λ = e^333, beyond float32 (the update uses 1/λ)
@pytest.mark.parametrize("scale", [1.0, 12.0])  # 12: contexts with π(y) within 1e-5 of 0 or of 1
@pytest.mark.parametrize("shift_by_max", [False, True])
def test_population_step_is_the_plain_update_in_float64(method, eta, scale, shift_by_max):
    logits = _logits(torch.float64, scale)
    new, mis = _fast_step(logits, method, 0.1, eta, one_hot_inv_lambda(10, eta), shift_by_max)
    ref_logits, ref_mis = _plain_step(logits, method, 0.1, eta)
    # TPO's per-context constant b is left out of the logits (no probability sees it): compare the policies.
    assert torch.allclose(torch.softmax(new, -1), torch.softmax(ref_logits, -1), rtol=1e-11, atol=1e-15)
    assert torch.allclose(mis, ref_mis, rtol=1e-9, atol=1e-12)
    if method != "tpo":
        assert torch.allclose(new, ref_logits, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("eta", [0.01, 1e-4])
def test_tpo_at_a_small_eta_does_not_overflow(eta):
    """λ = e^{(10/3)/η} is e^333 at η = 0.01 (inf in float32) and beyond a float64 at 1e-4: the run computes in 1/λ,
    so TPO trains as the plain formulas say (a sharp target, error falling) instead of diverging at step 0."""
    cfg = multi.Config(seeds=2, steps=30, eta=eta)
    ctx = _Log()
    multi.run_unit(cfg, "tpo", ctx)
    assert len(ctx.records) == cfg.steps and all(torch.isfinite(r[k]).all() for r in ctx.records for k in r)
    logits = torch.randn(cfg.seeds, cfg.contexts, cfg.actions, generator=torch.Generator().manual_seed(cfg.seed))
    logits = logits.double()
    for rec in ctx.records:
        logits, _ = _plain_step(logits, "tpo", cfg.lr, eta)
        err = 1.0 - torch.softmax(logits, -1)[..., 0].mean(dim=-1)
        assert torch.allclose(rec["error"].double(), err, rtol=1e-4, atol=1e-7)
    assert (ctx.records[-1]["error"] < ctx.records[0]["error"]).all()


def test_tpo_keeps_the_anchor_epsilon():
    """q ∝ (π + 1e-8)·w: without the ε a wrong action with π_a ≪ 1e-8 would get q_a ≈ 0; with it the update
    matches tpo_target's, which the authors' code uses."""
    logits = _logits(torch.float64, 30.0)
    assert torch.softmax(logits, -1).min() < 1e-10
    new, _ = _fast_step(logits, "tpo", 0.1, 1.0, one_hot_inv_lambda(10))
    no_eps = multi.EPS
    try:
        multi.EPS = 0.0
        other, _ = _fast_step(logits, "tpo", 0.1, 1.0, one_hot_inv_lambda(10))
    finally:
        multi.EPS = no_eps
    ref, _ = _plain_step(logits, "tpo", 0.1, 1.0)
    ref_p = torch.softmax(ref, -1)
    assert torch.allclose(torch.softmax(new, -1), ref_p, rtol=1e-10, atol=1e-300)
    assert not torch.allclose(torch.softmax(other, -1), ref_p, rtol=1e-10, atol=1e-300)


class _Log:
    def __init__(self):
        self.records = []

    def log(self, rec):
        self.records.append({k: torch.as_tensor(v).clone() for k, v in rec.items()})

    def advance(self, n=1):
        pass


@pytest.mark.parametrize("method", multi.METHODS)
@pytest.mark.parametrize("lr", [0.1, 1.0])  # the paper's α (softmax shifted by logit_y), and one shifted by the max
def test_multi_run_unit_follows_the_plain_loop(method, lr):
    cfg = multi.Config(seeds=2, steps=50, lr=lr)
    ctx = _Log()
    multi.run_unit(cfg, method, ctx)
    assert len(ctx.records) == cfg.steps
    gen = torch.Generator().manual_seed(cfg.seed)
    logits = torch.randn(cfg.seeds, cfg.contexts, cfg.actions, generator=gen, dtype=torch.float32).double()
    for t in range(cfg.steps):  # the plain formulas in float64: the float32 run agrees to float32 precision
        logits, mis = _plain_step(logits, method, cfg.lr, cfg.eta)
        err = 1.0 - torch.softmax(logits, -1)[..., 0].mean(dim=-1)
        rec = ctx.records[t]
        assert torch.allclose(rec["error"].double(), err, rtol=1e-4, atol=1e-7), (t, rec["error"], err)
        assert torch.allclose(rec["misalignment"].double(), mis, rtol=1e-3, atol=2e-6), (t, rec["misalignment"], mis)


@pytest.mark.parametrize("method", ["tpo", "grpo", "ce"])
def test_multi_records_do_not_depend_on_the_chunk(method, monkeypatch):
    """The metrics are finished and logged once per CHUNK steps: any chunk (one step, one that does not divide the
    steps, more than the steps) gives the same records, bit for bit, every step once and in order."""
    cfg = multi.Config(seeds=3, steps=23)
    runs = {}
    for chunk in (1, 5, 100):
        monkeypatch.setattr(multi, "CHUNK", chunk)
        runs[chunk] = _Log()
        multi.run_unit(cfg, method, runs[chunk])
    assert [r["step"].item() for r in runs[1].records] == list(range(cfg.steps))
    for chunk in (5, 100):
        assert all(torch.equal(a[k], b[k]) for a, b in zip(runs[1].records, runs[chunk].records, strict=True)
                   for k in a), chunk


def test_the_logit_y_shift_is_taken_only_where_it_stays_finite():
    cfg = multi.PRESETS["paper"]
    logits = torch.randn(cfg.seeds, cfg.contexts, cfg.actions, generator=torch.Generator().manual_seed(cfg.seed))
    ws = multi.Workspace(logits.transpose(-1, -2).contiguous())
    assert multi.shift_by_logit_y_is_safe(ws, cfg.lr, multi.CHUNK)  # the paper's protocol: the cheap shift
    assert not multi.shift_by_logit_y_is_safe(ws, 1.0, multi.CHUNK)  # 100 steps of α = 1 could open a gap of 141
    ws.logits[0, 3, 7] = ws.logits[0, 0, 7] + 45.0  # e² = e^90 overflows float32, not float64
    assert not multi.shift_by_logit_y_is_safe(ws, cfg.lr, 1)
    assert multi.shift_by_logit_y_is_safe(multi.Workspace(ws.logits.double()), cfg.lr, 1)
    ws.shift_by_max = False
    _, _, _, w = multi.context_stats_(ws)
    assert not torch.isfinite(w).all()  # what the check avoids
    ws.shift_by_max = True
    s, p, r, w = multi.context_stats_(ws)
    assert all(torch.isfinite(t).all() for t in (s, p, r, w)) and r[0, 7] > 0.99


@pytest.mark.parametrize("shift_by_max", [False, True])
def test_context_stats_are_the_softmax_sums(shift_by_max):
    logits = _logits(torch.float64, 12.0).transpose(-1, -2).contiguous()
    logits[:, 0, 0] += 200.0  # contexts with π(y) within 1e-20 of 1: r keeps its digits where 1 − p is 0
    ws = multi.Workspace(logits)
    ws.shift_by_max = shift_by_max
    s, p, r, w = multi.context_stats_(ws)
    e = ws.e
    probs = torch.softmax(logits, dim=-2)
    assert torch.allclose(s.unsqueeze(-2) * e, probs, rtol=1e-13, atol=0)
    assert torch.allclose(p, probs[..., 0, :], rtol=1e-13, atol=0)
    assert torch.allclose(r, probs[..., 1:, :].sum(dim=-2), rtol=1e-13, atol=0)
    assert torch.allclose(w, probs[..., 1:, :].square().sum(dim=-2), rtol=1e-13, atol=0)
    assert (r[:, 0] < 1e-15).all() and (r > 0).all() and (1.0 - p[:, 0] == 0).all()


def _assert_each_method_as_alone(module, cfg, *batches: dict) -> None:
    """Every method's records in each batch of `run_units` logs are, bit for bit, those it logs alone (a batch
    shares draws and op calls, never a number)."""
    for m in module.METHODS:
        alone = _Log()
        module.run_unit(cfg, m, alone)
        assert len(alone.records) == cfg.steps
        for logs in batches:
            if m in logs:
                assert all(a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
                           for a, b in zip(alone.records, logs[m].records, strict=True)), m


def test_single_methods_side_by_side_equal_each_method_alone():
    cfg = single.PRESETS["smoke"]
    together = {m: _Log() for m in single.METHODS}
    single.run_units(cfg, list(single.METHODS), together)
    pair = {m: _Log() for m in ("grpo", "pg")}
    single.run_units(cfg, ["grpo", "pg"], pair)
    _assert_each_method_as_alone(single, cfg, together, pair)


@pytest.mark.parametrize("lr", [0.1, 0.28, 1.0])  # 0.28: chunks where some methods shift by the max, others not
def test_multi_methods_side_by_side_equal_each_method_alone(lr, monkeypatch):
    cfg = multi.Config(seeds=3, steps=400, lr=lr)
    together = {m: _Log() for m in multi.METHODS}
    seen = set()
    stats = multi._softmax_stats_

    def spy(ws, methods, uniform):
        seen.add(uniform)
        return stats(ws, methods, uniform)

    monkeypatch.setattr(multi, "_softmax_stats_", spy)
    multi.run_units(cfg, list(multi.METHODS), together)
    assert seen == ({True, False} if lr == 0.28 else {True})  # the case the test is for is reached
    pair = {m: _Log() for m in ("tpo", "pg")}
    multi.run_units(cfg, ["tpo", "pg"], pair)
    _assert_each_method_as_alone(multi, cfg, together, pair)


def _final_error(dtype, unit: str, lr: float = 1.0, steps: int = 300, seeds: int = 4) -> float:
    gen = torch.Generator().manual_seed(42)
    logits = torch.randn(seeds, 100, 10, generator=gen).to(dtype).transpose(-1, -2).contiguous()
    ws, inv_lam = multi.Workspace(logits), one_hot_inv_lambda(10, 1.0)
    sums = torch.empty(3, seeds, dtype=dtype)
    for _ in range(steps):
        ws.shift_by_max = not multi.shift_by_logit_y_is_safe(ws, lr, 1)
        multi.context_stats_(ws)
        multi.population_step_(ws, unit, lr, 1.0, inv_lam, sums)
    return float(multi.context_stats_(ws)[2].mean())


@pytest.mark.parametrize("unit", multi.METHODS)
def test_tabular_multi_float32_follows_float64_down_to_tiny_errors(unit):
    """y's step was a·π_y plus a compensating term, two large float32 additions that cancel: at lr = 1 every method
    stalled near 2e-8 where float64 reaches 1e-12 (TPO's floor, 3.3e-9, is its ε anchor), so 'TPO ends lowest'
    passed on rounding noise. With y's step added on its own, float32 tracks float64."""
    f32, f64 = _final_error(torch.float32, unit), _final_error(torch.float64, unit)
    assert f64 < 1e-8
    assert abs(f32 - f64) <= 0.01 * f64


@pytest.mark.parametrize("method", multi.METHODS)
def test_multi_logs_tiny_errors_to_float32_precision(method):
    """The logged error is mean Σ_{a≠y} π_a, not 1 − mean π_y: once π_y rounds to 1 in float32 the latter reads 0
    (or a multiple of 6e-8) where the float64 loop is at 1e-9..1e-12."""
    cfg = multi.Config(seeds=2, steps=300, lr=1.0)
    ctx = _Log()
    multi.run_unit(cfg, method, ctx)
    gen = torch.Generator().manual_seed(cfg.seed)
    logits = torch.randn(cfg.seeds, cfg.contexts, cfg.actions, generator=gen, dtype=torch.float32).double()
    for _ in range(cfg.steps):
        logits, _ = _plain_step(logits, method, cfg.lr, cfg.eta)
    p = torch.softmax(logits, -1)
    err = p[..., 1:].sum(-1).mean(-1)  # Σ_{a≠y} π_a in float64 (y = 0 in the plain loop)
    assert (err < 1e-7).all(), err
    assert torch.allclose(ctx.records[-1]["error"].double(), err, rtol=0.02, atol=0), (ctx.records[-1]["error"], err)
