"""CNN, linear-algebra, normalization and resize kernels, each checked on a one-node model
against onnxruntime (or, where onnxruntime has no kernel, the ONNX reference evaluator)."""

from __future__ import annotations

import itertools

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from one_node_harness import one_node
from onnx import numpy_helper
from onnx.reference import ReferenceEvaluator

import onnxrun

RNG = np.random.default_rng(7)


# -- harness ----------------------------------------------------------------------------------


def rand(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


def run_ort(model: bytes, feeds):
    so = ort.SessionOptions()
    so.log_severity_level = 3
    return ort.InferenceSession(model, so, providers=["CPUExecutionProvider"]).run(None, feeds)


def run_ref(model: bytes, feeds):
    return ReferenceEvaluator(onnx.load_from_string(model)).run(None, feeds)


def run_ours(model: bytes, feeds):
    return onnxrun.InferenceSession(model).run(None, feeds)


def check(op, inputs, *, opset=19, n_out=1, const=(), rtol=1e-4, atol=1e-5, oracle=run_ort,
          **attrs):
    model, feeds = one_node(op, inputs, opset=opset, n_out=n_out, const=const, **attrs)
    expected = oracle(model, feeds)
    got = run_ours(model, feeds)
    assert len(got) == len(expected)
    for g, e in zip(got, expected, strict=True):
        assert g.dtype == e.dtype, (g.dtype, e.dtype)
        assert g.shape == e.shape, (g.shape, e.shape)
        if e.dtype == bool or e.dtype.kind in "iu":
            np.testing.assert_allclose(g.astype(np.float64), e.astype(np.float64), atol=atol)
        else:
            np.testing.assert_allclose(g.astype(np.float64), e.astype(np.float64), rtol=rtol,
                                       atol=atol)
    return got


# -- Conv ---------------------------------------------------------------------------------------

CONV_ATTRS = [
    {},
    {"pads": [1, 1, 1, 1]},
    {"strides": [2, 2]},
    {"strides": [2, 3], "pads": [0, 1, 2, 1]},
    {"dilations": [2, 1], "pads": [2, 0, 1, 3]},
    {"auto_pad": "SAME_UPPER", "strides": [2, 3]},
    {"auto_pad": "SAME_LOWER", "strides": [2, 3]},
    {"auto_pad": "SAME_UPPER"},
    {"auto_pad": "VALID", "strides": [2, 2]},
]
CONV_WEIGHTS = {  # name: (W shape, group) for X (2, 4, 9, 10)
    "dense": ((6, 4, 3, 3), 1),
    "grouped": ((6, 2, 3, 3), 2),
    "depthwise": ((4, 1, 3, 3), 4),
    "depthwise_x2": ((8, 1, 3, 3), 4),
    "pointwise": ((6, 4, 1, 1), 1),
    "rect": ((5, 4, 2, 4), 1),
}


@pytest.mark.parametrize("weights", list(CONV_WEIGHTS))
@pytest.mark.parametrize("attrs", CONV_ATTRS, ids=lambda a: "-".join(
    f"{k}={v}" for k, v in a.items()) or "default")
@pytest.mark.parametrize("const", [(), (1, 2)], ids=["dynamic", "const"])
def test_conv_2d(weights, attrs, const):
    wshape, group = CONV_WEIGHTS[weights]
    X, W, B = rand(2, 4, 9, 10), rand(*wshape), rand(wshape[0])
    check("Conv", [X, W, B], const=const, group=group, **attrs)


@pytest.mark.parametrize("xshape,wshape,group", [
    ((2, 3, 11), (4, 3, 3), 1),
    ((1, 4, 12), (4, 1, 5), 4),
    ((1, 2, 5, 6, 7), (4, 2, 2, 3, 2), 1),
    ((1, 4, 5, 6, 7), (4, 1, 3, 3, 3), 4),
    ((1, 4, 5, 6, 7), (6, 2, 1, 1, 1), 2),
])
@pytest.mark.parametrize("attrs", ["default", "pads_strides", "dilations", "same_upper"])
def test_conv_1d_3d(xshape, wshape, group, attrs):
    nd = len(xshape) - 2
    attrs = {
        "default": {},
        "pads_strides": {"pads": [1] * 2 * nd, "strides": [2] * nd},
        "dilations": {"dilations": [2] * nd},
        "same_upper": {"auto_pad": "SAME_UPPER", "strides": [2] * nd},
    }[attrs]
    check("Conv", [rand(*xshape), rand(*wshape)], group=group, **attrs)


@pytest.mark.parametrize("auto_pad", ["SAME_UPPER", "SAME_LOWER"])
@pytest.mark.parametrize("strides", [[1, 1], [2, 3]])
def test_conv_same_with_dilation(auto_pad, strides):
    # onnxruntime refuses SAME padding with dilations; the reference evaluator follows the spec
    check("Conv", [rand(1, 4, 9, 10), rand(6, 4, 3, 3)], oracle=run_ref, auto_pad=auto_pad,
          strides=strides, dilations=[2, 2])


def test_conv_float16_and_no_bias():
    X, W, B = rand(1, 4, 9, 10, dtype=np.float16), rand(6, 4, 3, 3, dtype=np.float16), None
    check("Conv", [X, W, B], pads=[1, 1, 1, 1], rtol=1e-2, atol=1e-2)
    check("Conv", [X, W], const=(1,), strides=[2, 2], rtol=1e-2, atol=1e-2)


def test_conv_float64_matches_reference():
    X, W, B = rand(1, 3, 8, 8, dtype=np.float64), rand(4, 3, 3, 3, dtype=np.float64), \
        rand(4, dtype=np.float64)
    check("Conv", [X, W, B], oracle=run_ref, pads=[1, 1, 1, 1], rtol=1e-10, atol=1e-10)


def test_conv_banded_im2col(monkeypatch):
    # force the band-by-band im2col/GEMM path on a small image
    from onnxrun.providers.cpu.ops import conv

    monkeypatch.setattr(conv, "_TILE", 200)
    for group, wshape in [(1, (6, 4, 3, 3)), (2, (6, 2, 3, 3))]:
        check("Conv", [rand(2, 4, 9, 10), rand(*wshape), rand(6)], group=group, pads=[1, 1, 1, 1],
              strides=[2, 1])
    check("Conv", [rand(1, 2, 5, 6, 7), rand(3, 2, 3, 3, 3)], pads=[1] * 6)


def test_conv_weight_prepared_once():
    """A constant weight is re-arranged at session creation and reused on every run."""
    X1, X2, W = rand(1, 4, 6, 6), rand(1, 4, 6, 6), rand(6, 4, 3, 3)
    model, _ = one_node("Conv", [X1, W], opset=13, const=(1,))
    sess = onnxrun.InferenceSession(model)
    for X in (X1, X2, X1):
        (got,) = sess.run(None, {"in0": X})
        (ref,) = run_ort(model, {"in0": X})
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)


# -- ConvTranspose --------------------------------------------------------------------------------


CT_CASES = [  # (X shape, W shape, group)
    ((1, 3, 5, 6), (3, 2, 3, 3), 1),
    ((2, 4, 4, 5), (4, 3, 3, 2), 2),
    ((1, 2, 7), (2, 3, 4), 1),
    ((1, 2, 3, 4, 3), (2, 2, 2, 3, 2), 1),
    ((1, 4, 5, 5), (4, 1, 3, 3), 4),
]


def _ct_attrs(name, xshape, wshape):
    nd = len(xshape) - 2
    sp = xshape[2:]
    return {
        "default": {},
        "strides": {"strides": [2] * nd},
        "output_padding": {"strides": [3] * nd, "output_padding": [1] * nd},
        "pads": {"pads": [1] * nd + [2] * nd, "strides": [2] * nd},
        "dilations": {"dilations": [2] * nd, "strides": [2] * nd},
        "output_shape": {"output_shape": [s * 2 + 1 for s in sp], "strides": [2] * nd},
        "output_shape_upper": {"output_shape": [s * 2 + 1 for s in sp], "strides": [2] * nd,
                               "auto_pad": "SAME_UPPER"},
        # one more than the stride-2 output: ends in a zero-padded row (less than a stride)
        "output_shape_larger": {"output_shape": [(s - 1) * 2 + k + 1
                                                 for s, k in zip(sp, wshape[2:], strict=True)],
                                "strides": [2] * nd},
        "same_upper": {"auto_pad": "SAME_UPPER", "strides": [2] * nd},
        "same_lower": {"auto_pad": "SAME_LOWER", "strides": [2] * nd},
        "valid": {"auto_pad": "VALID", "strides": [2] * nd},
    }[name]


@pytest.mark.parametrize("case", range(len(CT_CASES)))
@pytest.mark.parametrize("attrs", ["default", "strides", "output_padding", "pads", "dilations",
                                   "output_shape", "output_shape_upper", "output_shape_larger",
                                   "same_upper", "same_lower", "valid"])
def test_conv_transpose(case, attrs):
    xshape, wshape, group = CT_CASES[case]
    attrs = _ct_attrs(attrs, xshape, wshape)
    X, W, B = rand(*xshape), rand(*wshape), rand(wshape[1] * group)
    check("ConvTranspose", [X, W, B], const=(1, 2) if case % 2 else (), group=group, **attrs)


TILED_CASES = [  # (X shape, W shape, strides = kernel): each input pixel its own output block
    ((1, 24, 10, 12), (24, 24, 2, 2)),  # a DBNet-style head's 2x2 stride-2 upsampling
    ((2, 5, 4, 3), (5, 3, 3, 2)),  # a batch, a non-square kernel, few channels
    ((1, 6, 7, 5), (6, 1, 2, 2)),  # one output channel (NCHW and channels-last alike)
]


@pytest.mark.parametrize("case", range(len(TILED_CASES)))
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("const", [True, False])
def test_conv_transpose_tiled(case, bias, const):
    """strides equal to the kernel, no padding (ConvTranspose's tiled path, a stack of
    products written in place, for a constant W): onnxruntime's results, and the GEMM +
    col2im path's within rounding, for a constant bias or a bias input."""
    from onnxrun.providers.cpu.ops import conv as conv_mod

    rng = np.random.default_rng(case)  # (the module's RNG left to the tests after these)
    xshape, wshape = TILED_CASES[case]
    inputs = [rng.standard_normal(s).astype(np.float32) for s in
              (xshape, wshape, (wshape[1],))[:3 if bias else 2]]
    kernel = list(wshape[2:])
    got = check("ConvTranspose", inputs, const=((1, 2) if bias else (1,)) if const else (),
                strides=kernel, kernel_shape=kernel)
    model, feeds = one_node("ConvTranspose", inputs, opset=19,
                            const=((1, 2) if bias else (1,)) if const else (),
                            strides=kernel, kernel_shape=kernel)
    sess = onnxrun.InferenceSession(model)
    kernels = [s.kernel for s in sess._program.steps
               if isinstance(s.kernel, conv_mod.ConvTranspose)]
    assert len(kernels) == 1 and (kernels[0].tiles is not None) == const
    kernels[0].tiles = None  # the general path
    np.testing.assert_allclose(sess.run(None, feeds)[0], got[0], rtol=1e-5, atol=1e-5)


def test_only_non_overlapping_transposes_are_tiled():
    """A 2x2 stride-2 ConvTranspose takes the tiled path; padding, output padding, dilation,
    groups or an output shape each send it to the general one (and it still matches
    onnxruntime there)."""
    from onnxrun.providers.cpu.ops import conv as conv_mod

    rng = np.random.default_rng(3)  # (the module's RNG left to the tests after these)

    def tiled(attrs, w_shape=(4, 2, 2, 2)):
        inputs = [rng.standard_normal(s).astype(np.float32) for s in ((1, 4, 4, 4), w_shape)]
        check("ConvTranspose", inputs, const=(1,), **attrs)
        model, _ = one_node("ConvTranspose", inputs, opset=19, const=(1,), **attrs)
        steps = onnxrun.InferenceSession(model)._program.steps
        return any(isinstance(s.kernel, conv_mod.ConvTranspose) and s.kernel.tiles is not None
                   for s in steps)

    assert tiled({"strides": [2, 2]})
    for attrs in ({"strides": [2, 2], "pads": [1, 0, 0, 0]},
                  {"strides": [2, 2], "output_padding": [1, 1]},
                  {"strides": [2, 2], "dilations": [2, 2]},
                  {"strides": [2, 2], "output_shape": [9, 9]}, {"strides": [1, 1]}):
        assert not tiled(attrs), attrs
    assert not tiled({"strides": [2, 2], "group": 2}, (4, 1, 2, 2))


def test_conv_transpose_inconsistent_output_shape_fails():
    model, feeds = one_node("ConvTranspose", [rand(1, 1, 5), rand(1, 1, 3)], opset=13,
                            strides=[2], output_shape=[14])
    with pytest.raises(Exception, match="output size"):
        run_ours(model, feeds)


# -- pooling --------------------------------------------------------------------------------------

POOL_ATTRS = [
    ("k3", {"kernel_shape": 3}),
    ("k2s2", {"kernel_shape": 2, "strides": 2}),
    ("pads", {"kernel_shape": 3, "strides": 2, "pads": 1}),
    ("end_pads", {"kernel_shape": 3, "strides": 2, "pads": (0, 2)}),
    ("ceil", {"kernel_shape": 3, "strides": 2, "ceil_mode": 1}),
    ("ceil_pads", {"kernel_shape": 3, "strides": 2, "ceil_mode": 1, "pads": 1}),
    ("ceil_s3", {"kernel_shape": 2, "strides": 3, "ceil_mode": 1}),
    ("same_upper", {"kernel_shape": 3, "strides": 2, "auto_pad": "SAME_UPPER"}),
    ("same_lower", {"kernel_shape": 4, "strides": 2, "auto_pad": "SAME_LOWER"}),
    ("valid", {"kernel_shape": 3, "strides": 2, "auto_pad": "VALID"}),
    ("dilated", {"kernel_shape": 2, "dilations": 2}),
    ("dilated_ceil", {"kernel_shape": 2, "dilations": 2, "strides": 2, "pads": 1,
                      "ceil_mode": 1}),
    ("dilated_same", {"kernel_shape": 3, "dilations": 2, "auto_pad": "SAME_UPPER"}),
]
POOL_INPUTS = {"1d": (2, 3, 11), "2d": (2, 3, 9, 10), "3d": (1, 2, 6, 7, 5)}


def _pool_attrs(attrs, nd):
    out = {}
    for k, v in attrs.items():
        if k == "pads":
            out[k] = [v] * 2 * nd if isinstance(v, int) else [v[0]] * nd + [v[1]] * nd
        elif isinstance(v, int) and k in ("kernel_shape", "strides", "dilations"):
            out[k] = [v] * nd
        else:
            out[k] = v
    return out


@pytest.mark.parametrize("rank", list(POOL_INPUTS))
@pytest.mark.parametrize("name,attrs", POOL_ATTRS, ids=[n for n, _ in POOL_ATTRS])
@pytest.mark.parametrize("op,extra,n_out", [
    ("MaxPool", {}, 1),
    ("MaxPool", {}, 2),
    ("MaxPool", {"storage_order": 1}, 2),
    ("AveragePool", {}, 1),
    ("AveragePool", {"count_include_pad": 1}, 1),
    ("LpPool", {}, 1),
    ("LpPool", {"p": 3}, 1),
], ids=["max", "max_indices", "max_indices_colmajor", "avg", "avg_include_pad", "lp2", "lp3"])
def test_pool(rank, name, attrs, op, extra, n_out):
    X = rand(*POOL_INPUTS[rank])
    nd = X.ndim - 2
    opset = {"MaxPool": 12, "AveragePool": 19, "LpPool": 18}[op]
    check(op, [X], opset=opset, n_out=n_out, **_pool_attrs(attrs, nd), **extra)


@pytest.mark.parametrize("op,opset", [("MaxPool", 8), ("AveragePool", 7), ("AveragePool", 11),
                                      ("LpPool", 2), ("MaxPool", 1)])
def test_pool_older_opsets(op, opset):
    X = rand(2, 3, 9, 10)
    n_out = 2 if op == "MaxPool" and opset >= 8 else 1
    check(op, [X], opset=opset, n_out=n_out, kernel_shape=[3, 3], strides=[2, 2],
          pads=[1, 0, 1, 2])


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.float16, np.float64])
def test_maxpool_types(dtype):
    X = (RNG.integers(-100, 100, (1, 2, 7, 7)) if dtype == np.int8 else
         RNG.integers(0, 200, (1, 2, 7, 7)) if dtype == np.uint8 else
         RNG.standard_normal((1, 2, 7, 7))).astype(dtype)
    check("MaxPool", [X], opset=12, kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2])


def test_average_pool_float16():
    X = rand(1, 2, 7, 7, dtype=np.float16)
    check("AveragePool", [X], opset=19, kernel_shape=[3, 3], pads=[1, 1, 1, 1],
          rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("shape", [(2, 3, 11), (2, 3, 9, 10), (1, 2, 6, 7, 5)])
@pytest.mark.parametrize("op,attrs", [("GlobalAveragePool", {}), ("GlobalMaxPool", {}),
                                      ("GlobalLpPool", {}), ("GlobalLpPool", {"p": 3})])
def test_global_pool(shape, op, attrs):
    check(op, [rand(*shape)], opset=13, **attrs)


@pytest.mark.parametrize("shape", [(2, 112, 112, 32), (1, 56, 56, 144), (1, 7, 7, 1152),
                                   (3, 5, 7, 2), (1, 1, 1, 3)])
def test_global_average_pool_of_channels_last_memory(shape):
    """An SE block's GlobalAveragePool reads a channels-last activation (the layout level):
    its column sums, rows taken several at a time, match onnxruntime's, and channels holding
    the same values get the same mean."""
    from onnxrun.providers.cpu.ops.pool import GlobalAveragePool

    x = rand(*shape)
    x[..., 1] = x[..., 0]
    got = GlobalAveragePool(x.transpose(0, 3, 1, 2))
    want = run_ort(*one_node("GlobalAveragePool",
                             [np.ascontiguousarray(x.transpose(0, 3, 1, 2))], opset=13))[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    if shape[3] > 1:
        np.testing.assert_array_equal(got[:, 0], got[:, 1])


# -- normalization --------------------------------------------------------------------------------


def _bn_inputs(shape=(2, 3, 5, 6), dtype=np.float32):
    C = shape[1]
    var = (RNG.random(C) + 0.5).astype(dtype)
    return [rand(*shape, dtype=dtype), rand(C, dtype=dtype), rand(C, dtype=dtype),
            rand(C, dtype=dtype), var]


@pytest.mark.parametrize("opset", [7, 9, 14, 15])
@pytest.mark.parametrize("const", [(), (1, 2, 3, 4)], ids=["dynamic", "const"])
@pytest.mark.parametrize("shape", [(2, 3, 5, 6), (4, 3), (2, 3, 4, 5, 2)])
def test_batch_norm_inference(opset, const, shape):
    check("BatchNormalization", _bn_inputs(shape), opset=opset, const=const, epsilon=1e-3)


@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-7), (np.float16, 1e-2)])
def test_batch_norm_types(dtype, tol):
    check("BatchNormalization", _bn_inputs(dtype=dtype), opset=15, rtol=tol, atol=tol)


def test_batch_norm_training():
    check("BatchNormalization", _bn_inputs(), opset=15, n_out=3, training_mode=1,
          momentum=0.8)
    # before opset 14 extra outputs mean training: Y, running mean/var, saved mean/inv-std
    check("BatchNormalization", _bn_inputs(), opset=9, n_out=5)


@pytest.mark.parametrize("shape", [(2, 3, 5, 6), (2, 3, 7), (1, 3, 2, 3, 4)])
def test_instance_norm(shape):
    C = shape[1]
    check("InstanceNormalization", [rand(*shape), rand(C), rand(C)], opset=6, epsilon=1e-3)


def test_instance_norm_float16():
    X, s, b = rand(2, 3, 5, 6, dtype=np.float16), rand(3, dtype=np.float16), \
        rand(3, dtype=np.float16)
    check("InstanceNormalization", [X, s, b], opset=6, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("size", [1, 3, 5, 7])
def test_lrn(size):
    check("LRN", [rand(2, 7, 5, 6)], opset=13, size=size, alpha=1e-2, beta=0.75, bias=2.0)


def test_lrn_even_size():
    # onnxruntime accepts odd sizes only (and the reference evaluator's LRN loops over the batch
    # instead of the channels): check the spec's window [c - 1, c + 2] with numpy
    X = rand(2, 6, 4, 5)
    model, feeds = one_node("LRN", [X], opset=13, size=4, alpha=0.01, beta=0.75, bias=2.0)
    (got,) = run_ours(model, feeds)
    sq = X.astype(np.float64) ** 2
    window = np.stack([sq[:, max(0, c - 1):c + 3].sum(axis=1) for c in range(6)], axis=1)
    np.testing.assert_allclose(got, X / (2.0 + 0.01 / 4 * window) ** 0.75, rtol=1e-5)


@pytest.mark.parametrize("axis", [-1, -2, 1, 0])
@pytest.mark.parametrize("with_bias", [True, False])
def test_layer_norm(axis, with_bias):
    X = rand(2, 3, 4, 5)
    shape = X.shape[axis:]
    inputs = [X, rand(*shape)] + ([rand(*shape)] if with_bias else [])
    check("LayerNormalization", inputs, opset=17, n_out=3, axis=axis, epsilon=1e-3)
    check("LayerNormalization", inputs, opset=17, axis=axis)


@pytest.mark.parametrize("dtype,tol", [(np.float16, 1e-2), (np.float64, 1e-6)])
def test_layer_norm_types(dtype, tol):
    X, s, b = rand(2, 3, 4, 5, dtype=dtype), rand(5, dtype=dtype), rand(5, dtype=dtype)
    check("LayerNormalization", [X, s, b], opset=17, n_out=3, rtol=tol, atol=tol)


@pytest.mark.parametrize("groups", [1, 2, 3, 6])
def test_group_norm(groups):
    check("GroupNormalization", [rand(2, 6, 4, 5), rand(6), rand(6)], opset=21,
          num_groups=groups)


@pytest.mark.parametrize("groups", [1, 2, 3])
def test_group_norm_18_per_group_scale(groups):
    # opset 18 (deprecated: the model checker rejects it) takes one scale/bias per group
    from onnxrun.providers.cpu.ops.normalization import GroupNormalization18

    X, scale, bias = rand(2, 6, 4, 5), rand(groups), rand(groups)
    got = GroupNormalization18(X, scale, bias, num_groups=groups, epsilon=1e-5)
    g = X.reshape(2, groups, -1).astype(np.float64)
    norm = ((g - g.mean(-1, keepdims=True)) / np.sqrt(g.var(-1, keepdims=True) + 1e-5))
    norm = norm.reshape(2, groups, 6 // groups, 4, 5)
    ref = norm * scale[None, :, None, None, None] + bias[None, :, None, None, None]
    np.testing.assert_allclose(got, ref.reshape(X.shape), rtol=1e-4, atol=1e-5)
    assert got.dtype == np.float32


@pytest.mark.parametrize("opset", [9, 13])
@pytest.mark.parametrize("axes", [[0, 2, 3], [2, 3], [1]])
def test_mean_variance_normalization(opset, axes):
    check("MeanVarianceNormalization", [rand(2, 3, 5, 6)], opset=opset, axes=axes)


# -- Dropout ----------------------------------------------------------------------------------


@pytest.mark.parametrize("opset", [7, 10, 12, 13, 22])
def test_dropout_inference_is_identity(opset):
    X = rand(2, 3, 4)
    model, feeds = one_node("Dropout", [X], opset=opset, n_out=2)
    out, mask = run_ours(model, feeds)
    np.testing.assert_array_equal(out, X)
    # the mask has the data type before opset 10, bool after; all kept
    assert mask.dtype == (np.float32 if opset < 10 else np.bool_)
    assert mask.shape == X.shape and mask.all()
    check("Dropout", [X], opset=opset)


def test_dropout_ratio_without_training_is_identity():
    X = rand(2, 3, 4)
    check("Dropout", [X, np.array(0.3, np.float32)], opset=13, n_out=2)
    check("Dropout", [X, np.array(0.3, np.float32), np.array(False)], opset=13, n_out=2)


def test_dropout_training_mode():
    X = rand(50, 40)
    model, feeds = one_node("Dropout", [X, np.array(0.3, np.float32), np.array(True)],
                            opset=13, n_out=2)
    out, mask = run_ours(model, feeds)
    assert mask.dtype == np.bool_ and 0.6 < mask.mean() < 0.8
    np.testing.assert_allclose(out, np.where(mask, X / 0.7, 0), rtol=1e-6)
    # a seed attribute gives the node numpy's legacy RandomState(seed) stream (as the ONNX
    # reference draws it), continued across runs
    model, feeds = one_node("Dropout", [X, np.array(0.5, np.float32), np.array(True)],
                            opset=13, n_out=2, seed=3)
    sess = onnxrun.InferenceSession(model)
    stream = np.random.RandomState(3)
    for _ in range(2):
        np.testing.assert_array_equal(sess.run(None, feeds)[1],
                                      stream.uniform(0, 1, X.shape) >= 0.5)


# -- MatMul, Gemm, Einsum -------------------------------------------------------------------------


@pytest.mark.parametrize("a,b", [((3, 4), (4, 5)), ((2, 3, 4), (4, 5)), ((2, 3, 4), (2, 4, 5)),
                                 ((4,), (4, 5)), ((3, 4), (4,)), ((4,), (4,)),
                                 ((2, 1, 3, 4), (5, 4, 6)), ((1, 3, 4), (2, 4, 5))])
@pytest.mark.parametrize("const", [(), (1,)], ids=["dynamic", "const"])
def test_matmul(a, b, const):
    check("MatMul", [rand(*a), rand(*b)], opset=13, const=const)


def test_matmul_non_contiguous_stack():
    # a transposed (non-contiguous) stacked operand takes numpy's general matmul path
    A = np.ascontiguousarray(rand(4, 3, 2).transpose(2, 1, 0))
    check("MatMul", [A, rand(4, 5)], opset=13)


@pytest.mark.parametrize("dtype", [np.float64, np.float16, np.int32, np.int64])
def test_matmul_types(dtype):
    if np.dtype(dtype).kind == "i":
        A, B = RNG.integers(-5, 5, (2, 3, 4)).astype(dtype), RNG.integers(-5, 5, (4, 5))
        B = B.astype(dtype)
    else:
        A, B = rand(2, 3, 4, dtype=dtype), rand(4, 5, dtype=dtype)
    tol = 1e-2 if dtype == np.float16 else 1e-6
    check("MatMul", [A, B], opset=13, rtol=tol, atol=tol)


GEMM_C = {"full": (3, 5), "row": (5,), "row2d": (1, 5), "col": (3, 1), "scalar": ()}


@pytest.mark.parametrize("opset", [7, 9, 11, 13])
@pytest.mark.parametrize("trans", list(itertools.product([0, 1], [0, 1])))
@pytest.mark.parametrize("alpha,beta", [(1.0, 1.0), (0.5, 2.0), (1.0, 0.0)])
@pytest.mark.parametrize("c", list(GEMM_C))
@pytest.mark.parametrize("const", [(), (1, 2)], ids=["dynamic", "const"])
def test_gemm(opset, trans, alpha, beta, c, const):
    tA, tB = trans
    A = rand(4, 3) if tA else rand(3, 4)
    B = rand(5, 4) if tB else rand(4, 5)
    C = np.asarray(rand(*GEMM_C[c])) if GEMM_C[c] else np.array(1.5, np.float32)
    check("Gemm", [A, B, C], opset=opset, const=const, transA=tA, transB=tB, alpha=alpha,
          beta=beta)


@pytest.mark.parametrize("const", [(), (1,)], ids=["dynamic", "const"])
def test_gemm_without_c(const):
    check("Gemm", [rand(3, 4), rand(5, 4)], opset=13, const=const, transB=1, alpha=0.7)


@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-8), (np.float16, 1e-2)])
def test_gemm_types(dtype, tol):
    check("Gemm", [rand(3, 4, dtype=dtype), rand(4, 5, dtype=dtype), rand(5, dtype=dtype)],
          opset=13, alpha=0.3, rtol=tol, atol=tol)


@pytest.mark.parametrize("equation,shapes", [
    ("ij,jk->ik", [(3, 4), (4, 5)]),
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
    ("ii->i", [(4, 4)]),
    ("ij->ji", [(3, 4)]),
    ("i,i", [(4,), (4,)]),
    ("...ij,...jk", [(2, 3, 4), (2, 4, 5)]),
    ("bhqd, bhkd -> bhqk", [(2, 3, 4, 5), (2, 3, 6, 5)]),
    ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 5)]),
    ("ij", [(3, 4)]),
    ("ii", [(3, 3)]),
])
def test_einsum(equation, shapes):
    check("Einsum", [rand(*s) for s in shapes], opset=12, equation=equation)


def test_einsum_types():
    A, B = RNG.integers(-5, 5, (3, 4)), RNG.integers(-5, 5, (4, 5))
    check("Einsum", [A.astype(np.int64), B.astype(np.int64)], opset=12, equation="ij,jk->ik")
    check("Einsum", [rand(3, 4, dtype=np.float64)], opset=12, equation="ij->i")


# -- Resize / Upsample ------------------------------------------------------------------------

X_RESIZE = rand(2, 3, 7, 9)
EMPTY = np.array([], np.float32)
SCALES = [[1, 1, 2, 2], [1, 1, 0.5, 0.5], [1, 1, 1.7, 0.6], [1, 1, 0.3, 2.5], [1, 1, 3, 1]]
SIZES = [[2, 3, 14, 18], [2, 3, 3, 4], [2, 3, 10, 5], [2, 3, 1, 1], [2, 3, 1, 9]]
CTMS = ["half_pixel", "asymmetric", "pytorch_half_pixel", "align_corners",
        "half_pixel_symmetric"]


def _scales(s):
    return np.array(s, np.float32)


def _sizes(s):
    return np.array(s, np.int64)


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
@pytest.mark.parametrize("ctm", CTMS)
@pytest.mark.parametrize("target", range(len(SCALES) + len(SIZES)))
def test_resize_modes(mode, ctm, target):
    if target < len(SCALES):
        inputs, const = [X_RESIZE, EMPTY, _scales(SCALES[target])], (1, 2)
    else:
        inputs, const = [X_RESIZE, None, None, _sizes(SIZES[target - len(SCALES)])], (3,)
    check("Resize", inputs, const=const, mode=mode, coordinate_transformation_mode=ctm)


@pytest.mark.parametrize("nearest_mode", ["round_prefer_floor", "round_prefer_ceil", "floor",
                                          "ceil"])
@pytest.mark.parametrize("ctm", CTMS)
def test_resize_nearest_modes(nearest_mode, ctm):
    for s in SCALES:
        check("Resize", [X_RESIZE, EMPTY, _scales(s)], const=(1, 2), mode="nearest",
              coordinate_transformation_mode=ctm, nearest_mode=nearest_mode)
    for s in SIZES:
        check("Resize", [X_RESIZE, None, None, _sizes(s)], const=(3,), mode="nearest",
              coordinate_transformation_mode=ctm, nearest_mode=nearest_mode)


@pytest.mark.parametrize("nearest_mode", ["round_prefer_floor", "round_prefer_ceil"])
def test_resize_tf_half_pixel_for_nn(nearest_mode):
    for s in SCALES:
        check("Resize", [X_RESIZE, EMPTY, _scales(s)], opset=13, const=(1, 2), mode="nearest",
              coordinate_transformation_mode="tf_half_pixel_for_nn", nearest_mode=nearest_mode)


@pytest.mark.parametrize("a", [-0.5, -0.75])
@pytest.mark.parametrize("exclude_outside", [0, 1])
def test_resize_cubic_options(a, exclude_outside):
    for s in SCALES:
        check("Resize", [X_RESIZE, EMPTY, _scales(s)], const=(1, 2), mode="cubic",
              cubic_coeff_a=a, exclude_outside=exclude_outside)


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
@pytest.mark.parametrize("roi", [[0, 0, 0.2, 0.3, 1, 1, 0.8, 0.9],
                                 [0, 0, -0.2, 0.3, 1, 1, 1.3, 0.7]])
def test_resize_tf_crop_and_resize(mode, roi):
    roi = np.array(roi, np.float32)
    for s in SIZES:
        check("Resize", [X_RESIZE, roi, None, _sizes(s)], mode=mode,
              coordinate_transformation_mode="tf_crop_and_resize", extrapolation_value=-7.0)
    for s in SCALES[:3]:
        check("Resize", [X_RESIZE, roi, _scales(s)], mode=mode,
              coordinate_transformation_mode="tf_crop_and_resize")


@pytest.mark.parametrize("mode", ["linear", "cubic"])
@pytest.mark.parametrize("ctm", ["half_pixel", "asymmetric", "align_corners"])
@pytest.mark.parametrize("exclude_outside", [0, 1])
def test_resize_antialias(mode, ctm, exclude_outside):
    for s in SCALES:
        check("Resize", [X_RESIZE, EMPTY, _scales(s)], const=(1, 2), mode=mode, antialias=1,
              coordinate_transformation_mode=ctm, exclude_outside=exclude_outside)
    for s in SIZES[1:3]:
        check("Resize", [X_RESIZE, None, None, _sizes(s)], const=(3,), mode=mode, antialias=1,
              coordinate_transformation_mode=ctm, exclude_outside=exclude_outside)


@pytest.mark.parametrize("policy", ["stretch", "not_larger", "not_smaller"])
@pytest.mark.parametrize("axes,sizes", [([2, 3], [14, 5]), ([3, 2], [5, 14]), ([3], [4]),
                                        ([2], [3])])
@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_resize_axes_and_aspect_ratio(policy, axes, sizes, mode):
    check("Resize", [X_RESIZE, None, None, _sizes(sizes)], mode=mode, axes=axes,
          keep_aspect_ratio_policy=policy)


def test_resize_axes_misc():
    check("Resize", [X_RESIZE, None, None, _sizes([4])], mode="linear", axes=[-1])
    # without axes the policy's common scale applies to every axis, batch and channels too
    check("Resize", [X_RESIZE, None, None, _sizes([2, 3, 14, 5])], mode="nearest",
          keep_aspect_ratio_policy="not_smaller")
    check("Resize", [X_RESIZE, EMPTY, _scales([2, 0.5])], mode="linear", axes=[2, 3])
    check("Resize", [X_RESIZE, EMPTY, _scales([1.5])], mode="cubic", axes=[-2])
    check("Resize", [X_RESIZE, np.array([0.1, 0.9], np.float32), None, _sizes([5])],
          mode="linear", axes=[2], coordinate_transformation_mode="tf_crop_and_resize")


@pytest.mark.parametrize("shape,scales", [((5,), [2.5]), ((4, 6), [0.5, 1.5]),
                                          ((2, 4, 6), [1, 2, 0.5]),
                                          ((1, 2, 3, 4, 5), [1, 1, 2, 0.5, 1.5])])
def test_resize_other_ranks(shape, scales):
    X = rand(*shape)
    check("Resize", [X, EMPTY, _scales(scales)], mode="nearest")
    oracle = run_ort if len(shape) in (2, 3) or (len(shape) == 5 and scales[1] == 1) \
        else run_ref  # onnxruntime's linear mode covers only some ranks
    check("Resize", [X, EMPTY, _scales(scales)], mode="linear", oracle=oracle)
    if len(shape) == 2:
        check("Resize", [X, EMPTY, _scales(scales)], mode="cubic")


@pytest.mark.parametrize("dtype", [np.int32, np.int8, np.uint8])
@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_resize_integer_types(dtype, mode):
    X = RNG.integers(0, 100, (1, 2, 5, 6)).astype(dtype)
    # truncating the interpolated value makes one unit of difference possible where the float
    # result lies within rounding error of an integer (onnxruntime sums the four bilinear
    # terms at once; here the interpolation is separable)
    atol = 0 if mode == "nearest" else 1
    for s in SCALES[:4]:
        check("Resize", [X, EMPTY, _scales(s)], const=(1, 2), mode=mode, atol=atol)


@pytest.mark.parametrize("dtype", [np.int32, np.uint8])
@pytest.mark.parametrize("mode", ["linear", "cubic"])
def test_resize_integer_antialias(dtype, mode):
    X = RNG.integers(0, 100, (1, 2, 5, 6)).astype(dtype)
    for s in SCALES[:4]:
        # onnxruntime's 8-bit filters use 22-bit fixed-point weights: allow one unit
        check("Resize", [X, EMPTY, _scales(s)], const=(1, 2), mode=mode, antialias=1, atol=1)


def test_resize_float16_and_float64():
    # onnxruntime has no float16 or float64 Resize on CPU
    check("Resize", [X_RESIZE.astype(np.float16), EMPTY, _scales([1, 1, 2, 0.5])],
          mode="linear", rtol=1e-2, atol=1e-2, oracle=run_ref)
    check("Resize", [X_RESIZE.astype(np.float64), EMPTY, _scales([1, 1, 2, 0.5])],
          mode="linear", oracle=run_ref)


def test_resize_runtime_scales_and_sizes():
    check("Resize", [X_RESIZE, EMPTY, _scales([1, 1, 0.6, 1.8])], opset=13, mode="linear")
    check("Resize", [X_RESIZE, None, None, _sizes([2, 3, 9, 4])], opset=13, mode="cubic")


@pytest.mark.parametrize("opset", [10, 11, 13])
@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_resize_older_opsets(opset, mode):
    for s in SCALES:
        inputs = [X_RESIZE, _scales(s)] if opset == 10 else [X_RESIZE, EMPTY, _scales(s)]
        check("Resize", inputs, opset=opset, mode=mode)
    if opset > 10:
        for s in SIZES:
            check("Resize", [X_RESIZE, EMPTY, EMPTY if opset == 11 else None, _sizes(s)],
                  opset=opset, mode=mode)


@pytest.mark.parametrize("mode", ["nearest", "linear"])
@pytest.mark.parametrize("scales", [[1.0, 1.0, 2.0, 2.0], [1.0, 1.0, 3.0, 1.5],
                                    [1.0, 1.0, 1.0, 2.7]])
def test_upsample(mode, scales):
    X = rand(2, 3, 5, 7)
    check("Upsample", [X], opset=7, mode=mode, scales=scales)
    check("Upsample", [X, _scales(scales)], opset=9, mode=mode)
    check("Upsample", [X, _scales(scales)], opset=9, mode=mode, const=(1,))


def test_upsample_integers():
    X = RNG.integers(0, 50, (1, 2, 3, 4)).astype(np.int32)
    check("Upsample", [X, _scales([1, 1, 2, 3])], opset=9, mode="nearest")
    check("Upsample", [X.astype(np.uint8), _scales([1, 1, 2, 3])], opset=9, mode="linear",
          atol=1)


# -- ONNX node conformance cases ------------------------------------------------------------------

FAMILIES = ("conv", "pool", "normalization", "linalg", "resize")
# onnx's expectations that onnxruntime (and so onnxrun) does not follow
CONFORMANCE_SKIPS = {
    # random masks: the stored outputs come from numpy's global RNG
    "test_training_dropout", "test_training_dropout_mask", "test_training_dropout_default",
    "test_training_dropout_default_mask",
    # align_corners with scales: onnx divides by the unrounded output length (in * scale),
    # onnxruntime by the integer output length
    "test_resize_downsample_scales_linear_align_corners",
    "test_resize_downsample_scales_cubic_align_corners",
}


def _conformance_cases():
    from onnx.backend.test.case.node import collect_testcases

    from onnxrun.providers.cpu import _load_kernels, cpu_kernels

    _load_kernels()
    mine, known = set(), set()
    for domain, op_type, version in cpu_kernels.operators():
        if domain:
            continue
        known.add(op_type)
        if cpu_kernels.lookup(domain, op_type, version).impl.__module__.rsplit(".", 1)[-1] \
                in FAMILIES:
            mine.add(op_type)
    cases = []
    for case in collect_testcases(None):
        used = {n.op_type for n in case.model.graph.node}
        if used & mine and used <= known and case.name not in CONFORMANCE_SKIPS:
            cases.append(pytest.param(case, id=case.name))
    return cases


def _tensor(v):
    return numpy_helper.to_array(v) if isinstance(v, onnx.TensorProto) else np.asarray(v)


@pytest.mark.parametrize("case", _conformance_cases())
def test_onnx_node_case(case):
    rtol = case.rtol if case.rtol is not None else 1e-3
    atol = max(case.atol if case.atol is not None else 1e-7, 1e-6)
    sess = onnxrun.InferenceSession(case.model.SerializeToString())
    names = [i.name for i in sess.get_inputs()]
    for inputs, outputs in case.data_sets:
        got = sess.run(None, dict(zip(names, map(_tensor, inputs), strict=False)))
        assert len(got) == len(outputs)
        for g, w in zip(got, map(_tensor, outputs), strict=True):
            assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, w.shape, g.dtype)
            # bfloat16 holds 8 significant bits: the onnx runner allows two ULPs (2**-6), since
            # the reference rounds after every step and a float32 computation rounds once.
            tol = max(rtol, 2**-6) if w.dtype.name == "bfloat16" else rtol
            np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=tol,
                                       atol=atol)
