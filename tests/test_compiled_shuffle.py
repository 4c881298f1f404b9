"""The compiled channel shuffle (compiled/shuffle.py): each pixel's (b, a) block of channels
transposed, bit for bit numpy's transpose, for 1-8 groups and channel counts off the 8-lane
vectors (the scalar tail), on the AVX2 code (every target builds it:
tests/test_compiled_targets.py, the bundle); bad operands refused."""

from __future__ import annotations

import numpy as np
import pytest

from onnxrun.providers.cpu import compiled
from onnxrun.providers.cpu.compiled import jit
from onnxrun.providers.cpu.compiled import shuffle as cshuffle

pytest.importorskip("llvmlite")


@pytest.fixture(autouse=True)
def avx2():
    with compiled.forced_target("avx2"):
        if jit.why_unavailable() is not None:
            pytest.skip(jit.why_unavailable())
        yield


@pytest.mark.parametrize("b", [1, 2, 3, 4, 5, 8])
@pytest.mark.parametrize("a", [1, 5, 8, 17, 28, 34, 136])
def test_compiled_shuffle_is_the_transpose(a, b):
    rng = np.random.default_rng(a * b)
    X = rng.standard_normal((23, b, a)).astype(np.float32)
    X[0, 0, 0], X[-1, -1, -1] = np.nan, -np.inf
    Y = cshuffle.shuffle(X, b)
    assert Y.shape == (23, a, b) and Y.flags.c_contiguous
    np.testing.assert_array_equal(Y.view(np.uint32), X.transpose(0, 2, 1).view(np.uint32))
    assert cshuffle.shuffle(X[:0], b).shape == (0, a, b)


def test_compiled_shuffle_refuses_what_it_does_not_handle():
    X = np.zeros((4, 3, 8), np.float32)
    for bad, b in [(X, 2), (X.astype(np.float64), 3), (X[:, :, ::2], 3), (X[0], 3),
                   (np.zeros((4, 9, 8), np.float32), 9)]:
        with pytest.raises(ValueError, match="channel shuffle"):
            cshuffle.shuffle(bad, b)
