"""The soak of benchmarks/serve_load.py, short: the real server under concurrent HTTP load with
malformed requests mixed in answers every well-formed one, every malformed one with a 400, and
keeps its memory."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("starlette")
pytest.importorskip("grpc")

from serve_harness import ADDMUL, write_model  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def test_short_soak(tmp_path):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import serve_load
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    write_model(tmp_path, "addmul", ADDMUL, "max_batch_size: 8\ndynamic_batching { "
                "max_queue_delay_microseconds: 1000 }")
    x = np.ones((1, 4), np.float32)
    result = serve_load.soak(tmp_path, "addmul", {"x": x, "y": x}, seconds=6, concurrency=8,
                             malformed_every=10, sample_s=1)
    assert result["ok"] > 0 and result["malformed"] > 0
    assert result["failed"] == 0 and result["malformed_not_400"] == 0, result
    rss = result["rss_mb"]
    assert max(rss[1:]) < rss[1] + 100, rss  # no growth with the requests served
