"""What a process's first session imports: only the modules its model needs (every module
imported while a session is created is part of its creation time, which onnxruntime pays
before its clock starts, in its own import). Each check runs in a fresh interpreter."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap

_PKG = "onnxrun.providers"


def _imported_by_session(model_text: str) -> set[str]:
    """The onnxrun modules a fresh process imports to create a session of ``model_text``."""
    code = textwrap.dedent(f"""
        import json, sys
        import onnx
        import onnxrun
        model = onnx.parser.parse_model({model_text!r})
        before = set(sys.modules)
        onnxrun.InferenceSession(model.SerializeToString(),
                                 providers=["CPUExecutionProvider"])
        print(json.dumps(sorted(n for n in set(sys.modules) - before
                                if n.startswith("onnxrun."))))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    return set(json.loads(out.stdout.splitlines()[-1]))


_LSTM = """
    <ir_version: 8, opset_import: ["": 17]>
    g (float[5, 1, 4] x) => (float[5, 1, 1, 8] y) {
        w = Constant <value = float[1, 32, 4] {""" + ", ".join(["0.1"] * 128) + """}> ()
        r = Constant <value = float[1, 32, 8] {""" + ", ".join(["0.05"] * 256) + """}> ()
        y = LSTM <hidden_size = 8> (x, w, r)
    }
"""

_MATMUL_LAYERNORM = """
    <ir_version: 8, opset_import: ["": 17]>
    g (float[8, 4] x) => (float[8, 4] y) {
        w = Constant <value = float[4, 4] {""" + ", ".join(["0.5"] * 16) + """}> ()
        b = Constant <value = float[4] {0.1, 0.2, 0.3, 0.4}> ()
        s = Constant <value = float[4] {1.0, 1.0, 1.0, 1.0}> ()
        m = MatMul (x, w)
        a = Add (m, b)
        r = Relu (a)
        y = LayerNormalization <axis = -1> (r, s, b)
    }
"""

_CONV_RELU = """
    <ir_version: 8, opset_import: ["": 17]>
    g (float[1, 2, 5, 5] x) => (float[1, 3, 5, 5] y) {
        w = Constant <value = float[3, 2, 1, 1] {0.1, 0.2, 0.3, 0.4, 0.5, 0.6}> ()
        c = Conv (x, w)
        y = Relu (c)
    }
"""


def test_a_float_lstm_imports_no_int8_module():
    got = _imported_by_session(_LSTM)
    assert f"{_PKG}.cpu.ops.rnn" in got
    assert not got & {f"{_PKG}.cpu.compiled.int8_gemm", f"{_PKG}.cpu.compiled.quantize"}


def test_lstm_restates_the_int8_gemms_constants():
    """compiled/lstm.py restates int8_gemm's panel width and requirements (so that a float
    LSTM does not import it): they must agree, as the u8 mode reads int8_gemm's panels."""
    from onnxrun.providers.cpu.compiled import int8_gemm, lstm

    assert lstm.NR == int8_gemm.NR
    assert lstm.INT8_REQUIRES == int8_gemm.REQUIRES


def test_products_without_convolutions_import_no_convolution_module():
    """MatMul + Add + Relu (fused into FusedGemm) and LayerNormalization: neither conv.py nor
    pool.py (FusedConv, NhwcMaxPool and the compute dtype live elsewhere now)."""
    got = _imported_by_session(_MATMUL_LAYERNORM)
    assert f"{_PKG}.cpu.ops.contrib.fused" in got and f"{_PKG}.cpu.ops.normalization" in got
    assert not got & {f"{_PKG}.cpu.ops.conv", f"{_PKG}.cpu.ops.pool",
                      f"{_PKG}.cpu.ops.contrib.fused_conv"}


def test_a_cpu_session_imports_neither_the_cuda_device_nor_the_wasm_kernel():
    got = _imported_by_session(_CONV_RELU)
    assert f"{_PKG}.cpu.ops.contrib.fused_conv" in got  # Conv + Relu: FusedConv
    assert f"{_PKG}.cpu.ops.pool" not in got
    assert f"{_PKG}.cpu.wasm_gemm" not in got
    if importlib.util.find_spec("cupy") is None:  # (with CuPy, device.py asks it for GPUs)
        assert f"{_PKG}.cuda.device" not in got


_LATER_ONNX = """
    import json, sys
    import numpy as np
    import onnxrun
    from onnxrun.proto import onnx as messages
    imported = {"after import": "onnx" in sys.modules}
    sess = onnxrun.InferenceSession(sys.argv[1], providers=["CPUExecutionProvider"])
    out = sess.run(None, {"x": np.ones((1, 2, 5, 5), np.float32)})[0]
    imported["after a session"] = "onnx" in sys.modules
    import onnx
    from onnx import helper
    same = onnx.ModelProto is messages.ModelProto and onnx.TensorProto is messages.TensorProto
    # a ModelProto onnx builds goes straight in, as a model file did
    built = onnx.load(sys.argv[1])
    again = onnxrun.InferenceSession(built, providers=["CPUExecutionProvider"])
    same_out = bool((again.run(None, {"x": np.ones((1, 2, 5, 5), np.float32)})[0] == out).all())
    t = helper.make_tensor("t", onnx.TensorProto.FLOAT, [1], [1.0])
    print(json.dumps({"imported": imported, "same": same, "same_out": same_out,
                      "helper": isinstance(t, messages.TensorProto)}))
"""


def test_a_session_of_a_validated_model_file_imports_no_onnx(tmp_path):
    """``import onnxrun`` and a session of a model file validated before (the validation
    cache) never import the onnx package (~100 ms): its messages come from onnx's generated
    module alone, and are the same classes a later ``import onnx`` gives."""
    import onnx

    path = tmp_path / "conv.onnx"
    onnx.save(onnx.parser.parse_model(_CONV_RELU), str(path))
    env = {**os.environ, "ONNXRUN_KERNEL_CACHE": str(tmp_path / "cache")}
    env.pop("ONNXRUN_NO_ONNX", None)
    results = []
    for _ in range(2):  # the first process validates and fills the cache, the second reads it
        out = subprocess.run([sys.executable, "-c", textwrap.dedent(_LATER_ONNX), str(path)],
                             capture_output=True, text=True, check=True, env=env)
        results.append(json.loads(out.stdout.splitlines()[-1]))
    assert results[0]["imported"] == {"after import": False, "after a session": True}
    assert results[1]["imported"] == {"after import": False, "after a session": False}
    for r in results:
        assert r["same"] and r["same_out"] and r["helper"]
