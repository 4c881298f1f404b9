"""Each compiled kernel against its numpy path and onnxruntime, on one compiled-kernel target.

    python benchmarks/compiled_kernels.py                  # the host's best target
    python benchmarks/compiled_kernels.py --target avx2    # AVX2 code (any AVX2+ host)
    python benchmarks/compiled_kernels.py --quick          # fewer cases and runs

Three sessions per case in this process, 1 intra-op thread, run alternately (the order
reversed every round; ``--cpu-time``: timed by CPU time, for a loaded machine): onnxrun with
the compiled kernels (prepared inside ``compiled.forced_target``), onnxrun on its numpy paths
(prepared inside ``compiled.disabled()``), onnxruntime. Cases: the operators that use a
compiled kernel, one node each on typical shapes, then small models: int8 QDQ CNNs of the onnx
package's light zoo (QLinearConv and its depthwise kernel, quantized by onnxruntime's tool on
random calibration data) and a 2-layer bidirectional LSTM tagger, float32 and dynamic int8
(DynamicQuantizeLSTM). Prints a Markdown table (medians; ratios) and the machine's load.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

import onnxrun
from onnxrun.providers.cpu import compiled
from onnxrun.tools.bench import fmt_time

RNG = np.random.default_rng(18)
MS = "com.microsoft"
LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"


def _model(nodes, inputs, outputs, inits=(), opset=17) -> bytes:
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset),
                                                    helper.make_opsetid(MS, 1)])
    model.ir_version = 9
    return model.SerializeToString()


def _vi(name, elem, shape):
    return helper.make_tensor_value_info(name, elem, shape)


def _init(name, a):
    return numpy_helper.from_array(np.asarray(a), name)


def _q(shape, dtype=np.uint8):
    info = np.iinfo(dtype)
    return RNG.integers(info.min, int(info.max) + 1, size=shape).astype(dtype)


def matmul_integer(M=128, K=768, N=768):
    model = _model([helper.make_node("MatMulInteger", ["A", "B", "az", "bz"], ["Y"])],
                   [_vi("A", TP.UINT8, [M, K])], [_vi("Y", TP.INT32, None)],
                   [_init("B", _q((K, N), np.int8)), _init("az", np.uint8(3)),
                    _init("bz", np.int8(0))])
    return model, {"A": _q((M, K))}


def dynamic_quantize_matmul(M=128, K=768, N=768):
    model = _model([helper.make_node("DynamicQuantizeMatMul", ["A", "B", "bs", "bz"], ["Y"],
                                     domain=MS)],
                   [_vi("A", TP.FLOAT, [M, K])], [_vi("Y", TP.FLOAT, None)],
                   [_init("B", _q((K, N), np.int8)), _init("bs", np.float32(0.02)),
                    _init("bz", np.int8(0))])
    return model, {"A": RNG.standard_normal((M, K)).astype(np.float32)}


def dynamic_quantize_linear(n=1 << 20):
    model = _model([helper.make_node("DynamicQuantizeLinear", ["X"], ["Y", "s", "z"])],
                   [_vi("X", TP.FLOAT, [n])],
                   [_vi("Y", TP.UINT8, None), _vi("s", TP.FLOAT, None), _vi("z", TP.UINT8, None)])
    return model, {"X": RNG.standard_normal(n).astype(np.float32)}


def _qlinear_conv(C, M, HW, k, group):
    W = _q((M, C // group, k, k), np.int8)
    model = _model([helper.make_node("QLinearConv", ["X", "xs", "xz", "W", "ws", "wz", "ys",
                                                     "yz"], ["Y"], pads=[k // 2] * 4,
                                     group=group)],
                   [_vi("X", TP.UINT8, [1, C, HW, HW])], [_vi("Y", TP.UINT8, None)],
                   [_init("xs", np.float32(0.02)), _init("xz", np.uint8(128)), _init("W", W),
                    _init("ws", np.float32(0.01)), _init("wz", np.int8(0)),
                    _init("ys", np.float32(0.05)), _init("yz", np.uint8(128))])
    return model, {"X": _q((1, C, HW, HW))}


def qlinear_add(shape=(1, 64, 56, 56)):
    names = ["A", "as", "az", "B", "bs", "bz", "cs", "cz"]
    model = _model([helper.make_node("QLinearAdd", names, ["C"], domain=MS)],
                   [_vi("A", TP.UINT8, list(shape)), _vi("B", TP.UINT8, list(shape))],
                   [_vi("C", TP.UINT8, None)],
                   [_init("as", np.float32(0.02)), _init("az", np.uint8(120)),
                    _init("bs", np.float32(0.03)), _init("bz", np.uint8(130)),
                    _init("cs", np.float32(0.04)), _init("cz", np.uint8(128))])
    return model, {"A": _q(shape), "B": _q(shape)}


def _recurrent(op, T=128, B=1, I=256, H=256, **attrs):
    G = {"LSTM": 4, "GRU": 3}[op]
    inits = [_init("W", (RNG.standard_normal((1, G * H, I)) * 0.1).astype(np.float32)),
             _init("R", (RNG.standard_normal((1, G * H, H)) * 0.1).astype(np.float32)),
             _init("Bias", (RNG.standard_normal((1, 2 * G * H)) * 0.1).astype(np.float32))]
    model = _model([helper.make_node(op, ["X", "W", "R", "Bias"], ["Y"], hidden_size=H,
                                     **attrs)],
                   [_vi("X", TP.FLOAT, [T, B, I])], [_vi("Y", TP.FLOAT, None)], inits)
    return model, {"X": RNG.standard_normal((T, B, I)).astype(np.float32)}


def dynamic_quantize_lstm(T=128, B=1, I=256, H=256):
    W = _q((1, I, 4 * H), np.int8)
    R = _q((1, H, 4 * H), np.int8)
    inits = [_init("W", W), _init("R", R),
             _init("Bias", (RNG.standard_normal((1, 8 * H)) * 0.1).astype(np.float32)),
             _init("ws", np.full(1, 0.002, np.float32)), _init("wz", np.zeros(1, np.int8)),
             _init("rs", np.full(1, 0.002, np.float32)), _init("rz", np.zeros(1, np.int8))]
    inputs = ["X", "W", "R", "Bias", "", "", "", "", "ws", "wz", "rs", "rz"]
    model = _model([helper.make_node("DynamicQuantizeLSTM", inputs, ["Y"], domain=MS,
                                     hidden_size=H)],
                   [_vi("X", TP.FLOAT, [T, B, I])], [_vi("Y", TP.FLOAT, None)], inits)
    return model, {"X": RNG.standard_normal((T, B, I)).astype(np.float32)}


def depthwise_conv(C=96, HW=112, k=3):
    W = (RNG.standard_normal((C, 1, k, k)) * 0.3).astype(np.float32)
    model = _model([helper.make_node("Conv", ["X", "W"], ["Y"], group=C, pads=[k // 2] * 4)],
                   [_vi("X", TP.FLOAT, [1, C, HW, HW])], [_vi("Y", TP.FLOAT, None)],
                   [_init("W", W)])
    return model, {"X": RNG.standard_normal((1, C, HW, HW)).astype(np.float32)}


def lstm_tagger(layers=2, T=128, E=128, H=256):
    """Embedded tokens -> ``layers`` bidirectional LSTMs -> logits (float32)."""
    nodes, inits, x, width = [], [], "X", E
    for n in range(layers):
        inits += [_init(f"W{n}", (RNG.standard_normal((2, 4 * H, width)) * 0.1)
                        .astype(np.float32)),
                  _init(f"R{n}", (RNG.standard_normal((2, 4 * H, H)) * 0.1).astype(np.float32)),
                  _init(f"B{n}", (RNG.standard_normal((2, 8 * H)) * 0.1).astype(np.float32)),
                  _init(f"perm{n}", np.array([0, 2, 1, 3], np.int64)),
                  _init(f"shape{n}", np.array([T, 1, 2 * H], np.int64))]
        nodes += [helper.make_node("LSTM", [x, f"W{n}", f"R{n}", f"B{n}"], [f"Y{n}"],
                                   hidden_size=H, direction="bidirectional"),
                  helper.make_node("Transpose", [f"Y{n}"], [f"T{n}"], perm=[0, 2, 1, 3]),
                  helper.make_node("Reshape", [f"T{n}", f"shape{n}"], [f"X{n + 1}"])]
        x, width = f"X{n + 1}", 2 * H
    inits.append(_init("Wo", (RNG.standard_normal((2 * H, 32)) * 0.1).astype(np.float32)))
    nodes.append(helper.make_node("MatMul", [x, "Wo"], ["logits"]))
    model = _model(nodes, [_vi("X", TP.FLOAT, [T, 1, E])], [_vi("logits", TP.FLOAT, None)],
                   inits)
    return model, {"X": RNG.standard_normal((T, 1, E)).astype(np.float32)}


def _quantized_dynamic(make: Callable) -> Callable:
    def build():
        from onnxruntime.quantization import QuantType, quantize_dynamic

        model, feeds = make()
        with tempfile.TemporaryDirectory() as tmp:
            src, dst = os.path.join(tmp, "f.onnx"), os.path.join(tmp, "q.onnx")
            Path(src).write_bytes(model)
            quantize_dynamic(src, dst, weight_type=QuantType.QInt8)
            return Path(dst).read_bytes(), feeds
    return build


def _zoo_qdq(name: str) -> Callable:
    """A light-zoo CNN quantized to int8 QDQ by onnxruntime's tool (random calibration)."""
    def build():
        from onnxruntime.quantization import (
            CalibrationDataReader,
            QuantFormat,
            QuantType,
            quantize_static,
        )

        path = LIGHT / f"light_{name}.onnx"
        shape = [1, 3, 224, 224]
        x = RNG.random(shape, dtype=np.float32)

        class Reader(CalibrationDataReader):
            def __init__(self, feed_name):
                self.batches = iter([{feed_name: RNG.random(shape, dtype=np.float32)}
                                     for _ in range(2)])

            def get_next(self):
                return next(self.batches, None)

        model = onnx.load(path)
        inits = {t.name for t in model.graph.initializer}
        feed = next(i.name for i in model.graph.input if i.name not in inits)
        with tempfile.TemporaryDirectory() as tmp:
            dst = os.path.join(tmp, "q.onnx")
            quantize_static(str(path), dst, Reader(feed), quant_format=QuantFormat.QDQ,
                            activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
            return Path(dst).read_bytes(), {feed: x}
    return build


KERNELS = [  # (label, which compiled kernel, model factory, in --quick)
    ("MatMulInteger 128x768x768", "int8_gemm", matmul_integer, True),
    ("DynamicQuantizeMatMul 128x768x768", "quantize + int8_gemm", dynamic_quantize_matmul,
     True),
    ("DynamicQuantizeLinear 1M", "quantize", dynamic_quantize_linear, False),
    ("QLinearConv 64->64 3x3 56x56", "int8_gemm", lambda: _qlinear_conv(64, 64, 56, 3, 1),
     True),
    ("QLinearConv 1x1 128->128 28x28", "int8_gemm", lambda: _qlinear_conv(128, 128, 28, 1, 1),
     False),
    ("QLinearConv depthwise 144 3x3 56x56", "int8_depthwise",
     lambda: _qlinear_conv(144, 144, 56, 3, 144), True),
    ("QLinearAdd 64x56x56", "int8_elementwise", qlinear_add, False),
    ("Conv depthwise 96 3x3 112x112", "depthwise", depthwise_conv, True),
    ("LSTM T128 H256", "lstm_f32", lambda: _recurrent("LSTM"), True),
    ("GRU T128 H256 (lbr)", "gru_f32", lambda: _recurrent("GRU", linear_before_reset=1),
     False),
    ("DynamicQuantizeLSTM T128 H256", "lstm_u8", dynamic_quantize_lstm, True),
]
MODELS = [
    ("LSTM tagger 2x256 bidir, float32", "lstm_f32", lstm_tagger, True),
    ("LSTM tagger 2x256 bidir, dynamic int8", "lstm_u8 + int8_gemm",
     _quantized_dynamic(lstm_tagger), True),
    ("zoo squeezenet, int8 QDQ", "int8_gemm", _zoo_qdq("squeezenet"), True),
    ("zoo shufflenet, int8 QDQ", "int8_gemm + int8_depthwise", _zoo_qdq("shufflenet"), False),
    ("zoo resnet50, int8 QDQ", "int8_gemm", _zoo_qdq("resnet50"), False),
]


def _sessions(model: bytes, target: str | None):
    import onnxruntime as ort

    def options(rt):
        so = rt.SessionOptions()
        so.intra_op_num_threads = 1
        so.inter_op_num_threads = 1
        return so

    with compiled.forced_target(target) if target else _nothing():
        fast = onnxrun.InferenceSession(model, options(onnxrun))
    with compiled.disabled():
        slow = onnxrun.InferenceSession(model, options(onnxrun))
    ref = ort.InferenceSession(model, options(ort), providers=["CPUExecutionProvider"])
    return fast, slow, ref


class _nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return None


def _alternating(runners, repeat: int, clock):
    """One warm-up each, then ``repeat`` rounds, the order reversed every round (as
    ``onnxrun.tools.bench.time_alternating``), timed by ``clock``."""
    first = [run() for run in runners]
    times = [[] for _ in runners]
    for i in range(repeat):
        for k in (range(len(runners)) if i % 2 == 0 else reversed(range(len(runners)))):
            t0 = clock()
            runners[k]()
            times[k].append(clock() - t0)
    return times, first


def _numpy_run(session, feeds):
    with compiled.disabled():
        return session.run(None, feeds)


def _median(xs):
    return float(np.median(xs))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default=None,
                        help="compiled-kernel target (avx512vnni, avx512, avxvnni, avx2; "
                             "default the host's best)")
    parser.add_argument("--quick", action="store_true", help="fewer cases and runs")
    parser.add_argument("-r", "--repeat", type=int, default=None, help="timed rounds")
    parser.add_argument("--cases", default="", help="only cases whose label contains one of "
                        "these comma-separated words")
    parser.add_argument("--cpu-time", action="store_true",
                        help="time each run by this process's CPU time, not the wall clock "
                             "(steadier on a loaded machine; the same at 1 thread otherwise)")
    args = parser.parse_args()
    repeat = args.repeat or (7 if args.quick else 21)
    with compiled.forced_target(args.target) if args.target else _nothing():
        target = compiled.target().name if not compiled.why_unavailable() else \
            f"none ({compiled.why_unavailable()})"
    print(f"target: {target}; {platform.processor() or platform.machine()}; "
          f"load {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f}; 1 thread; "
          f"medians of {repeat} ({'CPU' if args.cpu_time else 'wall'} time)\n")
    print("| case | compiled kernel | onnxrun compiled | onnxrun numpy | onnxruntime "
          "| numpy / compiled | compiled / onnxruntime | max diff vs numpy |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    ratios = []
    for label, kernel, make, quick in KERNELS + MODELS:
        if args.quick and not quick:
            continue
        if args.cases and not any(w in label for w in args.cases.split(",")):
            continue
        model, feeds = make()
        fast, slow, ref = _sessions(model, args.target)
        runners = [lambda s=s, f=feeds: s.run(None, f) for s in (fast, slow, ref)]
        runners[1] = lambda s=slow, f=feeds: _numpy_run(s, f)  # some kernels ask at run time
        times, outs = _alternating(runners, repeat, time.process_time if args.cpu_time
                                   else time.perf_counter)
        t = [_median(x) for x in times]
        # how far the compiled path is from the numpy path (integers: exact in the tests;
        # an int8 LSTM's requantized h may round a code differently after a 1-ulp tanh)
        diff = max((float(np.abs(g.astype(np.float64) - w).max(initial=0))
                    for g, w in zip(outs[0], outs[1], strict=True)), default=0.0)
        ratios.append(t[0] / t[2])
        print(f"| {label} | {kernel} | {fmt_time(t[0])} | {fmt_time(t[1])} | {fmt_time(t[2])} "
              f"| {t[1] / t[0]:.2f}x | {t[0] / t[2]:.2f}x | {diff:.2g} |", flush=True)
    geo = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
    print(f"\ngeomean compiled / onnxruntime: {geo:.2f}x; load after "
          f"{os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
