"""Reductions (Reduce* in their attribute and input forms), ArgMax/ArgMin, CumSum and TopK,
each checked on a one-node model against onnxruntime (or the ONNX reference evaluator)."""

from __future__ import annotations

import numpy as np
import pytest
from one_node_harness import check, make_rand, one_node, oracle

import onnxrun

RNG = np.random.default_rng(2)
rand = make_rand(RNG)


# -- Reduce* ----------------------------------------------------------------------------------

I64 = np.int64
# op -> (last opset with the axes attribute, first opset with the axes input)
REDUCE = {
    "ReduceSum": (11, 13), "ReduceMean": (13, 18), "ReduceMax": (13, 18), "ReduceMin": (13, 18),
    "ReduceProd": (13, 18), "ReduceL1": (13, 18), "ReduceL2": (13, 18),
    "ReduceLogSum": (13, 18), "ReduceLogSumExp": (13, 18), "ReduceSumSquare": (13, 18),
}
AXES = [None, (0,), (1,), (-1,), (0, 2), (1, 2), (-2, -1), ()]


def _data(op, dtype, shape=(3, 4, 5)):
    lo, hi = (0.5, 2.0) if op in ("ReduceLogSum", "ReduceProd") else (-3.0, 3.0)
    if np.dtype(dtype).kind in "iu":
        lo, hi = (1, 3) if op == "ReduceProd" else (-9, 9)
    return rand(*shape, dtype=dtype, lo=lo, hi=hi)


@pytest.mark.parametrize("op", sorted(REDUCE))
@pytest.mark.parametrize("axes", AXES)
@pytest.mark.parametrize("keepdims", [0, 1])
def test_reduce_attribute_form(op, axes, keepdims):
    attrs = {"keepdims": keepdims}
    if axes:
        attrs["axes"] = list(axes)
    check(op, [_data(op, np.float32)], opset=REDUCE[op][0], rtol=1e-5, atol=1e-5, **attrs)


@pytest.mark.parametrize("op", sorted(REDUCE))
@pytest.mark.parametrize("axes", AXES)
@pytest.mark.parametrize("keepdims", [0, 1])
@pytest.mark.parametrize("const", [False, True])
def test_reduce_input_form(op, axes, keepdims, const):
    x = _data(op, np.float32)
    inputs = [x] if axes is None else [x, np.array(axes, dtype=I64)]
    check(op, inputs, opset=REDUCE[op][1], const=(1,) if const else (), rtol=1e-5, atol=1e-5,
          keepdims=keepdims)


@pytest.mark.parametrize("op", sorted(REDUCE))
@pytest.mark.parametrize("const", [False, True])
def test_reduce_noop_with_empty_axes(op, const):
    x = _data(op, np.float32)
    check(op, [x, np.zeros(0, I64)], opset=REDUCE[op][1], const=(1,) if const else (),
          noop_with_empty_axes=1)
    check(op, [x], opset=REDUCE[op][1], noop_with_empty_axes=1)


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin",
                                "ReduceProd", "ReduceL1", "ReduceSumSquare", "ReduceL2"])
@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.float64, np.float16])
def test_reduce_dtypes(op, dtype):
    x = _data(op, dtype)
    tol = 3e-3 if dtype == np.float16 else 1e-6
    for axes in ((1,), (0, 2), (2,)):
        if op == "ReduceSum":
            got = check(op, [x, np.array(axes, I64)], opset=13, rtol=tol, atol=tol)
        else:
            got = check(op, [x], opset=13, axes=list(axes), rtol=tol, atol=tol)
        assert got[0].dtype == dtype


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceL2"])
def test_reduce_noncontiguous_and_large(op):
    """The fast trailing-axes paths (gemv / argmax) against the oracle on bigger rows."""
    x = rand(4, 8, 300, lo=-2, hi=2)
    for axes in ((2,), (1, 2), (0,)):
        check(op, [x, np.array(axes, I64)], opset=18, const=(1,), rtol=1e-5, atol=1e-5)


def test_reduce_max_nan_and_empty():
    x = rand(4, 3)
    x[1, 2] = x[2, 0] = x[3, :] = np.nan
    for op in ("ReduceMax", "ReduceMin"):
        for axes in ([1], [0], [0, 1]):
            check(op, [x, np.array(axes, I64)], opset=18)
    e = np.zeros((2, 0, 3), np.float32)
    for op in ("ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceLogSumExp"):
        check(op, [e, np.array([1], I64)], opset=18)


def test_reduce_log_sum_exp_stability():
    x = np.array([[1000.0, 1000.0, -1000.0], [-np.inf, -np.inf, -np.inf]], np.float32)
    check("ReduceLogSumExp", [x, np.array([1], I64)], opset=18)


def test_reduce_bool_max_min():
    x = rand(3, 4, dtype=np.bool_)
    check("ReduceMax", [x, np.array([1], I64)], opset=20)
    check("ReduceMin", [x, np.array([0], I64)], opset=20)


# -- ArgMax / ArgMin --------------------------------------------------------------------------


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("keepdims", [0, 1])
@pytest.mark.parametrize("last", [0, 1])
def test_arg(op, axis, keepdims, last):
    x = rand(3, 4, 5, dtype=np.int32, lo=0, hi=3).astype(np.float32)  # many ties
    got = check(op, [x], opset=13, axis=axis, keepdims=keepdims, select_last_index=last)
    assert got[0].dtype == np.int64


@pytest.mark.parametrize("opset", [1, 11])
def test_arg_old_opsets(opset):
    x = rand(3, 4, dtype=np.int64, lo=-5, hi=5)
    check("ArgMax", [x], opset=opset, axis=1)
    check("ArgMin", [x], opset=opset, axis=0, keepdims=0)


# -- CumSum -----------------------------------------------------------------------------------


@pytest.mark.parametrize("exclusive", [0, 1])
@pytest.mark.parametrize("reverse", [0, 1])
@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.int64, np.float64])
def test_cumsum(exclusive, reverse, axis, dtype):
    x = rand(3, 4, dtype=dtype, lo=-5, hi=5)
    check("CumSum", [x, np.array(axis, dtype=np.int32)], opset=14, exclusive=exclusive,
          reverse=reverse)


# -- TopK -------------------------------------------------------------------------------------


@pytest.mark.parametrize("largest", [0, 1])
@pytest.mark.parametrize("axis", [0, -1])
@pytest.mark.parametrize("k", [1, 3, 5])
@pytest.mark.parametrize("ties", [False, True])
def test_topk(largest, axis, k, ties):
    x = rand(5, 6, lo=-3, hi=3)
    if ties:
        x = np.round(x)
    check("TopK", [x, np.array([k], I64)], opset=11, n_out=2, axis=axis, largest=largest)


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint8, np.float64])
def test_topk_dtypes(dtype):
    x = rand(4, 50, dtype=dtype, lo=0, hi=20)
    for largest in (0, 1):
        check("TopK", [x, np.array([4], I64)], opset=11, n_out=2, largest=largest)


def test_topk_long_axis_partial_selection():
    """k much smaller than the axis takes the argpartition path; ties still go to low indices."""
    x = rand(3, 400, lo=-3, hi=3)
    check("TopK", [x, np.array([5], I64)], opset=11, n_out=2)
    check("TopK", [np.round(x), np.array([5], I64)], opset=11, n_out=2)
    check("TopK", [np.round(x), np.array([5], I64)], opset=11, n_out=2, largest=0)


def test_topk_old_versions():
    x = rand(4, 6)
    check("TopK", [x], opset=1, n_out=2, k=2)
    check("TopK", [x, np.array([2], I64)], opset=10, n_out=2, axis=0)


def test_reduce_max_min_nan_large():
    x = rand(16, 512)
    x[3, 7] = x[5, 0] = np.nan
    x[9, :] = np.nan
    for op in ("ReduceMax", "ReduceMin"):
        check(op, [x, np.array([1], I64)], opset=18)
        check(op, [x, np.array([1], I64)], opset=18, keepdims=0)


@pytest.mark.parametrize("axes,keepdims", [([2], 0), ([2], 1), ([0, 2], 0), ([-1], 1)])
def test_mean_over_axes_of_one_element_is_its_sum_over_one(axes, keepdims):
    """A mean over axes of length 1 (a streaming model pooling its one frame) skips the
    reduction: the same bits as the sum divided by 1, -0.0 turned +0.0 as the sum does, NaN
    and infinities kept, and onnxruntime's values."""
    x = np.array([[[-0.0], [np.nan], [np.inf], [-np.inf], [1e-45], [3.5]]], np.float32)
    model, feeds = one_node("ReduceMean", [x], opset=13, axes=axes, keepdims=keepdims)
    got = onnxrun.InferenceSession(model).run(None, feeds)[0]
    ax = tuple(sorted(a % 3 for a in axes))
    want = np.add.reduce(x, axis=ax, keepdims=bool(keepdims))
    assert got.shape == want.shape and got.tobytes() == want.tobytes()
    np.testing.assert_array_equal(got, oracle(model, feeds)[0])
