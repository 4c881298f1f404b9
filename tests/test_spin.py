"""compiled/spin.py: one product split over spinning workers gives the same numbers as on one
thread, whatever the workers are doing (asleep, spinning, held by another caller), and several
threads forking at once never wait for each other forever."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from onnxrun.providers.cpu.compiled import nbits_gemm, spin

pytestmark = pytest.mark.skipif(
    (spin.unavailable() or nbits_gemm.unavailable()) is not None,
    reason=f"compiled kernels: {spin.unavailable() or nbits_gemm.unavailable()}")


def _gemm(K, N, zp, rng):
    kb = -(-K // 32)
    packed = rng.integers(0, 256, (N, kb, 16), dtype=np.uint8)
    scales = (rng.random((N, kb), dtype=np.float32) * 0.02 + 1e-3).astype(np.float32)
    zq = rng.integers(0, 16, (N, kb), dtype=np.uint8) if zp else None
    bias = rng.standard_normal(N).astype(np.float32)
    return nbits_gemm.Gemm(packed, scales, np.ascontiguousarray((8 * scales).T), bias, zq)


@pytest.mark.parametrize("parts", [2, 3, 5])
def test_parts_equal_one_thread(parts):
    rng = np.random.default_rng(parts)
    pool = spin.Pool(parts - 1)  # a pool of its own: its workers start asleep
    for K, N, zp in ((896, 1152, False), (288, 20, True), (100, 13, False), (64, 3, True)):
        g = _gemm(K, N, zp, rng)
        a = rng.standard_normal(K).astype(np.float32)
        want = np.empty(N, np.float32)
        g.row(a, want)
        for _ in range(50):  # the first forks find the workers asleep, later ones spinning
            got = np.full(N, np.nan, np.float32)
            g.row_parts(a, got, parts, pool)
            assert got.tobytes() == want.tobytes(), (K, N, zp)
    assert pool.started == [True] * (parts - 1)


def test_concurrent_callers_share_workers():
    rng = np.random.default_rng(1)
    pool = spin.Pool(2)
    gemms = [_gemm(512, 640, i % 2 == 1, rng) for i in range(4)]
    inputs = [rng.standard_normal(512).astype(np.float32) for _ in gemms]
    wants = []
    for g, a in zip(gemms, inputs, strict=True):
        w = np.empty(640, np.float32)
        g.row(a, w)
        wants.append(w)
    errors = []

    def caller(i):
        try:
            for _ in range(200):
                got = np.empty(640, np.float32)
                gemms[i].row_parts(inputs[i], got, 3, pool)
                assert got.tobytes() == wants[i].tobytes()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a fork never returned"
    assert not errors, errors[0]


def test_more_parts_than_workers_is_an_error():
    pool = spin.Pool(1)
    g = _gemm(64, 16, False, np.random.default_rng(2))
    with pytest.raises(ValueError, match="3 parts for 1 workers"):
        g.row_parts(np.zeros(64, np.float32), np.empty(16, np.float32), 3, pool)


def test_workers_that_fall_asleep_between_forks(monkeypatch):
    """Workers that stop polling after a few microseconds: most forks find them asleep or
    about to sleep (a part posted to a worker being woken, often taken back): the numbers
    are one thread's and every fork returns."""
    monkeypatch.setattr(spin, "SPIN_TICKS", 2_000)
    rng = np.random.default_rng(3)
    pool = spin.Pool(2)
    g = _gemm(288, 200, True, rng)
    a = rng.standard_normal(288).astype(np.float32)
    want = np.empty(200, np.float32)
    g.row(a, want)
    for i in range(300):
        got = np.full(200, np.nan, np.float32)
        g.row_parts(a, got, 3, pool)
        assert got.tobytes() == want.tobytes(), i
        if i % 50 == 0:
            time.sleep(0.002)  # longer than the polling: the workers are asleep again


def test_concurrent_callers_on_one_weight():
    """Several threads running one weight's product at once: one writes the weight's own
    argument blocks, the others copies of them; each gets its own row's numbers."""
    rng = np.random.default_rng(4)
    pool = spin.Pool(2)
    g = _gemm(640, 512, True, rng)
    inputs = [rng.standard_normal(640).astype(np.float32) for _ in range(4)]
    wants = []
    for a in inputs:
        w = np.empty(512, np.float32)
        g.row(a, w)
        wants.append(w)
    errors = []

    def caller(i):
        try:
            for _ in range(200):
                got = np.empty(512, np.float32)
                g.row_parts(inputs[i], got, 3, pool)
                assert got.tobytes() == wants[i].tobytes()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a fork never returned"
    assert not errors, errors[0]


def _spy_forks(monkeypatch):
    forks = []
    fork = spin.Pool.fork
    monkeypatch.setattr(spin.Pool, "fork", lambda self, job, argv, **kw: forks.append(
        len(argv)) or fork(self, job, argv, **kw))
    return forks


@pytest.mark.parametrize("M,N", [(5, 300), (200, 20), (97, 129), (1, 700)])
def test_float_gemm_split_on_the_spinning_workers(monkeypatch, M, N):
    """The compiled float GEMM's split (panels or row strips) runs on spin.py's workers, and
    gives one thread's bits: the sum over K runs in one order whatever the split."""
    from onnxrun.providers.cpu import parallel
    from onnxrun.providers.cpu.compiled import float_gemm

    monkeypatch.setattr(float_gemm, "SPIN_MACS_PER_RANGE", 1 << 10)  # small products split too
    monkeypatch.setattr(parallel, "run_ranges", None)  # not the queue's threads
    forks = _spy_forks(monkeypatch)
    rng = np.random.default_rng(M + N)
    A = rng.standard_normal((M, 600), np.float32)
    B = rng.standard_normal((600, N), np.float32)
    bias = rng.standard_normal(N).astype(np.float32)
    P = float_gemm.pack(B)
    one = P.run(A, bias)
    for threads in (2, 3, 4):
        for _ in range(20):  # workers asleep at first, then spinning
            assert P.run(A, bias, threads=threads).tobytes() == one.tobytes()
        assert forks == [min(threads, spin.pool().size + 1)] * 20
        forks.clear()


def test_small_float_gemm_splits_at_two_threads(monkeypatch):
    """A product of ~2M multiply-adds (SqueezeNet's and the GPT decoder's size) goes to the
    spinning workers at 2 threads, under the Python pool's threshold (parallel.
    MIN_MACS_PER_RANGE, which kept such products on one thread); a tiny one stays whole."""
    from onnxrun.providers.cpu import parallel
    from onnxrun.providers.cpu.compiled import float_gemm

    assert 64 * 256 * 128 < 2 * parallel.MIN_MACS_PER_RANGE
    forks = _spy_forks(monkeypatch)
    rng = np.random.default_rng(7)
    P = float_gemm.pack(rng.standard_normal((256, 128), np.float32))
    A = rng.standard_normal((64, 256), np.float32)
    one = P.run(A)
    assert P.run(A, threads=2).tobytes() == one.tobytes()
    assert forks == [2]
    forks.clear()
    tiny = rng.standard_normal((4, 256), np.float32)
    assert P.run(tiny, threads=2).tobytes() == P.run(tiny).tobytes() and forks == []


def test_run_blocks_takes_rows_in_turn(monkeypatch):
    """More products than threads (Winograd's 16 on 2): the threads take products in turn
    (@grab), every product whole on one thread: the same bits as one by one."""
    from onnxrun.providers.cpu.compiled import float_gemm

    monkeypatch.setattr(float_gemm, "SPIN_MACS_PER_RANGE", 1 << 10)
    forks = _spy_forks(monkeypatch)
    rng = np.random.default_rng(4)
    Bs = rng.standard_normal((16, 40, 33)).astype(np.float32)
    packed = float_gemm.pack_stack(Bs)
    A = rng.standard_normal((16, 50, 40)).astype(np.float32)
    want = np.stack([p.run(a) for p, a in zip(packed, A, strict=True)])
    for threads in (2, 3):
        for _ in range(20):
            got = np.full((16, 50, 33), np.nan, np.float32)
            float_gemm.run_all(packed, A, got, threads)
            assert got.tobytes() == want.tobytes()
        assert forks == [min(threads, spin.pool().size + 1)] * 20
        forks.clear()
    # below the threshold: no fork, one thread
    monkeypatch.setattr(float_gemm, "SPIN_MACS_PER_RANGE", 1 << 22)
    got = np.empty_like(want)
    float_gemm.run_all(packed, A, got, 2)
    assert got.tobytes() == want.tobytes() and forks == []


_HANDSHAKE = """
define void @handshake(ptr %a) nounwind {
entry:
  %role = load i64, ptr %a, align 8
  %fp = getelementptr i64, ptr %a, i64 1
  %flag = load ptr, ptr %fp, align 8
  %is_worker = icmp eq i64 %role, 1
  br i1 %is_worker, label %set, label %start
set:
  store atomic i64 1, ptr %flag release, align 8
  ret void
start:
  %t0 = call i64 @llvm.readcyclecounter()
  br label %poll
poll:
  %v = load atomic i64, ptr %flag acquire, align 8
  %seen = icmp eq i64 %v, 1
  br i1 %seen, label %done, label %more
more:
  %t = call i64 @llvm.readcyclecounter()
  %dt = sub i64 %t, %t0
  %late = icmp ugt i64 %dt, 4000000000
  br i1 %late, label %gave_up, label %poll
gave_up:
  ret void
done:
  %rp = getelementptr i64, ptr %a, i64 2
  store i64 1, ptr %rp, align 8
  ret void
}
declare i64 @llvm.readcyclecounter()
"""


def test_a_sleeping_worker_wakes_without_the_gil():
    """A worker asleep is woken by the fork itself and takes its part while the calling thread
    holds the GIL: it sleeps and wakes in compiled code (a futex), never in Python. Part 0
    waits (up to ~1-4 s) for part 1 to set a flag: only the worker can, since the caller runs
    part 1 only after part 0. With the worker woken through a threading.Event (it needed the
    GIL to leave its wait) part 0 timed out (word 2 of its block stays 0) and part 1 ran on
    the caller."""
    import ctypes

    from onnxrun.providers.cpu.compiled import jit

    job = jit.compile_module("test_spin_handshake", _HANDSHAKE,
                             {"handshake": ctypes.CFUNCTYPE(None, ctypes.c_void_p)}).handshake
    pool = spin.Pool(1)
    flag = np.zeros(1, np.int64)
    blocks = np.array([[0, jit.address(flag), 0], [1, jit.address(flag), 0]], np.int64)
    argv = np.array([jit.address(blocks[0]), jit.address(blocks[1])], np.int64)
    pool.fork(spin.function_address(job), argv)  # starts the worker
    time.sleep(0.05)  # past its polling: asleep
    assert pool.ctrl[0, 0] == 0
    flag[0] = 0
    # fork called with the GIL held (a PYFUNCTYPE prototype does not release it)
    held = ctypes.PYFUNCTYPE(ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p,
                             ctypes.c_void_p)(spin.function_address(pool._fork))
    blocks[0, 2] = 0
    held(pool.base, 1, spin.function_address(job), jit.address(argv))
    assert flag[0] == 1
    assert blocks[0, 2] == 1, "part 0 waited out its timeout: the worker slept on"


def test_a_worker_woken_for_a_part_taken_back_polls_for_the_next(monkeypatch):
    """A fork that finds its worker asleep wakes it, and a small part is taken back by the
    caller before the worker is up (a wake is ~15-30 us on a virtual machine): the worker
    finds its word 0 again and polls for the next fork, the word 1. Before, it went back to
    sleep, so in a run of small products every fork found it asleep, paid the wake and got
    no help. Here the wake is made by hand, the word left 0 (what such a fork leaves)."""
    import ctypes

    # polling for ~0.1-0.4 s (time-stamp ticks): a window this thread sees on a busy machine
    monkeypatch.setattr(spin, "SPIN_TICKS", 400_000_000)
    pool = spin.Pool(1)
    pool._start(1)
    for state in (1, 0):  # started (polling), then past its polling
        deadline = time.perf_counter() + 5.0
        while pool.ctrl[0, 0] != state and time.perf_counter() < deadline:
            time.sleep(0.001)
        assert pool.ctrl[0, 0] == state
    time.sleep(0.05)  # in its futex wait
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    woken = libc.syscall(ctypes.c_long(202), ctypes.c_void_p(pool.base), ctypes.c_long(129),
                         ctypes.c_long(1), None, None, ctypes.c_long(0))  # FUTEX_WAKE_PRIVATE
    assert woken == 1, "the worker was not in its futex wait"
    deadline = time.perf_counter() + 2.0
    while pool.ctrl[0, 0] != 1 and time.perf_counter() < deadline:
        pass
    assert pool.ctrl[0, 0] == 1, "the woken worker went back to sleep"


def test_control_words_own_their_cache_lines():
    """Each worker's control block starts a 128-byte pair of cache lines of its own, with a
    padding pair before the first and after the last: the polled words share no line with
    any other object of the process."""
    pool = spin.Pool(3)
    buffer = pool.ctrl.base
    assert pool.base % 128 == 0 and pool.ctrl.strides == (128, 8)
    assert pool.base - buffer.ctypes.data >= 128
    assert buffer.ctypes.data + buffer.nbytes - (pool.base + pool.ctrl.nbytes) >= 128
