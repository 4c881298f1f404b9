"""The convolution and pooling kernels cut into ranges for the intra-op threads: with every
split forced (no minimum size per range), 2 and 3 threads give onnxruntime's results."""

from __future__ import annotations

import pytest
from test_cnn_kernels import (
    DW_ATTRS,
    POOL_CASES,
    block_model,
    check,
    conv_model,
    pool_model,
    rand,
)

from onnxrun.providers.cpu import parallel
from onnxrun.providers.cpu.ops import conv as conv_mod

pytest.importorskip("onnxruntime")

THREADS = [2, 3]


@pytest.fixture(autouse=True)
def split_everything(monkeypatch):
    monkeypatch.setattr(parallel, "MIN_BYTES_PER_RANGE", 1)


@pytest.mark.parametrize("threads", THREADS)
@pytest.mark.parametrize("attrs", DW_ATTRS, ids=lambda a: "-".join(
    f"{k}={v}" for k, v in a.items()))
def test_depthwise(monkeypatch, threads, attrs):
    monkeypatch.setattr(conv_mod, "_NHWC_CHANNELS", 1)
    C = 6
    check(*conv_model((2, C, 11, 13), rand(C, 1, 3, 3), rand(C), "Clip", group=C, **attrs),
          threads=threads)
    check(*conv_model((1, C, 9, 10), rand(C, 1, 3, 3), None, const=False, group=C, **attrs),
          threads=threads)


@pytest.mark.parametrize("threads", THREADS)
@pytest.mark.parametrize("method", ["gemm", "shifted", "winograd"])
def test_dense_methods(monkeypatch, threads, method):
    monkeypatch.setattr(conv_mod, "_dense_method", lambda *args: method)
    C, M = 8, 8
    check(*conv_model((2, C, 9, 12), rand(M, C, 3, 3), rand(M), "Relu", pads=[1, 0, 2, 1]),
          threads=threads)
    check(*conv_model((1, C, 15, 8), rand(M, C, 3, 3), None, pads=[2, 1, 0, 1]),
          threads=threads)


@pytest.mark.parametrize("threads", THREADS)
def test_strided_im2col_and_1x1(threads):
    check(*conv_model((2, 3, 23, 19), rand(8, 3, 5, 5), rand(8), "Relu", strides=[2, 3],
                      pads=[2, 2, 1, 1]), threads=threads)
    check(*conv_model((2, 6, 7, 9), rand(12, 3, 3, 3), rand(12), group=2, pads=[1, 1, 1, 1]),
          threads=threads)
    check(*conv_model((2, 16, 7, 9), rand(8, 16, 1, 1), rand(8), "Clip"), threads=threads)


@pytest.mark.parametrize("threads", THREADS)
@pytest.mark.parametrize("extra_output", [False, True])
def test_channels_last_chain(threads, extra_output):
    model, feeds = block_model(extra_output=extra_output)
    check(model, feeds, rtol=1e-3, atol=1e-4, threads=threads)


@pytest.mark.parametrize("threads", THREADS)
@pytest.mark.parametrize("channels", [8, 64], ids=["planar", "channels_last"])
@pytest.mark.parametrize("kernel,attrs", POOL_CASES)
def test_pools(threads, channels, kernel, attrs):
    x = (2, channels, 9, 10)
    check(*pool_model("MaxPool", x, kernel_shape=list(kernel), **attrs), threads=threads)
    if "dilations" not in attrs:
        check(*pool_model("AveragePool", x, kernel_shape=list(kernel), count_include_pad=1,
                          **attrs), threads=threads)
