"""Fixtures of the MNIST tests."""

from types import SimpleNamespace

import pytest
import torch


@pytest.fixture
def logged():
    """A runner context for run_unit / train on the CPU that keeps a copy of every record it is given (in
    `.records`) and checks nothing."""
    records = []
    return SimpleNamespace(records=records, device=torch.device("cpu"), check_finite=lambda *a: None,
                           advance=lambda *a: None,
                           log=lambda r: records.append({k: (v.clone() if torch.is_tensor(v) else v)
                                                         for k, v in r.items()}))
