"""Models for the browser benchmark, built with onnx.helper (random weights, seeded): no torch.

    python tests/pyodide/make_bench_models.py OUT_DIR

- mobilenet_v2.onnx: MobileNetV2 (width 1.0, 224x224, 1000 classes; Conv + BatchNorm folded
  into the convolutions' weights, Clip(0, 6), inverted residual blocks, global pool, Gemm).
- bert_minilm.onnx: a BERT encoder of MiniLM-L6's shape (6 layers, hidden 384, 12 heads,
  intermediate 1536, vocabulary 30522), inputs input_ids / attention_mask / token_type_ids
  (1 x 128), written as the exporters write it (MatMul, Add, Softmax, LayerNormalization, Erf
  GELU, Gather embeddings).
"""

from __future__ import annotations

import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

RNG = np.random.default_rng(0)


class Builder:
    def __init__(self) -> None:
        self.nodes, self.inits, self.n = [], [], 0

    def name(self, prefix: str) -> str:
        self.n += 1
        return f"{prefix}_{self.n}"

    def const(self, arr: np.ndarray, prefix: str = "w") -> str:
        name = self.name(prefix)
        self.inits.append(numpy_helper.from_array(np.asarray(arr), name))
        return name

    def op(self, op_type: str, inputs: list[str], **attrs) -> str:
        out = self.name(op_type.lower())
        self.nodes.append(helper.make_node(op_type, inputs, [out], **attrs))
        return out

    def model(self, inputs, outputs, opset: int = 17) -> onnx.ModelProto:
        g = helper.make_graph(self.nodes, "g", inputs, outputs, self.inits)
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
        m.ir_version = 8
        return m


def _w(*shape: int, fan_in: int) -> np.ndarray:
    return (RNG.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32)


def mobilenet_v2() -> onnx.ModelProto:
    b = Builder()

    def conv(x, cin, cout, k, stride=1, group=1, act=True):
        w = b.const(_w(cout, cin // group, k, k, fan_in=cin // group * k * k))
        bias = b.const((RNG.standard_normal(cout) * 0.01).astype(np.float32), "b")
        y = b.op("Conv", [x, w, bias], kernel_shape=[k, k], strides=[stride, stride],
                 pads=[k // 2] * 4, group=group)
        if act:
            y = b.op("Clip", [y, b.const(np.float32(0), "lo"), b.const(np.float32(6), "hi")])
        return y

    x = conv("input", 3, 32, 3, 2)
    cin = 32
    for t, c, n, s in [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
                       (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)]:
        for i in range(n):
            stride = s if i == 0 else 1
            hidden = cin * t
            y = conv(x, cin, hidden, 1) if t != 1 else x
            y = conv(y, hidden, hidden, 3, stride, group=hidden)
            y = conv(y, hidden, c, 1, act=False)
            x = b.op("Add", [x, y]) if stride == 1 and cin == c else y
            cin = c
    x = conv(x, cin, 1280, 1)
    x = b.op("GlobalAveragePool", [x])
    x = b.op("Flatten", [x])
    fc = b.const(_w(1000, 1280, fan_in=1280))
    b.op("Gemm", [x, fc, b.const(np.zeros(1000, np.float32), "b")], transB=1)
    b.nodes[-1].output[0] = "logits"
    return b.model([helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, 224, 224])],
                   [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 1000])])


def bert_minilm(layers: int = 6, hidden: int = 384, heads: int = 12, inter: int = 1536,
                vocab: int = 30522, seq: int = 128) -> onnx.ModelProto:
    b = Builder()
    dh = hidden // heads

    def dense(x, n_in, n_out):
        return b.op("Add", [b.op("MatMul", [x, b.const(_w(n_in, n_out, fan_in=n_in))]),
                            b.const((RNG.standard_normal(n_out) * 0.01).astype(np.float32))])

    def layer_norm(x):
        return b.op("LayerNormalization", [x, b.const(np.ones(hidden, np.float32), "g"),
                                           b.const(np.zeros(hidden, np.float32), "b")],
                    axis=-1, epsilon=1e-12)

    emb = b.op("Gather", [b.const(_w(vocab, hidden, fan_in=hidden) * 0.1, "wte"), "input_ids"])
    pos = b.const((_w(1, seq, hidden, fan_in=hidden) * 0.1), "wpe")
    typ = b.op("Gather", [b.const(_w(2, hidden, fan_in=hidden) * 0.1, "wtt"), "token_type_ids"])
    x = layer_norm(b.op("Add", [b.op("Add", [emb, pos]), typ]))
    # attention mask (1, seq) -> additive (1, 1, 1, seq)
    m = b.op("Cast", [b.op("Unsqueeze", ["attention_mask", b.const(np.array([1, 2]), "ax")])],
             to=TensorProto.FLOAT)
    m = b.op("Mul", [b.op("Sub", [b.const(np.float32(1), "one"), m]),
                     b.const(np.float32(-10000.0), "neg")])
    split = b.const(np.array([1, seq, heads, dh]), "shape")
    merge = b.const(np.array([1, seq, hidden]), "shape")
    for _ in range(layers):
        def heads_of(t):
            return b.op("Transpose", [b.op("Reshape", [t, split])], perm=[0, 2, 1, 3])
        q, k, v = (heads_of(dense(x, hidden, hidden)) for _ in range(3))
        s = b.op("MatMul", [q, b.op("Transpose", [k], perm=[0, 1, 3, 2])])
        s = b.op("Add", [b.op("Div", [s, b.const(np.float32(np.sqrt(dh)), "scale")]), m])
        ctx = b.op("MatMul", [b.op("Softmax", [s], axis=-1), v])
        ctx = b.op("Reshape", [b.op("Transpose", [ctx], perm=[0, 2, 1, 3]), merge])
        x = layer_norm(b.op("Add", [x, dense(ctx, hidden, hidden)]))
        h = dense(x, hidden, inter)
        gelu = b.op("Mul", [b.op("Mul", [h, b.const(np.float32(0.5), "half")]),
                            b.op("Add", [b.op("Erf", [b.op("Div", [
                                h, b.const(np.float32(np.sqrt(2.0)), "sqrt2")])]),
                                b.const(np.float32(1), "one")])])
        x = layer_norm(b.op("Add", [x, dense(gelu, inter, hidden)]))
    b.nodes[-1].output[0] = "last_hidden_state"
    ints = [helper.make_tensor_value_info(n, TensorProto.INT64, [1, seq])
            for n in ("input_ids", "attention_mask", "token_type_ids")]
    return b.model(ints, [helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT,
                                                        [1, seq, hidden])])


def main(out: str) -> int:
    os.makedirs(out, exist_ok=True)
    for name, build in (("mobilenet_v2", mobilenet_v2), ("bert_minilm", bert_minilm)):
        m = build()
        onnx.checker.check_model(m)
        onnx.save(m, os.path.join(out, f"{name}.onnx"))
        print(f"{name}.onnx: {os.path.getsize(os.path.join(out, name + '.onnx')) >> 20} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
