"""The import rule of docs/architecture.md: the import-linter contracts in pyproject.toml hold."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_import_contracts_are_kept(monkeypatch):
    use_cases = pytest.importorskip("importlinter.application.use_cases")
    from importlinter.configuration import configure

    configure()
    monkeypatch.chdir(ROOT)
    monkeypatch.syspath_prepend(str(ROOT / "src"))
    assert "targetpo.objectives" in (ROOT / "pyproject.toml").read_text()
    assert use_cases.lint_imports(config_filename=str(ROOT / "pyproject.toml"), no_logo=True, cache_dir=None), \
        "an import breaks the layer contracts in pyproject.toml; run `PYTHONPATH=src lint-imports` for the chain"
