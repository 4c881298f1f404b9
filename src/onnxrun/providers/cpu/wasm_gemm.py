"""float32 GEMM in WebAssembly SIMD for Pyodide, where numpy has no BLAS and SciPy's OpenBLAS
is built without SIMD (~2.5 GFLOP/s on the products of a MiniLM encoder).

The module is emitted here as bytes (no binary in the repository): a 4 x 8 register-blocked
kernel (``v128.load32_splat`` of A, two f32x4 of a packed B panel, eight f32x4 accumulators)
and a packing routine (B's rows into panels of 8 columns; A is packed by blocks of 4 rows in
JavaScript). It runs in its own linear memory:
a JavaScript driver (``_DRIVER``) copies the operands in from Pyodide's heap (memcpy-speed
``TypedArray.set``), packs B, runs the kernel over blocks of K and of rows (L1/L2-sized), and
copies the product back, all in one call from Python.

``gemm()`` returns None where this cannot run (not in Pyodide, no SIMD in the engine).
"""

from __future__ import annotations

import functools
import sys

import numpy as np

# -- the WebAssembly module ---------------------------------------------------------------------

I32, V128 = 0x7F, 0x7B


def _uleb(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _sleb(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if (n == 0 and not b & 0x40) or (n == -1 and b & 0x40):
            out.append(b)
            return bytes(out)
        out.append(b | 0x80)


def _vec(items: list[bytes]) -> bytes:
    return _uleb(len(items)) + b"".join(items)


def _section(sid: int, body: bytes) -> bytes:
    return bytes([sid]) + _uleb(len(body)) + body


class _Code:
    """A function body written as a sequence of instructions."""

    def __init__(self) -> None:
        self.b = bytearray()

    def get(self, i: int) -> _Code:
        self.b += b"\x20" + _uleb(i)
        return self

    def set(self, i: int) -> _Code:
        self.b += b"\x21" + _uleb(i)
        return self

    def const(self, v: int) -> _Code:
        self.b += b"\x41" + _sleb(v)
        return self

    def op(self, *codes: int) -> _Code:
        self.b += bytes(codes)
        return self

    def simd(self, code: int, memarg: tuple[int, int] | None = None) -> _Code:
        self.b += b"\xfd" + _uleb(code)
        if memarg is not None:
            self.b += _uleb(memarg[0]) + _uleb(memarg[1])
        return self

    def add_to(self, i: int, v: int) -> _Code:  # local[i] += v
        return self.get(i).const(v).op(ADD).set(i)


F32 = 0x7D
ADD, SUB, MUL, SHR_U, LT_S = 0x6A, 0x6B, 0x6C, 0x76, 0x48
BLOCK, LOOP, IF, ELSE, END, BR_IF, EMPTY = 0x02, 0x03, 0x04, 0x05, 0x0B, 0x0D, 0x40
V_LOAD, V_SPLAT32, V_STORE, V_CONST, F32X4_ADD, F32X4_MUL = 0x00, 0x09, 0x0B, 0x0C, 0xE4, 0xE6
F32X4_SPLAT, F32X4_MIN, F32X4_MAX = 0x13, 0xE8, 0xE9
# the kernel's block of C: 4 rows x 8 columns (two f32x4); the driver packs A by 4 rows
ROWS, COLS = 4, 8


def _kernel() -> bytes:
    """kernel(a, lda, b, bstride, c, ldc, m, panels, kc, acc): C[m, 8 * panels] (+)= A[m, kc] @
    B, A packed by blocks of 4 rows (each kc x 4, row-major: the four rows' values of one k are
    one 16-byte load address apart by 4 bytes) ``lda`` bytes apart, B's panels (kc x 8,
    row-major) ``bstride`` bytes apart, C's rows ``ldc`` bytes apart; m a multiple of 4,
    kc >= 1; acc: add to C instead of setting it. (Packed A: one pointer to advance per k
    instead of four: 1.4-1.5x the row-major A's speed in Node.)"""
    a, lda, b, bstride, c, ldc, m, panels, kc, accum = range(10)
    p, i, k, bp, t, b0, b1 = range(10, 17)  # i32 x4, then v128 t, b0, b1
    ar = list(range(17, 17 + ROWS))  # i32: A's row pointers
    cr = list(range(17 + ROWS, 17 + 2 * ROWS))  # i32: C's row pointers
    acc = [[17 + 2 * ROWS + 2 * r, 18 + 2 * ROWS + 2 * r] for r in range(ROWS)]  # v128
    locals_ = [(4, I32), (3, V128), (2 * ROWS, I32), (2 * ROWS, V128)]
    f = _Code()
    f.const(0).set(p)
    f.op(LOOP, EMPTY)  # panels
    f.const(0).set(i)
    f.op(LOOP, EMPTY)  # row blocks
    # row pointers: A's rows i..i+3, C's rows i..i+3 at this panel's columns
    f.get(a).get(i).const(2).op(SHR_U).get(lda).op(MUL).op(ADD).set(ar[0])  # (i >> 2) * lda
    f.get(c).get(i).get(ldc).op(MUL).op(ADD).get(p).const(4 * COLS).op(MUL).op(ADD).set(cr[0])
    for r in range(1, ROWS):
        f.get(cr[r - 1]).get(ldc).op(ADD).set(cr[r])
    f.get(accum).op(IF, EMPTY)
    for r in range(ROWS):
        for h in range(2):
            f.get(cr[r]).simd(V_LOAD, (4, 16 * h)).set(acc[r][h])
    f.op(ELSE)
    for r in range(ROWS):
        for h in range(2):
            f.simd(V_CONST).op(*bytes(16)).set(acc[r][h])
    f.op(END)
    f.get(b).get(p).get(bstride).op(MUL).op(ADD).set(bp)
    f.get(kc).set(k)
    f.op(LOOP, EMPTY)  # k
    f.get(bp).simd(V_LOAD, (4, 0)).set(b0)
    f.get(bp).simd(V_LOAD, (4, 16)).set(b1)
    for r in range(ROWS):
        f.get(ar[0]).simd(V_SPLAT32, (2, 4 * r)).set(t)
        for h, bv in enumerate((b0, b1)):
            f.get(acc[r][h]).get(t).get(bv).simd(F32X4_MUL).simd(F32X4_ADD).set(acc[r][h])
    f.add_to(ar[0], 16)
    f.add_to(bp, 4 * COLS)
    f.get(k).const(1).op(SUB).set(k)
    f.get(k).op(BR_IF, 0)
    f.op(END)
    for r in range(ROWS):
        for h in range(2):
            f.get(cr[r]).get(acc[r][h]).simd(V_STORE, (4, 16 * h))
    f.add_to(i, ROWS)
    f.get(i).get(m).op(LT_S).op(BR_IF, 0)
    f.op(END)
    f.add_to(p, 1)
    f.get(p).get(panels).op(LT_S).op(BR_IF, 0)
    f.op(END)
    f.op(END)
    body = _vec([_uleb(n) + bytes([ty]) for n, ty in locals_]) + bytes(f.b)
    return _uleb(len(body)) + body


def _pack() -> bytes:
    """pack(src, ld, dst, k, panels): B (k rows ``ld`` bytes apart, 8 * panels columns) into
    panels of 8 columns, each k x 8 row-major, one after another at ``dst``."""
    src, ld, dst, kk, panels = range(5)
    p, r, s = range(5, 8)
    f = _Code()
    f.const(0).set(p)
    f.op(LOOP, EMPTY)
    f.get(src).get(p).const(4 * COLS).op(MUL).op(ADD).set(s)
    f.get(kk).set(r)
    f.op(LOOP, EMPTY)
    for h in range(2):
        f.get(dst).get(s).simd(V_LOAD, (4, 16 * h)).simd(V_STORE, (4, 16 * h))
    f.get(s).get(ld).op(ADD).set(s)
    f.add_to(dst, 4 * COLS)
    f.get(r).const(1).op(SUB).set(r)
    f.get(r).op(BR_IF, 0)
    f.op(END)
    f.add_to(p, 1)
    f.get(p).get(panels).op(LT_S).op(BR_IF, 0)
    f.op(END)
    f.op(END)
    body = _vec([_uleb(3) + bytes([I32])]) + bytes(f.b)
    return _uleb(len(body)) + body


def _clamp() -> bytes:
    """clamp(x, n, lo, hi): n f32x4 at x to min(max(x, lo), hi), in place, without branches
    (NaN stays NaN: WebAssembly's f32x4.max and min propagate it, as numpy's clip)."""
    x, n, lo, hi = range(4)
    vlo, vhi = 4, 5
    f = _Code()
    f.get(lo).simd(F32X4_SPLAT).set(vlo)
    f.get(hi).simd(F32X4_SPLAT).set(vhi)
    f.op(LOOP, EMPTY)
    f.get(x).get(x).simd(V_LOAD, (4, 0)).get(vlo).simd(F32X4_MAX).get(vhi).simd(F32X4_MIN)
    f.simd(V_STORE, (4, 0))
    f.add_to(x, 16)
    f.get(n).const(1).op(SUB).set(n)
    f.get(n).op(BR_IF, 0)
    f.op(END)
    f.op(END)
    body = _vec([_uleb(2) + bytes([V128])]) + bytes(f.b)
    return _uleb(len(body)) + body


@functools.cache
def module_bytes() -> bytes:
    """The WebAssembly module: exports ``memory`` (its own, growable), ``kernel``, ``pack``,
    ``clamp``."""
    types = _vec([b"\x60" + _vec([bytes([I32])] * 10) + _vec([]),
                  b"\x60" + _vec([bytes([I32])] * 5) + _vec([]),
                  b"\x60" + _vec([bytes([I32])] * 2 + [bytes([F32])] * 2) + _vec([])])
    funcs = _vec([_uleb(0), _uleb(1), _uleb(2)])
    memory = _vec([b"\x00" + _uleb(16)])  # 16 pages (1 MiB) to start; grown by the driver
    exports = _vec([_uleb(6) + b"memory" + b"\x02" + _uleb(0),
                    _uleb(6) + b"kernel" + b"\x00" + _uleb(0),
                    _uleb(4) + b"pack" + b"\x00" + _uleb(1),
                    _uleb(5) + b"clamp" + b"\x00" + _uleb(2)])
    code = _vec([_kernel(), _pack(), _clamp()])
    return (b"\x00asm\x01\x00\x00\x00" + _section(1, types) + _section(3, funcs)
            + _section(5, memory) + _section(7, exports) + _section(10, code))


# -- the driver (JavaScript) --------------------------------------------------------------------

# make(wasmBytes, heap): heap() returns the host's current Float32Array over its memory
# (Pyodide's HEAPF32, replaced when that memory grows). gemm(...) computes C = A @ B for A
# (m x k, strides ars, acs), B (k x n, strides brs, bcs) and row-major C (row stride ldc):
# pointers and strides in floats of the host heap, strides >= 0. clip(x, y, n, lo, hi):
# y[:n] = clip(x[:n], lo, hi) (x == y: in place).
_DRIVER = r"""
(wasmBytes, heap) => {
  const inst = new WebAssembly.Instance(new WebAssembly.Module(wasmBytes), {});
  const mem = inst.exports.memory, kernel = inst.exports.kernel, pack = inst.exports.pack;
  const KC = 256, MC = 128;
  let f32 = new Float32Array(mem.buffer);
  const ensure = (bytes) => {
    if (bytes > mem.buffer.byteLength) {
      mem.grow(Math.ceil((bytes - mem.buffer.byteLength) / 65536));
      f32 = new Float32Array(mem.buffer);
    }
  };
  // a rows x cols matrix of the host (strides rs, cs) into ours at off, row-major with rows
  // dcols apart; columns cols..dcols and rows rows..drows zero
  const put = (h, ptr, rows, cols, rs, cs, off, drows, dcols) => {
    if (cs === 1 && rs === cols && cols === dcols) f32.set(h.subarray(ptr, ptr + rows * cols), off);
    else if (cs === 1) for (let r = 0; r < rows; r++) {
      f32.set(h.subarray(ptr + r * rs, ptr + r * rs + cols), off + r * dcols);
    } else for (let r = 0; r < rows; r++) {
      const s = ptr + r * rs, d = off + r * dcols;
      for (let j = 0; j < cols; j++) f32[d + j] = h[s + j * cs];
    }
    if (dcols > cols)
      for (let r = 0; r < rows; r++) f32.fill(0, off + r * dcols + cols, off + (r + 1) * dcols);
    if (drows > rows) f32.fill(0, off + rows * dcols, off + drows * dcols);
  };
  const clip = (x, y, n, lo, hi) => {
    ensure(Math.ceil(n / 4) * 16);
    const h = heap();
    f32.set(h.subarray(x, x + n), 0);
    inst.exports.clamp(0, Math.ceil(n / 4), lo, hi);
    h.set(f32.subarray(0, n), y);
  };
  const gemm = (a, m, k, ars, acs, b, n, brs, bcs, c, ldc) => {
    const mp = Math.ceil(m / 4) * 4, np = Math.ceil(n / 8) * 8, panels = np / 8;
    const offA = 0, offB = offA + mp * k, offP = offB + k * np;
    const offC = offP + k * np, offQ = offC + mp * np;
    ensure((offQ + mp * k) * 4);
    const h = heap();
    put(h, a, m, k, ars, acs, offQ, mp, k);  // row-major, then by blocks of 4 rows
    for (let blk = 0; blk < mp / 4; blk++) {
      const s0 = offQ + blk * 4 * k, d0 = offA + blk * 4 * k;
      for (let kk = 0; kk < k; kk++) {
        const d = d0 + kk * 4, s1 = s0 + kk;
        f32[d] = f32[s1]; f32[d + 1] = f32[s1 + k];
        f32[d + 2] = f32[s1 + 2 * k]; f32[d + 3] = f32[s1 + 3 * k];
      }
    }
    put(h, b, k, n, brs, bcs, offB, k, np);
    pack(offB * 4, np * 4, offP * 4, k, panels);
    for (let k0 = 0; k0 < k; k0 += KC) {
      const kc = Math.min(KC, k - k0);
      for (let i0 = 0; i0 < mp; i0 += MC) {
        kernel((offA + i0 * k + k0 * 4) * 4, k * 16, (offP + k0 * 8) * 4, k * 32,
               (offC + i0 * np) * 4, np * 4, Math.min(MC, mp - i0), panels, kc, k0 > 0 ? 1 : 0);
      }
    }
    if (n === np && ldc === n) h.set(f32.subarray(offC, offC + m * n), c);
    else
      for (let r = 0; r < m; r++)
        h.set(f32.subarray(offC + r * np, offC + r * np + n), c + r * ldc);
  };
  return { gemm, clip };
}
"""


@functools.cache
def _driver():
    """The driver bound to Pyodide's heap, or None (not in Pyodide, or no WebAssembly SIMD)."""
    if sys.platform != "emscripten":
        return None
    try:
        import pyodide_js
        from pyodide.code import run_js
        from pyodide.ffi import to_js

        data = to_js(module_bytes())
        if not run_js("WebAssembly.validate")(data):
            return None
        module = pyodide_js._module
        return run_js(_DRIVER)(data, run_js("(m) => () => m.HEAPF32")(module))
    except Exception:  # an engine without SIMD, a Pyodide without these modules: SciPy's
        return None


def available() -> bool:
    """Whether ``gemm`` can run here (Pyodide with WebAssembly SIMD)."""
    return _driver() is not None


# Below this many multiply-adds a product stays with SciPy / numpy: the JavaScript call and the
# copies cost ~20 us. So do products of fewer than 4 rows or 8 columns (a matrix-vector
# product would pad them to the kernel's 4 x 8 block).
MIN_MACS = 1 << 16


def _strides(x: np.ndarray) -> tuple[int, int] | None:
    """A matrix's strides in floats, or None where the driver cannot read it in place."""
    if x.ctypes.data % 4 or any(s % 4 or s < 0 for s in x.strides):
        return None
    return x.strides[0] // 4, x.strides[1] // 4


def gemm(a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None) -> np.ndarray | None:
    """``a @ b`` for float32 matrices through the WebAssembly kernel, into ``out`` (or a new
    array); None where it does not apply (the caller then uses another product)."""
    m, k = a.shape
    n = b.shape[1]
    if m * n * k < MIN_MACS or m < 4 or n < 8:
        return None
    run = _driver()
    if run is None:
        return None
    sa, sb = _strides(a), _strides(b)
    if sa is None:
        a = np.ascontiguousarray(a)
        sa = _strides(a)
    if sb is None:
        b = np.ascontiguousarray(b)
        sb = _strides(b)
    so = None if out is None or out.dtype != np.float32 else _strides(out)
    dst = out if so is not None and so[1] == 1 else np.empty((m, n), np.float32)
    try:
        run.gemm(a.ctypes.data // 4, m, k, *sa, b.ctypes.data // 4, n, *sb,
                 dst.ctypes.data // 4, dst.strides[0] // 4)
    except Exception:  # its memory could not grow (JavaScript's RangeError): another product
        return None
    if out is not None and dst is not out:
        out[...] = dst
        return out
    return dst


# numpy's clip (and maximum, minimum) run a branch per element in Pyodide (no SIMD): 6-13 ms a
# 1.2M-element float32 array of sorted values, 20-37 ms of random signs (mispredicted branches;
# an add: 1 ms); the kernel's copies and f32x4 clamp do not depend on the values. Below this
# many elements numpy's call costs less than the JavaScript call.
MIN_CLIP = 4096


def clip(x: np.ndarray, lo: float, hi: float, out: np.ndarray) -> bool:
    """``out = clip(x, lo, hi)`` for C-contiguous float32 arrays of one shape (``out`` may be
    ``x``) through the kernel; False where it does not apply (nothing written then)."""
    if x.dtype != np.float32 or out.dtype != np.float32 or x.size < MIN_CLIP or \
            x.shape != out.shape or not x.flags.c_contiguous or not out.flags.c_contiguous or \
            x.ctypes.data % 4 or out.ctypes.data % 4:
        return False
    run = _driver()
    if run is None:
        return False
    try:
        run.clip(x.ctypes.data // 4, out.ctypes.data // 4, x.size, float(lo), float(hi))
    except Exception:  # its memory could not grow
        return False
    return True
