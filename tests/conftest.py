"""Shared fixtures, the real data sets' locations, and one rule for skips.

A test that needs something the machine may lack says so by skipping with the reason: the real data sets through
the `mnist_dir` / `gsm8k_dir` fixtures (also marked `data`), the optional libraries through a module-level
`pytest.importorskip`. With TARGETPO_REQUIRE_ALL=1 (or CI=true) every such skip is a failure instead: CI has the
data and every extra, and a test that quietly stopped running there would go unnoticed.
"""

import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"  # a checkout beside a `shared/data` folder finds the data by itself


def require_all() -> bool:
    return os.environ.get("TARGETPO_REQUIRE_ALL") == "1" or os.environ.get("CI", "").lower() == "true"


def data_dir(env_var: str, default: Path, needed: tuple[str, ...], what: str) -> Path:
    """`$env_var` if set, else `default`, provided it holds every file in `needed` (each possibly gzipped);
    otherwise the test is skipped with how to provide the data."""
    directory = Path(os.environ[env_var]).expanduser() if os.environ.get(env_var) else default
    missing = [f for f in needed if not (directory / f).is_file() and not (directory / f"{f}.gz").is_file()]
    if missing and os.environ.get(env_var):
        pytest.skip(f"{what} not found: {env_var}={directory} lacks {', '.join(missing)}")
    if missing:
        pytest.skip(f"{what} not found: set {env_var}=DIR or put them in {default} (lacks {', '.join(missing)})")
    return directory


@pytest.fixture(scope="session")
def mnist_dir() -> Path:
    """The MNIST IDX files (the test split is enough: the experiments split it 8,000 / 2,000)."""
    return data_dir("TARGETPO_MNIST_DIR", SHARED_DATA / "mnist",
                    ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"), "MNIST IDX files")


@pytest.fixture(scope="session")
def gsm8k_dir() -> Path:
    return data_dir("TARGETPO_GSM8K_DIR", SHARED_DATA / "gsm8k", ("train.jsonl", "test.jsonl"), "GSM8K JSONL files")


DATA_FIXTURES = {"mnist_dir", "gsm8k_dir"}


def pytest_configure(config):
    # Under pytest-xdist (`make test`: one worker per core) each worker takes its share of the cores as torch
    # threads. At every core's threads the workers oversubscribe the machine and each parallel op waits for a
    # descheduled thread (BENCHMARKS.md, "Threads"): the README's 7-second token example took 31 s that way.
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        torch.set_num_threads(max(1, torch.get_num_threads() // workers))


def pytest_collection_modifyitems(items):
    for item in items:
        if DATA_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.data)


def _skip_is_failure(report) -> None:
    if require_all() and report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        reason = reason.removeprefix("Skipped: ")
        report.outcome = "failed"
        report.longrepr = f"TARGETPO_REQUIRE_ALL=1 (or CI=true): every test must run, but this one skipped: {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    _skip_is_failure(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield  # a module-level importorskip skips at collection
    _skip_is_failure(outcome.get_result())


@pytest.fixture(autouse=True)
def _deterministic():
    torch.manual_seed(0)
    yield


@pytest.fixture
def one_torch_thread():
    """Tiny tensors: OpenMP hand-offs between threads cost more than the math (and far more on a busy machine)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="session")
def read_section():
    """Readers of an experiment report's Section: `claim(section, start)` is its one claim whose text starts with
    `start`; `row(section, label)` the cells after the label of the first table row labelled `label`."""

    def claim(section, start: str):
        found = [c for c in section.claims if c.text.startswith(start)]
        assert len(found) == 1, [c.text for c in section.claims]
        return found[0]

    def row(section, label: str) -> list[str]:
        text = "\n".join(section.blocks)
        line = next(line for line in text.splitlines() if line.startswith(f"| {label} |"))
        return [c.strip() for c in line.split("|")[2:-1]]

    return SimpleNamespace(claim=claim, row=row)
