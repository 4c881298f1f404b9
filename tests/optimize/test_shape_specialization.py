"""Shape specialization: with free-dimension overrides, shape computations fold to constants.

SessionOptions.add_free_dimension_override_by_name fixes a symbolic dimension; shape inference
then knows every shape downstream, so Shape / Size and the arithmetic on them become constants
(constant folding), and what they fed (Reshape targets, Expand shapes...) becomes static.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from basic_helpers import optimize_and_compare, parse, rand, session

import onnxrun

TEXT = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[N, T, 8] X) => (float[N, T, 2, 4] Y, int64 S) {
    R = Relu(X)
    shape = Shape(R)
    lead = Slice(shape, zero, two)
    target = Concat<axis = 0>(lead, tail)
    Y = Reshape(R, target)
    S = Size(R)
}"""
INITS = {"zero": np.array([0]), "two": np.array([2]), "tail": np.array([2, 4])}


def test_overrides_fold_shape_subgraphs() -> None:
    model = parse(TEXT, **INITS)
    res = optimize_and_compare(model, {"X": rand(3, 5, 8)}, N=3, T=5)
    assert res.changes("ConstantFolding") == {"Shape": 1, "Slice": 1, "Concat": 1, "Size": 1}
    assert res.ops == {"Relu": 1, "Reshape": 1}
    size = next(t for t in res.saved.graph.initializer if t.name == "S")
    assert onnx.numpy_helper.to_array(size) == 3 * 5 * 8


def test_without_overrides_shapes_stay_dynamic() -> None:
    model = parse(TEXT, **INITS)
    res = optimize_and_compare(model, {"X": rand(3, 5, 8)})
    assert "Shape" not in res.changes("ConstantFolding")
    assert res.ops["Shape"] == 1
    # One override is not enough for the Reshape target, but is for nothing else either.
    res = optimize_and_compare(model, {"X": rand(3, 5, 8)}, N=3)
    assert res.ops["Shape"] == 1


def test_specialized_session_refuses_other_sizes() -> None:
    model = parse(TEXT, **INITS)
    sess = session(model, 1, N=3, T=5)
    assert sess.get_inputs()[0].shape == [3, 5, 8]
    with pytest.raises(onnxrun.InvalidArgument, match="dimensions"):
        sess.run(None, {"X": rand(2, 5, 8)})


def test_callers_model_is_not_modified() -> None:
    model = parse(TEXT, **INITS)
    before = model.SerializeToString()
    so = onnxrun.SessionOptions()
    so.add_free_dimension_override_by_name("N", 3)
    onnxrun.InferenceSession(model, so)
    assert model.SerializeToString() == before
