"""The `targetpo` command: list, run, report, reproduce (and rlvr when the LLM extra is installed)."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import math
import multiprocessing.connection
import os
import re
import signal
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from targetpo.experiments import EXPERIMENTS, SUITES, in_suite, load, suite_of
from targetpo.runs.config import OneLineParser, config_class, field_lines, first_repeat, make_config, override_key
from targetpo.runs.data import MissingDataError, MissingExtraError, extra_of, needs_extra
from targetpo.runs.runner import (DATA_LOCATION, add_runner_arguments, available_cores, can_grow, computes_on,
                                  config_differences, file_in_the_way, folder_listing, is_not_run, mark_not_run,
                                  parse_device, run_experiment, show_differences, stored_config, units_of)
from targetpo.runs.workers import CONTEXT, become_worker, exit_on_signal, start_worker, stop_workers
from targetpo.runs.store import read_run_json
from targetpo.runs.stats import count


def _experiment_epilog() -> str:
    lines = ["experiments (config fields can be overridden as key=value; defaults of the cpu preset, [allowed]):"]
    for name in EXPERIMENTS:
        exp = load(name)
        lines.append(f"\n  {name}: {exp.TITLE}  [presets: {', '.join(exp.PRESETS)}; "
                     f"reproduce uses {exp.REPRODUCE_PRESET}]")
        lines += field_lines(exp.PRESETS.get("cpu", next(iter(exp.PRESETS.values()))), indent="      ")
    return "\n".join(lines)


def cmd_list(args) -> int:
    for name in EXPERIMENTS:
        exp = load(name)
        presets = ", ".join(f"{p} ({count(c.seeds, 'seed')})" for p, c in exp.PRESETS.items())
        print(f"{name:<20} {exp.TITLE}\n{'':<20} suite: {suite_of(name)}; presets: {presets}")
    return 0


def _field_names(exp) -> set[str]:
    return {f.name for f in dataclasses.fields(config_class(exp))}


DATA_FLAGS = {"data_dir": "--data-dir", "dataset": "--dataset", "download": "--download"}


def _data_overrides(args, exp, strict: bool) -> list[str]:
    """--data-dir/--dataset/--download as key=value overrides for experiments whose config has those fields.
    With `strict` (targetpo run) a flag the experiment cannot use is an error; reproduce applies them where they fit."""
    given = {k: getattr(args, k, None) for k in DATA_FLAGS}
    given = {k: v for k, v in given.items() if v not in (None, False)}
    both = [k for k in given if any(override_key(o) == k for o in getattr(args, "overrides", None) or [])]
    if both:
        raise ValueError(f"give either {DATA_FLAGS[both[0]]} or {both[0]}=..., not both")
    fields = _field_names(exp)
    if strict and set(given) - fields:
        users = [n for n in EXPERIMENTS if "data_dir" in _field_names(load(n))]
        flags = ", ".join(DATA_FLAGS[k] for k in given if k not in fields)
        raise ValueError(f"{flags}: experiment {exp.NAME} reads no external data set; these flags apply to "
                         f"{', '.join(users) or 'no experiment'}")
    return [f"{k}={v}" for k, v in given.items() if k in fields]


def _run_and_report(exp, args, overrides: list[str], seeds: int | None = None) -> int:
    """`targetpo run` and `targetpo rlvr`: run (or resume) one experiment, then write its REPORT.md."""
    with _sigterm_exits():
        run_dir = run_experiment(exp, args.preset, out=args.out, seeds=seeds, overrides=overrides,
                                 resume=args.resume, force=args.force, device=args.device,
                                 progress=not args.no_progress, threads=args.threads, jobs=args.jobs)
    if not args.no_report:
        from targetpo.report import write_report

        print(f"report: {write_report(run_dir)}")
    return 0


def cmd_run(args) -> int:
    exp = load(args.name)
    return _run_and_report(exp, args, _data_overrides(args, exp, strict=True) + list(args.overrides or []),
                           seeds=args.seeds)


def cmd_report(args) -> int:
    from targetpo.report import write_report

    print(write_report(args.dir, args.output))
    return 0


def estimated_seconds(exp) -> float:
    """The reproduce preset's wall time read from the experiment's RUNTIME note ("~2 s", "~1.5 min", the last
    "~N unit" in it); inf without one, so an experiment of unknown length is scheduled first."""
    found = re.findall(r"~\s*(\d+(?:\.\d+)?)(?:\s*[–-]\s*\d+(?:\.\d+)?)?\s*(s|min|h)\b", getattr(exp, "RUNTIME", ""))
    if not found:
        return math.inf
    value, unit = found[-1]
    return float(value) * {"s": 1, "min": 60, "h": 3600}[unit]


@dataclasses.dataclass(frozen=True)
class _Plan:
    """One experiment of a reproduce: what to run and whether its run folder is continued or started afresh."""

    name: str
    preset: str
    overrides: tuple[str, ...]
    run_dir: Path
    resume: bool
    force: bool
    device: str
    spread: int = 1  # worker processes its units could use at most (1: it cannot take a freed core)


def _plan(out: Path, name: str, preset: str, overrides: list[str], fresh: bool, device: str,
          spread: int = 1) -> _Plan:
    run_dir = out / name
    placeholder = is_not_run(run_dir)  # an earlier reproduce lacked the data: start this one afresh
    resume = (run_dir / "run.json").exists() and not fresh and not placeholder
    return _Plan(name, preset, tuple(overrides), run_dir, resume, fresh or placeholder, device, spread)


def _holds_reproduce(out: Path) -> bool:
    """Whether `out` holds what a reproduce writes: a run folder (run.json) or its REPORT.md."""
    from targetpo.report import is_report

    report = out / "REPORT.md"
    if report.is_file() and is_report(report):
        return True
    return any((p / "run.json").is_file() for p in out.iterdir() if p.is_dir())


def _check_resumable(plan: _Plan, exp, cfg) -> None:
    """`reproduce` continues the runs already in --out; one stored with another preset or other settings is named
    here, before any run starts (it used to fail in every worker with a traceback about `run --resume`)."""
    meta = read_run_json(plan.run_dir)
    # The same files found elsewhere are the same run: the runner checks their fingerprint.
    differ = config_differences(stored_config(exp, plan.run_dir, meta), cfg, ignore=DATA_LOCATION)
    if meta["preset"] != plan.preset or differ:
        fields = show_differences(differ)
        raise ValueError(f"{plan.run_dir} holds a {meta['preset']} run that this reproduce (preset {plan.preset}) "
                         f"would not continue{f' ({fields})' if fields else ''}; pass --fresh to replace the runs "
                         "in --out, or use a new --out")


def _run_plan(plan: _Plan, progress: bool, threads: int | None = None, quiet: bool = False, grant=None) -> None:
    run_experiment(load(plan.name), plan.preset, out=plan.run_dir, resume=plan.resume, force=plan.force,
                   overrides=list(plan.overrides) or None, device=plan.device, progress=progress, quiet=quiet,
                   threads=threads, grant=grant)


def _not_run(plan: _Plan, reason: str, extra: bool = False) -> None:
    """Leave the placeholder the report shows as NOT RUN, with the reason and the command that runs it."""
    exp = load(plan.name)
    fields = _field_names(exp)
    if extra:  # once the extra is installed, reproduce continues into the same folder
        cmd = f"targetpo reproduce --out {plan.run_dir.parent} --only {plan.name} --preset {plan.preset}"
        also = ""
    elif "data_dir" in fields:  # MNIST: reproduce passes --data-dir
        cmd = f"targetpo reproduce --out {plan.run_dir.parent} --only {plan.name} --preset {plan.preset} --data-dir DIR"
        # make reproduce writes the default presets into results/: the same folder only then
        also = (" (or `make reproduce MNIST_DIR=DIR`)" if plan.run_dir.parent == Path("results")
                and Path("Makefile").is_file() else "")  # from a checkout, not an installed wheel
    else:  # what reproduce cannot pass (a model directory, GSM8K's path): a run of its own into the same folder
        paths = " ".join(f"{n}=DIR" for n in ("model", "data_path") if n in fields)
        cmd = f"targetpo run {plan.name} --preset {plan.preset} --out {plan.run_dir} --force {paths}".rstrip()
        also = ""
    mark_not_run(plan.run_dir, exp, plan.preset, f"{reason}. To run it: `{cmd}`{also}")
    print(f"\n{'!' * 78}\n!! {plan.name} NOT RUN: {reason}\n!! run it with: {cmd}\n{'!' * 78}\n", file=sys.stderr)


@contextlib.contextmanager
def _sigterm_exits():
    """SIGTERM (a scheduler's stop, `kill`) raises SystemExit in the block, so a run ends like Ctrl-C: status
    "interrupted", every line kept. Without a handler the process died at once and run.json kept saying "running".
    Only the main thread can set a handler; elsewhere (a caller's thread) the block runs as it is."""
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, exit_on_signal) if main_thread else None
    try:
        yield
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)


def _name_worker_logs(name: str) -> logging.Handler:
    """targetpo's log lines from a reproduce worker start with its experiment's name: two workers write to the same
    terminal, and a bare "step 0: all 2 groups have zero-variance rewards" did not say whose it was."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(f"{name}: %(levelname)s: %(message)s"))
    logging.getLogger("targetpo").addHandler(handler)
    return handler


def _reproduce_worker(conn, plan: _Plan, threads: int, cores=None) -> None:
    """One experiment in its own process with `threads` torch threads; sends ("done", summary), ("missing", reason),
    ("missing extra", reason) or ("failed", traceback) to the parent. `cores` (a shared integer, or None): the
    worker processes of `threads` threads each its units may run in, raised by the parent as other experiments
    finish."""
    become_worker()
    _name_worker_logs(plan.name)
    try:
        _run_plan(plan, progress=False, threads=threads, quiet=True,
                  grant=None if cores is None else lambda: cores.value)
        exp = load(plan.name)
        if hasattr(exp, "summary"):
            from targetpo.runs.store import Run

            conn.send(("done", exp.summary(Run.load(plan.run_dir))))
        else:
            conn.send(("done", ""))
    except MissingDataError as exc:
        conn.send(("missing extra" if isinstance(exc, MissingExtraError) else "missing", str(exc)))
    except Exception:  # noqa: BLE001  (reported by the parent; the other experiments go on)
        conn.send(("failed", traceback.format_exc()))


def _run_parallel(plans: list[_Plan], jobs: int, progress: bool) -> tuple[list[str], list[str]]:
    """Run `plans` in up to `jobs` worker processes, longest first (by RUNTIME). Prints one line per finished
    experiment under an overall bar. Returns (names not run for lack of data, names that failed)."""
    cores = available_cores()
    threads = max(1, cores // jobs)  # the cores shared out: oversubscribed OpenMP threads stall
    estimate = {p.name: estimated_seconds(load(p.name)) for p in plans}  # RUNTIME notes, read once
    queue = sorted(plans, key=lambda p: -estimate[p.name])
    running: dict[Any, tuple[_Plan, Any, Any, float]] = {}  # sentinel -> (plan, process, connection, start)
    # Slots of `threads` threads: one per running experiment; once none is queued, a finished experiment's slot
    # goes to a running one whose units run apart, as one more worker process (the longest estimated, per slot).
    slots = max(jobs, cores // threads)
    granted: dict[str, Any] = {}  # plan name -> its shared slot count, for plans whose units can spread
    replies: dict[str, tuple[str, str]] = {}

    def share_out_idle_slots() -> None:
        idle = slots - sum(granted[p.name].value if p.name in granted else 1 for p, *_ in running.values())
        while idle > 0 and not queue:
            growable = [p for p, *_ in running.values() if p.name in granted and p.name not in replies
                        and granted[p.name].value < p.spread]
            if not growable:
                return
            best = max(growable, key=lambda p: estimate[p.name] / granted[p.name].value)
            granted[best.name].value += 1
            idle -= 1

    missing, failed = [], []
    finished = 0  # counted here: a disabled bar (--no-progress) does not count its updates
    start = time.time()
    bar = tqdm(total=len(plans), desc=f"reproduce ({jobs} jobs)", unit="exp", disable=not progress,
               file=sys.stderr, dynamic_ncols=True, bar_format="{desc}: {bar} {n}/{total} [{elapsed}]{postfix}")
    try:
        while queue or running:
            while queue and len(running) < jobs:
                plan = queue.pop(0)
                recv, send = CONTEXT.Pipe(duplex=False)
                if plan.spread > 1:
                    granted[plan.name] = CONTEXT.Value("i", 1)
                proc = start_worker(_reproduce_worker, (send, plan, threads, granted.get(plan.name)),
                                    name=f"reproduce-{plan.name}")
                send.close()
                running[proc.sentinel] = (plan, proc, recv, time.time())
            share_out_idle_slots()
            bar.set_postfix_str("running: " + ", ".join(p.name for p, *_ in running.values()))
            # A worker's reply, then its exit; a read pipe stays readable at EOF, so it is waited on once.
            ready = multiprocessing.connection.wait(
                [o for s, (p, _, recv, _) in running.items() for o in ((s,) if p.name in replies else (s, recv))])
            for sentinel in [s for s, v in running.items() if v[2] in ready or s in ready]:
                plan, proc, recv, t0 = running[sentinel]
                if plan.name not in replies and recv.poll():  # read before the process ends: a big reply blocks it
                    try:
                        replies[plan.name] = recv.recv()
                    except EOFError:
                        pass
                if sentinel not in ready:
                    continue
                proc.join()
                del running[sentinel]
                status, detail = replies.get(plan.name, ("failed", f"the worker process exited with code "
                                                                   f"{proc.exitcode} without a result"))
                finished += 1
                line = f"[{finished}/{len(plans)}] {plan.name} [{plan.preset}]"
                if status == "done":
                    bar.write(f"{line} done in {time.time() - t0:.1f}s -> {plan.run_dir}" +
                              (f"\n  {detail}" if detail else ""), file=sys.stdout)
                elif status in ("missing", "missing extra"):
                    missing.append(plan.name)
                    _not_run(plan, detail, extra=status == "missing extra")
                else:
                    failed.append(plan.name)
                    bar.write(f"{line} FAILED after {time.time() - t0:.1f}s (its run folder is kept; the other "
                              f"experiments go on):\n{detail.rstrip()}", file=sys.stderr)
                bar.update(1)
        bar.set_postfix_str("")
    except (KeyboardInterrupt, SystemExit):  # Ctrl-C, or SIGTERM (cmd_reproduce's handler): stop the workers too
        stop_workers([proc for _, proc, *_ in running.values()])
        bar.close()
        names = ", ".join(p.name for p, *_ in running.values()) or "none"
        print(f"\ninterrupted: stopped the running experiments ({names})", file=sys.stderr)
        raise
    bar.close()
    return missing, failed


def _run_sequentially(plans: list[_Plan], args, missing: list[str], failed: list[str]) -> None:
    """reproduce --jobs 1: each plan in this process; appends to `missing` / `failed` and goes on after either."""
    for plan in plans:
        try:  # the runner checks the data before it writes anything
            _run_plan(plan, progress=not args.no_progress)
        except MissingDataError as exc:
            missing.append(plan.name)
            _not_run(plan, str(exc), extra=isinstance(exc, MissingExtraError))
        except Exception:  # noqa: BLE001  (as in the parallel path: reported, and the other experiments go on)
            failed.append(plan.name)
            print(f"\n{plan.name} FAILED (the other experiments go on):\n{traceback.format_exc().rstrip()}",
                  file=sys.stderr)


def cmd_reproduce(args) -> int:
    from targetpo.report import write_report

    jobs = available_cores() if args.jobs is None else args.jobs
    if jobs < 1:
        raise ValueError(f"--jobs={jobs}: must be at least 1 (1 runs the experiments one after another)")
    if args.only is not None and not args.only:
        raise ValueError("--only needs at least one experiment name (see `targetpo list`); leave it out to run "
                         f"the --suite ({args.suite})")
    if args.only and first_repeat(args.only) is not None:
        raise ValueError(f"--only names {first_repeat(args.only)} twice; each experiment runs once")
    out = Path(args.out)
    blocker = file_in_the_way(out)
    if blocker is not None:  # every experiment would fail on it, each with a traceback
        raise ValueError(f"--out {out}: {blocker} is a file, not a directory")
    if out.is_dir() and not args.fresh and any(out.iterdir()) and not _holds_reproduce(out):
        # The combined REPORT.md goes here: files of a folder that holds no run are the user's.
        raise ValueError(f"--out {out}: not empty ({folder_listing(out)}) and holds no targetpo runs; choose a new "
                         "or empty --out, or pass --fresh to write into it (its REPORT.md is replaced)")
    data_dir = Path(args.data_dir).expanduser() if args.data_dir else None
    if data_dir is not None and not args.download and not data_dir.is_dir():  # a typo, not data to report missing
        what = "is a file, not a directory" if data_dir.exists() else "does not exist"
        raise ValueError(f"--data-dir {args.data_dir}: {what}; give the folder of the MNIST IDX files, add --download "
                         "to fetch them there, or leave --data-dir out (the MNIST experiments are then NOT RUN)")
    dev = parse_device(args.device)
    # Every config is validated before the first run starts, so a refused one leaves nothing behind.
    plans, cpu_only = [], []
    for name in args.only or in_suite(args.suite):
        exp = load(name)
        preset = args.preset or exp.REPRODUCE_PRESET
        overrides = _data_overrides(args, exp, strict=False)
        cfg = make_config(exp, preset, overrides=overrides)
        device = args.device if computes_on(exp, dev) else "cpu"
        if device != args.device:
            cpu_only.append(name)  # an experiment that computes on the CPU only runs there, and is named below
        spread = len(units_of(exp, cfg)) if can_grow(exp, device) else 1
        plans.append(_plan(out, name, preset, overrides, args.fresh, device, spread))
        if plans[-1].resume:
            _check_resumable(plans[-1], exp, cfg)
    if cpu_only:
        print(f"--device {args.device}: {', '.join(cpu_only)} compute on the CPU only and run there", file=sys.stderr)
    missing, failed = [], []
    start = time.time()
    # SIGTERM ends the running experiment as `targetpo run` does (status "interrupted", not a stale "running");
    # with workers, it stops them as Ctrl-C does (before, they were left to notice this process's death).
    with _sigterm_exits():
        if jobs == 1 or len(plans) == 1:
            _run_sequentially(plans, args, missing, failed)
        else:
            try:
                missing, failed = _run_parallel(plans, min(jobs, len(plans)), progress=not args.no_progress)
            except (KeyboardInterrupt, SystemExit) as exc:  # also a second Ctrl-C that cut the stopping short
                print("targetpo: interrupted; every finished line is kept and `targetpo reproduce` with the same "
                      "--out resumes", file=sys.stderr)
                return exc.code if isinstance(exc, SystemExit) else 130
    # One summary for both paths, counting what happened rather than what was planned.
    done = len(plans) - len(missing) - len(failed)
    print(f"reproduce: {done} done" + (f", {len(missing)} NOT RUN" if missing else "")
          + (f", {len(failed)} FAILED" if failed else "")
          + f" of {count(len(plans), 'experiment')} in {time.time() - start:.0f}s with "
          f"{count(min(jobs, len(plans)), 'job')}")
    print(f"report: {write_report(out)}")
    if missing:
        print(f"WARNING: {count(len(missing), 'experiment')} NOT RUN for lack of data or of an optional extra: "
              f"{', '.join(missing)} "
              "(see the report)", file=sys.stderr)
    if failed:
        print(f"ERROR: {count(len(failed), 'experiment')} FAILED: {', '.join(failed)} (tracebacks above; the report "
              "shows what they wrote; run `targetpo reproduce` again with the same --out to resume them)",
              file=sys.stderr)
        return 1
    return 0


def cmd_rlvr(args) -> int:
    from targetpo.llm.cli import rlvr_overrides

    return _run_and_report(load("rlvr"), args, rlvr_overrides(args))


def cmd_data(args) -> int:
    from targetpo.runs.download import download_all

    if args.dataset == "gsm8k":
        from targetpo.llm.data import gsm8k_remotes

        remotes = gsm8k_remotes(args.base_url)
    else:
        from targetpo.mnist.data import remotes as mnist_remotes

        remotes = mnist_remotes(args.dataset, args.base_url)
    paths = download_all(remotes, args.dir, progress=not args.no_progress)
    print(f"{args.dataset}: {count(len(paths), 'file')} verified in {args.dir}")
    return 0


def _add_data_flags(p, reproduce: bool = False) -> None:
    scope = " (applied to the experiments that read a data set)" if reproduce else ""
    p.add_argument("--data-dir", default=None, help="directory of MNIST-format IDX files (train-*/t10k-* "
                   "images/labels, optionally .gz); with only the t10k files a fixed 8k/2k split of the 10k test "
                   f"digits is used. Default: $TARGETPO_MNIST_DIR{scope}")
    p.add_argument("--dataset", default=None, choices=["mnist", "fashion-mnist"], help="data set in --data-dir "
                   "(fashion-mnist defaults to $TARGETPO_FASHION_MNIST_DIR, else /usr/share/datasets/fashion-mnist, "
                   f"Debian package dataset-fashion-mnist){scope}")
    p.add_argument("--download", action="store_true", help="fetch the official IDX files (MD5-checked) into "
                   f"--data-dir or ~/.cache/targetpo/DATASET before running; nothing is downloaded otherwise{scope}")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(  # every other refusal of the CLI is one line too
        prog="targetpo", description="Target Policy Optimization: run the paper's experiments and report them.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("list", help="list experiments and their presets")
    p.set_defaults(func=cmd_list)

    p = sub.add_parser("run", help="run one experiment", epilog=_experiment_epilog(),
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("name", choices=list(EXPERIMENTS), help="experiment to run")
    p.add_argument("--preset", default=None, help="smoke (seconds), cpu (minutes on 2 cores; default) or paper "
                   "(the paper's exact protocol)")
    p.add_argument("--seeds", type=int, default=None, help="number of seeds (overrides the preset)")
    p.add_argument("--out", default=None, help="run directory (default results/NAME-PRESET)")
    add_runner_arguments(p)
    _add_data_flags(p)
    # default=[]: argparse otherwise lists an empty nargs="*" positional among the required arguments
    p.add_argument("overrides", nargs="*", default=[], metavar="key=value", help="config overrides, e.g. steps=500 "
                   "methods=tpo,grpo (fields listed below)")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("report", help="write REPORT.md (tables vs the paper, plots, claim checks) for stored runs")
    p.add_argument("dir", help="a run directory, or a directory of run directories")
    p.add_argument("-o", "--output", default=None, help="report path (default DIR/REPORT.md)")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("reproduce", help="run every experiment at its reproduce preset and write one report")
    p.add_argument("--out", default="results", help="directory for all runs and REPORT.md (default results)")
    p.add_argument("--suite", default="paper", choices=list(SUITES),
                   help="which experiments: " + "; ".join(f"{k}: {v}" for k, v in SUITES.items()))
    p.add_argument("--only", nargs="*", choices=list(EXPERIMENTS), help="run only these experiments (any suite; "
                   "overrides --suite)")
    p.add_argument("--preset", default=None, help="use this preset for every experiment instead of each one's default")
    p.add_argument("--fresh", action="store_true", help="discard existing runs instead of resuming them")
    p.add_argument("--device", default="cpu", help="torch device, e.g. cpu or cuda")
    p.add_argument("--jobs", type=int, default=None, help="experiments run at once, each in its own process with "
                   "cores // jobs torch threads, longest first; once none is left to start, a finished one's share "
                   "runs units of a running one in another process (default: the number of CPU cores; 1 runs them "
                   "one after another in this process); the results are the same for any value")
    p.add_argument("--no-progress", action="store_true", help="hide progress bars")
    _add_data_flags(p, reproduce=True)
    p.set_defaults(func=cmd_reproduce)

    p = sub.add_parser("data", help="download a public data set (checksum-verified, resumable) into DIR",
                       description="Fetch a data set from its canonical public location into DIR. Each file is "
                       "checked against its published checksum before it is moved into place; an interrupted "
                       "download resumes. Nothing else in targetpo downloads unless asked.")
    p.add_argument("dataset", choices=("gsm8k", "mnist", "fashion-mnist"), help="gsm8k: train.jsonl and "
                   "test.jsonl (SHA-256); mnist / fashion-mnist: the four IDX .gz files (MD5)")
    p.add_argument("dir", help="destination directory (created); then pass it as --data-dir (MNIST) or "
                   "data_path= / --data-path (GSM8K)")
    p.add_argument("--base-url", default=None, help="a mirror that serves the same file names (default: the "
                   "canonical location)")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bars")
    p.set_defaults(func=cmd_data)

    try:  # the LLM entry point needs the optional LLM extra
        from targetpo.llm.cli import add_rlvr_parser
    except ImportError:
        pass
    else:
        add_rlvr_parser(sub).set_defaults(func=cmd_rlvr)
    return parser


def _refuse_empty_strings(args) -> None:
    """An empty flag or argument (`--preset ""`, `-o ""`, `data gsm8k ""`) is an error naming it: each used to
    mean its default (the cpu preset, DIR/REPORT.md, the current directory, the official URL)."""
    for key, value in vars(args).items():
        if isinstance(value, str) and not value.strip():
            if key in POSITIONAL:
                raise ValueError(f"{key.upper()} is empty: give a value")
            raise ValueError(f"--{key.replace('_', '-')} is empty: give a value, or leave the flag out for its default")


POSITIONAL = ("dir",)  # the free-text positional arguments (`report DIR`, `data NAME DIR`); the others have choices


def main(argv: list[str] | None = None, parser: argparse.ArgumentParser | None = None) -> int:
    """The `targetpo` command on `argv` (default sys.argv[1:]); `parser`: one :func:`build_parser` already built
    (the script builds it while it holds Ctrl-C, `targetpo.__main__`)."""
    parser = parser or build_parser()
    args, extra = parser.parse_known_args(argv)
    # key=value overrides may follow options (`run NAME --preset paper steps=10`); argparse leaves those over.
    # Any word that is not a flag joins them, so `steps` reads "must look like key=value" wherever it stands.
    if extra and getattr(args, "command", None) in ("run", "rlvr") and not any(e.startswith("-") for e in extra):
        args.overrides = list(args.overrides or []) + extra
    elif extra:  # named by the subcommand's parser, whose --help lists what it takes
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        # The unknown flags and the words that follow them (their values), not the overrides beside them.
        flags, follows = [], False
        for e in extra:
            follows = e.startswith("-") or (follows and "=" not in e)
            if follows:
                flags.append(e)
        flags = flags or extra
        sub.choices.get(getattr(args, "command", None), parser).error(f"unrecognized arguments: {' '.join(flags)}")
    try:
        _refuse_empty_strings(args)
        return args.func(args) or 0
    except BrokenPipeError:  # `targetpo list | head -1`: the reader left; stop quietly, as a tool SIGPIPE ends
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error flushing stdout at exit
        return 128 + signal.SIGPIPE
    except (ValueError, OSError, KeyError) as exc:
        # A KeyError's str() is the repr of its argument; show the message itself.
        message = exc.args[0] if isinstance(exc, KeyError) and len(exc.args) == 1 else exc
        print(f"targetpo: error: {message}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:
        _, extra = extra_of(exc)  # a command that needs one names the extra
        if extra is None:
            raise
        print(f"targetpo: error: {needs_extra(args.command, extra, exc.name)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        again = {"run": "the same command with --resume", "rlvr": "the same command with --resume",
                 "reproduce": "the same command (it resumes)"}.get(args.command)
        print("\ntargetpo: interrupted" + (f"; every metrics line written is kept: run {again} to continue" if again
                                           else ""), file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
