"""com.microsoft QLinearAdd on two 8-bit tensors of the same shape and memory layout, in one
pass (numpy needs eight, through float64 to emulate the fused multiply-add).

MLAS computes, per element, in float32 with fused multiply-adds:
    c = clamp(rint(fma(a, sa/sc, fma(b, sb/sc, zc - (za*sa/sc + zb*sb/sc)))), lo, hi)
The three constants are computed by the caller exactly as the numpy kernel computes them.
"""

from __future__ import annotations

import ctypes

import numpy as np

from . import jit

REQUIRES = ("avx512f", "avx512bw")
_V, _VF, _VB = "<16 x i32>", "<16 x float>", "<16 x i8>"
_IOTA = "<" + ", ".join(f"i32 {i}" for i in range(16)) + ">"


def _splat(name: str, scalar: str) -> list[str]:
    return [f"  {name}.i = insertelement {_VF} poison, float {scalar}, i64 0",
            f"  {name} = shufflevector {_VF} {name}.i, {_VF} poison, {_V} zeroinitializer"]


def _kernel(signed: bool) -> str:
    ext, name = ("sext", "add_s8") if signed else ("zext", "add_u8")
    L = [f"define void @{name}(ptr %A, ptr %B, ptr %C, i64 %n, ptr %k) nounwind {{",
         "entry:"]
    for i, q in enumerate(("rp", "rq", "fixed", "lo", "hi")):
        L += [f"  %{q}p = getelementptr float, ptr %k, i64 {i}",
              f"  %{q}s = load float, ptr %{q}p, align 4", *_splat(f"%{q}", f"%{q}s")]
    L += ["  %any = icmp sgt i64 %n, 0",
          "  br i1 %any, label %loop, label %end",
          "loop:",  # 16 elements at a time, the last chunk masked
          "  %i = phi i64 [0, %entry], [%in, %loop]",
          "  %left = sub i64 %n, %i",
          "  %left.c = icmp sgt i64 %left, 16",
          "  %left16 = select i1 %left.c, i64 16, i64 %left",
          "  %l32 = trunc i64 %left16 to i32",
          f"  %lv.i = insertelement {_V} poison, i32 %l32, i64 0",
          f"  %lv = shufflevector {_V} %lv.i, {_V} poison, {_V} zeroinitializer",
          f"  %mask = icmp slt {_V} {_IOTA}, %lv",
          "  %ap = getelementptr i8, ptr %A, i64 %i",
          "  %bp = getelementptr i8, ptr %B, i64 %i",
          f"  %a8 = call {_VB} @llvm.masked.load.v16i8.p0(ptr %ap, i32 1, <16 x i1> %mask, "
          f"{_VB} zeroinitializer)",
          f"  %b8 = call {_VB} @llvm.masked.load.v16i8.p0(ptr %bp, i32 1, <16 x i1> %mask, "
          f"{_VB} zeroinitializer)",
          f"  %a32 = {ext} {_VB} %a8 to {_V}",
          f"  %b32 = {ext} {_VB} %b8 to {_V}",
          f"  %af = sitofp {_V} %a32 to {_VF}",
          f"  %bf = sitofp {_V} %b32 to {_VF}",
          f"  %inner = call {_VF} @llvm.fma.v16f32({_VF} %bf, {_VF} %rq, {_VF} %fixed)",
          f"  %v = call {_VF} @llvm.fma.v16f32({_VF} %af, {_VF} %rp, {_VF} %inner)",
          f"  %r = call {_VF} @llvm.rint.v16f32({_VF} %v)",
          f"  %l = call {_VF} @llvm.maxnum.v16f32({_VF} %r, {_VF} %lo)",
          f"  %h = call {_VF} @llvm.minnum.v16f32({_VF} %l, {_VF} %hi)",
          f"  %q32 = fptosi {_VF} %h to {_V}",
          f"  %q = trunc {_V} %q32 to {_VB}",
          "  %cp = getelementptr i8, ptr %C, i64 %i",
          f"  call void @llvm.masked.store.v16i8.p0({_VB} %q, ptr %cp, i32 1, <16 x i1> %mask)",
          "  %in = add i64 %i, 16",
          "  %more = icmp slt i64 %in, %n",
          "  br i1 %more, label %loop, label %end",
          "end:",
          "  ret void",
          "}"]
    return "\n".join(L)


def module_ir() -> str:
    decls = [f"declare {_VB} @llvm.masked.load.v16i8.p0(ptr, i32, <16 x i1>, {_VB})",
             f"declare void @llvm.masked.store.v16i8.p0({_VB}, ptr, i32, <16 x i1>)",
             f"declare {_VF} @llvm.fma.v16f32({_VF}, {_VF}, {_VF})",
             f"declare {_VF} @llvm.rint.v16f32({_VF})",
             f"declare {_VF} @llvm.minnum.v16f32({_VF}, {_VF})",
             f"declare {_VF} @llvm.maxnum.v16f32({_VF}, {_VF})"]
    return "\n\n".join(decls + [_kernel(False), _kernel(True)])


_P = ctypes.c_void_p
_PROTO = ctypes.CFUNCTYPE(None, _P, _P, _P, ctypes.c_int64, _P)
_compiled: dict = {}


def unavailable() -> str | None:
    return jit.why_unavailable(REQUIRES)


def _same_memory_order(a: np.ndarray, b: np.ndarray) -> bool:
    """a and b have one shape and one dense layout (C order, or one permutation of it)."""
    if a.shape != b.shape or a.strides != b.strides:
        return False
    order = sorted(range(a.ndim), key=lambda i: -a.strides[i])
    return a.transpose(order).flags.c_contiguous


def qlinear_add(a: np.ndarray, b: np.ndarray, rp, rq, fixed) -> np.ndarray | None:
    """The QLinearAdd of two same-layout 8-bit tensors (output in that layout), or None when
    the shapes or layouts differ (the caller broadcasts with numpy)."""
    if a.dtype != b.dtype or a.dtype not in (np.uint8, np.int8) or not _same_memory_order(a, b):
        return None
    if not _compiled:
        module = jit.compile_module("int8_elementwise", module_ir(),
                                    {"add_u8": _PROTO, "add_s8": _PROTO}, REQUIRES)
        _compiled.update({False: module.add_u8, True: module.add_s8})
    info = np.iinfo(a.dtype)
    k = np.array([rp, rq, fixed, info.min, info.max], np.float32)
    out = np.empty_like(a)  # same shape and strides (dense, positive: checked above)
    if a.size:
        _compiled[a.dtype == np.int8](a.ctypes.data, b.ctypes.data, out.ctypes.data, a.size,
                                      k.ctypes.data)
    return out



# compiled with the other kernels on first use (jit._BUNDLE)
BUNDLE = {"int8_elementwise": (module_ir, REQUIRES)}

__all__ = ["BUNDLE", "REQUIRES", "module_ir", "qlinear_add", "unavailable"]
