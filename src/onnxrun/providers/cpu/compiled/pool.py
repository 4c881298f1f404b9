"""MaxPool and AveragePool in float32 on channels-last input: the depthwise kernel's loops
(``depthwise.py``: a row of output pixels per 16-channel chunk, padding masked instead of
copied) with the taps' maximum or sum in place of their weighted sum.

Why: numpy pools one spatial axis at a time in strided passes, each a fresh intermediate,
then copies the result into the channels-last output: 3-8x onnxruntime's time on the pools
of SqueezeNet, ShuffleNet and YOLO's SPPF (docs/PERFORMANCE.md, session 9). Here each output
pixel's chunk is read once per tap and stored once.

MaxPool gives numpy's numbers exactly (a NaN wins, as in ``np.maximum``); AveragePool sums
the window's taps in row order, then multiplies by the pixel's 1 / count (the numpy path's
factor, ``pool._counts``): results agree with the numpy path to float32 rounding.
"""

from __future__ import annotations

import ctypes

import numpy as np

from ..parallel import work_ranges
from . import depthwise, ir, jit, spin
from .jit import address

REQUIRES = ()  # generic vector IR: every target
MAX_TAPS = depthwise.MAX_TAPS
_P, _I = ctypes.c_void_p, ctypes.c_int64
_PROTO = ctypes.CFUNCTYPE(None, _P, _P, _P, _P, _P, *([_I] * 16))
_UNUSED = np.zeros(16, np.float32)  # the depthwise kernel's bias / bounds, never read here
_JOB = ctypes.CFUNCTYPE(None, _P)
# the depthwise kernel's (its loops are these): below, a pool stays on the calling thread
# (SqueezeNet's three 3x3 max pools, ShuffleNet's one, the global average pools' one row)
MIN_TAPS_PER_RANGE = depthwise.MIN_TAPS_PER_RANGE


def module_ir(kh: int, kw: int, op: str) -> str:
    """``@pool_f32`` for a kh x kw window, ``op`` "max" or "avg"."""
    # @pool_job: the same on an argument block, a range of output rows per spin.py worker
    job = ir.job("pool_job", "pool_f32", ("ptr",) * 5 + ("i64",) * 16)
    return "\n\n".join(ir.declarations("load.f32", "store.f32") + [
        depthwise._kernel(kh, kw, op), "\n".join(job)])


def pool(X: np.ndarray, op: str, kernel: tuple[int, int], heads: tuple[int, int],
         outs: tuple[int, int], strides: tuple[int, int], dilations: tuple[int, int],
         scale: np.ndarray | None = None, threads: int = 1,
         out: np.ndarray | None = None) -> np.ndarray:
    """The (N, Ho, Wo, C) pool of the C-contiguous channels-last (N, H, W, C) float32 ``X``,
    windows from (-heads) on, padding never read; ``scale`` (avg): each output pixel's factor,
    (Ho, Wo) float32; into ``out`` when it is a C-contiguous float32 array of that shape.
    Raises ``jit.Unavailable`` where the kernel cannot run here."""
    kh, kw = kernel
    if op not in ("max", "avg") or not 0 < kh * kw <= MAX_TAPS:
        raise ValueError(f"pool: op {op!r} over {kh} x {kw} taps is not compiled")
    reason = jit.why_unavailable(REQUIRES)
    if reason:
        raise jit.Unavailable(reason)
    module = jit.compile_module(f"pool_{op}_{kh}x{kw}", lambda target: module_ir(kh, kw, op),
                                {"pool_f32": _PROTO, "pool_job": _JOB}, REQUIRES)
    N, H, Wd, C = X.shape
    if X.dtype != np.float32 or not X.flags.c_contiguous:
        raise ValueError("pool: expected a contiguous float32 [N, H, W, C]")
    Ho, Wo = outs
    if out is None or out.shape != (N, Ho, Wo, C) or out.dtype != np.float32 or \
            not out.flags.c_contiguous:
        out = np.empty((N, Ho, Wo, C), np.float32)
    if out.size == 0:
        return out
    (sh, sw), (dh, dw), (pt, pl) = strides, dilations, heads
    # output columns whose windows lie inside the image's columns: [ow_lo, ow_hi)
    ow_lo = min(Wo, -(-pl // sw))
    last = Wd - 1 - (kw - 1) * dw + pl
    ow_hi = max(ow_lo, min(Wo, last // sw + 1 if last >= 0 else 0))
    if op == "avg":
        scale = np.ascontiguousarray(scale, np.float32)
        if scale.shape != (Ho, Wo):
            raise ValueError(f"pool: the scale must be [{Ho}, {Wo}], got {list(scale.shape)}")
    else:
        scale = _UNUSED
    args = (address(X), address(scale), address(_UNUSED), address(_UNUSED), address(out), C, C,
            H, Wd, Ho, Wo, sh, sw, dh, dw, pt, pl, ow_lo, ow_hi)
    rows = N * Ho
    ranges = work_ranges(rows, threads, Wo * C * kh * kw, least=MIN_TAPS_PER_RANGE)
    if len(ranges) > 1:  # rows taken in turn by the caller and spin.py's workers
        spin.run_blocks(module.pool_job, np.array([args + (r0, r1) for r0, r1 in ranges],
                                                  np.int64), threads)
    else:
        module.pool_f32(*args, 0, rows)
    return out


# compiled with the other kernels on first use (jit._BUNDLE): the suite's CNN pools
BUNDLE = {f"pool_{op}_{k}x{k}": ((lambda target, k=k, op=op: module_ir(k, k, op)), REQUIRES)
          for op in ("max", "avg") for k in (3,)}

__all__ = ["BUNDLE", "MAX_TAPS", "REQUIRES", "module_ir", "pool"]
