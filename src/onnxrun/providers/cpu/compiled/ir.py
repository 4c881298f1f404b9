"""Pieces of LLVM IR text the kernel generators share: vector types, intrinsic declarations,
broadcasts, lane masks, loop latches and the MLAS requantization epilogue.

Each helper returns lines (strings, two-space indented) that define the SSA names it is given,
so a generator reads as the sequence of operations it emits.
"""

from __future__ import annotations

import numpy as np

V = "<16 x i32>"
VF = "<16 x float>"
VB = "<16 x i8>"
IOTA = "<" + ", ".join(f"i32 {i}" for i in range(16)) + ">"

_DECLARATIONS = {
    "vpdpbusd": f"declare {V} @llvm.x86.avx512.vpdpbusd.512({V}, {V}, {V})",
    "vpdpbusd.256": "declare <8 x i32> @llvm.x86.avx512.vpdpbusd.256(<8 x i32>, <8 x i32>, "
                    "<8 x i32>)",
    "pmaddwd.512": "declare <16 x i32> @llvm.x86.avx512.pmaddw.d.512(<32 x i16>, <32 x i16>)",
    "pmaddwd.256": "declare <8 x i32> @llvm.x86.avx2.pmadd.wd(<16 x i16>, <16 x i16>)",
    "load.i8": f"declare {VB} @llvm.masked.load.v16i8.p0(ptr, i32, <16 x i1>, {VB})",
    "store.i8": f"declare void @llvm.masked.store.v16i8.p0({VB}, ptr, i32, <16 x i1>)",
    "store.i32": f"declare void @llvm.masked.store.v16i32.p0({V}, ptr, i32, <16 x i1>)",
    "store.f32": f"declare void @llvm.masked.store.v16f32.p0({VF}, ptr, i32, <16 x i1>)",
    "load.f32": f"declare {VF} @llvm.masked.load.v16f32.p0(ptr, i32, <16 x i1>, {VF})",
    "fma": f"declare {VF} @llvm.fma.v16f32({VF}, {VF}, {VF})",
    "rint": f"declare {VF} @llvm.rint.v16f32({VF})",
    "minnum": f"declare {VF} @llvm.minnum.v16f32({VF}, {VF})",
    "maxnum": f"declare {VF} @llvm.maxnum.v16f32({VF}, {VF})",
    "fabs": f"declare {VF} @llvm.fabs.v16f32({VF})",
    "copysign": f"declare {VF} @llvm.copysign.v16f32({VF}, {VF})",
}


def declarations(*names: str) -> list[str]:
    """The declarations of the named intrinsics (keys of ``_DECLARATIONS``)."""
    return [_DECLARATIONS[n] for n in names]


def dot_declarations(target) -> list[str]:
    """The declarations ``dot_u8s8`` needs on ``target``."""
    if target.has("avx512vnni"):
        return declarations("vpdpbusd")
    if target.has("avxvnni"):
        return declarations("vpdpbusd.256")
    return declarations("pmaddwd.512" if target.lanes == 16 else "pmaddwd.256")


def _lanes(first: int, count: int, step: int = 1) -> str:
    return "<" + ", ".join(f"i32 {first + step * i}" for i in range(count)) + ">"


def vnni(target) -> bool:
    """Whether ``target`` multiplies bytes with vpdpbusd (else with vpmaddwd on 16-bit pairs):
    it decides the order of the bytes in a packed 8-bit operand (``dot_u8s8``)."""
    return target.has("avx512vnni") or target.has("avxvnni")


def dot_u8s8(target, out: str, acc: str, a: str, b: str) -> list[str]:
    """``out`` = ``acc`` + sum over k < 4 of a[k] * b[k, j] in each of the 16 int32 lanes j,
    exactly: ``a`` holds 4 unsigned bytes (the same in every lane of its ``<16 x i32>``),
    ``b`` 64 signed bytes, 16 columns x 4 k, in the target's order: ``[16 columns][4 k]``
    with VNNI (vpdpbusd: AVX-512 VNNI's, or AVX-VNNI's 256-bit form on each half), else
    ``[2 pairs of k][16 columns][2 k]``: bytes widened to 16 bits and vpmaddwd, whose pair
    sums (at most 2 * 255 * 128) are exact where onnxruntime's AVX2 vpmaddubsw saturates."""
    t = out + "."
    if target.has("avx512vnni"):
        return [f"  {out} = call {V} @llvm.x86.avx512.vpdpbusd.512({V} {acc}, {V} {a}, {V} {b})"]
    if target.has("avxvnni"):
        L = []
        for h in range(2):
            L += [f"  {t}{x}{h} = shufflevector {V} {v}, {V} poison, <8 x i32> {_lanes(8 * h, 8)}"
                  for x, v in (("c", acc), ("a", a), ("b", b))]
            L.append(f"  {t}d{h} = call <8 x i32> @llvm.x86.avx512.vpdpbusd.256(<8 x i32> "
                     f"{t}c{h}, <8 x i32> {t}a{h}, <8 x i32> {t}b{h})")
        return L + [f"  {out} = shufflevector <8 x i32> {t}d0, <8 x i32> {t}d1, {V} "
                    f"{_lanes(0, 16)}"]
    w = 2 * target.lanes  # 16-bit lanes of one register
    fn = "@llvm.x86.avx512.pmaddw.d.512" if target.lanes == 16 else "@llvm.x86.avx2.pmadd.wd"
    vw, vr = f"<{w} x i16>", f"<{w // 2} x i32>"
    L = [f"  {t}a8 = bitcast {V} {a} to <64 x i8>",
         f"  {t}a4 = shufflevector <64 x i8> {t}a8, <64 x i8> poison, <4 x i32> {_lanes(0, 4)}",
         f"  {t}aw = zext <4 x i8> {t}a4 to <4 x i16>",
         f"  {t}b8 = bitcast {V} {b} to <64 x i8>",
         f"  {t}bw = sext <64 x i8> {t}b8 to <64 x i16>"]
    sums = []
    for h in range(16 // (w // 2)):  # registers of columns: 1 (512-bit) or 2 (256-bit)
        terms = []
        for pair in range(2):  # k = 0, 1 then 2, 3: columns' bytes at 32 * pair + 2j
            ap = f"{t}ap{pair}"
            if h == 0:
                pattern = ", ".join(f"i32 {2 * pair + i % 2}" for i in range(w))
                L.append(f"  {ap} = shufflevector <4 x i16> {t}aw, <4 x i16> poison, "
                         f"<{w} x i32> <{pattern}>")
            L += [f"  {t}b{h}{pair} = shufflevector <64 x i16> {t}bw, <64 x i16> poison, "
                  f"<{w} x i32> {_lanes(32 * pair + w * h, w)}",
                  f"  {t}p{h}{pair} = call {vr} {fn}({vw} {ap}, {vw} {t}b{h}{pair})"]
            terms.append(f"{t}p{h}{pair}")
        L.append(f"  {t}s{h} = add {vr} {terms[0]}, {terms[1]}")
        sums.append(f"{t}s{h}")
    if len(sums) == 2:
        L.append(f"  {t}s = shufflevector {vr} {sums[0]}, {vr} {sums[1]}, {V} {_lanes(0, 16)}")
    else:
        L.append(f"  {t}s = add {V} {sums[0]}, zeroinitializer")
    return L + [f"  {out} = add {V} {acc}, {t}s"]


def latch(var: str, step, flag: str, stop: str, loop: str, exit_: str,
          pred: str = "slt") -> list[str]:
    """The back edge of a counted loop: %{var}.next = %{var} + step, then on to block ``loop``
    while it is below ``stop`` (signed; ``pred="ult"``: unsigned), else to ``exit_``."""
    return [f"  %{var}.next = add i64 %{var}, {step}",
            f"  %{flag} = icmp {pred} i64 %{var}.next, {stop}",
            f"  br i1 %{flag}, label %{loop}, label %{exit_}"]


def hsum(v: str, out: str, op: str = "fadd") -> list[str]:
    """%{out} (float) = the 16 lanes of %{v} combined by ``op`` ("fadd", or "max": the larger
    of each pair, NaN lanes not kept) as a tree: lanes i and i + 8, then i and i + 4, pairs,
    the last two. One order for every kernel that sums a row in 16 lanes (softmax, the layer
    norms, the attention heads): their results depend on it."""
    L, cur, width = [], v, 16
    while width > 1:
        half = width // 2
        ty, hty = f"<{width} x float>", f"<{half} x float>"
        L += [f"  {out}.l{half} = shufflevector {ty} {cur}, {ty} poison, <{half} x i32> "
              f"{_lanes(0, half)}",
              f"  {out}.h{half} = shufflevector {ty} {cur}, {ty} poison, <{half} x i32> "
              f"{_lanes(half, half)}"]
        if op == "fadd":
            L.append(f"  {out}.s{half} = fadd {hty} {out}.l{half}, {out}.h{half}")
        else:
            L += [f"  {out}.g{half} = fcmp ogt {hty} {out}.h{half}, {out}.l{half}",
                  f"  {out}.s{half} = select <{half} x i1> {out}.g{half}, {hty} "
                  f"{out}.h{half}, {hty} {out}.l{half}"]
        cur, width = f"{out}.s{half}", half
    return L + [f"  {out} = extractelement <1 x float> {cur}, i64 0"]


def splat(name: str, scalar: str, vector: str = VF) -> list[str]:
    """``name`` = ``scalar`` in all 16 lanes of ``vector``."""
    elem = vector[vector.index("x ") + 2:-1]
    return [f"  {name}.s = insertelement {vector} poison, {elem} {scalar}, i64 0",
            f"  {name} = shufflevector {vector} {name}.s, {vector} poison, {V} zeroinitializer"]


def lane_mask(name: str, count: str, offset: int = 0) -> list[str]:
    """``name``: lanes whose index + ``offset`` is below the i64 ``count`` (a partial chunk)."""
    iota = IOTA if offset == 0 else \
        "<" + ", ".join(f"i32 {i + offset}" for i in range(16)) + ">"
    return [f"  {name}.n = trunc i64 {count} to i32",
            *splat(f"{name}.v", f"{name}.n", V),
            f"  {name} = icmp slt {V} {iota}, {name}.v"]


def requantize(result: str, value: str, zero_point: str, lo: str, hi: str) -> list[str]:
    """``result`` (16 bytes) = clamp(rint(``value``) + zero point, lo, hi), the float vectors
    given; maxnum(NaN, lo) = lo, so NaN never reaches the conversion."""
    t = result + "."
    return [f"  {t}r = call {VF} @llvm.rint.v16f32({VF} {value})",
            f"  {t}z = fadd {VF} {t}r, {zero_point}",
            f"  {t}l = call {VF} @llvm.maxnum.v16f32({VF} {t}z, {VF} {lo})",
            f"  {t}h = call {VF} @llvm.minnum.v16f32({VF} {t}l, {VF} {hi})",
            f"  {t}i = fptosi {VF} {t}h to {V}",
            f"  {result} = trunc {V} {t}i to {VB}"]


def tap_weights(T: int, align: int) -> list[str]:
    """``%w0``..``%w{T-1}``: the depthwise kernels' T tap weight vectors of the channel chunk
    ``%c0``, row t of the float32 weights ``%W`` (rows ``%Cp`` floats apart)."""
    lines = []
    for t in range(T):
        lines += [f"  %wr{t} = mul i64 {t}, %Cp",
                  f"  %wx{t} = add i64 %wr{t}, %c0",
                  f"  %wp{t} = getelementptr float, ptr %W, i64 %wx{t}",
                  f"  %w{t} = load {VF}, ptr %wp{t}, align {align}"]
    return lines


def chunk_and_row_loop_end() -> list[str]:
    """The end of the depthwise kernels' loops: the next 16-channel chunk (``%c0`` of
    ``%C``, back to ``%cloop``), else the next output row (``%r`` up to ``%r1``, back to
    ``%rloop``), else return."""
    return ["  %c0n = add i64 %c0, 16",
            "  %cmore = icmp slt i64 %c0n, %C",
            "  br i1 %cmore, label %cloop, label %rnext",
            *row_loop_end("%rloop")]


def row_loop_end(back: str) -> list[str]:
    """Block ``rnext``: the next row (``%r`` up to ``%r1``, back to label ``back``), else
    block ``end``: return; then the function's closing brace."""
    return ["rnext:",
            "  %rn = add i64 %r, 1",
            "  %rmore = icmp slt i64 %rn, %r1",
            f"  br i1 %rmore, label {back}, label %end",
            "end:",
            "  ret void",
            "}"]


def job(name: str, fn: str, types: tuple[str, ...]) -> list[str]:
    """``void @name(ptr %args)``: ``@fn`` called with its arguments (LLVM ``types``, ptr or
    i64) read from the i64 words of ``args``: a job for spin.run_blocks, which hands out one
    argument block per call."""
    lines = [f"define void @{name}(ptr %args) nounwind {{", "entry:"]
    for i, ty in enumerate(types):
        lines += [f"  %a{i}.p = getelementptr i64, ptr %args, i64 {i}",
                  f"  %a{i} = load {ty}, ptr %a{i}.p, align 8"]
    call = ", ".join(f"{ty} %a{i}" for i, ty in enumerate(types))
    return lines + [f"  call void @{fn}({call})", "  ret void", "}"]


def load_params(pointer: str, names: tuple[str, ...]) -> list[str]:
    """Each of ``names`` (without %) = the float at its index behind ``pointer``, broadcast."""
    lines = []
    for i, name in enumerate(names):
        lines += [f"  %{name}.p = getelementptr float, ptr {pointer}, i64 {i}",
                  f"  %{name}.f = load float, ptr %{name}.p, align 4",
                  *splat(f"%{name}", f"%{name}.f")]
    return lines


def float_constant(x: float) -> str:
    """A float32 constant as LLVM writes it (the double whose value it is, in hex)."""
    import struct

    bits = struct.unpack("<Q", struct.pack("<d", float(np.float32(x))))[0]
    return f"0x{bits:016X}"


def _vconst(x: float) -> str:
    return "<" + ", ".join([f"float {float_constant(x)}"] * 16) + ">"


def tanh_function() -> list[str]:
    """``@tanh16(<16 x float>)``, an internal function: tanh to ~2 ulp, as numpy's float32 tanh
    (which the numpy paths call), odd (-0.0 stays -0.0), NaN in NaN out.

    tanh|x| = e / (e + 2) with e = expm1(2|x|) = 2^n (q + 1) - 1, where 2|x| = n ln2 + r,
    |r| <= ln2/2 and q = expm1(r) by its Taylor series to r^8 (relative error < 1e-9):
    exact near 0, no cancellation. 2|x| is capped at 40, where tanh is 1 in float32.
    """
    taylor = [1 / 40320, 1 / 5040, 1 / 720, 1 / 120, 1 / 24, 1 / 6, 1 / 2, 1.0]
    L = ["define internal <16 x float> @tanh16(<16 x float> %x) alwaysinline nounwind {",
         "entry:",
         f"  %ax = call {VF} @llvm.fabs.v16f32({VF} %x)",
         f"  %y0 = fadd {VF} %ax, %ax",
         f"  %y = call {VF} @llvm.minnum.v16f32({VF} %y0, {VF} {_vconst(40.0)})",
         f"  %nl = fmul {VF} %y, {_vconst(1.4426950408889634)}",
         f"  %n = call {VF} @llvm.rint.v16f32({VF} %nl)",
         # Cody-Waite: n * ln2_hi is exact (ln2_hi has 12 trailing zero bits, n < 64)
         f"  %nn = fneg {VF} %n",
         f"  %r0 = call {VF} @llvm.fma.v16f32({VF} %nn, {VF} {_vconst(0.693145751953125)}, "
         f"{VF} %y)",
         f"  %r = call {VF} @llvm.fma.v16f32({VF} %nn, {VF} {_vconst(1.428606765330187e-06)}, "
         f"{VF} %r0)",
         f"  %p0 = fmul {VF} %r, {_vconst(taylor[0])}"]
    prev = "%p0"
    for k, coef in enumerate(taylor[1:], 1):  # Horner: q = r (1 + r (1/2 + r (1/6 + ...)))
        L += [f"  %p{k}a = fadd {VF} {prev}, {_vconst(coef)}",
              f"  %p{k} = fmul {VF} %p{k}a, %r"]
        prev = f"%p{k}"
    L += [f"  %ni = fptosi {VF} %n to {V}",  # 2^n from its exponent bits, exactly
          f"  %eb = add {V} %ni, " + "<" + ", ".join(["i32 127"] * 16) + ">",
          f"  %es = shl {V} %eb, " + "<" + ", ".join(["i32 23"] * 16) + ">",
          f"  %pw = bitcast {V} %es to {VF}",
          f"  %pm1 = fsub {VF} %pw, {_vconst(1.0)}",
          f"  %e = call {VF} @llvm.fma.v16f32({VF} %pw, {VF} {prev}, {VF} %pm1)",
          f"  %d = fadd {VF} %e, {_vconst(2.0)}",
          f"  %t = fdiv {VF} %e, %d",
          f"  %s = call {VF} @llvm.copysign.v16f32({VF} %t, {VF} %x)",
          f"  %nan = fcmp uno {VF} %x, zeroinitializer",
          f"  %res = select <16 x i1> %nan, {VF} %x, {VF} %s",
          f"  ret {VF} %res",
          "}"]
    return L


__all__ = ["IOTA", "V", "VB", "VF", "chunk_and_row_loop_end", "declarations", "dot_declarations",
           "dot_u8s8", "float_constant", "lane_mask", "latch", "load_params", "requantize", "splat",
           "tanh_function", "tap_weights", "vnni"]
