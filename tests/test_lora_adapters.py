"""LoRA adapters: the adapter file format (onnxruntime's FlatBuffers schema) written and read by
onnxrun and by onnxruntime, and runs with active adapters."""

from __future__ import annotations

import gc
import os

import numpy as np
import onnx.parser
import pytest
from ml_dtypes import bfloat16

import onnxrun
from onnxrun import (
    AdapterFormat,
    InferenceSession,
    LoraAdapter,
    OrtValue,
    RunOptions,
    adapter_format,
)

ort = pytest.importorskip("onnxruntime")

PARAMS = {
    "p_float": np.arange(10, dtype=np.float32).reshape(5, 2),
    "p_int64": np.arange(10, dtype=np.int64).reshape(2, 5) - 4,
    "p_half": np.linspace(-1, 1, 6, dtype=np.float16).reshape(3, 2),
    "p_bf16": np.array([1.5, -2.0, 3.25], dtype=bfloat16),
    "p_bool": np.array([True, False, True]),
    "p_empty": np.zeros((0, 3), np.float32),
    "p_scalar": np.array(7, np.int8),
}


def _export(module, path, params, adapter_version=3, model_version=5):
    fmt = module.AdapterFormat()
    fmt.set_adapter_version(adapter_version)
    fmt.set_model_version(model_version)
    fmt.set_parameters({k: module.OrtValue.ortvalue_from_numpy(v) for k, v in params.items()})
    fmt.export_adapter(str(path))


def _check(fmt, params):
    assert (fmt.get_adapter_version(), fmt.get_model_version()) == (3, 5)
    got = fmt.get_parameters()
    assert sorted(got) == sorted(params)
    for name, want in params.items():
        value = got[name]
        assert value.is_tensor() and value.shape() == list(want.shape)
        assert value.element_type() == onnxrun.OrtValue.ortvalue_from_numpy(want).element_type()
        np.testing.assert_array_equal(np.asarray(value.numpy(), want.dtype), want)


@pytest.mark.parametrize("writer,reader", [(onnxrun, onnxrun), (onnxrun, ort), (ort, onnxrun)])
def test_adapter_files_are_interchangeable_with_onnxruntime(tmp_path, writer, reader):
    params = dict(PARAMS)
    if writer is ort or reader is ort:
        # onnxruntime's numpy bridge lacks bfloat16 and 0-d arrays; its reader refuses bool
        for name in ("p_bf16", "p_scalar", "p_bool"):
            params.pop(name)
    path = tmp_path / "a.onnx_adapter"
    _export(writer, path, params)
    _check(reader.AdapterFormat.read_adapter(str(path)), params)


def test_read_modify_export_and_keep_alive(tmp_path):
    first, second = tmp_path / "1.onnx_adapter", tmp_path / "2.onnx_adapter"
    _export(onnxrun, first, {"param": np.ones((2, 2), np.float32)})
    fmt = AdapterFormat.read_adapter(str(first))
    fmt.set_parameters({"new": OrtValue.ortvalue_from_numpy(np.full((3, 2), 4, np.float32))})
    fmt.export_adapter(str(second))
    params = AdapterFormat.read_adapter(str(second)).get_parameters()
    assert list(params) == ["new"]
    value = params["new"]
    del params, fmt
    gc.collect()
    np.testing.assert_array_equal(value.numpy(), np.full((3, 2), 4, np.float32))
    assert AdapterFormat().get_format_version() == 1


def test_string_parameters_are_refused_before_writing(tmp_path):
    m = onnx.parser.parse_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    main () => (string[2] S) { S = Constant<value = string[2] {"hello", "world"}>() }
    """)
    value = InferenceSession(m.SerializeToString()).run_with_ort_values(["S"], {})[0]
    fmt = AdapterFormat()
    fmt.set_parameters({"s": value})
    path = tmp_path / "s.onnx_adapter"
    with pytest.raises(onnxrun.InvalidArgument, match="STRING"):
        fmt.export_adapter(str(path))
    assert not path.exists()


def test_malformed_files_are_refused(tmp_path):
    good = tmp_path / "good.onnx_adapter"
    _export(onnxrun, good, {"p": np.ones(4, np.float32)})
    data = good.read_bytes()
    cases = {
        "identifier": data[:4] + b"XXXX" + data[8:],
        "outside": data[:-20],
        "root": b"\xff\xff\x00\x00" + data[4:],
        "empty": b"",
    }
    for name, content in cases.items():
        path = tmp_path / f"{name}.onnx_adapter"
        path.write_bytes(content)
        with pytest.raises(onnxrun.InvalidArgument, match="not a valid onnxruntime adapter"):
            AdapterFormat.read_adapter(str(path))
        with pytest.raises(onnxrun.InvalidArgument):
            LoraAdapter().Load(str(path))
    with pytest.raises(onnxrun.NoSuchFile):
        LoraAdapter().Load(str(tmp_path / "missing.onnx_adapter"))
    # a format version this reader does not know
    adapter = adapter_format.read(data)
    adapter.format_version = 2
    with pytest.raises(onnxrun.InvalidArgument, match="format version 2"):
        adapter_format.read(adapter_format.write(adapter))


LORA_MODEL = onnx.parser.parse_model("""
<ir_version: 8, opset_import: ["" : 17]>
main (float[4, 4] x, float[4, 1] a, float[1, 4] b) => (float[4, 4] y)
<float[4, 4] w = {1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0, 13.0, 14.0,
                  15.0, 16.0},
 float[4, 1] a = {0.0, 0.0, 0.0, 0.0}, float[1, 4] b = {0.0, 0.0, 0.0, 0.0}>
{
    base = MatMul(x, w)
    down = MatMul(x, a)
    up = MatMul(down, b)
    y = Add(base, up)
}
""")


def test_run_with_active_adapters(tmp_path):
    path = tmp_path / "lora.onnx_adapter"
    a = np.array([[3.0], [4.0], [5.0], [6.0]], np.float32)
    b = np.array([[7.0, 8.0, 9.0, 10.0]], np.float32)
    _export(onnxrun, path, {"a": a, "b": b})
    x = np.ones((4, 4), np.float32)
    data = LORA_MODEL.SerializeToString()

    ours = LoraAdapter()
    ours.Load(str(path))
    ro = RunOptions()
    ro.add_active_adapter(ours)
    theirs = ort.LoraAdapter()
    theirs.Load(str(path))
    ort_ro = ort.RunOptions()
    ort_ro.add_active_adapter(theirs)

    session, ort_session = InferenceSession(data), ort.InferenceSession(data)
    got = session.run(None, {"x": x}, ro)[0]
    np.testing.assert_array_equal(got, ort_session.run(None, {"x": x}, ort_ro)[0])
    np.testing.assert_array_equal(got, x @ LORA_MODEL_W + (x @ a) @ b)
    # without the adapter: the model's own (zero) parameters
    np.testing.assert_array_equal(session.run(None, {"x": x})[0], x @ LORA_MODEL_W)
    # a name given by the feed and by an active adapter: the adapter's value, as onnxruntime
    a2 = np.full_like(a, 2.0)
    got = session.run(None, {"x": x, "a": a2}, ro)[0]
    np.testing.assert_array_equal(got, ort_session.run(None, {"x": x, "a": a2}, ort_ro)[0])
    np.testing.assert_array_equal(got, x @ LORA_MODEL_W + (x @ a) @ b)
    # two active adapters with the same names: the first activated wins, as onnxruntime
    other_path = path.with_name("other.onnx_adapter")
    _export(onnxrun, other_path, {"a": a2, "b": b})
    other, other_ort = LoraAdapter(), ort.LoraAdapter()
    other.Load(str(other_path))
    other_ort.Load(str(other_path))
    for first, second, first_ort, second_ort, want in [(ours, other, theirs, other_ort, a),
                                                      (other, ours, other_ort, theirs, a2)]:
        ro2, ort_ro2 = RunOptions(), ort.RunOptions()
        ro2.add_active_adapter(first)
        ro2.add_active_adapter(second)
        ort_ro2.add_active_adapter(first_ort)
        ort_ro2.add_active_adapter(second_ort)
        for feed in [{"x": x}, {"x": x, "a": np.full_like(a, 7.0)}]:
            got = session.run(None, feed, ro2)[0]
            np.testing.assert_array_equal(got, ort_session.run(None, feed, ort_ro2)[0])
            np.testing.assert_array_equal(got, x @ LORA_MODEL_W + (x @ want) @ b)
    with pytest.raises(TypeError, match="expects a LoraAdapter"):
        RunOptions().add_active_adapter(str(path))
    assert os.path.exists(path)


LORA_MODEL_W = np.arange(1, 17, dtype=np.float32).reshape(4, 4)


def test_mutated_files_raise_invalid_argument_only():
    import random

    from onnxrun.api.adapters import _values

    params = [adapter_format.parameter_from_array("p", np.arange(10, dtype=np.float32), 1),
              adapter_format.parameter_from_array("q", np.arange(6, dtype=np.int64), 7)]
    good = adapter_format.write(adapter_format.Adapter(1, 1, 1, params))
    rng = random.Random(0)
    for _ in range(2000):
        data = bytearray(good)
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        if rng.random() < 0.2:
            data = data[:rng.randrange(len(data))]
        try:
            _values(adapter_format.read(bytes(data)))
        except onnxrun.InvalidArgument:
            pass
