"""The compiled-kernel cache and loader (providers/cpu/compiled/cache.py, elf.py, jit.py) against
tampering and damage: planted or flipped objects are refused by their MAC tag and compiled
afresh, an unsafe folder is not used (one warning), code is never mapped writable and
executable at once, and every damaged object is an ``ObjectError``.

A tiny target-independent module (an i64 add) goes through the kernels' own path — compile in a
child process, cache, load — so these tests run on any x86-64 CPU with llvmlite, AVX-512 or not.
"""

from __future__ import annotations

import base64
import ctypes
import importlib.util
import json
import os
import random
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest
from one_node_harness import one_node

import onnxrun
from onnxrun import disk_cache
from onnxrun.providers.cpu.compiled import cache, elf, int8_gemm, jit, targets

pytestmark = [pytest.mark.skipif(importlib.util.find_spec("llvmlite") is None,
                                 reason="llvmlite is not installed"),
              pytest.mark.skipif(targets.select()[0] is None, reason=str(targets.select()[1]))]

NAME = "test_add"
ADD_IR = "define i64 @add(i64 %a, i64 %b) {\n  %s = add i64 %a, %b\n  ret i64 %s\n}"
# what a planted object would do instead: the same symbol, another result
MUL_IR = "define i64 @add(i64 %a, i64 %b) {\n  %s = mul i64 %a, %b\n  ret i64 %s\n}"
SIGNATURES = {"add": ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_int64, ctypes.c_int64)}
MODULES = {NAME: ADD_IR}
TARGET = targets.select()[0]  # the host's best: what compile_module uses here


@pytest.fixture
def folder(tmp_path, monkeypatch):
    """A fresh cache folder for this test; modules compiled by earlier tests forgotten."""
    jit.why_unavailable()  # the bundle, once per process, wherever its cache is
    path = tmp_path / "kernels"
    monkeypatch.setenv("ONNXRUN_KERNEL_CACHE", str(path))
    monkeypatch.setattr(jit, "_modules", {})
    monkeypatch.setattr(jit, "_failed", {})
    monkeypatch.setattr(disk_cache, "_refused", set())
    return path


@pytest.fixture
def compiles(monkeypatch):
    """The requests that reached a compiler process, by module names."""
    seen = []
    real = jit._compile

    def counting(modules, target):
        seen.append(sorted(modules))
        return real(modules, target)

    monkeypatch.setattr(jit, "_compile", counting)
    return seen


def _add() -> int:
    """2 + 3 through the module as it is had now (an 'add' that multiplies gives 6)."""
    return jit.compile_module(NAME, ADD_IR, SIGNATURES).add(2, 3)


_COMPILE = jit._compile  # uncounted


def _object(ir: str) -> str:
    answer = _COMPILE({"m": ir}, TARGET)
    assert answer["error"] is None, answer
    return answer["objects"]["m"]


def _entry(folder):
    return folder / cache.entry_name(cache.key(MODULES, TARGET))


def _plant(folder, obj_b64: str) -> None:
    """An answer holding ``obj_b64`` for the test module, tagged with the folder's own secret
    (as if our compiler had produced it)."""
    cache.write(cache.key(MODULES, TARGET), {"objects": {NAME: obj_b64}, "errors": {}})


def _forget(monkeypatch) -> None:
    monkeypatch.setattr(jit, "_modules", {})
    monkeypatch.setattr(jit, "_failed", {})


def _is_good_entry(folder) -> bool:
    answer = cache.read(cache.key(MODULES, TARGET))
    return answer is not None and elf.load(answer["objects"][NAME]) is not None


# -- the tag ----------------------------------------------------------------------------------


def test_entry_is_written_tagged_with_a_private_secret(folder, compiles, monkeypatch):
    assert _add() == 5
    assert compiles == [[NAME]]
    assert folder.stat().st_mode & 0o777 == 0o700
    secret = folder / "secret"
    assert secret.stat().st_mode & 0o777 == 0o600 and secret.stat().st_size == 32
    assert _entry(folder).read_bytes().startswith(b"onnxrun-kernels 5\n") and \
        cache._MAGIC == b"onnxrun-kernels 5\n"
    _forget(monkeypatch)
    assert _add() == 5
    assert compiles == [[NAME]]  # the second load came from the cache


def test_tag_is_keyed_blake2b_of_the_key_and_payload(folder, compiles):
    """The tag is what hashlib's keyed BLAKE2b computes: the cache's own import of it (without
    OpenSSL) is the same MAC."""
    import hashlib

    assert _add() == 5
    data = _entry(folder).read_bytes()
    head = len(cache._MAGIC)
    tag, payload = data[head:head + 64], data[head + 65:]
    key = json.loads(payload[8:8 + int.from_bytes(payload[:8], "little")])["key"]
    mac = hashlib.blake2b(cache._MAGIC + key.encode() + b"\0", digest_size=32,
                          key=(folder / "secret").read_bytes())
    mac.update(payload)
    assert tag == mac.hexdigest().encode()


def test_kernel_cache_does_not_load_openssl():
    """hashlib / hmac load OpenSSL's libcrypto (3.5 MiB resident, a few ms): a session whose
    kernels come from the cache never imports them."""
    code = textwrap.dedent("""
        import sys
        import numpy as np
        import onnxrun
        from onnxrun.providers.cpu.compiled import float_gemm
        assert float_gemm.unavailable() is None, float_gemm.unavailable()
        w = np.ones((8, 8), np.float32)
        assert float_gemm.pack(w) is not None
        print(sorted(m for m in ("_hashlib", "hashlib", "hmac") if m in sys.modules))
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_planted_entry_without_a_tag_is_refused_and_recompiled(folder, compiles):
    """Today's format without its tag, an answer with the right symbol, is never run."""
    folder.mkdir(mode=0o700)
    key = cache.key(MODULES, TARGET)
    planted = cache.payload(key, {"objects": {NAME: _object(MUL_IR)}, "errors": {}})
    _entry(folder).write_bytes(cache._MAGIC + planted)
    assert _add() == 5
    assert compiles[-1] == [NAME]
    assert _is_good_entry(folder)  # replaced by a tagged one


def test_planted_object_with_a_wrong_tag_is_refused(folder, compiles, monkeypatch):
    assert _add() == 5
    entry = _entry(folder)
    good = entry.read_bytes()
    head = good[:len(cache._MAGIC) + 65]
    planted = cache.payload(cache.key(MODULES, TARGET),
                            {"objects": {NAME: _object(MUL_IR)}, "errors": {}})
    entry.write_bytes(head + planted)  # the old tag, new bytes
    _forget(monkeypatch)
    compiles.clear()
    assert _add() == 5
    assert compiles == [[NAME]]
    assert _is_good_entry(folder)


def test_entry_tagged_by_another_secret_is_refused(folder, compiles, monkeypatch):
    """An entry copied from another user's or machine's cache: a valid tag, not ours."""
    assert _add() == 5
    (folder / "secret").unlink()
    _plant(folder, _object(MUL_IR))  # a new secret is made for it...
    (folder / "secret").unlink()
    (folder / "secret").write_bytes(os.urandom(32))  # ...and replaced
    (folder / "secret").chmod(0o600)
    _forget(monkeypatch)
    compiles.clear()
    assert _add() == 5
    assert compiles == [[NAME]]


@pytest.mark.parametrize("damage", ["short", "long", "header", "size", "key"])
def test_tagged_entry_that_does_not_parse_is_discarded(folder, damage):
    """A verified entry whose header and objects disagree (our own writer gone wrong) is
    refused and deleted, never sliced out of bounds."""
    key = cache.key(MODULES, TARGET)
    good = cache.payload(key, {"objects": {NAME: _object(ADD_IR)}, "errors": {}})
    size = int.from_bytes(good[:8], "little")
    header = json.loads(good[8:8 + size])
    if damage == "short":
        bad = good[:-1]
    elif damage == "long":
        bad = good + b"\0"
    elif damage == "header":
        bad = (size + 1000).to_bytes(8, "little") + good[8:]
    else:
        if damage == "size":
            header["objects"][0][1] = -1
        else:
            header["key"] = "0" * 64
        text = json.dumps(header).encode()
        bad = len(text).to_bytes(8, "little") + text + good[8 + size:]
    folder.mkdir(mode=0o700)
    cache.write(key, {"objects": {NAME: _object(ADD_IR)}, "errors": {}})  # the secret
    disk_cache.write(cache.entry_name(key), cache._MAGIC, key, bad)
    assert cache.read(key) is None
    assert not _entry(folder).exists()


@pytest.mark.parametrize("seed", range(4))
def test_a_flipped_bit_is_refused(folder, compiles, monkeypatch, seed):
    assert _add() == 5
    entry = _entry(folder)
    data = bytearray(entry.read_bytes())
    bit = random.Random(seed).randrange(8 * len(data))
    data[bit // 8] ^= 1 << (bit % 8)
    entry.write_bytes(bytes(data))
    _forget(monkeypatch)
    compiles.clear()
    assert _add() == 5
    assert compiles == [[NAME]]
    assert _is_good_entry(folder)


# -- damaged objects --------------------------------------------------------------------------


def test_truncated_object_is_an_object_error():
    obj = base64.b64decode(_object(ADD_IR))
    for n in (0, 3, 16, 0x30, 0x3F, 64, len(obj) // 2, len(obj) - 64, len(obj) - 1):
        with pytest.raises(elf.ObjectError):
            elf.load(obj[:n])


def test_truncated_cached_object_is_discarded_and_recompiled(folder, compiles, monkeypatch):
    """A tagged entry whose object does not load (as our compiler had written it): an
    ObjectError inside, the entry discarded, the module compiled afresh and stored."""
    obj = base64.b64decode(_object(ADD_IR))
    folder.mkdir(mode=0o700)
    _plant(folder, base64.b64encode(obj[:len(obj) // 2]).decode())
    real_load = elf.load
    errors = []

    def load(data):
        try:
            return real_load(data)
        except Exception as exc:
            errors.append(type(exc))
            raise

    monkeypatch.setattr(elf, "load", load)
    assert _add() == 5
    assert errors == [elf.ObjectError]
    assert compiles == [[NAME]]
    assert _is_good_entry(folder)


def test_object_that_cannot_be_had_is_unavailable_once(folder, compiles, monkeypatch):
    """A module whose object never loads is Unavailable (the kernel keeps numpy), remembered:
    no compiler process per later call."""
    def refuse(data):
        raise elf.ObjectError("refused")

    monkeypatch.setattr(elf, "load", refuse)
    with pytest.raises(jit.Unavailable, match="loading test_add: refused"):
        _add()
    assert jit.why_not_loaded(NAME, _add) == "loading test_add: refused"
    with pytest.raises(jit.Unavailable):
        _add()
    assert compiles == [[NAME]]


def test_session_falls_back_to_numpy_when_the_gemm_object_cannot_be_had(folder, monkeypatch):
    """The int8 GEMM asked for (as on a VNNI CPU) but its object does not load: the session is
    created and runs on the numpy path, like onnxruntime."""
    monkeypatch.setattr(jit, "why_unavailable", lambda requires=(): None)
    monkeypatch.setattr(jit, "_why", lambda requires=(): (TARGET, None))
    monkeypatch.setattr(jit, "_state", {TARGET.name: {**jit._compile_bundle(TARGET),
                                                      "objects": {}}})

    def refuse(data):
        raise elf.ObjectError("refused")

    monkeypatch.setattr(elf, "load", refuse)
    rng = np.random.default_rng(5)
    A = rng.integers(0, 256, (3, 8)).astype(np.uint8)
    B = rng.integers(-128, 128, (8, 4)).astype(np.int8)
    model, feeds = one_node("MatMulInteger", [A, B], opset=21, const=(1,))
    sess = onnxrun.InferenceSession(model)
    assert int8_gemm.unavailable() is not None
    # exact int64 arithmetic (onnxruntime's AVX2 u8 x s8 kernel saturates pairs to int16)
    want = A.astype(np.int64) @ B.astype(np.int64)
    np.testing.assert_array_equal(sess.run(None, feeds)[0], want)


# -- the folder and its files -----------------------------------------------------------------


def _warnings_of(fn):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = fn()
    return result, [w for w in caught if "kernel cache" in str(w.message)]


def test_world_writable_folder_is_not_used(folder, compiles, monkeypatch):
    """Mode 0777: a valid-looking entry there is not run, nothing is written, one warning."""
    folder.mkdir(mode=0o700)
    _plant(folder, _object(MUL_IR))
    before = sorted(os.listdir(folder))
    folder.chmod(0o777)

    def twice():
        first = _add()
        _forget(monkeypatch)
        return first, _add()

    results, caught = _warnings_of(twice)
    assert results == (5, 5)
    assert len(caught) == 1 and "0777" in str(caught[0].message)
    assert sorted(os.listdir(folder)) == before
    assert compiles == [[NAME], [NAME]]  # compiled in memory, each time


def test_folder_of_another_user_is_not_used(folder, compiles, monkeypatch):
    assert _add() == 5
    _forget(monkeypatch)
    compiles.clear()
    uid = os.getuid()
    monkeypatch.setattr(os, "getuid", lambda: uid + 1)
    result, caught = _warnings_of(_add)
    assert result == 5
    assert len(caught) == 1 and "another user" in str(caught[0].message)
    assert compiles == [[NAME]]


@pytest.mark.parametrize("what", ["entry", "secret"])
def test_group_writable_file_is_not_used(folder, compiles, monkeypatch, what):
    assert _add() == 5
    path = _entry(folder) if what == "entry" else folder / "secret"
    path.chmod(0o664 if what == "entry" else 0o640)
    _forget(monkeypatch)
    compiles.clear()
    result, caught = _warnings_of(_add)
    assert result == 5
    assert len(caught) == 1
    assert compiles == [[NAME]]
    assert path.exists()  # left for the user to look at


def test_symlinked_entry_is_not_followed(folder, compiles, monkeypatch, tmp_path):
    assert _add() == 5
    entry = _entry(folder)
    elsewhere = tmp_path / "elsewhere"
    entry.rename(elsewhere)
    entry.symlink_to(elsewhere)
    _forget(monkeypatch)
    compiles.clear()
    result, caught = _warnings_of(_add)
    assert result == 5 and len(caught) == 1
    assert compiles == [[NAME]]


# -- W^X --------------------------------------------------------------------------------------


def _permissions_at(address: int) -> str:
    with open("/proc/self/maps") as maps:
        for line in maps:
            span, perms = line.split()[:2]
            lo, hi = (int(x, 16) for x in span.split("-"))
            if lo <= address < hi:
                return perms
    raise AssertionError(f"{address:#x} is not mapped")


def test_code_is_never_writable_and_executable(folder):
    module = jit.compile_module(NAME, ADD_IR, SIGNATURES)
    address = ctypes.cast(module.add, ctypes.c_void_p).value
    assert _permissions_at(address) == "r-xp"
    assert module.add(40, 2) == 42


def test_loader_maps_read_write_then_read_execute(monkeypatch):
    """Every protection the loader asks for is W or X, never both."""
    asked = []
    real_map, real_protect = elf._map, elf._protect
    monkeypatch.setattr(elf, "_map", lambda size: asked.append("rw") or real_map(size))
    monkeypatch.setattr(elf, "_protect",
                        lambda a, s, prot: asked.append(prot) or real_protect(a, s, prot))
    code = elf.load(base64.b64decode(_object(ADD_IR)))
    import mmap

    assert asked == ["rw", mmap.PROT_READ | mmap.PROT_EXEC]
    assert _permissions_at(code.base) == "r-xp"


# -- the parser under random damage -----------------------------------------------------------


def test_fuzzed_objects_are_object_errors_or_load():
    """Random truncations, bit flips and overwritten fields (seeded): the loader refuses with
    an ObjectError or loads; never another exception (nothing loaded is called)."""
    obj = base64.b64decode(_object(ADD_IR))
    shoff = int.from_bytes(obj[0x28:0x30], "little")
    rng = random.Random(20261125)
    outcomes = {"ObjectError": 0, "loaded": 0}
    for i in range(400):
        data = bytearray(obj)
        kind = i % 4
        if kind == 0:
            data = data[:rng.randrange(len(obj))]
        elif kind == 1:  # anywhere
            for _ in range(rng.randint(1, 4)):
                bit = rng.randrange(8 * len(data))
                data[bit // 8] ^= 1 << (bit % 8)
        elif kind == 2:  # the headers and the section table
            for _ in range(rng.randint(1, 3)):
                at = rng.choice([rng.randrange(64), rng.randrange(shoff, len(data))])
                data[at] ^= 1 << rng.randrange(8)
        else:  # a whole field overwritten with an extreme value
            at = rng.choice([rng.randrange(64), rng.randrange(shoff, len(data) - 8)])
            data[at:at + 8] = rng.choice([b"\xff" * 8, b"\0" * 8, b"\x00\x00\x00\x80" * 2])
        try:
            elf.load(bytes(data))
        except elf.ObjectError:
            outcomes["ObjectError"] += 1
        else:
            outcomes["loaded"] += 1
    assert outcomes["ObjectError"] > 200, outcomes


# -- across processes -------------------------------------------------------------------------

_SCRIPT = textwrap.dedent("""
    import ctypes, sys
    from onnxrun.providers.cpu.compiled import jit
    if "--no-compiler" in sys.argv:  # the object must come from the cache
        def refuse(modules, target):
            raise AssertionError(f"compiler started for {sorted(modules)}")
        jit._compile = refuse
        jit._state[jit.target().name] = dict(error=None, objects={}, errors={}, key=None,
                                             cached=False)
    fn = jit.compile_module("test_add", sys.argv[1],
                            {"add": ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_int64,
                                                     ctypes.c_int64)}).add
    print(fn(2, 3), "llvmlite" in sys.modules)
""")


def _in_a_process(folder, *args: str) -> str:
    env = dict(os.environ, ONNXRUN_KERNEL_CACHE=str(folder))
    return subprocess.run([sys.executable, "-c", _SCRIPT, ADD_IR, *args], capture_output=True,
                          text=True, check=True, env=env).stdout.strip()


def test_cache_serves_the_next_process(tmp_path):
    folder = tmp_path / "kernels"
    assert _in_a_process(folder) == "5 False"
    assert _in_a_process(folder, "--no-compiler") == "5 False"
    assert not list(folder.glob(".tmp-*"))  # written atomically


def test_bundle_entry_found_without_writing_its_ir(folder, monkeypatch):
    """A later process finds the bundle's entry by the key of the package's sources and the
    target: it loads the objects without writing a line of IR (30-100 ms per process before);
    another source gives another key."""
    monkeypatch.setattr(jit, "_state", {})
    first = jit._compile_bundle(TARGET)
    assert first["error"] is None and not first["cached"]
    monkeypatch.setattr(jit, "_state", {})

    def no_ir(target):
        raise AssertionError("the IR was written to find a cached bundle")

    monkeypatch.setattr(jit, "_bundle_ir", no_ir)
    again = jit._compile_bundle(TARGET)
    assert again["cached"] and again["key"] == first["key"]
    assert sorted(again["objects"]) == sorted(first["objects"])
    real_listdir = os.listdir
    here = os.path.dirname(jit.__file__)
    monkeypatch.setattr(os, "listdir", lambda p: [n for n in real_listdir(p) if n != "gelu.py"]
                        if os.path.abspath(p) == here else real_listdir(p))
    assert jit._bundle_key(TARGET) != first["key"]


def test_sources_digest_kept_under_the_files_identities(folder, tmp_path, monkeypatch):
    """The sources' digest is stored under their files' identities: a later process stats the
    files instead of reading them; a changed file (size or time) is read again, and a planted
    or damaged entry is refused (the sources read, the right digest stored again)."""
    src = tmp_path / "sources"
    src.mkdir()
    (src / "a.py").write_bytes(b"x = 1\n")
    (src / "b.py").write_bytes(b"y = 2\n")
    first = jit._sources_digest(str(src))
    assert len(first) == 64 and list(folder.glob("*.sources"))
    reads = []
    real_open = open

    def counting_open(path, *args, **kwargs):
        reads.append(os.path.basename(str(path)))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr("builtins.open", counting_open)
    assert jit._sources_digest(str(src)) == first and reads == []  # stats only
    (src / "b.py").write_bytes(b"y = 3\n")  # same size, a new modification time
    os.utime(src / "b.py", ns=(1, 2))
    changed = jit._sources_digest(str(src))
    assert changed != first and reads == ["a.py", "b.py"]
    reads.clear()
    assert jit._sources_digest(str(src)) == changed and reads == []
    for entry in folder.glob("*.sources"):  # planted: another digest under the same name
        data = bytearray(entry.read_bytes())
        data[-5:-1] = b"0000" if data[-5:-1] != b"0000" else b"1111"
        entry.write_bytes(bytes(data))
    assert jit._sources_digest(str(src)) == changed and reads == ["a.py", "b.py"]


def test_bundled_module_loads_without_writing_its_ir(monkeypatch):
    """A module the bundle holds is loaded from its object: its IR generator is never called
    (writing an LSTM's IR was ~10 ms of a first session)."""
    from onnxrun.providers.cpu.compiled import lstm

    assert jit.why_unavailable() is None
    monkeypatch.setattr(jit, "_state", {})  # as in a fresh process: the bundle read again
    monkeypatch.setattr(jit, "_modules", {})
    monkeypatch.setattr(jit, "_failed", {})
    calls = []

    def ir(target):
        calls.append(target.name)
        return lstm.module_ir_f32(target)

    module = jit.compile_module("lstm_f32", ir, {"lstm_f32": lstm._PROTO})
    assert module.lstm_f32 is not None
    assert calls == []
