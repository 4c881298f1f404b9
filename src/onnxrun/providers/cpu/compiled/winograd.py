"""Winograd F(2x2, 3x3)'s input and output transforms (``ops.conv._winograd_3x3``) in one
compiled pass each, split over tile rows on spin.py's workers.

Why: on the numpy path each transform is eight to sixteen passes of sums and differences over
strided slices (with a temporary between the row and column halves), on the calling thread
only: ~15% of VGG-19's run at 1 thread, all of it left on one thread at 2 while the 16 products
between them split. Here a tile's 16 vectors of 16 channels stay in registers from load to
store, and ranges of tile rows go to the workers that ran the product before.

The operations are the numpy path's (``ops.conv._winograd_input`` / ``_winograd_output``), in
the same order and without fast-math, so the results are the same bits.

``wino_in`` (words: P, V, Wp, C, nt, tw, N, t0, Hp, q0, q1): for the band of ``nt`` tile rows
from tile row t0, rows q in [q0, q1) of the (image, tile row) index, V[k, q, t, c] = (B^T d
B)[k] of the 4x4 window of the zero-padded channels-last input P (N, Hp, Wp, C) at padded
row 2 (t0 + q % nt), column 2t. ``wino_out`` (words: Mm, Y, bias, has_bias, M, nt, tw, N, t0,
Ho2, q0, q1): Y (N, Ho2, 2 tw, M) rows 2 (t0 + r) + a, columns 2t + b = (A^T m A)[a, b] (+
bias) of the 16 products Mm[k, q, t, m].
"""

from __future__ import annotations

import ctypes

import numpy as np

from ..parallel import work_ranges
from . import ir, jit, spin
from .jit import address

REQUIRES = ()
_VF = ir.VF
# floats written per range on the intra-op threads at least (~30-60 us of one core's work):
# a band smaller than two of them stays on the calling thread
RANGE_FLOATS = 1 << 16


def _load(dst: str, ptr: str, masked: bool) -> str:
    if masked:
        return (f"  {dst} = call {_VF} @llvm.masked.load.v16f32.p0(ptr {ptr}, i32 4, "
                f"<16 x i1> %mask, {_VF} zeroinitializer)")
    return f"  {dst} = load {_VF}, ptr {ptr}, align 4"


def _store(value: str, ptr: str, masked: bool) -> str:
    if masked:  # only a row's last, partial chunk: a masked store is microcoded on AMD
        return (f"  call void @llvm.masked.store.v16f32.p0({_VF} {value}, ptr {ptr}, i32 4, "
                "<16 x i1> %mask)")
    return f"  store {_VF} {value}, ptr {ptr}, align 4"


def _words(names: tuple[str, ...], pointers: int) -> list[str]:
    """%name = word i of %args (the first ``pointers`` of them pointers)."""
    lines = []
    for i, name in enumerate(names):
        ty = "ptr" if i < pointers else "i64"
        lines += [f"  %{name}.p = getelementptr i64, ptr %args, i64 {i}",
                  f"  %{name} = load {ty}, ptr %{name}.p, align 8"]
    return lines


def _chunks(body) -> list[str]:
    """The channel loop (``%c`` of ``%width`` in 16s) around ``body(suffix, masked)``: whole
    chunks unmasked, the last partial one masked; back to ``%tnext`` when done."""
    return ["  br label %cloop",
            "cloop:",
            "  %c = phi i64 [0, %tloop], [%cn, %cnext]",
            "  %left = sub i64 %width, %c",
            "  %whole = icmp sge i64 %left, 16",
            "  br i1 %whole, label %full, label %part",
            "full:", *body("f", False), "  br label %cnext",
            "part:", *ir.lane_mask("%mask", "%left"), *body("m", True), "  br label %cnext",
            "cnext:",
            "  %cn = add i64 %c, 16",
            "  %cmore = icmp slt i64 %cn, %width",
            "  br i1 %cmore, label %cloop, label %tnext"]


def _tile_loops(name: str, words: tuple[str, ...], pointers: int, per_row: list[str],
                per_tile: list[str], body) -> list[str]:
    """``@name(ptr %args)``: for q in [q0, q1) (``per_row`` with %q, %n, %r), for t in
    [0, tw) (``per_tile`` with %t), the channel chunks of ``body``."""
    return [f"define void @{name}(ptr %args) nounwind {{", "entry:",
            *_words(words, pointers),
            "  %any = icmp slt i64 %q0, %q1",
            "  %anyc = icmp sgt i64 %width, 0",
            "  %anyt = icmp sgt i64 %tw, 0",
            "  %go1 = and i1 %any, %anyc",
            "  %go = and i1 %go1, %anyt",
            "  br i1 %go, label %qloop, label %end",
            "qloop:",
            "  %q = phi i64 [%q0, %entry], [%qn, %qnext]",
            "  %n = udiv i64 %q, %nt",
            "  %r = urem i64 %q, %nt",
            *per_row,
            "  br label %tloop",
            "tloop:",
            "  %t = phi i64 [0, %qloop], [%tn, %tnext]",
            *per_tile,
            *_chunks(body),
            "tnext:",
            "  %tn = add i64 %t, 1",
            "  %tmore = icmp slt i64 %tn, %tw",
            "  br i1 %tmore, label %tloop, label %qnext",
            "qnext:",
            "  %qn = add i64 %q, 1",
            "  %qmore = icmp slt i64 %qn, %q1",
            "  br i1 %qmore, label %qloop, label %end",
            "end:",
            "  ret void",
            "}"]


def _input_ir() -> list[str]:
    words = ("P", "V", "Wp", "width", "nt", "tw", "N", "t0", "Hp", "q0", "q1")
    per_row = ["  %tr = add i64 %t0, %r",
               "  %h = shl i64 %tr, 1",  # the window's first padded row
               "  %nh = mul i64 %n, %Hp",
               "  %hh = add i64 %nh, %h",
               "  %rowf = mul i64 %Wp, %width",  # floats per padded row
               "  %prow = mul i64 %hh, %rowf",
               "  %vq0 = mul i64 %q, %tw",
               "  %ks0 = mul i64 %N, %nt",
               "  %ks1 = mul i64 %ks0, %tw",
               "  %ks = mul i64 %ks1, %width"]  # floats per product's operand
    per_tile = ["  %w2 = shl i64 %t, 1",
                "  %wc = mul i64 %w2, %width",
                "  %pt = add i64 %prow, %wc",
                "  %vq = add i64 %vq0, %t",
                "  %vt = mul i64 %vq, %width"]
    for i in range(4):
        for j in range(4):
            per_tile += [f"  %ri{i}{j} = mul i64 %rowf, {i}",
                         f"  %ci{i}{j} = mul i64 %width, {j}",
                         f"  %oi{i}{j}a = add i64 %ri{i}{j}, %ci{i}{j}",
                         f"  %oi{i}{j} = add i64 %pt, %oi{i}{j}a"]
    for k in range(16):
        per_tile += [f"  %ko{k}a = mul i64 %ks, {k}", f"  %ko{k} = add i64 %ko{k}a, %vt"]

    def body(s: str, masked: bool) -> list[str]:
        L = []
        for i in range(4):
            for j in range(4):
                L += [f"  %a{i}{j}{s} = add i64 %oi{i}{j}, %c",
                      f"  %p{i}{j}{s} = getelementptr float, ptr %P, i64 %a{i}{j}{s}",
                      _load(f"%d{i}{j}{s}", f"%p{i}{j}{s}", masked)]
        for j in range(4):  # rows: B^T d, as _winograd_input's R
            L += [f"  %R0{j}{s} = fsub {_VF} %d0{j}{s}, %d2{j}{s}",
                  f"  %R1{j}{s} = fadd {_VF} %d1{j}{s}, %d2{j}{s}",
                  f"  %R2{j}{s} = fsub {_VF} %d2{j}{s}, %d1{j}{s}",
                  f"  %R3{j}{s} = fsub {_VF} %d1{j}{s}, %d3{j}{s}"]
        for a in range(4):  # columns: (B^T d) B into the 16 operands
            vals = [f"fsub {_VF} %R{a}0{s}, %R{a}2{s}", f"fadd {_VF} %R{a}1{s}, %R{a}2{s}",
                    f"fsub {_VF} %R{a}2{s}, %R{a}1{s}", f"fsub {_VF} %R{a}1{s}, %R{a}3{s}"]
            for b, val in enumerate(vals):
                k = 4 * a + b
                L += [f"  %v{k}{s} = {val}",
                      f"  %vo{k}{s} = add i64 %ko{k}, %c",
                      f"  %vp{k}{s} = getelementptr float, ptr %V, i64 %vo{k}{s}",
                      _store(f"%v{k}{s}", f"%vp{k}{s}", masked)]
        return L

    return _tile_loops("wino_in", words, 2, per_row, per_tile, body)


def _output_ir() -> list[str]:
    words = ("Mm", "Y", "bias", "hasb", "width", "nt", "tw", "N", "t0", "Ho2", "q0", "q1")
    per_row = ["  %tr = add i64 %t0, %r",
               "  %h = shl i64 %tr, 1",  # the tile's first output row
               "  %nh = mul i64 %n, %Ho2",
               "  %hh = add i64 %nh, %h",
               "  %wo = shl i64 %tw, 1",
               "  %rowf = mul i64 %wo, %width",  # floats per output row
               "  %yrow = mul i64 %hh, %rowf",
               "  %mq0 = mul i64 %q, %tw",
               "  %ks0 = mul i64 %N, %nt",
               "  %ks1 = mul i64 %ks0, %tw",
               "  %ks = mul i64 %ks1, %width",
               "  %biased = icmp ne i64 %hasb, 0"]
    per_tile = ["  %w2 = shl i64 %t, 1",
                "  %wc = mul i64 %w2, %width",
                "  %yt = add i64 %yrow, %wc",
                "  %mq = add i64 %mq0, %t",
                "  %mt = mul i64 %mq, %width"]
    for k in range(16):
        per_tile += [f"  %ko{k}a = mul i64 %ks, {k}", f"  %ko{k} = add i64 %ko{k}a, %mt"]
    for a in range(2):
        for b in range(2):
            per_tile += [f"  %yr{a}{b} = mul i64 %rowf, {a}",
                         f"  %yc{a}{b} = mul i64 %width, {b}",
                         f"  %yo{a}{b}a = add i64 %yr{a}{b}, %yc{a}{b}",
                         f"  %yo{a}{b} = add i64 %yt, %yo{a}{b}a"]

    def body(s: str, masked: bool) -> list[str]:
        L = []
        for k in range(16):
            L += [f"  %mo{k}{s} = add i64 %ko{k}, %c",
                  f"  %mp{k}{s} = getelementptr float, ptr %Mm, i64 %mo{k}{s}",
                  _load(f"%m{k}{s}", f"%mp{k}{s}", masked)]
        L += [f"  %bp{s} = getelementptr float, ptr %bias, i64 %c",
              _load(f"%b{s}", f"%bp{s}", masked)]
        for j in range(4):  # rows: A^T m, as _winograd_output's S (m[i][j] is product 4i + j)
            L += [f"  %S0{j}x{s} = fadd {_VF} %m{j}{s}, %m{4 + j}{s}",
                  f"  %S0{j}{s} = fadd {_VF} %S0{j}x{s}, %m{8 + j}{s}",
                  f"  %S1{j}x{s} = fsub {_VF} %m{4 + j}{s}, %m{8 + j}{s}",
                  f"  %S1{j}{s} = fsub {_VF} %S1{j}x{s}, %m{12 + j}{s}"]
        for a in range(2):  # the bias on column 1, which enters both outputs with a plus
            L += [f"  %S{a}1b{s} = fadd {_VF} %S{a}1{s}, %b{s}",
                  f"  %S{a}1c{s} = select i1 %biased, {_VF} %S{a}1b{s}, {_VF} %S{a}1{s}"]
        for a in range(2):  # columns: (A^T m) A into the 2x2 outputs
            c0, c1, c2, c3 = (f"%S{a}0{s}", f"%S{a}1c{s}", f"%S{a}2{s}", f"%S{a}3{s}")
            L += [f"  %y{a}0x{s} = fadd {_VF} {c0}, {c1}",
                  f"  %y{a}0{s} = fadd {_VF} %y{a}0x{s}, {c2}",
                  f"  %y{a}1x{s} = fsub {_VF} {c1}, {c2}",
                  f"  %y{a}1{s} = fsub {_VF} %y{a}1x{s}, {c3}"]
            for b in range(2):
                L += [f"  %yo{a}{b}{s} = add i64 %yo{a}{b}, %c",
                      f"  %yp{a}{b}{s} = getelementptr float, ptr %Y, i64 %yo{a}{b}{s}",
                      _store(f"%y{a}{b}{s}", f"%yp{a}{b}{s}", masked)]
        return L

    return _tile_loops("wino_out", words, 3, per_row, per_tile, body)


def module_ir(target=None) -> str:
    """Generic 16-lane IR, the same for every target (LLVM splits it on 8-lane ones)."""
    decls = ir.declarations("load.f32", "store.f32")
    return "\n\n".join(["\n".join(decls), "\n".join(_input_ir()), "\n".join(_output_ir())])


_JOB = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


def _module() -> jit.Module:
    return jit.compile_module("winograd", module_ir, {"wino_in": _JOB, "wino_out": _JOB},
                              REQUIRES)


def unavailable() -> str | None:
    """None when the transforms can run here (their object loaded), else why not."""
    return jit.why_unavailable(REQUIRES) or jit.why_not_loaded("winograd", _module)


def _run(job, head: list[int], rows: int, floats_per_row: int, threads: int) -> None:
    """``job`` on the argument block ``head`` + [q0, q1] for ranges of the ``rows`` rows."""
    ranges = work_ranges(rows, threads, floats_per_row, least=RANGE_FLOATS)
    blocks = np.array([head + [q0, q1] for q0, q1 in ranges], np.int64)
    if len(ranges) == 1:
        job(address(blocks))
    else:
        spin.run_blocks(job, blocks, threads)


def _check(name: str, a: np.ndarray, shape: tuple[int, ...]) -> None:
    if a.dtype != np.float32 or not a.flags.c_contiguous or a.shape != shape:
        raise ValueError(f"winograd: {name} must be a C-contiguous float32 {list(shape)}, got "
                         f"{a.dtype}{list(a.shape)}")


def input_transform(P: np.ndarray, V: np.ndarray, t0: int, threads: int = 1) -> None:
    """V (16, N, nt, tw, C) = the transformed 4x4 windows of tile rows t0 .. t0 + nt of the
    zero-padded channels-last input P (N, Hp, Wp, C), Hp >= 2 (t0 + nt) + 2, Wp >= 2 tw + 2."""
    _, N, nt, tw, C = V.shape
    Hp, Wp = P.shape[1:3]
    _check("V", V, (16, N, nt, tw, C))
    _check("P", P, (N, Hp, Wp, C))
    if Hp < 2 * (t0 + nt) + 2 or Wp < 2 * tw + 2 or t0 < 0:
        raise ValueError(f"winograd: tile rows {t0}..{t0 + nt} x {tw} reach outside the padded "
                         f"input {list(P.shape)}")
    _run(_module().wino_in, [address(P), address(V), Wp, C, nt, tw, N, t0, Hp], N * nt,
         16 * tw * C, threads)


def output_transform(Mm: np.ndarray, bias: np.ndarray | None, Y: np.ndarray, t0: int,
                     threads: int = 1) -> None:
    """Y (N, Ho2, 2 tw, M): rows 2 t0 .. 2 (t0 + nt) = the 2x2 output tiles of the 16 products
    Mm (16, N, nt, tw, M), ``bias`` (M values or None) added."""
    _, N, nt, tw, M = Mm.shape
    Ho2 = Y.shape[1]
    _check("Mm", Mm, (16, N, nt, tw, M))
    _check("Y", Y, (N, Ho2, 2 * tw, M))
    if Ho2 < 2 * (t0 + nt) or t0 < 0:
        raise ValueError(f"winograd: tile rows {t0}..{t0 + nt} reach outside the output "
                         f"{list(Y.shape)}")
    b = np.zeros(M, np.float32) if bias is None else \
        np.ascontiguousarray(bias, np.float32).reshape(-1)
    if b.size != M:
        raise ValueError(f"winograd: the bias has {b.size} values for {M} channels")
    _run(_module().wino_out, [address(Mm), address(Y), address(b), int(bias is not None), M,
                              nt, tw, N, t0, Ho2], N * nt, 4 * tw * M, threads)


BUNDLE = {"winograd": (module_ir, REQUIRES)}

__all__ = ["BUNDLE", "REQUIRES", "input_transform", "module_ir", "output_transform",
           "unavailable"]
