"""`targetpo run --help` documents every config field of every experiment, each with its own help text."""

import contextlib
import dataclasses
import io

import pytest

from targetpo.cli import main
from targetpo.experiments import EXPERIMENTS, load
from targetpo.runs.config import config_class, field_help


@pytest.fixture(scope="module")
def run_help() -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        main(["run", "--help"])
    return out.getvalue()


def sections(text: str) -> dict[str, list[str]]:
    """Help lines grouped under the experiment heading (`  NAME: TITLE  [presets: ...]`) they follow."""
    out, current = {}, None
    for line in text.splitlines():
        head = line.strip().split(":", 1)[0]
        if line.startswith("  ") and not line.startswith("   ") and head in EXPERIMENTS:
            current = out.setdefault(head, [])
        elif current is not None and line.strip():
            current.append(line.strip())
    return out


@pytest.mark.parametrize("name", list(EXPERIMENTS))
def test_run_help_lists_every_field_with_its_help_text(run_help, name):
    exp = load(name)
    cls = config_class(exp)
    helps = field_help(cls)
    lines = sections(run_help).get(name)
    assert lines, f"no section for {name} in `targetpo run --help`"
    assert exp.TITLE in run_help
    for field in dataclasses.fields(cls):
        assert helps.get(field.name), f"{name}: Config field {field.name!r} has no help text in its declaration"
        documented = [line for line in lines if line.startswith(f"{field.name}=")]
        assert len(documented) == 1, f"{name}: field {field.name!r} listed {len(documented)} times"
        # `name=default  help [allowed]`: the help text follows the default, the bounds follow the help
        assert documented[0].split(None, 1)[1].startswith(helps[field.name]), (name, field.name, documented[0])
