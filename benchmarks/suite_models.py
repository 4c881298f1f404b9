"""The benchmark suite's model classes of issue #18, built with onnx.helper from public
architectures (random weights, no download, no torch): each ``build_*`` returns the model and
its feeds, at the suite's size or, with ``small=True``, at a size the tests run in a second.

- ``yolo``: a YOLOv8n-style detector (Jocher et al., Ultralytics 2023): Conv+SiLU blocks, C2f
  blocks (Split, bottlenecks, Concat), SPPF (three MaxPools, Concat), a PAN neck (Resize x2,
  Concat) and three detection heads, 1 x 3 x 320 x 320.
- ``dbnet``: a DBNet-style text detector (Liao et al. 2020) on a light backbone, as PP-OCR's
  detector: FPN (1x1 convs, Resize, Add), the four scales upsampled and concatenated, the
  probability head ending in two ConvTranspose 2x2/2 and a Sigmoid, 1 x 3 x 640 x 640.
- ``crnn``: a CRNN recognizer (Shi et al. 2015): VGG-style convs and MaxPools (BatchNormalization
  on the deep layers), a 2-layer bidirectional LSTM, a per-step classifier over 6625 symbols,
  1 x 3 x 32 x 320.
- ``svtr``: an SVTR-tiny-style recognizer (Du et al. 2022): conv patch embedding, local-mixing
  (windowed, as an additive mask) and global-mixing transformer blocks (LayerNormalization,
  attention, GELU MLP), conv merging between stages, 1 x 3 x 32 x 128.
- ``vad``: a Silero-VAD-style streaming model (~30 nodes) called once per 512-sample chunk: an If
  on the sample rate picks the STFT-as-Conv branch, four Conv1d+Relu encoders, one LSTM step
  carrying its state across calls, a Sigmoid probability.
- ``densenet``: DenseNet-121-style dense blocks (Huang et al. 2017): BN-Relu-Conv1x1-BN-Relu-
  Conv3x3 layers each concatenating 32 channels, transitions with AveragePool, 1 x 3 x 224 x 224.
- ``inception``: GoogLeNet-style Inception modules (Szegedy et al. 2015): four branches (1x1,
  1x1-3x3, 1x1-5x5, MaxPool-1x1) concatenated, 3a/3b/4a/4b/4c at 28x28 and 14x14,
  1 x 3 x 224 x 224.

``python benchmarks/suite_models.py [--out DIR] [NAME ...]`` writes them to the benchmark cache
(``NAME/model.onnx`` and one ``NAME/<input>.npy`` per input), as ``run_suite.py`` does itself
when they are missing.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
FLOAT = TensorProto.FLOAT


class Graph:
    """A graph under construction: each method adds nodes (and random initializers) and returns
    the name of its output. Weights are He-scaled so activations stay of order one."""

    def __init__(self, seed: int, prefix: str = "") -> None:
        self.rng = np.random.default_rng(seed)
        self.prefix = prefix  # a subgraph's names must not shadow its parent's
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.count = 0

    def name(self, kind: str) -> str:
        self.count += 1
        return f"{self.prefix}{kind}_{self.count}"

    def const(self, value: np.ndarray, kind: str = "c") -> str:
        name = self.name(kind)
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def weight(self, shape: tuple[int, ...], fan_in: int, gain: float = 1.0) -> str:
        std = gain * math.sqrt(2.0 / max(fan_in, 1))
        return self.const(self.rng.normal(0, std, shape).astype(np.float32), "w")

    def bias(self, n: int) -> str:
        return self.const(self.rng.normal(0, 0.05, n).astype(np.float32), "b")

    def op(self, op_type: str, inputs: list[str], n_out: int = 1, **attrs) -> str | list[str]:
        outs = [self.name(op_type.lower()) for _ in range(n_out)]
        self.nodes.append(helper.make_node(op_type, inputs, outs, name=self.name(op_type),
                                           **attrs))
        return outs[0] if n_out == 1 else outs

    # -- layers ----------------------------------------------------------------------------------

    def conv(self, x: str, cin: int, cout: int, k: int | tuple[int, int] = 1, s: int = 1,
             p: int | None = None, group: int = 1, act: str | None = None, bias: bool = True,
             dims: int = 2, gain: float = 1.0) -> str:
        ks = (k,) * dims if isinstance(k, int) else tuple(k)
        pads = [kk // 2 for kk in ks] if p is None else [p] * dims
        w = self.weight((cout, cin // group, *ks), cin // group * math.prod(ks), gain)
        inputs = [x, w] + ([self.bias(cout)] if bias else [])
        y = self.op("Conv", inputs, kernel_shape=list(ks), strides=[s] * dims, pads=pads * 2,
                    group=group)
        return self.act(y, act)

    def act(self, x: str, act: str | None) -> str:
        if act is None:
            return x
        if act == "silu":  # as torch exports it
            return self.op("Mul", [x, self.op("Sigmoid", [x])])
        if act == "gelu":  # as torch exports nn.GELU(): x * 0.5 * (1 + erf(x / sqrt 2))
            e = self.op("Erf", [self.op("Div", [x, self.const(np.float32(math.sqrt(2)))])])
            e = self.op("Add", [e, self.const(np.float32(1))])
            return self.op("Mul", [self.op("Mul", [x, e]), self.const(np.float32(0.5))])
        return self.op({"relu": "Relu", "hardswish": "HardSwish", "sigmoid": "Sigmoid"}[act],
                       [x])

    def batchnorm(self, x: str, c: int) -> str:
        scale = self.const(self.rng.uniform(0.8, 1.2, c).astype(np.float32), "bn_scale")
        shift = self.const(self.rng.normal(0, 0.05, c).astype(np.float32), "bn_bias")
        mean = self.const(self.rng.normal(0, 0.05, c).astype(np.float32), "bn_mean")
        var = self.const(self.rng.uniform(0.8, 1.2, c).astype(np.float32), "bn_var")
        return self.op("BatchNormalization", [x, scale, shift, mean, var], epsilon=1e-5)

    def maxpool(self, x: str, k: int | tuple[int, int], s: int | tuple[int, int],
                p: int = 0) -> str:
        ks = [k, k] if isinstance(k, int) else list(k)
        ss = [s, s] if isinstance(s, int) else list(s)
        return self.op("MaxPool", [x], kernel_shape=ks, strides=ss, pads=[p] * 4)

    def linear(self, x: str, cin: int, cout: int, bias: bool = True) -> str:
        y = self.op("MatMul", [x, self.weight((cin, cout), cin, 0.7)])
        return self.op("Add", [y, self.bias(cout)]) if bias else y

    def layernorm(self, x: str, c: int) -> str:
        scale = self.const(self.rng.uniform(0.8, 1.2, c).astype(np.float32), "ln_scale")
        return self.op("LayerNormalization", [x, scale, self.bias(c)], axis=-1, epsilon=1e-5)

    def upsample2(self, x: str) -> str:
        scales = self.const(np.array([1, 1, 2, 2], np.float32), "scales")
        return self.op("Resize", [x, "", scales], mode="nearest")

    def global_pool_fc(self, x: str, c: int, classes: int) -> str:
        y = self.op("GlobalAveragePool", [x])
        y = self.op("Flatten", [y], axis=1)
        return self.op("Gemm", [y, self.weight((classes, c), c), self.bias(classes)], transB=1)

    def model(self, name: str, inputs: list[onnx.ValueInfoProto],
              outputs: list[tuple[str, str]], doc: str) -> onnx.ModelProto:
        """The model; ``outputs`` pairs an output name with the value it renames (an Identity
        would be a node the engines could skip; the last node's output is renamed instead)."""
        rename = dict((v, n) for n, v in outputs)
        for node in self.nodes:
            node.output[:] = [rename.get(o, o) for o in node.output]
            node.input[:] = [rename.get(i, i) for i in node.input]
        outs = [helper.make_tensor_value_info(n, FLOAT, None) for n, _ in outputs]
        graph = helper.make_graph(self.nodes, name, inputs, outs, self.inits)
        m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              ir_version=8, producer_name="onnxrun benchmarks/suite_models.py")
        m.doc_string = doc
        return onnx.shape_inference.infer_shapes(m, strict_mode=True)


Feeds = dict[str, np.ndarray]


def _image(shape: tuple[int, ...], seed: int) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-1, 1, shape).astype(np.float32)


def _input(name: str, shape: list) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, FLOAT, shape)


# ------------------------------------------------------------------------------------------------
# YOLOv8n-style detector


def build_yolo(small: bool = False) -> tuple[onnx.ModelProto, Feeds]:
    g = Graph(1801)
    size = 64 if small else 320
    w = [16, 32, 64, 128, 256]

    def conv(x, cin, cout, k=1, s=1):
        return g.conv(x, cin, cout, k, s, act="silu")

    def c2f(x, cin, cout, n, shortcut):
        half = cout // 2
        y = conv(x, cin, cout)
        split = g.const(np.array([half, half], np.int64), "split")
        a, b = g.op("Split", [y, split], n_out=2, axis=1)
        parts, cur = [a, b], b
        for _ in range(n):
            z = conv(conv(cur, half, half, 3), half, half, 3)
            cur = g.op("Add", [cur, z]) if shortcut else z
            parts.append(cur)
        return conv(g.op("Concat", parts, axis=1), half * (2 + n), cout)

    x = conv("images", 3, w[0], 3, 2)
    x = conv(x, w[0], w[1], 3, 2)
    x = c2f(x, w[1], w[1], 1, True)
    x = conv(x, w[1], w[2], 3, 2)
    p3 = c2f(x, w[2], w[2], 2, True)
    x = conv(p3, w[2], w[3], 3, 2)
    p4 = c2f(x, w[3], w[3], 2, True)
    x = conv(p4, w[3], w[4], 3, 2)
    x = c2f(x, w[4], w[4], 1, True)
    # SPPF
    y = conv(x, w[4], w[4] // 2)
    pools = [y]
    for _ in range(3):
        pools.append(g.maxpool(pools[-1], 5, 1, 2))
    p5 = conv(g.op("Concat", pools, axis=1), w[4] * 2, w[4])
    # PAN neck
    n4 = c2f(g.op("Concat", [g.upsample2(p5), p4], axis=1), w[4] + w[3], w[3], 1, False)
    n3 = c2f(g.op("Concat", [g.upsample2(n4), p3], axis=1), w[3] + w[2], w[2], 1, False)
    d4 = c2f(g.op("Concat", [conv(n3, w[2], w[2], 3, 2), n4], axis=1), w[2] + w[3], w[3], 1,
             False)
    d5 = c2f(g.op("Concat", [conv(d4, w[3], w[3], 3, 2), p5], axis=1), w[3] + w[4], w[4], 1,
             False)
    # heads: box (4 x 16 bins) and class (80) branches per scale, flattened and concatenated
    heads = []
    for feat, c in ((n3, w[2]), (d4, w[3]), (d5, w[4])):
        box = g.conv(conv(conv(feat, c, 64, 3), 64, 64, 3), 64, 64)
        cls = g.conv(conv(conv(feat, c, 80, 3), 80, 80, 3), 80, 80)
        y = g.op("Concat", [box, cls], axis=1)
        heads.append(g.op("Reshape", [y, g.const(np.array([1, 144, -1], np.int64), "shape")]))
    out = g.op("Concat", heads, axis=2)
    box, cls = g.op("Split", [out, g.const(np.array([64, 80], np.int64), "split")], n_out=2,
                    axis=1)
    scores = g.op("Sigmoid", [cls])
    model = g.model("yolo_style", [_input("images", [1, 3, size, size])],
                    [("boxes", box), ("scores", scores)], "YOLOv8n-style detector")
    return model, {"images": _image((1, 3, size, size), 1)}


# ------------------------------------------------------------------------------------------------
# DBNet-style text detector


def build_dbnet(small: bool = False) -> tuple[onnx.ModelProto, Feeds]:
    g = Graph(1802)
    size = 64 if small else 640
    # light backbone (MobileNetV3-small-like widths, plain convs): strides 4, 8, 16, 32
    x = g.conv("image", 3, 16, 3, 2, act="hardswish")
    feats, cin = [], 16
    for cout, n in ((24, 2), (40, 2), (96, 3), (192, 2)):
        x = g.conv(x, cin, cout, 3, 2, act="relu")
        for _ in range(n - 1):
            x = g.conv(g.conv(x, cout, cout, 1, act="relu"), cout, cout, 3, group=cout,
                       act="relu")
        feats.append(x)
        cin = cout
    # FPN: lateral 1x1 convs to 96, top-down Resize + Add, 3x3 convs to 24, all scales to 1/4
    lat = [g.conv(f, c, 96, 1, bias=False) for f, c in zip(feats, (24, 40, 96, 192), strict=True)]
    top = [lat[3]]
    for i in (2, 1, 0):
        top.insert(0, g.op("Add", [lat[i], g.upsample2(top[0])]))
    outs = []
    for i, t in enumerate(top):
        y = g.conv(t, 96, 24, 3, bias=False)
        for _ in range(i):
            y = g.upsample2(y)
        outs.append(y)
    fuse = g.op("Concat", outs[::-1], axis=1)
    # probability head: conv 3x3 + BN + Relu, two ConvTranspose 2x2/2, Sigmoid
    y = g.op("Relu", [g.batchnorm(g.conv(fuse, 96, 24, 3, bias=False), 24)])
    w1 = g.weight((24, 24, 2, 2), 24 * 4)
    y = g.op("Relu", [g.batchnorm(g.op("ConvTranspose", [y, w1, g.bias(24)], kernel_shape=[2, 2],
                                       strides=[2, 2]), 24)])
    w2 = g.weight((24, 1, 2, 2), 24 * 4)
    y = g.op("ConvTranspose", [y, w2, g.bias(1)], kernel_shape=[2, 2], strides=[2, 2])
    prob = g.op("Sigmoid", [y])
    model = g.model("dbnet_style", [_input("image", [1, 3, size, size])], [("maps", prob)],
                    "DBNet-style text detector")
    return model, {"image": _image((1, 3, size, size), 2)}


# ------------------------------------------------------------------------------------------------
# recognizers


def _lstm(g: Graph, x: str, cin: int, hidden: int) -> str:
    """A bidirectional LSTM over x [T, 1, cin]: [T, 1, 2 * hidden]."""
    wt = g.weight((2, 4 * hidden, cin), cin, 0.5)
    r = g.weight((2, 4 * hidden, hidden), hidden, 0.5)
    b = g.const(g.rng.normal(0, 0.05, (2, 8 * hidden)).astype(np.float32), "b")
    y = g.op("LSTM", [x, wt, r, b], n_out=1, hidden_size=hidden, direction="bidirectional")
    y = g.op("Transpose", [y], perm=[0, 2, 1, 3])  # [T, 2, 1, H] -> [T, 1, 2, H]
    return g.op("Reshape", [y, g.const(np.array([0, 0, -1], np.int64), "shape")])


def build_crnn(small: bool = False) -> tuple[onnx.ModelProto, Feeds]:
    g = Graph(1803)
    width = 64 if small else 320
    classes = 97 if small else 6625
    x, cin = "image", 3
    plan = [(64, False, (2, 2)), (128, False, (2, 2)), (256, True, None), (256, False, (2, 1)),
            (512, True, None), (512, False, (2, 1))]
    for cout, bn, pool in plan:
        x = g.conv(x, cin, cout, 3, bias=not bn)
        x = g.op("Relu", [g.batchnorm(x, cout) if bn else x])
        if pool is not None:
            x = g.maxpool(x, pool, pool)
        cin = cout
    # 2 x W/4 -> 1 x (W/4 - 1) by a 2x2 valid conv, then [T, 1, 512]
    x = g.op("Relu", [g.batchnorm(g.conv(x, 512, 512, 2, p=0, bias=False), 512)])
    x = g.op("Squeeze", [x, g.const(np.array([2], np.int64), "axes")])
    x = g.op("Transpose", [x], perm=[2, 0, 1])
    x = _lstm(g, _lstm(g, x, 512, 256), 512, 256)
    y = g.op("Softmax", [g.linear(x, 512, classes)], axis=-1)
    model = g.model("crnn_style", [_input("image", [1, 3, 32, width])], [("probs", y)],
                    "CRNN-style text recognizer")
    return model, {"image": _image((1, 3, 32, width), 3)}


def _window_mask(h: int, w: int, kh: int, kw: int) -> np.ndarray:
    """SVTR's local mixing: token (i, j) attends to tokens within a kh x kw window."""
    ii, jj = np.divmod(np.arange(h * w), w)
    near = (np.abs(ii[:, None] - ii[None, :]) <= kh // 2) & \
        (np.abs(jj[:, None] - jj[None, :]) <= kw // 2)
    return np.where(near, 0.0, -1e4).astype(np.float32)


def _attention(g: Graph, x: str, dim: int, heads: int, mask: str | None) -> str:
    """Multi-head self-attention over x [1, N, dim] as torch exports it."""
    hd = dim // heads
    qkv = g.linear(x, dim, 3 * dim)
    qkv = g.op("Reshape", [qkv, g.const(np.array([0, -1, 3, heads, hd], np.int64), "shape")])
    qkv = g.op("Transpose", [qkv], perm=[2, 0, 3, 1, 4])  # [3, 1, heads, N, hd]
    q, k, v = g.op("Split", [qkv, g.const(np.array([1, 1, 1], np.int64), "split")], n_out=3,
                   axis=0)
    sq = g.const(np.array([0], np.int64), "axes")
    q, k, v = (g.op("Squeeze", [t, sq]) for t in (q, k, v))
    q = g.op("Mul", [q, g.const(np.float32(hd ** -0.5))])
    att = g.op("MatMul", [q, g.op("Transpose", [k], perm=[0, 1, 3, 2])])
    if mask is not None:
        att = g.op("Add", [att, mask])
    y = g.op("MatMul", [g.op("Softmax", [att], axis=-1), v])  # [1, heads, N, hd]
    y = g.op("Transpose", [y], perm=[0, 2, 1, 3])
    y = g.op("Reshape", [y, g.const(np.array([0, 0, dim], np.int64), "shape")])
    return g.linear(y, dim, dim)


def build_svtr(small: bool = False) -> tuple[onnx.ModelProto, Feeds]:
    g = Graph(1804)
    width = 64 if small else 128
    classes = 97 if small else 6625
    dims, heads, depth = (64, 128, 256), (2, 4, 8), (3, 6, 3)
    mixers = (["local"] * 3, ["local"] * 3 + ["global"] * 3, ["global"] * 3)
    x = g.conv("image", 3, 32, 3, 2, bias=False)
    x = g.act(g.batchnorm(x, 32), "gelu")
    x = g.act(g.batchnorm(g.conv(x, 32, dims[0], 3, 2, bias=False), dims[0]), "gelu")
    h, w = 8, width // 4
    for stage in range(3):
        dim = dims[stage]
        x = g.op("Reshape", [x, g.const(np.array([0, dim, -1], np.int64), "shape")])
        x = g.op("Transpose", [x], perm=[0, 2, 1])  # [1, h*w, dim]
        mask = g.const(_window_mask(h, w, 7, 11), "mask") if "local" in mixers[stage] else None
        for i in range(depth[stage]):
            local = mixers[stage][i] == "local"
            x = g.op("Add", [x, _attention(g, g.layernorm(x, dim), dim, heads[stage],
                                           mask if local else None)])
            y = g.linear(g.act(g.linear(g.layernorm(x, dim), dim, 4 * dim), "gelu"), 4 * dim, dim)
            x = g.op("Add", [x, y])
        x = g.op("Transpose", [x], perm=[0, 2, 1])
        x = g.op("Reshape", [x, g.const(np.array([0, dim, h, w], np.int64), "shape")])
        if stage < 2:  # merging: conv 3x3, stride (2, 1) halves the height
            wt = g.weight((dims[stage + 1], dim, 3, 3), dim * 9)
            x = g.op("Conv", [x, wt, g.bias(dims[stage + 1])], kernel_shape=[3, 3],
                     strides=[2, 1], pads=[1, 1, 1, 1])
            h //= 2
    x = g.op("ReduceMean", [x], axes=[2], keepdims=1)  # [1, 256, 1, w]
    x = g.conv(x, dims[2], 192, 1, bias=False, act="hardswish")
    x = g.op("Transpose", [g.op("Squeeze", [x, g.const(np.array([2], np.int64), "axes")])],
             perm=[0, 2, 1])
    y = g.op("Softmax", [g.linear(x, 192, classes)], axis=-1)
    model = g.model("svtr_style", [_input("image", [1, 3, 32, width])], [("probs", y)],
                    "SVTR-tiny-style text recognizer")
    return model, {"image": _image((1, 3, 32, width), 4)}


# ------------------------------------------------------------------------------------------------
# VAD-style streaming model


def build_vad(small: bool = False) -> tuple[onnx.ModelProto, Feeds]:
    """One chunk of audio [1, 512] and the LSTM state [2, 1, 128] in; speech probability [1, 1]
    and the next state out. The sample rate (16000 or 8000) picks the STFT's branch in an If,
    as Silero VAD does."""
    g = Graph(1805)
    chunk = 512

    def stft_branch(name: str, hop: int, n_fft: int) -> onnx.GraphProto:
        b = Graph(1805 + hop, prefix=f"{name}_")
        x = b.op("Unsqueeze", ["input", b.const(np.array([1], np.int64), "axes")])  # [1, 1, L]
        x = b.op("Pad", [x, b.const(np.array([0, 0, n_fft // 4, 0, 0, n_fft // 4], np.int64),
                                    "pads")], mode="reflect")
        # the STFT as a Conv1d against fixed cos/sin windows, then the magnitude
        bins = n_fft // 2 + 1
        t = np.arange(n_fft)
        f = np.arange(bins)[:, None]
        win = 0.5 - 0.5 * np.cos(2 * np.pi * t / n_fft)
        basis = np.concatenate([np.cos(2 * np.pi * f * t / n_fft) * win,
                                -np.sin(2 * np.pi * f * t / n_fft) * win])
        y = b.op("Conv", [x, b.const(basis[:, None, :].astype(np.float32), "basis")],
                 kernel_shape=[n_fft], strides=[hop])
        re, im = b.op("Split", [y, b.const(np.array([bins, bins], np.int64), "split")], n_out=2,
                      axis=1)
        mag = b.op("Sqrt", [b.op("Add", [b.op("Mul", [re, re]), b.op("Mul", [im, im])])])
        # both branches give [1, 129, frames]: 8 kHz's fewer bins are padded up
        if bins < 129:
            mag = b.op("Pad", [mag, b.const(np.array([0, 0, 0, 0, 129 - bins, 0], np.int64),
                                            "pads")])
        return helper.make_graph(b.nodes, name, [], [helper.make_tensor_value_info(
            mag, FLOAT, None)], b.inits)

    is16k = g.op("Equal", ["sr", g.const(np.array(16000, np.int64), "sr16k")])
    spec = g.op("If", [is16k], then_branch=stft_branch("stft16k", 128, 256),
                else_branch=stft_branch("stft8k", 64, 128))
    x = g.op("Log", [g.op("Add", [spec, g.const(np.float32(1e-6))])])
    cin = 129
    for cout, s in ((128, 1), (64, 2), (64, 2), (128, 1)):
        x = g.conv(x, cin, cout, 3, s, act="relu", dims=1)
        cin = cout
    # the frames (1 per chunk after the strides) pooled, one LSTM step with the carried state
    x = g.op("ReduceMean", [x], axes=[2], keepdims=0)  # [1, 128]
    x = g.op("Unsqueeze", [x, g.const(np.array([0], np.int64), "axes")])  # [1, 1, 128]
    h0, c0 = (g.op("Gather", ["state", g.const(np.array(i, np.int64), "i")], axis=0)
              for i in (0, 1))
    h0, c0 = (g.op("Unsqueeze", [t, g.const(np.array([0], np.int64), "axes")]) for t in (h0, c0))
    wt = g.weight((1, 512, 128), 128, 0.5)
    r = g.weight((1, 512, 128), 128, 0.5)
    bias = g.const(g.rng.normal(0, 0.05, (1, 1024)).astype(np.float32), "b")
    _, h, c = g.op("LSTM", [x, wt, r, bias, "", h0, c0], n_out=3, hidden_size=128)
    state = g.op("Concat", [h, c], axis=0)  # [2, 1, 128]
    y = g.op("Relu", [g.op("Squeeze", [h, g.const(np.array([0], np.int64), "axes")])])
    y = g.op("Sigmoid", [g.linear(y, 128, 1)])
    model = g.model("vad_style", [
        helper.make_tensor_value_info("input", FLOAT, [1, chunk]),
        helper.make_tensor_value_info("state", FLOAT, [2, 1, 128]),
        helper.make_tensor_value_info("sr", TensorProto.INT64, [])],
        [("output", y), ("stateN", state)], "Silero-VAD-style streaming model")
    rng = np.random.default_rng(5)
    feeds = {"input": rng.uniform(-0.5, 0.5, (1, chunk)).astype(np.float32),
             "state": rng.normal(0, 0.3, (2, 1, 128)).astype(np.float32),
             "sr": np.array(16000, np.int64)}
    return model, feeds


# ------------------------------------------------------------------------------------------------
# DenseNet / Inception blocks


def build_densenet(small: bool = False) -> tuple[onnx.ModelProto, Feeds]:
    g = Graph(1806)
    size = 64 if small else 224
    growth = 32
    x = g.conv("image", 3, 64, 7, 2, bias=False)
    x = g.maxpool(g.op("Relu", [g.batchnorm(x, 64)]), 3, 2, 1)
    c = 64
    blocks = (2, 3, 2) if small else (6, 12, 8)
    for bi, n in enumerate(blocks):
        for _ in range(n):
            y = g.conv(g.op("Relu", [g.batchnorm(x, c)]), c, 4 * growth, 1, bias=False)
            y = g.conv(g.op("Relu", [g.batchnorm(y, 4 * growth)]), 4 * growth, growth, 3,
                       bias=False)
            x = g.op("Concat", [x, y], axis=1)
            c += growth
        if bi < len(blocks) - 1:  # transition: halve channels and size
            x = g.conv(g.op("Relu", [g.batchnorm(x, c)]), c, c // 2, 1, bias=False)
            x = g.op("AveragePool", [x], kernel_shape=[2, 2], strides=[2, 2])
            c //= 2
    y = g.global_pool_fc(g.op("Relu", [g.batchnorm(x, c)]), c, 1000)
    model = g.model("densenet_style", [_input("image", [1, 3, size, size])], [("logits", y)],
                    "DenseNet-121-style dense blocks")
    return model, {"image": _image((1, 3, size, size), 6)}


def build_inception(small: bool = False) -> tuple[onnx.ModelProto, Feeds]:
    g = Graph(1807)
    size = 64 if small else 224

    def conv(x, cin, cout, k=1, s=1):
        return g.conv(x, cin, cout, k, s, act="relu")

    def module(x, cin, c1, c3r, c3, c5r, c5, cp):
        b1 = conv(x, cin, c1)
        b2 = conv(conv(x, cin, c3r), c3r, c3, 3)
        b3 = conv(conv(x, cin, c5r), c5r, c5, 5)
        b4 = conv(g.maxpool(x, 3, 1, 1), cin, cp)
        return g.op("Concat", [b1, b2, b3, b4], axis=1), c1 + c3 + c5 + cp

    x = g.maxpool(conv("image", 3, 64, 7, 2), 3, 2, 1)
    x = g.maxpool(conv(conv(x, 64, 64), 64, 192, 3), 3, 2, 1)
    x, c = module(x, 192, 64, 96, 128, 16, 32, 32)  # 3a
    x, c = module(x, c, 128, 128, 192, 32, 96, 64)  # 3b
    x = g.maxpool(x, 3, 2, 1)
    x, c = module(x, c, 192, 96, 208, 16, 48, 64)  # 4a
    x, c = module(x, c, 160, 112, 224, 24, 64, 64)  # 4b
    x, c = module(x, c, 128, 128, 256, 24, 64, 64)  # 4c
    y = g.global_pool_fc(x, c, 1000)
    model = g.model("inception_style", [_input("image", [1, 3, size, size])], [("logits", y)],
                    "GoogLeNet-style Inception modules")
    return model, {"image": _image((1, 3, size, size), 7)}


def build_efficientnet(small: bool = False) -> tuple[onnx.ModelProto, Feeds]:
    """EfficientNet-B0 as PyTorch exports transformers' EfficientNet: convolutions without
    bias, each followed by a BatchNormalization; SiLU as x * Sigmoid(x); stride-1 convolutions
    with auto_pad SAME_UPPER (padding="same"), stride-2 ones VALID after a ZeroPad2d whose
    pads a constant subgraph computes (ONNX shape inference sizes nothing after it); MBConv
    blocks with squeeze-and-excitation gates."""
    g = Graph(1808)
    size = 96 if small else 224

    def conv(x, cin, cout, k=1, s=1, group=1, act="silu"):
        w = g.weight((cout, cin // group, k, k), cin // group * k * k)
        if s == 1:
            y = g.op("Conv", [x, w], kernel_shape=[k, k], auto_pad="SAME_UPPER", group=group)
        else:  # ZeroPad2d((k//2 - 1, k//2) each side), its pads computed
            lo, hi = k // 2 - 1, k // 2
            pads = g.op("Concat", [g.const(np.array([0, 0, lo, lo], np.int64)),
                                   g.const(np.array([0, 0, hi, hi], np.int64))], axis=0)
            x = g.op("Pad", [x, g.op("Cast", [pads], to=TensorProto.INT64)])
            y = g.op("Conv", [x, w], kernel_shape=[k, k], strides=[s, s], auto_pad="VALID",
                     group=group)
        return g.act(g.batchnorm(y, cout), act)

    def mbconv(x, cin, cout, expand, k, s):
        c = cin * expand
        h = conv(x, cin, c) if expand != 1 else x
        h = conv(h, c, c, k, s, group=c)
        squeeze = max(1, cin // 4)
        e = g.op("GlobalAveragePool", [h])
        e = g.act(g.op("Conv", [e, g.weight((squeeze, c, 1, 1), c), g.bias(squeeze)],
                       kernel_shape=[1, 1], auto_pad="SAME_UPPER"), "silu")
        e = g.op("Sigmoid", [g.op("Conv", [e, g.weight((c, squeeze, 1, 1), squeeze),
                                           g.bias(c)], kernel_shape=[1, 1],
                                  auto_pad="SAME_UPPER")])
        y = conv(g.op("Mul", [h, e]), c, cout, act=None)
        return g.op("Add", [y, x]) if s == 1 and cin == cout else y

    x = conv("image", 3, 32, 3, 2)
    c = 32
    stages = ((1, 3, 1, 16, 1), (6, 3, 2, 24, 2), (6, 5, 2, 40, 2), (6, 3, 2, 80, 3),
              (6, 5, 1, 112, 3), (6, 5, 2, 192, 4), (6, 3, 1, 320, 1))
    for expand, k, s, cout, repeats in stages[:4] if small else stages:
        for i in range(repeats):
            x = mbconv(x, c, cout, expand, k, s if i == 0 else 1)
            c = cout
    x = conv(x, c, 1280)
    y = g.global_pool_fc(x, 1280, 1000)
    model = g.model("efficientnet_style", [_input("image", [1, 3, size, size])],
                    [("logits", y)], "EfficientNet-B0 as PyTorch exports it")
    return model, {"image": _image((1, 3, size, size), 8)}


def build_regnet(small: bool = False) -> tuple[onnx.ModelProto, Feeds]:
    """RegNetY-800MF: residual bottleneck blocks whose 3x3 convolution is grouped (16
    channels a group), with squeeze-and-excitation, BatchNormalization and Relu, as torch
    exports them (torchvision's regnet_y_800mf layout)."""
    g = Graph(1809)
    size = 96 if small else 224

    def conv(x, cin, cout, k=1, s=1, group=1, act="relu"):
        y = g.conv(x, cin, cout, k, s, group=group, bias=False)
        return g.act(g.batchnorm(y, cout), act)

    def block(x, cin, cout, s):
        h = conv(x, cin, cout)
        h = conv(h, cout, cout, 3, s, group=cout // 16)
        squeeze = max(1, cin // 4)
        e = g.op("GlobalAveragePool", [h])
        e = g.act(g.op("Conv", [e, g.weight((squeeze, cout, 1, 1), cout), g.bias(squeeze)]),
                  "relu")
        e = g.op("Sigmoid", [g.op("Conv", [e, g.weight((cout, squeeze, 1, 1), squeeze),
                                           g.bias(cout)])])
        h = conv(g.op("Mul", [h, e]), cout, cout, act=None)
        skip = x if s == 1 and cin == cout else conv(x, cin, cout, 1, s, act=None)
        return g.op("Relu", [g.op("Add", [h, skip])])

    x = conv("image", 3, 32, 3, 2)
    c = 32
    stages = ((64, 1), (128, 3), (320, 8), (768, 2))
    for width, depth in stages[:3] if small else stages:
        for i in range(depth):
            x = block(x, c, width, 2 if i == 0 else 1)
            c = width
    y = g.global_pool_fc(x, c, 1000)
    model = g.model("regnet_style", [_input("image", [1, 3, size, size])], [("logits", y)],
                    "RegNetY-800MF: grouped bottlenecks with SE")
    return model, {"image": _image((1, 3, size, size), 9)}


# name -> (builder, row label, input description)
MODELS: dict[str, tuple[Callable[..., tuple[onnx.ModelProto, Feeds]], str, str]] = {
    "yolo_style": (build_yolo, "YOLOv8n-style detector", "1x3x320x320"),
    "dbnet_style": (build_dbnet, "DBNet-style text detector", "1x3x640x640"),
    "crnn_style": (build_crnn, "CRNN recognizer", "1x3x32x320"),
    "svtr_style": (build_svtr, "SVTR-tiny-style recognizer", "1x3x32x128"),
    "vad_style": (build_vad, "VAD-style streaming (If, LSTM)", "512 samples"),
    "densenet_style": (build_densenet, "DenseNet-121-style blocks", "1x3x224x224"),
    "inception_style": (build_inception, "Inception (GoogLeNet) modules", "1x3x224x224"),
    "efficientnet_style": (build_efficientnet, "EfficientNet-B0 (PyTorch export)", "1x3x224x224"),
    "regnet_style": (build_regnet, "RegNetY-800MF (grouped, SE)", "1x3x224x224"),
}


def ensure(name: str, cache: Path) -> Path:
    """The model ``name`` in the cache folder, written if missing or older than this file."""
    folder = cache / name
    path = folder / "model.onnx"
    if path.is_file() and path.stat().st_mtime >= Path(__file__).stat().st_mtime:
        return path
    model, feeds = MODELS[name][0]()
    folder.mkdir(parents=True, exist_ok=True)
    for key, value in feeds.items():
        np.save(folder / f"{key}.npy", value)
    tmp = folder / "model.onnx.tmp"
    onnx.save(model, str(tmp))
    os.replace(tmp, path)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help=f"models (default: all of {', '.join(MODELS)})")
    parser.add_argument("--out", type=Path, default=None,
                        help="cache folder "
                        "(default $ONNXRUN_BENCH_CACHE or ~/.cache/onnxrun-bench)")
    args = parser.parse_args()
    out = args.out or Path(os.environ.get("ONNXRUN_BENCH_CACHE")
                           or Path.home() / ".cache" / "onnxrun-bench")
    for name in args.names or list(MODELS):
        path = ensure(name, out)
        nodes = onnx.load(str(path)).graph.node
        print(f"{name}: {path}, {len(nodes)} nodes, {path.stat().st_size / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
