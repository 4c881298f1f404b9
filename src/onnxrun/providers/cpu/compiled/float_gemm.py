"""Float32 matrix products with a constant right operand packed once per session:
Y = clip(A @ B + bias + R, lo, hi).

Why: OpenBLAS packs B into its panel layout at every call and applies nothing after the
product, so a MatMul + bias + residual + Relu is four passes over the output. Here (as in
onnxruntime's MLAS) a constant B is packed once, when the session is created, into panels of
NR columns, each panel ``[K][NR]`` floats (one row of a panel is NR/W vector loads on one
cache line pair); a tile of MR rows x NR columns keeps MR * NR/W accumulators in registers
for a block of K, a row of A broadcast one float at a time (A is read where it lies, row
stride free, never packed). The epilogue adds the bias per column, a residual matrix and the
clip (Relu, Relu6, Clip) before the single store.

Two shapes of tile, one IR generator (``tile_ir(W, MR, NV)``), chosen by the target's vector
width (``tile_for``): avx2 / avxvnni, W = 8 lanes and 6 x 16 tiles (12 accumulators + 2 B
vectors + 1 broadcast of 16 ymm registers); AVX-512, W = 16 and 6 x 64 (24 + 4 + 1 of 32 zmm
registers). Not 14 x 32 (28 + 2 + 1): its 14 row pointers outgrow the 15 general registers,
and LLVM reloaded them from the stack and spilled an accumulator in the K loop (1-9% slower,
AVX-512 EPYC; 256 x 384 x 1536 107.0 against 103.1 GFLOP/s). A partial panel runs the tile of
as many vectors of B as its columns need. The IR is generic LLVM vector code: a <16 x float>
tile compiled for AVX2 is correct (split in halves, slower), which is how the tests check the
AVX-512 tile on an AVX2 host.

Blocking (Goto/MLAS): K in blocks of ``kc`` (the first starts from zero, the others add to the
stored partial sums, only the last runs the epilogue), panels in groups of ``nc`` (the group's
``kc x nc`` block of B stays in L2 while every MR-row strip of A, ``MR x kc`` in L1, passes
over it). Threads split the panels (or, with few panels, the rows) into contiguous ranges;
each range is one call, the GIL released. The sum over K runs in the same order whatever the
split, so results do not depend on the thread count.
"""

from __future__ import annotations

import ctypes
import math
import re
from typing import NamedTuple

import numpy as np

from ..gelu_polynomial import EPILOGUES
from ..parallel import work_ranges
from . import _compiler, gelu, ir, jit, spin
from . import logistic as mlas_logistic
from .jit import address
from .layout import aligned_empty, aligned_zeros


class Tile(NamedTuple):  # (not a dataclass: its creation was ~1 ms of a first session)
    """A tile shape: W float lanes per vector, MR rows, NR = NV * W columns; its blocking:
    KC rows of B per K block, panels in groups of NC bytes of such a block (in L2); products
    of K <= SHORT_K over more than one panel in strips of SHORT_MR < MR rows (0: MR always)."""

    W: int
    MR: int
    NV: int = 2
    KC: int = 256
    NC: int = 128 * 1024
    SHORT_K: int = 0
    SHORT_MR: int = 0

    @property
    def NR(self) -> int:
        return self.NV * self.W

    @property
    def module(self) -> str:
        return f"float_gemm_{self.MR}x{self.NR}"


# 12 accumulators + 2 B vectors + 1 broadcast of 16 ymm registers; K blocks of 256, groups
# of 128 KiB, measured on the AVX2 EPYC (docs/PERFORMANCE.md)
AVX2_TILE = Tile(8, 6)
# 24 + 4 + 1 of 32 zmm registers; K blocks of 512 (half the passes over C's partial sums),
# groups of 256 KiB (2 panels): 2-5% faster than 256 and 128 KiB on the AVX-512 EPYC
# (Zen 4, 1 MiB L2), 256 x 384 x 1536 106.0 -> 110.6 GFLOP/s. Strips of 4 rows where K is
# short and N wide (medians of 31, load 7): 3136 x 24 x 144 85.4 -> 90.6, 3136 x 64 x 256
# 93.6 -> 99.3, 12544 x 16 x 96 69.0 -> 73.3, 196 x 64 x 384 98.9 -> 102.4; they lost on one
# panel (3136 x 144 x 24 69.5 -> 66.4), at K = 256 with 32 rows (98.4 -> 95.5), from K = 1024
AVX512_TILE = Tile(16, 6, 4, 512, 256 * 1024, 192, 4)


def tile_for(target: jit.Target) -> Tile:
    return AVX512_TILE if target.lanes >= 16 else AVX2_TILE



def _step(tag: str, k: str, u: int, R: int, W: int, NV: int, acc: dict, out: str,
          NR: int | None = None) -> list[str]:
    """One k step (``k`` + ``u``) of an R-row tile: NV vectors of the panel's row (``NR``
    floats, NV * W by default), each row of A's float broadcast, R * NV fused multiply-adds
    from ``acc`` into ``out``_{r}_{v}."""
    VT, sfx = f"<{W} x float>", f"v{W}f32"
    NR = NR or NV * W
    t = f"%{tag}"
    L = [f"  {t}.k = add i64 {k}, {u}", f"  {t}.bo = mul i64 {t}.k, {NR}"]
    for v in range(NV):
        L += [f"  {t}.bx{v} = add i64 {t}.bo, {v * W}",
              f"  {t}.bp{v} = getelementptr float, ptr %B, i64 {t}.bx{v}",
              f"  {t}.b{v} = load {VT}, ptr {t}.bp{v}, align {4 * W}"]
    for r in range(R):
        L += [f"  {t}.xp{r} = getelementptr float, ptr %ap{r}, i64 {t}.k",
              f"  {t}.x{r} = load float, ptr {t}.xp{r}, align 4",
              f"  {t}.xs{r} = insertelement {VT} poison, float {t}.x{r}, i64 0",
              f"  {t}.xv{r} = shufflevector {VT} {t}.xs{r}, {VT} poison, "
              f"<{W} x i32> zeroinitializer"]
        for v in range(NV):
            L.append(f"  {out}_{r}_{v} = call {VT} @llvm.fma.{sfx}({VT} {t}.xv{r}, "
                     f"{VT} {t}.b{v}, {VT} {acc[r, v]})")
    return L


def _tile(R: int, W: int, NV: int, U: int = 4, NP: int | None = None) -> list[str]:
    """``@tile{R}``: an R x NV*W tile over ``%kc`` rows of K, row r of A at ``%roff[r]`` floats
    from ``%A``. ``%first``: start from zero (else
    from the partial sums stored in C); ``%last``: add the bias (``%flags`` bit 0) and the
    residual rows (bit 1), clip to ``%clip`` = (lo, hi), store. Columns past ``%ncols`` are
    masked (the panel's B columns there are zeros)."""
    VT = f"<{W} x float>"
    VI = f"<{W} x i32>"
    VM = f"<{W} x i1>"
    NR = NV * W
    NP = NP or NR  # the panels' width: NP > NR, the first NR columns of a partial panel
    sfx = f"v{W}f32"
    iota = lambda off: "<" + ", ".join(f"i32 {i + off}" for i in range(W)) + ">"  # noqa: E731
    name = f"tile{R}" if NP == NR else f"part{NV}x{R}"
    L = [f"define internal void @{name}(ptr %A, i64 %lda, ptr %B, i64 %kc, ptr %C, i64 %ldc, "
         "i64 %ncols, i1 %first, i1 %last, ptr %bias, ptr %Rs, i64 %ldr, ptr %clip, "
         "i64 %flags, i64 %blk, i64 %astep, i64 %nob, ptr %roff) alwaysinline nounwind {",
         "entry:",
         "  %full = icmp eq i64 %ncols, " + str(NR),
         "  %nc32 = trunc i64 %ncols to i32",
         f"  %ncs = insertelement {VI} poison, i32 %nc32, i64 0",
         f"  %ncv = shufflevector {VI} %ncs, {VI} poison, <{W} x i32> zeroinitializer"]
    for v in range(NV):
        L.append(f"  %mask{v} = icmp slt {VI} {iota(v * W)}, %ncv")
    for r in range(R):
        L += [f"  %aop{r} = getelementptr i64, ptr %roff, i64 {r}",  # (the driver's)
              f"  %ao{r} = load i64, ptr %aop{r}, align 8",
              f"  %apb{r} = getelementptr float, ptr %A, i64 %ao{r}",
              f"  %co{r} = mul i64 {r}, %ldc"]
        for v in range(NV):
            L += [f"  %cx{r}_{v} = add i64 %co{r}, {v * W}",
                  f"  %cp{r}_{v} = getelementptr float, ptr %C, i64 %cx{r}_{v}"]
    L += ["  br i1 %first, label %zero, label %loadc",
          "loadc:"]
    for r in range(R):
        for v in range(NV):
            L.append(f"  %c{r}_{v} = call {VT} @llvm.masked.load.{sfx}.p0(ptr %cp{r}_{v}, "
                     f"i32 4, {VM} %mask{v}, {VT} zeroinitializer)")
    L += ["  br label %pre", "zero:", "  br label %pre", "pre:"]
    for r in range(R):
        for v in range(NV):
            L.append(f"  %i{r}_{v} = phi {VT} [zeroinitializer, %zero], [%c{r}_{v}, %loadc]")
    # kc in sub-blocks of %blk rows of K, A's rows moving on %astep floats after each (an
    # implicit-GEMM convolution: a sub-block is a row of kernel taps, kw * C floats in place),
    # B's rows following each other; the accumulators stay in registers throughout
    L += ["  br label %oloop",
          "oloop:",
          "  %ob = phi i64 [0, %pre], [%obn, %olatch]"]
    for r in range(R):
        for v in range(NV):
            L.append(f"  %ai{r}_{v} = phi {VT} [%i{r}_{v}, %pre], [%s{r}_{v}, %olatch]")
    L += ["  %aoff = mul i64 %ob, %astep",
          "  %boff0 = mul i64 %ob, %blk",
          f"  %boff = mul i64 %boff0, {NP}",
          "  %Bb = getelementptr float, ptr %B, i64 %boff"]
    L += [f"  %ap{r} = getelementptr float, ptr %apb{r}, i64 %aoff" for r in range(R)]
    loop = len(L)
    # the K loop unrolled U times, then single steps for the rest
    L += [f"  %ku = and i64 %kc, {-U}",
          "  %anyu = icmp sgt i64 %ku, 0",
          "  br i1 %anyu, label %uloop, label %umid",
          "uloop:",
          "  %k = phi i64 [0, %pre], [%kn, %uloop]"]
    # A one-row tile (a GEMV) has only NV chains of dependent FMAs: each unrolled step gets
    # its own accumulators (U * NV chains, summed after the loop), or the FMA latency, not
    # the loads, would bound it (1.5-3x slower than BLAS's GEMV on the original matrix).
    sets = U if R == 1 else 1
    acc = {}
    for j in range(sets):
        for r in range(R):
            for v in range(NV):
                init = f"%i{r}_{v}" if j == 0 else "zeroinitializer"
                acc[j, r, v] = f"%u{j}_{r}_{v}"
                L.append(f"  %u{j}_{r}_{v} = phi {VT} [{init}, %pre], "
                         f"[%un{U - sets + j}_{r}_{v}, %uloop]")
    for u in range(U):
        j = u % sets
        L += _step(f"u{u}", "%k", u, R, W, NV, {(r, v): acc[j, r, v] for r in range(R)
                                                 for v in range(NV)}, f"%un{u}", NP)
        acc.update({(j, r, v): f"%un{u}_{r}_{v}" for r in range(R) for v in range(NV)})
    L += [f"  %kn = add i64 %k, {U}",
          "  %moreu = icmp slt i64 %kn, %ku",
          "  br i1 %moreu, label %uloop, label %umid",
          "umid:"]
    sums = []  # after the phis (LLVM wants them first in the block)
    for r in range(R):
        for v in range(NV):
            for j in range(sets):
                init = f"%i{r}_{v}" if j == 0 else "zeroinitializer"
                name = f"%m{r}_{v}" if sets == 1 else f"%mp{j}_{r}_{v}"
                L.append(f"  {name} = phi {VT} [{init}, %pre], "
                         f"[%un{U - sets + j}_{r}_{v}, %uloop]")
            total = f"%mp0_{r}_{v}"
            for j in range(1, sets):
                name = f"%m{r}_{v}" if j == sets - 1 else f"%ms{j}_{r}_{v}"
                sums.append(f"  {name} = fadd {VT} {total}, %mp{j}_{r}_{v}")
                total = name
    L += sums
    L += ["  %anyt = icmp slt i64 %ku, %kc",
          "  br i1 %anyt, label %tloop, label %after",
          "tloop:",
          "  %kt = phi i64 [%ku, %umid], [%ktn, %tloop]"]
    for r in range(R):
        for v in range(NV):
            L.append(f"  %t{r}_{v} = phi {VT} [%m{r}_{v}, %umid], [%tn_{r}_{v}, %tloop]")
    L += _step("t", "%kt", 0, R, W, NV,
               {(r, v): f"%t{r}_{v}" for r in range(R) for v in range(NV)}, "%tn", NP)
    L += ["  %ktn = add i64 %kt, 1",
          "  %moret = icmp slt i64 %ktn, %kc",
          "  br i1 %moret, label %tloop, label %after",
          "after:"]
    for r in range(R):
        for v in range(NV):
            L.append(f"  %s{r}_{v} = phi {VT} [%m{r}_{v}, %umid], [%tn_{r}_{v}, %tloop]")
    # within the sub-block: %blk rows of K from %Bb, accumulators from %ai
    L[loop:] = [re.sub(r"%kc\b", "%blk", re.sub(r"%i(\d+_\d+)", r"%ai\1", line))
                .replace("%pre]", "%oloop]").replace("ptr %B,", "ptr %Bb,") for line in L[loop:]]
    L += ["  br label %olatch",
          "olatch:",
          "  %obn = add i64 %ob, 1",
          "  %omore = icmp ult i64 %obn, %nob",
          "  br i1 %omore, label %oloop, label %odone",
          "odone:",
          "  br i1 %last, label %epi, label %out", "epi:",
          "  %fb = and i64 %flags, 1",
          "  %hb = icmp ne i64 %fb, 0",
          "  %fr = and i64 %flags, 2",
          "  %hr = icmp ne i64 %fr, 0",
          "  %lop = getelementptr float, ptr %clip, i64 0",
          "  %lof = load float, ptr %lop, align 4",
          "  %hip = getelementptr float, ptr %clip, i64 1",
          "  %hif = load float, ptr %hip, align 4",
          f"  %los = insertelement {VT} poison, float %lof, i64 0",
          f"  %lo = shufflevector {VT} %los, {VT} poison, <{W} x i32> zeroinitializer",
          f"  %his = insertelement {VT} poison, float %hif, i64 0",
          f"  %hi = shufflevector {VT} %his, {VT} poison, <{W} x i32> zeroinitializer"]
    for v in range(NV):  # masks that are all false read nothing: no bias / residual pointer
        L += [f"  %mb{v} = select i1 %hb, {VM} %mask{v}, {VM} zeroinitializer",
              f"  %mr{v} = select i1 %hr, {VM} %mask{v}, {VM} zeroinitializer",
              f"  %bsp{v} = getelementptr float, ptr %bias, i64 {v * W}",
              f"  %bs{v} = call {VT} @llvm.masked.load.{sfx}.p0(ptr %bsp{v}, i32 4, "
              f"{VM} %mb{v}, {VT} zeroinitializer)"]
    for r in range(R):
        L += [f"  %ro{r} = mul i64 {r}, %ldr"]
        for v in range(NV):
            t = f"%e{r}_{v}"
            L += [f"  {t}.b = fadd {VT} %s{r}_{v}, %bs{v}",
                  f"  {t}.rx = add i64 %ro{r}, {v * W}",
                  f"  {t}.rp = getelementptr float, ptr %Rs, i64 {t}.rx",
                  f"  {t}.r = call {VT} @llvm.masked.load.{sfx}.p0(ptr {t}.rp, i32 4, "
                  f"{VM} %mr{v}, {VT} zeroinitializer)",
                  f"  {t}.s = fadd {VT} {t}.b, {t}.r",
                  # numpy's clip: NaN stays NaN
                  f"  {t}.lt = fcmp olt {VT} {t}.s, %lo",
                  f"  {t}.l = select {VM} {t}.lt, {VT} %lo, {VT} {t}.s",
                  f"  {t}.gt = fcmp ogt {VT} {t}.l, %hi",
                  f"  {t} = select {VM} {t}.gt, {VT} %hi, {VT} {t}.l"]
    L += ["  br label %out", "out:"]
    for r in range(R):
        for v in range(NV):
            L.append(f"  %o{r}_{v} = phi {VT} [%s{r}_{v}, %odone], [%e{r}_{v}, %epi]")
    L += ["  br i1 %full, label %st, label %stm", "st:"]
    for r in range(R):
        for v in range(NV):
            L.append(f"  store {VT} %o{r}_{v}, ptr %cp{r}_{v}, align 4")
    L += ["  ret void", "stm:"]
    if W >= 16:
        # AVX-512: a partial panel's rows by masked stores (vmovups with a k mask, one store
        # each: not microcoded as AVX2's vmaskmovps is). The scalar stores below cost about
        # as much as the tile's FMAs at K ~ 30: ShuffleNet's grouped 784 x (4 x 34x34)
        # 158 -> 109 us, 784 x (4 x 28x28) 94 -> 65 (Zen 4; 32x32: 74)
        for r in range(R):
            L += [f"  call void @llvm.masked.store.{sfx}.p0({VT} %o{r}_{v}, ptr %cp{r}_{v}, "
                  f"i32 4, {VM} %mask{v})" for v in range(NV)]
        L += ["  ret void", "}"]
        return L
    # AVX2: a partial panel's rows through a buffer, then ncols scalar stores each. A masked
    # store is microcoded on AMD (vmaskmovps: ~12-19 cycles each, 12 per tile): 68 columns
    # of 196 rows cost more than 80 did (46 against 42 us at K = 68).
    L += [f"  %sbuf = alloca [{NR} x float], align {4 * W}"]
    for v in range(NV):
        L.append(f"  %sbv{v} = getelementptr float, ptr %sbuf, i64 {v * W}")
    L.append("  br label %sr0")
    for r in range(R):
        nxt = f"%sr{r + 1}" if r + 1 < R else "%sret"
        L.append(f"sr{r}:")
        L += [f"  store {VT} %o{r}_{v}, ptr %sbv{v}, align {4 * W}" for v in range(NV)]
        L += [f"  br label %sl{r}",
              f"sl{r}:",
              f"  %sj{r} = phi i64 [0, %sr{r}], [%sjn{r}, %sl{r}]",
              f"  %sp{r} = getelementptr float, ptr %sbuf, i64 %sj{r}",
              f"  %sx{r} = load float, ptr %sp{r}, align 4",
              f"  %sq{r} = getelementptr float, ptr %cp{r}_0, i64 %sj{r}",
              f"  store float %sx{r}, ptr %sq{r}, align 4",
              f"  %sjn{r} = add i64 %sj{r}, 1",
              f"  %sjm{r} = icmp slt i64 %sjn{r}, %ncols",
              f"  br i1 %sjm{r}, label %sl{r}, label {nxt}"]
    L += ["sret:", "  ret void", "}"]
    return L


# @sgemm's parameters, in the order of its int64 argument array
# (``ajump``: floats A moves on after each ``blk`` rows of K besides their width, 0 for a
# plain A; ``blk`` 0: no such sub-blocks. ``kcb`` is then a multiple of ``blk``.
# ``snp, sa, sc, sN``: a grouped product's sets of panels, ``snp`` panels per set (all of them
# for one product); set s reads A from column s * sa, writes C, the bias and R from column
# s * sc on, sN columns; ``wrap, wstep``: row m of A starts at (m // wrap) * wstep +
# (m % wrap) * lda, a strided convolution's output rows of ``wrap`` pixels, 2**62 and 0 for a
# plain A; ``ms``: rows per strip of A, at most MR)
PARAMS = ("A", "lda", "Bp", "K", "C", "ldc", "N", "bias", "R", "ldr", "clip", "flags", "kcb",
          "ncb", "ajump", "blk", "snp", "sa", "sc", "sN", "wrap", "wstep", "ms", "m0", "m1",
          "p0", "p1")
_POINTERS = frozenset({"A", "Bp", "C", "bias", "R", "clip"})


def _row_offsets(MR: int) -> list[str]:
    """``%roff[r]``, r = 1..MR-1: row m + r's start in A less row m's (``%am``), rows wrapping
    to the next output row (``%wstep`` on) after ``%wrap`` pixels; no division per row."""
    L = []
    for r in range(1, MR):
        p = r - 1
        L += [f"  %mr{r}a = add i64 %mr{p}, 1",
              f"  %mw{r} = icmp eq i64 %mr{r}a, %wrap",
              f"  %mr{r} = select i1 %mw{r}, i64 0, i64 %mr{r}a",
              f"  %mwi{r} = zext i1 %mw{r} to i64",
              f"  %mq{r} = add i64 %mq{p}, %mwi{r}",
              f"  %aq{r} = mul i64 %mq{r}, %wstep",
              f"  %ar{r} = mul i64 %mr{r}, %lda",
              f"  %aa{r} = add i64 %aq{r}, %ar{r}",
              f"  %ad{r} = sub i64 %aa{r}, %am",
              f"  %rop{r} = getelementptr i64, ptr %roff, i64 {r}",
              f"  store i64 %ad{r}, ptr %rop{r}, align 8"]
    return L


def _driver(W: int, MR: int, NV: int) -> list[str]:
    """``@sgemm``: rows [m0, m1) x panels [p0, p1) of C = epilogue(A @ B). K in blocks of
    ``%kcb``, panels in groups of ``%ncb``; per block and group, every MR-row strip of A
    passes over the group's panels. Block b of A starts ``b * %ajump`` floats further on (an
    implicit-GEMM convolution: each block is a row of kernel taps, read in place)."""
    NR = NV * W
    args = "ptr %At, i64 %lda, ptr %Bt, i64 %kc, ptr %Ct, i64 %ldc, i64 %nc, i1 %first, " \
        "i1 %last, ptr %bt, ptr %Rt, i64 %ldr, ptr %clip, i64 %flags, i64 %tblk, i64 %astep, " \
        "i64 %nob, ptr %roff"
    L = ["define void @sgemm(ptr %args) nounwind {",
         "entry:",
         f"  %roff = alloca [{MR} x i64], align 8"]
    for i, name in enumerate(PARAMS):  # one pointer argument: a ctypes call costs per argument
        L += [f"  %{name}.p = getelementptr i64, ptr %args, i64 {i}",
              f"  %{name}.i = load i64, ptr %{name}.p, align 8"]
        L.append(f"  %{name} = inttoptr i64 %{name}.i to ptr" if name in _POINTERS else
                 f"  %{name} = add i64 %{name}.i, 0")
    L += [
         "  %work = icmp slt i64 %m0, %m1",
         "  %work2 = icmp slt i64 %p0, %p1",
         "  %work3 = icmp sgt i64 %K, 0",
         "  %w12 = and i1 %work, %work2",
         "  %w = and i1 %w12, %work3",
         "  br i1 %w, label %kloop, label %end",
         "kloop:",
         "  %k0 = phi i64 [0, %entry], [%k0n, %knext]",
         "  %kleft = sub i64 %K, %k0",
         "  %kfit = icmp slt i64 %kleft, %kcb",
         "  %kc = select i1 %kfit, i64 %kleft, i64 %kcb",
         "  %first = icmp eq i64 %k0, 0",
         "  %noblk = icmp eq i64 %blk, 0",
         "  %tblk = select i1 %noblk, i64 %kc, i64 %blk",
         "  %astep = add i64 %tblk, %ajump",
         "  %nob = udiv i64 %kc, %tblk",  # sub-blocks of this K block (once, not per tile)
         "  %kb = sdiv i64 %k0, %tblk",
         "  %kjump = mul i64 %kb, %ajump",
         "  %k0n = add i64 %k0, %kc",
         "  %last = icmp sge i64 %k0n, %K",
         "  br label %gloop",
         "gloop:",
         "  %g0 = phi i64 [%p0, %kloop], [%g0n, %gnext]",
         "  %g1a = add i64 %g0, %ncb",
         "  %gfit = icmp slt i64 %g1a, %p1",
         "  %g1 = select i1 %gfit, i64 %g1a, i64 %p1",
         "  br label %mloop",
         "mloop:",
         "  %m = phi i64 [%m0, %gloop], [%mn, %mnext]",
         "  %mleft = sub i64 %m1, %m",
         "  %mfit = icmp slt i64 %mleft, %ms",
         "  %rows = select i1 %mfit, i64 %mleft, i64 %ms",
         "  %mq0 = udiv i64 %m, %wrap",  # (once per strip: the rows' offsets below)
         "  %mqw = mul i64 %mq0, %wrap",
         "  %mr0 = sub i64 %m, %mqw",
         "  %amq = mul i64 %mq0, %wstep",
         "  %amr = mul i64 %mr0, %lda",
         "  %am = add i64 %amq, %amr",
         "  store i64 0, ptr %roff, align 8",
         *_row_offsets(MR),
         "  %ak0 = add i64 %am, %k0",
         "  %ak = add i64 %ak0, %kjump",
         "  %At0 = getelementptr float, ptr %A, i64 %ak",
         "  %cm = mul i64 %m, %ldc",
         "  %rm = mul i64 %m, %ldr",
         # the first panel's set and place in it: one division per strip, not per tile
         "  %set0 = sdiv i64 %g0, %snp",
         "  %sp0 = mul i64 %set0, %snp",
         "  %pl0 = sub i64 %g0, %sp0",
         "  br label %ploop",
         "ploop:",
         "  %p = phi i64 [%g0, %mloop], [%pn, %pnext]",
         "  %set = phi i64 [%set0, %mloop], [%setn, %pnext]",
         "  %pl = phi i64 [%pl0, %mloop], [%pln, %pnext]",
         "  %sax = mul i64 %set, %sa",
         "  %At = getelementptr float, ptr %At0, i64 %sax",
         "  %scx = mul i64 %set, %sc",
         f"  %n00 = mul i64 %pl, {NR}",
         "  %nleft = sub i64 %sN, %n00",
         "  %n0 = add i64 %n00, %scx",
         f"  %nfit = icmp slt i64 %nleft, {NR}",
         f"  %nc = select i1 %nfit, i64 %nleft, i64 {NR}",
         "  %bpk = mul i64 %p, %K",
         "  %bpk2 = add i64 %bpk, %k0",
         f"  %bo = mul i64 %bpk2, {NR}",
         "  %Bt = getelementptr float, ptr %Bp, i64 %bo",
         "  %cx = add i64 %cm, %n0",
         "  %Ct = getelementptr float, ptr %C, i64 %cx",
         "  %bt = getelementptr float, ptr %bias, i64 %n0",
         "  %rx = add i64 %rm, %n0",
         "  %Rt = getelementptr float, ptr %R, i64 %rx",
         # a partial panel (the last, or ShuffleNet's groups of 34, 68 or 136 columns): the
         # tile of as many vectors of B per k as its columns need, no multiply-adds on zeros
         f"  %nvw = add i64 %nc, {W - 1}",
         f"  %nv = udiv i64 %nvw, {W}",
         f"  switch i64 %nv, label %sw{NV} ["
         + " ".join(f"i64 {v}, label %sw{v}" for v in range(1, NV)) + "]"]
    for v in range(1, NV + 1):
        L += [f"sw{v}:",
              f"  switch i64 %rows, label %t{v}x{MR} ["
              + " ".join(f"i64 {r}, label %t{v}x{r}" for r in range(1, MR)) + "]"]
        for r in range(1, MR + 1):
            name = f"tile{r}" if v == NV else f"part{v}x{r}"
            L += [f"t{v}x{r}:",
                  f"  call void @{name}({args})",
                  "  br label %pact"]
    # the logistic epilogue (flags 4: logistic(y); 8: y * logistic(alpha y), alpha the
    # clip block's third float) on the tile just stored, still in L1, after the last K block
    L += ["pact:",
          "  %actf = and i64 %flags, 60",
          "  %hasact = icmp ne i64 %actf, 0",
          "  %doact = and i1 %hasact, %last",
          "  br i1 %doact, label %actk, label %pnext",
          # flags 16: gelu(y), 32: FastGelu's (the standalone kernels' body: their bits)
          "actk:",
          "  %gelf = and i64 %flags, 16",
          "  %isgel = icmp ne i64 %gelf, 0",
          "  br i1 %isgel, label %gel, label %actk2",
          "gel:",
          "  call void @gelu_rows(ptr %Ct, i64 %ldc, i64 %rows, i64 %nc)",
          "  br label %pnext",
          "actk2:",
          "  %fgelf = and i64 %flags, 32",
          "  %isfgel = icmp ne i64 %fgelf, 0",
          "  br i1 %isfgel, label %fgel, label %act",
          "fgel:",
          "  call void @fast_gelu_rows(ptr %Ct, i64 %ldc, i64 %rows, i64 %nc)",
          "  br label %pnext",
          "act:",
          "  %alphap = getelementptr float, ptr %clip, i64 2",
          "  %alpha = load float, ptr %alphap, align 4",
          "  %mulf = and i64 %flags, 8",
          "  call void @act_rows(ptr %Ct, i64 %ldc, i64 %rows, i64 %nc, float %alpha, "
          "i64 %mulf)",
          "  br label %pnext",
          "pnext:",
          "  %pn = add i64 %p, 1",
          "  %pl1 = add i64 %pl, 1",
          "  %snext = icmp eq i64 %pl1, %snp",
          "  %pln = select i1 %snext, i64 0, i64 %pl1",
          "  %setx = zext i1 %snext to i64",
          "  %setn = add i64 %set, %setx",
          "  %pmore = icmp slt i64 %pn, %g1",
          "  br i1 %pmore, label %ploop, label %mnext",
          "mnext:",
          "  %mn = add i64 %m, %ms",
          "  %mmore = icmp slt i64 %mn, %m1",
          "  br i1 %mmore, label %mloop, label %gnext",
          "gnext:",
          "  %g0n = add i64 %g0, %ncb",
          "  %gmore = icmp slt i64 %g0n, %p1",
          "  br i1 %gmore, label %gloop, label %knext",
          "knext:",
          "  %kmore = icmp slt i64 %k0n, %K",
          "  br i1 %kmore, label %kloop, label %end",
          "end:",
          "  ret void",
          "}"]
    return L


def _rows_in_place(W: int, head: str, setup: list[str], body, x: str, y: str) -> list[str]:
    """An epilogue function, ``define internal void @<head> ... {`` (its parameters include
    ``ptr %C, i64 %ldc, i64 %rows, i64 %ncols``): rows [0, rows) of ``ncols`` floats, ``ldc``
    apart, from ``C`` in place, each element ``%<p>.<y>`` of ``%<p>.<x>`` by ``body(type,
    p, constant)``: whole vectors of W floats (p "v"), then the row's last floats one by one
    (p "s": the same operations, so the same bits; no masked store: microcoded on AMD's
    AVX2). ``setup``: the entry block's own lines."""
    VT = f"<{W} x float>"

    def vec(c):
        return "<" + ", ".join([f"float {ir.float_constant(c)}"] * W) + ">"

    return [f"define internal void @{head} noinline nounwind {{",
            "entry:",
            *setup,
            f"  %nv = and i64 %ncols, {-W}",
            "  %anyv = icmp sgt i64 %nv, 0",
            "  %anys = icmp slt i64 %nv, %ncols",
            "  br label %row",
            "row:",
            "  %r = phi i64 [0, %entry], [%rn, %rowend]",
            "  %ro = mul i64 %r, %ldc",
            "  %rp = getelementptr float, ptr %C, i64 %ro",
            "  br i1 %anyv, label %vloop, label %vdone",
            "vloop:",
            "  %i = phi i64 [0, %row], [%in, %vloop]",
            "  %xp = getelementptr float, ptr %rp, i64 %i",
            f"  %v.{x} = load {VT}, ptr %xp, align 4",
            *body(VT, "v", vec),
            f"  store {VT} %v.{y}, ptr %xp, align 4",
            f"  %in = add i64 %i, {W}",
            "  %more = icmp slt i64 %in, %nv",
            "  br i1 %more, label %vloop, label %vdone",
            "vdone:",
            "  br i1 %anys, label %sloop, label %rowend",
            "sloop:",
            "  %j = phi i64 [%nv, %vdone], [%jn, %sloop]",
            "  %sp = getelementptr float, ptr %rp, i64 %j",
            f"  %s.{x} = load float, ptr %sp, align 4",
            *body("float", "s", ir.float_constant),
            f"  store float %s.{y}, ptr %sp, align 4",
            "  %jn = add i64 %j, 1",
            "  %smore = icmp slt i64 %jn, %ncols",
            "  br i1 %smore, label %sloop, label %rowend",
            "rowend:",
            "  %rn = add i64 %r, 1",
            "  %rmore = icmp slt i64 %rn, %rows",
            "  br i1 %rmore, label %row, label %end",
            "end:",
            "  ret void",
            "}"]


def _act_rows(W: int) -> list[str]:
    """``@act_rows``: logistic(y), or y * logistic(alpha y) where ``mulflag`` (MLAS's
    logistic, operation for operation: compiled/logistic.py's bits, a fused Sigmoid or SiLU
    the same as the standalone one), on a tile's rows in place (``_rows_in_place``)."""
    VT = f"<{W} x float>"
    return _rows_in_place(
        W, "act_rows(ptr %C, i64 %ldc, i64 %rows, i64 %ncols, float %alpha, i64 %mulflag)",
        ["  %mul = icmp ne i64 %mulflag, 0",
         f"  %va.0 = insertelement {VT} poison, float %alpha, i64 0",
         f"  %v.alpha = shufflevector {VT} %va.0, {VT} poison, <{W} x i32> zeroinitializer",
         "  %s.alpha = fadd float %alpha, 0.0"],
        lambda ty, p, const: mlas_logistic.body_ir(ty, p, const), "x", "out")


# the epilogue's flag bit of each GELU (gelu_polynomial.EPILOGUES), its function @<name>_rows
_GELU_FLAGS = {"gelu": 16, "fast_gelu": 32}


def _gelu_flags(gelu_after: str | None) -> int:
    if gelu_after is None:
        return 0
    if gelu_after not in _GELU_FLAGS:
        raise ValueError(f"float GEMM: unknown gelu epilogue {gelu_after!r}")
    return _GELU_FLAGS[gelu_after]


def _gelu_rows(W: int, name: str) -> list[str]:
    """``@<name>_rows``: the GELU ``name`` (gelu_polynomial.EPILOGUES: Gelu's or FastGelu's
    polynomial) by compiled/gelu.py's body (the standalone BiasGelu's / FastGelu's operations
    on the same polynomial: a fused one gives its bits), on a tile's rows in place."""
    coeffs = EPILOGUES[name]
    return _rows_in_place(W, f"{name}_rows(ptr %C, i64 %ldc, i64 %rows, i64 %ncols)", [],
                          lambda ty, p, const: gelu.body_ir(coeffs, ty, p, const), "s", "y")


def _pack_ir(NR: int) -> list[str]:
    """``@pack_panels(base, off, K, sN, out, p0, p1)``: full panels [p0, p1) of a matrix
    whose row k starts ``off[k]`` floats from ``base`` and whose columns are ``sN`` floats
    apart: out[p][k][j] = base[off[k] + (p * NR + j) * sN]. A Gemm's transB weight or a
    convolution's (M, C, kh, kw) weight seen as (kh * kw * C, M), whose columns are rows in
    memory: numpy's transposing copy of such a view took 8x a plain copy (AlexNet's 9216 x
    4096 fully connected weight: 108 against 13 ms), most of creating such a session. Here
    8 columns at a time along 512 rows of K: 8 sequential read streams, which the
    prefetchers follow (the 64 columns of a panel at once ran as slowly as numpy), each
    row's offset read once, its 8 floats stored side by side (33 ms for that weight)."""
    return ["define void @pack_panels(ptr %base, ptr %off, i64 %K, i64 %sN, ptr %out, "
            "i64 %p0, i64 %p1) nounwind {",
            "entry:",
            "  %anyp = icmp slt i64 %p0, %p1",
            "  %anyk = icmp sgt i64 %K, 0",
            "  %any = and i1 %anyp, %anyk",
            "  br i1 %any, label %pl, label %end",
            "pl:",
            "  %p = phi i64 [%p0, %entry], [%pn, %pnext]",
            "  %pk = mul i64 %p, %K",
            f"  %colp = mul i64 %p, {NR}",
            "  br label %kb",
            "kb:",
            "  %k0 = phi i64 [0, %pl], [%k0n, %kbnext]",
            "  %kleft = sub i64 %K, %k0",
            "  %kfit = icmp slt i64 %kleft, 512",
            "  %kn = select i1 %kfit, i64 %kleft, i64 512",
            "  br label %jb",
            "jb:",
            "  %j0 = phi i64 [0, %kb], [%j0n, %jbnext]",
            "  br label %kl",
            "kl:",  # row k of the block: its offset once, then the block's 8 columns
            "  %kk = phi i64 [0, %jb], [%kkn, %knext]",
            "  %k = add i64 %k0, %kk",
            "  %offp = getelementptr i64, ptr %off, i64 %k",
            "  %o = load i64, ptr %offp, align 8",
            "  %dk = add i64 %pk, %k",
            f"  %dr = mul i64 %dk, {NR}",
            "  br label %jl",
            "jl:",
            "  %j = phi i64 [%j0, %kl], [%jn, %jl]",
            "  %cj = add i64 %colp, %j",
            "  %col = mul i64 %cj, %sN",
            "  %si = add i64 %o, %col",
            "  %sp = getelementptr float, ptr %base, i64 %si",
            "  %v = load float, ptr %sp, align 4",
            "  %di = add i64 %dr, %j",
            "  %dp = getelementptr float, ptr %out, i64 %di",
            "  store float %v, ptr %dp, align 4",
            "  %jn = add i64 %j, 1",
            "  %jend = add i64 %j0, 8",
            "  %jmore = icmp slt i64 %jn, %jend",
            "  br i1 %jmore, label %jl, label %knext",
            "knext:",
            "  %kkn = add i64 %kk, 1",
            "  %kmore = icmp slt i64 %kkn, %kn",
            "  br i1 %kmore, label %kl, label %jbnext",
            "jbnext:",
            "  %j0n = add i64 %j0, 8",
            f"  %jbmore = icmp slt i64 %j0n, {NR}",
            "  br i1 %jbmore, label %jb, label %kbnext",
            "kbnext:",
            "  %k0n = add i64 %k0, 512",
            "  %kbmore = icmp slt i64 %k0n, %K",
            "  br i1 %kbmore, label %kb, label %pnext",
            "pnext:",
            "  %pn = add i64 %p, 1",
            "  %pmore = icmp slt i64 %pn, %p1",
            "  br i1 %pmore, label %pl, label %end",
            "end:",
            "  ret void",
            "}"]


def tile_ir(W: int, MR: int, NV: int = 2) -> str:
    """The module of one tile shape: @tile1..@tile{MR} and the driver @sgemm."""
    VT, VM = f"<{W} x float>", f"<{W} x i1>"
    sfx = f"v{W}f32"
    decls = [f"declare {VT} @llvm.masked.load.{sfx}.p0(ptr, i32, {VM}, {VT})",
             f"declare void @llvm.masked.store.{sfx}.p0({VT}, ptr, i32, {VM})",
             f"declare {VT} @llvm.fma.{sfx}({VT}, {VT}, {VT})",
             "declare float @llvm.fma.f32(float, float, float)",
             # the GELU epilogue's (gelu_rows: vectors, then single floats)
             *(f"declare {t} @llvm.{f}.{x}({', '.join([t] * n)})"
               for t, x in ((VT, sfx), ("float", "f32"))
               for f, n in (("maxnum", 2), ("minnum", 2), ("rint", 1)))]
    parts = [_compiler.INLINE + "\n".join(decls)]  # the tiles inlined into the driver
    parts += ["\n".join(_tile(r, W, NV)) for r in range(1, MR + 1)]
    # a partial panel's first v vectors of columns (the others zeros: not computed)
    parts += ["\n".join(_tile(r, W, v, NP=NV * W)) for v in range(1, NV) for r in range(1, MR + 1)]
    parts.append("\n".join(_act_rows(W)))
    parts += ["\n".join(_gelu_rows(W, name)) for name in _GELU_FLAGS]
    parts.append("\n".join(_pack_ir(NV * W)))
    parts.append("\n".join(_driver(W, MR, NV)))
    return "\n\n".join(parts)


def module_ir(target: jit.Target) -> str:
    t = tile_for(target)
    return tile_ir(t.W, t.MR, t.NV)


_PROTO = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_PACK = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                         ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64)
_FUNCTIONS = {"sgemm": _PROTO, "pack_panels": _PACK}


def _module(tile: Tile | None = None) -> jit.Module:
    """The selected target's module, or (tests) ``tile``'s shape compiled for that target."""
    if tile is None:
        return jit.compile_module("float_gemm", module_ir, _FUNCTIONS)
    return jit.compile_module(tile.module, tile_ir(tile.W, tile.MR, tile.NV), _FUNCTIONS)


def unavailable() -> str | None:
    """None when the kernel can run here (its object loaded for the selected target), else
    why not. Asked by every convolution's layout choice about each neighbour (YOLO-style: ~750
    times a session): both answers are remembered per switch state, two dictionary lookups."""
    return jit.why_unavailable() or jit.why_not_loaded("float_gemm", _module)


def pack(B: np.ndarray | None) -> PackedMatrix | None:
    """The panels of a constant (K, N) float32 matrix for the selected target, or None where
    the kernel does not run: another dtype or rank, no llvmlite, a host the loader does not
    handle, or ONNXRUN_COMPILED_KERNELS=0 (or ``compiled.disabled()``). B may be any view
    (a transpose): its panels are filled by one strided copy."""
    if B is None or B.ndim != 2 or B.dtype != np.float32 or unavailable() is not None:
        return None
    return pack_rows(B)


def pack_rows(B: np.ndarray) -> PackedMatrix | None:
    """``pack`` of the (K, N) matrix whose K rows are the leading axes of the float32 array
    ``B`` (..., N) in C order, e.g. a convolution weight's (kh, kw, C, M) view: one strided
    copy from B into the panels, where a 2-D copy of it first would take another pass."""
    if B.ndim < 2 or B.dtype != np.float32 or unavailable() is not None:
        return None
    try:
        return PackedMatrix(B)
    except jit.Unavailable:
        return None


def pack_stack(Bs: np.ndarray) -> list[PackedMatrix] | None:
    """``pack`` of each (K, N) matrix of a float32 stack (G, K, N), in one copy into one
    buffer (Winograd's 16 products), or None where the kernel does not run."""
    if Bs.ndim != 3 or Bs.dtype != np.float32 or unavailable() is not None:
        return None
    try:
        return PackedMatrix.stack(Bs)
    except jit.Unavailable:
        return None


def pack_groups(Bs: np.ndarray) -> PackedGroups | None:
    """A grouped product's (G, K, N) float32 weights as PackedGroups, or None where the
    kernel does not run."""
    if Bs.ndim != 3 or Bs.dtype != np.float32 or unavailable() is not None:
        return None
    try:
        return PackedGroups(Bs)
    except jit.Unavailable:
        return None


def _panels(Bs: np.ndarray, NR: int, module: jit.Module | None = None) -> np.ndarray:
    """(G, *rows, N) -> (G, N/NR panels, K, NR), K the product of the row axes (C order),
    64-byte aligned, missing columns zero: the full panels in one strided copy for the whole
    stack, from any view (no contiguous copy of B first), the last partial panel apart (no
    padded copy of B). Where B's rows are contiguous, each panel's row of NR floats moves as
    one opaque item (a transpose of 64/128-byte items: 1.6x faster than numpy's copy of the
    same float transpose)."""
    Bs = np.asarray(Bs, np.float32)
    G, rows, N = Bs.shape[0], Bs.shape[1:-1], Bs.shape[-1]
    K = math.prod(rows)
    full, rest = divmod(N, NR)
    panels = aligned_empty((G, full + (rest > 0), K, NR), np.float32)  # each element written
    nr = len(rows)
    if full and K:
        src = Bs[..., :full * NR]
        dst = panels[:, :full].reshape((G, full) + rows + (NR,))
        to_panels = (0, nr + 1) + tuple(range(1, nr + 1))  # (G, full, *rows)
        if src.strides[-1] == 4:
            row = np.dtype((np.void, 4 * NR))
            dst.view(row)[..., 0] = src.view(row).transpose(to_panels)
        elif module is None or not _pack_compiled(module, Bs, panels, full):
            dst[...] = src.reshape(src.shape[:-1] + (full, NR)).transpose(to_panels + (nr + 2,))
    if rest:
        panels[:, full, :, :rest] = Bs[..., full * NR:].reshape(G, K, rest)
        panels[:, full, :, rest:] = 0
    return panels


def _pack_compiled(module: jit.Module, Bs: np.ndarray, panels: np.ndarray, full: int) -> bool:
    """_panels' full panels by the kernel's @pack_panels, each matrix of the stack from
    where it lies (rows at any non-negative strides, the columns a whole number of floats
    apart); False (nothing done) for other views."""
    strides = Bs.strides[1:]
    if any(st < 0 or st % 4 for st in strides):
        return False
    rows, K = Bs.shape[1:-1], panels.shape[2]
    # row k's start, in floats from the matrix's first one (k over the row axes, C order)
    off = np.zeros(rows, np.int64)
    for axis, (n, st) in enumerate(zip(rows, strides[:-1], strict=True)):
        shape = [1] * len(rows)
        shape[axis] = n
        off = off + (np.arange(n, dtype=np.int64) * (st // 4)).reshape(shape)
    off = np.ascontiguousarray(off.reshape(K))
    base = Bs.__array_interface__["data"][0]
    for g in range(Bs.shape[0]):
        module.pack_panels(base + g * Bs.strides[0], address(off), K, strides[-1] // 4,
                           address(panels[g]), 0, full)
    return True


_NO_CLIP = np.array((-np.inf, np.inf, 1.0, 0.0), np.float32)


def _clip_block(bounds, logistic) -> tuple[np.ndarray, int]:
    """The kernel's clip block (lo, hi, alpha, 0) and the flags it adds: ``logistic`` None,
    or (alpha, times_x): logistic(y) (flag 4), or y * logistic(alpha y) (flags 4 | 8: SiLU,
    QuickGelu) after the bias, the residual and the clip."""
    if bounds is None and logistic is None:
        return _NO_CLIP, 0
    lo, hi = (-np.inf, np.inf) if bounds is None else bounds
    if logistic is None:
        return np.array((lo, hi, 1.0, 0.0), np.float32), 0
    alpha, times_x = logistic
    return np.array((lo, hi, alpha, 0.0), np.float32), 12 if times_x else 4
# Multiply-adds a range needs before a product is split over spin.py's workers: one still
# polling from the previous product takes a range within microseconds, so this is below
# parallel.MIN_MACS_PER_RANGE (sized for waking a Python thread: 50-80 us). 1M multiply-adds
# are ~60-100 us on one AVX2 core. Quiet 2-vCPU VM, onnxrun/onnxruntime at 2 threads
# (`benchmarks/split_threshold.py`, three rounds): GPT decoder 1.78 / 2.17 / 2.32 with 4M ->
# 1.57 / 1.51 / 1.68 with 1M (1.69 / 1.64 with 256K); SqueezeNet 2.48 / 2.11 / 1.94 ->
# 2.14 / 1.87 / 2.17 (noise: its 1-thread figure moved as much).
SPIN_MACS_PER_RANGE = 1 << 20
_NO_WRAP = 1 << 62  # rows of A never wrap: row m at m * lda


def _rows_out(out: np.ndarray, shape: tuple[int, int]) -> bool:
    """Whether ``out`` can take a float32 product of ``shape``: rows of contiguous floats,
    any stride at least a row apart (a range of a wider matrix's columns: a grouped
    convolution's group, a convolution's channels of a Concat's output, memory.py)."""
    return out.shape == shape and out.dtype == np.float32 and out.strides[1] == 4 and \
        out.strides[0] % 4 == 0 and out.strides[0] >= 4 * shape[1]


# A's and out's addresses, and out's row stride, in the argument block (PackedMatrix._head)
_PTR_A, _PTR_OUT, _LDC = 0, 4, 5


def _logistic_in_place(out: np.ndarray, logistic) -> None:
    """_clip_block's logistic on ``out`` by compiled/logistic.py (an empty product's
    epilogue): the kernel's bits."""
    alpha, times_x = logistic
    dense = np.ascontiguousarray(out)
    if times_x:
        mlas_logistic.quick_gelu(dense, alpha, out=dense)
    else:
        mlas_logistic.sigmoid(dense, out=dense)
    out[...] = dense


class PackedMatrix:
    """A constant (K, N) float32 matrix packed once into the panels of the selected target's
    tile: (N/NR panels, K, NR) floats, 64-byte aligned, the last panel's missing columns zero.
    ``run`` computes clip(A @ B + bias + R). Raises ``jit.Unavailable`` where the kernel
    cannot run here. ``tile`` (tests) takes another tile shape, compiled for the selected
    target: the AVX-512 6 x 64 tile's code checked on an AVX2 host."""

    __slots__ = ("K", "N", "NR", "MR", "panels", "tile", "_fn", "_ptr", "_ncb", "_ms",
                 "_zeros", "_zeros_ptr")

    def __init__(self, B: np.ndarray, tile: Tile | None = None) -> None:
        if B.ndim < 2:
            raise ValueError(f"PackedMatrix: expected a 2-D matrix, got shape {list(B.shape)}")
        module = _module(tile)
        tile = tile or tile_for(module.target)  # the layout follows the module's target
        self._bind(module, tile, _panels(np.asarray(B, np.float32)[None], tile.NR, module)[0],
                   B.shape[-1])

    @classmethod
    def stack(cls, Bs: np.ndarray, tile: Tile | None = None) -> list[PackedMatrix]:
        """One PackedMatrix per (K, N) matrix of the stack ``Bs`` (G, K, N), their panels
        views of one buffer filled by one copy."""
        module = _module(tile)
        tile = tile or tile_for(module.target)
        panels = _panels(np.asarray(Bs, np.float32), tile.NR, module)
        packed = []
        for g in range(Bs.shape[0]):
            p = cls.__new__(cls)
            p._bind(module, tile, panels[g], Bs.shape[2])
            packed.append(p)
        return packed

    def _bind(self, module: jit.Module, tile: Tile, panels: np.ndarray, N: int) -> None:
        npan, K, NR = panels.shape
        self._fn = module.sgemm
        self.panels = panels
        self._ptr = address(self.panels) if self.panels.size else 0
        self.K, self.N, self.NR, self.MR, self.tile = K, N, NR, tile.MR, tile
        self._ncb = max(1, tile.NC // (4 * NR * max(1, min(K, tile.KC))))
        short = tile.SHORT_MR and K <= tile.SHORT_K and npan > 1
        self._ms = tile.SHORT_MR if short else tile.MR  # rows per strip of A
        self._zeros = aligned_zeros(npan * NR, np.float32)  # stands for no bias / residual
        self._zeros_ptr = address(self._zeros)

    @property
    def nbytes(self) -> int:
        return self.panels.nbytes

    def matrix(self) -> np.ndarray:
        """The packed (K, N) matrix, exactly, as a new array (for a caller whose original
        was released)."""
        npan, K, NR = self.panels.shape
        return np.ascontiguousarray(
            self.panels.transpose(1, 0, 2).reshape(K, npan * NR)[:, :self.N])

    def run(self, A: np.ndarray, bias: np.ndarray | None = None,
            residual: np.ndarray | None = None, bounds=None, out: np.ndarray | None = None,
            threads: int = 1, logistic=None, gelu_after: str | None = None) -> np.ndarray:
        """clip(A @ B + bias + residual, *bounds) (then ``logistic``: _clip_block's, or
        ``gelu_after``: "gelu" or "fast_gelu", compiled/gelu.py's bits) as a new (M, N)
        float32 array (or into
        ``out``: unit column stride, rows any stride apart, e.g. a range of the columns of a
        wider matrix: a grouped convolution's group). A: (M, K) float32, rows any stride apart
        (else copied); ``bias``: (N,) float32; ``residual``: (M, N) float32 with unit column
        stride."""
        if A.ndim != 2 or A.shape[1] != self.K:
            raise ValueError(f"float GEMM: expected A of shape [M, {self.K}], got "
                             f"{list(A.shape)}")
        if A.dtype != np.float32:
            raise TypeError(f"float GEMM: expected float32 A, got {A.dtype}")
        M, N, K = A.shape[0], self.N, self.K
        if out is None:
            out = np.empty((M, N), np.float32)
        elif not _rows_out(out, (M, N)):
            raise ValueError(f"float GEMM: out must be a float32 {[M, N]} with rows of "
                             "contiguous floats")
        if residual is not None and (residual.shape != (M, N) or residual.dtype != np.float32):
            raise ValueError(f"float GEMM: residual must be float32 {[M, N]}, got "
                             f"{residual.dtype}{list(residual.shape)}")
        if M == 0 or N == 0:
            return out
        if K == 0:  # no products: the epilogue on zeros
            out.fill(0)
            if bias is not None:
                out += bias
            if residual is not None:
                out += residual
            if bounds is not None:
                np.clip(out, *bounds, out=out)
            if logistic is not None:
                _logistic_in_place(out, logistic)
            if gelu_after is not None:
                _gelu_flags(gelu_after)
                dense = np.ascontiguousarray(out)
                out[...] = gelu.bias_gelu(EPILOGUES[gelu_after], dense, out=dense)
            return out
        if A.strides[1] != 4 or A.strides[0] < 4 * K or A.strides[0] % 4:
            A = np.ascontiguousarray(A)
        lda = A.strides[0] // 4
        # absent bias / residual: a row of zeros, never a null pointer (a masked load on an
        # unmapped page costs a microcode assist of ~0.5 us on AMD, even with every lane off)
        b_ptr = r_ptr = self._zeros_ptr
        flags = ldr = 0
        if bias is not None:
            bias = np.ascontiguousarray(bias, np.float32).reshape(-1)
            if bias.size != N:
                raise ValueError(f"float GEMM: bias must have {N} values, got {bias.size}")
            b_ptr, flags = address(bias), 1
        if residual is not None:
            if residual.strides[1] != 4 or residual.strides[0] % 4 or \
                    residual.strides[0] < 4 * N:
                residual = np.ascontiguousarray(residual)
            r_ptr, ldr, flags = address(residual), residual.strides[0] // 4, flags | 2
        if gelu_after is not None:
            if logistic is not None:
                raise ValueError("float GEMM: a logistic and a gelu epilogue at once")
            flags |= _gelu_flags(gelu_after)
        return self._launch(address(A), lda, M, out, b_ptr, r_ptr, ldr, bounds, flags,
                            self.tile.KC, 0, threads, logistic=logistic)

    def run_shifted(self, base: np.ndarray, rows: int, lda: int, block: int, jump: int,
                    bias: np.ndarray | None = None, bounds=None, threads: int = 1,
                    out: np.ndarray | None = None, wrap: int | None = None,
                    wstep: int = 0, logistic=None) -> np.ndarray:
        """clip(A @ B + bias, *bounds) (then ``logistic``) as a new (rows, N) float32 array
        (or into ``out``, rows of contiguous floats any stride apart: a caller's buffer, no
        fresh pages per call, or a range of a Concat's channels), where A's element (m, k)
        is ``base[start(m) + k + (k // block) * jump]`` (``base``: contiguous float32, read
        in place), start(m) = m * lda, or with ``wrap``,
        (m // wrap) * wstep + (m % wrap) * lda: a convolution on its zero-padded input, rows
        of A the output pixels (wrap of them a row, lda = the stride times C channels-last,
        wstep = the vertical stride times the padded row), a K block a row of taps (block =
        kw * C, jump = the padded row minus the block). Raises ValueError where A would reach
        outside ``base``."""
        return self.prepared_shifted(rows, lda, block, jump, bias, bounds, threads, wrap,
                                     wstep, logistic)(base, out)

    def prepared_shifted(self, rows: int, lda: int, block: int, jump: int,
                         bias: np.ndarray | None = None, bounds=None, threads: int = 1,
                         wrap: int | None = None, wstep: int = 0,
                         logistic=None) -> PreparedShifted:
        """``run_shifted``'s product with its argument blocks built once: called with a
        ``base`` (and ``out``) for each run, it writes only their addresses (a convolution
        of one geometry, run after run: the checks and blocks cost ~8 us a call, ~3% of a
        YOLO-style 20 x 20 layer). Holds ``bias``."""
        K, N = self.K, self.N
        if rows <= 0 or lda <= 0 or block <= 0 or jump < 0 or K % block or \
                (wrap is not None and (wrap <= 0 or wstep < 0)):
            raise ValueError(f"float GEMM: bad shifted A (rows {rows}, lda {lda}, block "
                             f"{block}, K {K}, wrap {wrap})")
        if wrap is None:
            wrap, wstep, last = _NO_WRAP, 0, (rows - 1) * lda
        else:
            q, r = divmod(rows - 1, wrap)  # the last row, or the row before it wrapped
            last = max(q * wstep + r * lda, (q - 1) * wstep + (wrap - 1) * lda if q else 0)
        b_ptr, flags = self._zeros_ptr, 0
        if bias is not None:
            bias = np.ascontiguousarray(bias, np.float32).reshape(-1)
            if bias.size != N:
                raise ValueError(f"float GEMM: bias must have {N} values, got {bias.size}")
            b_ptr, flags = address(bias), 1
        clip, more = _clip_block(bounds, logistic)
        # K blocks of whole rows of taps, as near the tile's KC as they come: the sub-blocks
        # (rows of taps) of one K block run with the accumulators in registers (a K block per
        # row of taps made 3 passes over C for a 3x3 kernel, of 48 rows of K at 16 channels).
        # All of K in one block up to 3 KC (a few hundred KiB of B a panel, in L2): rows of
        # taps a little over KC / 2 made a block each, 3 passes over a 3x3 layer's output
        # (DBNet-style 96 -> 24 at 160 x 160, 288-float rows: 15.5 -> 13.6 ms; 128 -> 128 at
        # 20 x 20 1.09 -> 1.05 ms; no layer of YOLO's or VGG's sizes slower beyond the noise)
        kcb = K if self.one_k_block(shifted=True) else max(1, self.tile.KC // block) * block
        head = self._head(0, lda, 0, N, b_ptr, self._zeros_ptr, 0, address(clip),
                          flags | more, kcb, jump, block, wrap, wstep)
        ranges = self._ranges(rows, -(-N // self.NR), threads)
        blocks = np.array([head + list(r) for r in ranges], np.int64)
        return PreparedShifted(self, blocks, (bias, clip), last + K + (K // block - 1) * jump,
                               (rows, N), threads)

    def one_k_block(self, shifted: bool = False) -> bool:
        """Whether a product takes all of K in one block, so that its tiles are written once
        and never read back: K up to the tile's KC, or 3 KC for the shifted products
        (``prepared_shifted``: a convolution's rows of taps)."""
        return self.K <= (3 if shifted else 1) * self.tile.KC

    def _head(self, a_ptr: int, lda: int, out_ptr: int, ldc: int, b_ptr: int, r_ptr: int,
              ldr: int, clip_ptr: int, flags: int, kcb: int = 0, ajump: int = 0,
              blk: int = 0, wrap: int = _NO_WRAP, wstep: int = 0) -> list[int]:
        """The kernel's argument block up to its range (rows m0, m1, panels p0, p1): the
        one place that lays it out."""
        N, K = self.N, self.K
        return [a_ptr, lda, self._ptr, K, out_ptr, ldc, N, b_ptr, r_ptr, ldr, clip_ptr, flags,
                kcb or self.tile.KC, self._ncb, ajump, blk, -(-N // self.NR), K, N, N, wrap,
                wstep, self._ms]

    def _launch(self, a_ptr: int, lda: int, M: int, out: np.ndarray, b_ptr: int, r_ptr: int,
                ldr: int, bounds, flags: int, kcb: int, ajump: int, threads: int,
                sets: int = 1, blk: int = 0, wrap: int = _NO_WRAP,
                wstep: int = 0, logistic=None) -> np.ndarray:
        """One call of the kernel (or one per thread): ``sets`` products of this matrix's
        shape whose panels follow each other in memory (PackedGroups), set s reading A
        from column s * K and writing out's columns from s * N."""
        N = self.N
        clip, more = _clip_block(bounds, logistic)
        flags |= more
        snp = -(-N // self.NR)
        npan = sets * snp
        head = self._head(a_ptr, lda, address(out), out.strides[0] // 4, b_ptr, r_ptr, ldr,
                          address(clip), flags, kcb, ajump, blk, wrap, wstep)
        ranges = self._ranges(M, npan, threads, sets)
        params = np.array([head + list(r) for r in ranges], np.int64)  # alive through the calls
        if len(ranges) == 1:
            self._fn(address(params))
        else:
            spin.run_blocks(self._fn, params, threads)
        return out

    def _ranges(self, M: int, npan: int, threads: int,
                sets: int = 1) -> list[tuple[int, int, int, int]]:
        """(m0, m1, p0, p1): the rows and panels of each range of an (M, K) product over
        ``npan`` panels (of ``sets`` products: PackedGroups) on ``threads`` threads; one
        range for a product under two ranges of SPIN_MACS_PER_RANGE multiply-adds (it stays
        on the calling thread)."""
        MR = self._ms
        if threads <= 1 or M * npan <= MR:
            return [(0, M, 0, npan)]
        # several ranges a thread, taken in turn by the caller and spin.py's workers: one
        # still spinning from the previous product starts within a microsecond, one woken
        # late (or slowed by other processes) takes fewer. Each thread reads its share of the
        # bigger operand: B's panels where they outweigh A (a decoder's few rows), else
        # strips of A's rows, the whole rows of the output each (a convolution's pixels:
        # cut by panels, every thread read all of A, and wrote part of each output row's
        # cache lines, which the next node read back from both cores; ShuffleNet's grouped
        # 1x1 convolutions at 2 threads, quiet: 96 -> 88 us, MobileNetV2's 3136 x 24 x 144
        # 201 -> 182 us). Panels under two a thread still beat fewer strips (a few rows on
        # AVX-512's 64-column panels).
        strips = -(-M // MR)
        # (panels that do not divide evenly over the threads, where there are strips enough
        # to share out: strips, every thread reading all of B: 5 panels on 2 threads made 3
        # against 2, a 14 x 14 1x1 convolution's 196 x 320 x 320 231 -> 201 us)
        if npan * self.NR > M * sets and (npan >= 2 * threads or npan > strips) and \
                not (npan % threads and strips >= 4 * threads):
            return [(0, M, p0, p1) for p0, p1 in
                    work_ranges(npan, threads, M * self.K * self.NR, SPIN_MACS_PER_RANGE)]
        return [(s0 * MR, min(M, s1 * MR), 0, npan) for s0, s1 in
                work_ranges(strips, threads, MR * self.K * npan * self.NR,
                            SPIN_MACS_PER_RANGE)]

    def prepared(self, M: int, bias: np.ndarray | None = None, bounds=None,
                 threads: int = 1, lda: int | None = None,
                 gelu_after: str | None = None, logistic=None) -> PreparedProduct | None:
        """``run`` for A of one shape (M, K), C-contiguous, with this ``bias``, ``bounds``
        and ``gelu_after`` or ``logistic``, its argument block built once (a streaming
        model's small Gemm, an SE block's one-pixel convolution, called with one shape every
        time: run's checks and block cost several times its one-row product); None where
        that product would be split over threads, or is empty. ``lda``: A's rows that many
        floats apart instead (rows that overlap: a 1-D convolution's windows read in place);
        the caller checks A reaches (M - 1) * lda + K floats."""
        N, K = self.N, self.K
        if lda is not None and lda <= 0:
            raise ValueError(f"float GEMM: bad lda {lda}")
        snp = -(-N // self.NR)
        if M <= 0 or N == 0 or K == 0 or len(self._ranges(M, snp, threads)) > 1:
            return None
        if gelu_after is not None and logistic is not None:
            raise ValueError("float GEMM: a logistic and a gelu epilogue at once")
        clip, flags = _clip_block(bounds, logistic)
        keep = [clip]
        b_ptr = self._zeros_ptr
        if bias is not None:
            keep.append(np.ascontiguousarray(bias, np.float32).reshape(-1))
            if keep[-1].size != N:
                raise ValueError(f"float GEMM: bias must have {N} values, got {keep[-1].size}")
            b_ptr, flags = address(keep[-1]), flags | 1
        flags |= _gelu_flags(gelu_after)
        # run's block for one range (A's and out's addresses filled in at each call)
        block = np.array(self._head(0, K if lda is None else lda, 0, N, b_ptr, self._zeros_ptr,
                                    0, address(keep[0]), flags) + [0, M, 0, snp], np.int64)
        return PreparedProduct(self, (M, K), block, keep, _PTR_A, _PTR_OUT)

    def args(self, A: np.ndarray, out: np.ndarray) -> np.ndarray:
        """The kernel's argument block (int64) for out = A @ B on one thread, for a caller
        that runs many products as one job (``run_all``). A: (M, K) float32 with contiguous
        rows, ``out`` (M, N) float32 C-contiguous; both kept alive by the caller."""
        M, N, K = A.shape[0], self.N, self.K
        if A.shape != (M, K) or A.dtype != np.float32 or A.strides[1] != 4 or \
                A.strides[0] % 4 or A.strides[0] < 4 * K or out.shape != (M, N) or \
                out.dtype != np.float32 or not out.flags.c_contiguous:
            raise ValueError(f"float GEMM: bad operands {A.dtype}{list(A.shape)} -> "
                             f"{out.dtype}{list(out.shape)} for [{K}, {N}]")
        snp = -(-N // self.NR)
        return np.array(self._head(address(A), A.strides[0] // 4, address(out), N,
                                   self._zeros_ptr, self._zeros_ptr, 0, address(_NO_CLIP), 0)
                        + [0, M, 0, snp], np.int64)


class PreparedProduct:
    """``PackedMatrix.prepared``'s product: ``call(A)`` is ``run(A, bias, bounds)`` for a
    C-contiguous float32 A of ``shape`` (the caller checks it), into a new array: the same
    kernel call on the same block, so the same numbers."""

    __slots__ = ("shape", "_fn", "_block", "_keep", "_out", "_a", "_o")

    def __init__(self, packed: PackedMatrix, shape: tuple[int, int], block: np.ndarray,
                 keep: list[np.ndarray], a: int, o: int) -> None:
        self.shape, self._fn, self._block = shape, packed._fn, block
        self._keep = (packed, keep)  # the panels, clip bounds and bias the block points at
        self._out = (shape[0], packed.N)
        self._a, self._o = a, o  # where A's and out's addresses go in the block

    def __call__(self, A: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """``out``: written when it is a float32 array of the product's shape with rows of
        contiguous floats (any stride apart: a range of a Concat's channels)."""
        if out is None or not _rows_out(out, self._out):
            out = np.empty(self._out, np.float32)
        block = self._block.copy()  # a block per call: concurrent runs share the kernel
        block[self._a] = address(A)
        block[self._o] = address(out)
        block[_LDC] = out.strides[0] // 4
        self._fn(address(block))
        return out


class PreparedShifted:
    """``PackedMatrix.prepared_shifted``'s product: ``call(base, out=None)`` is run_shifted
    on the geometry it was made for, its argument blocks (one per range of the threads)
    copied per call with ``base``'s and ``out``'s addresses: concurrent runs share it."""

    __slots__ = ("_fn", "_blocks", "_keep", "_reach", "_out", "_threads")

    def __init__(self, packed: PackedMatrix, blocks: np.ndarray, keep: tuple, reach: int,
                 out_shape: tuple[int, int], threads: int) -> None:
        self._fn, self._blocks = packed._fn, blocks
        self._keep = (packed, keep)  # the panels, bias and clip block the blocks point at
        self._reach, self._out, self._threads = reach, out_shape, threads

    def __call__(self, base: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        if base.dtype != np.float32 or not base.flags.c_contiguous:
            raise TypeError("float GEMM: the shifted A must be contiguous float32")
        if self._reach > base.size:
            raise ValueError(f"float GEMM: the shifted A reads past its {base.size} floats")
        if out is None:
            out = np.empty(self._out, np.float32)
        elif not _rows_out(out, self._out):
            raise ValueError(f"float GEMM: out must be a float32 {list(self._out)} with rows "
                             "of contiguous floats")
        blocks = self._blocks.copy()
        blocks[:, _PTR_A] = address(base)
        blocks[:, _PTR_OUT] = address(out)
        blocks[:, _LDC] = out.strides[0] // 4
        if len(blocks) == 1:
            self._fn(address(blocks))
        else:
            spin.run_blocks(self._fn, blocks, self._threads)
        return out


class PreparedGroupedShifted:
    """A grouped convolution's shifted products (``grouped_shifted``), one per group, in one
    set of argument blocks: ``call(base, out)`` runs group g's product on A at ``base`` plus
    g * ``group_stride`` floats (its slab of a group-major padded input) into ``out``'s
    columns [g * N, (g + 1) * N) (rows ``ldc`` floats apart: the channels-last output of
    every group), the groups' ranges taken in turn by the threads."""

    __slots__ = ("_fn", "_blocks", "_a_off", "_o_off", "_keep", "_reach", "_out", "_threads")

    def __init__(self, packs: list[PackedMatrix], blocks: np.ndarray, a_off: np.ndarray,
                 o_off: np.ndarray, keep: list, reach: int, out_shape: tuple[int, int],
                 threads: int) -> None:
        self._fn, self._blocks, self._a_off, self._o_off = packs[0]._fn, blocks, a_off, o_off
        self._keep = (packs, keep)  # the panels, biases and clip blocks the blocks point at
        self._reach, self._out, self._threads = reach, out_shape, threads

    def __call__(self, base: np.ndarray, out: np.ndarray) -> np.ndarray:
        if base.dtype != np.float32 or not base.flags.c_contiguous:
            raise TypeError("float GEMM: the shifted A must be contiguous float32")
        if self._reach > base.size:
            raise ValueError(f"float GEMM: the shifted A reads past its {base.size} floats")
        if not _rows_out(out, self._out):
            raise ValueError(f"float GEMM: out must be a float32 {list(self._out)} with rows "
                             "of contiguous floats")
        blocks = self._blocks.copy()
        blocks[:, _PTR_A] = address(base) + self._a_off
        blocks[:, _PTR_OUT] = address(out) + self._o_off
        blocks[:, _LDC] = out.strides[0] // 4
        spin.run_blocks(self._fn, blocks, self._threads)
        return out


def grouped_shifted(packs: list[PackedMatrix], rows: int, lda: int, block: int, jump: int,
                    group_stride: int, bias: np.ndarray | None = None, bounds=None,
                    threads: int = 1, wrap: int | None = None, wstep: int = 0,
                    logistic=None) -> PreparedGroupedShifted:
    """``PackedMatrix.prepared_shifted`` for each of ``packs`` (a grouped convolution's
    weights, one (K, N) matrix per group, the same shape), group g reading its A from
    g * ``group_stride`` floats on and writing its N columns of an (rows, G * N) output;
    ``bias``: (G * N,) or None."""
    G, N = len(packs), packs[0].N
    if any(p.N != N or p.K != packs[0].K for p in packs):
        raise ValueError("float GEMM: the groups' matrices differ in shape")
    if bias is not None:
        bias = np.ascontiguousarray(bias, np.float32).reshape(-1)
        if bias.size != G * N:
            raise ValueError(f"float GEMM: bias must have {G * N} values, got {bias.size}")
    parts, keep, a_off, o_off, reach = [], [], [], [], 0
    for g, pk in enumerate(packs):
        one = pk.prepared_shifted(rows, lda, block, jump,
                                  None if bias is None else bias[g * N:(g + 1) * N], bounds,
                                  threads, wrap, wstep, logistic)
        blocks = one._blocks.copy()
        blocks[:, _LDC] = G * N
        parts.append(blocks)
        keep.append(one)
        a_off += [4 * g * group_stride] * len(blocks)
        o_off += [4 * g * N] * len(blocks)
        reach = max(reach, g * group_stride + one._reach)
    return PreparedGroupedShifted(packs, np.concatenate(parts), np.array(a_off, np.int64),
                                  np.array(o_off, np.int64), keep, reach, (rows, G * N),
                                  threads)


def run_all(packed: list[PackedMatrix], As, outs, threads: int = 1) -> None:
    """outs[i] = As[i] @ packed[i] for every i, the products split over ``threads`` threads
    (spin.py's workers), each product whole on one thread: the same numbers as one by one.
    Empty products (M, N or K of 0) are run alone."""
    blocks = [p.args(a, o) for p, a, o in zip(packed, As, outs, strict=True)
              if a.shape[0] and p.N and p.K]
    if len(blocks) < len(packed):
        for p, a, o in zip(packed, As, outs, strict=True):
            if not (a.shape[0] and p.N and p.K):
                p.run(a, out=o)
    if blocks:
        # the small-work threshold as for one product: a part of >= SPIN_MACS_PER_RANGE
        macs = sum(a.shape[0] * p.K * p.N for p, a in zip(packed, As, strict=True))
        if len(work_ranges(len(blocks), threads, macs // len(blocks), SPIN_MACS_PER_RANGE)) == 1:
            threads = 1
        spin.run_blocks(packed[0]._fn, np.stack(blocks), threads)




class PackedGroups:
    """A grouped product's g constant (K, N) float32 matrices (a grouped 1x1 convolution's
    weights, one per group) in one buffer of panels: ``run`` computes group i's columns
    [i*N, (i+1)*N) of the (M, g*N) result from A's columns [i*K, (i+1)*K), all groups in one
    call of the kernel (the panels of every group split over the threads). Raises
    ``jit.Unavailable`` where the kernel cannot run here."""

    __slots__ = ("g", "K", "N", "first", "_zeros", "_zeros_ptr")

    def __init__(self, Bs: np.ndarray, tile: Tile | None = None) -> None:
        if Bs.ndim != 3:
            raise ValueError(f"PackedGroups: expected (groups, K, N), got {list(Bs.shape)}")
        self.g, self.K, self.N = Bs.shape
        self.first = PackedMatrix.stack(Bs, tile)[0]  # its panels: the start of the buffer
        self._zeros = aligned_zeros(self.g * self.first.panels.shape[0] * self.first.NR,
                                    np.float32)  # no bias / residual, for every group
        self._zeros_ptr = address(self._zeros)

    @property
    def nbytes(self) -> int:
        return self.first.panels.base.nbytes if self.first.panels.base is not None \
            else self.first.panels.nbytes

    def run(self, A: np.ndarray, bias: np.ndarray | None = None, bounds=None,
            threads: int = 1, out: np.ndarray | None = None,
            residual: np.ndarray | None = None, logistic=None) -> np.ndarray:
        """clip(group products + bias + residual, *bounds) (then ``logistic``) as a new
        (M, g*N) float32 array,
        or into ``out`` (rows of contiguous floats, any stride apart: the executor's buffer,
        no fresh pages per call, or a range of a Concat's channels).
        A: (M, g*K) float32 with contiguous rows (channels-last pixels); ``bias``: (g*N,);
        ``residual``: (M, g*N) float32 with contiguous rows (a FusedConv's Z)."""
        g, K, N = self.g, self.K, self.N
        if A.ndim != 2 or A.shape[1] != g * K or A.dtype != np.float32:
            raise ValueError(f"grouped float GEMM: expected float32 A of shape [M, {g * K}], "
                             f"got {A.dtype}{list(A.shape)}")
        if A.strides[1] != 4 or A.strides[0] % 4 or A.strides[0] < 4 * g * K:
            A = np.ascontiguousarray(A)
        if out is None:
            out = np.empty((A.shape[0], g * N), np.float32)
        elif not _rows_out(out, (A.shape[0], g * N)):
            raise ValueError(f"grouped float GEMM: out must be a float32 "
                             f"{[A.shape[0], g * N]} with rows of contiguous floats")
        if out.size == 0:
            return out
        b_ptr, flags = self._zeros_ptr, 0
        if bias is not None:
            bias = np.ascontiguousarray(bias, np.float32).reshape(-1)
            if bias.size != g * N:
                raise ValueError(f"grouped float GEMM: bias must have {g * N} values, got "
                                 f"{bias.size}")
            b_ptr, flags = address(bias), 1
        r_ptr, ldr = self._zeros_ptr, 0
        if residual is not None:
            if residual.shape != out.shape or residual.dtype != np.float32:
                raise ValueError(f"grouped float GEMM: residual must be float32 "
                                 f"{list(out.shape)}, got {residual.dtype}"
                                 f"{list(residual.shape)}")
            if residual.strides[1] != 4 or residual.strides[0] % 4 or \
                    residual.strides[0] < 4 * g * N:
                residual = np.ascontiguousarray(residual)
            r_ptr, ldr, flags = address(residual), residual.strides[0] // 4, flags | 2
        return self.first._launch(address(A), A.strides[0] // 4, A.shape[0], out, b_ptr,
                                  r_ptr, ldr, bounds, flags, self.first.tile.KC, 0, threads,
                                  sets=g, logistic=logistic)


# compiled with the other kernels on first use (jit._BUNDLE)
BUNDLE = {"float_gemm": (module_ir, ())}

__all__ = ["AVX2_TILE", "AVX512_TILE", "BUNDLE", "PackedGroups", "PackedMatrix",
           "PreparedGroupedShifted", "Tile", "grouped_shifted", "module_ir", "pack",
           "pack_groups", "pack_stack", "tile_for", "tile_ir", "unavailable"]
