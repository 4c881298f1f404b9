"""Dynamic uint8 quantization of a float32 tensor in one call: range, scale, zero point, codes.

Why: numpy needs about ten calls for it (min, max, scalar arithmetic, divide, round, clip, add,
narrow), which costs ~20 us even on an LSTM's 256-element hidden state at every time step, and
five passes over a transformer's activations before each product. Here it is two passes (range,
then codes) and one ctypes call.

Arithmetic is numpy's and onnxruntime's, step by step in float32:
    lo = min(x.min(), 0), hi = max(x.max(), 0)
    scale = (hi - lo) / 255, or ``flat_scale`` when hi == lo
    zp = rint(clip(0 - lo / scale, 0, 255))
    code = clip(rint(x / scale) + zp, 0, 255)
with rint rounding half to even (the CPU's default mode) and a true division, as numpy.
Generic 16-lane vector IR (two registers on AVX2); the masked tail handles any length.
"""

from __future__ import annotations

import ctypes

import numpy as np

from . import ir, jit
from .jit import address

REQUIRES = ()  # generic vector IR: every target

_VF = ir.VF
_U8_MAX = "<" + ", ".join(["float 255.0"] * 16) + ">"


def _codes(result: str, v: str) -> list[str]:
    """Lines computing the 16 codes ``result`` of the floats ``v`` (scale %sv, zero point %zv):
    clamp(rint(v / scale) + zp, 0, 255); a NaN input gives code 0."""
    return [f"  {result}.q = fdiv {_VF} {v}, %sv",
            *ir.requantize(result, f"{result}.q", "%zv", "zeroinitializer", _U8_MAX)]


def declarations() -> list[str]:
    """What ``functions()`` needs declared, for a module that includes them."""
    return [*ir.declarations("load.f32", "store.i8", "rint", "minnum", "maxnum"),
            f"declare float @llvm.vector.reduce.fmin.v16f32({_VF})",
            f"declare float @llvm.vector.reduce.fmax.v16f32({_VF})",
            "declare i32 @llvm.vector.reduce.add.v16i32(<16 x i32>)",
            "declare float @llvm.rint.f32(float)",
            "declare float @llvm.maxnum.f32(float, float)",
            "declare float @llvm.minnum.f32(float, float)"]


_V8 = "<8 x float>"
_V32 = "<32 x float>"
_F32_MAX = ir.float_constant(float(np.finfo(np.float32).max))
_F32_LOWEST = ir.float_constant(-float(np.finfo(np.float32).max))


def _lanes(kind: str, a: str, b: str, out: str, vector: str) -> list[str]:
    """x86 MAXPS/MINPS lane by lane: ``a > b ? a : b`` (``a < b``), so b when either is NaN —
    what MLAS's min/max kernel computes; ordered compares and a select keep exactly that."""
    cmp = "ogt" if kind == "max" else "olt"
    n = vector[1:vector.index(" x")]
    return [f"  {out}.c = fcmp {cmp} {vector} {a}, {b}",
            f"  {out} = select <{n} x i1> {out}.c, {vector} {a}, {vector} {b}"]


def _halves(v: str, out: str, width: int) -> list[str]:
    """``out.lo``/``out.hi``: the low and high halves of the ``width``-lane vector ``v``."""
    half = width // 2
    vec = f"<{width} x float>"
    lo = ", ".join(f"i32 {i}" for i in range(half))
    hi = ", ".join(f"i32 {i}" for i in range(half, width))
    return [f"  {out}.lo = shufflevector {vec} {v}, {vec} poison, <{half} x i32> <{lo}>",
            f"  {out}.hi = shufflevector {vec} {v}, {vec} poison, <{half} x i32> <{hi}>"]


def _reduce(kind: str, v8: str, out: str) -> list[str]:
    """MLAS's reduction of its 8-lane accumulator to a float: halves, then lanes (2, 3), then
    lane 1 against lane 0, each step a MAXPS (MINPS) with the same operand order."""
    v4 = "<4 x float>"
    return [*_halves(v8, f"{out}.h", 8),
            *_lanes(kind, f"{out}.h.lo", f"{out}.h.hi", f"{out}.a", v4),
            f"  {out}.s = shufflevector {v4} {out}.a, {v4} poison, <4 x i32> "
            "<i32 2, i32 3, i32 2, i32 3>",
            *_lanes(kind, f"{out}.a", f"{out}.s", f"{out}.b", v4),
            f"  {out}.b0 = extractelement {v4} {out}.b, i64 0",
            f"  {out}.b1 = extractelement {v4} {out}.b, i64 1",
            f"  {out}.bc = fcmp {'ogt' if kind == 'max' else 'olt'} float {out}.b0, {out}.b1",
            f"  {out} = select i1 {out}.bc, float {out}.b0, float {out}.b1"]


def _params_function() -> list[str]:
    """``@dq_params(x, n, params, flat_scale)``: onnxruntime's range, scale and zero point,
    NaN and infinities included (see ``dynamic_params`` in ops/quantization.py, the numpy
    twin): MLAS's min/max kernel step for step — four 8-lane accumulators over blocks of 32
    (one 32-lane vector here), folded into one, which continues over blocks of 8, a 4-lane
    reduction, then std::max/std::min over the last n % 8 elements — and C++'s std::min/max
    (ordered compares) for the rest, so a NaN lands where it lands in onnxruntime."""
    def splat(value: str, width: int) -> str:
        return "<" + ", ".join([f"float {value}"] * width) + ">"

    big, low, big8, low8 = (splat(_F32_MAX, 32), splat(_F32_LOWEST, 32), splat(_F32_MAX, 8),
                            splat(_F32_LOWEST, 8))
    return [
        "define internal void @dq_params(ptr %x, i64 %n, ptr %params, float %flat_scale) "
        "nounwind {",
        "entry:",
        "  %c32 = lshr i64 %n, 5",
        "  %vec = icmp uge i64 %n, 8",
        "  %has32 = icmp ne i64 %c32, 0",
        "  br i1 %vec, label %vstart, label %scalar",
        "vstart:",
        "  br i1 %has32, label %l32, label %pre8",
        "l32:",
        "  %i = phi i64 [0, %vstart], [%in, %l32]",
        f"  %hi32 = phi {_V32} [{low}, %vstart], [%hi32n, %l32]",
        f"  %lo32 = phi {_V32} [{big}, %vstart], [%lo32n, %l32]",
        "  %o32 = shl i64 %i, 5",
        "  %p32 = getelementptr float, ptr %x, i64 %o32",
        f"  %v32 = load {_V32}, ptr %p32, align 4",
        *_lanes("max", "%hi32", "%v32", "%hi32n", _V32),
        *_lanes("min", "%lo32", "%v32", "%lo32n", _V32),
        "  %in = add i64 %i, 1",
        "  %more32 = icmp ult i64 %in, %c32",
        "  br i1 %more32, label %l32, label %fold32",
        "fold32:",  # acc0..acc3 = lanes 0-7, 8-15, 16-23, 24-31
        *_halves("%hi32n", "%H", 32),
        *_halves("%H.lo", "%H0", 16), *_halves("%H.hi", "%H1", 16),
        *_lanes("max", "%H0.lo", "%H0.hi", "%H01", _V8),
        *_lanes("max", "%H1.lo", "%H1.hi", "%H23", _V8),
        *_lanes("max", "%H01", "%H23", "%Hf", _V8),
        *_halves("%lo32n", "%L", 32),
        *_halves("%L.lo", "%L0", 16), *_halves("%L.hi", "%L1", 16),
        *_lanes("min", "%L0.lo", "%L0.hi", "%L01", _V8),
        *_lanes("min", "%L1.lo", "%L1.hi", "%L23", _V8),
        *_lanes("min", "%L01", "%L23", "%Lf", _V8),
        "  br label %pre8",
        "pre8:",
        f"  %hi8s = phi {_V8} [{low8}, %vstart], [%Hf, %fold32]",
        f"  %lo8s = phi {_V8} [{big8}, %vstart], [%Lf, %fold32]",
        "  %s8 = shl i64 %c32, 5",
        "  %r8 = sub i64 %n, %s8",
        "  %c8 = lshr i64 %r8, 3",
        "  %has8 = icmp ne i64 %c8, 0",
        "  br i1 %has8, label %l8, label %red",
        "l8:",
        "  %j = phi i64 [0, %pre8], [%jn, %l8]",
        f"  %hi8 = phi {_V8} [%hi8s, %pre8], [%hi8n, %l8]",
        f"  %lo8 = phi {_V8} [%lo8s, %pre8], [%lo8n, %l8]",
        "  %j8 = shl i64 %j, 3",
        "  %o8 = add i64 %s8, %j8",
        "  %p8 = getelementptr float, ptr %x, i64 %o8",
        f"  %v8 = load {_V8}, ptr %p8, align 4",
        *_lanes("max", "%hi8", "%v8", "%hi8n", _V8),
        *_lanes("min", "%lo8", "%v8", "%lo8n", _V8),
        "  %jn = add i64 %j, 1",
        "  %more8 = icmp ult i64 %jn, %c8",
        "  br i1 %more8, label %l8, label %red",
        "red:",
        f"  %hiv = phi {_V8} [%hi8s, %pre8], [%hi8n, %l8]",
        f"  %lov = phi {_V8} [%lo8s, %pre8], [%lo8n, %l8]",
        *_reduce("max", "%hiv", "%hir"),
        *_reduce("min", "%lov", "%lor"),
        "  %t8 = shl i64 %c8, 3",
        "  %tstart = add i64 %s8, %t8",
        "  br label %scalar",
        # std::max(hi, t) = hi < t ? t : hi; std::min(lo, t) = t < lo ? t : lo
        "scalar:",
        "  %k = phi i64 [0, %entry], [%tstart, %red], [%kn, %sbody]",
        f"  %hs = phi float [{_F32_LOWEST}, %entry], [%hir, %red], [%hsn, %sbody]",
        f"  %ls = phi float [{_F32_MAX}, %entry], [%lor, %red], [%lsn, %sbody]",
        "  %sdone = icmp uge i64 %k, %n",
        "  br i1 %sdone, label %range_done, label %sbody",
        "sbody:",
        "  %tp = getelementptr float, ptr %x, i64 %k",
        "  %t = load float, ptr %tp, align 4",
        "  %hlt = fcmp olt float %hs, %t",
        "  %hsn = select i1 %hlt, float %t, float %hs",
        "  %llt = fcmp olt float %t, %ls",
        "  %lsn = select i1 %llt, float %t, float %ls",
        "  %kn = add i64 %k, 1",
        "  br label %scalar",
        # the range includes 0: std::min(lo, 0), std::max(hi, 0) (a NaN stays)
        "range_done:",
        "  %lpos = fcmp olt float 0.0, %ls",
        "  %lo = select i1 %lpos, float 0.0, float %ls",
        "  %hneg = fcmp olt float %hs, 0.0",
        "  %hi = select i1 %hneg, float 0.0, float %hs",
        "  %span = fsub float %hi, %lo",
        "  %flat = fcmp oeq float %hi, %lo",
        "  %sc0 = fdiv float %span, 255.0",
        "  %scale = select i1 %flat, float %flat_scale, float %sc0",
        "  %lq = fdiv float %lo, %scale",
        "  %iz = fsub float 0.0, %lq",
        # std::max(0, std::min(255, iz)): a NaN iz becomes 255
        "  %zlt = fcmp olt float %iz, 255.0",
        "  %z1 = select i1 %zlt, float %iz, float 255.0",
        "  %zgt = fcmp olt float 0.0, %z1",
        "  %z2 = select i1 %zgt, float %z1, float 0.0",
        "  %zpf = call float @llvm.rint.f32(float %z2)",
        "  store float %scale, ptr %params, align 4",
        "  %pz = getelementptr float, ptr %params, i64 1",
        "  store float %zpf, ptr %pz, align 4",
        "  ret void",
        "}",
    ]


def functions() -> list[str]:
    """Internal functions other modules include (the LSTM quantizes h at every step):
    ``@dq_params(x, n, params, flat_scale)`` writes (scale, zero point) of ``x[:n]`` to
    ``params``; ``@dq_codes(x, n, out, scale, zero_point)`` writes the codes and returns their
    sum (the row sums a nonzero weight zero point needs)."""
    zeros = "zeroinitializer"
    return [
        *_params_function(),
        "",
        "define internal i32 @dq_codes(ptr %x, i64 %n, ptr %out, float %scale, float %zpf) "
        "nounwind {",
        "entry:",
        *ir.splat("%sv", "%scale"),
        *ir.splat("%zv", "%zpf"),
        "  %chunks = lshr i64 %n, 4",
        "  %tail = and i64 %n, 15",
        "  %hasfull = icmp ne i64 %chunks, 0",
        "  br i1 %hasfull, label %qloop, label %qtail",
        "qloop:",
        "  %qi = phi i64 [0, %entry], [%qin, %qloop]",
        "  %sum = phi <16 x i32> [zeroinitializer, %entry], [%sumn, %qloop]",
        "  %qo = shl i64 %qi, 4",
        "  %qp = getelementptr float, ptr %x, i64 %qo",
        f"  %qv = load {_VF}, ptr %qp, align 4",
        *_codes("%qc", "%qv"),
        "  %op = getelementptr i8, ptr %out, i64 %qo",
        "  store <16 x i8> %qc, ptr %op, align 1",
        "  %qz = zext <16 x i8> %qc to <16 x i32>",
        "  %sumn = add <16 x i32> %sum, %qz",
        "  %qin = add i64 %qi, 1",
        "  %qmore = icmp ult i64 %qin, %chunks",
        "  br i1 %qmore, label %qloop, label %qtail",
        "qtail:",
        "  %sum1 = phi <16 x i32> [zeroinitializer, %entry], [%sumn, %qloop]",
        "  %has_tail = icmp ne i64 %tail, 0",
        "  br i1 %has_tail, label %qlast, label %done",
        "qlast:",
        "  %to = shl i64 %chunks, 4",
        "  %tp = getelementptr float, ptr %x, i64 %to",
        *ir.lane_mask("%tm", "%tail"),
        f"  %tv = call {_VF} @llvm.masked.load.v16f32.p0(ptr %tp, i32 4, <16 x i1> %tm, "
        f"{_VF} {zeros})",
        *_codes("%tc", "%tv"),
        "  %top = getelementptr i8, ptr %out, i64 %to",
        "  call void @llvm.masked.store.v16i8.p0(<16 x i8> %tc, ptr %top, i32 1, "
        "<16 x i1> %tm)",
        "  %tz = zext <16 x i8> %tc to <16 x i32>",
        "  %tzm = select <16 x i1> %tm, <16 x i32> %tz, <16 x i32> zeroinitializer",
        "  %sum2 = add <16 x i32> %sum1, %tzm",
        "  br label %done",
        "done:",
        "  %sumv = phi <16 x i32> [%sum1, %qtail], [%sum2, %qlast]",
        "  %total = call i32 @llvm.vector.reduce.add.v16i32(<16 x i32> %sumv)",
        "  ret i32 %total",
        "}",
    ]


def module_ir() -> str:
    return "\n".join([
        *declarations(),
        "",
        *functions(),
        "",
        "define void @dynamic_quantize_u8(ptr %x, i64 %n, ptr %out, ptr %params, "
        "float %flat_scale) nounwind {",
        "entry:",
        "  call void @dq_params(ptr %x, i64 %n, ptr %params, float %flat_scale)",
        "  %scale = load float, ptr %params, align 4",
        "  %pz = getelementptr float, ptr %params, i64 1",
        "  %zpf = load float, ptr %pz, align 4",
        "  %sum = call i32 @dq_codes(ptr %x, i64 %n, ptr %out, float %scale, float %zpf)",
        "  ret void",
        "}",
    ])


_PROTO = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p,
                          ctypes.c_void_p, ctypes.c_float)


def unavailable() -> str | None:
    return jit.why_unavailable(REQUIRES) or jit.why_not_loaded("quantize", _module)


def _module() -> jit.Module:
    return jit.compile_module("quantize", module_ir(), {"dynamic_quantize_u8": _PROTO}, REQUIRES)


def _function():
    """The selected target's function (compiled once per target; asked at every call)."""
    return _module().dynamic_quantize_u8


def dynamic_quantize_u8(x: np.ndarray, flat_scale: float,
                        out: np.ndarray | None = None) -> tuple[np.ndarray, np.float32, int]:
    """(codes uint8 shaped like x, scale, zero point) of a float32 ``x``; ``out`` may be a
    larger uint8 buffer whose first x.size bytes receive the codes."""
    if x.dtype != np.float32 or not x.flags.c_contiguous:
        x = np.ascontiguousarray(x, np.float32)
    if out is None:
        out = np.empty(x.shape, np.uint8)
    elif out.size < x.size or out.dtype != np.uint8 or not out.flags.c_contiguous:
        raise ValueError("dynamic_quantize_u8: out must be a contiguous uint8 buffer of x.size")
    params = np.empty(2, np.float32)
    _function()(address(x), x.size, address(out), address(params), flat_scale)
    return out, params[0], int(params[1])



# compiled with the other kernels on first use (jit._BUNDLE)
BUNDLE = {"quantize": (lambda target: module_ir(), REQUIRES)}  # the same IR for all

__all__ = ["BUNDLE", "REQUIRES", "declarations", "dynamic_quantize_u8", "functions", "module_ir",
           "unavailable"]
