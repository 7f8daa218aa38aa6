"""Fixtures of the token tests."""

import pytest

from targetpo.tokens import transformer as tfm


@pytest.fixture
def tiny_model():
    """(infos, parameters [2 seeds, ...]) of a one-layer, d_model = 8 transformer: every optimizer branch and
    parameter kind at a few hundred numbers."""
    spec = tfm.TransformerSpec(vocab=4, max_len=6, d_model=8, heads=2, layers=1, ffn_mult=2)
    return tfm.param_info(spec), tfm.init_params(spec, [0, 1])
