"""Convolutions through NVIDIA's cuDNN frontend (the ``nvidia-cudnn-frontend`` package, imported
as ``cudnn``), where it is installed: CuPy 14 dropped its own cuDNN bindings. Chosen per Conv
node when its kernel is created (2-D, float16 / float32, the package importable); one cuDNN
graph per input shape, built on first use and executed on the run's stream. Whatever cuDNN
refuses to build falls back, for that shape, to the implicit GEMM of ``ops/conv.py``.

The output's dims and strides are set, not left to the frontend: it infers a layout of its own
(seen on an H200 with cuDNN 9.19: H and W swapped in a row-major buffer)."""

from __future__ import annotations

import contextlib
import functools
import math
import threading
from collections.abc import Iterator
from typing import Any

_local = threading.local()


@functools.cache
def _module() -> Any:
    """The ``cudnn`` module and a handle, or None where it does not import or start."""
    try:
        import cudnn

        return cudnn, cudnn.create_handle()
    except Exception:  # noqa: BLE001 - no package, no library, no device: the GEMM path
        return None


def available() -> bool:
    return not getattr(_local, "disabled", False) and _module() is not None


@contextlib.contextmanager
def disabled() -> Iterator[None]:
    """Sessions created inside take the implicit GEMM (benchmarks/gpu.py measures both)."""
    before = getattr(_local, "disabled", False)
    _local.disabled = True
    try:
        yield
    finally:
        _local.disabled = before


def _strides(x: Any) -> list[int]:
    return [s // x.itemsize for s in x.strides]


class Convolution:
    """One Conv node's cuDNN graphs, keyed by the input's shape and dtype."""

    def __init__(self, strides: list[int], dilations: list[int], before: list[int],
                 after: list[int]) -> None:
        self.geometry = (list(strides), list(dilations), list(before), list(after))
        self.graphs: dict[tuple, Any] = {}
        self.built = 0  # graphs cuDNN built (the GPU test reads it)

    def __call__(self, X: Any, W: Any, out: list[int]) -> Any | None:
        """The convolution of X and W (no bias), or None where cuDNN has no plan for it."""
        import cupy

        key = (X.shape, X.dtype.str, W.shape, X.strides, W.strides)
        entry = self.graphs.get(key)
        if entry is None:
            entry = self.graphs[key] = self._build(X, W, out)
        if entry is False:
            return None
        graph, x, w, y, workspace = entry
        cudnn, handle = _module()
        Y = cupy.empty((X.shape[0], W.shape[0], *out), dtype=X.dtype)
        try:
            cudnn.set_stream(handle=handle, stream=cupy.cuda.get_current_stream().ptr)
            graph.execute({x: X, w: W, y: Y}, workspace, handle=handle)
        except Exception:  # noqa: BLE001 - a plan that does not run: the GEMM from now on
            self.graphs[key] = False
            return None
        return Y

    def _build(self, X: Any, W: Any, out: list[int]) -> Any:
        import cupy

        cudnn, handle = _module()
        types = {"<f2": cudnn.data_type.HALF, "<f4": cudnn.data_type.FLOAT}
        dt = types[X.dtype.str]
        strides, dilations, before, after = self.geometry
        try:
            graph = cudnn.pygraph(handle=handle, io_data_type=dt,
                                  intermediate_data_type=cudnn.data_type.FLOAT,
                                  compute_data_type=cudnn.data_type.FLOAT)
            x = graph.tensor(name="X", dim=list(X.shape), stride=_strides(X), data_type=dt)
            w = graph.tensor(name="W", dim=list(W.shape), stride=_strides(W), data_type=dt)
            y = graph.conv_fprop(image=x, weight=w, pre_padding=before, post_padding=after,
                                 stride=strides, dilation=dilations,
                                 compute_data_type=cudnn.data_type.FLOAT)
            # the result's layout stated, not inferred: NCHW contiguous, as the kernel returns
            dims = [X.shape[0], W.shape[0], *out]
            y.set_output(True).set_data_type(dt).set_dim(dims).set_stride(
                [math.prod(dims[i + 1:]) for i in range(len(dims))])
            graph.build([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
            workspace = cupy.empty(max(1, graph.get_workspace_size()), dtype=cupy.uint8)
        except Exception:  # noqa: BLE001 - no engine for this case: the implicit GEMM
            return False
        self.built += 1
        return graph, x, w, y, workspace
