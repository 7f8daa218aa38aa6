"""Config declarations: every preset validates, every shared bound is enforced with a message naming the field,
overrides are typed, a refused config leaves no run folder, and the generated docs are up to date."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import re
from pathlib import Path

import pytest

from targetpo.cli import main
from targetpo.experiments import EXPERIMENTS, load
from targetpo.runs.config import (RunConfig, apply_overrides, config, config_class, config_from_dict, default,
                                  field_help, make_config, param, unused_fields, validate)

ROOT = Path(__file__).resolve().parents[2]
PRESETS = [(n, p) for n in EXPERIMENTS for p in load(n).PRESETS]


def _fields(name: str) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(config_class(load(name)))}


def _free(name: str, field: str) -> bool:
    """The experiment has `field` and lets it be set (not swept per unit)."""
    f = _fields(name).get(field)
    return f is not None and not f.metadata.get("fixed")


@pytest.mark.parametrize("name,preset", PRESETS)
def test_every_preset_validates(name, preset):
    cfg = make_config(load(name), preset)
    assert cfg == load(name).PRESETS[preset]


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_every_field_is_declared_with_help(name):
    helps = field_help(config_class(load(name)))
    assert helps and all(helps.values()), [k for k, v in helps.items() if not v]


BAD = [("lr", "-1"), ("lr", "0"), ("lr", "nan"), ("lr", "inf"), ("seeds", "0"), ("eta", "0"), ("tpo_eta", "0"),
       ("dg_eta", "0"), ("k", "1"), ("clip_eps", "0"), ("grpo_beta", "-0.1")]
CASES = [(n, f, v) for n in EXPERIMENTS for f, v in BAD if _free(n, f)]


@pytest.mark.parametrize("name,field,value", CASES)
def test_shared_bounds_are_enforced(name, field, value):
    with pytest.raises(ValueError, match=rf"^{field}=\S+: must be "):
        make_config(load(name), "smoke", overrides=[f"{field}={value}"])


@pytest.mark.parametrize("name", [n for n in EXPERIMENTS if _free(n, "methods")])
def test_unknown_method_is_refused(name):
    with pytest.raises(ValueError, match=r"^methods=.*item 'magic' must be one of"):
        make_config(load(name), "smoke", overrides=["methods=magic"])
    with pytest.raises(ValueError, match=r"^methods=\(\): must not be empty"):
        make_config(load(name), "smoke", overrides=["methods="])


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_unknown_field_suggests_the_nearest(name):
    with pytest.raises(ValueError, match=r"unknown config field 'lrr'; did you mean 'lr'\? valid fields: seeds, "):
        make_config(load(name), "smoke", overrides=["lrr=3"])


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_non_integer_steps_are_refused(name):
    field = next(f for f in ("steps", "episodes", "terminal_episodes") if _free(name, f))
    with pytest.raises(ValueError, match=rf"^{field}='ten': expected an integer$"):
        make_config(load(name), "smoke", overrides=[f"{field}=ten"])


def test_swept_field_cannot_be_set():
    with pytest.raises(ValueError, match=r"length=4: fixed at 10 in this experiment \(swept by lengths\)"):
        make_config(load("token-terminal"), "smoke", overrides=["length=4"])
    assert make_config(load("token-terminal"), "smoke", overrides=["lengths=4,5"]).lengths == (4, 5)


def test_unused_field_cannot_be_set():
    """A knob none of the experiment's methods reads is refused rather than silently ignored."""
    with pytest.raises(ValueError, match=r"dg_eta=2.0: fixed at 1.0 in this experiment \(unused: group methods only\)"):
        make_config(load("token-ablations"), "smoke", overrides=["dg_eta=2"])
    with pytest.raises(ValueError, match=r"clip_eps=0.1: fixed at 0.2 in this experiment \(unused: DG only\)"):
        make_config(load("dg-epochs"), "smoke", overrides=["clip_eps=0.1"])

    for name in ("token-projections", "token-temperature"):  # marked by tokens.config.tpo_only
        with pytest.raises(ValueError, match=r"match='interactions': fixed at 'prompts' .*\(unused: TPO only\)"):
            make_config(load(name), "smoke", overrides=["match=interactions"])


def test_unused_fields_refuses_a_field_the_class_also_declares():
    with pytest.raises(TypeError, match=r"Config.seeds is declared in the class and by unused_fields\('why'\)"):
        @config
        @unused_fields("why", "seeds")
        class Config(RunConfig):
            seeds = 3


def test_experiment_rules_across_fields_still_apply():
    with pytest.raises(ValueError, match="eval_every"):
        make_config(load("mnist"), "smoke", overrides=["steps=101"])
    with pytest.raises(ValueError, match=r"delays=\(1, 1\): items must be distinct"):
        make_config(load("mnist-staleness"), "smoke", overrides=["delays=1,1"])
    with pytest.raises(ValueError, match=r"clip_eps=1.0: must be > 0 and < 1"):
        make_config(load("mnist-staleness"), "smoke", overrides=["clip_eps=1"])
    with pytest.raises(ValueError, match="heads=3: must divide"):
        make_config(load("token-dense"), "smoke", overrides=["heads=3"])


def test_inherited_default_keeps_help_and_bounds():
    base = {f.name: f for f in dataclasses.fields(RunConfig)}

    @config
    class Small(RunConfig):
        steps: int = param(3, "steps", ge=1)
        seeds = 5
        methods = default(("a",), choices=("a", "b"), note="the paper: a")

    f = {f.name: f for f in dataclasses.fields(Small)}
    assert Small().seeds == 5 and f["seeds"].metadata == base["seeds"].metadata
    assert f["methods"].metadata["choices"] == ("a", "b") and f["methods"].metadata["help"].endswith("(the paper: a)")
    assert [x.name for x in dataclasses.fields(Small)] == ["seeds", "seed", "methods", "steps"]
    validate(Small(methods=("b",)))
    with pytest.raises(ValueError, match=r"seeds=0: must be >= 1"):
        Small(seeds=0).validate()
    assert Small.__dataclass_params__.frozen

    @config
    class Leaf(Small):
        methods = ("b",)

    leaf = {f.name: f for f in dataclasses.fields(Leaf)}
    assert Leaf().methods == ("b",) and leaf["methods"].metadata == f["methods"].metadata  # Small's, not RunConfig's


def test_overrides_parse_types():
    cfg = apply_overrides(load("mnist").PRESETS["smoke"],
                          ["download=yes", "data_dir=none", "lr=2e-3", "methods=tpo,pg"])
    assert (cfg.download, cfg.data_dir, cfg.lr, cfg.methods) == (True, None, 2e-3, ("tpo", "pg"))
    with pytest.raises(ValueError, match="download='maybe': expected true or false"):
        apply_overrides(cfg, ["download=maybe"])
    with pytest.raises(ValueError, match="lr='fast': expected a number"):
        apply_overrides(cfg, ["lr=fast"])


def test_old_run_json_configs_still_load():
    """A config stored before fields were added (lists for tuples, fields missing) rebuilds with the defaults."""
    exp = load("token-terminal")
    stored = json.loads(json.dumps(dataclasses.asdict(exp.PRESETS["smoke"])))
    del stored["match"]
    assert config_from_dict(exp, stored) == exp.PRESETS["smoke"]


def _assert_refused(argv, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("targetpo: error: "), err
    return err[0]


@pytest.mark.parametrize("override,expected", [("lr=-1", "lr=-1.0: must be > 0 and finite"),
                                               ("lr=nan", "lr=nan: must be > 0 and finite"),
                                               ("steps=ten", "steps='ten': expected an integer"),
                                               ("eta=0", "eta=0.0: must be >= 1e-30 and finite")])
def test_refused_config_leaves_no_run_folder(tmp_path, capsys, override, expected):
    out = tmp_path / "run"
    line = _assert_refused(["run", "tabular-single", "--preset", "smoke", "--out", str(out), "--no-progress", override],
                           capsys)
    assert expected in line and not out.exists()


def test_refused_config_keeps_an_existing_run_with_force(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["run", "tabular-single", "--preset", "smoke", "--out", str(out), "--no-progress", "--no-report"]) == 0
    before = (out / "metrics.jsonl").read_text()
    _assert_refused(["run", "tabular-single", "--preset", "smoke", "--out", str(out), "--force", "lr=-1"], capsys)
    assert (out / "metrics.jsonl").read_text() == before


def test_resume_refuses_a_stored_config_out_of_bounds(tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    cfg = dataclasses.asdict(load("tabular-single").PRESETS["smoke"]) | {"lr": -1.0}
    (out / "run.json").write_text(json.dumps({"experiment": "tabular-single", "preset": "smoke", "config": cfg,
                                              "runs": []}))
    line = _assert_refused(["run", "tabular-single", "--preset", "smoke", "--out", str(out), "--resume"], capsys)
    assert "lr=-1.0" in line and sorted(p.name for p in out.iterdir()) == ["run.json"]


def test_reproduce_validates_every_config_before_running_any(tmp_path, capsys):
    out = tmp_path / "all"
    _assert_refused(["reproduce", "--only", "tabular-single", "tabular-multi", "--preset", "nope", "--out", str(out)],
                    capsys)
    assert not out.exists()


def test_generated_docs_are_up_to_date():
    spec = importlib.util.spec_from_file_location("gen_docs", ROOT / "tools" / "gen_docs.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    for path, text in gen.outputs().items():
        assert path.read_text() == text, f"{path.name} is out of date: run python tools/gen_docs.py"


def test_help_lists_fields_with_bounds(capsys):
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    out = capsys.readouterr().out
    assert "lr=0.001" in out and "[> 0 and finite]" in out and "[fixed (swept by lengths)]" in out


def test_a_fixed_length_tuple_field_takes_exactly_that_many_items():
    """`tuple[float, float]` is a pair: (0.9,) used to pass validation and fail inside torch's Adam."""

    @config
    class Pair(RunConfig):
        betas: tuple[float, float] = param((0.9, 0.999), "a pair", ge=0, lt=1)
        names: tuple[str, ...] = param(("a",), "any number")
        methods = ("m",)

    validate(Pair(names=("a", "b", "c")))
    for bad in ((0.9,), (0.9, 0.99, 0.999)):
        with pytest.raises(ValueError, match=re.escape(f"betas={bad!r}: must have exactly 2 items, each >= 0 and < 1")):
            validate(Pair(betas=bad))
    with pytest.raises(ValueError, match=r"betas=\(0.9, 1.0\): item 1.0 must be >= 0 and < 1"):
        validate(Pair(betas=(0.9, 1.0)))


def test_help_says_finite_wherever_infinity_is_refused():
    """`etas=inf` and `tpo_alpha=inf` are refused as not finite, but --help and docs/config.md showed the bounds
    without "and finite" for float lists and optional floats."""
    from targetpo.runs.config import bounds, config_class, config_fields

    for name, field in [("token-temperature", "etas"), ("token-terminal", "tpo_alpha"), ("rlvr", "adam_betas")]:
        assert bounds(config_fields(config_class(load(name)))[field]).endswith("and finite"), (name, field)


def test_a_dict_field_says_it_is_set_through_the_python_api():
    with pytest.raises(ValueError, match="a dict, set only through the Python API, not as key=value"):
        make_config(load("rlvr"), "smoke", overrides=['objective_options={"clip_eps": 0.2}'])


def test_data_locations_are_stored_absolute_and_a_resume_reads_either_spelling(tmp_path, mnist_dir, monkeypatch):
    """data_dir=REL was stored relative (--data-dir is made absolute), so a resume from another folder looked in
    the wrong place; on --resume, data-dir=NEW (a hyphen) was ignored where data_dir=NEW was read."""
    import json
    import shutil

    from targetpo.experiments import run_experiment

    shutil.copytree(mnist_dir, tmp_path / "m1")
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "run"
    run_experiment("mnist", "smoke", out=out, overrides=["data_dir=m1", "methods=ce"], progress=False, quiet=True)
    assert json.loads((out / "run.json").read_text())["config"]["data_dir"] == str(tmp_path / "m1")
    (tmp_path / "m1").rename(tmp_path / "m2")
    run_experiment("mnist", "smoke", out=out, overrides=[f"data-dir={tmp_path / 'm2'}", "methods=ce"], resume=True,
                   force=True, progress=False, quiet=True)


def test_resume_with_only_the_data_location_or_the_stored_seeds_continues(tmp_path, mnist_dir, capsys):
    """A resume with --data-dir alone (or --seeds as stored) was refused whenever the run had key=value overrides:
    the asked config was rebuilt from the preset, so "steps: stored 60, asked 100" though nobody asked for 100."""
    import json
    import shutil

    from targetpo.cli import main

    shutil.copytree(mnist_dir, tmp_path / "m1")
    out = tmp_path / "run"
    argv = ["run", "mnist", "--preset", "smoke", "steps=60", "methods=ce,tpo", "--out", str(out), "--no-progress",
            "--no-report"]
    assert main(argv + ["--data-dir", str(tmp_path / "m1")]) == 0
    (tmp_path / "m1").rename(tmp_path / "m2")  # the same files, moved
    before = (out / "metrics.jsonl").read_bytes()
    for extra in (["--data-dir", str(tmp_path / "m2")], ["--seeds", "2"]):
        code = main(["run", "mnist", "--out", str(out), "--resume", "--no-progress", "--no-report", *extra])
        assert code == 0, capsys.readouterr().err
    assert (out / "metrics.jsonl").read_bytes() == before
    assert json.loads((out / "run.json").read_text())["config"]["steps"] == 60
    code = main(["run", "mnist", "--out", str(out), "--resume", "--no-progress", "steps=80"])  # still refused
    assert code == 2 and "steps: stored 60, asked 80" in capsys.readouterr().err


def test_a_resume_refused_for_other_data_leaves_run_json_as_it_was(tmp_path, mnist_dir, capsys):
    """The fingerprint refusal came after run.json was rewritten: status "interrupted", a wall time and an empty
    segment were added by a resume that did nothing."""
    import gzip
    import json
    import shutil

    from targetpo.cli import main

    shutil.copytree(mnist_dir, tmp_path / "m1")
    out = tmp_path / "run"
    assert main(["run", "mnist", "--preset", "smoke", "methods=ce", "--data-dir", str(tmp_path / "m1"), "--out",
                 str(out), "--no-progress", "--no-report"]) == 0
    # make it a run killed midway: its last records and "done" line gone, run.json still saying "running"
    lines = (out / "metrics.jsonl").read_text().splitlines(keepends=True)
    (out / "metrics.jsonl").write_text("".join(lines[:2]))
    meta = json.loads((out / "run.json").read_text())
    meta["status"] = "running"
    (out / "run.json").write_text(json.dumps(meta))
    other = tmp_path / "m2"
    shutil.copytree(tmp_path / "m1", other)
    labels = other / "t10k-labels-idx1-ubyte.gz"
    raw = bytearray(gzip.decompress(labels.read_bytes()))
    raw[8], raw[9] = raw[9], raw[8]  # two test labels swapped: other data
    if raw[8] == raw[9]:
        raw[8] = (raw[8] + 1) % 10
    labels.write_bytes(gzip.compress(bytes(raw)))
    files = {p.name: p.read_bytes() for p in out.iterdir()}
    code = main(["run", "mnist", "--out", str(out), "--resume", "--data-dir", str(other), "--no-progress"])
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert code == 2 and len(err) == 1 and "was computed on other data" in err[0], err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == files


@pytest.mark.parametrize("override, message", [
    ("steps=٣", "steps='٣': expected an integer written in ASCII digits, without '_'"),
    ("lr=１", "lr='１': expected a number written in ASCII digits"),
    ("seeds=1_0", "seeds='1_0': expected an integer written in ASCII digits, without '_'"),
    ("lr=1e-400", "lr='1e-400': too small for a float (it would read as 0)"),
])
def test_numbers_python_reads_loosely_are_refused(override, message):
    """int()/float() accept Arabic-Indic and full-width digits and '_' separators (steps=٣ ran 3 steps,
    seeds=1_0 ran 10), and 1e-400 read as 0.0, so the error showed a value nobody typed."""
    from targetpo.experiments import load
    from targetpo.runs.config import make_config

    with pytest.raises(ValueError) as info:
        make_config(load("tabular-single"), "smoke", overrides=[override])
    assert message in str(info.value)
