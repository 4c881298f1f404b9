"""ConvActivationFusion: Conv + activation -> com.microsoft FusedConv."""

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


W = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
B = rng.standard_normal(4).astype(np.float32)
FEEDS = {"x": rng.standard_normal((1, 3, 6, 6)).astype(np.float32)}


def conv_model(act: str, opset: int = 17, outs: str = "float[1, 4, 6, 6] y", extra: str = ""):
    return build(f"""<ir_version: 8, opset_import: ["" : {opset}]>
g (float[1, 3, 6, 6] x{extra}) => ({outs}) {{
    c = Conv <pads = [1, 1, 1, 1]> (x, w, b)
    {act}
}}""", w=W, b=B)


CASES = {
    "Relu": ("y = Relu(c)", []),
    "Sigmoid": ("y = Sigmoid(c)", []),
    "Tanh": ("y = Tanh(c)", []),
    "LeakyRelu": ("y = LeakyRelu <alpha = 0.2> (c)", [0.2]),
    "HardSigmoid": ("y = HardSigmoid (c)", [0.2, 0.5]),
    "Clip": ("lo = Constant <value = float {0.0}> ()\n hi = Constant <value = float {6.0}> ()\n"
             " y = Clip(c, lo, hi)", [0.0, 6.0]),
}


@pytest.mark.parametrize("act", list(CASES))
def test_conv_activation_fires(act, tmp_path):
    body, params = CASES[act]
    changes, model = optimized(conv_model(body), FEEDS, tmp_path)
    assert changes["ConvActivationFusion"] == {f"Conv+{act}": 1}
    assert ops(model) == ["FusedConv"]
    node = model.graph.node[0]
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    assert node.domain == "com.microsoft" and attrs["activation"] == act.encode()
    assert attrs["pads"] == [1, 1, 1, 1]
    np.testing.assert_allclose(attrs.get("activation_params", []), params, rtol=1e-6)


def test_clip_with_attributes_before_opset_11_fires(tmp_path):
    body = "y = Clip <min = 0.0, max = 6.0> (c)"
    changes, model = optimized(conv_model(body, opset=9), FEEDS, tmp_path)
    assert ops(model) == ["FusedConv"]


def test_clip_with_only_a_lower_bound_fires(tmp_path):
    body = "lo = Constant <value = float {0.5}> ()\n y = Clip(c, lo)"
    changes, model = optimized(conv_model(body), FEEDS, tmp_path)
    assert ops(model) == ["FusedConv"]


def test_clip_with_runtime_bounds_does_not_fire(tmp_path):
    model = conv_model("y = Clip(c, lo)", extra=", float lo")
    changes, opt = optimized(model, FEEDS | {"lo": np.array(0.1, np.float32)}, tmp_path)
    assert "ConvActivationFusion" not in changes
    assert ops(opt) == ["Conv", "Clip"]


def test_conv_output_read_twice_does_not_fire(tmp_path):
    model = conv_model("y = Relu(c)", outs="float[1, 4, 6, 6] y, float[1, 4, 6, 6] c")
    changes, opt = optimized(model, FEEDS, tmp_path)
    assert "ConvActivationFusion" not in changes
    assert ops(opt) == ["Conv", "Relu"]


def test_hard_swish_is_not_fused(tmp_path):
    changes, opt = optimized(conv_model("y = HardSwish(c)"), FEEDS, tmp_path)
    assert "ConvActivationFusion" not in changes
