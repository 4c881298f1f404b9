"""MatMul + Transpose fusion: a Transpose that swaps the last two axes (and nothing else) in
front of a MatMul input becomes the transA / transB flag of com.microsoft FusedMatMul; the GEMM
reads the operand transposed instead of materializing the copy. Also folds such Transposes
into an existing FusedMatMul (flipping the flag)."""

from __future__ import annotations

from ..base import EXTENDED, RulePass, register_pass
from ..pattern import RewriteRule
from ._helpers import MS, is_float32, rank


def swaps_last_two(transpose, v) -> bool:
    """``transpose`` (of ``v``) only exchanges the last two axes of a rank >= 2 tensor."""
    perm = transpose.attr("perm")
    r = rank(v)
    if perm is None or r is None or len(perm) != r or r < 2:
        return False
    return list(perm) == list(range(r - 2)) + [r - 1, r - 2]


def _fused_attrs(mm) -> dict:
    if mm.op_type == "MatMul":
        return {"alpha": 1.0, "transA": 0, "transB": 0, "transBatchA": 0, "transBatchB": 0}
    return {"alpha": float(mm.attr("alpha", 1.0)), "transA": int(mm.attr("transA", 0)),
            "transB": int(mm.attr("transB", 0)), "transBatchA": int(mm.attr("transBatchA", 0)),
            "transBatchB": int(mm.attr("transBatchB", 0))}


class _TransposeIntoMatMul(RewriteRule):
    name = "Transpose+MatMul"
    side = 0  # which input the Transpose feeds
    fused = False  # FusedMatMul (True) or MatMul

    def pattern(self, op, x, other):
        t = op.Transpose(x, _name="t")
        ins = (t, other) if self.side == 0 else (other, t)
        if self.fused:
            return op.FusedMatMul(*ins, _domain=MS, _name="mm")
        return op.MatMul(*ins, _name="mm")

    def check(self, context, x, other, t, mm, **_):
        attrs = _fused_attrs(mm)
        if attrs["transBatchA" if self.side == 0 else "transBatchB"]:
            return False
        return (swaps_last_two(t, x) and (rank(other) or 0) >= 2
                and is_float32(x, other, mm.outputs[0]))

    def rewrite(self, op, x, other, mm, **_):
        attrs = _fused_attrs(mm)
        flag = "transA" if self.side == 0 else "transB"
        attrs[flag] = 1 - attrs[flag]
        ins = (x, other) if self.side == 0 else (other, x)
        return op.FusedMatMul(*ins, _domain=MS, **attrs)


def _variant(side: int, fused: bool) -> type[RewriteRule]:
    return type(f"TransposeMatMul_{side}_{int(fused)}", (_TransposeIntoMatMul,),
                {"side": side, "fused": fused})


@register_pass
class MatmulTransposeFusion(RulePass):
    name = "MatmulTransposeFusion"  # onnxruntime's spelling
    level = EXTENDED
    order = 60
    rules = tuple(_variant(s, f) for f in (False, True) for s in (0, 1))
