"""MNIST bandit: per-step training cost with and without vectorising seeds (and methods) into one network.

Measured side by side in one process on the same data (the shared MNIST test split), interleaved, medians:
- stacked: all S seeds × M methods as one batched network (what `targetpo run mnist` does);
- seeds only: one batched network of S seeds per method, M Python steps per update;
- none: one network per (seed, method), S·M Python steps per update (a plain per-run loop).
Evaluation is excluded (the same for every layout). Prints a markdown table; --write appends it to a file.

With ``--parts``, where the seconds of the stacked update go instead: the minibatch gather, the forward pass,
acting, each method's loss, the backward pass and Adam, each timed on its own (a CPU op returns when it is done),
and one evaluation on the test digits spread over its `eval_every` updates. The parts are `bandit_step`'s own
code path, step by step: the script checks that its parameters end bit for bit where `bandit_step`'s do.

With ``--compile``, the stacked update as `bandit_step` runs it (eager) against the same update with its
`forward_losses` (forward pass, acting and losses) under ``torch.compile`` (backward and Adam as before),
interleaved: ms per update, the first compiled call's seconds (the compilation), and how far the two runs'
parameters are apart at the end (the compiled kernels round differently, so the runs part). It needs a C++
compiler.

    python benchmarks/mnist.py --data-dir ../shared/data/mnist --seeds 20 --threads 2
    python benchmarks/mnist.py --data-dir ../shared/data/mnist --seeds 20 --threads 2 --parts
    python benchmarks/mnist.py --data-dir ../shared/data/mnist --seeds 20 --threads 2 --compile --steps 50
"""

from __future__ import annotations

import statistics
import time
from dataclasses import replace

import torch
from _args import Parser, positive_int  # benchmarks/ is on sys.path when run as a script

from targetpo.mnist import train as E
from targetpo.mnist import data as D
from targetpo.mnist.bandit import BatchStream, bandit_loss, log_softmax, sample_actions
from targetpo.mnist.mlp import bank_forward


def make(cfg, seeds: list[int], methods: list[str]):
    c = replace(cfg, seed=seeds[0], seeds=len(seeds), methods=tuple(methods))
    params, opt = E.init_policies(c, len(methods), inputs=PIXELS)
    return params, opt, methods, BatchStream(seeds, N_TRAIN, cfg.batch)


def run(setup, data, steps: int, eta: float) -> None:
    params, opt, methods, stream = setup
    for _ in range(steps):
        idx, noise = stream.next()
        E.bandit_step(params, opt, methods, *E.gather_batch(data, idx), noise, eta)


def layouts(cfg, seeds: list[int], data, steps: int, repeats: int, threads: int) -> str:
    """Markdown: ms per update of the stacked, seeds-only and unvectorised layouts (interleaved, medians)."""
    methods = list(cfg.methods)
    layouts = {
        "stacked (S seeds × M methods, one network)": [make(cfg, seeds, methods)],
        "seeds only (one S-seed network per method)": [make(cfg, seeds, [m]) for m in methods],
        # One (seed, method) network per Python step; S·M of them make one update of the whole experiment.
        "none (one network per seed and method)": [make(cfg, [0], [m]) for m in methods],
    }
    scale = {k: (len(seeds) if k.startswith("none") else 1) for k in layouts}
    times = {k: [] for k in layouts}
    for k, setups in layouts.items():  # warm-up
        for s in setups:
            run(s, data, 3, cfg.eta)
    for _ in range(repeats):
        for k, setups in layouts.items():
            t = time.perf_counter()
            for s in setups:
                run(s, data, steps, cfg.eta)
            times[k].append((time.perf_counter() - t) / steps * scale[k])
    base = statistics.median(times["stacked (S seeds × M methods, one network)"])
    lines = [f"Per-update training cost of the `mnist` paper configuration ({len(seeds)} seeds × "
             f"{len(methods)} methods, B = {cfg.batch}, MLP 784-50-50-10, Adam), {threads} torch threads, torch {torch.__version__}; "
             f"median of {repeats} interleaved repeats of {steps} updates, evaluation excluded.",
             "", "| layout | ms per update (all networks) | × stacked | projected 10,000 updates (min) |",
             "|---|---|---|---|"]
    for k, v in times.items():
        m = statistics.median(v)
        lines.append(f"| {k} | {m * 1e3:.1f} | {m / base:.2f}× | {m * 1e4 / 60:.1f} |")
    return "\n".join(lines)


def timed_parts(setup, data, eta: float) -> dict[str, float]:
    """One update of `bandit_step`, its parts timed one by one (seconds)."""
    params, opt, methods, stream = setup
    out, t = {}, time.perf_counter()

    def lap(name: str) -> None:
        nonlocal t
        now = time.perf_counter()
        out[name], t = now - t, now

    idx, noise = stream.next()
    x, y = E.gather_batch(data, idx)
    lap("minibatch gather")
    logits = bank_forward(params, x, len(methods))
    lap("forward (MLP bank)")
    with torch.no_grad():
        logp = log_softmax(logits.detach())
        actions = sample_actions(logp.exp(), noise.unsqueeze(1))
    lap("act (softmax, sample)")
    loss = 0  # as bandit_step's sum(), term by term
    for i, m in enumerate(methods):
        loss = loss + bandit_loss(m, logits[:, i], actions[:, i], y, logp[:, i], eta=eta)
        lap(f"loss: {m}")
    opt.zero_grad(set_to_none=True)
    loss.backward()
    lap("backward")
    opt.step()
    lap("Adam")
    return out


def parts(cfg, seeds: list[int], data, steps: int, repeats: int, threads: int) -> str:
    """Markdown: ms per update of each part of the stacked update (median over `repeats` × `steps` updates)."""
    methods = list(cfg.methods)
    timed, plain = make(cfg, seeds, methods), make(cfg, seeds, methods)
    run(plain, data, 3, cfg.eta)
    for _ in range(3):
        timed_parts(timed, data, cfg.eta)
    laps: dict[str, list[float]] = {}
    whole, evals = [], []
    for _ in range(repeats):
        for _ in range(steps):
            for k, v in timed_parts(timed, data, cfg.eta).items():
                laps.setdefault(k, []).append(v)
        t = time.perf_counter()
        run(plain, data, steps, cfg.eta)
        whole.append((time.perf_counter() - t) / steps)
        t = time.perf_counter()
        probs = E.test_probs(timed[0], data.test_x, len(methods))
        (probs.argmax(-1) != data.test_y).float().mean(-1)
        evals.append(time.perf_counter() - t)
    done = 3 + repeats * steps
    if not all(torch.equal(a, b) for a, b in zip(timed[0], plain[0])):
        raise RuntimeError(f"the timed parts did not compute bandit_step: parameters differ after {done} updates")
    rows = {k: statistics.median(v) for k, v in laps.items()}
    rows[f"evaluation (one per {cfg.eval_every} updates)"] = statistics.median(evals) / cfg.eval_every
    total = sum(rows.values())
    lines = [f"Where an update of the `mnist` paper configuration goes ({len(seeds)} seeds × {len(methods)} methods, "
             f"B = {cfg.batch}), {threads} torch threads, torch {torch.__version__}: median of {repeats} × {steps} "
             f"updates per part; `bandit_step` untimed inside, in the same rounds: "
             f"{statistics.median(whole) * 1e3:.1f} ms an update (parameters of both bit for bit equal after "
             f"{done} updates).", "", "| part | ms per update | share |", "|---|---|---|"]
    lines += [f"| {k} | {v * 1e3:.2f} | {v / total:.0%} |" for k, v in rows.items()]
    lines.append(f"| total | {total * 1e3:.1f} | projected {cfg.steps:,} updates: {total * cfg.steps / 60:.1f} min |")
    return "\n".join(lines)


def compiled(cfg, seeds: list[int], data, steps: int, repeats: int, threads: int) -> str:
    """Markdown: ms per update, eager vs the forward and losses under torch.compile (interleaved, medians)."""
    methods = list(cfg.methods)
    fns = {"eager": E.forward_losses,
           "torch.compile (forward + losses)": torch.compile(E.forward_losses, dynamic=False)}
    setups = {k: make(cfg, seeds, methods) for k in fns}

    def update(k: str) -> None:
        params, opt, _, stream = setups[k]
        idx, noise = stream.next()
        loss, _ = fns[k](params, methods, *E.gather_batch(data, idx), noise, cfg.eta)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    first = {}
    for k in fns:
        t = time.perf_counter()
        update(k)
        first[k] = time.perf_counter() - t
        for _ in range(2):
            update(k)
    times = {k: [] for k in fns}
    for _ in range(repeats):
        for k in fns:
            t = time.perf_counter()
            for _ in range(steps):
                update(k)
            times[k].append((time.perf_counter() - t) / steps)
    apart = max((a - b).abs().max().item() for a, b in zip(*(s[0] for s in setups.values())))
    base = statistics.median(times["eager"])
    lines = [f"The `mnist` paper configuration's update ({len(seeds)} seeds × {len(methods)} methods), eager vs "
             f"compiled, {threads} torch threads, torch {torch.__version__}; median of {repeats} interleaved repeats "
             f"of {steps} updates, evaluation excluded. After {3 + repeats * steps} updates from the same start the "
             f"two runs' parameters differ by up to {apart:.2e}.",
             "", "| update | ms per update | × eager | first call (s) |", "|---|---|---|---|"]
    for k, v in times.items():
        m = statistics.median(v)
        lines.append(f"| {k} | {m * 1e3:.1f} | {m / base:.2f}× | {first[k]:.1f} |")
    return "\n".join(lines)


def main() -> None:
    global N_TRAIN, PIXELS
    ap = Parser(description=__doc__)
    ap.add_argument("--data-dir", default=None, help="MNIST folder (default: $TARGETPO_MNIST_DIR)")
    ap.add_argument("--seeds", type=positive_int, default=20, help="seeds S per network (default 20, the paper's)")
    ap.add_argument("--threads", type=positive_int, default=2, help="torch CPU threads (default 2)")
    ap.add_argument("--steps", type=positive_int, default=20, help="updates per timed repeat")
    ap.add_argument("--repeats", type=positive_int, default=5, help="interleaved timed repeats of every layout "
                    "(median reported; default 5)")
    ap.add_argument("--parts", action="store_true", help="time the parts of the stacked update instead of the "
                    "three layouts")
    ap.add_argument("--compile", action="store_true", help="time the stacked update eager against its forward "
                    "and losses under torch.compile instead of the three layouts")
    ap.add_argument("--all-pixels", action="store_true", help="the networks on all 784 pixels, not only the inked "
                    "ones the experiments read (MnistData.inked)")
    ap.add_argument("--write", default=None, help="append the table to this markdown file")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    data = D.load(args.data_dir)
    data = data if args.all_pixels else data.inked()
    N_TRAIN, PIXELS = len(data.train_y), data.pixels
    cfg = E.PRESETS["paper"]
    seeds = list(range(args.seeds))
    if args.parts and args.compile:
        ap.error("--parts and --compile: choose one")
    if args.compile:
        text = compiled(cfg, seeds, data, args.steps, args.repeats, args.threads)
    elif args.parts:
        text = parts(cfg, seeds, data, args.steps, args.repeats, args.threads)
    else:
        text = layouts(cfg, seeds, data, args.steps, args.repeats, args.threads)
    print(text)
    if args.write:
        with open(args.write, "a") as fh:
            fh.write(text + "\n")


if __name__ == "__main__":
    main()
