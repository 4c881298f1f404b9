"""MatMulScaleFusion: scalar Mul / Div around a MatMul -> FusedMatMul alpha."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.numpy_helper
import onnx.parser
import onnxruntime as ort
import pytest

import onnxrun

EXTENDED = onnxrun.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
rng = np.random.default_rng(0)


def build(text: str, **inits: np.ndarray) -> onnx.ModelProto:
    model = onnx.parser.parse_model(text)
    model.graph.initializer.extend(onnx.numpy_helper.from_array(v, k) for k, v in inits.items())
    return model


def optimized(model: onnx.ModelProto, feeds: dict, tmp_path, level=EXTENDED):
    """Optimize and run. Outputs must equal the unoptimized run's, and onnxruntime must load
    the saved optimized model and agree. Returns ({pass: {change: count}}, saved model)."""
    opts = onnxrun.SessionOptions()
    opts.graph_optimization_level = onnxrun.GraphOptimizationLevel.ORT_DISABLE_ALL
    expected = onnxrun.InferenceSession(model.SerializeToString(), opts).run(None, feeds)
    opts = onnxrun.SessionOptions()
    opts.graph_optimization_level = level
    opts.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    sess = onnxrun.InferenceSession(model.SerializeToString(), opts)
    ort_opts = ort.SessionOptions()
    ort_opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    ort_sess = ort.InferenceSession(opts.optimized_model_filepath, ort_opts,
                                    providers=["CPUExecutionProvider"])
    for outputs in (sess.run(None, feeds), ort_sess.run(None, feeds)):
        for got, want in zip(outputs, expected, strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    changes = {name: dict(p.changes) for name, p in sess.get_optimization_report().passes.items()
               if p.changes}
    return changes, onnx.load(opts.optimized_model_filepath)


def ops(model: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in model.graph.node]


FEEDS = {"a": rng.standard_normal((2, 4, 5)).astype(np.float32),
         "b": rng.standard_normal((2, 5, 6)).astype(np.float32),
         "z": np.array(3.0, np.float32)}


def model_of(body: str, c: str = "float {0.125}", outs: str = "float[2, 4, 6] y"):
    return build(f"""<ir_version: 8, opset_import: ["" : 17]>
g (float[2, 4, 5] a, float[2, 5, 6] b, float z) => ({outs}) {{
    c = Constant <value = {c}> ()
    {body}
}}""")


def alpha(model) -> float:
    node = model.graph.node[0]
    return next(x.f for x in node.attribute if x.name == "alpha")


@pytest.mark.parametrize("body, expected", [
    ("m = MatMul(a, b)\n y = Mul(m, c)", 0.125),
    ("m = MatMul(a, b)\n y = Mul(c, m)", 0.125),
    ("m = MatMul(a, b)\n y = Div(m, c)", 8.0),
    ("s = Mul(c, a)\n y = MatMul(s, b)", 0.125),
    ("s = Div(b, c)\n y = MatMul(a, s)", 8.0),
    ("s = Mul(a, c)\n m = MatMul(s, b)\n y = Mul(m, c)", 0.125 ** 2),
])
def test_scale_fires(body, expected, tmp_path):
    changes, opt = optimized(model_of(body), FEEDS, tmp_path)
    assert "MatMulScaleFusion" in changes
    assert ops(opt) == ["FusedMatMul"]
    assert alpha(opt) == pytest.approx(expected)


def test_scale_and_transpose_end_in_one_node(tmp_path):
    feeds = FEEDS | {"b": rng.standard_normal((2, 6, 5)).astype(np.float32)}
    model = build("""<ir_version: 8, opset_import: ["" : 17]>
g (float[2, 4, 5] a, float[2, 6, 5] b) => (float[2, 4, 6] y) {
    c = Constant <value = float {0.25}> ()
    bt = Transpose <perm = [0, 2, 1]> (b)
    m = MatMul(a, bt)
    y = Mul(m, c)
}""")
    feeds.pop("z")
    changes, opt = optimized(model, feeds, tmp_path)
    assert ops(opt) == ["FusedMatMul"]
    assert alpha(opt) == 0.25


def test_vector_scale_does_not_fire(tmp_path):
    body = "m = MatMul(a, b)\n y = Mul(m, c)"
    changes, opt = optimized(model_of(body, c="float[6] {1, 2, 3, 4, 5, 6}"), FEEDS, tmp_path)
    assert "MatMulScaleFusion" not in changes
    assert ops(opt) == ["MatMul", "Mul"]


def test_scale_that_raises_the_rank_does_not_fire(tmp_path):
    body = "m = MatMul(a, b)\n y = Mul(m, c)"
    model = model_of(body, c="float[1, 1, 1, 1] {2}", outs="float[1, 2, 4, 6] y")
    changes, opt = optimized(model, FEEDS, tmp_path)
    assert "MatMulScaleFusion" not in changes


def test_runtime_scale_does_not_fire(tmp_path):
    changes, opt = optimized(model_of("m = MatMul(a, b)\n y = Mul(m, z)"), FEEDS, tmp_path)
    assert "MatMulScaleFusion" not in changes
    assert ops(opt) == ["MatMul", "Mul"]


def test_product_read_twice_does_not_fire(tmp_path):
    model = model_of("m = MatMul(a, b)\n y = Mul(m, c)", outs="float[2, 4, 6] y, float[2, 4, 6] m")
    changes, opt = optimized(model, FEEDS, tmp_path)
    assert "MatMulScaleFusion" not in changes
