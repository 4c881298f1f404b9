"""float32 softmax attention of whole heads in one compiled job, so that a head's products
(BLAS's ``cblas_sgemm``, called from the compiled code) and its softmax pass split over
spin.py's workers without Python: ``ops.attention.attend_exp2``'s arithmetic for the heads of
an encoder (BERT: 2 x 12 heads of 128 x 128 scores a layer).

Why: attend_exp2's numpy blocks ran on parallel.py's Python threads, each block a dozen numpy
calls, each call a GIL hand-off between the calling thread and the worker, next to spin.py's
workers polling for the products' ranges (two pools on the same cores).

Per head (``head``: words below), as attend_exp2 but in one pass where it makes three:
- s = q k^T by cblas_sgemm (row-major, B transposed), q carrying scale * log2(e);
- per row: s = exp2(s) in place (clamped to [-127, 128]: 0 below 2^-126.5, inf from 2^127.5;
  a Taylor polynomial of 2^f, |f| <= 1/2, to f^7: within ~1 ulp of numpy's exp2), the row's sum
  in 16 lanes added as a tree (numpy's path sums by a BLAS product: not its bits). The IR is
  16 lanes wide, one AVX-512 register (LLVM splits it in halves on AVX2): at 8 lanes the pass
  took a third of a BERT layer's heads;
- a row sum under 2^-60, infinite or NaN sets the head's flag and ends the head (the caller
  redoes it the stable way, as attend_exp2 does a block);
- out = s v by cblas_sgemm straight into the (S, N, Dv) output, then each row times 1 / sum
  (16 columns a vector, the last Dv % 16 one at a time).

Each head is computed whole on one thread, the same way on any: the results do not depend on
the thread count. ``head`` reads one argument block of i64 words: sgemm, q, ldq, k, ldk, v,
ldv, out, ldo, scratch (S * T + S floats), flag (an i64), S, T, D, Dv; strides in floats.
``head64`` calls an ILP64 cblas_sgemm (OpenBLAS built with 64-bit integers, numpy's wheels),
``head32`` one with 32-bit integers.
"""

from __future__ import annotations

import ctypes
import math
import threading

import numpy as np

from . import ir, jit

REQUIRES = ("avx2", "fma")
_VF = "<16 x float>"
_VI = "<16 x i32>"
_FMA = "@llvm.fma.v16f32"
_LANES = 16
_WORDS = ("sgemm", "q", "ldq", "k", "ldk", "v", "ldv", "out", "ldo", "scratch", "flag",
          "S", "T", "D", "Dv")
# below this row sum of exponentials, attend_exp2 redoes the block the stable way
TINY_ROW_SUM = 2.0 ** -60
# Multiply-adds of a range (a head is one) from which the heads split over spin.py's workers:
# the float GEMM's SPIN_MACS_PER_RANGE (a hand-off to a polling worker costs ~1-3 us, a
# BERT head ~35 us of one core)
SPLIT_MACS = 1 << 20
# Multiply-adds of a call (every head's two products) from which the compiled heads take it:
# below, the argument blocks and the fork cost more than the numpy blocks (attend_exp2, one
# thread, best of 3 x 200, load 4.7: 2 x 2 heads of 16 x 16 keys, 64 K: 163 against 130 us;
# 2 x 4 heads of 32 x 32, 512 K: 161 against 208 us; BERT's layer, 24 M: 8.7 against 24 ms)
MIN_MACS = 1 << 18
# Bytes of scores (every head of a call at once, one buffer per head) from which a caller
# takes the heads in groups: a long prompt's 2 x 16 heads of 4096 x 4096 keys would need 2 GiB
SCRATCH_BYTES = 1 << 25
# CBLAS's enumerations (C ints)
_ROW_MAJOR, _NO_TRANS, _TRANS = 101, 111, 112


def _v(x: float) -> str:
    return "<" + ", ".join([f"float {ir.float_constant(x)}"] * _LANES) + ">"


def _i(x: int) -> str:
    return "<" + ", ".join([f"i32 {x}"] * _LANES) + ">"


def _exp2_ir() -> list[str]:
    """``@exp2v(<16 x float>)``: 2^x by n = rint(x), f = x - n (exact), 2^f by its Taylor
    series (f ln2)^k / k! to k = 7 (relative error < 1e-8) times 2^n from the exponent bits."""
    coeffs = [math.log(2) ** k / math.factorial(k) for k in range(8)]
    L = [f"define internal {_VF} @exp2v({_VF} %x) alwaysinline nounwind {{",
         "entry:",
         f"  %x0 = call {_VF} @llvm.maxnum.v16f32({_VF} %x, {_VF} {_v(-127.0)})",
         f"  %xc = call {_VF} @llvm.minnum.v16f32({_VF} %x0, {_VF} {_v(128.0)})",
         f"  %n = call {_VF} @llvm.rint.v16f32({_VF} %xc)",
         f"  %f = fsub {_VF} %xc, %n",
         f"  %p7 = bitcast {_VF} {_v(coeffs[7])} to {_VF}"]
    for k in range(6, -1, -1):
        L.append(f"  %p{k} = call {_VF} {_FMA}({_VF} %p{k + 1}, {_VF} %f, {_VF} {_v(coeffs[k])})")
    return L + [
        f"  %ni = fptosi {_VF} %n to {_VI}",
        f"  %nb = add {_VI} %ni, {_i(127)}",
        f"  %eb = shl {_VI} %nb, {_i(23)}",
        f"  %sc = bitcast {_VI} %eb to {_VF}",
        f"  %r = fmul {_VF} %p0, %sc",
        f"  %nan = fcmp uno {_VF} %x, %x",  # maxnum dropped the NaN: it comes back here
        f"  %y = select <16 x i1> %nan, {_VF} %x, {_VF} %r",
        f"  ret {_VF} %y",
        "}"]


def _head_ir(bits: int) -> list[str]:
    it = f"i{bits}"
    sig = (f"i32, i32, i32, {it}, {it}, {it}, float, ptr, {it}, ptr, {it}, float, ptr, {it}")

    def ints(*names: str) -> list[str]:
        return [f"  %{n}.c = trunc i64 %{n} to {it}" if bits == 32 else
                f"  %{n}.c = add i64 %{n}, 0" for n in names]

    L = [f"define void @head{bits}(ptr %a) nounwind {{",
         "entry:"]
    for i, name in enumerate(_WORDS):
        ty = "ptr" if name in ("sgemm", "q", "k", "v", "out", "scratch", "flag") else "i64"
        L += [f"  %{name}.p = getelementptr i64, ptr %a, i64 {i}",
              f"  %{name} = load {ty}, ptr %{name}.p, align 8"]
    L += ints("S", "T", "D", "Dv", "ldq", "ldk", "ldv", "ldo")
    L += ["  %ST = mul i64 %S, %T",
          "  %sums = getelementptr float, ptr %scratch, i64 %ST",
          # s = q k^T (S x T)
          f"  call void %sgemm(i32 {_ROW_MAJOR}, i32 {_NO_TRANS}, i32 {_TRANS}, {it} %S.c, "
          f"{it} %T.c, {it} %D.c, float 1.0, ptr %q, {it} %ldq.c, ptr %k, {it} %ldk.c, "
          f"float 0.0, ptr %scratch, {it} %T.c)",
          "  %T16 = and i64 %T, -16",
          "  %anyrow = icmp sgt i64 %S, 0",
          "  br i1 %anyrow, label %row, label %pv",
          "row:",
          "  %r = phi i64 [0, %entry], [%r.next, %rowok]",
          "  %ro = mul i64 %r, %T",
          "  %rp = getelementptr float, ptr %scratch, i64 %ro",
          "  %any16 = icmp sgt i64 %T16, 0",
          "  br i1 %any16, label %vec, label %vecdone",
          "vec:",
          "  %j = phi i64 [0, %row], [%j.next, %vec]",
          f"  %acc = phi {_VF} [zeroinitializer, %row], [%acc.n, %vec]",
          "  %xp = getelementptr float, ptr %rp, i64 %j",
          f"  %xv = load {_VF}, ptr %xp, align 4",
          f"  %ev = call {_VF} @exp2v({_VF} %xv)",
          f"  store {_VF} %ev, ptr %xp, align 4",
          f"  %acc.n = fadd {_VF} %acc, %ev",
          *ir.latch("j", _LANES, "jmore", "%T16", "vec", "vecdone"),
          "vecdone:",
          f"  %accf = phi {_VF} [zeroinitializer, %row], [%acc.n, %vec]",
          *ir.hsum("%accf", "%vsum"),  # the 16 lanes as a tree
          "  %anytail = icmp slt i64 %T16, %T",
          "  br i1 %anytail, label %tail, label %rowend",
          "tail:",  # the row's last T % 16 keys, one at a time
          "  %t = phi i64 [%T16, %vecdone], [%t.next, %tail]",
          "  %ts = phi float [%vsum, %vecdone], [%ts.n, %tail]",
          "  %tp = getelementptr float, ptr %rp, i64 %t",
          "  %tx = load float, ptr %tp, align 4",
          f"  %tv = insertelement {_VF} zeroinitializer, float %tx, i64 0",
          f"  %te = call {_VF} @exp2v({_VF} %tv)",
          f"  %tf = extractelement {_VF} %te, i64 0",
          "  store float %tf, ptr %tp, align 4",
          "  %ts.n = fadd float %ts, %tf",
          *ir.latch("t", 1, "tmore", "%T", "tail", "rowend"),
          "rowend:",
          "  %sum = phi float [%vsum, %vecdone], [%ts.n, %tail]",
          "  %sp = getelementptr float, ptr %sums, i64 %r",
          "  store float %sum, ptr %sp, align 4",
          f"  %big = fcmp oge float %sum, {ir.float_constant(TINY_ROW_SUM)}",
          "  %fin = fcmp olt float %sum, 0x7FF0000000000000",
          "  %ok = and i1 %big, %fin",
          "  br i1 %ok, label %rowok, label %bad",
          "rowok:",
          *ir.latch("r", 1, "rmore", "%S", "row", "pv"),
          "bad:",  # redone the stable way by the caller
          "  store i64 1, ptr %flag, align 8",
          "  ret void",
          "pv:",
          # out = s v (S x Dv), rows ldo apart
          f"  call void %sgemm(i32 {_ROW_MAJOR}, i32 {_NO_TRANS}, i32 {_NO_TRANS}, {it} %S.c, "
          f"{it} %Dv.c, {it} %T.c, float 1.0, ptr %scratch, {it} %T.c, ptr %v, {it} %ldv.c, "
          f"float 0.0, ptr %out, {it} %ldo.c)",
          "  br i1 %anyrow, label %norm, label %end",
          "norm:",
          "  %nr = phi i64 [0, %pv], [%nr.next, %normend]",
          "  %nsp = getelementptr float, ptr %sums, i64 %nr",
          "  %ns = load float, ptr %nsp, align 4",
          "  %inv = fdiv float 1.0, %ns",
          "  %oro = mul i64 %nr, %ldo",
          "  %orp = getelementptr float, ptr %out, i64 %oro",
          *ir.splat("%invv", "%inv", _VF),
          "  %D16 = and i64 %Dv, -16",
          "  %anyv = icmp sgt i64 %D16, 0",
          "  br i1 %anyv, label %nvec, label %nvecdone",
          "nvec:",  # 16 columns at a time
          "  %cv = phi i64 [0, %norm], [%cv.next, %nvec]",
          "  %ovp = getelementptr float, ptr %orp, i64 %cv",
          f"  %ovv = load {_VF}, ptr %ovp, align 4",
          f"  %owv = fmul {_VF} %ovv, %invv",
          f"  store {_VF} %owv, ptr %ovp, align 4",
          *ir.latch("cv", _LANES, "cvmore", "%D16", "nvec", "nvecdone"),
          "nvecdone:",
          "  %anyd = icmp slt i64 %D16, %Dv",
          "  br i1 %anyd, label %ncol, label %normend",
          "ncol:",  # the last Dv % 16 columns
          "  %c = phi i64 [%D16, %nvecdone], [%c.next, %ncol]",
          "  %op = getelementptr float, ptr %orp, i64 %c",
          "  %ov = load float, ptr %op, align 4",
          "  %ow = fmul float %ov, %inv",
          "  store float %ow, ptr %op, align 4",
          *ir.latch("c", 1, "cmore", "%Dv", "ncol", "normend"),
          "normend:",
          *ir.latch("nr", 1, "nmore", "%S", "norm", "end"),
          "end:",
          "  ret void",
          "}",
          f"; cblas_sgemm: void ({sig})"]
    return L


def module_ir(target=None) -> str:
    return "\n".join([
        *_exp2_ir(), *_head_ir(64), *_head_ir(32),
        f"declare {_VF} @llvm.fma.v16f32({_VF}, {_VF}, {_VF})",
        f"declare {_VF} @llvm.rint.v16f32({_VF})",
        f"declare {_VF} @llvm.minnum.v16f32({_VF}, {_VF})",
        f"declare {_VF} @llvm.maxnum.v16f32({_VF}, {_VF})"])


_JOB = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


def _module() -> jit.Module:
    return jit.compile_module("attention_heads", module_ir, {"head64": _JOB, "head32": _JOB},
                              REQUIRES)


def unavailable() -> str | None:
    """None when the kernel can run here (its object loaded), else why not."""
    return jit.why_unavailable(REQUIRES) or jit.why_not_loaded("attention_heads", _module)


def job(bits: int):
    """The compiled job for a cblas_sgemm of ``bits``-bit integers (64 or 32)."""
    module = _module()
    return module.head64 if bits == 64 else module.head32


_local = threading.local()


def _scratch(n: int) -> np.ndarray:
    """n floats of this thread's scratch, kept between calls: a new buffer of a BERT layer's
    scores (1.6 MB) was paged in afresh at every call."""
    buf = getattr(_local, "buf", None)
    if buf is None or buf.size < n:
        buf = np.empty(n, np.float32)
        if 4 * n <= SCRATCH_BYTES // 2:  # a larger one is not kept for the thread's life
            _local.buf = buf
    return buf[:n]


def _offsets(S: int, D: int, Dv: int, strides: tuple, heads: tuple,
             one_scratch: bool) -> np.ndarray:
    """head_blocks' argument blocks less the arrays' addresses (the words that point get
    offsets in bytes), for one set of shapes and strides: the same every run."""
    qs, ks, vs, os_ = ([st // 4 for st in x] for x in strides)
    T = max(hi - lo for _, _, lo, hi in heads)
    b, h, lo, hi = np.array(heads, np.int64).reshape(-1, 4).T
    n = np.arange(len(heads))
    rel = np.zeros((len(heads), len(_WORDS)), np.int64)
    rel[:, 1], rel[:, 2] = 4 * (b * qs[0] + h * qs[1]), qs[2]
    rel[:, 3], rel[:, 4] = 4 * (b * ks[0] + h * ks[1] + lo * ks[2]), ks[2]
    rel[:, 5], rel[:, 6] = 4 * (b * vs[0] + h * vs[1] + lo * vs[2]), vs[2]
    rel[:, 7], rel[:, 8] = 4 * (b * os_[0] + h * os_[2]), os_[1]
    rel[:, 9], rel[:, 10] = 0 if one_scratch else 4 * (S * T + S) * n, 8 * n
    rel[:, 11], rel[:, 12], rel[:, 13], rel[:, 14] = S, hi - lo, D, Dv
    return rel


_OFFSETS: dict[tuple, np.ndarray] = {}


def head_blocks(sgemm: int, q: np.ndarray, k: np.ndarray, v: np.ndarray, out: np.ndarray,
                heads: list[tuple[int, int, int, int]], one_scratch: bool = False
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The argument blocks (one row per head) of ``heads`` (b, h, key lo, key hi): q (B, N, S,
    D), k (B, N, T, D), v (B, N, T, Dv) float32 with unit last strides, out (B, S, N, Dv)
    C-contiguous. Returns (blocks, scratch, flags): keep all three alive while the jobs run
    (the scratch is the calling thread's, reused by its next call); flags[i] = 1 where head
    i must be redone the stable way. ``one_scratch``: every head's scores in the same buffer,
    for jobs run one after another (BERT's layer: one head's 64 KiB stays in L2, where 24
    heads' 1.6 MB went out to L3 and back, ~5% of the heads' time), else one per head."""
    S, D, Dv = q.shape[2], q.shape[3], v.shape[3]
    key = (S, D, Dv, q.strides, k.strides, v.strides, out.strides, tuple(heads), one_scratch)
    found = _OFFSETS.get(key)
    if found is None:
        if len(_OFFSETS) > 64:
            _OFFSETS.clear()
        T = max(hi - lo for _, _, lo, hi in heads)
        found = _OFFSETS[key] = (_offsets(S, D, Dv, key[3:7], key[7], one_scratch),
                                 (1 if one_scratch else len(heads)) * (S * T + S))
    rel, floats = found
    scratch = _scratch(floats)
    flags = np.zeros(len(heads), np.int64)
    # the words that point (sgemm, q, k, v, out, scratch, flag), added to the offsets
    base = np.array((sgemm, _data(q), 0, _data(k), 0, _data(v), 0, _data(out), 0,
                     jit.address(scratch), jit.address(flags), 0, 0, 0, 0), np.int64)
    return rel + base, scratch, flags


def _data(x: np.ndarray) -> int:
    """The address of a view's first element (q, k and v are strided views)."""
    return x.__array_interface__["data"][0]


BUNDLE = {"attention_heads": (module_ir, REQUIRES)}

__all__ = ["BUNDLE", "MIN_MACS", "REQUIRES", "SCRATCH_BYTES", "SPLIT_MACS", "TINY_ROW_SUM",
           "head_blocks", "job", "module_ir", "unavailable"]
