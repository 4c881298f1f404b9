"""Activations and the softmax family.

Attributes arrive as Python floats, which numpy 2 (NEP 50) keeps in the array's precision, so
float16/float32 inputs keep their dtype. Temporaries are reused in place where that is safe
(only arrays created here are ever written).
"""

from __future__ import annotations

import functools
import math

import numpy as np

from ....dtypes import compute_dtype
from .. import blas
from ..kernels import KernelContext, op, takes_out
from ..parallel import threads_for
from .elementwise import erf, gelu_float32, gelu_kernel
from .reduction import max_last, sum_trailing


def _narrow_via_f32(fn):
    """ml_dtypes floats (bfloat16, float8) promote to float32 against Python floats (unlike
    float16), so such inputs are computed in float32 and rounded back."""

    @functools.wraps(fn)
    def kernel(X, *args, **kwargs):
        if X.dtype.kind == "V":
            return fn(X.astype(np.float32), *args, **kwargs).astype(X.dtype)
        return fn(X, *args, **kwargs)

    return kernel


_F32 = np.dtype(np.float32)
_RELU_F32 = (np.float32(0), np.float32(np.inf))


@op("Relu", 1, 6, 13, 14)
@takes_out
def Relu(X, *, out=None):
    if X.dtype is _F32:  # the usual case, its bounds made once
        return blas.clip(X, *_RELU_F32, out=out)
    if X.dtype.kind == "f":  # clip with two bounds is SIMD; maximum with a scalar is not
        t = X.dtype.type
        return blas.clip(X, t(0), t(np.inf), out=out)
    return np.maximum(X, X.dtype.type(0), out=out)


Relu.in_place = True  # elementwise: out may be X's own bytes (memory.py)
Relu.streams_out = True  # its output written once, in order: into a Concat's slice


@op("Sigmoid", 1, 6, 13)
@takes_out
def Sigmoid(X, *, out=None):
    if X.dtype == np.float32 and X.size and X.flags.c_contiguous:
        from ..compiled import logistic  # MLAS's logistic, onnxruntime's numbers bit for bit

        if logistic.unavailable() is None:
            return logistic.sigmoid(X, out if out is not None and out.flags.c_contiguous and
                                    out.shape == X.shape and out.dtype == X.dtype else None)
    return sigmoid(X, out if out is not None and out.shape == X.shape and
                   out.dtype == X.dtype else None)


Sigmoid.streams_out = True  # its output written once, in order: into a Concat's slice


def sigmoid(X, out=None):
    t = np.negative(X, out=out)
    with np.errstate(over="ignore"):  # exp(-x) overflows to inf for x << 0: 1/(1+inf) = 0
        np.exp(t, out=t)
    t += 1
    np.reciprocal(t, out=t)
    return t


def sigmoid_in_place(y):
    """``sigmoid``'s steps on ``y`` itself (a fused activation: no temporary, no copy back)."""
    np.negative(y, out=y)
    with np.errstate(over="ignore"):
        np.exp(y, out=y)
    y += 1
    np.reciprocal(y, out=y)


@op("Tanh", 1, 6, 13)
def Tanh(input):  # noqa: A002 - the schema's name
    if input.dtype.kind == "V":  # ml_dtypes' bfloat16 tanh is a slow scalar loop
        return np.tanh(input.astype(np.float32)).astype(input.dtype)
    return np.tanh(input)  # numpy's float16 tanh is vectorized


@op("LeakyRelu", 1, 6, 16)
@_narrow_via_f32
def LeakyRelu(X, *, alpha=0.01):
    if 0.0 <= alpha <= 1.0:  # max(x, a*x): two fast passes instead of a branchy np.where
        return np.maximum(X, X * alpha)
    return np.where(X < 0, X * alpha, X)


@op("PRelu", 7, 9, 16)
def PRelu(X, slope):
    return np.where(X < 0, X * slope, X).astype(X.dtype, copy=False)


@op("PRelu", 1, 6)
def PRelu_legacy(X, slope):
    """Before opset 7 a 1-D slope is per channel (axis 1), not numpy-broadcast from the right."""
    if slope.ndim == 1 and X.ndim > 2 and slope.size == X.shape[1] and slope.size > 1:
        slope = slope.reshape((-1,) + (1,) * (X.ndim - 2))
    return PRelu(X, slope)


@op("Elu", 1, 6, 22)
@_narrow_via_f32
def Elu(X, *, alpha=1.0):
    neg = np.minimum(X, 0)
    np.expm1(neg, out=neg)
    neg *= alpha
    return np.where(X > 0, X, neg)


@op("Selu", 1, 6, 22)
@_narrow_via_f32
def Selu(X, *, alpha=1.67326319217681884765625, gamma=1.05070102214813232421875):
    neg = np.minimum(X, 0)
    np.exp(neg, out=neg)
    neg -= 1
    neg *= alpha
    out = np.where(X > 0, X, neg)
    out *= gamma
    return out


@op("Celu", 12, 28)
@_narrow_via_f32
def Celu(X, *, alpha=1.0):
    neg = np.minimum(X, 0) / alpha
    np.expm1(neg, out=neg)
    neg *= alpha
    return np.where(X > 0, X, neg)


@op("Softplus", 1, 22)
@_narrow_via_f32
def Softplus(X):
    return np.logaddexp(X.dtype.type(0), X)


@op("Softsign", 1, 22)
@_narrow_via_f32
def Softsign(input):  # noqa: A002 - the schema's name
    d = np.abs(input)
    d += 1
    return np.divide(input, d, out=d)


@op("ThresholdedRelu", 10, 22)
def ThresholdedRelu(X, *, alpha=1.0):
    return np.where(X > alpha, X, X.dtype.type(0))


@op("Shrink", 9)
@_narrow_via_f32
def Shrink(input, *, bias=0.0, lambd=0.5):  # noqa: A002 - the schema's name
    zero = input.dtype.type(0)
    bias = np.asarray(bias).astype(input.dtype)
    return np.where(input < -lambd, input + bias, np.where(input > lambd, input - bias, zero))


@op("Mish", 18, 22)
@_narrow_via_f32
def Mish(X):
    t = np.logaddexp(X.dtype.type(0), X)
    np.tanh(t, out=t)
    t *= X
    return t


@op("HardSigmoid", 1, 6, 22)
@_narrow_via_f32
def HardSigmoid(X, *, alpha=0.2, beta=0.5):
    t = X * alpha
    t += beta
    np.clip(t, 0, 1, out=t)
    return t


@op("HardSwish", 14, 22)
@_narrow_via_f32
def HardSwish(X):
    t = X * (1.0 / 6.0)
    t += 0.5
    np.clip(t, 0, 1, out=t)
    t *= X
    return t


def _half_via_f32(fn):
    """float16 too: its several elementwise passes are much faster in float32."""

    @functools.wraps(fn)
    def kernel(X, *args, **kwargs):
        if compute_dtype(X.dtype) != X.dtype:
            return fn(X.astype(np.float32), *args, **kwargs).astype(X.dtype)
        return fn(X, *args, **kwargs)

    return kernel


@op("Gelu", 20)
class Gelu:
    """The exact (erf) float32 Gelu in compiled rows on the session's intra-op threads."""

    def __init__(self, ctx: KernelContext, *, approximate="none") -> None:
        self.approximate = approximate
        self.threads = threads_for(ctx)
        # the compiled module taken once (its lookups cost a third of a call)
        self.kernel = gelu_kernel() if approximate != "tanh" else None

    def __call__(self, X):
        if self.approximate != "tanh" and X.dtype == np.float32:
            return gelu_float32(np.ascontiguousarray(X), threads=self.threads,
                                kernel=self.kernel)
        return _gelu(X, approximate=self.approximate)


@_half_via_f32
def _gelu(X, *, approximate="none"):
    if approximate == "tanh":
        t = X * X
        t *= 0.044715
        t += 1
        t *= X
        t *= math.sqrt(2.0 / math.pi)
        np.tanh(t, out=t)
    elif X.dtype == np.float32:
        return gelu_float32(np.ascontiguousarray(X))
    else:
        t = erf(X * (1.0 / math.sqrt(2.0)))
    t += 1
    t *= X
    t *= 0.5
    return t


# -- softmax family ---------------------------------------------------------------------------


def _fast_last(x, axis):
    """float32/64 along the contiguous last axis: use the argmax/gemv reductions."""
    return (x.dtype.kind == "f" and x.dtype.itemsize >= 4 and x.size >= 4096
            and (axis == -1 or axis == x.ndim - 1) and x.flags.c_contiguous)


# elements from which float32 softmax over a contiguous last axis takes the compiled pass
# (compiled/softmax.py; below, its call costs about what numpy's passes do)
_SOFTMAX_COMPILED = 1 << 10


def _softmax(x, axis, out=None, threads: int = 1):
    """Softmax along ``axis``; ``out`` (a C-contiguous float32 array of x's shape, may be x)
    and ``threads`` are the compiled pass's, which takes a float32 x over its contiguous
    last axis."""
    if x.dtype == np.float32 and x.size >= _SOFTMAX_COMPILED and \
            (axis == -1 or axis == x.ndim - 1) and x.flags.c_contiguous:
        from ..compiled import softmax

        if softmax.unavailable() is None:
            return softmax.softmax_last(x, out, threads)
    if _fast_last(x, axis):
        e = x - max_last(x)
        np.exp(e, out=e)
        s = sum_trailing(e, x.shape[-1]).reshape(x.shape[:-1] + (1,))
        np.reciprocal(s, out=s)
        e *= s
        return e
    e = x - x.max(axis=axis, keepdims=True)
    np.exp(e, out=e)
    e /= e.sum(axis=axis, keepdims=True)
    return e


def _log_softmax(x, axis):
    if _fast_last(x, axis):
        e = x - max_last(x)
        s = sum_trailing(np.exp(e), x.shape[-1]).reshape(x.shape[:-1] + (1,))
    else:
        e = x - x.max(axis=axis, keepdims=True)
        s = np.exp(e).sum(axis=axis, keepdims=True)
    np.log(s, out=s)
    e -= s
    return e


def _hardmax(x, axis):
    idx = np.expand_dims(np.argmax(x, axis=axis), axis)
    out = np.zeros_like(x)
    np.put_along_axis(out, idx, 1, axis=axis)
    return out


def _coerced(fn):
    """Versions 1 and 11: the input is seen as 2-D [prod(shape[:axis]), prod(shape[axis:])]."""

    def kernel(input, *, axis=1):  # noqa: A002 - the schema's name
        if input.size == 0:  # an empty axis or batch: nothing to normalize
            return np.empty(input.shape, input.dtype)
        if input.ndim == 0:
            return fn(input.reshape(1, 1), 1).reshape(())
        axis = axis if axis >= 0 else axis + input.ndim
        outer = math.prod(input.shape[:axis])
        inner = math.prod(input.shape[axis:])
        if input.ndim == 2 and axis == 1 or axis == input.ndim - 1:
            return fn(input, -1)
        return fn(input.reshape(outer, inner), 1).reshape(input.shape)

    return kernel


def _per_axis(fn):
    def kernel(input, *, axis=-1):  # noqa: A002 - the schema's name
        if input.size == 0:  # an empty axis or batch: nothing to normalize
            return np.empty(input.shape, input.dtype)
        return fn(input, axis)

    return kernel


for _name, _fn in (("Softmax", _softmax), ("LogSoftmax", _log_softmax), ("Hardmax", _hardmax)):
    op(_name, 1, 11)(_coerced(_fn))
    if _name != "Softmax":
        op(_name, 13)(_per_axis(_fn))


@op("Softmax", 13)
class Softmax:
    """Softmax-13: float32 over a contiguous last axis in compiled/softmax.py's one kernel
    call, into the executor's buffer (memory.py), which may be the input's own bytes (each
    row read before it is written): no fresh array per call (attention scores: a few hundred
    KB each); the numpy passes elsewhere."""

    accepts_out = True
    in_place = True

    def __init__(self, ctx: KernelContext, *, axis=-1) -> None:
        self.axis = int(axis)
        self.threads = threads_for(ctx)

    def __call__(self, input, *, out=None):  # noqa: A002 - the schema's name
        x = input
        if x.size == 0:  # an empty axis or batch: nothing to normalize
            return np.empty(x.shape, x.dtype)
        if out is not None and (out.shape != x.shape or out.dtype != np.float32 or
                                not out.flags.c_contiguous):
            out = None  # (a buffer of another layout: a fresh result instead)
        axis = self.axis if self.axis >= 0 else self.axis + x.ndim
        return _softmax(x, axis, out, self.threads)


@op("LpNormalization", 1, 22)
@_narrow_via_f32
def LpNormalization(input, *, axis=-1, p=2):  # noqa: A002 - the schema's name
    if p == 1:
        norm = np.abs(input).sum(axis=axis, keepdims=True)
    else:
        norm = np.sqrt(np.square(input).sum(axis=axis, keepdims=True))
    # a zero vector stays zero (onnxruntime does not divide by a zero norm)
    return np.divide(input, norm, out=np.zeros_like(input), where=norm != 0)


__all__ = ["KernelContext", "sigmoid"]
