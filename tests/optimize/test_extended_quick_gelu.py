"""QuickGeluFusion: x * Sigmoid(alpha * x) -> com.microsoft QuickGelu."""

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


HEAD = '<ir_version: 8, opset_import: ["" : 17]>\n'
FEEDS = {"x": rng.standard_normal((2, 3, 8)).astype(np.float32),
         "z": rng.standard_normal((2, 3, 8)).astype(np.float32)}


def model_of(body: str):
    return build(f"""{HEAD}
g (float[2, 3, 8] x, float[2, 3, 8] z) => (float[2, 3, 8] y) {{
    alpha = Constant <value = float {{1.702}}> ()
    {body}
}}""")


def test_quick_gelu_fires(tmp_path):
    model = model_of("ax = Mul(alpha, x)\n s = Sigmoid(ax)\n y = Mul(x, s)")
    changes, opt = optimized(model, FEEDS, tmp_path)
    assert changes["QuickGeluFusion"] == {"QuickGelu": 1}
    assert ops(opt) == ["QuickGelu"]
    assert opt.graph.node[0].attribute[0].f == pytest.approx(1.702)


def test_silu_fires_with_alpha_one(tmp_path):
    changes, opt = optimized(model_of("s = Sigmoid(x)\n y = Mul(s, x)"), FEEDS, tmp_path)
    assert ops(opt) == ["QuickGelu"]
    assert opt.graph.node[0].attribute[0].f == 1.0


def test_sigmoid_of_another_value_does_not_fire(tmp_path):
    changes, opt = optimized(model_of("s = Sigmoid(z)\n y = Mul(x, s)"), FEEDS, tmp_path)
    assert "QuickGeluFusion" not in changes
    assert sorted(ops(opt)) == ["Mul", "Sigmoid"]


def test_non_constant_alpha_does_not_fire(tmp_path):
    model = model_of("ax = Mul(z, x)\n s = Sigmoid(ax)\n y = Mul(x, s)")
    changes, opt = optimized(model, FEEDS, tmp_path)
    assert "QuickGeluFusion" not in changes
    assert "Sigmoid" in ops(opt)
