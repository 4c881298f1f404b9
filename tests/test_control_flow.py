"""If, Loop, Scan, SequenceMap, sequence and optional operators against onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.parser
import onnxruntime as ort
import pytest

import onnxrun


def _parse(text: str, opset: int = 17) -> onnx.ModelProto:
    header = f'<ir_version: 8, opset_import: ["" : {opset}]>\n'
    model = onnx.parser.parse_model(header + text)
    onnx.checker.check_model(model)
    return model


def _run_both(model: onnx.ModelProto, feeds: dict) -> tuple[list, list]:
    data = model.SerializeToString()
    want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feeds)
    got = onnxrun.InferenceSession(data).run(None, feeds)
    return got, want


def _assert_same(got, want):
    assert type(got) is type(want) or isinstance(got, np.ndarray) and isinstance(want, np.ndarray)
    if isinstance(want, list):
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            _assert_same(g, w)
    elif want is None:
        assert got is None
    else:
        assert got.dtype == want.dtype, (got.dtype, want.dtype)
        assert got.shape == want.shape, (got.shape, want.shape)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def _check(model, feeds):
    got, want = _run_both(model, feeds)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        _assert_same(g, w)
    return got


F3 = np.array([1.0, 2.0, 3.0], np.float32)
G3 = np.array([0.5, -1.0, 4.0], np.float32)


# -- If -------------------------------------------------------------------------------------------

IF_MODEL = """
agraph (bool c, float[3] x, float[3] y) => (float[3] z, float[N] w) {
    z, w = If (c) <
        then_branch = then_g () => (float[3] t, float[N] t2) {
            t = Add(x, y)
            t2 = Concat <axis = 0> (x, y)
        },
        else_branch = else_g () => (float[3] e, float[N] e2) {
            e = Mul(x, y)
            e2 = Identity(x)
        }
    >
}
"""


@pytest.mark.parametrize("cond", [True, False])
def test_if_reads_outer_values(cond):
    _check(_parse(IF_MODEL), {"c": np.array(cond), "x": F3, "y": G3})


def test_if_opset_11():
    _check(_parse(IF_MODEL, opset=11), {"c": np.array(False), "x": F3, "y": G3})


def test_if_nested_reads_two_levels_up():
    model = _parse("""
    agraph (bool c1, bool c2, float[3] x, float[3] y) => (float[3] z) {
        z = If (c1) <
            then_branch = t1 () => (float[3] a) {
                a = If (c2) <
                    then_branch = t2 () => (float[3] b) { b = Sub(x, y) },
                    else_branch = e2 () => (float[3] b2) { b2 = Add(x, x) }
                >
            },
            else_branch = e1 () => (float[3] a2) { a2 = Identity(y) }
        >
    }
    """)
    for c1 in (True, False):
        for c2 in (True, False):
            _check(model, {"c1": np.array(c1), "c2": np.array(c2), "x": F3, "y": G3})


# -- Loop -----------------------------------------------------------------------------------------

LOOP_MODEL = """
agraph (int64 M, bool cond, float[2] a, float[2] k) => (float[2] a_final, float[N, 2] scan) {
    a_final, scan = Loop (M, cond, a) <
        body = body (int64 i, bool c_in, float[2] a_in) => (bool c_out, float[2] a_out,
                                                              float[2] s) {
            fi = Cast <to = 1> (i)
            step = Mul(k, fi)
            a_out = Add(a_in, step)
            s = Mul(a_out, a_out)
            limit = Constant <value = float {40.0}> ()
            total = ReduceSum <keepdims = 0> (a_out)
            c_out = Less(total, limit)
        }
    >
}
"""


@pytest.mark.parametrize("trips,cond", [(5, True), (100, True), (3, False), (0, True)])
def test_loop_scan_output_and_carried(trips, cond):
    feeds = {"M": np.array(trips, np.int64), "cond": np.array(cond),
             "a": np.array([1.0, 2.0], np.float32), "k": np.array([0.5, 1.5], np.float32)}
    _check(_parse(LOOP_MODEL), feeds)


def test_loop_without_trip_count_is_a_while_loop():
    model = _parse("""
    agraph (bool cond, float[2] a) => (float[2] a_final, float[N, 2] scan) {
        a_final, scan = Loop ("", cond, a) <
            body = body (int64 i, bool c_in, float[2] a_in) => (bool c_out, float[2] a_out,
                                                                  float[2] s) {
                two = Constant <value = float {2.0}> ()
                a_out = Mul(a_in, two)
                s = Identity(a_in)
                limit = Constant <value = float {100.0}> ()
                m = ReduceMax <keepdims = 0> (a_out)
                c_out = Less(m, limit)
            }
        >
    }
    """)
    _check(model, {"cond": np.array(True), "a": np.array([1.0, 3.0], np.float32)})


@pytest.mark.parametrize("body_cond", [0, 1])
def test_loop_without_cond_input(body_cond):
    # The spec's pseudo-code ignores the body's condition here; onnxruntime honours it.
    model = _parse("""
    agraph (int64 M, float[2] a) => (float[2] a_final) {
        a_final = Loop (M, "", a) <
            body = body (int64 i, bool c_in, float[2] a_in) => (bool c_out, float[2] a_out) {
                one = Constant <value = float {1.0}> ()
                a_out = Add(a_in, one)
                c_out = Constant <value = bool {BODY_COND}> ()
            }
        >
    }
    """.replace("BODY_COND", str(body_cond)))
    _check(model, {"M": np.array(4, np.int64), "a": np.array([1.0, 3.0], np.float32)})


def test_loop_carried_value_grows():
    model = _parse("""
    agraph (int64 M, float[1] seed) => (float[N] out, int64[K] iters) {
        out, iters = Loop (M, "", seed) <
            body = body (int64 i, bool c_in, float[N] acc) => (bool c_out, float[N] acc_out,
                                                                int64 it) {
                c_out = Identity(c_in)
                acc_out = Concat <axis = 0> (acc, seed)
                it = Identity(i)
            }
        >
    }
    """)
    _check(model, {"M": np.array(6, np.int64), "seed": np.array([2.5], np.float32)})


def test_loop_nested_in_if_reads_outer_values():
    model = _parse("""
    agraph (bool c, int64 M, float[2] a, float[2] k) => (float[2] r) {
        r = If (c) <
            then_branch = tb () => (float[2] t) {
                t = Loop (M, "", a) <
                    body = body (int64 i, bool c_in, float[2] a_in) => (bool c_out,
                                                                       float[2] a_out) {
                        c_out = Identity(c_in)
                        a_out = Add(a_in, k)
                    }
                >
            },
            else_branch = eb () => (float[2] e) { e = Sub(a, k) }
        >
    }
    """)
    for c in (True, False):
        _check(model, {"c": np.array(c), "M": np.array(3, np.int64),
                       "a": np.array([1.0, 2.0], np.float32),
                       "k": np.array([0.25, -1.0], np.float32)})


def test_nested_loops():
    model = _parse("""
    agraph (int64 M, int64 N, float[1] x) => (float[1] total, float[P, 1] rows) {
        total, rows = Loop (M, "", x) <
            body = outer (int64 i, bool c, float[1] acc) => (bool co, float[1] acc2,
                                                              float[1] row) {
                co = Identity(c)
                fi = Cast <to = 1> (i)
                inner_acc = Loop (N, "", acc) <
                    body = inner (int64 j, bool c2, float[1] a) => (bool co2, float[1] a2) {
                        co2 = Identity(c2)
                        fj = Cast <to = 1> (j)
                        t = Add(a, fj)
                        u = Mul(t, fi)
                        a2 = Add(u, x)
                    }
                >
                acc2 = Identity(inner_acc)
                row = Identity(inner_acc)
            }
        >
    }
    """)
    _check(model, {"M": np.array(3, np.int64), "N": np.array(4, np.int64),
                   "x": np.array([0.5], np.float32)})


def test_loop_with_sequence_carried():
    model = _parse("""
    agraph (int64 M, float[2] x) => (seq(float[2]) s) {
        empty = SequenceEmpty <dtype = 1> ()
        s = Loop (M, "", empty) <
            body = body (int64 i, bool c, seq(float[2]) acc) => (bool co, seq(float[2]) acc2) {
                co = Identity(c)
                fi = Cast <to = 1> (i)
                v = Mul(x, fi)
                acc2 = SequenceInsert(acc, v)
            }
        >
    }
    """)
    _check(model, {"M": np.array(3, np.int64), "x": np.array([1.0, -2.0], np.float32)})


# -- Scan -----------------------------------------------------------------------------------------

SCAN_MODEL = """
agraph (float[2] init, float[3, 4, 2] xs) => (float[2] final, float[3, 4, 2] ys,
                                             float[4, 3, 2] ys_t) {
    final, ys, ys_t = Scan (init, xs) <
        num_scan_inputs = 1, scan_input_axes = [1], scan_input_directions = [DIRECTION],
        scan_output_axes = [1, 0], scan_output_directions = [0, 1],
        body = body (float[2] s, float[3, 2] x) => (float[2] s2, float[3, 2] y, float[3, 2] y2) {
            REDUCE
            s2 = Add(s, r)
            y = Mul(x, s2)
            y2 = Identity(x)
        }
    >
}
"""


@pytest.mark.parametrize("direction", [0, 1])
@pytest.mark.parametrize("opset", [9, 11, 16, 21])
def test_scan(direction, opset):
    reduce = ("r = ReduceSum <axes = [0], keepdims = 0> (x)" if opset < 13 else
              "ax = Constant <value = int64[1] {0}> ()\n r = ReduceSum <keepdims = 0> (x, ax)")
    model = _parse(SCAN_MODEL.replace("DIRECTION", str(direction)).replace("REDUCE", reduce),
                   opset=opset)
    rng = np.random.default_rng(0)
    _check(model, {"init": np.array([0.5, -0.5], np.float32),
                   "xs": rng.standard_normal((3, 4, 2)).astype(np.float32)})


def test_scan_two_inputs_reads_outer():
    model = _parse("""
    agraph (float[2] w, float[5, 2] a, float[2, 5] b) => (float[2] acc, float[2, 5] out) {
        zero = Constant <value = float[2] {0.0, 0.0}> ()
        acc, out = Scan (zero, a, b) <
            num_scan_inputs = 2, scan_input_directions = [0, 1], scan_input_axes = [-2, -1],
            scan_output_axes = [-1],
            body = body (float[2] s, float[2] x, float[2] y) => (float[2] s2, float[2] o) {
                p = Mul(x, y)
                q = Mul(p, w)
                s2 = Add(s, q)
                o = Identity(s2)
            }
        >
    }
    """)
    rng = np.random.default_rng(1)
    _check(model, {"w": np.array([2.0, 0.5], np.float32),
                   "a": rng.standard_normal((5, 2)).astype(np.float32),
                   "b": rng.standard_normal((2, 5)).astype(np.float32)})


@pytest.mark.parametrize("with_lens", [False, True])
@pytest.mark.parametrize("direction", [0, 1])
def test_scan_8(with_lens, direction):
    model = _parse("""
    agraph (int64[2] lens, float[2, 3] init, float[2, 4, 3] xs) => (float[2, 3] final,
                                                                    float[2, 4, 3] ys) {
        final, ys = Scan (LENS, init, xs) <
            num_scan_inputs = 1, directions = [DIRECTION],
            body = body (float[3] s, float[3] x) => (float[3] s2, float[3] y) {
                s2 = Add(s, x)
                y = Mul(s2, x)
            }
        >
    }
    """.replace("LENS", "lens" if with_lens else '""').replace("DIRECTION", str(direction)),
                   opset=8)
    if not with_lens:
        model.graph.input.pop(0)
    rng = np.random.default_rng(2)
    feeds = {"init": rng.standard_normal((2, 3)).astype(np.float32),
             "xs": rng.standard_normal((2, 4, 3)).astype(np.float32)}
    if with_lens:
        feeds["lens"] = np.array([4, 2], np.int64)
    _check(model, feeds)


# -- sequences and optionals ----------------------------------------------------------------------


def test_sequence_ops():
    model = _parse("""
    agraph (float[2, 3] a, float[2, 3] b, float[2, 3] c, int64 p)
        => (seq(float[2, 3]) s_out, float[2, 3] at, int64 n, float[N, 3] cat, float[2, M, 3] st) {
        s = SequenceConstruct(a, b)
        s2 = SequenceInsert(s, c, p)
        s3 = SequenceInsert(s2, a)
        s_out = SequenceErase(s3, p)
        minus1 = Constant <value = int64 {-1}> ()
        at = SequenceAt(s_out, minus1)
        n = SequenceLength(s_out)
        cat = ConcatFromSequence <axis = 0> (s_out)
        st = ConcatFromSequence <axis = 1, new_axis = 1> (s_out)
    }
    """)
    rng = np.random.default_rng(3)
    feeds = {k: rng.standard_normal((2, 3)).astype(np.float32) for k in "abc"}
    for p in (0, 1, -2):
        _check(model, {**feeds, "p": np.array(p, np.int64)})


@pytest.mark.parametrize("split,attrs,dims", [
    (None, "axis = 1", "A, B"),
    (None, "axis = 1, keepdims = 0", "A"),
    ("int64 {2}", "axis = 1", "A, B"),
    ("int64[3] {1, 3, 1}", "axis = -1", "A, B"),
])
def test_split_to_sequence(split, attrs, dims):
    body = (f"sp = Constant <value = {split}> ()\n s = SplitToSequence <{attrs}> (x, sp)"
            if split else f"s = SplitToSequence <{attrs}> (x)")
    model = _parse(f"""
    agraph (float[2, 5] x) => (seq(float[{dims}]) s, int64 n) {{
        {body}
        n = SequenceLength(s)
    }}
    """)
    _check(model, {"x": np.arange(10, dtype=np.float32).reshape(2, 5)})


def test_sequence_input_and_output():
    model = _parse("""
    agraph (seq(float[2]) s, float[2] x) => (seq(float[2]) out, float[N, 2] cat) {
        out = SequenceInsert(s, x)
        cat = ConcatFromSequence <axis = 0, new_axis = 1> (out)
    }
    """)
    seq = [np.array([1.0, 2.0], np.float32), np.array([3.0, 4.0], np.float32)]
    _check(model, {"s": seq, "x": np.array([5.0, 6.0], np.float32)})


def test_sequence_map():
    model = _parse("""
    agraph (float[2, 6] x, float[3] w) => (seq(float[N]) out, seq(int64[2]) shapes) {
        s = SplitToSequence <axis = 1> (x)
        out, shapes = SequenceMap (s, w) <
            body = body (float[2, 1] t, float[3] v) => (float[N] r, int64[2] sh) {
                flat = Flatten <axis = 0> (t)
                fl = Squeeze(flat)
                r = Concat <axis = 0> (fl, v)
                sh = Shape(t)
            }
        >
    }
    """)
    _check(model, {"x": np.arange(12, dtype=np.float32).reshape(2, 6),
                   "w": np.array([7.0, 8.0, 9.0], np.float32)})


def test_optional_ops():
    model = _parse("""
    agraph (float[3] x) => (bool has_x, bool has_none, float[3] got, optional(float[3]) ox) {
        ox = Optional(x)
        has_x = OptionalHasElement(ox)
        none = Optional <type = float[3]> ()
        has_none = OptionalHasElement(none)
        got = OptionalGetElement(ox)
    }
    """, opset=18)
    _check(model, {"x": F3})


def test_optional_with_if():
    # A branch returning an empty optional, the other a value: onnxruntime's usual pattern.
    model = _parse("""
    agraph (bool c, float[3] x) => (bool has, optional(float[3]) o) {
        o = If (c) <
            then_branch = tb () => (optional(float[3]) t) { t = Optional(x) },
            else_branch = eb () => (optional(float[3]) e) { e = Optional <type = float[3]> () }
        >
        has = OptionalHasElement(o)
    }
    """, opset=18)
    for c in (True, False):
        _check(model, {"c": np.array(c), "x": F3})


def test_errors_name_the_node():
    model = _parse("""
    agraph (float[3] x) => (float[3] y) {
        s = SequenceConstruct(x)
        five = Constant <value = int64 {5}> ()
        y = SequenceAt(s, five)
    }
    """)
    with pytest.raises(onnxrun.RuntimeException, match="SequenceAt"):
        onnxrun.InferenceSession(model.SerializeToString()).run(None, {"x": F3})


def test_subgraph_kernels_see_outer_and_inner_initializers():
    """An LSTM inside a Loop body takes its weights from the main graph's initializers and its
    bias from the body's own initializer: both are constants at preparation time."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(5)
    t, b, i, h = 3, 2, 4, 5
    W = (rng.standard_normal((1, 4 * h, i)) * 0.5).astype(np.float32)
    R = (rng.standard_normal((1, 4 * h, h)) * 0.5).astype(np.float32)
    Bias = rng.standard_normal((1, 8 * h)).astype(np.float32)
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node("LSTM", ["x_in", "W", "R", "Bias"], ["y", "y_h"], hidden_size=h),
            helper.make_node("Squeeze", ["y", "axis1"], ["y_sq"]),
            helper.make_node("Slice", ["y_sq", "zero", "four", "two"], ["x_out"]),
        ],
        "body",
        [helper.make_tensor_value_info("iter", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("x_in", TensorProto.FLOAT, [t, b, i])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("x_out", TensorProto.FLOAT, [t, b, i]),
         helper.make_tensor_value_info("y_h", TensorProto.FLOAT, [1, b, h])],
        [numpy_helper.from_array(Bias, "Bias"),
         numpy_helper.from_array(np.array([1], np.int64), "axis1"),
         numpy_helper.from_array(np.array([0], np.int64), "zero"),
         numpy_helper.from_array(np.array([i], np.int64), "four"),
         numpy_helper.from_array(np.array([2], np.int64), "two")],
    )
    graph = helper.make_graph(
        [helper.make_node("Loop", ["M", "", "x"], ["x_final", "hs"], body=body)],
        "main",
        [helper.make_tensor_value_info("M", TensorProto.INT64, []),
         helper.make_tensor_value_info("x", TensorProto.FLOAT, [t, b, i])],
        [helper.make_tensor_value_info("x_final", TensorProto.FLOAT, [t, b, i]),
         helper.make_tensor_value_info("hs", TensorProto.FLOAT, [None, 1, b, h])],
        [numpy_helper.from_array(W, "W"), numpy_helper.from_array(R, "R")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    _check(model, {"M": np.array(3, np.int64),
                   "x": rng.standard_normal((t, b, i)).astype(np.float32)})
