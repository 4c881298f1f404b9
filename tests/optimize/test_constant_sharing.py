"""ConstantSharing: initializers with the same dtype, shape and bytes become one."""

from __future__ import annotations

import numpy as np
import onnx
from basic_helpers import optimize_and_compare, parse, rand, session

PASS = "ConstantSharing"

TEXT = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[2, 3] X) => (float[2, 3] Y) {
    A = Add(X, c1)
    B = Mul(A, c2)
    C = Sub(B, c3)
    Y = Div(C, c4)
}"""


def test_equal_scalars_are_shared() -> None:
    two = np.array(2.0, np.float32)
    model = parse(TEXT, c1=two, c2=two.copy(), c3=two.copy(), c4=np.array(3.0, np.float32))
    res = optimize_and_compare(model, {"X": rand(2, 3)}, disabled=("DivToMul",))
    assert res.changes(PASS) == {"initializers": 2}
    assert len(res.saved.graph.initializer) == 2


def test_different_dtype_shape_or_bits_stay_apart() -> None:
    # [2.0] vs 2.0 (shape), 0.0 vs -0.0 (bits): each a value of its own.
    model = parse(TEXT, c1=np.array([2.0], np.float32), c2=np.array(2.0, np.float32),
                  c3=np.array(0.0, np.float32), c4=np.array(-0.0, np.float32))
    res = optimize_and_compare(model, {"X": rand(2, 3)}, disabled=("DivToMul",))
    assert not res.changes(PASS)
    # Same shape and bytes, another dtype.
    model = parse("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[2] X, int32[2] I) => (float[2] Y, int32[2] Z) {
        Y = Add(X, cf)
        Z = Add(I, ci)
    }""", cf=np.ones(2, np.float32), ci=np.ones(2, np.float32).view(np.int32))
    res = optimize_and_compare(model, {"X": rand(2), "I": np.ones(2, np.int32)})
    assert not res.changes(PASS)


def test_overridable_initializer_is_not_shared() -> None:
    two = np.array(2.0, np.float32)
    model = parse(TEXT, c1=two, c2=two.copy(), c3=np.array(5.0, np.float32),
                  c4=np.array(3.0, np.float32))
    model.graph.input.append(onnx.helper.make_tensor_value_info("c2", onnx.TensorProto.FLOAT, []))
    res = optimize_and_compare(model, {"X": rand(2, 3)}, disabled=("DivToMul",))
    assert not res.changes(PASS)
    # Overriding it changes its reader only.
    x = rand(2, 3)
    got = session(model, 1).run(None, {"X": x, "c2": np.array(10.0, np.float32)})[0]
    np.testing.assert_allclose(got, ((x + 2) * 10 - 5) / 3, rtol=1e-5)


def test_large_constants_compare_every_piece() -> None:
    from onnxrun.optimize.basic.constant_sharing import _PIECE, _same

    n = 3 * _PIECE // 4 + 5  # float32: three pieces and a partial one
    a = np.arange(n, dtype=np.float32)
    assert _same(a, a.copy())
    for i in (0, _PIECE // 4, 2 * _PIECE // 4 - 1, n - 1):  # a difference in any piece
        b = a.copy()
        b[i] = -b[i] if b[i] else -0.0  # 0.0 -> -0.0: equal as numbers, not as bits
        assert not _same(a, b), i
    assert _same(a[::2], np.ascontiguousarray(a[::2]))  # a strided view, as its values
    assert not _same(a.reshape(-1, 1)[:4], a[:4])  # another shape
