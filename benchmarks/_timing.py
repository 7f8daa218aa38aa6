"""Timing a child process: the benchmarks that run whole commands share this."""

from __future__ import annotations

import resource
import subprocess
import time


def run_timed(cmd: list[str], **kwargs) -> tuple[subprocess.CompletedProcess, float, float]:
    """`subprocess.run(cmd, **kwargs)` with its wall seconds and the CPU seconds (user + system) it and every
    process it waited for used. On a shared machine the CPU time is the steadier number: it leaves out the time
    spent waiting for a core."""
    t0, before = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run(cmd, **kwargs)
    wall, after = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_CHILDREN)
    return out, wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
