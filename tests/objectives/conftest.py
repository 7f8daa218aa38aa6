import pytest
import torch


@pytest.fixture(scope="module")
def float64():
    """Exact comparisons need float64; restore the default so later test modules see torch's own."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(previous)
