"""The installed package declares ranges a library can live with: it admits the pins of the stacks users run
(verl[vllm] 0.9.1 pins torch 2.11.0 and transformers 5.9.0) and the versions CI tests (constraints.txt)."""

from __future__ import annotations

import importlib.metadata as md
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]


def requirements(dist: str, extra: str | None = None) -> dict[str, Requirement]:
    """{name: Requirement} of `dist`'s installed metadata, for the base install or one extra."""
    out = {}
    for text in md.requires(dist) or []:
        req = Requirement(text)
        env = {"extra": extra or ""}
        if req.marker is None and extra is None or req.marker is not None and req.marker.evaluate(env):
            out[req.name.lower()] = req
    return out


def admits(req: Requirement, version: str) -> bool:
    return req.specifier.contains(Version(version), prereleases=True)


def test_ranges_admit_the_gpu_stacks_users_run():
    base, llm = requirements("targetpo"), requirements("targetpo", "llm")
    for v in ("2.9.0", "2.11.0", "2.13.0"):
        assert admits(base["torch"], v), (base["torch"], v)
    for v in ("5.9.0", "5.10.4"):
        assert admits(llm["transformers"], v), (llm["transformers"], v)
    assert not any(str(r.specifier).startswith("==") for r in base.values()), "no exact pins in the library"
    trl, verl = requirements("targetpo", "trl"), requirements("targetpo", "verl")
    assert admits(trl["trl"], "1.16.0") and admits(verl["verl"], "0.9.1")


def test_ranges_admit_verl_vllm_pins_read_from_verl_itself():
    pytest.importorskip("verl", reason="needs the verl extra")
    pins = requirements("verl", "vllm")
    ours = {**requirements("targetpo"), **requirements("targetpo", "llm")}
    checked = []
    for name in ("torch", "transformers"):
        pin = pins.get(name)
        if pin is not None and str(pin.specifier).startswith("=="):
            version = str(pin.specifier)[2:]
            assert admits(ours[name], version), f"verl[vllm] pins {name}=={version}; we declare {ours[name]}"
            checked.append(name)
    assert checked == ["torch", "transformers"], f"verl's vllm extra no longer pins these: {pins}"


def test_constraints_pin_what_ci_installs_and_fit_the_ranges():
    lines = [l.split("#")[0].strip() for l in (ROOT / "constraints.txt").read_text().splitlines()]
    pins = {Requirement(l).name.lower(): str(Requirement(l).specifier)[2:] for l in lines if "==" in l}
    assert pins["torch"] == "2.13.0"  # the CPU wheel on disk; an unpinned torch pulls a CUDA build
    declared = {**requirements("targetpo"), **requirements("targetpo", "llm"), **requirements("targetpo", "trl"),
                **requirements("targetpo", "verl")}
    for name, req in declared.items():
        if name in pins and name != "targetpo":
            assert admits(req, pins[name]), f"constraints.txt pins {name}=={pins[name]} outside {req}"


def test_version_is_declared_once_and_matches_the_changelog():
    """pyproject.toml reads the version from `targetpo.__version__`; the installed metadata and run.json (which
    records `__version__`) agree, and CHANGELOG.md's newest heading is that release."""
    import tomllib

    import targetpo

    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "targetpo.__version__"}
    assert md.version("targetpo") == targetpo.__version__, "reinstall the package (pip install -e .)"
    newest = next(line for line in (ROOT / "CHANGELOG.md").read_text(encoding="utf-8").splitlines()
                  if line.startswith("## "))
    assert newest.split()[1] == Version(targetpo.__version__).base_version, newest


def test_the_sdist_carries_the_whole_test_suite(tmp_path):
    """The source distribution held 5 of the 61 test files and no conftest.py (setuptools' default picks
    tests/test*.py only), so its tests could not run; MANIFEST.in now grafts tests/ and what they read."""
    import subprocess
    import tarfile

    if not (ROOT / ".git").exists():
        pytest.skip("needs a git checkout (the tracked files are what a release builds from)")
    tracked = subprocess.run(["git", "-C", str(ROOT), "ls-files"], capture_output=True, text=True,
                             check=True).stdout.split()
    copy = tmp_path / "src_tree"  # build from a copy: building writes an egg-info folder into src/
    for name in tracked:
        (copy / name).parent.mkdir(parents=True, exist_ok=True)
        (copy / name).write_bytes((ROOT / name).read_bytes())
    code = (f"import os; os.chdir({str(copy)!r}); from setuptools import build_meta; "
            f"print(build_meta.build_sdist({str(tmp_path)!r}))")
    name = subprocess.run([__import__("sys").executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout.split()[-1]
    with tarfile.open(tmp_path / name) as tar:
        shipped = {m.name.split("/", 1)[1] for m in tar.getmembers() if m.isfile()}
    for folder in ("tests/", "docs/", "tools/", "examples/", "benchmarks/"):
        wanted = {t for t in tracked if t.startswith(folder)}
        assert wanted and wanted <= shipped, (folder, sorted(wanted - shipped)[:5])
    assert {"tests/conftest.py", "CHANGELOG.md", "BENCHMARKS.md", "constraints.txt", "pyproject.toml"} <= shipped
    assert not any("__pycache__" in s or s.endswith(".pyc") for s in shipped)


def test_the_git_commit_is_recorded_only_from_a_checkout(tmp_path, monkeypatch):
    """Installed from a wheel into a venv inside the user's own repository, run.json recorded the user's commit
    as targetpo's: `git -C site-packages/../..` finds the enclosing repository."""
    import subprocess

    from targetpo.runs import store

    repo = tmp_path / "userproj"
    site = repo / ".venv" / "lib" / "python3.11" / "site-packages"
    (site / "targetpo" / "runs").mkdir(parents=True)
    git = ["git", "-C", str(repo), "-c", "user.name=u", "-c", "user.email=u@example.org"]
    subprocess.run(git + ["init", "-q"], check=True)
    subprocess.run(git + ["commit", "-q", "--allow-empty", "-m", "user's project"], check=True)
    monkeypatch.setattr(store, "__file__", str(site / "targetpo" / "runs" / "store.py"))
    assert "git_commit" not in store.versions()
    monkeypatch.undo()
    if (ROOT / ".git").exists():  # from this checkout it is recorded
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
        assert store.versions()["git_commit"] == head
