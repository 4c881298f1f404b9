"""Running a test's work on several threads at once (what the concurrency tests share)."""

from __future__ import annotations

import threading
from collections.abc import Callable


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
