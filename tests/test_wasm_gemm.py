"""providers/cpu/wasm_gemm: the float32 GEMM Pyodide runs in WebAssembly SIMD. The module and
its JavaScript driver run here in Node.js (the engine Pyodide's Node lane uses) against numpy;
the Python side (operand strides, ``out``, which products it takes) runs natively with a
stand-in driver that multiplies through ctypes at the same addresses."""

from __future__ import annotations

import ctypes
import json
import shutil
import subprocess
import types

import numpy as np
import pytest

from onnxrun.providers.cpu import blas, wasm_gemm

HARNESS = r"""
import fs from "node:fs";
const [dir] = process.argv.slice(2);
const bytes = fs.readFileSync(dir + "/m.wasm");
if (!WebAssembly.validate(bytes)) { console.log("invalid"); process.exit(3); }
const make = eval(fs.readFileSync(dir + "/driver.js", "utf8"));
const cases = JSON.parse(fs.readFileSync(dir + "/cases.json", "utf8"));
const data = fs.readFileSync(dir + "/heap.bin");
const heap = new Float32Array(cases.heap);
heap.set(new Float32Array(data.buffer, data.byteOffset, data.byteLength / 4));
const drv = make(bytes, () => heap);
for (const c of cases.runs) drv.gemm(...c);
for (const c of cases.clips) drv.clip(...c);
fs.writeFileSync(dir + "/out.bin", Buffer.from(heap.buffer));
"""


def _shapes():
    rng = np.random.default_rng(0)
    f = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    # (a, b): remainders of the 4 x 8 block, K over one block of 256 (accumulated), M over one
    # block of 128 rows, transposed and strided operands; all but the first two large enough
    # for blas.matmul to hand them to the kernel
    return [(f(4, 8), f(8, 8)), (f(5, 3), f(3, 9)), (f(13, 300), f(300, 17)),
            (f(130, 520), f(520, 40)), (f(37, 300).T.copy().T, f(300, 45)),
            (f(60, 200), f(33, 200).T), (f(120, 400)[:, 50:350], f(300, 16)),
            (f(90, 640)[::2], f(640, 24)[:, :20])]


@pytest.mark.skipif(shutil.which("node") is None, reason="needs Node.js (the Pyodide lanes')")
def test_kernel_and_driver_in_node(tmp_path):
    (tmp_path / "m.wasm").write_bytes(wasm_gemm.module_bytes())
    (tmp_path / "driver.js").write_text(wasm_gemm._DRIVER)
    (tmp_path / "h.mjs").write_text(HARNESS)
    heap, runs, want, at = [], [], [], 0

    def place(x):  # x's floats at ``at`` in the heap, with its strides kept
        nonlocal at
        base = x.base if x.base is not None else x
        assert base.flags.c_contiguous
        off = (x.__array_interface__["data"][0] - base.__array_interface__["data"][0]) // 4
        heap.append(base.ravel())
        p = at + off
        at += base.size
        return p, x.strides[0] // 4, x.strides[1] // 4

    for a, b in _shapes():
        pa, ars, acs = place(a)
        pb, brs, bcs = place(b)
        m, n = a.shape[0], b.shape[1]
        heap.append(np.full(m * n, np.nan, np.float32))  # C: every element must be written
        runs.append([pa, m, a.shape[1], ars, acs, pb, n, brs, bcs, at, n])
        want.append((at, a.astype(np.float64) @ b.astype(np.float64)))
        at += m * n
    clips = []
    for n, lo, hi in [(5, 0.0, 6.0), (4099, -0.5, 0.25), (64, 0.0, 3.4e38)]:
        x = np.random.default_rng(n).standard_normal(n).astype(np.float32) * 4
        x[n // 2] = np.nan
        heap += [x, np.full(n, 7, np.float32)]
        clips.append([at, at + n, n, lo, hi])  # y = clip(x), one after the other
        want.append((at + n, np.clip(x, np.float32(lo), np.float32(hi))))
        at += 2 * n
    heap.append(np.full(8, 7, np.float32))
    clips.append([at, at, 8, -1.0, 1.0])  # in place
    want.append((at, np.full(8, 1, np.float32)))
    at += 8
    np.concatenate(heap).astype(np.float32).tofile(tmp_path / "heap.bin")
    (tmp_path / "cases.json").write_text(json.dumps({"heap": at, "runs": runs, "clips": clips}))
    subprocess.run(["node", str(tmp_path / "h.mjs"), str(tmp_path)], check=True, timeout=60)
    out = np.fromfile(tmp_path / "out.bin", np.float32)
    for at_c, ref in want:
        got = out[at_c:at_c + ref.size].reshape(ref.shape)
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)  # NaN where ref has NaN


def _float_view(ptr: int, shape, strides) -> np.ndarray:
    span = sum((d - 1) * s for d, s in zip(shape, strides, strict=True)) + 1
    buf = np.ctypeslib.as_array((ctypes.c_float * span).from_address(ptr * 4))
    return np.lib.stride_tricks.as_strided(buf, shape, [4 * s for s in strides])


@pytest.fixture
def stand_in(monkeypatch):
    """The driver's contract, natively: pointers and strides in floats of the process heap."""
    calls = []

    def gemm(a, m, k, ars, acs, b, n, brs, bcs, c, ldc):
        calls.append((m, k, n))
        A = _float_view(a, (m, k), (ars, acs))
        B = _float_view(b, (k, n), (brs, bcs))
        _float_view(c, (m, n), (ldc, 1))[...] = A @ B

    def clip(x, y, n, lo, hi):
        calls.append(("clip", n))
        _float_view(y, (n,), (1,))[...] = np.clip(_float_view(x, (n,), (1,)), lo, hi)

    monkeypatch.setattr(wasm_gemm, "_driver", lambda: types.SimpleNamespace(gemm=gemm, clip=clip))
    monkeypatch.setattr(blas, "_gemms", lambda: {})  # no SciPy: numpy's products otherwise
    return calls


def test_blas_matmul_routes_float32_products(stand_in):
    for a, b in _shapes()[2:]:
        np.testing.assert_allclose(blas.matmul(a, b), a @ b, rtol=1e-5, atol=1e-5)
    assert len(stand_in) == len(_shapes()) - 2
    rng = np.random.default_rng(1)
    a = rng.standard_normal((3, 40, 128)).astype(np.float32)
    b = rng.standard_normal((128, 16)).astype(np.float32)
    out = np.empty((16, 3, 40), np.float32).transpose(1, 2, 0)  # columns not contiguous
    assert blas.matmul(a, b, out=out) is out
    np.testing.assert_allclose(out, a @ b, rtol=1e-5, atol=1e-5)
    out = np.empty((3, 40, 16), np.float32)
    assert blas.matmul(a, b, out=out) is out
    np.testing.assert_allclose(out, a @ b, rtol=1e-5, atol=1e-5)
    assert stand_in[-1] == (40, 128, 16) and len(stand_in) == len(_shapes()) - 2 + 6


def test_small_narrow_and_other_products_stay_with_numpy(stand_in):
    rng = np.random.default_rng(2)
    f = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    for a, b in [(f(4, 4), f(4, 8)), (f(1, 1280), f(1280, 1000)), (f(300, 200), f(200, 4)),
                 (f(64, 64).astype(np.float64), f(64, 64).astype(np.float64)),
                 (f(64, 0), f(0, 64))]:
        np.testing.assert_allclose(blas.matmul(a, b), a @ b, rtol=1e-5, atol=1e-5)
    assert stand_in == []


def test_a_failed_driver_call_falls_back(monkeypatch):
    def run(*args):  # what Pyodide raises when the kernel's memory cannot grow
        raise RuntimeError("RangeError: WebAssembly.Memory.grow(): Maximum memory size exceeded")

    monkeypatch.setattr(wasm_gemm, "_driver", lambda: types.SimpleNamespace(gemm=run, clip=run))
    monkeypatch.setattr(blas, "_gemms", lambda: {})
    a = np.ones((64, 64), np.float32)
    assert wasm_gemm.gemm(a, a) is None
    np.testing.assert_array_equal(blas.matmul(a, a), a @ a)
    np.testing.assert_array_equal(blas.clip(a, 0, 0.5), np.clip(a, 0, 0.5))


def test_clip_through_the_kernel(stand_in):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((8, 64, 32)).astype(np.float32)
    x[0, 0, 0] = np.nan
    want = np.clip(x, 0, 6)
    np.testing.assert_array_equal(blas.clip(x, 0, 6), want)  # a new array
    y = x.copy()
    assert blas.clip(y, np.float32(0), np.float32(6), out=y) is y  # in place
    np.testing.assert_array_equal(y, want)
    assert stand_in == [("clip", x.size)] * 2
    # what the kernel does not take: small, strided, float64, a non-contiguous out
    for a in [x[:1, :1], x[:, ::2], x.astype(np.float64)]:
        np.testing.assert_array_equal(blas.clip(a, 0, 6), np.clip(a, 0, 6))
    out = np.empty((32, 64, 8), np.float32).transpose(2, 1, 0)
    np.testing.assert_array_equal(blas.clip(x, 0, 6, out=out), want)
    assert len(stand_in) == 2


def test_relu_and_fused_clip_through_the_kernel(stand_in):
    """Relu and FusedConv's Clip activation take the kernel's clip in Pyodide."""
    import onnx

    from onnxrun import InferenceSession

    model = onnx.parser.parse_model("""
    <ir_version: 8, opset_import: ["" : 17, "com.microsoft" : 1]>
    g (float[1, 8, 32, 32] x, float[16, 8, 1, 1] w) => (float[1, 8, 32, 32] r,
                                                       float[1, 16, 32, 32] c) {
      r = Relu(x)
      c = com.microsoft.FusedConv <activation = "Clip", activation_params = [0.0, 1.0]> (x, w)
    }
    """)
    rng = np.random.default_rng(4)
    x = rng.standard_normal((1, 8, 32, 32)).astype(np.float32)
    w = rng.standard_normal((16, 8, 1, 1)).astype(np.float32)
    r, c = InferenceSession(model.SerializeToString()).run(None, {"x": x, "w": w})
    np.testing.assert_array_equal(r, np.maximum(x, 0))
    want = np.clip(np.einsum("oc,nchw->nohw", w[:, :, 0, 0], x), 0, 1)
    np.testing.assert_allclose(c, want, rtol=1e-5, atol=1e-5)
    assert sum(1 for call in stand_in if call[0] == "clip") == 2
