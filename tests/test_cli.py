"""The ``onnxrun`` command line: ``info`` and ``run``."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnx.parser
import pytest
from onnx import numpy_helper

import onnxrun
from onnxrun.tools.cli import main

LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"

MODEL_TEXT = """
<ir_version: 8, opset_import: ["" : 17], producer_name: "cli-test", producer_version: "0.3">
main (float[batch, 3] X, int64[batch, seq] ids, bool[2] mask, string[1] text)
    => (float[batch, 3] Y, int64[batch, seq] ids_out, bool[2] mask_out, string[1] text_out)
<float[3] W = {1.0, 2.0, 3.0}, float[3] B = {0.0, 0.0, 0.0}>
{
    T = Mul(X, W)
    U = Add(T, B)
    Y = Relu(U)
    ids_out = Identity(ids)
    mask_out = Identity(mask)
    text_out = Identity(text)
}
"""


@pytest.fixture(scope="module")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("cli") / "small.onnx"
    onnx.save(onnx.parser.parse_model(MODEL_TEXT), path)
    return path


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "onnxrun", *args], capture_output=True,
                          text=True, timeout=120)


def run_in_process(capsys: pytest.CaptureFixture, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def output_line(stdout: str, name: str) -> str:
    lines = [ln.strip() for ln in stdout.splitlines() if ln.strip().startswith(f"{name}:")]
    assert lines, f"no line for {name} in:\n{stdout}"
    return lines[-1]


# -- info -----------------------------------------------------------------------------------------


def test_info(model_path: Path):
    done = cli("info", str(model_path))
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert re.search(r"producer:\s+cli-test 0.3", out)
    assert re.search(r"ir_version:\s+8", out)
    assert re.search(r"opsets:\s+ai.onnx 17", out)
    assert re.search(r"X\s+tensor\(float\)\s+\[batch, 3\]", out)
    assert re.search(r"ids\s+tensor\(int64\)\s+\[batch, seq\]", out)
    assert re.search(r"text_out\s+tensor\(string\)\s+\[1\]", out)
    assert re.search(r"initializers:\s+2, 24 B \(24 bytes\)", out)
    # The histogram is sorted by count, then name.
    hist = re.findall(r"^\s+(ai\.onnx:\w+)\s+(\d+)$", out, re.MULTILINE)
    assert hist == [("ai.onnx:Identity", "3"), ("ai.onnx:Add", "1"), ("ai.onnx:Mul", "1"),
                    ("ai.onnx:Relu", "1")]


def test_info_needs_no_kernels(tmp_path: Path, capsys):
    m = onnx.parser.parse_model("""
        <ir_version: 8, opset_import: ["" : 17, "com.example" : 1]>
        main (float[N] X) => (float[N] Y) { Y = com.example.Unknown(X) }
    """)
    path = tmp_path / "custom.onnx"
    onnx.save(m, path)
    code, out, _ = run_in_process(capsys, "info", str(path))
    assert code == 0
    assert re.search(r"com\.example:Unknown\s+1", out)
    assert re.search(r"opsets:\s+ai.onnx 17, com.example 1", out)


def test_info_reads_external_data_like_a_session(tmp_path: Path, capsys):
    m = onnx.parser.parse_model("""
        <ir_version: 8, opset_import: ["" : 17]> main (float[4] X) => (float[4] Y) { Y = Mul(X, W) }
    """)
    m.graph.initializer.append(numpy_helper.from_array(np.arange(4, dtype=np.float32), "W"))
    path = tmp_path / "ext.onnx"
    onnx.save_model(m, str(path), save_as_external_data=True, location="w.bin",
                    size_threshold=0)
    code, out, _ = run_in_process(capsys, "info", str(path))
    assert code == 0 and re.search(r"initializers:\s+1, 16 B", out)
    (tmp_path / "w.bin").unlink()
    code, _, err = run_in_process(capsys, "info", str(path))
    assert code == 1 and "w.bin" in err and len(err.strip().splitlines()) == 1


# -- run --------------------------------------------------------------------------------------


def test_run_with_generated_inputs(model_path: Path):
    done = cli("run", str(model_path), "-r", "3")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    # Symbolic dimensions default to 1; each output: name, dtype, shape, summary.
    assert re.match(r"Y: float32 \[1, 3\]\s+min=\S+ max=\S+ mean=\S+\s+first: \[", output_line(
        out, "Y"))
    ids = output_line(out, "ids_out")
    assert ids.startswith("ids_out: int64 [1, 1]")
    assert int(re.search(r"min=(\d+)", ids).group(1)) >= 0  # small non-negative integers
    assert output_line(out, "mask_out").startswith("mask_out: bool [2]  true=")
    assert output_line(out, "text_out") == "text_out: object [1]  first: ['a']"
    assert re.search(r"latency: first run [\d.]+ ms, median of 3 runs [\d.]+ ms", out)


def test_run_dims_inputs_and_output_dir(model_path: Path, tmp_path: Path, capsys):
    x = np.array([[1.0, -1.0, 2.0], [0.5, 0.5, -3.0]], np.float32)
    np.save(tmp_path / "x.npy", x)
    out_dir = tmp_path / "out"
    code, out, err = run_in_process(capsys, "run", str(model_path), "--dim", "seq=5", "--input",
                                    f"X={tmp_path / 'x.npy'}", "--output-dir", str(out_dir),
                                    "-r", "0", "--seed", "7")
    assert code == 0, err
    assert "X: float32 [2, 3] (from" in out
    # batch comes from the given X only where the model says so: generated ids use --dim/1.
    assert output_line(out, "ids_out").startswith("ids_out: int64 [1, 5]")
    assert "median" not in out  # -r 0: the first run only
    y = np.load(out_dir / "Y.npy")
    np.testing.assert_array_equal(y, np.maximum(x * np.array([1, 2, 3], np.float32), 0))
    ids_in = np.load(out_dir / "inputs" / "ids.npy")
    assert ids_in.dtype == np.int64 and ids_in.min() >= 0 and ids_in.max() <= 9
    np.testing.assert_array_equal(np.load(out_dir / "ids_out.npy"), ids_in)
    # The saved inputs replay the same run through the Python API.
    sess = onnxrun.InferenceSession(str(model_path))
    feeds = {n: np.load(out_dir / "inputs" / f"{n}.npy", allow_pickle=True)
             for n in ("X", "ids", "mask", "text")}
    np.testing.assert_array_equal(sess.run(["Y"], feeds)[0], y)


def test_run_is_reproducible_with_a_seed(model_path: Path, tmp_path: Path, capsys):
    results = []
    for seed, folder in ((3, "a"), (3, "b"), (4, "c")):
        code, _, err = run_in_process(capsys, "run", str(model_path), "--seed", str(seed),
                                      "--dim", "batch=4", "-o", str(tmp_path / folder), "-r", "0")
        assert code == 0, err
        results.append(np.load(tmp_path / folder / "inputs" / "X.npy"))
    assert results[0].shape == (4, 3)
    np.testing.assert_array_equal(results[0], results[1])
    assert not np.array_equal(results[0], results[2])


def test_run_reads_pb_tensors(model_path: Path, tmp_path: Path, capsys):
    ids = np.array([[4, 2, 0]], np.int64)
    (tmp_path / "ids.pb").write_bytes(numpy_helper.from_array(ids, "ids").SerializeToString())
    code, out, err = run_in_process(capsys, "run", str(model_path), "-i",
                                    f"ids={tmp_path / 'ids.pb'}", "-r", "0")
    assert code == 0, err
    assert "first: [4, 2, 0]" in output_line(out, "ids_out")


# -- errors: one line, non-zero status, no traceback -------------------------------------------


def test_bad_path_gives_one_line_error():
    done = cli("run", "/no/such/model.onnx")
    assert done.returncode != 0
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr
    assert lines[0].startswith("onnxrun: error:") and "/no/such/model.onnx" in lines[0]
    done = cli("info", "/no/such/model.onnx")
    assert done.returncode != 0 and len(done.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("make_args,message", [
    (lambda d, m: ["run", str(d / "garbage.onnx")], "protobuf"),
    (lambda d, m: ["info", str(d / "garbage.onnx")], "protobuf"),
    (lambda d, m: ["run", m, "--input", f"nope={d / 'x64.npy'}"], "no input of that name"),
    (lambda d, m: ["run", m, "--input", f"X={d / 'x64.npy'}"], "tensor(double)"),
    (lambda d, m: ["run", m, "--input", f"X={d / 'missing.npy'}"], "does not exist"),
    (lambda d, m: ["run", m, "--input", f"X={d / 'garbage.onnx'}"], ".npy"),
    (lambda d, m: ["run", m, "--dim", "batch"], "NAME=VALUE"),
    (lambda d, m: ["run", m, "--dim", "batch=two"], "integer"),
])
def test_bad_arguments_give_one_line_errors(model_path, tmp_path, capsys, make_args, message):
    (tmp_path / "garbage.onnx").write_bytes(b"\x00\x01 definitely not a model")
    np.save(tmp_path / "x64.npy", np.zeros((1, 3), np.float64))
    code, out, err = run_in_process(capsys, *make_args(tmp_path, str(model_path)))
    assert code == 1
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("onnxrun: error:"), err
    assert message in lines[0]


def test_unused_dim_is_noted(model_path: Path, capsys):
    code, _, err = run_in_process(capsys, "run", str(model_path), "--dim", "nosuchdim=3", "-r",
                                  "0")
    assert code == 0 and "nosuchdim" in err


def test_console_script_if_installed(model_path: Path):
    script = Path(sys.executable).parent / "onnxrun"
    if not script.exists():
        pytest.skip("the onnxrun console script is not installed next to this interpreter")
    done = subprocess.run([str(script), "info", str(model_path)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and "cli-test" in done.stdout


# -- a real model ---------------------------------------------------------------------------------


def test_info_on_light_squeezenet(capsys):
    code, out, err = run_in_process(capsys, "info", str(LIGHT / "light_squeezenet.onnx"))
    assert code == 0, err
    assert re.search(r"data_0\s+tensor\(float\)\s+\[1, 3, 224, 224\]", out)
    assert re.search(r"ai\.onnx:Conv\s+26", out)


def test_run_light_squeezenet_with_no_argument_but_the_path():
    path = LIGHT / "light_squeezenet.onnx"
    try:
        onnxrun.InferenceSession(str(path))
    except onnxrun.NotImplemented as e:
        pytest.skip(f"kernels not there yet: {e}")
    done = cli("run", str(path), "-r", "1")
    assert done.returncode == 0, done.stderr
    line = output_line(done.stdout, "softmaxout_1")
    assert line.startswith("softmaxout_1: float32 [1, 1000, 1, 1]")
    assert float(re.search(r"mean=(\S+)", line).group(1)) == pytest.approx(1e-3, rel=1e-3)


# -- onnxrun optimize -----------------------------------------------------------------------------

OPT_TEXT = """
<ir_version: 8, opset_import: ["" : 17]>
main (float[N, 3, 8, 8] X) => (float[N, 4, 6, 6] Y) {
    C = Conv<kernel_shape = [3, 3]>(X, W)
    B = BatchNormalization(C, scale, bias, mean, var)
    D = Div(B, two)
    Y = Relu(D)
}
"""


@pytest.fixture(scope="module")
def conv_bn_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    rng = np.random.default_rng(0)
    model = onnx.parser.parse_model(OPT_TEXT)
    inits = {"W": rng.standard_normal((4, 3, 3, 3)), "scale": rng.uniform(0.5, 1.5, 4),
             "bias": rng.standard_normal(4), "mean": rng.standard_normal(4),
             "var": rng.uniform(0.5, 1.5, 4), "two": np.array(2.0)}
    model.graph.initializer.extend(
        numpy_helper.from_array(v.astype(np.float32), k) for k, v in inits.items())
    path = tmp_path_factory.mktemp("cli-opt") / "conv_bn.onnx"
    onnx.save(model, path)
    return path


def test_optimize_writes_a_checked_model_and_reports(conv_bn_path: Path, tmp_path: Path,
                                                     capsys):
    out_path = tmp_path / "opt.onnx"
    code, out, err = run_in_process(capsys, "optimize", str(conv_bn_path), "-o", str(out_path),
                                    "--level", "basic", "--check")
    assert code == 0, err
    assert "optimization level 1: 4 nodes -> 2 nodes" in out
    assert re.search(r"ConvBNFusion\s+Conv\+BatchNormalization: 1", out)
    assert re.search(r"DivToMul\s+Div: 1", out)
    assert re.search(r"BatchNormalization\s+1\s+->\s+0", out)
    assert "check: onnx.checker accepts the saved model" in out
    assert "outputs match the unoptimized model's" in out
    saved = onnx.load(out_path)
    onnx.checker.check_model(saved)
    assert [n.op_type for n in saved.graph.node] == ["Conv", "Relu"]
    x = np.random.default_rng(1).standard_normal((2, 3, 8, 8)).astype(np.float32)
    plain = onnxrun.SessionOptions()
    plain.graph_optimization_level = onnxrun.GraphOptimizationLevel.ORT_DISABLE_ALL
    expected = onnxrun.InferenceSession(str(conv_bn_path), plain).run(None, {"X": x})[0]
    got = onnxrun.InferenceSession(str(out_path), plain).run(None, {"X": x})[0]
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)


def test_optimize_levels_and_disabled_passes(conv_bn_path: Path, tmp_path: Path, capsys):
    out_path = tmp_path / "opt.onnx"
    code, out, err = run_in_process(capsys, "optimize", str(conv_bn_path), "-o", str(out_path),
                                    "--level", "disable")
    assert code == 0, err
    assert "4 nodes -> 4 nodes" in out and "(no pass changed the graph)" in out
    code, out, err = run_in_process(capsys, "optimize", str(conv_bn_path), "-o", str(out_path),
                                    "--disable", "ConvBNFusion", "--dim", "N=2")
    assert code == 0, err
    assert "ConvBNFusion" not in out
    assert onnx.load(out_path).graph.input[0].type.tensor_type.shape.dim[0].dim_value == 2


def test_optimize_errors_are_one_line(conv_bn_path: Path, tmp_path: Path, capsys):
    code, _, err = run_in_process(capsys, "optimize", str(conv_bn_path), "-o",
                                  str(conv_bn_path))
    assert code == 1 and "names the model itself" in err
    code, _, err = run_in_process(capsys, "optimize", str(tmp_path / "missing.onnx"), "-o",
                                  str(tmp_path / "x.onnx"))
    assert code == 1 and "does not exist" in err
    with pytest.raises(SystemExit):
        main(["optimize", str(conv_bn_path), "-o", str(tmp_path / "x.onnx"), "--level", "max"])
