"""Running a test's work on several threads at once (what the concurrency tests share)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

import numpy as np


def run_on_threads(work: Callable[[int], object], count: int) -> None:
    """Call ``work(k)`` for k in range(count), each on a thread of its own, all at once; once
    every thread has finished, raise the first exception any of them raised."""
    errors: list[BaseException] = []

    def guarded(k: int) -> None:
        try:
            work(k)
        except BaseException as e:  # noqa: BLE001 - raised again on the calling thread
            errors.append(e)

    threads = [threading.Thread(target=guarded, args=(k,)) for k in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def assert_threads_match_serial(sess, inputs: Sequence[dict], repeats: int) -> None:
    """Thread k runs ``sess`` on ``inputs[k]`` ``repeats`` times, all threads at once; every
    output must equal, bit for bit, what one run on this thread gave first."""
    want = [sess.run(None, f) for f in inputs]
    got: list = [None] * len(inputs)

    def work(k: int) -> None:
        for _ in range(repeats):
            got[k] = sess.run(None, inputs[k])

    run_on_threads(work, len(inputs))
    for g, w in zip(got, want, strict=True):
        for a, b in zip(g, w, strict=True):
            np.testing.assert_array_equal(a, b)


def spy_hand_offs(monkeypatch) -> tuple[list[int], list[int]]:
    """Record the work handed to other threads from now on: each spin.Pool.fork's number of
    argument blocks (``forks``) and each parallel.run_ranges queue's number of ranges
    (``queued``), both still run. Skips the test where spin.py's pool is unavailable."""
    import pytest

    from onnxrun.providers.cpu import parallel
    from onnxrun.providers.cpu.compiled import spin

    if spin.unavailable() is not None:
        pytest.skip(spin.unavailable())
    forks: list[int] = []
    queued: list[int] = []
    fork = spin.Pool.fork
    monkeypatch.setattr(spin.Pool, "fork", lambda self, job, argv, **kw: forks.append(
        len(argv)) or fork(self, job, argv, **kw))
    run_ranges = parallel.run_ranges
    monkeypatch.setattr(parallel, "run_ranges",
                        lambda fn, r: queued.append(len(r)) or run_ranges(fn, r))
    return forks, queued
