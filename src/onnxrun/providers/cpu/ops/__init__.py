"""CPU kernels grouped by operator family, one module per family (``ml/``: ai.onnx.ml,
``contrib/``: com.microsoft). A module registers its kernels when imported, and modules are
imported on demand: ``KERNEL_MODULES`` says which module registers which operators, so a session
imports only the families its model uses (importing all of them costs more than creating a session
for a small model). tests/test_kernel_index.py checks the table against what the modules register
and prints the table to paste when they change; an operator missing from it is still found (a
lookup that finds nothing imports every module), only slower.
"""

from __future__ import annotations

import importlib

# domain -> module (relative to this package) -> operators it registers
KERNEL_MODULES: dict[str, dict[str, tuple[str, ...]]] = {
    "": {
        "activation": (
            "Celu", "Elu", "Gelu", "HardSigmoid", "HardSwish", "Hardmax", "LeakyRelu", "LogSoftmax",
            "LpNormalization", "Mish", "PRelu", "Relu", "Selu", "Shrink", "Sigmoid", "Softmax",
            "Softplus", "Softsign", "Tanh", "ThresholdedRelu"),
        "attention": (
            "Attention", "CausalConvWithState", "LinearAttention", "RMSNormalization",
            "RotaryEmbedding", "SwiGLU", "TensorScatter"),
        "contrib.transformer": ("LayerNormalization", "SimplifiedLayerNormalization"),
        "control_flow": (
            "ConcatFromSequence", "If", "Loop", "Optional", "OptionalGetElement",
            "OptionalHasElement", "Scan", "SequenceAt", "SequenceConstruct", "SequenceEmpty",
            "SequenceErase", "SequenceInsert", "SequenceLength", "SequenceMap", "SplitToSequence"),
        "conv": ("Conv", "ConvTranspose"),
        "elementwise": (
            "Abs", "Acos", "Acosh", "Add", "And", "Asin", "Asinh", "Atan", "Atanh", "BitShift",
            "BitwiseAnd", "BitwiseNot", "BitwiseOr", "BitwiseXor", "Cast", "CastLike", "Ceil",
            "Clip", "Cos", "Cosh", "Div", "Equal", "Erf", "Exp", "Floor", "Greater",
            "GreaterOrEqual", "IsInf", "IsNaN", "Less", "LessOrEqual", "Log", "Max", "Mean", "Min",
            "Mod", "Mul", "Neg", "Not", "Or", "Pow", "Reciprocal", "Round", "Sign", "Sin", "Sinh",
            "Sqrt", "Sub", "Sum", "Tan", "Where", "Xor"),
        "image": (
            "AffineGrid", "CenterCropPad", "Col2Im", "DeformConv", "GridSample", "ImageDecoder",
            "MaxRoiPool", "MaxUnpool", "NonMaxSuppression", "RoiAlign"),
        "linalg": ("Einsum", "Gemm", "MatMul"),
        "loss": ("NegativeLogLikelihoodLoss", "SoftmaxCrossEntropyLoss"),
        "math_extra": ("BitCast", "CumProd", "Det", "Swish"),
        "normalization": (
            "BatchNormalization", "Dropout", "GroupNormalization", "InstanceNormalization", "LRN",
            "LayerNormalization", "MeanVarianceNormalization"),
        "pool": (
            "AveragePool", "GlobalAveragePool", "GlobalLpPool", "GlobalMaxPool", "LpPool",
            "MaxPool"),
        "quantization": (
            "ConvInteger", "DequantizeLinear", "DynamicQuantizeLinear", "MatMulInteger",
            "QLinearConv", "QLinearMatMul", "QuantizeLinear"),
        "random": (
            "Bernoulli", "Multinomial", "RandomNormal", "RandomNormalLike", "RandomUniform",
            "RandomUniformLike"),
        "reduction": (
            "ArgMax", "ArgMin", "CumSum", "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp",
            "ReduceMax", "ReduceMean", "ReduceMin", "ReduceProd", "ReduceSum", "ReduceSumSquare",
            "TopK"),
        "resize": ("Resize", "Upsample"),
        "rnn": ("GRU", "LSTM", "RNN"),
        "signal": (
            "BlackmanWindow", "DFT", "HammingWindow", "HannWindow", "MelWeightMatrix", "STFT"),
        "tensor": (
            "Compress", "Concat", "Constant", "ConstantOfShape", "DepthToSpace", "Expand",
            "EyeLike", "Flatten", "Gather", "GatherElements", "GatherND", "Identity", "NonZero",
            "OneHot", "Pad", "Range", "Reshape", "ReverseSequence", "Scatter", "ScatterElements",
            "ScatterND", "Shape", "Size", "Slice", "SpaceToDepth", "Split", "Squeeze", "Tile",
            "Transpose", "Trilu", "Unique", "Unsqueeze"),
        "text": (
            "RegexFullMatch", "StringConcat", "StringNormalizer", "StringSplit", "TfIdfVectorizer"),
    },
    "ai.onnx.ml": {
        "ml.linear": ("LinearClassifier", "LinearRegressor"),
        "ml.preprocess": (
            "ArrayFeatureExtractor", "Binarizer", "CastMap", "CategoryMapper", "DictVectorizer",
            "FeatureVectorizer", "Imputer", "LabelEncoder", "Normalizer", "OneHotEncoder",
            "Scaler"),
        "ml.svm": ("SVMClassifier", "SVMRegressor"),
        "ml.tree": ("TreeEnsemble", "TreeEnsembleClassifier", "TreeEnsembleRegressor"),
        "ml.zipmap": ("ZipMap",),
    },
    "ai.onnx.preview": {
        "attention": ("FlexAttention",),
    },
    "ai.onnx.preview.training": {
        "gradient": ("Gradient",),
        "training": ("Adagrad", "Adam", "Momentum"),
    },
    "ai.onnxrun": {
        "contrib.fused": ("MatMulBiasGelu",),
        "normalization": ("FusedBatchNormalization",),
        "quantization": ("ConvIntegerToFloat", "QuantizeDequantize"),
    },
    "com.microsoft": {
        "contrib.fused": (
            "BiasAdd", "BiasGelu", "BiasSoftmax", "BiasSplitGelu", "FastGelu", "FusedGemm",
            "FusedMatMul", "Gelu", "QuickGelu", "SparseToDenseMatMul"),
        "contrib.fused_conv": ("FusedConv",),
        "contrib.quantization": (
            "DequantizeLinear", "DynamicQuantizeLSTM", "DynamicQuantizeMatMul",
            "GatherBlockQuantized",
            "MatMulBnb4", "MatMulIntegerToFloat", "MatMulNBits", "QGemm", "QLinearAdd",
            "QLinearAveragePool",
            "QLinearConcat", "QLinearGlobalAveragePool", "QLinearLeakyRelu", "QLinearMul",
            "QLinearSigmoid", "QLinearSoftmax", "QLinearWhere", "QuantizeLinear"),
        "contrib.transformer": (
            "Attention", "EmbedLayerNormalization", "GroupQueryAttention", "LayerNormalization",
            "MultiHeadAttention", "QAttention", "QEmbedLayerNormalization", "RotaryEmbedding",
            "SimplifiedLayerNormalization",
            "SkipLayerNormalization", "SkipSimplifiedLayerNormalization"),
        "pool": ("NhwcMaxPool",),
    },
}


def modules_by_operator() -> dict[tuple[str, str], tuple[str, ...]]:
    """(domain, op_type) -> absolute names of the modules registering its kernels."""
    index: dict[tuple[str, str], tuple[str, ...]] = {}
    for domain, modules in KERNEL_MODULES.items():
        for module, op_types in modules.items():
            for op_type in op_types:
                key = (domain, op_type)
                index[key] = (*index.get(key, ()), f"{__name__}.{module}")
    return index


def import_all() -> None:
    """Import every kernel module, sub-packages included."""
    import pkgutil

    for info in pkgutil.walk_packages(__path__, prefix=f"{__name__}."):
        importlib.import_module(info.name)
