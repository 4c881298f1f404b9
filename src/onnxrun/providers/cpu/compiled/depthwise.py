"""Depthwise float32 convolution, channels-last, with the bias and a clip (Relu, Relu6) in its
epilogue: Conv / FusedConv with group == channels.

Why: a depthwise layer is not a GEMM; numpy runs it as strided multiply-adds over whole rows
(one einsum per tap group, ~1-2 GMAC/s), so MobileNetV2's depthwise layers took 9 of its 22 ms.
Here each output pixel's 16-channel chunk sums its taps in a register (the tap weights stay in
registers while a row of pixels streams past them) and is stored once, bias added and clipped.

The input is read where it lies (channels-last), padding never copied: taps outside the image
are masked lanes, which read as zeros:
    y[pixel, c] = clip(sum_t x[pixel + off[t], c] * w[t, c] + bias[c], lo, hi)
the taps summed in order by fused multiply-adds (a rounding order of its own: results agree
with the numpy path to float32 rounding, not bit for bit). Same loop structure as the 8-bit
kernel (``int8_depthwise.py``).
"""

from __future__ import annotations

import ctypes

import numpy as np

from . import ir, jit
from .jit import address
from .layout import aligned_zeros

REQUIRES = ()  # generic vector IR: every target
_NEG_INF = "<" + ", ".join(["float 0xFFF0000000000000"] * 16) + ">"
MAX_TAPS = 49  # unrolled up to 7x7; larger windows keep the numpy path
_V, _VF = ir.V, ir.VF


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
                  f"  {x} = call {_VF} @llvm.masked.load.v16f32.p0(ptr {t}.xp{k}, i32 4, "
                  f"<16 x i1> {mask}, {_VF} {fill})" if masked else
                  f"  {x} = load {_VF}, ptr {t}.xp{k}, align 4"]
            if op == "fma":
                L.append(f"  {t}.a{k} = call {_VF} @llvm.fma.v16f32({_VF} {x}, {_VF} %w{k}, "
                         f"{prev})")
            elif k == 0:
                prev = f"{_VF} {x}"
                continue
            elif op == "avg":
                L.append(f"  {t}.a{k} = fadd {prev}, {x}")
            else:  # numpy's maximum: a NaN on either side wins
                L += [f"  {t}.g{k} = fcmp ogt {_VF} {x}, {prev[len(_VF) + 1:]}",
                      f"  {t}.b{k} = select <16 x i1> {t}.g{k}, {_VF} {x}, {prev}",
                      f"  {t}.n{k} = fcmp uno {_VF} {x}, zeroinitializer",
                      f"  {t}.a{k} = select <16 x i1> {t}.n{k}, {_VF} {x}, {_VF} {t}.b{k}"]
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
    L += ["  br label %cloop",
          "cloop:",
          "  %c0 = phi i64 [0, %rloop], [%c0n, %right.done]",
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
          *_pixels("right", kh, kw, "%ow_hi", "%Wo", True, op=op),
          *ir.chunk_and_row_loop_end()]
    return "\n".join(L)


def module_ir(kh: int, kw: int) -> str:
    return "\n\n".join(ir.declarations("load.f32", "store.f32", "fma") + [_kernel(kh, kw)])


_P, _I = ctypes.c_void_p, ctypes.c_int64
_PROTO = ctypes.CFUNCTYPE(None, _P, _P, _P, _P, _P, *([_I] * 16))


class DepthwiseFloat:
    """A constant depthwise weight (C, 1, kh, kw) as float32 rows of channels per tap (padded
    to 16 channels, 64-byte aligned), ready for ``run``. Raises ``jit.Unavailable`` where the
    kernel cannot run here (checked at every preparation)."""

    __slots__ = ("C", "Cp", "kernel", "w", "_fn")

    def __init__(self, W: np.ndarray) -> None:
        if W.ndim != 4 or W.shape[1] != 1 or not 0 < W.shape[2] * W.shape[3] <= MAX_TAPS:
            raise ValueError(f"depthwise: expected (C, 1, kh, kw) with at most {MAX_TAPS} "
                             f"taps, got {list(W.shape)}")
        reason = jit.why_unavailable(REQUIRES)
        if reason:
            raise jit.Unavailable(reason)
        C, _, kh, kw = W.shape
        self._fn = jit.compile_module(f"depthwise_f32_{kh}x{kw}", module_ir(kh, kw),
                                      {"dw_f32": _PROTO}, REQUIRES).dw_f32
        self.C, self.Cp, self.kernel = C, -(-C // 16) * 16, (kh, kw)
        self.w = aligned_zeros((kh * kw, self.Cp), np.float32)
        self.w[:, :C] = W.reshape(C, kh * kw).T

    def run(self, X: np.ndarray, heads: tuple[int, int], out_hw: tuple[int, int],
            strides: tuple[int, int], dilations: tuple[int, int], bias=None,
            bounds=(-np.inf, np.inf), out: np.ndarray | None = None,
            threads: int = 1) -> np.ndarray:
        """(N, Ho, Wo, C) from the channels-last (N, H, W, C) float32 ``X``, zero-padded by
        ``heads`` (top, left) and as far as the windows read past its end; ``bias`` per channel
        (or None), then the clip ``bounds``; ``out``: a C-contiguous (N, Ho, Wo, C) float32
        array."""
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
        (sh, sw), (dh, dw), (pt, pl) = strides, dilations, heads
        kw = self.kernel[1]
        # output columns whose windows lie inside the image's columns: [ow_lo, ow_hi)
        ow_lo = min(Wo, -(-pl // sw))
        last = Wd - 1 - (kw - 1) * dw + pl  # the last window start inside, plus pl
        ow_hi = max(ow_lo, min(Wo, last // sw + 1 if last >= 0 else 0))
        clip = np.array(bounds, np.float32)
        b = np.zeros(self.Cp, np.float32)
        if bias is not None:
            b[:C] = np.broadcast_to(np.asarray(bias, np.float32).reshape(-1), (C,))
        args = (address(X), address(self.w), address(b), address(clip), address(out), C,
                self.Cp, H, Wd, Ho, Wo, sh, sw, dh, dw, pt, pl, ow_lo, ow_hi)
        rows = N * Ho
        if threads > 1 and rows > 1:
            from ..parallel import run_ranges, split

            run_ranges(lambda r0, r1: self._fn(*args, r0, r1), split(rows, threads))
        else:
            self._fn(*args, 0, rows)
        return out


# compiled with the other kernels on first use (jit._BUNDLE)
BUNDLE = {"depthwise_f32_3x3": (lambda target: module_ir(3, 3), REQUIRES)}

__all__ = ["BUNDLE", "DepthwiseFloat", "MAX_TAPS", "REQUIRES", "module_ir"]
