"""A stack of float32 products, out[i] = alpha * a[i] @ b[i], each by the process's OpenBLAS
``cblas_sgemm`` called from compiled code: the whole stack in one call on one thread, or its
products taken in turn by spin.py's workers.

Why: an unfused attention (SVTR-style recognizers, ViTs, any exporter that writes q k^T,
Softmax, p v as nodes) multiplies stacks of a few heads of 64-256 rows. numpy's matmul runs
them one BLAS call per head on the calling thread: no second thread at 2 intra-op threads
(BLAS is held to one during runs), and FusedMatMul's alpha a second pass over the scores.
Here alpha is BLAS's own (alpha times each sum, as onnxruntime's GEMM applies it) and the heads
split over the intra-op threads. Each product runs whole on one thread, so results do not
depend on the thread count; at alpha 1 they are numpy's (the same cblas_sgemm per matrix).

An argument block per product, i64 words: sgemm, transA, transB (CBLAS's 111 / 112), M, N, K,
alpha (a float32 in the word's low half), a, lda, b, ldb, c, ldc; strides in floats.
``@product64`` / ``@product32`` run one block (an ILP64 cblas_sgemm, numpy's wheels, or one
with 32-bit integers); ``@products64`` / ``@products32`` (blocks, n) run n blocks in turn.
"""

from __future__ import annotations

import ctypes

import numpy as np

from .. import blas
from . import jit, spin

REQUIRES = ()  # scalar IR and a call: every target
_WORDS = ("sgemm", "ta", "tb", "M", "N", "K", "alpha", "a", "lda", "b", "ldb", "c", "ldc")
# Multiply-adds from which the products split over spin.py's workers (the float GEMM's
# SPIN_MACS_PER_RANGE: a hand-off to a polling worker costs ~1-3 us)
SPLIT_MACS = 1 << 20
_ROW_MAJOR, _NO_TRANS, _TRANS = 101, 111, 112


def _product_ir(bits: int) -> list[str]:
    it = f"i{bits}"
    L = [f"define void @product{bits}(ptr %w) nounwind {{", "entry:"]
    for i, name in enumerate(_WORDS):
        ty = "ptr" if name in ("sgemm", "a", "b", "c") else "float" if name == "alpha" \
            else "i64"
        L += [f"  %{name}.p = getelementptr i64, ptr %w, i64 {i}",
              f"  %{name} = load {ty}, ptr %{name}.p, align 8"]
    for name in ("ta", "tb"):
        L.append(f"  %{name}.c = trunc i64 %{name} to i32")
    for name in ("M", "N", "K", "lda", "ldb", "ldc"):
        L.append(f"  %{name}.c = trunc i64 %{name} to {it}" if bits == 32 else
                 f"  %{name}.c = add i64 %{name}, 0")
    L += [f"  call void %sgemm(i32 {_ROW_MAJOR}, i32 %ta.c, i32 %tb.c, {it} %M.c, {it} %N.c, "
          f"{it} %K.c, float %alpha, ptr %a, {it} %lda.c, ptr %b, {it} %ldb.c, float 0.0, "
          f"ptr %c, {it} %ldc.c)",
          "  ret void",
          "}",
          f"define void @products{bits}(ptr %blocks, i64 %n) nounwind {{",
          "entry:",
          "  %any = icmp sgt i64 %n, 0",
          "  br i1 %any, label %loop, label %end",
          "loop:",
          "  %i = phi i64 [0, %entry], [%i.next, %loop]",
          f"  %off = mul i64 %i, {len(_WORDS)}",
          "  %wp = getelementptr i64, ptr %blocks, i64 %off",
          f"  call void @product{bits}(ptr %wp)",
          "  %i.next = add i64 %i, 1",
          "  %more = icmp slt i64 %i.next, %n",
          "  br i1 %more, label %loop, label %end",
          "end:",
          "  ret void",
          "}"]
    return L


def module_ir(target=None) -> str:
    return "\n".join(_product_ir(64) + _product_ir(32))


_JOB = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_ALL = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64)


def _module() -> jit.Module:
    return jit.compile_module("batched_gemm", module_ir,
                              {"product64": _JOB, "product32": _JOB, "products64": _ALL,
                               "products32": _ALL}, REQUIRES)


def unavailable() -> str | None:
    """None when the kernel can run here (its object loaded), else why not."""
    return jit.why_unavailable(REQUIRES) or jit.why_not_loaded("batched_gemm", _module)


def _operand(x: np.ndarray) -> tuple[int, int] | None:
    """(CBLAS transpose flag, leading dimension in floats) of the 2-D slices of a float32
    stack whose rows or columns are contiguous; None where neither is."""
    s_r, s_c = x.strides[-2], x.strides[-1]
    rows, cols = x.shape[-2], x.shape[-1]
    if (s_c == 4 or cols == 1) and s_r % 4 == 0 and s_r >= 4 * max(1, cols):
        return _NO_TRANS, max(1, s_r // 4, cols)
    if (s_r == 4 or rows == 1) and s_c % 4 == 0 and s_c >= 4 * max(1, rows):
        return _TRANS, max(1, s_c // 4, rows)
    return None


class _Plan:
    """What a stack of one set of shapes, strides and alpha needs every call: the argument
    blocks less the three arrays' addresses (a, b and c hold byte offsets), the result's
    shape, and whether the given ``out`` is written (else a new C-contiguous array)."""

    __slots__ = ("rel", "shape", "use_out", "macs", "one", "each", "module")

    def __init__(self, rel, shape, use_out, macs, module, bits) -> None:
        self.rel, self.shape, self.use_out, self.macs = rel, shape, use_out, macs
        self.module = module  # (it keeps its machine code mapped)
        self.one = module.product64 if bits == 64 else module.product32  # a block a call
        self.each = module.products64 if bits == 64 else module.products32  # all in turn


def _plan(a: np.ndarray, b: np.ndarray, out: np.ndarray | None, alpha: float,
          sgemm: tuple[int, int]) -> _Plan | None:
    if a.dtype != np.float32 or b.dtype != np.float32 or a.ndim < 2 or b.ndim < 2 or \
            a.shape[-1] != b.shape[-2] or unavailable() is not None:
        return None
    try:
        batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    except ValueError:
        return None
    M, K, N = a.shape[-2], a.shape[-1], b.shape[-1]
    shape = batch + (M, N)
    fa, fb = _operand(a), _operand(b)
    if fa is None or fb is None or 0 in shape or K == 0:
        return None
    use_out = out is not None and out.shape == shape and out.dtype == np.float32 and \
        (N == 1 or out.strides[-1] == 4) and out.strides[-2] % 4 == 0 and \
        out.strides[-2] >= 4 * N and all(st >= 0 for st in out.strides)
    c_strides = out.strides if use_out else \
        tuple(int(np.prod(shape[i + 1:], dtype=np.int64)) * 4 for i in range(len(shape)))
    n = int(np.prod(batch, dtype=np.int64))
    idx = np.indices(batch, np.int64).reshape(len(batch), n) if batch else None

    def offsets(dims: tuple, strides: tuple) -> np.ndarray | int:
        if idx is None:
            return 0
        lead = len(dims) - 2  # its batch axes, aligned right against out's (broadcast: 0)
        steps = [0] * (len(batch) - lead) + [0 if d == 1 else st for d, st in
                                             zip(dims[:lead], strides[:lead], strict=True)]
        return (np.array(steps, np.int64)[:, None] * idx).sum(axis=0)

    rel = np.zeros((n, len(_WORDS)), np.int64)
    rel[:, 0] = sgemm[0]
    rel[:, 1], rel[:, 2] = fa[0], fb[0]
    rel[:, 3], rel[:, 4], rel[:, 5] = M, N, K
    rel[:, 6] = int(np.array([alpha], np.float32).view(np.uint32)[0])  # its bits, low half
    rel[:, 7], rel[:, 8] = offsets(a.shape, a.strides), fa[1]
    rel[:, 9], rel[:, 10] = offsets(b.shape, b.strides), fb[1]
    rel[:, 11], rel[:, 12] = offsets(shape, c_strides), c_strides[-2] // 4
    return _Plan(rel, shape, use_out, n * M * N * K, _module(), sgemm[1])


_PLANS: dict[tuple, _Plan | None] = {}


def matmul(a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None, alpha: float = 1.0,
           threads: int = 1) -> np.ndarray | None:
    """alpha * a @ b for float32 stacks a (..., M, K) and b (..., K, N) (batch axes broadcast
    as np.matmul's; each 2-D slice with contiguous rows or columns), into ``out`` when it is a
    float32 array of the result's shape with contiguous rows, else a new C-contiguous array;
    the products split over ``threads`` where they are worth it and BLAS is held to one
    thread. None where this does not run (no OpenBLAS ``cblas_sgemm``, no kernel, other
    operands)."""
    sgemm = blas.cblas_sgemm()
    if sgemm is None:
        return None
    key = (a.shape, b.shape, a.strides, b.strides, a.dtype, b.dtype, alpha,
           None if out is None else (out.shape, out.strides, out.dtype), jit.switches())
    plan = _PLANS.get(key, _PLANS)
    if plan is _PLANS:  # (None: remembered as not running)
        if len(_PLANS) > 256:
            _PLANS.clear()
        plan = _PLANS[key] = _plan(a, b, out, float(alpha), sgemm)
    if plan is None:
        return None
    if not plan.use_out:
        out = np.empty(plan.shape, np.float32)
    blocks = plan.rel + np.array((0, 0, 0, 0, 0, 0, 0, a.__array_interface__["data"][0], 0,
                                  b.__array_interface__["data"][0], 0,
                                  out.__array_interface__["data"][0], 0), np.int64)
    if threads > 1 and len(blocks) > 1 and blas.one_thread and plan.macs >= 2 * SPLIT_MACS:
        spin.run_blocks(plan.one, blocks, threads)
    else:
        plan.each(jit.address(blocks), len(blocks))
    return out


BUNDLE = {"batched_gemm": (module_ir, REQUIRES)}

__all__ = ["BUNDLE", "REQUIRES", "SPLIT_MACS", "matmul", "module_ir", "unavailable"]
