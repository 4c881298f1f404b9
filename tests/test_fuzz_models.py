"""Corrupted and malicious models: thousands of seeded mutations of real models, at the byte level
and at the field level (dimensions, element types, operator names, wiring, attributes, raw data,
opsets, input shapes). Every mutant must be refused with one of onnxruntime's error types at
session creation, or at run time, or run; never another exception, a crash or a hang."""

from __future__ import annotations

import copy
import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest

import onnxrun
from onnxrun import errors

MODELS = Path(__file__).parent / "models"
NAMES = ["gpt_tiny", "if_model", "mobilenet_tiny", "lstm_model"]
EXPECTED = (errors.InvalidProtobuf, errors.InvalidGraph, errors.InvalidArgument, errors.Fail,
            errors.RuntimeException, errors.NotImplemented, errors.NoSuchFile)
OPS = ["Add", "Relu", "Reshape", "Concat", "Gather", "MatMul", "Slice", "Transpose", "Expand",
       "Tile", "ConstantOfShape", "Range", "Pad", "Resize", "Loop", "If", "Split", "Squeeze",
       "Unsqueeze", "Cast", "Softmax", "Conv", "TopK", "NonZero", "Einsum"]
DTYPES = {"tensor(float)": np.float32, "tensor(int64)": np.int64, "tensor(int32)": np.int32,
          "tensor(bool)": np.bool_}


def _mutate_bytes(data: bytes, rng: np.random.Generator) -> bytes:
    b = bytearray(data)
    for _ in range(rng.integers(1, 8)):
        pos = int(rng.integers(0, len(b)))
        kind = rng.integers(0, 3)
        if kind == 0:
            b[pos] = int(rng.integers(0, 256))
        elif kind == 1:
            del b[pos:pos + int(rng.integers(1, 16))]
        else:
            b[pos:pos] = rng.integers(0, 256, int(rng.integers(1, 8))).astype(np.uint8).tobytes()
    return bytes(b)


def _mutate_fields(m: onnx.ModelProto, rng: np.random.Generator) -> None:
    g = m.graph
    nodes, inits = list(g.node), list(g.initializer)
    kind = int(rng.integers(0, 9))
    if kind == 0 and inits:
        t = inits[rng.integers(len(inits))]
        if t.dims:
            t.dims[rng.integers(len(t.dims))] = int(rng.choice([0, -1, 1, 3, 1 << 20, 1 << 40]))
    elif kind == 1 and inits:
        inits[rng.integers(len(inits))].data_type = int(rng.integers(0, 27))
    elif kind == 2 and nodes:
        nodes[rng.integers(len(nodes))].op_type = str(rng.choice(OPS))
    elif kind == 3 and nodes:
        n = nodes[rng.integers(len(nodes))]
        if n.input:
            del n.input[rng.integers(len(n.input))]
    elif kind == 4 and nodes:
        for a in nodes[rng.integers(len(nodes))].attribute:
            if a.type == onnx.AttributeProto.INT:
                a.i = int(rng.choice([-5, 0, 7, 1 << 31, -(1 << 40)]))
            elif a.type == onnx.AttributeProto.INTS and len(a.ints):
                a.ints[rng.integers(len(a.ints))] = int(rng.choice([-5, 0, 7, 1 << 31]))
            elif a.type == onnx.AttributeProto.FLOAT:
                a.f = float(rng.choice([np.nan, np.inf, -1.0, 0.0]))
    elif kind == 5 and inits:
        t = inits[rng.integers(len(inits))]
        if t.raw_data:
            t.raw_data = t.raw_data[:rng.integers(0, len(t.raw_data))]
    elif kind == 6:
        m.opset_import[0].version = int(rng.choice([1, 5, 9, 30, -1, 1000]))
    elif kind == 7 and nodes:
        n = nodes[rng.integers(len(nodes))]
        names = [x for node in nodes for x in node.output] + [i.name for i in g.input]
        if n.input:
            n.input[rng.integers(len(n.input))] = str(rng.choice(names))
    elif kind == 8:
        for vi in g.input:
            dims = vi.type.tensor_type.shape.dim
            if dims:
                dims[rng.integers(len(dims))].dim_value = int(rng.choice([0, 1, 5, 1 << 30]))


def _try(model_bytes: bytes) -> str:
    """Create a session and run it on generated inputs: "ok" or the expected error's name."""
    try:
        sess = onnxrun.InferenceSession(model_bytes)
        feeds = {}
        for arg in sess.get_inputs():
            shape = [d if isinstance(d, int) and 0 <= d < 64 else 2 for d in arg.shape]
            feeds[arg.name] = np.ones(shape, DTYPES.get(arg.type, np.float32))
        sess.run(None, feeds)
        return "ok"
    except EXPECTED as e:
        return type(e).__name__


@pytest.mark.parametrize("name", NAMES)
def test_byte_level_mutations_are_refused_cleanly(name):
    data = (MODELS / f"{name}.onnx").read_bytes()
    rng = np.random.default_rng(1)
    outcomes = {_try(_mutate_bytes(data, rng)) for _ in range(60)}
    assert "InvalidProtobuf" in outcomes


@pytest.mark.parametrize("name", NAMES)
def test_field_level_mutations_are_refused_cleanly(name):
    base = onnx.load(MODELS / f"{name}.onnx")
    rng = np.random.default_rng(2)
    outcomes = set()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # numpy on deliberately odd values
        for _ in range(80):
            m = copy.deepcopy(base)
            for _ in range(rng.integers(1, 3)):
                _mutate_fields(m, rng)
            outcomes.add(_try(m.SerializeToString()))
    assert "InvalidGraph" in outcomes


def test_a_string_field_that_is_not_utf8_is_invalid_protobuf():
    m = onnx.load(MODELS / "if_model.onnx")
    m.doc_string = "marker-doc"
    data = m.SerializeToString().replace(b"marker-doc", b"marker\xb1doc")
    with pytest.raises(errors.InvalidProtobuf):
        onnxrun.InferenceSession(data)
