"""The compiled kernels' targets (providers/cpu/compiled/targets.py, jit.py): which target a
host gets, the override (ONNXRUN_COMPILED_TARGET, ``compiled.forced_target``), the compiler
compiling for the target it is given rather than the host, and the loader refusing hosts and
objects it does not handle (foreign hosts and ELF machines are faked here)."""

from __future__ import annotations

import base64
import ctypes
import importlib
import importlib.util
import os

import numpy as np
import pytest
from one_node_harness import one_node

import onnxrun
from onnxrun.providers.cpu import compiled
from onnxrun.providers.cpu.compiled import elf, int8_gemm, jit, targets

_V3 = set(targets.get("avx2").features)
_V4 = set(targets.get("avx512").features)
needs_llvmlite = pytest.mark.skipif(importlib.util.find_spec("llvmlite") is None,
                                    reason="llvmlite is not installed")
HOST, WHY_NOT = targets.select()
needs_host_target = pytest.mark.skipif(HOST is None, reason=f"no target here: {WHY_NOT}")


@pytest.fixture
def fake_host(monkeypatch):
    """``fake_host(features, system="linux", machine="x86_64")``: what targets.py sees."""

    def fake(features, system="linux", machine="x86_64"):
        monkeypatch.setattr(targets, "host_features", lambda: frozenset(features))
        monkeypatch.setattr(targets, "host_platform", lambda: (system, machine))

    return fake


@pytest.fixture
def fresh_jit(monkeypatch):
    """Modules and bundles compiled by earlier tests forgotten (restored afterwards)."""
    for name in ("_state", "_modules", "_failed"):
        monkeypatch.setattr(jit, name, {})
    monkeypatch.setattr(jit, "_forced_targets", [])
    monkeypatch.delenv(targets.ENV, raising=False)


@pytest.mark.parametrize("features,best", [
    (_V4 | {"avx512vnni", "avxvnni"}, "avx512vnni"),
    (_V4, "avx512"),
    (_V3 | {"avxvnni"}, "avxvnni"),
    (_V3, "avx2"),
])
def test_the_host_gets_its_best_target(fake_host, features, best):
    fake_host(features)
    assert targets.select()[0].name == best
    assert targets.select("avx2")[0].name == "avx2"  # every host runs the lower targets


def test_a_host_below_avx2_gets_none(fake_host):
    fake_host(_V3 - {"fma"})
    target, reason = targets.select()
    assert target is None and "AVX2 and FMA" in reason


def test_a_forced_target_the_host_lacks_is_refused_with_the_features(fake_host):
    fake_host(_V3)
    target, reason = targets.select("avx512vnni")
    assert target is None
    assert reason == ("the CPU lacks avx512bw, avx512cd, avx512dq, avx512f, avx512vl, avx512vnni "
                      "(target avx512vnni)")
    assert "not a compiled-kernel target" in targets.select("neon")[1]
    with pytest.raises(ValueError, match="known: avx512vnni, avx512, avxvnni, avx2"):
        compiled.forced_target("neon")


@pytest.mark.parametrize("system,machine,words", [
    ("linux", "aarch64", "x86-64 code; this host is aarch64"),
    ("linux", "ppc64le", "this host is ppc64le"),
    ("darwin", "x86_64", "Linux only; this host is darwin"),
    ("win32", "amd64", "Linux only; this host is win32"),
])
def test_a_foreign_host_keeps_the_numpy_path(fake_host, fresh_jit, monkeypatch, system, machine,
                                              words):
    """No compiler is started, no object loaded; the kernels say why and the session's
    numbers are numpy's, exact."""
    fake_host(_V4 | {"avx512vnni"}, system, machine)

    def refuse(*args):
        raise AssertionError("a compiler process was started")

    monkeypatch.setattr(jit, "_compile", refuse)
    monkeypatch.setattr(elf, "load", refuse)
    assert words in jit.why_unavailable()
    assert words in int8_gemm.unavailable()
    with pytest.raises(jit.Unavailable, match=words.split(";")[0]):
        jit.compile_module("m", "define void @f() {\n  ret void\n}", {"f": None})
    rng = np.random.default_rng(3)
    A = rng.integers(0, 256, (5, 40)).astype(np.uint8)
    B = rng.integers(-128, 128, (40, 7)).astype(np.int8)
    model, feeds = one_node("MatMulInteger", [A, B], opset=21, const=(1,))
    got = onnxrun.InferenceSession(model).run(None, feeds)[0]
    np.testing.assert_array_equal(got, A.astype(np.int64) @ B.astype(np.int64))


def test_the_environment_names_the_target(fake_host, fresh_jit, monkeypatch):
    fake_host(_V4 | {"avx512vnni"})
    monkeypatch.setattr(jit, "_compile_bundle", lambda target: {"error": None})
    assert jit.target().name == "avx512vnni"
    monkeypatch.setenv(targets.ENV, "avx2")
    assert jit.target().name == "avx2"
    assert jit.why_unavailable(("avx512f", "fma", "avx512vnni")) == \
        "the avx2 target lacks avx512f, avx512vnni"
    monkeypatch.setenv(targets.ENV, "sse2")
    assert jit.why_unavailable().startswith(f"{targets.ENV}=sse2: 'sse2' is not a")
    with compiled.forced_target("avx512"):  # the context manager overrides the environment
        assert jit.target().name == "avx512"
        with compiled.forced_target("avx2"):
            assert jit.target().name == "avx2"
        assert jit.target().name == "avx512"


def test_an_elf_object_for_another_machine_is_refused():
    obj = bytearray(64)
    obj[:6] = b"\x7fELF\x02\x01"
    obj[0x10:0x14] = (1).to_bytes(2, "little") + (183).to_bytes(2, "little")  # ET_REL, AArch64
    with pytest.raises(elf.ObjectError, match="for AArch64: this loader links x86-64 code only"):
        elf.load(bytes(obj))
    obj[0x12:0x14] = (4242).to_bytes(2, "little")
    with pytest.raises(elf.ObjectError, match="ELF machine 4242"):
        elf.load(bytes(obj))


_VPDPBUSD = """declare <16 x i32> @llvm.x86.avx512.vpdpbusd.512(<16 x i32>, <16 x i32>, <16 x i32>)
define void @dot(ptr %p) {
  %a = load <16 x i32>, ptr %p, align 4
  %d = call <16 x i32> @llvm.x86.avx512.vpdpbusd.512(<16 x i32> %a, <16 x i32> %a, <16 x i32> %a)
  store <16 x i32> %d, ptr %p, align 4
  ret void
}"""


@needs_llvmlite
@needs_host_target
def test_the_compiler_compiles_for_the_target_it_is_given():
    """VNNI code compiles for the avx512vnni target on any x86-64 host (this AVX2 one too),
    and is refused for avx2 (a clear error, not a crash): the features are the target's."""
    answer = jit._compile({"vnni": _VPDPBUSD}, targets.get("avx512vnni"))
    assert answer["error"] is None and not answer["errors"]
    code = elf.load(base64.b64decode(answer["objects"]["vnni"]))  # mapped, never called
    assert "dot" in code.address
    refused = jit._compile({"vnni": _VPDPBUSD}, targets.get("avx2"))
    assert "vnni" not in refused["objects"]
    assert refused["error"] or refused["errors"].get("vnni")


@needs_llvmlite
@pytest.mark.parametrize("target", [t.name for t in targets.TARGETS])
def test_every_bundled_module_builds_for_every_target_it_claims(target):
    """Each kernel module's IR compiles and links for each target whose features it needs:
    AVX-512 code is proven to build on hosts that cannot run it."""
    t = targets.get(target)
    modules = {}
    for short in jit._BUNDLE:
        bundle = importlib.import_module(f"onnxrun.providers.cpu.compiled.{short}").BUNDLE
        modules.update({name: factory(t) for name, (factory, req) in bundle.items()
                        if set(req) <= set(t.features)})
    answer = jit._compile(modules, t)
    assert answer["error"] is None and answer["errors"] == {}
    assert sorted(answer["objects"]) == sorted(modules)
    for obj in answer["objects"].values():
        assert elf.load(base64.b64decode(obj)).address


_LANES_IR = "define i64 @lanes() {{\n  ret i64 {}\n}}"


@needs_llvmlite
@needs_host_target
def test_a_module_is_generated_and_kept_per_target(fresh_jit):
    """The IR generator is called with the selected target; each target gets its own module."""
    proto = {"lanes": ctypes.CFUNCTYPE(ctypes.c_int64)}
    seen = []

    def generate(target):
        seen.append(target.name)
        return _LANES_IR.format(target.lanes)

    with compiled.forced_target("avx2") as avx2:
        module = jit.compile_module("lanes", generate, proto)
        assert module.target is avx2 and module.lanes() == 8
        assert jit.compile_module("lanes", generate, proto) is module
    assert seen == ["avx2"]
    if HOST.name != "avx2":
        other = jit.compile_module("lanes", generate, proto)
        assert other is not module and other.lanes() == HOST.lanes
        assert seen == ["avx2", HOST.name]


def test_layout_helpers_do_not_load_the_compiler_machinery():
    """Kernels that only use compiled.layout's numpy helpers (FusedConv's module imports them)
    leave jit, its cache and hashlib's OpenSSL (~4 MiB resident, tens of ms) unimported; the
    package's jit names still resolve, on first use."""
    import subprocess
    import sys

    code = ("import sys; import onnxrun.providers.cpu.ops.contrib.fused; "
            "print('onnxrun.providers.cpu.compiled.jit' in sys.modules, "
            "'_hashlib' in sys.modules); "
            "from onnxrun.providers.cpu import compiled; compiled.why_unavailable(); "
            "print('onnxrun.providers.cpu.compiled.jit' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.split() == ["False", "False", "True"]


def test_why_unavailable_is_remembered_per_switch_state(fresh_jit, monkeypatch):
    """Kernels ask at every call (Sigmoid, MatMulNBits): _why's checks run once per state of
    the switch and the forced target, and the answer still follows them."""
    calls = []
    why = jit._why

    def counted(requires=()):
        calls.append(tuple(requires))
        return why(requires)

    monkeypatch.setattr(jit, "_why", counted)
    first = jit.why_unavailable()
    assert jit.why_unavailable() == first and len(calls) == 1
    with compiled.disabled():
        assert jit.why_unavailable() is not None
        jit.why_unavailable()
    assert len(calls) == 2
    monkeypatch.setenv(targets.ENV, "sse2")
    assert jit.why_unavailable().startswith(f"{targets.ENV}=sse2")
    monkeypatch.delenv(targets.ENV)
    assert jit.why_unavailable() == first and len(calls) == 3


def test_the_switches_read_the_environment_as_os_environ_does(monkeypatch):
    # jit._getenv reads os.environ's own data (its get of an unset name costs a KeyError)
    name = "ONNXRUN_TEST_SWITCH_READ"
    monkeypatch.delenv(name, raising=False)
    assert jit._getenv(name) is None
    for value in ("0", "avx2", "", "é"):
        monkeypatch.setenv(name, value)
        assert jit._getenv(name) == os.environ.get(name) == value
    monkeypatch.delenv(name)
    assert jit._getenv(name) is None
    monkeypatch.setattr(os, "environ", {name: "1"})  # a stand-in mapping: its get
    assert jit._getenv(name) == "1"
