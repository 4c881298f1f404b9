"""Integer operators on the CUDA provider, exact against the CPU provider: the one-node forms
(MatMulInteger, QLinearMatMul, ConvInteger, QLinearConv, DynamicQuantizeLinear, QLinearAdd)
and the quantized test models (static QDQ and dynamic), whose optimized graphs now run on the
device from end to end."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from cuda_helpers import compare

from onnxrun.quantization import FeedsDataReader, quantize_dynamic, quantize_static

rng = np.random.default_rng(5)
QUANT = Path(__file__).resolve().parent.parent / "models" / "quant"
EXACT = dict(rtol=0, atol=0)


def _model(body: str, opset: int = 13) -> onnx.ModelProto:
    return onnx.parser.parse_model(
        f'<ir_version: 8, opset_import: ["" : {opset}, "com.microsoft" : 1]>\n{body}')


def u8(*shape):
    return rng.integers(0, 256, shape, dtype=np.uint8)


def i8(*shape):
    return rng.integers(-128, 128, shape, dtype=np.int8)


def test_matmul_integer_per_row_and_column_zero_points(on_device):
    m = _model("g (uint8[2,3,5] a, int8[5,4] b, uint8[3] az, int8[4] bz) => (int32[2,3,4] y) "
               "{ y = MatMulInteger(a, b, az, bz) }", 10)
    compare(m, {"a": u8(2, 3, 5), "b": i8(5, 4), "az": u8(3), "bz": i8(4)}, **EXACT)


@pytest.mark.parametrize("types", [("uint8", "uint8", "uint8"), ("int8", "int8", "int8"),
                                   ("uint8", "int8", "uint8")])
def test_qlinear_matmul(on_device, types):
    ta, tb, ty = types
    m = _model(f"g ({ta}[3,16] a, {tb}[16,6] b) => ({ty}[3,6] y) {{ "
               "sa = Constant<value=float {0.02}>() sb = Constant<value=float[6] "
               "{0.01, 0.02, 0.03, 0.015, 0.025, 0.005}>() sy = Constant<value=float {0.05}>() "
               f"za = Constant<value={ta} {{3}}>() zb = Constant<value={tb}[6] {{1,2,3,4,5,6}}>() "
               f"zy = Constant<value={ty} {{7}}>() "
               "y = QLinearMatMul(a, sa, za, b, sb, zb, sy, zy) }")
    gen = {"uint8": u8, "int8": i8}
    compare(m, {"a": gen[ta](3, 16), "b": gen[tb](16, 6)}, **EXACT)


@pytest.mark.parametrize("attrs", ["<pads=[1,1,1,1]>", "<strides=[2,2], pads=[0,1,0,1]>",
                                   "<group=2, dilations=[2,2]>"])
def test_conv_integer(on_device, attrs):
    m = _model(f"g (uint8[2,4,7,7] x, uint8[6,{2 if 'group' in attrs else 4},3,3] w, uint8 xz, "
               f"uint8[6] wz) => (int32 y) {{ y = ConvInteger{attrs}(x, w, xz, wz) }}", 10)
    C = 2 if "group" in attrs else 4
    compare(m, {"x": u8(2, 4, 7, 7), "w": u8(6, C, 3, 3), "xz": np.array(128, np.uint8),
                "wz": u8(6)}, **EXACT)


def test_qlinear_conv_per_channel_with_bias(on_device):
    m = _model("g (uint8[1,3,6,6] x, int8[4,3,3,3] w, int32[4] bias) => (uint8 y) { "
               "sx = Constant<value=float {0.03}>() zx = Constant<value=uint8 {120}>() "
               "sw = Constant<value=float[4] {0.01, 0.02, 0.005, 0.04}>() "
               "zw = Constant<value=int8[4] {0, 0, 0, 0}>() sy = Constant<value=float {0.08}>() "
               "zy = Constant<value=uint8 {100}>() "
               "y = QLinearConv<pads=[1,1,1,1]>(x, sx, zx, w, sw, zw, sy, zy, bias) }", 10)
    compare(m, {"x": u8(1, 3, 6, 6), "w": i8(4, 3, 3, 3),
                "bias": rng.integers(-2000, 2000, 4).astype(np.int32)}, **EXACT)


def test_dynamic_quantize_linear(on_device):
    m = _model("g (float[4,9] x) => (uint8[4,9] y, float s, uint8 z) "
               "{ y, s, z = DynamicQuantizeLinear(x) }", 11)
    compare(m, {"x": rng.standard_normal((4, 9)).astype(np.float32) * 3 + 1}, **EXACT)
    compare(m, {"x": np.abs(rng.standard_normal((4, 9))).astype(np.float32)}, **EXACT)


@pytest.mark.parametrize("b_shape", ["[2,3,8]", "[3,1]", "[8]"])
def test_qlinear_add_broadcasts(on_device, b_shape):
    m = _model(f"g (uint8[2,3,8] a, uint8{b_shape} b) => (uint8[2,3,8] y) {{ "
               "sa = Constant<value=float {0.05}>() za = Constant<value=uint8 {128}>() "
               "sb = Constant<value=float {0.02}>() zb = Constant<value=uint8 {90}>() "
               "sc = Constant<value=float {0.07}>() zc = Constant<value=uint8 {110}>() "
               "y = com.microsoft.QLinearAdd(a, sa, za, b, sb, zb, sc, zc) }")
    shape = [int(d) for d in b_shape.strip("[]").split(",")]
    compare(m, {"a": u8(2, 3, 8), "b": u8(*shape)}, **EXACT)


@pytest.fixture(scope="module", params=["digits_cnn", "cancer_mlp"])
def quantized(request, tmp_path_factory):
    """(name, input, test rows, {format: path}): the test models quantized statically (QDQ)
    and dynamically by onnxrun.quantization."""
    name = request.param
    inp = {"digits_cnn": "image", "cancer_mlp": "features"}[name]
    d = np.load(QUANT / f"{name}.npz")
    tmp = tmp_path_factory.mktemp(name)
    paths = {"qdq": str(tmp / "qdq.onnx"), "dynamic": str(tmp / "dynamic.onnx")}
    feeds = [{inp: d["x_calib"][i:i + 32]} for i in range(0, len(d["x_calib"]), 32)]
    quantize_static(str(QUANT / f"{name}.onnx"), paths["qdq"], FeedsDataReader(feeds),
                    extra_options={"CalibShowProgress": False})
    quantize_dynamic(str(QUANT / f"{name}.onnx"), paths["dynamic"])
    return name, inp, d["x_test"][:32], paths


@pytest.mark.parametrize("fmt", ["qdq", "dynamic"])
def test_quantized_models_stay_on_the_device(on_device, quantized, fmt):
    """Every node of the optimized graph (QLinearConv, QLinearAdd, QGemm,
    ConvIntegerToFloat, DynamicQuantizeMatMul...) runs on the device, bit for bit the CPU's."""
    _, inp, x, paths = quantized
    model = open(paths[fmt], "rb").read()
    compare(model, {inp: x}, on_cpu=0, **EXACT)
