"""The one runner every experiment shares: presets and overrides, run.json, append-only metrics, progress,
resume, divergence, and the end-of-run summary. Experiments never write files or drive progress bars themselves.

A unit whose metrics, loss or parameters turn NaN/inf stops there: the runner writes
`{"unit": u, "event": "diverged", "step": N, "metric": name}` instead of `done`, goes on with the next unit,
and a resume counts the unit as finished (its curve simply ends at N). A unit that reads a diverged unit's output
(`unit_needs`, e.g. RL from a warm start) is not started: it is recorded as diverged at step 0, its metric naming
the unit it needed."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import multiprocessing.connection
import os
import shlex
import shutil
import sys
import time
import traceback
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

import numpy as np
import torch
from tqdm.auto import tqdm

from targetpo.runs.store import (METRICS_FILE, RUN_FILE, MetricsWriter, RunFileError, read_metrics, read_run_json,
                                 record_key, restore_run_json, versions, write_run_json)
from targetpo.runs.config import (config_class, config_fields, config_from_dict, configure, make_config,
                                  override_key, validated)
from targetpo.runs.stats import count
from targetpo.runs.data import require_extra
from targetpo.runs.workers import (CONTEXT, _STOP, become_worker, exit_if_stopping as _exit_if_stopping,  # noqa: F401
                                   request_stop, start_worker, stop_workers)


class _Diverged(Exception):
    """A unit produced a non-finite value; caught by :func:`run_experiment`, never seen by experiments."""

    def __init__(self, step: int, metric: str, unit: str):
        super().__init__(f"{metric} is not finite at step {step}")
        self.step, self.metric, self.unit = step, metric, unit


def available_cores() -> int:
    """The number of CPU cores this process may use."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def _cpu_times() -> tuple[int, int] | None:
    """(idle, total) jiffies of all CPUs since boot (Linux /proc/stat), or None elsewhere."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return None
    return fields[3] + (fields[4] if len(fields) > 4 else 0), sum(fields[:8])


def default_threads(window_s: float = 0.1) -> int:
    """Torch threads for a run: the cores this process may use that are idle now (sampled over `window_s` from
    /proc/stat), at least 1; 1 where that cannot be read. Two threads on an idle 2-core machine run the token and
    MNIST experiments 1.7x faster with the same numbers, but when another job holds a core each parallel op
    waits for the descheduled thread and a run goes 10–50x slower (BENCHMARKS.md "Threads"), so the count
    follows what is free when the run starts."""
    cores = available_cores()
    a = _cpu_times()
    if a is None:
        return 1
    time.sleep(window_s)
    b = _cpu_times()
    total = b[1] - a[1]
    if total <= 0:
        return 1
    idle = (b[0] - a[0]) / total * (os.cpu_count() or cores)
    return max(1, min(cores, int(idle + 0.25)))


def first_non_finite(values: dict[str, Any], nan_means_empty: tuple[str, ...] = ()) -> str | None:
    """The name of the first value (number, list, array or tensor, nested in dicts/lists) holding a NaN or
    ±inf, or None. Integers, booleans and strings are always finite. Names ending in one of `nan_means_empty`
    may hold NaN (a mean over an empty set), but not ±inf."""
    for name, x in values.items():
        nan_ok = bool(nan_means_empty) and name.endswith(tuple(nan_means_empty))
        if _has_bad(x, nan_ok):
            return name
    return None


def _has_bad(x: Any, nan_ok: bool) -> bool:
    # Arrays first: per-seed rows are most of a log. (A bool is no float; NumPy's bools have dtype kind "b".)
    if isinstance(x, (np.ndarray, np.generic, float)):
        x = np.asarray(x)
        if x.dtype.kind not in "fc":
            return False
        return bool(np.isinf(x).any() if nan_ok else not np.isfinite(x).all())
    if isinstance(x, dict):
        return any(_has_bad(v, nan_ok) for v in x.values())
    if isinstance(x, (list, tuple)):
        return any(_has_bad(v, nan_ok) for v in x)
    if isinstance(x, torch.Tensor):
        if not (x.is_floating_point() or x.is_complex()):
            return False
        x = x.detach()
        return bool(torch.isinf(x).any() if nan_ok else ~torch.isfinite(x).all())
    return False


class DataMismatch(ValueError):
    """A resume reads other data than the stored records were computed on."""


class RunContext:
    """What a unit sees of the runner: `log` a metrics record, `advance` the progress bar, a `device`."""

    def __init__(self, unit: str, writer: MetricsWriter, bar: tqdm, device: torch.device, meta: dict,
                 run_dir: Path | None = None, nan_means_empty: tuple[str, ...] = (),
                 on_data: Callable[[str, str | None], None] | None = None):
        self.unit = unit
        self._on_data = on_data  # a `run --jobs` worker hands the data source to its parent, which owns run.json
        self._nan_means_empty = tuple(nan_means_empty)
        self.run_dir = run_dir  # for units that keep files (model checkpoints) next to the metrics
        self._writer = writer
        self._bar = bar
        self.device = device
        self._meta = meta

    def log(self, record: dict[str, Any]) -> None:
        """Append one metrics record; a NaN/inf in any of its values ends the unit as diverged at this step
        (the record is not written, so every stored curve is finite). Metrics named in the config class's
        NAN_MEANS_EMPTY may be NaN."""
        _exit_if_stopping()
        if "step" not in record:
            raise ValueError(f"a metrics record needs a 'step' key; got keys {sorted(record)}")
        # Tensors move to NumPy once, for both the finiteness check and the JSON text (each is several times
        # cheaper on a small NumPy array than on a tensor; logging was ~1/4 of tabular-multi's run time).
        record = {k: v.detach().cpu().numpy() if isinstance(v, torch.Tensor) and v.dtype != torch.bfloat16 else v
                  for k, v in record.items()}
        bad = first_non_finite({k: v for k, v in record.items() if k != "step"}, self._nan_means_empty)
        if bad is not None:
            raise _Diverged(int(record["step"]), bad, self.unit)
        self._writer.write({"unit": self.unit, **record})

    def check_finite(self, step: int, values: dict[str, Any]) -> None:
        """End the unit as diverged at `step` if any of `values` (a loss, the parameters, ...) is NaN/inf."""
        bad = first_non_finite(values)
        if bad is not None:
            raise _Diverged(int(step), bad, self.unit)

    def advance(self, n: int = 1) -> None:
        _exit_if_stopping()
        self._bar.update(n)

    def set_data_source(self, description: str, fingerprint: str | None = None) -> None:
        """Recorded in run.json at once (a killed run keeps it) and shown in every report (e.g. which MNIST split
        was used). `fingerprint` identifies the data's content: a resume whose data differs from what the stored
        records were computed on is refused (a curve would mix two data sets)."""
        stored = self._meta.get("data_fingerprint")
        if fingerprint is not None and stored is not None and stored != fingerprint:
            raise DataMismatch(f"{self.run_dir or 'this run'} was computed on other data ({self._meta.get('data_source')}, "
                               f"fingerprint {stored}) than this resume reads ({description}, fingerprint "
                               f"{fingerprint}); resume with the run's data, or use a new --out")
        if self._meta.get("data_source") == description and stored == fingerprint:
            return
        self._meta["data_source"] = description
        if fingerprint is not None:
            self._meta["data_fingerprint"] = fingerprint
        if self._on_data is not None:
            self._on_data(description, fingerprint)
        elif self.run_dir is not None:
            write_run_json(self.run_dir, self._meta)


# ----------------------------------------------------------------------------- running

def stored_config(exp: ModuleType, run_dir: Path, meta: dict) -> Any:
    """The validated config of the run stored in `run_dir` (`meta`, its run.json), which must be `exp`'s."""
    if meta["experiment"] != exp.NAME:
        raise ValueError(f"{run_dir} holds a {meta['experiment']} run, not {exp.NAME}; use a new --out")
    if not meta.get("config"):  # an empty config would read as the class defaults, which no preset is
        raise ValueError(f"{run_dir / RUN_FILE}: holds no config (status {meta.get('status')!r}), so there is no run "
                         "to continue or report; start one without --resume")
    return validated(config_from_dict(exp, meta["config"]))


def show_differences(differ: dict[str, tuple[Any, Any]]) -> str:
    """:func:`config_differences` as "field: stored a, asked b; …" for an error message."""
    return "; ".join(f"{k}: stored {a!r}, asked {b!r}" for k, (a, b) in differ.items())


# Where a run reads its data from, not what the data is: a resume may find the same files elsewhere (a path given
# once as --data-dir, once through $TARGETPO_MNIST_DIR); the content fingerprint in run.json is what must match.
DATA_LOCATION = ("data_dir", "data_path", "download")


def absolute_locations(cfg: Any) -> Any:
    """`cfg` with a relative `data_dir` / `data_path` made absolute, as `--data-dir` is: run.json then names the
    same folder from any working directory a resume starts in."""
    changes = {k: str(Path(v).expanduser().resolve()) for k in ("data_dir", "data_path")
               if isinstance(v := getattr(cfg, k, None), str) and v and not Path(v).expanduser().is_absolute()}
    return dataclasses.replace(cfg, **changes) if changes else cfg


def config_differences(a: Any, b: Any, ignore: tuple[str, ...] = ()) -> dict[str, tuple[Any, Any]]:
    """{field: (value in a, value in b)} for the fields where two configs of one class differ (but `ignore`)."""
    da, db = dataclasses.asdict(a), dataclasses.asdict(b)
    return {k: (da[k], db[k]) for k in da if da[k] != db.get(k) and k not in ignore}


def file_in_the_way(path: Path) -> Path | None:
    """The file (not a folder) at `path` or at the nearest existing parent of it, which no folder can be made
    under; None when there is none."""
    blocker = next((p for p in [path, *path.parents] if p.exists()), None)
    return blocker if blocker is not None and not blocker.is_dir() else None


def folder_listing(path: Path) -> str:
    """The first few names in the folder `path`, for a message: "a, b, c, d and 3 more"."""
    found = sorted(p.name for p in path.iterdir())
    return ", ".join(found[:4]) + (f" and {len(found) - 4} more" if len(found) > 4 else "")


def make_run_dir(run_dir: Path) -> None:
    """Create the run directory, or say which path cannot be written and why (one line, no traceback)."""
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        probe = run_dir / ".write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        blocker = file_in_the_way(run_dir)
        why = f"{blocker} is a file, not a directory" if blocker is not None else exc.strerror or str(exc)
        raise OSError(f"cannot write the run directory {run_dir}: {why}") from None


def _check_data(exp: ModuleType, cfg: Any) -> None:
    """The optional extra the experiment needs (MissingExtraError), then its data check (MissingDataError, or a
    ValueError naming a malformed file), if it has them."""
    if getattr(exp, "REQUIRES_EXTRA", None):
        require_extra(exp.REQUIRES_EXTRA, exp.NAME)
    if hasattr(exp, "check_data"):
        exp.check_data(cfg)


def units_of(exp: ModuleType, cfg: Any) -> list[str]:
    """An experiment's resumable units; by default one per method."""
    return exp.units(cfg) if hasattr(exp, "units") else list(cfg.methods)


def steps_of(exp: ModuleType, cfg: Any, unit: str) -> int:
    return exp.unit_steps(cfg, unit) if hasattr(exp, "unit_steps") else cfg.steps


def needs_of(exp: ModuleType, cfg: Any, unit: str) -> list[str]:
    """The units whose output `unit` reads (e.g. a shared warm start): `run --jobs` starts it only once they
    have finished. None unless the experiment defines `unit_needs(cfg, unit)`."""
    return list(exp.unit_needs(cfg, unit)) if hasattr(exp, "unit_needs") else []


def record_diverged(name: str, unit: str, step: int, metric: str, diverged: set[str], writer, bar) -> None:
    """A unit that turned NaN/inf at `step`: its diverged line, a warning, and `unit` into `diverged`."""
    writer.write({"unit": unit, "event": "diverged", "step": step, "metric": metric})
    diverged.add(unit)
    bar.write(f"warning: {name} unit {unit} diverged at step {step} ({metric} is NaN/inf); it is recorded as "
              "diverged, not done, and the run goes on", file=sys.stderr)


NEEDS_DIVERGED = "needs "  # how the diverged-line metric of a unit not started begins (the report reads it)


def skipped_for_diverged_need(exp: ModuleType, cfg: Any, unit: str, diverged: set[str], writer, bar) -> bool:
    """Whether `unit` reads the output of a unit in `diverged`; if so it is not started but recorded as diverged
    at step 0 (metric "needs U, which diverged"), with a warning, its bar as if finished, and joins `diverged`:
    what it would start from holds NaN/inf or was never written (and a unit left to build it itself would do so
    unchecked, and under --jobs beside its siblings)."""
    bad = [n for n in needs_of(exp, cfg, unit) if n in diverged]
    if not bad:
        return False
    metric = f"{NEEDS_DIVERGED}{', '.join(bad)}, which diverged"
    writer.write({"unit": unit, "event": "diverged", "step": 0, "metric": metric})
    bar.write(f"warning: {exp.NAME} unit {unit} is not run: it {metric}; it is recorded as diverged at step 0, and "
              "the run goes on", file=sys.stderr)
    diverged.add(unit)
    bar.update(steps_of(exp, cfg, unit))
    return True


@dataclasses.dataclass(frozen=True)
class Progress:
    """How far a stored run got, unit by unit: `finished` (a done or diverged line), `partial` ({unit: (last step
    logged, steps planned)}: records but no done line, e.g. a killed run) and `missing` (no record yet)."""

    finished: tuple[str, ...]
    partial: dict[str, tuple[int, int]]
    missing: tuple[str, ...]

    @property
    def complete(self) -> bool:
        return not self.partial and not self.missing


def run_progress(exp: ModuleType, run) -> Progress:
    """The Progress of `run` (a store.Run of `exp`) against the units its stored config plans. The status in
    run.json cannot tell: a killed run still says "running", and only the done/diverged lines say what ended."""
    cfg = config_from_dict(exp, run.config)
    ended = run.done_units() | set(run.diverged_units())
    last: dict[str, int] = {}
    for r in run.records:
        if "event" not in r and isinstance(r.get("step"), int):
            last[r.get("unit")] = max(last.get(r.get("unit"), r["step"]), r["step"])
    planned = units_of(exp, cfg)
    return Progress(finished=tuple(u for u in planned if u in ended),
                    partial={u: (last[u], steps_of(exp, cfg, u)) for u in planned if u not in ended and u in last},
                    missing=tuple(u for u in planned if u not in ended and u not in last))


@contextlib.contextmanager
def _on_interrupt(action):
    """Run `action` when Ctrl-C, or SIGTERM (a `reproduce` worker exits on it), stops the block; then go on stopping."""
    try:
        yield
    except (KeyboardInterrupt, SystemExit):
        action()
        raise


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether `exc` is an allocation failure: Python's MemoryError, or torch's CPU/CUDA out-of-memory errors."""
    return isinstance(exc, (MemoryError, torch.OutOfMemoryError)) or (
        isinstance(exc, RuntimeError) and "can't allocate memory" in str(exc))


@contextlib.contextmanager
def _on_failure(name: str, cfg: Any, record_status, restore=None):
    """An exception that ends a run records status "failed (...)" in run.json, so neither the folder nor its report
    says "running". Running out of memory becomes one line naming the config's size (the CLI's exit 2, no
    traceback); any other exception is a bug and keeps its traceback."""
    try:
        yield
    except DataMismatch:  # nothing was computed: the run resumes on its own data
        if restore is not None:
            restore()  # run.json as it was before this refused resume
        else:
            record_status("interrupted")
        raise
    except Exception as exc:  # noqa: BLE001
        first_line = (str(exc).strip().splitlines() or [""])[0]
        if not is_out_of_memory(exc):
            record_status(f"failed ({type(exc).__name__}: {first_line[:200]})")
            raise
        record_status("failed (out of memory)")
        seeds = getattr(cfg, "seeds", 1)
        what = "fewer seeds or a smaller config" if seeds > 1 else "a smaller config (one seed is the least)"
        raise ValueError(f"{name}: out of memory with seeds={seeds} ({first_line[:200]}); run {what}; the run "
                         "folder records the failure (--force replaces it)") from None


def is_not_run(run_dir: str | Path) -> bool:
    """Whether `run_dir` holds only the placeholder that :func:`mark_not_run` writes."""
    if not (Path(run_dir) / RUN_FILE).exists():
        return False
    try:
        return read_run_json(run_dir).get("status") == "not run"
    except RunFileError:
        return False  # a damaged run.json is no placeholder: never overwrite it


def mark_not_run(run_dir: str | Path, exp: ModuleType, preset: str, reason: str) -> None:
    """Record an experiment that could not start (e.g. its data set is missing) so the report lists it as
    not run, with the reason and the command that runs it, instead of silently leaving it out."""
    run_dir = Path(run_dir)
    if (run_dir / RUN_FILE).exists() or (run_dir / METRICS_FILE).exists():
        if not is_not_run(run_dir):
            return  # never overwrite a real run
        empty_dir(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    write_run_json(run_dir, {"experiment": exp.NAME, "title": exp.TITLE, "paper_ref": exp.PAPER_REF,
                             "preset": preset, "config": {}, "command": shlex.join(sys.argv),
                             "versions": versions(), "data_source": "not available", "status": "not run",
                             "reason": reason, "wall_time_s": 0.0, "runs": []})


def empty_dir(run_dir: Path) -> None:
    """Delete everything `run_dir` holds but keep the folder: its lock (an flock on the folder, :func:`_run_dir_lock`)
    stays held. Deleting and re-making the folder left the new one unlocked, so a second run could write into it."""
    for child in run_dir.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()


@contextlib.contextmanager
def _run_dir_lock(run_dir: Path):
    """Hold an exclusive lock on the run folder while a run writes to it: a second `targetpo run` (or a resume, or
    --force) on the same folder is refused instead of interleaving its records with this one's. The lock is
    released when the run ends or its process dies. Platforms without flock (Windows) run unlocked."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    fd = os.open(run_dir, os.O_RDONLY)
    try:
        # A few quick retries: `run_is_live` (a report) holds a shared lock for microseconds while it looks.
        for attempt in range(5):
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if attempt == 4:
                    raise BlockingIOError(f"{run_dir} is in use by another targetpo process (a run, resume or "
                                          "reproduce writing there); wait for it to end, or stop it, then --resume"
                                          ) from None
                time.sleep(0.02)
        yield
    finally:
        os.close(fd)


def run_is_live(run_dir: str | Path) -> bool | None:
    """Whether a process is writing to `run_dir` now (it holds the folder's lock, :func:`_run_dir_lock`); False for
    a run that was killed or interrupted (its run.json still says "running"); None where it cannot be told
    (no flock, or the folder cannot be opened)."""
    try:
        import fcntl
    except ImportError:
        return None
    try:
        fd = os.open(run_dir, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return None
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


def run_experiment(exp: ModuleType, preset: str | None = None, **kwargs) -> Path:
    """Run (or resume) one experiment (its module, see :mod:`targetpo.experiments`) and return its run
    directory. `preset` None means the stored run's preset on resume and "cpu" otherwise; a resume that asks for
    another preset, seed count or overrides than the stored run is refused, naming the fields that differ. The
    run folder is locked while the run writes to it (:func:`_run_dir_lock`). `grant` (what `reproduce` passes): a
    callable giving how many worker processes the run may use now; an experiment that :func:`can_grow` then runs
    its units in worker processes and starts another each time the count grows while units are queued."""
    with contextlib.ExitStack() as held:
        return _run_experiment(exp, preset, hold=lambda d: held.enter_context(_run_dir_lock(d)), **kwargs)


def _run_experiment(
    exp: ModuleType,
    preset: str | None = None,
    *,
    hold,
    out: str | Path | None = None,
    seeds: int | None = None,
    overrides: list[str] | None = None,
    resume: bool = False,
    force: bool = False,
    device: str = "cpu",
    progress: bool = True,
    quiet: bool = False,
    threads: int | None = None,
    jobs: int | None = 1,
    grant: Callable[[], int] | None = None,
) -> Path:
    name = exp.NAME
    if out is not None and not str(out).strip():
        raise ValueError("--out is empty: give the run directory (default results/NAME-PRESET)")
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise ValueError(f"--threads {threads!r}: must be an integer >= 1 (default: the idle cores)")
    threads_asked = threads is not None
    if jobs is not None:  # None: chosen once the units left to run are known (auto_jobs)
        check_jobs(exp, jobs, device)
    dev = resolve_device(exp, device)
    # The idle cores unless asked (or the experiment sets TORCH_THREADS); any count gives the same numbers.
    # `reproduce --jobs N` gives each worker cores // N.
    if threads is not None and threads > (cores := available_cores()):
        print(f"warning: --threads {threads} is more than the {cores} CPU core(s) this process may use; "
              "the numbers are the same, but each parallel op waits for a descheduled thread and runs can be many "
              "times slower (BENCHMARKS.md, \"Threads\")", file=sys.stderr)
    if jobs is not None and jobs > 1:  # the cores shared out between the workers: oversubscribed OpenMP threads stall
        threads = threads or max(1, available_cores() // jobs)
    torch.set_num_threads(threads or getattr(exp, "TORCH_THREADS", None) or default_threads())
    run_dir = Path(out) if out is not None else Path("results") / f"{name}-{preset or 'cpu'}"
    meta_path = run_dir / RUN_FILE
    held = run_dir.is_dir()
    if held:
        hold(run_dir)  # before reading what is there, and before --force deletes it
    placeholder = meta_path.exists() and is_not_run(run_dir)  # reproduce's NOT RUN record: no run to keep
    if resume and not meta_path.exists() and not (run_dir / METRICS_FILE).exists():
        # A typo in --out would otherwise start a new run (perhaps of an hour) where a resume was asked.
        raise FileNotFoundError(f"--resume: {run_dir} holds no run to continue (no {RUN_FILE}); check --out, or "
                                "drop --resume to start a new run there")
    if resume and placeholder:
        raise FileNotFoundError(f"--resume: {run_dir} holds no run to continue, only the record that `reproduce` "
                                "could not run it; drop --resume to run it there")
    if resume and meta_path.exists():
        meta = read_run_json(run_dir)
        cfg = stored_config(exp, run_dir, meta)
        unknown = sorted(set(meta["config"]) - set(config_fields(type(cfg))))
        if unknown:  # a hand edit, or a field this version no longer has: the replay would not be that run's
            raise ValueError(f"--resume: {run_dir / RUN_FILE} has config fields {exp.NAME} does not take "
                             f"({', '.join(unknown)}), so this version cannot replay that run; start it anew with "
                             "--force (or use the version that wrote it)")
        other_preset = preset is not None and preset != meta["preset"]
        if other_preset or overrides or seeds is not None:
            # Without --preset, the stored config with what was given now: --data-dir alone, or --seeds as stored,
            # asks for the same run (built from the preset, every key=value of the original run would differ).
            asked = absolute_locations(configure(cfg, seeds, overrides) if preset is None
                                       else make_config(exp, preset, seeds, overrides))
            given = {override_key(k) for k in overrides or ()}  # data-dir=… is data_dir=…
            # The data's location as given now (the fingerprint check still refuses other data).
            cfg = dataclasses.replace(cfg, **{k: getattr(asked, k) for k in DATA_LOCATION if k in given})
            differ = config_differences(cfg, asked, ignore=DATA_LOCATION)
            if differ or other_preset:
                what = f"preset {preset!r} differs" if other_preset else "the overrides differ"
                fields = show_differences(differ) or "no field"
                raise ValueError(f"--resume continues the {meta['preset']} run stored in {run_dir}, but {what} "
                                 f"({fields}); drop --preset/--seeds/overrides to continue it, or use a new "
                                 f"--out")
        preset = meta["preset"]
        if meta.get("device", device) != device:  # the other half of the curves would come from another device
            raise ValueError(f"--resume continues the run stored in {run_dir}, which ran on --device "
                             f"{meta['device']}; asked --device {device}: pass --device {meta['device']} to "
                             "continue it, or use a new --out")
        if force or not str(meta.get("status", "")).startswith("complete"):  # a complete run reads no data
            _check_data(exp, cfg)                                            # (--force replays its diverged units)
    else:
        preset = preset or "cpu"
        cfg = absolute_locations(make_config(exp, preset, seeds, overrides))  # validated before anything on disk
        _check_data(exp, cfg)  # and the data checked before --force deletes anything
        if meta_path.exists() or (run_dir / METRICS_FILE).exists():
            if not force and resume:  # metrics without their run.json: nothing says which config they came from
                raise FileExistsError(f"{run_dir} holds {METRICS_FILE} but no {RUN_FILE}, so it cannot be resumed; "
                                      "--force replaces it")
            if not force and not placeholder:
                raise FileExistsError(f"{run_dir} already holds a run; pass --resume to continue it or --force to replace it")
            empty_dir(run_dir)  # the folder itself stays: the lock this process holds on it stays valid
        elif held and not force and any(run_dir.iterdir()):
            # A run writes REPORT.md, plots and checkpoints here: files of a folder that is no run are the user's.
            raise FileExistsError(f"{run_dir} is not empty ({folder_listing(run_dir)}) and holds no targetpo run; a "
                                  f"run writes {RUN_FILE}, {METRICS_FILE}, REPORT.md, plots and checkpoints there: "
                                  "choose a new or empty --out, or pass --force to write into it (files of those "
                                  "names are replaced, the rest kept)")
        meta = {"experiment": name, "title": exp.TITLE, "paper_ref": exp.PAPER_REF, "preset": preset,
                "config": dataclasses.asdict(cfg), "command": shlex.join(sys.argv), "versions": versions(),
                "device": device,
                # An experiment that reads data names it once a unit has loaded it (RunContext.set_data_source).
                "data_source": "not loaded yet" if hasattr(exp, "check_data") else "generated (no external data)",
                "status": "running", "wall_time_s": 0.0, "runs": []}
    make_run_dir(run_dir)
    if not held:
        # Also when another process made the folder after this one looked: two runs started together on a new
        # --out both found no folder, and the second used to write beside the first without the lock.
        hold(run_dir)
        if meta_path.exists() or (run_dir / METRICS_FILE).exists():
            raise FileExistsError(f"{run_dir} was filled by another targetpo process while this one started; pass "
                                  "--resume to continue that run once it stops, or use a new --out")

    existing = {record_key(r): r for r in read_metrics(run_dir / METRICS_FILE, repair=True)}
    diverged_before = {k[0] for k in existing if k[2] == "diverged"}
    # A diverged unit is finished: replaying it would diverge at the same step. --force replays it anyway.
    done = {k[0] for k in existing if k[2] == "done"} | (set() if force else diverged_before)
    units = units_of(exp, cfg)
    todo = [u for u in units if u not in done]
    workers = 1  # processes that ran units, for the summary line
    if jobs is None:
        jobs = auto_jobs(exp, preset, device, len(todo), torch.get_num_threads(), threads_asked)
        torch.set_num_threads(max(1, torch.get_num_threads() // jobs))  # the idle cores shared out
    t0, before = time.time(), meta.get("wall_time_s", 0.0)
    reset_peak_memory(dev)

    def record_time(status: str) -> float:
        """This segment's wall time so far (and on a GPU its peak memory) and `status` into run.json; returns the
        segment's time. Written after every finished batch of units too, so a killed run keeps the time up to its
        last one and the total after a resume counts every segment."""
        elapsed = time.time() - t0
        meta["wall_time_s"], meta["runs"][-1]["wall_time_s"], meta["status"] = before + elapsed, elapsed, status
        peak = peak_memory_bytes(dev)
        if peak is not None:
            meta["runs"][-1]["peak_gpu_memory_bytes"] = peak
            meta["peak_gpu_memory_bytes"] = max(peak, meta.get("peak_gpu_memory_bytes", 0))
        write_run_json(run_dir, meta)
        return elapsed

    # A resume the data check refuses (DataMismatch, inside the first unit) puts run.json back as it was.
    stored = meta_path.read_bytes() if meta_path.exists() else None
    meta["status"] = "running"
    meta.setdefault("runs", []).append({"started": time.strftime("%Y-%m-%dT%H:%M:%S"), "resumed": bool(done) or bool(existing),
                         "units": todo, "torch_threads": torch.get_num_threads(), "jobs": jobs,
                         "device": device})  # for reading wall times
    # From before run.json says "running" to the last record: a Ctrl-C or SIGTERM anywhere in between (even while
    # the metrics file is being created) leaves the status "interrupted", never a stale "running".
    with (_on_interrupt(lambda: record_time("interrupted")),
          _on_failure(name, cfg, record_time,
                      restore=None if stored is None else lambda: restore_run_json(run_dir, stored)),
          deterministic_kernels(dev),
          contextlib.ExitStack() as open_files):
        write_run_json(run_dir, meta)
        total = sum(steps_of(exp, cfg, u) for u in todo)
        writer = open_files.enter_context(contextlib.closing(MetricsWriter(run_dir / METRICS_FILE, existing)))
        nan_ok = getattr(type(cfg), "NAN_MEANS_EMPTY", ())  # metrics that are NaN by design (a mean over nothing)
        with tqdm(total=total, desc=f"{name} [{preset}]", unit="step", disable=not progress, mininterval=0.5,
                  file=sys.stderr, dynamic_ncols=True) as bar:
            # Units computed together (`run_units`: methods batched like seeds) form one batch, others a batch each.
            # A diverged unit leaves its batch and the others replay from their start: the writer skips the records
            # already on disk, as on resume.
            batched = hasattr(exp, "run_units")
            run_units = exp.run_units if batched else lambda c, units, ctxs: exp.run_unit(c, units[0], ctxs[units[0]])
            # Units diverged in this segment or before it (those --force replays count only once replayed).
            diverged_now = set() if force else set(diverged_before)
            grow = grant if grant is not None and can_grow(exp, device) else None
            if len(todo) > 1 and (jobs > 1 or grow is not None):
                workers = _run_in_workers(exp, cfg, todo, jobs, torch.get_num_threads(), dev, meta, run_dir, writer,
                                          bar, nan_ok, record_time, diverged_now, grow)
                meta["runs"][-1]["workers"] = workers
                todo = []
            for i, pending in enumerate([list(todo)] if batched else [[u] for u in todo]):
                if i:
                    record_time("running")  # the batches before this one are finished
                if not batched and skipped_for_diverged_need(exp, cfg, pending[0], diverged_now, writer, bar):
                    continue
                while pending:
                    bar.set_postfix_str("+".join(pending))
                    start = bar.n
                    try:
                        run_units(cfg, list(pending), {u: RunContext(u, writer, bar, dev, meta, run_dir, nan_ok)
                                                       for u in pending})
                    except _Diverged as d:
                        record_diverged(name, d.unit, d.step, d.metric, diverged_now, writer, bar)
                        pending.remove(d.unit)
                        bar.n = start + steps_of(exp, cfg, d.unit)  # the diverged unit's bar as if it had finished
                        bar.refresh()
                        continue
                    for unit in pending:
                        writer.write({"unit": unit, "event": "done"})
                    break
    diverged = sorted({k[0] for k in writer.existing if k[2] == "diverged"})

    if diverged:
        meta["diverged"] = diverged
    if writer.mismatches:
        meta["resume_mismatches"] = [list(k) for k in writer.mismatches]
        print(f"warning: {len(writer.mismatches)} replayed record(s) differ from the ones on disk "
              f"(non-deterministic replay); the original lines were kept", file=sys.stderr)
    elapsed = record_time(f"complete ({count(len(diverged), 'unit')} diverged)" if diverged else "complete")
    if not quiet:
        line = (f"{name} [{preset}] done in {elapsed:.1f}s ({count(cfg.seeds, 'seed')}, {count(len(units), 'unit')}"
                f"{f', {workers} processes' if workers > 1 else ''}) -> {run_dir}")
        if hasattr(exp, "summary"):
            from targetpo.runs.store import Run

            line += "\n  " + exp.summary(Run.load(run_dir))
        print(line)
    return run_dir


# ----------------------------------------------------------------------------- units in worker processes

def auto_jobs(exp: ModuleType, preset: str, device: str, units: int, cores: int, threads_asked: bool) -> int:
    """`run`'s worker processes when --jobs is not given: on a CPU, an experiment whose units run apart spreads
    them over the `cores` idle when the run starts, one process each. Small models use cores better as processes
    than as threads of one process (token-sweeps' cpu preset 1.6x faster on a 2-core machine, BENCHMARKS.md), and
    each unit computes the same numbers either way. One process for a smoke preset (seconds of work, less than
    starting a worker costs), a batched experiment, an accelerator, when --threads asks for a thread count, or an
    experiment that sets JOBS_BY_DEFAULT = False (the LM experiments: a model copy per worker)."""
    if threads_asked or preset == "smoke" or not can_grow(exp, device):
        return 1
    return max(1, min(cores, units))


def _no_workers(exp: ModuleType, device: str) -> str | None:
    """Why `exp`'s units cannot run in worker processes on `device` (what follows "--jobs N" in the error), or
    None."""
    if str(device) != "cpu":
        return (f" with --device {device}: worker processes share out CPU cores; on an accelerator the units run one "
                "after another (drop --jobs)")
    if hasattr(exp, "run_units"):
        return (f": {exp.NAME} computes all its units together in one batch (its methods batched like seeds), so "
                "there are no units to run apart; drop --jobs")
    return None


def can_grow(exp: ModuleType, device: str) -> bool:
    """Whether a run of `exp` may spread its units over worker processes unasked: `run` over the idle cores
    (:func:`auto_jobs`), `reproduce` over the cores of experiments that finished. Units that run apart on the CPU,
    each without a model copy of its own (JOBS_BY_DEFAULT) or a thread count it needs (TORCH_THREADS)."""
    return (_no_workers(exp, device) is None and getattr(exp, "JOBS_BY_DEFAULT", True)
            and not getattr(exp, "TORCH_THREADS", None))


def check_jobs(exp: ModuleType, jobs: int, device: str) -> None:
    """ValueError unless `jobs` (units run at once, `run --jobs`) is an integer >= 1 that `exp` and `device` allow:
    more than one needs the CPU and an experiment whose units run apart (not batched by `run_units`)."""
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"--jobs {jobs!r}: must be an integer >= 1 (units run at once, each in its own process)")
    if jobs > 1 and (why := _no_workers(exp, device)):
        raise ValueError(f"--jobs {jobs}{why}")


class UnitFailed(RuntimeError):
    """A unit raised in its `run --jobs` worker; the message carries the worker's traceback."""


class _ToParent:
    """A `run --jobs` worker's stand-in for the runner's metrics writer and progress bar: both go to the parent."""

    def __init__(self, conn):
        self._conn = conn

    def write(self, record: dict) -> None:
        self._conn.send(("log", {k: v for k, v in record.items() if k != "unit"}))

    def update(self, n: int = 1) -> None:
        self._conn.send(("advance", n))


def _unit_worker(conn, module: str, config: dict, threads: int, device: str, run_dir: str, data: dict,
                 nan_ok: tuple[str, ...]) -> None:
    """A `run --jobs` worker (started by `runs.workers.start_worker`) with `threads` torch threads that runs the
    units its parent sends over `conn` (None: stop), one at a time. A unit's records, progress and data source go
    to the parent, then ("done",), ("diverged", step, metric) or ("failed", kind, text) with kind "memory", "data"
    or "error"."""
    become_worker()
    torch.set_num_threads(threads)
    exp = importlib.import_module(module)
    cfg = validated(config_from_dict(exp, config))
    to_parent = _ToParent(conn)
    while (unit := conn.recv()) is not None:
        try:
            ctx = RunContext(unit, to_parent, to_parent, torch.device(device), data, Path(run_dir), nan_ok,
                             on_data=lambda description, fingerprint: conn.send(("data", description, fingerprint)))
            exp.run_unit(cfg, unit, ctx)
        except _Diverged as d:
            conn.send(("diverged", d.step, d.metric))
        except DataMismatch as exc:
            conn.send(("failed", "data", str(exc)))
        except Exception as exc:  # noqa: BLE001  (the parent records it and stops the run)
            first_line = (str(exc).strip().splitlines() or [""])[0]
            conn.send(("failed", "memory", first_line) if is_out_of_memory(exc)
                      else ("failed", "error", traceback.format_exc()))
        else:
            conn.send(("done",))


def _run_in_workers(exp: ModuleType, cfg: Any, units: list[str], jobs: int, threads: int, dev: torch.device,
                    meta: dict, run_dir: Path, writer: MetricsWriter, bar: tqdm, nan_ok: tuple[str, ...],
                    record_time: Callable[[str], float], diverged: set[str],
                    grant: Callable[[], int] | None = None) -> int:
    """Run `units` in up to `jobs` worker processes of `threads` torch threads each, the longest first of
    those whose needs (:func:`needs_of`) have finished; this process writes every record (a unit's in its order)
    and owns run.json. A unit computes exactly what it computes in this process (its seeds, its config, any
    thread count), so only the interleaving of the units' lines in metrics.jsonl differs. A failing unit stops the
    others (their records so far are kept, and a resume replays them) and raises here: UnitFailed with its
    traceback, or as the runner's own errors would. `diverged` (the units ended diverged so far) gains those that
    diverge here; a unit that needs one of them is recorded as diverged without being started.

    `grant` (reproduce): how many workers the run may have now, which grows as the caller's other experiments
    finish; a worker is added while queued units are left. Returns the number of workers started."""
    queue = sorted(units, key=lambda u: -steps_of(exp, cfg, u))
    data = {k: meta[k] for k in ("data_source", "data_fingerprint") if k in meta}
    workers = []

    def add_workers() -> None:
        allowed = max(jobs, grant()) if grant is not None else jobs
        while len(workers) < allowed and len(workers) < len(busy) + len(queue):
            parent_end, child_end = CONTEXT.Pipe()
            proc = start_worker(_unit_worker, (child_end, exp.__name__, dataclasses.asdict(cfg), threads, str(dev),
                                               str(run_dir), data, nan_ok), name=f"{exp.NAME}-worker-{len(workers)}")
            child_end.close()
            workers.append((parent_end, proc))

    busy: dict[Any, str] = {}                     # connection -> the unit its worker runs
    advanced = dict.fromkeys(units, 0)
    try:
        while queue or busy:
            add_workers()
            for conn, _ in workers:
                while conn not in busy and (unit := _ready(exp, cfg, queue, busy.values())) is not None:
                    queue.remove(unit)
                    if skipped_for_diverged_need(exp, cfg, unit, diverged, writer, bar):
                        continue
                    busy[conn] = unit
                    conn.send(unit)
            if not busy and not queue:  # the last units were not started: they needed a diverged one
                break
            if not busy:  # units left, none startable: they need each other
                raise ValueError(f"{exp.NAME}: units {', '.join(queue)} wait for each other (unit_needs has a cycle)")
            bar.set_postfix_str("+".join(busy.values()))
            # With a grant and units queued, look again every GRANT_POLL_S for cores handed over meanwhile.
            timeout = GRANT_POLL_S if grant is not None and queue else None
            for conn in multiprocessing.connection.wait(list(busy), timeout):
                unit = busy[conn]
                try:
                    message = conn.recv()
                except EOFError:  # the worker died without a last word (killed, or out of memory at the OS level)
                    proc = next(p for c, p in workers if c is conn)
                    proc.join()
                    message = ("failed", "error", f"its worker process exited with code {proc.exitcode} before the "
                               "unit ended")
                kind = message[0]
                if kind == "log":
                    _exit_if_stopping()
                    writer.write({"unit": unit, **message[1]})
                    continue
                if kind == "advance":
                    advanced[unit] += message[1]
                    bar.update(message[1])
                    continue
                if kind == "data":
                    description, fingerprint = message[1:]
                    meta["data_source"] = description
                    if fingerprint is not None:
                        meta["data_fingerprint"] = fingerprint
                    write_run_json(run_dir, meta)
                    continue
                del busy[conn]
                if kind == "done":
                    writer.write({"unit": unit, "event": "done"})
                elif kind == "diverged":
                    step, metric = message[1:]
                    record_diverged(exp.NAME, unit, step, metric, diverged, writer, bar)
                    bar.update(steps_of(exp, cfg, unit) - advanced[unit])  # its bar as if it had finished
                else:
                    _, why, text = message
                    if why == "memory":
                        raise MemoryError(text)
                    if why == "data":
                        raise DataMismatch(text)
                    raise UnitFailed(f"{exp.NAME} unit {unit} failed in its worker process:\n{text.rstrip()}")
                record_time("running")  # a killed run keeps the time up to its last finished unit
        for conn, _ in workers:
            conn.send(None)
        for _, proc in workers:
            proc.join(timeout=30)
    finally:
        stop_workers([proc for _, proc in workers])
    return len(workers)


GRANT_POLL_S = 1.0


def _ready(exp: ModuleType, cfg: Any, queue: list[str], running) -> str | None:
    """The first unit of `queue` (longest first) whose needs are all finished: none still queued or running."""
    waiting = set(queue) | set(running)
    return next((u for u in queue if not waiting.intersection(needs_of(exp, cfg, u))), None)


@contextlib.contextmanager
def deterministic_kernels(dev: torch.device):
    """On a CUDA device, the block runs with torch's deterministic algorithms, so that a seed and config give the
    same numbers again and a resume replays exactly (docs/architecture.md, "Resume"): e.g. the token engine's
    gathers differentiate through `index_add_`, whose CUDA kernel adds with atomics in no fixed order. An op with
    no deterministic kernel warns (`warn_only`) rather than stopping a run. cuBLAS needs a fixed workspace for
    it, `CUBLAS_WORKSPACE_CONFIG=:4096:8`, set unless the environment already sets it (read when cuBLAS starts:
    in a process that used cuBLAS before, set it yourself). On other devices nothing changes: the CPU kernels
    these experiments use are deterministic."""
    if dev.type != "cuda":
        yield
        return
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    was, warn_only = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(was, warn_only=warn_only)


def reset_peak_memory(dev: torch.device) -> None:
    """Start counting a CUDA device's peak memory from now (a run's segment); nothing on other devices."""
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)


def peak_memory_bytes(dev: torch.device) -> int | None:
    """Peak memory torch allocated on a CUDA device since :func:`reset_peak_memory`; None on other devices
    (the CPU has no such counter: BENCHMARKS.md measures CPU memory with the profiler)."""
    return int(torch.cuda.max_memory_allocated(dev)) if dev.type == "cuda" else None


def computes_on(exp: ModuleType, dev: torch.device) -> bool:
    """Whether the experiment's units compute on `dev` (its Config.DEVICES; None: any device)."""
    allowed = config_class(exp).DEVICES
    return allowed is None or dev.type in allowed


def resolve_device(exp: ModuleType, device: str) -> torch.device:
    """The torch device `device` names, or a ValueError saying why this experiment cannot compute on it: an
    experiment that runs on the CPU only (Config.DEVICES), or see :func:`parse_device`."""
    dev = parse_device(device)
    if not computes_on(exp, dev):
        allowed = config_class(exp).DEVICES
        fix = "drop --device" if allowed == ("cpu",) else f"give --device {' or '.join(allowed)}"
        raise ValueError(f"--device {device}: {exp.NAME} computes on {' or '.join(allowed)} only; {fix}")
    return dev


def parse_device(device: str | torch.device, name: str = "--device ") -> torch.device:
    """The torch device `device` names, or a ValueError starting with `name` (the flag, or "device=" for a Python
    argument): not a device string, or a device this machine lacks."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"{name}{str(device)!r}: not a torch device (e.g. cpu, cuda, cuda:1, mps)") from None
    if dev.type == "cuda":
        have = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if (dev.index or 0) >= have:
            raise ValueError(f"{name}{device}: this machine has {have} CUDA device(s) usable by torch "
                             f"{torch.__version__} (built with CUDA {torch.version.cuda or 'none'})")
    elif dev.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"{name}{device}: MPS is not available to torch {torch.__version__} here")
    return dev


def add_runner_arguments(parser, *, unit: str = "units",
                         partial: str = "is replayed without rewriting the lines already on disk") -> None:
    """The command-line options of :func:`run_experiment` shared by `targetpo run` and `targetpo rlvr`: `unit`
    names what is resumed, `partial` what becomes of one a killed run left part-done."""
    parser.add_argument("--resume", action="store_true", help=f"continue the run stored in --out: finished {unit} "
                        f"(done or diverged) are skipped, a partial one {partial}")
    parser.add_argument("--force", action="store_true", help="delete an existing run in --out and start over "
                        "(a non-empty --out that holds no run: write into it, keeping its other files); "
                        f"with --resume, replay diverged {unit} instead")
    parser.add_argument("--device", default="cpu", help="torch device, e.g. cpu or cuda")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: the cores idle "
                        "when the run starts; with --jobs, cores // jobs per worker; the same numbers with any count)")
    parser.add_argument("--jobs", type=int, default=None, help=f"{unit} run at once, each in its own process "
                        "(1: one after another in this process). Default: on a CPU, one per core idle when the run "
                        "starts, unless the preset is smoke, --threads is given or each worker would hold a language "
                        "model (rlvr, llm-length: 1). Small models use cores better this way than as threads of one "
                        "process; each unit computes the same numbers either way")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    parser.add_argument("--no-report", action="store_true", help="do not write REPORT.md into the run directory")
