"""Depthwise 8-bit convolution, channels-last, requantized to 8 bits (QLinearConv with
group == channels).

Why: a depthwise convolution is not a GEMM, and numpy runs it as one strided multiply-add per
kernel tap over the whole image (18 passes for a 3x3 kernel) on float copies of the bytes. Here
each output pixel's 16-channel chunk accumulates its taps in an int32 register and is
requantized and stored as bytes at once.

The input is an (N, Hp, Wp, C) byte buffer already padded with the input's zero point, so every
tap is in bounds and padding contributes ``x_zp * w``; ``init[c] = bias[c] - x_zp * sum_t w[t, c]``
cancels exactly those terms for every pixel:
    acc[c] = init[c] + sum_t x[pixel + off[t], c] * w[t, c]  =  bias + sum_t (x - x_zp) * w
with ``w`` the weight minus its zero point (int32, one row of channels per tap). The epilogue
is the GEMM's: clamp(rint(float(acc) * scale[c]) + y_zp, lo, hi), as MLAS.
"""

from __future__ import annotations

import ctypes

import numpy as np

from . import ir, jit
from .layout import aligned_zeros

REQUIRES = ()  # generic vector IR: every target
_V, _VF, _VB = ir.V, ir.VF, ir.VB


def _pixels(tag: str, ext: str, T: int, mode: str, masked: bool) -> list[str]:
    """The loop over a row's output pixels for one 16-channel chunk, labelled ``tag``: the
    taps' sum, scale, epilogue, store. ``masked`` for the last, partial chunk; whole chunks
    use plain loads and stores (masked byte accesses go lane by lane on AVX2)."""
    t_ = f"%{tag}."
    L = [f"{tag}.loop:",
         f"  {t_}ow = phi i64 [0, %cloop], [{t_}own, %{tag}.loop]",
         f"  {t_}inw = mul i64 {t_}ow, %swc",
         f"  {t_}xb = add i64 %xc, {t_}inw",
         f"  {t_}outw = mul i64 {t_}ow, %C",
         f"  {t_}ya = add i64 %yc, {t_}outw"]
    # float32 products and sums of bytes times weights are exact integers (T * 255 * 255 <
    # 2**24 for T <= MAX_TAPS); the FMA has twice vpmulld's throughput
    prev = f"{_VF} zeroinitializer"
    for t in range(T):
        L += [f"  {t_}xa{t} = add i64 {t_}xb, %off{t}",
              f"  {t_}xp{t} = getelementptr i8, ptr %X, i64 {t_}xa{t}",
              f"  {t_}xv{t} = call {_VB} @llvm.masked.load.v16i8.p0(ptr {t_}xp{t}, i32 1, "
              f"<16 x i1> %mask, {_VB} zeroinitializer)" if masked else
              f"  {t_}xv{t} = load {_VB}, ptr {t_}xp{t}, align 1",
              f"  {t_}x{t} = {ext} {_VB} {t_}xv{t} to {_V}",
              f"  {t_}xf{t} = sitofp {_V} {t_}x{t} to {_VF}",
              f"  {t_}acc{t + 1} = call {_VF} @llvm.fma.v16f32({_VF} {t_}xf{t}, {_VF} %w{t}, "
              f"{prev})"]
        prev = f"{_VF} {t_}acc{t + 1}"
    L += [f"  {t_}sum = fptosi {prev} to {_V}",
          f"  {t_}acc = add {_V} {t_}sum, %acc0",
          f"  {t_}f = sitofp {_V} {t_}acc to {_VF}",
          f"  {t_}m = fmul {_VF} {t_}f, %sv"]
    if mode == "q8":
        L += [*ir.requantize(f"{t_}b", f"{t_}m", "%zp", "%lo", "%hi"),
              f"  {t_}yp = getelementptr i8, ptr %Y, i64 {t_}ya",
              f"  call void @llvm.masked.store.v16i8.p0({_VB} {t_}b, ptr {t_}yp, i32 1, "
              "<16 x i1> %mask)" if masked else f"  store {_VB} {t_}b, ptr {t_}yp, align 1"]
    else:
        out = f"{t_}ob" if mode == "f32c" else f"{t_}o"
        L.append(f"  {out} = fadd {_VF} {t_}m, %bv")
        if mode == "f32c":  # as np.clip: NaN stays NaN
            L += [f"  {t_}clt = fcmp olt {_VF} {t_}ob, %clo",
                  f"  {t_}cl = select <16 x i1> {t_}clt, {_VF} %clo, {_VF} {t_}ob",
                  f"  {t_}cgt = fcmp ogt {_VF} {t_}cl, %chi",
                  f"  {t_}o = select <16 x i1> {t_}cgt, {_VF} %chi, {_VF} {t_}cl"]
        L += [f"  {t_}yp = getelementptr float, ptr %Y, i64 {t_}ya",
              f"  call void @llvm.masked.store.v16f32.p0({_VF} {t_}o, ptr {t_}yp, i32 4, "
              "<16 x i1> %mask)" if masked else f"  store {_VF} {t_}o, ptr {t_}yp, align 4"]
    return L + [f"  {t_}own = add i64 {t_}ow, 1",
                f"  {t_}wmore = icmp slt i64 {t_}own, %Wo",
                f"  br i1 {t_}wmore, label %{tag}.loop, label %cnext"]


def _kernel(signed: bool, T: int, mode: str) -> str:
    """Rows [r0, r1) of output pixels; per row, per 16-channel chunk (the last masked), the T
    tap weights and offsets stay in registers while the row's pixels stream past them.
    ``mode`` "q8": requantized bytes, ``%yq`` = (zero point, lo, hi); "f32": float32
    ``float(acc) * scale + bias``, ``%yq`` = the bias per channel; "f32c": that clipped to
    (lo, hi), ``%yq`` = the bias (``Cp`` floats) then lo, hi."""
    ext = "sext" if signed else "zext"
    name = f"dw_{'s8' if signed else 'u8'}_{mode}"
    L = [f"define void @{name}(ptr %X, ptr %off, ptr %W, ptr %init, ptr %scale, ptr %yq, "
         "ptr %Y, i64 %C, i64 %Cp, i64 %Ho, i64 %Wo, i64 %swc, i64 %shrow, i64 %img, "
         "i64 %r0, i64 %r1) nounwind {",
         "entry:"]
    if mode == "q8":
        L += ir.load_params("%yq", ("zp", "lo", "hi"))
    elif mode == "f32c":
        L += ["  %yqb = getelementptr float, ptr %yq, i64 %Cp",
              *ir.load_params("%yqb", ("clo", "chi"))]
    for t in range(T):
        L += [f"  %offp{t} = getelementptr i64, ptr %off, i64 {t}",
              f"  %off{t} = load i64, ptr %offp{t}, align 8"]
    L += ["  %any = icmp slt i64 %r0, %r1",
          "  br i1 %any, label %rloop, label %end",
          "rloop:",  # one output row (n, oh)
          "  %r = phi i64 [%r0, %entry], [%rn, %rnext]",
          "  %n = udiv i64 %r, %Ho",
          "  %oh = urem i64 %r, %Ho",
          "  %ina = mul i64 %n, %img",
          "  %inb = mul i64 %oh, %shrow",
          "  %in0 = add i64 %ina, %inb",
          "  %outa = mul i64 %r, %Wo",
          "  %out0 = mul i64 %outa, %C",
          "  br label %cloop",
          "cloop:",  # 16 channels, the last chunk masked
          "  %c0 = phi i64 [0, %rloop], [%c0n, %cnext]",
          "  %left = sub i64 %C, %c0",
          *ir.lane_mask("%mask", "%left"),
          "  %ip = getelementptr i32, ptr %init, i64 %c0",
          f"  %acc0 = load {_V}, ptr %ip, align 4",
          "  %sp = getelementptr float, ptr %scale, i64 %c0",
          f"  %sv = load {_VF}, ptr %sp, align 4"]
    if mode != "q8":
        L += ["  %bp = getelementptr float, ptr %yq, i64 %c0",
              f"  %bv = load {_VF}, ptr %bp, align 4"]
    L += ir.tap_weights(T, align=4)
    L += ["  %xc = add i64 %in0, %c0",
          "  %yc = add i64 %out0, %c0",
          "  %whole = icmp sge i64 %left, 16",
          "  br i1 %whole, label %w.loop, label %m.loop",
          *_pixels("w", ext, T, mode, masked=False),
          *_pixels("m", ext, T, mode, masked=True),
          "cnext:",
          *ir.chunk_and_row_loop_end()]
    return "\n".join(L)


def module_ir(T: int) -> str:
    """The kernels for windows of T taps (the taps are unrolled)."""
    decls = ir.declarations("load.i8", "store.i8", "store.f32", "rint", "fma", "minnum",
                            "maxnum")
    return "\n\n".join(decls + [_kernel(signed, T, mode) for signed in (False, True)
                                  for mode in _MODES])


_P, _I = ctypes.c_void_p, ctypes.c_int64
_PROTO = ctypes.CFUNCTYPE(None, _P, _P, _P, _P, _P, _P, _P, _I, _I, _I, _I, _I, _I, _I, _I, _I)
MAX_TAPS = 49  # unrolled up to 7x7 (and 49 * 255 * 255 < 2**24); larger ones take numpy


def unavailable() -> str | None:
    """None when the kernel can run here (the 3x3 window's object loaded; ``DepthwiseWeights``
    raises ``jit.Unavailable`` for a window whose object cannot be had), else why not."""
    return jit.why_unavailable(REQUIRES) or \
        jit.why_not_loaded("int8_depthwise_9", lambda: _module(9))


_MODES = ("q8", "f32", "f32c")


def _module(T: int) -> jit.Module:
    names = [f"dw_{s}_{mode}" for s in ("u8", "s8") for mode in _MODES]
    return jit.compile_module(f"int8_depthwise_{T}", module_ir(T),
                              {name: _PROTO for name in names}, REQUIRES)


class DepthwiseWeights:
    """A depthwise weight (C, 1, *kernel) minus its zero point, as float32 rows of channels per
    tap (padded to 16 channels), with the per-channel sums the zero-point terms need."""

    __slots__ = ("C", "Cp", "taps", "w", "wsum", "_functions")

    def __init__(self, W: np.ndarray, zero_point=None) -> None:
        C = W.shape[0]
        taps = int(np.prod(W.shape[2:]))
        if not 0 < taps <= MAX_TAPS:
            raise ValueError(f"depthwise: {taps} taps (at most {MAX_TAPS})")
        module = _module(taps)
        self._functions = {(signed, mode): getattr(module, f"dw_{'s8' if signed else 'u8'}_{mode}")
                           for signed in (False, True) for mode in _MODES}
        w = W.reshape(C, taps).astype(np.int64)
        if zero_point is not None:
            w = w - np.asarray(zero_point, np.int64).reshape(-1, 1)
        self.C, self.Cp, self.taps = C, -(-C // 16) * 16, taps
        self.w = aligned_zeros((taps, self.Cp), np.float32)
        self.w[:, :C] = w.T
        self.wsum = w.sum(axis=1)

    def run(self, Xp: np.ndarray, offsets: np.ndarray, out_hw: tuple[int, int],
            strides: tuple[int, int], x_zero_point: int, int_bias, scale, y_zero_point,
            out_dtype, threads: int = 1, float_bias=None, clip=None) -> np.ndarray:
        """(N, Ho, Wo, C) from the padded (N, Hp, Wp, C) input ``Xp``; ``offsets``: each tap's
        byte offset from its window's first pixel (int64). ``out_dtype`` float32: the output
        is ``float(acc) * scale + float_bias``, clipped to ``clip=(lo, hi)`` if given; 8-bit:
        requantized with ``y_zero_point``."""
        N, Hp, Wp, C = Xp.shape
        if C != self.C or Xp.dtype not in (np.uint8, np.int8) or not Xp.flags.c_contiguous:
            raise ValueError(f"depthwise: expected a contiguous 8-bit [N, H, W, {self.C}] input")
        if offsets.dtype != np.int64 or offsets.size != self.taps:
            raise ValueError(f"depthwise: expected {self.taps} int64 tap offsets")
        Ho, Wo = out_hw
        init = np.zeros(self.Cp, np.int32)
        v = -int(x_zero_point) * self.wsum
        if int_bias is not None:
            v = v + np.asarray(int_bias, np.int64).reshape(-1)
        init[:C] = v
        sc = np.zeros(self.Cp, np.float32)
        sc[:C] = np.broadcast_to(np.asarray(scale, np.float32).reshape(-1), (C,))
        out_dtype = np.dtype(out_dtype)
        if out_dtype == np.float32:
            mode, extra = "f32", np.zeros(self.Cp + 2, np.float32)
            if float_bias is not None:
                extra[:C] = np.broadcast_to(np.asarray(float_bias, np.float32).reshape(-1), (C,))
            if clip is not None:
                mode, extra[self.Cp:] = "f32c", clip
        else:
            info = np.iinfo(out_dtype)
            mode, extra = "q8", np.array([y_zero_point, info.min, info.max], np.float32)
        out = np.empty((N, Ho, Wo, C), out_dtype)
        if out.size == 0:
            return out
        fn = self._functions[(Xp.dtype == np.int8, mode)]
        args = (Xp.ctypes.data, offsets.ctypes.data, self.w.ctypes.data,
                init.ctypes.data, sc.ctypes.data, extra.ctypes.data, out.ctypes.data, C,
                self.Cp, Ho, Wo, strides[1] * C, strides[0] * Wp * C, Hp * Wp * C)
        rows = N * Ho
        if threads > 1 and rows > 1:
            from ..parallel import run_ranges, split

            run_ranges(lambda r0, r1: fn(*args, r0, r1), split(rows, threads))
        else:
            fn(*args, 0, rows)
        return out



# compiled with the other kernels on first use (jit._BUNDLE)
BUNDLE = {"int8_depthwise_9": (lambda target: module_ir(9), REQUIRES)}  # 3x3 windows

__all__ = ["BUNDLE", "DepthwiseWeights", "MAX_TAPS", "REQUIRES", "module_ir", "unavailable"]
