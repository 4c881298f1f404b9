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
import math
import sys

import numpy as np

from .parallel import run_ranges, work_ranges

_WASM = f"{__package__}.wasm_gemm"


def _wasm():
    """The WebAssembly kernel's module where it may run: in Pyodide, or where it was imported
    already (the tests' stand-in driver); else None, so that CPython's sessions do not import
    it (~0.7 ms of a first session)."""
    module = sys.modules.get(_WASM)
    if module is None and sys.platform == "emscripten":
        from . import wasm_gemm as module
    return module


def _wasm_available() -> bool:
    wasm = _wasm()
    return wasm is not None and wasm.available()

try:  # the clip ufunc itself: np.clip's Python wrapper costs ~5-10 us a call (a Relu of 128)
    from numpy._core.umath import clip as _clip_ufunc
except ImportError:  # numpy 1.26
    from numpy.core.umath import clip as _clip_ufunc


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


def matmul_function(dtype: np.dtype):
    """What ``matmul(a, b)`` of two ``dtype`` matrices on one thread calls: np.matmul itself
    where no other GEMM takes them (for a caller that runs one product many times)."""
    dtype = np.dtype(dtype)
    if _gemms().get(dtype) is None and not (dtype == np.float32 and _wasm_available()):
        return np.matmul
    return matmul


def matmul(a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None,
           threads: int = 1) -> np.ndarray:
    """``np.matmul(a, b, out=out)``; float products through the WebAssembly kernel or SciPy's
    BLAS in Pyodide (a stack of matrices: one GEMM per matrix). ``threads`` > 1 (the kernel's
    intra-op threads): a large product is cut into ranges of rows or columns that run on
    onnxrun's threads, BLAS at one thread in each (the session holds it there during runs)."""
    if a.ndim < 2 or b.ndim < 2 or a.dtype != b.dtype or not a.size or not b.size:
        return np.matmul(a, b, out=out)
    gemm = _gemms().get(a.dtype)
    if gemm is None and not (a.dtype == np.float32 and _wasm_available()):
        if threads > 1 and one_thread and a.dtype.kind == "f":
            return _split_matmul(a, b, out, threads)
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


# Whether BLAS runs on one thread now: set by the session while runs are in progress (it holds
# BLAS there). Only then are products cut for onnxrun's threads: OpenBLAS serves one call at
# a time on its own threads, so cut products would queue for them.
one_thread = False

# Ranges start at multiples of this many rows (columns): whole tiles of BLAS's micro-kernels.
_ALIGN = 16


def _split_matmul(a: np.ndarray, b: np.ndarray, out: np.ndarray | None,
                  threads: int) -> np.ndarray:
    """np.matmul(a, b, out=out) over ranges of a's rows (or b's columns, when they are more),
    each range one BLAS call (numpy releases the GIL in it) on onnxrun's intra-op threads.
    The cut depends on the shapes and the thread count only, so a session's results are the
    same run after run; OpenBLAS sums some elements of a smaller product in another order
    (its kernels depend on the sizes), so they can move in their last bits with the thread
    count, as they did with OpenBLAS's own threads."""
    (M, K), N = a.shape[-2:], b.shape[-1]
    batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    per_row = math.prod(batch) * K
    rows = M >= N
    n = M if rows else N
    units = work_ranges(-(-n // _ALIGN), threads, _ALIGN * per_row * (N if rows else M))
    ranges = [(u0 * _ALIGN, min(n, u1 * _ALIGN)) for u0, u1 in units]
    if len(ranges) == 1:
        return np.matmul(a, b, out=out)
    if out is None:
        out = np.empty(batch + (M, N), np.result_type(a, b))
    if rows:
        run_ranges(lambda r0, r1: np.matmul(a[..., r0:r1, :], b, out=out[..., r0:r1, :]),
                   ranges)
    else:
        run_ranges(lambda c0, c1: np.matmul(a, b[..., c0:c1], out=out[..., c0:c1]), ranges)
    return out


def _gemm2(gemm, a: np.ndarray, b: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    wasm = _wasm() if a.dtype == np.float32 else None
    if wasm is not None:
        c = wasm.gemm(a, b, out)
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


@functools.cache
def cblas_sgemm() -> tuple[int, int] | None:
    """(address, integer bits) of the process's OpenBLAS ``cblas_sgemm``, numpy's own where
    it is one (found through threadpoolctl, as the session finds the BLAS it holds to one
    thread), for compiled kernels that call it (``compiled.attention_heads``); None where
    there is no OpenBLAS, or no threadpoolctl. 64 bits: built with 64-bit integers."""
    if sys.platform == "emscripten":
        return None
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:
        return None
    import ctypes

    libs = [lib for lib in ThreadpoolController().select(internal_api="openblas").lib_controllers
            if getattr(lib, "dynlib", None) is not None]
    libs.sort(key=lambda lib: "numpy" not in str(getattr(lib, "filepath", "")))  # numpy's first
    for lib in libs:
        for prefix in ("", "scipy_"):
            for suffix in ("64_", ""):
                fn = getattr(lib.dynlib, f"{prefix}cblas_sgemm{suffix}", None)
                config = getattr(lib.dynlib, f"{prefix}openblas_get_config{suffix}", None)
                if fn is None or config is None:
                    continue
                config.restype = ctypes.c_char_p
                wide = b"USE64BITINT" in (config() or b"")
                return ctypes.cast(fn, ctypes.c_void_p).value, 64 if wide else 32
    return None


def clip(x: np.ndarray, lo, hi, out: np.ndarray | None = None) -> np.ndarray:
    """``np.clip(x, lo, hi, out=out)``; in Pyodide float32 arrays through the WebAssembly
    kernel (the same results: NaN stays NaN)."""
    if x.dtype == np.float32 and _wasm_available():
        dst = np.empty(x.shape, np.float32) if out is None else out
        if _wasm().clip(x, lo, hi, dst):
            return dst
    return _clip_ufunc(x, lo, hi, out=out)
