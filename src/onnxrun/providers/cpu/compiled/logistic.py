"""The logistic function as MLAS computes it on x86-64 (MlasComputeLogistic's FMA3 kernel,
onnxruntime's Sigmoid and QuickGelu), operation for operation, so that the results are
onnxruntime's bit for bit: x clamped to [-18, 18], p = x * (odd polynomial of degree 9),
q = even polynomial of degree 10 (Horner's rule in x^2 with fused multiply-adds), p / q + 0.5,
then max(0, .). An LLM's SiLU output feeds an int8-quantized product, where a last-bit
difference grows (compiled/nbits_gemm.py).

quick_gelu: x * logistic(alpha * x), alpha * x rounded first (onnxruntime's QuickGelu; SiLU
at alpha 1)."""

from __future__ import annotations

import ctypes

import numpy as np

from ..parallel import work_ranges
from . import ir, jit, spin

REQUIRES = ("avx2", "fma")

# MLAS's constants (logistic.cpp, those of Eigen's logistic): lower and upper range,
# alpha_9 .. alpha_1, beta_10 .. beta_0
_LOWER, _UPPER = -18.0, 18.0
_ALPHA = (4.37031012579801e-11, 1.15627324459942e-07, 6.08574864600143e-05,
          8.51377133304701e-03, 2.48287947061529e-01)
_BETA = (6.10247389755681e-13, 5.76102136993427e-09, 6.29106785017040e-06,
         1.70198817374094e-03, 1.16817656904453e-01, 9.93151921023180e-01)

_VF = "<8 x float>"


def _c(x: float) -> str:
    """A float32 constant as LLVM IR writes it (the double with the float32's value)."""
    return f"0x{np.float64(np.float32(x)).view(np.uint64):016X}"


def body_ir(ty: str, v: str, splat) -> list[str]:
    """Instructions computing %{v}.out = x * logistic(alpha * x) (where ``%mul``) or
    logistic(x) from %{v}.x and %{v}.alpha (type ``ty``: float or <W x float>; each lane's
    operations the same whatever W: the same bits); ``splat(c)`` writes a constant of that
    type. Also the float GEMM's epilogue (float_gemm.py: a convolution's fused Sigmoid or
    SiLU)."""
    lanes = int(ty[1:].split()[0]) if ty.startswith("<") else 0
    fma = f"@llvm.fma.v{lanes}f32" if lanes else "@llvm.fma.f32"
    mask = f"<{lanes} x i1>" if lanes else "i1"
    L = [f"  %{v}.ax = fmul {ty} %{v}.x, %{v}.alpha",
         f"  %{v}.a = select i1 %mul, {ty} %{v}.ax, {ty} %{v}.x",
         # vmaxps(lower, x): lower where lower > x, else x (a NaN goes through)
         f"  %{v}.lt = fcmp ogt {ty} {splat(_LOWER)}, %{v}.a",
         f"  %{v}.c0 = select {mask} %{v}.lt, {ty} "
         f"{splat(_LOWER)}, {ty} %{v}.a",
         f"  %{v}.gt = fcmp olt {ty} {splat(_UPPER)}, %{v}.c0",
         f"  %{v}.c = select {mask} %{v}.gt, {ty} "
         f"{splat(_UPPER)}, {ty} %{v}.c0",
         f"  %{v}.x2 = fmul {ty} %{v}.c, %{v}.c",
         f"  %{v}.p1 = call {ty} {fma}({ty} %{v}.x2, {ty} {splat(_ALPHA[0])}, {ty} "
         f"{splat(_ALPHA[1])})"]
    for i, a in enumerate(_ALPHA[2:], 2):
        L.append(f"  %{v}.p{i} = call {ty} {fma}({ty} %{v}.x2, {ty} %{v}.p{i - 1}, {ty} "
                 f"{splat(a)})")
    L.append(f"  %{v}.q1 = call {ty} {fma}({ty} %{v}.x2, {ty} {splat(_BETA[0])}, {ty} "
             f"{splat(_BETA[1])})")
    for i, b in enumerate(_BETA[2:], 2):
        L.append(f"  %{v}.q{i} = call {ty} {fma}({ty} %{v}.x2, {ty} %{v}.q{i - 1}, {ty} "
                 f"{splat(b)})")
    np_, nq = len(_ALPHA) - 1, len(_BETA) - 1
    L += [f"  %{v}.p = fmul {ty} %{v}.c, %{v}.p{np_}",
          f"  %{v}.r0 = fdiv {ty} %{v}.p, %{v}.q{nq}",
          f"  %{v}.r1 = fadd {ty} %{v}.r0, {splat(0.5)}",
          # vmaxps(0, r): 0 where 0 > r, else r
          f"  %{v}.neg = fcmp ogt {ty} {splat(0.0)}, %{v}.r1",
          f"  %{v}.r = select {mask} %{v}.neg, {ty} "
          f"{splat(0.0)}, {ty} %{v}.r1",
          f"  %{v}.xr = fmul {ty} %{v}.x, %{v}.r",
          f"  %{v}.out = select i1 %mul, {ty} %{v}.xr, {ty} %{v}.r"]
    return L


def module_ir(target=None) -> str:
    """logistic(x, y, n, alpha, mul): y[i] = logistic(x[i]) (mul 0), or x[i] *
    logistic(alpha * x[i]) (mul 1), for i < n; 8 at a time, the rest one by one (the same
    operations)."""
    def vec(c):
        return "<" + ", ".join([f"float {_c(c)}"] * 8) + ">"

    def sc(c):
        return _c(c)

    L = ["define void @logistic(ptr noalias %x, ptr noalias %y, i64 %n, float %alpha, "
         "i64 %mulflag) nounwind {",
         "entry:",
         "  %mul = icmp ne i64 %mulflag, 0",
         f"  %va.0 = insertelement {_VF} poison, float %alpha, i64 0",
         f"  %v.alpha = shufflevector {_VF} %va.0, {_VF} poison, <8 x i32> zeroinitializer",
         "  %s.alpha = fadd float %alpha, 0.0",
         "  %n8 = and i64 %n, -8",
         "  %any8 = icmp sgt i64 %n8, 0",
         "  br i1 %any8, label %vloop, label %vdone",
         "vloop:",
         "  %i = phi i64 [0, %entry], [%i.next, %vloop]",
         "  %xp = getelementptr float, ptr %x, i64 %i",
         f"  %v.x = load {_VF}, ptr %xp, align 4",
         *body_ir(_VF, "v", vec),
         "  %yp = getelementptr float, ptr %y, i64 %i",
         f"  store {_VF} %v.out, ptr %yp, align 4",
         "  %i.next = add i64 %i, 8",
         "  %more = icmp slt i64 %i.next, %n8",
         "  br i1 %more, label %vloop, label %vdone",
         "vdone:",
         "  %anyr = icmp slt i64 %n8, %n",
         "  br i1 %anyr, label %sloop, label %end",
         "sloop:",
         "  %j = phi i64 [%n8, %vdone], [%j.next, %sloop]",
         "  %sxp = getelementptr float, ptr %x, i64 %j",
         "  %s.x = load float, ptr %sxp, align 4",
         *body_ir("float", "s", sc),
         "  %syp = getelementptr float, ptr %y, i64 %j",
         "  store float %s.out, ptr %syp, align 4",
         "  %j.next = add i64 %j, 1",
         "  %smore = icmp slt i64 %j.next, %n",
         "  br i1 %smore, label %sloop, label %end",
         "end:",
         "  ret void",
         "}",
         f"declare {_VF} @llvm.fma.v8f32({_VF}, {_VF}, {_VF})",
         "declare float @llvm.fma.f32(float, float, float)",
         # @logistic_job: the same on an argument block (alpha's float32 bits in its word's
         # low half), a range of elements per spin.py worker
         *ir.job("logistic_job", "logistic", ("ptr", "ptr", "i64", "float", "i64"))]
    return "\n".join(L)


_PROTO = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                          ctypes.c_float, ctypes.c_int64)
_JOB = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


def _module() -> jit.Module:
    return jit.compile_module("logistic", module_ir,
                              {"logistic": _PROTO, "logistic_job": _JOB}, REQUIRES)


def unavailable() -> str | None:
    """None when the kernel runs here, else why not. Sigmoid asks at every call (the choice
    follows compiled.disabled() / forced targets at run time): both answers are remembered
    per switch state (jit._answers), so that is two dictionary lookups."""
    return jit.why_unavailable(REQUIRES) or jit.why_not_loaded("logistic", _module)


# Elements a range needs before it goes to another thread (~10-20 us of one AVX2 core's
# work, against a hand-off of a few microseconds to spin.py's spinning worker); below two
# ranges' worth, one pass on the calling thread
_CHUNK = 1 << 15


def function():
    """The compiled function (a kernel takes it once, when it is prepared)."""
    return _module().logistic


def _apply(x: np.ndarray, out: np.ndarray | None, alpha: float, mul: int, threads: int,
           fn=None) -> np.ndarray:
    if fn is None:
        fn = _module().logistic
    if out is None and 0 < x.size < 2 * _CHUNK and x.dtype == np.float32 and \
            x.flags.c_contiguous:  # one pass on this thread (a decode step's): no driver
        out = np.empty(x.shape, np.float32)
        fn(jit.address(x), jit.address(out), x.size, alpha, mul)
        return out
    # whole vectors of 8 a range, taken in turn by the caller and spin.py's workers: each
    # element's operations are the same on any thread (the same bits)
    ranges = work_ranges(-(-x.size // 8), threads, 8, least=_CHUNK)
    out = jit.elementwise_out("logistic", x, out)
    xa, ya, n = jit.address(x), jit.address(out), x.size
    if len(ranges) == 1:
        if n:
            fn(xa, ya, n, alpha, mul)
        return out
    bits = int(np.float32(alpha).view(np.int32))
    spin.run_blocks(_module().logistic_job, np.array(
        [(xa + 32 * a, ya + 32 * a, min(8 * b, n) - 8 * a, bits, mul) for a, b in ranges],
        np.int64), threads)
    return out


def sigmoid(x: np.ndarray, out: np.ndarray | None = None, threads: int = 1) -> np.ndarray:
    """MLAS's logistic of a contiguous float32 array (into ``out``, which may be ``x``)."""
    return _apply(x, out, 1.0, 0, threads)


def quick_gelu(x: np.ndarray, alpha: float = 1.0, out: np.ndarray | None = None,
               threads: int = 1, fn=None) -> np.ndarray:
    """x * logistic(alpha x) of a contiguous float32 array as onnxruntime's QuickGelu;
    ``fn``: function(), when the caller holds it."""
    return _apply(x, out, float(np.float32(alpha)), 1, threads, fn)


BUNDLE = {"logistic": (module_ir, REQUIRES)}

__all__ = ["BUNDLE", "REQUIRES", "body_ir", "function", "module_ir", "quick_gelu", "sigmoid",
           "unavailable"]
