"""Large copies split over spin.py's workers: ``dst[...] = src`` for two arrays of one shape and
dtype whose last axis is contiguous and whose other axes each collapse to one stride (a
Concat's operand into its range of the output's channels, channels-last or not).

Why: at 2 intra-op threads a Concat's copies ran on the calling thread while the workers idled
(DenseNet-style blocks: ~7% of a run; YOLO's and ShuffleNet's joins). A copy is the input's
bytes: any split gives the same result. Below two ranges of MIN_BYTES_PER_RANGE, or where the
arrays overlap or do not collapse to rows, ``copy`` says no and the caller copies with numpy.
``copy_rows`` runs the same loop on the calling thread where the rows are many and short (a
channels-last operand's rows of a few dozen floats), which numpy copies a row at a time.
"""

from __future__ import annotations

import ctypes

import numpy as np

from ..parallel import work_ranges
from . import ir, jit, spin
from .jit import address

REQUIRES = ()  # generic IR: every target
# Bytes a range needs before it goes to another thread: ~25-50 us of one core's copying (the
# pools' measured ~30-60 us a range), against a hand-off of a few microseconds to a spinning
# worker and ~6 us of Python around it (benchmarks/pool_costs.py)
MIN_BYTES_PER_RANGE = 1 << 18
# copy_rows (one thread): rows of at most MAX_ROW_BYTES, at least MIN_ROWS of them, MIN_ROWS_BYTES
# in all, where numpy's per-row loop costs more than the bytes (rows of 24 floats: 189 -> 137
# us for 25600 of them, 16 floats 744 -> 467 us for 102400; 128 floats: 12 -> 10 us for 784)
MAX_ROW_BYTES = 512
MIN_ROWS = 64
MIN_ROWS_BYTES = 1 << 14
_ARGS = ("ptr", "ptr", "i64", "i64", "i64", "i64", "i64")


def module_ir(target=None) -> str:
    """``@copy_rows(dst, src, dstep, sstep, bytes, r0, r1)``: ``bytes`` bytes of each row r in
    [r0, r1), row r at ``r * step`` bytes from each base; 32 bytes a step, then the rest.
    "no-builtins": the loop must not become a call of memcpy (the objects link nothing)."""
    L = ["define void @copy_rows(ptr %dst, ptr %src, i64 %dstep, i64 %sstep, i64 %bytes, "
         "i64 %r0, i64 %r1) #0 {",
         "entry:",
         "  %b32 = and i64 %bytes, -32",
         "  %any = icmp slt i64 %r0, %r1",
         "  br i1 %any, label %row, label %end",
         "row:",
         "  %r = phi i64 [%r0, %entry], [%rn, %rnext]",
         "  %doff = mul i64 %r, %dstep",
         "  %soff = mul i64 %r, %sstep",
         "  %d = getelementptr i8, ptr %dst, i64 %doff",
         "  %s = getelementptr i8, ptr %src, i64 %soff",
         "  %anyv = icmp sgt i64 %b32, 0",
         "  br i1 %anyv, label %vloop, label %vdone",
         "vloop:",
         "  %i = phi i64 [0, %row], [%in, %vloop]",
         "  %sp = getelementptr i8, ptr %s, i64 %i",
         "  %v = load <8 x i32>, ptr %sp, align 1",
         "  %dp = getelementptr i8, ptr %d, i64 %i",
         "  store <8 x i32> %v, ptr %dp, align 1",
         "  %in = add i64 %i, 32",
         "  %more = icmp slt i64 %in, %b32",
         "  br i1 %more, label %vloop, label %vdone",
         "vdone:",
         "  %anyt = icmp slt i64 %b32, %bytes",
         "  br i1 %anyt, label %tloop, label %rnext",
         "tloop:",
         "  %j = phi i64 [%b32, %vdone], [%jn, %tloop]",
         "  %tsp = getelementptr i8, ptr %s, i64 %j",
         "  %t = load i8, ptr %tsp, align 1",
         "  %tdp = getelementptr i8, ptr %d, i64 %j",
         "  store i8 %t, ptr %tdp, align 1",
         "  %jn = add i64 %j, 1",
         "  %tmore = icmp slt i64 %jn, %bytes",
         "  br i1 %tmore, label %tloop, label %rnext",
         *ir.row_loop_end("%row"),
         'attributes #0 = { nounwind "no-builtins" }',
         # @copy_job: the same on an argument block, a range of rows per spin.py worker
         *ir.job("copy_job", "copy_rows", _ARGS)]
    return "\n".join(L)


_JOB = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


def _module() -> jit.Module:
    return jit.compile_module("copy", module_ir, {"copy_job": _JOB}, REQUIRES)


def unavailable() -> str | None:
    """None when the kernel runs here, else why not."""
    return jit.why_unavailable(REQUIRES) or jit.why_not_loaded("copy", _module)


def _rows(a: np.ndarray) -> tuple[int, int, int] | None:
    """(rows, row stride in bytes, row bytes) of ``a`` as rows of its contiguous last axis, or
    None where its other axes do not collapse to one stride."""
    if a.ndim == 0 or a.strides[-1] != a.itemsize:
        return None
    width = a.shape[-1] * a.itemsize
    rows, step = 1, width
    for n, s in zip(reversed(a.shape[:-1]), reversed(a.strides[:-1]), strict=True):
        if n == 1:
            continue
        if rows > 1 and s != step * rows:
            return None
        if rows == 1:
            step = s
        rows *= n
    return rows, step, width


def _row_pair(dst: np.ndarray, src: np.ndarray) -> tuple[int, int, int, int] | None:
    """(rows, dst's row step, src's row step, row bytes) where ``dst[...] = src`` is a copy
    the kernel can make: one shape and dtype (no objects), dst writable, both collapsing to
    rows, no overlap, the kernel loaded; else None."""
    if dst.shape != src.shape or dst.dtype != src.dtype or dst.dtype.hasobject or \
            not dst.flags.writeable:
        return None
    d, s = _rows(dst), _rows(src)
    if d is None or s is None or np.may_share_memory(dst, src) or unavailable() is not None:
        return None
    (rows, dstep, width), sstep = d, s[1]
    return rows, dstep, sstep, width


def copy(dst: np.ndarray, src: np.ndarray, threads: int) -> bool:
    """``dst[...] = src`` in ranges on the calling thread and spin.py's workers, when the copy
    is worth at least two ranges on ``threads`` threads; False (nothing done) where it is not,
    or the arrays differ in shape or dtype, overlap, or do not collapse to rows."""
    if threads <= 1 or dst.nbytes < 2 * MIN_BYTES_PER_RANGE:
        return False
    found = _row_pair(dst, src)
    if found is None or spin.usable() is None:
        return False
    rows, dstep, sstep, width = found
    da, sa = address(dst), address(src)
    if rows == 1 or (dstep == sstep == width):  # one run of bytes: cut by bytes
        total = rows * width
        ranges = work_ranges(-(-total // 64), threads, 64, least=MIN_BYTES_PER_RANGE)
        blocks = [(da + 64 * a, sa + 64 * a, 0, 0, min(64 * b, total) - 64 * a, 0, 1)
                  for a, b in ranges]
    else:
        ranges = work_ranges(rows, threads, width, least=MIN_BYTES_PER_RANGE)
        blocks = [(da, sa, dstep, sstep, width, r0, r1) for r0, r1 in ranges]
    if len(blocks) < 2:
        return False
    spin.run_blocks(_module().copy_job, np.array(blocks, np.int64), threads)
    return True


def copy_rows(dst: np.ndarray, src: np.ndarray) -> bool:
    """``dst[...] = src`` on the calling thread where both are many short rows (a Concat's
    channels-last operand into its range of the output's channels: rows of 16-128 floats);
    False (nothing done) elsewhere. numpy's strided copy pays its loop's setup per row."""
    if dst.nbytes < MIN_ROWS_BYTES:
        return False
    found = _row_pair(dst, src)
    if found is None or found[0] < MIN_ROWS or found[3] > MAX_ROW_BYTES:
        return False
    rows, dstep, sstep, width = found
    block = np.array((address(dst), address(src), dstep, sstep, width, 0, rows), np.int64)
    _module().copy_job(address(block))
    return True


# compiled with the other kernels on first use (jit._BUNDLE)
BUNDLE = {"copy": (module_ir, REQUIRES)}

__all__ = ["BUNDLE", "MIN_BYTES_PER_RANGE", "copy", "copy_rows", "module_ir", "unavailable"]
