"""Basic-level passes (ORT_ENABLE_BASIC): constant folding and redundant-node eliminations.

``PASSES`` lists them without importing them: module -> (pass name, order, needs). ``needs``
says which operators the pass can act on: it can change a graph only if, for one of the groups
(space-separated operator types, ``domain:Op`` outside ai.onnx), every operator occurs in it;
empty, it may change any graph. A module is imported when its pass first has something to look
at. tests/optimize/test_pass_index.py checks the table against the modules.
"""

PASSES: dict[str, tuple[str, int, tuple[str, ...]]] = {
    "constant_folding": ("ConstantFolding", 10, ()),
    "constant_sharing": ("ConstantSharing", 12, ()),
    "common_subexpression": ("CommonSubexpressionElimination", 14, ()),
    "eliminate_identity": ("RedundantNodeElimination", 20, (
        "Identity", "Dropout", "Add", "Sub", "Mul", "Div", "Cast", "Reshape", "Expand",
        "Squeeze", "Unsqueeze", "Flatten", "Transpose", "Pad", "Slice")),
    "div_to_mul": ("DivToMul", 25, ("Div",)),
    "fold_mul_chains": ("MulChainFolding", 26, ("Mul", "Div")),
    "fold_add_chains": ("AddChainFolding", 27, ("Add", "Sub")),
    "fuse_conv_bn": ("ConvBNFusion", 30, (
        "BatchNormalization Conv", "BatchNormalization ConvTranspose",
        "BatchNormalization Gemm", "BatchNormalization Flatten MatMul",
        "BatchNormalization MatMul")),
    "fuse_conv_mul": ("ConvMulFusion", 31, ("Conv Mul",)),
    "fuse_conv_add": ("ConvAddFusion", 32, ("Add Conv", "Add ConvTranspose")),
    "fuse_bn_mul_add": ("BatchNormMulAddFusion", 33, (
        "BatchNormalization Mul", "BatchNormalization Add")),
    "fuse_pad": ("PadFusion", 34, ("Conv Pad", "AveragePool Pad")),
    "fuse_matmul_add": ("MatMulAddFusion", 40, ("Add MatMul",)),
    "fuse_gemm_transpose": ("GemmTransposeFusion", 42, ("Gemm Transpose",)),
    "fuse_reshape_shape": ("ReshapeFusion", 43, ("Concat Reshape",)),
    "fuse_transposes": ("TransposeChainFusion", 44, ("Transpose",)),
    "fuse_reshapes": ("ReshapeChainFusion", 45, ("Reshape",)),
    "eliminate_squeeze_unsqueeze": ("SqueezeUnsqueezeElimination", 46, ("Squeeze Unsqueeze",)),
    "fuse_not_where": ("NotWhereFusion", 47, ("Not Where",)),
    "eliminate_dead": ("DeadCodeElimination", 90, ()),
}
