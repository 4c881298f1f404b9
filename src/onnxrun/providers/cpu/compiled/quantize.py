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
Needs only AVX-512F (16-lane vectors); the masked tail handles any length.
"""

from __future__ import annotations

import ctypes

import numpy as np

from . import ir, jit
from .jit import address

REQUIRES = ("avx512f",)

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


def functions() -> list[str]:
    """Internal functions other modules include (the LSTM quantizes h at every step):
    ``@dq_params(x, n, params, flat_scale)`` writes (scale, zero point) of ``x[:n]`` to
    ``params``; ``@dq_codes(x, n, out, scale, zero_point)`` writes the codes and returns their
    sum (the row sums a nonzero weight zero point needs)."""
    zeros = "zeroinitializer"
    return [
        "define internal void @dq_params(ptr %x, i64 %n, ptr %params, float %flat_scale) "
        "nounwind {",
        "entry:",
        "  %chunks = lshr i64 %n, 4",
        "  %tail = and i64 %n, 15",
        "  %hasfull = icmp ne i64 %chunks, 0",
        "  br i1 %hasfull, label %rloop, label %rtail",
        # the range, starting from 0 (so 0 is always inside it; masked lanes read 0)
        "rloop:",
        "  %ri = phi i64 [0, %entry], [%rin, %rloop]",
        f"  %lo = phi {_VF} [{zeros}, %entry], [%lon, %rloop]",
        f"  %hi = phi {_VF} [{zeros}, %entry], [%hin, %rloop]",
        "  %ro = shl i64 %ri, 4",
        "  %rp = getelementptr float, ptr %x, i64 %ro",
        f"  %rv = load {_VF}, ptr %rp, align 4",
        f"  %lt = fcmp olt {_VF} %rv, %lo",
        f"  %lon = select <16 x i1> %lt, {_VF} %rv, {_VF} %lo",
        f"  %gt = fcmp ogt {_VF} %rv, %hi",
        f"  %hin = select <16 x i1> %gt, {_VF} %rv, {_VF} %hi",
        "  %rin = add i64 %ri, 1",
        "  %rmore = icmp ult i64 %rin, %chunks",
        "  br i1 %rmore, label %rloop, label %rtail",
        "rtail:",
        f"  %lo1 = phi {_VF} [{zeros}, %entry], [%lon, %rloop]",
        f"  %hi1 = phi {_VF} [{zeros}, %entry], [%hin, %rloop]",
        "  %to = shl i64 %chunks, 4",
        "  %tp = getelementptr float, ptr %x, i64 %to",
        *ir.lane_mask("%tm", "%tail"),
        f"  %tv = call {_VF} @llvm.masked.load.v16f32.p0(ptr %tp, i32 4, <16 x i1> %tm, "
        f"{_VF} {zeros})",
        f"  %tlt = fcmp olt {_VF} %tv, %lo1",
        f"  %lo2 = select <16 x i1> %tlt, {_VF} %tv, {_VF} %lo1",
        f"  %tgt = fcmp ogt {_VF} %tv, %hi1",
        f"  %hi2 = select <16 x i1> %tgt, {_VF} %tv, {_VF} %hi1",
        f"  %lo_s = call float @llvm.vector.reduce.fmin.v16f32({_VF} %lo2)",
        f"  %hi_s = call float @llvm.vector.reduce.fmax.v16f32({_VF} %hi2)",
        # scale and zero point, in float32 as numpy computes them
        "  %span = fsub float %hi_s, %lo_s",
        "  %flat = fcmp oeq float %hi_s, %lo_s",
        "  %sc0 = fdiv float %span, 255.0",
        "  %scale = select i1 %flat, float %flat_scale, float %sc0",
        "  %lq = fdiv float %lo_s, %scale",
        "  %nl = fsub float 0.0, %lq",
        "  %c0 = call float @llvm.maxnum.f32(float %nl, float 0.0)",
        "  %c1 = call float @llvm.minnum.f32(float %c0, float 255.0)",
        "  %zpf = call float @llvm.rint.f32(float %c1)",
        "  store float %scale, ptr %params, align 4",
        "  %pz = getelementptr float, ptr %params, i64 1",
        "  store float %zpf, ptr %pz, align 4",
        "  ret void",
        "}",
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
    return jit.why_unavailable(REQUIRES)


_compiled: list = []


def _function():
    if not _compiled:
        _compiled.append(jit.compile_module("quantize", module_ir(),
                                            {"dynamic_quantize_u8": _PROTO},
                                            REQUIRES).dynamic_quantize_u8)
    return _compiled[0]


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
BUNDLE = {"quantize": (module_ir, REQUIRES)}

__all__ = ["BUNDLE", "REQUIRES", "declarations", "dynamic_quantize_u8", "functions", "module_ir",
           "unavailable"]
