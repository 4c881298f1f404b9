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

The weight stays as the model stores it (byte j of a block: element 2j in the low nibble,
2j + 1 in the high one); each 16 bytes are put in element order once per column tile and
serve all the tile's rows.
"""

from __future__ import annotations

import ctypes

import numpy as np

from . import jit

REQUIRES = ("avx2", "fma")
BLOCK = 32
# rows and columns of C per tile
ROWS, COLS = 2, 4
# columns in MLAS's groups of four (FoldAccumulators); the last N % 4 are summed another way
GROUP = 4

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


def _tile(rows: int, cols: int, fold: bool) -> list[str]:
    """@tile_{rows}x{cols}_{fold|hsum}: C[m:m+rows, n:n+cols] over all kb blocks.

    A pair of blocks: 32 weight bytes, their low nibbles [b's even elements | b+1's] and high
    ones [b's odd | b+1's] meet A's codes laid out the same way (quantize_rows); the two
    u8 x s8 products summed to 16 bits (at most 4 * 15 * 127), then pairs of those to 32: lanes
    [b 0-7, b 8-15, b 16-23, b 24-31 | b+1 0-7, ... b+1 24-31], MLAS's lanes in the order
    _SWAP, their scales [s_b x 4 | s_b+1 x 4]. The zero points' share runs along as a vector
    over the tile's columns (each lane the same scalar fused multiply-adds MLAS does)."""
    R, C = range(rows), range(cols)
    RC = [(r, c) for r in R for c in C]
    VZ = f"<{cols} x float>"
    name = f"tile_{rows}x{cols}_{'fold' if fold else 'hsum'}"
    L = [f"define internal void @{name}(ptr noalias %qa, ptr noalias %sa, ptr noalias %as, "
         "ptr noalias %B, ptr noalias %sb, ptr noalias %bs, ptr noalias %bias, "
         "ptr noalias %C, i64 %m, i64 %n, i64 %N, i64 %kb) nounwind alwaysinline {",
         "entry:",
         "  %K = mul i64 %kb, 32",
         "  %rowbytes = mul i64 %kb, 16",
         "  %pairs = lshr i64 %kb, 1",
         *(f"  %mr{r} = add i64 %m, {r}" for r in R),
         *(f"  %arow{r} = mul i64 %mr{r}, %K" for r in R),
         *(f"  %srow{r} = mul i64 %mr{r}, %kb" for r in R),
         *(f"  %nc{c} = add i64 %n, {c}" for c in C),
         *(f"  %brow{c} = mul i64 %nc{c}, %rowbytes" for c in C),
         *(f"  %bsrow{c} = mul i64 %nc{c}, %kb" for c in C),
         "  %anyp = icmp ugt i64 %pairs, 0",
         "  br i1 %anyp, label %p.loop, label %p.end",
         "p.loop:",
         "  %p = phi i64 [0, %entry], [%p.next, %p.loop]",
         *(f"  %acc{r}_{c} = phi {_VF} [zeroinitializer, %entry], [%acc{r}_{c}.n, %p.loop]"
           for r, c in RC),
         *(f"  %z{r} = phi {VZ} [zeroinitializer, %entry], [%z{r}.n, %p.loop]" for r in R),
         "  %b0 = shl i64 %p, 1",
         "  %b1 = add i64 %b0, 1",
         "  %boff = mul i64 %b0, 16",
         "  %aoff = mul i64 %b0, 32",
         "  %bs0 = mul i64 %b0, %N",
         "  %bsi0 = add i64 %bs0, %n",
         "  %bsi1 = add i64 %bsi0, %N",
         *(line for k in (0, 1) for line in (
             f"  %bsp{k} = getelementptr float, ptr %bs, i64 %bsi{k}",
             f"  %bsv{k} = load {VZ}, ptr %bsp{k}, align 4"))]
    for c in C:
        L += [f"  %bo{c} = add i64 %brow{c}, %boff",
              f"  %bp{c} = getelementptr i8, ptr %B, i64 %bo{c}",
              f"  %w{c} = load {_V32B}, ptr %bp{c}, align 1",
              f"  %lo{c} = and {_V32B} %w{c}, " + "<" + ", ".join(["i8 15"] * 32) + ">",
              f"  %hi{c} = lshr {_V32B} %w{c}, " + "<" + ", ".join(["i8 4"] * 32) + ">",
              f"  %sbi{c} = add i64 %bsrow{c}, %b0",
              f"  %sbp{c} = getelementptr float, ptr %sb, i64 %sbi{c}",
              f"  %sb2_{c} = load <2 x float>, ptr %sbp{c}, align 4",
              f"  %sb8_{c} = shufflevector <2 x float> %sb2_{c}, <2 x float> poison, "
              f"<8 x i32> {_mask([0, 0, 0, 0, 1, 1, 1, 1])}"]
    for r in R:
        L += [f"  %ao{r} = add i64 %arow{r}, %aoff",
              f"  %ap0_{r} = getelementptr i8, ptr %qa, i64 %ao{r}",
              f"  %a0_{r} = load {_V32B}, ptr %ap0_{r}, align 1",
              f"  %ap1_{r} = getelementptr i8, ptr %ap0_{r}, i64 32",
              f"  %a1_{r} = load {_V32B}, ptr %ap1_{r}, align 1",
              f"  %sai{r} = add i64 %srow{r}, %b0",
              f"  %sap{r} = getelementptr float, ptr %sa, i64 %sai{r}",
              f"  %sa2_{r} = load <2 x float>, ptr %sap{r}, align 4",
              f"  %sa8_{r} = shufflevector <2 x float> %sa2_{r}, <2 x float> poison, "
              f"<8 x i32> {_mask([0, 0, 0, 0, 1, 1, 1, 1])}",
              f"  %asp{r} = getelementptr float, ptr %as, i64 %sai{r}",
              f"  %as2_{r} = load <2 x float>, ptr %asp{r}, align 4",
              *(line for k in (0, 1) for line in (
                  f"  %ase{k}_{r} = extractelement <2 x float> %as2_{r}, i64 {k}",
                  f"  %asi{k}_{r} = insertelement {VZ} poison, float %ase{k}_{r}, i64 0",
                  f"  %asv{k}_{r} = shufflevector {VZ} %asi{k}_{r}, {VZ} poison, "
                  f"<{cols} x i32> zeroinitializer")),
              f"  %z{r}.h = call {VZ} @llvm.fma.v{cols}f32({VZ} %asv0_{r}, {VZ} %bsv0, "
              f"{VZ} %z{r})",
              f"  %z{r}.n = call {VZ} @llvm.fma.v{cols}f32({VZ} %asv1_{r}, {VZ} %bsv1, "
              f"{VZ} %z{r}.h)"]
    for r, c in RC:
        t = f"{r}_{c}"
        L += [f"  %dx_{t} = call {_VH} @llvm.x86.avx2.pmadd.ub.sw({_V32B} %lo{c}, "
              f"{_V32B} %a0_{r})",
              f"  %dy_{t} = call {_VH} @llvm.x86.avx2.pmadd.ub.sw({_V32B} %hi{c}, "
              f"{_V32B} %a1_{r})",
              f"  %h_{t} = add {_VH} %dx_{t}, %dy_{t}",
              f"  %q_{t} = call {_V8} @llvm.x86.avx2.pmadd.wd({_VH} %h_{t}, {_VH} {_ONES})",
              f"  %f_{t} = sitofp {_V8} %q_{t} to {_VF}",
              f"  %sv_{t} = fmul {_VF} %sa8_{r}, %sb8_{c}",
              f"  %acc{t}.n = call {_VF} @llvm.fma.v8f32({_VF} %f_{t}, {_VF} %sv_{t}, "
              f"{_VF} %acc{t})"]
    L += ["  %p.next = add i64 %p, 1",
          "  %p.more = icmp ult i64 %p.next, %pairs",
          "  br i1 %p.more, label %p.loop, label %p.end",
          "p.end:",
          *(f"  %accp{r}_{c} = phi {_VF} [zeroinitializer, %entry], [%acc{r}_{c}.n, %p.loop]"
            for r, c in RC),
          *(f"  %zp{r} = phi {VZ} [zeroinitializer, %entry], [%z{r}.n, %p.loop]" for r in R),
          "  %odd = and i64 %kb, 1",
          "  %isodd = icmp ne i64 %odd, 0",
          "  br i1 %isodd, label %t.block, label %fin",
          "t.block:",  # an odd last block alone, A's codes in element order
          "  %bt = sub i64 %kb, 1",
          "  %btoff = mul i64 %bt, 16",
          "  %atoff = mul i64 %bt, 32",
          "  %tbs0 = mul i64 %bt, %N",
          "  %tbsi = add i64 %tbs0, %n",
          "  %tbsp = getelementptr float, ptr %bs, i64 %tbsi",
          f"  %tbsv = load {VZ}, ptr %tbsp, align 4"]
    for c in C:
        L += [f"  %tbo{c} = add i64 %brow{c}, %btoff",
              f"  %tbp{c} = getelementptr i8, ptr %B, i64 %tbo{c}",
              f"  %tw{c} = load {_VB}, ptr %tbp{c}, align 1",
              f"  %tlo{c} = and {_VB} %tw{c}, " + "<" + ", ".join(["i8 15"] * 16) + ">",
              f"  %thi{c} = lshr {_VB} %tw{c}, " + "<" + ", ".join(["i8 4"] * 16) + ">",
              f"  %tbv{c} = shufflevector {_VB} %tlo{c}, {_VB} %thi{c}, <32 x i32> {_ONE}",
              f"  %tsbi{c} = add i64 %bsrow{c}, %bt",
              f"  %tsbp{c} = getelementptr float, ptr %sb, i64 %tsbi{c}",
              f"  %tsbv{c} = load float, ptr %tsbp{c}, align 4"]
    for r in R:
        L += [f"  %tao{r} = add i64 %arow{r}, %atoff",
              f"  %tap{r} = getelementptr i8, ptr %qa, i64 %tao{r}",
              f"  %ta{r} = load {_V32B}, ptr %tap{r}, align 1",
              f"  %tsai{r} = add i64 %srow{r}, %bt",
              f"  %tsap{r} = getelementptr float, ptr %sa, i64 %tsai{r}",
              f"  %tsav{r} = load float, ptr %tsap{r}, align 4",
              f"  %tasp{r} = getelementptr float, ptr %as, i64 %tsai{r}",
              f"  %tasv{r} = load float, ptr %tasp{r}, align 4",
              f"  %tasi{r} = insertelement {VZ} poison, float %tasv{r}, i64 0",
              f"  %tasb{r} = shufflevector {VZ} %tasi{r}, {VZ} poison, "
              f"<{cols} x i32> zeroinitializer",
              f"  %zt{r} = call {VZ} @llvm.fma.v{cols}f32({VZ} %tasb{r}, {VZ} %tbsv, "
              f"{VZ} %zp{r})"]
    for r, c in RC:
        t = f"{r}_{c}"
        L += [f"  %td_{t} = call {_VH} @llvm.x86.avx2.pmadd.ub.sw({_V32B} %tbv{c}, "
              f"{_V32B} %ta{r})",
              f"  %tq_{t} = call {_V8} @llvm.x86.avx2.pmadd.wd({_VH} %td_{t}, {_VH} {_ONES})",
              f"  %tqs_{t} = shufflevector {_V8} %tq_{t}, {_V8} poison, <8 x i32> "
              f"{_mask(_SWAP)}",
              f"  %tf_{t} = sitofp {_V8} %tqs_{t} to {_VF}",
              f"  %ts_{t} = fmul float %tsav{r}, %tsbv{c}",
              f"  %tsv0_{t} = insertelement {_VF} poison, float %ts_{t}, i64 0",
              f"  %tsv_{t} = shufflevector {_VF} %tsv0_{t}, {_VF} poison, <8 x i32> "
              "zeroinitializer",
              f"  %acct{t} = call {_VF} @llvm.fma.v8f32({_VF} %tf_{t}, {_VF} %tsv_{t}, "
              f"{_VF} %accp{t})"]
    L += ["  br label %fin",
          "fin:",
          *(f"  %accf{r}_{c} = phi {_VF} [%accp{r}_{c}, %p.end], [%acct{r}_{c}, %t.block]"
            for r, c in RC),
          *(f"  %zf{r} = phi {VZ} [%zp{r}, %p.end], [%zt{r}, %t.block]" for r in R)]
    for c in C:
        L += [f"  %biasp{c} = getelementptr float, ptr %bias, i64 %nc{c}",
              f"  %biasv{c} = load float, ptr %biasp{c}, align 4"]
    for r, c in RC:
        t = f"{r}_{c}"
        # x{i}: MLAS's lane i
        L += [f"  %x{i}_{t} = extractelement {_VF} %accf{t}, i64 {_SWAP[i]}" for i in range(8)]
        if fold:
            L += [f"  %l1_{t} = fadd float %x0_{t}, %x1_{t}",
                  f"  %l2_{t} = fadd float %l1_{t}, %x2_{t}",
                  f"  %l3_{t} = fadd float %l2_{t}, %x3_{t}",
                  f"  %u1_{t} = fadd float %x4_{t}, %x5_{t}",
                  f"  %u2_{t} = fadd float %u1_{t}, %x6_{t}",
                  f"  %u3_{t} = fadd float %u2_{t}, %x7_{t}",
                  f"  %y_{t} = fadd float %l3_{t}, %u3_{t}"]
        else:
            L += [f"  %e04_{t} = fadd float %x0_{t}, %x4_{t}",
                  f"  %e15_{t} = fadd float %x1_{t}, %x5_{t}",
                  f"  %e26_{t} = fadd float %x2_{t}, %x6_{t}",
                  f"  %e37_{t} = fadd float %x3_{t}, %x7_{t}",
                  f"  %e0_{t} = fadd float %e04_{t}, %e26_{t}",
                  f"  %e1_{t} = fadd float %e15_{t}, %e37_{t}",
                  f"  %y_{t} = fadd float %e0_{t}, %e1_{t}"]
        L += [f"  %zc_{t} = extractelement {VZ} %zf{r}, i64 {c}",
              f"  %yb_{t} = fadd float %y_{t}, %biasv{c}",
              f"  %out_{t} = fadd float %yb_{t}, %zc_{t}",
              f"  %ci0_{t} = mul i64 %mr{r}, %N",
              f"  %ci_{t} = add i64 %ci0_{t}, %nc{c}",
              f"  %cp_{t} = getelementptr float, ptr %C, i64 %ci_{t}",
              f"  store float %out_{t}, ptr %cp_{t}, align 4"]
    L += ["  ret void", "}"]
    return L


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


def _gemm() -> list[str]:
    """gemm(qa, sa, as, B, sb, bs, bias, C, M, n0, n1, N, kb, nfold): columns [n0, n1) of C
    for M rows of A; columns below nfold (N - N % 4) in tiles of COLS (n0 a multiple of 4),
    the rest one at a time; rows ROWS at a time, then one."""
    args = "ptr %qa, ptr %sa, ptr %as, ptr %B, ptr %sb, ptr %bs, ptr %bias, ptr %C"

    def call(rows, cols, fold, m, n, label):
        return [f"  call void @tile_{rows}x{cols}_{'fold' if fold else 'hsum'}({args}, "
                f"i64 {m}, i64 {n}, i64 %N, i64 %kb)", f"  br label %{label}.latch"]

    L = ["define void @gemm(ptr noalias %qa, ptr noalias %sa, ptr noalias %as, "
         "ptr noalias %B, ptr noalias %sb, ptr noalias %bs, ptr noalias %bias, "
         "ptr noalias %C, i64 %M, i64 %n0, i64 %n1, i64 %N, i64 %kb, i64 %nfold) nounwind {",
         "entry:",
         f"  %Modd = srem i64 %M, {ROWS}",
         "  %Mpair = sub i64 %M, %Modd",
         "  %lt = icmp slt i64 %n1, %nfold",
         "  %nend = select i1 %lt, i64 %n1, i64 %nfold",
         "  %gt = icmp sgt i64 %n0, %nfold",
         "  %tstart = select i1 %gt, i64 %n0, i64 %nfold",
         "  br label %f.pre",
         "f.pre:"]
    rows_fold = _loop("fm", "fm", "0", "%Mpair", ROWS, call(ROWS, COLS, True, "%fm", "%fn", "fm"),
                      "fr.pre")
    rest_fold = _loop("fr", "fr", "%Mpair", "%M", 1, call(1, COLS, True, "%fr", "%fn", "fr"),
                      "f.latch")
    body = ["  br label %fm.pre", "fm.pre:", *rows_fold, "fr.pre:", *rest_fold]
    L += _loop("f", "fn", "%n0", "%nend", COLS, body, "h.pre")
    rows_h = _loop("hm", "hm", "0", "%Mpair", ROWS, call(ROWS, 1, False, "%hm", "%hn", "hm"),
                   "hr.pre")
    rest_h = _loop("hr", "hr", "%Mpair", "%M", 1, call(1, 1, False, "%hr", "%hn", "hr"), "h.latch")
    body = ["  br label %hm.pre", "hm.pre:", *rows_h, "hr.pre:", *rest_h]
    L += ["h.pre:", *_loop("h", "hn", "%tstart", "%n1", 1, body, "end"),
          "end:", "  ret void", "}"]
    return L


def module_ir(target=None) -> str:
    shapes = ((ROWS, COLS, True), (1, COLS, True), (ROWS, 1, False), (1, 1, False))
    tiles = [line for rows, cols, fold in shapes for line in _tile(rows, cols, fold)]
    fmas = [f"declare <{c} x float> @llvm.fma.v{c}f32(<{c} x float>, <{c} x float>, "
            f"<{c} x float>)" for c in sorted({COLS, 1})]
    return "\n".join([*tiles, *_gemm(), *fmas,
                      f"declare {_VF} @llvm.fma.v8f32({_VF}, {_VF}, {_VF})",
                      f"declare {_VH} @llvm.x86.avx2.pmadd.ub.sw({_V32B}, {_V32B})",
                      f"declare {_V8} @llvm.x86.avx2.pmadd.wd({_VH}, {_VH})"])


_P = ctypes.c_void_p
_I = ctypes.c_int64
_PROTO = ctypes.CFUNCTYPE(None, _P, _P, _P, _P, _P, _P, _P, _P, _I, _I, _I, _I, _I, _I)


def _module() -> jit.Module:
    return jit.compile_module("nbits_gemm", module_ir, {"gemm": _PROTO}, REQUIRES)


def unavailable() -> str | None:
    return jit.why_unavailable(REQUIRES) or jit.why_not_loaded("nbits_gemm", _module)


def supported(bits: int, block_size: int) -> bool:
    return bits == 4 and block_size == BLOCK


def quantize_rows(A: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A (M, K) float32 as MLAS's QuantizeARow_CompInt8 does it: per block of 32 (K padded with
    zeros) the scale amax / 127, codes rint(a * (127 / amax)) (0 for an all-zero block), and
    scale * (the sum of the codes). The codes in the kernel's layout: each pair of blocks as
    [b's even-indexed | b+1's even | b's odd | b+1's odd], an odd last block in order."""
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
    return q, scale, scale * sums


class Gemm:
    """The kernel bound to one constant weight: packed (N, kb, 16) bytes, scales (N, kb)
    float32, the zero points' share -zp * scale transposed, (kb, N) float32, and a bias (N,)
    float32 (zeros for none)."""

    def __init__(self, packed: np.ndarray, scales: np.ndarray, zshare: np.ndarray,
                 bias: np.ndarray) -> None:
        self.keep = (packed, scales, zshare, bias)  # the kernel reads them
        self.N, self.kb = scales.shape
        self.fn = _module().gemm
        self.ptrs = (packed.ctypes.data, scales.ctypes.data, zshare.ctypes.data,
                     bias.ctypes.data)

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

    def __call__(self, qa: np.ndarray, sa: np.ndarray, asum: np.ndarray, out: np.ndarray,
                 n0: int, n1: int) -> None:
        """out[:, n0:n1] = the rows' products, all terms included; qa (M, kb * 32) int8, sa
        and asum (M, kb) float32, out (M, N) float32, all C-contiguous; n0 a multiple of 4."""
        B, S, Z, bias = self.ptrs
        M = qa.shape[0]
        self.fn(qa.ctypes.data, sa.ctypes.data, asum.ctypes.data, B, S, Z, bias,
                out.ctypes.data, M, n0, n1, self.N, self.kb, self.N - self.N % GROUP)


BUNDLE = {"nbits_gemm": (module_ir, REQUIRES)}

__all__ = ["BLOCK", "BUNDLE", "REQUIRES", "Gemm", "module_ir", "quantize_rows", "supported",
           "unavailable"]
