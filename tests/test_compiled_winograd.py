"""Winograd F(2x2, 3x3)'s compiled transforms (compiled/winograd.py) against the numpy path
they replace, bit for bit, on 1 to 3 threads; and a Winograd convolution through them at 1 and
2 intra-op threads against onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest

from onnxrun.providers.cpu.compiled import jit, winograd
from onnxrun.providers.cpu.ops import conv

pytest.importorskip("llvmlite")
_REASON = jit.why_unavailable()
pytestmark = pytest.mark.skipif(_REASON is not None, reason=f"compiled kernels: {_REASON}")

# (N, C, tile rows, tile columns, M, first tile row of the band, tile rows in the band)
SHAPES = [(1, 64, 5, 7, 64, 0, 5), (2, 19, 6, 5, 21, 2, 3), (1, 3, 2, 2, 5, 0, 2),
          (3, 33, 4, 9, 17, 1, 2), (1, 16, 1, 1, 16, 0, 1)]


def _bits(a):
    return a.view(np.uint32)


def _specials(a, rng):
    flat = a.reshape(-1)
    at = rng.choice(flat.size, size=min(flat.size, 12), replace=False)
    flat[at] = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, 1e-40, -1e-40, 3e38, -3e38, 1e-30,
                         -5.5, 7.25], np.float32)[:at.size]


@pytest.fixture(params=[1, 2, 3], ids=lambda n: f"{n} threads")
def threads(request, monkeypatch):
    monkeypatch.setattr(winograd, "RANGE_FLOATS", 1)  # every split taken
    return request.param


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_input_transform_is_the_numpy_path(shape, threads):
    N, C, th, tw, _, t0, nt = shape
    rng = np.random.default_rng(C + th)
    P = rng.standard_normal((N, 2 * th + 2, 2 * tw + 2, C)).astype(np.float32)
    _specials(P, rng)
    expected = np.full((16, N, nt, tw, C), np.nan, np.float32)
    got = expected.copy()
    with np.errstate(all="ignore"):
        conv._winograd_input(P, expected, t0, 0, nt)
    winograd.input_transform(P, got, t0, threads)
    np.testing.assert_array_equal(_bits(got), _bits(expected))


@pytest.mark.parametrize("with_bias", [True, False], ids=["bias", "no bias"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_output_transform_is_the_numpy_path(shape, with_bias, threads):
    N, _, th, tw, M, t0, nt = shape
    rng = np.random.default_rng(M + tw)
    Mm = rng.standard_normal((16, N, nt, tw, M)).astype(np.float32)
    _specials(Mm, rng)
    Mm[:, 0, 0, 0, 0] = -0.0  # a tile of negative zeros: its sign kept without a bias
    b = rng.standard_normal(M).astype(np.float32) if with_bias else None
    expected = np.full((N, 2 * th, 2 * tw, M), np.nan, np.float32)
    got = expected.copy()
    with np.errstate(all="ignore"):
        conv._winograd_output(Mm.reshape(4, 4, N, nt, tw, M), b, expected, t0, 0, nt)
    winograd.output_transform(Mm, b, got, t0, threads)
    np.testing.assert_array_equal(_bits(got), _bits(expected))


def test_ranges_go_to_the_spin_workers(monkeypatch):
    from onnxrun.providers.cpu.compiled import spin

    calls = []
    run_blocks = spin.run_blocks

    def counted(job, blocks, threads):
        calls.append((len(blocks), threads))
        return run_blocks(job, blocks, threads)

    monkeypatch.setattr(spin, "run_blocks", counted)
    P = np.ones((1, 2 * 20 + 2, 2 * 20 + 2, 64), np.float32)  # 16 x 20 x 64 floats a tile row
    V = np.empty((16, 1, 20, 20, 64), np.float32)
    winograd.input_transform(P, V, 0, threads=1)
    assert calls == []
    winograd.input_transform(P, V, 0, threads=2)
    assert calls and calls[0][0] > 1 and calls[0][1] == 2


def test_bad_operands():
    P = np.zeros((1, 6, 6, 4), np.float32)
    with pytest.raises(ValueError, match="outside the padded input"):
        winograd.input_transform(P, np.empty((16, 1, 3, 2, 4), np.float32), 0)
    with pytest.raises(ValueError, match="C-contiguous float32"):
        winograd.input_transform(P.astype(np.float64), np.empty((16, 1, 2, 2, 4), np.float32), 0)
    with pytest.raises(ValueError, match="bias"):
        winograd.output_transform(np.zeros((16, 1, 2, 2, 4), np.float32), np.ones(3, np.float32),
                                  np.empty((1, 4, 4, 4), np.float32), 0)
    with pytest.raises(ValueError, match="outside the output"):
        winograd.output_transform(np.zeros((16, 1, 2, 2, 4), np.float32), None,
                                  np.empty((1, 2, 4, 4), np.float32), 0)


@pytest.mark.parametrize("target", ["avx2", "avxvnni", "avx512", "avx512vnni"])
def test_builds_for_every_target(target):
    """The generic IR compiled (not run, for AVX-512 on an AVX2 host) for each target."""
    from onnxrun.providers.cpu.compiled import targets

    answer = jit._compile({"winograd": winograd.module_ir()}, targets.get(target))
    assert answer["error"] is None and answer["errors"] == {} and "winograd" in answer["objects"]


def test_winograd_convolution_through_the_compiled_transforms(monkeypatch):
    """A Winograd convolution (forced) through the compiled transforms, every split taken:
    onnxruntime's values at 1 and 2 threads, the same bits at both."""
    from test_cnn_kernels import check, conv_model, rand, session

    calls = []
    for name in ("input_transform", "output_transform"):
        fn = getattr(winograd, name)
        monkeypatch.setattr(winograd, name,
                            lambda *a, _fn=fn, _n=name, **k: (calls.append(_n), _fn(*a, **k))[1])
    monkeypatch.setattr(conv, "_dense_method", lambda *args: "winograd")
    monkeypatch.setattr(winograd, "RANGE_FLOATS", 1)
    data, feeds = conv_model((2, 24, 13, 11), rand(20, 24, 3, 3), rand(20), "Relu",
                             pads=[1, 1, 1, 1])
    check(data, feeds, threads=1)
    check(data, feeds, threads=2)
    assert {"input_transform", "output_transform"} <= set(calls)
    one, two = (session(data, n).run(None, feeds)[0] for n in (1, 2))
    np.testing.assert_array_equal(one, two)


def test_the_padded_copy_splits_at_two_threads(monkeypatch):
    """Winograd's padded channels-last copy of a large input goes to the intra-op threads in
    ranges of at least _PAD_BYTES (the other numpy passes stay whole by default)."""
    from onnxrun.providers.cpu import parallel

    pads = []

    def counted(fn, n, threads, bytes_per_item=1 << 20, least=None):
        ranges = parallel.ranges_for(n, threads, bytes_per_item, least)
        if getattr(fn, "__name__", "") == "pad_rows":
            pads.append(len(ranges))
        return parallel.run_ranges(fn, ranges)

    monkeypatch.setattr(parallel, "MIN_BYTES_PER_RANGE", None)
    monkeypatch.setattr(conv, "parallel_for", counted)
    rng = np.random.default_rng(3)
    U = rng.standard_normal((16, 64, 8)).astype(np.float32)
    results = []
    for side, threads, cut in [(60, 2, 1), (120, 1, 1), (120, 2, 2)]:  # ~1 MiB, ~3.8 MiB
        X = rng.standard_normal((1, 64, side, side)).astype(np.float32)
        results.append(conv._winograd_3x3(X, U, None, (1, 1), (side, side), threads=threads))
        assert pads[-1] == cut
    X = rng.standard_normal((1, 64, 120, 120)).astype(np.float32)
    np.testing.assert_array_equal(conv._winograd_3x3(X, U, None, (1, 1), (120, 120), 1),
                                  conv._winograd_3x3(X, U, None, (1, 1), (120, 120), 2))
