"""float32 GELU with its bias, in one pass: y = s / (1 + 2^(s * P(s^2))), s = x + bias[column].

Why: the numpy path (``ops.elementwise.gelu_float32``) takes 18 passes over each block for the
same formula (its polynomial, exp2, the division), and in BERT the BiasGelu after the up
projection of each layer took 16% of a MiniLM run (82 of 505 ms of kernel time at 1 thread,
2 x 128 tokens) — as much as a third of that layer's GEMMs. Here each 16-float chunk stays in
registers from load to store.

The formula is the numpy path's, constant for constant (``ops.elementwise._GELU_LOGIT``, given
by the caller: gelu(x) = x / (1 + 2^(x P(x^2))), within 6.2e-7 of gelu), with exp2 here: 2^p =
2^n * 2^f, n = rint(p), |f| <= 1/2, 2^f by its Taylor series to f^7 (relative error < 1e-8),
2^n applied as one exponent-bit factor, p clamped to [-125, 128] first (below, 1 + 2^p is 1
anyway, and no factor or product is subnormal; 2^128 is inf, so the quotient is -0 where gelu
vanishes). The polynomial's Horner steps are fused multiply-adds (numpy's path rounds each
product: the last bits differ). A NaN stays NaN; +inf gives +inf, -inf NaN, as numpy's exp2
and division give on the numpy path.

A polynomial of degree 0 (one coefficient c) makes the same pass x / (1 + 2^(c x)) = x *
sigmoid(-c ln(2) x): SiLU and QuickGelu (``quick_gelu``: c = -alpha log2(e)), which YOLO-style
detectors apply after every convolution (a sixth of such a model's run on the numpy path:
negate, exp, add, reciprocal, multiply, each a pass and most a temporary). +inf gives +inf,
-inf NaN (-inf * 0), a NaN NaN, as x * sigmoid(alpha x) does on the numpy path.
"""

from __future__ import annotations

import ctypes
import math
import zlib

import numpy as np

from ..gelu_polynomial import GELU_LOGIT
from ..parallel import work_ranges
from . import ir, jit, spin
from .jit import address

_V, _VF = ir.V, ir.VF


def _c(x: float) -> str:
    return ir._vconst(x)


def body_ir(coeffs, VT: str, p: str, const) -> list[str]:
    """``%{p}.y`` = s / (1 + 2^(s P(s^2))) of ``%{p}.s`` (type ``VT``: a float vector of any
    width, or "float"); ``const(x)``: a constant of that type. The one body of the standalone
    BiasGelu (16 lanes) and the float GEMM's GELU epilogue (its tile's width, "float" for a
    row's last columns): per element the same operations, so the same bits."""
    if VT == "float":
        sfx, IT, ic = "f32", "i32", str
    else:
        lanes = int(VT[1:VT.index(" ")])
        sfx, IT = f"v{lanes}f32", f"<{lanes} x i32>"

        def ic(v: int) -> str:
            return "<" + ", ".join([f"i32 {v}"] * lanes) + ">"
    t = f"%{p}."
    if len(coeffs) == 1:  # a constant: p = c s (SiLU, QuickGelu)
        L = [f"  {t}p = fmul {VT} {t}s, {const(float(coeffs[0]))}"]
    else:
        L = [f"  {t}t = fmul {VT} {t}s, {t}s"]
        prev = const(float(coeffs[0]))  # Horner: (((c0 t + c1) t + c2) ... ) t + c6, fused
        for k, a in enumerate(coeffs[1:], 1):
            L.append(f"  {t}h{k} = call {VT} @llvm.fma.{sfx}({VT} {prev}, {VT} {t}t, "
                     f"{VT} {const(float(a))})")
            prev = f"{t}h{k}"
        L.append(f"  {t}p = fmul {VT} {prev}, {t}s")
    # 2^p: clamp (a NaN p comes from a NaN s, which the division keeps), split, scale. Below
    # -125, 1 + 2^p is 1 all the same; from there 2^n is a normal factor (one whose product
    # were subnormal would cost a microcode assist), 2^128 is inf
    L += [f"  {t}pl = call {VT} @llvm.maxnum.{sfx}({VT} {t}p, {VT} {const(-125.0)})",
          f"  {t}pc = call {VT} @llvm.minnum.{sfx}({VT} {t}pl, {VT} {const(128.0)})",
          f"  {t}nf = call {VT} @llvm.rint.{sfx}({VT} {t}pc)",
          f"  {t}f = fsub {VT} {t}pc, {t}nf",
          f"  {t}g = fmul {VT} {t}f, {const(math.log(2))}"]
    taylor = [1 / math.factorial(k) for k in range(7, 0, -1)]  # e^g to g^7, Horner
    prev = const(taylor[0])
    for k, a in enumerate(taylor[1:], 1):
        L.append(f"  {t}e{k} = call {VT} @llvm.fma.{sfx}({VT} {prev}, {VT} {t}g, "
                 f"{VT} {const(a)})")
        prev = f"{t}e{k}"
    return L + [
        f"  {t}ef = call {VT} @llvm.fma.{sfx}({VT} {prev}, {VT} {t}g, {VT} {const(1.0)})",
        f"  {t}ni = fptosi {VT} {t}nf to {IT}",
        f"  {t}nb = add {IT} {t}ni, {ic(127)}",  # n in [-125, 128]: 2^128's bits are inf's
        f"  {t}ns = shl {IT} {t}nb, {ic(23)}",
        f"  {t}sc = bitcast {IT} {t}ns to {VT}",
        f"  {t}ex = fmul {VT} {t}ef, {t}sc",
        f"  {t}den = fadd {VT} {t}ex, {const(1.0)}",
        f"  {t}y = fdiv {VT} {t}s, {t}den"]


def _kernel(coeffs: list[float], name: str = "bias_gelu") -> str:
    """``@<name>``: rows [r0, r1) of width ``%n``; the bias (``%n`` floats) added along the
    row; x and y rows ``%n`` floats apart (y may be x)."""
    L = [f"define void @{name}(ptr %X, ptr %bias, ptr %Y, i64 %n, i64 %r0, i64 %r1) nounwind {{",
         "entry:",
         "  %anyr = icmp slt i64 %r0, %r1",
         "  %anyc = icmp sgt i64 %n, 0",
         "  %any = and i1 %anyr, %anyc",
         "  br i1 %any, label %rloop, label %end",
         "rloop:",
         "  %r = phi i64 [%r0, %entry], [%rn, %rnext]",
         "  %row = mul i64 %r, %n",
         "  br label %loop",
         "loop:",
         "  %i = phi i64 [0, %rloop], [%in, %next]",
         "  %left = sub i64 %n, %i",
         "  %left.c = icmp sgt i64 %left, 16",
         "  %left16 = select i1 %left.c, i64 16, i64 %left",
         *ir.lane_mask("%mask", "%left16"),
         "  %at = add i64 %row, %i",
         "  %xp = getelementptr float, ptr %X, i64 %at",
         "  %bp = getelementptr float, ptr %bias, i64 %i",
         # plain loads for a whole chunk, masked ones for the row's last, partial chunk
         # (a masked load costs more: (128, 512) 34.4 -> 30.7 us a call)
         "  %full = icmp eq i64 %left16, 16",
         "  br i1 %full, label %ldf, label %ldm",
         "ldf:",
         f"  %xf = load {_VF}, ptr %xp, align 4",
         f"  %bf = load {_VF}, ptr %bp, align 4",
         "  br label %ld",
         "ldm:",
         f"  %xm = call {_VF} @llvm.masked.load.v16f32.p0(ptr %xp, i32 4, <16 x i1> %mask, "
         f"{_VF} zeroinitializer)",
         f"  %bm = call {_VF} @llvm.masked.load.v16f32.p0(ptr %bp, i32 4, <16 x i1> %mask, "
         f"{_VF} zeroinitializer)",
         "  br label %ld",
         "ld:",
         f"  %x = phi {_VF} [%xf, %ldf], [%xm, %ldm]",
         f"  %b = phi {_VF} [%bf, %ldf], [%bm, %ldm]",
         f"  %g.s = fadd {_VF} %x, %b",
         *body_ir(coeffs, _VF, "g", _c)]
    L += ["  %yp = getelementptr float, ptr %Y, i64 %at",
          # a masked store only for the row's last, partial chunk: on AMD it is microcoded
          "  br i1 %full, label %st, label %stm",
          "st:",
          f"  store {_VF} %g.y, ptr %yp, align 4",
          "  br label %next",
          "stm:",
          f"  call void @llvm.masked.store.v16f32.p0({_VF} %g.y, ptr %yp, i32 4, <16 x i1> %mask)",
          "  br label %next",
          "next:",
          "  %in = add i64 %i, 16",
          "  %more = icmp slt i64 %in, %n",
          "  br i1 %more, label %loop, label %rnext",
          "rnext:",
          "  %rn = add i64 %r, 1",
          "  %rmore = icmp slt i64 %rn, %r1",
          "  br i1 %rmore, label %rloop, label %end",
          "end:",
          "  ret void",
          "}"]
    return "\n".join(L)


def module_ir(coeffs, name: str = "bias_gelu") -> str:
    """Generic 16-lane IR (the same for every target: LLVM splits it on 8-lane ones) for the
    polynomial ``coeffs`` (highest degree first: the numpy path's, which is their home)."""
    decls = ir.declarations("load.f32", "store.f32", "fma", "rint", "minnum", "maxnum")
    # @<name>_job: the same on an argument block, a range of rows per spin.py worker
    job = ir.job(f"{name}_job", name, ("ptr", "ptr", "ptr", "i64", "i64", "i64"))
    return "\n\n".join(["\n".join(decls), _kernel([float(c) for c in coeffs], name),
                         "\n".join(job)])


_P, _I = ctypes.c_void_p, ctypes.c_int64
_PROTO = ctypes.CFUNCTYPE(None, _P, _P, _P, _I, _I, _I)
_JOB = ctypes.CFUNCTYPE(None, _P)
# elements per range of bias_gelu on the intra-op threads (~30-60 us of work on one AVX2 core):
# a smaller product is not worth a hand-off to a worker that may be asleep
_GELU_RANGE = 1 << 15


def _module_name(coeffs) -> str:
    """The module of a polynomial: one per polynomial (a process may run Gelu and FastGelu)."""
    key = np.asarray(coeffs, np.float32).tobytes()
    name = _NAMES.get(key)
    if name is None:
        name = _NAMES[key] = f"bias_gelu_{zlib.crc32(key):08x}_{len(coeffs)}"
    return name


_NAMES: dict[bytes, str] = {np.asarray(GELU_LOGIT, np.float32).tobytes(): "bias_gelu"}


def _module(coeffs) -> jit.Module:
    return jit.compile_module(_module_name(coeffs), lambda target: module_ir(coeffs),
                              {"bias_gelu": _PROTO, "bias_gelu_job": _JOB})


def unavailable(coeffs) -> str | None:
    """None when the kernel can run here (its object loaded), else why not."""
    return jit.why_unavailable() or jit.why_not_loaded(_module_name(coeffs),
                                                       lambda: _module(coeffs))


def module(coeffs) -> jit.Module | None:
    """The kernel's module for ``coeffs``, or None where it does not run here: for a caller
    that takes it once (a Gelu node, when prepared) instead of both lookups at every call
    (~15-20 us of a (128, 512) call's 55)."""
    return _module(coeffs) if unavailable(coeffs) is None else None


def bias_gelu(coeffs, x: np.ndarray, bias: np.ndarray | None = None,
              out: np.ndarray | None = None, threads: int = 1,
              kernel: jit.Module | None = None) -> np.ndarray:
    """gelu(x + bias) of a C-contiguous float32 ``x`` (``bias``: one float per element of the
    last axis, or None), into ``out`` (C-contiguous, x's shape; may be ``x``; new if None);
    ``coeffs``: the polynomial of ``ops.elementwise``'s gelu; ``kernel``: ``module(coeffs)``
    where the caller holds it."""
    if x.dtype != np.float32 or not x.flags.c_contiguous:
        raise ValueError("bias_gelu: expected a C-contiguous float32 array")
    width = x.shape[-1] if x.ndim else 1
    if bias is None:
        bias = np.zeros(width, np.float32)
    bias = np.ascontiguousarray(bias, np.float32).reshape(-1)
    if bias.size != width:
        raise ValueError(f"bias_gelu: the bias has {bias.size} values, the last axis {width}")
    if out is None:
        out = np.empty(x.shape, np.float32)
    elif out.shape != x.shape or out.dtype != np.float32 or not out.flags.c_contiguous:
        raise ValueError(f"bias_gelu: out must be a C-contiguous float32 {list(x.shape)}")
    if x.size == 0:
        return out
    kernel = kernel or _module(coeffs)
    rows = x.size // width
    args = [address(x), address(bias), address(out), width]
    ranges = work_ranges(rows, threads, width, least=_GELU_RANGE) if threads > 1 else ()
    if len(ranges) > 1:  # on spin.py's workers (one spinning since the product before)
        spin.run_blocks(kernel.bias_gelu_job, np.array([args + [r0, r1] for r0, r1 in ranges],
                                                        np.int64), threads)
    else:
        kernel.bias_gelu(*args, 0, rows)
    return out


_SILU_CHUNK = 4096  # floats per kernel row: the bias row of zeros it reads stays this short


def _silu_module(alpha: float) -> jit.Module:
    c = float(np.float32(-alpha * math.log2(math.e)))
    return jit.compile_module(f"silu_{np.float32(alpha).view(np.uint32):08x}",
                              lambda target: module_ir([c], "silu"),
                              {"silu": _PROTO, "silu_job": _JOB})


def silu_unavailable(alpha: float = 1.0) -> str | None:
    """None when ``quick_gelu`` can run here for ``alpha``, else why not."""
    return jit.why_unavailable() or jit.why_not_loaded(
        f"silu_{np.float32(alpha).view(np.uint32):08x}", lambda: _silu_module(alpha))


_ZEROS = np.zeros(_SILU_CHUNK, np.float32)


def silu_function(alpha: float = 1.0):
    """The compiled function quick_gelu runs for ``alpha`` (a kernel takes it once, when it is
    prepared: looking the module up costs more than a decode step's SiLU)."""
    return _silu_module(alpha).silu


def quick_gelu(x: np.ndarray, alpha: float = 1.0, out: np.ndarray | None = None,
               threads: int = 1, fn=None) -> np.ndarray:
    """x * sigmoid(alpha x) of a 1-D contiguous float32 ``x`` into ``out`` (1-D, x's size;
    may be ``x``; new if None): SiLU at alpha 1, QuickGelu's default 1.702. ``fn``:
    silu_function(alpha), when the caller holds it."""
    if x.ndim != 1:
        raise ValueError("quick_gelu: expected a 1-D contiguous float32 array")
    if fn is None:
        fn = _silu_module(alpha).silu
    out = jit.elementwise_out("quick_gelu", x, out)
    xa, za, ya = address(x), address(_ZEROS), address(out)
    # rows of _SILU_CHUNK (the bias row of zeros is that long), then the short last one
    whole, rest = divmod(x.size, _SILU_CHUNK)
    ranges = work_ranges(whole, threads, _SILU_CHUNK, least=_GELU_RANGE)
    if len(ranges) > 1:  # taken in turn by the caller and spin.py's workers
        spin.run_blocks(_silu_module(alpha).silu_job, np.array(
            [(xa, za, ya, _SILU_CHUNK, r0, r1) for r0, r1 in ranges], np.int64), threads)
    elif whole:
        fn(xa, za, ya, _SILU_CHUNK, 0, whole)
    if rest:
        at = 4 * (x.size - rest)
        fn(xa + at, za, ya + at, rest, 0, 1)
    return out


__all__ = ["bias_gelu", "module", "module_ir", "quick_gelu", "silu_function", "silu_unavailable",
           "unavailable"]
