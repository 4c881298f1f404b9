"""Layout-level passes (ORT_ENABLE_LAYOUT, level 3): rewrites for this host's kernels.

Where onnxruntime's layout level writes NCHWc operators for its CPU kernels, onnxrun's keeps
activations channels-last inside the convolution kernels (decided when the session prepares
them: ``providers/cpu/ops/conv.py``, shown in the report) and fuses here what those kernels
take in their epilogue. A model saved at this level is for onnxrun, as onnxruntime's is for
onnxruntime. ``PASSES`` as in ``basic``.
"""

PASSES: dict[str, tuple[str, int, tuple[str, ...]]] = {
    "batch_norm_relu": ("BatchNormReluFusion", 42, ("BatchNormalization Relu",)),
    "conv_quick_gelu": ("ConvQuickGeluFusion", 40, ("Conv com.microsoft:QuickGelu",)),
    "matmul_gelu": ("MatMulGeluFusion", 41, (
        "MatMul com.microsoft:BiasGelu", "MatMul com.microsoft:Gelu",
        "MatMul com.microsoft:FastGelu", "Gemm com.microsoft:Gelu",
        "Gemm Reshape com.microsoft:Gelu", "Gemm com.microsoft:FastGelu",
        "Gemm Reshape com.microsoft:FastGelu")),
}
