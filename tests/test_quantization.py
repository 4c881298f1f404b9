"""onnxrun.quantization: onnxruntime's quantization tool on onnxrun.

The trained models of ``tests/models/quant/`` (``scripts/train_quant_models.py``: a CNN on
scikit-learn's 8x8 digits, an MLP on the breast cancer table) are quantized dynamically and
statically (QDQ and QOperator) and must keep their test accuracy within one point; the models
onnxrun writes must run on onnxruntime with the same outputs, and those onnxruntime's tool writes
on onnxrun. onnxruntime (the test oracle) also checks the arithmetic: scales and zero points,
calibration ranges, the entropy threshold search. It runs the quantized models in its exact 8-bit
mode (``ort_int8.session``): by default its uint8 x int8 products saturate on CPUs without VNNI.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxruntime import quantization as oq
from ort_int8 import session as ort_exact

import onnxrun
from onnxrun.quantization import (
    CalibrationDataReader,
    CalibrationMethod,
    DynamicQuantConfig,
    FeedsDataReader,
    QuantFormat,
    QuantType,
    StaticQuantConfig,
    compute_scale_zp,
    create_calibrator,
    get_qmin_qmax_for_qType,
    quant_pre_process,
    quantize,
    quantize_data,
    quantize_dynamic,
    quantize_static,
)
from onnxrun.quantization.calibrate import HistogramCollector

HERE = Path(__file__).resolve().parent
QUANT = HERE / "models" / "quant"
MODELS = {"digits_cnn": "image", "cancer_mlp": "features"}
QUIET = {"CalibShowProgress": False}


# -- helpers ------------------------------------------------------------------------------------


class Data:
    def __init__(self, name: str) -> None:
        self.name = name
        self.path = str(QUANT / f"{name}.onnx")
        self.input = MODELS[name]
        d = np.load(QUANT / f"{name}.npz")
        self.x, self.y, self.calib = d["x_test"], d["y_test"], d["x_calib"]
        self.float_acc = self.accuracy(self.path)

    def batches(self, size: int = 32) -> list[dict[str, np.ndarray]]:
        return [{self.input: self.calib[i:i + size]} for i in range(0, len(self.calib), size)]

    def run(self, path: str, engine: str = "onnxrun") -> np.ndarray:
        sess = onnxrun.InferenceSession(path) if engine == "onnxrun" else ort_exact(path)
        return sess.run(None, {self.input: self.x})[0]

    def accuracy(self, path: str, engine: str = "onnxrun") -> float:
        return float((self.run(path, engine).argmax(1) == self.y).mean())


class OrtReader(oq.CalibrationDataReader):
    def __init__(self, feeds: list[dict[str, np.ndarray]]) -> None:
        self.it = iter(feeds)

    def get_next(self):
        return next(self.it, None)


@pytest.fixture(scope="module", params=list(MODELS))
def data(request) -> Data:
    return Data(request.param)


@pytest.fixture(scope="module")
def digits() -> Data:
    return Data("digits_cnn")


def ops(path: str) -> list[tuple[str, str]]:
    return [(n.domain or "", n.op_type) for n in onnx.load(path).graph.node]


def inits(path: str) -> dict[str, np.ndarray]:
    return {t.name: numpy_helper.to_array(t) for t in onnx.load(path).graph.initializer}


def assert_engines_match(a: np.ndarray, b: np.ndarray, rel: float) -> None:
    """Same predictions, and outputs within ``rel`` of their magnitude (integer pipelines of
    the two engines may round a value to the neighbouring quantization step)."""
    assert a.shape == b.shape
    assert (a.argmax(1) == b.argmax(1)).mean() >= 0.99
    assert np.abs(a - b).max() <= rel * max(np.abs(a).max(), 1e-6)


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


STATIC = {
    "qdq": dict(quant_format=QuantFormat.QDQ),
    "qdq-per-channel": dict(quant_format=QuantFormat.QDQ, per_channel=True),
    "qdq-uint8": dict(quant_format=QuantFormat.QDQ, activation_type=QuantType.QUInt8,
                      weight_type=QuantType.QUInt8),
    "qoperator": dict(quant_format=QuantFormat.QOperator, activation_type=QuantType.QUInt8),
    "qoperator-per-channel": dict(quant_format=QuantFormat.QOperator, per_channel=True,
                                  activation_type=QuantType.QUInt8),
}
DYNAMIC = {"dynamic": {}, "dynamic-per-channel": dict(per_channel=True),
           "dynamic-uint8": dict(weight_type=QuantType.QUInt8)}


def _ort_enum(kwargs: dict) -> dict:
    """The same keyword arguments with onnxruntime's enums."""
    out = {}
    for k, v in kwargs.items():
        if isinstance(v, QuantFormat):
            v = oq.QuantFormat[v.name]
        elif isinstance(v, QuantType):
            v = oq.QuantType[v.name]
        elif isinstance(v, CalibrationMethod):
            v = oq.CalibrationMethod[v.name]
        out[k] = v
    return out


# -- parameters and calibration, against onnxruntime's tool -------------------------------------


@pytest.mark.parametrize("qtype", [QuantType.QInt8, QuantType.QUInt8, QuantType.QInt16,
                                   QuantType.QUInt16])
@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("reduce_range", [False, True])
def test_scale_zero_point_match_onnxruntime(qtype, symmetric, reduce_range):
    from onnxruntime.quantization import quant_utils as qu

    rng = np.random.default_rng(0)
    t = qtype.tensor_type
    for lo, hi in [(-1.5, 2.0), (0.0, 6.0), (-3.0, -1.0), (0.0, 0.0), (1e-3, 2e-3)]:
        qmin, qmax = get_qmin_qmax_for_qType(qtype, reduce_range, symmetric)
        eqmin, eqmax = qu.get_qmin_qmax_for_qType(t, reduce_range, symmetric)
        assert (qmin, qmax) == (eqmin, eqmax) and qmin.dtype == eqmin.dtype
        zp, s = compute_scale_zp(np.float32(lo), np.float32(hi), qmin, qmax, symmetric)
        ezp, es = qu.compute_scale_zp(np.float32(lo), np.float32(hi), eqmin, eqmax, symmetric)
        assert zp == ezp and zp.dtype == ezp.dtype and s == es and s.dtype == es.dtype
    w = rng.standard_normal((6, 5)).astype(np.float32)
    zp, s, q = quantize_data(w, qtype, symmetric, reduce_range)
    ezp, es, eq = qu.quantize_data(w.ravel(), t, symmetric, reduce_range)
    assert zp == ezp and s == es and np.array_equal(q.ravel(), eq)
    zp, s, q = quantize_data(w, qtype, symmetric, reduce_range, axis=1)  # per channel
    for c in range(w.shape[1]):
        ezp, es, eq = qu.quantize_data(w[:, c], t, symmetric, reduce_range)
        assert zp[c] == ezp and s[c] == es and np.array_equal(q[:, c], eq)


def _ort_divergences(hist: np.ndarray, levels: int) -> np.ndarray:
    """onnxruntime's KL divergence of every candidate (its loop, its helpers)."""
    from onnxruntime.quantization.calibrate import entropy
    from onnxruntime.quantization.quant_utils import smooth_distribution

    nb, half = hist.size, levels // 2
    zero = nb // 2
    out = []
    for i in range(half, zero + 1):
        s, e = zero - i, min(zero + i + 1, nb)
        sliced = hist[s:e]
        p = sliced.copy()
        p[0] += hist[:s].sum()
        p[-1] += hist[e:].sum()
        m = sliced.size // levels
        merged = sliced[:levels * m].reshape(levels, m).sum(1)
        merged[-1] += sliced[levels * m:].sum()
        norms = (p[:levels * m] != 0).reshape(levels, m).sum(1)
        q = np.zeros(p.size, np.int64)
        q[:levels * m] = np.repeat(np.where(norms > 0, merged // np.maximum(norms, 1), 0), m)
        ps, qs = smooth_distribution(p), smooth_distribution(q)
        out.append(np.inf if ps is None or qs is None else float(entropy(ps, qs)))
    return np.array(out)


@pytest.mark.parametrize("seed", range(4))
def test_entropy_threshold_matches_onnxruntime(seed):
    from onnxruntime.quantization.calibrate import HistogramCollector as OrtCollector

    rng = np.random.default_rng(seed)
    values = [rng.standard_normal(5000), rng.exponential(1.0, 5000) - 0.2,
              np.concatenate([rng.standard_normal(4000), 8 + rng.standard_normal(50)]),
              np.maximum(rng.standard_normal(5000), 0)][seed].astype(np.float32)
    for bins in (128, 256, 301):
        mine = HistogramCollector("entropy", False, bins, 128, 99.999, "same")
        mine.collect({"t": [values]})
        theirs = OrtCollector("entropy", False, bins, 128, 99.999, "same")
        theirs.collect({"t": values})
        got = mine.get_entropy_threshold(mine.histogram_dict["t"], 128)
        want = theirs.get_entropy_threshold(theirs.histogram_dict["t"], 128)
        assert float(got[0]) == float(want[0])
        if float(got[1]) != float(want[1]):  # a tie within onnxruntime's float32 rounding
            hist, edges = theirs.histogram_dict["t"][:2]
            kl = _ort_divergences(hist, 128)
            pick = int(np.searchsorted(edges, got[1])) - hist.size // 2 - 1 - 64
            assert kl[pick] <= kl.min() * (1 + 1e-5)


@pytest.mark.parametrize("method", [CalibrationMethod.MinMax, CalibrationMethod.Entropy,
                                    CalibrationMethod.Percentile])
def test_calibration_ranges_match_onnxruntime(digits, method, tmp_path, capsys):
    feeds = digits.batches()
    mine = create_calibrator(digits.path, calibrate_method=method)
    mine.collect_data(FeedsDataReader(feeds))
    got = mine.compute_data()
    err = capsys.readouterr().err
    assert "Calibrating [" in err and f"{len(feeds)}/{len(feeds)} batches" in err
    theirs = oq.create_calibrator(digits.path, calibrate_method=oq.CalibrationMethod[method.name],
                                  augmented_model_path=str(tmp_path / "aug.onnx"))
    theirs.collect_data(OrtReader(feeds))
    want = theirs.compute_data()
    assert set(got) == set(want)
    for name in want:
        lo, hi = got[name].range_value
        elo, ehi = want[name].range_value
        # the model runs on different engines: its values may differ in the last bits
        np.testing.assert_allclose([float(lo), float(hi)], [float(np.ravel(elo)[0]),
                                   float(np.ravel(ehi)[0])], rtol=1e-4, atol=1e-5)


def test_minmax_moving_average():
    model = helper.make_model(helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 4])]),
        opset_imports=[helper.make_opsetid("", 17)])
    batches = [np.array([[lo, 0, 1, hi]], np.float32) for lo, hi in [(-4, 2), (-2, 6), (-3, 1)]]
    cal = create_calibrator(model, extra_options={"moving_average": True, "show_progress": False})
    cal.collect_data(FeedsDataReader([{"x": b} for b in batches]))
    lo, hi = cal.compute_data()["x"].range_value
    assert (float(lo), float(hi)) == (-3.0, 3.0)  # the mean of the batches' extremes
    plain = create_calibrator(model, extra_options={"show_progress": False})
    plain.collect_data(FeedsDataReader([{"x": b} for b in batches]))
    lo, hi = plain.compute_data()["x"].range_value
    assert (float(lo), float(hi)) == (-4.0, 6.0)


def test_data_readers(digits, tmp_path):
    reader = FeedsDataReader(digits.batches())
    assert len(reader) == 4 and isinstance(reader, CalibrationDataReader)
    assert list(reader) and reader.get_next() is None  # exhausted
    reader.rewind()
    assert reader.get_next() is not None
    reader.set_range(1, 3)
    assert len(list(reader)) == 2

    class Plain:  # any object with get_next() will do, as in onnxruntime
        def __init__(self, feeds):
            self.feeds = list(feeds)

        def get_next(self):
            return self.feeds.pop(0) if self.feeds else None

    assert isinstance(Plain([]), CalibrationDataReader)
    out = tmp_path / "q.onnx"
    quantize_static(digits.path, out, Plain(digits.batches()), extra_options=QUIET)
    assert abs(digits.accuracy(str(out)) - digits.float_acc) <= 0.01
    with pytest.raises(ValueError, match="No data"):
        quantize_static(digits.path, out, Plain([]), extra_options=QUIET)


# -- accuracy of the trained models -------------------------------------------------------------


@pytest.mark.parametrize("mode", list(DYNAMIC) + list(STATIC))
def test_accuracy_within_one_point(data, mode, tmp_path):
    out = str(tmp_path / "q.onnx")
    if mode in DYNAMIC:
        quantize_dynamic(data.path, out, **DYNAMIC[mode])
    else:
        quantize_static(data.path, out, FeedsDataReader(data.batches()), extra_options=QUIET,
                        **STATIC[mode])
    acc = data.accuracy(out)
    assert abs(acc - data.float_acc) <= 0.01, (mode, acc, data.float_acc)
    if data.name == "digits_cnn":  # the MLP is too small for its weights to dominate the file
        assert os.path.getsize(out) < 0.45 * os.path.getsize(data.path)
    # the same model on onnxruntime
    rel = 1e-4 if mode in DYNAMIC else 0.05
    assert_engines_match(data.run(out), data.run(out, "onnxruntime"), rel)


@pytest.mark.parametrize("method", [CalibrationMethod.Entropy, CalibrationMethod.Percentile])
def test_accuracy_other_calibration_methods(digits, method, tmp_path):
    out = str(tmp_path / "q.onnx")
    quantize_static(digits.path, out, FeedsDataReader(digits.batches()),
                    calibrate_method=method, extra_options=QUIET)
    assert abs(digits.accuracy(out) - digits.float_acc) <= 0.01
    assert_engines_match(digits.run(out), digits.run(out, "onnxruntime"), 0.05)


# -- models from onnxruntime's tool on onnxrun, and the two tools compared ---------------------


@pytest.mark.parametrize("mode", list(DYNAMIC) + list(STATIC))
def test_onnxruntime_quantized_models_run_on_onnxrun(data, mode, tmp_path):
    theirs, mine = str(tmp_path / "ort.onnx"), str(tmp_path / "mine.onnx")
    if mode in DYNAMIC:
        oq.quantize_dynamic(data.path, theirs, **_ort_enum(DYNAMIC[mode]))
        quantize_dynamic(data.path, mine, **DYNAMIC[mode])
        rel = 1e-4
    else:
        oq.quantize_static(data.path, theirs, OrtReader(data.batches()),
                           **_ort_enum(STATIC[mode]))
        quantize_static(data.path, mine, FeedsDataReader(data.batches()), extra_options=QUIET,
                        **STATIC[mode])
        rel = 0.05
    expected = data.run(theirs, "onnxruntime")
    assert_engines_match(data.run(theirs), expected, rel)
    # the same graph as onnxruntime's tool writes (which reshapes Conv biases in the graph),
    # the same stored weights (where both quantize them alike: onnxrun's dynamic Conv also
    # honours per_channel)
    assert sorted(o for o in ops(mine) if o[1] != "Reshape") == \
        sorted(o for o in ops(theirs) if o[1] != "Reshape")
    a, b = inits(mine), inits(theirs)
    for name, value in b.items():
        base = name[:-len("_quantized")]
        if name.endswith("_quantized") and value.dtype != np.int32:
            if f"{base}_scale" in a and a[f"{base}_scale"].shape == b[f"{base}_scale"].shape:
                assert np.array_equal(a[name], value), name
        elif name in a and (name.endswith("_scale") or name.endswith("_zero_point")):
            # activation ranges come from engines whose floats may differ in the last bits
            np.testing.assert_allclose(a[name].astype(np.float64), value.astype(np.float64),
                                       rtol=1e-4, atol=1, err_msg=name)


def test_formats(digits, tmp_path):
    qdq, qop, dyn = (str(tmp_path / f"{n}.onnx") for n in ("qdq", "qop", "dyn"))
    quantize_static(digits.path, qdq, FeedsDataReader(digits.batches()), extra_options=QUIET)
    quantize_static(digits.path, qop, FeedsDataReader(digits.batches()), extra_options=QUIET,
                    quant_format=QuantFormat.QOperator, activation_type=QuantType.QUInt8)
    quantize_dynamic(digits.path, dyn)
    kinds = [o for _, o in ops(qdq)]
    assert "Relu" not in kinds and kinds.count("Conv") == 3 and "QuantizeLinear" in kinds
    w = inits(qdq)
    assert w["conv1.weight_quantized"].dtype == np.int8
    assert w["conv1.bias_quantized"].dtype == np.int32  # scale: input scale * weight scale
    np.testing.assert_allclose(w["conv1.bias_quantized_scale"],
                               w["image_scale"] * w["conv1.weight_scale"], rtol=1e-6)
    assert {("com.microsoft", "QLinearAdd"), ("com.microsoft", "QLinearGlobalAveragePool"),
            ("com.microsoft", "QGemm"), ("", "QLinearConv")} <= set(ops(qop))
    assert {o for _, o in ops(dyn)} >= {"DynamicQuantizeLinear", "ConvInteger", "MatMulInteger"}
    assert not any(v.dtype == np.float32 and v.size > 100 for v in inits(dyn).values())


# -- transformer and recurrent models -----------------------------------------------------------


def _npz_feeds(name: str) -> dict[str, np.ndarray]:
    d = np.load(HERE / "models" / f"{name}.inputs.npz")
    return {k.split("/", 1)[1]: d[k] for k in d if k.startswith("0/")}


def assert_matches_onnxruntime(path: str, feeds: dict[str, np.ndarray]) -> None:
    """onnxrun's outputs on a dynamically quantized model are onnxruntime's, each within 1e-4 of
    what onnxruntime gives on the graph as written (ORT_DISABLE_ALL) or on its fused graph.
    The two differ in the last bits of their floats, and dynamic quantization turns such a bit
    into a whole step (1/255 of an activation row's range) where a value lies on a rounding
    boundary: bert_tiny's per-channel model moves by 7.7e-4 between them on AVX2."""
    unfused = ort.SessionOptions()
    unfused.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    runs = [ort_exact(path, o).run(None, feeds) for o in (unfused, None)]
    for g, *theirs in zip(onnxrun.InferenceSession(path).run(None, feeds), *runs, strict=True):
        off = np.minimum(*(np.abs(g - o) - 1e-4 * np.abs(o) for o in theirs))
        assert off.max() <= 1e-4, off.max()


def test_bert_dynamic_per_channel_against_onnxruntime(tmp_path):
    src = str(HERE / "models" / "bert_tiny.onnx")
    feeds = _npz_feeds("bert_tiny")
    ref = ort.InferenceSession(src).run(None, feeds)
    mine, theirs = str(tmp_path / "mine.onnx"), str(tmp_path / "ort.onnx")
    quantize_dynamic(src, mine, per_channel=True)
    oq.quantize_dynamic(src, theirs, per_channel=True)
    got = onnxrun.InferenceSession(mine).run(None, feeds)
    other = ort_exact(theirs).run(None, feeds)
    for r, g, o in zip(ref, got, other, strict=True):
        assert cosine(r, g) >= cosine(r, o) - 1e-7
    assert_matches_onnxruntime(mine, feeds)
    # embeddings and projections are int8: 38% of the float file here (the embeddings'
    # share grows with the vocabulary: 25% for MiniLM-L6, see test_minilm_size)
    assert os.path.getsize(mine) <= 0.40 * os.path.getsize(src)
    # the same on onnxruntime's model
    assert_matches_onnxruntime(theirs, feeds)


def _bench_cache() -> Path:
    return Path(os.environ.get("ONNXRUN_BENCH_CACHE") or Path.home() / ".cache" / "onnxrun-bench")


@pytest.mark.skipif(not (_bench_cache() / "bert_minilm_l6" / "model.onnx").exists(),
                    reason="run scripts/generate_bench_models.py bert_minilm_l6 first")
def test_minilm_size(tmp_path):
    src = _bench_cache() / "bert_minilm_l6" / "model.onnx"
    out = tmp_path / "q.onnx"
    quantize_dynamic(src, out, per_channel=True)
    assert out.stat().st_size <= 0.30 * src.stat().st_size


def test_lstm_dynamic(tmp_path):
    src = str(HERE / "models" / "lstm_model.onnx")
    feeds = _npz_feeds("lstm_model")
    out = str(tmp_path / "q.onnx")
    quantize_dynamic(src, out)
    assert ("com.microsoft", "DynamicQuantizeLSTM") in ops(out)
    ref = ort.InferenceSession(src).run(None, feeds)[0]
    got = onnxrun.InferenceSession(out).run(None, feeds)[0]
    assert cosine(ref, got) > 0.9999
    np.testing.assert_allclose(got, ort_exact(out).run(None, feeds)[0], atol=3e-3)


# -- options ------------------------------------------------------------------------------------


def test_node_and_op_filters(digits, tmp_path):
    out = str(tmp_path / "q.onnx")
    conv1 = next(n.name for n in onnx.load(digits.path).graph.node if n.op_type == "Conv")
    quantize_static(digits.path, out, FeedsDataReader(digits.batches()), extra_options=QUIET,
                    quant_format=QuantFormat.QOperator, activation_type=QuantType.QUInt8,
                    nodes_to_exclude=[conv1])
    kinds = [o for _, o in ops(out)]
    assert kinds.count("Conv") == 1 and kinds.count("QLinearConv") == 2
    quantize_dynamic(digits.path, out, op_types_to_quantize=["MatMul"])
    kinds = [o for _, o in ops(out)]
    assert "ConvInteger" not in kinds and "MatMulInteger" in kinds  # Gemm -> MatMul
    assert abs(digits.accuracy(out) - digits.float_acc) <= 0.01


def test_symmetric_and_reduced_range(digits, tmp_path):
    out = str(tmp_path / "q.onnx")
    quantize_static(digits.path, out, FeedsDataReader(digits.batches()), reduce_range=True,
                    extra_options={**QUIET, "ActivationSymmetric": True})
    w = inits(out)
    assert all(not v.any() for k, v in w.items() if k.endswith("_zero_point"))
    assert all(np.abs(v.astype(int)).max() <= 64 for k, v in w.items()
               if k.endswith("weight_quantized"))
    assert abs(digits.accuracy(out) - digits.float_acc) <= 0.02


def test_int16_activations(digits, tmp_path):
    out = str(tmp_path / "q.onnx")
    quantize_static(digits.path, out, FeedsDataReader(digits.batches()), extra_options=QUIET,
                    activation_type=QuantType.QInt16, weight_type=QuantType.QInt8)
    model = onnx.load(out)
    assert model.opset_import[0].version >= 21
    assert inits(out)["image_zero_point"].dtype == np.int16
    a, b = digits.run(out), digits.run(out, "onnxruntime")
    assert_engines_match(a, b, 1e-3)
    assert abs(digits.accuracy(out) - digits.float_acc) <= 0.01


def test_infinite_ranges_stay_float(tmp_path):
    """A -inf mask cannot be scaled: the tensors holding it are left float."""
    model = helper.make_model(helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["s"]),
         helper.make_node("Where", ["mask", "neg", "s"], ["m"]),
         helper.make_node("Softmax", ["m"], ["y"], axis=-1)], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 8]),
         helper.make_tensor_value_info("mask", TensorProto.BOOL, [None, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 8])],
        [numpy_helper.from_array(np.random.default_rng(0).standard_normal((8, 8))
                                 .astype(np.float32), "w"),
         numpy_helper.from_array(np.array(-np.inf, np.float32), "neg")]),
        opset_imports=[helper.make_opsetid("", 17)])
    rng = np.random.default_rng(1)
    feeds = [{"x": rng.standard_normal((4, 8)).astype(np.float32),
              "mask": rng.random((4, 8)) < 0.3} for _ in range(3)]
    out = str(tmp_path / "q.onnx")
    quantize_static(model, out, FeedsDataReader(feeds), extra_options=QUIET)
    y = onnxrun.InferenceSession(out).run(None, feeds[0])[0]
    ref = onnxrun.InferenceSession(model).run(None, feeds[0])[0]
    assert np.all(np.isfinite(y)) and np.all(y[feeds[0]["mask"]] == 0)
    np.testing.assert_allclose(y, ref, atol=0.02)


def test_preprocess_config_and_external_data(digits, tmp_path):
    pre = tmp_path / "pre.onnx"
    model = quant_pre_process(digits.path, pre)
    assert any(p.key == "onnx.quant.pre_process" for p in model.metadata_props)
    np.testing.assert_allclose(digits.run(str(pre)), digits.run(digits.path), rtol=1e-4,
                               atol=1e-4)
    out = tmp_path / "q.onnx"
    quantize(pre, out, StaticQuantConfig(FeedsDataReader(digits.batches()), per_channel=True,
                                         extra_options=QUIET))
    assert abs(digits.accuracy(str(out)) - digits.float_acc) <= 0.01
    quantize(digits.path, out, DynamicQuantConfig(per_channel=True))
    assert abs(digits.accuracy(str(out)) - digits.float_acc) <= 0.01
    quantize_dynamic(digits.path, out, use_external_data_format=True)
    assert (tmp_path / "q.onnx.data").exists()
    assert abs(digits.accuracy(str(out)) - digits.float_acc) <= 0.01


def _many_ops_model() -> onnx.ModelProto:
    """Conv, LeakyRelu, Split, Sigmoid, Mul, AveragePool, Pad, Resize, MaxPool, Unsqueeze,
    Squeeze, Concat, Clip, Transpose, Reshape, MatMul, Softmax."""
    rng = np.random.default_rng(0)

    def w(name, shape, s=0.3):
        return numpy_helper.from_array((rng.standard_normal(shape) * s).astype(np.float32), name)

    def c(name, values, dtype):
        return numpy_helper.from_array(np.array(values, dtype), name)

    n = helper.make_node
    nodes = [
        n("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        n("LeakyRelu", ["c1"], ["l1"], alpha=0.1),
        n("Split", ["l1", "split"], ["s1", "s2"], axis=1),
        n("Sigmoid", ["s1"], ["sg"]),
        n("Mul", ["sg", "s2"], ["m1"]),
        n("AveragePool", ["m1"], ["ap"], kernel_shape=[2, 2], strides=[2, 2]),
        n("Pad", ["ap", "pads"], ["pd"], mode="constant"),
        n("Resize", ["pd", "", "scales"], ["rs"], mode="nearest"),
        n("Conv", ["x", "w3"], ["b_conv"], pads=[1, 1, 1, 1]),
        n("MaxPool", ["b_conv"], ["b_pool"], kernel_shape=[2, 2], strides=[2, 2]),
        n("Unsqueeze", ["b_pool", "axes"], ["b_u"]),
        n("Squeeze", ["b_u", "axes"], ["b_s"]),
        n("Resize", ["b_s", "", "scales"], ["b_r"], mode="nearest"),
        n("Concat", ["rs", "b_r"], ["cc"], axis=1),
        n("Clip", ["cc", "zero", "six"], ["cl"]),
        n("Transpose", ["cl"], ["tp"], perm=[0, 2, 3, 1]),
        n("Reshape", ["tp", "shape"], ["rh"]),
        n("MatMul", ["rh", "w2"], ["mm"]),
        n("Softmax", ["mm"], ["y"], axis=-1),
    ]
    inits_ = [w("w1", (8, 3, 3, 3)), w("b1", (8,), 0.1), w("w3", (4, 3, 3, 3)), w("w2", (8, 5)),
              c("split", [4, 4], np.int64), c("pads", [0] * 8, np.int64),
              c("scales", [1, 1, 2, 2], np.float32), c("axes", [1], np.int64),
              c("zero", 0, np.float32), c("six", 6, np.float32),
              c("shape", [-1, 8], np.int64)]
    graph = helper.make_graph(nodes, "many", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, ["N", 3, 8, 8])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, ["M", 5])], inits_)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("fmt", [QuantFormat.QDQ, QuantFormat.QOperator])
@pytest.mark.parametrize("per_channel", [False, True])
def test_many_operators_as_onnxruntime_tool(fmt, per_channel, tmp_path):
    path = str(tmp_path / "model.onnx")
    onnx.save(_many_ops_model(), path)
    rng = np.random.default_rng(1)
    feeds = [{"x": rng.standard_normal((2, 3, 8, 8)).astype(np.float32)} for _ in range(4)]
    kwargs = dict(quant_format=fmt, per_channel=per_channel,
                  activation_type=QuantType.QUInt8 if fmt == QuantFormat.QOperator
                  else QuantType.QInt8)
    mine, theirs = str(tmp_path / "mine.onnx"), str(tmp_path / "ort.onnx")
    quantize_static(path, mine, FeedsDataReader(feeds), extra_options=QUIET, **kwargs)
    oq.quantize_static(path, theirs, OrtReader(feeds), **_ort_enum(kwargs))
    onnx.checker.check_model(mine)
    assert sorted(ops(mine)) == sorted(ops(theirs))
    if fmt == QuantFormat.QOperator:
        assert {"QLinearLeakyRelu", "QLinearSigmoid", "QLinearMul", "QLinearAveragePool",
                "QLinearConcat", "QLinearSoftmax", "QLinearMatMul"} <= {o for _, o in ops(mine)}
    x = feeds[0]
    ref = onnxrun.InferenceSession(path).run(None, x)[0]
    for model in (mine, theirs):
        a = onnxrun.InferenceSession(model).run(None, x)[0]
        b = ort_exact(model).run(None, x)[0]
        # QOperator: the same integer kernels; QDQ: onnxruntime fuses the pairs into integer
        # kernels where onnxrun computes in float, a rounding may flip a step or a few
        assert np.abs(a - b).max() <= (0 if fmt == QuantFormat.QOperator else 5 / 255)
        assert np.abs(a - ref).max() < 0.05


def test_quantize_linear_saturates_like_onnxruntime():
    """NaN and infinities (an infinite scale, a -inf mask) quantize as onnxruntime does."""
    x = np.array([-np.inf, -1e38, 1, 0, np.inf, np.nan], np.float32)
    for zp in (np.array(3, np.int8), np.array(3, np.uint8)):
        for scale in (np.inf, 1e30, 0.1):
            graph = helper.make_graph(
                [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"])], "g",
                [helper.make_tensor_value_info("x", TensorProto.FLOAT, [6])],
                [helper.make_tensor_value_info("q", helper.np_dtype_to_tensor_dtype(zp.dtype),
                                               [6])],
                [numpy_helper.from_array(np.array(scale, np.float32), "s"),
                 numpy_helper.from_array(zp, "z")])
            model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
            want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
            got = onnxrun.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
            assert np.array_equal(got, want), (zp.dtype, scale, got, want)
