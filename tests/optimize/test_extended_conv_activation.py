"""ConvActivationFusion: Conv + activation -> com.microsoft FusedConv."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.numpy_helper
import onnx.parser
import pytest
from extended_helpers import build, ops, optimized

rng = np.random.default_rng(0)


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
