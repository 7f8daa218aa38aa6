"""Timing a child process: the benchmarks that run whole commands share this."""

from __future__ import annotations

import ctypes
import os
import resource
import signal
import subprocess
import sys
import time

_PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>


def run_timed(cmd: list[str], stop_after: float | None = None,
              **kwargs) -> tuple[subprocess.CompletedProcess, float, float]:
    """`subprocess.run(cmd, **kwargs)` with its wall seconds and the CPU seconds (user + system) of it and every
    process it started. On a shared machine the CPU time is the steadier number: it leaves out the time spent
    waiting for a core. `stop_after`: seconds after which the child gets SIGTERM (a `targetpo run` then records
    "interrupted" and keeps every line), and SIGKILL if it is still there two minutes later; its exit code is
    returned as it is (no `check`, no captured output on this path).

    A process's CPU time reaches its parent only when the parent waits for it, and nothing waits for the fork
    server that `run --jobs` and `reproduce` fork their workers from: it outlives its parent and is adopted by
    init, taking its workers' seconds with it. On Linux this process therefore adopts its descendants' orphans
    (PR_SET_CHILD_SUBREAPER) and waits for them after the command; elsewhere the CPU column leaves them out."""
    adopting = _adopt_orphans()
    t0, before = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run(cmd, **kwargs) if stop_after is None else _run_stopped(cmd, stop_after, **kwargs)
    wall = time.perf_counter() - t0
    if adopting:
        _wait_for_orphans()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return out, wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def _adopt_orphans() -> bool:
    """Become the reaper of this process's orphaned descendants (Linux only); whether that worked."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _wait_for_orphans(limit_s: float = 60.0) -> None:
    """Wait for every child of this process to end, adopted ones included (the fork server ends once its parent
    has), so their CPU time is counted; after `limit_s` seconds say that some still run and leave them out of the
    count. The benchmarks run one timed command at a time, so no other child is waited for here."""
    end = time.monotonic() + limit_s
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return  # none left
        if pid == 0:
            if time.monotonic() > end:
                print(f"run_timed: descendants still running after {limit_s:.0f} s; the CPU time leaves them out",
                      file=sys.stderr)
                return
            time.sleep(0.02)


def _run_stopped(cmd: list[str], stop_after: float, **kwargs) -> subprocess.CompletedProcess:
    with subprocess.Popen(cmd, **kwargs) as proc:
        try:
            proc.wait(timeout=stop_after)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    return subprocess.CompletedProcess(cmd, proc.returncode)
