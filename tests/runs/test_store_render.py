"""Metrics text: the one-format-per-row fast path writes exactly the per-number text."""

import json

import numpy as np
import torch

from targetpo.runs.store import _num, _render


def _slow(values) -> str:
    return "[" + ",".join(map(_num, values)) + "]"


def test_row_text_equals_per_number_text():
    rng = np.random.default_rng(0)
    for dtype in (np.float32, np.float64):
        x = (rng.standard_normal(500) * 10.0 ** rng.integers(-30, 30, 500)).astype(dtype)
        x[:6] = [0.0, -0.0, 1e-5, 123456789.0, 0.1, 2.5]
        assert _render(x) == _slow(x.tolist())
        assert _render(torch.from_numpy(x)) == _slow(x.tolist())
    assert _render(np.array([1.0, np.nan, -np.inf])) == "[1,NaN,-Infinity]"  # non-finite rows: the slow path
    assert _render({"step": 3, "ok": True, "x": np.float32(0.5), "n": np.int64(2)}) == \
        '{"step":3,"ok":true,"x":0.5,"n":2}'
    assert json.loads(_render({"a": torch.ones(2, 2)})) == {"a": [[1, 1], [1, 1]]}
