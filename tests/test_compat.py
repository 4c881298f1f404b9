"""onnxrun.compat: code written for onnxruntime runs on onnxrun unchanged.

The application ``tests/apps/ort_app.py`` imports onnxruntime; it runs once on the real
onnxruntime and once under ``python -m onnxrun.compat``, and the two reports must agree.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnx.parser
import pytest

import onnxrun
from onnxrun import compat

APP = Path(__file__).parent / "apps" / "ort_app.py"
ALIASED = ("onnxruntime", "onnxruntime.capi", "onnxruntime.capi._pybind_state",
           "onnxruntime.capi.onnxruntime_pybind11_state",
           "onnxruntime.capi.onnxruntime_inference_collection")

MODEL_TEXT = """
<ir_version: 8, opset_import: ["" : 17], producer_name: "ort-app-test", model_version: 2,
 metadata_props: ["task": "compat"]>
app (float[batch, 4] features, float[4] scale, int64[batch] ids) => (float[batch, 4] activated,
                                                                      float[batch, 4] scaled,
                                                                      int64[batch] ids_out)
<float[4] bias = {0.5, -0.5, 1.0, -1.0}>
{
    shifted = Add(features, bias)
    activated = Relu(shifted)
    scaled = Mul(activated, scale)
    ids_out = Identity(ids)
}
"""


def _run(args: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=120,
                          cwd=cwd)


def _assert_same_arrays(ours: dict, theirs: dict) -> None:
    assert ours["dtype"] == theirs["dtype"] and ours["shape"] == theirs["shape"]
    np.testing.assert_allclose(ours["data"], theirs["data"], rtol=1e-6, atol=1e-6)


def test_onnxruntime_app_gives_the_same_report_on_onnxrun(tmp_path: Path):
    pytest.importorskip("onnxruntime")
    model = tmp_path / "app_model.onnx"
    onnx.save(onnx.parser.parse_model(MODEL_TEXT), model)

    real = _run([str(APP), str(model)])
    assert real.returncode == 0, real.stderr
    ours = _run(["-m", "onnxrun.compat", str(APP), str(model)])
    assert ours.returncode == 0, ours.stderr
    theirs, mine = json.loads(real.stdout), json.loads(ours.stdout)

    assert theirs["engine"] == "onnxruntime" and mine["engine"] == "onnxrun"
    for key in ("has_version", "warned_about_cuda", "providers", "cpu_available", "device",
                "inputs", "outputs", "meta", "threads_match_serial", "bad_dtype",
                "missing_model"):
        assert mine[key] == theirs[key], key
    assert mine["warned_about_cuda"] and mine["providers"] == ["CPUExecutionProvider"]
    assert mine["bad_dtype"] == "InvalidArgument" and mine["missing_model"] == "NoSuchFile"
    assert mine["threads_match_serial"]
    assert mine["run"].keys() == theirs["run"].keys()
    for name in theirs["run"]:
        _assert_same_arrays(mine["run"][name], theirs["run"][name])
    _assert_same_arrays(mine["subset"], theirs["subset"])
    for a, b in zip(mine["iobinding"], theirs["iobinding"], strict=True):
        _assert_same_arrays(a, b)
    assert mine["ort_values"]["shape"] == theirs["ort_values"]["shape"]
    assert mine["ort_values"]["type"] == theirs["ort_values"]["type"]
    np.testing.assert_allclose(mine["ort_values"]["data"], theirs["ort_values"]["data"],
                               rtol=1e-6)
    for outs_a, outs_b in zip(mine["threads"], theirs["threads"], strict=True):
        for a, b in zip(outs_a, outs_b, strict=True):
            _assert_same_arrays(a, b)


@pytest.fixture
def clean_modules(monkeypatch: pytest.MonkeyPatch):
    """Undo whatever a test does to the onnxruntime entries of sys.modules."""
    for name in ALIASED:
        if name in sys.modules:
            monkeypatch.setitem(sys.modules, name, sys.modules[name])
    yield
    compat.uninstall()


def _check_aliases() -> None:
    import onnxruntime as ort
    from onnxruntime.capi.onnxruntime_pybind11_state import (
        EPFail,
        Fail,
        InvalidArgument,
        InvalidGraph,
        InvalidProtobuf,
        NoSuchFile,
        NotImplemented,  # noqa: A004
        RuntimeException,
    )

    assert ort.InferenceSession is onnxrun.InferenceSession
    assert ort.SessionOptions is onnxrun.SessionOptions
    assert ort.GraphOptimizationLevel is onnxrun.GraphOptimizationLevel
    assert (InvalidArgument, NoSuchFile, Fail) == (onnxrun.InvalidArgument, onnxrun.NoSuchFile,
                                                  onnxrun.Fail)
    assert (InvalidProtobuf, InvalidGraph, NotImplemented, RuntimeException, EPFail) == (
        onnxrun.InvalidProtobuf, onnxrun.InvalidGraph, onnxrun.NotImplemented,
        onnxrun.RuntimeException, onnxrun.EPFail)
    collection = importlib.import_module("onnxruntime.capi.onnxruntime_inference_collection")
    assert collection.InferenceSession is onnxrun.InferenceSession
    assert collection.IOBinding is onnxrun.IOBinding and collection.OrtValue is onnxrun.OrtValue
    pybind = importlib.import_module("onnxruntime.capi._pybind_state")
    assert pybind.InvalidArgument is onnxrun.InvalidArgument
    assert pybind.get_available_providers() == onnxrun.get_available_providers()
    assert ort.capi.onnxruntime_pybind11_state.Fail is onnxrun.Fail
    assert importlib.util.find_spec("onnxruntime") is not None
    # Status codes onnxrun never raises still exist, so `except` clauses naming them work.
    from onnxruntime.capi.onnxruntime_pybind11_state import EngineError, NoModel

    assert issubclass(EngineError, Exception) and issubclass(NoModel, Exception)

    m = onnx.parser.parse_model("""
        <ir_version: 8, opset_import: ["" : 17]> g (float[2] X) => (float[2] Y) { Y = Relu(X) }
    """)
    s = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(s.run(None, {"X": np.array([-1, 2], np.float32)})[0], [0, 2])
    with pytest.raises(InvalidArgument):
        s.run(None, {"X": np.array([1, 2], np.float64)})


def test_install_uninstall_when_onnxruntime_is_imported(clean_modules):
    real = pytest.importorskip("onnxruntime")
    real_state = importlib.import_module("onnxruntime.capi.onnxruntime_pybind11_state")
    assert sys.modules["onnxruntime"] is real
    installed = compat.install()
    assert compat.install() is installed  # idempotent
    assert compat.is_installed()
    assert sys.modules["onnxruntime"] is installed
    _check_aliases()
    compat.uninstall()
    assert not compat.is_installed()
    assert sys.modules["onnxruntime"] is real
    assert sys.modules["onnxruntime.capi.onnxruntime_pybind11_state"] is real_state
    import onnxruntime

    assert onnxruntime.InferenceSession is not onnxrun.InferenceSession
    compat.uninstall()  # a second uninstall changes nothing
    assert sys.modules["onnxruntime"] is real


def test_install_uninstall_when_onnxruntime_is_not_imported(clean_modules, monkeypatch):
    for name in ALIASED:
        monkeypatch.delitem(sys.modules, name, raising=False)
    compat.install()
    _check_aliases()
    compat.uninstall()
    assert all(name not in sys.modules for name in ALIASED)


def test_compat_command_line(tmp_path: Path):
    script = tmp_path / "app.py"
    script.write_text(
        "import sys, onnxruntime, helper_mod\n"
        "print(onnxruntime.InferenceSession.__module__, sys.argv[1:], helper_mod.VALUE)\n"
        "sys.exit(int(sys.argv[1]))\n"
    )
    (tmp_path / "helper_mod.py").write_text("VALUE = 'found beside the script'\n")
    # The script's folder is on sys.path, argv is the script's, its exit status is ours.
    done = _run(["-m", "onnxrun.compat", str(script), "3", "x y"])
    assert done.returncode == 3, done.stderr
    assert done.stdout.split()[0] == "onnxrun.api.session"
    assert "['3', 'x y'] found beside the script" in done.stdout

    # -m runs a module the same way.
    (tmp_path / "app_module.py").write_text(
        "import sys, onnxruntime\nprint(onnxruntime.get_device(), sys.argv[1:])\n"
    )
    done = _run(["-m", "onnxrun.compat", "-m", "app_module", "--flag"], cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "CPU ['--flag']"

    done = _run(["-m", "onnxrun.compat"])
    assert done.returncode == 2 and "usage" in done.stderr
    done = _run(["-m", "onnxrun.compat", str(tmp_path / "missing.py")])
    assert done.returncode == 2 and "missing.py" in done.stderr


def test_submodules_resolve_to_onnxruntime_names(clean_modules):
    import onnxrun.backend
    import onnxrun.quantization
    import onnxrun.quantization.calibrate
    import onnxrun.tools
    import onnxrun.transformers.float16

    compat.install()
    import onnxruntime.backend
    import onnxruntime.quantization
    import onnxruntime.quantization.calibrate
    import onnxruntime.tools
    import onnxruntime.transformers.float16
    from onnxruntime import quantization
    from onnxruntime.quantization import calibrate

    assert onnxruntime.quantization is quantization is onnxrun.quantization
    assert calibrate is onnxruntime.quantization.calibrate is onnxrun.quantization.calibrate
    assert onnxruntime.backend is onnxrun.backend and onnxruntime.tools is onnxrun.tools
    assert onnxruntime.transformers.float16 is onnxrun.transformers.float16
    assert sys.modules["onnxruntime.quantization"] is onnxrun.quantization
    # The module keeps its own identity: reload, pickle and tracebacks see onnxrun's.
    assert quantization.__name__ == quantization.__spec__.name == "onnxrun.quantization"
    # reload() re-finds the module by its own spec name; checked without reloading a module
    # whose classes other tests hold (a reload would make their isinstance checks fail).
    assert calibrate.__spec__.name == "onnxrun.quantization.calibrate"
    assert importlib.util.find_spec(calibrate.__spec__.name).origin == calibrate.__file__


def test_missing_submodule_raises_module_not_found_naming_it(clean_modules):
    compat.install()
    for name in ("onnxruntime.no_such_module", "onnxruntime.quantization.no_such_module",
                 "onnxruntime.capi.no_such_module", "onnxruntime.training"):
        with pytest.raises(ModuleNotFoundError, match=name.replace(".", r"\.")) as info:
            importlib.import_module(name)
        assert info.value.name == name
        assert importlib.util.find_spec(name) is None  # probes for optional parts answer None
    with pytest.raises(ImportError, match="no_such_name"):
        exec("from onnxruntime.quantization import no_such_name", {})


def test_uninstall_restores_the_real_submodules(clean_modules, monkeypatch):
    pytest.importorskip("onnxruntime")
    real_quant = importlib.import_module("onnxruntime.quantization")
    monkeypatch.setitem(sys.modules, "onnxruntime.quantization", real_quant)
    compat.install()
    import onnxruntime.quantization

    assert onnxruntime.quantization is not real_quant
    compat.uninstall()
    assert not any(isinstance(f, type(compat._AliasFinder())) for f in sys.meta_path)
    assert sys.modules["onnxruntime.quantization"] is real_quant
    assert importlib.import_module("onnxruntime.quantization") is real_quant


def test_importing_onnxruntime_imports_no_submodule():
    # Laziness: a fresh process that imports onnxruntime through the alias loads none of the
    # submodules (quantization, transformers, tools, backend) until they are asked for.
    done = _run(["-c", (
        "import sys, onnxrun.compat; onnxrun.compat.install(); import onnxruntime\n"
        "subs = ('quantization', 'transformers', 'tools', 'backend')\n"
        "print(sorted(m for m in sys.modules if m.split('.')[1:2] and m.split('.')[1] in subs"
        " and m.split('.')[0] in ('onnxrun', 'onnxruntime')))\n"
        "import onnxruntime.quantization\n"
        "print('onnxrun.quantization' in sys.modules)\n")])
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:2] == ["[]", "True"]


def test_native_module_names(clean_modules):
    # The names whole onnxruntime test modules import from the native module, and where they
    # come from in onnxrun.
    from onnxrun.api import devices, thread_pools
    from onnxrun.api.ortvalue_vector import OrtValueVector

    compat.install()
    import onnxruntime
    from onnxruntime.capi import _pybind_state as C
    from onnxruntime.capi import onnxruntime_pybind11_state as C11

    for mod in (C, C11):
        assert mod.OrtValueVector is OrtValueVector and mod.OrtDevice is devices.NativeOrtDevice
        assert mod.OrtCompiledModelCompatibility is devices.OrtCompiledModelCompatibility
        assert mod.set_global_thread_pool_sizes is thread_pools.set_global_thread_pool_sizes
        assert mod.OrtMemoryInfo is devices.OrtMemoryInfo
        assert mod.kSameAsRequested == 1 and isinstance(mod.get_default_session_options(),
                                                         onnxrun.SessionOptions)
    assert onnxruntime.OrtDevice is devices.OrtDevice
    assert onnxruntime.OrtDevice.make("cpu", 0)._get_c_device().device_type() == C.OrtDevice.cpu()
    for name in ("OrtArenaCfg", "OrtAllocatorType", "OrtMemType", "OrtDeviceMemoryType",
                 "OrtDeviceVendorId", "create_and_register_allocator",
                 "set_global_thread_pool_sizes"):
        assert getattr(onnxruntime, name) is getattr(onnxrun, name), name
    assert "Build Info" in onnxruntime.get_build_info()
