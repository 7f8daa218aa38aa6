"""benchmarks/_timing.run_timed counts the CPU time of every process a command started, the fork server's
workers included: a process nobody waits for (an orphan, as Python's fork server is once its parent has
exited) would otherwise take its seconds with it, and BENCHMARKS.md's CPU columns would read near zero."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# The command under test starts a grandchild that burns 0.6 s of CPU and exits at once, so the grandchild is an
# orphan while it runs. The check runs in its own interpreter: run_timed makes its process the reaper of orphans.
CHECK = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, sys.argv[1])
    from _timing import run_timed
    burn = "import time\\nwhile time.process_time() < 0.6: pass"
    start = f"import subprocess, sys; subprocess.Popen([sys.executable, '-c', {burn!r}])"
    _, wall, cpu = run_timed([sys.executable, "-c", start])
    print(json.dumps({"wall": wall, "cpu": cpu}))
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="orphans are adopted on Linux only")
def test_run_timed_counts_the_cpu_of_orphaned_descendants():
    out = subprocess.run([sys.executable, "-c", CHECK, str(ROOT / "benchmarks")], capture_output=True, text=True,
                         check=True, timeout=120)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["cpu"] >= 0.6, got  # the orphan's 0.6 s are counted (without the adoption: ~0.05 s)
