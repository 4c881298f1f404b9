"""Intra-op threads and BLAS (issue #18): onnxrun's own threads carry the products, BLAS is held
to one thread during runs whatever the sessions' thread counts, runs that overlap from several
threads on sessions with different counts give their serial results, and the host's BLAS
setting comes back after them; products too small to pay a hand-off stay on one thread."""

from __future__ import annotations

import numpy as np
import pytest

from onnxrun.providers.cpu import blas, parallel

threadpoolctl = pytest.importorskip("threadpoolctl")


def blas_threads() -> list[int]:
    return [i["num_threads"] for i in threadpoolctl.threadpool_info() if i["user_api"] == "blas"]


def test_work_ranges_cover_the_items_and_keep_small_work_whole():
    assert parallel.work_ranges(100, 2, 10, least=10_000) == [(0, 100)]  # 1000 < 2 ranges
    assert parallel.work_ranges(100, 1, 10**9) == [(0, 100)]
    assert parallel.work_ranges(1, 4, 10**9) == [(0, 1)]
    r = parallel.work_ranges(100, 2, 1000, least=30_000)  # worth 3 ranges
    assert len(r) == 3
    r = parallel.work_ranges(1000, 2, 10**6, least=1, per_thread=4)
    assert len(r) == 8 and r[0][0] == 0 and r[-1][1] == 1000
    assert all(a[1] == b[0] for a, b in zip(r, r[1:], strict=False))


@pytest.mark.parametrize(("a_shape", "b_shape"), [
    ((300, 70), (70, 40)),  # rows
    ((30, 70), (70, 400)),  # columns
    ((3, 90, 33), (33, 50)),  # a stack times one matrix
    ((2, 1, 40, 33), (5, 33, 60)),  # broadcast batch
])
@pytest.mark.parametrize("threads", [2, 3])
def test_split_matmul_gives_the_uncut_product(monkeypatch, a_shape, b_shape, threads):
    """Every range a product of its own: OpenBLAS's order of summation depends on the sizes,
    so the last bits may move (as with its own threads), nothing more."""
    monkeypatch.setattr(parallel, "MIN_MACS_PER_RANGE", 1)  # every product split
    monkeypatch.setattr(blas, "one_thread", True)  # as during a run
    calls = []
    run_ranges = parallel.run_ranges
    monkeypatch.setattr(blas, "run_ranges", lambda fn, r: calls.append(len(r)) or
                        run_ranges(fn, r))
    rng = np.random.default_rng(0)
    a = rng.standard_normal(a_shape).astype(np.float32)
    b = rng.standard_normal(b_shape).astype(np.float32)
    with threadpoolctl.threadpool_limits(1, user_api="blas"):
        want = np.matmul(a, b)
        got = blas.matmul(a, b, threads=threads)
        out = np.full(want.shape, np.nan, np.float32)
        assert blas.matmul(a, b, out=out, threads=threads) is out
    assert calls and all(n > 1 for n in calls)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(out, got)


def test_small_products_stay_on_the_calling_thread(monkeypatch):
    from onnxrun.providers.cpu.compiled import float_gemm

    if float_gemm.unavailable() is not None:
        pytest.skip(float_gemm.unavailable())
    from onnxrun.providers.cpu.compiled import spin

    calls = []
    monkeypatch.setattr(blas, "one_thread", True)  # as during a run
    monkeypatch.setattr(parallel, "run_ranges", lambda fn, r: calls.append(r) or [
        fn(*x) for x in r])
    monkeypatch.setattr(blas, "run_ranges", parallel.run_ranges)
    run_blocks = spin.run_blocks  # the compiled GEMM's split (spin.py's workers)
    monkeypatch.setattr(spin, "run_blocks", lambda job, b, t: calls.append(list(b)) or
                        run_blocks(job, b, t))
    rng = np.random.default_rng(1)
    B = rng.standard_normal((256, 256)).astype(np.float32)
    A = rng.standard_normal((32, 256)).astype(np.float32)  # a decoder's 32 tokens: 2M MACs
    packed = float_gemm.pack(B)
    # under float_gemm.SPIN_MACS_PER_RANGE (spin.py's workers), under parallel's for BLAS
    np.testing.assert_allclose(packed.run(A[:8], threads=2), A[:8] @ B, rtol=1e-4, atol=1e-4)
    blas.matmul(A, B, threads=2)
    assert calls == []
    A = rng.standard_normal((512, 256)).astype(np.float32)  # 33M MACs: split
    np.testing.assert_array_equal(packed.run(A, threads=2), packed.run(A, threads=1))
    blas.matmul(A, B, threads=2)
    assert len(calls) == 2 and all(len(r) > 1 for r in calls)


CONCURRENT = r"""
import threading
import numpy as np, onnx, threadpoolctl
from onnx import TensorProto as TP, helper
import onnxrun
from onnxrun.api import session as session_module
from onnxrun.providers.cpu import parallel

def blas_threads():
    return [i["num_threads"] for i in threadpoolctl.threadpool_info() if i["user_api"] == "blas"]

parallel.MIN_MACS_PER_RANGE = 1 << 12  # small products split too
from onnxrun.providers.cpu.compiled import float_gemm
float_gemm.SPIN_MACS_PER_RANGE = 1 << 12  # the compiled GEMM's too
rng = np.random.default_rng(2)
K, N = 96, 80
W = rng.standard_normal((K, N)).astype(np.float32)
nodes = [helper.make_node("MatMul", ["A", "W"], ["P"]),  # the compiled GEMM
         helper.make_node("MatMul", ["A", "B"], ["Q"]),  # BLAS
         helper.make_node("Add", ["P", "Q"], ["Y"])]
graph = helper.make_graph(
    nodes, "g", [helper.make_tensor_value_info("A", TP.FLOAT, ["m", K]),
                 helper.make_tensor_value_info("B", TP.FLOAT, [K, N])],
    [helper.make_tensor_value_info("Y", TP.FLOAT, None)], [onnx.numpy_helper.from_array(W, "W")])
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
sessions = []
for n in (1, 2, 3):
    so = onnxrun.SessionOptions()
    so.intra_op_num_threads = n
    sessions.append(onnxrun.InferenceSession(model, so))
feeds = [{"A": rng.standard_normal((m, K)).astype(np.float32),
          "B": rng.standard_normal((K, N)).astype(np.float32)} for m in (7, 64, 300)]
host = blas_threads()
want = {}
def serial():  # not on the main thread: its set of BLAS's count would hold (see the test)
    for s in range(3):
        for f in range(3):
            want[s, f] = sessions[s].run(None, feeds[f])[0]
t = threading.Thread(target=serial)
t.start()
t.join()
for f in range(3):  # BLAS's cut products: the last bits may move with the thread count
    np.testing.assert_allclose(want[1, f], want[0, f], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(want[2, f], want[0, f], rtol=1e-5, atol=1e-5)
inside = []
enter = session_module._BlasHeld.__enter__
def spy(self):
    enter(self)
    inside.append(blas_threads())
session_module._BlasHeld.__enter__ = spy
errors = []
start = threading.Barrier(4)
def worker(t):
    try:
        start.wait()
        for i in range(30):
            s, f = (t + i) % 3, (t * 7 + i) % 3
            np.testing.assert_array_equal(sessions[s].run(None, feeds[f])[0], want[s, f])
    except BaseException as e:
        errors.append(e)
threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
for t in threads:
    t.start()
for t in threads:
    t.join()
assert not errors, errors[0]
assert len(inside) == 120 and all(set(seen) <= {1} for seen in inside), inside[:5]
assert blas_threads() == host, (blas_threads(), host)
print("ok", host)
"""


def test_concurrent_runs_on_sessions_with_different_thread_counts():
    """Runs overlapping from four threads on 1-, 2- and 3-thread sessions: each result is its
    session's serial one, bit for bit (the same cut of each product, whichever thread takes a
    range); BLAS holds one thread inside every run and its count before the runs comes back
    after the last. In a fresh process: once the main thread has set OpenBLAS's count (as
    threadpoolctl does in other tests), OpenBLAS 0.3.31 ignores the sets of other threads."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", CONCURRENT], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("ok")
