"""onnxrun without the onnx package (and without ml_dtypes): the path Pyodide takes, on CPython.

Each check runs in a child process where ``import onnx`` and ``import ml_dtypes`` fail
(tests/pyodide/conformance.py's blocker), on models this process builds with onnx. The same
models run here, with onnx, as the oracle. The Pyodide lane itself is tests/pyodide/lane.sh.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxrun

HERE = os.path.dirname(os.path.abspath(__file__))
RUNNER = os.path.join(HERE, "pyodide")


def _child(code: str, block: str = "onnx,ml_dtypes") -> dict:
    """Run ``code`` with ``block`` unimportable; it sets ``result`` (JSON) for the parent."""
    script = textwrap.dedent(f"""
        import json, sys
        sys.path.insert(0, {RUNNER!r})
        import conformance
        conformance.block(set({block!r}.split(",")))
        import numpy as np
        import onnxrun, onnxrun.proto
        result = {{}}
    """) + textwrap.dedent(code) + "\nprint('RESULT=' + json.dumps(result))\n"
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    line = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT=")][-1]
    return json.loads(line[len("RESULT="):])


def _model(nodes, inputs, outputs, opset=17, **kw) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "g", inputs, outputs, initializer=kw.pop("initializer", []))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], **kw)


def _vi(name, elem, shape):
    return helper.make_tensor_value_info(name, elem, shape)


def _write(tmp_path, name: str, mp: onnx.ModelProto) -> str:
    path = str(tmp_path / name)
    onnx.save(mp, path)
    return path


def test_imports_without_onnx_and_runs_a_model(tmp_path):
    w = np.arange(6, dtype=np.float32).reshape(3, 2)
    mp = _model(
        [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Relu", ["m"], ["y"])],
        [_vi("x", TensorProto.FLOAT, [2, 3])], [_vi("y", TensorProto.FLOAT, [2, 2])],
        initializer=[numpy_helper.from_array(w, "w")])
    path = _write(tmp_path, "m.onnx", mp)
    x = np.array([[1, -2, 3], [-4, 5, -6]], np.float32)
    expected = onnxrun.InferenceSession(path).run(None, {"x": x})[0]
    r = _child(f"""
        x = np.array({x.tolist()!r}, np.float32)
        s = onnxrun.InferenceSession(open({path!r}, "rb").read())  # from bytes
        result["y"] = s.run(None, {{"x": x}})[0].tolist()
        result["path"] = onnxrun.InferenceSession({path!r}).run(None, {{"x": x}})[0].tolist()
        result["have_onnx"] = onnxrun.proto.HAVE_ONNX
        result["onnx_loaded"] = "onnx" in sys.modules or "ml_dtypes" in sys.modules
        result["inputs"] = [(i.name, i.type, i.shape) for i in s.get_inputs()]
    """)
    assert r["have_onnx"] is False and r["onnx_loaded"] is False
    np.testing.assert_array_equal(r["y"], expected)
    np.testing.assert_array_equal(r["path"], expected)
    assert r["inputs"] == [["x", "tensor(float)", [2, 3]]]


_LOAD_ERROR = textwrap.dedent("""
    try:
        onnxrun.InferenceSession({path!r})
        result["error"] = None
    except Exception as e:
        result["error"] = [type(e).__name__, str(e), [c.__name__ for c in type(e).__mro__]]
""")


@pytest.mark.parametrize(
    "case", ["type_mismatch", "missing_attribute", "unknown_op", "too_few_inputs", "no_inputs"])
def test_bad_models_fail_at_load_as_with_onnx(tmp_path, case):
    if case == "type_mismatch":
        mp = _model([helper.make_node("Add", ["x", "y"], ["z"], name="add")],
                    [_vi("x", TensorProto.FLOAT, [2]), _vi("y", TensorProto.INT64, [2])],
                    [_vi("z", TensorProto.FLOAT, [2])])
    elif case == "missing_attribute":  # Cast without its required 'to'
        mp = _model([helper.make_node("Cast", ["x"], ["z"], name="cast")],
                    [_vi("x", TensorProto.FLOAT, [2])], [_vi("z", TensorProto.FLOAT, [2])])
    elif case in ("too_few_inputs", "no_inputs"):  # Reshape needs its shape (2 inputs)
        # Without onnx this was a run-time error (1 input) or an IndexError in an optimizer
        # pass (none, after a Flatten: the reshape-chain fusion).
        mp = _model([helper.make_node("Flatten", ["x"], ["f"], name="flat"),
                     helper.make_node("Reshape", ["f"] if case == "too_few_inputs" else [],
                                      ["z"], name="rs")],
                    [_vi("x", TensorProto.FLOAT, [2, 3])], [_vi("z", TensorProto.FLOAT, [6])])
    else:
        mp = _model([helper.make_node("NoSuchOperator", ["x"], ["z"], name="nso")],
                    [_vi("x", TensorProto.FLOAT, [2])], [_vi("z", TensorProto.FLOAT, [2])])
    path = _write(tmp_path, f"{case}.onnx", mp)
    with pytest.raises(onnxrun.errors.OnnxRunError) as with_onnx:
        onnxrun.InferenceSession(path)
    r = _child(_LOAD_ERROR.format(path=path))
    assert r["error"] is not None, f"{case}: loaded without onnx"
    name, message, mro = r["error"]
    assert "OnnxRunError" in mro
    # The same kind of error as with onnx, naming the node or the operator.
    assert name == type(with_onnx.value).__name__
    needle = {"type_mismatch": "add", "missing_attribute": "to", "unknown_op": "NoSuchOperator",
              "too_few_inputs": "rs", "no_inputs": "rs"}
    assert needle[case] in message, message


def test_a_bypassed_node_keeps_the_graph_outputs_declared_type(tmp_path):
    """Relu -> Identity -> graph output: the Identity is bypassed and Relu's output takes the
    output's name. Without shape inference Relu's output has no type: the output's declared
    type stays what get_outputs reports (it reported "unknown", [])."""
    mp = _model([helper.make_node("Relu", ["x"], ["b"]),
                 helper.make_node("Identity", ["b"], ["y"])],
                [_vi("x", TensorProto.FLOAT, [2])], [_vi("y", TensorProto.FLOAT, [2])])
    path = _write(tmp_path, "bypass.onnx", mp)
    expected = [(o.name, o.type, o.shape) for o in onnxrun.InferenceSession(path).get_outputs()]
    r = _child(f"""
        s = onnxrun.InferenceSession({path!r})
        result["outputs"] = [(o.name, o.type, o.shape) for o in s.get_outputs()]
        result["y"] = s.run(None, {{"x": np.array([-1, 1], np.float32)}})[0].tolist()
    """)
    assert expected == [("y", "tensor(float)", [2])]
    assert [tuple(o) for o in r["outputs"]] == expected
    assert r["y"] == [0, 1]


def test_kernels_need_no_more_inputs_than_the_schemas():
    """Validation without onnx refuses a node with fewer inputs than its kernel needs
    (``KernelDef.min_inputs``): that refuses no model onnx's checker accepts only while no
    CPU kernel needs more inputs than its operator's schema at any opset."""
    from onnxrun.providers.cpu.kernels import cpu_kernels as registry

    registry.import_all()
    stricter, compared = [], 0
    for domain, op_type, _ in registry.operators():
        if domain != "":
            continue
        for opset in range(1, onnx.defs.onnx_opset_version() + 1):
            kdef = registry.lookup("", op_type, opset)
            try:
                schema = onnx.defs.get_schema(op_type, opset, "")
            except onnx.defs.SchemaError:
                continue
            if kdef is not None:
                compared += 1
                if kdef.min_inputs > schema.min_input:
                    stricter.append((op_type, opset, kdef.min_inputs, schema.min_input))
    assert compared > 1000 and not stricter, stricter


def _local_function_model() -> onnx.ModelProto:
    """Two model-local functions: one calls the other (twice per call), and a Constant in the
    inner one reads the call's attribute by reference."""
    scale = helper.make_function(
        "local", "Scale", ["a"], ["b"],
        [helper.make_node("Constant", [], ["c"]),
         helper.make_node("Mul", ["a", "c"], ["b"])],
        [helper.make_opsetid("", 17)], attributes=["factor"])
    # bind Constant 'c' to the attribute 'factor' by reference
    ref = onnx.AttributeProto(name="value_float", ref_attr_name="factor",
                              type=onnx.AttributeProto.FLOAT)
    scale.node[0].attribute.append(ref)
    outer = helper.make_function(
        "local", "ScaleAdd", ["x", "y"], ["z"],
        [helper.make_node("Scale", ["x"], ["t"], domain="local", factor=3.0),
         helper.make_node("Scale", ["y"], ["u"], domain="local", factor=-1.0),
         helper.make_node("Add", ["t", "u"], ["z"])],
        [helper.make_opsetid("", 17), helper.make_opsetid("local", 1)])
    mp = _model([helper.make_node("ScaleAdd", ["x", "y"], ["z"], domain="local"),
                 helper.make_node("ScaleAdd", ["z", "x"], ["w"], domain="local")],
                [_vi("x", TensorProto.FLOAT, [3]), _vi("y", TensorProto.FLOAT, [3])],
                [_vi("w", TensorProto.FLOAT, [3])])
    mp.opset_import.append(helper.make_opsetid("local", 1))
    mp.functions.extend([scale, outer])
    return mp


def test_model_local_functions_inlined_by_onnxrun(tmp_path):
    path = _write(tmp_path, "functions.onnx", _local_function_model())
    x = np.array([1, 2, 3], np.float32)
    y = np.array([10, 20, 30], np.float32)
    expected = onnxrun.InferenceSession(path).run(None, {"x": x, "y": y})[0]
    np.testing.assert_allclose(expected, 3 * (3 * x - y) - x)  # the model means this
    r = _child(f"""
        s = onnxrun.InferenceSession({path!r})
        x, y = np.array({x.tolist()!r}, np.float32), np.array({y.tolist()!r}, np.float32)
        result["w"] = s.run(None, {{"x": x, "y": y}})[0].tolist()
    """)
    np.testing.assert_array_equal(r["w"], expected)


def test_recursive_local_function_is_refused(tmp_path):
    f = helper.make_function("local", "F", ["a"], ["b"],
                             [helper.make_node("F", ["a"], ["b"], domain="local")],
                             [helper.make_opsetid("local", 1)])
    mp = _model([helper.make_node("F", ["x"], ["y"], domain="local")],
                [_vi("x", TensorProto.FLOAT, [1])], [_vi("y", TensorProto.FLOAT, [1])])
    mp.opset_import.append(helper.make_opsetid("local", 1))
    mp.functions.append(f)
    path = str(tmp_path / "recursive.onnx")
    with open(path, "wb") as fh:
        fh.write(mp.SerializeToString())
    r = _child(_LOAD_ERROR.format(path=path))
    assert r["error"][0] == "InvalidGraph" and "calls itself" in r["error"][1]


def test_narrow_types_name_ml_dtypes(tmp_path):
    mp = _model([helper.make_node("Cast", ["x"], ["y"], to=TensorProto.BFLOAT16),
                 helper.make_node("Cast", ["y"], ["z"], to=TensorProto.FLOAT)],
                [_vi("x", TensorProto.FLOAT, [2])], [_vi("z", TensorProto.FLOAT, [2])])
    path = _write(tmp_path, "bf16.onnx", mp)
    mp2 = _model([helper.make_node("Identity", ["x"], ["y"])],
                 [_vi("x", TensorProto.BFLOAT16, [2])], [_vi("y", TensorProto.BFLOAT16, [2])])
    path2 = _write(tmp_path, "bf16_io.onnx", mp2)
    x = [1.5, 2.25]
    got = onnxrun.InferenceSession(path).run(None, {"x": np.array(x, np.float32)})[0]
    r = _child(textwrap.dedent(f"""
        try:
            s = onnxrun.InferenceSession({path!r})
            s.run(None, {{"x": np.array({x!r}, np.float32)}})
            result["cast"] = None
        except Exception as e:
            result["cast"] = [type(e).__name__, str(e)]
    """) + _LOAD_ERROR.format(path=path2))
    assert r["error"][0] == "NarrowTypeUnavailable" and "ml_dtypes" in r["error"][1]
    assert "graph input 'x'" in r["error"][1]
    assert r["cast"] is not None and "ml_dtypes" in r["cast"][1]
    # with ml_dtypes but still without onnx, narrow types work
    r = _child(f"""
        s = onnxrun.InferenceSession({path!r})
        result["z"] = s.run(None, {{"x": np.array({x!r}, np.float32)}})[0].tolist()
    """, block="onnx")
    np.testing.assert_array_equal(r["z"], got)


def test_pure_tensor_conversion_matches_onnx():
    """pure.py's to_array / from_array against onnx's numpy_helper, every plain type and the
    typed (non-raw) fields."""
    arrays = {
        "f32": np.array([[1.5, -2.0]], np.float32), "f64": np.array([3.25], np.float64),
        "f16": np.array([0.5, -1.0, 65504.0], np.float16), "i8": np.array([-3, 7], np.int8),
        "u8": np.array([200, 1], np.uint8), "i16": np.array([-300], np.int16),
        "u16": np.array([60000], np.uint16), "i32": np.array([-(2**31)], np.int32),
        "i64": np.array([2**40, -1], np.int64), "u32": np.array([2**32 - 1], np.uint32),
        "u64": np.array([2**63], np.uint64), "b": np.array([True, False]),
        "c64": np.array([1 + 2j], np.complex64), "c128": np.array([3 - 4j], np.complex128),
        "s": np.array(["ab", "cd"], dtype=object), "scalar": np.array(7, np.int64),
    }
    protos = {k: numpy_helper.from_array(v, k).SerializeToString().hex() for k, v in arrays.items()}
    typed = {  # the same values in typed fields, as older exporters write them
        "f16_typed": helper.make_tensor("f16_typed", TensorProto.FLOAT16, [2],
                                        np.array([0.5, -1.0], np.float16).view(np.uint16)),
        "i8_typed": helper.make_tensor("i8_typed", TensorProto.INT8, [2], [-3, 7]),
        "f32_typed": helper.make_tensor("f32_typed", TensorProto.FLOAT, [2], [1.5, 2.5]),
        "u64_typed": helper.make_tensor("u64_typed", TensorProto.UINT64, [1], [2**63]),
        "c64_typed": helper.make_tensor("c64_typed", TensorProto.COMPLEX64, [1], [1 + 2j]),
    }
    protos.update({k: t.SerializeToString().hex() for k, t in typed.items()})
    r = _child(f"""
        from onnxrun.proto import onnx
        out = {{}}
        for k, h in {protos!r}.items():
            t = onnx.TensorProto()
            t.ParseFromString(bytes.fromhex(h))
            a = onnx.numpy_helper.to_array(t)
            back = onnx.numpy_helper.from_array(a, k)
            b = onnx.numpy_helper.to_array(back)
            out[k] = [str(a.dtype), list(a.shape), [repr(v) for v in a.reshape(-1).tolist()],
                      [repr(v) for v in b.reshape(-1).tolist()]]
        result = out
    """)
    for k, h in protos.items():
        t = onnx.TensorProto()
        t.ParseFromString(bytes.fromhex(h))
        ref = numpy_helper.to_array(t)
        dtype, shape, values, round_trip = r[k]
        assert dtype == str(ref.dtype) and shape == list(ref.shape), k
        assert values == [repr(v) for v in ref.reshape(-1).tolist()], k
        assert round_trip == values, k


def test_conformance_subset_without_onnx(tmp_path):
    """A slice of the ONNX node conformance cases, written to files here and run through
    tests/pyodide/conformance.py without onnx and ml_dtypes: the Pyodide lane's path."""
    export = subprocess.run(
        [sys.executable, os.path.join(RUNNER, "export_cases.py"), str(tmp_path)],
        capture_output=True, text=True, timeout=300)
    assert export.returncode == 0, export.stderr[-2000:]
    pattern = (r"^test_(add|conv|gather|reshape|softmax|lstm|gru|loop|if|scan|resize|slice|"
               r"where|einsum|cast_|layer_norm|matmul|maxpool|averagepool|split|concat|top_k)")
    out = subprocess.run(
        [sys.executable, os.path.join(RUNNER, "conformance.py"), str(tmp_path), "-k", pattern,
         "--block", "onnx,ml_dtypes", "--json", str(tmp_path / "r.json")],
        capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    results = json.loads((tmp_path / "r.json").read_text())
    assert len(results) > 300
    failed = {k: v for k, v in results.items() if v[0] != "pass"}
    # Only narrow-type cases may fail, and they must say that ml_dtypes is what is missing.
    assert all("ml_dtypes" in msg for _, msg in failed.values()), failed


def test_as_intp_is_a_checked_cast(monkeypatch):
    """Indices as numpy's index type: a no-op where intp is int64; where it is int32 (wasm32,
    simulated here), int64 indices are cast, and values that do not fit are an IndexError,
    never wrapped around into other, in-range indices."""
    from onnxrun.providers.cpu import indices

    idx = np.array([0, -1, 2], np.int64)
    assert indices.as_intp(idx) is idx or indices.INTP != np.int64
    monkeypatch.setattr(indices, "INTP", np.dtype(np.int32))
    monkeypatch.setattr(indices, "_LIMITS", np.iinfo(np.int32))
    got = indices.as_intp(idx)
    assert got.dtype == np.int32 and got.tolist() == [0, -1, 2]
    assert indices.as_intp(np.array([3], np.uint8)).dtype == np.int32
    with pytest.raises(IndexError, match="2147483648 is out of range"):
        indices.as_intp(np.array([1, 2**31], np.int64))
    with pytest.raises(IndexError, match="out of range"):
        indices.as_intp(np.array(-(2**40), np.int64), "indices")
    assert indices.as_intp(np.zeros(0, np.int64)).dtype == np.int32


def test_without_threads_parallel_mode_and_run_async_run_sequentially(tmp_path, monkeypatch):
    """Where no thread can start (Pyodide), ORT_PARALLEL runs the graph on the calling thread
    and run_async runs before it returns, its callback getting (results, user_data, err) as
    onnxruntime's does; kernels do not split. Never an exception."""
    import threading

    from onnxrun import threads

    branches = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Neg", ["x"], ["b"]),
                helper.make_node("Add", ["a", "b"], ["y"])]
    path = _write(tmp_path, "par.onnx", _model(
        branches, [_vi("x", TensorProto.FLOAT, [4])], [_vi("y", TensorProto.FLOAT, [4])]))
    x = np.array([-2, -1, 1, 2], np.float32)

    def refuse(self, *a, **k):
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading.Thread, "start", refuse)
    monkeypatch.setattr(threads, "available", lambda: False)
    so = onnxrun.SessionOptions()
    so.execution_mode = onnxrun.ExecutionMode.ORT_PARALLEL
    so.intra_op_num_threads = 4
    sess = onnxrun.InferenceSession(path, so)
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], np.maximum(x, 0) - x)
    calls = []
    sess.run_async(None, {"x": x}, lambda res, data, err: calls.append((res, data, err)), "u")
    assert len(calls) == 1  # already called: nothing ran in the background
    res, data, err = calls[0]
    assert data == "u" and err == ""
    np.testing.assert_array_equal(res[0], np.maximum(x, 0) - x)
    sess.run_async(None, {"x": x[:2]}, lambda res, data, err: calls.append((res, data, err)), 1)
    assert calls[1][0] == [] and calls[1][2]  # a failed run: the error goes to the callback


def test_blas_matmul_through_scipy_matches_numpy(monkeypatch):
    """providers/cpu/blas.matmul: in Pyodide, float products go through SciPy's BLAS (numpy has
    none there). The same code runs here with SciPy's BLAS forced on, against np.matmul, for
    every operand layout the kernels pass (row-major, column-major, strided, stacked,
    broadcast, with ``out``)."""
    blas_mod = pytest.importorskip("scipy.linalg.blas")
    from onnxrun.providers.cpu import blas

    monkeypatch.setattr(blas, "_gemms", lambda: {np.dtype(np.float32): blas_mod.sgemm,
                                                 np.dtype(np.float64): blas_mod.dgemm})
    rng = np.random.default_rng(0)
    a = rng.standard_normal((6, 5)).astype(np.float32)
    b = rng.standard_normal((5, 4)).astype(np.float32)
    cases = [(a, b), (np.asfortranarray(a), b), (a, np.asfortranarray(b)), (a.T.copy().T, b.T.T),
             (rng.standard_normal((12, 10))[::2, ::2], rng.standard_normal((5, 3))),
             (rng.standard_normal((3, 6, 5)).astype(np.float32), b),
             (a, rng.standard_normal((2, 5, 4)).astype(np.float32)),
             (rng.standard_normal((2, 1, 6, 5)), rng.standard_normal((3, 5, 4)))]
    for x, y in cases:
        np.testing.assert_allclose(blas.matmul(x, y), np.matmul(x, y), rtol=1e-5, atol=1e-5)
    out = np.empty((3, 6, 4), np.float32)
    got = blas.matmul(cases[5][0], b, out=out)
    assert got is out
    np.testing.assert_allclose(out, np.matmul(cases[5][0], b), rtol=1e-5, atol=1e-5)
    ints = np.arange(6).reshape(2, 3)
    assert blas.matmul(ints, ints.T).dtype == ints.dtype  # no BLAS for integers: numpy's
