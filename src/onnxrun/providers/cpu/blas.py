"""Matrix products where numpy has no BLAS: Pyodide's numpy is built without one (a 512x512
float32 product takes 150-270 ms there, 2-10 ms natively). There float32 products go to a
WebAssembly SIMD kernel (``wasm_gemm``: ~14 GFLOP/s where SciPy's OpenBLAS, built without SIMD,
gives ~2.5), and what it does not take (small products, float64) to SciPy's OpenBLAS when SciPy
is installed (``scipy.linalg.blas``), else to numpy. Elsewhere numpy's own BLAS is used and
``matmul`` is ``np.matmul``. ``clip`` is here for the same reason: numpy's clip is a branch per
element in Pyodide (20-37 ms a 1.2M-element array of random signs), float32 ones go to the
WebAssembly kernel there too.
"""

from __future__ import annotations

import functools
import sys

import numpy as np

from . import wasm_gemm


@functools.cache
def _gemms() -> dict[np.dtype, object]:
    if sys.platform != "emscripten":
        return {}
    try:
        from scipy.linalg import blas
    except ImportError:
        return {}
    return {np.dtype(np.float32): blas.sgemm, np.dtype(np.float64): blas.dgemm}


def _fortran(x: np.ndarray) -> tuple[np.ndarray, int]:
    """``x`` as a column-major operand and its transpose flag, without a copy when ``x`` is
    contiguous either way (a row-major matrix is its transpose, column-major)."""
    if x.flags.f_contiguous:
        return x, 0
    if x.flags.c_contiguous:
        return x.T, 1
    return np.asfortranarray(x), 0


def matmul(a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """``np.matmul(a, b, out=out)``; float products through the WebAssembly kernel or SciPy's
    BLAS in Pyodide (a stack of matrices: one GEMM per matrix)."""
    if a.ndim < 2 or b.ndim < 2 or a.dtype != b.dtype or not a.size or not b.size:
        return np.matmul(a, b, out=out)
    gemm = _gemms().get(a.dtype)
    if gemm is None and not (a.dtype == np.float32 and wasm_gemm.available()):
        return np.matmul(a, b, out=out)
    if a.ndim > 2 or b.ndim > 2:
        batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
        if out is None:
            out = np.empty(batch + (a.shape[-2], b.shape[-1]), a.dtype)
        a = np.broadcast_to(a, batch + a.shape[-2:])
        b = np.broadcast_to(b, batch + b.shape[-2:])
        for i in np.ndindex(*batch):
            _gemm2(gemm, a[i], b[i], out[i])
        return out
    return _gemm2(gemm, a, b, out)


def _gemm2(gemm, a: np.ndarray, b: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    if a.dtype == np.float32:
        c = wasm_gemm.gemm(a, b, out)
        if c is not None:
            return c
    if gemm is None:
        return np.matmul(a, b, out=out)
    # C = A @ B as C^T = B^T @ A^T: the column-major result's transpose is row-major C.
    bt, tb = _fortran(b.T)
    at, ta = _fortran(a.T)
    c = gemm(1.0, bt, at, trans_a=tb, trans_b=ta).T
    if out is None:
        return c
    out[...] = c
    return out


def clip(x: np.ndarray, lo, hi, out: np.ndarray | None = None) -> np.ndarray:
    """``np.clip(x, lo, hi, out=out)``; in Pyodide float32 arrays through the WebAssembly
    kernel (the same results: NaN stays NaN)."""
    if x.dtype == np.float32 and wasm_gemm.available():
        dst = np.empty(x.shape, np.float32) if out is None else out
        if wasm_gemm.clip(x, lo, hi, dst):
            return dst
    return np.clip(x, lo, hi, out=out)
