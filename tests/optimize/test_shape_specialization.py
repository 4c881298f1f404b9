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


def test_override_by_denotation_folds_too() -> None:
    # onnxruntime's other override: by the dimension's denotation (DATA_BATCH...); the symbol
    # carrying it is then that value everywhere, outputs included.
    model = parse(TEXT, **INITS)
    model.graph.input[0].type.tensor_type.shape.dim[0].denotation = "DATA_BATCH"
    model.graph.input[0].type.tensor_type.shape.dim[1].denotation = "DATA_CHANNEL"
    so = onnxrun.SessionOptions()
    so.add_free_dimension_override_by_denotation("DATA_BATCH", 3)
    so.add_free_dimension_override_by_denotation("DATA_CHANNEL", 5)
    sess = onnxrun.InferenceSession(model.SerializeToString(), so)
    assert sess.get_inputs()[0].shape == [3, 5, 8]
    assert sess.get_outputs()[0].shape == [3, 5, 2, 4]
    assert sess.get_optimization_report().passes["ConstantFolding"].changes["Shape"] == 1
    x = rand(3, 5, 8)
    y, size = sess.run(None, {"X": x})
    np.testing.assert_array_equal(y, np.maximum(x, 0).reshape(3, 5, 2, 4))
    assert size == 120
