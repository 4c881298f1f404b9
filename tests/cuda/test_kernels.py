"""The CUDA provider's kernels against the CPU provider's outputs (one-node and small models
in ONNX text), on the stand-in device (and on CuPy, marked gpu)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from cuda_helpers import compare

import onnxrun

rng = np.random.default_rng(0)


def _model(body: str, opset: int = 17, domains: str = "") -> onnx.ModelProto:
    return onnx.parser.parse_model(
        f'<ir_version: 8, opset_import: ["" : {opset}{domains}]>\n{body}')


def f32(*shape):
    return rng.standard_normal(shape).astype(np.float32)


UNARY = ["Neg", "Abs", "Exp", "Tanh", "Sin", "Cos", "Floor", "Ceil", "Sign", "Relu", "Sigmoid",
         "Softplus", "Softsign", "Erf", "Identity", "Reciprocal"]


@pytest.mark.parametrize("name", UNARY)
def test_unary(on_device, name):
    m = _model(f"g (float[3,4] x) => (float[3,4] y) {{ y = {name}(x) }}")
    compare(m, {"x": f32(3, 4)})


@pytest.mark.parametrize("name", ["Sqrt", "Log"])
def test_unary_positive(on_device, name):
    m = _model(f"g (float[3,4] x) => (float[3,4] y) {{ y = {name}(x) }}")
    compare(m, {"x": np.abs(f32(3, 4)) + 0.1})


@pytest.mark.parametrize("name", ["Add", "Sub", "Mul", "Div", "Max", "Min", "Sum", "Mean"])
def test_binary_broadcast(on_device, name):
    m = _model(f"g (float[2,3,4] a, float[4] b) => (float[2,3,4] y) {{ y = {name}(a, b) }}")
    compare(m, {"a": f32(2, 3, 4), "b": f32(4) + 3.0})


@pytest.mark.parametrize("name", ["Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"])
def test_compare(on_device, name):
    m = _model(f"g (int64[5] a, int64[5] b) => (bool[5] y) {{ y = {name}(a, b) }}")
    compare(m, {"a": np.array([1, 2, 3, 4, 5]), "b": np.array([5, 2, 1, 4, 9])})


def test_integer_div_and_mod_truncate_as_onnx(on_device):
    m = _model("g (int64[6] a, int64[6] b) => (int64[6] q, int64[6] r, int64[6] f) "
               "{ q = Div(a, b) r = Mod(a, b) f = Mod<fmod=1>(a, b) }")
    compare(m, {"a": np.array([7, -7, 7, -7, 0, 9]), "b": np.array([2, 2, -2, -2, 3, 4])})


def test_pow_where_clip_cast(on_device):
    m = _model("g (float[6] x, float[6] e, bool[6] c) => (float[6] p, float[6] w, float[6] k, "
               "int32[6] i) { p = Pow(x, e) w = Where(c, x, e) lo = Constant<value=float{-0.5}>() "
               "hi = Constant<value=float{0.5}>() k = Clip(x, lo, hi) i = Cast<to=6>(x) }")
    x = np.array([0.5, 1.5, 2.0, -2.7, 3.9, 0.1], np.float32)
    compare(m, {"x": x, "e": np.array([2, 0.5, 3, 2, 1, 0], np.float32),
                "c": np.array([1, 0, 1, 0, 1, 0], bool)}, rtol=1e-5)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu(on_device, approximate):
    m = _model(f'g (float[64] x) => (float[64] y) {{ y = Gelu<approximate="{approximate}">(x) }}',
               opset=20)
    compare(m, {"x": np.linspace(-6, 6, 64, dtype=np.float32)}, atol=2e-6)


@pytest.mark.parametrize("activation", ["LeakyRelu", "HardSigmoid", "HardSwish", "Elu"])
def test_activations(on_device, activation):
    m = _model(f"g (float[3,8] x) => (float[3,8] y) {{ y = {activation}(x) }}", opset=14)
    compare(m, {"x": f32(3, 8) * 4})


@pytest.mark.parametrize("axis", [-1, 1, 0])
def test_softmax_logsoftmax(on_device, axis):
    m = _model(f"g (float[3,4,5] x) => (float[3,4,5] y, float[3,4,5] z) "
               f"{{ y = Softmax<axis={axis}>(x) z = LogSoftmax<axis={axis}>(x) }}", opset=13)
    compare(m, {"x": f32(3, 4, 5)})


def test_softmax_opset11_flattens(on_device):
    m = _model("g (float[3,4,5] x) => (float[3,4,5] y) { y = Softmax<axis=1>(x) }", opset=11)
    compare(m, {"x": f32(3, 4, 5)})


@pytest.mark.parametrize("shapes", [((4, 5), (5, 3)), ((2, 4, 5), (5, 3)), ((2, 4, 5), (2, 5, 3)),
                                    ((5,), (5, 3)), ((2, 1, 4, 5), (3, 5, 2))])
def test_matmul(on_device, shapes):
    a, b = shapes
    out = np.matmul(np.zeros(a), np.zeros(b)).shape
    sa, sb, so = (",".join(map(str, s)) for s in (a, b, out))
    m = _model(f"g (float[{sa}] a, float[{sb}] b) => (float[{so}] y) {{ y = MatMul(a, b) }}")
    compare(m, {"a": f32(*a), "b": f32(*b)}, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("attrs", ["", "<transA=1>", "<transB=1, alpha=0.5, beta=2.0>"])
def test_gemm(on_device, attrs):
    ta, tb = "transA=1" in attrs, "transB=1" in attrs
    sa = "5,4" if ta else "4,5"
    sb = "3,5" if tb else "5,3"
    m = _model(f"g (float[{sa}] a, float[{sb}] b, float[3] c) => (float[4,3] y) "
               f"{{ y = Gemm{attrs}(a, b, c) }}")
    compare(m, {"a": f32(*map(int, sa.split(","))), "b": f32(*map(int, sb.split(","))),
                "c": f32(3)}, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin",
                                "ReduceProd", "ReduceL2", "ReduceSumSquare"])
@pytest.mark.parametrize("keepdims", [0, 1])
def test_reductions_with_axes_input(on_device, op, keepdims):
    out = "2,1,4" if keepdims else "2,4"
    m = _model(f"g (float[2,3,4] x) => (float[{out}] y) {{ axes = Constant<value=int64[1] {{1}}>() "
               f"y = {op}<keepdims={keepdims}>(x, axes) }}", opset=18)
    compare(m, {"x": f32(2, 3, 4)}, rtol=1e-5)


def test_reduce_attribute_axes_and_argmax(on_device):
    m = _model("g (float[2,3,4] x) => (float[2,4] y, int64[2,1,4] i, int64[2,3] j) "
               "{ y = ReduceMean<axes=[1], keepdims=0>(x) i = ArgMax<axis=1>(x) "
               "j = ArgMin<axis=-1, keepdims=0, select_last_index=1>(x) }", opset=13)
    compare(m, {"x": f32(2, 3, 4)})


@pytest.mark.parametrize("kernel,pads,strides,group,dil", [
    (3, [1, 1, 1, 1], [1, 1], 1, [1, 1]),
    (3, [0, 0, 0, 0], [2, 2], 1, [1, 1]),
    (1, [0, 0, 0, 0], [1, 1], 1, [1, 1]),
    (3, [1, 1, 1, 1], [1, 1], 4, [1, 1]),
    (3, [2, 1, 0, 2], [1, 2], 2, [2, 1]),
])
def test_conv(on_device, kernel, pads, strides, group, dil):
    C, M = 4, 8
    m = _model(f"g (float[2,{C},9,8] x, float[{M},{C // group},{kernel},{kernel}] w, float[{M}] b)"
               f" => (float[n,m,h,w] y) {{ y = Conv<pads={pads}, strides={strides}, group={group}, "
               f"dilations={dil}>(x, w, b) }}")
    compare(m, {"x": f32(2, C, 9, 8), "w": f32(M, C // group, kernel, kernel), "b": f32(M)},
            rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("auto_pad", ["SAME_UPPER", "SAME_LOWER", "VALID"])
def test_conv_auto_pad_1d(on_device, auto_pad):
    m = _model(f'g (float[1,2,10] x, float[3,2,4] w) => (float[n,m,l] y) '
               f'{{ y = Conv<auto_pad="{auto_pad}", strides=[3]>(x, w) }}')
    compare(m, {"x": f32(1, 2, 10), "w": f32(3, 2, 4)}, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("attrs", [
    "kernel_shape=[3,3]", "kernel_shape=[3,3], strides=[2,2], pads=[1,1,1,1]",
    "kernel_shape=[3,3], strides=[2,2], ceil_mode=1",
    "kernel_shape=[2,2], dilations=[2,2]",
])
def test_maxpool(on_device, attrs):
    m = _model(f"g (float[2,3,9,9] x) => (float[n,c,h,w] y) {{ y = MaxPool<{attrs}>(x) }}",
               opset=12)
    compare(m, {"x": f32(2, 3, 9, 9)})


@pytest.mark.parametrize("attrs", [
    "kernel_shape=[3,3]", "kernel_shape=[3,3], strides=[2,2], pads=[1,1,1,1]",
    "kernel_shape=[3,3], strides=[2,2], pads=[1,1,1,1], count_include_pad=1",
    "kernel_shape=[3,3], strides=[2,2], ceil_mode=1",
])
def test_averagepool(on_device, attrs):
    m = _model(f"g (float[2,3,9,9] x) => (float[n,c,h,w] y) {{ y = AveragePool<{attrs}>(x) }}",
               opset=11)
    compare(m, {"x": f32(2, 3, 9, 9)})


def test_global_pools_batchnorm_lrn(on_device):
    m = _model("g (float[2,4,5,5] x, float[4] s, float[4] b, float[4] mu, float[4] var) => "
               "(float[2,4,1,1] a, float[2,4,1,1] m, float[2,4,5,5] n, float[2,4,5,5] l) "
               "{ a = GlobalAveragePool(x) m = GlobalMaxPool(x) "
               "n = BatchNormalization(x, s, b, mu, var) l = LRN<size=3>(x) }", opset=15)
    compare(m, {"x": f32(2, 4, 5, 5), "s": f32(4), "b": f32(4), "mu": f32(4),
                "var": np.abs(f32(4)) + 0.5}, rtol=1e-4, atol=1e-5)


def test_layer_norms(on_device):
    m = _model("g (float[2,3,8] x, float[8] s, float[8] b) => (float[2,3,8] y, float[2,3,8] r, "
               "float[2,3,8] i) { y = LayerNormalization<axis=-1>(x, s, b) "
               "r = RMSNormalization<axis=-1>(x, s) "
               "i = InstanceNormalization(x, sc, bc) sc = Constant<value=float[3] {1,2,3}>() "
               "bc = Constant<value=float[3] {0,1,0}>() }", opset=23)
    compare(m, {"x": f32(2, 3, 8), "s": f32(8), "b": f32(8)}, rtol=1e-4, atol=1e-5)


def test_shape_ops(on_device):
    m = _model("g (float[2,3,4] x, float[2,3,4] z) => (float[4,6] r, float[3,2,4] t, "
               "float[2,1,3,4] u, float[2,6,4] c, float[2,1,4] s1, float[2,2,4] s2, "
               "float[2,1,2] sl, float[3,2,4] gat, float[2,3,4] e, float[2,4,6] fl) {"
               "shape = Constant<value=int64[2] {4,6}>() r = Reshape(x, shape) "
               "t = Transpose<perm=[1,0,2]>(x) a1 = Constant<value=int64[1] {1}>() "
               "u = Unsqueeze(x, a1) c = Concat<axis=1>(x, z) "
               "sizes = Constant<value=int64[2] {1,2}>() s1, s2 = Split<axis=1>(x, sizes) "
               "st = Constant<value=int64[2] {0,-1}>() en = Constant<value=int64[2] {2,-5}>() "
               "ax = Constant<value=int64[2] {1,2}>() sp = Constant<value=int64[2] {2,-2}>() "
               "sl = Slice(x, st, en, ax, sp) idx = Constant<value=int64[3] {1,-1,0}>() "
               "gat = Gather<axis=0>(xt, idx) xt = Transpose<perm=[1,0,2]>(x) "
               "one = Constant<value=int64[1] {1}>() e = Expand(x, one) "
               "xx = Concat<axis=2>(x, x) fl = Reshape(xx, fs) "
               "fs = Constant<value=int64[3] {2,4,-1}>() }", opset=18)
    compare(m, {"x": f32(2, 3, 4), "z": f32(2, 3, 4)})


def test_pad_tile_constant_of_shape(on_device):
    m = _model("g (float[2,3] x) => (float[3,7] p, float[4,9] t, float[2,3] z) {"
               "pads = Constant<value=int64[4] {1,2,0,2}>() v = Constant<value=float {1.5}>() "
               "p = Pad(x, pads, v) reps = Constant<value=int64[2] {2,3}>() t = Tile(x, reps) "
               "s = Shape(x) c = ConstantOfShape<value=float[1] {2}>(s) z = Add(x, c) }",
               opset=18)
    compare(m, {"x": f32(2, 3)}, on_cpu=1)


def test_gather_with_device_indices(on_device):
    m = _model("g (float[10,4] table, int64[2,3] ids) => (float[2,3,4] y) "
               "{ y = Gather(table, ids) }")
    compare(m, {"table": f32(10, 4), "ids": np.array([[1, 9, -1], [0, 2, 2]])})


# -- com.microsoft operators the optimizer writes --------------------------------------------------

MS = ', "com.microsoft" : 1'


def _ms(body: str) -> onnx.ModelProto:
    return _model(body, opset=17, domains=MS)


def test_ms_gelu_family(on_device):
    m = _ms("g (float[2,8] x, float[8] b) => (float[2,8] g, float[2,8] bg, float[2,8] fg, "
            "float[2,8] q) { g = com.microsoft.Gelu(x) bg = com.microsoft.BiasGelu(x, b) "
            "fg = com.microsoft.FastGelu(x, b) q = com.microsoft.QuickGelu<alpha=1.5>(x) }")
    compare(m, {"x": f32(2, 8) * 3, "b": f32(8)}, atol=2e-6)


def test_fused_conv_gemm_matmul(on_device):
    m = _ms('g (float[1,4,6,6] x, float[4,4,3,3] w, float[4] b, float[5,4] a, float[3,4] c, '
            'float[4,3,5] p, float[3,6,5] q) => (float[1,4,6,6] y, float[5,3] z, '
            'float[3,4,6] m) { y = com.microsoft.FusedConv<activation="Relu", '
            'pads=[1,1,1,1]>(x, w, b) z = com.microsoft.FusedGemm<activation="LeakyRelu", '
            'activation_alpha=0.2, transB=1>(a, c) '
            'm = com.microsoft.FusedMatMul<transB=1, transBatchA=1, alpha=0.5>(p, q) }')
    compare(m, {"x": f32(1, 4, 6, 6), "w": f32(4, 4, 3, 3), "b": f32(4), "a": f32(5, 4),
                "c": f32(3, 4), "p": f32(4, 3, 5), "q": f32(3, 6, 5)}, rtol=1e-4, atol=1e-5)


def test_layout_level_gelu_fusions_stay_on_the_device(on_device):
    """What the CPU's layout level writes for a GEMM's GELU epilogue (ai.onnxrun MatMulBiasGelu,
    FusedGemm "Gelu" / "FastGelu") runs on the device too, as the product then the GELU."""
    m = _model('g (float[2,3,8] x, float[8,6] w, float[6] b, float[5,8] a, float[8,4] c) => '
               '(float[2,3,6] y, float[2,3,6] t, float[5,4] z, float[5,4] f) { '
               'y = ai.onnxrun.MatMulBiasGelu(x, w, b) '
               't = ai.onnxrun.MatMulBiasGelu<approximate="tanh">(x, w) '
               'z = com.microsoft.FusedGemm<activation="Gelu">(a, c) '
               'f = com.microsoft.FusedGemm<activation="FastGelu">(a, c) }', opset=17,
               domains=MS + ', "ai.onnxrun" : 1')
    compare(m, {"x": f32(2, 3, 8), "w": f32(8, 6), "b": f32(6), "a": f32(5, 8),
                "c": f32(8, 4)}, rtol=1e-4, atol=1e-5)


def test_layout_level_batch_norm_relu_stays_on_the_device(on_device):
    """The CPU's layout level's ai.onnxrun FusedBatchNormalization (a BatchNormalization, then
    Relu) runs on the device too."""
    m = _model('g (float[2,5,4,3] x, float[5] s, float[5] b, float[5] m, float[5] v) => '
               '(float[2,5,4,3] y) { y = ai.onnxrun.FusedBatchNormalization<activation="Relu">'
               '(x, s, b, m, v) }', opset=15, domains=', "ai.onnxrun" : 1')
    compare(m, {"x": f32(2, 5, 4, 3), "s": f32(5), "b": f32(5), "m": f32(5),
                "v": np.abs(f32(5)) + 0.5}, rtol=1e-5, atol=1e-6)


def test_skip_layer_normalization(on_device):
    m = _ms("g (float[2,3,8] x, float[2,3,8] s, float[8] g, float[8] b, float[8] bias) => "
            "(float[2,3,8] y, float[2,3,8] r) { y, m, v, sum = com.microsoft.SkipLayerNormalization"
            "<epsilon=1e-5>(x, s, g, b, bias) r = com.microsoft.SkipSimplifiedLayerNormalization"
            "<epsilon=1e-5>(x, s, g) }")
    compare(m, {"x": f32(2, 3, 8), "s": f32(2, 3, 8), "g": f32(8), "b": f32(8),
                "bias": f32(8)}, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("unidirectional", [0, 1])
@pytest.mark.parametrize("masked", [False, True])
def test_ms_attention(on_device, unidirectional, masked):
    mask_in = ", int32[2,5] mask" if masked else ""
    mask_arg = ", mask" if masked else ""
    m = _ms(f"g (float[2,5,8] x, float[8,24] w, float[24] b{mask_in}) => (float[2,5,8] y) "
            f"{{ y = com.microsoft.Attention<num_heads=2, unidirectional={unidirectional}>"
            f"(x, w, b{mask_arg}) }}")
    feeds = {"x": f32(2, 5, 8), "w": f32(8, 24) * 0.5, "b": f32(24)}
    if masked:
        feeds["mask"] = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], np.int32)
    compare(m, feeds, rtol=1e-4, atol=1e-5)


def test_attention_with_past_stays_on_cpu(on_device):
    m = _ms("g (float[2,1,8] x, float[8,24] w, float[24] b, float[2,2,2,3,4] past) => "
            "(float[2,1,8] y, float[2,2,2,4,4] present) "
            "{ y, present = com.microsoft.Attention<num_heads=2>(x, w, b, , past) }")
    compare(m, {"x": f32(2, 1, 8), "w": f32(8, 24), "b": f32(24), "past": f32(2, 2, 2, 3, 4)},
            rtol=1e-4, atol=1e-5, on_cpu=1)


@pytest.mark.parametrize("zp_type", ["uint8", "int8"])
def test_quantize_dequantize_per_tensor_and_per_axis(on_device, zp_type):
    zp = "128" if zp_type == "uint8" else "-3"
    m = _model(f"g (float[2,3,4] x, float[3] s) => (float[2,3,4] y, {zp_type}[2,3,4] q, "
               f"float[2,3,4] w) {{ sc = Constant<value=float {{0.05}}>() "
               f"z = Constant<value={zp_type} {{{zp}}}>() q = QuantizeLinear(x, sc, z) "
               f"y = DequantizeLinear(q, sc, z) zs = Constant<value={zp_type}[3] {{1, 2, 3}}>() "
               f"qa = QuantizeLinear<axis=1>(x, s, zs) w = DequantizeLinear<axis=1>(qa, s, zs) }}",
               opset=13)
    x = f32(2, 3, 4) * 4
    x[0, 0, 0] = np.nan
    x[0, 0, 1] = 0.025  # a tie: half to even
    opts = onnxrun.SessionOptions()  # keep the QDQ pairs (the optimizer would fuse them)
    opts.graph_optimization_level = onnxrun.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess, _ = compare(m, {"x": x, "s": np.array([0.02, 0.1, 0.5], np.float32)}, options=opts,
                      on_cpu=3)  # the three Constant nodes
    assert sess.get_optimization_report().placement.nodes["CUDAExecutionProvider"] == 4
