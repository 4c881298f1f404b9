"""Softmax, LogSoftmax, and the activations FusedConv / FusedGemm name."""

from __future__ import annotations

from typing import Any

from ..array import namespace, normalize_axis
from ..kernels import op
from .elementwise import _gelu


def softmax(x: Any, axis: int = -1) -> Any:
    xp = namespace(x)
    e = xp.exp(x - xp.max(x, axis=axis, keepdims=True))
    return e / xp.sum(e, axis=axis, keepdims=True)


def _flat(x: Any, axis: int) -> tuple[Any, Any]:
    """Opsets < 13: the input as 2-D [prod(before axis), prod(from axis)]."""
    xp = namespace(x)
    a = normalize_axis(axis, x.ndim)
    outer = 1
    for d in x.shape[:a]:
        outer *= d
    return xp, xp.reshape(x, (outer, -1))


@op("Softmax", 13)
def Softmax(input, *, axis=-1):  # noqa: A002 - the schema's name
    return softmax(input, axis)


@op("Softmax", 1, 11)
def Softmax1(input, *, axis=1):  # noqa: A002
    xp, flat = _flat(input, axis)
    return xp.reshape(softmax(flat, -1), input.shape)


@op("LogSoftmax", 13)
def LogSoftmax(input, *, axis=-1):  # noqa: A002
    xp = namespace(input)
    shifted = input - xp.max(input, axis=axis, keepdims=True)
    return shifted - xp.log(xp.sum(xp.exp(shifted), axis=axis, keepdims=True))


@op("LogSoftmax", 1, 11)
def LogSoftmax1(input, *, axis=1):  # noqa: A002
    xp, flat = _flat(input, axis)
    return xp.reshape(LogSoftmax(flat, axis=-1), input.shape)


def make_activation(name: Any, alpha: float | None = None, beta: float | None = None,
                    gamma: float | None = None) -> Any:
    """The activation FusedConv / FusedGemm name (None: identity); parameters default as in
    the standalone operators."""
    name = name.decode() if isinstance(name, bytes) else str(name or "")
    if name in ("", "Identity"):
        return None
    if name == "Relu":
        return lambda y: namespace(y).maximum(y, namespace(y).zeros_like(y))
    if name == "Tanh":
        return lambda y: namespace(y).tanh(y)
    if name in ("Sigmoid", "Logistic"):
        return lambda y: 1.0 / (1.0 + namespace(y).exp(-y))
    if name == "QuickGelu":  # onnxrun's layout level: a convolution's SiLU
        a = 1.702 if alpha is None else alpha
        return lambda y: y / (1.0 + namespace(y).exp(-a * y))
    if name in ("Gelu", "FastGelu"):  # onnxrun's layout level: a Gemm's GELU
        fast = name == "FastGelu"
        return lambda y: _gelu(y, approximate=fast)
    if name == "LeakyRelu":
        a = 0.01 if alpha is None else alpha
        return lambda y: namespace(y).where(y >= 0, y, y * a)
    if name == "Clip":
        lo = alpha if alpha is not None else None
        hi = beta if beta is not None else None
        return lambda y: namespace(y).clip(y, lo, hi)
    if name == "HardSigmoid":
        a = 0.2 if alpha is None else alpha
        b = 0.5 if beta is None else beta
        return lambda y: namespace(y).clip(y * a + b, 0.0, 1.0)
    raise ValueError(f"unsupported fused activation {name!r}")


FUSED_ACTIVATIONS = frozenset({"", "Identity", "Relu", "Tanh", "Sigmoid", "Logistic",
                               "LeakyRelu", "Clip", "HardSigmoid", "QuickGelu", "Gelu",
                               "FastGelu"})
