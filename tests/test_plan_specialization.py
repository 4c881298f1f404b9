"""Plans specialized per input-shape signature (onnxrun/specialize.py): the shape steps leave the
plan on a repeated signature, outputs stay those of an unspecialized session and onnxruntime, and
a shape that only looks input-determined is caught."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from concurrency import run_on_threads
from onnx import TensorProto, helper

import onnxrun
from onnxrun.specialize import MAX_SIGNATURES

MODELS = Path(__file__).parent / "models"


def _session(path, specialize: bool = True, level=None) -> onnxrun.InferenceSession:
    so = onnxrun.SessionOptions()
    if level is not None:
        so.graph_optimization_level = level
    if not specialize:
        so.add_session_config_entry("onnxrun.shape_specialization", "0")
    return onnxrun.InferenceSession(str(path), so)


def _feeds(name: str) -> list[dict[str, np.ndarray]]:
    data = np.load(MODELS / f"{name}.inputs.npz")
    groups: dict[str, dict[str, np.ndarray]] = {}
    for key, value in data.items():
        group, input_name = key.split("/", 1)
        groups.setdefault(group, {})[input_name] = value
    return [groups[k] for k in sorted(groups)]


@pytest.mark.parametrize("name", ["bert_tiny", "gpt_tiny", "lstm_model"])
def test_repeated_signatures_run_a_shorter_plan_with_the_same_outputs(name):
    path = MODELS / f"{name}.onnx"
    sess = _session(path)
    plain = _session(path, specialize=False)
    oracle = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    spec = sess._program.specializer
    assert spec is not None and spec.frontier, "the model computes from its input shapes"
    a, b = _feeds(name)
    for feeds in [a, a, a, b, b, a, b]:
        got = sess.run(None, feeds)
        want = plain.run(None, feeds)
        ref = oracle.run(None, feeds)
        for g, w, r in zip(got, want, ref, strict=True):
            np.testing.assert_array_equal(g, w)
            np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-5)
    assert len(spec._cache) == 2  # one specialization per signature
    full = sess._program.full_plan
    for plan, known in (entry for entry in spec._cache.values() if entry):
        assert len(plan.steps) < len(full.steps)
        assert {s for s, _ in known} == set(spec.frontier)
        shape_nodes = {step.node.op_type for step in plan.steps} & {"Shape", "Size"}
        assert not shape_nodes


def test_a_signature_seen_once_is_not_specialized_and_the_cache_is_bounded():
    path = MODELS / "gpt_tiny.onnx"
    sess = _session(path)
    spec = sess._program.specializer
    rng = np.random.default_rng(0)
    sess.run(None, {"input_ids": rng.integers(0, 50, (1, 5))})
    assert not spec._cache
    for length in range(1, MAX_SIGNATURES + 4):
        ids = rng.integers(0, 50, (1, length))
        sess.run(None, {"input_ids": ids})
        sess.run(None, {"input_ids": ids})
    assert len(spec._cache) == MAX_SIGNATURES
    # the newest signatures stayed
    assert ((1, MAX_SIGNATURES + 3),) in {k[0] for k in spec._cache}


@pytest.mark.parametrize("how", ["config", "level"])
def test_it_can_be_turned_off(how):
    path = MODELS / "gpt_tiny.onnx"
    if how == "config":
        sess = _session(path, specialize=False)
    else:
        sess = _session(path, level=onnxrun.GraphOptimizationLevel.ORT_DISABLE_ALL)
    assert sess._program.specializer is None


def _lying_model() -> onnx.ModelProto:
    """Y = X + Size(NonZero(X)) where the file claims NonZero's output is [1, 'n'] ('n' being
    X's dimension): its size depends on X's values, not only on X's shape."""
    nodes = [
        helper.make_node("NonZero", ["X"], ["nz"]),
        helper.make_node("Size", ["nz"], ["count"]),
        helper.make_node("Cast", ["count"], ["countf"], to=TensorProto.FLOAT),
        helper.make_node("Add", ["X", "countf"], ["Y"]),
    ]
    graph = helper.make_graph(
        nodes, "lying",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["n"])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["n"])],
        value_info=[helper.make_tensor_value_info("nz", TensorProto.INT64, [1, "n"])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_a_data_dependent_shape_labelled_as_input_determined_is_never_cached():
    sess = onnxrun.InferenceSession(_lying_model().SerializeToString())
    spec = sess._program.specializer
    xs = [np.array([0, 1, 2, 0], np.float32), np.array([1, 1, 1, 1], np.float32),
          np.array([0, 0, 0, 5], np.float32), np.array([3, 0, 0, 5], np.float32)]
    for x in xs * 2:
        (y,) = sess.run(None, {"X": x})
        np.testing.assert_array_equal(y, x + np.count_nonzero(x))
    # Size(nz) was taken for a shape step (the file's type says so) and the check caught it
    assert spec is not None and spec.frontier
    assert list(spec._cache.values()) == [None]


def test_a_shape_output_is_the_callers_own():
    nodes = [helper.make_node("Shape", ["X"], ["S"]),
             helper.make_node("Mul", ["S", "two"], ["S2"]),
             helper.make_node("Identity", ["S2"], ["T"]),
             helper.make_node("Expand", ["one", "S2"], ["E"]),
             helper.make_node("Add", ["E", "E"], ["Y"])]
    graph = helper.make_graph(
        nodes, "shape_out",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["a", "b"])],
        [helper.make_tensor_value_info("T", TensorProto.INT64, [2]),
         helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)],
        [helper.make_tensor("two", TensorProto.INT64, [], [2]),
         helper.make_tensor("one", TensorProto.FLOAT, [], [1.0])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    sess = onnxrun.InferenceSession(model.SerializeToString())
    x = np.zeros((2, 3), np.float32)
    for _ in range(4):
        t, y = sess.run(None, {"X": x})
        np.testing.assert_array_equal(t, [4, 6])
        np.testing.assert_array_equal(y, np.full((4, 6), 2.0, np.float32))
        t[:] = 0  # the caller's to keep or change
        y[:] = 0
    assert sess._program.specializer is not None and any(sess._program.specializer._cache.values())


def test_runs_from_several_threads_with_alternating_shapes():
    path = MODELS / "gpt_tiny.onnx"
    sess = _session(path)
    plain = _session(path, specialize=False)
    rng = np.random.default_rng(1)
    inputs = [rng.integers(0, 50, (b, n)) for b, n in [(1, 4), (2, 7), (1, 9)]]
    expected = [plain.run(None, {"input_ids": x})[0] for x in inputs]

    def worker(k: int) -> None:
        for i in range(12):
            j = (i + k) % len(inputs)
            (got,) = sess.run(None, {"input_ids": inputs[j]})
            np.testing.assert_array_equal(got, expected[j])

    run_on_threads(worker, 4)
