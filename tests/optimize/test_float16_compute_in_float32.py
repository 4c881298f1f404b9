"""Float16ComputeInFloat32: float16 / bfloat16 models compute in float32, with Casts only at the
graph inputs and outputs; the extended fusions then fire as on the float32 original."""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import onnx.numpy_helper
import onnx.parser
import onnxruntime as ort
import pytest

import onnxrun
from onnxrun.transformers.float16 import convert_float_to_float16

MODELS = Path(__file__).resolve().parent.parent / "models"
LEVELS = onnxrun.GraphOptimizationLevel
PASS = "Float16ComputeInFloat32"
F16, BF16 = onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16
# Fused ops whose count must equal the float32 model's.
FUSED = ("Attention", "SkipLayerNormalization", "LayerNormalization", "FusedGemm", "FusedConv",
         "SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization")
# Per half type: (numpy dtype, tolerance against the level-0 run of the same model)
TOL = {"float16": (np.float16, 1e-2), "bfloat16": (ml_dtypes.bfloat16, 5e-2)}


def options(level, path: Path | None = None) -> onnxrun.SessionOptions:
    opts = onnxrun.SessionOptions()
    opts.graph_optimization_level = level
    if path is not None:
        opts.optimized_model_filepath = str(path)
    return opts


def session(model: onnx.ModelProto, level=LEVELS.ORT_ENABLE_ALL, path: Path | None = None,
            **kwargs) -> onnxrun.InferenceSession:
    return onnxrun.InferenceSession(model.SerializeToString(), options(level, path), **kwargs)


def changes(sess: onnxrun.InferenceSession) -> dict:
    return dict(sess.get_optimization_report().passes[PASS].changes)


def as_f32(a: np.ndarray) -> np.ndarray:
    return np.asarray(a).astype(np.float32)


def assert_close(got, want, tol: float) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_allclose(as_f32(g), as_f32(w), rtol=tol, atol=tol)


# -- the test models, converted ------------------------------------------------------------------


def to_bfloat16(m16: onnx.ModelProto) -> onnx.ModelProto:
    """The float16 model with every float16 tensor, type and Cast target bfloat16."""
    m = onnx.ModelProto()
    m.CopyFrom(m16)

    def bf16(t: onnx.TensorProto) -> onnx.TensorProto:
        a = onnx.numpy_helper.to_array(t).astype(np.float32).astype(ml_dtypes.bfloat16)
        return onnx.numpy_helper.from_array(a, t.name)

    def fix(g: onnx.GraphProto) -> None:
        for t in g.initializer:
            if t.data_type == F16:
                t.CopyFrom(bf16(t))
        for v in (*g.input, *g.output, *g.value_info):
            if v.type.tensor_type.elem_type == F16:
                v.type.tensor_type.elem_type = BF16
        for n in g.node:
            for a in n.attribute:
                if a.name == "to" and a.i == F16:
                    a.i = BF16
                if a.HasField("t") and a.t.data_type == F16:
                    a.t.CopyFrom(bf16(a.t))
                if a.HasField("g"):
                    fix(a.g)

    fix(m.graph)
    if any(n.op_type in ("Conv", "ConvTranspose") for n in m.graph.node):
        for o in m.opset_import:  # bfloat16 Conv from opset 22
            if o.domain in ("", "ai.onnx"):
                o.version = max(o.version, 22)
    return m


_CACHE: dict[tuple, onnx.ModelProto] = {}


def model(name: str, half: str = "float32", keep_io_types: bool = False) -> onnx.ModelProto:
    key = (name, half, keep_io_types)
    if key not in _CACHE:
        m = onnx.load(str(MODELS / f"{name}.onnx"))
        if half != "float32":
            m = convert_float_to_float16(m, keep_io_types=keep_io_types)
        if half == "bfloat16":
            m = to_bfloat16(m)
        _CACHE[key] = m
    return _CACHE[key]


def feeds(name: str, half: str, keep_io_types: bool) -> dict[str, np.ndarray]:
    data = np.load(MODELS / f"{name}.inputs.npz")
    out = {k.split("/", 1)[1]: data[k] for k in data.files if k.startswith("0/")}
    if half != "float32" and not keep_io_types:
        dt = TOL[half][0]
        out = {k: v.astype(dt) if v.dtype == np.float32 else v for k, v in out.items()}
    return out


def fused_counts(path: Path) -> Counter:
    saved = onnx.load(str(path))
    return Counter(n.op_type for n in saved.graph.node)


NAMES = ["bert_tiny", "gpt_tiny", "mobilenet_tiny"]
VARIANTS = [("float16", False), ("float16", True), ("bfloat16", False)]


@pytest.fixture(scope="module")
def float32_counts(tmp_path_factory) -> dict[str, Counter]:
    out = {}
    for name in NAMES:
        path = tmp_path_factory.mktemp(name) / "fp32.onnx"
        sess = session(model(name), LEVELS.ORT_ENABLE_EXTENDED, path)
        assert not changes(sess)  # a float32 model is not touched
        out[name] = fused_counts(path)
    return out


@pytest.mark.parametrize("half,keep_io_types", VARIANTS)
@pytest.mark.parametrize("name", NAMES)
def test_converted_models(name, half, keep_io_types, float32_counts, tmp_path):
    m = model(name, half, keep_io_types)
    f = feeds(name, half, keep_io_types)
    plain = session(m, LEVELS.ORT_DISABLE_ALL)
    want = plain.run(None, f)
    path = tmp_path / "optimized.onnx"
    sess = session(m, LEVELS.ORT_ENABLE_EXTENDED, path)
    got = sess.run(None, f)
    # same names and dtypes as declared, values within half-precision tolerance
    assert [o.name for o in sess.get_outputs()] == [o.name for o in plain.get_outputs()]
    assert [o.type for o in sess.get_outputs()] == [o.type for o in plain.get_outputs()]
    assert_close(got, want, TOL[half][1])
    assert changes(sess)["initializers"] > 0
    assert PASS in sess.get_optimization_report().format()
    # the fusions fire as on the float32 model
    counts, expected = fused_counts(path), float32_counts[name]
    assert {op: counts[op] for op in FUSED} == {op: expected[op] for op in FUSED}
    assert sum(expected[op] for op in FUSED) > 0
    # inside, everything is float32: only the boundary Casts see 16-bit types
    saved = onnx.load(str(path))
    low = {F16, BF16}
    assert not any(t.data_type in low for t in saved.graph.initializer)
    outputs = {o.name for o in saved.graph.output}
    for n in saved.graph.node:
        to = next((a.i for a in n.attribute if a.name == "to"), None)
        if n.op_type == "Cast" and to in low:
            assert set(n.output) <= outputs


@pytest.mark.parametrize("name", ["bert_tiny", "gpt_tiny"])
def test_gelu_fused_like_float32(name, float32_counts, tmp_path):
    path = tmp_path / "optimized.onnx"
    session(model(name, "float16"), LEVELS.ORT_ENABLE_EXTENDED, path)
    counts, expected = fused_counts(path), float32_counts[name]
    counts.pop("Cast", None)
    expected.pop("Cast", None)
    assert counts == expected


def test_float16_is_as_accurate_as_the_float16_run():
    """Against the float32 original, the converted run errs no more than the float16 run."""
    name = "bert_tiny"
    f = feeds(name, "float32", False)
    truth = session(model(name), LEVELS.ORT_DISABLE_ALL).run(None, f)
    m = model(name, "float16", keep_io_types=True)
    plain = session(m, LEVELS.ORT_DISABLE_ALL).run(None, f)
    fast = session(m).run(None, f)
    for t, p, q in zip(truth, plain, fast, strict=True):
        assert np.abs(q - t).max() <= np.abs(p - t).max()


def test_saved_model_is_stable(tmp_path):
    """The optimized model, loaded again, gives the pass nothing to do."""
    m = model("mobilenet_tiny", "float16")
    # saved as optimized (the session's IR no longer holds the weights its kernels packed)
    sess = session(m, LEVELS.ORT_ENABLE_EXTENDED, tmp_path / "optimized.onnx")
    saved = onnx.load(str(tmp_path / "optimized.onnx"))
    again = session(saved, LEVELS.ORT_ENABLE_EXTENDED)
    assert not changes(again)
    f = feeds("mobilenet_tiny", "float16", False)
    assert_close(again.run(None, f), sess.run(None, f), 1e-6)


def test_can_be_turned_off():
    m = model("gpt_tiny", "float16")
    sess = session(m, disabled_optimizers=[PASS])
    assert PASS not in sess.get_optimization_report().format()
    assert "AttentionFusion" not in sess.get_optimization_report().format()


# -- minimal models ------------------------------------------------------------------------------

HEAD = '<ir_version: 10, opset_import: ["" : 19]>\n'
rng = np.random.default_rng(0)


def build(text: str, head: str = HEAD, **inits: np.ndarray) -> onnx.ModelProto:
    """Parse a model; tensors written ``half[...] {...}`` in attributes become float16 (the
    parser reads float16 literals as bit patterns)."""
    m = onnx.parser.parse_model(head + text.replace("half[", "float["))
    if "half[" in text:
        _halve_attributes(m.graph)
    m.graph.initializer.extend(onnx.numpy_helper.from_array(v, k) for k, v in inits.items())
    return m


def _halve_attributes(g: onnx.GraphProto) -> None:
    for n in g.node:
        for a in n.attribute:
            if a.HasField("t") and a.t.data_type == onnx.TensorProto.FLOAT:
                arr = onnx.numpy_helper.to_array(a.t).astype(np.float16)
                a.t.CopyFrom(onnx.numpy_helper.from_array(arr, a.t.name))
            if a.HasField("g"):
                _halve_attributes(a.g)


def check_fires(m: onnx.ModelProto, f: dict, tmp_path, tol: float = 1e-2, oracle: bool = True):
    """Run optimized and at level 0; the pass fires, outputs agree within float16 tolerance,
    and onnxruntime runs the saved model alike. Returns (changes, saved model)."""
    want = session(m, LEVELS.ORT_DISABLE_ALL).run(None, f)
    path = tmp_path / "optimized.onnx"
    sess = session(m, LEVELS.ORT_ENABLE_EXTENDED, path)
    assert_close(sess.run(None, f), want, tol)
    saved = onnx.load(str(path))
    onnx.checker.check_model(saved)
    if oracle:
        ort_opts = ort.SessionOptions()
        ort_opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        ort_sess = ort.InferenceSession(str(path), ort_opts, providers=["CPUExecutionProvider"])
        assert_close(ort_sess.run(None, f), want, tol)
    assert changes(sess)
    return changes(sess), saved


def op_types(m: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in m.graph.node]


def test_fires_on_a_minimal_model(tmp_path):
    m = build("""
        g (float16[N, 8] x) => (float16[N, 4] y) {
            h = MatMul(x, w)
            z = Add(h, b)
            y = Relu(z)
        }""", w=rng.standard_normal((8, 4)).astype(np.float16),
        b=rng.standard_normal(4).astype(np.float16))
    f = {"x": rng.standard_normal((3, 8)).astype(np.float16)}
    found, saved = check_fires(m, f, tmp_path)
    assert found["initializers"] == 2
    assert found["graph inputs"] == 1 and found["graph outputs"] == 1
    g = saved.graph
    assert g.node[0].op_type == "Cast" and g.node[-1].op_type == "Cast"
    assert g.node[-1].output[0] == "y" and g.input[0].name == "x"
    assert g.input[0].type.tensor_type.elem_type == F16
    assert g.output[0].type.tensor_type.elem_type == F16
    assert all(t.data_type == onnx.TensorProto.FLOAT for t in g.initializer)
    inner = {vi.name: vi.type.tensor_type.elem_type for vi in g.value_info}
    assert set(inner.values()) == {onnx.TensorProto.FLOAT}


def test_attribute_types_and_tensors(tmp_path):
    """Constant, ConstantOfShape, EyeLike/RandomNormal dtype, Cast targets: all float32."""
    m = build("""
        g (float16[2, 3] x, int32[3, 3] q) => (float16[2, 3] y, bfloat16[2, 3] z, float16[3, 3] e,
                                float16[2, 2] r) {
            c = Constant <value = half[1] {0.25}> ()
            s = Constant <value = int64[2] {2, 3}> ()
            k = ConstantOfShape <value = half[1] {1.5}> (s)
            xc = Mul(x, c)
            y = Add(xc, k)
            z = Cast <to = 16> (y)
            sq = Constant <value = half[3, 3] {0, 0, 0, 0, 0, 0, 0, 0, 0}> ()
            e1 = EyeLike <dtype = 10> (q)
            e = Add(e1, sq)
            r0 = RandomNormal <dtype = 10, shape = [2, 2], seed = 1.0> ()
            r = Mul(r0, c)
        }""")
    f = {"x": rng.standard_normal((2, 3)).astype(np.float16), "q": np.zeros((3, 3), np.int32)}
    want = session(m, LEVELS.ORT_DISABLE_ALL).run(None, f)
    path = tmp_path / "optimized.onnx"
    sess = session(m, LEVELS.ORT_ENABLE_EXTENDED, path)
    got = sess.run(None, f)
    assert_close(got[:3], want[:3], 1e-2)
    assert got[3].dtype == np.float16 and got[3].shape == (2, 2)  # random: type and shape only
    found = changes(sess)
    assert found["EyeLike dtype"] == 1 and found["RandomNormal dtype"] == 1
    saved = onnx.load(str(path))
    low_attrs = [a for n in saved.graph.node for a in n.attribute
                 if (a.HasField("t") and a.t.data_type in (F16, BF16))]
    assert not low_attrs
    dtypes = {next(a.i for a in n.attribute if a.name in ("to", "dtype"))
              for n in saved.graph.node if n.op_type in ("EyeLike", "RandomNormal")}
    assert dtypes <= {onnx.TensorProto.FLOAT}


def test_mid_graph_cast_to_float16_becomes_float32(tmp_path):
    """A documented choice: intermediate rounding to float16 is not kept (as onnxruntime's CPU
    provider computes the ops it wraps in Casts); only the graph output is rounded."""
    m = build("""
        g (float16[4] x) => (float16[4] y) {
            a = Cast <to = 1> (x)
            b = Mul(a, big)
            c = Cast <to = 10> (b)
            y = Div(c, big16)
        }""", big=np.array([1e5], np.float32), big16=np.array([8.0], np.float16))
    f = {"x": np.array([1, 2, 3, 4], np.float16)}
    sess = session(m, LEVELS.ORT_ENABLE_EXTENDED)
    # float16 overflows to inf at c; computed in float32 it does not
    assert np.all(np.isinf(session(m, LEVELS.ORT_DISABLE_ALL).run(None, f)[0]))
    expected = (f["x"].astype(np.float32) * np.float32(1e5 / 8)).astype(np.float16)
    assert np.all(np.isfinite(expected))
    np.testing.assert_array_equal(sess.run(None, f)[0], expected)
    assert changes(sess)["Cast to"] == 1


def test_loop_if_and_scan_bodies_convert_consistently(tmp_path):
    """Loop-carried float16 state, a float16 constant inside the body, If branches reading outer
    float16 values, a Scan: all float32 inside, results as at level 0."""
    m = build("""
        g (float16[2] x, bool c, int64 n) => (float16[2] y, float16[2] z, float16[3, 2] s) {
            y = Loop(n, c, x) <body = body (int64 i, bool cond, float16[2] acc)
                                      => (bool co, float16[2] next) {
                co = Identity(cond)
                h = Constant <value = half[1] {0.5}> ()
                m = Mul(acc, h)
                next = Add(m, w)
            }>
            z = If(c) <then_branch = t () => (float16[2] o) { o = Identity(x) },
                       else_branch = e () => (float16[2] o2) { o2 = Mul(x, w) }>
            rows = Constant <value = half[3, 2] {1, 2, 3, 4, 5, 6}> ()
            last, s = Scan(x, rows) <num_scan_inputs = 1, body = sb (float16[2] st, float16[2] r)
                                        => (float16[2] st2, float16[2] out) {
                st2 = Add(st, r)
                out = Mul(st2, r)
            }>
        }""", w=np.array([0.25, -1.5], np.float16))
    f = {"x": np.array([1.0, 2.0], np.float16), "c": np.array(True), "n": np.array(3)}
    found, saved = check_fires(m, f, tmp_path, oracle=False)
    assert found["value types"] > 0
    for n in saved.graph.node:
        for a in n.attribute:
            if a.HasField("g"):
                body = a.g
                types = [v.type.tensor_type.elem_type for v in (*body.input, *body.output)]
                assert F16 not in types, n.op_type
    f["c"] = np.array(False)
    assert_close(session(m).run(None, f), session(m, LEVELS.ORT_DISABLE_ALL).run(None, f), 1e-2)


def test_boundaries(tmp_path):
    """An input read only by Casts needs no Cast of its own; an input returned as an output, an
    initializer output and an overridable initializer keep their float16 values."""
    m = build("""
        g (float16[2] x, float16[2] p) => (float[2] a, float16[2] x2, float16[2] k, float16[2] q) {
            a = Cast <to = 1> (x)
            x2 = Identity(x)
            k = Identity(kc)
            q = Mul(p, kc)
        }""", kc=np.array([3.0, 4.0], np.float16), p=np.array([1.0, 2.0], np.float16))
    f = {"x": np.array([1.0, 2.0], np.float16)}
    _, saved = check_fires(m, f, tmp_path, oracle=False)
    names = [(n.op_type, list(n.input)) for n in saved.graph.node]
    assert ("Cast", ["x"]) in names
    assert sum(1 for op, ins in names if op == "Cast" and ins == ["x"]) == 1
    sess = session(m, LEVELS.ORT_ENABLE_EXTENDED)
    f["p"] = np.array([-1.0, 0.5], np.float16)  # an initializer listed as an input is fed
    np.testing.assert_array_equal(sess.run(["q"], f)[0], np.array([-3.0, 2.0], np.float16))


# -- where it must not fire ----------------------------------------------------------------------


def check_untouched(m: onnx.ModelProto, f: dict, exact: bool = True) -> None:
    want = session(m, LEVELS.ORT_DISABLE_ALL).run(None, f)
    sess = session(m, LEVELS.ORT_ENABLE_EXTENDED)
    assert not changes(sess)
    got = sess.run(None, f)
    for g, w in zip(got, want, strict=True):
        for a, b in zip(*(x if isinstance(x, list) else [x] for x in (g, w)), strict=True):
            assert a.dtype == b.dtype
            if exact:
                np.testing.assert_array_equal(a, b)


def test_bitcast_is_refused(caplog):
    m = build("""
        g (float16[4] x) => (int16[4] y, float16[4] z) {
            s = Add(x, x)
            y = BitCast <to = 5> (s)
            z = Mul(x, w)
        }""", head='<ir_version: 10, opset_import: ["" : 26]>\n',
        w=np.array([0.1, 0.2, 0.3, 0.4], np.float16))
    with caplog.at_level(logging.DEBUG, logger="onnxrun"):
        check_untouched(m, {"x": np.array([1, 2, 3, 4], np.float16)})
    assert "BitCast" in caplog.text and PASS in caplog.text


def test_cast_to_string_is_refused():
    m = build("""
        g (float16[2] x) => (string[2] y) {
            s = Mul(x, w)
            y = Cast <to = 8> (s)
        }""", w=np.array([0.1, 3.0], np.float16))
    check_untouched(m, {"x": np.array([1.0, 2.0], np.float16)})


def test_sequence_output_is_refused():
    m = build("""
        g (float16[2] x) => (seq(float16[2]) y) {
            s = Mul(x, w)
            y = SequenceConstruct(s, x)
        }""", w=np.array([0.1, 3.0], np.float16))
    check_untouched(m, {"x": np.array([1.0, 2.0], np.float16)})


def test_float32_model_with_explicit_rounding_is_untouched():
    """Explicit round trips through float16 in a model that holds no 16-bit data are intent."""
    m = build("""
        g (float[4] x) => (float[4] y) {
            h = Cast <to = 10> (x)
            y = Cast <to = 1> (h)
        }""")
    check_untouched(m, {"x": np.array([0.1, 1e5, 1 / 3, 2.0], np.float32)})

