"""com.microsoft MatMulNBits (4 bits, accuracy_level 4) for a few rows of A: the product of int8
activations with the packed 4-bit weight, read as it is stored (no float copy of the weight).

What MLAS's CompInt8 path computes, per output (m, n) and block b of K:
    C[m, n] = sum_b sa[m, b] * sb[n, b] * sum_i qa[m, b, i] * (q[n, b, i] - zp[n, b])
The kernel sums qa * q (zero point left out) exactly, as MLAS's AVX2 kernel does (u8 x s8
products summed in pairs to 16 bits, then in fours to 32), converts each block's eight
lanes to float and accumulates them scaled by sa * sb with fused multiply-adds; the caller
subtracts the zero point's share, (sa * sum_i qa) @ (zp * sb), with one small float product.
Only float summation order differs from MLAS.

A byte of the weight holds element 2j in its low nibble and 2j + 1 in its high one: the caller
lays each 32 activations of a block out as their 16 even-indexed then their 16 odd-indexed
ones, so a 16-byte load of the weight meets two plain 16-byte loads of A.
"""

from __future__ import annotations

import ctypes

import numpy as np

from . import jit

REQUIRES = ("avx2", "fma")
_VB = "<16 x i8>"
_V32B = "<32 x i8>"
_VH = "<16 x i16>"
_V8 = "<8 x i32>"
_VF = "<8 x float>"


def module_ir(target=None) -> str:
    """gemv(qa, sa, B, sb, C, M, n0, n1, N, kb, groups): rows n0..n1 of the weight; ``groups``
    = block size / 32; qa is (M, kb * groups * 32) int8 laid out as above, sa (M, kb), B
    (N, kb, groups * 16) bytes, sb (N, kb), C (M, N) float32."""
    L = ["define void @gemv(ptr noalias %qa, ptr noalias %sa, ptr noalias %B, ptr noalias %sb,"
         " ptr noalias %C, i64 %M, i64 %n0, i64 %n1, i64 %N, i64 %kb, i64 %groups) nounwind {",
         "entry:",
         "  %bsz = mul i64 %groups, 32",  # activations per block
         "  %bbytes = mul i64 %groups, 16",  # weight bytes per block
         "  %K = mul i64 %kb, %bsz",
         "  %rowbytes = mul i64 %kb, %bbytes",
         "  %any = icmp slt i64 %n0, %n1",
         "  br i1 %any, label %n.loop, label %end",
         "n.loop:",
         "  %n = phi i64 [%n0, %entry], [%n.next, %n.end]",
         "  %brow = mul i64 %n, %rowbytes",
         "  %srow = mul i64 %n, %kb",
         "  br label %m.loop",
         "m.loop:",
         "  %m = phi i64 [0, %n.loop], [%m.next, %m.end]",
         "  %arow = mul i64 %m, %K",
         "  %sarow = mul i64 %m, %kb",
         "  br label %b.loop",
         "b.loop:",
         "  %b = phi i64 [0, %m.loop], [%b.next, %b.end]",
         f"  %acc = phi {_VF} [zeroinitializer, %m.loop], [%acc.next, %b.end]",
         "  %bbase = mul i64 %b, %bbytes",
         "  %bbase2 = add i64 %brow, %bbase",
         "  %abase = mul i64 %b, %bsz",
         "  %abase2 = add i64 %arow, %abase",
         "  br label %g.loop",
         "g.loop:",
         "  %g = phi i64 [0, %b.loop], [%g.next, %g.loop]",
         f"  %dot = phi {_V8} [zeroinitializer, %b.loop], [%dot.next, %g.loop]",
         "  %goff = mul i64 %g, 16",
         "  %bo = add i64 %bbase2, %goff",
         "  %bp = getelementptr i8, ptr %B, i64 %bo",
         f"  %w = load {_VB}, ptr %bp, align 1",
         f"  %lo = and {_VB} %w, " + "<" + ", ".join(["i8 15"] * 16) + ">",
         f"  %hi = lshr {_VB} %w, " + "<" + ", ".join(["i8 4"] * 16) + ">",
         # the 32 nibbles: even-indexed elements, then odd-indexed ones (A's layout)
         f"  %wb = shufflevector {_VB} %lo, {_VB} %hi, <32 x i32> <"
         + ", ".join(f"i32 {i}" for i in range(32)) + ">",
         "  %aoff = mul i64 %g, 32",
         "  %ao = add i64 %abase2, %aoff",
         "  %ap = getelementptr i8, ptr %qa, i64 %ao",
         f"  %a = load {_V32B}, ptr %ap, align 1",
         # u8 x s8 products summed in pairs (at most 2 * 15 * 127: no saturation), then in 4s
         f"  %p16 = call {_VH} @llvm.x86.avx2.pmadd.ub.sw({_V32B} %wb, {_V32B} %a)",
         f"  %p32 = call {_V8} @llvm.x86.avx2.pmadd.wd({_VH} %p16, {_VH} "
         + "<" + ", ".join(["i16 1"] * 16) + ">)",
         f"  %dot.next = add {_V8} %dot, %p32",
         "  %g.next = add i64 %g, 1",
         "  %g.more = icmp slt i64 %g.next, %groups",
         "  br i1 %g.more, label %g.loop, label %b.end",
         "b.end:",
         f"  %df = sitofp {_V8} %dot.next to {_VF}",
         "  %sai = add i64 %sarow, %b",
         "  %sap = getelementptr float, ptr %sa, i64 %sai",
         "  %sav = load float, ptr %sap, align 4",
         "  %sbi = add i64 %srow, %b",
         "  %sbp = getelementptr float, ptr %sb, i64 %sbi",
         "  %sbv = load float, ptr %sbp, align 4",
         "  %scale = fmul float %sav, %sbv",
         f"  %sv.s = insertelement {_VF} poison, float %scale, i64 0",
         f"  %sv = shufflevector {_VF} %sv.s, {_VF} poison, <8 x i32> zeroinitializer",
         f"  %acc.next = call {_VF} @llvm.fma.v8f32({_VF} %df, {_VF} %sv, {_VF} %acc)",
         "  %b.next = add i64 %b, 1",
         "  %b.more = icmp slt i64 %b.next, %kb",
         "  br i1 %b.more, label %b.loop, label %m.end",
         "m.end:",
         f"  %sum = call reassoc float @llvm.vector.reduce.fadd.v8f32(float 0.0, {_VF} "
         "%acc.next)",
         "  %ci0 = mul i64 %m, %N",
         "  %ci = add i64 %ci0, %n",
         "  %cp = getelementptr float, ptr %C, i64 %ci",
         "  store float %sum, ptr %cp, align 4",
         "  %m.next = add i64 %m, 1",
         "  %m.more = icmp slt i64 %m.next, %M",
         "  br i1 %m.more, label %m.loop, label %n.end",
         "n.end:",
         "  %n.next = add i64 %n, 1",
         "  %n.more = icmp slt i64 %n.next, %n1",
         "  br i1 %n.more, label %n.loop, label %end",
         "end:",
         "  ret void",
         "}",
         f"declare {_VF} @llvm.fma.v8f32({_VF}, {_VF}, {_VF})",
         f"declare float @llvm.vector.reduce.fadd.v8f32(float, {_VF})",
         f"declare {_VH} @llvm.x86.avx2.pmadd.ub.sw({_V32B}, {_V32B})",
         f"declare {_V8} @llvm.x86.avx2.pmadd.wd({_VH}, {_VH})"]
    return "\n".join(L)


_P = ctypes.c_void_p
_I = ctypes.c_int64
_PROTO = ctypes.CFUNCTYPE(None, _P, _P, _P, _P, _P, _I, _I, _I, _I, _I, _I)


def unavailable() -> str | None:
    return jit.why_unavailable(REQUIRES) or jit.why_not_loaded("nbits_gemv", _module)


def _module() -> jit.Module:
    return jit.compile_module("nbits_gemv", module_ir, {"gemv": _PROTO}, REQUIRES)


def supported(bits: int, block_size: int) -> bool:
    """The weights this kernel reads: 4 bits, blocks of 32 to 256 (A quantized per block)."""
    return bits == 4 and block_size in (32, 64, 128, 256)


def quantize_rows(A: np.ndarray, block_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A (M, K) float32 as MLAS's CompInt8 path quantizes it (see ops int8_blocks): int8 codes
    in the kernel's layout (K padded to whole blocks), the per-block scales, and each block's
    sum of codes."""
    M, K = A.shape
    kb = -(-K // block_size)
    blocks = np.zeros((M, kb * block_size), np.float32)
    blocks[:, :K] = A
    blocks = blocks.reshape(M, kb, block_size)
    amax = np.abs(blocks).max(axis=-1)
    with np.errstate(divide="ignore"):
        inv = np.where(amax != 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    q = np.rint(blocks * inv[..., None]).astype(np.int8)
    sums = q.sum(axis=-1, dtype=np.int32).astype(np.float32)
    # each 32 codes: the 16 even-indexed, then the 16 odd-indexed
    laid = q.reshape(M, -1, 16, 2).transpose(0, 1, 3, 2)
    return np.ascontiguousarray(laid).reshape(M, -1), amax / np.float32(127), sums


class Gemv:
    """The kernel bound to one constant weight (its pointers taken once: a decode step calls
    it for every projection of every layer, so the per-call cost is the Python around it)."""

    def __init__(self, packed: np.ndarray, scales: np.ndarray, block_size: int) -> None:
        self.packed, self.scales = packed, scales  # kept alive: the kernel reads them
        self.fn = _module().gemv
        self.b, self.s = packed.ctypes.data, scales.ctypes.data
        self.groups = block_size // 32

    def __call__(self, qa: np.ndarray, sa: np.ndarray, out: np.ndarray, n0: int,
                 n1: int) -> None:
        """out[:, n0:n1] = the zero-point-free block products (see the module's doc); qa, sa
        and out C-contiguous, from quantize_rows and (M, N)."""
        M, kb = sa.shape
        self.fn(qa.ctypes.data, sa.ctypes.data, self.b, self.s, out.ctypes.data, M, n0, n1,
                out.shape[1], kb, self.groups)


# compiled with the other kernels on first use (jit._BUNDLE)
BUNDLE = {"nbits_gemv": (module_ir, REQUIRES)}

__all__ = ["BUNDLE", "REQUIRES", "Gemv", "module_ir", "quantize_rows", "supported",
           "unavailable"]
