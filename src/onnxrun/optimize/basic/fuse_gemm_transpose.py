"""Gemm + Transpose: a 2-D Transpose feeding Gemm's A or B becomes Gemm's transA / transB, and
a Transpose of a bias-free Gemm's result becomes the Gemm of the swapped, transposed operands
((A B)^T = B^T A^T). BLAS reads either layout at the same cost, so the copy goes away."""

from __future__ import annotations

from ..base import BASIC, RulePass, register_pass
from ..pattern import RewriteRule
from ._helpers import rank


def _swaps_2d(t) -> bool:
    """A Transpose that swaps the two axes of a 2-D tensor."""
    perm = t.attr("perm")
    if perm is not None:
        return list(perm) == [1, 0]
    return rank(t.inputs[0]) == 2  # no perm: axes reversed


def _flip(node, name: str) -> int:
    return 0 if node.attr(name, 0) else 1


class TransposeA(RewriteRule):
    name = "Transpose(A)+Gemm"

    def pattern(self, op, a, b):
        return op.Gemm(op.Transpose(a, _name="t"), b, _name="gemm")

    def check(self, context, t, **_):
        return _swaps_2d(t)

    def rewrite(self, op, a, b, gemm, **_):
        attrs = {**gemm.attributes, "transA": _flip(gemm, "transA")}
        return op.Gemm(a, b, *gemm.inputs[2:], _name=gemm.name or None, **attrs)


class TransposeB(RewriteRule):
    name = "Transpose(B)+Gemm"

    def pattern(self, op, a, b):
        return op.Gemm(a, op.Transpose(b, _name="t"), _name="gemm")

    def check(self, context, t, **_):
        return _swaps_2d(t)

    def rewrite(self, op, a, b, gemm, **_):
        attrs = {**gemm.attributes, "transB": _flip(gemm, "transB")}
        return op.Gemm(a, b, *gemm.inputs[2:], _name=gemm.name or None, **attrs)


class TransposeOfGemm(RewriteRule):
    name = "Gemm+Transpose"

    def pattern(self, op, a, b):
        return op.Transpose(op.Gemm(a, b, _name="gemm"), _name="t")

    def check(self, context, gemm, t, **_):
        perm = t.attr("perm")
        no_bias = len(gemm.inputs) < 3 or gemm.inputs[2] is None
        return no_bias and (perm is None or list(perm) == [1, 0])

    def rewrite(self, op, a, b, gemm, **_):
        attrs = {**gemm.attributes, "transA": _flip(gemm, "transB"),
                 "transB": _flip(gemm, "transA")}
        return op.Gemm(b, a, _name=gemm.name or None, **attrs)


@register_pass
class GemmTransposeFusion(RulePass):
    name = "GemmTransposeFusion"
    level = BASIC
    order = 42
    rules = (TransposeA, TransposeB, TransposeOfGemm)
