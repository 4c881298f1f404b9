"""The validation cache (validate_cache.py over disk_cache.py): a model file accepted once is
accepted by a later session without onnx's checker, shape inference or schema registry, with
the same inferred types; weights are not part of the key; an entry that is damaged, planted
or tagged by another secret is refused (the full validation runs, so a model the checker
refuses stays refused); a model built in memory writes no entry."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import onnxrun
from onnxrun import disk_cache, validate_cache
from onnxrun.errors import InvalidGraph
from onnxrun.ir.serde import model_from_proto
from onnxrun.validate import validate


@pytest.fixture
def folder(tmp_path, monkeypatch):
    path = tmp_path / "cache"
    monkeypatch.setenv("ONNXRUN_KERNEL_CACHE", str(path))
    monkeypatch.setattr(disk_cache, "_refused", set())
    return path


@pytest.fixture
def checks(monkeypatch):
    """Calls of onnx's checker and shape inference (what a cache hit skips)."""
    seen = []
    real_check, real_infer = onnx.checker.check_model, onnx.shape_inference.infer_shapes

    def check(*args, **kwargs):
        seen.append("check")
        return real_check(*args, **kwargs)

    def infer(*args, **kwargs):
        seen.append("infer")
        return real_infer(*args, **kwargs)

    monkeypatch.setattr(onnx.checker, "check_model", check)
    monkeypatch.setattr(onnx.shape_inference, "infer_shapes", infer)
    return seen


def _model(weight: float = 0.5, bad: bool = False) -> onnx.ModelProto:
    """x (?, 4) @ W (4, 3) -> Reshape to (-1,) -> Relu; ``bad``: Relu given an attribute its
    schema does not have (the checker refuses it; onnxrun's kernels would ignore it)."""
    w = helper.make_tensor("W", TensorProto.FLOAT, [4, 3], [weight] * 12)
    shape = helper.make_tensor("shape", TensorProto.INT64, [1], [-1])
    relu = helper.make_node("Relu", ["r"], ["y"], **({"alpha": 1.0} if bad else {}))
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["m"]),
         helper.make_node("Reshape", ["m", "shape"], ["r"]), relu],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w, shape])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _save(mp: onnx.ModelProto, path) -> str:
    onnx.save(mp, str(path))
    return str(path)


def _entries(folder) -> list:
    return sorted(folder.glob("*.validation")) if folder.exists() else []


def _session(path: str):
    return onnxrun.InferenceSession(path, providers=["CPUExecutionProvider"])


def test_second_session_skips_onnx_with_the_same_types(folder, checks, tmp_path):
    path = _save(_model(), tmp_path / "m.onnx")
    first = _session(path)
    assert "check" in checks and "infer" in checks
    assert len(_entries(folder)) == 1
    checks.clear()
    second = _session(path)
    assert checks == []
    # the inferred output shape (n * 3,) came from the entry: the declared output has none
    assert [o.shape for o in second.get_outputs()] == [o.shape for o in first.get_outputs()]
    assert second.get_outputs()[0].shape != []
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    np.testing.assert_array_equal(second.run(None, {"x": x})[0], first.run(None, {"x": x})[0])


def test_other_weights_share_the_entry_other_structure_does_not(folder, checks, tmp_path):
    _session(_save(_model(0.5), tmp_path / "a.onnx"))
    checks.clear()
    _session(_save(_model(-2.0), tmp_path / "b.onnx"))
    assert checks == []  # the key leaves the weights out
    other = _model()
    other.graph.node[2].op_type = "Sigmoid"
    _session(_save(other, tmp_path / "c.onnx"))
    assert "check" in checks
    assert len(_entries(folder)) == 2


def test_a_model_built_in_memory_writes_no_entry(folder):
    onnxrun.InferenceSession(_model().SerializeToString(), providers=["CPUExecutionProvider"])
    assert _entries(folder) == []


def test_refused_models_are_not_stored(folder, tmp_path):
    path = _save(_model(bad=True), tmp_path / "bad.onnx")
    for _ in range(2):
        with pytest.raises(InvalidGraph, match="model failed validation"):
            _session(path)
    assert _entries(folder) == []


def _planted_acceptance(folder, tmp_path) -> tuple[str, object, bytes]:
    """The bad model's file, and an entry claiming it was accepted, tagged with this cache's
    own secret (an entry as only onnxrun itself could write: the planted variants below change
    it); returns the path, the entry's file and its payload."""
    _session(_save(_model(), tmp_path / "good.onnx"))  # the folder and its secret
    path = _save(_model(bad=True), tmp_path / "bad.onnx")
    mp = onnx.load(path)
    captured = []
    real_key = validate_cache.key

    def spy(data, infer_shapes):
        captured.append(k := real_key(data, infer_shapes))
        return k

    validate_cache.key = spy
    try:
        with pytest.raises(InvalidGraph):
            validate(mp, model_from_proto(mp), has_kernel=lambda op, v: True, cache=True)
    finally:
        validate_cache.key = real_key
    (key,) = captured
    payload = json.dumps({"key": key, "hidden": [], "types": None}).encode()
    disk_cache.write(f"{key}.validation", validate_cache._MAGIC, key, payload)
    return path, folder / f"{key}.validation", payload


def test_the_tag_is_the_guard(folder, tmp_path):
    """An entry under the bad model's key with this cache's own tag is believed: only the tag
    (the secret) keeps a planted acceptance out, as the next test checks."""
    path, _, _ = _planted_acceptance(folder, tmp_path)
    _session(path)


@pytest.mark.parametrize("how", ["another secret", "flipped bit", "no tag", "truncated"])
def test_planted_or_damaged_entry_is_refused_and_the_model_checked(folder, tmp_path, how):
    path, entry, payload = _planted_acceptance(folder, tmp_path)
    data = entry.read_bytes()
    magic = validate_cache._MAGIC
    if how == "another secret":
        data = magic + disk_cache.tag(os.urandom(32), magic, entry.stem, payload) + b"\n" + payload
    elif how == "flipped bit":
        data = data[:-5] + bytes([data[-5] ^ 1]) + data[-4:]
    elif how == "no tag":
        data = payload
    else:
        data = data[: len(data) // 2]
    entry.write_bytes(data)
    with pytest.raises(InvalidGraph, match="model failed validation"):
        _session(path)
    assert not entry.exists()  # deleted


def test_hidden_operators_are_rechecked_against_the_providers(folder, tmp_path):
    """An entry of a model whose operator onnx does not know (hidden from the checker because
    a provider runs it) is used only while a provider still runs it."""
    mp = _model()
    mp.graph.node[2].op_type = "SimplifiedLayerNormalization"  # onnxruntime's ai.onnx op
    del mp.graph.node[2].attribute[:]
    path = _save(mp, tmp_path / "hidden.onnx")
    _session(path)
    (entry,) = _entries(folder)
    assert json.loads(entry.read_bytes().split(b"\n", 2)[2])["hidden"] == [
        "SimplifiedLayerNormalization"]
    loaded = onnx.load(path)
    with pytest.raises(InvalidGraph, match="SimplifiedLayerNormalization"):
        validate(loaded, model_from_proto(loaded), has_kernel=lambda op, v: False, cache=True)
    validate(loaded, model_from_proto(loaded), has_kernel=lambda op, v: True, cache=True)


def test_cache_switched_off_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("ONNXRUN_KERNEL_CACHE", "0")
    _session(_save(_model(), tmp_path / "m.onnx"))
    assert not any(tmp_path.rglob("*.validation"))


_CHILD = """
import sys, onnx, onnxrun
calls = []
real = onnx.checker.check_model
onnx.checker.check_model = lambda *a, **k: (calls.append(1), real(*a, **k))[1]
onnxrun.InferenceSession(sys.argv[1], providers=["CPUExecutionProvider"])
print(len(calls))
"""


def test_a_later_process_skips_the_checker(tmp_path):
    env = dict(os.environ, ONNXRUN_KERNEL_CACHE=str(tmp_path / "cache"))
    path = _save(_model(), tmp_path / "m.onnx")
    runs = [subprocess.run([sys.executable, "-c", _CHILD, path], capture_output=True, text=True,
                           check=True, env=env).stdout.strip() for _ in range(2)]
    assert runs == ["1", "0"]


@pytest.mark.parametrize("payload", [b"not json", b'{"key": "another"}',
                                     b'{"key": "%s", "hidden": [], "types": "!!"}'])
def test_verified_but_unreadable_entry_is_dropped(folder, checks, tmp_path, payload):
    """An entry whose tag verifies but whose contents do not parse (another onnxrun's format)
    is deleted and the model validated afresh, its result stored again."""
    path = _save(_model(), tmp_path / "m.onnx")
    first = _session(path)
    (entry,) = _entries(folder)
    key = entry.stem
    disk_cache.write(entry.name, validate_cache._MAGIC, key, payload.replace(b"%s", key.encode()))
    checks.clear()
    again = _session(path)
    assert "check" in checks
    assert [o.shape for o in again.get_outputs()] == [o.shape for o in first.get_outputs()]
    assert b'"hidden"' in entry.read_bytes()  # rewritten by the full validation
