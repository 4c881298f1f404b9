"""MatMulIntegerToFloatFusion and DynamicQuantizeMatMulFusion on what quantize_dynamic writes."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.helper as oh
import pytest
from extended_helpers import build, ops, optimized

from onnxrun.quantization import quantize_dynamic

F = onnx.TensorProto.FLOAT

def _mlp(shared_input: bool = False) -> onnx.ModelProto:
    """y = relu(x @ W1 + b1) @ W2 + b2 (and, shared_input, a second product z = x @ W3 + b3)."""
    rng = np.random.default_rng(0)  # the same weights whichever tests run before
    inits = {"W1": rng.standard_normal((16, 32)), "b1": rng.standard_normal(32),
             "W2": rng.standard_normal((32, 8)), "b2": rng.standard_normal(8),
             "W3": rng.standard_normal((16, 8)), "b3": rng.standard_normal(8)}
    nodes = [oh.make_node("MatMul", ["x", "W1"], ["h0"]), oh.make_node("Add", ["h0", "b1"], ["h1"]),
             oh.make_node("Relu", ["h1"], ["h"]), oh.make_node("MatMul", ["h", "W2"], ["y0"]),
             oh.make_node("Add", ["y0", "b2"], ["y"])]
    outputs = [oh.make_tensor_value_info("y", F, ["batch", "seq", 8])]
    if shared_input:
        nodes += [oh.make_node("MatMul", ["x", "W3"], ["z0"]),
                  oh.make_node("Add", ["b3", "z0"], ["z"])]
        outputs.append(oh.make_tensor_value_info("z", F, ["batch", "seq", 8]))
    else:
        del inits["W3"], inits["b3"]
    graph = oh.make_graph(
        nodes, "mlp", [oh.make_tensor_value_info("x", F, ["batch", "seq", 16])], outputs,
        [onnx.numpy_helper.from_array(v.astype(np.float32), k) for k, v in inits.items()])
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)], ir_version=8)


def _quantized(tmp_path, per_channel=False, **kw) -> onnx.ModelProto:
    src, dst = tmp_path / "f32.onnx", tmp_path / "int8.onnx"
    onnx.save(_mlp(**kw), src)
    quantize_dynamic(src, dst, per_channel=per_channel)
    return onnx.load(dst)


FEEDS = {"x": np.random.default_rng(1).standard_normal((2, 5, 16)).astype(np.float32)}


@pytest.mark.parametrize("per_channel", [False, True])
def test_each_product_becomes_one_dynamic_quantize_matmul(per_channel, tmp_path):
    model = _quantized(tmp_path, per_channel)
    assert ops(model).count("MatMulInteger") == 2
    changes, opt = optimized(model, FEEDS, tmp_path)
    assert changes["MatMulIntegerToFloatFusion"] == {"MatMulIntegerToFloat": 2,
                                                     "MatMulIntegerToFloat+bias": 2}
    assert changes["DynamicQuantizeMatMulFusion"] == {"DynamicQuantizeMatMul": 2}
    assert ops(opt) == ["DynamicQuantizeMatMul", "Relu", "DynamicQuantizeMatMul"]
    assert all(len(n.input) == 5 for n in opt.graph.node if n.op_type != "Relu")  # with bias


def test_a_shared_dynamic_quantization_stays_and_quantizes_once(tmp_path):
    model = _quantized(tmp_path, shared_input=True)
    changes, opt = optimized(model, FEEDS, tmp_path)
    assert sorted(ops(opt)) == ["DynamicQuantizeLinear", "DynamicQuantizeMatMul",
                                "MatMulIntegerToFloat", "MatMulIntegerToFloat", "Relu"]


TEXT = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[4, 16] x, float b_scale_in) => (float[4, 8] y) {
    a, a_scale, a_zp = DynamicQuantizeLinear(x)
    acc = MatMulInteger(a, B, a_zp, b_zp)
    accf = Cast<to = 1>(acc)
    scale = Mul(a_scale, %s)
    y = Mul(accf, scale)
}"""
HAND_FEEDS = {"x": FEEDS["x"][0, :4], "b_scale_in": np.array(0.02, np.float32)}


def _hand_written(b_scale: str):
    B = np.random.default_rng(2).integers(-127, 128, (16, 8)).astype(np.int8)
    return build(TEXT % b_scale, B=B,
                 b_zp=np.array(0, np.int8), b_scale=np.array(0.02, np.float32),
                 row_scale=np.full((4, 1), 0.02, np.float32))


def test_hand_written_group_fires(tmp_path):
    changes, opt = optimized(_hand_written("b_scale"), HAND_FEEDS, tmp_path)
    assert ops(opt) == ["DynamicQuantizeMatMul"]


@pytest.mark.parametrize("b_scale", ["b_scale_in", "row_scale"])
def test_a_runtime_or_per_row_weight_scale_does_not_fire(b_scale, tmp_path):
    changes, opt = optimized(_hand_written(b_scale), HAND_FEEDS, tmp_path)
    assert "MatMulIntegerToFloatFusion" not in changes
    assert "MatMulInteger" in ops(opt)
