"""Depthwise float32 convolution, channels-last, with the bias and a clip (Relu, Relu6) in its
epilogue: Conv / FusedConv with group == channels.

Why: a depthwise layer is not a GEMM; numpy runs it as strided multiply-adds over whole rows
(one einsum per tap group, ~1-2 GMAC/s), so MobileNetV2's depthwise layers took 9 of its 22 ms.
Here each output pixel's chunk of channels (one vector register of the target: 8 lanes on
AVX2, 16 on AVX-512) sums its taps in a register (the chunk's tap weights stay in registers
while its rows of pixels stream past them) and is stored once, bias added and clipped; where
every tap is inside the image, four pixels a step, and at strides 1 and 2 each input pixel of
a tap row is loaded once per step for all the pixels that read it.

The input is read where it lies (channels-last), padding never copied: taps outside the image
read a pixel inside and use 0 instead:
    y[pixel, c] = clip(sum_t x[pixel + off[t], c] * w[t, c] + bias[c], lo, hi)
the taps summed in order by fused multiply-adds (a rounding order of its own: results agree
with the numpy path to float32 rounding, not bit for bit; the same bits whatever the target,
the step or the threads). ``_kernel`` is the loop of session 9 (16 lanes, one pixel at a
time, masked loads): the pools' (``pool.py``) and the baseline ``single_pixel_module_ir``.
"""

from __future__ import annotations

import ctypes

import numpy as np

from ..parallel import work_ranges
from . import ir, jit, spin
from . import logistic as mlas_logistic
from .jit import address
from .layout import aligned_zeros

REQUIRES = ()  # generic vector IR: every target
# Window taps (output floats x taps) a range of output rows needs before it goes to another
# thread (the depthwise kernel's and the pools', pool.py): ~30-60 us of one AVX2 core's work,
# against a hand-off of a few microseconds to a spinning worker (benchmarks/pool_costs.py).
# Cut into exactly one range a thread on parallel.py's queue, every split paid a wake of a
# Python thread (GIL and all).
MIN_TAPS_PER_RANGE = 1 << 18
_NEG_INF = "<" + ", ".join(["float 0xFFF0000000000000"] * 16) + ">"
MAX_TAPS = 49  # unrolled up to 7x7; larger windows keep the numpy path
_V, _VF = ir.V, ir.VF


def tap_load(x: str, ptr: str, mask: str, fill: str, masked: bool) -> str:
    """``x`` = the 16 floats at ``ptr``: lanes ``mask`` only (the others ``fill``) where
    ``masked``, else a plain load."""
    if masked:
        return (f"  {x} = call {_VF} @llvm.masked.load.v16f32.p0(ptr {ptr}, i32 4, "
                f"<16 x i1> {mask}, {_VF} {fill})")
    return f"  {x} = load {_VF}, ptr {ptr}, align 4"


def numpy_maximum(out: str, x: str, prev: str) -> list[str]:
    """``out`` = numpy's maximum of the vectors ``prev`` (so far) and ``x`` (the next tap): a
    NaN on either side wins, else ``x`` where it is greater, else ``prev``."""
    return [f"  {out}.g = fcmp ogt {_VF} {x}, {prev}",
            f"  {out}.b = select <16 x i1> {out}.g, {_VF} {x}, {_VF} {prev}",
            f"  {out}.n = fcmp uno {_VF} {x}, zeroinitializer",
            f"  {out} = select <16 x i1> {out}.n, {_VF} {x}, {_VF} {out}.b"]


def _pixels(tag: str, kh: int, kw: int, lo: str, hi: str, checked: bool,
            masked: bool = True, op: str = "fma") -> list[str]:
    """The loop over output pixels [lo, hi) of a row and 16-channel chunk, labelled ``tag``:
    the taps' sum, bias, clip, store. ``checked``: columns at the image's left or right edge,
    each tap's lanes masked off where its column is outside the image (the rows' masks
    %mr{i} already are). ``masked`` False: a whole chunk with every tap row inside the image,
    read and written by plain loads and stores (masked ones cost more, most on AVX2).
    ``op`` "max" / "avg" (compiled/pool.py): the taps' maximum (NaN kept, as numpy's; taps
    outside the image read -inf) or their sum times ``%W[%sr + ow]``, stored as they are."""
    t = f"%{tag}"
    L = [f"  {t}.any = icmp slt i64 {lo}, {hi}",
         f"  br i1 {t}.any, label {t}.loop, label {t}.done",
         f"{tag}.loop:",
         f"  {t}.ow = phi i64 [{lo}, %{tag}.pre], [{t}.own, {t}.loop]",
         f"  {t}.iw = mul i64 {t}.ow, %swc",
         f"  {t}.xb = add i64 %xc, {t}.iw",
         f"  {t}.oa = mul i64 {t}.ow, %C",
         f"  {t}.ya = add i64 %yc, {t}.oa"]
    if checked:  # the window's first column, then each tap column's validity
        L += [f"  {t}.c0 = mul i64 {t}.ow, %sw",
              f"  {t}.c = sub i64 {t}.c0, %pl"]
        for j in range(kw):
            L += [f"  {t}.cj{j} = add i64 {t}.c, %cd{j}",
                  f"  {t}.cv{j} = icmp ult i64 {t}.cj{j}, %Wd"]
    prev = f"{_VF} zeroinitializer"
    fill = _NEG_INF if op == "max" else "zeroinitializer"  # what a tap outside reads
    for i in range(kh):
        for j in range(kw):
            k = i * kw + j
            mask = f"%mr{i}"
            if checked:
                mask = f"{t}.m{k}"
                L.append(f"  {mask} = select i1 {t}.cv{j}, <16 x i1> %mr{i}, "
                         "<16 x i1> zeroinitializer")
            x = f"{t}.x{k}"
            L += [f"  {t}.xa{k} = add i64 {t}.xb, %off{k}",
                  f"  {t}.xp{k} = getelementptr float, ptr %X, i64 {t}.xa{k}",
                  tap_load(x, f"{t}.xp{k}", mask, fill, masked)]
            if op == "fma":
                L.append(f"  {t}.a{k} = call {_VF} @llvm.fma.v16f32({_VF} {x}, {_VF} %w{k}, "
                         f"{prev})")
            elif k == 0:
                prev = f"{_VF} {x}"
                continue
            elif op == "avg":
                L.append(f"  {t}.a{k} = fadd {prev}, {x}")
            else:
                L += numpy_maximum(f"{t}.a{k}", x, prev[len(_VF) + 1:])
            prev = f"{_VF} {t}.a{k}"
    if op != "fma":
        if op == "avg":  # times the pixel's 1 / count
            L += [f"  {t}.si = add i64 %sr, {t}.ow",
                  f"  {t}.sp = getelementptr float, ptr %W, i64 {t}.si",
                  f"  {t}.sf = load float, ptr {t}.sp, align 4",
                  *ir.splat(f"{t}.sv", f"{t}.sf"),
                  f"  {t}.o = fmul {prev}, {t}.sv"]
            prev = f"{_VF} {t}.o"
        L += [f"  {t}.yp = getelementptr float, ptr %Y, i64 {t}.ya",
              f"  call void @llvm.masked.store.v16f32.p0({prev}, ptr {t}.yp, i32 4, "
              "<16 x i1> %mask)" if masked else f"  store {prev}, ptr {t}.yp, align 4",
              f"  {t}.own = add i64 {t}.ow, 1",
              f"  {t}.more = icmp slt i64 {t}.own, {hi}",
              f"  br i1 {t}.more, label {t}.loop, label {t}.done",
              f"{tag}.done:"]
        return L
    L += [f"  {t}.s = fadd {prev}, %bv",
          # numpy's clip: NaN stays NaN
          f"  {t}.lt = fcmp olt {_VF} {t}.s, %lo",
          f"  {t}.sl = select <16 x i1> {t}.lt, {_VF} %lo, {_VF} {t}.s",
          f"  {t}.gt = fcmp ogt {_VF} {t}.sl, %hi",
          f"  {t}.o = select <16 x i1> {t}.gt, {_VF} %hi, {_VF} {t}.sl",
          f"  {t}.yp = getelementptr float, ptr %Y, i64 {t}.ya",
          f"  call void @llvm.masked.store.v16f32.p0({_VF} {t}.o, ptr {t}.yp, i32 4, "
          "<16 x i1> %mask)" if masked else f"  store {_VF} {t}.o, ptr {t}.yp, align 4",
          f"  {t}.own = add i64 {t}.ow, 1",
          f"  {t}.more = icmp slt i64 {t}.own, {hi}",
          f"  br i1 {t}.more, label {t}.loop, label {t}.done",
          f"{tag}.done:"]
    return L


def _kernel(kh: int, kw: int, op: str = "fma") -> str:
    """``@dw_f32``: rows [r0, r1) of output pixels (n, oh) of the unpadded channels-last input
    (N, H, Wd, C); per row and 16-channel chunk (the last masked) the taps' weights stay in
    registers while the row's pixels stream past them. Padding is never materialized: a tap
    row outside the image has its lanes masked off for the whole row, and the output columns
    [0, ow_lo) and [ow_hi, Wo), whose windows cross the left or right edge, check each tap's
    column. ``%bounds`` = (lo, hi); strides in elements. ``op`` "max" / "avg": ``@pool_f32``
    of the same parameters, the window's maximum or sum (_pixels), ``%W`` the pixels' 1 /
    count (avg), ``%bias`` and ``%bounds`` unread."""
    T = kh * kw
    L = [f"define void @{'dw' if op == 'fma' else 'pool'}_f32(ptr %X, ptr %W, ptr %bias, "
         "ptr %bounds, ptr %Y, i64 %C, "
         "i64 %Cp, i64 %H, i64 %Wd, i64 %Ho, i64 %Wo, i64 %sh, i64 %sw, i64 %dh, i64 %dw, "
         "i64 %pt, i64 %pl, i64 %ow_lo, i64 %ow_hi, i64 %r0, i64 %r1) nounwind {",
         "entry:",
         *(ir.load_params("%bounds", ("lo", "hi")) if op == "fma" else []),
         "  %rowc = mul i64 %Wd, %C",
         "  %img = mul i64 %H, %rowc",
         "  %swc = mul i64 %sw, %C"]
    for i in range(kh):
        L += [f"  %rd{i} = mul i64 %dh, {i}",
              f"  %ro{i} = mul i64 %rd{i}, %rowc"]
    for j in range(kw):
        L += [f"  %cd{j} = mul i64 %dw, {j}",
              f"  %co{j} = mul i64 %cd{j}, %C"]
    for i in range(kh):
        for j in range(kw):
            L.append(f"  %off{i * kw + j} = add i64 %ro{i}, %co{j}")
    L += ["  %any = icmp slt i64 %r0, %r1",
          "  br i1 %any, label %rloop, label %end",
          "rloop:",  # one output row (n, oh): its window's first input row and tap rows
          "  %r = phi i64 [%r0, %entry], [%rn, %rnext]",
          "  %n = udiv i64 %r, %Ho",
          "  %oh = urem i64 %r, %Ho",
          "  %ih0 = mul i64 %oh, %sh",
          "  %ih = sub i64 %ih0, %pt",
          "  %ina = mul i64 %n, %img",
          "  %inb = mul i64 %ih, %rowc",
          "  %inc = mul i64 %pl, %C",
          "  %in1 = add i64 %ina, %inb",
          "  %in0 = sub i64 %in1, %inc",  # pixel ow's window starts at in0 + ow * swc
          "  %sr = mul i64 %oh, %Wo",
          "  %outa = mul i64 %r, %Wo",
          "  %out0 = mul i64 %outa, %C"]
    for i in range(kh):
        L += [f"  %rr{i} = add i64 %ih, %rd{i}",
              f"  %rv{i} = icmp ult i64 %rr{i}, %H"]
    pool = op != "fma"
    L += ["  br label %cloop",
          "cloop:",
          f"  %c0 = phi i64 [0, %rloop], [%c0n, {'%cnext' if pool else '%right.done'}]",
          "  %left = sub i64 %C, %c0",
          *ir.lane_mask("%mask", "%left")]
    if op == "fma":
        L += ["  %bp = getelementptr float, ptr %bias, i64 %c0",
              f"  %bv = load {_VF}, ptr %bp, align 4"]
    L.append("  %fast0 = icmp sge i64 %left, 16")
    for i in range(kh):
        L += [f"  %mr{i} = select i1 %rv{i}, <16 x i1> %mask, <16 x i1> zeroinitializer",
              f"  %fast{i + 1} = and i1 %fast{i}, %rv{i}"]
    L.append(f"  %fast = or i1 %fast{kh}, false")
    if op == "fma":
        L += ir.tap_weights(T, align=64)
    L += ["  %xc = add i64 %in0, %c0",
          "  %yc = add i64 %out0, %c0",
          "  br label %left.pre",
          "left.pre:",
          *_pixels("left", kh, kw, "0", "%ow_lo", True, op=op),
          "  br i1 %fast, label %fmid.pre, label %mid.pre",
          "fmid.pre:",
          *_pixels("fmid", kh, kw, "%ow_lo", "%ow_hi", False, masked=False, op=op),
          "  br label %right.pre",
          "mid.pre:",
          *_pixels("mid", kh, kw, "%ow_lo", "%ow_hi", False, op=op),
          "  br label %right.pre",
          "right.pre:",
          *_pixels("right", kh, kw, "%ow_hi", "%Wo", True, op=op)]
    if not pool:
        return "\n".join(L + ir.chunk_and_row_loop_end())
    # A pool's last chunk of a partial 16 (ShuffleNet's 24 and 136 channels) is the last 16
    # channels instead, overlapping the chunk before: each channel's window is pooled
    # alone, so those channels are computed and stored again with the same values, by plain
    # loads and stores where the masked ones of a partial chunk cost most (AVX2 on AMD)
    L += ["  %c0s = add i64 %c0, 16",
          "  %cmore = icmp slt i64 %c0s, %C",
          "  br i1 %cmore, label %cnext, label %rnext",
          "cnext:",
          "  %cend = add i64 %c0s, 16",
          "  %cpart = icmp sgt i64 %cend, %C",
          "  %cwide = icmp sge i64 %C, 16",
          "  %cover = and i1 %cpart, %cwide",
          "  %cback = sub i64 %C, 16",
          "  %c0n = select i1 %cover, i64 %cback, i64 %c0s",
          "  br label %cloop",
          *ir.chunk_and_row_loop_end()[3:]]
    return "\n".join(L)


# -- the convolution: chunks of the target's vector width, several pixels at once -------------

UNROLL = 4  # output pixels per step of the inner loop: independent chains of multiply-adds


def _conv_pixels(tag: str, kh: int, kw: int, vt: str, lo: str, hi: str, *, rows: bool,
                 cols: bool, masked: bool, unroll: int = 1,
                 reuse: tuple[int, int] | None = None) -> list[str]:
    """Output pixels [lo, hi) of a row and chunk, ``unroll`` at a time (the rest of the range
    is the caller's), labelled ``tag``: each pixel's taps summed in row order by fused
    multiply-adds from 0, then the bias and the clip, stored. ``rows`` / ``cols``: some tap rows
    (``%rv{i}``) / columns are outside the image: their loads read a valid pixel (the row
    ``%rb{i}`` is clamped into the image, the column to 0) and the value is replaced by 0,
    as the padding's (0 * w: NaN for an infinite weight, as the numpy path's padded copy).
    ``masked``: the chunk's lanes ``%mask`` only (a partial chunk), else plain loads and
    stores. ``reuse`` (the strides and dilations (sw, dw), known here): each input pixel of a
    tap row is loaded once and multiplied into every pixel of the step that reads it (their
    taps still in order), instead of once per tap and pixel."""
    t, U = f"%{tag}", unroll
    L = []
    if reuse is not None:  # the input columns the step reads, from its first pixel's first
        sw, dw = reuse
        reads = sorted({u * sw + j * dw for u in range(U) for j in range(kw)})
        L += [f"  {t}.cx{x} = mul i64 %C, {x}" for x in reads]
    L += [f"  {t}.any = icmp slt i64 {lo}, {hi}",
         f"  br i1 {t}.any, label {t}.loop, label {t}.done",
         f"{tag}.loop:",
         f"  {t}.ow = phi i64 [{lo}, %{tag}.pre], [{t}.own, {t}.loop]"]
    acc = {}
    for u in range(U):
        p = f"{t}.u{u}"
        L += [f"  {p}.ow = add i64 {t}.ow, {u}",
              f"  {p}.iw = mul i64 {p}.ow, %swc",
              f"  {p}.ya = mul i64 {p}.ow, %C"]
        if cols:  # each tap column's index in the image, and whether it is inside
            L += [f"  {p}.c0 = mul i64 {p}.ow, %sw",
                  f"  {p}.c = sub i64 {p}.c0, %pl"]
            for j in range(kw):
                L += [f"  {p}.cj{j} = add i64 {p}.c, %cd{j}",
                      f"  {p}.cv{j} = icmp ult i64 {p}.cj{j}, %Wd",
                      f"  {p}.cs{j} = select i1 {p}.cv{j}, i64 {p}.cj{j}, i64 0",
                      f"  {p}.cp{j} = add i64 {p}.cs{j}, %pl",
                      f"  {p}.co{j} = mul i64 {p}.cp{j}, %C"]
        acc[u] = f"{vt} zeroinitializer"
    for i in range(kh) if reuse is not None else ():
        for x in reads:
            q = f"{t}.r{i}c{x}"
            L += [f"  {q}.o = add i64 %rb{i}, {t}.u0.iw",
                  f"  {q}.a = add i64 {q}.o, {t}.cx{x}",
                  f"  {q}.p = getelementptr float, ptr %X, i64 {q}.a",
                  f"  {q} = load {vt}, ptr {q}.p, align 4"]
            for u in range(U):
                for j in range(kw):
                    if u * sw + j * dw == x:
                        k, p = i * kw + j, f"{t}.u{u}"
                        L.append(f"  {p}.a{k} = call {vt} @llvm.fma.{_SFX[vt]}({vt} {q}, "
                                 f"{vt} %w{k}, {acc[u]})")
                        acc[u] = f"{vt} {p}.a{k}"
    for i in range(kh) if reuse is None else ():
        for j in range(kw):
            k = i * kw + j
            for u in range(U):
                p = f"{t}.u{u}"
                off = f"{p}.co{j}" if cols else f"{p}.iw"
                L.append(f"  {p}.xa{k} = add i64 %rb{i}, {off}")
                if not cols:
                    L[-1] = f"  {p}.xo{k} = add i64 %rb{i}, {off}"
                    L.append(f"  {p}.xa{k} = add i64 {p}.xo{k}, %co{j}")
                x = f"{p}.x{k}"
                L += [f"  {p}.xp{k} = getelementptr float, ptr %X, i64 {p}.xa{k}",
                      f"  {x} = call {vt} @llvm.masked.load.{_SFX[vt]}.p0(ptr {p}.xp{k}, i32 4, "
                      f"{_VM[vt]} %mask, {vt} zeroinitializer)" if masked else
                      f"  {x} = load {vt}, ptr {p}.xp{k}, align 4"]
                valid = [f"%rv{i}"] if rows else []
                if cols:
                    valid.append(f"{p}.cv{j}")
                if valid:
                    v = valid[0]
                    if len(valid) == 2:
                        v = f"{p}.v{k}"
                        L.append(f"  {v} = and i1 {valid[0]}, {valid[1]}")
                    L.append(f"  {p}.z{k} = select i1 {v}, {vt} {x}, {vt} zeroinitializer")
                    x = f"{p}.z{k}"
                L.append(f"  {p}.a{k} = call {vt} @llvm.fma.{_SFX[vt]}({vt} {x}, {vt} %w{k}, "
                         f"{acc[u]})")
                acc[u] = f"{vt} {p}.a{k}"
    for u in range(U):
        p = f"{t}.u{u}"
        L += [f"  {p}.s = fadd {acc[u]}, %bv",
              # numpy's clip: NaN stays NaN
              f"  {p}.lt = fcmp olt {vt} {p}.s, %lo",
              f"  {p}.sl = select {_VM[vt]} {p}.lt, {vt} %lo, {vt} {p}.s",
              f"  {p}.gt = fcmp ogt {vt} {p}.sl, %hi",
              f"  {p}.o = select {_VM[vt]} {p}.gt, {vt} %hi, {vt} {p}.sl",
              f"  {p}.yo = add i64 %yrow, {p}.ya",
              f"  {p}.yp = getelementptr float, ptr %Y, i64 {p}.yo",
              f"  call void @llvm.masked.store.{_SFX[vt]}.p0({vt} {p}.o, ptr {p}.yp, i32 4, "
              f"{_VM[vt]} %mask)" if masked else f"  store {vt} {p}.o, ptr {p}.yp, align 4"]
    L += [f"  {t}.own = add i64 {t}.ow, {U}",
          f"  {t}.more = icmp slt i64 {t}.own, {hi}",
          f"  br i1 {t}.more, label {t}.loop, label {t}.done",
          f"{tag}.done:"]
    return L


_SFX = {f"<{n} x float>": f"v{n}f32" for n in (8, 16)}
_VM = {f"<{n} x float>": f"<{n} x i1>" for n in (8, 16)}


def _conv_kernel(kh: int, kw: int, lanes: int) -> str:
    """``@dw_f32``: rows [r0, r1) of output pixels (n, oh) of the unpadded channels-last
    input (N, H, Wd, C), a chunk of ``lanes`` channels (the target's vector: one register) at
    a time, the last one masked; per chunk the taps' weights stay in registers while its rows
    of pixels stream past them, ``UNROLL`` pixels a step where every tap is inside the image.
    Padding is never materialized: output rows whose window crosses the top or bottom edge,
    and the columns [0, ow_lo) and [ow_hi, Wo) whose windows cross the left or right edge,
    replace the taps outside by zeros (_conv_pixels). ``%bounds`` = (lo, hi); strides in
    elements. The same numbers, pixel by pixel, whatever the unrolling or the threads."""
    vt = f"<{lanes} x float>"
    U = UNROLL
    iota = "<" + ", ".join(f"i32 {i}" for i in range(lanes)) + ">"
    L = ["define void @dw_f32(ptr %X, ptr %W, ptr %bias, ptr %bounds, ptr %Y, i64 %C, "
         "i64 %Cp, i64 %H, i64 %Wd, i64 %Ho, i64 %Wo, i64 %sh, i64 %sw, i64 %dh, i64 %dw, "
         "i64 %pt, i64 %pl, i64 %ow_lo, i64 %ow_hi, i64 %r0, i64 %r1) nounwind {",
         "entry:"]
    for k, name in enumerate(("lo", "hi", "alpha")):
        L += [f"  %{name}.p = getelementptr float, ptr %bounds, i64 {k}",
              f"  %{name}.f = load float, ptr %{name}.p, align 4",
              f"  %{name}.s = insertelement {vt} poison, float %{name}.f, i64 0",
              f"  %{name} = shufflevector {vt} %{name}.s, {vt} poison, <{lanes} x i32> "
              "zeroinitializer"]
    # the logistic epilogue (%bounds[3]: 0 none, 1 logistic(y), 2 y * logistic(alpha y))
    L += ["  %mode.p = getelementptr float, ptr %bounds, i64 3",
          "  %mode = load float, ptr %mode.p, align 4",
          "  %act = fcmp one float %mode, 0.0",
          "  %mul = fcmp ogt float %mode, 1.5",
          "  %lf.alpha = fadd " + vt + " %alpha, zeroinitializer",
          "  %lm.alpha = fadd " + vt + " %alpha, zeroinitializer"]
    L += ["  %rowc = mul i64 %Wd, %C",
          "  %img = mul i64 %H, %rowc",
          "  %swc = mul i64 %sw, %C",
          "  %plc = mul i64 %pl, %C",
          "  %rows = sub i64 %r1, %r0",
          "  %wide = sub i64 %ow_hi, %ow_lo",
          f"  %wfit = urem i64 %wide, {U}",
          "  %ow_u = sub i64 %ow_hi, %wfit",  # [ow_lo, ow_u): whole steps of U pixels
          "  %n0 = udiv i64 %r0, %Ho",
          "  %oh0 = urem i64 %r0, %Ho",
          "  %ina0 = mul i64 %n0, %img",
          "  %work = icmp sgt i64 %rows, 0"]
    for j in range(kw):
        L += [f"  %cd{j} = mul i64 %dw, {j}",
              f"  %co{j} = mul i64 %cd{j}, %C"]
    L += ["  br i1 %work, label %cloop, label %end",
          "cloop:",
          "  %c0 = phi i64 [0, %entry], [%c0n, %cnext]",
          "  %left = sub i64 %C, %c0",
          "  %full = icmp sge i64 %left, " + str(lanes),
          "  %left32 = trunc i64 %left to i32",
          f"  %lv.s = insertelement <{lanes} x i32> poison, i32 %left32, i64 0",
          f"  %lv = shufflevector <{lanes} x i32> %lv.s, <{lanes} x i32> poison, "
          f"<{lanes} x i32> zeroinitializer",
          f"  %mask = icmp slt <{lanes} x i32> {iota}, %lv",
          "  %bp = getelementptr float, ptr %bias, i64 %c0",
          f"  %bv = load {vt}, ptr %bp, align 4"]
    for k in range(kh * kw):  # (the rows are padded to Cp >= C rounded up to 16: readable)
        L += [f"  %wr{k} = mul i64 {k}, %Cp",
              f"  %wx{k} = add i64 %wr{k}, %c0",
              f"  %wp{k} = getelementptr float, ptr %W, i64 %wx{k}",
              f"  %w{k} = load {vt}, ptr %wp{k}, align 4"]
    L += ["  br label %rloop",
          "rloop:",  # one output row (n, oh) of this chunk: no division per row
          "  %r = phi i64 [%r0, %cloop], [%rn, %rdone]",
          "  %oh = phi i64 [%oh0, %cloop], [%ohn, %rdone]",
          "  %ina = phi i64 [%ina0, %cloop], [%inan, %rdone]",
          "  %ih0 = mul i64 %oh, %sh",
          "  %ih = sub i64 %ih0, %pt",
          "  %inc = add i64 %ina, %c0",
          "  %in0 = sub i64 %inc, %plc",  # + (column + pl) * C: a pixel of tap row i
          "  %yr = mul i64 %r, %Wo",
          "  %yr2 = mul i64 %yr, %C",
          "  %yrow = add i64 %yr2, %c0",
          "  %allr0 = or i1 true, true"]
    for i in range(kh):
        L += [f"  %ri{i}.d = mul i64 %dh, {i}",
              f"  %ri{i} = add i64 %ih, %ri{i}.d",
              f"  %rv{i} = icmp ult i64 %ri{i}, %H",
              f"  %rc{i} = select i1 %rv{i}, i64 %ri{i}, i64 0",
              f"  %rm{i} = mul i64 %rc{i}, %rowc",
              f"  %rb{i} = add i64 %in0, %rm{i}",
              f"  %allr{i + 1} = and i1 %allr{i}, %rv{i}"]
    L += [f"  %fast = and i1 %allr{kh}, %full",
          "  br i1 %full, label %left.pre, label %mleft.pre"]
    pieces = [  # (label, lo, hi, rows checked, columns checked, masked, unroll, next)
        ("left", "0", "%ow_lo", True, True, False, 1, None),
        ("mid", "%ow_lo", "%ow_hi", True, False, False, 1, "right"),
        ("fast", "%ow_lo", "%ow_u", False, False, False, U, None),
        ("fast1", "%ow_lo", "%ow_u", False, False, False, U, None),
        ("fast2", "%ow_lo", "%ow_u", False, False, False, U, None),
        ("tail", "%ow_u", "%ow_hi", False, False, False, 1, "right"),
        ("right", "%ow_hi", "%Wo", True, True, False, 1, "rnext"),
        ("mleft", "0", "%Wo", True, True, True, 1, "rnext"),
    ]
    for tag, lo, hi, rows, cols, masked, unroll, nxt in pieces:
        reuse = {"fast1": (1, 1), "fast2": (2, 1)}.get(tag)
        L += [f"{tag}.pre:", *_conv_pixels(tag, kh, kw, vt, lo, hi, rows=rows, cols=cols,
                                           masked=masked, unroll=unroll, reuse=reuse)]
        if tag == "left":  # the middle: unrolled where every tap row is inside the image,
            # each input pixel loaded once per step at strides 1 and 2 (undilated)
            L += ["  br i1 %fast, label %pick, label %mid.pre",
                  "pick:",
                  "  %d1 = icmp eq i64 %dw, 1",
                  "  %s1 = icmp eq i64 %sw, 1",
                  "  %s2 = icmp eq i64 %sw, 2",
                  "  %f1 = and i1 %d1, %s1",
                  "  %f2 = and i1 %d1, %s2",
                  "  %fk = select i1 %f2, i64 2, i64 0",
                  "  %fj = select i1 %f1, i64 1, i64 %fk",
                  "  switch i64 %fj, label %fast.pre [i64 1, label %fast1.pre "
                  "i64 2, label %fast2.pre]"]
        elif tag.startswith("fast"):
            L.append("  br label %tail.pre")
        else:
            L.append(f"  br label %{nxt}.pre" if nxt != "rnext" else "  br label %rnext")
    L += ["rnext:",  # the row's pixels of this chunk, still in L1: the logistic, if asked
          "  br i1 %act, label %act.pre, label %rdone",
          *_logistic_pixels(vt, lanes),
          "rdone:",
          "  %oh1 = add i64 %oh, 1",
          "  %ohw = icmp eq i64 %oh1, %Ho",  # the next image
          "  %ohn = select i1 %ohw, i64 0, i64 %oh1",
          "  %inai = add i64 %ina, %img",
          "  %inan = select i1 %ohw, i64 %inai, i64 %ina",
          "  %rn = add i64 %r, 1",
          "  %rmore = icmp slt i64 %rn, %r1",
          "  br i1 %rmore, label %rloop, label %cnext",
          "cnext:",
          f"  %c0n = add i64 %c0, {lanes}",
          "  %cmore = icmp slt i64 %c0n, %C",
          "  br i1 %cmore, label %cloop, label %end",
          "end:",
          "  ret void",
          "}"]
    return "\n".join(L)


def _logistic_pixels(vt: str, lanes: int) -> list[str]:
    """Blocks ``act.pre`` ... -> ``rdone``: the output row's Wo pixels of this chunk (``%C``
    floats apart from ``%yrow``) in place through compiled/logistic.py's body (the same
    operations per lane as the standalone Sigmoid / QuickGelu: the same bits); a partial
    chunk's lanes ``%mask`` only."""
    vm = f"<{lanes} x i1>"
    sfx = f"v{lanes}f32"

    def vec(c):
        return "<" + ", ".join([f"float {ir.float_constant(c)}"] * lanes) + ">"

    L = ["act.pre:",
         "  br i1 %full, label %actf, label %actm"]
    for masked, label, t, v in ((False, "actf", "af", "lf"), (True, "actm", "am", "lm")):
        p = f"%{t}.p"
        load = f"call {vt} @llvm.masked.load.{sfx}.p0(ptr {p}, i32 4, {vm} %mask, " \
            f"{vt} zeroinitializer)" if masked else f"load {vt}, ptr {p}, align 4"
        store = f"call void @llvm.masked.store.{sfx}.p0({vt} %{v}.out, ptr {p}, i32 4, " \
            f"{vm} %mask)" if masked else f"store {vt} %{v}.out, ptr {p}, align 4"
        L += [f"{label}:",  # a whole chunk's pixels, then a partial one's
              f"  %{t}.ow = phi i64 [0, %act.pre], [%{t}.own, %{label}]",
              f"  %{t}.o = mul i64 %{t}.ow, %C",
              f"  %{t}.i = add i64 %yrow, %{t}.o",
              f"  {p} = getelementptr float, ptr %Y, i64 %{t}.i",
              f"  %{v}.x = {load}",
              *mlas_logistic.body_ir(vt, v, vec),
              f"  {store}",
              f"  %{t}.own = add i64 %{t}.ow, 1",
              f"  %{t}.more = icmp slt i64 %{t}.own, %Wo",
              f"  br i1 %{t}.more, label %{label}, label %rdone"]
    return L


_ARGS = ("ptr",) * 5 + ("i64",) * 16  # @dw_f32's, read from one block of words by @dw_job


def module_ir(kh: int, kw: int, lanes: int) -> str:
    """``@dw_f32`` for a kh x kw window on vectors of ``lanes`` floats, and ``@dw_job``: the
    same called with its arguments read from one block of int64 words (one ctypes argument)."""
    vt, vm, sfx = f"<{lanes} x float>", f"<{lanes} x i1>", f"v{lanes}f32"
    return "\n\n".join([
        f"declare {vt} @llvm.masked.load.{sfx}.p0(ptr, i32, {vm}, {vt})",
        f"declare void @llvm.masked.store.{sfx}.p0({vt}, ptr, i32, {vm})",
        f"declare {vt} @llvm.fma.{sfx}({vt}, {vt}, {vt})",
        _conv_kernel(kh, kw, lanes), "\n".join(ir.job("dw_job", "dw_f32", _ARGS))])



_PROTO = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_X, _BIAS, _Y, _R0, _R1 = 0, 2, 4, 19, 20  # the words a call fills in


def function(kh: int, kw: int):
    """``@dw_job`` of the kh x kw module for the selected target."""
    return jit.compile_module(f"depthwise_f32_{kh}x{kw}",
                              lambda target: module_ir(kh, kw, target.lanes),
                              {"dw_job": _PROTO}, REQUIRES).dw_job


def single_pixel_module_ir(kh: int, kw: int) -> str:
    """The kernel before session 10 (16-lane chunks, one pixel at a time, each tap loaded
    per pixel, masked loads and stores wherever a tap may be outside), with the same
    ``@dw_job``: the baseline ``benchmarks/cnn_gain.py --changes depthwise`` measures."""
    return "\n\n".join(ir.declarations("load.f32", "store.f32", "fma") + [
        _kernel(kh, kw), "\n".join(ir.job("dw_job", "dw_f32", _ARGS))])


class DepthwiseFloat:
    """A constant depthwise weight (C, 1, kh, kw) as float32 rows of channels per tap (padded
    to 16 channels, 64-byte aligned), and a constant per-channel ``bias`` (or none), ready for
    ``run``. Raises ``jit.Unavailable`` where the kernel cannot run here (checked at every
    preparation)."""

    __slots__ = ("C", "Cp", "kernel", "w", "bias", "_fn", "_blocks")

    def __init__(self, W: np.ndarray, bias: np.ndarray | None = None) -> None:
        if W.ndim != 4 or W.shape[1] != 1 or not 0 < W.shape[2] * W.shape[3] <= MAX_TAPS:
            raise ValueError(f"depthwise: expected (C, 1, kh, kw) with at most {MAX_TAPS} "
                             f"taps, got {list(W.shape)}")
        reason = jit.why_unavailable(REQUIRES)
        if reason:
            raise jit.Unavailable(reason)
        C, _, kh, kw = W.shape
        self._fn = function(kh, kw)
        self.C, self.Cp, self.kernel = C, -(-C // 16) * 16, (kh, kw)
        self.w = aligned_zeros((kh * kw, self.Cp), np.float32)
        self.w[:, :C] = W.reshape(C, kh * kw).T
        self.bias = self._padded(bias)
        # (X's shape, geometry, bounds) -> the kernel's argument block for it, with the clip
        # array it points at: a call fills in X's and the output's addresses only (its 21
        # arguments through ctypes and the per-call arrays cost more than a small layer)
        self._blocks: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}

    def _padded(self, bias) -> np.ndarray:
        b = np.zeros(self.Cp, np.float32)
        if bias is not None:
            b[:self.C] = np.broadcast_to(np.asarray(bias, np.float32).reshape(-1), (self.C,))
        return b

    def run(self, X: np.ndarray, heads: tuple[int, int], out_hw: tuple[int, int],
            strides: tuple[int, int], dilations: tuple[int, int], bias=None,
            bounds=(-np.inf, np.inf), out: np.ndarray | None = None,
            threads: int = 1, logistic: tuple[float, bool] | None = None) -> np.ndarray:
        """(N, Ho, Wo, C) from the channels-last (N, H, W, C) float32 ``X``, zero-padded by
        ``heads`` (top, left) and as far as the windows read past its end; plus ``bias`` per
        channel (a bias known only now), else the constant one; then the clip ``bounds``;
        then ``logistic`` (alpha, times_x): logistic(y), or y * logistic(alpha y) (a fused
        Sigmoid, SiLU / QuickGelu: the standalone compiled kernel's bits); ``out``: a
        C-contiguous (N, Ho, Wo, C) float32 array."""
        N, H, Wd, C = X.shape
        if C != self.C or X.dtype != np.float32 or not X.flags.c_contiguous:
            raise ValueError(f"depthwise: expected a contiguous float32 [N, H, W, {self.C}]")
        Ho, Wo = out_hw
        if out is None:
            out = np.empty((N, Ho, Wo, C), np.float32)
        elif out.shape != (N, Ho, Wo, C) or out.dtype != np.float32 or \
                not out.flags.c_contiguous:
            raise ValueError(f"depthwise: out must be a C-contiguous float32 {[N, Ho, Wo, C]}")
        if out.size == 0:
            return out
        alpha, mode = (1.0, 0.0) if logistic is None else \
            (float(np.float32(logistic[0])), 2.0 if logistic[1] else 1.0)
        key = (X.shape, heads, out_hw, strides, dilations,
               (*map(float, bounds), alpha, mode))
        prepared = self._blocks.get(key)
        if prepared is None:
            prepared = self._blocks[key] = self._block(X.shape, heads, out_hw, strides,
                                                       dilations, key[-1])
        block = prepared[0].copy()  # a block per call: concurrent runs share the kernel
        block[_X], block[_Y] = address(X), address(out)
        if bias is not None:
            bias = self._padded(bias)  # (kept alive through the calls below)
            block[_BIAS] = address(bias)
        rows = N * Ho
        ranges = work_ranges(rows, threads, Wo * C * self.kernel[0] * self.kernel[1],
                             least=MIN_TAPS_PER_RANGE)
        if len(ranges) > 1:  # rows taken in turn by the caller and spin.py's workers
            blocks = np.repeat(block[None], len(ranges), axis=0)
            blocks[:, _R0], blocks[:, _R1] = np.array(ranges, np.int64).T
            spin.run_blocks(self._fn, blocks, threads)
        else:
            block[_R0], block[_R1] = 0, rows
            self._fn(address(block))
        return out

    def _block(self, shape, heads, out_hw, strides, dilations, bounds):
        N, H, Wd, C = shape
        (Ho, Wo), (sh, sw), (dh, dw), (pt, pl) = out_hw, strides, dilations, heads
        kw = self.kernel[1]
        # output columns whose windows lie inside the image's columns: [ow_lo, ow_hi)
        ow_lo = min(Wo, -(-pl // sw))
        last = Wd - 1 - (kw - 1) * dw + pl  # the last window start inside, plus pl
        ow_hi = max(ow_lo, min(Wo, last // sw + 1 if last >= 0 else 0))
        clip = np.array(bounds, np.float32)
        block = np.array([0, address(self.w), address(self.bias), address(clip), 0, C,
                          self.Cp, H, Wd, Ho, Wo, sh, sw, dh, dw, pt, pl, ow_lo, ow_hi, 0, 0],
                         np.int64)
        return block, clip


# compiled with the other kernels on first use (jit._BUNDLE)
BUNDLE = {"depthwise_f32_3x3": (lambda target: module_ir(3, 3, target.lanes), REQUIRES)}

__all__ = ["BUNDLE", "DepthwiseFloat", "MAX_TAPS", "REQUIRES", "function", "module_ir",
           "single_pixel_module_ir"]
