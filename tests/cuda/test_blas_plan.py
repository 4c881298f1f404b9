"""The layout arithmetic of the CuPy provider's own cuBLAS GEMM (cupy/blas.py), on the CPU: the
plan's arguments, read back the way cuBLAS reads column-major memory, must multiply to
numpy's matmul for plain, transposed, sliced, broadcast and batched operands."""

import numpy as np
import pytest
from numpy.lib.stride_tricks import as_strided

from onnxrun.providers.cuda.cupy.blas import OP_N, broadcast_batch, gemm_plan


def _column_major(x, op, ld, stride, rows, cols, batch):
    """The (batch, rows, cols) operand cuBLAS sees: op N reads rows x cols column-major with
    leading dimension ld, op T reads cols x rows so and transposes it."""
    item = x.itemsize
    if op == OP_N:
        return as_strided(x, (batch, rows, cols), (stride * item, item, ld * item))
    stored = as_strided(x, (batch, cols, rows), (stride * item, item, ld * item))
    return stored.transpose(0, 2, 1)


def _emulate(a, b):
    strides = [tuple(s // x.itemsize for s in x.strides) for x in (a, b)]
    plan = gemm_plan(a.shape, strides[0], b.shape, strides[1])
    if plan is None:
        return None
    first = _column_major(b, plan.first.op, plan.first.ld, plan.first.stride, plan.m, plan.k,
                          plan.batch)
    second = _column_major(a, plan.second.op, plan.second.ld, plan.second.stride, plan.k,
                           plan.n, plan.batch)
    c = first @ second  # column-major m x n per batch: the row-major result transposed
    batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    return c.transpose(0, 2, 1).reshape(*batch, a.shape[-2], b.shape[-1])


def _cases():
    r = np.random.default_rng(0)

    def f(*s):
        return r.standard_normal(s).astype(np.float32)

    big = f(6, 9, 10)
    return {
        "plain": (f(4, 5), f(5, 3)),
        "batched": (f(2, 4, 5), f(2, 5, 3)),
        "shared weight": (f(2, 3, 4, 5), f(5, 6)),
        "shared input": (f(4, 5), f(3, 5, 6)),
        "transposed B": (f(4, 5), f(3, 5).T),
        "transposed A": (f(5, 4).T, f(5, 3)),
        "batch-transposed": (f(2, 5, 4).transpose(0, 2, 1), f(2, 3, 5).transpose(0, 2, 1)),
        "sliced rows": (big[:, 1:5, 2:7], f(5, 3)),
        "heads of one sequence": (f(7, 6, 4).transpose(1, 0, 2), f(7, 6, 4).transpose(1, 2, 0)),
        "single row": (f(1, 5), f(5, 3)),
        "single column": (f(4, 5), f(5, 1)),
        "one by one": (f(1, 1), f(1, 1)),
        "size-1 batch dims": (f(2, 1, 4, 5), f(1, 1, 5, 3)),
        "broadcast batch": (np.broadcast_to(f(1, 4, 5), (3, 4, 5)), f(3, 5, 2)),
        "leading size-1 batch dim": (f(1, 3, 4, 5), f(3, 5, 2)),
        "size-1 batch dim inside": (f(2, 1, 3, 4, 5), f(2, 1, 3, 5, 2)),
        "sliced batch": (f(6, 4, 5)[::2], f(3, 5, 2)),
    }


@pytest.mark.parametrize("name", list(_cases()))
def test_gemm_plan_multiplies_as_numpy(name):
    a, b = _cases()[name]
    got = _emulate(a, b)
    assert got is not None, "this layout needs no copy"
    np.testing.assert_allclose(got, np.matmul(a, b), rtol=1e-5, atol=1e-5)


def test_gemm_plan_asks_for_a_copy():
    r = np.random.default_rng(1)
    q = r.standard_normal((2, 7, 3, 4)).astype(np.float32).transpose(0, 2, 1, 3)
    k = r.standard_normal((2, 3, 4, 7)).astype(np.float32)
    cases = [
        (np.ones((2, 1, 4, 5), np.float32), np.ones((3, 5, 2), np.float32)),  # A broadcast
        (q, k),  # heads of a batch: batch dims (2, 3) need two strides
        (np.ones((3, 4, 5), np.float32)[:, :, ::2], np.ones((3, 3, 2), np.float32)),  # step 2
    ]
    for a, b in cases:
        strides = [tuple(s // 4 for s in x.strides) for x in (a, b)]
        assert gemm_plan(a.shape, strides[0], b.shape, strides[1]) is None, (a.shape, b.shape)


@pytest.mark.parametrize("a,b", [((), ()), ((3,), ()), ((2, 1), (4,)), ((1, 3), (2, 1)),
                                 ((5, 1, 4), (3, 1)), ((2, 3), (2, 3))])
def test_broadcast_batch_is_numpys(a, b):
    assert broadcast_batch(a, b) == np.broadcast_shapes(a, b)
    assert broadcast_batch(b, a) == np.broadcast_shapes(b, a)


def test_broadcast_batch_refuses_what_numpy_refuses():
    with pytest.raises(ValueError):
        broadcast_batch((2, 3), (4, 3))
