"""Worker processes of the CLI and the runner: `reproduce --jobs` runs experiments in them, `run --jobs` the units
of one experiment. A worker starts clean (no OpenMP thread pool or torch state of its parent's), sees its parent's
environment as it is when the worker starts, ignores Ctrl-C (it reaches the whole process group; the parent
stops its workers), ends cleanly on SIGTERM, and stops when its parent dies (an orphan would go on appending to
a run folder that the next run resumes)."""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import signal
import threading
import time

# Workers are forked from Python's fork server, a clean process started once per parent that has imported torch
# and the runner but run no torch op (a forked OpenMP thread pool or torch state would misbehave in the child):
# a worker then starts in milliseconds instead of the ~2.5 s of CPU an interpreter takes to import torch. Where
# the platform has no fork server (Windows), each worker is a fresh spawned interpreter.
CONTEXT = multiprocessing.get_context("forkserver" if "forkserver" in multiprocessing.get_all_start_methods()
                                      else "spawn")
# What the fork server imports before its first fork. Set when targetpo starts a worker, not at import (it is
# the process's one fork server); a server already running keeps its own list and its workers import it.
PRELOAD = ["targetpo.runs.runner"]

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


def start_worker(target, args: tuple, name: str) -> multiprocessing.process.BaseProcess:
    """Start `target(*args)` in a worker process (see the module's docstring) and return the process."""
    if CONTEXT.get_start_method() == "forkserver":
        CONTEXT.set_forkserver_preload(PRELOAD)  # read only when the server starts
    proc = CONTEXT.Process(target=_in_parents_environment, args=(dict(os.environ), target, args), name=name)
    proc.start()
    return proc


def _in_parents_environment(environ: dict, target, args: tuple) -> None:
    # The fork server's environment is its parent's when the server started; a spawned worker's would be the
    # parent's now. The parent may have changed it since (a test's monkeypatch, a notebook), so it is set again.
    os.environ.clear()
    os.environ.update(environ)
    target(*args)


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
