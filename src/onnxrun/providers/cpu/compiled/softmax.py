"""float32 softmax over the last axis, a row at a time: its maximum, exp(x - max) stored with
their sum, then each times 1 / sum: three passes over a row that stays in L1.

Why: the numpy path (``ops.activation``'s Softmax) is five passes with temporaries (the
maximum, the difference, exp, the sum, the product), 4-5x onnxruntime's time on the
attention scores of transformer recognizers (SVTR-tiny-style: 1898 against 434 us a run, its
(4, 128, 128) and (2, 256, 256) scores) and of any model whose attention is not fused.

exp(t), t = x - max <= 0: n = rint(t log2(e)), r = t - n ln(2) in two parts (Cody and
Waite: |r| <= ln(2)/2, exactly), e^r by its Taylor series to r^7 (relative error < 1e-8),
times 2^n from its exponent bits. Below max(-86, ln(FLT_MIN * 2^b)), 2^b > the row's length,
the result is 0, so that every exponential and every share of the sum is normal: no lane is
ever subnormal (each operation producing one is a microcode assist: 2x the time on attention
scores with a wide spread). Within ~2 ulp of numpy's exp elsewhere; the sum runs in 16 lanes
(numpy's in another order): results agree with the numpy path to float32 rounding (what is
dropped is under 1e-35 of a probability), not bit for bit. A NaN anywhere in
a row makes the row NaN, as do an infinite maximum (inf - inf) and a row of -inf, as on the
numpy path.
"""

from __future__ import annotations

import ctypes
import math

import numpy as np

from ..parallel import work_ranges
from . import ir, jit, spin
from .jit import address

REQUIRES = ()  # generic 16-lane IR (LLVM splits it on 8-lane targets)
_VF, _V = ir.VF, ir.V
# exp(t) is 0 for t below ln(FLT_MIN * 2^b), 2^b > n the row's length (at least _LOWEST):
# every exp then is normal and so is its share, exp(t) / sum >= exp(t) / n, and no lane ever
# holds a subnormal, each operation on which is a microcode assist (SVTR's (2, 256, 256)
# attention scores, a few percent of them in that band: 122 against 77 us a call on the
# AVX-512 EPYC). What is dropped is under 1e-35 of a probability (row of 256: below
# exp(-81.1)): nothing float32 rounding of the larger shares would show.
_LOWEST = -86.0
_LN_FLT_MIN = math.log(float(np.finfo(np.float32).tiny))


def _c(x: float) -> str:
    return ir._vconst(x)


def _exp(t: str, out: str, low: str) -> list[str]:
    """%{out} = exp(%{t}) for t <= 0, 0 below the vector %{low} (>= _LOWEST; NaN kept)."""
    taylor = [1 / math.factorial(k) for k in range(7, 0, -1)]  # Horner, r^7 .. r
    ln2_hi = float(np.float32(math.log(2)))
    ln2_lo = math.log(2) - ln2_hi
    L = [f"  {out}.lt = fcmp ogt {_VF} {low}, {t}",  # NaN: false, kept
         f"  {out}.tc = select <16 x i1> {out}.lt, {_VF} {low}, {_VF} {t}",
         f"  {out}.ts = fmul {_VF} {out}.tc, {_c(1 / math.log(2))}",
         f"  {out}.nf = call {_VF} @llvm.rint.v16f32({_VF} {out}.ts)",
         f"  {out}.nn = fneg {_VF} {out}.nf",
         f"  {out}.r0 = call {_VF} @llvm.fma.v16f32({_VF} {out}.nn, {_VF} {_c(ln2_hi)}, "
         f"{_VF} {out}.tc)",
         f"  {out}.r = call {_VF} @llvm.fma.v16f32({_VF} {out}.nn, {_VF} {_c(ln2_lo)}, "
         f"{_VF} {out}.r0)"]
    prev = _c(taylor[0])
    for k, a in enumerate(taylor[1:], 1):
        L.append(f"  {out}.e{k} = call {_VF} @llvm.fma.v16f32({_VF} {prev}, {_VF} {out}.r, "
                 f"{_VF} {_c(a)})")
        prev = f"{out}.e{k}"
    bias = "<" + ", ".join(["i32 127"] * 16) + ">"
    shift = "<" + ", ".join(["i32 23"] * 16) + ">"
    # 2^n as one factor of exponent bits: t >= _LOWEST keeps n >= -125, a normal 2^n
    return L + [
        f"  {out}.p = call {_VF} @llvm.fma.v16f32({_VF} {prev}, {_VF} {out}.r, {_VF} {_c(1.0)})",
        f"  {out}.ni = fptosi {_VF} {out}.nf to {_V}",  # (a NaN's lanes: any n, still NaN)
        f"  {out}.b = add {_V} {out}.ni, {bias}",
        f"  {out}.s = shl {_V} {out}.b, {shift}",
        f"  {out}.f = bitcast {_V} {out}.s to {_VF}",
        f"  {out}.v = fmul {_VF} {out}.p, {out}.f",
        f"  {out} = select <16 x i1> {out}.lt, {_VF} zeroinitializer, {_VF} {out}.v"]


def module_ir(target=None) -> str:
    """``@softmax_rows(x, y, n, r0, r1)``: rows [r0, r1) of ``n`` floats (n >= 1), y = the
    softmax of x's row (y may be x), 16 floats a step, the row's last ones under a mask."""
    neg = _c(-math.inf)
    L = ["define void @softmax_rows(ptr %x, ptr %y, i64 %n, i64 %r0, i64 %r1) nounwind {",
         "entry:",
         # exp's lower bound: ln(FLT_MIN) + b ln(2), 2^b > n (b: n's bits), at least _LOWEST
         "  %lz = call i64 @llvm.ctlz.i64(i64 %n, i1 false)",
         "  %bits = sub i64 64, %lz",
         "  %bf = sitofp i64 %bits to float",
         f"  %lb = call float @llvm.fma.f32(float %bf, float {ir.float_constant(math.log(2))}, "
         f"float {ir.float_constant(_LN_FLT_MIN)})",
         f"  %lbig = fcmp ogt float %lb, {ir.float_constant(_LOWEST)}",
         f"  %low = select i1 %lbig, float %lb, float {ir.float_constant(_LOWEST)}",
         *ir.splat("%lowv", "%low"),
         "  %any = icmp slt i64 %r0, %r1",
         "  br i1 %any, label %row, label %end",
         "row:",
         "  %r = phi i64 [%r0, %entry], [%rn, %scaled]",
         "  %ro = mul i64 %r, %n",
         "  %xr = getelementptr float, ptr %x, i64 %ro",
         "  %yr = getelementptr float, ptr %y, i64 %ro",
         "  br label %mloop",
         # 1. the row's maximum
         # (a whole chunk's loads are plain ones, the row's last, partial chunk's masked: a
         # masked load costs more)
         "mloop:",
         "  %i = phi i64 [0, %row], [%in, %mld]",
         f"  %m = phi {_VF} [{neg}, %row], [%mn, %mld]",
         "  %left = sub i64 %n, %i",
         *ir.lane_mask("%mask", "%left"),
         "  %xp = getelementptr float, ptr %xr, i64 %i",
         "  %mfull = icmp sge i64 %left, 16",
         "  br i1 %mfull, label %mldf, label %mldm",
         "mldf:",
         f"  %xvf = load {_VF}, ptr %xp, align 4",
         "  br label %mld",
         "mldm:",
         f"  %xvm = call {_VF} @llvm.masked.load.v16f32.p0(ptr %xp, i32 4, <16 x i1> %mask, "
         f"{_VF} {neg})",
         "  br label %mld",
         "mld:",
         f"  %xv = phi {_VF} [%xvf, %mldf], [%xvm, %mldm]",
         f"  %gt = fcmp ogt {_VF} %xv, %m",
         f"  %mn = select <16 x i1> %gt, {_VF} %xv, {_VF} %m",
         "  %in = add i64 %i, 16",
         "  %mmore = icmp slt i64 %in, %n",
         "  br i1 %mmore, label %mloop, label %mdone",
         "mdone:",
         *ir.hsum("%mn", "%mx", "max"),
         *ir.splat("%mv", "%mx"),
         "  br label %eloop",
         # 2. exp(x - max) into y, summed
         "eloop:",
         "  %j = phi i64 [0, %mdone], [%jn, %estore]",
         f"  %sum = phi {_VF} [zeroinitializer, %mdone], [%sumn, %estore]",
         "  %eleft = sub i64 %n, %j",
         *ir.lane_mask("%emask", "%eleft"),
         "  %exp_ = getelementptr float, ptr %xr, i64 %j",
         "  %efull = icmp sge i64 %eleft, 16",
         "  br i1 %efull, label %eldf, label %eldm",
         "eldf:",
         f"  %exf = load {_VF}, ptr %exp_, align 4",
         "  br label %eld",
         "eldm:",
         f"  %exm = call {_VF} @llvm.masked.load.v16f32.p0(ptr %exp_, i32 4, <16 x i1> %emask, "
         f"{_VF} zeroinitializer)",
         "  br label %eld",
         "eld:",
         f"  %ex = phi {_VF} [%exf, %eldf], [%exm, %eldm]",
         f"  %t = fsub {_VF} %ex, %mv",
         *_exp("%t", "%e", "%lowv"),
         f"  %ez = select <16 x i1> %emask, {_VF} %e, {_VF} zeroinitializer",
         f"  %sumn = fadd {_VF} %sum, %ez",
         "  %eyp = getelementptr float, ptr %yr, i64 %j",
         "  br i1 %efull, label %est, label %estm",
         "est:",
         f"  store {_VF} %e, ptr %eyp, align 4",
         "  br label %estore",
         "estm:",  # the row's last, partial chunk (a masked store: microcoded on AMD's AVX2)
         f"  call void @llvm.masked.store.v16f32.p0({_VF} %e, ptr %eyp, i32 4, "
         "<16 x i1> %emask)",
         "  br label %estore",
         "estore:",
         "  %jn = add i64 %j, 16",
         "  %emore = icmp slt i64 %jn, %n",
         "  br i1 %emore, label %eloop, label %edone",
         "edone:",
         *ir.hsum("%sumn", "%total"),
         "  %inv = fdiv float 1.0, %total",
         *ir.splat("%iv", "%inv"),
         "  br label %sloop",
         # 3. each times 1 / sum
         "sloop:",
         "  %k = phi i64 [0, %edone], [%kn, %snext]",
         "  %sleft = sub i64 %n, %k",
         *ir.lane_mask("%smask", "%sleft"),
         "  %syp = getelementptr float, ptr %yr, i64 %k",
         "  %sfull = icmp sge i64 %sleft, 16",
         "  br i1 %sfull, label %sst, label %sstm",
         "sst:",
         f"  %sv = load {_VF}, ptr %syp, align 4",
         f"  %sp = fmul {_VF} %sv, %iv",
         f"  store {_VF} %sp, ptr %syp, align 4",
         "  br label %snext",
         "sstm:",
         f"  %svm = call {_VF} @llvm.masked.load.v16f32.p0(ptr %syp, i32 4, <16 x i1> %smask, "
         f"{_VF} zeroinitializer)",
         f"  %spm = fmul {_VF} %svm, %iv",
         f"  call void @llvm.masked.store.v16f32.p0({_VF} %spm, ptr %syp, i32 4, "
         "<16 x i1> %smask)",
         "  br label %snext",
         "snext:",
         "  %kn = add i64 %k, 16",
         "  %smore = icmp slt i64 %kn, %n",
         "  br i1 %smore, label %sloop, label %scaled",
         "scaled:",
         "  %rn = add i64 %r, 1",
         "  %rmore = icmp slt i64 %rn, %r1",
         "  br i1 %rmore, label %row, label %end",
         "end:",
         "  ret void",
         "}"]
    decls = ir.declarations("load.f32", "store.f32", "fma", "rint") + [
        "declare i64 @llvm.ctlz.i64(i64, i1)", "declare float @llvm.fma.f32(float, float, float)"]
    job = ir.job("softmax_job", "softmax_rows", ("ptr", "ptr", "i64", "i64", "i64"))
    return "\n\n".join(["\n".join(decls), "\n".join(L), "\n".join(job)])


_P, _I = ctypes.c_void_p, ctypes.c_int64
_PROTO = ctypes.CFUNCTYPE(None, _P, _P, _I, _I, _I)
_JOB = ctypes.CFUNCTYPE(None, _P)
# Elements a range needs before it goes to another thread (~15-30 us of one core's work,
# against a hand-off of a few microseconds to a spinning worker)
_CHUNK = 1 << 15


def _module() -> jit.Module:
    return jit.compile_module("softmax", module_ir,
                              {"softmax_rows": _PROTO, "softmax_job": _JOB}, REQUIRES)


def unavailable() -> str | None:
    """None when the kernel runs here, else why not (remembered per switch state)."""
    return jit.why_unavailable(REQUIRES) or jit.why_not_loaded("softmax", _module)


def softmax_last(x: np.ndarray, out: np.ndarray | None = None,
                 threads: int = 1) -> np.ndarray:
    """The softmax of a C-contiguous float32 ``x`` over its last axis (of at least one
    element), into ``out`` (C-contiguous, x's shape; may be ``x``; new if None); rows in
    ranges on spin.py's workers where worth two."""
    if x.dtype != np.float32 or not x.flags.c_contiguous or x.ndim == 0 or x.shape[-1] == 0:
        raise ValueError("softmax_last: expected a C-contiguous float32 array with a last axis")
    out = jit.elementwise_out("softmax_last", x, out)
    n = x.shape[-1]
    rows = x.size // n
    if rows == 0:
        return out
    module = _module()
    xa, ya = address(x), address(out)
    ranges = work_ranges(rows, threads, n, least=_CHUNK) if threads > 1 else [(0, rows)]
    if len(ranges) > 1 and spin.usable() is not None:
        spin.run_blocks(module.softmax_job, np.array(
            [(xa, ya, n, r0, r1) for r0, r1 in ranges], np.int64), threads)
    else:
        module.softmax_rows(xa, ya, n, 0, rows)
    return out


BUNDLE = {"softmax": (module_ir, REQUIRES)}

__all__ = ["BUNDLE", "REQUIRES", "module_ir", "softmax_last", "unavailable"]
