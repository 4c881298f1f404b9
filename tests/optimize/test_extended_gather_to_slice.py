"""GatherToSliceFusion: Gather(data, Range(start, limit, step)) -> Slice."""

from __future__ import annotations

import numpy as np
import pytest
from extended_helpers import build, ops, optimized

rng = np.random.default_rng(0)


TABLE = rng.standard_normal((10, 4)).astype(np.float32)
FEEDS = {"ids": np.array([[1, 2, 3, 4, 5, 6]], np.int64)}


def positions_model(start: int = 0, step: int = 1, outs: str = "float[p, q] y",
                    axis: int = 0):
    table = "table" if axis == 0 else "table_t"
    return build(f"""<ir_version: 8, opset_import: ["" : 17]>
g (int64[1, seq] ids) => ({outs}) {{
    shape = Shape(ids)
    one = Constant <value = int64 {{1}}> ()
    n = Gather <axis = 0> (shape, one)
    start = Constant <value = int64 {{{start}}}> ()
    step = Constant <value = int64 {{{step}}}> ()
    r = Range(start, n, step)
    y = Gather <axis = {axis}> ({table}, r)
}}""", table=TABLE, table_t=TABLE.T.copy())


@pytest.mark.parametrize("axis", [0, 1])
def test_gather_of_range_fires(axis, tmp_path):
    changes, model = optimized(positions_model(step=2, axis=axis), FEEDS, tmp_path)
    assert changes["GatherToSliceFusion"] == {"Gather(Range)->Slice": 1}
    assert "Range" not in ops(model) and "Slice" in ops(model)


def test_negative_start_does_not_fire(tmp_path):
    # Gather reads index -2 as the second-to-last row; Slice would read from there to the limit
    changes, model = optimized(positions_model(start=-2), FEEDS, tmp_path)
    assert "GatherToSliceFusion" not in changes
    assert "Range" in ops(model)


def test_range_read_elsewhere_does_not_fire(tmp_path):
    model = positions_model(outs="float[p, q] y, int64[m] r")
    changes, opt = optimized(model, FEEDS, tmp_path)
    assert "GatherToSliceFusion" not in changes
