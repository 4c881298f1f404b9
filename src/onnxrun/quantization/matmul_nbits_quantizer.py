"""Weight-only block quantization of MatMul weights to 2, 4 or 8 bits (onnxruntime's
``matmul_nbits_quantizer``).

Each constant MatMul weight ``B [K, N]`` is split, per output column, into blocks of
``block_size`` values along K; each block gets a scale (and, asymmetric, a zero point) and its
values are rounded to ``bits``-bit integers. The QOperator format writes one com.microsoft
``MatMulNBits`` node (weights packed low bits first, ``[N, K / block_size, block_size * bits /
8]``); the QDQ format writes a block-wise ``DequantizeLinear`` (opset 21) before the MatMul.
A weight with unit leading dimensions (``[1, ..., K, N]``) is quantized as its 2-D matrix and the
MatMul's output rank restored by a small shape computation.
"""

from __future__ import annotations

import logging
from typing import Any

import ml_dtypes
import numpy as np
import onnx
from onnx import ModelProto, NodeProto, TensorProto, helper, numpy_helper

from ..api.blockwise import quantize_blocks  # MLAS's block quantization, one home
from .onnx_model import ONNXModel
from .quant_types import QuantFormat

logger = logging.getLogger("onnxrun.quantization")
MS_DOMAIN = "com.microsoft"


class WeightOnlyQuantConfig:
    """What to quantize and how (the base of the algorithm configurations)."""

    def __init__(self, algorithm: str, quant_format: QuantFormat,
                 op_types_to_quantize: tuple[str, ...] | None = None,
                 quant_axes: tuple[tuple[str, int], ...] | None = None,
                 customized_weight_config: dict | None = None) -> None:
        self.algorithm = algorithm
        self.quant_format = quant_format
        self.op_types_to_quantize = set(op_types_to_quantize) if op_types_to_quantize \
            else {"MatMul"}
        self.quant_axes = dict(quant_axes) if quant_axes else {"MatMul": 0, "Gather": 1}
        self.customized_weight_config = customized_weight_config or {}


class DefaultWeightOnlyQuantConfig(WeightOnlyQuantConfig):
    """Round to nearest, per block of K: symmetric (the block's value of largest magnitude maps
    to the most negative integer, zero point 2**(bits-1)) or asymmetric (min..max, with 0)."""

    def __init__(self, block_size: int = 128, is_symmetric: bool = False,
                 accuracy_level: int | None = None, quant_format=QuantFormat.QOperator,
                 op_types_to_quantize: tuple[str, ...] | None = None,
                 quant_axes: tuple[tuple[str, int], ...] | None = None, bits: int = 4,
                 channel_wised_quantize: bool = False) -> None:
        super().__init__("DEFAULT", quant_format, op_types_to_quantize, quant_axes)
        if bits not in (2, 4, 8):
            raise ValueError(f"bits must be 2, 4 or 8, got {bits}")
        if block_size < 16 or block_size & (block_size - 1):
            raise ValueError(f"block_size must be a power of 2 >= 16, got {block_size}")
        self.block_size = block_size
        self.is_symmetric = is_symmetric
        self.accuracy_level = accuracy_level
        self.bits = bits
        self.channel_wised_quantize = channel_wised_quantize


class _UnsupportedAlgorithm(WeightOnlyQuantConfig):
    """Configurations of algorithms onnxrun does not implement (they need torch or
    neural_compressor): accepted, refused by MatMulNBitsQuantizer with a clear error."""

    def __init__(self, algorithm: str, quant_format=QuantFormat.QOperator,
                 op_types_to_quantize=None, **options: Any) -> None:
        super().__init__(algorithm, quant_format, op_types_to_quantize)
        self.options = options


class RTNWeightOnlyQuantConfig(_UnsupportedAlgorithm):
    def __init__(self, ratios=None, quant_format=QuantFormat.QOperator,
                 op_types_to_quantize=None, customized_weight_config=None) -> None:
        super().__init__("RTN", quant_format, op_types_to_quantize, ratios=ratios)


class GPTQWeightOnlyQuantConfig(_UnsupportedAlgorithm):
    def __init__(self, calibration_data_reader=None, percdamp=0.01, block_size=128,
                 actorder=False, mse=False, perchannel=True, quant_format=QuantFormat.QOperator,
                 op_types_to_quantize=None) -> None:
        super().__init__("GPTQ", quant_format, op_types_to_quantize, block_size=block_size)


class HQQWeightOnlyQuantConfig(_UnsupportedAlgorithm):
    def __init__(self, block_size=128, bits=4, axis=1, quant_format=QuantFormat.QOperator,
                 op_types_to_quantize=None, quant_axes=None) -> None:
        super().__init__("HQQ", quant_format, op_types_to_quantize, block_size=block_size,
                         bits=bits)


def _pack(values: np.ndarray, bits: int) -> np.ndarray:
    """Unsigned ``bits``-bit values packed into bytes along the last axis, low bits first."""
    per = 8 // bits
    v = values.reshape(*values.shape[:-1], -1, per).astype(np.uint8)
    shifts = (np.arange(per, dtype=np.uint8) * bits)
    return np.bitwise_or.reduce(v << shifts, axis=-1).astype(np.uint8)


class MatMulNBitsQuantizer:
    """Quantizes a model's constant MatMul weights block-wise (``process()``, then the result
    in ``self.model``, an ONNXModel)."""

    def __init__(self, model: ModelProto | str, bits: int = 4, block_size: int = 128,
                 is_symmetric: bool = False, accuracy_level: int | None = None,
                 nodes_to_exclude=None, nodes_to_include: list[str] | None = None,
                 quant_format=QuantFormat.QOperator,
                 op_types_to_quantize: tuple[str, ...] | None = None,
                 quant_axes: tuple[tuple[str, int], ...] | None = None,
                 channel_wised_quantize: bool = False,
                 algo_config: WeightOnlyQuantConfig | None = None) -> None:
        self.model = ONNXModel(onnx.load(model) if isinstance(model, str) else model)
        self.model_path = model if isinstance(model, str) else None
        self.nodes_to_exclude = set(nodes_to_exclude or ())
        self.nodes_to_include = set(nodes_to_include) if nodes_to_include else None
        if algo_config is None:
            algo_config = DefaultWeightOnlyQuantConfig(
                block_size=block_size, is_symmetric=is_symmetric, accuracy_level=accuracy_level,
                quant_format=quant_format, op_types_to_quantize=op_types_to_quantize,
                quant_axes=quant_axes, bits=bits, channel_wised_quantize=channel_wised_quantize)
        self.algo_config = algo_config
        if not isinstance(algo_config, DefaultWeightOnlyQuantConfig):
            raise NotImplementedError(
                f"the {algo_config.algorithm} weight-only algorithm is not implemented by "
                "onnxrun; use DefaultWeightOnlyQuantConfig")
        if "Gather" in algo_config.op_types_to_quantize and algo_config.bits != 4:
            raise NotImplementedError("Gather -> GatherBlockQuantized is 4-bit only")
        self.bits = algo_config.bits
        self.block_size = algo_config.block_size
        self.is_symmetric = algo_config.is_symmetric
        self.accuracy_level = algo_config.accuracy_level
        self.qdq = algo_config.quant_format == QuantFormat.QDQ

    def process(self) -> None:
        graph = self.model.graph()
        out: list[NodeProto] = []
        changed = False
        for node in graph.node:
            new = self._quantize(node) if self._selected(node) else None
            if new is None:
                out.append(node)
            else:
                out.extend(new)
                changed = True
        del graph.node[:]
        graph.node.extend(out)
        if changed:
            if self.qdq:
                for o in self.model.opset_import():
                    if o.domain in ("", "ai.onnx") and o.version < 21:
                        o.version = 21  # block-wise DequantizeLinear
                if self.model.ir_version() < 10:
                    self.model.model.ir_version = 10
            else:
                self.model.set_opset_import(MS_DOMAIN, 1)
        self.model.clean_initializers()

    def _selected(self, node: NodeProto) -> bool:
        if node.op_type not in self.algo_config.op_types_to_quantize \
                or node.op_type not in ("MatMul", "Gather"):
            return False
        if node.name in self.nodes_to_exclude:
            return False
        return self.nodes_to_include is None or node.name in self.nodes_to_include

    def _quantize(self, node: NodeProto) -> list[NodeProto] | None:
        if node.op_type == "Gather":
            return self._gather(node)
        init = self.model.get_initializer(node.input[1])
        if init is None or init.data_type not in (TensorProto.FLOAT, TensorProto.FLOAT16):
            return None
        W = numpy_helper.to_array(init)
        if W.ndim < 2 or any(d != 1 for d in W.shape[:-2]):
            logger.info("MatMul %s: weight of shape %s is not quantized (not [.., K, N] with "
                        "unit leading dims)", node.name, W.shape)
            return None
        K, N = W.shape[-2:]
        W2 = W.reshape(K, N).astype(np.float32)
        q, scale, zp = quantize_blocks(W2, self.block_size, self.bits, self.is_symmetric,
                                       W.dtype)
        sdt = W.dtype  # scales in the weight's float type
        rank_b = W.ndim
        a_type = self.model.get_tensor_type(node.input[0])
        if a_type is not None and a_type.HasField("shape") \
                and len(a_type.shape.dim) >= rank_b:
            rank_b = 2  # A's rank already gives MatMulNBits the MatMul's output rank
        y = node.output[0]
        mm_out = f"{y}_pre_reshape" if rank_b > 2 else y
        name = node.name or y
        if self.qdq:
            nodes = self._qdq_nodes(node, init.name, W2.shape, q, scale, zp, sdt, mm_out)
            helper_prefix = f"{name}_DQ_Q4_output"
        else:
            nodes = self._nbits_node(node, init.name, K, N, q, scale, zp, sdt, mm_out)
            helper_prefix = f"{name}_Q4_output"
        if rank_b > 2:
            nodes += self._restore_rank(node.input[0], mm_out, y, rank_b, N, helper_prefix)
        return nodes

    def _gather(self, node: NodeProto) -> list[NodeProto] | None:
        """A constant [rows, cols] table gathered along axis 0 -> com.microsoft
        GatherBlockQuantized with 4-bit blocks along the quantize axis (1)."""
        init = self.model.get_initializer(node.input[0])
        if init is None or init.data_type not in (TensorProto.FLOAT, TensorProto.FLOAT16):
            return None
        data = numpy_helper.to_array(init)
        qaxis = self.algo_config.quant_axes.get("Gather", 1)
        gaxis = next((a.i for a in node.attribute if a.name == "axis"), 0)
        if data.ndim != 2 or qaxis % 2 != 1 or gaxis % 2 != 0:
            return None  # rows gathered, blocks along the columns only
        rows, cols = data.shape
        q, scale, zp = quantize_blocks(data.T.astype(np.float32), self.block_size, 4,
                                       self.is_symmetric, data.dtype)  # blocks of columns
        vals = q.reshape(rows, -1)[:, :cols].astype(np.int16)
        w = init.name
        if self.is_symmetric:
            inputs = [self._add(f"{w}_Q4", (vals - 8).astype(ml_dtypes.int4)), node.input[1],
                      self._add(f"{w}_scales", scale.astype(data.dtype))]
        else:
            inputs = [self._add(f"{w}_Q4", vals.astype(ml_dtypes.uint4)), node.input[1],
                      self._add(f"{w}_scales", scale.astype(data.dtype)),
                      self._add(f"{w}_zero_points", zp.astype(ml_dtypes.uint4))]
        name = node.name or node.output[0]
        return [helper.make_node("GatherBlockQuantized", inputs, list(node.output),
                                 f"{name}_Q4", domain=MS_DOMAIN, block_size=self.block_size,
                                 gather_axis=gaxis % 2, quantize_axis=qaxis % 2)]

    def _nbits_node(self, node, w, K, N, q, scale, zp, sdt, out) -> list[NodeProto]:
        name = node.name or out
        kb = q.shape[1]
        packed = _pack(q, self.bits)  # [N, kb, block_size * bits / 8]
        inputs = [node.input[0], self._add(f"{w}_Q4", packed),
                  self._add(f"{w}_scales", scale.astype(sdt))]
        if not self.is_symmetric:
            per = 8 // self.bits
            width = -(-kb // per) * per
            zpad = np.zeros((N, width), np.uint8)
            zpad[:, :kb] = zp
            inputs.append(self._add(f"{w}_zero_points", _pack(zpad, self.bits)))
        attrs = {"K": K, "N": N, "bits": self.bits, "block_size": self.block_size}
        if self.accuracy_level is not None:
            attrs["accuracy_level"] = self.accuracy_level
        return [helper.make_node("MatMulNBits", inputs, [out], f"{name}_Q4", domain=MS_DOMAIN,
                                 **attrs)]

    def _qdq_nodes(self, node, w, shape, q, scale, zp, sdt, out) -> list[NodeProto]:
        K, N = shape
        name = node.name or out
        signed = self.is_symmetric
        half = 1 << (self.bits - 1)
        vals = q.reshape(N, -1)[:, :K].T.astype(np.int16)  # [K, N]
        if signed:
            vals = vals - half
        if self.bits == 4:
            qdt = ml_dtypes.int4 if signed else ml_dtypes.uint4
        else:  # 2 and 8 bits are stored in 8-bit integers
            qdt = np.int8 if signed else np.uint8
        inputs = [self._add(f"{w}_DQ_Q4", vals.astype(qdt)),
                  self._add(f"{w}_DQ_scales", np.ascontiguousarray(scale.T).astype(sdt))]
        if not signed:
            inputs.append(self._add(f"{w}_DQ_zero_points", np.ascontiguousarray(zp.T).astype(qdt)))
        dq_out = f"{w}_DQ_Q4_output"
        return [helper.make_node("DequantizeLinear", inputs, [dq_out], f"{name}_DQ_Q4", axis=0,
                                 block_size=self.block_size),
                helper.make_node("MatMul", [node.input[0], dq_out], [out], f"{name}_matmul_Q4")]

    def _restore_rank(self, a: str, src: str, y: str, rank_b: int, N: int, p: str
                      ) -> list[NodeProto]:
        """Reshape the 2-D weight's product to MatMul's output shape for a [1, .., K, N] weight:
        ``[1] * max(rank_b - max(rank_a, 2), 0) + shape(A)[:-1] + [N]``."""
        c = {"zero": np.int64(0), "one": np.int64(1), "two": np.int64(2),
             "rank_b": np.int64(rank_b), "one_vec": np.array([1], np.int64),
             "zero_vec": np.array([0], np.int64), "n_vec": np.array([N], np.int64)}
        k = {key: self._add(f"{p}_{key}", np.asarray(v)) for key, v in c.items()}
        t = {n: f"{p}_{n}" for n in ("a_shape", "a_shape_of_shape", "a_rank", "a_rank_eff",
                                     "extra_raw", "extra_count", "extra_count_vec",
                                     "extra_ones", "a_rank_m1", "a_rank_m1_vec",
                                     "a_prefix_shape", "target_shape")}
        one = numpy_helper.from_array(np.array([1], np.int64), f"{p}_one_value")
        mk = helper.make_node
        return [
            mk("Shape", [a], [t["a_shape"]], f"{p}_shape_a"),
            mk("Shape", [t["a_shape"]], [t["a_shape_of_shape"]], f"{p}_shape_of_a_shape"),
            mk("Gather", [t["a_shape_of_shape"], k["zero"]], [t["a_rank"]], f"{p}_gather_rank"),
            mk("Max", [t["a_rank"], k["two"]], [t["a_rank_eff"]], f"{p}_max_rank_eff"),
            mk("Sub", [k["rank_b"], t["a_rank_eff"]], [t["extra_raw"]], f"{p}_sub"),
            mk("Max", [t["extra_raw"], k["zero"]], [t["extra_count"]], f"{p}_max"),
            mk("Reshape", [t["extra_count"], k["one_vec"]], [t["extra_count_vec"]],
               f"{p}_reshape_extra"),
            mk("ConstantOfShape", [t["extra_count_vec"]], [t["extra_ones"]],
               f"{p}_const_ones", value=one),
            mk("Sub", [t["a_rank"], k["one"]], [t["a_rank_m1"]], f"{p}_sub_one"),
            mk("Reshape", [t["a_rank_m1"], k["one_vec"]], [t["a_rank_m1_vec"]],
               f"{p}_reshape_rank_m1"),
            mk("Slice", [t["a_shape"], k["zero_vec"], t["a_rank_m1_vec"], k["zero_vec"]],
               [t["a_prefix_shape"]], f"{p}_slice_a_prefix"),
            mk("Concat", [t["extra_ones"], t["a_prefix_shape"], k["n_vec"]], [t["target_shape"]],
               f"{p}_concat_target", axis=0),
            mk("Reshape", [src, t["target_shape"]], [y], f"{p}_reshape_out"),
        ]

    def _add(self, name: str, value: np.ndarray) -> str:
        self.model.add_initializer(numpy_helper.from_array(np.asarray(value), name))
        return name


__all__ = ["DefaultWeightOnlyQuantConfig", "GPTQWeightOnlyQuantConfig",
           "HQQWeightOnlyQuantConfig", "MatMulNBitsQuantizer", "RTNWeightOnlyQuantConfig",
           "WeightOnlyQuantConfig"]
