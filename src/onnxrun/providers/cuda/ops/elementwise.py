"""Elementwise operators: arithmetic, comparisons, logic, unary math, Cast, Where, Clip, and the
GELU family (ONNX Gelu, com.microsoft Gelu / FastGelu / BiasGelu / QuickGelu)."""

from __future__ import annotations

import math
from typing import Any

from ....dtypes import np_dtype
from ..array import is_float, namespace
from ..kernels import KernelContext, op

MS = "com.microsoft"


def _binary(name: str, fn: Any) -> Any:
    def kernel(A, B):
        return fn(namespace(A), A, B)

    kernel.__name__ = name
    return kernel


def _div(xp: Any, a: Any, b: Any) -> Any:
    if is_float(xp, a):
        return xp.divide(a, b)
    # integer Div truncates toward zero (C), floor_divide floors
    q = xp.floor_divide(xp.abs(a), xp.abs(b))
    negative = xp.logical_xor(xp.less(a, 0), xp.less(b, 0))
    return xp.where(negative, -q, q)


def _pow(xp: Any, a: Any, b: Any) -> Any:
    if b.dtype != a.dtype:
        b = xp.astype(b, a.dtype)
    return xp.pow(a, b)


for _name, _versions, _fn in [
    ("Add", (7, 13, 14), lambda xp, a, b: xp.add(a, b)),
    ("Sub", (7, 13, 14), lambda xp, a, b: xp.subtract(a, b)),
    ("Mul", (7, 13, 14), lambda xp, a, b: xp.multiply(a, b)),
    ("Div", (7, 13, 14), _div),
    ("Pow", (7, 12, 13, 15), _pow),
    ("Equal", (7, 11, 13, 19), lambda xp, a, b: xp.equal(a, b)),
    ("Less", (7, 9, 13), lambda xp, a, b: xp.less(a, b)),
    ("LessOrEqual", (12, 16), lambda xp, a, b: xp.less_equal(a, b)),
    ("Greater", (7, 9, 13), lambda xp, a, b: xp.greater(a, b)),
    ("GreaterOrEqual", (12, 16), lambda xp, a, b: xp.greater_equal(a, b)),
    ("And", (7,), lambda xp, a, b: xp.logical_and(a, b)),
    ("Or", (7,), lambda xp, a, b: xp.logical_or(a, b)),
    ("Xor", (7,), lambda xp, a, b: xp.logical_xor(a, b)),
]:
    op(_name, *_versions)(_binary(_name, _fn))


@op("Mod", 10, 13)
def Mod(A, B, *, fmod=0):
    xp = namespace(A)
    if not fmod:
        return xp.remainder(A, B)  # the sign of the divisor, as Python's %
    # C fmod: the sign of the dividend
    return A - (xp.trunc(A / B) if is_float(xp, A) else _div(xp, A, B)) * B


def _unary(name: str, versions: tuple[int, ...], fn: Any) -> None:
    def kernel(X):
        return fn(namespace(X), X)

    kernel.__name__ = name
    op(name, *versions)(kernel)


for _name, _versions, _fn in [
    ("Neg", (6, 13), lambda xp, x: xp.negative(x)),
    ("Abs", (6, 13), lambda xp, x: xp.abs(x)),
    ("Sqrt", (6, 13), lambda xp, x: xp.sqrt(x)),
    ("Exp", (6, 13), lambda xp, x: xp.exp(x)),
    ("Log", (6, 13), lambda xp, x: xp.log(x)),
    ("Tanh", (6, 13), lambda xp, x: xp.tanh(x)),
    ("Sin", (7,), lambda xp, x: xp.sin(x)),
    ("Cos", (7,), lambda xp, x: xp.cos(x)),
    ("Floor", (6, 13), lambda xp, x: xp.floor(x)),
    ("Ceil", (6, 13), lambda xp, x: xp.ceil(x)),
    ("Round", (11,), lambda xp, x: xp.round(x)),
    ("Sign", (9, 13), lambda xp, x: xp.sign(x)),
    ("Not", (1,), lambda xp, x: xp.logical_not(x)),
    ("Reciprocal", (6, 13), lambda xp, x: 1.0 / x),
    ("Relu", (6, 13, 14), lambda xp, x: xp.maximum(x, xp.zeros_like(x))),
    ("Sigmoid", (6, 13), lambda xp, x: 1.0 / (1.0 + xp.exp(-x))),
    ("Softplus", (1,), lambda xp, x: xp.where(x > 20.0, x, xp.log1p(xp.exp(x)))),
    ("Softsign", (1,), lambda xp, x: x / (1.0 + xp.abs(x))),
    ("IsNaN", (9, 13, 20), lambda xp, x: xp.isnan(x)),
    ("Identity", (1, 13, 14, 16, 19, 21, 23, 24, 25), lambda xp, x: x),
]:
    _unary(_name, _versions, _fn)


def erf(x: Any) -> Any:
    """erf on any array namespace: CuPy's own where it runs (``cupy/elementwise.py``), else
    Abramowitz-Stegun 7.1.26 (|error| <= 1.5e-7)."""
    xp = namespace(x)
    fast = _fast_erf(xp)
    if fast is not None:
        return fast(x)
    a = xp.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * a)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (
        -1.453152027 + t * 1.061405429))))
    y = 1.0 - poly * xp.exp(-a * a)
    return xp.where(x < 0, -y, y)


def _fast_erf(xp: Any) -> Any:
    if "cupy" in getattr(xp, "__name__", ""):
        from ..cupy.elementwise import erf as cupy_erf

        return cupy_erf
    return None


@op("Erf", 9, 13)
def Erf(X):
    return erf(X)


_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def _gelu(x: Any, bias: Any = None, approximate: bool = False) -> Any:
    """GELU of ``x + bias``: one fused kernel on CuPy (``cupy/elementwise.py``)."""
    xp = namespace(x)
    if "cupy" in getattr(xp, "__name__", ""):
        from ..cupy import elementwise as fast

        if fast.fused(x):
            return fast.gelu(x, bias, approximate)
    if bias is not None:
        x = x + bias
    if approximate:
        return 0.5 * x * (1.0 + xp.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * x * x * x)))
    return 0.5 * x * (1.0 + erf(x * (1.0 / math.sqrt(2.0))))


@op("Gelu", 20)
def Gelu(X, *, approximate="none"):
    return _gelu(X, approximate=approximate == "tanh")


@op("Gelu", 1, domain=MS)
def MsGelu(X):
    return _gelu(X)


@op("BiasGelu", 1, domain=MS)
def BiasGelu(A, B):
    return _gelu(A, B)


@op("FastGelu", 1, domain=MS)
def FastGelu(X, bias=None):
    return _gelu(X, bias, approximate=True)


@op("QuickGelu", 1, domain=MS)
def QuickGelu(X, *, alpha=1.702):
    xp = namespace(X)
    return X * (1.0 / (1.0 + xp.exp(-alpha * X)))


@op("LeakyRelu", 6, 16)
def LeakyRelu(X, *, alpha=0.01):
    xp = namespace(X)
    return xp.where(X >= 0, X, X * alpha)


@op("Elu", 6)
def Elu(X, *, alpha=1.0):
    xp = namespace(X)
    return xp.where(X > 0, X, alpha * xp.expm1(X))


@op("HardSigmoid", 6)
def HardSigmoid(X, *, alpha=0.2, beta=0.5):
    xp = namespace(X)
    return xp.clip(X * alpha + beta, 0.0, 1.0)


@op("HardSwish", 14)
def HardSwish(X):
    xp = namespace(X)
    return X * xp.clip(X * (1.0 / 6.0) + 0.5, 0.0, 1.0)


@op("Where", 9, 16)
def Where(condition, X, Y):
    return namespace(X).where(condition, X, Y)


def _variadic(name: str, versions: tuple[int, ...], reduce: Any) -> None:
    def kernel(*inputs):
        xp = namespace(inputs[0])
        out = inputs[0]
        for x in inputs[1:]:
            out = reduce(xp, out, x)
        return out

    kernel.__name__ = name
    op(name, *versions)(kernel)


_variadic("Sum", (6, 8, 13), lambda xp, a, b: xp.add(a, b))
_variadic("Max", (6, 8, 12, 13), lambda xp, a, b: xp.maximum(a, b))
_variadic("Min", (6, 8, 12, 13), lambda xp, a, b: xp.minimum(a, b))


@op("Mean", 6, 8, 13)
def Mean(*inputs):
    xp = namespace(inputs[0])
    out = inputs[0]
    for x in inputs[1:]:
        out = xp.add(out, x)
    return out / len(inputs)


@op("Clip", 11, 12, 13, host_inputs=(1, 2))
def Clip(input, min=None, max=None):  # noqa: A002 - the schema's names
    xp = namespace(input)
    lo = None if min is None else min.item()
    hi = None if max is None else max.item()
    if lo is None and hi is None:
        return input
    return xp.clip(input, lo, hi)


@op("Clip", 6)
def Clip6(input, *, min=-3.4028234663852886e38, max=3.4028234663852886e38):  # noqa: A002
    return namespace(input).clip(input, min, max)


@op("Cast", 6, 9, 13, 19, 21, 23, 24, 25)
class Cast:
    def __init__(self, ctx: KernelContext, *, to, saturate=1, round_mode="up") -> None:
        self.device = ctx.provider.backend
        self.dtype = self.device.as_dtype(np_dtype(to))

    def __call__(self, input):  # noqa: A002
        xp = namespace(input)
        if input.dtype == self.dtype:
            return input
        if xp.isdtype(self.dtype, "bool"):
            return input != 0
        if xp.isdtype(self.dtype, "integral") and is_float(xp, input):
            input = xp.trunc(input)  # C casts truncate; NaN/inf are undefined in ONNX too
        return xp.astype(input, self.dtype)


__all__ = ["erf"]
