"""The demo page's Python side (runs inside Pyodide): load a model, make inputs, run, describe.

index.html calls these with the bytes of the files the user picked; results come back as JSON.
"""

from __future__ import annotations

import io
import json
import time

import numpy as np

import onnxrun
from onnxrun.ir.serde import tensor_to_array
from onnxrun.proto import onnx

_state: dict = {}


def _bytes(data) -> bytes:
    """A JavaScript Uint8Array (a JsProxy) as bytes in one copy; bytes() of the proxy would
    read it element by element (minutes for a 100 MB model)."""
    return data.to_bytes() if hasattr(data, "to_bytes") else bytes(data)


def load_model(data) -> str:
    """Create the session from the model's bytes; describe its inputs and outputs."""
    data = _bytes(data)
    t0 = time.perf_counter()
    sess = onnxrun.InferenceSession(data)
    _state.update(session=sess, load_ms=(time.perf_counter() - t0) * 1e3)
    return json.dumps({
        "load_ms": _state["load_ms"],
        "inputs": [_arg(a) for a in sess.get_inputs()],
        "outputs": [_arg(a) for a in sess.get_outputs()],
    })


def _arg(a) -> dict:
    return {"name": a.name, "type": a.type, "shape": [d if isinstance(d, int) else None
                                                      for d in a.shape]}


_NP = {"tensor(float)": np.float32, "tensor(double)": np.float64, "tensor(int64)": np.int64,
       "tensor(int32)": np.int32, "tensor(uint8)": np.uint8, "tensor(int8)": np.int8,
       "tensor(bool)": np.bool_, "tensor(float16)": np.float16}


def _inputs(mode: str, image) -> dict[str, np.ndarray]:
    """One array per input: ``random`` (seeded), ``pattern`` (arange(n)/n, what onnx's test
    runner feeds the light-zoo models), or the picked image (resized, ImageNet-normalized NCHW)
    for an image-shaped input."""
    sess = _state["session"]
    rng = np.random.default_rng(0)
    feeds = {}
    for a in sess.get_inputs():
        shape = [d if isinstance(d, int) and d > 0 else 1 for d in a.shape]
        dtype = _NP.get(a.type)
        if dtype is None:
            raise ValueError(f"input '{a.name}' is {a.type}: the demo makes numeric tensors only")
        n = int(np.prod(shape))
        if image is not None and len(shape) == 4 and shape[1] in (1, 3):
            feeds[a.name] = _image_tensor(_bytes(image), shape).astype(dtype)
        elif mode == "pattern":
            feeds[a.name] = (np.arange(n).reshape(shape) / n).astype(dtype)
        elif np.issubdtype(dtype, np.floating):
            feeds[a.name] = rng.standard_normal(shape).astype(dtype)
        elif dtype is np.bool_:
            feeds[a.name] = rng.integers(0, 2, shape).astype(bool)
        else:
            feeds[a.name] = rng.integers(0, 10, shape).astype(dtype)
    return feeds


def _image_tensor(data: bytes, shape: list[int]) -> np.ndarray:
    from PIL import Image

    _, c, h, w = shape
    img = Image.open(io.BytesIO(data)).convert("RGB" if c == 3 else "L").resize((w, h))
    x = np.asarray(img, dtype=np.float32) / 255.0
    if c == 3:
        x = (x - [0.485, 0.456, 0.406]) / [0.229, 0.224, 0.225]
        x = x.transpose(2, 0, 1)
    else:
        x = x[None]
    return x[None].astype(np.float32)


def run(mode: str = "random", image=None, expected=None, repeat: int = 1) -> str:
    """Run (``repeat`` times; the median is reported); describe the outputs; compare the first
    output with ``expected`` (a TensorProto's bytes) when given."""
    sess = _state["session"]
    feeds = _inputs(mode, image)
    times, outs = [], None
    for _ in range(max(1, int(repeat))):
        t0 = time.perf_counter()
        outs = sess.run(None, feeds)
        times.append((time.perf_counter() - t0) * 1e3)
    result = {"run_ms": float(np.median(times)), "runs": len(times),
              "load_ms": _state["load_ms"], "outputs": []}
    for meta, value in zip(sess.get_outputs(), outs, strict=True):
        result["outputs"].append(_describe(meta.name, value))
    if expected is not None:
        t = onnx.TensorProto()
        t.ParseFromString(_bytes(expected))
        ref = tensor_to_array(t)
        got = np.asarray(outs[0])
        ok = got.shape == ref.shape and got.dtype == ref.dtype and np.allclose(
            got, ref, rtol=1e-3, atol=1e-7)
        diff = float(np.max(np.abs(got.astype(np.float64) - ref))) if got.shape == ref.shape \
            else None
        result["check"] = {"matches": bool(ok), "max_abs_diff": diff,
                           "shape": list(ref.shape)}
    return json.dumps(result)


def _describe(name: str, value) -> dict:
    a = np.asarray(value)
    d = {"name": name, "dtype": str(a.dtype), "shape": list(a.shape)}
    if a.dtype.kind in "fiub" and a.size:
        flat = a.reshape(-1)
        d["first"] = [float(v) for v in flat[:8]]
        d["min"], d["max"] = float(flat.min()), float(flat.max())
        # a classifier's scores: one row of >= 10 classes (logits or probabilities)
        if a.dtype.kind == "f" and a.size >= 10 and a.size == max(a.shape):
            scores = flat.astype(np.float64)
            p = np.exp(scores - scores.max())
            p = p / p.sum() if not (0 <= scores.min() and abs(scores.sum() - 1) < 1e-3) \
                else scores
            top = np.argsort(-scores)[:5]
            d["top"] = [{"class": int(i), "score": float(scores[i]), "p": float(p[i])}
                        for i in top]
    return d
