"""Pieces of LLVM IR text the kernel generators share: vector types, intrinsic declarations,
broadcasts, lane masks and the MLAS requantization epilogue.

Each helper returns lines (strings, two-space indented) that define the SSA names it is given,
so a generator reads as the sequence of operations it emits.
"""

from __future__ import annotations

V = "<16 x i32>"
VF = "<16 x float>"
VB = "<16 x i8>"
IOTA = "<" + ", ".join(f"i32 {i}" for i in range(16)) + ">"

_DECLARATIONS = {
    "vpdpbusd": f"declare {V} @llvm.x86.avx512.vpdpbusd.512({V}, {V}, {V})",
    "load.i8": f"declare {VB} @llvm.masked.load.v16i8.p0(ptr, i32, <16 x i1>, {VB})",
    "store.i8": f"declare void @llvm.masked.store.v16i8.p0({VB}, ptr, i32, <16 x i1>)",
    "store.i32": f"declare void @llvm.masked.store.v16i32.p0({V}, ptr, i32, <16 x i1>)",
    "store.f32": f"declare void @llvm.masked.store.v16f32.p0({VF}, ptr, i32, <16 x i1>)",
    "load.f32": f"declare {VF} @llvm.masked.load.v16f32.p0(ptr, i32, <16 x i1>, {VF})",
    "fma": f"declare {VF} @llvm.fma.v16f32({VF}, {VF}, {VF})",
    "rint": f"declare {VF} @llvm.rint.v16f32({VF})",
    "minnum": f"declare {VF} @llvm.minnum.v16f32({VF}, {VF})",
    "maxnum": f"declare {VF} @llvm.maxnum.v16f32({VF}, {VF})",
}


def declarations(*names: str) -> list[str]:
    """The declarations of the named intrinsics (keys of ``_DECLARATIONS``)."""
    return [_DECLARATIONS[n] for n in names]


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


def load_params(pointer: str, names: tuple[str, ...]) -> list[str]:
    """Each of ``names`` (without %) = the float at its index behind ``pointer``, broadcast."""
    lines = []
    for i, name in enumerate(names):
        lines += [f"  %{name}.p = getelementptr float, ptr {pointer}, i64 {i}",
                  f"  %{name}.f = load float, ptr %{name}.p, align 4",
                  *splat(f"%{name}", f"%{name}.f")]
    return lines


__all__ = ["IOTA", "V", "VB", "VF", "declarations", "lane_mask", "load_params", "requantize",
           "splat"]
