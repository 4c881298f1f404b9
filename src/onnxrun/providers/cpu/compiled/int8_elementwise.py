"""com.microsoft QLinearAdd on two 8-bit tensors of the same shape and memory layout, in one
pass (numpy needs eight, through float64 to emulate the fused multiply-add).

MLAS computes, per element, in float32 with fused multiply-adds:
    c = clamp(rint(fma(a, sa/sc, fma(b, sb/sc, zc - (za*sa/sc + zb*sb/sc)))), lo, hi)
The three constants are computed by the caller exactly as the numpy kernel computes them.
"""

from __future__ import annotations

import ctypes

import numpy as np

from . import ir, jit
from .layout import dense_order

REQUIRES = ()  # generic vector IR: every target
_V, _VF, _VB = ir.V, ir.VF, ir.VB


def _sum(ext: str, s: str) -> list[str]:
    """``%q{s}`` = the requantized sum of the 16 bytes ``%a8{s}``, ``%b8{s}``."""
    return [f"  %a32{s} = {ext} {_VB} %a8{s} to {_V}",
            f"  %b32{s} = {ext} {_VB} %b8{s} to {_V}",
            f"  %af{s} = sitofp {_V} %a32{s} to {_VF}",
            f"  %bf{s} = sitofp {_V} %b32{s} to {_VF}",
            f"  %inner{s} = call {_VF} @llvm.fma.v16f32({_VF} %bf{s}, {_VF} %rq, {_VF} %fixed)",
            f"  %v{s} = call {_VF} @llvm.fma.v16f32({_VF} %af{s}, {_VF} %rp, {_VF} %inner{s})",
            *ir.requantize(f"%q{s}", f"%v{s}", "zeroinitializer", "%lo", "%hi")]  # zc in fixed


def _kernel(signed: bool) -> str:
    ext, name = ("sext", "add_s8") if signed else ("zext", "add_u8")
    L = [f"define void @{name}(ptr %A, ptr %B, ptr %C, i64 %n, ptr %k) nounwind {{",
         "entry:"]
    L += ir.load_params("%k", ("rp", "rq", "fixed", "lo", "hi"))
    L += ["  %any = icmp sgt i64 %n, 0",
          "  br i1 %any, label %loop, label %end",
          "loop:",  # 16 elements at a time: whole chunks by plain loads, the last masked
          "  %i = phi i64 [0, %entry], [%in, %next]",
          "  %left = sub i64 %n, %i",
          "  %ap = getelementptr i8, ptr %A, i64 %i",
          "  %bp = getelementptr i8, ptr %B, i64 %i",
          "  %cp = getelementptr i8, ptr %C, i64 %i",
          "  %whole = icmp sge i64 %left, 16",
          "  br i1 %whole, label %plain, label %tail",
          "plain:",
          f"  %a8p = load {_VB}, ptr %ap, align 1",
          f"  %b8p = load {_VB}, ptr %bp, align 1",
          *_sum(ext, "p"),
          f"  store {_VB} %qp, ptr %cp, align 1",
          "  br label %next",
          "tail:",  # masked byte loads and stores: per lane on AVX2, so only here
          *ir.lane_mask("%mask", "%left"),
          f"  %a8t = call {_VB} @llvm.masked.load.v16i8.p0(ptr %ap, i32 1, <16 x i1> %mask, "
          f"{_VB} zeroinitializer)",
          f"  %b8t = call {_VB} @llvm.masked.load.v16i8.p0(ptr %bp, i32 1, <16 x i1> %mask, "
          f"{_VB} zeroinitializer)",
          *_sum(ext, "t"),
          f"  call void @llvm.masked.store.v16i8.p0({_VB} %qt, ptr %cp, i32 1, <16 x i1> %mask)",
          "  br label %next",
          "next:",
          "  %in = add i64 %i, 16",
          "  %more = icmp slt i64 %in, %n",
          "  br i1 %more, label %loop, label %end",
          "end:",
          "  ret void",
          "}"]
    return "\n".join(L)


def module_ir() -> str:
    decls = ir.declarations("load.i8", "store.i8", "fma", "rint", "minnum", "maxnum")
    return "\n\n".join(decls + [_kernel(False), _kernel(True)])


_P = ctypes.c_void_p
_PROTO = ctypes.CFUNCTYPE(None, _P, _P, _P, ctypes.c_int64, _P)


def unavailable() -> str | None:
    return jit.why_unavailable(REQUIRES) or jit.why_not_loaded("int8_elementwise", _module)


def _module() -> jit.Module:
    return jit.compile_module("int8_elementwise", module_ir(),
                              {"add_u8": _PROTO, "add_s8": _PROTO}, REQUIRES)


def qlinear_add(a: np.ndarray, b: np.ndarray, rp, rq, fixed) -> np.ndarray | None:
    """The QLinearAdd of two same-layout 8-bit tensors (output in that layout), or None when
    the shapes or layouts differ (the caller broadcasts with numpy)."""
    if a.dtype != b.dtype or a.dtype not in (np.uint8, np.int8) or a.shape != b.shape or \
            a.strides != b.strides or dense_order(a) is None:  # one shape, one dense layout
        return None
    module = _module()  # the selected target's (cached): asked at run time, not prepared
    info = np.iinfo(a.dtype)
    k = np.array([rp, rq, fixed, info.min, info.max], np.float32)
    out = np.empty_like(a)  # same shape and strides (dense: checked above)
    if a.size:
        fn = module.add_s8 if a.dtype == np.int8 else module.add_u8
        fn(a.ctypes.data, b.ctypes.data, out.ctypes.data, a.size, k.ctypes.data)
    return out



# compiled with the other kernels on first use (jit._BUNDLE)
BUNDLE = {"int8_elementwise": (lambda target: module_ir(), REQUIRES)}

__all__ = ["BUNDLE", "REQUIRES", "module_ir", "qlinear_add", "unavailable"]
