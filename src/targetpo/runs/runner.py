"""The one runner every experiment shares: presets and overrides, run.json, append-only metrics, progress,
resume, and the end-of-run summary. Experiments never write files or drive progress bars themselves."""

from __future__ import annotations

import dataclasses
import json
import shutil
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from tqdm.auto import tqdm

from targetpo.runs.store import METRICS_FILE, RUN_FILE, MetricsWriter, read_metrics, record_key, versions, write_run_json
from targetpo.runs.config import config_from_dict, make_config, validated


class RunContext:
    """What a unit sees of the runner: `log` a metrics record, `advance` the progress bar, a `device`."""

    def __init__(self, unit: str, writer: MetricsWriter, bar: tqdm, device: torch.device, meta: dict,
                 run_dir: Path | None = None):
        self.unit = unit
        self.run_dir = run_dir  # for units that keep files (model checkpoints) next to the metrics
        self._writer = writer
        self._bar = bar
        self.device = device
        self._meta = meta

    def log(self, record: dict[str, Any]) -> None:
        if "step" not in record:
            raise ValueError(f"a metrics record needs a 'step' key; got keys {sorted(record)}")
        self._writer.write({"unit": self.unit, **record})

    def advance(self, n: int = 1) -> None:
        self._bar.update(n)

    def set_data_source(self, description: str) -> None:
        """Recorded in run.json and shown in every report (e.g. which MNIST split was used)."""
        self._meta["data_source"] = description


# ----------------------------------------------------------------------------- running

def config_differences(a: Any, b: Any) -> dict[str, tuple[Any, Any]]:
    """{field: (value in a, value in b)} for the fields where two configs of one class differ."""
    da, db = dataclasses.asdict(a), dataclasses.asdict(b)
    return {k: (da[k], db[k]) for k in da if da[k] != db.get(k)}


def make_run_dir(run_dir: Path) -> None:
    """Create the run directory, or say which path cannot be written and why (one line, no traceback)."""
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        probe = run_dir / ".write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        blocker = next((p for p in [run_dir, *run_dir.parents] if p.exists()), None)
        why = exc.strerror or str(exc)
        if blocker is not None and not blocker.is_dir():
            why = f"{blocker} is a file, not a directory"
        raise OSError(f"cannot write the run directory {run_dir}: {why}") from None

def units_of(exp: ModuleType, cfg: Any) -> list[str]:
    """An experiment's resumable units; by default one per method."""
    return exp.units(cfg) if hasattr(exp, "units") else list(cfg.methods)


def steps_of(exp: ModuleType, cfg: Any, unit: str) -> int:
    return exp.unit_steps(cfg, unit) if hasattr(exp, "unit_steps") else cfg.steps


def is_not_run(run_dir: str | Path) -> bool:
    """Whether `run_dir` holds only the placeholder that :func:`mark_not_run` writes."""
    path = Path(run_dir) / RUN_FILE
    return path.exists() and json.loads(path.read_text()).get("status") == "not run"


def mark_not_run(run_dir: str | Path, exp: ModuleType, preset: str, reason: str) -> None:
    """Record an experiment that could not start (e.g. its data set is missing) so the report lists it as
    not run, with the reason and the command that runs it, instead of silently leaving it out."""
    run_dir = Path(run_dir)
    if (run_dir / RUN_FILE).exists() or (run_dir / METRICS_FILE).exists():
        if not is_not_run(run_dir):
            return  # never overwrite a real run
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    write_run_json(run_dir, {"experiment": exp.NAME, "title": exp.TITLE, "paper_ref": exp.PAPER_REF,
                             "preset": preset, "config": {}, "seeds": [], "command": " ".join(sys.argv),
                             "versions": versions(), "data_source": "not available", "status": "not run",
                             "reason": reason, "wall_time_s": 0.0, "runs": []})


def run_experiment(
    exp: ModuleType,
    preset: str | None = None,
    *,
    out: str | Path | None = None,
    seeds: int | None = None,
    overrides: list[str] | None = None,
    resume: bool = False,
    force: bool = False,
    device: str = "cpu",
    progress: bool = True,
    quiet: bool = False,
    threads: int | None = None,
) -> Path:
    """Run (or resume) one experiment (its module, see :mod:`targetpo.experiments`) and return its run
    directory. `preset` None means the stored run's preset on resume and "cpu" otherwise; a resume that asks for
    another preset, seed count or overrides than the stored run is refused, naming the fields that differ."""
    name = exp.NAME
    # Tiny-tensor experiments run far faster on one thread: OpenMP hand-offs cost more than the math.
    threads = threads or getattr(exp, "TORCH_THREADS", None)
    if threads:
        torch.set_num_threads(threads)
    run_dir = Path(out) if out is not None else Path("results") / f"{name}-{preset or 'cpu'}"
    meta_path = run_dir / RUN_FILE
    if resume and meta_path.exists():
        meta = json.loads(meta_path.read_text())
        if meta["experiment"] != name:
            raise ValueError(f"{run_dir} holds a {meta['experiment']} run, not {name}")
        cfg = validated(config_from_dict(exp, meta["config"]))
        if (preset is not None and preset != meta["preset"]) or overrides or seeds is not None:
            requested = make_config(exp, preset or meta["preset"], seeds, overrides)
            differ = config_differences(cfg, requested)
            if differ or (preset is not None and preset != meta["preset"]):
                what = f"preset {preset!r} differs" if preset is not None and preset != meta["preset"] else "the overrides differ"
                fields = "; ".join(f"{k}: stored {a!r}, asked {b!r}" for k, (a, b) in differ.items()) or "no field"
                raise ValueError(f"--resume continues the {meta['preset']} run stored in {run_dir}, but {what} "
                                 f"({fields}); drop --preset/--seeds/overrides to continue it, or use a new "
                                 f"--out")
        preset = meta["preset"]
    else:
        preset = preset or "cpu"
        cfg = make_config(exp, preset, seeds, overrides)  # validated before anything on disk is touched
        if meta_path.exists() or (run_dir / METRICS_FILE).exists():
            if not force:
                raise FileExistsError(f"{run_dir} already holds a run; pass --resume to continue it or --force to replace it")
            shutil.rmtree(run_dir)
        meta = {"experiment": name, "title": exp.TITLE, "paper_ref": exp.PAPER_REF, "preset": preset,
                "config": dataclasses.asdict(cfg), "seeds": list(range(getattr(cfg, "seed", 0),
                                                                      getattr(cfg, "seed", 0) + cfg.seeds)),
                "command": " ".join(sys.argv), "versions": versions(), "device": device,
                "data_source": getattr(exp, "DATA_SOURCE", "generated (no external data)"),
                "status": "running", "wall_time_s": 0.0, "runs": []}
    if hasattr(exp, "check_data"):  # fail before creating anything when the data set cannot be found
        exp.check_data(cfg)
    make_run_dir(run_dir)

    existing = {record_key(r): r for r in read_metrics(run_dir / METRICS_FILE, repair=True)}
    done = {k[0] for k in existing if k[2] == "done"}
    units = units_of(exp, cfg)
    todo = [u for u in units if u not in done]
    t0 = time.time()
    meta["status"] = "running"
    meta["runs"].append({"started": time.strftime("%Y-%m-%dT%H:%M:%S"), "resumed": bool(done) or bool(existing),
                         "units": todo})
    write_run_json(run_dir, meta)

    total = sum(steps_of(exp, cfg, u) for u in todo)
    writer = MetricsWriter(run_dir / METRICS_FILE, existing)
    dev = torch.device(device)
    with tqdm(total=total, desc=f"{name} [{preset}]", unit="step", disable=not progress, mininterval=0.5,
              file=sys.stderr, dynamic_ncols=True) as bar:
        for unit in todo:
            bar.set_postfix_str(unit)
            exp.run_unit(cfg, unit, RunContext(unit, writer, bar, dev, meta, run_dir))
            writer.write({"unit": unit, "event": "done"})
    writer.close()

    elapsed = time.time() - t0
    meta["wall_time_s"] = meta.get("wall_time_s", 0.0) + elapsed
    meta["runs"][-1]["wall_time_s"] = elapsed
    meta["status"] = "complete"
    if writer.mismatches:
        meta["resume_mismatches"] = [list(k) for k in writer.mismatches]
        print(f"warning: {len(writer.mismatches)} replayed record(s) differ from the ones on disk "
              f"(non-deterministic replay); the original lines were kept", file=sys.stderr)
    write_run_json(run_dir, meta)
    if not quiet:
        line = f"{name} [{preset}] done in {elapsed:.1f}s ({cfg.seeds} seeds, {len(units)} units) -> {run_dir}"
        if hasattr(exp, "summary"):
            from targetpo.runs.store import Run

            line += "\n  " + exp.summary(Run.load(run_dir))
        print(line)
    return run_dir


def add_runner_arguments(parser, *, unit: str = "units", threads_default: str = "the experiment's choice") -> None:
    """The command-line options of :func:`run_experiment` shared by `targetpo run` and `targetpo rlvr`."""
    parser.add_argument("--resume", action="store_true", help=f"continue the run stored in --out: finished {unit} "
                        "are skipped, a partial one is replayed without rewriting the lines already on disk")
    parser.add_argument("--force", action="store_true", help="delete an existing run in --out and start over")
    parser.add_argument("--device", default="cpu", help="torch device, e.g. cpu or cuda")
    parser.add_argument("--threads", type=int, default=None, help=f"torch CPU threads (default: {threads_default})")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    parser.add_argument("--no-report", action="store_true", help="do not write REPORT.md into the run directory")
