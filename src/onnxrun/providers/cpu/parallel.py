"""The CPU provider's intra-op threads: a kernel splits one large piece of work into contiguous
ranges and runs them at once, on the calling thread and on worker threads.

numpy releases the GIL inside ufunc loops, copies and BLAS calls on large arrays, so ranges of a
few hundred kilobytes each run truly in parallel. BLAS has threads of its own; these are for the
engine's own work (elementwise passes, im2col, depthwise convolution, transforms).

A kernel learns its thread count once, when it is prepared (``threads_for(ctx)``): that is
``SessionOptions.intra_op_num_threads``, or every usable core when it is 0, as in onnxruntime.
The worker threads are shared by every session of the process and started on first use.
Splitting is off unless ONNXRUN_INTRA_OP_SPLIT_BYTES is set (see MIN_BYTES_PER_RANGE for the
measurement); the thread count still guides kernels' choice of method under BLAS threads.
"""

from __future__ import annotations

import itertools
import os
import queue
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from ... import threads

# Below this many bytes of work per range, handing a range to another thread costs more than it
# saves: waking a worker costs 20-80 us on a virtual machine, and numpy streams ~5 GB/s per core.
# None: kernels never split (the default). Measured on the 2-vCPU development VM with numpy's
# OpenBLAS, splitting lost at 2 threads on every model tried (MobileNetV2 19.8 -> 23.8 ms,
# ShuffleNet 12.9 -> 14.1, SqueezeNet 17.3 -> 17.9, VGG-19 and BERT even): OpenBLAS's idle
# threads spin for ~0.1 s after each GEMM and take the core a worker would use, and with BLAS
# held at one thread the split kernels lose the GEMMs' second core. ONNXRUN_INTRA_OP_SPLIT_BYTES
# (e.g. 1048576) turns splitting on, for machines where it pays.
_configured = os.environ.get("ONNXRUN_INTRA_OP_SPLIT_BYTES", "")
MIN_BYTES_PER_RANGE: int | None = int(_configured) if _configured.isdigit() else None

_lock = threading.Lock()
_tasks: queue.SimpleQueue = queue.SimpleQueue()  # jobs: callables the workers run
_started = 0
_local = threading.local()  # .worker: this thread is one of ours


def usable_cores() -> int:
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


def threads_for(ctx: Any) -> int:
    """The intra-op thread count of the session that prepares the kernel ``ctx`` belongs to."""
    if not threads.available():
        return 1
    n = int(getattr(getattr(ctx, "session_options", None), "intra_op_num_threads", 0) or 0)
    return n if n > 0 else usable_cores()


def split_threads(ctx: Any) -> int:
    """How many threads a kernel may split its own work over: ``threads_for(ctx)`` when
    splitting is on (ONNXRUN_INTRA_OP_SPLIT_BYTES), else 1. Measured for the compiled 8-bit
    kernels too (2 threads, 2-vCPU VM): splitting lost next to OpenBLAS's spinning threads
    (int8 LSTM 12.0 -> 18.4 ms, MobileNetV2 QDQ 10.5 -> 14.6, MiniLM int8 26.2 -> 29.4)."""
    return threads_for(ctx) if MIN_BYTES_PER_RANGE is not None else 1


def _worker() -> None:
    _local.worker = True
    while True:
        _tasks.get()()


def _ensure_workers(n: int) -> None:
    """Plain threads on one queue, not a ThreadPoolExecutor: its futures cost ~70 us a
    hand-off on a virtual machine, a queue ~15 us."""
    global _started
    with _lock:
        while _started < n:
            threading.Thread(target=_worker, daemon=True,
                             name=f"onnxrun-intra-op-{_started}").start()
            _started += 1


def split(n: int, parts: int) -> list[tuple[int, int]]:
    """[0, n) as at most ``parts`` contiguous, nearly equal, non-empty ranges."""
    parts = max(1, min(parts, n))
    q, r = divmod(n, parts)
    ranges, start = [], 0
    for i in range(parts):
        stop = start + q + (1 if i < r else 0)
        ranges.append((start, stop))
        start = stop
    return ranges


# Below this many multiply-adds per range, a product is not worth handing to another thread:
# waking a worker and passing the GIL costs 50-80 us on the 2-vCPU development VM (run_ranges
# of two sleeping ranges against one), the time of ~2M multiply-adds on one AVX2 core.
MIN_MACS_PER_RANGE = 1 << 22
# At most this many ranges per thread: a worker the OS wakes late still finds ranges to take
# (run_ranges hands them out in turn) instead of the caller doing the whole second half alone.
RANGES_PER_THREAD = 4


def work_ranges(n: int, threads: int, work_per_item: int, least: int | None = None,
                per_thread: int = RANGES_PER_THREAD) -> list[tuple[int, int]]:
    """How to cut ``n`` items of ``work_per_item`` work each (multiply-adds, say) for
    ``threads`` threads: ranges of at least ``least`` work (MIN_MACS_PER_RANGE), at most
    ``per_thread`` a thread; one range (no hand-off) when the whole is under two ranges' worth."""
    if threads <= 1 or n <= 1:
        return [(0, n)]
    least = MIN_MACS_PER_RANGE if least is None else least
    worth = (n * max(1, work_per_item)) // max(1, least)
    if worth < 2:
        return [(0, n)]
    return split(n, min(threads * per_thread, worth))


def ranges_for(n: int, threads: int, bytes_per_item: int,
               least: int | None = None) -> list[tuple[int, int]]:
    """How to cut ``n`` items of ``bytes_per_item`` work each for ``threads`` threads: one range
    when the whole is too small to be worth a hand-off. ``least``: the bytes a range needs,
    for a pass measured to gain from splitting (a large copy), where MIN_BYTES_PER_RANGE
    (ONNXRUN_INTRA_OP_SPLIT_BYTES) is not set; without either, one range."""
    least = MIN_BYTES_PER_RANGE if MIN_BYTES_PER_RANGE is not None else least
    if threads <= 1 or n <= 1 or not least:
        return [(0, n)]
    worth = max(1, (n * max(1, bytes_per_item)) // least)
    return split(n, min(threads, worth))


class _Job:
    """One run_ranges call: the calling thread and the workers take ranges in turn until none is
    left. A worker the OS has not scheduled yet finds nothing to do when it wakes, instead of
    the caller waiting a time slice for it (what a fixed range per thread would do on a busy
    machine)."""

    def __init__(self, fn: Callable[[int, int], Any], ranges: list[tuple[int, int]]) -> None:
        self.fn, self.ranges = fn, ranges
        self.results: list[Any] = [None] * len(ranges)
        self.errors: list[BaseException] = []
        self.next = itertools.count()  # next() on a count is atomic under the GIL
        self.left = len(ranges)
        self.lock = threading.Lock()
        self.finished = threading.Event()
        self.errstate = np.geterr()  # the caller's (a session ignores floating-point errors)

    def __call__(self) -> None:
        if not getattr(_local, "worker", False):
            self._take_ranges()
            return
        with np.errstate(**self.errstate):
            self._take_ranges()

    def _take_ranges(self) -> None:
        n = len(self.ranges)
        while (i := next(self.next)) < n:
            try:
                self.results[i] = self.fn(*self.ranges[i])
            except BaseException as e:  # noqa: BLE001 - raised again in the calling thread
                self.errors.append(e)
            with self.lock:
                self.left -= 1
                if self.left == 0:
                    self.finished.set()


def run_ranges(fn: Callable[[int, int], Any], ranges: list[tuple[int, int]]) -> list[Any]:
    """``fn(start, stop)`` for every range, concurrently; the results in range order. An
    exception in any range is raised here once every range has finished. Called from a worker
    (a kernel inside a kernel), the ranges run one after another: a worker waiting for queued
    work could otherwise wait for itself."""
    if len(ranges) == 1 or getattr(_local, "worker", False):
        return [fn(a, b) for a, b in ranges]
    _ensure_workers(len(ranges) - 1)
    job = _Job(fn, ranges)
    for _ in ranges[1:]:
        _tasks.put(job)
    job()
    job.finished.wait()
    if job.errors:
        raise job.errors[0]
    return job.results


def run_each(fn: Callable[[int], Any], n: int, threads: int) -> None:
    """``fn(i)`` for i in range(n), each on a thread of its own when ``threads`` > 1 (for a
    few independent pieces of compiled work that release the GIL, such as a recurrent layer's
    directions), else in turn."""
    if threads > 1 and n > 1:
        run_ranges(lambda i, _: fn(i), [(i, i + 1) for i in range(n)])
    else:
        for i in range(n):
            fn(i)


def parallel_for(fn: Callable[[int, int], Any], n: int, threads: int,
                 bytes_per_item: int = 1 << 20, least: int | None = None) -> list[Any]:
    """Run ``fn(start, stop)`` over [0, n) on up to ``threads`` threads (``ranges_for``)."""
    return run_ranges(fn, ranges_for(n, threads, bytes_per_item, least))


__all__ = ["MIN_BYTES_PER_RANGE", "MIN_MACS_PER_RANGE", "RANGES_PER_THREAD", "parallel_for",
           "ranges_for", "run_each", "run_ranges", "split", "split_threads", "threads_for",
           "usable_cores", "work_ranges"]
