"""ShapeRefinement: shapes ONNX inference left unknown are propagated (no node changes), so the
fusions' shape checks work after a Reshape-13 to a computed target or a com.microsoft node."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx.parser
import pytest

import onnxrun
from onnxrun.dtypes import np_dtype, type_shape
from onnxrun.load import load_model
from onnxrun.optimize.extended.shape_refinement import ShapeRefinement
from onnxrun.validate import validate

MODELS = Path(__file__).resolve().parent.parent / "models"


def _actual(model: onnx.ModelProto, feeds: dict) -> dict[str, np.ndarray]:
    """Every node output's value in a plain run."""
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    known = {o.name for o in probe.graph.output}
    for node in probe.graph.node:
        probe.graph.output.extend(onnx.ValueInfoProto(name=n) for n in node.output
                                  if n and n not in known)
    opts = onnxrun.SessionOptions()
    opts.graph_optimization_level = onnxrun.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = onnxrun.InferenceSession(probe.SerializeToString(), opts)
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(None, feeds), strict=True))


@pytest.mark.parametrize("name", ["bert_tiny", "gpt_tiny", "mobilenet_tiny"])
def test_refined_shapes_agree_with_the_run(name):
    proto = onnx.load(str(MODELS / f"{name}.onnx"))
    data = np.load(MODELS / f"{name}.inputs.npz")
    feeds = {k.split("/", 1)[1]: data[k] for k in data.files if k.startswith("0/")}
    actual = _actual(proto, feeds)
    mp, model = load_model(str(MODELS / f"{name}.onnx"))
    validate(mp, model)
    outputs = {id(v) for v in model.graph.outputs}
    values = [v for n in model.graph.nodes for v in n.outputs if v.name and id(v) not in outputs]
    for v in values:  # forget what ONNX inferred
        v.type = None
    ShapeRefinement().run(model)
    refined = [v for v in values if v.type is not None]
    assert len(refined) > 0.9 * len(values)
    symbols: dict[str, int] = {}
    for v in refined:
        got, dims = actual[v.name], type_shape(v.type)
        assert np_dtype(v.type.tensor_type.elem_type) == got.dtype, v.name
        assert dims is not None and len(dims) == got.ndim, (v.name, dims, got.shape)
        for d, size in zip(dims, got.shape, strict=True):
            if isinstance(d, int):
                assert d == size, (v.name, dims, got.shape)
            elif isinstance(d, str):
                assert symbols.setdefault(d, size) == size, (v.name, d)


def test_fusion_after_reshape_to_a_computed_target(tmp_path):
    # Reshape-13's inference gives no rank for a computed target: Gelu's rank check needs ours
    model = onnx.parser.parse_model("""<ir_version: 8, opset_import: ["" : 13]>
g (float[batch, 6] x) => (float[batch, 2, 3] y) {
    shape = Shape(x)
    zero = Constant <value = int64[1] {0}> ()
    b = Gather(shape, zero)
    rest = Constant <value = int64[2] {2, 3}> ()
    target = Concat <axis = 0> (b, rest)
    h = Reshape(x, target)
    c = Constant <value = float {1.4142135}> ()
    one = Constant <value = float {1.0}> ()
    half = Constant <value = float {0.5}> ()
    a = Div(h, c)
    e = Erf(a)
    p = Add(e, one)
    e1 = Mul(h, p)
    y = Mul(e1, half)
}""")
    opts = onnxrun.SessionOptions()
    opts.graph_optimization_level = onnxrun.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    sess = onnxrun.InferenceSession(model.SerializeToString(), opts)
    assert sess.get_optimization_report().passes["GeluFusion"].changes == {"Gelu": 1}
    x = np.random.default_rng(0).standard_normal((4, 6)).astype(np.float32)
    opts.graph_optimization_level = onnxrun.GraphOptimizationLevel.ORT_DISABLE_ALL
    want = onnxrun.InferenceSession(model.SerializeToString(), opts).run(None, {"x": x})[0]
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], want, rtol=1e-4, atol=1e-5)
