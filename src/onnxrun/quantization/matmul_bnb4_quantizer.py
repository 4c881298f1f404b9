"""Weight-only FP4 / NF4 quantization of MatMul weights (bitsandbytes' 4-bit formats) into
com.microsoft ``MatMulBnb4`` (onnxruntime's ``matmul_bnb4_quantizer``).

The transposed weight ``B.T [N, K]`` is flattened and split into blocks of ``block_size``;
each value divided by its block's largest magnitude (``absmax``) is stored as the index of the
nearest of 16 code values, two a byte, the first in the high nibble.
"""

from __future__ import annotations

import logging

import numpy as np
import onnx
from onnx import ModelProto, TensorProto, helper, numpy_helper

from ..api.blockwise import quantize_matmul_bnb4  # bitsandbytes' rounding, one home

# the code values live with the MatMulBnb4 kernel that decodes them
from ..providers.cpu.ops.contrib.quantization import BNB4_CODES as CODES
from ..providers.cpu.ops.contrib.quantization import FP4_CODE, NF4_CODE
from .onnx_model import ONNXModel

logger = logging.getLogger("onnxrun.quantization")


def quantize_bnb4(W: np.ndarray, quant_type: int, block_size: int
                  ) -> tuple[np.ndarray, np.ndarray]:
    """``W [K, N]`` -> (packed uint8 [ceil(N*K / 2)], absmax float [ceil(N*K / block)])."""
    if quant_type not in CODES:
        raise ValueError(f"quant_type must be 0 (FP4) or 1 (NF4), got {quant_type}")
    K, N = W.shape
    n = N * K
    packed = np.zeros((n + 1) // 2, np.uint8)
    absmax = np.zeros(-(-n // block_size), W.dtype)
    quantize_matmul_bnb4(packed, np.ascontiguousarray(W.T), absmax, block_size, quant_type, N, K)
    return packed, absmax


class MatMulBnb4Quantizer:
    """Quantizes the constant 2-D MatMul weights of a model (``process()``; the result in
    ``self.model``, an ONNXModel)."""

    FP4 = 0
    NF4 = 1

    def __init__(self, model: ModelProto | str, quant_type: int, block_size: int,
                 nodes_to_exclude=None) -> None:
        if quant_type not in CODES:
            raise ValueError(f"quant_type must be 0 (FP4) or 1 (NF4), got {quant_type}")
        self.model = ONNXModel(onnx.load(model) if isinstance(model, str) else model)
        self.quant_type = quant_type
        self.block_size = int(block_size)
        self.nodes_to_exclude = set(nodes_to_exclude or ())

    def process(self) -> None:
        graph = self.model.graph()
        out = []
        changed = False
        for node in graph.node:
            new = self._quantize(node)
            out.append(new or node)
            changed |= new is not None
        del graph.node[:]
        graph.node.extend(out)
        if changed:
            self.model.set_opset_import("com.microsoft", 1)
        self.model.clean_initializers()

    def _quantize(self, node) -> onnx.NodeProto | None:
        if node.op_type != "MatMul" or node.name in self.nodes_to_exclude:
            return None
        init = self.model.get_initializer(node.input[1])
        if init is None or init.data_type not in (TensorProto.FLOAT, TensorProto.FLOAT16) \
                or len(init.dims) != 2:
            return None
        W = numpy_helper.to_array(init)
        K, N = W.shape
        packed, absmax = quantize_bnb4(W, self.quant_type, self.block_size)
        w = init.name
        self.model.add_initializer(numpy_helper.from_array(packed, f"{w}_Bnb4"))
        self.model.add_initializer(numpy_helper.from_array(absmax, f"{w}_absmax"))
        name = node.name or node.output[0]
        return helper.make_node("MatMulBnb4", [node.input[0], f"{w}_Bnb4", f"{w}_absmax"],
                                list(node.output), f"{name}_Bnb4", domain="com.microsoft", K=K,
                                N=N, block_size=self.block_size, quant_type=self.quant_type)


__all__ = ["FP4_CODE", "MatMulBnb4Quantizer", "NF4_CODE", "quantize_bnb4"]
