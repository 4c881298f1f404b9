"""QLinearConv (and onnxrun's ConvIntegerToFloat) on the compiled 8-bit kernels, with
channels-last activations.

Why channels-last: the VNNI GEMM multiplies rows of bytes of the activation by the packed
weight, so a 1x1 convolution of an (N, H, W, C) buffer is that GEMM with no copy at all, its
output (N*H*W, M) is again channels-last, and the depthwise kernel wants channels innermost too.
Outputs are returned as NCHW-shaped views of channels-last memory when the session allows layout
changes (ORT_ENABLE_ALL, as the float convolutions) and every reader is an 8-bit operator that
takes any layout (``_LAYOUT_AGNOSTIC``); otherwise, and for graph outputs, they are NCHW.

Per convolution, chosen once when the kernel is prepared:
- group 1, 1x1, stride 1, no padding: the GEMM on the input itself;
- group 1, any other window: the GEMM on byte im2col rows (kh*kw*C per output pixel), built
  from the input padded with its zero point;
- depthwise (group == C == M): compiled/int8_depthwise.py.
Other groups, rank other than 2-D, or weights that are not constant 8-bit: the numpy kernel.
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import as_strided

from ..compiled import int8_depthwise, int8_gemm
from ..compiled.jit import Unavailable
from ..parallel import split_threads
from .conv import layout_changes_allowed, window_geometry

# Readers of a QLinearConv output that run as fast on channels-last memory (the convolution
# itself, element-wise numpy, a reduction over the spatial axes).
_LAYOUT_AGNOSTIC = frozenset({("", "QLinearConv"), ("com.microsoft", "QLinearConv"),
                              ("com.microsoft", "QLinearAdd"), ("com.microsoft", "QLinearMul"),
                              ("com.microsoft", "QLinearGlobalAveragePool")})


# Readers of ConvIntegerToFloat's float output: element-wise numpy keeps the layout, and the
# dynamic quantization of the next convolution's input reads any dense layout.
_FLOAT_LAYOUT_AGNOSTIC = frozenset({("", "Clip"), ("", "Relu"), ("", "Add"),
                                    ("", "DynamicQuantizeLinear"), ("", "GlobalAveragePool"),
                                    ("ai.onnxrun", "ConvIntegerToFloat")})


def _channels_last_output(ctx, readers: frozenset) -> bool:
    if not layout_changes_allowed(ctx):
        return False
    y = ctx.node.outputs[0]
    graph = ctx.node.graph
    if y is None or not y.uses or (graph is not None and y in graph.outputs):
        return False
    return all((node.domain or "", node.op_type) in readers for node, _ in y.uses)


def _pairs(values, default: int) -> tuple[int, int]:
    return tuple(int(v) for v in values) if values is not None and len(values) else (default,) * 2


class CompiledQLinearConv:
    """A prepared QLinearConv; ``prepare`` returns None where the compiled path does not apply."""

    @classmethod
    def prepare(cls, ctx, conv, W: np.ndarray | None, w_zero_point, float_output=False):
        if W is None or W.ndim != 4 or W.dtype not in (np.int8, np.uint8):
            return None
        if int8_gemm.unavailable() or int8_depthwise.unavailable():
            return None
        if w_zero_point is not None and np.asarray(w_zero_point).size not in (1, W.shape[0]):
            return None
        M, Cg = W.shape[:2]
        g = conv.group
        depthwise = g > 1 and Cg == 1 and M == g
        if g != 1 and not depthwise:
            return None
        try:
            return cls(ctx, conv, W, w_zero_point, depthwise, float_output)
        except Unavailable:  # this window's object cannot be had: the numpy kernel serves
            return None

    def __init__(self, ctx, conv, W: np.ndarray, w_zero_point, depthwise: bool,
                 float_output: bool) -> None:
        self.conv = conv
        self.kernel = tuple(W.shape[2:])
        self.strides = _pairs(conv.strides, 1)
        self.dilations = _pairs(conv.dilations, 1)
        self.M = W.shape[0]
        self.depthwise = depthwise
        self.threads = split_threads(ctx)
        self.channels_last = _channels_last_output(
            ctx, _FLOAT_LAYOUT_AGNOSTIC if float_output else _LAYOUT_AGNOSTIC)
        zp = None if w_zero_point is None else np.asarray(w_zero_point).reshape(-1)
        if depthwise:
            self.dw = int8_depthwise.DepthwiseWeights(W, zp)
        else:  # rows ordered (kh, kw, C) like the im2col rows
            Wm = np.ascontiguousarray(W.transpose(2, 3, 1, 0)).reshape(-1, self.M)
            self.packed = int8_gemm.PackedB(Wm, zp)
        self.pointwise = self.kernel == (1, 1) and self.strides == (1, 1)

    def __call__(self, x, x_zero_point, mult, y_zero_point, out_dtype, bias, float_bias=None,
                 clip=None):
        """The requantized output (8-bit ``out_dtype``) or ``float(acc) * mult + float_bias``
        (float32; clipped to ``clip=(lo, hi)`` if given), or None when this input needs the
        numpy kernel."""
        if x.ndim != 4 or x.dtype not in (np.uint8, np.int8):
            return None
        N, C, H, Wd = x.shape
        heads, _, outs = window_geometry((H, Wd), self.kernel, self.strides, self.dilations,
                                         self.conv.pads, self.conv.auto_pad)
        Ho, Wo = outs
        if x.size == 0 or Ho * Wo == 0:  # an empty batch or output: the numpy kernel's case
            return None
        xzp = int(np.asarray(x_zero_point).reshape(-1)[0]) if x_zero_point is not None else 0
        yzp = int(np.asarray(y_zero_point).reshape(-1)[0]) if y_zero_point is not None else 0
        xt = x.transpose(0, 2, 3, 1)  # channels-last view: free when x came from here
        if self.depthwise:
            Xp = self._padded(xt, heads, outs, xzp)
            Wp = Xp.shape[2]
            (dh, dw) = self.dilations
            offsets = np.array([(i * dh * Wp + j * dw) * C for i in range(self.kernel[0])
                                for j in range(self.kernel[1])], np.int64)
            y = self.dw.run(Xp, offsets, (Ho, Wo), self.strides, xzp, bias, mult, yzp,
                            out_dtype, self.threads, float_bias, clip)
        else:
            if self.pointwise and not any(heads) and (Ho, Wo) == (H, Wd):
                A = xt.reshape(N * H * Wd, C)  # a copy only when x is not channels-last
            else:
                A = self._im2col(self._padded(xt, heads, outs, xzp), outs)
            if np.dtype(out_dtype) == np.float32:
                y = self.packed.matmul(A, xzp, scale=mult, bias=float_bias, clip=clip,
                                       threads=self.threads)
            else:
                y = self.packed.matmul(A, xzp, scale=mult, int_bias=bias,
                                       requantize=(yzp, out_dtype), threads=self.threads)
            y = y.reshape(N, Ho, Wo, self.M)
        y = y.transpose(0, 3, 1, 2)
        return y if self.channels_last else np.ascontiguousarray(y)

    def _padded(self, xt: np.ndarray, heads, outs, fill: int) -> np.ndarray:
        """The channels-last input padded with its zero point to exactly what the windows read,
        C-contiguous."""
        N, H, W, C = xt.shape
        need = [(o - 1) * s + (k - 1) * d + 1 for o, s, k, d in
                zip(outs, self.strides, self.kernel, self.dilations, strict=True)]
        if not any(heads) and need[0] <= H and need[1] <= W:
            return np.ascontiguousarray(xt)
        Xp = np.full((N, need[0], need[1], C), fill, xt.dtype)
        h1, w1 = min(heads[0] + H, need[0]), min(heads[1] + W, need[1])
        Xp[:, heads[0]:h1, heads[1]:w1] = xt[:, : h1 - heads[0], : w1 - heads[1]]
        return Xp

    def _im2col(self, Xp: np.ndarray, outs) -> np.ndarray:
        """(N*Ho*Wo, kh*kw*C) rows of window bytes, ordered (kh, kw, C) like the weight rows."""
        N, _, Wp, C = Xp.shape
        s = Xp.strides
        (sh, sw), (dh, dw) = self.strides, self.dilations
        view = as_strided(Xp, (N, outs[0], outs[1], self.kernel[0], self.kernel[1], C),
                          (s[0], s[1] * sh, s[2] * sw, s[1] * dh, s[2] * dw, s[3]),
                          writeable=False)
        return view.reshape(N * outs[0] * outs[1], -1)


__all__ = ["CompiledQLinearConv"]
