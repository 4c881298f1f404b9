"""Zero-size tensors, operator by operator (one_node_harness.check_zero_size): an empty batch,
sequence, channel, reduced axis or index list. Where onnxruntime returns (empty) results,
onnxrun returns the same dtypes, shapes and values; where onnxruntime refuses, onnxrun refuses
with one of its own errors. test_every_family_is_covered keeps each operator family of the CPU
kernel table in the list.
"""

from __future__ import annotations

import numpy as np
import pytest
from one_node_harness import check_zero_size
from onnx import TensorProto as TP
from onnx import helper

from onnxrun.providers.cpu.ops import KERNEL_MODULES

MS = "com.microsoft"
ML = "ai.onnx.ml"
RNG = np.random.default_rng(8)
F = np.float32
SEQ = helper.make_sequence_type_proto(helper.make_tensor_type_proto(TP.FLOAT, None))


def r(*shape, dtype=F):
    """Random values of ``shape`` (any dimension may be 0)."""
    if np.dtype(dtype).kind in "iu":
        return RNG.integers(0, 5, size=shape).astype(dtype)
    if np.dtype(dtype) == np.bool_:
        return RNG.random(shape) > 0.5
    return RNG.standard_normal(shape).astype(dtype)


def i64(*values):
    return np.array(values, np.int64)


def s(*values):
    return np.array(values, object)


def case(op, inputs, opset=21, *, domain="", const=(), n_out=1, out_types=None, id=None,
         oracle="onnxruntime", named=None, **attrs):
    """One zero-size case; ``named``: attributes whose names clash with these parameters."""
    attrs.update(named or {})
    inputs = [None if x is None else np.asarray(x) for x in inputs]  # numpy scalars: 0-d
    return pytest.param(op, inputs, opset, domain, const, n_out, out_types, oracle, attrs,
                        id=id or op)


_X0 = r(0, 3, 4, 4)  # an empty batch of 3-channel 4x4 images
_W = r(2, 3, 3, 3)
_U8 = np.zeros((0, 3, 4, 4), np.uint8)
_Q8 = RNG.integers(0, 255, (2, 3, 3, 3)).astype(np.uint8)
_SCALE, _ZP = np.float32(0.1), np.uint8(128)
_BOOLS = np.zeros((0, 3), np.bool_)

CASES = [
    # -- activation (softmax family over an empty axis and an empty batch)
    *[case(op, [r(0, 5)], 13, id=f"{op}-batch") for op in
      ("Relu", "Sigmoid", "Tanh", "Softsign", "Softplus", "HardSigmoid", "Elu", "Selu",
       "LeakyRelu", "ThresholdedRelu", "Shrink")],
    case("Celu", [r(0, 5)], 13), case("HardSwish", [r(0, 5)], 14), case("Mish", [r(2, 0)], 18),
    case("Gelu", [r(0, 5)], 20), case("PRelu", [r(0, 5), r(5)], 16),
    *[case(op, [x], 13, id=f"{op}-{name}", axis=axis) for op in
      ("Softmax", "LogSoftmax", "Hardmax")
      for name, x, axis in (("empty-axis", r(3, 0), -1), ("empty-batch", r(0, 4), -1),
                            ("empty-other-axis", r(2, 0, 3), 1))],
    case("LpNormalization", [r(0, 4)], 13, axis=-1),
    case("LpNormalization", [r(3, 0)], 13, axis=-1, id="LpNormalization-empty-axis"),
    # -- elementwise
    *[case(op, [r(0, 3)], 13, id=op) for op in
      ("Abs", "Neg", "Exp", "Log", "Sqrt", "Reciprocal", "Floor", "Ceil", "Round", "Sign",
       "Sin", "Cos", "Tan", "Asin", "Acos", "Atan", "Sinh", "Cosh", "Asinh", "Acosh", "Atanh",
       "Erf", "IsNaN", "IsInf", "Identity")],
    *[case(op, [r(0, 3), r(1, 3)], 14, id=op) for op in
      ("Add", "Sub", "Mul", "Div", "Pow", "Equal", "Greater", "Less", "GreaterOrEqual",
       "LessOrEqual")],
    case("Add", [r(0, 3), r(2, 1, 3)], 14, id="Add-broadcast-to-empty"),
    case("Mod", [r(0, 3, dtype=np.int32), np.ones((1, 3), np.int32)], 13),
    *[case(op, [r(0, 3), r(3), r(0, 1)], 13, id=op) for op in ("Max", "Min", "Mean", "Sum")],
    *[case(op, [_BOOLS, _BOOLS], 7, id=op) for op in ("And", "Or", "Xor")],
    case("Not", [_BOOLS], 1),
    *[case(op, [r(0, 3, dtype=np.int32), r(0, 3, dtype=np.int32)], 18, id=op)
      for op in ("BitwiseAnd", "BitwiseOr", "BitwiseXor")],
    case("BitwiseNot", [r(0, 3, dtype=np.int32)], 18),
    case("BitShift", [r(0, 3, dtype=np.uint32), r(0, 3, dtype=np.uint32)], 11,
         direction="LEFT"),
    case("Cast", [r(0, 3)], 21, to=TP.INT64), case("CastLike", [r(0, 3), i64(1)], 21),
    case("Clip", [r(0, 3), np.float32(-1), np.float32(1)], 13),
    case("Where", [_BOOLS, r(0, 3), r(1, 3)], 16),
    # -- linalg
    case("MatMul", [r(0, 4), r(4, 3)], 13, id="MatMul-M0"),
    case("MatMul", [r(2, 0), r(0, 3)], 13, id="MatMul-K0"),
    case("MatMul", [r(0, 2, 4), r(4, 3)], 13, id="MatMul-batch0"),
    case("Gemm", [r(0, 4), r(4, 3), r(3)], 13, id="Gemm-M0"),
    case("Gemm", [r(2, 0), r(0, 3), r(3)], 13, id="Gemm-K0"),
    case("Einsum", [r(0, 4), r(4, 3)], 12, equation="ij,jk->ik"),
    # -- conv
    case("Conv", [_X0, _W], 11, id="Conv-batch0"),
    case("Conv", [_X0, _W, r(2)], 11, id="Conv-batch0-bias-pads", pads=[1, 1, 1, 1]),
    case("Conv", [r(0, 3, 4, 4), r(3, 1, 3, 3)], 11, id="Conv-batch0-depthwise", group=3,
         pads=[1, 1, 1, 1]),
    case("Conv", [r(0, 3, 4), r(2, 3, 3)], 11, id="Conv1d-batch0"),
    # constant weights: the prepared (and, on AVX-512 CPUs, compiled) kernels
    case("Conv", [r(0, 3, 4, 4), r(3, 1, 3, 3)], 11, id="Conv-batch0-depthwise-const",
         const=(1,), group=3, pads=[1, 1, 1, 1]),
    case("Conv", [_X0, _W], 11, id="Conv-batch0-const", const=(1,)),
    case("ConvTranspose", [_X0, r(3, 2, 3, 3)], 11, id="ConvTranspose-batch0"),
    # -- pool
    *[case(op, [_X0], 12, id=op, kernel_shape=[2, 2]) for op in
      ("MaxPool", "AveragePool", "LpPool")],
    *[case(op, [_X0], 12, id=op) for op in
      ("GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool")],
    # -- normalization
    case("BatchNormalization", [_X0, r(3), r(3), r(3), np.abs(r(3))], 15),
    case("InstanceNormalization", [_X0, r(3), r(3)], 6),
    case("LayerNormalization", [r(0, 4), r(4), r(4)], 17, id="LayerNormalization-batch0"),
    case("LRN", [_X0], 13, size=3),
    case("MeanVarianceNormalization", [_X0], 13),
    case("Dropout", [r(0, 3)], 13),
    # -- reduction
    *[case(op, [r(0, 3), i64(1)], 18, id=f"{op}-empty-kept") for op in
      ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1",
       "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare")],
    *[case(op, [r(0, 3), i64(0)], 18, id=f"{op}-over-empty") for op in
      ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1",
       "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare")],
    case("ReduceSum", [r(0, 3)], 13, id="ReduceSum-all"),
    *[case(op, [r(0, 3)], 13, id=f"{op}-keep-axis", axis=1) for op in ("ArgMax", "ArgMin")],
    *[case(op, [r(0, 3)], 13, id=f"{op}-over-empty", axis=0) for op in ("ArgMax", "ArgMin")],
    case("CumSum", [r(0, 3), i64(1)], 14),
    case("TopK", [r(0, 5), i64(2)], 11, n_out=2),
    case("TopK", [r(3, 5), i64(0)], 11, n_out=2, id="TopK-k0"),
    # -- tensor
    case("Concat", [r(2, 0), r(2, 3)], 13, axis=1),
    case("Concat", [r(0, 3), r(0, 3)], 13, axis=0, id="Concat-all-empty"),
    case("Reshape", [r(0, 3), i64(3, 0)], 14),
    case("Reshape", [r(0, 3), i64(0, -1)], 14, id="Reshape-copy-zero"),
    case("Reshape", [r(0, 3), i64(3, 0)], 14, id="Reshape-allowzero", allowzero=1),
    case("Reshape", [r(0, 3), i64(3, 0)], 14, id="Reshape-allowzero-const", allowzero=1,
         const=(1,)),
    case("Flatten", [r(0, 3, 2)], 13),
    case("Transpose", [r(0, 3, 2)], 13, perm=[2, 0, 1]),
    case("Squeeze", [r(0, 1, 3), i64(1)], 13), case("Unsqueeze", [r(0, 3), i64(0)], 13),
    case("Expand", [r(1, 3), i64(0, 3)], 13),
    case("Tile", [r(2, 3), i64(0, 1)], 13),
    case("Slice", [r(4, 3), i64(2), i64(2), i64(0)], 13, id="Slice-empty-result"),
    case("Slice", [r(0, 3), i64(0), i64(2), i64(0)], 13, id="Slice-empty-input"),
    case("Split", [r(0, 4), i64(2, 2)], 13, n_out=2, axis=1),
    case("Split", [r(4, 3), i64(0, 4)], 13, n_out=2, id="Split-empty-part"),
    case("Gather", [r(5, 3), np.zeros((0,), np.int64)], 13, id="Gather-no-indices"),
    case("Gather", [r(0, 3), np.zeros((2,), np.int64)], 13, axis=1, id="Gather-empty-data"),
    case("GatherElements", [r(0, 3), np.zeros((0, 3), np.int64)], 13),
    case("GatherND", [r(5, 3), np.zeros((0, 1), np.int64)], 13),
    case("ScatterElements", [r(4, 3), np.zeros((0, 3), np.int64), r(0, 3)], 18),
    case("ScatterND", [r(4, 3), np.zeros((0, 1), np.int64), r(0, 3)], 18),
    case("Compress", [r(0, 3), np.zeros((0,), np.bool_)], 11, axis=0),
    case("NonZero", [r(0, 3)], 13),
    case("OneHot", [np.zeros((0,), np.int64), i64(4), r(2)], 11),
    case("Pad", [r(0, 3), i64(0, 1, 0, 1)], 18),
    case("ConstantOfShape", [i64(0, 3)], 21, out_types=[TP.FLOAT]),
    case("Range", [np.float32(0), np.float32(0), np.float32(1)], 11),
    case("Shape", [r(0, 3)], 21), case("Size", [r(0, 3)], 21),
    case("DepthToSpace", [r(0, 4, 2, 2)], 13, blocksize=2),
    case("SpaceToDepth", [r(0, 1, 4, 4)], 13, blocksize=2),
    case("EyeLike", [r(0, 3)], 22),
    case("Trilu", [r(0, 3, 3)], 14),
    case("Unique", [r(0)], 11, n_out=4, sorted=1),
    case("ReverseSequence", [r(3, 0, 2), np.zeros((0,), np.int64)], 10),
    # -- resize
    case("Resize", [_X0, None, np.array([1, 1, 2, 2], np.float32)], 19, mode="linear"),
    case("Resize", [_X0, None, np.array([1, 1, 2, 2], np.float32)], 19, mode="nearest",
         id="Resize-nearest"),
    # -- rnn (an empty batch; with no time steps onnxruntime returns uninitialized Y_h)
    case("LSTM", [r(2, 0, 3), r(1, 8, 3), r(1, 8, 2)], 14, n_out=3, hidden_size=2,
         oracle="reference"),  # onnxruntime aborts on an empty batch
    case("GRU", [r(2, 0, 3), r(1, 6, 3), r(1, 6, 2)], 14, n_out=2, hidden_size=2,
         oracle="reference"),
    case("RNN", [r(2, 0, 3), r(1, 2, 3), r(1, 2, 2)], 14, n_out=2, hidden_size=2,
         oracle="reference"),
    # -- quantization
    case("QuantizeLinear", [r(0, 3), _SCALE, _ZP], 21),
    case("DequantizeLinear", [np.zeros((0, 3), np.uint8), _SCALE, _ZP], 21),
    case("DynamicQuantizeLinear", [r(0, 3)], 11, n_out=3),
    case("MatMulInteger", [np.zeros((0, 4), np.uint8), r(4, 3, dtype=np.uint8)], 10),
    case("QLinearMatMul", [np.zeros((0, 4), np.uint8), _SCALE, _ZP, r(4, 3, dtype=np.uint8),
                           _SCALE, _ZP, _SCALE, _ZP], 21),
    case("ConvInteger", [_U8, _Q8], 10),
    case("QLinearConv", [_U8, _SCALE, _ZP, _Q8, _SCALE, _ZP, _SCALE, _ZP], 10),
    case("QLinearConv", [_U8, _SCALE, _ZP, _Q8, _SCALE, _ZP, _SCALE, _ZP], 10,
         const=tuple(range(1, 8)), id="QLinearConv-const"),
    case("QLinearConv", [_U8, _SCALE, _ZP, r(3, 1, 3, 3, dtype=np.uint8), _SCALE, _ZP, _SCALE,
                         _ZP], 10, const=tuple(range(1, 8)), group=3,
         id="QLinearConv-depthwise-const"),
    # -- random (shapes only)
    case("RandomNormalLike", [r(0, 3)], 15), case("RandomUniformLike", [r(0, 3)], 15),
    case("Bernoulli", [np.zeros((0, 3), np.float32)], 15),
    # -- image
    case("RoiAlign", [r(1, 3, 4, 4), r(0, 4), np.zeros((0,), np.int64)], 16),
    case("MaxRoiPool", [r(1, 3, 4, 4), r(0, 5)], 1, pooled_shape=[2, 2]),
    case("NonMaxSuppression", [r(1, 0, 4), r(1, 1, 0)], 11),
    case("GridSample", [r(0, 3, 4, 4), r(0, 2, 2, 2)], 20),
    case("AffineGrid", [r(0, 2, 3), i64(0, 1, 4, 4)], 20),
    case("CenterCropPad", [r(0, 4), i64(2)], 18, axes=[1]),
    # -- loss
    case("NegativeLogLikelihoodLoss", [r(0, 3), np.zeros((0,), np.int64)], 13,
         reduction="sum"),
    # -- math_extra
    case("Det", [r(0, 3, 3)], 11),
    case("CumProd", [r(0, 3), i64(1)], 26),
    # -- signal
    case("HannWindow", [i64(0)[0]], 17), case("HammingWindow", [i64(0)[0]], 17),
    case("BlackmanWindow", [i64(0)[0]], 17),
    case("DFT", [r(0, 8, 1)], 20, id="DFT-batch0"),
    # -- text
    case("StringConcat", [s(), s()], 20),
    case("RegexFullMatch", [s()], 20, pattern="a+"),
    case("StringSplit", [s()], 20, n_out=2),
    # -- attention and transformer
    case("RMSNormalization", [r(0, 4), r(4)], 23),
    case("LayerNormalization", [r(3, 0), r(0), r(0)], 17, id="LayerNormalization-empty-axis"),
    case("Attention", [r(0, 2, 3, 4), r(0, 2, 5, 4), r(0, 2, 5, 4)], 23, id="Attention-batch0"),
    case("RotaryEmbedding", [r(0, 2, 3, 4), r(8, 2), r(8, 2), np.zeros((0, 3), np.int64)], 23),
    # -- control flow (sequences of empty tensors)
    case("SplitToSequence", [r(0, 3)], 11, axis=1, out_types=[SEQ]),
    case("SplitToSequence", [r(2, 0)], 11, axis=0, out_types=[SEQ], id="SplitToSequence-rows"),
    # -- ai.onnx.ml
    case("LinearRegressor", [r(0, 3)], 13, domain=ML, coefficients=[1.0, 2.0, 3.0],
         intercepts=[0.5]),
    case("LinearClassifier", [r(0, 3)], 13, domain=ML, n_out=2,
         coefficients=[1.0, 2.0, 3.0, -1.0, 0.0, 1.0], intercepts=[0.1, 0.2],
         classlabels_ints=[0, 1]),
    case("Normalizer", [r(0, 3)], 13, domain=ML, norm="L2"),
    case("Scaler", [r(0, 3)], 13, domain=ML, scale=[2.0], offset=[1.0]),
    case("Binarizer", [r(0, 3)], 13, domain=ML),
    case("Imputer", [r(0, 3)], 13, domain=ML, imputed_value_floats=[0.0],
         replaced_value_float=np.nan),
    case("ArrayFeatureExtractor", [r(0, 3), i64(1)], 13, domain=ML),
    case("TreeEnsembleRegressor", [r(0, 2)], 13, domain=ML, n_targets=1,
         nodes_treeids=[0, 0, 0], nodes_nodeids=[0, 1, 2], nodes_featureids=[0, 0, 0],
         nodes_values=[0.5, 0.0, 0.0], nodes_modes=["BRANCH_LEQ", "LEAF", "LEAF"],
         nodes_truenodeids=[1, 0, 0], nodes_falsenodeids=[2, 0, 0],
         target_treeids=[0, 0], target_nodeids=[1, 2], target_ids=[0, 0],
         target_weights=[1.0, 2.0]),
    case("SVMRegressor", [r(0, 2)], 13, domain=ML, coefficients=[1.0, -1.0],
         support_vectors=[0.0, 1.0, 1.0, 0.0], n_supports=2, rho=[0.1],
         kernel_type="LINEAR", kernel_params=[0.1, 0.0, 2.0]),
    # -- com.microsoft: fused and transformer
    case("FusedConv", [_X0, _W, r(2)], 11, domain=MS, activation="Relu",
         id="FusedConv-batch0"),
    case("FusedGemm", [r(0, 4), r(4, 3), r(3)], 11, domain=MS, activation="Relu"),
    case("FusedMatMul", [r(0, 4), r(4, 3)], 11, domain=MS),
    case("BiasGelu", [r(0, 4), r(4)], 11, domain=MS),
    case("FastGelu", [r(0, 4), r(4)], 11, domain=MS),
    case("Gelu", [r(0, 4)], 11, domain=MS, id="Gelu-ms"),
    case("QuickGelu", [r(0, 4)], 11, domain=MS),
    case("BiasSoftmax", [r(0, 2, 4), r(1, 2, 4)], 11, domain=MS, axis=-1,
         is_inner_broadcast=0, oracle=[r(0, 2, 4)]),  # no CPU kernel in onnxruntime
    case("SkipLayerNormalization", [r(0, 2, 4), r(0, 2, 4), r(4), r(4)], 11, domain=MS),
    case("SkipSimplifiedLayerNormalization", [r(0, 2, 4), r(0, 2, 4), r(4)], 11, domain=MS),
    case("SimplifiedLayerNormalization", [r(0, 4), r(4)], 17),
    case("MultiHeadAttention", [r(0, 3, 8), r(0, 3, 8), r(0, 3, 8)], 11, domain=MS,
         num_heads=2),
    # -- com.microsoft: quantization
    case("DynamicQuantizeMatMul", [r(0, 4), r(4, 3, dtype=np.int8), np.float32(0.1)], 11,
         domain=MS, const=(1, 2), out_types=[TP.FLOAT]),
    case("MatMulIntegerToFloat", [np.zeros((0, 4), np.uint8), r(4, 3, dtype=np.int8),
                                  np.float32(0.1), np.float32(0.2)], 11, domain=MS,
         const=(1, 2, 3), out_types=[TP.FLOAT]),
    case("QLinearAdd", [np.zeros((0, 3), np.uint8), _SCALE, _ZP, np.zeros((0, 3), np.uint8),
                        _SCALE, _ZP, _SCALE, _ZP], 11, domain=MS, out_types=[TP.UINT8]),
    case("QLinearSigmoid", [np.zeros((0, 3), np.uint8), _SCALE, _ZP, _SCALE, _ZP], 11,
         domain=MS, out_types=[TP.UINT8]),
    case("QLinearGlobalAveragePool", [_U8, _SCALE, _ZP, _SCALE, _ZP], 11, domain=MS,
         out_types=[TP.UINT8]),
    case("DynamicQuantizeLSTM", [r(2, 0, 3), r(1, 3, 8, dtype=np.int8),
                                 r(1, 2, 8, dtype=np.int8), None, None, None, None, None,
                                 np.full(1, 0.1, F), np.zeros(1, np.int8), np.full(1, 0.1, F),
                                 np.zeros(1, np.int8)],
         11, domain=MS, n_out=3, const=(1, 2, 8, 9, 10, 11), out_types=[TP.FLOAT] * 3,
         hidden_size=2, oracle=[r(2, 1, 0, 2), r(1, 0, 2), r(1, 0, 2)]),  # onnxruntime aborts

    # -- second batch: the rest of each family
    case("Col2Im", [r(0, 4, 9), i64(4, 4), i64(2, 2)], 18),
    case("MaxUnpool", [r(0, 3, 2, 2), np.zeros((0, 3, 2, 2), np.int64)], 11,
         kernel_shape=[2, 2], strides=[2, 2]),
    case("DeformConv", [_X0, _W, r(0, 18, 2, 2)], 19, oracle="reference"),  # no ORT kernel
    case("Multinomial", [r(0, 3)], 7, sample_size=2),
    case("RandomNormal", [], 1, shape=[0, 3], out_types=[TP.FLOAT]),
    case("RandomUniform", [], 1, shape=[3, 0], out_types=[TP.FLOAT]),
    case("Constant", [], 13, value=helper.make_tensor("v", TP.FLOAT, [0, 3], [])),
    case("Upsample", [_X0, np.array([1, 1, 2, 2], np.float32)], 9),
    case("STFT", [r(0, 16, 1), i64(4)[0], None, i64(8)[0]], 17),
    case("Scatter", [r(4, 3), np.zeros((0, 3), np.int64), r(0, 3)], 10),
    case("TfIdfVectorizer", [np.zeros((0, 3), np.int64)], 9, mode="TF", min_gram_length=1,
         max_gram_length=1, max_skip_count=0, ngram_counts=[0], ngram_indexes=[0, 1],
         pool_int64s=[1, 2]),
    case("Swish", [r(0, 3)], 24, oracle="reference"),
    case("SequenceConstruct", [r(0, 3), r(0, 3)], 11, out_types=[SEQ]),
    case("Loop", [i64(0)[0], np.array(True), r(0, 3)], 16, body=helper.make_graph(
        [helper.make_node("Identity", ["c"], ["c_out"]),
         helper.make_node("Identity", ["v"], ["v_out"])], "body",
        [helper.make_tensor_value_info("i", TP.INT64, []),
         helper.make_tensor_value_info("c", TP.BOOL, []),
         helper.make_tensor_value_info("v", TP.FLOAT, None)],
        [helper.make_tensor_value_info("c_out", TP.BOOL, []),
         helper.make_tensor_value_info("v_out", TP.FLOAT, None)])),
    case("If", [np.array(True)], 16, then_branch=helper.make_graph(
        [helper.make_node("Constant", [], ["t"],
                          value=helper.make_tensor("e", TP.FLOAT, [0, 2], []))], "then",
        [], [helper.make_tensor_value_info("t", TP.FLOAT, None)]),
        else_branch=helper.make_graph(
        [helper.make_node("Constant", [], ["e"],
                          value=helper.make_tensor("e", TP.FLOAT, [1, 2], [1.0, 2.0]))],
        "else", [], [helper.make_tensor_value_info("e", TP.FLOAT, None)]),
        out_types=[TP.FLOAT]),
    case("Adagrad", [np.float32(0.1), i64(0)[0], r(0), r(0), r(0)], 18,
         domain="ai.onnx.preview.training", n_out=2, oracle="reference",
         out_types=[TP.FLOAT] * 2),
    case("Momentum", [np.float32(0.1), i64(0)[0], r(0), r(0), r(0)], 18,
         domain="ai.onnx.preview.training", n_out=2, oracle="reference", alpha=0.9, beta=1.0,
         mode="standard", norm_coefficient=0.0, out_types=[TP.FLOAT] * 2),
    # ai.onnx.ml
    case("CategoryMapper", [s()], 13, domain=ML, cats_strings=["a", "b"], cats_int64s=[0, 1]),
    case("LabelEncoder", [s()], 13, domain=ML, classes_strings=["a", "b"], default_int64=-1),
    case("OneHotEncoder", [np.zeros((0,), np.int64)], 13, domain=ML, cats_int64s=[1, 2]),
    case("FeatureVectorizer", [r(0, 2), r(0, 3)], 13, domain=ML, inputdimensions=[2, 3],
         oracle="reference"),  # onnxruntime aborts on an empty batch
    case("SVMClassifier", [r(0, 2)], 13, domain=ML, n_out=2, coefficients=[1.0, -1.0],
         support_vectors=[0.0, 1.0, 1.0, 0.0], vectors_per_class=[1, 1], rho=[0.1],
         kernel_type="LINEAR", classlabels_ints=[0, 1], kernel_params=[0.1, 0.0, 2.0]),
    case("TreeEnsembleClassifier", [r(0, 2)], 13, domain=ML, n_out=2,
         nodes_treeids=[0, 0, 0], nodes_nodeids=[0, 1, 2], nodes_featureids=[0, 0, 0],
         nodes_values=[0.5, 0.0, 0.0], nodes_modes=["BRANCH_LEQ", "LEAF", "LEAF"],
         nodes_truenodeids=[1, 0, 0], nodes_falsenodeids=[2, 0, 0],
         class_treeids=[0, 0], class_nodeids=[1, 2], class_ids=[0, 1],
         class_weights=[1.0, 1.0], classlabels_int64s=[0, 1]),
    # com.microsoft
    case("QuantizeLinear", [r(0, 3), _SCALE, _ZP], 13, domain=MS, id="QuantizeLinear-ms",
         out_types=[TP.UINT8]),
    case("DequantizeLinear", [np.zeros((0, 3), np.uint8), _SCALE, _ZP], 13, domain=MS,
         id="DequantizeLinear-ms", out_types=[TP.FLOAT]),
    case("QLinearMul", [np.zeros((0, 3), np.uint8), _SCALE, _ZP, np.zeros((1, 3), np.uint8),
                        _SCALE, _ZP, _SCALE, _ZP], 11, domain=MS, out_types=[TP.UINT8]),
    case("QLinearLeakyRelu", [np.zeros((0, 3), np.uint8), _SCALE, _ZP, _SCALE, _ZP], 11,
         domain=MS, out_types=[TP.UINT8]),
    case("QLinearSoftmax", [np.zeros((0, 3), np.uint8), _SCALE, _ZP, np.float32(1 / 256),
                            np.uint8(0)], 13, domain=MS, out_types=[TP.UINT8], axis=-1,
         named={"opset": 13}),
    case("QLinearConcat", [_SCALE, _ZP, np.zeros((0, 3), np.uint8), _SCALE, _ZP,
                           np.zeros((0, 3), np.uint8), _SCALE, _ZP], 11, domain=MS,
         out_types=[TP.UINT8], axis=1),
    case("QLinearAveragePool", [_U8, _SCALE, _ZP, _SCALE, _ZP], 11, domain=MS,
         out_types=[TP.UINT8], kernel_shape=[2, 2]),
    case("QGemm", [np.zeros((0, 4), np.uint8), _SCALE, _ZP, r(4, 3, dtype=np.uint8), _SCALE,
                   _ZP], 11, domain=MS, out_types=[TP.FLOAT]),
    case("MatMulNBits", [r(0, 32), np.zeros((3, 1, 16), np.uint8), np.ones(3, np.float32)],
         11, domain=MS, const=(1, 2), out_types=[TP.FLOAT], K=32, N=3, bits=4,
         block_size=32),
    case("NhwcMaxPool", [np.zeros((0, 4, 4, 3), np.uint8)], 11, domain=MS,
         kernel_shape=[2, 2], out_types=[TP.UINT8]),
    case("Attention", [r(0, 3, 8), r(8, 24), r(24)], 11, domain=MS, id="Attention-ms-batch0",
         num_heads=2, out_types=[TP.FLOAT]),
    case("RotaryEmbedding", [r(0, 3, 8), np.zeros((0, 3), np.int64), r(10, 2), r(10, 2)], 11,
         domain=MS, id="RotaryEmbedding-ms", out_types=[TP.FLOAT]),
    case("EmbedLayerNormalization", [np.zeros((0, 3), np.int32), np.zeros((0, 3), np.int32),
                                     r(20, 8), r(16, 8), r(2, 8), r(8), r(8)], 11, domain=MS,
         n_out=2, out_types=[TP.FLOAT, TP.INT32]),
    case("LayerNormalization", [r(0, 4), r(4), r(4)], 1, id="LayerNormalization-v1-batch0",
         out_types=[TP.FLOAT]),
]


@pytest.mark.parametrize("op,inputs,opset,domain,const,n_out,out_types,oracle,attrs", CASES)
def test_zero_size(op, inputs, opset, domain, const, n_out, out_types, oracle, attrs):
    check_zero_size(op, inputs, opset=opset, domain=domain, const=const, n_out=n_out,
                    out_types=out_types, oracle=oracle, attributes=attrs)


def _covered() -> set[tuple[str, str]]:
    return {(p.values[3], p.values[0]) for p in CASES}


def test_every_family_is_covered():
    """Each module of the CPU kernel table (an operator family) has an operator here, but the
    families whose inputs cannot be empty (control flow bodies, training, gradients)."""
    not_tensor_families = {"gradient", "training", "ml.zipmap"}
    covered = _covered()
    missing = []
    for domain, modules in KERNEL_MODULES.items():
        for module, op_types in modules.items():
            # ai.onnxrun: onnxrun's own fusions, no oracle runs them (their parts are here)
            if module in not_tensor_families or domain in ("ai.onnx.preview", "ai.onnxrun"):
                continue
            if not any((domain, op) in covered for op in op_types):
                missing.append(f"{domain or 'ai.onnx'}:{module}")
    assert not missing, missing
