"""The CUDA provider's CPU-only lane: the provider runs on array-api-strict's non-default device
(``device.stand_in()``), which refuses any operation mixing it with host arrays. Tests marked
``gpu`` run the same checks on CuPy and are skipped without a GPU."""

from __future__ import annotations

import pytest

pytest.importorskip("array_api_strict")
pytest.importorskip("array_api_compat")

from onnxrun.providers.cuda import device  # noqa: E402


def pytest_collection_modifyitems(config, items):  # noqa: ARG001
    if device.cupy_gpu_count() == 0:
        skip = pytest.mark.skip(reason="no GPU: CuPy finds no CUDA device")
        for item in items:
            if item.get_closest_marker("gpu") is not None:
                item.add_marker(skip)


@pytest.fixture(params=["stand-in", pytest.param("cupy", marks=pytest.mark.gpu)])
def on_device(request):
    """The CUDA provider on the stand-in device, and (marked gpu) on CuPy."""
    if request.param == "stand-in":
        with device.stand_in():
            yield request.param
    else:
        yield request.param
