"""Devices, memory infos, arena configs, shared allocators, OrtValueVector and the global thread
pools: the same values and the same refusals as onnxruntime (the oracle where installed)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import onnx
import onnx.parser
import pytest

import onnxrun
from onnxrun.api import devices
from onnxrun.api.ortvalue_vector import OrtValueVector

ENUMS = ("OrtAllocatorType", "OrtMemType", "OrtDeviceMemoryType", "OrtMemoryInfoDeviceType",
         "OrtDeviceVendorId", "OrtHardwareDeviceType")
NATIVE_ENUMS = ("OrtCompiledModelCompatibility", "ArenaExtendStrategy")


def _members(enum_type) -> dict[str, int]:
    return {k: int(v) for k, v in enum_type.__members__.items()}


@pytest.fixture(scope="module")
def ort():
    return pytest.importorskip("onnxruntime")


def test_enums_have_onnxruntimes_names_and_values(ort):
    from onnxruntime.capi import _pybind_state as C

    for name in ENUMS:
        assert _members(getattr(onnxrun, name)) == _members(getattr(ort, name)), name
    for name in NATIVE_ENUMS:
        assert _members(getattr(devices, name)) == _members(getattr(C, name)), name
    # printed as pybind11 prints them
    assert str(onnxrun.OrtMemType.DEFAULT) == str(ort.OrtMemType.DEFAULT) == "OrtMemType.DEFAULT"
    assert onnxrun.OrtMemType.CPU == onnxrun.OrtMemType.CPU_OUTPUT


@pytest.mark.parametrize("name", ["cpu", "cuda", "dml", "cann", "webgpu", "gpu", "npu"])
@pytest.mark.parametrize("vendor", [-1, 0, 0x8086])
def test_ort_device_make_matches_onnxruntime(ort, name, vendor):
    ours, theirs = onnxrun.OrtDevice.make(name, 1, vendor), ort.OrtDevice.make(name, 1, vendor)
    for method in ("device_id", "device_type", "device_vendor_id", "device_mem_type"):
        assert getattr(ours, method)() == getattr(theirs, method)(), (name, vendor, method)
    c = ours._get_c_device()
    assert (c.device_type(), c.mem_type(), c.device_id()) == (
        ours.device_type(), ours.device_mem_type(), 1)


def test_native_device_constructors_match_onnxruntime(ort):
    from onnxruntime.capi import _pybind_state as C

    N = devices.NativeOrtDevice
    for kind in ("cpu", "gpu", "fpga", "npu", "cuda", "dml", "cann", "webgpu", "default_memory"):
        assert getattr(N, kind)() == getattr(C.OrtDevice, kind)(), kind
    for args in [(0, 0, 0), (1, 0, 3), (1, 0, 0x10DE, 2), (4, 0, 1), (4, 0, 0x8086, 1),
                 (2, 0, 7, 1)]:
        ours, theirs = N(*args), C.OrtDevice(*args)
        for method in ("device_type", "mem_type", "vendor_id", "device_id"):
            assert getattr(ours, method)() == getattr(theirs, method)(), (args, method)
    with pytest.raises(TypeError):
        N(0, 0)
    with pytest.raises(TypeError, match="device_id"):
        N(0, 0, "zero")
    with pytest.raises(onnxrun.Fail, match="Unsupported device type: tpu"):
        onnxrun.OrtDevice.make("tpu", 0)
    with pytest.raises(ValueError):
        onnxrun.OrtDevice(3)


@pytest.mark.parametrize("name", ["Cpu", "Cuda", "CudaPinned", "DML", "OpenVINO_GPU",
                                  "QnnHtpShared"])
def test_memory_info_matches_onnxruntime(ort, name):
    args = (ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 1, ort.OrtMemType.CPU_INPUT)
    theirs = ort.OrtMemoryInfo(name, *args)
    ours = onnxrun.OrtMemoryInfo(name, onnxrun.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 1,
                                 onnxrun.OrtMemType.CPU_INPUT)
    assert ours.name == theirs.name
    for attr in ("device_id", "mem_type", "allocator_type", "device_mem_type",
                 "device_vendor_id"):
        assert int(getattr(ours, attr)) == int(getattr(theirs, attr)), (name, attr)
    with pytest.raises(AttributeError):
        ours.name = "other"


def test_memory_info_refusals_and_create_v2(ort):
    for bad in ("Cann", "cpu", "Bogus"):
        with pytest.raises(RuntimeError, match="not supported. Try CreateMemoryInfo_V2"):
            onnxrun.OrtMemoryInfo(bad, onnxrun.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0,
                                  onnxrun.OrtMemType.DEFAULT)
    with pytest.raises(TypeError, match="allocator_type"):
        onnxrun.OrtMemoryInfo("Cpu", 7, 0, onnxrun.OrtMemType.DEFAULT)
    for dev, mem in [("CPU", "DEFAULT"), ("GPU", "HOST_ACCESSIBLE"), ("NPU", "DEFAULT")]:
        theirs = ort.OrtMemoryInfo.create_v2(
            "X", getattr(ort.OrtMemoryInfoDeviceType, dev), 0x10DE, 2,
            getattr(ort.OrtDeviceMemoryType, mem), 64, ort.OrtAllocatorType.ORT_DEVICE_ALLOCATOR)
        ours = onnxrun.OrtMemoryInfo.create_v2(
            "X", getattr(onnxrun.OrtMemoryInfoDeviceType, dev), 0x10DE, 2,
            getattr(onnxrun.OrtDeviceMemoryType, mem), 64,
            onnxrun.OrtAllocatorType.ORT_DEVICE_ALLOCATOR)
        for attr in ("device_id", "mem_type", "allocator_type", "device_mem_type",
                     "device_vendor_id"):
            assert int(getattr(ours, attr)) == int(getattr(theirs, attr)), (dev, mem, attr)


def test_arena_cfg_matches_onnxruntime(ort):
    fields = ("max_mem", "arena_extend_strategy", "initial_chunk_size_bytes",
              "max_dead_bytes_per_chunk", "initial_growth_chunk_size_bytes",
              "max_power_of_two_extend_bytes")
    for args in [(8, 0, 4, 2), ({},), ({"max_mem": 32, "arena_extend_strategy": 11,
                                        "max_power_of_two_extend_bytes": 17},)]:
        ours, theirs = onnxrun.OrtArenaCfg(*args), ort.OrtArenaCfg(*args)
        assert [getattr(ours, f) for f in fields] == [getattr(theirs, f) for f in fields]
    cfg = onnxrun.OrtArenaCfg(0, -1, -1, -1)
    cfg.max_mem = 1 << 20
    assert cfg.max_mem == 1 << 20
    with pytest.raises(RuntimeError, match="Invalid OrtArenaCfg option: bogus"):
        onnxrun.OrtArenaCfg({"max_mem": 1, "bogus": 2})
    with pytest.raises(TypeError):
        onnxrun.OrtArenaCfg({"max_mem": "x"})
    with pytest.raises(ValueError, match="max_mem"):
        onnxrun.OrtArenaCfg({"max_mem": -5})
    with pytest.raises(TypeError):
        onnxrun.OrtArenaCfg(1, 2, 3)


MUL = onnx.parser.parse_model("""
    <ir_version: 8, opset_import: ["" : 17]> g (float[2] X) => (float[2] Y) { Y = Mul(X, X) }
""").SerializeToString()


def test_shared_cpu_allocator_registration(monkeypatch):
    monkeypatch.setattr(devices, "_shared", {})
    cpu = onnxrun.OrtMemoryInfo("Cpu", onnxrun.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0,
                                onnxrun.OrtMemType.DEFAULT)

    def session() -> None:  # a session asking for the environment's allocators runs
        so = onnxrun.SessionOptions()
        so.add_session_config_entry("session.use_env_allocators", "1")
        s = onnxrun.InferenceSession(MUL, so)
        np.testing.assert_array_equal(s.run(None, {"X": np.array([2, 3], np.float32)})[0],
                                      [4, 9])

    session()
    with pytest.raises(RuntimeError, match="No shared allocator found"):
        devices.registered_allocator(cpu)
    onnxrun.create_and_register_allocator(cpu, None)
    assert devices.registered_allocator(cpu) == (cpu, None)
    session()
    cfg = onnxrun.OrtArenaCfg(0, -1, -1, -1)
    onnxrun.create_and_register_allocator_v2("CPUExecutionProvider", cpu, {}, cfg)
    assert devices.registered_allocator(cpu) == (cpu, cfg)  # registering again replaces it

    cuda = onnxrun.OrtMemoryInfo("Cuda", onnxrun.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0,
                                 onnxrun.OrtMemType.DEFAULT)
    with pytest.raises(RuntimeError, match="Only CPU devices are supported"):
        onnxrun.create_and_register_allocator(cuda, None)
    with pytest.raises(RuntimeError, match="CUDAExecutionProvider is not implemented"):
        onnxrun.create_and_register_allocator_v2("CUDAExecutionProvider", cuda, {}, cfg)
    with pytest.raises(TypeError, match="OrtMemoryInfo"):
        onnxrun.create_and_register_allocator(None, None)
    with pytest.raises(TypeError, match="OrtArenaCfg"):
        onnxrun.create_and_register_allocator(cpu, {"max_mem": 0})


def test_ort_value_vector():
    a, b = np.arange(6, dtype=np.int64).reshape(2, 3), np.ones(2, np.float32)
    vec = OrtValueVector()
    vec.reserve(2)
    vec.push_back(onnxrun.OrtValue.ortvalue_from_numpy(a))
    vec.push_back(b)  # a DLPack tensor
    vec.shrink_to_fit()
    assert len(vec) == 2 and [v.shape() for v in vec] == [[2, 3], [2]]
    assert [vec.element_type_at(i) for i in range(2)] == [onnx.TensorProto.INT64,
                                                           onnx.TensorProto.FLOAT]
    np.testing.assert_array_equal(vec[-1].numpy(), b)
    shared = np.from_dlpack(devices_capsule(vec.dlpack_at(0)))
    assert np.shares_memory(shared, a)
    assert [x.shape for x in vec.to_dlpacks(lambda c: np.from_dlpack(devices_capsule(c)))] == [
        (2, 3), (2,)]
    vec.push_back(vec.to_dlpacks(None)[1])  # a bare capsule
    np.testing.assert_array_equal(vec[2].numpy(), b)
    with pytest.raises(IndexError, match="out of range"):
        vec[3]
    with pytest.raises(TypeError, match="OrtValue or a DLPack"):
        vec.push_back([1, 2])


def devices_capsule(capsule):
    from onnxrun.api.ortvalue import DLPackCapsule

    return DLPackCapsule(capsule)


def _run_script(body: str) -> subprocess.CompletedProcess:
    code = "import numpy as np, onnx.parser, onnxrun\n" + textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)


THREADS_SCRIPT = """
    MUL = onnx.parser.parse_model('''
        <ir_version: 8, opset_import: ["" : 17]> g (float[2] X) => (float[2] Y) { Y = Mul(X, X) }
    ''').SerializeToString()

    def session(per_session, mode=onnxrun.ExecutionMode.ORT_PARALLEL):
        so = onnxrun.SessionOptions()
        so.execution_mode = mode
        so.use_per_session_threads = per_session
        try:
            s = onnxrun.InferenceSession(MUL, so)
        except RuntimeError as e:
            return type(e).__name__ + ": " + str(e).split("(")[0].strip()
        y = s.run(None, {"X": np.array([2, 3], np.float32)})[0]
        return "ok " + str(y.tolist()) + " " + THREADS

    print(session(False))
    print(session(True))
    onnxrun.set_global_thread_pool_sizes(2, 3)
    try:
        onnxrun.set_global_thread_pool_sizes(1, 1)
    except RuntimeError as e:
        print(type(e).__name__ + ": " + str(e))
    print(session(False))
    print(session(True))
    print(session(True, onnxrun.ExecutionMode.ORT_SEQUENTIAL))
"""


def test_global_thread_pools():
    # A process-wide setting: in a child process, so that it cannot leak into other tests.
    script = THREADS_SCRIPT.replace(
        "THREADS", "str((s._threads.intra_op_num_threads, s._pool._max_workers))")
    done = _run_script(script)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("Fail: When the session is not configured to use per session")
    assert lines[1].startswith("ok [4.0, 9.0]")
    assert lines[2] == ("Fail: Global thread pools have already been created, cannot replace "
                        "them")
    assert lines[3] == "ok [4.0, 9.0] (2, 3)"
    assert lines[4] == lines[5] == ("Fail: use_per_session_threads must be false when using a "
                                    "global thread pool")


def test_global_thread_pool_sizes_arguments():
    done = _run_script("""
        for bad in [(1.5, 0), (0, "2"), (True, 0)]:
            try:
                onnxrun.set_global_thread_pool_sizes(*bad)
            except TypeError as e:
                print("TypeError", "must be an integer" in str(e))
        onnxrun.set_global_thread_pool_sizes(-1)  # onnxruntime takes it as 0: every core
        from onnxrun.api import thread_pools
        print(thread_pools._sizes)
    """)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:4] == ["TypeError True"] * 3 + ["(0, 0)"]


def test_ortvalue_with_memory_info_needs_a_shared_allocator(monkeypatch):
    monkeypatch.setattr(devices, "_shared", {})
    cpu = onnxrun.OrtMemoryInfo("Cpu", onnxrun.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0,
                                onnxrun.OrtMemType.DEFAULT)
    bogus = onnxrun.OrtMemoryInfo.create_v2(
        "Bogus", onnxrun.OrtMemoryInfoDeviceType.GPU, 0xDEAD, 0,
        onnxrun.OrtDeviceMemoryType.HOST_ACCESSIBLE, 0,
        onnxrun.OrtAllocatorType.ORT_DEVICE_ALLOCATOR)
    for info in (cpu, bogus):
        with pytest.raises(RuntimeError, match="No shared allocator found"):
            onnxrun.OrtValue.ortvalue_from_shape_and_type([2], np.float32, memory_info=info)
    onnxrun.create_and_register_allocator(cpu, None)
    v = onnxrun.OrtValue.ortvalue_from_shape_and_type([2, 3], onnx.TensorProto.FLOAT16,
                                                      memory_info=cpu)
    assert v.shape() == [2, 3] and v.data_type() == "tensor(float16)"
    with pytest.raises(TypeError, match="OrtMemoryInfo"):
        onnxrun.OrtValue.ortvalue_from_shape_and_type([2], np.float32, memory_info="Cpu")


def _model_bytes(metadata: dict[str, str]) -> bytes:
    model = onnx.helper.make_model(onnx.helper.make_graph([], "g", [], []),
                                   opset_imports=[onnx.helper.make_opsetid("", 13)])
    onnx.helper.set_model_props(model, metadata)
    return model.SerializeToString()


def test_hardware_and_ep_devices_match_onnxruntime(ort):
    from onnxruntime.capi import _pybind_state as C

    from onnxrun.api import ep_devices as E

    assert _members(E.OrtDeviceEpIncompatibilityReason) == _members(
        C.OrtDeviceEpIncompatibilityReason)
    (ours,), (theirs,) = E.get_hardware_devices(), C.get_hardware_devices()
    for attr in ("vendor", "vendor_id", "device_id", "metadata"):
        assert getattr(ours, attr) == getattr(theirs, attr), attr
    assert int(ours.type) == int(theirs.type) == 0 and ours.vendor  # the CPU, named
    (ep,), (ort_ep,) = onnxrun.get_ep_devices(), ort.get_ep_devices()
    assert ep.device is ours and ort_ep.device == theirs
    for attr in ("ep_name", "ep_vendor", "ep_options"):
        assert getattr(ep, attr) == getattr(ort_ep, attr), attr
    assert ep.memory_info(onnxrun.OrtDeviceMemoryType.DEFAULT) is None
    with pytest.raises(TypeError):
        onnxrun.OrtEpDevice()
    for mod in (E, C):
        cpu = mod.get_hardware_devices()[0]
        details = mod.get_hardware_device_ep_incompatibility_details("CPUExecutionProvider", cpu)
        assert details == {"reasons_bitmask": 0, "notes": None, "error_code": 0}
        with pytest.raises(Exception, match="No valid factory found for execution provider 'X'"):
            mod.get_hardware_device_ep_incompatibility_details("X", cpu)
        with pytest.raises(TypeError):
            mod.get_hardware_device_ep_incompatibility_details("CPUExecutionProvider",
                                                               mod.get_ep_devices()[0])
        devs = mod.get_ep_devices()
        assert mod.get_model_compatibility_for_ep_devices(devs, "anything").name == \
            "EP_NOT_APPLICABLE"
        with pytest.raises(RuntimeError, match="GetModelCompatibilityForEpDevices"):
            mod.get_model_compatibility_for_ep_devices([], "info")
        for bad in ((devs, None), ([cpu], "x"), (devs[0], "x")):
            with pytest.raises(TypeError):
                mod.get_model_compatibility_for_ep_devices(*bad)


def test_compatibility_info_from_model_matches_onnxruntime(ort, tmp_path):
    from onnxruntime.capi import _pybind_state as C

    from onnxrun.api import ep_devices as E

    data = _model_bytes({"ep_compatibility_info.X": "v1", "other": "o"})
    path = tmp_path / "m.onnx"
    path.write_bytes(data)
    for mod in (E, C):
        for arg in (data, bytearray(data), memoryview(data)):
            assert mod.get_compatibility_info_from_model_bytes(arg, "X") == "v1"
        assert mod.get_compatibility_info_from_model_bytes(data, "other") is None
        assert mod.get_compatibility_info_from_model(str(path), "X") == "v1"
        assert mod.get_compatibility_info_from_model(str(path), "Y") is None
        for bad in ((b"", "X"), (data, ""), (b"not a model", "X")):
            with pytest.raises(RuntimeError):
                mod.get_compatibility_info_from_model_bytes(*bad)
        for bad in (("str", "X"), (data, None)):
            with pytest.raises(TypeError):
                mod.get_compatibility_info_from_model_bytes(*bad)
        for bad in ((str(tmp_path / "missing.onnx"), "X"), ("", "X"), (str(path), ""),
                    (str(tmp_path), "X")):
            with pytest.raises(RuntimeError):
                mod.get_compatibility_info_from_model(*bad)
    with pytest.raises(onnxrun.NoSuchFile, match="missing.onnx"):
        E.get_compatibility_info_from_model(str(tmp_path / "missing.onnx"), "X")


def test_compat_exports_ep_device_names():
    from onnxrun import compat

    mods = compat._build()
    native = mods["onnxruntime.capi.onnxruntime_pybind11_state"]
    for name in ("OrtDeviceEpIncompatibilityReason", "get_compatibility_info_from_model",
                 "get_compatibility_info_from_model_bytes", "get_ep_devices",
                 "get_hardware_device_ep_incompatibility_details", "get_hardware_devices",
                 "get_model_compatibility_for_ep_devices", "OrtEpDevice", "OrtHardwareDevice"):
        assert hasattr(native, name), name
    assert mods["onnxruntime"].get_ep_devices is onnxrun.get_ep_devices
