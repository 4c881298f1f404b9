"""onnxruntime.quantization's module-level API on onnxrun: quant_utils, the calibration cache,
static_quantize_runner and the QDQ extra options that onnxruntime's own tests read."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxrun
from onnxrun.quantization import (
    CalibrationMethod,
    FeedsDataReader,
    QuantFormat,
    QuantType,
    TensorData,
    TensorsData,
    load_tensors_data,
    quantize_static,
    save_tensors_data,
    static_quantize_runner,
)
from onnxrun.quantization import quant_utils as qu
from onnxrun.quantization.calibrate import entropy


def _conv_model(relu: bool = False) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.random((4, 3, 3, 3), dtype=np.float32), "w")
    b = numpy_helper.from_array(rng.random(4, dtype=np.float32), "b")
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c" if relu else "y"], name="conv")]
    if relu:
        nodes.append(helper.make_node("Relu", ["c"], ["y"], name="relu"))
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", 1, [1, 3, 8, 8])],
                          [helper.make_tensor_value_info("y", 1, None)], [w, b])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])


def _two_adds() -> onnx.ModelProto:
    vi = [helper.make_tensor_value_info(n, 1, [2, 3]) for n in ("a", "b", "c", "y0", "y1")]
    g = helper.make_graph([helper.make_node("Add", ["a", "b"], ["y0"], name="add0"),
                           helper.make_node("Add", ["b", "c"], ["y1"], name="add1")],
                          "g", vi[:3], vi[3:])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])


def _run_runner(tmp_path: Path, model: onnx.ModelProto, args: list[str], monkeypatch
                ) -> onnx.ModelProto:
    onnx.save(model, tmp_path / "model.onnx")
    rng = np.random.default_rng(1)
    folder = tmp_path / "test_data_set_0"
    folder.mkdir()
    for k, i in enumerate(model.graph.input):
        shape = [d.dim_value for d in i.type.tensor_type.shape.dim]
        t = numpy_helper.from_array(rng.random(shape, dtype=np.float32))
        (folder / f"input_{k}.pb").write_bytes(t.SerializeToString())
    out = tmp_path / "q.onnx"
    monkeypatch.setattr(sys, "argv", ["runner", "-i", str(tmp_path / "model.onnx"), "-o",
                                      str(out), *args])
    static_quantize_runner.main()
    return onnx.load(out)


def test_runner_dedicated_pairs_and_contrib_domain(tmp_path, monkeypatch):
    m = _run_runner(tmp_path, _two_adds(), [], monkeypatch)
    assert len(m.graph.node) == 12  # 3 input pairs, 2 Adds, 2 output pairs
    (tmp_path / "d").mkdir()
    m = _run_runner(tmp_path / "d", _two_adds(), ["--dedicated_qdq_pair", "--use_qdq_contrib_ops"],
                    monkeypatch)
    assert len(m.graph.node) == 14  # b, read by both Adds, gets one pair each
    qdq = [n for n in m.graph.node if "QuantizeLinear" in n.op_type]
    assert qdq and all(n.domain == "com.microsoft" for n in qdq)
    assert any(o.domain == "com.microsoft" for o in m.opset_import)
    adds = [n for n in m.graph.node if n.op_type == "Add"]
    assert adds[0].input[1] != adds[1].input[0]  # each Add reads its own pair


def test_runner_disable_bias_quantization(tmp_path, monkeypatch):
    m = _run_runner(tmp_path, _conv_model(), [], monkeypatch)
    assert len(m.graph.node) == 7
    (tmp_path / "b").mkdir()
    m = _run_runner(tmp_path / "b", _conv_model(), ["--disable_quantize_bias"], monkeypatch)
    assert len(m.graph.node) == 6
    conv = next(n for n in m.graph.node if n.op_type == "Conv")
    assert conv.input[2] == "b"  # the float bias, read as it is


def test_qdq_parameters_stored_as_onnxruntime_stores_them(tmp_path):
    """Zero point before scale, values in the typed fields: scripts read int32_data[0]."""
    model = _conv_model()
    rng = np.random.default_rng(2)
    feeds = [{"x": rng.random((1, 3, 8, 8), dtype=np.float32)} for _ in range(2)]
    quantize_static(model, tmp_path / "q.onnx", FeedsDataReader(feeds),
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    q = onnx.load(tmp_path / "q.onnx")
    names = [t.name for t in q.graph.initializer]
    assert names.index("x_zero_point") < names.index("x_scale")
    assert names.index("w_zero_point") < names.index("w_scale") < names.index("w_quantized")
    zp = next(t for t in q.graph.initializer if t.name == "x_zero_point")
    assert len(zp.int32_data) == 1 and not zp.raw_data


def test_restricted_asymmetric_activations(tmp_path):
    model = _conv_model()
    feeds = [{"x": np.full((1, 3, 8, 8), v, np.float32)} for v in (-1.0, 2.0)]
    for restricted, want in ((True, 128), (False, 85)):
        quantize_static(model, tmp_path / "q.onnx", FeedsDataReader(feeds),
                        quant_format=QuantFormat.QOperator, activation_type=QuantType.QUInt8,
                        weight_type=QuantType.QUInt8,
                        extra_options={"ActivationRestrictedAsymmetric": restricted})
        q = onnx.load(tmp_path / "q.onnx")
        zp = next(t for t in q.graph.initializer if t.name == "x_zero_point")
        assert zp.int32_data[0] == want


def test_snap_zero_point_to_uint8():
    zp, scale = qu.snap_zero_point_to_uint8(np.float32(-1.0), np.float32(2.0))
    assert (zp.dtype, int(zp)) == (np.uint8, 128)
    assert np.isclose(scale, 2.0 / 127)  # covers rmax from the midpoint without clipping
    zp, scale = qu.snap_zero_point_to_uint8(0.0, 3.0, 0, 127)
    assert int(zp) == 0 and np.isclose(scale, 3.0 / 127)
    zp, scale = qu.snap_zero_point_to_uint8(-1e-9, 1e-9, min_real_range=1e-4)
    assert float(scale) >= 1e-4 / 255


def test_pack_bytes_to_4bit_and_blocked_scales():
    vals = np.arange(-8, 7).astype(np.int8)
    packed = qu.pack_bytes_to_4bit(vals.tobytes())
    assert bytes(packed) == onnx.numpy_helper.from_array(
        vals.astype(ml_dtypes.int4)).raw_data
    w = np.arange(24, dtype=np.float32).reshape(6, 4) - 10
    zp, scale = qu.compute_scale_zp_blocked(w, TensorProto.INT8, axis=0, block_size=4,
                                            symmetric=True)
    assert zp.shape == scale.shape == (2, 4)
    assert np.allclose(scale[0], np.abs(w[:4]).max(axis=0) / 127)
    with pytest.raises(NotImplementedError):
        qu.compute_scale_zp_blocked(w.reshape(2, 3, 4), TensorProto.INT8, 0, 2, True)
    q = qu.quantize_onnx_initializer(numpy_helper.from_array(w, "w"), TensorProto.INT8, zp,
                                     scale, axis=0, block_size=4)
    back = numpy_helper.to_array(q).astype(np.float32) * np.repeat(scale, 4, axis=0)[:6]
    assert np.abs(back - w).max() <= scale.max() / 2 + 1e-6


def test_update_opset_version_and_metadata(tmp_path):
    g = helper.make_graph([], "g", [], [])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 20)])
    assert qu.get_opset_version(qu.update_opset_version(m, QuantType.QInt16)) == 21
    assert qu.get_opset_version(qu.update_opset_version(m, QuantType.QInt8,
                                                        QuantType.QUInt8)) == 20
    onnx.save(_conv_model(), tmp_path / "m.onnx")
    loaded = qu.load_model_with_shape_infer(tmp_path / "m.onnx")
    assert qu.model_has_infer_metadata(loaded) and not qu.model_has_infer_metadata(m)
    assert not (tmp_path / "m-inferred.onnx").exists()


def test_entropy_is_kl_divergence():
    p, q = np.array([1.0, 2.0, 3.0]), np.array([2.0, 2.0, 2.0])
    pn, qn = p / p.sum(), q / q.sum()
    assert np.isclose(entropy(p, q), np.sum(pn * np.log(pn / qn)), rtol=1e-6)
    assert np.isinf(entropy([1.0, 1.0], [1.0, 0.0]))


def test_calibration_cache_round_trip_and_reuse(tmp_path, caplog):
    td = TensorsData(CalibrationMethod.Entropy, {"x": TensorData(
        lowest=np.float32(-0.5), highest=np.float32(0.5), hist=np.array([1, 2]),
        hist_edges=np.array([0.0, 1.0, 2.0], np.float32), bins=np.int64(5))})
    save_tensors_data(td, tmp_path / "deep" / "c.json", smooth_quant=True)
    raw = json.loads((tmp_path / "deep" / "c.json").read_text())
    assert raw["smooth_quant"] is True
    back = load_tensors_data(tmp_path / "deep" / "c.json")
    assert back.calibration_method == CalibrationMethod.Entropy and back["x"].bins == 5
    assert np.array_equal(back["x"].hist_edges, td["x"].hist_edges)
    with pytest.raises(FileNotFoundError):
        load_tensors_data(tmp_path / "missing.json")

    model, cache = _conv_model(), tmp_path / "cache.json"
    feeds = [{"x": np.ones((1, 3, 8, 8), np.float32)}]
    with pytest.raises(ValueError, match="calibration_data_reader"):
        quantize_static(model, tmp_path / "q.onnx", None)
    quantize_static(model, tmp_path / "q1.onnx", FeedsDataReader(feeds),
                    calibration_cache_path=cache)
    quantize_static(model, tmp_path / "q2.onnx", None, calibration_cache_path=cache)
    assert (tmp_path / "q1.onnx").read_bytes() == (tmp_path / "q2.onnx").read_bytes()
    with pytest.raises(ValueError, match="MinMax"):  # cached by another method, no reader
        quantize_static(model, tmp_path / "q3.onnx", None,
                        calibrate_method=CalibrationMethod.Entropy,
                        calibration_cache_path=cache)


def test_negative_dim_value_is_free():
    """onnx.helper writes -1 for a free dimension; onnxruntime accepts any size there."""
    vi = helper.make_tensor_value_info("x", TensorProto.FLOAT, [-1, 2])
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [vi],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    s = onnxrun.InferenceSession(m.SerializeToString())
    (y,) = s.run(None, {"x": -np.ones((5, 2), np.float32)})
    assert y.shape == (5, 2) and not y.any()


def _sigmoid_conv() -> onnx.ModelProto:
    w = numpy_helper.from_array(np.array([[[-1.0, -2.0], [1.0, 2.0]], [[-0.5, -1.5], [0.5, 1.5]]],
                                         np.float32), "WGT")
    b = numpy_helper.from_array(np.array([0.0, 1.0], np.float32), "BIAS")
    g = helper.make_graph([helper.make_node("Sigmoid", ["INP"], ["SIG_OUT"], name="sig"),
                           helper.make_node("Conv", ["SIG_OUT", "WGT", "BIAS"], ["OUT"],
                                            name="conv")], "g",
                          [helper.make_tensor_value_info("INP", 1, [1, 2, 3])],
                          [helper.make_tensor_value_info("OUT", 1, None)], [w, b])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])


def _quantize_overrides(tmp_path, overrides, per_channel=False, **kw) -> dict:
    feeds = [{"INP": np.arange(1, 7, dtype=np.float32).reshape(1, 2, 3)}]
    quantize_static(_sigmoid_conv(), tmp_path / "q.onnx", FeedsDataReader(feeds),
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QUInt8,
                    per_channel=per_channel, op_types_to_quantize=["Conv", "Sigmoid"],
                    extra_options={"TensorQuantOverrides": overrides, **kw})
    q = onnx.load(tmp_path / "q.onnx")
    return {t.name: t for t in q.graph.initializer} | {"__model__": q}


def test_tensor_overrides_parameters_types_and_ranges(tmp_path):
    inits = _quantize_overrides(tmp_path, {
        "SIG_OUT": [{"scale": np.float32(1.0), "zero_point": np.uint8(127)}],
        "WGT": [{"quant_type": QuantType.QInt8, "symmetric": True, "reduce_range": True}],
        "BIAS": [{"rmin": np.float32(-2.0), "rmax": np.float32(2.0)}]})
    assert inits["SIG_OUT_zero_point"].int32_data[0] == 127
    assert inits["SIG_OUT_scale"].float_data[0] == 1.0
    assert inits["WGT_zero_point"].data_type == TensorProto.INT8
    assert np.isclose(inits["WGT_scale"].float_data[0], 2.0 / 64)  # reduced symmetric int8
    # an overridden bias is quantized as a weight (its own range), not as int32
    assert inits["BIAS_zero_point"].data_type == TensorProto.UINT8
    assert np.isclose(inits["BIAS_scale"].float_data[0], 4.0 / 255)


def test_tensor_overrides_per_channel_and_convert(tmp_path):
    inits = _quantize_overrides(tmp_path, {
        "WGT": [{"axis": 0, "scale": np.float32(0.5), "zero_point": np.uint8(2)},
                {"scale": np.float32(0.2), "zero_point": np.uint8(4)}],
        "SIG_OUT": [{"quant_type": QuantType.QUInt8,
                     "convert": {"quant_type": QuantType.QUInt16, "recv_nodes": {"conv"}}}]},
        per_channel=True)
    assert list(inits["WGT_zero_point"].int32_data) == [2, 4]
    assert np.allclose(inits["WGT_scale"].float_data, [0.5, 0.2])
    q = inits["__model__"]
    assert q.opset_import[0].version >= 21  # a 16-bit conversion: opset 21's Q/DQ
    assert inits["SIG_OUT_zero_point_convert"].data_type == TensorProto.UINT16
    conv = next(n for n in q.graph.node if n.op_type == "Conv")
    assert conv.input[0] == "SIG_OUT_DequantizeLinear_Output_convert"


@pytest.mark.parametrize(("override", "message"), [
    ({"NOPE": [{"rmin": np.float32(0)}]}, "is not present in the model"),
    ({"SIG_OUT": [{"scale": np.float32(1)}]}, "Must provide both 'scale' and 'zero_point'"),
    ({"SIG_OUT": [{"scale": np.float32(1), "zero_point": np.uint8(0), "rmax": 1.0}]},
     r"option\(s\) \[rmax\] are invalid with 'scale' and 'zero_point'"),
])
def test_tensor_overrides_validation(tmp_path, override, message):
    with pytest.raises(ValueError, match=message):
        _quantize_overrides(tmp_path, override)


def test_get_qdq_config_and_qnn_config():
    from onnxrun.quantization import get_qdq_config
    from onnxrun.quantization.execution_providers.qnn import get_qnn_qdq_config

    m = _sigmoid_conv()
    cfg = get_qdq_config(m, FeedsDataReader([]), nodes_to_exclude=lambda _m, n: n.name == "sig",
                         weight_type=QuantType.QInt4)
    assert cfg.op_types_to_quantize == ["Conv"] and cfg.nodes_to_exclude == ["sig"]
    assert cfg.extra_options["ForceQuantizeNoInputCheck"] is True
    assert cfg.extra_options["UseQDQContribOps"] is True  # 4-bit below opset 21
    cfg = get_qnn_qdq_config(m, FeedsDataReader([]), activation_type=QuantType.QUInt16)
    sig = cfg.extra_options["TensorQuantOverrides"]["SIG_OUT"][0]
    assert sig["quant_type"] == QuantType.QUInt16 and sig["scale"] == np.float32(1 / 65536)
    # a uint16 Sigmoid output in a uint8 model: its producer and consumer run in uint16, the
    # model input is converted for the Sigmoid (onnxruntime's overrides, checked against it)
    cfg = get_qnn_qdq_config(m, FeedsDataReader([]),
                             init_overrides={"SIG_OUT": [{"quant_type": QuantType.QUInt16}]})
    ov = cfg.extra_options["TensorQuantOverrides"]
    assert ov["INP"] == [{"quant_type": QuantType.QUInt8,
                          "convert": {"quant_type": QuantType.QUInt16, "recv_nodes": {"sig"}}}]
    assert ov["OUT"] == [{"quant_type": QuantType.QUInt16}]
    assert cfg.extra_options["UseQDQContribOps"] is True  # 16-bit below opset 21


def _fp16_model(op: str) -> onnx.ModelProto:
    rng = np.random.default_rng(3)
    shape = (2, 3, 1, 1) if op == "Conv" else (3, 2, 1, 1)
    w = numpy_helper.from_array(rng.standard_normal(shape).astype(np.float16), "W")
    b = numpy_helper.from_array(rng.standard_normal(2).astype(np.float16), "B")
    g = helper.make_graph([helper.make_node(op, ["x", "W", "B"], ["y"], name="op")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [1, 3, 4, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT16, None)], [w, b])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 19)])


def test_float16_models_quantize_to_valid_graphs(tmp_path):
    """float16 Conv (dynamic: ConvInteger) and ConvTranspose (QDQ: a float16 bias scale)."""
    from onnxrun.quantization import quantize_dynamic

    x = np.random.default_rng(4).random((1, 3, 4, 4)).astype(np.float16)
    for op in ("Conv", "ConvTranspose"):
        m = _fp16_model(op)
        ref = onnxrun.InferenceSession(m.SerializeToString()).run(None, {"x": x})[0]
        out = tmp_path / f"{op}.onnx"
        if op == "Conv":
            quantize_dynamic(m, out, weight_type=QuantType.QUInt8)
        else:
            quantize_static(m, out, FeedsDataReader([{"x": x}]))
        q = onnx.load(out)
        onnx.checker.check_model(q, full_check=True)
        if op == "Conv":
            assert [n.op_type for n in q.graph.node].count("ConvInteger") == 1
        (y,) = onnxrun.InferenceSession(str(out)).run(None, {"x": x})
        assert y.dtype == np.float16 and np.abs(y - ref).max() < 0.1


def test_onnx_model_topological_sort_as_onnxruntime():
    from onnxrun.quantization.onnx_model import ONNXModel

    g = helper.make_graph(
        [helper.make_node("Add", ["c", "x"], ["y"], name="add"),
         helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(np.float32(1))),
         helper.make_node("Relu", ["x"], ["r"], name="relu"),
         # reads y only inside its branch: must come after the Add all the same
         helper.make_node("If", ["cond"], ["z"], then_branch=helper.make_graph(
             [helper.make_node("Identity", ["y"], ["t"])], "t", [],
             [helper.make_tensor_value_info("t", 1, None)]), else_branch=helper.make_graph(
             [helper.make_node("Identity", ["r"], ["e"])], "e", [],
             [helper.make_tensor_value_info("e", 1, None)]))],
        "g", [helper.make_tensor_value_info("x", 1, [1]),
              helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("z", 1, None)])
    m = ONNXModel(helper.make_model(g))
    m.topological_sort()
    assert [n.op_type for n in m.nodes()] == ["Constant", "Relu", "Add", "If"]
    assert m.get_children(m.nodes()[0])[0].op_type == "Add"
    assert m.find_graph_output("z") is not None and m.is_graph_input("x")


def test_qdq_respects_prequantized_weights_and_untyped_models(tmp_path):
    """A weight the model already dequantizes keeps its parameters (the bias is quantized with
    them); a model without value_info is typed before quantizing (QDQQuantizer used directly)."""
    from onnxrun.quantization import QDQQuantizer

    wq = numpy_helper.from_array(np.array([[[[3]]], [[[-5]]]], np.int8), "wq")
    ws = numpy_helper.from_array(np.float32(0.1), "ws")
    wz = numpy_helper.from_array(np.int8(0), "wz")
    b = numpy_helper.from_array(np.array([0.5, -0.5], np.float32), "b")
    g = helper.make_graph([helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["w"]),
                           helper.make_node("Conv", ["x", "w", "b"], ["y"], name="conv")], "g",
                          [helper.make_tensor_value_info("x", 1, [1, 1, 2, 2])],
                          [helper.make_tensor_value_info("y", 1, [1, 2, 2, 2])], [wq, ws, wz, b])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    ranges = {n: TensorData(lowest=np.float32(-1), highest=np.float32(1)) for n in ("x", "y")}
    quantizer = QDQQuantizer(m, False, False, QuantType.QInt8, QuantType.QUInt8, ranges, [], [],
                             ["Conv"], {})
    quantizer.quantize_model()
    q = quantizer.model.model
    ops = [n.op_type for n in q.graph.node]
    assert ops.count("QuantizeLinear") == 2 and ops.count("DequantizeLinear") == 4
    dq_w = next(n for n in q.graph.node if n.output[0] == "w")
    assert list(dq_w.input) == ["wq", "ws", "wz"]
    bias_scale = next(t for t in q.graph.initializer if t.name == "b_quantized_scale")
    assert np.isclose(numpy_helper.to_array(bias_scale).reshape(-1)[0], 0.1 * 2 / 255)


def test_float8_qdq(tmp_path):
    """E4M3FN QDQ: scales from the Distribution calibration's standard deviations, zero points
    0 in float 8, the bias left float (Cast), opset 19."""
    rng = np.random.default_rng(5)
    w = numpy_helper.from_array(rng.standard_normal((4, 8)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "b")
    g = helper.make_graph([helper.make_node("Gemm", ["x", "w", "b"], ["y"], transB=1)], "g",
                          [helper.make_tensor_value_info("x", 1, [3, 8])],
                          [helper.make_tensor_value_info("y", 1, [3, 4])], [w, b])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    feeds = [{"x": rng.standard_normal((3, 8)).astype(np.float32)} for _ in range(4)]
    out = tmp_path / "f8.onnx"
    quantize_static(m, out, FeedsDataReader(feeds), activation_type=QuantType.QFLOAT8E4M3FN,
                    weight_type=QuantType.QFLOAT8E4M3FN,
                    calibrate_method=CalibrationMethod.Distribution)
    q = onnx.load(out)
    assert q.opset_import[0].version >= 19
    ops = [n.op_type for n in q.graph.node]
    assert ops.count("QuantizeLinear") == 2 and ops.count("DequantizeLinear") == 3
    assert ops.count("Cast") == 1
    inits = {t.name: t for t in q.graph.initializer}
    assert inits["w_quantized"].data_type == TensorProto.FLOAT8E4M3FN
    assert inits["x_zero_point"].data_type == TensorProto.FLOAT8E4M3FN
    wv = numpy_helper.to_array(w)
    assert np.isclose(numpy_helper.to_array(inits["w_scale"]), np.std(wv) / _f8_std(),
                      rtol=1e-5)
    (y,) = onnxrun.InferenceSession(str(out)).run(None, feeds[0])
    ref = feeds[0]["x"] @ wv.T + numpy_helper.to_array(b)
    assert np.abs(y - ref).max() < 0.25 * np.abs(ref).max()
    with pytest.raises(ValueError, match="Distribution"):
        quantize_static(m, out, FeedsDataReader(feeds), activation_type=QuantType.QFLOAT8E4M3FN,
                        weight_type=QuantType.QFLOAT8E4M3FN)


def test_float8_qoperator_matmul_is_com_microsoft_qlinearmatmul(tmp_path):
    """E4M3FN QOperator MatMul: onnxruntime's quantizer writes com.microsoft's QLinearMatMul
    (which no runtime defines: the default domain's takes float 8 only from opset 21); a session
    refuses it with onnxruntime's words for an operator its domain does not define."""
    ort_quantization = pytest.importorskip("onnxruntime.quantization")
    rng = np.random.default_rng(7)
    w = numpy_helper.from_array(rng.standard_normal((8, 4)).astype(np.float32), "w")
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "g",
                          [helper.make_tensor_value_info("x", 1, [3, 8])],
                          [helper.make_tensor_value_info("y", 1, [3, 4])], [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    m.ir_version = 8
    src = tmp_path / "fp.onnx"
    onnx.save(m, src)
    feeds = [{"x": rng.standard_normal((3, 8)).astype(np.float32)} for _ in range(2)]
    domains = {}
    for name, mod in (("onnxrun", sys.modules["onnxrun.quantization"]),
                      ("ort", ort_quantization)):
        out = tmp_path / f"{name}.onnx"
        mod.quantize_static(str(src), str(out), FeedsDataReader(feeds),
                            quant_format=mod.QuantFormat.QOperator,
                            activation_type=mod.QuantType.QFLOAT8E4M3FN,
                            weight_type=mod.QuantType.QFLOAT8E4M3FN,
                            calibrate_method=mod.CalibrationMethod.Distribution)
        domains[name] = {n.domain for n in onnx.load(out).graph.node
                         if n.op_type == "QLinearMatMul"}
    assert domains["onnxrun"] == domains["ort"] == {"com.microsoft"}
    with pytest.raises(onnxrun.Fail,
                       match=r"com\.microsoft:QLinearMatMul\(-1\) is not a registered function/op"):
        onnxrun.InferenceSession(str(tmp_path / "onnxrun.onnx"))


def _f8_std() -> float:
    v = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    return float(np.std(v[np.isfinite(v)]))


@pytest.mark.parametrize("fmt", [QuantFormat.QOperator, QuantFormat.QDQ])
@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("wshape", [(40, 6), (1, 40, 6)])
def test_matmul_nbits_quantizer(fmt, symmetric, wshape):
    from onnxrun.quantization.matmul_nbits_quantizer import (
        DefaultWeightOnlyQuantConfig,
        MatMulNBitsQuantizer,
    )

    rng = np.random.default_rng(6)
    # integers on each block's 4-bit grid: block quantization is exact
    grid = rng.integers(-8, 8, size=wshape) if symmetric else rng.integers(0, 16, size=wshape)
    grid.reshape(-1, wshape[-1])[0] = -8 if symmetric else 15  # every block spans the range
    grid.reshape(-1, wshape[-1])[32] = -8 if symmetric else 15
    w = numpy_helper.from_array(grid.astype(np.float32), "w")
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "g",
                          [helper.make_tensor_value_info("x", 1, [3, 40])],
                          [helper.make_tensor_value_info("y", 1, None)], [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    x = rng.standard_normal((3, 40)).astype(np.float32)
    ref = onnxrun.InferenceSession(m.SerializeToString()).run(None, {"x": x})[0]
    q = MatMulNBitsQuantizer(m, algo_config=DefaultWeightOnlyQuantConfig(
        block_size=32, is_symmetric=symmetric, quant_format=fmt))
    q.process()
    ops = [n.op_type for n in q.model.nodes()]
    assert ("MatMulNBits" in ops) == (fmt == QuantFormat.QOperator)
    assert ("Reshape" in ops) == (len(wshape) == 3)  # the MatMul's output rank restored
    if fmt == QuantFormat.QDQ:
        dq = next(n for n in q.model.nodes() if n.op_type == "DequantizeLinear")
        assert q.model.get_initializer(dq.input[0]).data_type == (
            TensorProto.INT4 if symmetric else TensorProto.UINT4)
        assert q.model.opset_import()[0].version == 21
    (y,) = onnxrun.InferenceSession(q.model.model.SerializeToString()).run(None, {"x": x})
    assert y.shape == ref.shape and np.allclose(y, ref, rtol=1e-5, atol=1e-4)


def test_quantize_nparray_scalar_and_dynamic_weight_shared_with_float_consumer(tmp_path):
    from onnxrun.quantization import quantize_dynamic, quantize_nparray

    q = quantize_nparray(TensorProto.UINT8, np.float32(3.0), np.float32(0.5), np.uint8(10))
    assert q.dtype == np.uint8 and int(q) == 16  # a 0-d value (crashed in np.clip's out=)
    w = numpy_helper.from_array(np.random.default_rng(7).standard_normal((4, 8)).astype(
        np.float32), "weight")
    g = helper.make_graph([helper.make_node("MatMul", ["x", "weight"], ["y"]),
                           helper.make_node("Identity", ["weight"], ["w_out"])], "g",
                          [helper.make_tensor_value_info("x", 1, [5, 4])],
                          [helper.make_tensor_value_info("y", 1, [5, 8]),
                           helper.make_tensor_value_info("w_out", 1, [4, 8])], [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    quantize_dynamic(m, tmp_path / "q.onnx", per_channel=True, weight_type=QuantType.QInt8)
    qm = onnx.load(tmp_path / "q.onnx")
    onnx.checker.check_model(qm, full_check=True)
    dq = next(n for n in qm.graph.node if n.op_type == "DequantizeLinear")
    assert dq.output[0] == "weight" and helper.get_attribute_value(dq.attribute[0]) == -1
    assert "weight" not in {t.name for t in qm.graph.initializer}  # no float copy kept
    (_, w_out) = onnxrun.InferenceSession(qm.SerializeToString()).run(
        None, {"x": np.ones((5, 4), np.float32)})
    assert np.abs(w_out - numpy_helper.to_array(w)).max() < 0.01


def test_qdq_loss_debug_matches_activations_and_weights(tmp_path):
    from onnxrun.quantization.qdq_loss_debug import (
        collect_activations,
        compute_activation_error,
        compute_weight_error,
        create_activation_matching,
        create_weight_matching,
        modify_model_output_intermediate_tensors,
    )

    m = _conv_model(relu=True)
    onnx.save(m, tmp_path / "f.onnx")
    rng = np.random.default_rng(8)
    feeds = [{"x": rng.random((1, 3, 8, 8), dtype=np.float32)} for _ in range(2)]
    quantize_static(m, tmp_path / "q.onnx", FeedsDataReader(feeds))
    acts = {}
    for kind in ("f", "q"):
        modify_model_output_intermediate_tensors(tmp_path / f"{kind}.onnx",
                                                 tmp_path / f"{kind}_aug.onnx")
        acts[kind] = collect_activations(tmp_path / f"{kind}_aug.onnx", FeedsDataReader(feeds))
    ref = onnxrun.InferenceSession(m.SerializeToString()).run(None, feeds[0])[0]
    assert np.array_equal(acts["f"]["y"][0], ref.reshape(-1))
    match = create_activation_matching(acts["q"], acts["f"])
    assert {"x", "y"} <= set(match) and len(match["x"]["float"]) == 2
    errs = compute_activation_error(match)
    assert errs["x"]["qdq_err"] > 30 and isinstance(errs["y"]["xmodel_err"], float)
    weights = create_weight_matching(str(tmp_path / "f.onnx"), str(tmp_path / "q.onnx"))
    assert set(weights) == {"w", "b"}
    assert weights["w"]["dequantized"].shape == weights["w"]["float"].shape
    assert compute_weight_error(weights)["w"] > 30  # dB


@pytest.mark.parametrize("per_channel", [False, True])
def test_minmax_calibrator_reduces_in_the_graph(tmp_path, per_channel):
    from onnxrun.quantization import create_calibrator

    onnx.save(_conv_model(relu=True), tmp_path / "m.onnx")
    cal = create_calibrator(tmp_path / "m.onnx", ["Conv", "Relu"], tmp_path / "aug.onnx",
                            extra_options={"per_channel": per_channel})
    aug = cal.get_augment_model()
    names = [n.name for n in aug.graph.node]
    for t in ("x", "c", "y"):  # graph input, intermediate, graph output
        assert {f"{t}_ReduceMin", f"{t}_ReduceMax_Reshape"} <= set(names)
        assert f"{t}_ReduceMax" in {o.name for o in aug.graph.output}
    assert len(names) == 2 + 4 * 3
    rng = np.random.default_rng(9)
    xs = [rng.standard_normal((1, 3, 8, 8)).astype(np.float32) for _ in range(3)]
    cal.collect_data(FeedsDataReader([{"x": x} for x in xs]))
    lo, hi = cal.compute_data()["x"].range_value
    allx = np.concatenate(xs)
    if per_channel:
        assert np.allclose(lo, allx.min(axis=(0, 2, 3))) and hi.shape == (3,)
    else:
        assert lo.shape == () and np.isclose(lo, allx.min()) and np.isclose(hi, allx.max())


@pytest.mark.parametrize(("mode", "value", "shared"), [("constant", None, True),
                                                       ("constant", 0.0, True),
                                                       ("constant", 3.75, False),
                                                       ("edge", None, True)])
def test_pad_quantized_as_onnxruntime(tmp_path, mode, value, shared):
    """QDQ: Pad's input is quantized, its output shares the input's parameters unless a non-zero
    constant is padded in; QOperator: a non-zero constant is quantized on the input's scale."""
    inits = [numpy_helper.from_array(np.array([0, 1, 0, 0], np.int64), "pads")]
    inputs = ["x", "pads"]
    if value is not None:
        inits.append(numpy_helper.from_array(np.float32(value), "v"))
        inputs.append("v")
    g = helper.make_graph([helper.make_node("Pad", inputs, ["y"], mode=mode, name="pad")], "g",
                          [helper.make_tensor_value_info("x", 1, [3, 2])],
                          [helper.make_tensor_value_info("y", 1, [3, 3])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    feeds = [{"x": np.array([[1.0, 1.2], [2.3, 3.4], [4.5, 5.7]], np.float32)}]
    quantize_static(m, tmp_path / "q.onnx", FeedsDataReader(feeds),
                    activation_type=QuantType.QUInt8)
    q = onnx.load(tmp_path / "q.onnx")
    pad = next(n for n in q.graph.node if n.op_type == "Pad")
    dq_in = next(n for n in q.graph.node if n.output[0] == pad.input[0])
    q_out = next(n for n in q.graph.node if n.input and n.input[0] == pad.output[0])
    assert (dq_in.op_type, q_out.op_type) == ("DequantizeLinear", "QuantizeLinear")
    assert (dq_in.input[1] == q_out.input[1]) == shared
    ref = onnxrun.InferenceSession(m.SerializeToString()).run(None, feeds[0])[0]
    (y,) = onnxrun.InferenceSession(str(tmp_path / "q.onnx")).run(None, feeds[0])
    assert np.abs(y - ref).max() < 0.05
    if value:
        quantize_static(m, tmp_path / "qo.onnx", FeedsDataReader(feeds),
                        quant_format=QuantFormat.QOperator, activation_type=QuantType.QUInt8,
                        extra_options={"ForceQuantizeNoInputCheck": True})
        qo = onnx.load(tmp_path / "qo.onnx")
        assert next(n for n in qo.graph.node if n.op_type == "Pad").input[2] == "v_quantized"
        (yo,) = onnxrun.InferenceSession(str(tmp_path / "qo.onnx")).run(None, feeds[0])
        assert np.abs(yo - ref).max() < 0.05


def test_block_size_option_quantizes_weights_per_block(tmp_path):
    b = np.random.default_rng(10).uniform(-1, 1, (64, 32)).astype(np.float32)
    g = helper.make_graph([helper.make_node("MatMul", ["A", "B"], ["Y"], name="mm")], "g",
                          [helper.make_tensor_value_info("A", 1, [1, 64])],
                          [helper.make_tensor_value_info("Y", 1, None)],
                          [numpy_helper.from_array(b, "B")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    feeds = [{"A": np.random.default_rng(11).uniform(-1, 1, (1, 64)).astype(np.float32)}]
    quantize_static(m, tmp_path / "q.onnx", FeedsDataReader(feeds),
                    activation_type=QuantType.QInt8, weight_type=QuantType.QInt8,
                    extra_options={"BlockSize": 32, "WeightSymmetric": True})
    q = onnx.load(tmp_path / "q.onnx")
    assert q.opset_import[0].version == 21
    dq = next(n for n in q.graph.node if n.op_type == "DequantizeLinear" and n.input[0] ==
              "B_quantized")
    assert {a.name: a.i for a in dq.attribute} == {"axis": 0, "block_size": 32}
    scale = numpy_helper.to_array(next(t for t in q.graph.initializer if t.name == "B_scale"))
    assert scale.shape == (2, 32)
    assert np.allclose(scale[1], np.abs(b[32:]).max(axis=0) / 127)
    ref = feeds[0]["A"] @ b
    (y,) = onnxrun.InferenceSession(str(tmp_path / "q.onnx")).run(None, feeds[0])
    assert np.abs(y - ref).max() < 0.1


def test_quant_pre_process_moves_old_opsets_to_11(tmp_path):
    from onnxrun.quantization.shape_inference import quant_pre_process

    scales = numpy_helper.from_array(np.array([1, 1, 2, 3], np.float32), "scales")
    g = helper.make_graph([helper.make_node("Upsample", ["x", "scales"], ["y"], name="up")], "g",
                          [helper.make_tensor_value_info("x", 1, [1, 1, 2, 2])],
                          [helper.make_tensor_value_info("y", 1, None)], [scales])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 9)])
    out = quant_pre_process(m, tmp_path / "p.onnx", skip_symbolic_shape=True)
    assert [n.op_type for n in out.graph.node] == ["Resize"]
    assert out.opset_import[0].version == 11
    x = np.arange(4, dtype=np.float32).reshape(1, 1, 2, 2)
    (y,) = onnxrun.InferenceSession(str(tmp_path / "p.onnx")).run(None, {"x": x})
    assert np.array_equal(y, x.repeat(2, axis=2).repeat(3, axis=3))  # Upsample's nearest


def test_where_quantizes_to_qlinearwhere_matching_onnxruntime(tmp_path):
    import onnxruntime

    vi = [helper.make_tensor_value_info("c", TensorProto.BOOL, [2, 3]),
          *[helper.make_tensor_value_info(n, 1, [2, 3]) for n in ("x", "y", "z")]]
    g = helper.make_graph([helper.make_node("Where", ["c", "x", "y"], ["z"], name="w")], "g",
                          vi[:3], vi[3:])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 16)])
    rng = np.random.default_rng(12)
    feeds = [{"c": rng.random((2, 3)) > 0.5, "x": rng.standard_normal((2, 3)).astype(np.float32),
              "y": 3 * rng.standard_normal((2, 3)).astype(np.float32)} for _ in range(3)]
    quantize_static(m, tmp_path / "q.onnx", FeedsDataReader(feeds),
                    quant_format=QuantFormat.QOperator, activation_type=QuantType.QUInt8,
                    extra_options={"ForceQuantizeNoInputCheck": True})
    q = onnx.load(tmp_path / "q.onnx")
    assert [n.op_type for n in q.graph.node].count("QLinearWhere") == 1
    ours = onnxrun.InferenceSession(str(tmp_path / "q.onnx")).run(None, feeds[0])[0]
    theirs = onnxruntime.InferenceSession(str(tmp_path / "q.onnx"),
                                          providers=["CPUExecutionProvider"]).run(None, feeds[0])[0]
    assert np.array_equal(ours, theirs)


def _const(name, v):
    return numpy_helper.from_array(np.asarray(v, np.float32), name)


def test_fusions_gelu_layernorm_lpnorm_and_channel_last(tmp_path):
    from onnxrun.quantization.execution_providers.qnn import qnn_preprocess_model

    n = helper.make_node
    nodes = [n("Mul", ["x", "r2"], ["s"]), n("Erf", ["s"], ["e"]), n("Add", ["e", "one"], ["a"]),
             n("Mul", ["a", "half"], ["h"]), n("Mul", ["h", "x"], ["g"]),          # GELU
             n("ReduceL2", ["g", "axes"], ["l2"], keepdims=1), n("Clip", ["l2", "eps"], ["c"]),
             n("Shape", ["g"], ["gs"]), n("Expand", ["c", "gs"], ["ex"]),
             n("Div", ["g", "ex"], ["ln"]),                                       # L2 norm
             n("ReduceMean", ["ln", "axes"], ["m"]), n("Sub", ["ln", "m"], ["d"]),
             n("Mul", ["d", "d"], ["sq"]), n("ReduceMean", ["sq", "axes"], ["v"]),
             n("Add", ["v", "eps"], ["ve"]), n("Sqrt", ["ve"], ["sd"]),
             n("Div", ["d", "sd"], ["nd"]), n("Mul", ["nd", "sc"], ["ns"]),
             n("Add", ["ns", "bi"], ["y"])]                                       # layer norm
    inits = [_const("r2", 1 / np.sqrt(2)), _const("one", 1.0), _const("half", 0.5),
             numpy_helper.from_array(np.array([-1], np.int64), "axes"), _const("eps", 1e-6),
             _const("sc", [1.5, 2.0, 0.5, 1.0]), _const("bi", [0.1, 0.2, 0.3, 0.4])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", 1, [1, 2, 3, 4])],
                          [helper.make_tensor_value_info("y", 1, [1, 2, 3, 4])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    x = np.random.default_rng(13).standard_normal((1, 2, 3, 4)).astype(np.float32)
    ref = onnxrun.InferenceSession(m.SerializeToString()).run(None, {"x": x})[0]
    assert qnn_preprocess_model(m, tmp_path / "p.onnx", fuse_layernorm=True,
                                inputs_to_make_channel_last=["x"],
                                outputs_to_make_channel_last=["y"])
    p = onnx.load(tmp_path / "p.onnx")
    ops = sorted(nd.op_type for nd in p.graph.node)
    assert ops == ["Gelu", "LayerNormalization", "LpNormalization", "Transpose", "Transpose"]
    (y,) = onnxrun.InferenceSession(str(tmp_path / "p.onnx")).run(
        None, {"x": x.transpose(0, 2, 3, 1)})
    assert np.allclose(y, ref.transpose(0, 2, 3, 1), atol=1e-4)
    with pytest.raises(ValueError, match="rank >= 3"):
        g2 = helper.make_graph([n("Relu", ["a"], ["b"])], "g",
                               [helper.make_tensor_value_info("a", 1, [2, 2])],
                               [helper.make_tensor_value_info("b", 1, [2, 2])])
        qnn_preprocess_model(helper.make_model(g2), tmp_path / "q.onnx",
                             inputs_to_make_channel_last=["a"])


def test_onnx_quantizer_untyped_tensors_need_default_tensor_type():
    from onnxrun.quantization.onnx_quantizer import ONNXQuantizer
    from onnxrun.quantization.quant_types import QuantizationMode

    w = [numpy_helper.from_array(np.eye(4, dtype=np.float32), f"W{k}") for k in range(3)]
    g = helper.make_graph([helper.make_node("MatMul", ["X", "W0"], ["T1"]),
                           helper.make_node("FusedMatMul", ["T1", "W1"], ["T2"],
                                            domain="com.microsoft"),
                           helper.make_node("MatMul", ["T2", "W2"], ["Y"])], "g",
                          [helper.make_tensor_value_info("X", 1, [1, 4])],
                          [helper.make_tensor_value_info("Y", 1, [1, 4])], w)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18),
                                            helper.make_opsetid("com.microsoft", 1)])

    def quantizer(extra):
        return ONNXQuantizer(m, False, False, QuantizationMode.IntegerOps, False,
                             QuantType.QInt8, QuantType.QUInt8, None, [], [], ["MatMul"], extra)

    with pytest.raises(RuntimeError, match="DefaultTensorType"):
        quantizer({"MatMulConstBOnly": True}).quantize_model()
    q = quantizer({"MatMulConstBOnly": True, "DefaultTensorType": 1}).quantize_model()
    assert [n.op_type for n in q.graph.node].count("MatMulInteger") == 2


def test_embed_layer_norm_quantizes_to_qembedlayernorm_matching_onnxruntime(tmp_path):
    import onnxruntime

    from onnxrun.quantization import quantize_dynamic

    rng = np.random.default_rng(14)
    inits = [numpy_helper.from_array(rng.standard_normal(s).astype(np.float32), n)
             for n, s in (("word", (32, 4)), ("pos", (16, 4)), ("seg", (2, 4)),
                          ("gamma", (4,)), ("beta", (4,)))]
    node = helper.make_node("EmbedLayerNormalization",
                            ["ids", "sids", "word", "pos", "seg", "gamma", "beta"],
                            ["out", "mask_index"], domain="com.microsoft", epsilon=1e-5)
    ids = [helper.make_tensor_value_info(n, TensorProto.INT32, [1, 4]) for n in ("ids", "sids")]
    g = helper.make_graph([node], "g", ids,
                          [helper.make_tensor_value_info("out", 1, [1, 4, 4]),
                           helper.make_tensor_value_info("mask_index", TensorProto.INT32, [1])],
                          inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 14),
                                            helper.make_opsetid("com.microsoft", 1)])
    quantize_dynamic(m, tmp_path / "q.onnx")
    q = onnx.load(tmp_path / "q.onnx")
    assert [n.op_type for n in q.graph.node] == ["QEmbedLayerNormalization"]
    feeds = {"ids": rng.integers(0, 32, (1, 4)).astype(np.int32),
             "sids": rng.integers(0, 2, (1, 4)).astype(np.int32)}
    ours = onnxrun.InferenceSession(str(tmp_path / "q.onnx")).run(None, feeds)
    theirs = onnxruntime.InferenceSession(str(tmp_path / "q.onnx"),
                                          providers=["CPUExecutionProvider"]).run(None, feeds)
    assert np.allclose(ours[0], theirs[0], atol=1e-5) and np.array_equal(ours[1], theirs[1])


def test_attention_quantizes_to_qattention_matching_onnxruntime(tmp_path):
    import onnxruntime

    from onnxrun.quantization import quantize_dynamic

    rng = np.random.default_rng(15)
    inits = [numpy_helper.from_array(rng.standard_normal((10, 30)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.standard_normal(30).astype(np.float32), "b")]
    node = helper.make_node("Attention", ["x", "w", "b"], ["y"], domain="com.microsoft",
                            num_heads=5)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", 1, [1, 3, 10])],
                          [helper.make_tensor_value_info("y", 1, [1, 3, 10])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 14),
                                            helper.make_opsetid("com.microsoft", 1)])
    quantize_dynamic(m, tmp_path / "q.onnx")
    q = onnx.load(tmp_path / "q.onnx")
    assert [n.op_type for n in q.graph.node] == ["DynamicQuantizeLinear", "QAttention"]
    feeds = {"x": rng.standard_normal((1, 3, 10)).astype(np.float32)}
    ours = onnxrun.InferenceSession(str(tmp_path / "q.onnx")).run(None, feeds)[0]
    theirs = onnxruntime.InferenceSession(str(tmp_path / "q.onnx"),
                                          providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    assert np.allclose(ours, theirs, atol=1e-4)


@pytest.mark.parametrize("symmetric", [True, False])
def test_gather_block_quantized_matches_onnxruntime(tmp_path, symmetric):
    import onnxruntime

    from onnxrun.quantization.matmul_nbits_quantizer import (
        DefaultWeightOnlyQuantConfig,
        MatMulNBitsQuantizer,
    )

    rng = np.random.default_rng(16)
    table = numpy_helper.from_array(rng.standard_normal((50, 40)).astype(np.float32), "emb")
    g = helper.make_graph([helper.make_node("Gather", ["emb", "ids"], ["y"], name="g")], "g",
                          [helper.make_tensor_value_info("ids", TensorProto.INT64, [2, 3])],
                          [helper.make_tensor_value_info("y", 1, [2, 3, 40])], [table])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    q = MatMulNBitsQuantizer(m, algo_config=DefaultWeightOnlyQuantConfig(
        block_size=16, is_symmetric=symmetric, op_types_to_quantize=("Gather",)))
    q.process()
    assert [n.op_type for n in q.model.nodes()] == ["GatherBlockQuantized"]
    onnx.save(q.model.model, tmp_path / "q.onnx")
    feeds = {"ids": np.array([[0, 5, 49], [-1, 7, 7]], np.int64)}
    ours = onnxrun.InferenceSession(str(tmp_path / "q.onnx")).run(None, feeds)[0]
    theirs = onnxruntime.InferenceSession(str(tmp_path / "q.onnx"),
                                          providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    assert np.allclose(ours, theirs, atol=1e-6)
    ref = numpy_helper.to_array(table)[feeds["ids"]]
    assert np.abs(ours - ref).max() < 0.5


@pytest.mark.parametrize("quant_type", [0, 1])
def test_matmul_bnb4_matches_onnxruntime(tmp_path, quant_type):
    import onnxruntime

    from onnxrun.quantization.matmul_bnb4_quantizer import MatMulBnb4Quantizer

    rng = np.random.default_rng(17)
    w = numpy_helper.from_array(rng.standard_normal((52, 30)).astype(np.float32), "w")
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "g",
                          [helper.make_tensor_value_info("x", 1, [3, 52])],
                          [helper.make_tensor_value_info("y", 1, [3, 30])], [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    q = MatMulBnb4Quantizer(m, quant_type, 64)
    q.process()
    node = q.model.nodes()[0]
    assert node.op_type == "MatMulBnb4"
    packed = numpy_helper.to_array(q.model.get_initializer(node.input[1]))
    assert packed.shape == ((52 * 30 + 1) // 2,)
    onnx.save(q.model.model, tmp_path / "q.onnx")
    x = {"x": rng.standard_normal((3, 52)).astype(np.float32)}
    ours = onnxrun.InferenceSession(str(tmp_path / "q.onnx")).run(None, x)[0]
    theirs = onnxruntime.InferenceSession(str(tmp_path / "q.onnx"),
                                          providers=["CPUExecutionProvider"]).run(None, x)[0]
    assert np.allclose(ours, theirs, atol=1e-4)
