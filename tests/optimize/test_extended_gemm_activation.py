"""GemmActivationFusion: Gemm (and MatMul + Add) + activation -> com.microsoft FusedGemm."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.numpy_helper
import onnx.parser
import pytest
from extended_helpers import build, ops, optimized

rng = np.random.default_rng(0)


W = rng.standard_normal((8, 5)).astype(np.float32)
B = rng.standard_normal(5).astype(np.float32)
FEEDS = {"x": rng.standard_normal((4, 8)).astype(np.float32)}


def gemm_model(act: str, outs: str = "float[4, 5] y", gemm: str = "g1 = Gemm(x, w, b)"):
    return build(f"""<ir_version: 8, opset_import: ["" : 17]>
g (float[4, 8] x) => ({outs}) {{
    {gemm}
    {act}
}}""", w=W, b=B)


CASES = {
    "Relu": ("y = Relu(g1)", {}),
    "Tanh": ("y = Tanh(g1)", {}),
    "Sigmoid": ("y = Sigmoid(g1)", {}),
    "LeakyRelu": ("y = LeakyRelu <alpha = 0.1> (g1)", {"activation_alpha": 0.1}),
    "HardSigmoid": ("y = HardSigmoid <beta = 0.4> (g1)",
                    {"activation_alpha": 0.2, "activation_beta": 0.4}),
    "Elu": ("y = Elu(g1)", {"activation_alpha": 1.0}),
    "Softplus": ("y = Softplus(g1)", {}),
}


@pytest.mark.parametrize("act", list(CASES))
def test_gemm_activation_fires(act, tmp_path):
    body, params = CASES[act]
    changes, model = optimized(gemm_model(body), FEEDS, tmp_path)
    assert changes["GemmActivationFusion"] == {f"Gemm+{act}": 1}
    assert ops(model) == ["FusedGemm"]
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in model.graph.node[0].attribute}
    assert attrs["activation"] == act.encode()
    for k, v in params.items():
        assert attrs[k] == pytest.approx(v)


def test_transposed_gemm_keeps_its_attributes(tmp_path):
    model = gemm_model("y = Relu(g1)", gemm="g1 = Gemm <transB = 1, alpha = 0.5> (x, wt, b)")
    model.graph.initializer.append(onnx.numpy_helper.from_array(W.T.copy(), "wt"))
    changes, opt = optimized(model, FEEDS, tmp_path)
    assert ops(opt) == ["FusedGemm"]
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in opt.graph.node[0].attribute}
    assert attrs["transB"] == 1 and attrs["alpha"] == 0.5


def test_matmul_add_relu_fires(tmp_path):
    model = gemm_model("y = Relu(g1)", gemm="m = MatMul(x, w)\n g1 = Add(m, b)")
    changes, opt = optimized(model, FEEDS, tmp_path)
    assert ops(opt) == ["FusedGemm"]


def test_gemm_output_read_twice_does_not_fire(tmp_path):
    changes, opt = optimized(gemm_model("y = Relu(g1)", outs="float[4, 5] y, float[4, 5] g1"),
                             FEEDS, tmp_path)
    assert "GemmActivationFusion" not in changes
    assert ops(opt) == ["Gemm", "Relu"]


def test_clip_is_not_fused(tmp_path):
    # onnxruntime's FusedGemm has no Clip activation
    body = "lo = Constant <value = float {0.0}> ()\n y = Clip(g1, lo)"
    changes, opt = optimized(gemm_model(body), FEEDS, tmp_path)
    assert "GemmActivationFusion" not in changes
