"""Worker processes of the CLI and the runner: `reproduce --jobs` runs experiments in them, `run --jobs` the units
of one experiment. A worker is a spawned interpreter (no forked OpenMP or torch state) that ignores Ctrl-C (it
reaches the whole process group; the parent stops its workers), ends cleanly on SIGTERM, and stops when its
parent dies (an orphan would go on appending to a run folder that the next run resumes)."""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import signal
import threading
import time

# A fresh interpreter per worker: forked OpenMP thread pools and torch state misbehave in the child.
SPAWN = multiprocessing.get_context("spawn")

# Set when this process must stop (a worker got SIGTERM): the SystemExit raised by the signal handler normally
# ends the run at once, but it is lost where it lands in code that swallows it (seen inside an import), and the
# unit would go on writing. The unit's next record or progress step then raises it again.
_STOP = threading.Event()

# How long a worker whose parent died may take to stop by itself before it is ended at once.
ORPHAN_GRACE_S = 60.0


def request_stop() -> None:
    """Make this process's next `RunContext.log` or `advance` raise SystemExit (see :data:`_STOP`)."""
    _STOP.set()


def exit_if_stopping() -> None:
    if _STOP.is_set():
        raise SystemExit(128 + signal.SIGTERM)


def exit_on_signal(signum, frame) -> None:
    request_stop()  # should this SystemExit be lost inside a library, the run's next record raises it again
    raise SystemExit(128 + signum)


def exit_on_first_signal(signum, frame) -> None:
    """A worker's SIGTERM handler. Once is enough: a worker gets a second SIGTERM (the process group's, then its
    parent-watch's) that, landing in the interpreter's exit, raised inside an atexit callback and printed
    "Exception ignored ... SystemExit: 143". Should the first SystemExit be lost, request_stop still ends the run
    at its next record, and the parent-watch ends the process ORPHAN_GRACE_S later."""
    signal.signal(signum, signal.SIG_IGN)
    exit_on_signal(signum, frame)


def stop_with_parent() -> None:
    """SIGTERM this worker when its parent process dies (even by SIGKILL). The run's next record raises the
    SystemExit again should the signal handler's be lost (:func:`request_stop`), and a worker still alive
    :data:`ORPHAN_GRACE_S` later exits without cleaning up."""
    parent = multiprocessing.parent_process()
    if parent is None:
        return

    def watch() -> None:
        multiprocessing.connection.wait([parent.sentinel])
        request_stop()
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(ORPHAN_GRACE_S)  # a daemon thread: the interpreter's exit does not wait for it
        os._exit(128 + signal.SIGTERM)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def become_worker() -> None:
    """What every worker does first: leave Ctrl-C to the parent, end on SIGTERM, stop with the parent."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, exit_on_first_signal)
    stop_with_parent()


def stop_workers(processes) -> None:
    """SIGTERM each live process, wait up to 30 s for it, then SIGKILL what is left."""
    for proc in processes:
        if proc.is_alive():
            proc.terminate()
    for proc in processes:
        proc.join(timeout=30)
        if proc.is_alive():
            proc.kill()
            proc.join()
