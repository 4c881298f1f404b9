"""Conv / ConvTranspose / Gemm + BatchNormalization -> one Conv / ConvTranspose / Gemm; and a
MatMul whose output is flattened to (rows, channels) for a BatchNormalization (a Linear layer's
BatchNorm1d as PyTorch exports it: LeViT) -> MatMul + Add of the folded bias.

An inference BatchNormalization is y = a * x + b per channel, a = scale / sqrt(var + eps) and
b = bias - mean * a: scaling each output channel's weights by a and its bias by a, plus b, gives
the same result without a second pass over the activation. Only for constant weights and
parameters, a BatchNormalization in inference mode whose extra outputs nobody reads, and a
convolution output read by nothing else.
"""

from __future__ import annotations

import numpy as np

from ...dtypes import type_shape
from ..base import BASIC, RulePass, register_pass
from ..graph_utils import constant_value
from ..pattern import RewriteRule
from ._helpers import batchnorm_affine, is_float_array


def _bias(node, index: int) -> tuple[bool, np.ndarray | None]:
    """(usable, value) of an optional constant bias input: absent is usable (None)."""
    if len(node.inputs) <= index or node.inputs[index] is None:
        return True, None
    c = constant_value(node.inputs[index])
    return c is not None, c


def _scaled(weight: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """weight * scale, each product in float64 and rounded once to the weight's dtype, without
    float64 copies of the whole weight (numpy's buffered loop: 3-4x faster on ResNet-50's)."""
    out = np.empty(np.broadcast_shapes(weight.shape, scale.shape), weight.dtype)
    np.multiply(weight, scale.astype(np.float64, copy=False), out=out, casting="unsafe")
    return out


class _AffineOnce:
    """A rule whose ``check`` computes the BatchNormalization's (a, b) hands them to its
    ``rewrite``, which the matcher calls right after on the same match: computed once per
    fusion, not twice (ShuffleNet: 49 fusions per session). Only an accepted match's answer
    is held, and the rewrite takes it away: no graph is kept alive by the (global) rule."""

    _last: tuple | None = None

    def affine(self, model, bn, channels: int, take: bool = False):
        params = tuple(id(constant_value(v)) for v in bn.inputs[1:])
        last = self._last
        if take:
            self._last = None
        if last is not None and last[0] is bn and last[1] == (channels, params):
            return last[2]
        found = batchnorm_affine(model, bn, channels)
        if found is not None and not take:
            self._last = (bn, (channels, params), found)
        return found


def _folded_bias(old: np.ndarray | None, a: np.ndarray, b: np.ndarray, dtype: np.dtype
                 ) -> np.ndarray:
    base = np.zeros_like(a) if old is None else old.astype(np.float64)
    return (base * a + b).astype(dtype)


class ConvBatchNorm(_AffineOnce, RewriteRule):
    name = "Conv+BatchNormalization"

    def pattern(self, op, x, w, scale, bias, mean, var):
        return op.BatchNormalization(op.Conv(x, w, _name="conv"), scale, bias, mean, var,
                                     _name="bn")

    def check(self, context, w, conv, bn, **_):
        weight = constant_value(w)
        if not is_float_array(weight) or weight.ndim < 3:
            return False
        ok, _b = _bias(conv, 2)
        return ok and self.affine(context.model, bn, weight.shape[0]) is not None

    def rewrite(self, op, x, w, conv, bn, **_):
        weight = constant_value(w)
        a, b = self.affine(op.model, bn, weight.shape[0], take=True)
        scale = a.reshape((-1,) + (1,) * (weight.ndim - 1))
        new_w = _scaled(weight, scale)
        new_b = _folded_bias(_bias(conv, 2)[1], a, b, weight.dtype)
        return op.Conv(x, op.initializer(new_w, "W"), op.initializer(new_b, "B"),
                       _name=conv.name or None, **conv.attributes)


class ConvTransposeBatchNorm(_AffineOnce, RewriteRule):
    name = "ConvTranspose+BatchNormalization"

    def pattern(self, op, x, w, scale, bias, mean, var):
        return op.BatchNormalization(op.ConvTranspose(x, w, _name="conv"), scale, bias, mean,
                                     var, _name="bn")

    def check(self, context, w, conv, bn, **_):
        weight = constant_value(w)
        if not is_float_array(weight) or weight.ndim < 3:
            return False
        group = int(conv.attr("group", 1))
        if group < 1 or weight.shape[0] % group:
            return False
        ok, _b = _bias(conv, 2)
        channels = weight.shape[1] * group
        return ok and self.affine(context.model, bn, channels) is not None

    def rewrite(self, op, x, w, conv, bn, **_):
        weight = constant_value(w)
        group = int(conv.attr("group", 1))
        c_in, m_per_group = weight.shape[0], weight.shape[1]
        a, b = self.affine(op.model, bn, m_per_group * group, take=True)
        # W is [C, M/group, k...]; output channel g * M/group + j is W[group g's rows, j].
        grouped = weight.reshape((group, c_in // group, m_per_group) + weight.shape[2:])
        scale = a.reshape((group, 1, m_per_group) + (1,) * (weight.ndim - 2))
        new_w = _scaled(grouped, scale).reshape(weight.shape)
        new_b = _folded_bias(_bias(conv, 2)[1], a, b, weight.dtype)
        return op.ConvTranspose(x, op.initializer(new_w, "W"), op.initializer(new_b, "B"),
                                _name=conv.name or None, **conv.attributes)


class GemmBatchNorm(_AffineOnce, RewriteRule):
    name = "Gemm+BatchNormalization"

    def pattern(self, op, x, w, scale, bias, mean, var):
        return op.BatchNormalization(op.Gemm(x, w, _name="gemm"), scale, bias, mean, var,
                                     _name="bn")

    def check(self, context, w, gemm, bn, **_):
        weight = constant_value(w)
        if not is_float_array(weight) or weight.ndim != 2:
            return False
        ok, c = _bias(gemm, 2)
        if not ok or (c is not None and c.ndim > 2):
            return False
        n = weight.shape[0] if gemm.attr("transB", 0) else weight.shape[1]
        return self.affine(context.model, bn, n) is not None

    def rewrite(self, op, x, w, gemm, bn, **_):
        weight = constant_value(w)
        trans_b = bool(gemm.attr("transB", 0))
        n = weight.shape[0] if trans_b else weight.shape[1]
        a, b = self.affine(op.model, bn, n, take=True)
        scale = a[:, None] if trans_b else a[None, :]
        new_w = _scaled(weight, scale)
        c = _bias(gemm, 2)[1]
        beta = float(gemm.attr("beta", 1.0))
        new_c = b if c is None else c.astype(np.float64) * beta * a + b
        attrs = {**gemm.attributes, "beta": 1.0}
        if "broadcast" in gemm.attributes:  # Gemm-1..6: the new C is a row to broadcast
            attrs["broadcast"] = 1
        return op.Gemm(x, op.initializer(new_w, "W"),
                       op.initializer(new_c.astype(weight.dtype), "C"),
                       _name=gemm.name or None, **attrs)


class MatMulFlattenBatchNorm(_AffineOnce, RewriteRule):
    """MatMul by a constant 2-D weight, Flatten to (rows, the weight's columns), inference
    BatchNormalization over those columns: the normalization's factors scale the weight's
    columns, its shift becomes a bias added after the MatMul (which MatMulAddReshapeFusion
    then takes into a Gemm's epilogue), the Flatten stays. LeViT's 58 such normalizations were
    946 us of a 13.8 ms run, each a pass over its rows."""

    name = "MatMul+Flatten+BatchNormalization"

    def pattern(self, op, x, w, scale, bias, mean, var):
        return op.BatchNormalization(op.Flatten(op.MatMul(x, w, _name="mm"), _name="flat"),
                                     scale, bias, mean, var, _name="bn")

    def check(self, context, x, w, flat, bn, **_):
        weight = constant_value(w)
        if not is_float_array(weight) or weight.ndim != 2:
            return False
        # The normalization's channels are the Flatten's columns, the product of the MatMul
        # output's dimensions from ``axis`` on, the last of which is the weight's columns:
        # as many channels as those columns means every other dimension there is 1, so
        # channel j is column j. Where the rank is known, checked outright.
        dims = type_shape(x.type) if x.type is not None else None
        if dims is not None:
            axis = int(flat.attr("axis", 1))
            axis = axis + len(dims) if axis < 0 else axis
            if len(dims) < 2 or any(d != 1 for d in dims[axis:-1]):
                return False
        return self.affine(context.model, bn, weight.shape[1]) is not None

    def rewrite(self, op, x, w, flat, bn, **_):
        return op.Flatten(self.folded(op, x, w, bn), _name=flat.name or None,
                          **flat.attributes)

    def folded(self, op, x, w, bn):
        """MatMul(x, the weight's columns scaled) + the normalization's shift."""
        weight = constant_value(w)
        a, b = self.affine(op.model, bn, weight.shape[1], take=True)
        product = op.MatMul(x, op.initializer(_scaled(weight, a[None, :]), "W"))
        return op.Add(product, op.initializer(b.astype(weight.dtype), "B"))


class MatMulBatchNorm(MatMulFlattenBatchNorm):
    """The same without the Flatten: a 2-D product, whose columns are the channels (a
    Flatten of a 2-D product is an Identity that the redundant-node pass removes first)."""

    name = "MatMul+BatchNormalization"

    def pattern(self, op, x, w, scale, bias, mean, var):
        return op.BatchNormalization(op.MatMul(x, w, _name="mm"), scale, bias, mean, var,
                                     _name="bn")

    def check(self, context, x, w, bn, **_):
        weight = constant_value(w)
        dims = type_shape(x.type) if x.type is not None else None
        return is_float_array(weight) and weight.ndim == 2 and dims is not None and \
            len(dims) == 2 and self.affine(context.model, bn, weight.shape[1]) is not None

    def rewrite(self, op, x, w, bn, **_):
        return self.folded(op, x, w, bn)


@register_pass
class ConvBNFusion(RulePass):
    name = "ConvBNFusion"
    level = BASIC
    order = 30
    rules = (ConvBatchNorm, ConvTransposeBatchNorm, GemmBatchNorm, MatMulFlattenBatchNorm,
             MatMulBatchNorm)
