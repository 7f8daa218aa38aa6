"""Append-only run storage.

A run directory holds `run.json` (config, which gives the seeds, versions, data source, wall time, status) and
`metrics.jsonl`, one JSON object per line, each written with a single write and flushed as soon as it is
produced, so a killed process keeps every complete line (an operating-system crash or power loss may still lose
the lines the kernel had not written out: `MetricsWriter(fsync=True)` syncs each one, at a cost per record). Records are keyed by (unit, step); on
resume the runner replays a unit deterministically and skips keys already on disk, so nothing written before
a kill is lost or duplicated. A unit is finished when its `{"unit": u, "event": "done"}` line exists, or its
`{"unit": u, "event": "diverged", "step": N, "metric": name}` line (a NaN/inf at step N; no record of step N
or later is stored for it). Event lines are not metrics records: `rows`, `units` and `series` skip them.
"""

from __future__ import annotations

import json
import math
import os
import platform
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

RUN_FILE = "run.json"
METRICS_FILE = "metrics.jsonl"


def _num(x: float) -> str:
    # 7 significant digits: enough for errors down to 1e-7, and 3x smaller files than repr(float64).
    if math.isfinite(x):
        return f"{x:.7g}"
    return "NaN" if x != x else ("Infinity" if x > 0 else "-Infinity")


_ROW_FORMATS: dict[int, str] = {}


def _row(values: list[float]) -> str:
    """A JSON list of finite floats as _num writes them: one %-format for the whole row (printf's %.7g is the
    same text as format(x, ".7g")), ~10x faster than formatting each number; per-seed rows are most of a log."""
    fmt = _ROW_FORMATS.get(len(values))
    if fmt is None:
        fmt = _ROW_FORMATS[len(values)] = "[" + ",".join(["%.7g"] * len(values)) + "]"
    return fmt % tuple(values)


def _render(x: Any) -> str:
    """JSON text of a record value; tensors and arrays become flat or nested lists of numbers."""
    if type(x) is str:  # noqa: E721  (the run's few unit and event names: rendered once)
        return _key(x) if len(x) <= 64 else json.dumps(x)
    if type(x) is not np.ndarray and hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    if isinstance(x, np.ndarray):
        if x.ndim == 0:
            return _render(x.item())
        if x.dtype.kind in "fc":
            if x.ndim == 1:
                if x.dtype.kind == "f":
                    text = _row(x.tolist())
                    if "n" not in text:  # %g writes a NaN or ±inf as nan/inf, which JSON spells otherwise
                        return text
                return "[" + ",".join(map(_num, x.tolist())) + "]"
            return "[" + ",".join(_render(r) for r in x) + "]"
        return json.dumps(x.tolist())
    if isinstance(x, dict):
        return "{" + ",".join(f"{_key(k)}:{_render(v)}" for k, v in x.items()) + "}"
    if isinstance(x, (list, tuple)):
        return "[" + ",".join(_render(v) for v in x) + "]"
    if isinstance(x, (float, np.floating)):
        return _num(float(x))
    if isinstance(x, np.integer) or type(x) is int:  # noqa: E721  (not bool, a subclass of int)
        return str(int(x))
    return json.dumps(x)


_KEYS: dict[str, str] = {}


def _key(k: Any) -> str:
    """The JSON text of a record key; the few distinct keys (and unit names) of a run are rendered once."""
    k = str(k)
    text = _KEYS.get(k)
    if text is None:
        text = json.dumps(k)
        if len(_KEYS) < 4096:  # bounded: a log of many distinct strings renders the rest each time
            _KEYS[k] = text
    return text


def _jsonable(x: Any) -> Any:
    return json.loads(_render(x))


# Timing values differ between a run and its replay; they are kept as first written and not compared.
VOLATILE_PREFIX = "wall_"


def _stable(rec: dict) -> dict:
    return {k: v for k, v in rec.items() if not k.startswith(VOLATILE_PREFIX)}


def record_key(rec: dict) -> tuple:
    return (rec.get("unit"), rec.get("step"), rec.get("event"))


class MetricsWriter:
    """Appends records to metrics.jsonl, skipping keys already present (resume) and flushing every line."""

    def __init__(self, path: Path, existing: dict[tuple, dict] | None = None, fsync: bool = False):
        self.path = Path(path)
        self.existing = existing or {}
        self.mismatches: list[tuple] = []
        self._fh = open(self.path, "a", encoding="utf-8")
        self._fsync = fsync

    def write(self, rec: dict) -> bool:
        """Write `rec` unless its key is already on disk; returns True if a line was written."""
        line = _render(rec)
        key = record_key(rec)
        if key in self.existing:
            prev = self.existing[key]
            if _stable(json.loads(prev) if isinstance(prev, str) else prev) != _stable(json.loads(line)):  # as a reader sees them
                self.mismatches.append(key)
            return False
        self._fh.write(line + "\n")
        self._fh.flush()
        if self._fsync:
            os.fsync(self._fh.fileno())
        self.existing[key] = line  # parsed only if the same key comes again
        return True

    def close(self) -> None:
        self._fh.close()


class RunFileError(ValueError):
    """A run's run.json or metrics.jsonl cannot be read; the message is one line naming the file (and line)."""


def read_metrics(path: Path, repair: bool = False) -> list[dict]:
    """Read every complete line. A trailing partial line (a kill mid-write) is ignored, or cut off if `repair`;
    a complete line that is not a JSON object is damage no kill leaves, so it raises RunFileError naming it."""
    path = Path(path)
    if not path.exists():
        return []
    data = path.read_bytes()
    end = data.rfind(b"\n") + 1
    if repair and end < len(data):
        with open(path, "r+b") as fh:
            fh.truncate(end)
    return [_record(line, path, i) for i, line in enumerate(data[:end].split(b"\n"), 1) if line.strip()]


def _record(line: bytes, path: Path, number: int) -> dict:
    try:
        rec = json.loads(line)
    except ValueError:  # not JSON, or not UTF-8
        raise RunFileError(f"{path} line {number}: not valid JSON") from None
    if not isinstance(rec, dict):
        raise RunFileError(f"{path} line {number}: must be a JSON object (a metrics record), got "
                           f"{type(rec).__name__}")
    # The keys every reader sorts and groups by; a hand-edited value failed deep in a report (a TypeError
    # comparing "abc" with 0, or "step 0 was not recorded" for a record without a unit).
    problem = None
    if not isinstance(rec.get("unit"), str):
        problem = f"needs a 'unit' string, got {rec.get('unit')!r}"
    elif "event" in rec and not isinstance(rec["event"], str):
        problem = f"its 'event' must be a string, got {rec['event']!r}"
    elif ("step" in rec or "event" not in rec) and not (type(rec.get("step")) is int and rec["step"] >= 0):
        problem = f"needs a 'step' integer >= 0, got {rec.get('step')!r}"
    if problem:
        raise RunFileError(f"{path} line {number}: a metrics record {problem}")
    return rec


def seed_count(meta: dict) -> int:
    """How many seeds a run.json's config runs (0 for a not-run placeholder, whose config is empty)."""
    n = meta.get("config", {}).get("seeds", 0)
    return n if isinstance(n, int) and not isinstance(n, bool) else 0


# What every reader of run.json relies on (targetpo run writes these, and a not-run placeholder too).
RUN_FIELDS = {"experiment": str, "preset": str, "config": dict}


def read_run_json(run_dir: str | Path) -> dict:
    """A run folder's run.json, checked to be an object with RUN_FIELDS; RunFileError naming the file if not."""
    path = Path(run_dir) / RUN_FILE
    if not path.exists():
        raise FileNotFoundError(f"{run_dir} is not a run directory (no {RUN_FILE})")
    try:
        meta = json.loads(path.read_bytes())
    except json.JSONDecodeError as exc:
        raise RunFileError(f"{path}: not valid JSON at line {exc.lineno} column {exc.colno} ({exc.msg})") from None
    except ValueError:
        raise RunFileError(f"{path}: not UTF-8 text") from None
    if not isinstance(meta, dict):
        raise RunFileError(f"{path}: must be a JSON object as `targetpo run` writes it, got {type(meta).__name__}")
    for name, kind in RUN_FIELDS.items():
        if not isinstance(meta.get(name), kind):
            got = "missing" if name not in meta else f"got {meta[name]!r:.60}"
            raise RunFileError(f"{path}: {name!r} must be a JSON {_JSON_KIND[kind]} ({got})")
    for name, kind in RUN_OPTIONAL_FIELDS.items():  # absent in a not-run placeholder; shown in every report
        if name in meta and (isinstance(meta[name], bool) or not isinstance(meta[name], kind)):
            raise RunFileError(f"{path}: {name!r} must be a JSON {_JSON_KIND[kind]} (got {meta[name]!r:.60})")
    return meta


RUN_OPTIONAL_FIELDS = {"status": str, "wall_time_s": (int, float), "runs": list}
_JSON_KIND = {str: "string", dict: "object", (int, float): "number", list: "array"}


def cpu_description(cpuinfo: str | None = None) -> str:
    """The CPU as a run's numbers depend on it: its model name and family (/proc/cpuinfo on Linux, else
    `platform.processor()`) and the vector kernels torch uses on it. Two CPUs that round differently (AVX2 against
    AVX-512 kernels, docs/experiments.md "Machines round differently, too") give other token and LLM curves from
    the same seeds, so a report names the CPU beside the torch version."""
    import torch

    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(errors="replace")
        except OSError:
            cpuinfo = ""
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip(), value.strip())
    name = fields.get("model name") or platform.processor() or "unknown CPU"
    if fields.get("cpu family"):
        name += f" (family {fields['cpu family']})"
    return f"{name}, {torch.backends.cpu.get_cpu_capability()} kernels"


def versions() -> dict[str, str]:
    import torch

    from targetpo import __version__

    out = {"python": platform.python_version(), "torch": torch.__version__, "numpy": np.__version__,
           "targetpo": __version__, "platform": platform.platform(), "cpu": cpu_description()}
    try:
        # Only from a checkout (src/targetpo/…): installed from a wheel, parents[3] is site-packages' lib folder,
        # and git would name the commit of whatever repository happens to contain the environment.
        package = Path(__file__).resolve().parents[1]
        root = package.parents[1]
        if package.parent.name != "src" or not (root / "pyproject.toml").is_file():
            return out
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, timeout=5)
        if commit.returncode == 0:
            out["git_commit"] = commit.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return out


def write_run_json(run_dir: Path, meta: dict) -> None:
    # The config is written as is, every float at full precision (repr): a resume must replay the config that was
    # asked for, and %.7g turned lr=0.123456789 into 0.1234568 (the resumed steps then trained on another lr).
    out = {k: v if k == "config" else _jsonable(v) for k, v in meta.items()}
    text = json.dumps(out, indent=2, default=lambda o: o.item() if hasattr(o, "item") else str(o)) + "\n"
    restore_run_json(run_dir, text.encode())


def restore_run_json(run_dir: Path, data: bytes) -> None:
    """run.json replaced by `data` (as read from it earlier, byte for byte), atomically: a kill never leaves a
    half-written run.json."""
    tmp = Path(run_dir) / (RUN_FILE + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, Path(run_dir) / RUN_FILE)


@dataclass
class Run:
    """A finished or partial run as read back from disk (what reports use; they never recompute training)."""

    path: Path
    meta: dict
    records: list[dict] = field(default_factory=list)

    @classmethod
    def load(cls, path: str | Path) -> "Run":
        path = Path(path)
        return cls(path, read_run_json(path), read_metrics(path / METRICS_FILE))

    @property
    def config(self) -> dict:
        return self.meta["config"]

    @property
    def experiment(self) -> str:
        return self.meta["experiment"]

    def units(self) -> list[str]:
        """The units that logged a record, in the order the run planned them (its first segment's `units` in
        run.json), then any others in the order they first appear: `run --jobs` interleaves the units' lines,
        and a report must not list them by which worker wrote first."""
        seen: dict[str, None] = {}
        for r in self.records:
            if "step" in r and "event" not in r and r.get("unit") is not None:
                seen.setdefault(r["unit"], None)
        planned = {u: i for i, u in enumerate(dict.fromkeys(
            u for segment in self.meta.get("runs", []) if isinstance(segment, dict)
            for u in segment.get("units", []) if isinstance(u, str)))}
        return sorted(seen, key=lambda u: planned.get(u, len(planned)))

    def done_units(self) -> set[str]:
        return {r["unit"] for r in self.records if r.get("event") == "done"}

    def diverged_units(self) -> dict[str, tuple[int, str]]:
        """{unit: (step, metric)} for every unit that stopped on a NaN/inf value."""
        return {r["unit"]: (r["step"], r.get("metric", "?")) for r in self.records if r.get("event") == "diverged"}

    def rows(self, unit: str) -> list[dict]:
        return sorted((r for r in self.records if r.get("unit") == unit and "step" in r and "event" not in r),
                      key=lambda r: r["step"])

    def series(self, unit: str, metric: str) -> tuple[np.ndarray, np.ndarray]:
        """(steps [n], values [n, seeds]) for one unit's metric; per-seed lists become columns."""
        rows = [r for r in self.rows(unit) if metric in r]
        steps = np.array([r["step"] for r in rows])
        vals = np.array([np.atleast_1d(np.asarray(r[metric], dtype=float)) for r in rows])
        return steps, vals


def find_runs(root: str | Path) -> list[Path]:
    root = Path(root)
    if (root / RUN_FILE).exists():
        return [root]
    return sorted(p.parent for p in root.glob(f"*/{RUN_FILE}"))
