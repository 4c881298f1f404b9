"""MatMul + Add -> Reshape, Gemm, Reshape: a static-shape activation of rank 3 or more (a
transformer's [batch, tokens, hidden]) times a constant 2-D weight plus a constant 1-D bias,
seen as its 2-D rows, as onnxruntime's MatMulAddFusion does. Both Reshapes are views of
contiguous memory; the bias goes into the GEMM's epilogue instead of a second pass over the
product.

Runs after AttentionFusion, whose patterns read the projections' MatMul + Add (onnxruntime
fuses these at its basic level, where its attention fusion then never fires on a static
shape), and before BiasGeluFusion and SkipLayerNormFusion: a bias in the GEMM's epilogue,
then Gelu or SkipLayerNormalization without one, as onnxruntime's extended graph has them,
was faster than the bias in those (SVTR-style at 1 thread, alternating processes: 14.34 ->
13.50 ms, against 14.01 -> 13.67 when only the Adds they leave were taken). The basic level's
MatMulAddFusion takes 2-D activations; dynamic shapes keep MatMul + Add (Gemm is 2-D only,
and the rows' count would need computing at every run).
"""

from __future__ import annotations

import math

import numpy as np

from ...dtypes import type_shape
from ..base import EXTENDED, RulePass, register_pass
from ..basic.fuse_matmul_add import MatMulAddToGemm
from ..graph_utils import constant_value


class MatMulAddToGemmRows(MatMulAddToGemm):
    name = "MatMul+Add (rows)"

    def check(self, context, a, b, c, **_):
        found = self.operands(a, b, c)
        if found is None:
            return False
        shape_a, w, bias = found
        # a static shape of rank 3 or more; onnxruntime's condition: a bias of N values,
        # broadcast over every row
        return len(shape_a) >= 3 and all(isinstance(d, int) and d > 0 for d in shape_a) and \
            shape_a[-1] == w.shape[0] and bias.shape == (w.shape[1],)

    def rewrite(self, op, a, b, c, **_):
        shape_a = type_shape(a.type)
        k, n = constant_value(b).shape
        rows = op.Reshape(a, op.initializer(np.array([math.prod(shape_a[:-1]), k], np.int64),
                                            "rows"))
        return op.Reshape(op.Gemm(rows, b, c),
                          op.initializer(np.array([*shape_a[:-1], n], np.int64), "shape"))


@register_pass
class MatMulAddRowsFusion(RulePass):
    name = "MatMulAddReshapeFusion"
    level = EXTENDED
    order = 25
    rules = (MatMulAddToGemmRows,)
