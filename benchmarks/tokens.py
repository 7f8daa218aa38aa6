"""Speed of the token-experiment engine (targetpo.tokens.engine).

Three measurements:
1. seconds per episode per seed of each method (one rollout batch + its epochs), token-level methods on the dense
   task (reverse copy, bag reward) and sequence-level ones on the terminal task, both at H = 10, V = 2, B = 100,
   K = 8, with S seeds vectorised; sequence-level costs are measured from a fresh (near-uniform) policy, their
   worst case (a confident policy repeats answers, which the engine computes once).
2. the configuration of the authors' `transformer --smoke` preset end to end (2 seeds × 50 episodes, H = 10,
   V = 2, B = 100, K = 8; ppo, dg, tpo_token, grpo_token), median of --repeats runs, to compare with the authors'
   JAX code (169–173 s on a quiet 2-core machine by its own "Completed in", compile included;
   docs/experiments.md §Compute).
3. side by side in one process: one TPO_token episode of the engine vs the same episode computed the way the
   authors' code does (a full forward per sampled token, no KV cache; one forward per prefix state in training),
   so the ratio is robust to a busy machine.

    python benchmarks/tokens.py                        # print
    python benchmarks/tokens.py --write BENCHMARKS.md  # also replace this benchmark's section there

With ``--against OTHER_SRC`` it only times measurement 2, in fresh interpreters alternating between this checkout's
``src`` and another version's (e.g. ``git archive COMMIT src | tar -x -C /tmp/old``, then ``--against
/tmp/old/src``), and checks that both give the same errors bit for bit.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from _args import Parser, positive_int, src_folder  # benchmarks/ is on sys.path when run as a script
from _timing import run_timed
from _markdown import replace_section

from targetpo import objectives as obj
from targetpo.tokens import engine as te
from targetpo.tokens import transformer as tfm
from targetpo.optim import make_optimizer
from targetpo.tokens import tasks

SECTION = "## Token experiments: engine speed"
TOKEN_METHODS = ("tpo_token", "grpo_token", "ppo", "dg")
SEQUENCE_METHODS = ("tpo", "grpo", "ppo@interactions")
# The authors' `transformer --smoke` preset (2 seeds × 50 episodes of TOKEN_METHODS); _SMOKE_CHILD repeats it as text.
SMOKE = te.TrialConfig(task="reverse_copy", reward="bag", length=10, vocab=2, batch=100, k=8, episodes=50)
# The authors' code, 3 runs on the quiet 2-core Intel machine (BENCHMARKS.md, docs/experiments.md §Compute); the
# printed ratio holds on that machine only: on another, time both with --authors.
JAX_SMOKE_S = (169, 173)


def episode_seconds(cfg: te.TrialConfig, method: str, seeds: list[int], episodes: int) -> float:
    """Median seconds of one episode (after one warm-up episode) of `method` for the S seeds."""
    marks: list[float] = []
    te.run_trial(te.trial_config(cfg, episodes=episodes + 1), method, seeds, advance=lambda: marks.append(time.perf_counter()))
    return statistics.median(b - a for a, b in zip(marks, marks[1:]))


def per_seed_costs(seeds: int, episodes: int) -> dict[str, float]:
    ids = list(range(seeds))
    out = {}
    dense = te.TrialConfig(task="reverse_copy", reward="bag", length=10, vocab=2, batch=100, k=8)
    for m in TOKEN_METHODS:
        out[f"{m} (dense)"] = episode_seconds(dense, m, ids, episodes) / seeds
    terminal = te.TrialConfig(task="reverse_copy", reward="terminal", length=10, vocab=2, batch=100, k=8)
    for spec in SEQUENCE_METHODS:
        m, _, match = spec.partition("@")
        cfg = te.trial_config(terminal, match=match or "prompts")
        out[f"{spec} (terminal)"] = episode_seconds(cfg, m, ids, episodes) / seeds
    return out


def authors_smoke(repeats: int) -> tuple[float, list[float], dict[str, float]]:
    """Median wall seconds of `repeats` runs of the configuration (and all of them), and the 2-seed mean error
    at episode 50 of each method (the same in every run: the engine is deterministic)."""
    walls, runs = [], []
    for _ in range(repeats):
        finals = {}
        t0 = time.perf_counter()
        for m in TOKEN_METHODS[::-1]:
            finals[m] = float(te.run_trial(SMOKE, m, [0, 1])["error"][-1].mean())
        walls.append(time.perf_counter() - t0)
        runs.append(finals)
    if any(r != runs[0] for r in runs):
        raise RuntimeError(f"the smoke configuration gave different results in different runs: {runs}")
    return statistics.median(walls), walls, runs[0]


# One run of the smoke configuration in a fresh interpreter: wall and CPU seconds and every method's error curve.
_SMOKE_CHILD = """
import json, sys, time, torch
from targetpo.tokens import engine as te
torch.set_num_threads(int(sys.argv[1]))
cfg = te.TrialConfig(task="reverse_copy", reward="bag", length=10, vocab=2, batch=100, k=8, episodes=50)
t0, c0 = time.perf_counter(), time.process_time()
errors = {m: te.run_trial(cfg, m, [0, 1])["error"].tolist() for m in ("dg", "grpo_token", "tpo_token", "ppo")}
print(json.dumps({"wall": time.perf_counter() - t0, "cpu": time.process_time() - c0, "errors": errors}))
"""


def _runner_child(src: str, jobs: int) -> dict:
    """The smoke configuration as `targetpo run token-dense` runs it with --jobs `jobs` (its four methods are the
    run's units), the whole command in a fresh interpreter: wall seconds, CPU seconds of the command and its
    workers, and every method's error curve read back from metrics.jsonl."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "targetpo.cli", "run", "token-dense", "--preset", "cpu", "--seeds", "2",
               "--out", tmp, "--force", "--no-progress", "--no-report", "--jobs", str(jobs), *SMOKE_OVERRIDES]
        out, wall, cpu = run_timed(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": src})
        if out.returncode:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{out.stderr.strip()}")
        errors: dict[str, list] = {}
        for line in (Path(tmp) / "metrics.jsonl").read_text().splitlines():
            r = json.loads(line)
            if "error" in r:
                errors.setdefault(r["unit"].split("/", 1)[1], []).append(r["error"])
    return {"wall": wall, "cpu": cpu, "errors": {m: errors[m] for m in TOKEN_METHODS[::-1]}}


# token-dense's cpu preset with these overrides (and --seeds 2) is the smoke configuration.
SMOKE_OVERRIDES = ("episodes=50", "vocabs=2", f"methods={','.join(TOKEN_METHODS)}")


def _authors_child(repo: str, python: str) -> dict:
    """One run of the authors' own `transformer --smoke` (their public JAX repository at `repo`, run with the
    interpreter `python` of a separate environment; nothing of it is imported here): its own "Completed in"
    seconds (compilation included) and the CPU seconds of the whole command."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [python, "-m", "tpo.cli", "transformer", "--smoke", "--no-wandb", "--save-dir", tmp]
        out, _, cpu = run_timed(cmd, capture_output=True, text=True, cwd=tmp,
                                env={**os.environ, "PYTHONPATH": str(Path(repo).resolve() / "src")})
    done = re.findall(r"Completed in ([0-9.]+)s", out.stdout)
    if out.returncode or len(done) != 1:
        raise RuntimeError(f"{' '.join(cmd)} failed or printed no single 'Completed in':\n{out.stdout[-2000:]}"
                           f"{out.stderr[-2000:]}")
    return {"wall": float(done[0]), "cpu": cpu}


AUTHORS = "authors' JAX"


def smoke_against(other_src: str | None, threads: int, repeats: int, jobs: int = 0,
                  authors: tuple[str, str] | None = None) -> dict[str, dict]:
    """The smoke configuration `repeats` times for this checkout ("new") and `other_src` ("old"), alternating
    (the order swapped every repeat), each run in a fresh interpreter; median wall and CPU seconds of each. With
    `jobs` > 0, also this checkout's `targetpo run token-dense ... --jobs N` ("new, N jobs") in the same rounds;
    with `authors` = (repo, python), also the authors' own code (its "Completed in" as the wall time).
    `other_src` must hold the targetpo package (_args.src_folder checks it)."""
    srcs = {"new": str(Path(__file__).resolve().parents[1] / "src")}
    if other_src is not None:
        srcs["old"] = str(Path(other_src).resolve())
    names = ((["old"] if other_src else []) + ["new"] + ([f"new, {jobs} jobs"] if jobs else [])
             + ([AUTHORS] if authors else []))
    runs: dict[str, list[dict]] = {k: [] for k in names}
    for r in range(repeats):
        for name in (names if r % 2 == 0 else names[::-1]):
            if name == AUTHORS:
                runs[name].append(_authors_child(*authors))
            elif name.startswith("new, "):
                runs[name].append(_runner_child(srcs["new"], jobs))
            else:
                out = subprocess.run([sys.executable, "-c", _SMOKE_CHILD, str(threads)], capture_output=True, text=True,
                                     env={**os.environ, "PYTHONPATH": srcs[name]})
                if out.returncode:
                    raise RuntimeError(f"the {name} tree ({srcs[name]}) failed:\n{out.stderr.strip()}")
                runs[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(f"{name} run {r}: {runs[name][-1]['wall']:.1f} s wall, {runs[name][-1]['cpu']:.1f} s CPU", flush=True)
    # Each tree must repeat itself bit for bit; "new, N jobs" must give "new"'s curves (the same engine), as
    # metrics.jsonl writes them (%.7g).
    def logged(errors: dict) -> dict:
        return {m: [[float(f"{v:.7g}") for v in row] for row in rows] for m, rows in errors.items()}

    out = {}
    for name, rs in runs.items():
        out[name] = {"wall_s": statistics.median(x["wall"] for x in rs), "cpu_s": statistics.median(x["cpu"] for x in rs),
                     "walls_s": [x["wall"] for x in rs]}
        if name != AUTHORS:  # the authors' curves are theirs (JAX's own random streams): nothing to compare
            ref = logged(runs["new" if name.startswith("new") else name][0]["errors"])
            out[name]["repeatable"] = all(logged(x["errors"]) == ref for x in rs)
    if other_src:
        out["old"]["identical_to_new"] = runs["old"][0]["errors"] == runs["new"][0]["errors"]
    return out


# ----------------------------------------------------------------------------- the authors' way, in torch

def _reference_tpo_token_episode(params, opt, spec, cfg, prompts, gen) -> None:
    """One TPO_token episode computed like the authors' JAX code: a full forward of the zero-padded [B, 2H]
    buffer for every sampled token, and one forward per prefix state (B·H sequences of 2H) in training."""
    s, b, h = prompts.shape
    with torch.no_grad():
        buf = torch.zeros(s, b, 2 * h, dtype=torch.long)
        buf[:, :, :h] = prompts
        states, cands, cand_lps = [], [], []
        for t in range(h):
            logp = tfm.forward(params, buf, spec)[:, :, h - 1 + t]
            c = te.sample_tokens(logp, torch.rand(s, b, cfg.k, generator=gen))
            states.append(buf.clone())
            cands.append(c)
            cand_lps.append(logp.gather(-1, c))
            buf[:, :, h + t] = c[..., 0]
        cand, cand_lp = torch.stack(cands, 2), torch.stack(cand_lps, 2)
        rewards = tasks.candidate_rewards(cand, tasks.targets(prompts, cfg.task, cfg.vocab), cfg.reward)
        flat = torch.stack(states, 2).view(s, b * h, 2 * h)
        pos = (h - 1 + torch.arange(h)).repeat(b)
    names = list(params)
    for _ in range(cfg.epochs):
        full = tfm.forward(params, flat, spec)                                      # [S, B·H, 2H, V]
        tok = full[:, torch.arange(b * h), pos].view(s, b, h, spec.vocab)
        loss = obj.tpo_token_loss(tok, cand, cand_lp, rewards).loss * s
        grads = torch.autograd.grad(loss, [params[k] for k in names])
        opt.step(params, dict(zip(names, grads)))


def side_by_side(seeds: int, repeats: int) -> tuple[float, float]:
    """Median seconds of one TPO_token episode: (engine, authors' way), interleaved."""
    cfg = te.TrialConfig(task="reverse_copy", reward="bag", length=10, vocab=2, batch=100, k=8)
    spec = te.model_spec(cfg)
    ids = list(range(seeds))
    ours, ref = [], []
    p1, p2 = tfm.init_params(spec, ids), tfm.init_params(spec, ids)
    for p in (*p1.values(), *p2.values()):
        p.requires_grad_(True)
    o1 = make_optimizer("optax", p1, tfm.param_info(spec), cfg.lr)
    o2 = make_optimizer("optax", p2, tfm.param_info(spec), cfg.lr)
    gens = te._generators(ids, 2, "cpu")
    gen = torch.Generator().manual_seed(0)
    names = list(p1)
    for r in range(repeats + 1):
        prompts = tasks.sample_prompts(te._generators([r], 1, "cpu") * seeds, cfg.batch, cfg.length, cfg.vocab)
        t0 = time.perf_counter()
        batch = te.collect(p1, spec, cfg, "tpo_token", prompts, gens)
        for _ in range(cfg.epochs):
            grads = torch.autograd.grad(te.loss_fn(p1, spec, cfg, "tpo_token", batch), [p1[k] for k in names])
            o1.step(p1, dict(zip(names, grads)))
        t1 = time.perf_counter()
        _reference_tpo_token_episode(p2, o2, spec, cfg, prompts, gen)
        t2 = time.perf_counter()
        if r:
            ours.append(t1 - t0)
            ref.append(t2 - t1)
    return statistics.median(ours), statistics.median(ref)


def main():
    ap = Parser(description=__doc__)
    ap.add_argument("--seeds", type=positive_int, default=4, help="seeds vectorised per episode for the per-seed costs")
    ap.add_argument("--episodes", type=positive_int, default=5, help="timed episodes per method (median reported)")
    ap.add_argument("--threads", type=positive_int, default=2, help="torch CPU threads")
    ap.add_argument("--repeats", type=positive_int, default=3, help="runs of the authors' smoke configuration "
                    "(median reported)")
    ap.add_argument("--write", default=None, help=f"markdown file whose '{SECTION}' section is replaced")
    ap.add_argument("--against", default=None, type=src_folder, metavar="OTHER_SRC",
                    help="only time the smoke configuration, alternating with another version's src folder")
    ap.add_argument("--jobs", type=positive_int, default=None, help="with --against or --authors: also time this checkout's "
                    "`targetpo run token-dense` of the smoke configuration with --jobs N (its four methods in N worker "
                    "processes), the whole command")
    ap.add_argument("--authors", default=None, metavar="REPO", help="also time the authors' own `transformer "
                    "--smoke` in the same rounds: a checkout of their public repository (run, never imported here)")
    ap.add_argument("--authors-python", default=None, metavar="PYTHON",
                    help="with --authors: the interpreter of a separate environment holding jax, flax and optax")
    args = ap.parse_args()
    if args.authors and not (Path(args.authors) / "src" / "tpo" / "cli.py").is_file():
        ap.error(f"--authors {args.authors}: not a checkout of the authors' repository (no src/tpo/cli.py)")
    if args.authors and not args.authors_python:
        ap.error("--authors needs --authors-python: the interpreter of an environment with jax, flax and optax")
    if args.against or args.authors:
        authors = (args.authors, args.authors_python) if args.authors else None
        res = smoke_against(args.against, args.threads, args.repeats, args.jobs or 0, authors)
        print(f"| version | wall (s), median of {args.repeats} | runs (s) | CPU (s) |\n|---|---|---|---|")
        for name, r in res.items():
            print(f"| {name} | {r['wall_s']:.1f} | {' / '.join(f'{w:.1f}' for w in r['walls_s'])} | {r['cpu_s']:.1f} |")
        base = "old" if args.against else "new"
        for name, r in res.items():
            same = "" if name == AUTHORS else (f"; each run the same curves as "
                                               f"{'itself' if name == 'old' else 'new'}: {r['repeatable']}")
            print(f"{base} / {name} wall: {res[base]['wall_s'] / r['wall_s']:.2f}×{same}")
        if AUTHORS in res:
            for name in (n for n in res if n != AUTHORS):
                print(f"{AUTHORS} / {name} wall: {res[AUTHORS]['wall_s'] / res[name]['wall_s']:.1f}×")
        if args.against:
            print(f"old and new error curves identical: {res['old']['identical_to_new']}")
        print(json.dumps(res))
        return
    torch.set_num_threads(args.threads)

    costs = per_seed_costs(args.seeds, args.episodes)
    ours, ref = side_by_side(2, max(3, args.episodes))
    smoke_s, smoke_all, finals = authors_smoke(args.repeats)
    cmd = (f"python benchmarks/tokens.py --seeds {args.seeds} --episodes {args.episodes} --threads {args.threads} "
           f"--repeats {args.repeats}")
    rows = [f"| {k} | {v:.3f} |" for k, v in costs.items()]
    section = "\n".join([
        SECTION, "",
        f"torch {torch.__version__}, {args.threads} CPU threads, float32. Per-episode times are medians of "
        f"{args.episodes} episodes after a warm-up, with {args.seeds} seeds vectorised, divided by the seeds. "
        "Sequence-level costs are from a fresh, near-uniform policy (the worst case: a confident policy repeats "
        "answers and prompts, which are computed once).", "",
        f"Command: `{cmd}`", "",
        "| method (task, H = 10, V = 2, B = 100, K = 8) | seconds per episode per seed |", "|---|---|", *rows, "",
        "The authors' `transformer --smoke` configuration (2 seeds × 50 episodes, H = 10, V = 2, B = 100, K = 8; "
        f"ppo, dg, tpo_token, grpo_token), in one process (interpreter start-up excluded), median of {args.repeats} "
        f"runs ({', '.join(f'{w:.1f}' for w in smoke_all)} s):", "",
        "| | wall (s) | vs authors' JAX, timed on the 2-core Intel machine (169–173 s; elsewhere time it with "
        "--authors) |", "|---|---|---|",
        f"| targetpo engine | {smoke_s:.1f} | {JAX_SMOKE_S[0] / smoke_s:.1f}–{JAX_SMOKE_S[1] / smoke_s:.1f}× faster |", "",
        "Error at episode 50 (2-seed mean): " + ", ".join(f"{m} {v:.3f}" for m, v in finals.items())
        + " (the authors' run: tpo_token ≈ 0.01, the others 0.37–0.43).", "",
        "One TPO_token episode (2 seeds), interleaved in one process: engine "
        f"{ours * 1e3:.0f} ms vs {ref * 1e3:.0f} ms computed the authors' way (full forward per sampled token, one "
        f"forward per prefix state in training) — **{ref / ours:.1f}×**.", ""])
    print(section)
    print(json.dumps({"per_seed_s": costs, "smoke_s": smoke_s, "smoke_runs_s": smoke_all, "side_by_side_s": [ours, ref],
                      "finals": finals}))
    if args.write:
        replace_section(args.write, SECTION, section)


if __name__ == "__main__":
    main()
