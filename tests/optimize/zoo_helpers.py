"""The light model-zoo level comparison shared by test_levels_zoo.py (the models as shipped)
and test_levels_zoo_random.py (with random weights): see test_levels_zoo.py for what and why."""

from __future__ import annotations

import collections
import functools
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

import onnxrun

ort = pytest.importorskip("onnxruntime")

LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
NAMES = sorted(p.stem[len("light_"):] for p in LIGHT.glob("light_*.onnx"))

LEVELS = [1, 2, 99]
RTOL, ATOL = 1e-4, 1e-5

def _expose_logits(model: onnx.ModelProto) -> None:
    softmax = [n for n in model.graph.node if n.op_type == "Softmax"]
    if softmax:
        model.graph.output.append(onnx.ValueInfoProto(name=softmax[-1].input[0]))


def _randomize(model: onnx.ModelProto, seed: int = 0) -> None:
    """ConstantOfShape weights -> random initializers of a scale that keeps activations sane."""
    rng = np.random.default_rng(seed)
    inits = {t.name: t for t in model.graph.initializer}
    reader = {}
    for n in model.graph.node:
        for i, name in enumerate(n.input):
            reader.setdefault(name, (n, i))
    kept = []
    for n in model.graph.node:
        if n.op_type != "ConstantOfShape" or n.input[0] not in inits:
            kept.append(n)
            continue
        shape = [int(d) for d in numpy_helper.to_array(inits[n.input[0]])]
        user, index = reader.get(n.output[0], (None, 0))
        op = user.op_type if user is not None else ""
        if op == "BatchNormalization":
            w = (rng.uniform(0.5, 1.5, shape) if index in (1, 4)  # scale, variance
                 else rng.normal(0.0, 0.1, shape))  # bias, mean
        elif len(shape) >= 2:
            trans_b = any(a.name == "transB" and a.i for a in user.attribute) if user else False
            fan_in = shape[1] if op == "Gemm" and trans_b else (
                shape[0] if op == "Gemm" else int(np.prod(shape[1:])))
            w = rng.normal(0.0, np.sqrt(2.0 / max(fan_in, 1)), shape)
        elif op in ("Conv", "Gemm"):
            w = rng.normal(0.0, 0.1, shape)  # biases
        else:
            w = rng.uniform(0.8, 1.2, shape)  # per-channel scales and shifts (DenseNet)
        model.graph.initializer.append(numpy_helper.from_array(w.astype(np.float32), n.output[0]))
    del model.graph.node[:]
    model.graph.node.extend(kept)


@functools.lru_cache(maxsize=1)  # one model at a time: the big ones hold 0.5 GB of weights
def model_bytes(name: str, variant: str) -> bytes:
    model = onnx.load(str(LIGHT / f"light_{name}.onnx"))
    _expose_logits(model)
    if variant == "random":
        _randomize(model)
    return model.SerializeToString()


@functools.cache
def feeds(name: str) -> tuple[tuple[str, np.ndarray], ...]:
    model = onnx.load(str(LIGHT / f"light_{name}.onnx"), load_external_data=False)
    init = {t.name for t in model.graph.initializer}
    rng = np.random.default_rng(1)
    result = []
    for vi in model.graph.input:
        if vi.name in init:
            continue
        shape = [d.dim_value or 1 for d in vi.type.tensor_type.shape.dim]
        result.append((vi.name, rng.standard_normal(shape).astype(np.float32)))
    return tuple(result)


def run(name: str, variant: str, level: int, saved: str = "") -> onnxrun.InferenceSession:
    """A session on the model at ``level``, saving the optimized model to ``saved`` if given."""
    so = onnxrun.SessionOptions()
    so.graph_optimization_level = level
    so.optimized_model_filepath = saved
    return onnxrun.InferenceSession(model_bytes(name, variant), so)


@functools.lru_cache(maxsize=1)
def reference(name: str, variant: str) -> list[np.ndarray]:
    return run(name, variant, 0).run(None, dict(feeds(name)))


def signature(report) -> tuple:
    return tuple(sorted((name, tuple(sorted(rep.changes.items())))
                        for name, rep in report.passes.items() if rep.changes))


@functools.cache
def softmax_output(name: str) -> int | None:
    """Which output is the final Softmax of the logits that _expose_logits appends (last)."""
    model = onnx.load(str(LIGHT / f"light_{name}.onnx"), load_external_data=False)
    softmax = [n.output[0] for n in model.graph.node if n.op_type == "Softmax"]
    outputs = [o.name for o in model.graph.output]
    return outputs.index(softmax[-1]) if softmax and softmax[-1] in outputs else None


def assert_close(got: list, expected: list, rtol: float = RTOL, err: str = "",
                 softmax: int | None = None) -> None:
    """Output by output; ``softmax``, the index of the Softmax of the last output (the logits),
    also within what the logits' difference allows: Softmax(l + d) / Softmax(l) lies within
    exp(+-2 max|d|), so the two differ by at most the larger times 1 - exp(-2 max|d|). (The
    shipped SqueezeNet's equal logits of 7e9 come out of a convolution a last bit apart, an ulp
    being 512, as some BLAS and MLAS kernels round channels: any distribution can follow.)"""
    assert len(got) == len(expected), err
    drift = float(np.abs(got[-1].astype(np.float64) - expected[-1]).max())
    for i, (g, e) in enumerate(zip(got, expected, strict=True)):
        assert g.dtype == e.dtype and g.shape == e.shape, err
        scale = float(np.abs(e).max())
        bound = rtol * np.abs(e) + ATOL + rtol * scale
        if i == softmax:
            bound = bound - np.maximum(np.abs(g), np.abs(e)) * np.expm1(-2 * drift)
        assert (np.abs(g - e) <= bound).all(), (
            f"{err}: output {i} off by {np.abs(g - e).max():g}, logits by {drift:g}")


def has_batchnorm(name: str) -> bool:
    model = onnx.load(str(LIGHT / f"light_{name}.onnx"), load_external_data=False)
    return any(n.op_type == "BatchNormalization" for n in model.graph.node)


def saved_ops(path: Path) -> collections.Counter:
    return collections.Counter(n.op_type for n in onnx.load(str(path)).graph.node)


def check_levels(name: str, variant: str, tmp_path: Path) -> None:
    """Each level against level 0; the saved models through the checker and onnxruntime."""
    expected = reference(name, variant)
    inputs = dict(feeds(name))
    seen: dict[tuple, int] = {}
    last = None
    for level in LEVELS:
        path = tmp_path / f"level_{level}.onnx"
        # Level 99 adds only layout passes, none of which rewrites these CNNs: it is saved (half a
        # gigabyte for VGG) only if it turns out to be a graph of its own.
        sess = run(name, variant, level, "" if level == 99 else str(path))
        report = sess.get_optimization_report()
        if variant == "shipped":
            assert report.nodes_after < report.nodes_before  # at least the weights fold
        if signature(report) in seen:
            path.unlink(missing_ok=True)
            continue  # the same passes changed the same things: the graph of a lower level
        seen[signature(report)] = level
        if level == 99:
            sess = run(name, variant, level, str(path))
        got = sess.run(None, inputs)
        del sess
        assert_close(got, expected, err=f"level {level}", softmax=softmax_output(name))
        onnx.checker.check_model(str(path))
        if name == "resnet50":
            assert saved_ops(path)["BatchNormalization"] == 0, f"level {level}"
        if last is not None and last != path:
            last.unlink()  # only the most rewritten graph is read again (VGG's: ~0.5 GB each)
        last = path

    # onnxruntime runs the most rewritten graph (every basic and extended rewrite in it), unless
    # it holds onnxrun's own operators (domain ai.onnxrun), which onnxruntime does not know.
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        try:
            ort_sess = ort.InferenceSession(str(last), opts, providers=["CPUExecutionProvider"])
        except Exception as e:
            if "ai.onnxrun" in str(e):
                return
            raise
        assert_close(ort_sess.run(None, inputs), expected, 1e-3, err="onnxruntime",
                     softmax=softmax_output(name))
    finally:
        # pytest keeps the last runs' tmp_path folders; concurrent runs filled a disk with these
        last.unlink(missing_ok=True)
