"""Timing a child process: the benchmarks that run whole commands share this."""

from __future__ import annotations

import resource
import signal
import subprocess
import time


def run_timed(cmd: list[str], stop_after: float | None = None,
              **kwargs) -> tuple[subprocess.CompletedProcess, float, float]:
    """`subprocess.run(cmd, **kwargs)` with its wall seconds and the CPU seconds (user + system) it and every
    process it waited for used. On a shared machine the CPU time is the steadier number: it leaves out the time
    spent waiting for a core. `stop_after`: seconds after which the child gets SIGTERM (a `targetpo run` then
    records "interrupted" and keeps every line), and SIGKILL if it is still there two minutes later; its exit code
    is returned as it is (no `check`, no captured output on this path)."""
    t0, before = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run(cmd, **kwargs) if stop_after is None else _run_stopped(cmd, stop_after, **kwargs)
    wall, after = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_CHILDREN)
    return out, wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


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
