"""x * a + b with one (a, b) per channel, over rows of channels-last pixels, in one pass, split
over spin.py's workers at 2+ intra-op threads: BatchNormalization at inference on a
channels-last input (a DenseNet's pre-activations after its Concats).

Why: at 2 threads it ran on the calling thread (numpy's multiply and add) while the workers
idled: ~8% of the DenseNet-style blocks' 1-thread run. Each element is rounded after the
multiply and again after the add, as numpy's two passes do (no fused multiply-add: the IR
has no ``contract`` flag): the numpy path's bits, on any split. With Relu after
(``relu=True``: the layout level's FusedBatchNormalization, a DenseNet's BatchNormalization
+ Relu) the Relu is applied in the same pass, as onnxrun's Relu computes it.
"""

from __future__ import annotations

import ctypes

import numpy as np

from ..parallel import work_ranges
from . import ir, jit, spin
from .jit import address

REQUIRES = ()  # generic vector IR: every target
# Elements a range needs before it goes to another thread (~30-50 us of one core's work, the
# pools' measured range, against a hand-off of a few microseconds to a spinning worker)
MIN_ELEMENTS_PER_RANGE = 1 << 16
_V8 = "<8 x float>"
_ARGS = ("ptr", "ptr", "ptr", "ptr", "i64", "i64", "i64", "i64", "i64")


def module_ir(target=None) -> str:
    """``@scale_shift(x, a, b, y, C, r0, r1, xs, ys)``: y[r, c] = x[r, c] * a[c] + b[c] for
    rows r in [r0, r1) of C contiguous floats each, x's rows ``xs`` floats apart and y's
    ``ys`` (a range of a wider buffer's channels: a DenseNet's BatchNormalization reads the
    first channels of the next Concat's output), 8 channels a step, then the rest;
    ``@scale_shift_relu`` the same followed by Relu as onnxrun's Relu computes it (np.clip
    to [0, inf]: NaN and -0.0 kept), and a ``_job`` of each on an argument block."""
    return "\n".join(_function("scale_shift", False) + _function("scale_shift_relu", True)
                     + ir.job("scale_shift_job", "scale_shift", _ARGS)
                     + ir.job("scale_shift_relu_job", "scale_shift_relu", _ARGS))


def _relu(name: str, ty: str, x: str, zero: str, mask: str) -> list[str]:
    """``name`` = x where x >= 0 or x is NaN (-0.0 kept), else +0.0: np.clip(x, 0, inf)."""
    return [f"  {name}.g = fcmp uge {ty} {x}, {zero}",
            f"  {name} = select {mask} {name}.g, {ty} {x}, {ty} {zero}"]


def _function(name: str, relu: bool) -> list[str]:
    vy, ty = "%s", "%ts"
    vec = [f"  %m = fmul {_V8} %xv, %av", f"  %s = fadd {_V8} %m, %bv"]
    one = ["  %tm = fmul float %tx, %ta", "  %ts = fadd float %tm, %tb"]
    if relu:
        vec += _relu("%sr", _V8, "%s", "zeroinitializer", "<8 x i1>")
        one += _relu("%tsr", "float", "%ts", "0.0", "i1")
        vy, ty = "%sr", "%tsr"
    return [f"define void @{name}(ptr noalias %x, ptr noalias %a, ptr noalias %b, "
            "ptr noalias %y, i64 %C, i64 %r0, i64 %r1, i64 %xs, i64 %ys) nounwind {",
            "entry:",
            "  %c8 = and i64 %C, -8",
            "  %any = icmp slt i64 %r0, %r1",
            "  br i1 %any, label %row, label %end",
            "row:",
            "  %r = phi i64 [%r0, %entry], [%rn, %rnext]",
            "  %xoff = mul i64 %r, %xs",
            "  %yoff = mul i64 %r, %ys",
            "  %xr = getelementptr float, ptr %x, i64 %xoff",
            "  %yr = getelementptr float, ptr %y, i64 %yoff",
            "  %anyv = icmp sgt i64 %c8, 0",
            "  br i1 %anyv, label %vloop, label %vdone",
            "vloop:",
            "  %i = phi i64 [0, %row], [%in, %vloop]",
            "  %xp = getelementptr float, ptr %xr, i64 %i",
            f"  %xv = load {_V8}, ptr %xp, align 4",
            "  %ap = getelementptr float, ptr %a, i64 %i",
            f"  %av = load {_V8}, ptr %ap, align 4",
            "  %bp = getelementptr float, ptr %b, i64 %i",
            f"  %bv = load {_V8}, ptr %bp, align 4",
            *vec,
            "  %yp = getelementptr float, ptr %yr, i64 %i",
            f"  store {_V8} {vy}, ptr %yp, align 4",
            "  %in = add i64 %i, 8",
            "  %more = icmp slt i64 %in, %c8",
            "  br i1 %more, label %vloop, label %vdone",
            "vdone:",
            "  %anyt = icmp slt i64 %c8, %C",
            "  br i1 %anyt, label %tloop, label %rnext",
            "tloop:",
            "  %j = phi i64 [%c8, %vdone], [%jn, %tloop]",
            "  %txp = getelementptr float, ptr %xr, i64 %j",
            "  %tx = load float, ptr %txp, align 4",
            "  %tap = getelementptr float, ptr %a, i64 %j",
            "  %ta = load float, ptr %tap, align 4",
            "  %tbp = getelementptr float, ptr %b, i64 %j",
            "  %tb = load float, ptr %tbp, align 4",
            *one,
            "  %typ = getelementptr float, ptr %yr, i64 %j",
            f"  store float {ty}, ptr %typ, align 4",
            "  %jn = add i64 %j, 1",
            "  %tmore = icmp slt i64 %jn, %C",
            "  br i1 %tmore, label %tloop, label %rnext",
            *ir.row_loop_end("%row")]


_JOB = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


def _module() -> jit.Module:
    return jit.compile_module("scale_shift", module_ir,
                              {"scale_shift_job": _JOB, "scale_shift_relu_job": _JOB}, REQUIRES)


def unavailable() -> str | None:
    """None when the kernel runs here, else why not."""
    return jit.why_unavailable(REQUIRES) or jit.why_not_loaded("scale_shift", _module)


def scale_shift(src: np.ndarray, a: np.ndarray, b: np.ndarray, dst: np.ndarray,
                threads: int, relu: bool = False) -> bool:
    """dst = src * a + b (``relu``: then Relu) for (rows, C) float32 ``src`` and ``dst``
    (rows of C contiguous floats, any stride apart) and (C,) ``a``, ``b``: in ranges of rows
    on the calling thread and spin.py's workers where worth at least two ranges on
    ``threads`` threads, else in one call here (one pass where numpy's path takes two and
    tiles a and b: 3x faster at 1 thread, DenseNet's 224 x 56 x 56 221 -> 69 us); False
    (nothing done) where the kernel does not run or the operands do not fit it."""
    if src.ndim != 2 or src.dtype != np.float32 or dst.dtype != np.float32 or \
            dst.shape != src.shape or not (_rows(src) and _rows(dst)) or \
            np.may_share_memory(src, dst) or unavailable() is not None:
        return False
    rows, C = src.shape
    a = np.ascontiguousarray(a, np.float32).reshape(-1)
    b = np.ascontiguousarray(b, np.float32).reshape(-1)
    if a.size != C or b.size != C:
        return False
    ranges = [(0, rows)]
    if threads > 1 and src.size >= 2 * MIN_ELEMENTS_PER_RANGE and spin.usable() is not None:
        ranges = work_ranges(rows, threads, C, least=MIN_ELEMENTS_PER_RANGE)
    head = (address(src), address(a), address(b), address(dst), C)
    steps = (src.strides[0] // 4, dst.strides[0] // 4)
    blocks = np.array([head + (r0, r1) + steps for r0, r1 in ranges], np.int64)
    module = _module()
    job = module.scale_shift_relu_job if relu else module.scale_shift_job
    if len(ranges) == 1:
        job(address(blocks))
    else:
        spin.run_blocks(job, blocks, threads)
    return True


def _rows(x: np.ndarray) -> bool:
    """Rows of contiguous floats, a whole number of floats apart, not overlapping."""
    return x.strides[1] == 4 and x.strides[0] % 4 == 0 and \
        (x.shape[0] <= 1 or x.strides[0] >= 4 * x.shape[1])


# compiled with the other kernels on first use (jit._BUNDLE)
BUNDLE = {"scale_shift": (module_ir, REQUIRES)}

__all__ = ["BUNDLE", "MIN_ELEMENTS_PER_RANGE", "module_ir", "scale_shift", "unavailable"]
