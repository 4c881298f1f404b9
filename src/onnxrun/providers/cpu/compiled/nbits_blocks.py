"""com.microsoft MatMulNBits (4 bits) with MLAS's AVX2 arithmetic, bit for bit, where
compiled/nbits_gemm.py (blocks of 32 at accuracy_level 4) does not reach: blocks of 16, 64,
128 and 256 at accuracy_level 4 (MLAS's CompInt8 kernels), and any block at levels 0-3
(CompFp32). Why the bits matter: see nbits_gemm.py (a level-4 product quantizes its input, so
a last-bit difference upstream flips codes layer after layer).

CompInt8 (onnxruntime 1.32, sqnbitgemm_kernel_avx2_int8_blklen16.h / _blklen64.h), per output
(m, n), A quantized per block as nbits_gemm's quantize_rows does (amax / 127, round half even):
- K in groups of 64 elements (a sub-block of a block of 64-256; four blocks of 16): the
  u8 x s8 products summed exactly over each 8 consecutive elements, eight int32 lanes in the
  order [0-7, 8-15, 32-39, 40-47, 16-23, 24-31, 48-55, 56-63], converted to float and
  accumulated by one fused multiply-add with sa * sb of each lane's block;
- blocks of 16 left over after the groups of four (kb % 4) one at a time, lane j the pair of
  elements 2j, 2j + 1;
- the lanes folded as FoldAccumulators (columns in MLAS's groups of four) or hsum_float_8 (the
  last N % 4 columns), the bias added, then the zero points' share (nbits_gemm.zshare_ir);
- except one row with blocks of 64-256 (MLAS's M == 1 kernel): the nibbles minus their zero
  point in integers, the same lanes, no share after.
In registers the lanes stay in element order (lane L: elements 8L..8L+7, MLAS's lane
_SWAP[L]); the fold reads them in MLAS's order. A's codes are laid out per group of 64 as
their 32 even-indexed then 32 odd-indexed elements, to meet the weight's low and high nibbles;
a leftover block of 16 in element order.

CompFp32 (levels 0-3), each weight (q - zp) * scale in float32. One row
(SQ4BitGemmM1Kernel_CompFp32_avx2, from the packed weight, dequantized in registers): eight
lanes per column, lane j the fused multiply-add chain over k = j, j + 8, ... in order; folded
as FoldAccumulators, or for the last N % 4 columns as (lo + hi) then two horizontal adds; the
bias added. Several rows (the weight dequantized once, K x N, through MLAS's FMA3 SGEMM kernel
over all of K): one fused multiply-add chain per output in k order, then the bias.
"""

from __future__ import annotations

import ctypes

import numpy as np

from . import jit
from .ir import job, latch
from .nbits_gemm import MAX_STACK_K, RowParts, zshare_ir
from .nbits_gemv import quantize_ir

REQUIRES = ("avx2", "fma")
BLOCKS = (16, 64, 128, 256)  # CompInt8 here (32: nbits_gemm)
FP32_BLOCKS = (16, 32, 64, 128, 256)  # CompFp32
ROWS = 4  # rows of A per column pass (their codes share the column's unpacked weight)
NBLOCK = 16  # columns per block of the row loop (their weight stays in cache)
PANEL = 16  # columns of the dequantized weight's panels (contiguous along K, as MLAS packs B)
COLS = 4  # columns per pass of the one-row kernels (A's codes or floats loaded once for all)

_V32B = "<32 x i8>"
_VH = "<16 x i16>"
_V8 = "<8 x i32>"
_VF = "<8 x float>"
_SWAP = [0, 1, 4, 5, 2, 3, 6, 7]  # register lane L holds MLAS's lane _SWAP[L] (an involution)


def _vec(elem: str, values) -> str:
    return "<" + ", ".join(f"{elem} {v}" for v in values) + ">"


def _splat(L: list[str], name: str, scalar: str, n: int = 8, ty: str = "float") -> str:
    L += [f"  %{name}.0 = insertelement <{n} x {ty}> poison, {ty} {scalar}, i64 0",
          f"  %{name} = shufflevector <{n} x {ty}> %{name}.0, <{n} x {ty}> poison, "
          f"<{n} x i32> zeroinitializer"]
    return f"%{name}"


def _fold(L: list[str], acc: str, t: str, fp32: bool = False) -> tuple[str, str]:
    """The two ways MLAS folds a column's eight lanes ``acc`` into one float (names suffixed
    ``_{t}``): FoldAccumulators, ((x0 + x1) + x2) + x3 + (((x4 + x5) + x6) + x7) (returned
    first), and the single columns' horizontal sum: CompInt8's hsum_float_8 pairs lanes
    (0 + 4) + (2 + 6), (1 + 5) + (3 + 7); CompFp32's (lo + hi) then two horizontal adds,
    (0 + 4) + (1 + 5), (2 + 6) + (3 + 7). CompInt8's lanes are read through _SWAP (register
    lane L holds MLAS's lane _SWAP[L]), CompFp32's in order."""
    x = [f"%x{i}_{t}" for i in range(8)]
    L += [f"  {x[i]} = extractelement {_VF} {acc}, i64 {i if fp32 else _SWAP[i]}"
          for i in range(8)]
    L += [f"  %l1_{t} = fadd float {x[0]}, {x[1]}",
          f"  %l2_{t} = fadd float %l1_{t}, {x[2]}",
          f"  %l3_{t} = fadd float %l2_{t}, {x[3]}",
          f"  %u1_{t} = fadd float {x[4]}, {x[5]}",
          f"  %u2_{t} = fadd float %u1_{t}, {x[6]}",
          f"  %u3_{t} = fadd float %u2_{t}, {x[7]}",
          f"  %fo_{t} = fadd float %l3_{t}, %u3_{t}"]
    if fp32:
        L += [f"  %v0_{t} = fadd float {x[0]}, {x[4]}",
              f"  %v1_{t} = fadd float {x[1]}, {x[5]}",
              f"  %v2_{t} = fadd float {x[2]}, {x[6]}",
              f"  %v3_{t} = fadd float {x[3]}, {x[7]}",
              f"  %h01_{t} = fadd float %v0_{t}, %v1_{t}",
              f"  %h23_{t} = fadd float %v2_{t}, %v3_{t}",
              f"  %hs_{t} = fadd float %h01_{t}, %h23_{t}"]
    else:
        L += [f"  %e04_{t} = fadd float {x[0]}, {x[4]}",
              f"  %e26_{t} = fadd float {x[2]}, {x[6]}",
              f"  %e15_{t} = fadd float {x[1]}, {x[5]}",
              f"  %e37_{t} = fadd float {x[3]}, {x[7]}",
              f"  %e0_{t} = fadd float %e04_{t}, %e26_{t}",
              f"  %e1_{t} = fadd float %e15_{t}, %e37_{t}",
              f"  %hs_{t} = fadd float %e0_{t}, %e1_{t}"]
    return f"%fo_{t}", f"%hs_{t}"


def _column16(rows: int) -> list[str]:
    """@col16_{rows}'s loop body: a group of four blocks of 16 (lane L's block is L // 2)."""
    L = ["  %g32 = mul i64 %g, 32",
         "  %bo = add i64 %brow, %g32",
         "  %bp = getelementptr i8, ptr %B, i64 %bo",
         f"  %w = load {_V32B}, ptr %bp, align 1",
         f"  %lo = and {_V32B} %w, {_vec('i8', [15] * 32)}",
         f"  %hi = lshr {_V32B} %w, {_vec('i8', [4] * 32)}",
         "  %g64 = mul i64 %g, 64",
         "  %b4 = shl i64 %g, 2",
         "  %sbi = add i64 %bsrow, %b4",
         "  %sbp = getelementptr float, ptr %sb, i64 %sbi",
         "  %sb4 = load <4 x float>, ptr %sbp, align 4"]
    for r in range(rows):
        L += [f"  %ao{r} = add i64 %arow{r}, %g64",
              f"  %ap{r} = getelementptr i8, ptr %qa, i64 %ao{r}",
              *_group_dot(f"%ap{r}", "%lo", "%hi", f"%f{r}", f"{r}"),
              f"  %sai{r} = add i64 %srow{r}, %b4",
              f"  %sap{r} = getelementptr float, ptr %sa, i64 %sai{r}",
              f"  %sa4_{r} = load <4 x float>, ptr %sap{r}, align 4",
              f"  %s4_{r} = fmul <4 x float> %sa4_{r}, %sb4",
              f"  %sv{r} = shufflevector <4 x float> %s4_{r}, <4 x float> poison, "
              f"<8 x i32> {_vec('i32', [0, 0, 1, 1, 2, 2, 3, 3])}",
              f"  %acc{r}.n = call {_VF} @llvm.fma.v8f32({_VF} %f{r}, {_VF} %sv{r}, "
              f"{_VF} %acc{r})"]
    return L


def _group_dot(ap: str, lo: str, hi: str, f: str, t: str) -> list[str]:
    """``f``: the eight float lanes of a group of 64 (A's codes at ``ap``: 32 even-indexed,
    32 odd-indexed; the weight's nibbles ``lo``, ``hi``), lane L the exact sum of elements
    8L..8L+7's products."""
    return [f"  %ae{t} = load {_V32B}, ptr {ap}, align 1",
            f"  %apo{t} = getelementptr i8, ptr {ap}, i64 32",
            f"  %ad{t} = load {_V32B}, ptr %apo{t}, align 1",
            f"  %pe{t} = call {_VH} @llvm.x86.avx2.pmadd.ub.sw({_V32B} {lo}, {_V32B} %ae{t})",
            f"  %po{t} = call {_VH} @llvm.x86.avx2.pmadd.ub.sw({_V32B} {hi}, {_V32B} %ad{t})",
            f"  %ps{t} = add {_VH} %pe{t}, %po{t}",
            f"  %q{t} = call {_V8} @llvm.x86.avx2.pmadd.wd({_VH} %ps{t}, "
            f"{_VH} {_vec('i16', [1] * 16)})",
            f"  {f} = sitofp {_V8} %q{t} to {_VF}"]


def _column_block(block: int, rows: int) -> list[str]:
    """@col{block}_{rows}'s loop body (blocks of 64-256): one block, groups g..g+per-1 (per =
    block / 64), its scale sa * sb per row formed once, each group's fused multiply-add in
    order."""
    per = block // 64
    shift = per.bit_length() - 1
    L = [f"  %blk = lshr i64 %g, {shift}" if shift else "  %blk = add i64 %g, 0",
         "  %sbi = add i64 %bsrow, %blk",
         "  %sbp = getelementptr float, ptr %sb, i64 %sbi",
         "  %sbv = load float, ptr %sbp, align 4",
         "  %g32 = mul i64 %g, 32",
         "  %bo = add i64 %brow, %g32",
         "  %g64 = mul i64 %g, 64"]
    for r in range(rows):
        L += [f"  %sai{r} = add i64 %srow{r}, %blk",
              f"  %sap{r} = getelementptr float, ptr %sa, i64 %sai{r}",
              f"  %sav{r} = load float, ptr %sap{r}, align 4",
              f"  %s{r} = fmul float %sav{r}, %sbv"]
        _splat(L, f"sv{r}", f"%s{r}")
        L += [f"  %ao{r} = add i64 %arow{r}, %g64"]
    acc = {r: f"%acc{r}" for r in range(rows)}
    for u in range(per):
        L += [f"  %bo_{u} = add i64 %bo, {32 * u}",
              f"  %bp_{u} = getelementptr i8, ptr %B, i64 %bo_{u}",
              f"  %w_{u} = load {_V32B}, ptr %bp_{u}, align 1",
              f"  %lo_{u} = and {_V32B} %w_{u}, {_vec('i8', [15] * 32)}",
              f"  %hi_{u} = lshr {_V32B} %w_{u}, {_vec('i8', [4] * 32)}"]
        for r in range(rows):
            t = f"{r}_{u}"
            out = f"%acc{r}.n" if u == per - 1 else f"%acc{t}"
            L += [f"  %aou{t} = add i64 %ao{r}, {64 * u}",
                  f"  %ap{t} = getelementptr i8, ptr %qa, i64 %aou{t}",
                  *_group_dot(f"%ap{t}", f"%lo_{u}", f"%hi_{u}", f"%f{t}", t),
                  f"  {out} = call {_VF} @llvm.fma.v8f32({_VF} %f{t}, {_VF} %sv{r}, "
                  f"{_VF} {acc[r]})"]
            acc[r] = out
    return L



def _column(block: int, rows: int) -> list[str]:
    """@col{block}_{rows}: C[m..m+rows, n] of one column for several rows (see the module's
    doc); C holds the zero points' share on entry (Zq is not read)."""
    R = range(rows)
    name = f"col{block}_{rows}"
    per = block // 64  # groups per block (blocks of 64-256)
    L = [f"define internal void @{name}(ptr noalias %qa, ptr noalias %sa, ptr noalias %Zq, "
         "ptr noalias %B, ptr noalias %sb, ptr noalias %bias, ptr %C, i64 %m, i64 %n, "
         "i64 %N, i64 %kb, i64 %nfold) nounwind alwaysinline {",
         "entry:",
         f"  %K = mul i64 %kb, {block}",
         f"  %rowbytes = mul i64 %kb, {block // 2}",
         f"  %groups = {'lshr i64 %kb, 2' if block == 16 else f'mul i64 %kb, {per}'}",
         *(f"  %mr{r} = add i64 %m, {r}" for r in R),
         *(f"  %arow{r} = mul i64 %mr{r}, %K" for r in R),
         *(f"  %srow{r} = mul i64 %mr{r}, %kb" for r in R),
         "  %brow = mul i64 %n, %rowbytes",
         "  %bsrow = mul i64 %n, %kb",
         "  %anyg = icmp ugt i64 %groups, 0",
         "  br i1 %anyg, label %g.loop, label %g.end",
         "g.loop:",
         "  %g = phi i64 [0, %entry], [%g.next, %g.loop]",
         *(f"  %acc{r} = phi {_VF} [zeroinitializer, %entry], [%acc{r}.n, %g.loop]" for r in R)]
    if block > 16:  # a block per iteration: its scales loaded and multiplied once
        L += _column_block(block, rows)
    else:
        L += _column16(rows)
    L += [*latch("g", 1 if block == 16 else block // 64, "g.more", "%groups", "g.loop",
                 "g.end", pred="ult"),
          "g.end:",
          *(f"  %accp{r} = phi {_VF} [zeroinitializer, %entry], [%acc{r}.n, %g.loop]"
            for r in R)]
    fin = [f"%accp{r}" for r in R]
    if block == 16:  # the blocks after the groups of four, one at a time
        L += ["  %t0 = shl i64 %groups, 2",
              "  %anyt = icmp ult i64 %t0, %kb",
              "  br i1 %anyt, label %t.loop, label %t.end",
              "t.loop:",
              "  %t = phi i64 [%t0, %g.end], [%t.next, %t.loop]",
              *(f"  %tacc{r} = phi {_VF} [%accp{r}, %g.end], [%tacc{r}.n, %t.loop]" for r in R),
              "  %t8 = mul i64 %t, 8",
              "  %tbo = add i64 %brow, %t8",
              "  %tbp = getelementptr i8, ptr %B, i64 %tbo",
              "  %tw = load <8 x i8>, ptr %tbp, align 1",
              f"  %tlo = and <8 x i8> %tw, {_vec('i8', [15] * 8)}",
              f"  %thi = lshr <8 x i8> %tw, {_vec('i8', [4] * 8)}",
              "  %tw16 = shufflevector <8 x i8> %tlo, <8 x i8> %thi, <16 x i32> "
              + _vec("i32", [v for j in range(8) for v in (j, 8 + j)]),
              "  %t16 = mul i64 %t, 16",
              "  %tsbi = add i64 %bsrow, %t",
              "  %tsbp = getelementptr float, ptr %sb, i64 %tsbi",
              "  %tsbv = load float, ptr %tsbp, align 4"]
        for r in R:
            L += [f"  %tao{r} = add i64 %arow{r}, %t16",
                  f"  %tap{r} = getelementptr i8, ptr %qa, i64 %tao{r}",
                  f"  %ta{r} = load <16 x i8>, ptr %tap{r}, align 1",
                  f"  %tp{r} = call <8 x i16> @llvm.x86.ssse3.pmadd.ub.sw.128(<16 x i8> %tw16, "
                  f"<16 x i8> %ta{r})",
                  f"  %tq{r} = sext <8 x i16> %tp{r} to {_V8}",
                  f"  %tqs{r} = shufflevector {_V8} %tq{r}, {_V8} poison, <8 x i32> "
                  f"{_vec('i32', _SWAP)}",
                  f"  %tf{r} = sitofp {_V8} %tqs{r} to {_VF}",
                  f"  %tsai{r} = add i64 %srow{r}, %t",
                  f"  %tsap{r} = getelementptr float, ptr %sa, i64 %tsai{r}",
                  f"  %tsav{r} = load float, ptr %tsap{r}, align 4",
                  f"  %ts{r} = fmul float %tsav{r}, %tsbv"]
            _splat(L, f"tsv{r}", f"%ts{r}")
            L += [f"  %tacc{r}.n = call {_VF} @llvm.fma.v8f32({_VF} %tf{r}, {_VF} %tsv{r}, "
                  f"{_VF} %tacc{r})"]
        L += [*latch("t", "1", "t.more", "%kb", "t.loop", "t.end", pred="ult"),
              "t.end:",
              *(f"  %accq{r} = phi {_VF} [%accp{r}, %g.end], [%tacc{r}.n, %t.loop]" for r in R)]
        fin = [f"%accq{r}" for r in R]
    L += ["  %hb = icmp ne ptr %bias, null",
          "  br i1 %hb, label %bias.yes, label %bias.no",
          "bias.yes:",
          "  %bsp = getelementptr float, ptr %bias, i64 %n",
          "  %bsv = load float, ptr %bsp, align 4",
          "  br label %bias.no",
          "bias.no:",
          f"  %bval = phi float [%bsv, %bias.yes], [0.0, %{'t.end' if block == 16 else 'g.end'}]",
          "  %infold = icmp slt i64 %n, %nfold"]
    for r in R:
        fo, hs = _fold(L, fin[r], str(r))
        L += [f"  %y_{r} = select i1 %infold, float {fo}, float {hs}",
              f"  %yb0_{r} = fadd float %y_{r}, %bval",
              f"  %yb_{r} = select i1 %hb, float %yb0_{r}, float %y_{r}",
              f"  %ci0_{r} = mul i64 %mr{r}, %N",
              f"  %ci_{r} = add i64 %ci0_{r}, %n",
              f"  %cp_{r} = getelementptr float, ptr %C, i64 %ci_{r}",
              # the zero points' share, already in C, added last
              f"  %zs_{r} = load float, ptr %cp_{r}, align 4",
              f"  %out_{r} = fadd float %yb_{r}, %zs_{r}",
              f"  store float %out_{r}, ptr %cp_{r}, align 4"]
    return L + ["  ret void", "}"]


def _columns_m1(block: int, cols: int) -> list[str]:
    """@cols{block}_{cols}_m1: C[0, n..n+cols] of one row as MLAS's M == 1 kernel (blocks of
    64-256): the columns side by side, A's codes and their lane sums loaded and formed once
    per group of 64 for all of them; each column's integer lanes sum a * (w - zp) (as
    sum a * w - zp * sum a, exactly), then its own fused multiply-add chain and fold."""
    C = range(cols)
    per = block // 64
    shift = per.bit_length() - 1
    ones8, ones16 = _vec("i8", [1] * 32), _vec("i16", [1] * 16)
    L = [f"define internal void @cols{block}_{cols}_m1(ptr noalias %qa, ptr noalias %sa, "
         "ptr noalias %Zq, ptr noalias %B, ptr noalias %sb, ptr noalias %bias, ptr %C, "
         "i64 %n, i64 %kb, i64 %nfold) nounwind alwaysinline {",
         "entry:",
         f"  %rowbytes = mul i64 %kb, {block // 2}",
         f"  %groups = mul i64 %kb, {per}",
         *(f"  %nc{c} = add i64 %n, {c}" for c in C),
         *(f"  %brow{c} = mul i64 %nc{c}, %rowbytes" for c in C),
         *(f"  %bsrow{c} = mul i64 %nc{c}, %kb" for c in C),
         "  br label %g.loop",
         "g.loop:",
         "  %g = phi i64 [0, %entry], [%g.next, %g.loop]",
         *(f"  %acc{c} = phi {_VF} [zeroinitializer, %entry], [%acc{c}.n, %g.loop]" for c in C),
         f"  %blk = lshr i64 %g, {shift}" if shift else "  %blk = add i64 %g, 0",
         "  %g32 = mul i64 %g, 32",
         "  %g64 = mul i64 %g, 64",
         "  %ap = getelementptr i8, ptr %qa, i64 %g64",
         f"  %ae = load {_V32B}, ptr %ap, align 1",
         "  %apo = getelementptr i8, ptr %ap, i64 32",
         f"  %ad = load {_V32B}, ptr %apo, align 1",
         f"  %se = call {_VH} @llvm.x86.avx2.pmadd.ub.sw({_V32B} {ones8}, {_V32B} %ae)",
         f"  %so = call {_VH} @llvm.x86.avx2.pmadd.ub.sw({_V32B} {ones8}, {_V32B} %ad)",
         f"  %ss = add {_VH} %se, %so",
         f"  %asl = call {_V8} @llvm.x86.avx2.pmadd.wd({_VH} %ss, {_VH} {ones16})",
         "  %sap = getelementptr float, ptr %sa, i64 %blk",
         "  %sav = load float, ptr %sap, align 4"]
    if cols > 1:  # the next columns' bytes, a pass ahead (the hardware follows few streams)
        L += [f"  %pfo = mul i64 %rowbytes, {cols}"]
        for c in C:
            L += [f"  %pf{c}.0 = add i64 %brow{c}, %pfo",
                  f"  %pf{c}.1 = add i64 %pf{c}.0, %g32",
                  f"  %pf{c} = getelementptr i8, ptr %B, i64 %pf{c}.1",
                  f"  call void @llvm.prefetch.p0(ptr %pf{c}, i32 0, i32 3, i32 1)"]
    for c in C:
        L += [f"  %bo{c} = add i64 %brow{c}, %g32",
              f"  %bp{c} = getelementptr i8, ptr %B, i64 %bo{c}",
              f"  %w{c} = load {_V32B}, ptr %bp{c}, align 1",
              f"  %lo{c} = and {_V32B} %w{c}, {_vec('i8', [15] * 32)}",
              f"  %hi{c} = lshr {_V32B} %w{c}, {_vec('i8', [4] * 32)}",
              f"  %pe{c} = call {_VH} @llvm.x86.avx2.pmadd.ub.sw({_V32B} %lo{c}, {_V32B} %ae)",
              f"  %po{c} = call {_VH} @llvm.x86.avx2.pmadd.ub.sw({_V32B} %hi{c}, {_V32B} %ad)",
              f"  %ps{c} = add {_VH} %pe{c}, %po{c}",
              f"  %q{c} = call {_V8} @llvm.x86.avx2.pmadd.wd({_VH} %ps{c}, {_VH} {ones16})",
              f"  %sbi{c} = add i64 %bsrow{c}, %blk",
              f"  %zp{c} = getelementptr i8, ptr %Zq, i64 %sbi{c}",
              f"  %zb{c} = load i8, ptr %zp{c}, align 1",
              f"  %z{c} = zext i8 %zb{c} to i32"]
        zv = _splat(L, f"zv{c}", f"%z{c}", ty="i32")
        L += [f"  %zc{c} = mul {_V8} %asl, {zv}",
              f"  %qz{c} = sub {_V8} %q{c}, %zc{c}",
              f"  %f{c} = sitofp {_V8} %qz{c} to {_VF}",
              f"  %sbp{c} = getelementptr float, ptr %sb, i64 %sbi{c}",
              f"  %sbv{c} = load float, ptr %sbp{c}, align 4",
              f"  %s{c} = fmul float %sav, %sbv{c}"]
        sv = _splat(L, f"sv{c}", f"%s{c}")
        L += [f"  %acc{c}.n = call {_VF} @llvm.fma.v8f32({_VF} %f{c}, {_VF} {sv}, "
              f"{_VF} %acc{c})"]
    L += [*latch("g", "1", "g.more", "%groups", "g.loop", "g.end", pred="ult"),
          "g.end:",
          "  %hb = icmp ne ptr %bias, null",
          "  br i1 %hb, label %bias.yes, label %bias.no",
          "bias.yes:",
          "  %bsp = getelementptr float, ptr %bias, i64 %n",
          f"  %bsv = load <{cols} x float>, ptr %bsp, align 4",
          "  br label %bias.no",
          "bias.no:",
          f"  %bval = phi <{cols} x float> [%bsv, %bias.yes], [zeroinitializer, %g.end]"]
    for c in C:
        fo, hs = _fold(L, f"%acc{c}.n", str(c))
        L += [f"  %infold{c} = icmp slt i64 %nc{c}, %nfold",
              f"  %y_{c} = select i1 %infold{c}, float {fo}, float {hs}",
              f"  %bv{c} = extractelement <{cols} x float> %bval, i64 {c}",
              f"  %yb0_{c} = fadd float %y_{c}, %bv{c}",
              f"  %yb_{c} = select i1 %hb, float %yb0_{c}, float %y_{c}",
              f"  %cp_{c} = getelementptr float, ptr %C, i64 %nc{c}",
              f"  store float %yb_{c}, ptr %cp_{c}, align 4"]
    return L + ["  ret void", "}"]


def _columns8_m1(block: int, sym: bool) -> list[str]:
    """@cols{block}_8_m1[s]: C[0, n..n+8] of one row, eight columns all in MLAS's groups of
    four, each column's arithmetic exactly @cols{block}_1_m1's (the same integer lanes, one
    fused multiply-add per group of 64 in K order, FoldAccumulators, the bias), faster: a
    block per iteration (its scales and zero points loaded once, its groups unrolled), the
    zero point subtracted in 16 bits (z * the pair sums of A's codes; ``sym``: no zero
    points, 8 as a shift, once for all columns), the next eight columns' bytes prefetched
    linearly (eight short streams are more than the hardware follows), and the eight folds
    done on the transposed accumulators, one vector operation for eight scalar ones."""
    from .nbits_gemm import _transpose8

    C8 = range(8)
    per = block // 64
    ones8, ones16 = _vec("i8", [1] * 32), _vec("i16", [1] * 16)
    L = [f"define internal void @cols{block}_8_m1{'s' if sym else ''}(ptr noalias %qa, "
         "ptr noalias %sa, ptr noalias %Zq, ptr noalias %B, ptr noalias %sb, "
         "ptr noalias %bias, ptr %C, i64 %n, i64 %kb) nounwind alwaysinline {",
         "entry:",
         f"  %rowbytes = mul i64 %kb, {block // 2}",
         *(f"  %nc{c} = add i64 %n, {c}" for c in C8),
         *(f"  %brow{c} = mul i64 %nc{c}, %rowbytes" for c in C8),
         *(f"  %bsrow{c} = mul i64 %nc{c}, %kb" for c in C8),
         "  %pf.r = mul i64 %rowbytes, 8",
         "  %pf.base = add i64 %brow0, %pf.r",
         "  br label %b.loop",
         "b.loop:",
         "  %b = phi i64 [0, %entry], [%b.next, %b.loop]",
         *(f"  %acc{c} = phi {_VF} [zeroinitializer, %entry], [%acc{c}.n, %b.loop]" for c in C8),
         f"  %boff = mul i64 %b, {block // 2}",
         f"  %aoff = mul i64 %b, {block}",
         "  %sap = getelementptr float, ptr %sa, i64 %b",
         "  %sav = load float, ptr %sap, align 4",
         f"  %pf.b = mul i64 %b, {4 * block}",  # the eight columns' bytes of this block
         "  %pf.o = add i64 %pf.base, %pf.b"]
    for k in range(block // 16):
        L += [f"  %pf.o{k} = add i64 %pf.o, {64 * k}",
              f"  %pf.p{k} = getelementptr i8, ptr %B, i64 %pf.o{k}",
              f"  call void @llvm.prefetch.p0(ptr %pf.p{k}, i32 0, i32 3, i32 1)"]
    for c in C8:
        L += [f"  %sbi{c} = add i64 %bsrow{c}, %b",
              f"  %sbp{c} = getelementptr float, ptr %sb, i64 %sbi{c}",
              f"  %sbv{c} = load float, ptr %sbp{c}, align 4",
              f"  %s{c} = fmul float %sav, %sbv{c}"]
        _splat(L, f"sv{c}", f"%s{c}")
        if not sym:
            L += [f"  %zp{c} = getelementptr i8, ptr %Zq, i64 %sbi{c}",
                  f"  %zb{c} = load i8, ptr %zp{c}, align 1",
                  f"  %z{c} = zext i8 %zb{c} to i16"]
            _splat(L, f"zv{c}", f"%z{c}", n=16, ty="i16")
    acc = {c: f"%acc{c}" for c in C8}
    for g in range(per):
        L += [f"  %ao{g} = add i64 %aoff, {64 * g}",
              f"  %ap{g} = getelementptr i8, ptr %qa, i64 %ao{g}",
              f"  %ae{g} = load {_V32B}, ptr %ap{g}, align 1",
              f"  %apo{g} = getelementptr i8, ptr %ap{g}, i64 32",
              f"  %ad{g} = load {_V32B}, ptr %apo{g}, align 1",
              f"  %se{g} = call {_VH} @llvm.x86.avx2.pmadd.ub.sw({_V32B} {ones8}, "
              f"{_V32B} %ae{g})",
              f"  %so{g} = call {_VH} @llvm.x86.avx2.pmadd.ub.sw({_V32B} {ones8}, "
              f"{_V32B} %ad{g})",
              f"  %ss{g} = add {_VH} %se{g}, %so{g}"]  # lane j: the codes of ps's lane j
        if sym:
            L += [f"  %ss8_{g} = shl {_VH} %ss{g}, {_vec('i16', [3] * 16)}"]
        for c in C8:
            t = f"{c}_{g}"
            L += [f"  %bo{t} = add i64 %brow{c}, %boff",
                  f"  %bg{t} = add i64 %bo{t}, {32 * g}",
                  f"  %bp{t} = getelementptr i8, ptr %B, i64 %bg{t}",
                  f"  %w{t} = load {_V32B}, ptr %bp{t}, align 1",
                  f"  %lo{t} = and {_V32B} %w{t}, {_vec('i8', [15] * 32)}",
                  f"  %hi{t} = lshr {_V32B} %w{t}, {_vec('i8', [4] * 32)}",
                  f"  %pe{t} = call {_VH} @llvm.x86.avx2.pmadd.ub.sw({_V32B} %lo{t}, "
                  f"{_V32B} %ae{g})",
                  f"  %po{t} = call {_VH} @llvm.x86.avx2.pmadd.ub.sw({_V32B} %hi{t}, "
                  f"{_V32B} %ad{g})",
                  f"  %ps{t} = add {_VH} %pe{t}, %po{t}"]
            # sum a * (w - z) = sum a * w - z * sum a, exactly in 16 bits (|terms| <= 7620)
            if sym:
                L += [f"  %h{t} = sub {_VH} %ps{t}, %ss8_{g}"]
            else:
                L += [f"  %zc{t} = mul {_VH} %zv{c}, %ss{g}",
                      f"  %h{t} = sub {_VH} %ps{t}, %zc{t}"]
            out = f"%acc{c}.n" if g == per - 1 else f"%acc{t}"
            L += [f"  %q{t} = call {_V8} @llvm.x86.avx2.pmadd.wd({_VH} %h{t}, {_VH} {ones16})",
                  f"  %f{t} = sitofp {_V8} %q{t} to {_VF}",
                  f"  {out} = call {_VF} @llvm.fma.v8f32({_VF} %f{t}, {_VF} %sv{c}, "
                  f"{_VF} {acc[c]})"]
            acc[c] = out
    L += [*latch("b", "1", "b.more", "%kb", "b.loop", "b.end", pred="ult"),
          "b.end:"]
    T = _transpose8(L, [f"%acc{c}.n" for c in C8], "tr")  # T[j]: lane j of the columns
    x = [T[_SWAP[i]] for i in range(8)]  # MLAS's lane i
    return L + [f"  %l1 = fadd {_VF} {x[0]}, {x[1]}",
                f"  %l2 = fadd {_VF} %l1, {x[2]}",
                f"  %l3 = fadd {_VF} %l2, {x[3]}",
                f"  %u1 = fadd {_VF} {x[4]}, {x[5]}",
                f"  %u2 = fadd {_VF} %u1, {x[6]}",
                f"  %u3 = fadd {_VF} %u2, {x[7]}",
                f"  %y = fadd {_VF} %l3, %u3",
                "  %hb = icmp ne ptr %bias, null",
                "  br i1 %hb, label %bias.yes, label %bias.no",
                "bias.yes:",
                "  %biasp = getelementptr float, ptr %bias, i64 %n",
                f"  %biasv = load {_VF}, ptr %biasp, align 4",
                f"  %yb = fadd {_VF} %y, %biasv",
                "  br label %bias.no",
                "bias.no:",
                f"  %out = phi {_VF} [%yb, %bias.yes], [%y, %b.end]",
                "  %cp = getelementptr float, ptr %C, i64 %n",
                f"  store {_VF} %out, ptr %cp, align 4",
                "  ret void",
                "}"]


def _row(block: int, sym: bool) -> list[str]:
    """row{block}[s](A, C, consts): one row's whole level-4 product in one call (a decode step's;
    a ctypes argument costs ~0.25 us, the arrays of a separate quantization more than the
    small products' arithmetic): A (kb * block floats) quantized into scratch on the stack
    (kb * (block + 8) bytes), then gemm{block}_m1[s] over all N columns; ``consts``: i64 words
    Zq, B, sb, bias (0: none), N, kb, nfold. rows{block}[s]: the same for columns [n0, n1),
    and row_job{block}[s] it on spin.fork's argument block (i64 words A, C, Zq, B, sb, bias,
    n0, n1, N, kb, nfold: one part of a row's columns per thread)."""
    sfx = "s" if sym else ""
    names = ["Zq", "B", "sb", "bias", "N", "kb", "nfold"]
    L = [f"define internal void @rows{block}{sfx}(ptr noalias %A, ptr %C, ptr noalias %Zq, "
         "ptr noalias %B, ptr noalias %sb, ptr noalias %bias, i64 %n0, i64 %n1, i64 %N, "
         "i64 %kb, i64 %nfold) nounwind {",
         "entry:",
         f"  %K = mul i64 %kb, {block}",
         "  %kb8 = mul i64 %kb, 8",
         "  %size = add i64 %K, %kb8",
         "  %qa = alloca i8, i64 %size, align 32",
         "  %sa = getelementptr i8, ptr %qa, i64 %K",
         "  %kb4 = mul i64 %kb, 4",
         "  %asum = getelementptr i8, ptr %sa, i64 %kb4",
         f"  call void @quantize{block}(ptr %A, ptr %qa, ptr %sa, ptr %asum, i64 1, i64 %kb)",
         f"  call void @gemm{block}_m1{sfx}(ptr %qa, ptr %sa, ptr %Zq, ptr %B, ptr %sb, "
         "ptr %bias, ptr %C, i64 1, i64 %n0, i64 %n1, i64 %N, i64 %kb, i64 %nfold)",
         "  ret void",
         "}",
         f"define void @row{block}{sfx}(ptr noalias %A, ptr %C, ptr noalias %consts) nounwind {{",
         "entry:"]
    for i, v in enumerate(names):
        ty = "ptr" if i < 4 else "i64"
        L += [f"  %{v}.p = getelementptr i64, ptr %consts, i64 {i}",
              f"  %{v} = load {ty}, ptr %{v}.p, align 8"]
    return L + [f"  call void @rows{block}{sfx}(ptr %A, ptr %C, ptr %Zq, ptr %B, ptr %sb, "
                "ptr %bias, i64 0, i64 %N, i64 %N, i64 %kb, i64 %nfold)",
                "  ret void",
                "}",
                *job(f"row_job{block}{sfx}", f"rows{block}{sfx}",
                     ("ptr",) * 6 + ("i64",) * 5)]


def _gemm_m1(block: int, sym: bool) -> list[str]:
    """gemm{block}_m1[s](qa, sa, Zq, B, sb, bias, C, M, n0, n1, N, kb, nfold): columns
    [n0, n1) of one row (M is 1), eight at a time where all eight are below nfold (``sym``:
    the weight has no zero points, Zq all 8), then COLS at a time, then one by one."""
    args = "ptr %qa, ptr %sa, ptr %Zq, ptr %B, ptr %sb, ptr %bias, ptr %C"
    sfx = "s" if sym else ""
    return [f"define void @gemm{block}_m1{sfx}(ptr noalias %qa, ptr noalias %sa, "
            "ptr noalias %Zq, ptr noalias %B, ptr noalias %sb, ptr noalias %bias, ptr %C, "
            "i64 %M, i64 %n0, i64 %n1, i64 %N, i64 %kb, i64 %nfold) nounwind {",
            "entry:",
            "  %lt = icmp slt i64 %n1, %nfold",
            "  %lim = select i1 %lt, i64 %n1, i64 %nfold",
            "  br label %e.head",
            "e.head:",
            "  %ne = phi i64 [%n0, %entry], [%ne.next, %e.body]",
            "  %ne8 = add i64 %ne, 8",
            "  %e.ok = icmp sle i64 %ne8, %lim",
            "  br i1 %e.ok, label %e.body, label %v.head",
            "e.body:",
            f"  call void @cols{block}_8_m1{sfx}({args}, i64 %ne, i64 %kb)",
            "  %ne.next = add i64 %ne, 8",
            "  br label %e.head",
            "v.head:",
            "  %n = phi i64 [%ne, %e.head], [%n.next, %v.body]",
            f"  %nend = add i64 %n, {COLS}",
            "  %v.ok = icmp sle i64 %nend, %n1",
            "  br i1 %v.ok, label %v.body, label %s.head",
            "v.body:",
            f"  call void @cols{block}_{COLS}_m1({args}, i64 %n, i64 %kb, i64 %nfold)",
            f"  %n.next = add i64 %n, {COLS}",
            "  br label %v.head",
            "s.head:",
            "  %c = phi i64 [%n, %v.head], [%c.next, %s.body]",
            "  %s.ok = icmp slt i64 %c, %n1",
            "  br i1 %s.ok, label %s.body, label %end",
            "s.body:",
            f"  call void @cols{block}_1_m1({args}, i64 %c, i64 %kb, i64 %nfold)",
            "  %c.next = add i64 %c, 1",
            "  br label %s.head",
            "end:",
            "  ret void",
            "}"]


def _gemm(block: int) -> list[str]:
    """gemm{block}(qa, sa, Zq, B, sb, bias, C, M, n0, n1, N, kb, nfold): columns [n0, n1) of
    C for M rows (C holding the zero points' share): blocks of NBLOCK columns (their weight
    stays in cache), in each the rows ROWS at a time (their codes stay in L1), then one by
    one, and for each row tile the block's columns."""
    args = "ptr %qa, ptr %sa, ptr %Zq, ptr %B, ptr %sb, ptr %bias, ptr %C"
    tail = "i64 %N, i64 %kb, i64 %nfold)"
    return [f"define void @gemm{block}(ptr noalias %qa, ptr noalias %sa, "
            "ptr noalias %Zq, ptr noalias %B, ptr noalias %sb, ptr noalias %bias, ptr %C, "
            "i64 %M, i64 %n0, i64 %n1, i64 %N, i64 %kb, i64 %nfold) nounwind {",
            "entry:",
            f"  %Mrest = srem i64 %M, {ROWS}",
            "  %Mtile = sub i64 %M, %Mrest",
            "  br label %b.head",
            "b.head:",
            "  %nb = phi i64 [%n0, %entry], [%nb.next, %o.head]",
            "  %b.ok = icmp slt i64 %nb, %n1",
            "  br i1 %b.ok, label %b.body, label %end",
            "b.body:",
            f"  %ne0 = add i64 %nb, {NBLOCK}",
            "  %ne.lt = icmp slt i64 %ne0, %n1",
            "  %ne = select i1 %ne.lt, i64 %ne0, i64 %n1",
            "  br label %r.head",
            "r.head:",  # row tiles
            "  %r = phi i64 [0, %b.body], [%r.next, %c.head]",
            "  %r.ok = icmp slt i64 %r, %Mtile",
            "  br i1 %r.ok, label %c.pre, label %o.pre",
            "c.pre:",
            "  br label %c.head",
            "c.head:",
            "  %c = phi i64 [%nb, %c.pre], [%c.next, %c.body]",
            "  %c.ok = icmp slt i64 %c, %ne",
            f"  %r.next = add i64 %r, {ROWS}",
            "  br i1 %c.ok, label %c.body, label %r.head",
            "c.body:",
            f"  call void @col{block}_{ROWS}({args}, i64 %r, i64 %c, {tail}",
            "  %c.next = add i64 %c, 1",
            "  br label %c.head",
            "o.pre:",  # the rows left, one by one
            "  br label %o.head",
            "o.head:",
            "  %o = phi i64 [%Mtile, %o.pre], [%o.next, %d.head]",
            "  %o.ok = icmp slt i64 %o, %M",
            f"  %nb.next = add i64 %nb, {NBLOCK}",
            "  br i1 %o.ok, label %d.pre, label %b.head",
            "d.pre:",
            "  br label %d.head",
            "d.head:",
            "  %d = phi i64 [%nb, %d.pre], [%d.next, %d.body]",
            "  %d.ok = icmp slt i64 %d, %ne",
            "  %o.next = add i64 %o, 1",
            "  br i1 %d.ok, label %d.body, label %o.head",
            "d.body:",
            f"  call void @col{block}_1({args}, i64 %o, i64 %d, {tail}",
            "  %d.next = add i64 %d, 1",
            "  br label %d.head",
            "end:",
            "  ret void",
            "}"]


def _dequantize_sub(L: list[str], c: int, SB: int) -> str:
    """%wf{c}: column c's SB weights from byte ``%bo`` of its row ``%brow{c}`` (scale and zero
    point of block ``%blk``), each (q - zp) * scale in float32 as MLAS dequantizes them."""
    H = SB // 2
    VS, VSI, VSF = f"<{H} x i8>", f"<{SB} x i8>", f"<{SB} x float>"
    inter = _vec("i32", [v for j in range(H) for v in (j, H + j)])
    L += [f"  %bo{c} = add i64 %brow{c}, %bo",
          f"  %bp{c} = getelementptr i8, ptr %B, i64 %bo{c}",
          f"  %w{c} = load {VS}, ptr %bp{c}, align 1",
          f"  %lo{c} = and {VS} %w{c}, {_vec('i8', [15] * H)}",
          f"  %hi{c} = lshr {VS} %w{c}, {_vec('i8', [4] * H)}",
          f"  %e{c} = shufflevector {VS} %lo{c}, {VS} %hi{c}, <{SB} x i32> {inter}",
          f"  %sbi{c} = add i64 %bsrow{c}, %blk",
          f"  %zp{c} = getelementptr i8, ptr %Zq, i64 %sbi{c}",
          f"  %z{c} = load i8, ptr %zp{c}, align 1"]
    z = _splat(L, f"zv{c}", f"%z{c}", n=SB, ty="i8")
    L += [f"  %d{c} = sub {VSI} %e{c}, {z}",
          f"  %f{c} = sitofp {VSI} %d{c} to {VSF}",
          f"  %sbp{c} = getelementptr float, ptr %sb, i64 %sbi{c}",
          f"  %sv{c} = load float, ptr %sbp{c}, align 4"]
    sv = _splat(L, f"svv{c}", f"%sv{c}", n=SB)
    L += [f"  %wf{c} = fmul {VSF} %f{c}, {sv}"]
    return f"%wf{c}"


def _fq_columns(block: int, cols: int) -> list[str]:
    """@fq{block}_{cols}: C[0, n..n+cols] of one row at levels 0-3 straight from the packed
    weight, as MLAS's M == 1 CompFp32 kernel: per sub-block of 32 elements (16 in blocks of 16)
    the nibbles minus the zero point, converted and times the scale (each weight exactly the
    dequantized one), then one fused multiply-add per 8 elements with A's (lane j: elements
    j mod 8, in order); the columns side by side, A's floats loaded once for all."""
    SB = min(block, 32)
    C, I = range(cols), range(SB // 8)
    per = block // SB
    shift = per.bit_length() - 1
    VSF = f"<{SB} x float>"
    L = [f"define internal void @fq{block}_{cols}(ptr noalias %A, ptr noalias %B, "
         "ptr noalias %sb, ptr noalias %Zq, ptr noalias %bias, ptr %C, i64 %n, i64 %kb, "
         "i64 %nfold) nounwind alwaysinline {",
         "entry:",
         f"  %rowbytes = mul i64 %kb, {block // 2}",
         f"  %subs = mul i64 %kb, {per}",
         *(f"  %nc{c} = add i64 %n, {c}" for c in C),
         *(f"  %brow{c} = mul i64 %nc{c}, %rowbytes" for c in C),
         *(f"  %bsrow{c} = mul i64 %nc{c}, %kb" for c in C),
         "  br label %s.loop",
         "s.loop:",
         "  %s = phi i64 [0, %entry], [%s.next, %s.loop]",
         *(f"  %acc{c} = phi {_VF} [zeroinitializer, %entry], [%acc{c}.n, %s.loop]" for c in C),
         f"  %blk = lshr i64 %s, {shift}" if shift else "  %blk = add i64 %s, 0",
         f"  %ao = mul i64 %s, {SB}",
         "  %ap = getelementptr float, ptr %A, i64 %ao",
         f"  %a = load {VSF}, ptr %ap, align 4",
         *(f"  %a{i} = shufflevector {VSF} %a, {VSF} poison, <8 x i32> "
           f"{_vec('i32', range(8 * i, 8 * i + 8))}" for i in I),
         f"  %bo = mul i64 %s, {SB // 2}"]
    for c in C:
        _dequantize_sub(L, c, SB)
        prev = f"%acc{c}"
        for i in I:
            out = f"%acc{c}.n" if i == I[-1] else f"%acc{c}_{i}"
            L += [f"  %wf{c}_{i} = shufflevector {VSF} %wf{c}, {VSF} poison, <8 x i32> "
                  f"{_vec('i32', range(8 * i, 8 * i + 8))}",
                  f"  {out} = call {_VF} @llvm.fma.v8f32({_VF} %wf{c}_{i}, {_VF} %a{i}, "
                  f"{_VF} {prev})"]
            prev = out
    L += [*latch("s", "1", "s.more", "%subs", "s.loop", "s.end", pred="ult"),
          "s.end:",
          "  %hb = icmp ne ptr %bias, null",
          "  br i1 %hb, label %bias.yes, label %bias.no",
          "bias.yes:",
          "  %bsp = getelementptr float, ptr %bias, i64 %n",
          f"  %bsv = load <{cols} x float>, ptr %bsp, align 4",
          "  br label %bias.no",
          "bias.no:",
          f"  %bval = phi <{cols} x float> [%bsv, %bias.yes], [zeroinitializer, %s.end]"]
    for c in C:
        fo, hs = _fold(L, f"%acc{c}.n", str(c), fp32=True)
        L += [f"  %bv{c} = extractelement <{cols} x float> %bval, i64 {c}",
              f"  %fob_{c} = fadd float {fo}, %bv{c}",
              f"  %fo2_{c} = select i1 %hb, float %fob_{c}, float {fo}",
              f"  %hs2_{c} = fadd float {hs}, %bv{c}",  # MLAS adds 0.0f without a bias
              f"  %infold{c} = icmp slt i64 %nc{c}, %nfold",
              f"  %y_{c} = select i1 %infold{c}, float %fo2_{c}, float %hs2_{c}",
              f"  %cp_{c} = getelementptr float, ptr %C, i64 %nc{c}",
              f"  store float %y_{c}, ptr %cp_{c}, align 4"]
    return L + ["  ret void", "}"]


def _fq_m1(block: int) -> list[str]:
    """fq{block}_m1(A, B, sb, Zq, bias, C, n0, n1, kb, nfold): columns [n0, n1) of one row at
    levels 0-3 from the packed weight (A zero-padded to whole blocks), COLS at a time."""
    args = "ptr %A, ptr %B, ptr %sb, ptr %Zq, ptr %bias, ptr %C"
    return [f"define void @fq{block}_m1(ptr noalias %A, ptr noalias %B, ptr noalias %sb, "
            "ptr noalias %Zq, ptr noalias %bias, ptr %C, i64 %n0, i64 %n1, i64 %kb, "
            "i64 %nfold) nounwind {",
            "entry:",
            "  br label %v.head",
            "v.head:",
            "  %n = phi i64 [%n0, %entry], [%n.next, %v.body]",
            f"  %nend = add i64 %n, {COLS}",
            "  %v.ok = icmp sle i64 %nend, %n1",
            "  br i1 %v.ok, label %v.body, label %s.head",
            "v.body:",
            f"  call void @fq{block}_{COLS}({args}, i64 %n, i64 %kb, i64 %nfold)",
            f"  %n.next = add i64 %n, {COLS}",
            "  br label %v.head",
            "s.head:",
            "  %c = phi i64 [%n, %v.head], [%c.next, %s.body]",
            "  %s.ok = icmp slt i64 %c, %n1",
            "  br i1 %s.ok, label %s.body, label %end",
            "s.body:",
            f"  call void @fq{block}_1({args}, i64 %c, i64 %kb, i64 %nfold)",
            "  %c.next = add i64 %c, 1",
            "  br label %s.head",
            "end:",
            "  ret void",
            "}"]


def _dequantize_panel(SB: int) -> list[str]:
    """@dq{SB}(B, sb, Zq, W, n, N, kb, shift): columns n..n+15 of the weight in blocks of
    SB << shift dequantized into the panel W (kb * block, 16) float32, each (q - zp) * scale
    in float32 exactly as MLAS's CompFp32 path dequantizes B before its SGEMM (columns from N
    on repeat column N - 1: the caller drops them). Eight columns at a time: each one's
    sub-block of SB values unpacked and scaled, then 8 x 8 transposes to store rows of eight
    columns. One function for all blocks of SB (16) or more (32): the shift a runtime one."""
    from .nbits_gemm import _transpose8

    H = SB // 2
    VSF = f"<{SB} x float>"
    C8 = range(8)
    L = [f"define internal void @dq{SB}(ptr noalias %B, ptr noalias %sb, ptr noalias %Zq, "
         "ptr noalias %W, i64 %n, i64 %N, i64 %kb, i64 %shift) nounwind noinline {",
         "entry:",
         "  %subs = shl i64 %kb, %shift",
         f"  %rowbytes = mul i64 %subs, {H}",
         "  %Nl = sub i64 %N, 1",
         "  br label %h.loop",
         "h.loop:",
         "  %h = phi i64 [0, %entry], [%h.next, %s.end]",
         "  %h8 = mul i64 %h, 8",
         "  %nh = add i64 %n, %h8"]
    for c in C8:
        L += [f"  %nc{c}.0 = add i64 %nh, {c}",
              f"  %nc{c}.lt = icmp slt i64 %nc{c}.0, %N",
              f"  %nc{c} = select i1 %nc{c}.lt, i64 %nc{c}.0, i64 %Nl",
              f"  %brow{c} = mul i64 %nc{c}, %rowbytes",
              f"  %bsrow{c} = mul i64 %nc{c}, %kb"]
    L += ["  br label %s.loop",
          "s.loop:",
          "  %s = phi i64 [0, %h.loop], [%s.next, %s.loop]",
          "  %blk = lshr i64 %s, %shift",
          f"  %bo = mul i64 %s, {H}"]
    chunks = {c: [] for c in C8}
    for c in C8:
        _dequantize_sub(L, c, SB)
        for i in range(SB // 8):
            L += [f"  %wf{c}_{i} = shufflevector {VSF} %wf{c}, {VSF} poison, <8 x i32> "
                  f"{_vec('i32', range(8 * i, 8 * i + 8))}"]
            chunks[c].append(f"%wf{c}_{i}")
    L += [f"  %k0 = mul i64 %s, {SB}"]
    for i in range(SB // 8):
        T = _transpose8(L, [chunks[c][i] for c in C8], f"t{i}")  # T[j]: element 8i + j
        for j in range(8):
            L += [f"  %wk{i}_{j} = add i64 %k0, {8 * i + j}",
                  f"  %wo{i}_{j}.0 = mul i64 %wk{i}_{j}, {PANEL}",
                  f"  %wo{i}_{j} = add i64 %wo{i}_{j}.0, %h8",
                  f"  %wp{i}_{j} = getelementptr float, ptr %W, i64 %wo{i}_{j}",
                  f"  store {_VF} {T[j]}, ptr %wp{i}_{j}, align 4"]
    return L + [*latch("s", "1", "s.more", "%subs", "s.loop", "s.end"),
                "s.end:",
                *latch("h", "1", "h.more", "2", "h.loop", "end"),
                "end:",
                "  ret void",
                "}"]


def _fp32_rows(block: int) -> list[str]:
    """fp32_rows{block}(A, W, bias, C, M, K, Np, n0, n1, B, sb, Zq, N, kb): rows of
    C = A @ W (+ bias), A (M, K), C (M, Np), W the weight (B packed, scales sb, zero points
    Zq) dequantized a panel of 16 columns at a time into the scratch ``W`` (kb * block, 16:
    @dq16 / @dq32); the panel's columns for ROWS rows (then one) at a time, each output one
    fused multiply-add chain in k order (MLAS's SGEMM kernel over the dequantized weight),
    then the bias. n0, n1 multiples of 16."""
    def tile(rows: int, tag: str, m: str, after: str) -> list[str]:
        R, H = range(rows), range(2)
        T = [f"{tag}.pre:",
             *(f"  %{tag}arow{r} = mul i64 {m}, %K" if r == 0 else
               f"  %{tag}arow{r} = add i64 %{tag}arow{r - 1}, %K" for r in R),
             "  br label %" + f"{tag}.k",
             f"{tag}.k:",
             f"  %{tag}k = phi i64 [0, %{tag}.pre], [%{tag}k.next, %{tag}.k]",
             *(f"  %{tag}acc{r}_{h} = phi {_VF} [zeroinitializer, %{tag}.pre], "
               f"[%{tag}acc{r}_{h}.n, %{tag}.k]" for r in R for h in H),
             f"  %{tag}wi0 = mul i64 %{tag}k, {PANEL}",
             f"  %{tag}wi = add i64 %{tag}wi0, %pb",
             f"  %{tag}wp0 = getelementptr float, ptr %W, i64 %{tag}wi",
             f"  %{tag}w0 = load {_VF}, ptr %{tag}wp0, align 4",
             f"  %{tag}wp1 = getelementptr float, ptr %{tag}wp0, i64 8",
             f"  %{tag}w1 = load {_VF}, ptr %{tag}wp1, align 4"]
        for r in R:
            T += [f"  %{tag}ai{r} = add i64 %{tag}arow{r}, %{tag}k",
                  f"  %{tag}ap{r} = getelementptr float, ptr %A, i64 %{tag}ai{r}",
                  f"  %{tag}a{r} = load float, ptr %{tag}ap{r}, align 4"]
            _splat(T, f"{tag}as{r}", f"%{tag}a{r}")
            T += [f"  %{tag}acc{r}_{h}.n = call {_VF} @llvm.fma.v8f32({_VF} %{tag}as{r}, "
                  f"{_VF} %{tag}w{h}, {_VF} %{tag}acc{r}_{h})" for h in H]
        T += [*latch(f"{tag}k", "1", f"{tag}k.more", "%K", f"{tag}.k", f"{tag}.out"),
              f"{tag}.out:"]
        for r in R:
            T += [f"  %{tag}m{r} = add i64 {m}, {r}",
                  f"  %{tag}ci0{r} = mul i64 %{tag}m{r}, %Np",
                  f"  %{tag}ci{r} = add i64 %{tag}ci0{r}, %n"]
            for h in H:
                T += [f"  %{tag}yb{r}_{h} = fadd {_VF} %{tag}acc{r}_{h}.n, %bval{h}",
                      f"  %{tag}y{r}_{h} = select i1 %hb, {_VF} %{tag}yb{r}_{h}, "
                      f"{_VF} %{tag}acc{r}_{h}.n",
                      f"  %{tag}cj{r}_{h} = add i64 %{tag}ci{r}, {8 * h}",
                      f"  %{tag}cp{r}_{h} = getelementptr float, ptr %C, i64 %{tag}cj{r}_{h}",
                      f"  store {_VF} %{tag}y{r}_{h}, ptr %{tag}cp{r}_{h}, align 4"]
        return T + [f"  br label %{after}"]

    return [f"define void @fp32_rows{block}(ptr noalias %A, ptr noalias %W, "
            "ptr noalias %bias, ptr noalias %C, i64 %M, i64 %K, i64 %Np, i64 %n0, i64 %n1, "
            "ptr noalias %B, ptr noalias %sb, ptr noalias %Zq, i64 %N, i64 %kb) nounwind {",
            "entry:",
            "  %hb = icmp ne ptr %bias, null",
            f"  %Mrest = srem i64 %M, {ROWS}",
            "  %Mtile = sub i64 %M, %Mrest",
            "  %anyn = icmp slt i64 %n0, %n1",
            "  %anyk = icmp sgt i64 %K, 0",
            "  %any = and i1 %anyn, %anyk",
            "  br i1 %any, label %n.loop, label %end",
            "n.loop:",
            "  %n = phi i64 [%n0, %entry], [%n.next, %n.end]",
            f"  call void @dq{min(block, 32)}(ptr %B, ptr %sb, ptr %Zq, ptr %W, i64 %n, "
            f"i64 %N, i64 %kb, i64 {(block // min(block, 32)).bit_length() - 1})",
            "  %pb = add i64 0, 0",  # the panel's scratch
            "  br i1 %hb, label %bias.yes, label %bias.no",
            "bias.yes:",
            "  %bp0 = getelementptr float, ptr %bias, i64 %n",
            f"  %bv0 = load {_VF}, ptr %bp0, align 4",
            "  %bp1 = getelementptr float, ptr %bp0, i64 8",
            f"  %bv1 = load {_VF}, ptr %bp1, align 4",
            "  br label %bias.no",
            "bias.no:",
            f"  %bval0 = phi {_VF} [%bv0, %bias.yes], [zeroinitializer, %n.loop]",
            f"  %bval1 = phi {_VF} [%bv1, %bias.yes], [zeroinitializer, %n.loop]",
            "  %anyr = icmp sgt i64 %Mtile, 0",
            "  br i1 %anyr, label %r.loop, label %o.head",
            "r.loop:",
            "  %r = phi i64 [0, %bias.no], [%r.next, %r.latch]",
            "  br label %rt.pre",
            *tile(ROWS, "rt", "%r", "r.latch"),
            "r.latch:",
            *latch("r", ROWS, "r.more", "%Mtile", "r.loop", "o.head"),
            "o.head:",
            "  %o = phi i64 [%Mtile, %bias.no], [%Mtile, %r.latch], [%o.next, %o.latch]",
            "  %o.ok = icmp slt i64 %o, %M",
            "  br i1 %o.ok, label %ot.pre, label %n.end",
            *tile(1, "ot", "%o", "o.latch"),
            "o.latch:",
            "  %o.next = add i64 %o, 1",
            "  br label %o.head",
            "n.end:",
            *latch("n", PANEL, "n.more", "%n1", "n.loop", "end"),
            "end:",
            "  ret void",
            "}"]


def module_ir(target=None) -> str:
    parts = [*zshare_ir()]
    parts += _dequantize_panel(16) + _dequantize_panel(32)
    for block in FP32_BLOCKS:
        parts += _fp32_rows(block)
        parts += _fq_columns(block, COLS) + _fq_columns(block, 1) + _fq_m1(block)
    for block in BLOCKS:
        parts += quantize_ir(block=block)
        parts += _column(block, ROWS) + _column(block, 1) + _gemm(block)
        if block > 32:
            parts += _columns_m1(block, COLS) + _columns_m1(block, 1)
            for sym in (False, True):
                parts += _columns8_m1(block, sym) + _gemm_m1(block, sym) + _row(block, sym)
    decl = []
    for C in (16, 64):
        VC, VI = f"<{C} x float>", f"<{C} x i32>"
        decl += [f"declare {VC} @llvm.fabs.v{C}f32({VC})",
                 f"declare {VC} @llvm.maxnum.v{C}f32({VC}, {VC})",
                 f"declare float @llvm.vector.reduce.fmax.v{C}f32({VC})",
                 f"declare {VC} @llvm.rint.v{C}f32({VC})",
                 f"declare i32 @llvm.vector.reduce.add.v{C}i32({VI})"]
    return "\n".join([*parts, *decl,
                      f"declare {_VF} @llvm.fma.v8f32({_VF}, {_VF}, {_VF})",
                      "declare float @llvm.fma.f32(float, float, float)",
                      "declare void @llvm.prefetch.p0(ptr, i32, i32, i32)",
                      f"declare {_VH} @llvm.x86.avx2.pmadd.ub.sw({_V32B}, {_V32B})",
                      "declare <8 x i16> @llvm.x86.ssse3.pmadd.ub.sw.128(<16 x i8>, <16 x i8>)",
                      f"declare {_V8} @llvm.x86.avx2.pmadd.wd({_VH}, {_VH})"])


_P = ctypes.c_void_p
_I = ctypes.c_int64
_QUANT = ctypes.CFUNCTYPE(None, _P, _P, _P, _P, _I, _I)
_GEMM = ctypes.CFUNCTYPE(None, _P, _P, _P, _P, _P, _P, _P, _I, _I, _I, _I, _I, _I)
_ZSHARE = ctypes.CFUNCTYPE(None, _P, _P, _P, _I, _I, _I, _I, _I)
_FP32_ROWS = ctypes.CFUNCTYPE(None, _P, _P, _P, _P, _I, _I, _I, _I, _I, _P, _P, _P, _I,
                              _I)
_ROW = ctypes.CFUNCTYPE(None, _P, _P, _P)
_JOB = ctypes.CFUNCTYPE(None, _P)
_FQ_M1 = ctypes.CFUNCTYPE(None, _P, _P, _P, _P, _P, _P, _I, _I, _I, _I)


def _module() -> jit.Module:
    signatures = {"zshare": _ZSHARE}
    for block in FP32_BLOCKS:
        signatures[f"fp32_rows{block}"] = _FP32_ROWS
        signatures[f"fq{block}_m1"] = _FQ_M1
    for block in BLOCKS:
        signatures[f"quantize{block}"] = _QUANT
        signatures[f"gemm{block}"] = _GEMM
        if block > 32:
            for sfx in ("", "s"):
                signatures[f"gemm{block}_m1{sfx}"] = _GEMM
                signatures[f"row{block}{sfx}"] = _ROW
                signatures[f"row_job{block}{sfx}"] = _JOB
    return jit.compile_module("nbits_blocks", module_ir, signatures, REQUIRES)


def unavailable() -> str | None:
    return jit.why_unavailable(REQUIRES) or jit.why_not_loaded("nbits_blocks", _module)


def supported_int8(bits: int, block_size: int) -> bool:
    return bits == 4 and block_size in BLOCKS


def supported_fp32(bits: int, block_size: int) -> bool:
    """MLAS's CompFp32 path: 4 bits, blocks of 16 to 256."""
    return bits == 4 and block_size in FP32_BLOCKS


class Int8:
    """MLAS's CompInt8 product for one constant weight (blocks of 16, 64, 128, 256): packed
    (N, kb, block / 2) bytes, scales (N, kb), zero points (N, kb) bytes or None (8), and
    zp * scale transposed, (kb, N) (the zero points' share for several rows)."""

    def __init__(self, packed: np.ndarray, scales: np.ndarray, block: int,
                 zero_points: np.ndarray | None, zs: np.ndarray) -> None:
        self.N, self.kb = scales.shape
        self.block, self.K = block, self.kb * block
        zq = np.full((self.N, self.kb), 8, np.uint8) if zero_points is None else \
            np.ascontiguousarray(zero_points, dtype=np.uint8)
        self.keep = (packed, scales, zq, zs)  # the kernel reads them
        self.ptrs = (packed.ctypes.data, scales.ctypes.data, zq.ctypes.data, zs.ctypes.data)
        self.nfold = self.N - self.N % 4
        module = _module()
        self._quantize = getattr(module, f"quantize{block}")
        self.fn = getattr(module, f"gemm{block}")
        sym = "s" if zero_points is None else ""  # no zero points: 8 as a shift
        self.fn1 = getattr(module, f"gemm{block}_m1{sym}", None)  # MLAS's M == 1 (64-256)
        self.zfn = module.zshare
        self._row = getattr(module, f"row{block}{sym}", None)
        job = getattr(module, f"row_job{block}{sym}", None)
        self._job = None if job is None else ctypes.cast(job, ctypes.c_void_p).value
        self._consts = None
        self._parts: dict[int, RowParts] = {}

    def bind_bias(self, bias: np.ndarray | None) -> None:
        """A constant bias (N,) float32, or None: row() adds it (kept alive here)."""
        self.bias = bias
        B, S, Zq, _ = self.ptrs
        words = [Zq, B, S, 0 if bias is None else bias.ctypes.data, self.N, self.kb, self.nfold]
        self._consts = np.array(words, np.int64)
        self._pconsts = self._consts.ctypes.data

    def row(self, a: np.ndarray, out: np.ndarray) -> bool:
        """out (N,) = one row's product, the bound bias included, in one compiled call
        (blocks of 64-256, a bound bias, ``a`` one row of float32, K within MAX_STACK_K);
        False where it does not apply (the caller takes the general path)."""
        a = self._whole(a)
        if self._row is None or self._consts is None or a is None:
            return False
        address = jit.address
        self._row(address(a), address(out), self._pconsts)
        return True

    def _whole(self, a: np.ndarray) -> np.ndarray | None:
        """One row as whole blocks of contiguous float32 (a last partial block padded with
        zeros, as quantize pads it), or None where the one-call paths do not apply."""
        if a.dtype != np.float32 or self.K > MAX_STACK_K or \
                not self.K - self.block < a.size <= self.K:
            return None
        if a.size == self.K and a.flags.c_contiguous:
            return a
        full = np.zeros(self.K, np.float32)
        full[:a.size] = a.reshape(-1)
        return full

    def row_parts(self, a: np.ndarray, out: np.ndarray, parts: int, pool) -> bool:
        """row(a, out) with the columns in ``parts`` ranges (their inner ends multiples of 8)
        run at once on ``pool`` (compiled/spin.py), each part quantizing the row itself; False
        where row() does not apply."""
        a = self._whole(a)
        if self._job is None or self._consts is None or a is None:
            return False
        split = self._parts.get(parts)
        if split is None:
            Zq, B, S, bias, N, kb, nfold = (int(w) for w in self._consts)
            eights = -(-N // 8)
            q, r = divmod(eights, max(1, min(parts, eights)))
            ends = np.cumsum([q + (i < r) for i in range(min(parts, eights))]) * 8
            ranges = [(int(e0), min(int(e1), N)) for e0, e1 in zip([0, *ends[:-1]], ends,
                                                                      strict=True)]
            split = self._parts[parts] = RowParts(self._job, [Zq, B, S, bias],
                                                  [N, kb, nfold], ranges)
        split.fork(pool, a, out)
        return True

    def quantize(self, A: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """A (M, K) float32 as MLAS quantizes it: codes (this module's layout), scales and
        sa * (sum of codes), per block; K padded with zeros to whole blocks."""
        M, K = A.shape
        if K != self.K or A.dtype != np.float32 or not A.flags.c_contiguous:
            full = np.zeros((M, self.K), np.float32)
            full[:, :K] = A
            A = full
        qa = np.empty((M, self.K), np.int8)
        sa = np.empty((M, self.kb), np.float32)
        asum = np.empty((M, self.kb), np.float32)
        address = jit.address
        self._quantize(address(A), address(qa), address(sa), address(asum), M, self.kb)
        return qa, sa, asum

    def one_row(self, M: int) -> bool:
        """Whether M rows take MLAS's M == 1 arithmetic (blocks of 64-256, one row)."""
        return M == 1 and self.fn1 is not None

    def __call__(self, qa: np.ndarray, sa: np.ndarray, asum: np.ndarray, bias, out: np.ndarray,
                 n0: int, n1: int) -> None:
        """out[:, n0:n1] = the rows' products (out (M, N) float32 C-contiguous; bias (N,)
        float32 or None)."""
        B, S, Zq, zs = self.ptrs
        M = qa.shape[0]
        address = jit.address
        pq, ps, po = address(qa), address(sa), address(out)
        pb = None if bias is None else address(bias)
        if self.one_row(M):
            self.fn1(pq, ps, Zq, B, S, pb, po, 1, n0, n1, self.N, self.kb, self.nfold)
            return
        self.zfn(address(asum), zs, po, M, n0, n1, self.N, self.kb)
        self.fn(pq, ps, Zq, B, S, pb, po, M, n0, n1, self.N, self.kb, self.nfold)


class Fp32:
    """MLAS's CompFp32 product (accuracy_level 0-3) for one constant weight, K long: packed
    (N, kb, block / 2) bytes, scales (N, kb), zero points (N, kb) bytes or None for 8. One
    row from the packed weight; several rows on the weight dequantized a panel of PANEL
    columns at a time into a scratch of kb * block * PANEL floats (as MLAS dequantizes B for
    its SGEMM: no float copy kept, 8x the packed bytes)."""

    def __init__(self, K: int, packed: np.ndarray, scales: np.ndarray, block: int,
                 zero_points: np.ndarray | None) -> None:
        self.N, self.kb = scales.shape
        self.K = K
        self.Np = -(-self.N // PANEL) * PANEL
        self.Kp = self.kb * block
        zq = np.full((self.N, self.kb), 8, np.uint8) if zero_points is None else \
            np.ascontiguousarray(zero_points, dtype=np.uint8)
        self.keep = (packed, scales, zq)  # the kernel reads them
        self.ptrs = (packed.ctypes.data, scales.ctypes.data, zq.ctypes.data)
        self.nfold = self.N - self.N % 4
        module = _module()
        self.fn, self.fq = getattr(module, f"fp32_rows{block}"), getattr(module, f"fq{block}_m1")

    def __call__(self, A: np.ndarray, bias, out: np.ndarray, n0: int, n1: int,
                 one_row: bool) -> None:
        """out[:, n0:n1] = A @ W (+ bias) in MLAS's order; A (M, K), out (M, Np), bias (Np,)
        or None, all float32 C-contiguous; n0, n1 multiples of PANEL. ``one_row``: MLAS's
        M == 1 kernel (A one row)."""
        address = jit.address
        pb = None if bias is None else address(bias)
        if one_row:
            if A.size != self.Kp:  # the last block padded with zeros
                full = np.zeros(self.Kp, np.float32)
                full[:self.K] = A.reshape(-1)
                A = full
            B, S, Zq = self.ptrs
            self.fq(address(A), B, S, Zq, pb, address(out), n0, min(n1, self.N), self.kb,
                    self.nfold)
        else:
            B, S, Zq = self.ptrs
            panel = np.empty(self.Kp * PANEL, np.float32)  # this part's dequantized panel
            self.fn(address(A), address(panel), pb, address(out), A.shape[0], self.K, self.Np,
                    n0, n1, B, S, Zq, self.N, self.kb)


# compiled on its own, on first use (not in jit._BUNDLE): its IR is the largest (~6 s of a
# cold compile at load 11) and only models with these blocks or levels need it
__all__ = ["BLOCKS", "REQUIRES", "Fp32", "Int8", "module_ir", "supported_fp32",
           "supported_int8", "unavailable"]
