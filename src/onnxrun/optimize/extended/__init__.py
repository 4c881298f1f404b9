"""Extended-level passes (ORT_ENABLE_EXTENDED): operator fusions.

``PASSES``: module -> (pass name, order, needs), as in ``basic``.
"""

PASSES: dict[str, tuple[str, int, tuple[str, ...]]] = {
    "float16_compute_in_float32": ("Float16ComputeInFloat32", 0, ()),
    "shape_refinement": ("ShapeRefinement", 1, ()),
    "qdq_node_groups": ("QDQSelectorActionTransformer", 4, (
        "DequantizeLinear QuantizeLinear", "DequantizeLinear Gemm")),
    "quantize_dequantize": ("QuantizeDequantizeFusion", 5, ("DequantizeLinear QuantizeLinear",)),
    "gelu": ("GeluFusion", 10, ("Add Div Erf Mul", "Add Erf Mul")),
    "fast_gelu": ("FastGeluFusion", 11, ("Add Mul Pow Tanh", "Add Mul Tanh")),
    "matmul_integer_to_float": ("MatMulIntegerToFloatFusion", 12, (
        "Cast MatMulInteger Mul", "Add com.microsoft:MatMulIntegerToFloat")),
    "conv_integer_to_float": ("ConvIntegerToFloatFusion", 12, (
        "Cast ConvInteger Mul", "Add ai.onnxrun:ConvIntegerToFloat",
        "Clip ai.onnxrun:ConvIntegerToFloat", "Relu ai.onnxrun:ConvIntegerToFloat")),
    "quick_gelu": ("QuickGeluFusion", 12, ("Mul Sigmoid",)),
    "dynamic_quantize_matmul": ("DynamicQuantizeMatMulFusion", 13, (
        "DynamicQuantizeLinear com.microsoft:MatMulIntegerToFloat",)),
    "layer_norm": ("LayerNormFusion", 15, (
        "Add Div Mul Pow ReduceMean Sqrt Sub", "Add Div Mul ReduceMean Sqrt Sub",
        "Add Mul Pow Reciprocal ReduceMean Sqrt Sub", "Add Mul Reciprocal ReduceMean Sqrt Sub")),
    "simplified_layer_norm": ("SimplifiedLayerNormFusion", 16, (
        "Add Div Mul Pow ReduceMean Sqrt", "Add Div Mul ReduceMean Sqrt",
        "Add Mul Pow Reciprocal ReduceMean Sqrt", "Add Mul Reciprocal ReduceMean Sqrt")),
    "attention": ("AttentionFusion", 20, ("MatMul Softmax",)),
    "matmul_add_rows": ("MatMulAddReshapeFusion", 25, ("Add MatMul",)),
    "bias_gelu": ("BiasGeluFusion", 30, ("Add com.microsoft:FastGelu", "Add com.microsoft:Gelu",
                                         "Add Gelu")),
    "skip_layer_norm": ("SkipLayerNormFusion", 35, (
        "Add LayerNormalization", "Add SimplifiedLayerNormalization", "Add RMSNormalization")),
    "conv_add_activation": ("ConvAddActivationFusion", 39, (
        "Add Conv", "Add Conv Relu", "Conv Sum", "Conv Relu Sum")),
    "conv_activation": ("ConvActivationFusion", 40, (
        "Clip Conv", "Conv HardSigmoid", "Conv LeakyRelu", "Conv Relu", "Conv Sigmoid",
        "Conv Tanh")),
    "gemm_activation": ("GemmActivationFusion", 41, (
        "Elu Gemm", "Gemm HardSigmoid", "Gemm LeakyRelu", "Gemm Relu", "Gemm Selu",
        "Gemm Sigmoid", "Gemm Softplus", "Gemm Softsign", "Gemm Tanh", "Gemm ThresholdedRelu")),
    "gather_to_slice": ("GatherToSliceFusion", 50, ("Gather Range",)),
    "matmul_transpose": ("MatmulTransposeFusion", 60, (
        "MatMul Transpose", "Transpose com.microsoft:FusedMatMul")),
    "matmul_scale": ("MatMulScaleFusion", 61, (
        "Div MatMul", "Div com.microsoft:FusedMatMul", "MatMul Mul",
        "Mul com.microsoft:FusedMatMul")),
}
