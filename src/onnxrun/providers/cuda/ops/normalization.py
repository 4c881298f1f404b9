"""BatchNormalization (inference), LayerNormalization, SimplifiedLayerNormalization (RMS),
com.microsoft SkipLayerNormalization / SkipSimplifiedLayerNormalization, LRN. Statistics in
float32 at least, as onnxruntime computes them."""

from __future__ import annotations

from typing import Any

from ..array import namespace, normalize_axis
from ..kernels import KernelContext, op, text_attribute
from .activation import make_activation

MS = "com.microsoft"
_RELU = make_activation("Relu")


def _stat(xp: Any, x: Any) -> Any:
    return xp.astype(x, xp.float32) if x.dtype == getattr(xp, "float16", None) else x


def _inference_only(node: Any) -> bool:
    return not node.attr("training_mode", 0) and len(node.outputs) == 1


@op("BatchNormalization", 7, 9, 14, 15, check=_inference_only)
def BatchNormalization(X, scale, B, input_mean, input_var, *, epsilon=1e-5, momentum=0.9,
                       training_mode=0):
    xp = namespace(X)
    shape = (1, -1) + (1,) * (X.ndim - 2)
    inv = scale / xp.sqrt(input_var + epsilon)
    shift = B - input_mean * inv
    return X * xp.reshape(inv, shape) + xp.reshape(shift, shape)


@op("FusedBatchNormalization", 1, domain="ai.onnxrun")
def FusedBatchNormalization(X, scale, B, input_mean, input_var, *, activation="Relu",
                            epsilon=1e-5, momentum=0.9):
    """onnxrun's layout level's BatchNormalization + Relu (made for the CPU's one pass)."""
    activation = text_attribute(activation)
    if activation != "Relu":
        raise ValueError(f"FusedBatchNormalization: activation must be 'Relu', got "
                         f"{activation!r}")
    return _RELU(BatchNormalization(X, scale, B, input_mean, input_var, epsilon=epsilon))


def layer_norm(x: Any, axis: int, epsilon: float, scale: Any, bias: Any) -> tuple[Any, Any, Any]:
    xp = namespace(x)
    axes = tuple(range(normalize_axis(axis, x.ndim), x.ndim))
    s = _stat(xp, x)
    mean = xp.mean(s, axis=axes, keepdims=True)
    centered = s - mean
    inv = 1.0 / xp.sqrt(xp.mean(centered * centered, axis=axes, keepdims=True) + epsilon)
    y = xp.astype(centered * inv, x.dtype) * scale
    if bias is not None:
        y = y + bias
    return y, mean, inv


def _one_output_stats(node: Any) -> bool:
    """The mean / inverse-deviation outputs are left to the CPU provider (training graphs)."""
    outputs = node.graph.outputs if node.graph is not None else []
    return all(not v.name or (not v.uses and v not in outputs) for v in node.outputs[1:3])


@op("LayerNormalization", 17, check=_one_output_stats)
@op("LayerNormalization", 1, domain=MS, check=_one_output_stats)
def LayerNormalization(X, Scale, B=None, *, axis=-1, epsilon=1e-5, stash_type=1):
    return layer_norm(X, axis, epsilon, Scale, B)[0]


def rms_norm(x: Any, axis: int, epsilon: float, scale: Any) -> Any:
    xp = namespace(x)
    axes = tuple(range(normalize_axis(axis, x.ndim), x.ndim))
    s = _stat(xp, x)
    inv = 1.0 / xp.sqrt(xp.mean(s * s, axis=axes, keepdims=True) + epsilon)
    return xp.astype(s * inv, x.dtype) * scale


@op("SimplifiedLayerNormalization", 1, check=_one_output_stats)
@op("SimplifiedLayerNormalization", 1, domain=MS, check=_one_output_stats)
def SimplifiedLayerNormalization(X, scale, *, axis=-1, epsilon=1e-5, stash_type=1):
    return rms_norm(X, axis, epsilon, scale)


@op("RMSNormalization", 23)
def RMSNormalization(X, scale, *, axis=-1, epsilon=1e-5, stash_type=1):
    return rms_norm(X, axis, epsilon, scale)


@op("SkipLayerNormalization", 1, domain=MS, check=_one_output_stats)
class SkipLayerNormalization:
    """LayerNorm(input + skip + bias) * gamma + beta; output 3 is the sum."""

    def __init__(self, ctx: KernelContext, *, epsilon=1e-12) -> None:
        self.epsilon = float(epsilon)
        self.want_sum = ctx.output_used(3)

    def __call__(self, input, skip, gamma, beta=None, bias=None):  # noqa: A002 - schema
        s = input + skip
        if bias is not None:
            s = s + bias
        y = layer_norm(s, -1, self.epsilon, gamma, beta)[0]
        return y, None, None, (s if self.want_sum else None)


@op("SkipSimplifiedLayerNormalization", 1, domain=MS, check=_one_output_stats)
class SkipSimplifiedLayerNormalization:
    def __init__(self, ctx: KernelContext, *, epsilon=1e-12) -> None:
        self.epsilon = float(epsilon)
        self.want_sum = ctx.output_used(3)

    def __call__(self, input, skip, gamma, bias=None):  # noqa: A002 - the schema's name
        s = input + skip
        if bias is not None:
            s = s + bias
        return rms_norm(s, -1, self.epsilon, gamma), None, None, (s if self.want_sum else None)


@op("LRN", 1, 13)
def LRN(X, *, alpha=1e-4, beta=0.75, bias=1.0, size):
    xp = namespace(X)
    size = int(size)
    C = X.shape[1]
    sq = X * X
    lo, hi = (size - 1) // 2, size - 1 - (size - 1) // 2
    # the channel window sum as a sum of shifted slices of a zero-padded copy
    padded = xp.zeros((X.shape[0], C + lo + hi, *X.shape[2:]), dtype=X.dtype, device=X.device)
    padded[:, lo:lo + C, ...] = sq
    acc = padded[:, 0:C, ...]
    for i in range(1, size):
        acc = acc + padded[:, i:i + C, ...]
    return X / xp.pow(bias + (alpha / size) * acc, beta)


@op("InstanceNormalization", 6)
def InstanceNormalization(input, scale, B, *, epsilon=1e-5):  # noqa: A002 - schema
    xp = namespace(input)
    axes = tuple(range(2, input.ndim))
    shape = (1, -1) + (1,) * (input.ndim - 2)
    s = _stat(xp, input)
    mean = xp.mean(s, axis=axes, keepdims=True)
    centered = s - mean
    inv = 1.0 / xp.sqrt(xp.mean(centered * centered, axis=axes, keepdims=True) + epsilon)
    y = xp.astype(centered * inv, input.dtype)
    return y * xp.reshape(scale, shape) + xp.reshape(B, shape)
