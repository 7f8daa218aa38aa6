"""Experiment configs, declared once: fields with help and bounds, one validator, presets, `key=value`
overrides, rebuilding a stored config, and the field / experiment tables of `--help`, the README and
docs/config.md.

A config is a frozen dataclass whose fields carry their help text and bounds as field metadata::

    @config
    class Config(RunConfig):
        steps: int = param(150, "normalized logit steps", ge=1)
        seeds = 100                              # a new default for an inherited field: same help, same bounds
        methods = default(METHODS, choices=METHODS)
        length = swept("lengths")               # set per unit from another field: refused if set
        dg_eta = unused("no DG method here")    # read by none of its methods: refused if set

Plain dataclasses rather than a validation library: the configs are frozen dataclasses that run.json stores
(``dataclasses.asdict``) and rebuilds (:func:`config_from_dict`), and the core library must install beside verl
and TRL stacks, which pin their own pydantic; one small validator over field metadata needs nothing of that.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import math
import re
import types
import typing
from types import ModuleType
from typing import Any

from targetpo.runs.stats import count


# ----------------------------------------------------------------------------- declaring fields

def param(default: Any, help: str, *, gt: float | None = None, ge: float | None = None, lt: float | None = None,
          le: float | None = None, choices: tuple | None = None, finite: bool = True, nonempty: bool = True,
          unique: bool | None = None, fixed: str | None = None) -> Any:
    """A config field: its default, help text and what values are allowed. Bounds and `choices` apply to a
    number/string or to every item of a tuple; `nonempty` and `unique` to tuples; `finite` to floats. `unique`
    defaults to on for a list (``tuple[x, ...]``): its items name methods, lengths or conditions, and a repeated
    one would collapse into a single unit; a fixed-length tuple such as ``tuple[float, float]`` may repeat.
    `fixed` says why an experiment does not let it be set (see :func:`swept`, :func:`unused`)."""
    meta = {"help": help, "gt": gt, "ge": ge, "lt": lt, "le": le, "choices": tuple(choices) if choices else None,
            "finite": finite, "nonempty": nonempty, "unique": unique, "fixed": fixed}
    return dataclasses.field(default=default, metadata=meta)


@dataclasses.dataclass(frozen=True)
class _Default:
    value: Any
    changes: dict


_INHERITED = object()  # keep the base's default


def default(value: Any, *, note: str | None = None, **changes) -> Any:
    """A new default for an inherited field, keeping the base's help and bounds (`changes` replaces some of
    them, e.g. ``choices=``; `note` is appended to the help, e.g. "the paper: 2000"). Needs :func:`config`."""
    if note:
        changes["note"] = note
    return _Default(value, changes)


def swept(by: str) -> Any:
    """An inherited field this experiment sets per unit from field `by`: it keeps the base's default and refuses
    another value (set `by` instead). Needs :func:`config`."""
    return _Default(_INHERITED, {"fixed": f"swept by {by}"})


def unused(why: str) -> Any:
    """An inherited field no method of this experiment reads: it keeps the base's default and refuses another
    value, so setting it is never silently ignored. Needs :func:`config`."""
    return _Default(_INHERITED, {"fixed": f"unused: {why}"})


def unused_fields(why: str, *names: str):
    """A class decorator, placed under ``@config``: marks the inherited fields `names` :func:`unused` for `why`,
    for a set of fields several configs leave unread (declared once, e.g. ``tokens.config.tpo_only``)."""
    def mark(cls: type) -> type:
        for name in names:
            if name in cls.__dict__:
                raise TypeError(f"{cls.__name__}.{name} is declared in the class and by unused_fields({why!r})")
            setattr(cls, name, unused(why))
        return cls
    return mark


def config(cls: type) -> type:
    """`@dataclass(frozen=True)`, after turning each unannotated `name = value` (or `name = default(...)`) that
    names an inherited field into that field with a new default and the base's metadata."""
    inherited = {f.name: f for base in reversed(cls.__mro__[1:]) if dataclasses.is_dataclass(base)
                 for f in dataclasses.fields(base)}  # the nearest base wins, as in dataclasses
    own = cls.__dict__.get("__annotations__", {})
    annotations = dict(own)
    for name, value in list(cls.__dict__.items()):
        if name in own or name not in inherited:
            continue
        new = value if isinstance(value, _Default) else _Default(value, {})
        changes = dict(new.changes)
        note = changes.pop("note", None)
        meta = dict(inherited[name].metadata) | changes
        if note:
            meta["help"] = f"{meta['help']} ({note})"
        value = inherited[name].default if new.value is _INHERITED else new.value
        setattr(cls, name, dataclasses.field(default=value, metadata=meta))
        annotations[name] = typing.get_type_hints(_owner(cls, name))[name]
    cls.__annotations__ = annotations
    return dataclasses.dataclass(frozen=True)(cls)


def _owner(cls: type, name: str) -> type:
    return next(b for b in cls.__mro__[1:] if name in getattr(b, "__dataclass_fields__", {}))


@dataclasses.dataclass(frozen=True)
class Validated:
    """A config whose `validate()` checks every declared field, then `check()`: its rules across fields."""

    def validate(self) -> None:
        validate(self)
        self.check()

    def check(self) -> None:
        """Rules across fields (none here)."""

    def unread(self) -> dict[str, str]:
        """{field: why} for the fields that this config's other settings leave unread, e.g. a baseline's clip
        range in a run of TPO alone. :func:`make_config` refuses a `key=value` override of one; a preset's value
        for such a field is left alone (the preset set it for methods this run does not choose)."""
        return {}

    def readers(self) -> dict[str, str]:
        """{field: "read by <methods>"} for fields only some methods read: shown in `--help` and docs/config.md."""
        return {}


def check_named_values(name: str, values) -> None:
    """ValueError unless each value of the list field `name` reads back from its "%g" text: the text names the
    value's unit or metric keys (eta0.25, tpo_is10, flip0.3), so 0.3 and 0.3000001 would share one name and one
    would overwrite the other's records."""
    for v in values:
        if float(f"{v:g}") != v:
            raise ValueError(f"{name}={tuple(values)!r}: item {v!r} must be written with at most 6 significant "
                             f"digits (it is named {v:g}, as its unit and metrics are)")


# The smallest temperature η a config takes: below it u/η (|u| ≤ √(K−1)) leaves float32's range for any K that
# fits in memory, and the objectives refuse such an η only when they run, after the run folder is written.
ETA_MIN = 1e-30


@dataclasses.dataclass(frozen=True)
class RunConfig(Validated):
    """The fields every experiment has. `check` holds an experiment's rules across fields."""

    seeds: int = param(1, "independent seeds, vectorised as one batch inside each unit", ge=1)
    seed: int = param(0, "first seed (seeds are seed, seed+1, ...)", ge=0)
    methods: tuple[str, ...] = param((), "which methods to run")
    # The torch device types the experiment's units compute on (None: whatever --device names). An experiment
    # that keeps its tensors on the CPU says so, and `--device cuda` is refused rather than recorded and ignored.
    DEVICES: typing.ClassVar[tuple[str, ...] | None] = None
    # {field: the methods that read it} for fields only some methods read: setting one when none of them runs
    # is refused (:meth:`unread`), never silently ignored.
    READ_BY: typing.ClassVar[dict[str, tuple[str, ...]]] = {}
    # {field: {other field: value}}: a `key=value` override of the field also sets the others, unless they are given
    # too (rlvr's task=NAME starts from that task's own options, not the preset's options for another task).
    SETS_WITH: typing.ClassVar[dict[str, dict[str, typing.Any]]] = {}

    def readers(self) -> dict[str, str]:
        return {name: f"read by {', '.join(by)}" for name, by in self.READ_BY.items()}

    def unread(self) -> dict[str, str]:
        readers = self.readers()
        return {name: f"{readers[name]}; methods={show(self.methods)} runs none of them"
                for name, by in self.READ_BY.items() if not set(by) & set(self.methods)}


def unread_by(cfg: Any, selector: str, readers: dict[str, tuple[str, ...]], describe) -> dict[str, str]:
    """For :meth:`Validated.unread`: {field: why} for each field of `readers` ({field: the values of the tuple field
    `selector` that read it}) when none of those values is chosen; `describe(values)` names them ("part terminal",
    "the k sweep")."""
    chosen = getattr(cfg, selector)
    return {name: f"read only by {describe(by)}, and {selector}={show(chosen)}"
            for name, by in readers.items() if not set(by) & set(chosen)}


# ----------------------------------------------------------------------------- validating

_TYPE_NAMES = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}


def _base_type(annotation: Any) -> tuple[Any, bool, Any]:
    """(type, optional, item type of a tuple or None)."""
    optional = False
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        optional, annotation = True, args[0]
    if typing.get_origin(annotation) in (tuple, list):
        return tuple, optional, (typing.get_args(annotation) or (str,))[0]
    return annotation, optional, None


def _tuple_length(annotation: Any) -> int | None:
    """n for a fixed-length tuple annotation (``tuple[float, float]`` -> 2); None for ``tuple[str, ...]``."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        annotation = next(a for a in typing.get_args(annotation) if a is not type(None))
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) is not tuple or not args or Ellipsis in args:
        return None
    return len(args)


def first_repeat(items) -> Any:
    """The first item of `items` that an earlier one equals, or None."""
    return next((x for i, x in enumerate(items) if x in items[:i]), None)


def _is(value: Any, tp: Any) -> bool:
    if tp is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, tp)


def allowed(meta: typing.Mapping) -> str:
    """What a field's bounds allow, in words: "> 0", ">= 1 and <= 10", "one of (a, b)"."""
    rules = [f"{op} {meta[key]:g}" for key, op in (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<="))
             if meta.get(key) is not None]
    if meta.get("choices"):
        rules.append(f"one of ({', '.join(map(str, meta['choices']))})")
    return " and ".join(rules)


# Counts, sizes and seeds become int64 tensors and generator seeds: a larger integer passed every declared bound
# and then failed inside torch ("Overflow when unpacking long long"), after the run folder was written.
INT_MAX = 2**63 - 1


def _within(x: Any, meta: typing.Mapping) -> bool:
    return ((meta.get("gt") is None or x > meta["gt"]) and (meta.get("ge") is None or x >= meta["ge"])
            and (meta.get("lt") is None or x < meta["lt"]) and (meta.get("le") is None or x <= meta["le"]))


def _check_item(name: str, shown: Any, x: Any, tp: Any, meta: typing.Mapping, which: str) -> None:
    """`x` (the value of field `name`, or the item `which` of its tuple `shown`) against the declaration."""
    if not _is(x, tp):
        raise ValueError(f"{name}={shown!r}: {which}expected {_TYPE_NAMES.get(tp, tp.__name__)}")
    if tp is int and abs(x) > INT_MAX:
        raise ValueError(f"{name}={shown!r}: {which}must fit in 64 bits (|x| <= 2**63 - 1)")
    finite = tp is float and meta.get("finite", True)
    ok = (not finite or math.isfinite(x)) and (tp not in (int, float) or _within(x, meta))
    if meta.get("choices") and x not in meta["choices"]:
        ok = False
    if not ok:
        rule = " and ".join(r for r in (allowed(meta), "finite" if finite else "") if r)
        raise ValueError(f"{name}={shown!r}: {which}must be {rule}")


def validate(cfg: Any) -> None:
    """Check every field of `cfg` against its declaration (type, finite, bounds, choices, non-empty tuples,
    swept fields left alone); a ValueError names the field, the value and what is allowed."""
    hints = typing.get_type_hints(type(cfg))
    for f in dataclasses.fields(cfg):
        if "help" not in f.metadata:
            continue
        meta, value = f.metadata, getattr(cfg, f.name)
        tp, optional, item = _base_type(hints[f.name])
        if value is None and optional:
            continue
        if meta.get("fixed") and value != f.default:
            raise ValueError(f"{f.name}={value!r}: fixed at {f.default!r} in this experiment ({meta['fixed']})")
        if item is None:
            _check_item(f.name, value, value, tp, meta, "")
            continue
        if not isinstance(value, tuple):
            raise ValueError(f"{f.name}={value!r}: expected a tuple of {_TYPE_NAMES.get(item, item.__name__)}s")
        if meta.get("nonempty", True) and not value:
            items = f"; allowed items: {allowed(meta)}" if allowed(meta) else ""
            raise ValueError(f"{f.name}=(): must not be empty{items}")
        length = _tuple_length(hints[f.name])
        if length is not None and len(value) != length:  # e.g. tuple[float, float]: a pair, not any tuple
            items = f", each {allowed(meta)}" if allowed(meta) else ""
            raise ValueError(f"{f.name}={value!r}: must have exactly {length} items{items}")
        for x in value:
            _check_item(f.name, value, x, item, meta, f"item {x!r} ")
        unique = meta.get("unique")
        if unique is None:  # the default: on for a list, tuple[x, ...], off for a fixed-length tuple
            unique = length is None
        dup = first_repeat(value) if unique else None
        if dup is not None:
            raise ValueError(f"{f.name}={value!r}: items must be distinct ({dup!r} is given twice)")
    seed, seeds = getattr(cfg, "seed", None), getattr(cfg, "seeds", None)
    if isinstance(seed, int) and isinstance(seeds, int) and seed + seeds - 1 > INT_MAX:
        raise ValueError(f"seed={seed!r} with seeds={seeds!r}: the last seed, seed + seeds - 1, must fit in 64 bits "
                         "(<= 2**63 - 1)")


# ----------------------------------------------------------------------------- presets and overrides

def config_class(exp: ModuleType) -> type:
    """The experiment's Config dataclass (the type of its presets)."""
    return type(next(iter(exp.PRESETS.values())))


def config_fields(cfg_cls: type) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(cfg_cls)}


def _parse_value(text: str, annotation: Any, name: str) -> Any:
    tp, optional, item = _base_type(annotation)
    if optional and text.lower() in ("none", "null"):
        return None
    if item is not None:
        items = [t.strip() for t in text.split(",")]
        if text.strip() and "" in items:  # "tpo,,grpo" or "tpo,": a lost item, not a shorter list
            raise ValueError(f"{name}={text!r}: item {items.index('') + 1} is empty")
        return tuple(_parse_value(t, item, name) for t in items if t)
    if tp is bool:
        if text.lower() in ("1", "true", "yes", "on"):
            return True
        if text.lower() in ("0", "false", "no", "off"):
            return False
    elif tp in (int, float):
        if not text.isascii() or "_" in text:  # Python's int()/float() read "٣", "１" and "1_0" too
            raise ValueError(f"{name}={text!r}: expected {_TYPE_NAMES[tp]} written in ASCII digits, without '_'")
        try:
            value = tp(text)
        except ValueError:
            pass
        else:
            if value == 0 and re.search(r"[1-9]", re.split(r"[eE]", text)[0]):  # 1e-400: not the 0.0 it reads as
                raise ValueError(f"{name}={text!r}: too small for a float (it would read as 0)")
            return value
    elif tp is dict:
        raise ValueError(f"{name}={text!r}: a dict, set only through the Python API, not as key=value")
    else:
        return text
    raise ValueError(f"{name}={text!r}: expected {_TYPE_NAMES[tp]}")


def override_key(item: str) -> str:
    """The field a `key=value` override sets (`lr-warmup=…` and `lr_warmup=…` are the same field)."""
    return item.split("=", 1)[0].strip().replace("-", "_")


def apply_overrides(cfg: Any, overrides: list[str]) -> Any:
    """`key=value` strings → a new config. An unknown key is an error naming the nearest field and the valid ones."""
    hints = typing.get_type_hints(type(cfg))
    names = [f.name for f in dataclasses.fields(cfg)]
    changes = {}
    for item in overrides:
        if "=" not in item or not override_key(item):
            raise ValueError(f"override {item!r} must look like key=value")
        key, value = override_key(item), item.split("=", 1)[1]
        if key not in names:
            near = difflib.get_close_matches(key, names, n=1)
            hint = f"did you mean {near[0]!r}? " if near else ""
            raise ValueError(f"unknown config field {key!r}; {hint}valid fields: {', '.join(names)}")
        if key in changes:
            raise ValueError(f"{key} is set twice ({key}={show(changes[key])} and {item.strip()}); give it once")
        changes[key] = _parse_value(value.strip(), hints[key], key)
    for key in [k for k in changes if changes[k] != getattr(cfg, k)]:  # `task=` naming the task it has: no reset
        changes |= {k: v for k, v in getattr(cfg, "SETS_WITH", {}).get(key, {}).items() if k not in changes}
    return dataclasses.replace(cfg, **changes)


def validated(cfg: Any) -> Any:
    """`cfg` after checking it (its own `validate` if it has one, else the field declarations)."""
    if hasattr(cfg, "validate"):
        cfg.validate()
    else:
        validate(cfg)
    return cfg


def make_config(exp: ModuleType, preset: str, seeds: int | None = None, overrides: list[str] | None = None) -> Any:
    """A preset with `seeds` and `key=value` overrides applied, validated."""
    if preset not in exp.PRESETS:
        raise ValueError(f"experiment {exp.NAME} has no preset {preset!r}; presets: {', '.join(exp.PRESETS)}")
    return configure(exp.PRESETS[preset], seeds, overrides)


def configure(cfg: Any, seeds: int | None = None, overrides: list[str] | None = None) -> Any:
    """`cfg` (a preset, or the config a run stored) with `seeds` and `key=value` overrides applied, validated."""
    if seeds is not None:
        if any(override_key(o) == "seeds" for o in overrides or []):
            raise ValueError(f"give either --seeds {seeds} or seeds=..., not both")
        cfg = dataclasses.replace(cfg, seeds=seeds)
    cfg = validated(apply_overrides(cfg, overrides or []))
    unread = cfg.unread() if hasattr(cfg, "unread") else {}
    for key in dict.fromkeys(override_key(o) for o in overrides or []):
        if key in unread:
            raise ValueError(f"{key}={show(getattr(cfg, key))}: not read by this run ({unread[key]}); drop it")
    return cfg


def config_from_dict(exp: ModuleType, data: dict) -> Any:
    """The config stored in a run.json (lists back to tuples; fields it lacks take their defaults)."""
    cls = config_class(exp)
    hints = typing.get_type_hints(cls)
    fixed = {k: (tuple(v) if isinstance(v, list) and _base_type(hints[k])[2] is not None else v)
             for k, v in data.items() if k in hints}
    return cls(**fixed)


# ----------------------------------------------------------------------------- tables for --help and docs

def field_help(cfg_cls: type) -> dict[str, str]:
    """{field: help} from the field declarations."""
    return {f.name: f.metadata.get("help", "") for f in dataclasses.fields(cfg_cls)}


def show(value: Any) -> str:
    """A value as it is written in a `key=value` override."""
    if isinstance(value, (tuple, list)):
        return ",".join(map(show, value))
    return str(value).lower() if isinstance(value, bool) else str(value)


def bounds(f: dataclasses.Field) -> str:
    rule = allowed(f.metadata)
    # Any float field, also a float list or an optional float (the checks refuse inf in each of them).
    if rule and re.search(r"\bfloat\b", f.type if isinstance(f.type, str) else repr(f.type)) \
            and f.metadata.get("finite", True):
        rule += " and finite"
    if f.metadata.get("fixed"):
        rule = f"fixed ({f.metadata['fixed']})"
    return rule


def rule_texts(cfg: Any) -> dict[str, str]:
    """{field: what it allows (:func:`bounds`) and, for a field only some methods read, which ones
    (`cfg.readers`)}, for every field of `cfg`."""
    by = cfg.readers() if hasattr(cfg, "readers") else {}
    return {f.name: "; ".join(x for x in (bounds(f), "" if f.metadata.get("fixed") else by.get(f.name, "")) if x)
            for f in dataclasses.fields(cfg)}


def field_lines(cfg: Any, indent: str = "  ", width: int = 28) -> list[str]:
    """`name=default  help [allowed]` lines of a config (the defaults of preset `cfg`), for `--help`."""
    lines = []
    rules = rule_texts(cfg)
    for f in dataclasses.fields(cfg):
        rule = rules[f.name]
        text = f.metadata.get("help", "") + (f" [{rule}]" if rule else "")
        lines.append(f"{indent}{f'{f.name}={show(getattr(cfg, f.name))}':<{width}} {text}")
    return lines


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def field_table(exp: ModuleType) -> str:
    """A markdown table of an experiment's fields: the value in each preset, what is allowed, the help."""
    presets = list(exp.PRESETS)
    rows = [f"| field | {' | '.join(presets)} | allowed | help |", "|---" * (len(presets) + 3) + "|"]
    rules = rule_texts(config_class(exp)())
    for f in dataclasses.fields(config_class(exp)):
        values = [f"`{_cell(show(getattr(exp.PRESETS[p], f.name))) or ' '}`" for p in presets]
        rows.append(f"| `{f.name}` | {' | '.join(values)} | {_cell(rules[f.name])} | "
                    f"{_cell(f.metadata.get('help', ''))} |")
    return "\n".join(rows)


def steps_label(cfg: Any) -> str:
    """"S seeds × N steps" of a preset (episodes for the token experiments)."""
    fields = config_fields(type(cfg))
    for name in ("steps", "episodes"):
        if name in fields and not fields[name].metadata.get("fixed"):
            return f"{count(cfg.seeds, 'seed')} × {getattr(cfg, name):,} {name}"
    return f"{count(cfg.seeds, 'seed')}"


def paper_ref(exp: ModuleType) -> str:
    return exp.PAPER_REF.split("; docs/")[0]


def experiment_table(modules: list[ModuleType]) -> str:
    """The README's experiment table: name, paper reference, suite, the preset `targetpo reproduce` runs."""
    rows = ["| experiment | paper | suite | preset in `targetpo reproduce --suite SUITE` |", "|---|---|---|---|"]
    for exp in modules:
        preset = exp.REPRODUCE_PRESET
        note = "; ".join(x for x in (steps_label(exp.PRESETS[preset]), getattr(exp, "RUNTIME", "")) if x)
        suite = getattr(exp, "SUITE", "paper")
        rows.append(f"| `{exp.NAME}` | {_cell(paper_ref(exp))} | {suite} | {preset} ({_cell(note)}) |")
    return "\n".join(rows)


def config_doc(modules: list[ModuleType]) -> str:
    """docs/config.md: every experiment's fields with their value in each preset, bounds and help."""
    parts = ["# Experiment configs", "",
             "Generated by `tools/gen_docs.py` from the field declarations (do not edit by hand). Any field can be "
             "overridden as `key=value` after `targetpo run NAME`; a value outside what is allowed is refused "
             "before anything is written, and so is a field that no unit of the run reads: one that only some "
             "methods read (`clip_eps` in a run of TPO alone, `eta` without DG or TPO), or only some parts or "
             "sweeps. A field marked fixed is set by the experiment itself.", ""]
    for exp in modules:
        parts += [f"## `{exp.NAME}`", "", f"{exp.TITLE}. Reproduce preset: `{exp.REPRODUCE_PRESET}`.", "",
                  field_table(exp), ""]
    return "\n".join(parts)


# ----------------------------------------------------------------------------- command lines

class OneLineParser(argparse.ArgumentParser):
    """argparse with a one-line error: the message and where the usage is, not the usage itself; exit status 2.
    Every command line of the project uses it (the CLI, benchmarks/, tools/), so each refusal reads alike.
    Options are never abbreviated: `--seed 2` would otherwise be taken, silently, as `--seeds 2` (the config
    field is `seed=2`)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (usage: {self.prog} --help)\n")
