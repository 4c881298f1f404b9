"""Real exported models (tests/models/, see its README) run on onnxrun and onnxruntime.

Each model ships with ``<name>.inputs.npz`` holding several input cases (keys
``"<case>/<input>"``) that differ in batch/sequence size, so one session must handle
several shapes along its dynamic axes. Needs neither torch nor a random generator.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pytest
from concurrency import run_on_threads

import onnxrun

ort = pytest.importorskip("onnxruntime")

MODELS_DIR = Path(__file__).parent / "models"
MODEL_NAMES = ["bert_tiny", "gpt_tiny", "mobilenet_tiny", "lstm_model", "gru_model", "if_model"]
RTOL, ATOL = 1e-3, 1e-4


def model_path(name: str) -> Path:
    path = MODELS_DIR / f"{name}.onnx"
    if not path.exists():
        pytest.skip(f"{path.name} is absent: run `python scripts/generate_models.py` (needs torch)")
    return path


@functools.cache
def load_cases(name: str) -> list[dict[str, np.ndarray]]:
    path = MODELS_DIR / f"{name}.inputs.npz"
    if not path.exists():
        return []
    cases: dict[int, dict[str, np.ndarray]] = {}
    with np.load(path) as data:
        for key in data.files:
            case, _, input_name = key.partition("/")
            cases.setdefault(int(case), {})[input_name] = data[key]
    return [cases[i] for i in sorted(cases)]


@functools.cache
def onnxrun_session(name: str) -> onnxrun.InferenceSession:
    return onnxrun.InferenceSession(str(MODELS_DIR / f"{name}.onnx"))


@functools.cache
def ort_session(name: str):
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    return ort.InferenceSession(str(MODELS_DIR / f"{name}.onnx"), opts,
                                providers=["CPUExecutionProvider"])


def cases_of(name: str) -> list[dict[str, np.ndarray]]:
    model_path(name)
    cases = load_cases(name)
    if not cases:
        pytest.skip(f"{name}.inputs.npz is absent: run `python scripts/generate_models.py`")
    return cases


def assert_outputs_match(name: str, got: list, expected: list, output_names: list[str]) -> None:
    assert len(got) == len(expected)
    for out_name, g, e in zip(output_names, got, expected, strict=True):
        where = f"{name}: output '{out_name}'"
        assert isinstance(g, np.ndarray), f"{where} is {type(g).__name__}, not an ndarray"
        assert g.dtype == e.dtype, f"{where} dtype {g.dtype} != onnxruntime's {e.dtype}"
        assert g.shape == e.shape, f"{where} shape {g.shape} != onnxruntime's {e.shape}"
        err = float(np.max(np.abs(g.astype(np.float64) - e))) if e.size else 0.0
        np.testing.assert_allclose(g, e, rtol=RTOL, atol=ATOL,
                                   err_msg=f"{where}: max abs diff {err:.3g}")


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_io_metadata_matches_onnxruntime(name: str) -> None:
    model_path(name)
    ours, theirs = onnxrun_session(name), ort_session(name)
    for mine, ref in [(ours.get_inputs(), theirs.get_inputs()),
                      (ours.get_outputs(), theirs.get_outputs())]:
        assert [a.name for a in mine] == [a.name for a in ref]
        assert [a.type for a in mine] == [a.type for a in ref]
        assert [list(a.shape) for a in mine] == [list(a.shape) for a in ref]


@pytest.mark.parametrize("case", [0, 1])
@pytest.mark.parametrize("name", MODEL_NAMES)
def test_model_matches_onnxruntime(name: str, case: int) -> None:
    cases = cases_of(name)
    if case >= len(cases):
        pytest.skip(f"{name} has {len(cases)} input case(s)")
    feeds = cases[case]
    sess = onnxrun_session(name)
    output_names = [o.name for o in ort_session(name).get_outputs()]
    expected = ort_session(name).run(None, feeds)
    got = sess.run(None, feeds)
    assert_outputs_match(name, got, expected, output_names)


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_all_cases_on_one_session(name: str) -> None:
    """Every case (and the first again) through one session: shapes change between runs."""
    cases = cases_of(name)
    sess = onnxrun.InferenceSession(str(model_path(name)))
    output_names = [o.name for o in sess.get_outputs()]
    for feeds in [*cases, cases[0]]:
        expected = ort_session(name).run(None, feeds)
        assert_outputs_match(name, sess.run(None, feeds), expected, output_names)


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_fetch_subset_of_outputs(name: str) -> None:
    """Outputs asked by name, last first; the session plans only what they need."""
    feeds = cases_of(name)[0]
    sess = onnxrun_session(name)
    wanted = [o.name for o in sess.get_outputs()][::-1][:2]
    expected = ort_session(name).run(wanted, feeds)
    assert_outputs_match(name, sess.run(wanted, feeds), expected, wanted)


@pytest.mark.parametrize("level", ["ORT_DISABLE_ALL", "ORT_ENABLE_BASIC", "ORT_ENABLE_EXTENDED"])
@pytest.mark.parametrize("name", MODEL_NAMES)
def test_optimization_levels_agree(name: str, level: str) -> None:
    """Graph rewrites must not change results: each level against onnxruntime."""
    feeds = cases_of(name)[-1]
    opts = onnxrun.SessionOptions()
    opts.graph_optimization_level = getattr(onnxrun.GraphOptimizationLevel, level)
    sess = onnxrun.InferenceSession(str(model_path(name)), opts)
    output_names = [o.name for o in sess.get_outputs()]
    expected = ort_session(name).run(None, feeds)
    assert_outputs_match(name, sess.run(None, feeds), expected, output_names)


@pytest.mark.parametrize("name", ["bert_tiny", "lstm_model", "if_model"])
def test_concurrent_runs_on_one_session(name: str) -> None:
    """One session, several threads, different shapes at once: runs share nothing mutable."""
    cases = cases_of(name)
    sess = onnxrun.InferenceSession(str(model_path(name)))
    expected = [ort_session(name).run(None, feeds) for feeds in cases]
    results: dict[tuple[int, int], list] = {}

    def worker(t: int) -> None:
        for r in range(4):
            i = (t + r) % len(cases)
            results[t, r] = [i, sess.run(None, cases[i])]

    run_on_threads(worker, 3)
    output_names = [o.name for o in sess.get_outputs()]
    for i, got in results.values():
        assert_outputs_match(name, got, expected[i], output_names)


def test_model_bytes_and_path_agree() -> None:
    """A session built from serialized bytes behaves as one built from the file path."""
    path = model_path("if_model")
    feeds = cases_of("if_model")[0]
    from_bytes = onnxrun.InferenceSession(path.read_bytes()).run(None, feeds)
    from_path = onnxrun_session("if_model").run(None, feeds)
    for a, b in zip(from_bytes, from_path, strict=True):
        np.testing.assert_array_equal(a, b)


def test_if_model_takes_every_branch() -> None:
    """The saved if_model cases cover outer-then, outer-else/inner-else and inner-then."""
    cases = cases_of("if_model")
    sums = [float(c["x"].sum()) for c in cases]
    maxes = [float(c["x"].max()) for c in cases]
    assert any(s > 0 for s in sums)
    assert any(s <= 0 and m > 0 for s, m in zip(sums, maxes, strict=True))
    assert any(m <= 0 for m in maxes)
    for feeds in cases:
        expected = ort_session("if_model").run(None, feeds)
        got = onnxrun_session("if_model").run(None, feeds)
        assert_outputs_match("if_model", got, expected, ["y", "z"])
