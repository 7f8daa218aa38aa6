"""The one runner every experiment shares: presets and overrides, run.json, append-only metrics, progress,
resume, and the end-of-run summary. Experiments never write files or drive progress bars themselves."""

from __future__ import annotations

import dataclasses
import json
import shutil
import sys
import time
import typing
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from tqdm.auto import tqdm

from ..reporting.store import METRICS_FILE, RUN_FILE, MetricsWriter, read_metrics, record_key, versions, write_run_json
from . import config_class, load


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


# ----------------------------------------------------------------------------- config handling

def check_config(cfg: Any, allowed_methods: tuple[str, ...], positive: tuple[str, ...] = ("seeds", "steps")) -> None:
    """The validation every experiment shares: known methods, positive counts."""
    bad = [m for m in getattr(cfg, "methods", ()) if m not in allowed_methods]
    if bad:
        raise ValueError(f"methods {bad} not in {allowed_methods}")
    small = {f: getattr(cfg, f) for f in positive if getattr(cfg, f) < 1}
    if small:
        raise ValueError(f"these config fields must be >= 1: {small}")


def units_of(exp: ModuleType, cfg: Any) -> list[str]:
    """An experiment's resumable units; by default one per method."""
    return exp.units(cfg) if hasattr(exp, "units") else list(cfg.methods)


def steps_of(exp: ModuleType, cfg: Any, unit: str) -> int:
    return exp.unit_steps(cfg, unit) if hasattr(exp, "unit_steps") else cfg.steps


def config_fields(cfg_cls: type) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(cfg_cls)}


def _parse_value(text: str, annotation: Any, name: str) -> Any:
    origin = typing.get_origin(annotation)
    if origin in (tuple, list):
        inner = typing.get_args(annotation)[0] if typing.get_args(annotation) else str
        items = [_parse_value(t.strip(), inner, name) for t in text.split(",") if t.strip()]
        return tuple(items) if origin is tuple else items
    if origin is typing.Union or str(origin) == "types.UnionType":
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if text.lower() in ("none", "null"):
            return None
        return _parse_value(text, args[0], name)
    try:
        if annotation is bool:
            if text.lower() in ("1", "true", "yes", "on"):
                return True
            if text.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError
        if annotation in (int, float, str):
            return annotation(text)
    except ValueError:
        raise ValueError(f"override {name}={text!r}: expected {annotation.__name__}") from None
    return text


def apply_overrides(cfg: Any, overrides: list[str]) -> Any:
    """`key=value` strings → a new config. Unknown keys are an error listing the valid ones."""
    hints = typing.get_type_hints(type(cfg))
    changes = {}
    for item in overrides:
        if "=" not in item:
            raise ValueError(f"override {item!r} must look like key=value")
        key, value = item.split("=", 1)
        key = key.strip().replace("-", "_")
        if key not in hints:
            raise ValueError(f"unknown config field {key!r}; valid fields: {', '.join(hints)}")
        changes[key] = _parse_value(value.strip(), hints[key], key)
    return dataclasses.replace(cfg, **changes)


def make_config(exp: ModuleType, preset: str, seeds: int | None = None, overrides: list[str] | None = None) -> Any:
    if preset not in exp.PRESETS:
        raise ValueError(f"experiment {exp.NAME} has no preset {preset!r}; presets: {', '.join(exp.PRESETS)}")
    cfg = exp.PRESETS[preset]
    if seeds is not None:
        cfg = dataclasses.replace(cfg, seeds=seeds)
    cfg = apply_overrides(cfg, overrides or [])
    if hasattr(cfg, "validate"):
        cfg.validate()
    return cfg


def config_from_dict(exp: ModuleType, data: dict) -> Any:
    cls = config_class(exp)
    hints = typing.get_type_hints(cls)
    fixed = {k: (tuple(v) if isinstance(v, list) and typing.get_origin(hints.get(k)) is tuple else v)
             for k, v in data.items() if k in hints}
    return cls(**fixed)


# ----------------------------------------------------------------------------- running

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
    name: str,
    preset: str = "cpu",
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
    """Run (or resume) one experiment and return its run directory."""
    exp = load(name)
    # Tiny-tensor experiments run far faster on one thread: OpenMP hand-offs cost more than the math.
    threads = threads or getattr(exp, "TORCH_THREADS", None)
    if threads:
        torch.set_num_threads(threads)
    run_dir = Path(out) if out is not None else Path("results") / f"{name}-{preset}"
    meta_path = run_dir / RUN_FILE
    if resume and meta_path.exists():
        meta = json.loads(meta_path.read_text())
        if meta["experiment"] != name:
            raise ValueError(f"{run_dir} holds a {meta['experiment']} run, not {name}")
        cfg = config_from_dict(exp, meta["config"])
        if overrides or seeds is not None:
            requested = dataclasses.asdict(make_config(exp, meta["preset"], seeds, overrides))
            if requested != dataclasses.asdict(cfg):
                raise ValueError(f"--resume continues the config stored in {meta_path}; drop the overrides or use a new --out")
    else:
        if meta_path.exists() or (run_dir / METRICS_FILE).exists():
            if not force:
                raise FileExistsError(f"{run_dir} already holds a run; pass --resume to continue it or --force to replace it")
            shutil.rmtree(run_dir)
        cfg = make_config(exp, preset, seeds, overrides)
        meta = {"experiment": name, "title": exp.TITLE, "paper_ref": exp.PAPER_REF, "preset": preset,
                "config": dataclasses.asdict(cfg), "seeds": list(range(getattr(cfg, "seed", 0),
                                                                      getattr(cfg, "seed", 0) + cfg.seeds)),
                "command": " ".join(sys.argv), "versions": versions(), "device": device,
                "data_source": getattr(exp, "DATA_SOURCE", "generated (no external data)"),
                "status": "running", "wall_time_s": 0.0, "runs": []}
    if hasattr(exp, "check_data"):  # fail before creating anything when the data set cannot be found
        exp.check_data(cfg)
    run_dir.mkdir(parents=True, exist_ok=True)

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
            from ..reporting.store import Run

            line += "\n  " + exp.summary(Run.load(run_dir))
        print(line)
    return run_dir
