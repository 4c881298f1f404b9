"""Float GEMMs on CuPy through cuBLAS's strided-batched GEMM, called with a handle of our own.

Why not ``cupy.matmul``: CuPy refuses every cuBLAS call while a stream is being captured
("calling cuBLAS API during stream capture is currently unsupported"), so a CUDA graph of a
model with one MatMul or Conv could not be made. cuBLAS itself captures GEMMs as long as it
allocates nothing during the capture: each thread's handle gets a workspace of its own
(``cublasSetWorkspace``), set again whenever its stream changes (``cublasSetStream`` resets
it). One path for all runs, captured or not, so the graph replays the GEMM the plain run made.

``gemm_plan`` is the layout arithmetic (pure, tested on the CPU against numpy): row-major
C = A @ B is column-major C^T = B^T A^T, so cuBLAS gets B as its first operand; an operand whose
matrices are transposed views is passed with op T instead of copied; batch dimensions collapse
to one stride (0 for an operand shared by every batch). Operands no single stride describes
are copied contiguous first."""

from __future__ import annotations

import ctypes
import math
import os
import threading
from typing import Any, NamedTuple

import numpy as np

OP_N, OP_T = 0, 1
_DATA_TYPES = {np.dtype(np.float32): 0, np.dtype(np.float64): 1, np.dtype(np.float16): 2}
_COMPUTE_32F, _COMPUTE_64F = 68, 70
_GEMM_DEFAULT = -1
WORKSPACE_BYTES = 32 << 20  # NVIDIA's advice for Hopper; a thread's GEMMs share it in order
_INT_MAX = 2 ** 31 - 1


class Operand(NamedTuple):
    op: int  # OP_N or OP_T, as cuBLAS reads the column-major matrix
    ld: int  # leading dimension, elements
    stride: int  # between batches, elements (0: one matrix for all)


class GemmPlan(NamedTuple):
    """cuBLAS's arguments, column-major: C^T (n_cols x n_rows) = B^T . A^T."""

    m: int  # rows of cuBLAS's C = columns N of the row-major result
    n: int  # columns of cuBLAS's C = rows M
    k: int
    first: Operand  # cuBLAS's A = our B
    second: Operand  # cuBLAS's B = our A
    batch: int


def _matrix(shape: tuple[int, ...], strides: tuple[int, ...]) -> tuple[int, int] | None:
    """(op, ld) for the row-major (rows x cols) matrices of an operand with these element
    strides, as cuBLAS's column-major reading of their transpose; None: not one stride."""
    rows, cols = shape[-2], shape[-1]
    sr, sc = strides[-2], strides[-1]
    if cols == 1:
        sc = 1  # a single column: its stride is never read
    if rows == 1:
        sr = max(cols, 1)  # a single row likewise
    if sc == 1 and sr >= max(cols, 1):
        return OP_N, sr  # row-major: column-major cols x rows, ld = row stride
    if sr == 1 and sc >= max(rows, 1):
        return OP_T, sc  # a transposed view: column-major rows x cols, read transposed
    return None


def broadcast_batch(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    """numpy's broadcast of two batch shapes (a few tuples: np.broadcast_shapes took ~1.5 us
    of a GEMM's host time here)."""
    if a == b:
        return a
    n = max(len(a), len(b))
    a, b = (1,) * (n - len(a)) + a, (1,) * (n - len(b)) + b
    out = []
    for x, y in zip(a, b, strict=True):
        if x != y and x != 1 and y != 1:
            raise ValueError(f"matmul: batch shapes {a} and {b} do not broadcast")
        out.append(y if x == 1 else x)
    return tuple(out)


def _batch_stride(shape: tuple[int, ...], strides: tuple[int, ...],
                  batch: tuple[int, ...]) -> int | None:
    """One stride between the operand's matrices in the broadcast batch order, 0 when it has
    one matrix for all; None when the batch dims need more than one stride."""
    own = shape[:-2]
    extra = len(batch) - len(own)
    if own != batch and (own != batch[extra:] or any(d != 1 for d in batch[:extra])):
        return 0 if all(d == 1 for d in own) else None  # else broadcast along a batch dim
    stride = None
    for d, st in zip(reversed(own), reversed(strides[:-2]), strict=False):
        if d == 1:
            continue
        if stride is None:
            stride, inner = st, st * d  # the innermost dim that counts
        elif st != inner:
            return None
        else:
            inner = st * d
    return 0 if stride is None else stride


def gemm_plan(a_shape: tuple[int, ...], a_strides: tuple[int, ...], b_shape: tuple[int, ...],
              b_strides: tuple[int, ...], batch: tuple[int, ...] | None = None
              ) -> GemmPlan | None:
    """The strided-batched GEMM computing matmul(A, B) for operands of ndim >= 2 with these
    shapes and element strides, into a C-contiguous result; None where an operand must be
    copied first (or the sizes pass cuBLAS's int range). ``batch``: the broadcast batch
    shape, where the caller has it."""
    M, K = a_shape[-2:]
    N = b_shape[-1]
    if batch is None:
        batch = broadcast_batch(a_shape[:-2], b_shape[:-2])
    count = math.prod(batch)
    a, b = _matrix(a_shape, a_strides), _matrix(b_shape, b_strides)
    if a is None or b is None:
        return None
    sa, sb = _batch_stride(a_shape, a_strides, batch), _batch_stride(b_shape, b_strides, batch)
    if sa is None or sb is None or max(M, N, K, a[1], b[1], count) > _INT_MAX:
        return None
    return GemmPlan(N, M, K, Operand(b[0], b[1], sb), Operand(a[0], a[1], sa), count)


def _element_strides(x: Any) -> tuple[int, ...] | None:
    item = x.itemsize
    if any(s % item or s < 0 for s in x.strides):
        return None
    return tuple(s // item for s in x.strides)


# -- the library -------------------------------------------------------------------------------

_lib_lock = threading.Lock()
_lib: Any = None
_state = threading.local()


def _library() -> Any:
    """libcublas as CuPy loaded it (the same file, so one copy of cuBLAS in the process)."""
    global _lib
    with _lib_lock:
        if _lib is None:
            import cupy

            cupy.cuda.device.get_cublas_handle()  # CuPy loads its cuBLAS
            path = None
            try:
                with open("/proc/self/maps", encoding="utf-8") as maps:
                    for line in maps:
                        mapped = line.split()[-1] if "/" in line else ""
                        if os.path.basename(mapped).startswith("libcublas.so"):
                            path = mapped
                            break
            except OSError:
                pass
            lib = ctypes.CDLL(path or "libcublas.so")
            vp, i32, i64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong
            lib.cublasCreate_v2.argtypes = [ctypes.POINTER(vp)]
            lib.cublasSetStream_v2.argtypes = [vp, vp]
            lib.cublasSetWorkspace_v2.argtypes = [vp, vp, ctypes.c_size_t]
            lib.cublasGemmStridedBatchedEx.argtypes = [
                vp, i32, i32, i32, i32, i32, vp, vp, i32, i32, i64, vp, i32, i32, i64, vp, vp,
                i32, i32, i64, i32, i32, i32]
            for f in (lib.cublasCreate_v2, lib.cublasSetStream_v2, lib.cublasSetWorkspace_v2,
                      lib.cublasGemmStridedBatchedEx):
                f.restype = ctypes.c_int
            _lib = lib
        return _lib


def _check(status: int, what: str) -> None:
    if status != 0:
        raise RuntimeError(f"cuBLAS {what} failed with status {status}")


class _Handle:
    """A thread's cuBLAS handle on one device, with its workspace (raw device memory, outside
    every pool: a graph's private pool may end before the handle does)."""

    def __init__(self, lib: Any, cupy: Any) -> None:
        handle = ctypes.c_void_p()
        _check(lib.cublasCreate_v2(ctypes.byref(handle)), "cublasCreate")
        self.handle = handle
        self.workspace = cupy.cuda.memory.Memory(WORKSPACE_BYTES)
        self.stream: int | None = None

    def bind(self, lib: Any, stream: int) -> ctypes.c_void_p:
        if stream != self.stream:
            _check(lib.cublasSetStream_v2(self.handle, stream), "cublasSetStream")
            _check(lib.cublasSetWorkspace_v2(self.handle, self.workspace.ptr, WORKSPACE_BYTES),
                   "cublasSetWorkspace")
            self.stream = stream
        return self.handle


def _handle(lib: Any, cupy: Any) -> _Handle:
    handles = getattr(_state, "handles", None)
    if handles is None:
        handles = _state.handles = {}
    device = cupy.cuda.runtime.getDevice()
    h = handles.get(device)
    if h is None:
        h = handles[device] = _Handle(lib, cupy)
    return h


def matmul(a: Any, b: Any) -> Any:
    """``cupy.matmul(a, b)`` for float16 / float32 / float64 operands of one type, as one
    cuBLAS call that a CUDA graph can capture; other types go to CuPy's matmul."""
    import cupy

    dtype = a.dtype
    if b.dtype != dtype or dtype not in _DATA_TYPES or a.ndim == 0 or b.ndim == 0:
        return cupy.matmul(a, b)
    squeeze = []
    if a.ndim == 1:
        a, squeeze = a[None, :], [-2]
    if b.ndim == 1:
        b, squeeze = b[:, None], squeeze + [-1]
    if a.shape[-1] != b.shape[-2]:
        raise ValueError(f"matmul: shapes {a.shape} and {b.shape} do not multiply")
    batch = broadcast_batch(a.shape[:-2], b.shape[:-2])
    out = cupy.empty(batch + (a.shape[-2], b.shape[-1]), dtype)
    if out.size and a.shape[-1] == 0:
        out.fill(0)
    elif out.size:
        _gemm(cupy, a, b, out, dtype, batch)
    for axis in squeeze:  # numpy's rule for 1-D operands: their added dim goes again
        out = out.squeeze(axis)
    return out


def _gemm(cupy: Any, a: Any, b: Any, out: Any, dtype: np.dtype,
          batch: tuple[int, ...]) -> None:
    sa, sb = _element_strides(a), _element_strides(b)
    plan = None if sa is None or sb is None else gemm_plan(a.shape, sa, b.shape, sb, batch)
    if plan is None:  # a layout no single stride describes: copy the operands contiguous
        a = cupy.ascontiguousarray(cupy.broadcast_to(a, batch + a.shape[-2:]))
        b = cupy.ascontiguousarray(cupy.broadcast_to(b, batch + b.shape[-2:]))
        plan = gemm_plan(a.shape, _element_strides(a), b.shape, _element_strides(b), batch)
        if plan is None:  # sizes past cuBLAS's int arguments
            cupy.matmul(a, b, out=out)
            return
    lib = _library()
    handle = _handle(lib, cupy).bind(lib, cupy.cuda.get_current_stream().ptr)
    data_type = _DATA_TYPES[dtype]
    if dtype == np.float64:
        one, zero, compute = ctypes.c_double(1.0), ctypes.c_double(0.0), _COMPUTE_64F
    else:  # float16 accumulates in float32, as CuPy and onnxruntime do
        one, zero, compute = ctypes.c_float(1.0), ctypes.c_float(0.0), _COMPUTE_32F
    first, second = plan.first, plan.second
    _check(lib.cublasGemmStridedBatchedEx(
        handle, first.op, second.op, plan.m, plan.n, plan.k, ctypes.byref(one),
        b.data.ptr, data_type, first.ld, first.stride,
        a.data.ptr, data_type, second.ld, second.stride, ctypes.byref(zero),
        out.data.ptr, data_type, plan.m, plan.m * plan.n, plan.batch, compute, _GEMM_DEFAULT),
        "cublasGemmStridedBatchedEx")
