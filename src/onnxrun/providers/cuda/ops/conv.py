"""Conv and com.microsoft FusedConv: an implicit GEMM. The window patches of the padded input
are gathered (im2col) and multiplied with the weights by one batched matmul per group (cuBLAS
on CuPy); a 1x1 convolution is the matmul alone. ``cupy/conv.py`` does the gathering in one
strided copy on CuPy."""

from __future__ import annotations

from typing import Any

from ...cpu.ops.contrib.fused import activation_arguments
from ..array import is_float, matmul, namespace
from ..kernels import KernelContext, op
from . import _windows
from .activation import FUSED_ACTIVATIONS, make_activation

MS = "com.microsoft"


@op("Conv", 1, 11)
class Conv:
    def __init__(self, ctx: KernelContext, *, auto_pad="NOTSET", dilations=None, group=1,
                 kernel_shape=None, pads=None, strides=None) -> None:
        self.auto_pad, self.group = auto_pad, int(group)
        self.dilations = None if dilations is None else [int(d) for d in dilations]
        self.kernel_shape = None if kernel_shape is None else [int(k) for k in kernel_shape]
        self.pads = None if pads is None else [int(p) for p in pads]
        self.strides = None if strides is None else [int(s) for s in strides]
        self.act = None
        fast = getattr(ctx.provider, "fast", None)
        self.im2col = fast.conv.im2col if fast is not None else None
        # cuDNN (nvidia-cudnn-frontend) for a 2-D float convolution where it imports; the
        # implicit GEMM below for the rest and for what cuDNN cannot plan
        self.cudnn = None
        t = ctx.input_type(1)
        if fast is not None and fast.cudnn.available() and t is not None and \
                t.tensor_type.elem_type in (1, 10) and len(t.tensor_type.shape.dim) == 4:
            self.cudnn = fast.cudnn
            self.cudnn_convs: dict[tuple, Any] = {}

    def __call__(self, X, W, B=None):
        return self._forward(X, W, B, None)

    def _forward(self, X: Any, W: Any, B: Any, Z: Any) -> Any:
        xp = namespace(X)
        N, C = X.shape[:2]
        M = W.shape[0]
        kernel = self.kernel_shape or list(W.shape[2:])
        spatial = tuple(X.shape[2:])
        strides, dil, before, after, out = _windows.geometry(
            spatial, kernel, self.strides, self.dilations, self.pads, self.auto_pad)
        G = self.group
        K = 1
        for k in kernel:
            K *= k
        L = 1
        for o in out:
            L *= o
        if self.cudnn is not None and is_float(xp, X):
            y = self._cudnn(X, W, strides, dil, before, after, out)
            if y is not None:
                return self._epilogue(xp, y, B, Z, M, out)
        if K == 1 and all(s == 1 for s in strides) and not any(before) and not any(after):
            cols = xp.reshape(X, (N, G, C // G, L))
        elif self.im2col is not None:
            cols = self.im2col(X, before, after, out, strides, dil, kernel, G)
        else:
            p = _windows.padded(X, before, after, out, strides, dil, kernel,
                                 0.0 if is_float(xp, X) else 0)
            taken = _windows.patches(p, out, strides, dil, kernel)
            cols = xp.reshape(xp.stack(taken, axis=2), (N, G, (C // G) * K, L))
        w = xp.reshape(W, (G, M // G, (C // G) * K))
        return self._epilogue(xp, xp.reshape(matmul(w, cols), (N, M, *out)), B, Z, M, out)

    def _epilogue(self, xp: Any, y: Any, B: Any, Z: Any, M: int, out: list[int]) -> Any:
        if B is not None:
            y = y + xp.reshape(B, (1, M) + (1,) * len(out))
        if Z is not None:
            y = y + Z
        if self.act is not None:
            y = self.act(y)
        return y

    def _cudnn(self, X: Any, W: Any, strides: list[int], dil: list[int], before: list[int],
               after: list[int], out: list[int]) -> Any:
        """cuDNN's convolution (no bias), or None where it has no plan for this case."""
        key = (tuple(strides), tuple(dil), tuple(before), tuple(after))
        conv = self.cudnn_convs.get(key)
        if conv is None:
            conv = self.cudnn_convs[key] = self.cudnn.Convolution(strides, dil, before, after)
        return conv(X, W, out)


def _fused_activation_known(node: Any) -> bool:
    name = node.attr("activation", "")
    return (name.decode() if isinstance(name, bytes) else name) in FUSED_ACTIVATIONS


@op("FusedConv", 1, domain=MS, check=_fused_activation_known)
class FusedConv(Conv):
    def __init__(self, ctx: KernelContext, *, activation="", activation_params=None,
                 auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=None,
                 strides=None) -> None:
        super().__init__(ctx, auto_pad=auto_pad, dilations=dilations, group=group,
                         kernel_shape=kernel_shape, pads=pads, strides=strides)
        self.act = make_activation(activation, *activation_arguments(activation_params))

    def __call__(self, X, W, B=None, Z=None):
        return self._forward(X, W, B, Z)
