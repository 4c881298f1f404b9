"""Elementwise operators: arithmetic with numpy broadcasting, unary math, comparisons, logic,
bitwise operators, variadic Sum/Min/Max/Mean, Where, Clip and the Cast family.

Every kernel keeps ONNX's output element type: numpy 2 promotes float32 with float64 arrays or
numpy float64 scalars, so constants are converted to the input's dtype before use.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from ....dtypes import BFLOAT16, np_dtype
from ..gelu_polynomial import GELU_LOGIT as _GELU_LOGIT  # gelu(x) = x / (1 + 2^(x P(x^2)))
from ..kernels import KernelContext, op

# -- helpers ----------------------------------------------------------------------------------

# numpy's float16 and ml_dtypes' bfloat16 arithmetic converts element by element; casting whole
# arrays around a float32 ufunc is several times faster and, float32 having more than twice
# their precision, rounds +, -, *, / to the same result.
_HALF = frozenset({np.dtype(np.float16), BFLOAT16})


def _legacy_broadcast(A, B, broadcast, axis):
    """Opset < 7 binary ops: with broadcast=1 and an axis, B aligns with A starting at axis."""
    if broadcast and axis is not None and B.ndim:
        axis = axis if axis >= 0 else axis + A.ndim
        tail = A.ndim - axis - B.ndim
        if tail > 0:
            B = B.reshape(B.shape + (1,) * tail)
    return B


def _input_dtype(ctx: KernelContext, index: int) -> np.dtype | None:
    """The element type of input ``index`` as the model types it, when it is a tensor."""
    tp = ctx.input_type(index)
    if tp is None or tp.WhichOneof("value") != "tensor_type" or not tp.tensor_type.elem_type:
        return None
    try:
        return np_dtype(tp.tensor_type.elem_type)
    except TypeError:
        return None


def _register(name, versions, kernel, fast=None):
    """Register ``kernel`` at ``versions``. ``fast(dtype)``, given the type of input 0 known when
    the session is made (None if unknown), may return a bare ufunc that computes the same as
    ``kernel`` for that type: the session then calls the ufunc itself, without a Python frame
    per node, which is most of the cost of a small elementwise node."""
    kernel.__name__ = kernel.__qualname__ = name
    if fast is None:
        op(name, *versions)(kernel)
        return

    def __new__(cls, ctx: KernelContext):  # a class kernel that returns a plain function
        return fast(_input_dtype(ctx, 0)) or kernel

    def __init__(self, ctx: KernelContext) -> None:  # never called; read for the attributes
        pass

    op(name, *versions)(type(name, (), {"__new__": __new__, "__init__": __init__,
                                        "__doc__": kernel.__doc__}))


def _not_half(ufunc):
    return lambda dtype: ufunc if dtype is not None and dtype not in _HALF else None


def _binary(name, ufunc, versions, legacy_until=7, half_via_f32=False, fast=None):
    """Register a broadcasting binary op; versions before ``legacy_until`` take broadcast/axis.
    ``fast``: see _register (by default, a ufunc is its own fast path, for types other than
    float16/bfloat16 when those go through float32)."""
    modern = [v for v in versions if v >= legacy_until]
    legacy = [v for v in versions if v < legacy_until]

    def kernel(A, B):
        return ufunc(A, B)

    if half_via_f32:

        def kernel(A, B):
            if A.dtype in _HALF:
                return ufunc(A.astype(np.float32), B.astype(np.float32)).astype(A.dtype)
            return ufunc(A, B)

    if fast is None and isinstance(ufunc, np.ufunc):
        fast = _not_half(ufunc) if half_via_f32 else (lambda dtype: ufunc)
    _register(name, modern, kernel, fast)
    if legacy:

        def legacy_kernel(A, B, *, broadcast=0, axis=None):
            return ufunc(A, _legacy_broadcast(A, B, broadcast, axis))

        legacy_kernel.__name__ = legacy_kernel.__qualname__ = name + "_legacy"
        op(name, *legacy)(legacy_kernel)


def _unary(name, ufunc, versions):
    def kernel(X):
        return ufunc(X)

    _register(name, versions, kernel, lambda dtype: ufunc)


# -- arithmetic -------------------------------------------------------------------------------

_binary("Add", np.add, (1, 6, 7, 13, 14), half_via_f32=True)
_binary("Sub", np.subtract, (1, 6, 7, 13, 14), half_via_f32=True)
_binary("Mul", np.multiply, (1, 6, 7, 13, 14), half_via_f32=True)


def _div(A, B):
    if A.dtype.kind in "iu":
        if A.dtype.kind == "u":
            return np.floor_divide(A, B)
        # C semantics: the quotient truncates toward zero (numpy floors)
        return np.floor_divide(np.subtract(A, np.fmod(A, B)), B)
    return np.true_divide(A, B)


_binary("Div", _div, (1, 6, 7, 13, 14), half_via_f32=True,
        fast=lambda dtype: np.true_divide if dtype is not None and dtype.kind == "f"
        and dtype not in _HALF else None)


@op("Pow", 7, 12, 13, 15)
class Pow:
    """Pow keeps the base's type; a constant exponent of 2, 0.5, 1 or 3 takes a fast path."""

    def __init__(self, ctx: KernelContext):
        y = ctx.constant(1)
        self.fast = None
        if y is not None and y.size == 1 and y.dtype.kind in "fiu":
            v = float(y.reshape(()))
            self.fast = {2.0: np.square, 0.5: np.sqrt, 1.0: np.positive,
                         3.0: lambda x: x * x * x}.get(v)
            self.yshape = y.shape

    def __call__(self, X, Y):
        if self.fast is not None and X.dtype.kind == "f" and len(self.yshape) <= X.ndim:
            if X.dtype in _HALF:
                return self.fast(X.astype(np.float32)).astype(X.dtype)
            return self.fast(X)
        return _pow(X, Y)


def _pow(X, Y):
    if X.dtype in _HALF:  # a wider float exponent is kept as it is
        Y = Y if Y.dtype.kind in "iu" or Y.dtype.kind == "f" and Y.itemsize >= 4 \
            else Y.astype(np.float32)
        return _pow(X.astype(np.float32), Y).astype(X.dtype)
    if X.dtype.kind in "iu" and Y.dtype.kind in "iu":
        if (Y < 0).any():  # numpy refuses negative integer powers; C's pow then truncates
            return np.power(X.astype(np.float64), Y).astype(X.dtype)
        return np.power(X, Y.astype(X.dtype, copy=False))
    if X.dtype == Y.dtype:
        return np.power(X, Y)
    if X.dtype.kind == "f" and Y.dtype.kind in "iu":
        return np.power(X, Y.astype(X.dtype))
    return np.power(X, Y).astype(X.dtype, copy=False)


@op("Pow", 1)
def Pow_legacy(X, Y, *, broadcast=0, axis=None):
    return _pow(X, _legacy_broadcast(X, Y, broadcast, axis))


@op("Mod", 10, 13, 28)
def Mod(A, B, *, fmod=0):
    # fmod=1: C's fmod (sign of the dividend); fmod=0: Python's % (sign of the divisor)
    return np.fmod(A, B) if fmod else np.mod(A, B)


def _variadic(ufunc):
    def kernel(*data):
        if len(data) == 1:
            return data[0]
        if len(data) == 2:
            return ufunc(data[0], data[1])
        return functools.reduce(ufunc, data)

    return kernel


def _register_variadic(name, ufunc, versions):
    kernel = _variadic(ufunc)
    kernel.__name__ = kernel.__qualname__ = name
    op(name, *versions)(kernel)


_register_variadic("Sum", np.add, (1, 6, 8, 13))
_register_variadic("Max", np.maximum, (1, 6, 8, 12, 13))
_register_variadic("Min", np.minimum, (1, 6, 8, 12, 13))


@op("Mean", 1, 6, 8, 13)
def Mean(*data):
    if len(data) == 1:
        return data[0]
    total = np.add(data[0], data[1])
    for d in data[2:]:
        total = np.add(total, d)
    total /= len(data)  # total is a fresh array: dividing in place is safe
    return total


# -- unary math -------------------------------------------------------------------------------

_unary("Neg", np.negative, (1, 6, 13))
_unary("Abs", np.abs, (1, 6, 13))
_unary("Floor", np.floor, (1, 6, 13))
_unary("Ceil", np.ceil, (1, 6, 13))
_unary("Sqrt", np.sqrt, (1, 6, 13))
_unary("Exp", np.exp, (1, 6, 13))
_unary("Log", np.log, (1, 6, 13))
_unary("Round", np.rint, (11, 22))  # rint rounds half to even, as ONNX requires
_unary("Sign", np.sign, (9, 13))
_unary("IsNaN", np.isnan, (9, 13, 20))
_unary("Sin", np.sin, (7, 22))
_unary("Cos", np.cos, (7, 22))
_unary("Tan", np.tan, (7, 22))
_unary("Asin", np.arcsin, (7, 22))
_unary("Acos", np.arccos, (7, 22))
_unary("Atan", np.arctan, (7, 22))
_unary("Sinh", np.sinh, (9, 22))
_unary("Cosh", np.cosh, (9, 22))
_unary("Asinh", np.arcsinh, (9, 22))
_unary("Acosh", np.arccosh, (9, 22))
_unary("Atanh", np.arctanh, (9, 22))
_unary("Not", np.logical_not, (1,))
_unary("BitwiseNot", np.invert, (18,))


@op("Reciprocal", 1, 6, 13)
def Reciprocal(X):
    return np.reciprocal(X) if X.dtype.kind == "f" else np.divide(1, X).astype(X.dtype)


@op("IsInf", 10, 20)
def IsInf(X, *, detect_negative=1, detect_positive=1):
    if detect_negative and detect_positive:
        return np.isinf(X)
    if detect_positive:
        return np.isposinf(X)
    if detect_negative:
        return np.isneginf(X)
    return np.zeros(X.shape, dtype=bool)


def _erf_float64():
    try:
        from scipy.special import erf  # correctly rounded, but ~20 ns per element

        return erf
    except ImportError:  # pragma: no cover - scipy is optional
        return np.frompyfunc(math.erf, 1, 1)


# Eigen's rational approximation of erf for float32 (its fast erf): odd numerator,
# even denominator in x^2 on [-4, 4], absolute error below 5e-7, 10x faster than scipy's erf.
_ERF_ALPHA = np.array([-2.72614225801306e-10, 2.77068142495902e-08, -2.10102402082508e-06,
                       -5.69250639462346e-05, -7.34990630326855e-04, -2.95459980854025e-03,
                       -1.60960333262415e-02], dtype=np.float32)
_ERF_BETA = np.array([-1.45660718464996e-05, -2.13374055278905e-04, -1.68282697438203e-03,
                      -7.37332916720468e-03, -1.42647390514189e-02], dtype=np.float32)
_erf64 = None


# Elements per block of the blocked evaluation below: its three float32 scratch arrays stay in
# the L2 cache across the ~20 passes of the rational function, where whole-array passes would
# each stream the arrays through memory (8x slower on a 2 x 128 x 1536 activation).
_BLOCK = 32768


def _horner(t: np.ndarray, coeffs, out: np.ndarray) -> None:
    """out = the polynomial ``coeffs`` (highest degree first) at t, by Horner's rule, in place."""
    np.multiply(t, coeffs[0], out=out)
    for a in coeffs[1:-1]:
        np.add(out, a, out=out)
        np.multiply(out, t, out=out)
    np.add(out, coeffs[-1], out=out)


def _rational(c: np.ndarray, t: np.ndarray, p: np.ndarray, q: np.ndarray, num, den) -> None:
    """p = c * num(t) / den(t) with t = c * c (num, den: coefficients, highest degree first);
    t and q are scratch. All of one length, nothing allocated."""
    np.multiply(c, c, out=t)
    _horner(t, num, p)
    np.multiply(p, c, out=p)
    _horner(t, den, q)
    np.divide(p, q, out=p)


def _blocks(n: int, count: int):
    """(start, stop, ``count`` float32 scratch arrays of the block's length) over n elements."""
    size = max(min(n, _BLOCK), 1)
    scratch = [np.empty(size, np.float32) for _ in range(count)]
    for start in range(0, n, size):
        stop = min(start + size, n)
        if stop - start < size:
            scratch = [a[:stop - start] for a in scratch]
        yield start, stop, scratch


_ERF_NUM = [np.float32(a) for a in _ERF_ALPHA]
_ERF_DEN = [np.float32(b) for b in _ERF_BETA]
_ERF_LIMIT = np.float32(4.0)


def _erf_float32(x: np.ndarray) -> np.ndarray:
    flat = np.ascontiguousarray(x).reshape(-1)
    out = np.empty(flat.shape, np.float32)
    for start, stop, (c, t, q) in _blocks(flat.size, 3):
        np.clip(flat[start:stop], -_ERF_LIMIT, _ERF_LIMIT, out=c)
        _rational(c, t, out[start:stop], q, _ERF_NUM, _ERF_DEN)
    return out.reshape(x.shape)


# float32 elements per block of the gelu passes: the block and its two scratch arrays stay in the
# L2 cache across the passes
_GELU_BLOCK = 65536
# from this many elements up the compiled kernel runs (below, its call costs more than numpy's)
_GELU_COMPILED_MIN = 256


def gelu_kernel(coeffs=_GELU_LOGIT):
    """compiled/gelu's module for this polynomial (``gelu_polynomial``: Gelu's, or
    FastGelu's), or None where it does not run: a kernel takes it once, when prepared, for
    gelu_float32's ``kernel``."""
    from ..compiled import gelu

    return gelu.module(coeffs)


def gelu_float32(x: np.ndarray, bias: np.ndarray | None = None,
                 out: np.ndarray | None = None, threads: int = 1, kernel=None,
                 coeffs=_GELU_LOGIT) -> np.ndarray:
    """0.5 * (x + bias) * (1 + erf((x + bias) / sqrt 2)) of C-contiguous float32 ``x`` (``bias``
    along the last axis, optional), into ``out`` (which may be ``x``; a new array by default);
    with FastGelu's ``coeffs`` (gelu_polynomial.FAST_GELU_LOGIT) its tanh form instead.
    Rows are processed in blocks that stay in the cache; the compiled kernel's ranges of rows
    on up to ``threads`` threads (each element's arithmetic is the same on any of them).
    ``kernel``: gelu_kernel(coeffs), where the caller holds it (else looked up here)."""
    if out is None:
        out = np.empty(x.shape, np.float32)
    if x.size == 0:
        return out
    if x.ndim and x.size >= _GELU_COMPILED_MIN:
        from ..compiled import gelu

        if kernel is not None or gelu.unavailable(coeffs) is None:  # one pass
            return gelu.bias_gelu(coeffs, x, bias, out, threads, kernel)
    width = x.shape[-1] if x.ndim else 1
    rows_in, rows_out = x.reshape(-1, width), out.reshape(-1, width)
    per_block = max(1, _GELU_BLOCK // width)
    size = min(per_block, rows_in.shape[0]) * width
    t_buf, p_buf = np.empty(size, np.float32), np.empty(size, np.float32)
    one = np.float32(1)
    with np.errstate(all="ignore"):  # overflows to inf are part of the limits below
        for start in range(0, rows_in.shape[0], per_block):
            src, y = rows_in[start:start + per_block], rows_out[start:start + per_block]
            if bias is not None:
                src = np.add(src, bias, out=y)
            src, y = src.reshape(-1), y.reshape(-1)
            t, p = t_buf[:y.size], p_buf[:y.size]
            np.multiply(src, src, out=t)
            _horner(t, coeffs, p)
            np.multiply(p, src, out=p)
            np.exp2(p, out=p)  # inf for x << 0: x / inf = -0, gelu's limit
            np.add(p, one, out=p)
            np.divide(src, p, out=y)
    return out


def erf(x: np.ndarray) -> np.ndarray:
    """erf of a float array, in the array's own dtype."""
    global _erf64
    if x.dtype == np.float32:
        return _erf_float32(x)
    if x.dtype == np.float64:
        if _erf64 is None:
            _erf64 = _erf_float64()
        return np.asarray(_erf64(x), dtype=np.float64)
    return _erf_float32(x.astype(np.float32)).astype(x.dtype)


@op("Erf", 9, 13)
def Erf(input):  # noqa: A002 - the schema's name
    if input.dtype.kind in "iu":
        return np.rint(erf(input.astype(np.float32))).astype(input.dtype)
    return erf(input)


# -- comparison and logic ---------------------------------------------------------------------


def _compare(ufunc):
    def kernel(A, B):
        out = ufunc(A, B)
        if out.dtype != np.bool_:  # object (string) comparisons
            out = out.astype(np.bool_)
        return out

    return kernel


for _name, _ufunc, _versions in (
    ("Equal", np.equal, (1, 7, 11, 13, 19)),
    ("Less", np.less, (1, 7, 9, 13)),
    ("Greater", np.greater, (1, 7, 9, 13)),
    ("LessOrEqual", np.less_equal, (12, 16)),
    ("GreaterOrEqual", np.greater_equal, (12, 16)),
    ("And", np.logical_and, (1, 7)),
    ("Or", np.logical_or, (1, 7)),
    ("Xor", np.logical_xor, (1, 7)),
):
    # On numbers (not strings) the ufunc already returns booleans.
    _binary(_name, _compare(_ufunc), _versions,
            fast=lambda dtype, u=_ufunc: u if dtype is not None and dtype.kind in "biuf" else None)

_binary("BitwiseAnd", np.bitwise_and, (18,))
_binary("BitwiseOr", np.bitwise_or, (18,))
_binary("BitwiseXor", np.bitwise_xor, (18,))


@op("BitShift", 11, 28)
def BitShift(X, Y, *, direction):
    if direction == "LEFT":
        return np.left_shift(X, Y)
    return np.right_shift(X, Y)


@op("Where", 9, 16)
def Where(condition, X, Y):
    return np.where(condition, X, Y)


# -- Clip -------------------------------------------------------------------------------------


def _bounds(dtype: np.dtype):
    if dtype.kind == "f":
        return dtype.type(-np.inf), dtype.type(np.inf)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return dtype.type(info.min), dtype.type(info.max)
    return None, None


def _clip(x, lo, hi):
    # np.clip with both bounds runs a SIMD loop; maximum/minimum against scalars do not
    if x.dtype == BFLOAT16:  # ml_dtypes' maximum/minimum are scalar loops
        f32 = np.float32
        lo = None if lo is None else f32(lo)
        hi = None if hi is None else f32(hi)
        return _clip(x.astype(f32), lo, hi).astype(x.dtype)
    dlo, dhi = _bounds(x.dtype)
    if dlo is None:  # other ml_dtypes floats
        out = x if lo is None else np.maximum(x, lo)
        return out if hi is None else np.minimum(out, hi)
    return np.clip(x, dlo if lo is None else lo, dhi if hi is None else hi)


@op("Clip", 1, 6)
def Clip_6(input, *, min=-3.4028234663852886e38, max=3.4028234663852886e38):  # noqa: A002
    return _clip(input, input.dtype.type(min), input.dtype.type(max))


def _scalar(v, dtype):
    return None if v is None else v.astype(dtype, copy=False).reshape(())


@op("Clip", 11, 12, 13)
class Clip:
    def __init__(self, ctx: KernelContext):
        self.lo = ctx.constant(1)
        self.hi = ctx.constant(2)
        self.lo_const = not ctx.has_input(1) or self.lo is not None
        self.hi_const = not ctx.has_input(2) or self.hi is not None

    def __call__(self, input, min=None, max=None):  # noqa: A002 - the schema's names
        lo = self.lo if self.lo_const else min
        hi = self.hi if self.hi_const else max
        if lo is not None and hi is not None and lo.reshape(()) > hi.reshape(()):
            lo = hi  # min > max: every value becomes max
        return _clip(input, _scalar(lo, input.dtype), _scalar(hi, input.dtype))


# -- Cast -------------------------------------------------------------------------------------

_FLOAT8_MAX: dict[np.dtype, float] = {}
try:
    import ml_dtypes

    for _t in ("float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz"):
        _dt = np.dtype(getattr(ml_dtypes, _t))
        _FLOAT8_MAX[_dt] = float(ml_dtypes.finfo(_dt).max)
except ImportError:  # pragma: no cover
    pass


def _to_float8e8m0(x: np.ndarray, to: np.dtype, saturate: bool, round_mode: str
                   ) -> np.ndarray:
    """float8e8m0 (an unsigned power of two): float32's exponent byte, rounded by the fraction
    bits as Cast-25's ``round_mode`` says; NaN and infinities become 0xFF."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    exponent = ((bits >> 23) & 0xFF).astype(np.uint16)
    special = exponent == 0xFF
    fraction = bits & 0x7FFFFF
    if round_mode == "up":
        up = fraction > 0
    elif round_mode == "nearest":  # half and above rounds up, except a bare half at exponent 0
        up = (fraction & 0x400000 > 0) & ((fraction & 0x3FFFFF > 0) | (exponent > 0))
    elif round_mode == "down":
        up = np.zeros(bits.shape, bool)
    else:
        raise ValueError(f"Cast: unsupported round_mode '{round_mode}'")
    up &= ~special
    if saturate:
        up &= exponent != 0xFE
    out = (exponent + up).astype(np.uint8)
    out[special] = 0xFF
    return out.view(to).reshape(x.shape)


def _number_to_string(x: np.ndarray) -> np.ndarray:
    flat = x.reshape(-1)
    if x.dtype.kind in "iu":
        out = [str(v) for v in flat.tolist()]
    elif x.dtype.kind == "b":
        out = ["1" if v else "0" for v in flat.tolist()]
    else:  # floats print like onnxruntime: 8 significant digits, NaN / INF / -INF
        out = [_format_float(v) for v in flat.astype(np.float64).tolist()]
    return np.array(out, dtype=object).reshape(x.shape)


def _format_float(v: float) -> str:
    if v != v:
        return "NaN"
    if v in (math.inf, -math.inf):
        return "INF" if v > 0 else "-INF"
    return f"{v:.8g}"


def _string_to_number(x: np.ndarray, to: np.dtype) -> np.ndarray:
    flat = x.reshape(-1)
    strs = [s.decode() if isinstance(s, bytes) else str(s) for s in flat.tolist()]
    if to.kind in "iu":
        vals = []
        for s in strs:
            try:
                vals.append(int(s))
            except ValueError:
                vals.append(int(float(s)))
        return np.array(vals, dtype=np.int64).astype(to).reshape(x.shape)
    if to.kind == "b":
        return np.array([float(s) != 0 for s in strs], dtype=bool).reshape(x.shape)
    return np.array([float(s) for s in strs], dtype=np.float64).astype(to).reshape(x.shape)


def cast(x: np.ndarray, to: np.dtype, saturate: int = 1, round_mode: str = "up"
         ) -> np.ndarray:
    """Cast ``x`` to numpy dtype ``to`` (object for strings) with ONNX's rules."""
    if x.dtype == to:
        return x
    if to.kind == "O":
        if x.dtype.kind in "US":
            return x.astype(object)
        return _number_to_string(x)
    if x.dtype == object or x.dtype.kind in "US":
        return _string_to_number(x, to)
    if to.name == "float8_e8m0fnu":  # a power-of-two exponent: rounding has its own modes
        return _to_float8e8m0(x, to, bool(saturate), round_mode)
    fmax = _FLOAT8_MAX.get(to)
    if fmax is not None:
        src = x if x.dtype.kind == "f" and x.dtype.itemsize >= 4 else x.astype(np.float32)
        if saturate:
            src = np.clip(src, -fmax, fmax)  # clip keeps NaN and maps +-inf to +-max
        return src.astype(to)
    if x.dtype.kind == "V" or x.dtype.itemsize == 1 and x.dtype.kind not in "iub":
        # ml_dtypes narrow floats: go through float32 for anything but themselves
        if to.kind in "iub":
            return x.astype(np.float32).astype(to)
    if to.kind in "iu" and x.dtype.kind == "f":
        # numpy warns on NaN/out of range; C++ leaves those undefined anyway
        with np.errstate(invalid="ignore"):
            return x.astype(to)
    return x.astype(to)


@op("Cast", 1, 6, 9, 13, 19, 21, 23, 24, 25, 28)
class Cast:
    def __init__(self, ctx: KernelContext, *, to, saturate=1, round_mode="up"):
        self.to = _cast_target(to)
        self.saturate = saturate
        self.round_mode = round_mode
        # plain numpy targets take a one-call path from other plain numeric types
        self.plain = self.to.kind in "biuf" and self.to.type.__module__ == "numpy"
        self.to_bf16 = self.to == BFLOAT16  # one astype from numpy numbers too

    def __call__(self, input):  # noqa: A002 - the schema's name
        kind = input.dtype.kind
        if self.plain and kind in "biu" or self.plain and kind == "f" and self.to.kind == "f":
            return input.astype(self.to, copy=False)
        if self.to_bf16 and kind in "biuf" or self.to.kind == "f" and input.dtype == BFLOAT16:
            return input.astype(self.to, copy=False)
        return cast(input, self.to, self.saturate, self.round_mode)


def _cast_target(to) -> np.dtype:
    if isinstance(to, str):  # Cast-1 spelled the type as a string ("FLOAT")
        from ....proto import onnx
        TensorProto = onnx.TensorProto

        to = TensorProto.DataType.Value(to.upper())
    if to == 8:  # STRING
        return np.dtype(object)
    return np_dtype(int(to))


@op("CastLike", 15, 19, 21, 23, 24, 25)
def CastLike(input, target_type, *, saturate=1, round_mode="up"):  # noqa: A002
    return cast(input, target_type.dtype, saturate, round_mode)


__all__ = ["cast", "erf", "gelu_float32"]
