"""The MatMulNBits models and sessions the 4-bit tests build (test_nbits_blocks, test_nbits_gemm,
test_nbits_gemv): random packed weights, the one-node model, onnxrun beside onnxruntime."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

import onnxrun


def packed_weight(rng, N: int, kb: int, block: int, name: str = "") -> list:
    """Initializers ``{name}B`` (N, kb, block / 2) random bytes and ``{name}S`` (N * kb) small
    positive scales, drawn in that order."""
    B = rng.integers(0, 256, (N, kb, block // 2), dtype=np.uint8)
    S = (rng.random(N * kb, dtype=np.float32) * 0.02 + 1e-3).astype(np.float32)
    return [numpy_helper.from_array(B, f"{name}B"), numpy_helper.from_array(S, f"{name}S")]


def model(nodes, inputs, outputs, inits) -> bytes:
    """A graph in opset 17 with com.microsoft 1, serialized."""
    g = helper.make_graph(nodes, "g", inputs, outputs, inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                               helper.make_opsetid("com.microsoft", 1)]
                             ).SerializeToString()


def matmul_nbits(K: int, N: int, rng, block: int = 32, level: int = 4, zp: bool = False,
                 bias: bool = False) -> bytes:
    """Y = MatMulNBits(A (M, K)) with a random 4-bit weight, zero points (packed two to a byte)
    and a bias where asked, drawn in that order."""
    kb = -(-K // block)
    inits = packed_weight(rng, N, kb, block)
    names = ["A", "B", "S", "", "", ""]
    if zp:
        inits.append(numpy_helper.from_array(
            rng.integers(0, 256, N * ((kb + 1) // 2), dtype=np.uint8), "Z"))
        names[3] = "Z"
    if bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(N).astype(np.float32), "b"))
        names[5] = "b"
    while not names[-1]:
        names.pop()
    node = helper.make_node("MatMulNBits", names, ["Y"], domain="com.microsoft", K=K, N=N,
                            block_size=block, bits=4, accuracy_level=level)
    return model([node], [helper.make_tensor_value_info("A", TP.FLOAT, ["M", K])],
                 [helper.make_tensor_value_info("Y", TP.FLOAT, ["M", N])], inits)


def sessions(data: bytes, threads: int = 1, ort_threads: int | None = None):
    """An onnxrun session and an onnxruntime CPU one (``ort_threads``, default ``threads``)."""
    import onnxruntime as ort

    so = onnxrun.SessionOptions()
    so.intra_op_num_threads = threads
    oso = ort.SessionOptions()
    oso.intra_op_num_threads = threads if ort_threads is None else ort_threads
    return (onnxrun.InferenceSession(data, so),
            ort.InferenceSession(data, oso, providers=["CPUExecutionProvider"]))
