"""Experiment configs: presets, `key=value` overrides, and rebuilding a stored config."""

from __future__ import annotations

import dataclasses
import inspect
import typing
from types import ModuleType
from typing import Any


def config_class(exp: ModuleType) -> type:
    """The experiment's Config dataclass (the type of its presets)."""
    return type(next(iter(exp.PRESETS.values())))


def check_config(cfg: Any, allowed_methods: tuple[str, ...], positive: tuple[str, ...] = ("seeds", "steps")) -> None:
    """The validation every experiment shares: known methods, positive counts."""
    bad = [m for m in getattr(cfg, "methods", ()) if m not in allowed_methods]
    if bad:
        raise ValueError(f"methods {bad} not in {allowed_methods}")
    small = {f: getattr(cfg, f) for f in positive if getattr(cfg, f) < 1}
    if small:
        raise ValueError(f"these config fields must be >= 1: {small}")


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


def field_help(cfg_cls: type) -> dict[str, str]:
    """{field: help} from the Config docstring's `field: help` lines."""
    doc = inspect.getdoc(cfg_cls) or ""
    out = {}
    for line in doc.splitlines():
        if ":" in line:
            key, text = line.split(":", 1)
            out[key.strip()] = text.strip()
    return out
