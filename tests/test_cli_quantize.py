"""``onnxrun quantize``: dynamic by default, ``--static`` with a folder of .npy inputs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import onnxrun
from onnxrun.tools.cli import main

QUANT = Path(__file__).resolve().parent / "models" / "quant"
MODEL = str(QUANT / "digits_cnn.onnx")


@pytest.fixture(scope="module")
def data() -> dict[str, np.ndarray]:
    return dict(np.load(QUANT / "digits_cnn.npz"))


def accuracy(path: str, data: dict[str, np.ndarray]) -> float:
    logits = onnxrun.InferenceSession(path).run(None, {"image": data["x_test"]})[0]
    return float((logits.argmax(1) == data["y_test"]).mean())


def op_types(path: Path) -> set[str]:
    return {n.op_type for n in onnx.load(str(path)).graph.node}


def test_dynamic_by_default(tmp_path, data, capsys):
    out = tmp_path / "q.onnx"
    assert main(["quantize", MODEL, "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "dynamic" in text and "ConvInteger" in text and "% of" in text
    assert {"ConvInteger", "MatMulInteger", "DynamicQuantizeLinear"} <= op_types(out)
    assert abs(accuracy(str(out), data) - accuracy(MODEL, data)) <= 0.01
    assert out.stat().st_size < 0.45 * Path(MODEL).stat().st_size


def test_static_qdq_indexed_batches(tmp_path, data, capsys):
    calib = tmp_path / "calib"
    calib.mkdir()
    for i in range(4):
        np.save(calib / f"image_{i}.npy", data["x_calib"][32 * i:32 * (i + 1)])
    out = tmp_path / "q.onnx"
    assert main(["quantize", MODEL, "-o", str(out), "--static", "--calibration-dir",
                 str(calib)]) == 0
    captured = capsys.readouterr()
    assert "4 calibration batch(es)" in captured.out and "4/4 batches" in captured.err
    assert {"QuantizeLinear", "DequantizeLinear", "Conv"} <= op_types(out)
    assert abs(accuracy(str(out), data) - accuracy(MODEL, data)) <= 0.01
    a = onnxrun.InferenceSession(str(out)).run(None, {"image": data["x_test"]})[0]
    b = ort.InferenceSession(str(out)).run(None, {"image": data["x_test"]})[0]
    assert (a.argmax(1) == b.argmax(1)).mean() >= 0.99


def test_static_qoperator_per_channel_one_file(tmp_path, data, capsys):
    calib = tmp_path / "calib"
    calib.mkdir()
    np.save(calib / "image.npy", data["x_calib"])
    out = tmp_path / "q.onnx"
    assert main(["quantize", MODEL, "-o", str(out), "--static", "--calibration-dir", str(calib),
                 "--format", "qoperator", "--per-channel", "--activation-type", "uint8",
                 "--calibrate-method", "percentile", "-q"]) == 0
    captured = capsys.readouterr()
    assert "1 calibration batch(es)" in captured.out and "per channel" in captured.out
    assert "Calibrating" not in captured.err
    assert {"QLinearConv", "QGemm", "QLinearAdd"} <= op_types(out)
    assert abs(accuracy(str(out), data) - accuracy(MODEL, data)) <= 0.01


def test_errors(tmp_path, capsys):
    out = str(tmp_path / "q.onnx")
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["quantize", MODEL, "-o", out, "--static", "--calibration-dir",
                 str(empty)]) == 1
    assert "no calibration data for input 'image'" in capsys.readouterr().err
    assert main(["quantize", MODEL, "-o", out, "--static"]) == 1
    assert "--calibration-dir" in capsys.readouterr().err
    np.save(empty / "image_0.npy", np.zeros((1, 1, 8, 8), np.float32))
    assert main(["quantize", MODEL, "-o", out, "--calibration-dir", str(empty)]) == 1
    assert "--static" in capsys.readouterr().err
    assert main(["quantize", str(tmp_path / "missing.onnx"), "-o", out]) == 1
    assert "does not exist" in capsys.readouterr().err
