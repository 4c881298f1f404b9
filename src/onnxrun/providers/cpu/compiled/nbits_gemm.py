"""com.microsoft MatMulNBits (4 bits, blocks of 32, accuracy_level 4) for many rows of A (a
prompt): the int8 x 4-bit product tiled over rows and columns, with MLAS's float arithmetic
step for step, so that its results equal onnxruntime's bit for bit.

Why bit for bit: a level-4 product quantizes its input to int8 per block, and a code that
rounds the other way changes a product by amax / 127 of an input; in a 24-layer model every
such difference grows layer after layer (the 0.5b Qwen2 test folder's prompt logits differed
by 0.5 from onnxruntime's with every operator within 1e-6 of it). Only the same float
operations in the same order give the same tokens.

What MLAS's AVX2 CompInt8 kernel for BlkLen 32 and M > 1 computes (onnxruntime 1.32,
SQ4BitGemmKernel_BlkSum_CompInt8_avx2; M == 1 takes another kernel), per output (m, n):
- blocks b, b + 1 in pairs: the u8 x s8 products summed (exactly, in integers) over each 8
  consecutive elements, eight int32 lanes [b 0-7, b 8-15, b+1 0-7, b+1 8-15, b 16-23,
  b 24-31, b+1 16-23, b+1 24-31], converted to float and accumulated with one fused
  multiply-add by (sa * sb) of their block; an odd last block alone, lanes of 4 elements;
- the lanes folded as ((x0 + x1) + x2) + x3 + (((x4 + x5) + x6) + x7) where the column is in
  a group of four (FoldAccumulators), ((x0 + x4) + (x2 + x6)) + ((x1 + x5) + (x3 + x7)) for
  the last N % 4 columns (hsum_float_8); the bias added;
- the zero points' share added last: sum over b of (sa * sum of A's codes)[m, b] *
  (-zp * sb)[n, b], fused multiply-adds in block order from 0 (MLAS's float GEMM kernel).
The weight's nibbles are unsigned (0-15); the zero point (8 by default) is all in that share.

One row (a decode step) takes MLAS's M == 1 kernel's arithmetic
(MlasQ4Int8GemmM1KernelBlkLen32Avx2): without zero points the same lanes, scales and folds
over the nibbles minus 8, subtracted in integers (gemm1); with them each block on its own,
lanes of 4 elements (gemm1zp); no zero points' share after either. A decode step's row takes
row / rowzp / rowc: its quantization and the product in one call, eight columns per pass with
each column's float operations exactly those of gemm1 / gemm1zp (the integer sums, exact
either way, taken as sum a * w - z * sum a: fewer instructions), the next columns prefetched.

The weight stays as the model stores it (byte j of a block: element 2j in the low nibble,
2j + 1 in the high one); each 16 bytes are put in element order once per column tile and
serve all the tile's rows.
"""

from __future__ import annotations

import ctypes
import threading

import numpy as np

from . import jit, nbits_gemv
from .ir import latch

REQUIRES = ("avx2", "fma")
BLOCK = 32
# rows of C per tile (one column: the accumulators, the column's unpacked weight and its
# scales stay in registers, A's codes come straight from memory); columns per block of the
# row loop (the tile's rows of A stay in L1 across them)
ROWS, NBLOCK = 8, 16
# columns in MLAS's groups of four (FoldAccumulators); the last N % 4 are summed another way
GROUP = 4
# rows up to this long take rowc, its scratch on the stack (K + 20 kb bytes: ~100 KiB)
MAX_STACK_K = 1 << 16

_VB = "<16 x i8>"
_V32B = "<32 x i8>"
_VH = "<16 x i16>"
_V8 = "<8 x i32>"
_VF = "<8 x float>"
_ONES = "<" + ", ".join(["i16 1"] * 16) + ">"


def _mask(values) -> str:
    return "<" + ", ".join(f"i32 {v}" for v in values) + ">"


_ONE = _mask(v for j in range(16) for v in (j, 16 + j))  # one block: 16 low, 16 high in order
# the accumulator's lanes are MLAS's in the order [0, 1, 4, 5, 2, 3, 6, 7] (see _tile)
_SWAP = [0, 1, 4, 5, 2, 3, 6, 7]
_HALVES = _mask([0, 0, 0, 0, 1, 1, 1, 1])


def _signed(v: str) -> list[str]:
    """%{v}.s = the 32 nibbles %{v} minus 8 and %{v}.u = their magnitudes: MLAS's M == 1 kernel
    for weights without zero points subtracts the implicit 8 in integers (A's codes then take
    the signs of %{v}.s) and adds no share after."""
    return [f"  %{v}.s = sub {_V32B} %{v}, " + "<" + ", ".join(["i8 8"] * 32) + ">",
            f"  %{v}.u = call {_V32B} @llvm.x86.avx2.psign.b({_V32B} %{v}.s, {_V32B} %{v}.s)"]


def _tile(rows: int, fold: bool, sym: bool = False) -> list[str]:
    """@tile_{rows}_{fold|hsum}: C[m:m+rows, n] over all kb blocks.

    A pair of blocks: 32 weight bytes, their low nibbles [b's even elements | b+1's] and high
    ones [b's odd | b+1's] meet A's codes laid out the same way (quantize_rows); the two
    u8 x s8 products summed to 16 bits (at most 4 * 15 * 127), then pairs of those to 32: lanes
    [b 0-7, b 8-15, b 16-23, b 24-31 | b+1 0-7, ... b+1 24-31], MLAS's lanes in the order
    _SWAP, their scales sa * sb as [b x 4 | b+1 x 4] (A's scales come four times each, sa4).
    The zero points' share (Z, from @zshare) and the bias are added after the lanes' fold.
    ``sym``: one row as MLAS's M == 1 kernel (no zero points): the weight's nibbles minus 8 in
    integers (A's codes take their signs), the same lanes, no share (Z is not read)."""
    R = range(rows)
    name = f"tile_{rows}_{'fold' if fold else 'hsum'}{'_sym' if sym else ''}"
    L = [f"define internal void @{name}(ptr noalias %qa, ptr noalias %sa4, ptr %Z, "
         "ptr noalias %B, ptr noalias %sb, ptr noalias %bias, ptr %C, i64 %m, "
         "i64 %n, i64 %N, i64 %kb) nounwind alwaysinline {",
         "entry:",
         "  %K = mul i64 %kb, 32",
         "  %kb4 = mul i64 %kb, 4",
         "  %rowbytes = mul i64 %kb, 16",
         "  %pairs = lshr i64 %kb, 1",
         *(f"  %mr{r} = add i64 %m, {r}" for r in R),
         *(f"  %arow{r} = mul i64 %mr{r}, %K" for r in R),
         *(f"  %srow{r} = mul i64 %mr{r}, %kb4" for r in R),
         "  %brow = mul i64 %n, %rowbytes",
         "  %bsrow = mul i64 %n, %kb",
         "  %anyp = icmp ugt i64 %pairs, 0",
         "  br i1 %anyp, label %p.loop, label %p.end",
         "p.loop:",
         "  %p = phi i64 [0, %entry], [%p.next, %p.loop]",
         *(f"  %acc{r} = phi {_VF} [zeroinitializer, %entry], [%acc{r}.n, %p.loop]" for r in R),
         "  %b0 = shl i64 %p, 1",
         "  %boff = mul i64 %b0, 16",
         "  %aoff = mul i64 %b0, 32",
         "  %soff = mul i64 %b0, 4",
         "  %bo = add i64 %brow, %boff",
         "  %bp = getelementptr i8, ptr %B, i64 %bo",
         f"  %w = load {_V32B}, ptr %bp, align 1",
         f"  %lo = and {_V32B} %w, " + "<" + ", ".join(["i8 15"] * 32) + ">",
         f"  %hi = lshr {_V32B} %w, " + "<" + ", ".join(["i8 4"] * 32) + ">",
         *(_signed("lo") + _signed("hi") if sym else []),
         "  %sbi = add i64 %bsrow, %b0",
         "  %sbp = getelementptr float, ptr %sb, i64 %sbi",
         "  %sb2 = load <2 x float>, ptr %sbp, align 4",
         f"  %sb2w = shufflevector <2 x float> %sb2, <2 x float> poison, <8 x i32> "
         f"{_mask([0, 1, 1, 1, 1, 1, 1, 1])}",
         f"  %sb8 = call {_VF} @llvm.x86.avx2.permps({_VF} %sb2w, {_V8} {_HALVES})"]
    for r in R:
        L += [f"  %ao{r} = add i64 %arow{r}, %aoff",
              f"  %ap0_{r} = getelementptr i8, ptr %qa, i64 %ao{r}",
              f"  %a0_{r} = load {_V32B}, ptr %ap0_{r}, align 1",
              f"  %ap1_{r} = getelementptr i8, ptr %ap0_{r}, i64 32",
              f"  %a1_{r} = load {_V32B}, ptr %ap1_{r}, align 1",
              f"  %so{r} = add i64 %srow{r}, %soff",
              f"  %sap{r} = getelementptr float, ptr %sa4, i64 %so{r}",
              f"  %sa8_{r} = load {_VF}, ptr %sap{r}, align 4",
              *([f"  %a0s_{r} = call {_V32B} @llvm.x86.avx2.psign.b({_V32B} %a0_{r}, "
                 f"{_V32B} %lo.s)",
                 f"  %a1s_{r} = call {_V32B} @llvm.x86.avx2.psign.b({_V32B} %a1_{r}, "
                 f"{_V32B} %hi.s)",
                 f"  %dx{r} = call {_VH} @llvm.x86.avx2.pmadd.ub.sw({_V32B} %lo.u, "
                 f"{_V32B} %a0s_{r})",
                 f"  %dy{r} = call {_VH} @llvm.x86.avx2.pmadd.ub.sw({_V32B} %hi.u, "
                 f"{_V32B} %a1s_{r})"] if sym else [
                 f"  %dx{r} = call {_VH} @llvm.x86.avx2.pmadd.ub.sw({_V32B} %lo, "
                 f"{_V32B} %a0_{r})",
                 f"  %dy{r} = call {_VH} @llvm.x86.avx2.pmadd.ub.sw({_V32B} %hi, "
                 f"{_V32B} %a1_{r})"]),
              f"  %h{r} = add {_VH} %dx{r}, %dy{r}",
              f"  %q{r} = call {_V8} @llvm.x86.avx2.pmadd.wd({_VH} %h{r}, {_VH} {_ONES})",
              f"  %f{r} = sitofp {_V8} %q{r} to {_VF}",
              f"  %sv{r} = fmul {_VF} %sa8_{r}, %sb8",
              f"  %acc{r}.n = call {_VF} @llvm.fma.v8f32({_VF} %f{r}, {_VF} %sv{r}, "
              f"{_VF} %acc{r})"]
    L += [*latch("p", "1", "p.more", "%pairs", "p.loop", "p.end", pred="ult"),
          "p.end:",
          *(f"  %accp{r} = phi {_VF} [zeroinitializer, %entry], [%acc{r}.n, %p.loop]"
            for r in R),
          "  %odd = and i64 %kb, 1",
          "  %isodd = icmp ne i64 %odd, 0",
          "  br i1 %isodd, label %t.block, label %fin",
          "t.block:",  # an odd last block alone, A's codes in element order
          "  %bt = sub i64 %kb, 1",
          "  %btoff = mul i64 %bt, 16",
          "  %atoff = mul i64 %bt, 32",
          "  %tsoff = mul i64 %bt, 4",
          "  %tbo = add i64 %brow, %btoff",
          "  %tbp = getelementptr i8, ptr %B, i64 %tbo",
          f"  %tw = load {_VB}, ptr %tbp, align 1",
          f"  %tlo = and {_VB} %tw, " + "<" + ", ".join(["i8 15"] * 16) + ">",
          f"  %thi = lshr {_VB} %tw, " + "<" + ", ".join(["i8 4"] * 16) + ">",
          f"  %tbv = shufflevector {_VB} %tlo, {_VB} %thi, <32 x i32> {_ONE}",
          *(_signed("tbv") if sym else []),
          "  %tsbi = add i64 %bsrow, %bt",
          "  %tsbp = getelementptr float, ptr %sb, i64 %tsbi",
          "  %tsbv = load float, ptr %tsbp, align 4"]
    for r in R:
        L += [f"  %tao{r} = add i64 %arow{r}, %atoff",
              f"  %tap{r} = getelementptr i8, ptr %qa, i64 %tao{r}",
              f"  %ta{r} = load {_V32B}, ptr %tap{r}, align 1",
              f"  %tso{r} = add i64 %srow{r}, %tsoff",
              f"  %tsap{r} = getelementptr float, ptr %sa4, i64 %tso{r}",
              f"  %tsav{r} = load float, ptr %tsap{r}, align 4",
              *([f"  %tas{r} = call {_V32B} @llvm.x86.avx2.psign.b({_V32B} %ta{r}, "
                 f"{_V32B} %tbv.s)",
                 f"  %td{r} = call {_VH} @llvm.x86.avx2.pmadd.ub.sw({_V32B} %tbv.u, "
                 f"{_V32B} %tas{r})"] if sym else [
                 f"  %td{r} = call {_VH} @llvm.x86.avx2.pmadd.ub.sw({_V32B} %tbv, "
                 f"{_V32B} %ta{r})"]),
              f"  %tq{r} = call {_V8} @llvm.x86.avx2.pmadd.wd({_VH} %td{r}, {_VH} {_ONES})",
              f"  %tqs{r} = shufflevector {_V8} %tq{r}, {_V8} poison, <8 x i32> {_mask(_SWAP)}",
              f"  %tf{r} = sitofp {_V8} %tqs{r} to {_VF}",
              f"  %ts{r} = fmul float %tsav{r}, %tsbv",
              f"  %tsv0_{r} = insertelement {_VF} poison, float %ts{r}, i64 0",
              f"  %tsv{r} = shufflevector {_VF} %tsv0_{r}, {_VF} poison, <8 x i32> "
              "zeroinitializer",
              f"  %acct{r} = call {_VF} @llvm.fma.v8f32({_VF} %tf{r}, {_VF} %tsv{r}, "
              f"{_VF} %accp{r})"]
    L += ["  br label %fin",
          "fin:",
          *(f"  %accf{r} = phi {_VF} [%accp{r}, %p.end], [%acct{r}, %t.block]" for r in R),
          "  %biasp = getelementptr float, ptr %bias, i64 %n",
          "  %biasv = load float, ptr %biasp, align 4"]
    for r in R:
        # x{i}_{r}: MLAS's lane i
        L += [f"  %x{i}_{r} = extractelement {_VF} %accf{r}, i64 {_SWAP[i]}" for i in range(8)]
        if fold:
            L += [f"  %l1_{r} = fadd float %x0_{r}, %x1_{r}",
                  f"  %l2_{r} = fadd float %l1_{r}, %x2_{r}",
                  f"  %l3_{r} = fadd float %l2_{r}, %x3_{r}",
                  f"  %u1_{r} = fadd float %x4_{r}, %x5_{r}",
                  f"  %u2_{r} = fadd float %u1_{r}, %x6_{r}",
                  f"  %u3_{r} = fadd float %u2_{r}, %x7_{r}",
                  f"  %y_{r} = fadd float %l3_{r}, %u3_{r}"]
        else:
            L += [f"  %e04_{r} = fadd float %x0_{r}, %x4_{r}",
                  f"  %e15_{r} = fadd float %x1_{r}, %x5_{r}",
                  f"  %e26_{r} = fadd float %x2_{r}, %x6_{r}",
                  f"  %e37_{r} = fadd float %x3_{r}, %x7_{r}",
                  f"  %e0_{r} = fadd float %e04_{r}, %e26_{r}",
                  f"  %e1_{r} = fadd float %e15_{r}, %e37_{r}",
                  f"  %y_{r} = fadd float %e0_{r}, %e1_{r}"]
        L += [f"  %ci0_{r} = mul i64 %mr{r}, %N",
              f"  %ci_{r} = add i64 %ci0_{r}, %n",
              f"  %yb_{r} = fadd float %y_{r}, %biasv",
              *([f"  %out_{r} = fadd float %yb_{r}, 0x8000000000000000"] if sym else [
                 f"  %zp_{r} = getelementptr float, ptr %Z, i64 %ci_{r}",
                 f"  %zv_{r} = load float, ptr %zp_{r}, align 4",
                 f"  %out_{r} = fadd float %yb_{r}, %zv_{r}"]),
              f"  %cp_{r} = getelementptr float, ptr %C, i64 %ci_{r}",
              f"  store float %out_{r}, ptr %cp_{r}, align 4"]
    L += ["  ret void", "}"]
    return L


def _tile_zp1(fold: bool) -> list[str]:
    """@tile_1_{fold|hsum}_zp: C[m, n] for one row as MLAS's M == 1 kernel with zero points
    (accumulate_blklen32_r1c1blk2_zp_avx2): each block on its own, its nibbles minus its zero
    point in integers, eight int32 lanes of 4 consecutive elements, one fused multiply-add by
    sa * sb per block; no share after. %Z holds the zero points, (N, kb) bytes. With A's pair
    layout, the even and odd products summed to 16 bits are those lanes already: block b in
    the low 8, block b+1 in the high 8."""
    name = f"tile_1_{'fold' if fold else 'hsum'}_zp"
    V8W = "<8 x i16>"
    L = [f"define internal void @{name}(ptr noalias %qa, ptr noalias %sa4, ptr %Z, "
         "ptr noalias %B, ptr noalias %sb, ptr noalias %bias, ptr %C, i64 %m, "
         "i64 %n, i64 %N, i64 %kb) nounwind alwaysinline {",
         "entry:",
         "  %K = mul i64 %kb, 32",
         "  %kb4 = mul i64 %kb, 4",
         "  %rowbytes = mul i64 %kb, 16",
         "  %pairs = lshr i64 %kb, 1",
         "  %arow = mul i64 %m, %K",
         "  %srow = mul i64 %m, %kb4",
         "  %brow = mul i64 %n, %rowbytes",
         "  %bsrow = mul i64 %n, %kb",
         "  %anyp = icmp ugt i64 %pairs, 0",
         "  br i1 %anyp, label %p.loop, label %p.end",
         "p.loop:",
         "  %p = phi i64 [0, %entry], [%p.next, %p.loop]",
         f"  %acc = phi {_VF} [zeroinitializer, %entry], [%acc.n, %p.loop]",
         "  %b0 = shl i64 %p, 1",
         "  %boff = mul i64 %b0, 16",
         "  %aoff = mul i64 %b0, 32",
         "  %soff = mul i64 %b0, 4",
         "  %bo = add i64 %brow, %boff",
         "  %bp = getelementptr i8, ptr %B, i64 %bo",
         f"  %w = load {_V32B}, ptr %bp, align 1",
         f"  %lo0 = and {_V32B} %w, " + "<" + ", ".join(["i8 15"] * 32) + ">",
         f"  %hi0 = lshr {_V32B} %w, " + "<" + ", ".join(["i8 4"] * 32) + ">",
         "  %sbi = add i64 %bsrow, %b0",
         "  %zpp = getelementptr i8, ptr %Z, i64 %sbi",
         "  %zp2 = load <2 x i8>, ptr %zpp, align 1",
         f"  %zp32 = shufflevector <2 x i8> %zp2, <2 x i8> poison, <32 x i32> "
         f"{_mask([0] * 16 + [1] * 16)}",
         f"  %lo.s = sub {_V32B} %lo0, %zp32",
         f"  %hi.s = sub {_V32B} %hi0, %zp32",
         f"  %lo.u = call {_V32B} @llvm.x86.avx2.psign.b({_V32B} %lo.s, {_V32B} %lo.s)",
         f"  %hi.u = call {_V32B} @llvm.x86.avx2.psign.b({_V32B} %hi.s, {_V32B} %hi.s)",
         "  %sbp = getelementptr float, ptr %sb, i64 %sbi",
         "  %sb2 = load <2 x float>, ptr %sbp, align 4",
         "  %ao = add i64 %arow, %aoff",
         "  %ap0 = getelementptr i8, ptr %qa, i64 %ao",
         f"  %a0 = load {_V32B}, ptr %ap0, align 1",
         "  %ap1 = getelementptr i8, ptr %ap0, i64 32",
         f"  %a1 = load {_V32B}, ptr %ap1, align 1",
         "  %so = add i64 %srow, %soff",
         "  %sap = getelementptr float, ptr %sa4, i64 %so",
         "  %sa0 = load float, ptr %sap, align 4",
         "  %sap1 = getelementptr float, ptr %sap, i64 4",
         "  %sa1 = load float, ptr %sap1, align 4",
         f"  %a0s = call {_V32B} @llvm.x86.avx2.psign.b({_V32B} %a0, {_V32B} %lo.s)",
         f"  %a1s = call {_V32B} @llvm.x86.avx2.psign.b({_V32B} %a1, {_V32B} %hi.s)",
         f"  %dx = call {_VH} @llvm.x86.avx2.pmadd.ub.sw({_V32B} %lo.u, {_V32B} %a0s)",
         f"  %dy = call {_VH} @llvm.x86.avx2.pmadd.ub.sw({_V32B} %hi.u, {_V32B} %a1s)",
         f"  %h = add {_VH} %dx, %dy"]
    for k in (0, 1):
        L += [f"  %h{k} = shufflevector {_VH} %h, {_VH} poison, <8 x i32> "
              f"{_mask(range(8 * k, 8 * k + 8))}",
              f"  %q{k} = sext {V8W} %h{k} to {_V8}",
              f"  %f{k} = sitofp {_V8} %q{k} to {_VF}",
              f"  %sbe{k} = extractelement <2 x float> %sb2, i64 {k}",
              f"  %s{k} = fmul float %sa{k}, %sbe{k}",
              f"  %sv{k}.0 = insertelement {_VF} poison, float %s{k}, i64 0",
              f"  %sv{k} = shufflevector {_VF} %sv{k}.0, {_VF} poison, <8 x i32> zeroinitializer"]
    L += [f"  %acc.h = call {_VF} @llvm.fma.v8f32({_VF} %f0, {_VF} %sv0, {_VF} %acc)",
          f"  %acc.n = call {_VF} @llvm.fma.v8f32({_VF} %f1, {_VF} %sv1, {_VF} %acc.h)",
          *latch("p", "1", "p.more", "%pairs", "p.loop", "p.end", pred="ult"),
          "p.end:",
          f"  %accp = phi {_VF} [zeroinitializer, %entry], [%acc.n, %p.loop]",
          "  %odd = and i64 %kb, 1",
          "  %isodd = icmp ne i64 %odd, 0",
          "  br i1 %isodd, label %t.block, label %fin",
          "t.block:",
          "  %bt = sub i64 %kb, 1",
          "  %btoff = mul i64 %bt, 16",
          "  %atoff = mul i64 %bt, 32",
          "  %tsoff = mul i64 %bt, 4",
          "  %tbo = add i64 %brow, %btoff",
          "  %tbp = getelementptr i8, ptr %B, i64 %tbo",
          f"  %tw = load {_VB}, ptr %tbp, align 1",
          f"  %tlo = and {_VB} %tw, " + "<" + ", ".join(["i8 15"] * 16) + ">",
          f"  %thi = lshr {_VB} %tw, " + "<" + ", ".join(["i8 4"] * 16) + ">",
          f"  %tbv0 = shufflevector {_VB} %tlo, {_VB} %thi, <32 x i32> {_ONE}",
          "  %tsbi = add i64 %bsrow, %bt",
          "  %tzpp = getelementptr i8, ptr %Z, i64 %tsbi",
          "  %tzp = load i8, ptr %tzpp, align 1",
          f"  %tzv0 = insertelement {_V32B} poison, i8 %tzp, i64 0",
          f"  %tzv = shufflevector {_V32B} %tzv0, {_V32B} poison, <32 x i32> zeroinitializer",
          f"  %tbv.s = sub {_V32B} %tbv0, %tzv",
          f"  %tbv.u = call {_V32B} @llvm.x86.avx2.psign.b({_V32B} %tbv.s, {_V32B} %tbv.s)",
          "  %tsbp = getelementptr float, ptr %sb, i64 %tsbi",
          "  %tsbv = load float, ptr %tsbp, align 4",
          "  %tao = add i64 %arow, %atoff",
          "  %tap = getelementptr i8, ptr %qa, i64 %tao",
          f"  %ta = load {_V32B}, ptr %tap, align 1",
          "  %tso = add i64 %srow, %tsoff",
          "  %tsap = getelementptr float, ptr %sa4, i64 %tso",
          "  %tsav = load float, ptr %tsap, align 4",
          f"  %tas = call {_V32B} @llvm.x86.avx2.psign.b({_V32B} %ta, {_V32B} %tbv.s)",
          f"  %td = call {_VH} @llvm.x86.avx2.pmadd.ub.sw({_V32B} %tbv.u, {_V32B} %tas)",
          f"  %tq = call {_V8} @llvm.x86.avx2.pmadd.wd({_VH} %td, {_VH} {_ONES})",
          f"  %tf = sitofp {_V8} %tq to {_VF}",
          "  %ts = fmul float %tsav, %tsbv",
          f"  %tsv0 = insertelement {_VF} poison, float %ts, i64 0",
          f"  %tsv = shufflevector {_VF} %tsv0, {_VF} poison, <8 x i32> zeroinitializer",
          f"  %acct = call {_VF} @llvm.fma.v8f32({_VF} %tf, {_VF} %tsv, {_VF} %accp)",
          "  br label %fin",
          "fin:",
          f"  %accf = phi {_VF} [%accp, %p.end], [%acct, %t.block]",
          "  %biasp = getelementptr float, ptr %bias, i64 %n",
          "  %biasv = load float, ptr %biasp, align 4",
          *(f"  %x{i} = extractelement {_VF} %accf, i64 {i}" for i in range(8))]
    if fold:
        L += ["  %l1 = fadd float %x0, %x1", "  %l2 = fadd float %l1, %x2",
              "  %l3 = fadd float %l2, %x3", "  %u1 = fadd float %x4, %x5",
              "  %u2 = fadd float %u1, %x6", "  %u3 = fadd float %u2, %x7",
              "  %y = fadd float %l3, %u3"]
    else:
        L += ["  %e04 = fadd float %x0, %x4", "  %e15 = fadd float %x1, %x5",
              "  %e26 = fadd float %x2, %x6", "  %e37 = fadd float %x3, %x7",
              "  %e0 = fadd float %e04, %e26", "  %e1 = fadd float %e15, %e37",
              "  %y = fadd float %e0, %e1"]
    L += ["  %out = fadd float %y, %biasv",
          "  %ci0 = mul i64 %m, %N",
          "  %ci = add i64 %ci0, %n",
          "  %cp = getelementptr float, ptr %C, i64 %ci",
          "  store float %out, ptr %cp, align 4",
          "  ret void",
          "}"]
    return L


def zshare_ir() -> list[str]:
    """zshare(as, zs, Z, M, n0, n1, N, kb): Z[m, n] = sum over b of as[m, b] * -zs[b, n] by
    fused multiply-adds in block order from 0 (MLAS's float GEMM kernel for the zero points'
    share, its QuantBBlkSum being -zp * scale; zs = zp * scale is nbits_gemv's array, negated
    here exactly), 8 columns at a time, then one by one."""
    return [
        "define void @zshare(ptr noalias %as, ptr noalias %bs, ptr noalias %Z, i64 %M, "
        "i64 %n0, i64 %n1, i64 %N, i64 %kb) nounwind {",
        "entry:",
        "  %w = sub i64 %n1, %n0",
        "  %w8 = and i64 %w, -8",
        "  %n8 = add i64 %n0, %w8",
        "  %anym = icmp sgt i64 %M, 0",
        "  br i1 %anym, label %m.loop, label %end",
        "m.loop:",
        "  %m = phi i64 [0, %entry], [%m.next, %m.end]",
        "  %arow = mul i64 %m, %kb",
        "  %zrow = mul i64 %m, %N",
        "  %any8 = icmp slt i64 %n0, %n8",
        "  br i1 %any8, label %v.loop, label %v.end",
        "v.loop:",
        "  %n = phi i64 [%n0, %m.loop], [%n.next, %v.done]",
        "  br label %vb.loop",
        "vb.loop:",
        "  %b = phi i64 [0, %v.loop], [%b.next, %vb.loop]",
        f"  %acc = phi {_VF} [zeroinitializer, %v.loop], [%acc.n, %vb.loop]",
        "  %ai = add i64 %arow, %b",
        "  %ap = getelementptr float, ptr %as, i64 %ai",
        "  %av = load float, ptr %ap, align 4",
        f"  %av0 = insertelement {_VF} poison, float %av, i64 0",
        f"  %av8 = shufflevector {_VF} %av0, {_VF} poison, <8 x i32> zeroinitializer",
        "  %bi0 = mul i64 %b, %N",
        "  %bi = add i64 %bi0, %n",
        "  %bp = getelementptr float, ptr %bs, i64 %bi",
        f"  %bv0 = load {_VF}, ptr %bp, align 4",
        f"  %bv = fneg {_VF} %bv0",
        f"  %acc.n = call {_VF} @llvm.fma.v8f32({_VF} %av8, {_VF} %bv, {_VF} %acc)",
        *latch("b", "1", "b.more", "%kb", "vb.loop", "v.done"),
        "v.done:",
        "  %zi = add i64 %zrow, %n",
        "  %zp = getelementptr float, ptr %Z, i64 %zi",
        f"  store {_VF} %acc.n, ptr %zp, align 4",
        *latch("n", "8", "n.more", "%n8", "v.loop", "v.end"),
        "v.end:",
        "  %anys = icmp slt i64 %n8, %n1",
        "  br i1 %anys, label %s.loop, label %m.end",
        "s.loop:",
        "  %sn = phi i64 [%n8, %v.end], [%sn.next, %s.done]",
        "  br label %sb.loop",
        "sb.loop:",
        "  %c = phi i64 [0, %s.loop], [%c.next, %sb.loop]",
        "  %sacc = phi float [0.0, %s.loop], [%sacc.n, %sb.loop]",
        "  %sai = add i64 %arow, %c",
        "  %sap = getelementptr float, ptr %as, i64 %sai",
        "  %sav = load float, ptr %sap, align 4",
        "  %sbi0 = mul i64 %c, %N",
        "  %sbi = add i64 %sbi0, %sn",
        "  %sbp = getelementptr float, ptr %bs, i64 %sbi",
        "  %sbv0 = load float, ptr %sbp, align 4",
        "  %sbv = fneg float %sbv0",
        "  %sacc.n = call float @llvm.fma.f32(float %sav, float %sbv, float %sacc)",
        *latch("c", "1", "c.more", "%kb", "sb.loop", "s.done"),
        "s.done:",
        "  %szi = add i64 %zrow, %sn",
        "  %szp = getelementptr float, ptr %Z, i64 %szi",
        "  store float %sacc.n, ptr %szp, align 4",
        *latch("sn", "1", "sn.more", "%n1", "s.loop", "m.end"),
        "m.end:",
        *latch("m", "1", "m.more", "%M", "m.loop", "end"),
        "end:",
        "  ret void",
        "}"]


def _loop(label: str, var: str, start: str, stop: str, step: int, body: list[str],
          after: str) -> list[str]:
    """A counted loop ``var`` = start, start + step, ... < stop around ``body`` (whose blocks
    end in a branch to ``%{label}.latch``), entered from block ``{label}.pre``, leaving to
    ``after``."""
    return [f"  br label %{label}.head",
            f"{label}.head:",
            f"  %{var} = phi i64 [{start}, %{label}.pre], [%{var}.next, %{label}.latch]",
            f"  %{var}.ok = icmp slt i64 %{var}, {stop}",
            f"  br i1 %{var}.ok, label %{label}.body, label %{after}",
            f"{label}.body:",
            *body,
            f"{label}.latch:",
            f"  %{var}.next = add i64 %{var}, {step}",
            f"  br label %{label}.head"]


def _gemm(sym: str = "") -> list[str]:
    """gemm(qa, sa4, Z, B, sb, bias, C, M, n0, n1, N, kb, nfold): columns [n0, n1) of C for M
    rows of A; columns below nfold (N - N % 4) folded as MLAS's groups of four, the rest as
    its single columns; blocks of NBLOCK columns, in each the rows ROWS at a time (then one)
    and for each row tile the block's columns."""
    args = "ptr %qa, ptr %sa4, ptr %Z, ptr %B, ptr %sb, ptr %bias, ptr %C"

    def call(rows, fold, m, n, label):
        if sym and rows != 1:  # no M == 1 kernel for several rows: never reached
            return [f"  br label %{label}.latch"]
        return [f"  call void @tile_{rows}_{'fold' if fold else 'hsum'}{sym and '_' + sym}"
                f"({args}, i64 {m}, i64 {n}, i64 %N, i64 %kb)", f"  br label %{label}.latch"]

    def columns(fold, p):
        """Loops over [start, stop) of one kind of column: blocks, row tiles, columns."""
        start, stop = ("%n0", "%nend") if fold else ("%tstart", "%n1")
        inner_r = _loop(f"{p}c", f"{p}c", f"%{p}b", f"%{p}be", 1,
                        call(ROWS, fold, f"%{p}m", f"%{p}c", f"{p}c"), f"{p}m.latch")
        inner_1 = _loop(f"{p}d", f"{p}d", f"%{p}b", f"%{p}be", 1,
                        call(1, fold, f"%{p}r", f"%{p}d", f"{p}d"), f"{p}r.latch")
        rows_r = _loop(f"{p}m", f"{p}m", "0", "%Mtile", ROWS,
                       ["  br label %" + f"{p}c.pre", f"{p}c.pre:", *inner_r], f"{p}r.pre")
        rows_1 = _loop(f"{p}r", f"{p}r", "%Mtile", "%M", 1,
                       ["  br label %" + f"{p}d.pre", f"{p}d.pre:", *inner_1], f"{p}b.latch")
        body = [f"  %{p}be0 = add i64 %{p}b, {NBLOCK}",
                f"  %{p}lt = icmp slt i64 %{p}be0, {stop}",
                f"  %{p}be = select i1 %{p}lt, i64 %{p}be0, i64 {stop}",
                f"  br label %{p}m.pre", f"{p}m.pre:", *rows_r, f"{p}r.pre:", *rows_1]
        return _loop(f"{p}b", f"{p}b", start, stop, NBLOCK, body,
                     "h.pre" if fold else "end")

    fn = {"": "gemm", "sym": "gemm1", "zp": "gemm1zp"}[sym]
    return [f"define void @{fn}(ptr noalias %qa, ptr noalias %sa4, ptr %Z, "
            "ptr noalias %B, ptr noalias %sb, ptr noalias %bias, ptr %C, i64 %M, "
            "i64 %n0, i64 %n1, i64 %N, i64 %kb, i64 %nfold) nounwind {",
            "entry:",
            f"  %Mrest = srem i64 %M, {ROWS}",
            "  %Mtile = sub i64 %M, %Mrest",
            "  %lt = icmp slt i64 %n1, %nfold",
            "  %nend = select i1 %lt, i64 %n1, i64 %nfold",
            "  %gt = icmp sgt i64 %n0, %nfold",
            "  %tstart = select i1 %gt, i64 %n0, i64 %nfold",
            "  br label %fb.pre",
            "fb.pre:",
            *columns(True, "f"),
            "h.pre:",
            "  br label %hb.pre",
            "hb.pre:",
            *columns(False, "h"),
            "end:",
            "  ret void",
            "}"]


def _transpose8(L: list[str], rows: list[str], tag: str) -> list[str]:
    """The 8 x 8 transpose of eight <8 x float> vectors (unpack, shuffle, permute: what a
    compiler makes of it); returns the names of the columns: result j holds lane j of each."""
    lo, hi = [0, 8, 1, 9, 4, 12, 5, 13], [2, 10, 3, 11, 6, 14, 7, 15]
    t = []
    for i in range(0, 8, 2):
        L += [f"  %{tag}a{i} = shufflevector {_VF} {rows[i]}, {_VF} {rows[i + 1]}, <8 x i32> "
              f"{_mask(lo)}",
              f"  %{tag}a{i + 1} = shufflevector {_VF} {rows[i]}, {_VF} {rows[i + 1]}, "
              f"<8 x i32> {_mask(hi)}"]
        t += [f"%{tag}a{i}", f"%{tag}a{i + 1}"]
    lo2, hi2 = [0, 1, 8, 9, 4, 5, 12, 13], [2, 3, 10, 11, 6, 7, 14, 15]
    u = {}
    for g in (0, 4):  # rows g..g+3: t[g], t[g+1] (0-1 / 2-3 interleaved) and t[g+2], t[g+3]
        for k, (x, y, mask) in enumerate([(0, 2, lo2), (0, 2, hi2), (1, 3, lo2), (1, 3, hi2)]):
            L += [f"  %{tag}b{g + k} = shufflevector {_VF} {t[g + x]}, {_VF} {t[g + y]}, "
                  f"<8 x i32> {_mask(mask)}"]
            u[g + k] = f"%{tag}b{g + k}"
    out = [""] * 8
    for k in range(4):  # u[k]: lanes k and k + 4 of rows 0-3; u[4 + k] of rows 4-7
        L += [f"  %{tag}c{k} = shufflevector {_VF} {u[k]}, {_VF} {u[4 + k]}, <8 x i32> "
              f"{_mask([0, 1, 2, 3, 8, 9, 10, 11])}",
              f"  %{tag}c{k + 4} = shufflevector {_VF} {u[k]}, {_VF} {u[4 + k]}, <8 x i32> "
              f"{_mask([4, 5, 6, 7, 12, 13, 14, 15])}"]
        out[k], out[k + 4] = f"%{tag}c{k}", f"%{tag}c{k + 4}"
    return out


def _row8(zp: bool) -> list[str]:
    """@row8_{sym|zp}: C[0, n:n+8] for one row, eight columns in MLAS's groups of four, each
    column's arithmetic exactly @tile_1_fold_sym's / @tile_1_fold_zp's (the same lanes, fused
    multiply-adds in block order, fold and bias), the eight side by side: A's codes and scales
    are loaded once per pair of blocks for all eight, eight independent accumulator chains
    hide the multiply-adds' latency, and the folds run on the transposed accumulators (lane c:
    column c), one vector operation for eight scalar ones."""
    name = f"row8_{'zp' if zp else 'sym'}"
    C8 = range(8)
    L = [f"define internal void @{name}(ptr noalias %qa, ptr noalias %sa4, ptr %Z, "
         "ptr noalias %B, ptr noalias %sb, ptr noalias %bias, ptr %C, i64 %n, i64 %kb) "
         "nounwind alwaysinline {",
         "entry:",
         "  %rowbytes = mul i64 %kb, 16",
         "  %pairs = lshr i64 %kb, 1",
         *(f"  %nc{c} = add i64 %n, {c}" for c in C8),
         *(f"  %brow{c} = mul i64 %nc{c}, %rowbytes" for c in C8),
         *(f"  %bsrow{c} = mul i64 %nc{c}, %kb" for c in C8),
         "  %anyp = icmp ugt i64 %pairs, 0",
         "  br i1 %anyp, label %p.loop, label %p.end",
         "p.loop:",
         "  %p = phi i64 [0, %entry], [%p.next, %p.loop]",
         *(f"  %acc{c} = phi {_VF} [zeroinitializer, %entry], [%acc{c}.n, %p.loop]" for c in C8),
         "  %b0 = shl i64 %p, 1",
         "  %boff = mul i64 %b0, 16",
         "  %aoff = mul i64 %b0, 32",
         "  %soff = mul i64 %b0, 4",
         "  %ap0 = getelementptr i8, ptr %qa, i64 %aoff",
         f"  %a0 = load {_V32B}, ptr %ap0, align 1",
         "  %ap1 = getelementptr i8, ptr %ap0, i64 32",
         f"  %a1 = load {_V32B}, ptr %ap1, align 1",
         "  %sap = getelementptr float, ptr %sa4, i64 %soff"]
    # The integer sums are MLAS's exactly, computed with fewer operations: sum a * (w - z) as
    # sum a * w (w the unsigned nibbles) minus z * sum a, the sums of A's codes taken once
    # per pair of blocks for the eight columns (all terms within 16 bits: |a| <= 127).
    u8 = "<" + ", ".join(["i8 1"] * 32) + ">"
    L += [f"  %as0 = call {_VH} @llvm.x86.avx2.pmadd.ub.sw({_V32B} {u8}, {_V32B} %a0)",
          f"  %as1 = call {_VH} @llvm.x86.avx2.pmadd.ub.sw({_V32B} {u8}, {_V32B} %a1)",
          f"  %as = add {_VH} %as0, %as1"]  # lane j: the codes of lane j of h below
    # The next eight columns' bytes and scales, one pass ahead, linearly (a pass reads 256
    # bytes and 64 of scales per pair): eight short streams (a column is rowbytes long) are
    # more than the hardware prefetcher follows in time (896 x 4864: 0.45 -> 0.2 ms).
    L += ["  %pf.b0 = mul i64 %rowbytes, 8",
          "  %pf.b1 = add i64 %brow0, %pf.b0",
          "  %pf.b2 = mul i64 %p, 256",
          "  %pf.b = add i64 %pf.b1, %pf.b2"]
    for k in range(4):
        L += [f"  %pf.o{k} = add i64 %pf.b, {64 * k}",
              f"  %pf.p{k} = getelementptr i8, ptr %B, i64 %pf.o{k}",
              f"  call void @llvm.prefetch.p0(ptr %pf.p{k}, i32 0, i32 3, i32 1)"]
    L += ["  %pf.s0 = mul i64 %kb, 32",  # 8 columns' scales, bytes
          "  %pf.s1 = mul i64 %bsrow0, 4",
          "  %pf.s2 = add i64 %pf.s1, %pf.s0",
          "  %pf.s3 = mul i64 %p, 64",
          "  %pf.s = add i64 %pf.s2, %pf.s3",
          "  %pf.sp = getelementptr i8, ptr %sb, i64 %pf.s",
          "  call void @llvm.prefetch.p0(ptr %pf.sp, i32 0, i32 3, i32 1)"]
    if zp:
        L += ["  %sa0 = load float, ptr %sap, align 4",
              "  %sap1 = getelementptr float, ptr %sap, i64 4",
              "  %sa1 = load float, ptr %sap1, align 4"]
    else:  # 8 * the codes' sums, in q's lanes
        L += [f"  %as8 = shl {_VH} %as, " + "<" + ", ".join(["i16 3"] * 16) + ">",
              f"  %corr = call {_V8} @llvm.x86.avx2.pmadd.wd({_VH} %as8, {_VH} {_ONES})",
              f"  %sa8 = load {_VF}, ptr %sap, align 4"]
    for c in C8:
        L += [f"  %bo{c} = add i64 %brow{c}, %boff",
              f"  %bp{c} = getelementptr i8, ptr %B, i64 %bo{c}",
              f"  %w{c} = load {_V32B}, ptr %bp{c}, align 1",
              f"  %lo{c} = and {_V32B} %w{c}, " + "<" + ", ".join(["i8 15"] * 32) + ">",
              f"  %hi{c} = lshr {_V32B} %w{c}, " + "<" + ", ".join(["i8 4"] * 32) + ">",
              f"  %sbi{c} = add i64 %bsrow{c}, %b0",
              f"  %sbp{c} = getelementptr float, ptr %sb, i64 %sbi{c}",
              f"  %sb2_{c} = load <2 x float>, ptr %sbp{c}, align 4",
              f"  %dx{c} = call {_VH} @llvm.x86.avx2.pmadd.ub.sw({_V32B} %lo{c}, {_V32B} %a0)",
              f"  %dy{c} = call {_VH} @llvm.x86.avx2.pmadd.ub.sw({_V32B} %hi{c}, {_V32B} %a1)",
              f"  %hw{c} = add {_VH} %dx{c}, %dy{c}"]
        if zp:  # as @tile_1_*_zp: block b's lanes, then b+1's, one multiply-add each
            L += [f"  %zpp{c} = getelementptr i8, ptr %Z, i64 %sbi{c}",
                  f"  %zp2_{c} = load <2 x i8>, ptr %zpp{c}, align 1",
                  f"  %zpw{c} = zext <2 x i8> %zp2_{c} to <2 x i16>",
                  f"  %zp16_{c} = shufflevector <2 x i16> %zpw{c}, <2 x i16> poison, "
                  f"<16 x i32> {_mask([0] * 8 + [1] * 8)}",
                  f"  %zc{c} = mul {_VH} %zp16_{c}, %as",
                  f"  %h{c} = sub {_VH} %hw{c}, %zc{c}"]
            for k in (0, 1):
                L += [f"  %h{c}_{k} = shufflevector {_VH} %h{c}, {_VH} poison, <8 x i32> "
                      f"{_mask(range(8 * k, 8 * k + 8))}",
                      f"  %q{c}_{k} = sext <8 x i16> %h{c}_{k} to {_V8}",
                      f"  %f{c}_{k} = sitofp {_V8} %q{c}_{k} to {_VF}",
                      f"  %sbe{c}_{k} = extractelement <2 x float> %sb2_{c}, i64 {k}",
                      f"  %s{c}_{k} = fmul float %sa{k}, %sbe{c}_{k}",
                      f"  %sv{c}_{k}.0 = insertelement {_VF} poison, float %s{c}_{k}, i64 0",
                      f"  %sv{c}_{k} = shufflevector {_VF} %sv{c}_{k}.0, {_VF} poison, "
                      "<8 x i32> zeroinitializer"]
            L += [f"  %acc{c}.h = call {_VF} @llvm.fma.v8f32({_VF} %f{c}_0, {_VF} %sv{c}_0, "
                  f"{_VF} %acc{c})",
                  f"  %acc{c}.n = call {_VF} @llvm.fma.v8f32({_VF} %f{c}_1, {_VF} %sv{c}_1, "
                  f"{_VF} %acc{c}.h)"]
        else:
            L += [f"  %qw{c} = call {_V8} @llvm.x86.avx2.pmadd.wd({_VH} %hw{c}, {_VH} {_ONES})",
                  f"  %q{c} = sub {_V8} %qw{c}, %corr",
                  f"  %f{c} = sitofp {_V8} %q{c} to {_VF}",
                  f"  %sb2w{c} = shufflevector <2 x float> %sb2_{c}, <2 x float> poison, "
                  f"<8 x i32> {_mask([0, 1, 1, 1, 1, 1, 1, 1])}",
                  f"  %sb8_{c} = call {_VF} @llvm.x86.avx2.permps({_VF} %sb2w{c}, "
                  f"{_V8} {_HALVES})",
                  f"  %sv{c} = fmul {_VF} %sa8, %sb8_{c}",
                  f"  %acc{c}.n = call {_VF} @llvm.fma.v8f32({_VF} %f{c}, {_VF} %sv{c}, "
                  f"{_VF} %acc{c})"]
    L += [*latch("p", "1", "p.more", "%pairs", "p.loop", "p.end", pred="ult"),
          "p.end:",
          *(f"  %accp{c} = phi {_VF} [zeroinitializer, %entry], [%acc{c}.n, %p.loop]"
            for c in C8),
          "  %odd = and i64 %kb, 1",
          "  %isodd = icmp ne i64 %odd, 0",
          "  br i1 %isodd, label %t.block, label %fin",
          "t.block:",  # an odd last block alone, A's codes in element order
          "  %bt = sub i64 %kb, 1",
          "  %btoff = mul i64 %bt, 16",
          "  %atoff = mul i64 %bt, 32",
          "  %tsoff = mul i64 %bt, 4",
          "  %tap = getelementptr i8, ptr %qa, i64 %atoff",
          f"  %ta = load {_V32B}, ptr %tap, align 1",
          "  %tsap = getelementptr float, ptr %sa4, i64 %tsoff",
          "  %tsav = load float, ptr %tsap, align 4"]
    for c in C8:
        L += [f"  %tbo{c} = add i64 %brow{c}, %btoff",
              f"  %tbp{c} = getelementptr i8, ptr %B, i64 %tbo{c}",
              f"  %tw{c} = load {_VB}, ptr %tbp{c}, align 1",
              f"  %tlo{c} = and {_VB} %tw{c}, " + "<" + ", ".join(["i8 15"] * 16) + ">",
              f"  %thi{c} = lshr {_VB} %tw{c}, " + "<" + ", ".join(["i8 4"] * 16) + ">",
              f"  %tbv{c} = shufflevector {_VB} %tlo{c}, {_VB} %thi{c}, <32 x i32> {_ONE}",
              f"  %tsbi{c} = add i64 %bsrow{c}, %bt",
              f"  %tsbp{c} = getelementptr float, ptr %sb, i64 %tsbi{c}",
              f"  %tsbv{c} = load float, ptr %tsbp{c}, align 4"]
        if zp:
            L += [f"  %tzpp{c} = getelementptr i8, ptr %Z, i64 %tsbi{c}",
                  f"  %tzp{c} = load i8, ptr %tzpp{c}, align 1",
                  f"  %tzv0_{c} = insertelement {_V32B} poison, i8 %tzp{c}, i64 0",
                  f"  %tzv{c} = shufflevector {_V32B} %tzv0_{c}, {_V32B} poison, <32 x i32> "
                  "zeroinitializer",
                  f"  %tbv{c}.s = sub {_V32B} %tbv{c}, %tzv{c}",
                  f"  %tbv{c}.u = call {_V32B} @llvm.x86.avx2.psign.b({_V32B} %tbv{c}.s, "
                  f"{_V32B} %tbv{c}.s)"]
        else:
            L += [line.replace("%tbv", f"%tbv{c}") for line in _signed("tbv")]
        L += [f"  %tas{c} = call {_V32B} @llvm.x86.avx2.psign.b({_V32B} %ta, {_V32B} %tbv{c}.s)",
              f"  %td{c} = call {_VH} @llvm.x86.avx2.pmadd.ub.sw({_V32B} %tbv{c}.u, "
              f"{_V32B} %tas{c})",
              f"  %tq{c} = call {_V8} @llvm.x86.avx2.pmadd.wd({_VH} %td{c}, {_VH} {_ONES})"]
        if zp:  # the zero-point kernel's lanes are in order
            L += [f"  %tf{c} = sitofp {_V8} %tq{c} to {_VF}"]
        else:
            L += [f"  %tqs{c} = shufflevector {_V8} %tq{c}, {_V8} poison, <8 x i32> "
                  f"{_mask(_SWAP)}",
                  f"  %tf{c} = sitofp {_V8} %tqs{c} to {_VF}"]
        L += [f"  %ts{c} = fmul float %tsav, %tsbv{c}",
              f"  %tsv0_{c} = insertelement {_VF} poison, float %ts{c}, i64 0",
              f"  %tsv{c} = shufflevector {_VF} %tsv0_{c}, {_VF} poison, <8 x i32> "
              "zeroinitializer",
              f"  %acct{c} = call {_VF} @llvm.fma.v8f32({_VF} %tf{c}, {_VF} %tsv{c}, "
              f"{_VF} %accp{c})"]
    L += ["  br label %fin",
          "fin:",
          *(f"  %accf{c} = phi {_VF} [%accp{c}, %p.end], [%acct{c}, %t.block]" for c in C8)]
    T = _transpose8(L, [f"%accf{c}" for c in C8], "tr")  # T[j]: lane j of the eight columns
    x = [T[i] for i in range(8)] if zp else [T[_SWAP[i]] for i in range(8)]  # MLAS's lane i
    L += [f"  %l1 = fadd {_VF} {x[0]}, {x[1]}",
          f"  %l2 = fadd {_VF} %l1, {x[2]}",
          f"  %l3 = fadd {_VF} %l2, {x[3]}",
          f"  %u1 = fadd {_VF} {x[4]}, {x[5]}",
          f"  %u2 = fadd {_VF} %u1, {x[6]}",
          f"  %u3 = fadd {_VF} %u2, {x[7]}",
          f"  %y = fadd {_VF} %l3, %u3",
          "  %biasp = getelementptr float, ptr %bias, i64 %n",
          f"  %biasv = load {_VF}, ptr %biasp, align 4",
          f"  %out = fadd {_VF} %y, %biasv",
          "  %cp = getelementptr float, ptr %C, i64 %n",
          f"  store {_VF} %out, ptr %cp, align 4",
          "  ret void",
          "}"]
    return L


def _row(zp: bool) -> list[str]:
    """row / rowzp(A, buf, Z, B, sb, bias, C, n0, n1, N, kb, nfold): one row's product in one
    call (a decode step's): A (kb * 32 floats) quantized into ``buf`` (kb * 52 bytes: codes,
    four-fold scales, block sums), then columns [n0, n1) of C, eight at a time where all eight
    are in MLAS's groups of four (@row8_*), the rest by @gemm1 / @gemm1zp. n0 a multiple of 4."""
    sfx = "zp" if zp else "sym"
    return [f"define void @row{'zp' if zp else ''}(ptr noalias %A, ptr noalias %buf, ptr %Z, "
            "ptr noalias %B, ptr noalias %sb, ptr noalias %bias, ptr %C, i64 %n0, i64 %n1, "
            "i64 %N, i64 %kb, i64 %nfold) nounwind {",
            "entry:",
            "  %K = mul i64 %kb, 32",
            "  %kb16 = mul i64 %kb, 16",
            "  %sa4 = getelementptr i8, ptr %buf, i64 %K",
            "  %asum = getelementptr i8, ptr %sa4, i64 %kb16",
            "  call void @quantize(ptr %A, ptr %buf, ptr %sa4, ptr %asum, i64 1, i64 %kb)",
            "  %lt = icmp slt i64 %n1, %nfold",
            "  %lim = select i1 %lt, i64 %n1, i64 %nfold",
            "  br label %c.head",
            "c.head:",
            "  %n = phi i64 [%n0, %entry], [%n.next, %c.body]",
            "  %n8 = add i64 %n, 8",
            "  %ok = icmp sle i64 %n8, %lim",
            "  br i1 %ok, label %c.body, label %c.rest",
            "c.body:",
            f"  call void @row8_{sfx}(ptr %buf, ptr %sa4, ptr %Z, ptr %B, ptr %sb, ptr %bias, "
            "ptr %C, i64 %n, i64 %kb)",
            "  %n.next = add i64 %n, 8",
            "  br label %c.head",
            "c.rest:",
            f"  call void @gemm1{'zp' if zp else ''}(ptr %buf, ptr %sa4, ptr %Z, ptr %B, "
            "ptr %sb, ptr %bias, ptr %C, i64 1, i64 %n, i64 %n1, i64 %N, i64 %kb, i64 %nfold)",
            "  ret void",
            "}"]


def _row_on_stack_scratch(call: str) -> list[str]:
    """The end of row_job and rowc: the row's scratch (K + 20 kb bytes) on the stack, then
    @rowzp or @row (zero points or not) with the arguments ``call``."""
    return ["  %K = mul i64 %kb, 32",
            "  %kb20 = mul i64 %kb, 20",
            "  %size = add i64 %K, %kb20",
            "  %buf = alloca i8, i64 %size, align 32",
            "  %haszp = icmp ne i64 %zp, 0",
            "  br i1 %haszp, label %withzp, label %sym",
            "withzp:", f"  call void @rowzp{call}", "  ret void",
            "sym:", f"  call void @row{call}", "  ret void", "}"]


def _row_job() -> list[str]:
    """row_job(args): @row or @rowzp on an argument block (spin.fork's job: one part of a
    row's columns per thread), i64 words A, C, Z, B, sb, bias, n0, n1, N, kb, nfold, with
    zero points (0 / 1); the scratch on the stack, as rowc's."""
    names = ["A", "C", "Z", "B", "sb", "bias", "n0", "n1", "N", "kb", "nfold", "zp"]
    L = ["define void @row_job(ptr %args) nounwind {", "entry:"]
    for i, v in enumerate(names):
        ty = "ptr" if i < 6 else "i64"
        L += [f"  %{v}.p = getelementptr i64, ptr %args, i64 {i}",
              f"  %{v} = load {ty}, ptr %{v}.p, align 8"]
    call = ("(ptr %A, ptr %buf, ptr %Z, ptr %B, ptr %sb, ptr %bias, ptr %C, i64 %n0, i64 %n1, "
            "i64 %N, i64 %kb, i64 %nfold)")
    return L + _row_on_stack_scratch(call)


def _rowc() -> list[str]:
    """rowc(A, C, consts): the whole row in a call of three arguments (a ctypes call costs
    ~0.25 us an argument: more than a small product's arithmetic), the weight's operands in
    ``consts`` (i64 words Z, B, sb, bias, N, kb, nfold, with zero points), the scratch on
    the stack (K + 20 kb bytes; the caller keeps K within MAX_STACK_K)."""
    names = ["Z", "B", "sb", "bias", "N", "kb", "nfold", "zp"]
    L = ["define void @rowc(ptr noalias %A, ptr %C, ptr noalias %consts) nounwind {", "entry:"]
    for i, v in enumerate(names):
        ty = "ptr" if i < 4 else "i64"
        L += [f"  %{v}.p = getelementptr i64, ptr %consts, i64 {i}",
              f"  %{v} = load {ty}, ptr %{v}.p, align 8"]
    call = ("(ptr %A, ptr %buf, ptr %Z, ptr %B, ptr %sb, ptr %bias, ptr %C, i64 0, i64 %N, "
            "i64 %N, i64 %kb, i64 %nfold)")
    return L + _row_on_stack_scratch(call)


def module_ir(target=None) -> str:
    tiles = [line for rows in sorted({ROWS, 1}) for fold in (True, False)
             for line in _tile(rows, fold)]
    tiles += [line for fold in (True, False) for line in _tile(1, fold, sym=True)]
    tiles += [line for fold in (True, False) for line in _tile_zp1(fold)]
    rows = [line for zp in (False, True) for line in _row8(zp) + _row(zp)] + _row_job() + _rowc()
    return "\n".join([*tiles, *_gemm(), *_gemm("sym"), *_gemm("zp"), *zshare_ir(),
                      *nbits_gemv.quantize_ir(pairs=True),
                      *rows,
                      f"declare {_V32B} @llvm.x86.avx2.psign.b({_V32B}, {_V32B})",
                      f"declare {_VF} @llvm.fma.v8f32({_VF}, {_VF}, {_VF})",
                      "declare float @llvm.fma.f32(float, float, float)",
                      "declare void @llvm.prefetch.p0(ptr, i32, i32, i32)",
                      f"declare {_VF} @llvm.x86.avx2.permps({_VF}, {_V8})",
                      f"declare {_VH} @llvm.x86.avx2.pmadd.ub.sw({_V32B}, {_V32B})",
                      f"declare {_V8} @llvm.x86.avx2.pmadd.wd({_VH}, {_VH})"])


_P = ctypes.c_void_p
_I = ctypes.c_int64
_GEMM = ctypes.CFUNCTYPE(None, _P, _P, _P, _P, _P, _P, _P, _I, _I, _I, _I, _I, _I)
_ZSHARE = ctypes.CFUNCTYPE(None, _P, _P, _P, _I, _I, _I, _I, _I)
_QUANT = ctypes.CFUNCTYPE(None, _P, _P, _P, _P, _I, _I)
_ROW = ctypes.CFUNCTYPE(None, _P, _P, _P, _P, _P, _P, _P, _I, _I, _I, _I, _I)
_JOB = ctypes.CFUNCTYPE(None, _P)
_ROWC = ctypes.CFUNCTYPE(None, _P, _P, _P)


def _module() -> jit.Module:
    return jit.compile_module("nbits_gemm", module_ir,
                              {"gemm": _GEMM, "gemm1": _GEMM, "gemm1zp": _GEMM, "zshare": _ZSHARE,
                               "quantize": _QUANT, "row": _ROW, "rowzp": _ROW,
                               "row_job": _JOB, "rowc": _ROWC}, REQUIRES)


def unavailable() -> str | None:
    return jit.why_unavailable(REQUIRES) or jit.why_not_loaded("nbits_gemm", _module)


def supported(bits: int, block_size: int) -> bool:
    return bits == 4 and block_size == BLOCK


def quantize(A: np.ndarray, fn=None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """quantize_rows by the compiled kernel (one pass over A); ``fn``: the module's quantize,
    where the caller holds it (Gemm.quantize)."""
    M, K = A.shape
    kb = -(-K // BLOCK)
    if K % BLOCK or not A.flags.c_contiguous or A.dtype != np.float32:
        padded = np.zeros((M, kb * BLOCK), np.float32)
        padded[:, :K] = A
        A = padded
    qa = np.empty((M, kb * BLOCK), np.int8)
    sa4 = np.empty((M, kb * 4), np.float32)
    asum = np.empty((M, kb), np.float32)
    address = jit.address  # ~6x cheaper than .ctypes.data
    (fn or _module().quantize)(address(A), address(qa), address(sa4), address(asum), M, kb)
    return qa, sa4, asum


def quantize_rows(A: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A (M, K) float32 as MLAS's QuantizeARow_CompInt8 does it: per block of 32 (K padded with
    zeros) the scale amax / 127, codes rint(a * (127 / amax)) (0 for an all-zero block), and
    scale * (the sum of the codes). The codes in the kernel's layout: each pair of blocks as
    [b's even-indexed | b+1's even | b's odd | b+1's odd], an odd last block in order; the
    scales each four times over, (M, kb * 4)."""
    M, K = A.shape
    kb = -(-K // BLOCK)
    if K % BLOCK:
        padded = np.zeros((M, kb * BLOCK), np.float32)
        padded[:, :K] = A
        A = padded
    blocks = A.reshape(M, kb, BLOCK)
    amax = np.abs(blocks).max(axis=-1)
    with np.errstate(divide="ignore"):
        inv = np.where(amax != 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    x = blocks * inv[..., None]
    np.rint(x, out=x)
    scale = amax / np.float32(127)
    sums = x.sum(axis=-1, dtype=np.float32)  # whole numbers below 2**24: exact
    q = np.empty((M, kb * BLOCK), np.int8)
    pairs = kb // 2
    # (m, pair, block in pair, j, parity) -> (m, pair, parity, block in pair, j)
    q[:, :pairs * 64].reshape(M, pairs, 2, 2, 16)[...] = x[:, :2 * pairs].reshape(
        M, pairs, 2, 16, 2).transpose(0, 1, 4, 2, 3)
    if kb % 2:
        q[:, pairs * 64:] = x[:, -1]
    return q, np.repeat(scale, 4, axis=1), scale * sums


class RowParts:
    """One row's product in column ranges at once on compiled/spin.py's pool: a compiled job
    reads a 128-byte argument block of i64 words A, C, ``before``, n0, n1, ``after`` (one
    block per range, made once; each part quantizes the row itself, ~1 us, rather than wait
    for one copy)."""

    def __init__(self, job: int, before: list[int], after: list[int],
                 ranges: list[tuple[int, int]]) -> None:
        self.job = job
        self.template = np.zeros((len(ranges), 16), np.int64)
        for i, (n0, n1) in enumerate(ranges):
            self.template[i, 2:2 + len(before) + 2 + len(after)] = [*before, n0, n1, *after]
        self.offsets = np.arange(len(ranges)) * 128
        self.argv = self.offsets + self.template.ctypes.data
        self.at = self.argv.ctypes.data
        self.lock = threading.Lock()

    def fork(self, pool, a: np.ndarray, out: np.ndarray) -> None:
        address = jit.address
        if self.lock.acquire(False):  # the blocks themselves (~2 us less); a concurrent run copies
            try:
                self.template[:, 0] = address(a)
                self.template[:, 1] = address(out)
                pool.fork(self.job, self.argv, self.at)
            finally:
                self.lock.release()
            return
        args = self.template.copy()
        args[:, 0] = address(a)
        args[:, 1] = address(out)
        pool.fork(self.job, self.offsets + address(args))


class Gemm:
    """The kernel bound to one constant weight: packed (N, kb, 16) bytes, scales (N, kb)
    float32, zp * scale transposed, (kb, N) float32 (nbits_gemv's array, shared), and a bias
    (N,) float32 (zeros for none)."""

    def __init__(self, packed: np.ndarray, scales: np.ndarray, zshare: np.ndarray,
                 bias: np.ndarray, zero_points: np.ndarray | None = None) -> None:
        """``zero_points``: (N, kb) uint8, or None for the implicit 8; one row takes MLAS's
        M == 1 kernel's arithmetic for either, as onnxruntime does."""
        self.keep = (packed, scales, zshare, bias, zero_points)  # the kernel reads them
        self.N, self.kb = scales.shape
        module = _module()
        self.fn, self.zfn = module.gemm, module.zshare
        self.fn1 = module.gemm1 if zero_points is None else module.gemm1zp
        self._quantize = module.quantize
        self.zq = 0 if zero_points is None else zero_points.ctypes.data
        self.ptrs = (packed.ctypes.data, scales.ctypes.data, zshare.ctypes.data,
                     bias.ctypes.data)
        self.nfold = self.N - self.N % GROUP
        self.K = self.kb * BLOCK
        self._row = module.row if zero_points is None else module.rowzp
        self._row_ptrs = (self.zq, self.ptrs[0], self.ptrs[1], self.ptrs[3])
        self._buf = self.K + self.kb * 20  # row's scratch: codes, four-fold scales, block sums
        self._job = ctypes.cast(module.row_job, ctypes.c_void_p).value
        self._rowc = module.rowc if self.K <= MAX_STACK_K else None
        words = [*self._row_ptrs, self.N, self.kb, self.nfold, int(zero_points is not None)]
        self._consts = np.array(words, np.int64)
        self._pconsts = self._consts.ctypes.data
        self._parts: dict[int, RowParts] = {}
        self._job_words = words

    def ranges(self, parts: int) -> list[tuple[int, int]]:
        """[0, N) in at most ``parts`` ranges whose inner ends are multiples of 4."""
        tiles = -(-self.N // GROUP)
        parts = max(1, min(parts, tiles))
        q, r = divmod(tiles, parts)
        out, start = [], 0
        for i in range(parts):
            stop = start + q + (1 if i < r else 0)
            out.append((start * GROUP, min(stop * GROUP, self.N)))
            start = stop
        return out

    def row(self, a: np.ndarray, out: np.ndarray, n0: int = 0, n1: int | None = None) -> None:
        """out[..., n0:n1] = one row's product (MLAS's M == 1 arithmetic), quantization
        included, in one compiled call: a decode step calls this for every projection, so the
        Python around it is most of a small product's cost. ``a``: K float32, ``out``: N
        float32, C-contiguous; n0 a multiple of 4."""
        if n1 is None and self._rowc is not None and a.size == self.K and \
                a.dtype == np.float32 and a.flags.c_contiguous:
            address = jit.address
            self._rowc(address(a), address(out), self._pconsts)
            return
        a = self._padded(a)
        address = jit.address
        Z, B, S, bias = self._row_ptrs
        buf = np.empty(self._buf, np.uint8)  # held here: the kernel writes it
        self._row(address(a), address(buf), Z, B, S, bias, address(out), n0,
                  self.N if n1 is None else n1, self.N, self.kb, self.nfold)

    def one_row(self) -> tuple | None:
        """row()'s single compiled call for a whole row, for a caller that checks the row
        itself (a contiguous float32 of self.K, whole blocks) and calls ``fn(address(a),
        address(out), consts)``:
        (fn, consts, address); None where row() takes its general path (K beyond
        MAX_STACK_K)."""
        return None if self._rowc is None else (self._rowc, self._pconsts, jit.address)

    def quantize(self, A: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """quantize(A) on the module this weight was prepared with (bound once)."""
        return quantize(A, self._quantize)

    def _padded(self, a: np.ndarray) -> np.ndarray:
        if a.size != self.K or a.dtype != np.float32 or not a.flags.c_contiguous:
            padded = np.zeros(self.K, np.float32)  # the last block padded with zeros
            padded[:a.size] = a.reshape(-1)
            a = padded
        return a

    def row_parts(self, a: np.ndarray, out: np.ndarray, parts: int, pool) -> None:
        """row(a, out) with the columns in ``parts`` ranges run at once on ``pool``
        (compiled/spin.py: workers that are already spinning take theirs within a microsecond;
        each part quantizes the row itself, ~1 us, rather than wait for one copy). Rows
        longer than MAX_STACK_K take row()."""
        if self.K > MAX_STACK_K:
            self.row(a, out)
            return
        split = self._parts.get(parts)
        if split is None:
            split = self._parts[parts] = RowParts(self._job, self._job_words[:4],
                                                  self._job_words[4:], self.ranges(parts))
        split.fork(pool, self._padded(a), out)

    def __call__(self, qa: np.ndarray, sa4: np.ndarray, asum: np.ndarray, out: np.ndarray,
                 n0: int, n1: int, bias: np.ndarray | None = None) -> None:
        """out[:, n0:n1] = the rows' products, all terms included; qa (M, kb * 32) int8, sa4
        (M, kb * 4) and asum (M, kb) float32 from quantize_rows, out (M, N) float32, all
        C-contiguous; n0 a multiple of 4. ``out`` first holds the zero points' share.
        ``bias``: (N,) float32 C-contiguous in place of the bound one (a computed bias)."""
        B, S, Z, bound = self.ptrs
        M = qa.shape[0]
        address = jit.address
        bias = bound if bias is None else address(bias)
        po, pq, ps = address(out), address(qa), address(sa4)
        if M == 1:
            self.fn1(pq, ps, self.zq, B, S, bias, po, 1, n0, n1, self.N, self.kb,
                     self.N - self.N % GROUP)
            return
        self.zfn(address(asum), Z, po, M, n0, n1, self.N, self.kb)
        self.fn(pq, ps, po, B, S, bias, po, M, n0, n1, self.N, self.kb, self.N - self.N % GROUP)


BUNDLE = {"nbits_gemm": (module_ir, REQUIRES)}

__all__ = ["BLOCK", "BUNDLE", "REQUIRES", "Gemm", "module_ir", "quantize", "quantize_rows",
           "supported", "unavailable"]
