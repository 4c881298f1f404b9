"""com.microsoft MatMulNBits (4 bits, accuracy_level 4) for a few rows of A: the product of int8
activations with the packed 4-bit weight, read as it is stored (no float copy of the weight).

What MLAS's CompInt8 path computes, per output (m, n) and block b of K:
    C[m, n] = sum_b sa[m, b] * sb[n, b] * sum_i qa[m, b, i] * (q[n, b, i] - zp[n, b])
The kernel sums qa * q (zero point left out) exactly, as MLAS's AVX2 kernel does (u8 x s8
products summed in pairs to 16 bits, then in fours to 32), converts each block's eight
lanes to float and accumulates them scaled by sa * sb with fused multiply-adds; the caller
subtracts the zero point's share, (sa * sum_i qa) @ (zp * sb), with one small float product.
Only float summation order differs from MLAS. For decoding's rows gemv8 (Gemv.decode) takes
eight columns per pass, the zero points' share inside (see _function8).

A byte of the weight holds element 2j in its low nibble and 2j + 1 in its high one: the caller
lays each 32 activations of a block out as their 16 even-indexed then their 16 odd-indexed
ones, so a 16-byte load of the weight meets two plain 16-byte loads of A.
"""

from __future__ import annotations

import ctypes

import numpy as np

from . import jit
from .ir import latch

REQUIRES = ("avx2", "fma")
_VB = "<16 x i8>"
_V32B = "<32 x i8>"
_VH = "<16 x i16>"
_V8 = "<8 x i32>"
_VF = "<8 x float>"


def _function(name: str, rows: int) -> list[str]:
    """``rows`` rows of A per pass: each 16 bytes of the weight are unpacked once for all of
    them (a prompt's rows share the weight's decoding)."""
    R = range(rows)
    L = [f"define void @{name}(ptr noalias %qa, ptr noalias %sa, ptr noalias %B, "
         "ptr noalias %sb, ptr noalias %C, i64 %M, i64 %n0, i64 %n1, i64 %N, i64 %kb, "
         "i64 %groups) nounwind {",
         "entry:",
         "  %bsz = mul i64 %groups, 32",  # activations per block
         "  %bbytes = mul i64 %groups, 16",  # weight bytes per block
         "  %K = mul i64 %kb, %bsz",
         "  %rowbytes = mul i64 %kb, %bbytes",
         "  %any.n = icmp slt i64 %n0, %n1",
         f"  %any.m = icmp sge i64 %M, {rows}",
         "  %any = and i1 %any.n, %any.m",
         "  br i1 %any, label %n.loop, label %end",
         "n.loop:",
         "  %n = phi i64 [%n0, %entry], [%n.next, %n.end]",
         "  %brow = mul i64 %n, %rowbytes",
         "  %srow = mul i64 %n, %kb",
         "  br label %m.loop",
         "m.loop:",
         "  %m = phi i64 [0, %n.loop], [%m.next, %m.end]",
         *(f"  %m{r} = add i64 %m, {r}" for r in R),
         *(f"  %arow{r} = mul i64 %m{r}, %K" for r in R),
         *(f"  %sarow{r} = mul i64 %m{r}, %kb" for r in R),
         "  br label %b.loop",
         "b.loop:",
         "  %b = phi i64 [0, %m.loop], [%b.next, %b.end]",
         *(f"  %acc{r} = phi {_VF} [zeroinitializer, %m.loop], [%acc{r}.next, %b.end]"
           for r in R),
         "  %bbase = mul i64 %b, %bbytes",
         "  %bbase2 = add i64 %brow, %bbase",
         "  %abase = mul i64 %b, %bsz",
         *(f"  %abase{r} = add i64 %arow{r}, %abase" for r in R),
         "  br label %g.loop",
         "g.loop:",
         "  %g = phi i64 [0, %b.loop], [%g.next, %g.loop]",
         *(f"  %dot{r} = phi {_V8} [zeroinitializer, %b.loop], [%dot{r}.next, %g.loop]"
           for r in R),
         "  %goff = mul i64 %g, 16",
         "  %bo = add i64 %bbase2, %goff",
         "  %bp = getelementptr i8, ptr %B, i64 %bo",
         f"  %w = load {_VB}, ptr %bp, align 1",
         f"  %lo = and {_VB} %w, " + "<" + ", ".join(["i8 15"] * 16) + ">",
         f"  %hi = lshr {_VB} %w, " + "<" + ", ".join(["i8 4"] * 16) + ">",
         # the 32 nibbles: even-indexed elements, then odd-indexed ones (A's layout)
         f"  %wb = shufflevector {_VB} %lo, {_VB} %hi, <32 x i32> <"
         + ", ".join(f"i32 {i}" for i in range(32)) + ">",
         "  %aoff = mul i64 %g, 32"]
    for r in R:
        # u8 x s8 products summed in pairs (at most 2 * 15 * 127: no saturation), then in 4s
        L += [f"  %ao{r} = add i64 %abase{r}, %aoff",
              f"  %ap{r} = getelementptr i8, ptr %qa, i64 %ao{r}",
              f"  %a{r} = load {_V32B}, ptr %ap{r}, align 1",
              f"  %p16.{r} = call {_VH} @llvm.x86.avx2.pmadd.ub.sw({_V32B} %wb, {_V32B} %a{r})",
              f"  %p32.{r} = call {_V8} @llvm.x86.avx2.pmadd.wd({_VH} %p16.{r}, {_VH} "
              + "<" + ", ".join(["i16 1"] * 16) + ">)",
              f"  %dot{r}.next = add {_V8} %dot{r}, %p32.{r}"]
    L += [*latch("g", "1", "g.more", "%groups", "g.loop", "b.end"),
          "b.end:",
          "  %sbi = add i64 %srow, %b",
          "  %sbp = getelementptr float, ptr %sb, i64 %sbi",
          "  %sbv = load float, ptr %sbp, align 4"]
    for r in R:
        L += [f"  %df{r} = sitofp {_V8} %dot{r}.next to {_VF}",
              f"  %sai{r} = add i64 %sarow{r}, %b",
              f"  %sap{r} = getelementptr float, ptr %sa, i64 %sai{r}",
              f"  %sav{r} = load float, ptr %sap{r}, align 4",
              f"  %scale{r} = fmul float %sav{r}, %sbv",
              f"  %sv{r}.s = insertelement {_VF} poison, float %scale{r}, i64 0",
              f"  %sv{r} = shufflevector {_VF} %sv{r}.s, {_VF} poison, <8 x i32> "
              "zeroinitializer",
              f"  %acc{r}.next = call {_VF} @llvm.fma.v8f32({_VF} %df{r}, {_VF} %sv{r}, "
              f"{_VF} %acc{r})"]
    L += [*latch("b", "1", "b.more", "%kb", "b.loop", "m.end"),
          "m.end:"]
    for r in R:
        L += [f"  %sum{r} = call reassoc float @llvm.vector.reduce.fadd.v8f32(float 0.0, "
              f"{_VF} %acc{r}.next)",
              f"  %ci0.{r} = mul i64 %m{r}, %N",
              f"  %ci{r} = add i64 %ci0.{r}, %n",
              f"  %cp{r} = getelementptr float, ptr %C, i64 %ci{r}",
              f"  store float %sum{r}, ptr %cp{r}, align 4"]
    L += [f"  %m.next = add i64 %m, {rows}",
          f"  %m.last = add i64 %m.next, {rows - 1}",
          "  %m.more = icmp slt i64 %m.last, %M",
          "  br i1 %m.more, label %m.loop, label %n.end",
          "n.end:",
          *latch("n", "1", "n.more", "%n1", "n.loop", "end"),
          "end:",
          "  ret void",
          "}"]
    return L


def _vec(elem: str, values) -> str:
    return "<" + ", ".join(f"{elem} {v}" for v in values) + ">"


def _columns8(L: list[str], tag: str, weight: str, a_lo: str, a_hi: str, wide: bool) -> str:
    """Emit the int32 dot products of eight columns (lanes 0-7; with ``wide``, two blocks:
    lanes 0-3 and 8-11 the first block's, 4-7 and 12-15 the second's) with the activations'
    even-indexed codes ``a_lo`` and odd-indexed ``a_hi``; returns the result's name.

    ``weight`` is the byte offset of column 0's bytes; column c's are ``rowbytes`` further
    each. 16 bytes hold one block of 32 (``wide`` reads 32: two blocks). Each column's
    products are summed in 16-bit lanes across the eight columns by horizontal adds (at
    most 16 * 15 * 127 = 30480 per lane: no wrap), then in pairs to 32 bits."""
    V16, n = "<16 x i16>", 32 if wide else 16
    VB = f"<{n} x i8>"
    for c in range(8):
        L += [f"  %{tag}o{c} = mul i64 %rowbytes, {c}",
              f"  %{tag}bo{c} = add i64 {weight}, %{tag}o{c}",
              f"  %{tag}bp{c} = getelementptr i8, ptr %B, i64 %{tag}bo{c}",
              f"  %{tag}w{c} = load {VB}, ptr %{tag}bp{c}, align 1",
              f"  %{tag}lo{c} = and {VB} %{tag}w{c}, {_vec('i8', [15] * n)}",
              f"  %{tag}hi{c} = lshr {VB} %{tag}w{c}, {_vec('i8', [4] * n)}"]
        if wide:  # [block b's even | b+1's even] and the odd ones: the codes' halves
            L += [f"  %{tag}p{c}a = call {V16} @llvm.x86.avx2.pmadd.ub.sw({_V32B} %{tag}lo{c}, "
                  f"{_V32B} {a_lo})",
                  f"  %{tag}p{c}b = call {V16} @llvm.x86.avx2.pmadd.ub.sw({_V32B} %{tag}hi{c}, "
                  f"{_V32B} {a_hi})",
                  f"  %{tag}p{c} = add {V16} %{tag}p{c}a, %{tag}p{c}b"]
        else:
            L += [f"  %{tag}wb{c} = shufflevector {_VB} %{tag}lo{c}, {_VB} %{tag}hi{c}, "
                  f"<32 x i32> {_vec('i32', range(32))[1:-1].join('<>')}",
                  f"  %{tag}p{c} = call {V16} @llvm.x86.avx2.pmadd.ub.sw({_V32B} %{tag}wb{c}, "
                  f"{_V32B} {a_lo})"]
    # per 128-bit lane phadd gives [x0+x1, x2+x3, .., y0+y1, ..]: after two levels, column c
    # of each four holds two 16-bit lanes per 128-bit lane
    L += [f"  %{tag}h01 = call {V16} @llvm.x86.avx2.phadd.w({V16} %{tag}p0, {V16} %{tag}p1)",
          f"  %{tag}h23 = call {V16} @llvm.x86.avx2.phadd.w({V16} %{tag}p2, {V16} %{tag}p3)",
          f"  %{tag}h45 = call {V16} @llvm.x86.avx2.phadd.w({V16} %{tag}p4, {V16} %{tag}p5)",
          f"  %{tag}h67 = call {V16} @llvm.x86.avx2.phadd.w({V16} %{tag}p6, {V16} %{tag}p7)",
          f"  %{tag}q03 = call {V16} @llvm.x86.avx2.phadd.w({V16} %{tag}h01, {V16} %{tag}h23)",
          f"  %{tag}q47 = call {V16} @llvm.x86.avx2.phadd.w({V16} %{tag}h45, {V16} %{tag}h67)",
          f"  %{tag}d03 = call {_V8} @llvm.x86.avx2.pmadd.wd({V16} %{tag}q03, {V16} "
          f"{_vec('i16', [1] * 16)})",
          f"  %{tag}d47 = call {_V8} @llvm.x86.avx2.pmadd.wd({V16} %{tag}q47, {V16} "
          f"{_vec('i16', [1] * 16)})"]
    if wide:  # lanes: [c0-3 of b, c0-3 of b+1] and [c4-7 of b, c4-7 of b+1]
        L += [f"  %{tag}r = shufflevector {_V8} %{tag}d03, {_V8} %{tag}d47, <16 x i32> "
              + _vec("i32", [0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 12, 13, 14, 15])]
        return f"%{tag}r"
    # lanes: [c0-3 first 16 products, c0-3 last 16] and the same for c4-7
    L += [f"  %{tag}ra = shufflevector {_V8} %{tag}d03, {_V8} %{tag}d47, <8 x i32> "
          + _vec("i32", [0, 1, 2, 3, 8, 9, 10, 11]),
          f"  %{tag}rb = shufflevector {_V8} %{tag}d03, {_V8} %{tag}d47, <8 x i32> "
          + _vec("i32", [4, 5, 6, 7, 12, 13, 14, 15]),
          f"  %{tag}r = add {_V8} %{tag}ra, %{tag}rb"]
    return f"%{tag}r"


def _scale8(L: list[str], tag: str, block: str) -> str:
    """sa[m, block] * sb[n..n+8, block] as a vector; returns its name."""
    L += [f"  %{tag}sai = add i64 %sarow, {block}",
          f"  %{tag}sap = getelementptr float, ptr %sa, i64 %{tag}sai",
          f"  %{tag}sav = load float, ptr %{tag}sap, align 4"]
    sb = _gather8(L, tag, "%sb", block)
    L += [f"  %{tag}sas = insertelement {_VF} poison, float %{tag}sav, i64 0",
          f"  %{tag}sa8 = shufflevector {_VF} %{tag}sas, {_VF} poison, <8 x i32> "
          "zeroinitializer",
          f"  %{tag}scale = fmul {_VF} %{tag}sa8, {sb}"]
    return f"%{tag}scale"


def _zshare8(L: list[str], tag: str, block: str, acc: str, out: str) -> None:
    """acc - (sa * sum of A's codes)[m, block] * zmul * zs[n..n+8, block] (the zero points'
    share; zs (N, kb) read like sb, a column's blocks contiguous: a (kb, N) table would be
    kb pages apart per pass), named ``out``."""
    L += [f"  %{tag}ai = add i64 %sarow, {block}",
          f"  %{tag}ap = getelementptr float, ptr %asum, i64 %{tag}ai",
          f"  %{tag}av = load float, ptr %{tag}ap, align 4",
          f"  %{tag}am = fmul float %{tag}av, %zmul",
          f"  %{tag}an = fneg float %{tag}am",
          f"  %{tag}as = insertelement {_VF} poison, float %{tag}an, i64 0",
          f"  %{tag}a8 = shufflevector {_VF} %{tag}as, {_VF} poison, <8 x i32> "
          "zeroinitializer"]
    zv = _gather8(L, tag, "%zs", block)
    L += [f"  {out} = call {_VF} @llvm.fma.v8f32({_VF} %{tag}a8, {_VF} {zv}, {_VF} {acc})"]


def _gather8(L: list[str], tag: str, table: str, block: str) -> str:
    """table[n..n+8, block] of an (N, kb) float table as a vector; returns its name."""
    L += [f"  %{tag}gi = add i64 %srow, {block}"]
    prev = "poison"
    for c in range(8):
        L += [f"  %{tag}go{c} = mul i64 %kb, {c}",
              f"  %{tag}gi{c} = add i64 %{tag}gi, %{tag}go{c}",
              f"  %{tag}gp{c} = getelementptr float, ptr {table}, i64 %{tag}gi{c}",
              f"  %{tag}g{c} = load float, ptr %{tag}gp{c}, align 4",
              f"  %{tag}gv{c} = insertelement {_VF} {prev}, float %{tag}g{c}, i64 {c}"]
        prev = f"%{tag}gv{c}"
    return prev


def _prefetch8(L: list[str], tag: str, units: str, pre: list[str]) -> None:
    """Prefetch the next eight columns' bytes linearly, one pass ahead (``units``: 16-byte
    groups of a column read before this pass; a pass reads 32 bytes of each of the eight
    columns, 256 bytes): eight interleaved streams are more than the hardware prefetcher
    follows from memory (the lm_head)."""
    L += [*pre,
          f"  %{tag}row = mul i64 %rowbytes, 8",
          f"  %{tag}base = add i64 %brow, %{tag}row",
          f"  %{tag}off = mul i64 {units}, 128"]
    for k in range(4):
        L += [f"  %{tag}o{k} = add i64 %{tag}off, {64 * k}",
              f"  %{tag}a{k} = add i64 %{tag}base, %{tag}o{k}",
              f"  %{tag}p{k} = getelementptr i8, ptr %B, i64 %{tag}a{k}",
              f"  call void @llvm.prefetch.p0(ptr %{tag}p{k}, i32 0, i32 3, i32 1)"]


def _function8() -> list[str]:
    """gemv8 (same arguments as gemv, n1 - n0 a multiple of 8): eight columns per pass for a
    few rows (decoding). The eight columns' integer block sums land in one vector, so one
    conversion, one scale vector and one fused multiply-add per block serve all eight (the
    one-column kernel pays those per column); in blocks of 32 two blocks are read at once
    (32 bytes: one mask and one shift for both). Each column's blocks are accumulated in one
    float chain, in block order."""
    L = ["define void @gemv8(ptr noalias %qa, ptr noalias %sa, ptr noalias %asum, "
         "ptr noalias %B, ptr noalias %sb, ptr noalias %zs, float %zmul, ptr noalias %C, "
         "i64 %M, i64 %n0, i64 %n1, i64 %N, i64 %kb, i64 %groups) nounwind {",
         "entry:",
         "  %bsz = mul i64 %groups, 32",
         "  %bbytes = mul i64 %groups, 16",
         "  %K = mul i64 %kb, %bsz",
         "  %rowbytes = mul i64 %kb, %bbytes",
         "  %one = icmp eq i64 %groups, 1",
         "  %kb2 = and i64 %kb, -2",
         "  %pairs = select i1 %one, i64 %kb2, i64 0",  # blocks taken two at a time
         "  %n8 = add i64 %n0, 8",
         "  %any.n = icmp sle i64 %n8, %n1",
         "  %any.m = icmp sgt i64 %M, 0",
         "  %any = and i1 %any.n, %any.m",
         "  br i1 %any, label %m.loop, label %end",
         "m.loop:",
         "  %m = phi i64 [0, %entry], [%m.next, %m.end]",
         "  %arow = mul i64 %m, %K",
         "  %sarow = mul i64 %m, %kb",
         "  br label %n.loop",
         "n.loop:",
         "  %n = phi i64 [%n0, %m.loop], [%n.next, %n.end]",
         "  %brow = mul i64 %n, %rowbytes",
         "  %srow = mul i64 %n, %kb",
         "  %any.p = icmp sgt i64 %pairs, 0",
         "  br i1 %any.p, label %p.loop, label %b.pre",
         "p.loop:",  # blocks b, b + 1 of 32
         "  %pb = phi i64 [0, %n.loop], [%pb.next, %p.loop]",
         f"  %pacc = phi {_VF} [zeroinitializer, %n.loop], [%pacc.next, %p.loop]",
         f"  %pz = phi {_VF} [zeroinitializer, %n.loop], [%pz.next, %p.loop]",
         "  %pw0 = mul i64 %pb, 16",
         "  %pw = add i64 %brow, %pw0",
         "  %pa0 = mul i64 %pb, 32",
         "  %pa = add i64 %arow, %pa0",
         "  %pap = getelementptr i8, ptr %qa, i64 %pa",
         "  %pa64 = load <64 x i8>, ptr %pap, align 1",
         "  %palo = shufflevector <64 x i8> %pa64, <64 x i8> poison, <32 x i32> "
         + _vec("i32", [*range(0, 16), *range(32, 48)]),
         "  %pahi = shufflevector <64 x i8> %pa64, <64 x i8> poison, <32 x i32> "
         + _vec("i32", [*range(16, 32), *range(48, 64)])]
    _prefetch8(L, "pf.", "%pb", [])
    r = _columns8(L, "c2.", "%pw", "%palo", "%pahi", wide=True)
    s0 = _scale8(L, "s2a.", "%pb")
    L += ["  %pb1 = add i64 %pb, 1"]
    s1 = _scale8(L, "s2b.", "%pb1")
    L += [f"  %pd0 = shufflevector <16 x i32> {r}, <16 x i32> poison, <8 x i32> "
          + _vec("i32", range(8)),
          f"  %pd1 = shufflevector <16 x i32> {r}, <16 x i32> poison, <8 x i32> "
          + _vec("i32", range(8, 16)),
          f"  %pf0 = sitofp {_V8} %pd0 to {_VF}",
          f"  %pf1 = sitofp {_V8} %pd1 to {_VF}",
          f"  %pacc1 = call {_VF} @llvm.fma.v8f32({_VF} %pf0, {_VF} {s0}, {_VF} %pacc)",
          f"  %pacc.next = call {_VF} @llvm.fma.v8f32({_VF} %pf1, {_VF} {s1}, {_VF} %pacc1)"]
    _zshare8(L, "z2a.", "%pb", "%pz", "%pz1")
    _zshare8(L, "z2b.", "%pb1", "%pz1", "%pz.next")
    L += [
          *latch("pb", "2", "p.more", "%pairs", "p.loop", "b.pre"),
          "b.pre:",
          "  %b0 = phi i64 [0, %n.loop], [%pb.next, %p.loop]",
          f"  %acc0 = phi {_VF} [zeroinitializer, %n.loop], [%pacc.next, %p.loop]",
          f"  %z0 = phi {_VF} [zeroinitializer, %n.loop], [%pz.next, %p.loop]",
          "  %any.b = icmp slt i64 %b0, %kb",
          "  br i1 %any.b, label %b.loop, label %n.end",
          "b.loop:",  # the rest one block at a time, 16 bytes of it per pass
          "  %b = phi i64 [%b0, %b.pre], [%b.next, %b.end]",
          f"  %acc = phi {_VF} [%acc0, %b.pre], [%acc.next, %b.end]",
          f"  %z = phi {_VF} [%z0, %b.pre], [%z.next, %b.end]",
          "  %bbase = mul i64 %b, %bbytes",
          "  %bbase2 = add i64 %brow, %bbase",
          "  %abase0 = mul i64 %b, %bsz",
          "  %abase = add i64 %arow, %abase0",
          "  %godd = and i64 %groups, 1",
          "  %geven = icmp eq i64 %godd, 0",
          "  br i1 %geven, label %h.loop, label %g.loop",
          "h.loop:",  # blocks of 64-256: two 16-byte groups of the block per pass
          "  %h = phi i64 [0, %b.loop], [%h.next, %h.loop]",
          f"  %hdot = phi {_V8} [zeroinitializer, %b.loop], [%hdot.next, %h.loop]",
          "  %hao0 = mul i64 %h, 32",
          "  %hao = add i64 %abase, %hao0",
          "  %hap = getelementptr i8, ptr %qa, i64 %hao",
          "  %ha64 = load <64 x i8>, ptr %hap, align 1",
          "  %halo = shufflevector <64 x i8> %ha64, <64 x i8> poison, <32 x i32> "
          + _vec("i32", [*range(0, 16), *range(32, 48)]),
          "  %hahi = shufflevector <64 x i8> %ha64, <64 x i8> poison, <32 x i32> "
          + _vec("i32", [*range(16, 32), *range(48, 64)]),
          "  %hbo0 = mul i64 %h, 16",
          "  %hbo = add i64 %bbase2, %hbo0"]
    _prefetch8(L, "hp.", "%hpass", ["  %hpb = mul i64 %b, %groups",
                                    "  %hpass = add i64 %hpb, %h"])
    r2 = _columns8(L, "c3.", "%hbo", "%halo", "%hahi", wide=True)
    L += [f"  %hd0 = shufflevector <16 x i32> {r2}, <16 x i32> poison, <8 x i32> "
          + _vec("i32", range(8)),
          f"  %hd1 = shufflevector <16 x i32> {r2}, <16 x i32> poison, <8 x i32> "
          + _vec("i32", range(8, 16)),
          f"  %hd = add {_V8} %hd0, %hd1",
          f"  %hdot.next = add {_V8} %hdot, %hd",
          *latch("h", "2", "h.more", "%groups", "h.loop", "b.end"),
          "g.loop:",
          "  %g = phi i64 [0, %b.loop], [%g.next, %g.loop]",
          f"  %dot = phi {_V8} [zeroinitializer, %b.loop], [%dot.next, %g.loop]",
          "  %aoff = mul i64 %g, 32",
          "  %ao = add i64 %abase, %aoff",
          "  %ap = getelementptr i8, ptr %qa, i64 %ao",
          f"  %a = load {_V32B}, ptr %ap, align 1",
          "  %goff = mul i64 %g, 16",
          "  %bo = add i64 %bbase2, %goff"]
    r = _columns8(L, "c1.", "%bo", "%a", "", wide=False)
    L += [f"  %dot.next = add {_V8} %dot, {r}",
          *latch("g", "1", "g.more", "%groups", "g.loop", "b.end"),
          "b.end:",
          f"  %dsum = phi {_V8} [%dot.next, %g.loop], [%hdot.next, %h.loop]"]
    s = _scale8(L, "s1.", "%b")
    L += [f"  %df = sitofp {_V8} %dsum to {_VF}",
          f"  %acc.next = call {_VF} @llvm.fma.v8f32({_VF} %df, {_VF} {s}, {_VF} %acc)"]
    _zshare8(L, "z1.", "%b", "%z", "%z.next")
    L += [
          *latch("b", "1", "b.more", "%kb", "b.loop", "n.end"),
          "n.end:",
          f"  %res.d = phi {_VF} [%acc0, %b.pre], [%acc.next, %b.end]",
          f"  %res.z = phi {_VF} [%z0, %b.pre], [%z.next, %b.end]",
          f"  %res = fadd {_VF} %res.d, %res.z",
          "  %ci0 = mul i64 %m, %N",
          "  %ci = add i64 %ci0, %n",
          "  %cp = getelementptr float, ptr %C, i64 %ci",
          f"  store {_VF} %res, ptr %cp, align 4",
          "  %n.next = add i64 %n, 8",
          "  %n.last = add i64 %n.next, 8",
          "  %n.more = icmp sle i64 %n.last, %n1",
          "  br i1 %n.more, label %n.loop, label %m.end",
          "m.end:",
          *latch("m", "1", "m.more", "%M", "m.loop", "end"),
          "end:",
          "  ret void",
          "}",
          "declare <16 x i16> @llvm.x86.avx2.phadd.w(<16 x i16>, <16 x i16>)",
          "declare void @llvm.prefetch.p0(ptr, i32, i32, i32)"]
    return L


def _quantize_frame(name: str, params: str, setup: list[str], body: list[str],
                    total: str) -> list[str]:
    """A quantize function: for each row m and block b (``%base``'s offset set up by
    ``body``, which stores the codes and the scale), then ``asum`` = sa * ``total``."""
    return [f"define void @{name}(ptr noalias %A, ptr noalias %qa, ptr noalias %sa, "
            f"ptr noalias %asum, i64 %M, i64 %kb{params}) nounwind {{",
            "entry:",
            *setup,
            "  %any = icmp sgt i64 %M, 0",
            "  br i1 %any, label %m.loop, label %end",
            "m.loop:",
            "  %m = phi i64 [0, %entry], [%m.next, %m.end]",
            "  %arow = mul i64 %m, %K",
            "  %srow = mul i64 %m, %kb",
            "  br label %b.loop",
            "b.loop:",
            "  %b = phi i64 [0, %m.loop], [%b.next, %b.end]",
            *body,
            f"  %totalf = sitofp i32 {total} to float",
            "  %blocksum = fmul float %scale, %totalf",
            "  %up = getelementptr float, ptr %asum, i64 %si",
            "  store float %blocksum, ptr %up, align 4",
            "  br label %b.end",
            "b.end:",
            *latch("b", "1", "b.more", "%kb", "b.loop", "m.end"),
            "m.end:",
            *latch("m", "1", "m.more", "%M", "m.loop", "end"),
            "end:",
            "  ret void",
            "}"]


def _scale() -> list[str]:
    """%inv = 127 / %amax (0 where amax is 0), %scale = amax / 127, %si the block's index."""
    return ["  %nz = fcmp one float %amax, 0.0",
            "  %inv0 = fdiv float 127.0, %amax",
            "  %inv = select i1 %nz, float %inv0, float 0.0",
            "  %scale = fdiv float %amax, 127.0",
            "  %si = add i64 %srow, %b"]


def _quantize_block(block: int) -> tuple[list[str], str]:
    """quantize{block}'s body (nbits_blocks' layout, a constant block of 16-256, unrolled):
    each 64 codes their 32 even-indexed then 32 odd-indexed; a block of 16 in a group of four
    its 8 evens at 8p, its 8 odds at 32 + 8p, one after the groups of four in order."""
    C = min(block, 64)  # elements per chunk
    VC, VI, VB = f"<{C} x float>", f"<{C} x i32>", f"<{C} x i8>"
    chunks = range(block // C)
    L = [f"  %boff = mul i64 %b, {block}",
         "  %base = add i64 %arow, %boff"]
    prev = None
    for c in chunks:
        L += [f"  %o{c} = add i64 %base, {C * c}",
              f"  %p{c} = getelementptr float, ptr %A, i64 %o{c}",
              f"  %v{c} = load {VC}, ptr %p{c}, align 4",
              f"  %av{c} = call {VC} @llvm.fabs.v{C}f32({VC} %v{c})"]
        if prev is None:
            prev = f"%av{c}"
        else:
            L += [f"  %mx{c} = call {VC} @llvm.maxnum.v{C}f32({VC} {prev}, {VC} %av{c})"]
            prev = f"%mx{c}"
    L += [f"  %amax = call float @llvm.vector.reduce.fmax.v{C}f32({VC} {prev})",
          *_scale(),
          "  %sp = getelementptr float, ptr %sa, i64 %si",
          "  store float %scale, ptr %sp, align 4",
          f"  %invv.0 = insertelement {VC} poison, float %inv, i64 0",
          f"  %invv = shufflevector {VC} %invv.0, {VC} poison, <{C} x i32> zeroinitializer"]
    total = None
    for c in chunks:
        L += [f"  %ws{c} = fmul {VC} %v{c}, %invv",
              f"  %wr{c} = call {VC} @llvm.rint.v{C}f32({VC} %ws{c})",
              f"  %wi{c} = fptosi {VC} %wr{c} to {VI}",
              f"  %t{c} = call i32 @llvm.vector.reduce.add.v{C}i32({VI} %wi{c})",
              f"  %wb{c} = trunc {VI} %wi{c} to {VB}"]
        if total is None:
            total = f"%t{c}"
        else:
            L += [f"  %tt{c} = add i32 {total}, %t{c}"]
            total = f"%tt{c}"
    H = C // 2
    even = _vec("i32", range(0, C, 2))
    odd = _vec("i32", range(1, C, 2))
    VH8 = f"<{H} x i8>"
    if block >= 64:  # each chunk one group: its evens, then its odds
        for c in chunks:
            L += [f"  %ev{c} = shufflevector {VB} %wb{c}, {VB} poison, <{H} x i32> {even}",
                  f"  %od{c} = shufflevector {VB} %wb{c}, {VB} poison, <{H} x i32> {odd}",
                  f"  %q{c} = getelementptr i8, ptr %qa, i64 %o{c}",
                  f"  store {VH8} %ev{c}, ptr %q{c}, align 1",
                  f"  %qo{c} = getelementptr i8, ptr %q{c}, i64 {H}",
                  f"  store {VH8} %od{c}, ptr %qo{c}, align 1"]
        L += ["  br label %sums"]
    else:  # a block of 16 in a group of four: evens at 8p, odds at 32 + 8p; else in order
        L += ["  %ingroup = icmp slt i64 %b, %kb4",
              "  br i1 %ingroup, label %grp, label %alone",
              "grp:",
              "  %pos = and i64 %b, 3",
              "  %pos8 = mul i64 %pos, 8",
              "  %gb = sub i64 %boff, %pos8",  # 16 b - 8 p = 64 (b / 4) + 8 p
              "  %ge = add i64 %arow, %gb",
              f"  %ev = shufflevector {VB} %wb0, {VB} poison, <8 x i32> {even}",
              f"  %od = shufflevector {VB} %wb0, {VB} poison, <8 x i32> {odd}",
              "  %qe = getelementptr i8, ptr %qa, i64 %ge",
              "  store <8 x i8> %ev, ptr %qe, align 1",
              "  %qo = getelementptr i8, ptr %qe, i64 32",
              "  store <8 x i8> %od, ptr %qo, align 1",
              "  br label %sums",
              "alone:",
              "  %ql = getelementptr i8, ptr %qa, i64 %base",
              f"  store {VB} %wb0, ptr %ql, align 1",
              "  br label %sums"]
    return L + ["sums:"], total


def quantize_ir(pairs: bool = False, block: int | None = None) -> list[str]:
    """quantize(A, qa, sa, asum, M, kb[, groups]): A's rows to quantize_rows's int8 codes with
    the same float operations in the same order (amax, 127 / amax or 0, rint of a * inv,
    amax / 127), and each block's sa * (sum of its codes, exact): the factor of the zero
    points' share. One generator for both kernels' layouts:

    - ``pairs=False`` (this module): blocks of ``groups`` x 32 values, each 32 codes the 16
      even-indexed then the 16 odd-indexed, one scale per block in ``sa``;
    - ``pairs=True`` (nbits_gemm, no ``groups``: blocks of 32): two neighbouring blocks'
      codes as [b even | b+1 even | b odd | b+1 odd] (a last unpaired block in order), each
      scale four times in ``sa`` (MLAS's four-lane scale vectors);
    - ``block`` (nbits_blocks, blocks of 16-256: ``quantize{block}``, no ``groups``, its
      declarations left to the caller): see _quantize_block."""
    if block is not None:
        body, total = _quantize_block(block)
        setup = [f"  %K = mul i64 %kb, {block}", "  %kb4 = and i64 %kb, -4"]
        return _quantize_frame(f"quantize{block}", "", setup, body, total)
    VF32, VI32, VB32, VB16 = "<32 x float>", "<32 x i32>", "<32 x i8>", "<16 x i8>"
    # each 32 codes: the 16 even-indexed, then the 16 odd-indexed
    order = "<32 x i32> <" + ", ".join(
        f"i32 {i}" for i in [*range(0, 32, 2), *range(1, 32, 2)]) + ">"
    setup = ["  %K = mul i64 %kb, 32", "  %pairs2 = and i64 %kb, -2"] if pairs else \
        ["  %bsz = mul i64 %groups, 32", "  %K = mul i64 %kb, %bsz"]  # pairs2: whole pairs
    L = []
    if pairs:  # one vector a block: its amax straight from it
        L += ["  %boff = mul i64 %b, 32",
              "  %base = add i64 %arow, %boff",
              "  %p = getelementptr float, ptr %A, i64 %base",
              f"  %v = load {VF32}, ptr %p, align 4",
              f"  %av = call {VF32} @llvm.fabs.v32f32({VF32} %v)",
              f"  %amax = call float @llvm.vector.reduce.fmax.v32f32({VF32} %av)"]
    else:
        L += ["  %boff = mul i64 %b, %bsz",
              "  %base = add i64 %arow, %boff",
              "  br label %x.loop",
              "x.loop:",  # the block's amax
              "  %g = phi i64 [0, %b.loop], [%g.next, %x.loop]",
              f"  %mx = phi {VF32} [zeroinitializer, %b.loop], [%mx.next, %x.loop]",
              "  %goff = mul i64 %g, 32",
              "  %i = add i64 %base, %goff",
              "  %p = getelementptr float, ptr %A, i64 %i",
              f"  %v = load {VF32}, ptr %p, align 4",
              f"  %av = call {VF32} @llvm.fabs.v32f32({VF32} %v)",
              f"  %mx.next = call {VF32} @llvm.maxnum.v32f32({VF32} %mx, {VF32} %av)",
              *latch("g", "1", "g.more", "%groups", "x.loop", "x.end"),
              "x.end:",
              f"  %amax = call float @llvm.vector.reduce.fmax.v32f32({VF32} %mx.next)"]
    L += [*_scale(),
          f"  %ins = insertelement {VF32} poison, float %inv, i64 0",
          f"  %invv = shufflevector {VF32} %ins, {VF32} poison, <32 x i32> zeroinitializer"]
    if pairs:
        L += ["  %s4i = mul i64 %si, 4",
              "  %s4p = getelementptr float, ptr %sa, i64 %s4i",
              "  %sc0 = insertelement <4 x float> poison, float %scale, i64 0",
              "  %sc4 = shufflevector <4 x float> %sc0, <4 x float> poison, <4 x i32> "
              "zeroinitializer",
              "  store <4 x float> %sc4, ptr %s4p, align 4",
              f"  %ws = fmul {VF32} %v, %invv",
              f"  %wr = call {VF32} @llvm.rint.v32f32({VF32} %ws)",
              f"  %wi = fptosi {VF32} %wr to {VI32}",
              f"  %total = call i32 @llvm.vector.reduce.add.v32i32({VI32} %wi)",
              f"  %wb = trunc {VI32} %wi to {VB32}",
              "  %inpair = icmp slt i64 %b, %pairs2",
              "  %half = and i64 %b, 1",
              "  %pb = sub i64 %b, %half",
              "  %pbase0 = mul i64 %pb, 32",
              "  %h16 = mul i64 %half, 16",
              "  %pbase = add i64 %pbase0, %h16",
              "  %ebase = add i64 %arow, %pbase",
              "  %obase = add i64 %ebase, 32",
              "  br i1 %inpair, label %pair, label %alone",
              "pair:",
              f"  %ev = shufflevector {VB32} %wb, {VB32} poison, <16 x i32> "
              f"<{', '.join(f'i32 {i}' for i in range(0, 32, 2))}>",
              f"  %od = shufflevector {VB32} %wb, {VB32} poison, <16 x i32> "
              f"<{', '.join(f'i32 {i}' for i in range(1, 32, 2))}>",
              "  %ep = getelementptr i8, ptr %qa, i64 %ebase",
              f"  store {VB16} %ev, ptr %ep, align 1",
              "  %op = getelementptr i8, ptr %qa, i64 %obase",
              f"  store {VB16} %od, ptr %op, align 1",
              "  br label %sums",
              "alone:",
              "  %lp = getelementptr i8, ptr %qa, i64 %base",
              f"  store {VB32} %wb, ptr %lp, align 1",
              "  br label %sums",
              "sums:"]
    else:
        L += ["  %sp = getelementptr float, ptr %sa, i64 %si",
              "  store float %scale, ptr %sp, align 4",
              "  br label %q.loop",
              "q.loop:",  # codes, in the kernels' layout, and their sum
              "  %h = phi i64 [0, %x.end], [%h.next, %q.loop]",
              f"  %sum = phi {VI32} [zeroinitializer, %x.end], [%sum.next, %q.loop]",
              "  %hoff = mul i64 %h, 32",
              "  %j = add i64 %base, %hoff",
              "  %pj = getelementptr float, ptr %A, i64 %j",
              f"  %w = load {VF32}, ptr %pj, align 4",
              f"  %ws = fmul {VF32} %w, %invv",
              f"  %wr = call {VF32} @llvm.rint.v32f32({VF32} %ws)",
              f"  %wi = fptosi {VF32} %wr to {VI32}",
              f"  %sum.next = add {VI32} %sum, %wi",
              f"  %wo = shufflevector {VI32} %wi, {VI32} poison, {order}",
              f"  %wb = trunc {VI32} %wo to {VB32}",
              "  %pq = getelementptr i8, ptr %qa, i64 %j",
              f"  store {VB32} %wb, ptr %pq, align 1",
              *latch("h", "1", "h.more", "%groups", "q.loop", "q.end"),
              "q.end:",
              f"  %total = call i32 @llvm.vector.reduce.add.v32i32({VI32} %sum.next)"]
    return [*_quantize_frame("quantize", "" if pairs else ", i64 %groups", setup, L, "%total"),
        f"declare {VF32} @llvm.fabs.v32f32({VF32})",
        *([] if pairs else [f"declare {VF32} @llvm.maxnum.v32f32({VF32}, {VF32})"]),
        f"declare float @llvm.vector.reduce.fmax.v32f32({VF32})",
        f"declare {VF32} @llvm.rint.v32f32({VF32})",
        f"declare i32 @llvm.vector.reduce.add.v32i32({VI32})"]


def module_ir(target=None) -> str:
    """gemv / gemv4 (qa, sa, B, sb, C, M, n0, n1, N, kb, groups): columns n0..n1 of C for the
    rows of A, one or four at a time (gemv4 leaves the last M % 4 rows alone); ``groups`` =
    block size / 32; qa is (M, kb * groups * 32) int8 laid out as above, sa (M, kb), B
    (N, kb, groups * 16) bytes, sb (N, kb), C (M, N) float32."""
    return "\n".join([*_function("gemv", 1), *_function("gemv4", 4), *_function8(),
                      *quantize_ir(),
                      f"declare {_VF} @llvm.fma.v8f32({_VF}, {_VF}, {_VF})",
                      f"declare float @llvm.vector.reduce.fadd.v8f32(float, {_VF})",
                      f"declare {_VH} @llvm.x86.avx2.pmadd.ub.sw({_V32B}, {_V32B})",
                      f"declare {_V8} @llvm.x86.avx2.pmadd.wd({_VH}, {_VH})"])


_P = ctypes.c_void_p
_I = ctypes.c_int64
_PROTO = ctypes.CFUNCTYPE(None, _P, _P, _P, _P, _P, _I, _I, _I, _I, _I, _I)


def unavailable() -> str | None:
    return jit.why_unavailable(REQUIRES) or jit.why_not_loaded("nbits_gemv", _module)


_QUANT = ctypes.CFUNCTYPE(None, _P, _P, _P, _P, _I, _I, _I)
_PROTO8 = ctypes.CFUNCTYPE(None, _P, _P, _P, _P, _P, _P, ctypes.c_float, _P, _I, _I, _I, _I,
                           _I, _I)


def _module() -> jit.Module:
    return jit.compile_module("nbits_gemv", module_ir, {"gemv": _PROTO, "gemv4": _PROTO,
                                                        "gemv8": _PROTO8, "quantize": _QUANT},
                              REQUIRES)


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
    it for every projection of every layer, so the per-call cost is the Python around it).
    ``zs``: zero point * scales, (N, kb) like the scales, where the weight has zero points
    (None: the default zero point 8, read as 8 * scales, exactly the same numbers)."""

    def __init__(self, packed: np.ndarray, scales: np.ndarray, block_size: int,
                 zs: np.ndarray | None = None) -> None:
        self.zmul = 8.0 if zs is None else 1.0
        zs = scales if zs is None else np.ascontiguousarray(zs, dtype=np.float32)
        self.packed, self.scales, self.zs = packed, scales, zs  # kept alive: the kernel reads them
        module = _module()
        self.fn, self.fn4, self.fn8 = module.gemv, module.gemv4, module.gemv8
        self.b, self.s, self.z = packed.ctypes.data, scales.ctypes.data, zs.ctypes.data
        self.groups = block_size // 32
        self.kb = scales.shape[1]
        self.K = self.kb * block_size
        self._quantize = module.quantize

    def quantize(self, A: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """quantize_rows(A) compiled, for this weight's blocks: the codes, the scales and
        sa * sums (bit for bit; a decode step's numpy calls cost more than the kernel)."""
        M, K = A.shape
        if K != self.K or A.dtype != np.float32 or not A.flags.c_contiguous:
            full = np.zeros((M, self.K), np.float32)  # the last block padded with zeros
            full[:, :K] = A
            A = full
        qa = np.empty((M, self.K), np.int8)
        sa = np.empty((M, self.kb), np.float32)
        asum = np.empty((M, self.kb), np.float32)
        address = jit.address
        self._quantize(address(A), address(qa), address(sa), address(asum), M, self.kb,
                       self.groups)
        return qa, sa, asum

    def __call__(self, qa: np.ndarray, sa: np.ndarray, out: np.ndarray, n0: int,
                 n1: int) -> None:
        """out[:, n0:n1] = the zero-point-free block products (see the module's doc); qa, sa
        and out C-contiguous, from quantize_rows and (M, N)."""
        M, kb = sa.shape
        address = jit.address
        pq, ps, po = address(qa), address(sa), address(out)
        rest = (n0, n1, out.shape[1], kb, self.groups)
        four = M - M % 4
        if four:
            self.fn4(pq, ps, self.b, self.s, po, four, *rest)
        if four < M:
            K = qa.shape[1]
            self.fn(pq + four * K, ps + four * kb * 4, self.b, self.s,
                    po + four * out.shape[1] * 4, M - four, *rest)

    def decode(self, qa: np.ndarray, sa: np.ndarray, asum: np.ndarray, out: np.ndarray,
               n0: int, n1: int) -> None:
        """out[:, n0:n1] = the whole product, the zero points' share included, eight columns
        per pass (gemv8: for decoding's few rows); a range not a multiple of 8 ends with the
        eight columns up to n1 (the columns computed twice get the same numbers)."""
        M, kb = sa.shape
        N = out.shape[1]
        address = jit.address
        args = (address(qa), address(sa), address(asum), self.b, self.s, self.z, self.zmul,
                address(out), M)
        if n1 - n0 < 8:  # too few columns for a pass of eight
            self(qa, sa, out, n0, n1)
            out[:, n0:n1] -= asum @ (np.float32(self.zmul) * self.zs[n0:n1]).T
            return
        n8 = n0 + (n1 - n0) // 8 * 8
        self.fn8(*args, n0, n8, N, kb, self.groups)
        if n8 < n1:
            self.fn8(*args, n1 - 8, n1, N, kb, self.groups)


# compiled with the other kernels on first use (jit._BUNDLE)
BUNDLE = {"nbits_gemv": (module_ir, REQUIRES)}

__all__ = ["BUNDLE", "REQUIRES", "Gemv", "module_ir", "quantize_rows", "supported",
           "unavailable"]
