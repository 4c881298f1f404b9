"""Elementwise kernels (arithmetic, math, comparison, logic, Clip, Cast) and activations,
each checked on a one-node model against onnxruntime (or the ONNX reference evaluator where
onnxruntime has no kernel for the type)."""

from __future__ import annotations

import warnings

import ml_dtypes
import numpy as np
import onnx
import pytest
from one_node_harness import check, make_rand, one_node
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

import onnxrun

RNG = np.random.default_rng(0)
rand = make_rand(RNG)


# -- binary arithmetic ------------------------------------------------------------------------

NUMERIC = [np.float32, np.float64, np.int32, np.int64, np.float16]


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div"])
@pytest.mark.parametrize("dtype", NUMERIC)
@pytest.mark.parametrize("opset", [7, 13, 14])
def test_binary_arith(op, dtype, opset):
    a = rand(2, 3, 4, dtype=dtype, lo=-20, hi=20)
    b = rand(3, 1, dtype=dtype, lo=1, hi=7)
    if op == "Div" and np.dtype(dtype).kind == "i":
        b = b * np.where(rand(3, 1) > 0, 1, -1).astype(dtype)  # truncation with signs mixed
    check(op, [a, b], opset=opset, rtol=1e-3 if dtype == np.float16 else 1e-5)


def test_int_div_truncates_toward_zero():
    a = np.array([7, -7, 7, -7, 0, 5], dtype=np.int32)
    b = np.array([2, 2, -2, -2, 3, 5], dtype=np.int32)
    got = check("Div", [a, b], opset=14)
    assert got[0].tolist() == [3, -3, -3, 3, 0, 1]


def test_legacy_broadcast_axis():
    a = rand(2, 3, 4, 5)
    b = rand(3, 4)
    model, feeds = one_node("Add", [a, b], opset=6, broadcast=1, axis=1)
    got = onnxrun.InferenceSession(model).run(None, feeds)[0]
    np.testing.assert_allclose(got, a + b[None, :, :, None], rtol=1e-6)


@pytest.mark.parametrize("case", ["f32_f32", "f32_i64", "i32_i32", "i64_f32", "f16_f32",
                                  "f32_const2", "f32_const05", "f32_f64const3"])
def test_pow(case):
    x = rand(3, 4, lo=0.5, hi=2.0)
    const = ()
    if case == "f32_f32":
        inputs = [x, rand(3, 4, lo=-2, hi=2)]
    elif case == "f32_i64":
        inputs = [x, rand(4, dtype=np.int64, lo=-2, hi=3)]
    elif case == "i32_i32":
        inputs = [rand(3, 4, dtype=np.int32, lo=-4, hi=4), rand(4, dtype=np.int32, lo=0, hi=3)]
    elif case == "i64_f32":
        inputs = [rand(3, 4, dtype=np.int64, lo=1, hi=4), np.array([2.0], np.float32)]
    elif case == "f16_f32":
        inputs = [x.astype(np.float16), rand(4, lo=-1, hi=2)]
    elif case == "f32_const2":
        inputs, const = [x, np.array(2.0, np.float32)], (1,)
    elif case == "f32_const05":
        inputs, const = [x, np.array([0.5], np.float32)], (1,)
    else:
        inputs, const = [x, np.array(3.0, np.float64)], (1,)
    got = check("Pow", inputs, opset=15, const=const, rtol=1e-3)
    assert got[0].dtype == inputs[0].dtype  # Pow keeps the base's type


@pytest.mark.parametrize("fmod", [0, 1])
@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.float32])
def test_mod(fmod, dtype):
    if np.dtype(dtype).kind == "f" and not fmod:
        pytest.skip("float Mod requires fmod=1")
    a = rand(4, 5, dtype=dtype, lo=-20, hi=20)
    b = rand(5, dtype=dtype, lo=1, hi=6) * np.array([1, -1, 1, -1, 1], dtype=dtype)
    check("Mod", [a, b], opset=13, fmod=fmod)


@pytest.mark.parametrize("op", ["Sum", "Max", "Min", "Mean"])
@pytest.mark.parametrize("n", [1, 2, 3])
def test_variadic(op, n):
    shapes = [(2, 3, 4), (3, 1), (4,)][:n]
    check(op, [rand(*s) for s in shapes], opset=13)


def test_max_min_int():
    a, b = rand(3, 4, dtype=np.int64, lo=-9, hi=9), rand(4, dtype=np.int64, lo=-9, hi=9)
    check("Max", [a, b], opset=13)
    check("Min", [a, b], opset=13)


# -- unary math -------------------------------------------------------------------------------

UNARY = {
    "Neg": (-3, 3), "Abs": (-3, 3), "Floor": (-3, 3), "Ceil": (-3, 3), "Sqrt": (0, 4),
    "Exp": (-3, 3), "Log": (0.1, 4), "Reciprocal": (0.5, 4), "Sign": (-3, 3), "Erf": (-4, 4),
    "Sin": (-3, 3), "Cos": (-3, 3), "Tan": (-1, 1), "Asin": (-0.9, 0.9), "Acos": (-0.9, 0.9),
    "Atan": (-3, 3), "Sinh": (-2, 2), "Cosh": (-2, 2), "Asinh": (-3, 3), "Acosh": (1.1, 4),
    "Atanh": (-0.9, 0.9), "Round": (-3, 3), "Sigmoid": (-9, 9), "Tanh": (-4, 4),
    "Relu": (-3, 3), "Softsign": (-3, 3), "Softplus": (-20, 20),
}


@pytest.mark.parametrize("op", sorted(UNARY))
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
def test_unary(op, dtype):
    lo, hi = UNARY[op]
    x = rand(3, 17, dtype=dtype, lo=lo, hi=hi)
    tol = 2e-3 if dtype == np.float16 else 1e-5
    got = check(op, [x], opset=13 if op not in ("Round",) else 11, rtol=tol, atol=tol)
    assert got[0].dtype == dtype


def test_round_half_to_even():
    x = np.array([0.5, 1.5, 2.5, -0.5, -1.5, 2.4, 2.6], np.float32)
    assert check("Round", [x], opset=11)[0].tolist() == [0, 2, 2, -0, -2, 2, 3]


def test_erf_accuracy_float32():
    x = np.linspace(-6, 6, 20001, dtype=np.float32)
    got = check("Erf", [x], opset=13, atol=1e-6)[0]
    from math import erf

    want = np.array([erf(v) for v in x.astype(np.float64)])
    assert np.abs(got - want).max() < 1e-6


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_unary_int(dtype):
    x = rand(3, 5, dtype=dtype, lo=-9, hi=9)
    for op in ("Neg", "Abs", "Sign"):
        check(op, [x], opset=13)


def test_isnan_isinf():
    x = np.array([1.0, np.nan, np.inf, -np.inf, 0.0], np.float32)
    check("IsNaN", [x], opset=13)
    for neg in (0, 1):
        for pos in (0, 1):
            check("IsInf", [x], opset=10, detect_negative=neg, detect_positive=pos)


# -- comparison, logic, bitwise ---------------------------------------------------------------


@pytest.mark.parametrize("op,opset", [("Equal", 13), ("Less", 13), ("Greater", 13),
                                      ("LessOrEqual", 16), ("GreaterOrEqual", 16)])
@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.int32])
def test_compare(op, opset, dtype):
    a = rand(3, 4, dtype=dtype, lo=-3, hi=3).round().astype(dtype)
    b = rand(4, dtype=dtype, lo=-3, hi=3).round().astype(dtype)
    got = check(op, [a, b], opset=opset)
    assert got[0].dtype == np.bool_


def test_equal_string():
    a = np.array(["a", "b", "c"], dtype=object)
    b = np.array(["a", "x", "c"], dtype=object)
    assert check("Equal", [a, b], opset=19)[0].tolist() == [True, False, True]


@pytest.mark.parametrize("op", ["And", "Or", "Xor"])
def test_logic(op):
    check(op, [rand(3, 4, dtype=np.bool_), rand(4, dtype=np.bool_)], opset=7)


def test_not():
    check("Not", [rand(3, 4, dtype=np.bool_)], opset=1)


@pytest.mark.parametrize("op", ["BitwiseAnd", "BitwiseOr", "BitwiseXor"])
@pytest.mark.parametrize("dtype", [np.int32, np.uint8, np.int64])
def test_bitwise(op, dtype):
    check(op, [rand(3, 4, dtype=dtype, lo=0, hi=100), rand(4, dtype=dtype, lo=0, hi=100)],
          opset=18)


def test_bitwise_not_and_shift():
    check("BitwiseNot", [rand(3, 4, dtype=np.int32, lo=-50, hi=50)], opset=18)
    x = rand(3, 4, dtype=np.uint32, lo=0, hi=1000)
    y = rand(4, dtype=np.uint32, lo=0, hi=5)
    check("BitShift", [x, y], opset=11, direction="LEFT")
    check("BitShift", [x, y], opset=11, direction="RIGHT")


@pytest.mark.parametrize("dtype", [np.float32, np.int64, object])
def test_where(dtype):
    c = rand(3, 4, dtype=np.bool_)
    if dtype is object:
        x = np.array(["a", "b", "c", "d"], dtype=object)
        y = np.array([["z"]] * 3, dtype=object)
    else:
        x, y = rand(4, dtype=dtype), rand(3, 1, dtype=dtype)
    check("Where", [c, x, y], opset=16)


# -- Clip -------------------------------------------------------------------------------------


@pytest.mark.parametrize("bounds", ["both", "min", "max", "none", "inverted"])
@pytest.mark.parametrize("const", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.float16])
def test_clip(bounds, const, dtype):
    x = rand(4, 5, dtype=dtype, lo=-10, hi=10)
    lo = np.array(-2, dtype=dtype)
    hi = np.array(3, dtype=dtype)
    if bounds == "inverted":
        lo, hi = hi, lo
    inputs = {"both": [x, lo, hi], "min": [x, lo], "max": [x, None, hi], "none": [x],
              "inverted": [x, lo, hi]}[bounds]
    check("Clip", inputs, opset=13, const=(1, 2) if const else ())


def test_clip_6_attributes():
    x = rand(4, 5, lo=-10, hi=10)
    check("Clip", [x], opset=6, min=-1.5, max=2.0)
    check("Clip", [x], opset=6, min=-1.5)
    check("Clip", [x], opset=6)


# -- Cast -------------------------------------------------------------------------------------

CAST_TYPES = [TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.INT32,
              TensorProto.INT64, TensorProto.INT8, TensorProto.UINT8, TensorProto.BOOL,
              TensorProto.BFLOAT16, TensorProto.UINT16]


@pytest.mark.parametrize("src", CAST_TYPES)
@pytest.mark.parametrize("dst", CAST_TYPES)
def test_cast_matrix(src, dst):
    dt = helper.tensor_dtype_to_np_dtype(src)
    x = rand(2, 7, lo=0, hi=100).round()
    x[0, :3] = [0, 1, 0]
    x = x.astype(dt)
    check("Cast", [x], opset=19, to=dst)


def test_cast_float_to_string_and_back():
    x = np.array([1.0, 0.1, 1e10, -2.5e-7, 3.14159265, 1 / 3, np.nan, np.inf, -np.inf, -0.0],
                 np.float32)
    check("Cast", [x], opset=13, to=TensorProto.STRING)
    check("Cast", [x.astype(np.float64)], opset=13, to=TensorProto.STRING)
    check("Cast", [np.array([3, -7, 0], np.int64)], opset=13, to=TensorProto.STRING)
    s = np.array(["1.5", "-INF", "NaN", "+inf", "1e3", "-0.25"], dtype=object)
    check("Cast", [s], opset=13, to=TensorProto.FLOAT)
    check("Cast", [s], opset=13, to=TensorProto.DOUBLE)
    check("Cast", [np.array(["15", "-3", "7"], dtype=object)], opset=13, to=TensorProto.INT64)


@pytest.mark.parametrize("to", [TensorProto.FLOAT8E4M3FN, TensorProto.FLOAT8E5M2,
                                TensorProto.FLOAT8E4M3FNUZ, TensorProto.FLOAT8E5M2FNUZ])
@pytest.mark.parametrize("saturate", [0, 1])
def test_cast_float8(to, saturate):
    x = np.array([0.0, 0.3, -1.7, 100.0, 1e6, -1e6, np.inf, -np.inf, np.nan, 448.0, 57344.0],
                 np.float32)
    model, feeds = one_node("Cast", [x], opset=19, to=to, saturate=saturate)
    got = onnxrun.InferenceSession(model).run(None, feeds)[0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = ReferenceEvaluator(onnx.load_from_string(model)).run(None, feeds)[0]
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got.astype(np.float32), want.astype(np.float32))
    back = check("Cast", [got], opset=19, to=TensorProto.FLOAT)[0]
    assert back.dtype == np.float32


def test_castlike():
    x = rand(3, 4, lo=-100, hi=100)
    for like in (np.zeros(1, np.int32), np.zeros(1, np.float16), np.zeros(1, bool),
                 np.zeros(1, ml_dtypes.bfloat16)):
        check("CastLike", [x, like], opset=19)


# -- activations ------------------------------------------------------------------------------

ACTIVATIONS = [
    ("LeakyRelu", 16, {}), ("LeakyRelu", 6, {"alpha": 0.2}), ("LeakyRelu", 16, {"alpha": 1.5}),
    ("Elu", 6, {}), ("Elu", 6, {"alpha": 0.5}), ("Selu", 6, {}),
    ("Selu", 6, {"alpha": 2.0, "gamma": 0.5}), ("Celu", 12, {}), ("Celu", 12, {"alpha": 2.0}),
    ("ThresholdedRelu", 10, {}), ("ThresholdedRelu", 10, {"alpha": 0.5}), ("Shrink", 9, {}),
    ("Shrink", 9, {"bias": 0.3, "lambd": 1.0}), ("Mish", 18, {}), ("HardSigmoid", 6, {}),
    ("HardSigmoid", 6, {"alpha": 0.3, "beta": 0.4}), ("HardSwish", 14, {}),
    ("Gelu", 20, {}), ("Gelu", 20, {"approximate": "tanh"}), ("Softplus", 1, {}),
]


@pytest.mark.parametrize("op,opset,attrs", ACTIVATIONS)
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
def test_activation(op, opset, attrs, dtype):
    if op == "Celu" and dtype != np.float32:
        pytest.skip("Celu-12 is float32 only")
    x = rand(3, 5, 7, dtype=dtype, lo=-5, hi=5)
    tol = 3e-3 if dtype == np.float16 else 1e-5
    got = check(op, [x], opset=opset, rtol=tol, atol=tol, **attrs)
    assert got[0].dtype == dtype


def test_activation_bfloat16_keeps_type():
    x = rand(4, 6, lo=-3, hi=3).astype(ml_dtypes.bfloat16)
    for op, opset in (("LeakyRelu", 16), ("Elu", 22), ("HardSigmoid", 22), ("Gelu", 20)):
        model, feeds = one_node(op, [x], opset=opset)
        assert onnxrun.InferenceSession(model).run(None, feeds)[0].dtype == x.dtype


@pytest.mark.parametrize("slope_shape", [(1,), (6,), (4, 1, 1), (4, 5, 6)])
def test_prelu(slope_shape):
    check("PRelu", [rand(2, 4, 5, 6), rand(*slope_shape)], opset=16)


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax", "Hardmax"])
@pytest.mark.parametrize("opset", [11, 13])
@pytest.mark.parametrize("axis", [0, 1, 2, -1])
def test_softmax_family(op, opset, axis):
    x = rand(2, 3, 5, lo=-5, hi=5)
    check(op, [x], opset=opset, axis=axis)


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
def test_softmax_default_axis_and_dtypes(op):
    for opset in (1, 11, 13):
        check(op, [rand(2, 3, 4, lo=-5, hi=5)], opset=opset)
    check(op, [rand(2, 3, 8, dtype=np.float16)], opset=13, rtol=2e-3, atol=2e-3)
    check(op, [rand(2, 3, 8, dtype=np.float64)], opset=13)
    big = rand(4, 16, lo=-1e4, hi=1e4)  # needs the max shift to stay finite
    check(op, [big], opset=13)


def test_softmax_masked_rows():
    x = rand(2, 4, 6)
    x[0, 1, :3] = -np.inf
    x[1, 2, :] = -1e30
    check("Softmax", [x], opset=13)


@pytest.mark.parametrize("p", [1, 2])
@pytest.mark.parametrize("axis", [0, -1])
def test_lp_normalization(p, axis):
    x = rand(3, 4)
    x[1] = 0
    check("LpNormalization", [x], opset=1, p=p, axis=axis)


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_softmax_large_rows(op, dtype):
    """Big enough for the argmax/gemv fast path; masked entries and a transposed input."""
    x = rand(2, 8, 64, 64, dtype=dtype, lo=-8, hi=8)
    x[0, 1, :, :10] = -np.inf
    x[1, 2, 3, :] = -1e4
    check(op, [x], opset=13, axis=-1)
    check(op, [x], opset=13, axis=2)
    check(op, [x], opset=11, axis=3)
