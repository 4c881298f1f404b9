"""``onnxrun bench`` and the benchmark suite's plumbing: functional checks only, no timings."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np
import onnx
import onnx.parser
import pytest

import onnxrun
from onnxrun.tools import bench
from onnxrun.tools.cli import main

ROOT = Path(__file__).resolve().parent.parent

MODEL_TEXT = """
<ir_version: 8, opset_import: ["" : 17]>
main (float[batch, 8] X) => (float[batch, 4] Y)
<float[8, 4] W = {1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0,
                  1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0}>
{
    T = MatMul(X, W)
    U = Relu(T)
    Y = Sigmoid(U)
}
"""


@pytest.fixture(scope="module")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("bench") / "tiny.onnx"
    onnx.save(onnx.parser.parse_model(MODEL_TEXT), path)
    return path


def run_cli(capsys: pytest.CaptureFixture, *args: str) -> tuple[int, str, str]:
    code = main(["bench", *args])
    out, err = capsys.readouterr()
    return code, out, err


def table_row(out: str, first_cell: str) -> list[str]:
    rows = [ln.split() for ln in out.splitlines() if ln.strip().startswith(first_cell)]
    assert rows, f"no row starting with {first_cell!r} in:\n{out}"
    return rows[0]


def test_bench_prints_its_table(model_path: Path, capsys: pytest.CaptureFixture) -> None:
    code, out, err = run_cli(capsys, str(model_path), "-r", "3", "--dim", "batch=2")
    assert code == 0, err
    assert "X: float32 [2, 8] (random)" in out
    assert "1 warm-up + 3 runs per engine" in out
    header = table_row(out, "engine")
    for column in ("runs", "median", "p90", "min", "mean", "runs/s", "create", "peak"):
        assert column in header
    row = table_row(out, "onnxrun")
    assert row[2] == "3"  # runs
    assert "fresh child process" in out  # creation and memory from the child processes
    assert "MiB" in " ".join(row)


def test_bench_options_no_isolate_duration(model_path: Path,
                                          capsys: pytest.CaptureFixture) -> None:
    code, out, err = run_cli(capsys, str(model_path), "-m", "0.05", "-w", "0", "-x", "1", "-y",
                             "1", "-P", "-o", "basic", "--no-isolate")
    assert code == 0, err
    assert "as many runs as fit in 0.05 s" in out
    assert "optimization level 1 (basic)" in out
    assert "parallel execution" in out and "inter-op threads 1" in out
    assert "peak RSS" not in out and "create" in out
    assert int(table_row(out, "onnxrun")[2]) >= 1


def test_bench_vs_onnxruntime_and_profile(model_path: Path, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture) -> None:
    pytest.importorskip("onnxruntime")
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(capsys, str(model_path), "-r", "3", "--vs", "onnxruntime",
                             "--profile", "--top", "2", "--no-isolate")
    assert code == 0, err
    assert "engines run alternately" in out
    assert table_row(out, "onnxruntime")[2] == "3"
    ratio = table_row(out, "onnxrun / onnxruntime")
    assert all(cell.endswith("x") for cell in ratio[3:])
    assert "max |onnxrun - onnxruntime| = " in out
    for engine in ("onnxrun", "onnxruntime"):
        assert f"profile of {engine}: 3 profiled runs after warm-up" in out
        assert list(tmp_path.glob(f"onnxrun_bench_profile_{engine}_*.json"))
    # Which operator is slowest depends on timing: check the tables' shape, never their order.
    sections = out.split("top operators by total time:")[1:]
    assert len(sections) == 2
    for section in sections:
        ops_table, nodes_table = section.split("top nodes by total time:")
        ops = [ln.split()[0] for ln in ops_table.splitlines()[2:] if ln.strip()]
        nodes = [ln.split()[1] for ln in nodes_table.splitlines()[2:] if ln.startswith("    ")]
        for shown in (ops, nodes):  # --top 2 of the three operators, each once
            assert len(shown) == 2 and len(set(shown)) == 2, section
            assert set(shown) <= {"MatMul", "Relu", "Sigmoid"}, section


def test_bench_vs_without_onnxruntime(model_path: Path, monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture) -> None:
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # makes the import fail
    code, _, err = run_cli(capsys, str(model_path), "-r", "3", "--vs", "onnxruntime")
    assert code == 1
    assert "needs the onnxruntime package" in err and "pip install onnxruntime" in err


def test_bench_notes_inter_op_threads_without_parallel(model_path: Path,
                                                      capsys: pytest.CaptureFixture) -> None:
    code, out, err = run_cli(capsys, str(model_path), "-r", "3", "-y", "2", "--no-isolate")
    assert code == 0, err
    assert "matters only with -P" in out


def test_bench_errors(model_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    code, _, err = run_cli(capsys, str(model_path), "-o", "fastest")
    assert code == 1 and "-o fastest" in err
    code, _, err = run_cli(capsys, str(tmp_path / "missing.onnx"))
    assert code == 1 and "does not exist" in err
    code, _, err = run_cli(capsys, str(model_path), "--input", "nope=x.npy")
    assert code == 1 and "no input of that name" in err


def test_bench_reads_input_files(model_path: Path, tmp_path: Path,
                                 capsys: pytest.CaptureFixture) -> None:
    x = tmp_path / "x.npy"
    np.save(x, np.ones((5, 8), dtype=np.float32))
    code, out, err = run_cli(capsys, str(model_path), "-r", "3", "-i", f"X={x}", "--no-isolate")
    assert code == 0, err
    assert f"X: float32 [5, 8] (from {x})" in out


def test_alternating_order() -> None:
    calls: list[str] = []
    runners = [lambda: calls.append("a") or 1, lambda: calls.append("b") or 2]
    times, first = bench.time_alternating(runners, warmup=1, repeat=3)
    assert calls == ["a", "b", "a", "b", "b", "a", "a", "b"]
    assert [len(t) for t in times] == [3, 3] and first == [1, 2]


def test_alternating_settle_warms_again_untimed(monkeypatch: pytest.MonkeyPatch) -> None:
    # with a pause before each switch of runner, the runner switched to runs once untimed
    # after it: a timed run never follows the idle pause (a cold run: caches, asleep workers)
    calls: list[str] = []
    monkeypatch.setattr(bench.time, "sleep", lambda s: calls.append("pause"))
    runners = [lambda: calls.append("a") or 1, lambda: calls.append("b") or 2]
    times, _ = bench.time_alternating(runners, warmup=1, repeat=3, settle=0.15)
    assert calls == ["a", "b",  # warm-up
                     "a", "pause", "b", "b",  # round 1: A B
                     "b", "pause", "a", "a",  # round 2: B A
                     "a", "pause", "b", "b"]  # round 3: A B
    assert [len(t) for t in times] == [3, 3]


def test_summarize_trace_skips_warmup(tmp_path: Path) -> None:
    def node(name: str, op: str, ts: int, dur: int) -> dict:
        return {"cat": "Node", "name": f"{name}_kernel_time", "ts": ts, "dur": dur,
                "args": {"op_name": op}}

    events = [
        {"cat": "Session", "name": "model_run", "ts": 0, "dur": 100},
        node("a", "Conv", 1, 90), node("b", "Relu", 95, 5),
        {"cat": "Session", "name": "model_run", "ts": 200, "dur": 30},
        node("a", "Conv", 201, 20), node("b", "Relu", 222, 5),
        {"cat": "Node", "name": "a_fence_before", "ts": 201, "dur": 1},
        {"cat": "Session", "name": "model_run", "ts": 300, "dur": 30},
        node("a", "Conv", 301, 20), node("b", "Relu", 322, 5),
    ]
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(events))
    p = bench.summarize_trace(str(path), skip_runs=1, top=5)
    assert p.runs == 2 and p.total_us == 50
    assert p.by_op == [("Conv", 2, 40.0), ("Relu", 2, 10.0)]
    assert p.by_node[0] == ("a", "Conv", 2, 40.0)


def test_threadpoolctl_is_a_dependency() -> None:
    # intra_op_num_threads holds only through threadpoolctl: it must come with onnxrun.
    from importlib.metadata import requires

    assert any(re.match(r"threadpoolctl\b", r) and "extra ==" not in r
               for r in requires("onnxrun") or [])


def test_intra_op_threads_limit_blas_during_runs(model_path: Path) -> None:
    import threadpoolctl

    def blas_threads() -> list[int]:
        return [i["num_threads"] for i in threadpoolctl.threadpool_info()
                if i["user_api"] == "blas"]

    if not blas_threads():
        pytest.skip("no BLAS library found by threadpoolctl")
    so = onnxrun.SessionOptions()
    so.intra_op_num_threads = 1
    sess = onnxrun.InferenceSession(str(model_path), so)
    seen: list[list[int]] = []
    program_run = sess._program.run

    def spy(*args, **kwargs):
        seen.append(blas_threads())
        return program_run(*args, **kwargs)

    sess._program.run = spy
    # The host's own setting (3, not any library's default) is what comes back after the run.
    with threadpoolctl.threadpool_limits(3, user_api="blas"):
        host = blas_threads()
        assert set(host) == {3}
        sess.run(None, {"X": np.ones((2, 8), dtype=np.float32)})
        assert seen == [[1] * len(host)]
        assert blas_threads() == host  # restored after the run


def test_suite_writes_between_markers(tmp_path: Path) -> None:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import run_suite
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    doc = tmp_path / "PERFORMANCE.md"
    doc.write_text(f"# P\n\nintro\n\n{run_suite.BEGIN}\nold\n{run_suite.END}\n\nafter\n")
    run_suite.write_doc(doc, "new table")
    assert doc.read_text() == (f"# P\n\nintro\n\n{run_suite.BEGIN}\nnew table\n{run_suite.END}"
                               "\n\nafter\n")
    chain = run_suite.chain_model(tmp_path / "chain.onnx", n=10)
    sess = onnxrun.InferenceSession(chain.model)
    x = np.full((1, 16), 3.0, dtype=np.float32)
    y = x.copy()
    for i in range(10):
        y = y + x if i % 2 == 0 else y * 0.5
    np.testing.assert_allclose(sess.run(None, {"X": x})[0], y, rtol=1e-6)


def test_suite_dry_run_on_the_micro_benchmark(tmp_path: Path,
                                              capsys: pytest.CaptureFixture) -> None:
    pytest.importorskip("onnxruntime")
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import run_suite
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    code = run_suite.main(["--models", "chain", "-r", "2", "--threads", "1", "--dry-run",
                           "--cache", str(tmp_path), "--json", str(tmp_path / "r.json")])
    out, _ = capsys.readouterr()
    assert code == 0
    assert "chain of 1000 elementwise nodes (1x16 floats, 1 thread): onnxrun " in out
    assert "per node" in out and "| **geometric mean** |" in out
    assert "Not run (not generated" in out  # the empty cache folder
    assert json.loads((tmp_path / "r.json").read_text())[0]["threads"] == 1


def test_run_overhead_replays_kernels_but_keeps_control_flow() -> None:
    pytest.importorskip("onnxruntime")
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import run_overhead
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    model, feeds = run_overhead.load_vad()
    with run_overhead.replaying():
        fixed = onnxrun.InferenceSession(model)
    plain = onnxrun.InferenceSession(model)
    replays = [s.kernel for s in fixed._program.steps if isinstance(s.kernel,
                                                                   run_overhead.Replay)]
    kept = [s.kernel for s in fixed._program.steps if s.node.op_type == "If"]
    assert replays and kept and not isinstance(kept[0], run_overhead.Replay)
    first = fixed.run(None, feeds)
    for got, want in zip(first, plain.run(None, feeds), strict=True):
        np.testing.assert_array_equal(got, want)
    # the second run replays: other inputs give the first run's results
    other = {**feeds, "input": feeds["input"] * 2}
    assert np.array_equal(fixed.run(None, other)[0], first[0])
    assert not np.array_equal(plain.run(None, other)[0], first[0])
    m = run_overhead.measure(model, feeds, runs=3)
    assert set(m) >= {"onnxruntime", "onnxrun", "onnxrun fixed cost", "onnxrun cpu"}
