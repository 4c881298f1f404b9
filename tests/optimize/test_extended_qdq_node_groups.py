"""QDQSelectorActionTransformer: QDQ node groups become onnxruntime's integer operators.

Each model ends in a QuantizeLinear whose codes are the graph output, so results compare
exactly: onnxrun at the extended level against onnxruntime at the extended level (which makes
the same integer operators), and the saved optimized model on onnxruntime. Groups that must stay
float are compared with the unoptimized run.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import ort_int8
import pytest
from extended_helpers import EXTENDED, build

import onnxrun
from onnxrun.quantization import FeedsDataReader, quantize_static

ort.set_default_logger_severity(3)
rng = np.random.default_rng(0)
QUANT = Path(__file__).resolve().parent.parent / "models" / "quant"
HEAD = '<ir_version: 8, opset_import: ["" : 17]>\n'
X = {"x": rng.standard_normal((2, 8, 10, 10)).astype(np.float32)}

# activations: uint8, per tensor
ACT = {"xs": np.float32(0.03), "xz": np.uint8(120), "ys": np.float32(0.05), "yz": np.uint8(100),
       "zs": np.float32(0.04), "zz": np.uint8(131)}
W = rng.integers(-127, 128, (16, 8, 3, 3)).astype(np.int8)
WS = rng.uniform(0.002, 0.01, 16).astype(np.float32)
WEIGHTS = {"w": W, "ws": WS, "wz": np.zeros(16, np.int8),
           "wst": np.float32(0.006), "wzt": np.int8(0),
           "b": rng.integers(-3000, 3000, 16).astype(np.int32), "bz": np.zeros(16, np.int32),
           "bs": (np.float32(0.03) * WS).astype(np.float32)}
X_DQ = """
    xq = QuantizeLinear(x, xs, xz)
    xd = DequantizeLinear(xq, xs, xz)
"""
CONV = X_DQ + "wd = DequantizeLinear <axis = 0> (w, ws, wz)\n"


def session(model: onnx.ModelProto, level=EXTENDED, path=None, disabled=None):
    opts = onnxrun.SessionOptions()
    opts.graph_optimization_level = level
    if path is not None:
        opts.optimized_model_filepath = str(path)
    if disabled:
        opts.add_session_config_entry("optimization.disable_specified_optimizers", disabled)
    return onnxrun.InferenceSession(model.SerializeToString(), opts)


def histogram(sess) -> Counter:
    return Counter(n.op_type for n in sess._model.graph.nodes)


def ort_run(model, feeds, level=ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED):
    opts = ort.SessionOptions()
    opts.graph_optimization_level = level
    data = model if isinstance(model, str) else model.SerializeToString()
    return ort_int8.session(data, opts).run(None, feeds)  # exact 8-bit products on every CPU


def converted(text: str, tmp_path, feeds=None, atol=0.0, **inits) -> Counter:
    """Optimize at the extended level; the outputs equal onnxruntime's (extended level, where it
    makes the same integer operators; within ``atol`` where it computes part in float) and
    exactly the saved model's on onnxruntime. Returns the optimized graph's operators."""
    feeds = feeds or X
    model = build(HEAD + text, **ACT, **WEIGHTS, **inits)
    path = tmp_path / "optimized.onnx"
    sess = session(model, path=path)
    got = sess.run(None, feeds)
    saved = ort_run(str(path), feeds, ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    for g, want, s in zip(got, ort_run(model, feeds), saved, strict=True):
        np.testing.assert_allclose(g, want, rtol=0, atol=atol)
        np.testing.assert_array_equal(g, s)
    return histogram(sess)


def unchanged(text: str, feeds=None, level=EXTENDED, **inits) -> Counter:
    """Outputs equal the unoptimized run's; returns the optimized graph's operators."""
    feeds = feeds or X
    model = build(HEAD + text, **ACT, **WEIGHTS, **inits)
    sess = session(model, level)
    want = session(model, onnxrun.GraphOptimizationLevel.ORT_DISABLE_ALL).run(None, feeds)
    for g, w in zip(sess.run(None, feeds), want, strict=True):
        np.testing.assert_array_equal(g, w)
    return histogram(sess)


# -- Conv -------------------------------------------------------------------------------------


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("per_channel", [True, False])
def test_conv_becomes_qlinear_conv(bias, per_channel, tmp_path):
    wd = "wd = DequantizeLinear <axis = 0> (w, ws, wz)" if per_channel else \
        "wd = DequantizeLinear(w, wst, wzt)"
    b = ", bd" if bias else ""
    ops = converted(f"""g (float[2, 8, 10, 10] x) => (uint8[2, 16, 10, 10] y) {{
        {X_DQ}
        {wd}
        bd = DequantizeLinear <axis = 0> (b, {"bs, bz" if per_channel else "bst, bzt"})
        c = Conv <pads = [1, 1, 1, 1]> (xd, wd{b})
        y = QuantizeLinear(c, ys, yz)
    }}""", tmp_path, bst=np.float32(0.03) * np.float32(0.006), bzt=np.int32(0))
    assert ops == {"QuantizeLinear": 1, "QLinearConv": 1}


@pytest.mark.parametrize("disabled", [None, "ConstantFolding"])
def test_conv_weight_kept_narrow(disabled):
    """The weight reaches QLinearConv as the int8 initializer: taken back from constant folding,
    or from its DequantizeLinear when nothing folded it."""
    model = build(HEAD + f"""g (float[2, 8, 10, 10] x) => (uint8[2, 16, 10, 10] y) {{
        {CONV}
        bd = DequantizeLinear <axis = 0> (b, bs, bz)
        c = Conv <pads = [1, 1, 1, 1]> (xd, wd, bd)
        y = QuantizeLinear(c, ys, yz)
    }}""", **ACT, **WEIGHTS)
    sess = session(model, disabled=disabled)
    assert histogram(sess) == {"QuantizeLinear": 1, "QLinearConv": 1}
    (conv,) = [n for n in sess._model.graph.nodes if n.op_type == "QLinearConv"]
    for i, want in ((3, W), (4, WS), (8, WEIGHTS["b"])):
        got = conv.inputs[i].const_value
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)
    want = session(model, onnxrun.GraphOptimizationLevel.ORT_ENABLE_EXTENDED).run(None, X)
    np.testing.assert_array_equal(sess.run(None, X)[0], want[0])


def test_basic_level_folds_the_weight_as_before():
    """At the basic level the convolution stays float with its weight folded once: no
    DequantizeLinear of the weight is left to run."""
    ops = unchanged(f"""g (float[2, 8, 10, 10] x) => (uint8[2, 16, 10, 10] y) {{
        {CONV}
        c = Conv <pads = [1, 1, 1, 1]> (xd, wd)
        y = QuantizeLinear(c, ys, yz)
    }}""", level=onnxrun.GraphOptimizationLevel.ORT_ENABLE_BASIC)
    assert ops == {"QuantizeLinear": 2, "DequantizeLinear": 1, "Conv": 1}


def test_output_also_read_by_a_float_op_is_not_fused():
    ops = unchanged(f"""g (float[2, 8, 10, 10] x) => (uint8[2, 16, 10, 10] y,
                                                     float[2, 16, 10, 10] r) {{
        {CONV}
        c = Conv <pads = [1, 1, 1, 1]> (xd, wd)
        y = QuantizeLinear(c, ys, yz)
        r = Relu(c)
    }}""")
    assert ops["Conv"] == 1 and "QLinearConv" not in ops


def test_bias_of_another_scale_is_not_fused():
    ops = unchanged(f"""g (float[2, 8, 10, 10] x) => (uint8[2, 16, 10, 10] y) {{
        {CONV}
        bd = DequantizeLinear <axis = 0> (b, bs2, bz)
        c = Conv <pads = [1, 1, 1, 1]> (xd, wd, bd)
        y = QuantizeLinear(c, ys, yz)
    }}""", bs2=(WEIGHTS["bs"] * 2).astype(np.float32))
    assert ops["Conv"] == 1 and "QLinearConv" not in ops


def test_per_channel_weight_zero_points_must_agree():
    """onnxruntime's QLinearConv takes one weight zero point: others stay float."""
    ops = unchanged(f"""g (float[2, 8, 10, 10] x) => (uint8[2, 16, 10, 10] y) {{
        {X_DQ}
        wd = DequantizeLinear <axis = 0> (w, ws, wz2)
        c = Conv <pads = [1, 1, 1, 1]> (xd, wd)
        y = QuantizeLinear(c, ys, yz)
    }}""", wz2=np.arange(16, dtype=np.int8))
    assert ops["Conv"] == 1


def test_int8_activations_become_uint8(tmp_path):
    """int8 activations move to uint8 (onnxruntime's QDQS8ToU8Transformer). The Conv's output
    DQ is read by the Add group and by a float Relu: it stays for the Relu. (onnxruntime leaves
    that Conv in float: its int8 -> uint8 step skips a Q read by two DQs.)"""
    ops = converted("""g (float[2, 8, 10, 10] x) => (float[2, 16, 10, 10] y) {
        xq = QuantizeLinear(x, xs, xzi)
        xd = DequantizeLinear(xq, xs, xzi)
        wd = DequantizeLinear <axis = 0> (w, ws, wz)
        c = Conv <pads = [1, 1, 1, 1]> (xd, wd)
        cq = QuantizeLinear(c, ys, yzi)
        cd = DequantizeLinear(cq, ys, yzi)
        r = Relu(cd)
        rq = QuantizeLinear(r, ys, yzi)
        rd = DequantizeLinear(rq, ys, yzi)
        a = Add(cd, rd)
        aq = QuantizeLinear(a, zs, zzi)
        y = DequantizeLinear(aq, zs, zzi)
    }""", tmp_path, atol=1.01 * ACT["zs"], xzi=np.int8(-8), yzi=np.int8(-28), zzi=np.int8(3))
    assert ops == {"QuantizeLinear": 2, "QLinearConv": 1, "DequantizeLinear": 2, "Relu": 1,
                   "QLinearAdd": 1}


def test_disabled_by_name():
    model = build(HEAD + f"""g (float[2, 8, 10, 10] x) => (uint8[2, 16, 10, 10] y) {{
        {CONV}
        c = Conv <pads = [1, 1, 1, 1]> (xd, wd)
        y = QuantizeLinear(c, ys, yz)
    }}""", **ACT, **WEIGHTS)
    assert "QLinearConv" not in histogram(session(model, disabled="QDQSelectorActionTransformer"))


# -- other groups -----------------------------------------------------------------------------


def test_add_becomes_qlinear_add(tmp_path):
    ops = converted("""g (float[2, 8, 10, 10] x, float[2, 8, 10, 10] x2) => (uint8[2, 8, 10, 10] y)
    {
        aq = QuantizeLinear(x, xs, xz)
        ad = DequantizeLinear(aq, xs, xz)
        bq = QuantizeLinear(x2, zs, zz)
        bd = DequantizeLinear(bq, zs, zz)
        s = Add(ad, bd)
        y = QuantizeLinear(s, ys, yz)
    }""", tmp_path, feeds={**X, "x2": rng.standard_normal((2, 8, 10, 10)).astype(np.float32)})
    assert ops == {"QuantizeLinear": 2, "QLinearAdd": 1}


def test_concat_becomes_qlinear_concat(tmp_path):
    """Inputs of other scales than the output's are requantized by QLinearConcat."""
    ops = converted("""g (float[2, 8, 10, 10] x, float[2, 8, 10, 10] x2) => (uint8[2, 16, 10, 10] y)
    {
        aq = QuantizeLinear(x, xs, xz)
        ad = DequantizeLinear(aq, xs, xz)
        bq = QuantizeLinear(x2, zs, zz)
        bd = DequantizeLinear(bq, zs, zz)
        s = Concat <axis = 1> (ad, bd)
        y = QuantizeLinear(s, ys, yz)
    }""", tmp_path, feeds={**X, "x2": rng.standard_normal((2, 8, 10, 10)).astype(np.float32)})
    assert ops == {"QuantizeLinear": 2, "QLinearConcat": 1}


@pytest.mark.parametrize("op, qop, shape", [
    ("GlobalAveragePool", "QLinearGlobalAveragePool", "2, 8, 1, 1"),
    ("AveragePool <kernel_shape = [3, 3], pads = [1, 1, 1, 1], strides = [2, 2]>",
     "QLinearAveragePool", "2, 8, 5, 5"),
    ("Sigmoid", "QLinearSigmoid", "2, 8, 10, 10"),
    ("LeakyRelu <alpha = 0.2>", "QLinearLeakyRelu", "2, 8, 10, 10"),
    ("Softmax <axis = 1>", "QLinearSoftmax", "2, 8, 10, 10"),
])
def test_unary_becomes_qlinear(op, qop, shape, tmp_path):
    ops = converted(f"""g (float[2, 8, 10, 10] x) => (uint8[{shape}] y) {{
        xq = QuantizeLinear(x, xs, xz)
        xd = DequantizeLinear(xq, xs, xz)
        p = {op}(xd)
        y = QuantizeLinear(p, ys, yz)
    }}""", tmp_path)
    assert ops == {"QuantizeLinear": 1, qop: 1}


@pytest.mark.parametrize("op, shape", [
    ("Flatten", "2, 800"), ("Transpose <perm = [0, 2, 3, 1]>", "2, 10, 10, 8"),
    ("MaxPool <kernel_shape = [2, 2], strides = [2, 2]>", "2, 8, 5, 5")])
def test_data_movement_runs_on_codes(op, shape, tmp_path):
    """DQ -> op -> Q of one scale and zero point: the op moves the codes, DQ and Q dropped."""
    ops = converted(f"""g (float[2, 8, 10, 10] x) => (uint8[{shape}] y) {{
        xq = QuantizeLinear(x, xs, xz)
        xd = DequantizeLinear(xq, xs, xz)
        f = {op}(xd)
        y = QuantizeLinear(f, xs, xz)
    }}""", tmp_path)
    assert ops == {"QuantizeLinear": 1, op.split()[0]: 1}


def test_data_movement_with_other_parameters_stays_float():
    ops = unchanged("""g (float[2, 8, 10, 10] x) => (uint8[2, 800] y) {
        xq = QuantizeLinear(x, xs, xz)
        xd = DequantizeLinear(xq, xs, xz)
        f = Flatten(xd)
        y = QuantizeLinear(f, ys, yz)
    }""")
    assert ops == {"QuantizeDequantize": 1, "Flatten": 1, "QuantizeLinear": 1}


def test_matmul_becomes_qlinear_matmul(tmp_path):
    """A per-column int8 weight of a (K, N) product."""
    ops = converted("""g (float[4, 10] x) => (uint8[4, 6] y) {
        xq = QuantizeLinear(x, xs, xz)
        xd = DequantizeLinear(xq, xs, xz)
        md = DequantizeLinear <axis = 1> (m, ms, mz)
        p = MatMul(xd, md)
        y = QuantizeLinear(p, ys, yz)
    }""", tmp_path, feeds={"x": rng.standard_normal((4, 10)).astype(np.float32)},
        m=rng.integers(-127, 128, (10, 6)).astype(np.int8),
        ms=rng.uniform(0.01, 0.02, 6).astype(np.float32), mz=np.zeros(6, np.int8))
    assert ops == {"QuantizeLinear": 1, "QLinearMatMul": 1}


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("quantized_output", [True, False])
def test_gemm_becomes_qgemm(quantized_output, bias, tmp_path):
    """transB weight per output channel, int32 bias; without a Q, QGemm writes float. alpha
    scales the product (without a bias: with one, onnxruntime keeps the group in float)."""
    gs = rng.uniform(0.01, 0.02, 6).astype(np.float32)
    out = "uint8[4, 6] y" if quantized_output else "float[4, 6] p"
    q = "y = QuantizeLinear(p, ys, yz)" if quantized_output else ""
    ops = converted(f"""g (float[4, 10] x) => ({out}) {{
        xq = QuantizeLinear(x, xs, xz)
        xd = DequantizeLinear(xq, xs, xz)
        gd = DequantizeLinear <axis = 0> (gw, gs, gz)
        cd = DequantizeLinear <axis = 0> (gb, gbs, gbz)
        p = Gemm <transB = 1, alpha = {1.0 if bias else 0.5}> (xd, gd{", cd" if bias else ""})
        {q}
    }}""", tmp_path, feeds={"x": rng.standard_normal((4, 10)).astype(np.float32)},
        gw=rng.integers(-127, 128, (6, 10)).astype(np.int8), gs=gs, gz=np.zeros(6, np.int8),
        gb=rng.integers(-500, 500, 6).astype(np.int32), gbs=np.float32(0.03) * gs,
        gbz=np.zeros(6, np.int32))
    assert ops == {"QuantizeLinear": 1, "QGemm": 1}


def test_gemm_bias_not_scaled_by_alpha_is_not_fused():
    """QGemm scales its int32 bias by alpha too: a bias quantized with a_scale * b_scale under
    alpha != 1 stays float."""
    gs = rng.uniform(0.01, 0.02, 6).astype(np.float32)
    ops = unchanged("""g (float[4, 10] x) => (float[4, 6] p) {
        xq = QuantizeLinear(x, xs, xz)
        xd = DequantizeLinear(xq, xs, xz)
        gd = DequantizeLinear <axis = 0> (gw, gs, gz)
        cd = DequantizeLinear <axis = 0> (gb, gbs, gbz)
        p = Gemm <transB = 1, alpha = 0.5> (xd, gd, cd)
    }""", feeds={"x": rng.standard_normal((4, 10)).astype(np.float32)},
        gw=rng.integers(-127, 128, (6, 10)).astype(np.int8), gs=gs, gz=np.zeros(6, np.int8),
        gb=rng.integers(-500, 500, 6).astype(np.int32), gbs=np.float32(0.03) * gs,
        gbz=np.zeros(6, np.int32))
    assert ops["Gemm"] == 1 and "QGemm" not in ops


# -- a model from onnxrun's quantizer -------------------------------------------------------------


def test_quantize_static_conv_net_runs_on_integer_operators(tmp_path):
    """digits_cnn (3 convolutions, max pool, residual Add, global average pool, linear) quantized
    by onnxrun.quantization: every group becomes an integer operator; the outputs are
    onnxruntime's (extended level) within a step of the output's scale."""
    data = np.load(QUANT / "digits_cnn.npz")
    path = str(tmp_path / "qdq.onnx")
    calib = [{"image": data["x_calib"][i:i + 32]} for i in range(0, len(data["x_calib"]), 32)]
    quantize_static(str(QUANT / "digits_cnn.onnx"), path, FeedsDataReader(calib),
                    extra_options={"CalibShowProgress": False})
    model = onnx.load(path)
    feeds = {"image": data["x_test"][:64]}
    sess = session(model, path=tmp_path / "optimized.onnx")
    ops = histogram(sess)
    assert ops["QLinearConv"] == 3 and "Conv" not in ops and "DequantizeLinear" in ops
    assert {"QLinearAdd", "QLinearGlobalAveragePool", "QGemm"} <= set(ops)
    got = sess.run(None, feeds)[0]
    want = ort_run(model, feeds, ort.GraphOptimizationLevel.ORT_ENABLE_ALL)[0]
    saved = ort_run(str(tmp_path / "optimized.onnx"), feeds,
                    ort.GraphOptimizationLevel.ORT_DISABLE_ALL)[0]
    np.testing.assert_array_equal(got, saved)
    scale = max(float(onnx.numpy_helper.to_array(i)) for i in model.graph.initializer
                if i.name.endswith("_scale") and len(i.dims) == 0)
    assert np.abs(got - want).max() <= 2 * scale
    assert (got.argmax(1) == want.argmax(1)).mean() >= 0.98
