"""ConstantFolding fills a ConstantOfShape of a constant shape itself (no kernel prepared for
it): the same arrays as the kernel's, and the same nodes left to run time."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.helper as h
import pytest

from onnxrun.load import load_model
from onnxrun.optimize.basic import constant_folding

CASES = [
    ([2, 3], None), ([0, 4], None), ([], None), ([3], np.array([7], np.int32)),
    ([2, 2], np.array([1.5], np.float16)), ([2], np.array([True])),
    ([2, 1], np.array([np.nan], np.float64)), ([1], np.array([-0.0], np.float32)),
    ([-1], None),  # refused by the kernel: left to run time
    ([1 << 40, 1 << 40], None),  # too large to fill: left to run time, no crash
    ([2], np.array([1, 2], np.float32)),  # two values (onnx allows one): the kernel decides
]


def _folded(shape, value, fill: bool) -> np.ndarray | None:
    attrs = {} if value is None else {"value": onnx.numpy_helper.from_array(value)}
    graph = h.make_graph([h.make_node("ConstantOfShape", ["s"], ["y"], **attrs)], "g", [],
                         [h.make_tensor_value_info("y", onnx.TensorProto.UNDEFINED, None)],
                         [onnx.numpy_helper.from_array(np.array(shape, np.int64), "s")])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    _, ir = load_model(model.SerializeToString(), None, {}, {})
    real = constant_folding._constant_of_shape
    calls = []

    def spy(*args):
        calls.append(1)
        return real(*args) if fill else None

    constant_folding._constant_of_shape = spy
    try:
        constant_folding.ConstantFolding().run(ir)
    finally:
        constant_folding._constant_of_shape = real
    assert calls  # the fill was asked
    v = ir.graph.initializers.get("y")
    return None if v is None else v.const_value


@pytest.mark.parametrize(("shape", "value"), CASES)
def test_filled_as_the_kernel_fills(shape, value):
    got, want = _folded(shape, value, True), _folded(shape, value, False)
    if want is None:
        assert got is None
        return
    assert got is not None and got.dtype == want.dtype and got.shape == want.shape
    assert got.tobytes() == want.tobytes()
