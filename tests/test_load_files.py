"""Loading from files (load.py): what is read and from where.

- The model file is read, never memory-mapped: a file truncated or rewritten while it loads gives
  an onnxrun error, never a SIGBUS; weights are copied once into aligned arrays of their own.
- External data follows one rule: a location is relative with no '..' component, and the file it
  names may resolve (symlinks followed) inside the folder of the model path as given or inside
  the folder the model file itself resolves to (Hugging Face's hub layout). The rule is checked on
  the opened file, so swapping a folder for a symlink between check and open redirects nothing.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxrun
from onnxrun import load

# -- the model file ---------------------------------------------------------------------------


def _model(path) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(3)
    weights = {
        "W": rng.standard_normal((512, 600)).astype(np.float32),  # 1.2 MB
        "b": rng.standard_normal(600).astype(np.float32),
        "h": rng.standard_normal((600,)).astype(np.float16),
    }
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["m"]), helper.make_node("Add", ["m", "b"], ["a"]),
         helper.make_node("Cast", ["h"], ["hf"], to=TensorProto.FLOAT),
         helper.make_node("Mul", ["a", "hf"], ["y"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 512])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 600])],
        [numpy_helper.from_array(v, k) for k, v in weights.items()])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return weights


def test_file_gives_the_weights_of_its_bytes(tmp_path):
    path = tmp_path / "m.onnx"
    weights = _model(path)
    _, from_file = load.load_model(str(path))
    _, from_bytes = load.load_model(path.read_bytes())
    for name, expected in weights.items():
        got = from_file.graph.initializers[name].const_value
        np.testing.assert_array_equal(got, expected)
        np.testing.assert_array_equal(got, from_bytes.graph.initializers[name].const_value)
        assert got.flags.aligned and not got.flags.writeable
        assert got.base is None or not isinstance(got.base, memoryview)  # a copy of its own


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps")
def test_file_is_not_mapped_and_session_runs(tmp_path):
    path = tmp_path / "m.onnx"
    weights = _model(path)
    sess = onnxrun.InferenceSession(str(path))
    with open("/proc/self/maps") as f:
        assert str(path) not in f.read()
    x = np.ones((2, 512), np.float32)
    expected = (x @ weights["W"] + weights["b"]) * weights["h"].astype(np.float32)
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], expected, rtol=1e-5, atol=1e-4)


_REWRITER = """
import os, sys, time
path, data, stop = sys.argv[1], open(sys.argv[2], "rb").read(), time.time() + float(sys.argv[3])
while time.time() < stop:
    with open(path, "r+b") as f:  # truncate and rewrite in place, as a careless deploy does
        f.truncate(0)
        f.flush()
        time.sleep(0.0005)
        for i in range(0, len(data), 1 << 16):
            f.write(data[i:i + 1 << 16])
            f.flush()
"""

_LOADER = """
import sys, time
import onnxrun
from onnxrun import load
path, stop, loads, errors = sys.argv[1], time.time() + float(sys.argv[2]), 0, 0
while time.time() < stop:
    try:
        load.load_model(path)
        loads += 1
    except onnxrun.OnnxRunError:  # anything else escapes and fails the test
        errors += 1
print(loads, errors)
"""


@pytest.mark.skipif(sys.platform == "win32", reason="a file open for loading cannot be truncated")
def test_file_rewritten_while_it_loads_gives_errors_not_a_crash(tmp_path):
    path, pristine = tmp_path / "m.onnx", tmp_path / "pristine.onnx"
    _model(pristine)  # 1.2 MB: memory-mapped by the loader that crashed
    path.write_bytes(pristine.read_bytes())
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    for _ in range(3):
        writer = subprocess.Popen([sys.executable, "-c", _REWRITER, str(path), str(pristine), "4"])
        try:
            loader = subprocess.run([sys.executable, "-c", _LOADER, str(path), "3"], env=env,
                                    capture_output=True, text=True, timeout=120)
        finally:
            writer.wait(timeout=60)
        # A signal (SIGBUS: -7) gives a negative return code; an escaped exception gives 1.
        assert loader.returncode == 0, (loader.returncode, loader.stderr[-2000:])
        loads, errors = map(int, loader.stdout.split())
        assert loads + errors > 0


def test_file_shrinking_after_the_scan_is_invalid_protobuf(tmp_path, monkeypatch):
    path = tmp_path / "m.onnx"
    _model(path)
    monkeypatch.setattr(load, "_WHOLE_READ", 0)  # scanned through the window, as large files
    real = load._parse_stripped

    def parse_then_truncate(*args):  # between the scan and the weights' reads
        os.truncate(path, path.stat().st_size // 2)
        return real(*args)

    monkeypatch.setattr(load, "_parse_stripped", parse_then_truncate)
    with pytest.raises(onnxrun.InvalidProtobuf, match="ends inside a tensor's data"):
        load.load_model(str(path))


def test_small_file_is_read_once_and_scanned_in_memory(tmp_path, monkeypatch):
    """A model file below load._WHOLE_READ is read whole, then scanned (not byte by byte
    through the file window), its weights the same arrays."""
    path = tmp_path / "m.onnx"
    _model(path)
    _, want = load.load_model(str(path))

    def no_window(*args):
        raise AssertionError("scanned through the file window")

    monkeypatch.setattr(load, "_FileWindow", no_window)
    _, got = load.load_model(str(path))
    for name, v in want.graph.initializers.items():
        a = got.graph.initializers[name].const_value
        assert a.tobytes() == v.const_value.tobytes() and a.flags.aligned, name


# -- external data ----------------------------------------------------------------------------

INSIDE = np.arange(1, 9, dtype=np.float32)
OUTSIDE = np.full(8, -666.0, np.float32)  # what a redirected read would return


def _external_model(location: str, constant: bool = False) -> onnx.ModelProto:
    """Y = X + W, W's 8 floats kept in ``location``; W an initializer, or a Constant's value."""
    t = numpy_helper.from_array(INSIDE, "W")
    onnx.external_data_helper.set_external_data(t, location=location, offset=0,
                                               length=INSIDE.nbytes)
    t.ClearField("raw_data")
    t.data_location = TensorProto.EXTERNAL
    nodes = [helper.make_node("Add", ["X", "W"], ["Y"])]
    if constant:
        nodes.insert(0, helper.make_node("Constant", [], ["W"], value=t))
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [8])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [8])], [] if constant else [t])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _loaded_w(path) -> np.ndarray:
    return load.load_model(str(path))[1].graph.initializers["W"].const_value


def _hub(tmp_path: Path, data_target: Path | None = None, constant: bool = False) -> Path:
    """Hugging Face's hub cache: snapshots/<rev>/{model.onnx, model.onnx_data} are relative
    symlinks into ../../blobs/. ``data_target``: where model.onnx_data points instead."""
    blobs, snap = tmp_path / "blobs", tmp_path / "snapshots" / "0123abcd"
    blobs.mkdir()
    snap.mkdir(parents=True)
    model = _external_model("model.onnx_data", constant)
    (blobs / "9f1e").write_bytes(model.SerializeToString())
    (blobs / "77ab").write_bytes(INSIDE.tobytes())
    (snap / "model.onnx").symlink_to(Path("..", "..", "blobs", "9f1e"))
    (snap / "model.onnx_data").symlink_to(data_target or Path("..", "..", "blobs", "77ab"))
    return snap / "model.onnx"


@pytest.mark.parametrize("constant", [False, True], ids=["initializer", "Constant"])
def test_hugging_face_hub_layout_loads_like_onnxruntime(tmp_path, monkeypatch, constant):
    import onnxruntime as ort

    path = _hub(tmp_path, constant=constant)
    x = np.linspace(-1, 1, 8).astype(np.float32)
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"X": x})
    for source in (str(path), path):
        got = onnxrun.InferenceSession(source).run(None, {"X": x})
        np.testing.assert_array_equal(got[0], want[0])
    monkeypatch.chdir(path.parent)  # a relative path, from inside the snapshot folder
    got = onnxrun.InferenceSession("model.onnx").run(None, {"X": x})
    np.testing.assert_array_equal(got[0], want[0])


def test_hub_layout_data_pointing_outside_both_folders_is_refused(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "secret").write_bytes(OUTSIDE.tobytes())
    path = _hub(tmp_path, data_target=elsewhere / "secret")
    with pytest.raises(onnxrun.InvalidGraph, match="External data path validation failed.*"
                                                   "outside"):
        _loaded_w(path)


@pytest.mark.parametrize("location", ["/etc/hostname", "../outside.bin", "sub/../../outside.bin",
                                      "sub/../w.bin", "..", "sub\\..\\w.bin"])
def test_locations_absolute_or_with_dotdot_are_refused_unopened(tmp_path, location, monkeypatch):
    folder = tmp_path / "m"
    (folder / "sub").mkdir(parents=True)
    (folder / "w.bin").write_bytes(INSIDE.tobytes())
    (tmp_path / "outside.bin").write_bytes(OUTSIDE.tobytes())
    path = folder / "model.onnx"
    path.write_bytes(_external_model(location).SerializeToString())
    opened = _record_opens(monkeypatch)
    with pytest.raises(onnxrun.InvalidGraph, match="absolute|'\\.\\.'"):
        _loaded_w(path)
    assert opened == [os.path.realpath(path)]  # the model, and nothing else


def _record_opens(monkeypatch) -> list[str]:
    opened: list[str] = []
    real_os_open, real_io_open = os.open, io.open

    def os_open(file, *args, **kwargs):
        opened.append(os.path.realpath(file))
        return real_os_open(file, *args, **kwargs)

    def io_open(file, *args, **kwargs):
        if isinstance(file, str | os.PathLike):
            opened.append(os.path.realpath(file))
        return real_io_open(file, *args, **kwargs)

    monkeypatch.setattr(os, "open", os_open)
    monkeypatch.setattr(io, "open", io_open)
    monkeypatch.setattr("builtins.open", io_open)
    return opened


@pytest.mark.parametrize("how", ["file", "folder"])
def test_symlinks_leading_out_are_refused(tmp_path, how):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "w.bin").write_bytes(OUTSIDE.tobytes())
    folder = tmp_path / "m"
    folder.mkdir()
    if how == "file":
        (folder / "w.bin").symlink_to(outside / "w.bin")
        location = "w.bin"
    else:
        (folder / "sub").symlink_to(outside)
        location = "sub/w.bin"
    path = folder / "model.onnx"
    path.write_bytes(_external_model(location).SerializeToString())
    with pytest.raises(onnxrun.InvalidGraph, match="outside the model's folder"):
        _loaded_w(path)


def test_symlinks_inside_the_folder_are_followed(tmp_path):
    folder = tmp_path / "m"
    (folder / "data" / "v2").mkdir(parents=True)
    (folder / "data" / "v2" / "w.bin").write_bytes(INSIDE.tobytes())
    (folder / "current").symlink_to(Path("data", "v2"))
    path = folder / "model.onnx"
    path.write_bytes(_external_model("current/w.bin").SerializeToString())
    np.testing.assert_array_equal(_loaded_w(path), INSIDE)


@pytest.mark.skipif(sys.platform == "win32", reason="symlinks need privileges")
def test_folder_swapped_for_a_symlink_while_loading_never_redirects_a_read(tmp_path):
    folder, outside = tmp_path / "m", tmp_path / "outside"
    (folder / "sub").mkdir(parents=True)
    outside.mkdir()
    (folder / "sub" / "w.bin").write_bytes(INSIDE.tobytes())
    (outside / "w.bin").write_bytes(OUTSIDE.tobytes())
    path = folder / "model.onnx"
    path.write_bytes(_external_model("sub/w.bin").SerializeToString())
    sub, parked, link = folder / "sub", folder / "parked", folder / "link"
    link.symlink_to(outside)
    stop = threading.Event()

    def swap() -> None:  # sub is in turn the real folder and a symlink to the outside one
        while not stop.is_set():
            os.rename(sub, parked)
            os.rename(link, sub)
            os.rename(sub, link)
            os.rename(parked, sub)

    outcomes = {"inside": 0, "refused": 0, "missing": 0}
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # switch threads often: many interleavings per load
    swapper = threading.Thread(target=swap)
    swapper.start()
    try:
        for _ in range(1500):
            try:
                w = _loaded_w(path)
            except onnxrun.NoSuchFile:
                outcomes["missing"] += 1
                continue
            except onnxrun.InvalidGraph as e:
                assert "outside the model's folder" in str(e)
                outcomes["refused"] += 1
                continue
            assert not np.array_equal(w, OUTSIDE), f"read the outside file ({outcomes})"
            np.testing.assert_array_equal(w, INSIDE)
            outcomes["inside"] += 1
    finally:
        stop.set()
        swapper.join()
        sys.setswitchinterval(interval)
    assert outcomes["inside"] and outcomes["refused"], outcomes  # both states were seen


def test_external_data_file_shrinking_while_loading_is_a_clean_error(tmp_path, monkeypatch):
    path = tmp_path / "model.onnx"
    path.write_bytes(_external_model("w.bin").SerializeToString())
    (tmp_path / "w.bin").write_bytes(INSIDE.tobytes())
    real = load.ExternalDataReader._open

    def open_then_truncate(self, *args):  # after the size was taken
        opened = real(self, *args)
        os.truncate(tmp_path / "w.bin", 8)
        return opened

    monkeypatch.setattr(load.ExternalDataReader, "_open", open_then_truncate)
    with pytest.raises(onnxrun.InvalidGraph, match="changed while loading"):
        _loaded_w(path)


def _vanish_on_open(monkeypatch, victim: Path) -> None:
    """The file disappears just before it is opened (after any check the loader made)."""
    real_os_open, real_io_open = os.open, io.open

    def gone(file) -> None:
        if isinstance(file, str | os.PathLike) and os.path.abspath(file) == str(victim):
            victim.unlink(missing_ok=True)

    def os_open(file, *args, **kwargs):
        gone(file)
        return real_os_open(file, *args, **kwargs)

    def io_open(file, *args, **kwargs):
        gone(file)
        return real_io_open(file, *args, **kwargs)

    monkeypatch.setattr(os, "open", os_open)
    monkeypatch.setattr(io, "open", io_open)
    monkeypatch.setattr("builtins.open", io_open)


@pytest.mark.parametrize("which", ["model", "data"])
def test_file_vanishing_while_loading_is_no_such_file(tmp_path, monkeypatch, which):
    path = tmp_path / "model.onnx"
    path.write_bytes(_external_model("w.bin").SerializeToString())
    (tmp_path / "w.bin").write_bytes(INSIDE.tobytes())
    _vanish_on_open(monkeypatch, path if which == "model" else tmp_path / "w.bin")
    with pytest.raises(onnxrun.NoSuchFile) as info:
        _loaded_w(path)
    assert type(info.value) is onnxrun.NoSuchFile
    assert ("w.bin" if which == "data" else "model.onnx") in str(info.value)


def test_external_data_of_a_model_given_as_bytes_is_read_from_the_working_directory(
        tmp_path, monkeypatch):
    """As onnxruntime does; the session config entry names another folder, under the rule."""
    import onnxruntime as ort

    folder, elsewhere = tmp_path / "models", tmp_path / "elsewhere"
    folder.mkdir()
    elsewhere.mkdir()
    (folder / "w.bin").write_bytes(INSIDE.tobytes())
    data = _external_model("w.bin").SerializeToString()
    x = np.ones(8, np.float32)
    monkeypatch.chdir(folder)
    so = ort.SessionOptions()  # onnxruntime's optimizers fail on external data of bytes
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    want = ort.InferenceSession(data, so, providers=["CPUExecutionProvider"]).run(None, {"X": x})
    np.testing.assert_array_equal(onnxrun.InferenceSession(data).run(None, {"X": x})[0], want[0])
    monkeypatch.chdir(elsewhere)
    with pytest.raises(onnxrun.NoSuchFile, match="working directory"):
        onnxrun.InferenceSession(data)
    so = onnxrun.SessionOptions()
    so.add_session_config_entry("session.model_external_initializers_file_folder_path",
                                str(folder))
    np.testing.assert_array_equal(onnxrun.InferenceSession(data, so).run(None, {"X": x})[0],
                                  want[0])
    (folder / "w.bin").rename(elsewhere / "w.bin")
    (folder / "w.bin").symlink_to(elsewhere / "w.bin")  # out of the config entry's folder
    with pytest.raises(onnxrun.InvalidGraph, match="outside the model's folder"):
        onnxrun.InferenceSession(data, so)
