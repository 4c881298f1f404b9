"""GroupQueryAttention's float32 arithmetic as onnxruntime 1.32 computes it on x86-64 (its flash
path: group_query_attention.cc's ApplyAttentionFlash over MLAS's flashattn_gqa.cpp), operation
for operation, so that the results are onnxruntime's bit for bit. An LLM's attention output
feeds an int8-quantized product (MatMulNBits, accuracy_level 4), where a last-bit difference
grows layer by layer (compiled/nbits_gemm.py). onnxruntime takes that path whenever the total
sequence length exceeds 1 and there is no softcap, smooth softmax, head sink or QK output.

- rotary (MLAS's AVX2 rope kernel): re' = fma(re, cos, -(im * sin)),
  im' = fma(re, sin, im * cos) (``rope_rows``);
- one new token (MlasGQADecodeGQAThreaded): per query head, each score = scale * the dot
  product in 8 lanes of products added in order, the lanes added ((0+1)+(2+3)) +
  ((4+5)+(6+7)); keys before the local window at the lowest float; the maximum; MLAS's
  sum-exp kernel (MlasComputeSumExpF32KernelFma3: exp(x - max) by its polynomial, summed in 8
  lanes, element j in lane j % 8, the lanes added the same way); out = (sum over the keys in
  order of exp * v, a multiply and an add each) * (1 / sum) (``decode``);
- a prompt (MlasFlashAttentionGQAThreaded): query blocks of min(kv_block, 2 H) rows and KV
  blocks of kv_block = L2 size / (32 H) keys (sysconf's L2 cache size, as onnxruntime's Env
  reads it); per KV block the scores by MLAS's FMA3 SGEMM (each dot product a chain of fused
  multiply-adds over H from zero, in MLAS's K strides, times alpha: ``scores``), masked keys at
  the lowest float, the online-softmax step (running maximum, the sum-exp kernel, the C
  library's expf of the maximum's change to rescale the sum and the output: ``online``), then
  O += exp scores x V by the SGEMM (``pv``; a query block of one row takes MLAS's M == 1
  kernel, SgemmKernelM1Avx: products of 4 keys added in order, then to C: ``pv1``); O / sum
  at the end.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import math
import struct
import threading

import numpy as np

from . import jit, spin
from .ir import latch
from .jit import address

REQUIRES = ("avx2", "fma")

_VF = "<8 x float>"
_V8 = "<8 x i32>"
_FMA = "@llvm.fma.v8f32"

# MLAS's exp constants (compute.cpp, MlasExpConstants) as the sum-exp kernel uses them
_LOWER_SUMEXP = -88.3762626647949
_ROUNDING_BIAS = 12582912.0  # 1.5 * 2^23
_LOG2_RECIPROCAL = 1.44269504088896341
_LOG2_HIGH = -6.93145752e-1
_LOG2_LOW = -1.42860677e-6
_POLY = (float.fromhex("0x1.694000p-10"), float.fromhex("0x1.125edcp-7"),
         float.fromhex("0x1.555b5ap-5"), float.fromhex("0x1.555450p-3"),
         float.fromhex("0x1.fffff6p-2"), 1.0)
_MAX_EXPONENT = 0x3F800000
_LOWEST = float(np.finfo(np.float32).min)


def _c(x: float) -> str:
    """A float32 constant as LLVM IR writes it (the double with the float32's value)."""
    return f"0x{np.float64(np.float32(x)).view(np.uint64):016X}"


def _vc(x: float) -> str:
    return "<" + ", ".join([f"float {_c(x)}"] * 8) + ">"


def _vi(x: int) -> str:
    return "<" + ", ".join([f"i32 {x}"] * 8) + ">"


def _splat(name: str, scalar: str) -> list[str]:
    return [f"  {name}.i = insertelement {_VF} poison, float {scalar}, i64 0",
            f"  {name} = shufflevector {_VF} {name}.i, {_VF} poison, <8 x i32> zeroinitializer"]


def _lane_mask(name: str, count: str) -> list[str]:
    """``name`` (<8 x i1>): lanes below the i64 ``count``."""
    return [f"  {name}.n = trunc i64 {count} to i32",
            f"  {name}.i = insertelement {_V8} poison, i32 {name}.n, i64 0",
            f"  {name}.v = shufflevector {_V8} {name}.i, {_V8} poison, <8 x i32> "
            "zeroinitializer",
            f"  {name} = icmp slt {_V8} <i32 0, i32 1, i32 2, i32 3, i32 4, i32 5, i32 6, "
            f"i32 7>, {name}.v"]


def _rope_rows_ir() -> list[str]:
    """rope_rows(x, rows, ld, cos, sin, half, interleaved, S): the rope kernel's arithmetic in
    place on ``rows`` rows of x (ld floats apart), row r at the position of cos / sin row
    r % S (rows of half floats): pairs (i, half + i), or (2i, 2i + 1) interleaved. Heads of S
    consecutive positions, (head, position) rows."""
    return ["define void @rope_rows(ptr %x, i64 %rows, i64 %ld, ptr %cs0, ptr %sn0, i64 %half, "
            "i64 %inter, i64 %S) nounwind {",
            "entry:",
            "  %il = icmp ne i64 %inter, 0",
            "  %go0 = icmp sgt i64 %rows, 0",
            "  %go1 = icmp sgt i64 %half, 0",
            "  %go = and i1 %go0, %go1",
            "  br i1 %go, label %rloop, label %end",
            "rloop:",
            "  %r = phi i64 [0, %entry], [%r.next, %rnext]",
            "  %ro = mul i64 %r, %ld",
            "  %row = getelementptr float, ptr %x, i64 %ro",
            "  %rs = urem i64 %r, %S",  # the row's position: cos / sin row r % S
            "  %co = mul i64 %rs, %half",
            "  %cs = getelementptr float, ptr %cs0, i64 %co",
            "  %sn = getelementptr float, ptr %sn0, i64 %co",
            "  br label %iloop",
            "iloop:",
            "  %i = phi i64 [0, %rloop], [%i.next, %iloop]",
            "  %i2 = shl i64 %i, 1",
            "  %i2b = add i64 %i2, 1",
            "  %ih = add i64 %i, %half",
            "  %ja = select i1 %il, i64 %i2, i64 %i",
            "  %jb = select i1 %il, i64 %i2b, i64 %ih",
            "  %pa = getelementptr float, ptr %row, i64 %ja",
            "  %pb = getelementptr float, ptr %row, i64 %jb",
            "  %re = load float, ptr %pa, align 4",
            "  %im = load float, ptr %pb, align 4",
            "  %cp = getelementptr float, ptr %cs, i64 %i",
            "  %c = load float, ptr %cp, align 4",
            "  %sp = getelementptr float, ptr %sn, i64 %i",
            "  %s = load float, ptr %sp, align 4",
            "  %is = fmul float %im, %s",
            "  %nis = fneg float %is",
            "  %ore = call float @llvm.fma.f32(float %re, float %c, float %nis)",
            "  %ic = fmul float %im, %c",
            "  %oim = call float @llvm.fma.f32(float %re, float %s, float %ic)",
            "  store float %ore, ptr %pa, align 4",
            "  store float %oim, ptr %pb, align 4",
            *latch("i", "1", "imore", "%half", "iloop", "rnext"),
            "rnext:",
            *latch("r", "1", "rmore", "%rows", "rloop", "end"),
            "end:",
            "  ret void",
            "}"]


def _scores_ir() -> list[str]:
    """scores(qt, k, out, tl, nblk, M8, H, ldk, ks, alpha, heads, sq, sk, so, ldo): per head
    and block of 8 query rows (qt: [H][M8], the rows transposed), for each of the block's
    tl[b] keys (k rows ldk apart), the 8 dot products as chains of fused multiply-adds over
    H in strides of ks (MLAS's SGEMM with B transposed; the query rows in the vector lanes,
    so each lane's chain is one dot product), the first stride times alpha, the others
    fma(sum, alpha, C); stored into the rows of out (ldo apart). Four keys at a time."""
    L = ["define void @scores(ptr %qt, ptr %k, ptr %out, ptr %tl, i64 %nblk, i64 %M8, "
         "i64 %H, i64 %ldk, i64 %ks, float %alpha, i64 %heads, i64 %sq, i64 %sk, i64 %so, "
         "i64 %ldo) nounwind {",
         "entry:",
         *_splat("%va", "%alpha"),
         "  %anyh = icmp sgt i64 %heads, 0",
         "  %anyb = icmp sgt i64 %nblk, 0",
         "  %go = and i1 %anyh, %anyb",
         "  br i1 %go, label %hloop, label %end",
         "hloop:",
         "  %hd = phi i64 [0, %entry], [%hd.next, %hnext]",
         "  %qo = mul i64 %hd, %sq",
         "  %qh = getelementptr float, ptr %qt, i64 %qo",
         "  %ko = mul i64 %hd, %sk",
         "  %kh = getelementptr float, ptr %k, i64 %ko",
         "  %oo = mul i64 %hd, %so",
         "  %oh = getelementptr float, ptr %out, i64 %oo",
         "  br label %bloop",
         "bloop:",
         "  %b = phi i64 [0, %hloop], [%b.next, %bnext]",
         "  %tlp = getelementptr i64, ptr %tl, i64 %b",
         "  %T = load i64, ptr %tlp, align 8",
         "  %m0 = shl i64 %b, 3",
         "  %qb = getelementptr float, ptr %qh, i64 %m0",
         "  %T4 = and i64 %T, -4",
         "  %any4 = icmp sgt i64 %T4, 0",
         "  br i1 %any4, label %g4.top, label %g4.done"]

    def group(J: int, p: str, t0: str, first: str, back: str, done: str) -> list[str]:
        """Keys t .. t + J - 1 from label {p}.top (t from phi: first at entry, +J at back)."""
        accs = [f"%{p}.acc{j}" for j in range(J)]
        Cs = [f"%{p}.C{j}" for j in range(J)]
        G = [f"{p}.top:",
             f"  %{p}.t = phi i64 [{t0}, %{first}], [%{p}.t.next, %{p}.kbnext.end]"]
        for j in range(J):
            G += [f"  %{p}.tj{j} = add i64 %{p}.t, {j}",
                  f"  %{p}.ko{j} = mul i64 %{p}.tj{j}, %ldk",
                  f"  %{p}.kp{j} = getelementptr float, ptr %kh, i64 %{p}.ko{j}"]
        G += [f"  br label %{p}.kb",
              f"{p}.kb:",
              f"  %{p}.kb0 = phi i64 [0, %{p}.top], [%{p}.kb1, %{p}.kbnext]"]
        for j in range(J):
            G.append(f"  {Cs[j]} = phi {_VF} [zeroinitializer, %{p}.top], "
                     f"[{Cs[j]}.n, %{p}.kbnext]")
        G += [f"  %{p}.he0 = add i64 %{p}.kb0, %ks",
              f"  %{p}.hlt = icmp slt i64 %{p}.he0, %H",
              f"  %{p}.he = select i1 %{p}.hlt, i64 %{p}.he0, i64 %H",
              f"  br label %{p}.h",
              f"{p}.h:",
              f"  %{p}.hh = phi i64 [%{p}.kb0, %{p}.kb], [%{p}.hh.next, %{p}.h]"]
        for j in range(J):
            G.append(f"  {accs[j]} = phi {_VF} [zeroinitializer, %{p}.kb], "
                     f"[{accs[j]}.n, %{p}.h]")
        G += [f"  %{p}.qo = mul i64 %{p}.hh, %M8",
              f"  %{p}.qp = getelementptr float, ptr %qb, i64 %{p}.qo",
              f"  %{p}.q = load {_VF}, ptr %{p}.qp, align 4"]
        for j in range(J):
            G += [f"  %{p}.kx{j}p = getelementptr float, ptr %{p}.kp{j}, i64 %{p}.hh",
                  f"  %{p}.kx{j} = load float, ptr %{p}.kx{j}p, align 4",
                  *_splat(f"%{p}.kv{j}", f"%{p}.kx{j}"),
                  f"  {accs[j]}.n = call {_VF} {_FMA}({_VF} %{p}.q, {_VF} %{p}.kv{j}, "
                  f"{_VF} {accs[j]})"]
        G += [*latch(f"{p}.hh", "1", f"{p}.hmore", f"%{p}.he", f"{p}.h", f"{p}.kbnext"),
              f"{p}.kbnext:",
              f"  %{p}.isfirst = icmp eq i64 %{p}.kb0, 0"]
        for j in range(J):
            G += [f"  %{p}.z{j} = fmul {_VF} {accs[j]}.n, %va",
                  f"  %{p}.f{j} = call {_VF} {_FMA}({_VF} {accs[j]}.n, {_VF} %va, "
                  f"{_VF} {Cs[j]})",
                  f"  {Cs[j]}.n = select i1 %{p}.isfirst, {_VF} %{p}.z{j}, {_VF} %{p}.f{j}"]
        G += [f"  %{p}.kb1 = add i64 %{p}.kb0, %ks",
              f"  %{p}.kbmore = icmp slt i64 %{p}.kb1, %H",
              f"  br i1 %{p}.kbmore, label %{p}.kb, label %{p}.kbnext.end",
              f"{p}.kbnext.end:"]
        for j in range(J):  # lane i is query row m0 + i: out[(m0 + i) * ldo + t + j]
            for i in range(8):
                G += [f"  %{p}.e{j}_{i} = extractelement {_VF} {Cs[j]}.n, i64 {i}",
                      f"  %{p}.r{j}_{i} = add i64 %m0, {i}",
                      f"  %{p}.ro{j}_{i} = mul i64 %{p}.r{j}_{i}, %ldo",
                      f"  %{p}.o{j}_{i} = add i64 %{p}.ro{j}_{i}, %{p}.tj{j}",
                      f"  %{p}.op{j}_{i} = getelementptr float, ptr %oh, i64 %{p}.o{j}_{i}",
                      f"  store float %{p}.e{j}_{i}, ptr %{p}.op{j}_{i}, align 4"]
        G += latch(f"{p}.t", J, f"{p}.more", back, f"{p}.top", done)
        return G

    L += group(4, "g4", "0", "bloop", "%T4", "g4.done")
    L += ["g4.done:",
          "  %anyr = icmp slt i64 %T4, %T",
          "  br i1 %anyr, label %g1.top, label %bnext"]
    L += group(1, "g1", "%T4", "g4.done", "%T", "bnext")
    L += ["bnext:",
          *latch("b", "1", "bmore", "%nblk", "bloop", "hnext"),
          "hnext:",
          *latch("hd", "1", "hmore", "%heads", "hloop", "end"),
          "end:",
          "  ret void",
          "}"]
    return L


def _exp_ir(v: str, x: str) -> list[str]:
    """%{v}.e = MLAS's sum-exp kernel's exp of the <8 x float> ``x`` (already x - max)."""
    return [f"  %{v}.lt = fcmp ogt {_VF} {_vc(_LOWER_SUMEXP)}, {x}",  # vmaxps(lower, x)
            f"  %{v}.x0 = select <8 x i1> %{v}.lt, {_VF} {_vc(_LOWER_SUMEXP)}, {_VF} {x}",
            f"  %{v}.bi = call {_VF} {_FMA}({_VF} %{v}.x0, {_VF} {_vc(_LOG2_RECIPROCAL)}, "
            f"{_VF} {_vc(_ROUNDING_BIAS)})",
            f"  %{v}.m = fsub {_VF} %{v}.bi, {_vc(_ROUNDING_BIAS)}",
            f"  %{v}.x1 = call {_VF} {_FMA}({_VF} %{v}.m, {_VF} {_vc(_LOG2_HIGH)}, "
            f"{_VF} %{v}.x0)",
            f"  %{v}.x = call {_VF} {_FMA}({_VF} %{v}.m, {_VF} {_vc(_LOG2_LOW)}, "
            f"{_VF} %{v}.x1)",
            f"  %{v}.p1 = call {_VF} {_FMA}({_VF} {_vc(_POLY[0])}, {_VF} %{v}.x, "
            f"{_VF} {_vc(_POLY[1])})",
            f"  %{v}.p2 = call {_VF} {_FMA}({_VF} %{v}.p1, {_VF} %{v}.x, {_VF} {_vc(_POLY[2])})",
            f"  %{v}.p3 = call {_VF} {_FMA}({_VF} %{v}.p2, {_VF} %{v}.x, {_VF} {_vc(_POLY[3])})",
            f"  %{v}.p4 = call {_VF} {_FMA}({_VF} %{v}.p3, {_VF} %{v}.x, {_VF} {_vc(_POLY[4])})",
            f"  %{v}.p5 = call {_VF} {_FMA}({_VF} %{v}.p4, {_VF} %{v}.x, {_VF} {_vc(_POLY[5])})",
            f"  %{v}.p6 = call {_VF} {_FMA}({_VF} %{v}.p5, {_VF} %{v}.x, {_VF} {_vc(_POLY[5])})",
            f"  %{v}.bb = bitcast {_VF} %{v}.bi to {_V8}",
            f"  %{v}.sh = shl {_V8} %{v}.bb, {_vi(23)}",
            f"  %{v}.nb = add {_V8} %{v}.sh, {_vi(_MAX_EXPONENT)}",
            f"  %{v}.nf = bitcast {_V8} %{v}.nb to {_VF}",
            f"  %{v}.e = fmul {_VF} %{v}.p6, %{v}.nf"]


def _sumexp_ir() -> list[str]:
    """@sumexp(p, n, negmax): MlasComputeSumExpF32KernelFma3 in place: p[j] = exp(p[j] +
    negmax), returned summed in 8 lanes (element j in lane j % 8; a partial vector's unused
    lanes read 0 with a maximum of 0, their exp masked to 0), the lanes added
    ((0+1)+(2+3)) + ((4+5)+(6+7)). An internal function."""
    return ["define internal float @sumexp(ptr %p, i64 %n, float %negmax) alwaysinline "
            "nounwind {",
            "entry:",
            *_splat("%vneg", "%negmax"),
            "  %n8 = and i64 %n, -8",
            "  %any8 = icmp sgt i64 %n8, 0",
            "  br i1 %any8, label %eloop, label %edone",
            "eloop:",
            "  %ei = phi i64 [0, %entry], [%ei.next, %eloop]",
            f"  %acc = phi {_VF} [zeroinitializer, %entry], [%acc.n, %eloop]",
            "  %ep = getelementptr float, ptr %p, i64 %ei",
            f"  %ev = load {_VF}, ptr %ep, align 4",
            f"  %ex = fadd {_VF} %vneg, %ev",
            *_exp_ir("x", "%ex"),
            f"  store {_VF} %x.e, ptr %ep, align 4",
            f"  %acc.n = fadd {_VF} %acc, %x.e",
            *latch("ei", "8", "emore", "%n8", "eloop", "edone"),
            "edone:",
            f"  %acc.d = phi {_VF} [zeroinitializer, %entry], [%acc.n, %eloop]",
            "  %rem = sub i64 %n, %n8",
            "  %anyrem = icmp sgt i64 %rem, 0",
            "  br i1 %anyrem, label %tail, label %reduce",
            "tail:",
            *_lane_mask("%tm", "%rem"),
            "  %tp = getelementptr float, ptr %p, i64 %n8",
            f"  %tv = call {_VF} @llvm.masked.load.v8f32.p0(ptr %tp, i32 4, <8 x i1> %tm, "
            f"{_VF} zeroinitializer)",
            f"  %tneg = select <8 x i1> %tm, {_VF} %vneg, {_VF} zeroinitializer",
            f"  %tx = fadd {_VF} %tneg, %tv",
            *_exp_ir("y", "%tx"),
            f"  %ye = select <8 x i1> %tm, {_VF} %y.e, {_VF} zeroinitializer",
            f"  %acc.t = fadd {_VF} %acc.d, %ye",
            f"  call void @llvm.masked.store.v8f32.p0({_VF} %ye, ptr %tp, i32 4, "
            "<8 x i1> %tm)",
            "  br label %reduce",
            "reduce:",
            f"  %a = phi {_VF} [%acc.d, %edone], [%acc.t, %tail]",
            *_tree("%a", "%sum"),
            "  ret float %sum",
            "}"]


def _tree(v: str, out: str) -> list[str]:
    """``out`` = ((v0 + v1) + (v2 + v3)) + ((v4 + v5) + (v6 + v7)) of the <8 x float> ``v``."""
    t = out + "."
    return [*[f"  {t}{i} = extractelement {_VF} {v}, i64 {i}" for i in range(8)],
            f"  {t}01 = fadd float {t}0, {t}1",
            f"  {t}23 = fadd float {t}2, {t}3",
            f"  {t}45 = fadd float {t}4, {t}5",
            f"  {t}67 = fadd float {t}6, {t}7",
            f"  {t}lo = fadd float {t}01, {t}23",
            f"  {t}hi = fadd float {t}45, {t}67",
            f"  {out} = fadd float {t}lo, {t}hi"]


def _rowmax_ir(p: str, n: str, out: str, first: str) -> list[str]:
    """``out``: the maximum of the ``n`` floats at ``p`` (from lowest; the order does not
    matter); labels {out}.loop / {out}.done, entered from block ``first``."""
    t = out[1:]
    return [f"  br label %{t}.loop",
            f"{t}.loop:",
            f"  %{t}.i = phi i64 [0, %{first}], [%{t}.i.next, %{t}.loop]",
            f"  %{t}.m = phi float [{_c(_LOWEST)}, %{first}], [{out}, %{t}.loop]",
            f"  %{t}.p = getelementptr float, ptr {p}, i64 %{t}.i",
            f"  %{t}.v = load float, ptr %{t}.p, align 4",
            f"  %{t}.lt = fcmp olt float %{t}.m, %{t}.v",  # std::max(m, v)
            f"  {out} = select i1 %{t}.lt, float %{t}.v, float %{t}.m",
            *latch(f"{t}.i", "1", f"{t}.more", n, f"{t}.loop", f"{t}.done"),
            f"{t}.done:"]


def _vrowmax_ir(p: str, n: str, out: str, first: str) -> list[str]:
    """``out``: the maximum of the ``n`` (>= 1) floats at ``p`` as _rowmax_ir's, in 8 lanes
    (std::max(m, v) per lane from lowest, the rest one at a time, then the lanes': the order
    does not matter); entered from block ``first``, on in block {out}.done."""
    t = out[1:]
    low = _vc(_LOWEST)
    return [f"  %{t}.n8 = and i64 {n}, -8",
            f"  %{t}.any8 = icmp sgt i64 %{t}.n8, 0",
            f"  br i1 %{t}.any8, label %{t}.vl, label %{t}.vd",
            f"{t}.vl:",
            f"  %{t}.vi = phi i64 [0, %{first}], [%{t}.vi.next, %{t}.vl]",
            f"  %{t}.vm = phi {_VF} [{low}, %{first}], [%{t}.vm.n, %{t}.vl]",
            f"  %{t}.vp = getelementptr float, ptr {p}, i64 %{t}.vi",
            f"  %{t}.vv = load {_VF}, ptr %{t}.vp, align 4",
            f"  %{t}.vlt = fcmp olt {_VF} %{t}.vm, %{t}.vv",
            f"  %{t}.vm.n = select <8 x i1> %{t}.vlt, {_VF} %{t}.vv, {_VF} %{t}.vm",
            *latch(f"{t}.vi", "8", f"{t}.vmore", f"%{t}.n8", f"{t}.vl", f"{t}.vd"),
            f"{t}.vd:",
            f"  %{t}.vf = phi {_VF} [{low}, %{first}], [%{t}.vm.n, %{t}.vl]",
            *[f"  %{t}.e{i} = extractelement {_VF} %{t}.vf, i64 {i}" for i in range(8)],
            *[line for i in range(1, 8) for line in (
                f"  %{t}.c{i} = fcmp olt float {f'%{t}.m{i - 1}' if i > 1 else f'%{t}.e0'}, "
                f"%{t}.e{i}",
                f"  %{t}.m{i} = select i1 %{t}.c{i}, float %{t}.e{i}, "
                f"float {f'%{t}.m{i - 1}' if i > 1 else f'%{t}.e0'}")],
            f"  %{t}.anyr = icmp slt i64 %{t}.n8, {n}",
            f"  br i1 %{t}.anyr, label %{t}.sl, label %{t}.done",
            f"{t}.sl:",
            f"  %{t}.si = phi i64 [%{t}.n8, %{t}.vd], [%{t}.si.next, %{t}.sl]",
            f"  %{t}.sm = phi float [%{t}.m7, %{t}.vd], [%{t}.sm.n, %{t}.sl]",
            f"  %{t}.sp = getelementptr float, ptr {p}, i64 %{t}.si",
            f"  %{t}.sv = load float, ptr %{t}.sp, align 4",
            f"  %{t}.slt = fcmp olt float %{t}.sm, %{t}.sv",
            f"  %{t}.sm.n = select i1 %{t}.slt, float %{t}.sv, float %{t}.sm",
            *latch(f"{t}.si", "1", f"{t}.smore", n, f"{t}.sl", f"{t}.done"),
            f"{t}.done:",
            f"  {out} = phi float [%{t}.m7, %{t}.vd], [%{t}.sm.n, %{t}.sl]"]


def _online_ir() -> list[str]:
    """online(sc, rows, R, cnt, st, m, l, O, H, first, expf): one KV block's online-softmax
    step of MlasFlashAttentionGQA for each row r of scores (rows R floats apart; its first
    cnt[r] keys, those before the causal limit, the first st[r] of them, before a local
    window, set to the lowest float; the keys after the limit only add exps of exactly 0
    there): a row with nothing unmasked
    becomes zeros; else the running maximum m[r] = max(m[r], row max), the row replaced by
    exp(x - m[r]) (@sumexp) whose sum s gives l[r] = s on the first block, else l[r] = e *
    l[r] + s and O[r] (H floats) times e, e = expf(old m - new m) (``expf``: the C
    library's, as std::exp)."""
    return ["define void @online(ptr %sc, i64 %rows, i64 %R, ptr %cnt, ptr %st, ptr %m, ptr %l, "
            "ptr %O, i64 %H, i64 %first, ptr %expf) nounwind {",
            "entry:",
            "  %isfirst = icmp ne i64 %first, 0",
            "  %anyrow = icmp sgt i64 %rows, 0",
            "  br i1 %anyrow, label %rloop, label %end",
            "rloop:",
            "  %r = phi i64 [0, %entry], [%r.next, %rnext]",
            "  %ro = mul i64 %r, %R",
            "  %row = getelementptr float, ptr %sc, i64 %ro",
            "  %np = getelementptr i64, ptr %cnt, i64 %r",
            "  %n = load i64, ptr %np, align 8",
            "  %anyn = icmp sgt i64 %n, 0",
            "  br i1 %anyn, label %hasn, label %rnext",
            "hasn:",  # the first st[r] keys, before the local window, at the lowest float
            "  %stp = getelementptr i64, ptr %st, i64 %r",
            "  %ns = load i64, ptr %stp, align 8",
            "  %anys = icmp sgt i64 %ns, 0",
            "  br i1 %anys, label %wloop, label %wdone",
            "wloop:",
            "  %w = phi i64 [0, %hasn], [%w.next, %wloop]",
            "  %wp = getelementptr float, ptr %row, i64 %w",
            f"  store float {_c(_LOWEST)}, ptr %wp, align 4",
            *latch("w", "1", "wmore", "%ns", "wloop", "wdone"),
            "wdone:",
            *_rowmax_ir("%row", "%n", "%mx", "wdone"),
            f"  %none = fcmp oeq float %mx, {_c(_LOWEST)}",
            "  br i1 %none, label %zloop, label %upd",
            "zloop:",
            "  %z = phi i64 [0, %mx.done], [%z.next, %zloop]",
            "  %zp = getelementptr float, ptr %row, i64 %z",
            "  store float 0.0, ptr %zp, align 4",
            *latch("z", "1", "zmore", "%n", "zloop", "rnext"),
            "upd:",
            "  %mp = getelementptr float, ptr %m, i64 %r",
            "  %mo = load float, ptr %mp, align 4",
            "  %mlt = fcmp olt float %mo, %mx",
            "  %mn = select i1 %mlt, float %mx, float %mo",
            "  store float %mn, ptr %mp, align 4",
            "  %md = fsub float %mo, %mn",
            "  %negmax = fneg float %mn",
            "  %s = call float @sumexp(ptr %row, i64 %n, float %negmax)",
            "  %lp = getelementptr float, ptr %l, i64 %r",
            "  br i1 %isfirst, label %lfirst, label %lnext",
            "lfirst:",
            "  store float %s, ptr %lp, align 4",
            "  br label %rnext",
            "lnext:",
            "  %ed = call float %expf(float %md)",
            "  %lo = load float, ptr %lp, align 4",
            "  %el = fmul float %ed, %lo",
            "  %ln = fadd float %el, %s",
            "  store float %ln, ptr %lp, align 4",
            "  %oo = mul i64 %r, %H",
            "  %orow = getelementptr float, ptr %O, i64 %oo",
            "  br label %oloop",
            "oloop:",
            "  %oi = phi i64 [0, %lnext], [%oi.next, %oloop]",
            "  %op = getelementptr float, ptr %orow, i64 %oi",
            "  %ov = load float, ptr %op, align 4",
            "  %ox = fmul float %ov, %ed",
            "  store float %ox, ptr %op, align 4",
            *latch("oi", "1", "omore", "%H", "oloop", "rnext"),
            "rnext:",
            *latch("r", "1", "rmore", "%rows", "rloop", "end"),
            "end:",
            "  ret void",
            "}"]


def _tree4_ir(p: str, accs: list[str]) -> list[str]:
    """Four keys' scores t .. t + 3 from their accumulators (``_tree``'s additions for each:
    ((0+1)+(2+3)) + ((4+5)+(6+7)), as lane-wise additions of shuffled pairs), times the
    scale, those before ws at the lowest float, stored at sc + t."""
    V4 = "<4 x float>"
    ev = "<8 x i32> <i32 0, i32 2, i32 4, i32 6, i32 8, i32 10, i32 12, i32 14>"
    od = "<8 x i32> <i32 1, i32 3, i32 5, i32 7, i32 9, i32 11, i32 13, i32 15>"
    G = []
    for name, (a, b) in (("s01", accs[:2]), ("s23", accs[2:])):  # pairs of lanes
        G += [f"  %{p}.{name}e = shufflevector {_VF} {a}, {_VF} {b}, {ev}",
              f"  %{p}.{name}o = shufflevector {_VF} {a}, {_VF} {b}, {od}",
              f"  %{p}.{name} = fadd {_VF} %{p}.{name}e, %{p}.{name}o"]
    G += [f"  %{p}.qe = shufflevector {_VF} %{p}.s01, {_VF} %{p}.s23, {ev}",  # halves
          f"  %{p}.qo = shufflevector {_VF} %{p}.s01, {_VF} %{p}.s23, {od}",
          f"  %{p}.qs = fadd {_VF} %{p}.qe, %{p}.qo",
          f"  %{p}.de = shufflevector {_VF} %{p}.qs, {_VF} poison, "
          "<4 x i32> <i32 0, i32 2, i32 4, i32 6>",
          f"  %{p}.do = shufflevector {_VF} %{p}.qs, {_VF} poison, "
          "<4 x i32> <i32 1, i32 3, i32 5, i32 7>",
          f"  %{p}.dots = fadd {V4} %{p}.de, %{p}.do",
          f"  %{p}.sc.i = insertelement {V4} poison, float %scale, i64 0",
          f"  %{p}.sc4 = shufflevector {V4} %{p}.sc.i, {V4} poison, <4 x i32> zeroinitializer",
          f"  %{p}.sv = fmul {V4} %{p}.dots, %{p}.sc4",
          f"  %{p}.t.i = insertelement <4 x i64> poison, i64 %{p}.t, i64 0",
          f"  %{p}.t4 = shufflevector <4 x i64> %{p}.t.i, <4 x i64> poison, "
          "<4 x i32> zeroinitializer",
          f"  %{p}.tv = add <4 x i64> %{p}.t4, <i64 0, i64 1, i64 2, i64 3>",
          f"  %{p}.ws.i = insertelement <4 x i64> poison, i64 %ws, i64 0",
          f"  %{p}.ws4 = shufflevector <4 x i64> %{p}.ws.i, <4 x i64> poison, "
          "<4 x i32> zeroinitializer",
          f"  %{p}.msk = icmp slt <4 x i64> %{p}.tv, %{p}.ws4",
          f"  %{p}.svm = select <4 x i1> %{p}.msk, {V4} <float {_c(_LOWEST)}, float "
          f"{_c(_LOWEST)}, float {_c(_LOWEST)}, float {_c(_LOWEST)}>, {V4} %{p}.sv",
          f"  %{p}.scp = getelementptr float, ptr %sc, i64 %{p}.t",
          f"  store {V4} %{p}.svm, ptr %{p}.scp, align 4"]
    return G


def _dots_ir(J: int, p: str, t0: str, first: str, back: str, done: str) -> list[str]:
    """The decode kernel's scores of keys t .. t + J - 1 at once (from label {p}.top, t from
    ``t0`` entered from ``first``, on while below ``back``): each key's dot product with the
    head's query its own chain (8 lanes of products added in order over H, the lanes added
    as a tree), J chains interleaved; times the scale, keys before ws at the lowest float."""
    G = [f"{p}.top:",
         f"  %{p}.t = phi i64 [{t0}, %{first}], [%{p}.t.next, %{p}.end]"]
    for j in range(J):
        G += [f"  %{p}.tj{j} = add i64 %{p}.t, {j}",
              f"  %{p}.kro{j} = mul i64 %{p}.tj{j}, %H",
              f"  %{p}.krow{j} = getelementptr float, ptr %kh, i64 %{p}.kro{j}"]
    G += [f"  br label %{p}.d",
          f"{p}.d:",
          f"  %{p}.dd = phi i64 [0, %{p}.top], [%{p}.dd.next, %{p}.d]"]
    G += [f"  %{p}.acc{j} = phi {_VF} [zeroinitializer, %{p}.top], [%{p}.acc{j}.n, %{p}.d]"
          for j in range(J)]
    G += [f"  %{p}.qp = getelementptr float, ptr %qh, i64 %{p}.dd",
          f"  %{p}.qv = load {_VF}, ptr %{p}.qp, align 4"]
    for j in range(J):
        G += [f"  %{p}.kp{j} = getelementptr float, ptr %{p}.krow{j}, i64 %{p}.dd",
              f"  %{p}.kv{j} = load {_VF}, ptr %{p}.kp{j}, align 4",
              f"  %{p}.pr{j} = fmul {_VF} %{p}.qv, %{p}.kv{j}",
              f"  %{p}.acc{j}.n = fadd {_VF} %{p}.acc{j}, %{p}.pr{j}"]
    G += [*latch(f"{p}.dd", "8", f"{p}.dmore", "%H", f"{p}.d", f"{p}.end"),
          f"{p}.end:"]
    if J == 4:  # the four trees at once: the same additions, lanes paired by shuffles
        return G + _tree4_ir(p, [f"%{p}.acc{j}.n" for j in range(4)]) + latch(
            f"{p}.t", J, f"{p}.more", back, f"{p}.top", done)
    for j in range(J):
        G += [*_tree(f"%{p}.acc{j}.n", f"%{p}.dot{j}"),
              f"  %{p}.sv{j} = fmul float %{p}.dot{j}, %scale",
              f"  %{p}.msk{j} = icmp slt i64 %{p}.tj{j}, %ws",
              f"  %{p}.svm{j} = select i1 %{p}.msk{j}, float {_c(_LOWEST)}, "
              f"float %{p}.sv{j}",
              f"  %{p}.scp{j} = getelementptr float, ptr %sc, i64 %{p}.tj{j}",
              f"  store float %{p}.svm{j}, ptr %{p}.scp{j}, align 4"]
    return G + latch(f"{p}.t", J, f"{p}.more", back, f"{p}.top", done)


def _decode_ir() -> list[str]:
    """decode(q, k, v, out, sc, n0, N, G, T, H, sk, sv, scale, ws, raw, ml):
    MlasGQADecodeGQAThreaded for one sequence: per query head n in [n0, N), one of its tasks
    (q and out rows of H floats; kv head n / G: k and v rows
    of H floats, heads sk / sv floats apart), scores[t] = scale * (8 lanes of products added
    in order, the lanes added as a tree) into ``sc`` (T floats), the keys before ws at the
    lowest float, @sumexp after the maximum, then out = (sum over t in order of sc[t] * v[t],
    a multiply and an add each) * (1 / sum). H a multiple of 8."""
    L = ["define void @decode(ptr %q, ptr %k, ptr %v, ptr %out, ptr %sc, i64 %n0, i64 %N, "
         "i64 %G, i64 %T, i64 %H, i64 %sk, i64 %sv, float %scale, i64 %ws, i64 %raw, "
         "ptr %ml) nounwind {",
         "entry:",
         "  %israw = icmp ne i64 %raw, 0",
         "  %nv = lshr i64 %H, 3",
         "  %nv4 = and i64 %nv, -4",
         "  %nv8 = and i64 %nv, -8",
         "  %any8 = icmp sgt i64 %nv8, 0",
         "  %anyn = icmp slt i64 %n0, %N",
         "  br i1 %anyn, label %hloop, label %end",
         "hloop:",
         "  %n = phi i64 [%n0, %entry], [%n.next, %hnext]",
         "  %kvh = udiv i64 %n, %G",
         "  %ko = mul i64 %kvh, %sk",
         "  %kh = getelementptr float, ptr %k, i64 %ko",
         "  %vo = mul i64 %kvh, %sv",
         "  %vh = getelementptr float, ptr %v, i64 %vo",
         "  %qo = mul i64 %n, %H",
         "  %qh = getelementptr float, ptr %q, i64 %qo",
         "  %oh = getelementptr float, ptr %out, i64 %qo",
         "  %T4 = and i64 %T, -4",
         "  %anyt4 = icmp sgt i64 %T4, 0",
         "  br i1 %anyt4, label %k4.top, label %k4.done",
         *_dots_ir(4, "k4", "0", "hloop", "%T4", "k4.done"),
         "k4.done:",
         "  %anyt1 = icmp slt i64 %T4, %T",
         "  br i1 %anyt1, label %k1.top, label %smax",
         *_dots_ir(1, "k1", "%T4", "k4.done", "%T", "smax"),
         "smax:",
         *_vrowmax_ir("%sc", "%T", "%mx", "smax"),
         f"  %none = fcmp oeq float %mx, {_c(_LOWEST)}",
         "  %negmax = fneg float %mx",
         "  %mlo = shl i64 %n, 1",
         "  %mlp = getelementptr float, ptr %ml, i64 %mlo",
         "  %mlp1 = getelementptr float, ptr %mlp, i64 1",
         "  br i1 %none, label %zero, label %norm",
         "zero:",  # every key masked: zeros (a split's chunk: maximum lowest, sum 0)
         "  br i1 %israw, label %zml, label %zloop",
         "zml:",
         f"  store float {_c(_LOWEST)}, ptr %mlp, align 4",
         "  store float 0.0, ptr %mlp1, align 4",
         "  br label %zloop",
         "zloop:",
         "  %zi = phi i64 [0, %zero], [0, %zml], [%zi.next, %zloop]",
         "  %zp = getelementptr float, ptr %oh, i64 %zi",
         "  store float 0.0, ptr %zp, align 4",
         *latch("zi", "1", "zmore", "%H", "zloop", "hnext"),
         "norm:",
         "  %sum = call float @sumexp(ptr %sc, i64 %T, float %negmax)",
         "  %pos = fcmp ogt float %sum, 0.0",
         "  %inv0 = fdiv float 1.0, %sum",
         "  %inv1 = select i1 %pos, float %inv0, float 0.0",
         # a split's chunk (raw): its maximum and sum kept, the output not normalized
         "  %inv = select i1 %israw, float 1.0, float %inv1",
         "  br i1 %israw, label %nml, label %nml.done",
         "nml:",
         "  store float %mx, ptr %mlp, align 4",
         "  store float %sum, ptr %mlp1, align 4",
         "  br label %nml.done",
         "nml.done:",
         *_splat("%vinv", "%inv"),
         "  br i1 %any8, label %c8.top, label %c8.done"]

    def chunk(W: int, p: str, j0: str, first: str, back: str, done: str) -> list[str]:
        G = [f"{p}.top:",
             f"  %{p}.j = phi i64 [{j0}, %{first}], [%{p}.j.next, %{p}.st]",
             f"  br label %{p}.t",
             f"{p}.t:",
             f"  %{p}.tt = phi i64 [0, %{p}.top], [%{p}.tt.next, %{p}.t]"]
        G += [f"  %{p}.a{w} = phi {_VF} [zeroinitializer, %{p}.top], [%{p}.a{w}.n, %{p}.t]"
              for w in range(W)]
        G += [f"  %{p}.pp = getelementptr float, ptr %sc, i64 %{p}.tt",
              f"  %{p}.px = load float, ptr %{p}.pp, align 4",
              *_splat(f"%{p}.pv", f"%{p}.px"),
              f"  %{p}.vr = mul i64 %{p}.tt, %H"]
        for w in range(W):
            G += [f"  %{p}.c{w} = add i64 %{p}.j, {w}",
                  f"  %{p}.c8{w} = shl i64 %{p}.c{w}, 3",
                  f"  %{p}.x{w} = add i64 %{p}.vr, %{p}.c8{w}",
                  f"  %{p}.vp{w} = getelementptr float, ptr %vh, i64 %{p}.x{w}",
                  f"  %{p}.v{w} = load {_VF}, ptr %{p}.vp{w}, align 4",
                  f"  %{p}.m{w} = fmul {_VF} %{p}.pv, %{p}.v{w}",
                  f"  %{p}.a{w}.n = fadd {_VF} %{p}.a{w}, %{p}.m{w}"]
        G += [*latch(f"{p}.tt", "1", f"{p}.tmore", "%T", f"{p}.t", f"{p}.st"),
              f"{p}.st:"]
        for w in range(W):
            G += [f"  %{p}.r{w} = fmul {_VF} %{p}.a{w}.n, %vinv",
                  f"  %{p}.o{w} = getelementptr float, ptr %oh, i64 %{p}.c8{w}",
                  f"  store {_VF} %{p}.r{w}, ptr %{p}.o{w}, align 4"]
        G += latch(f"{p}.j", W, f"{p}.jmore", back, f"{p}.top", done)
        return G

    L += chunk(8, "c8", "0", "nml.done", "%nv8", "c8.done")
    L += ["c8.done:",
          "  %anyc4 = icmp slt i64 %nv8, %nv4",
          "  br i1 %anyc4, label %c4.top, label %c4.done"]
    L += chunk(4, "c4", "%nv8", "c8.done", "%nv4", "c4.done")
    L += ["c4.done:",
          "  %anyc = icmp slt i64 %nv4, %nv",
          "  br i1 %anyc, label %c1.top, label %hnext"]
    L += chunk(1, "c1", "%nv4", "c4.done", "%nv", "hnext")
    L += ["hnext:",
          *latch("n", "1", "nmore", "%N", "hloop", "end"),
          "end:",
          "  ret void",
          "}"]
    return L


def _pv_ir(m1: bool) -> list[str]:
    """pv / pv1(p, ldp, v, ldv, out, ldo, rows, len, nv, ks, heads, sp, sv, so, accum): per
    head and query row m (weights p + m * ldp, len[m] keys), the row times V (rows ldv apart,
    nv vectors of 8 columns) into out + m * ldo, C starting from out's row (accum: the SGEMM's
    beta 1) or from zeros. pv: MLAS's FMA3 SGEMM (chains of fused multiply-adds over the keys
    of each K stride of ks, each stride's sum added to C); pv1: MLAS's M == 1 kernel (groups
    of 4 products added in order, then to C; a pair, then one, for the rest). Columns 32 at a
    time (4 accumulators), then 8."""
    name = "pv1" if m1 else "pv"
    L = [f"define void @{name}(ptr %p, i64 %ldp, ptr %v, i64 %ldv, ptr %out, i64 %ldo, "
         "i64 %rows, ptr %len, i64 %nv, i64 %ks, i64 %heads, i64 %sp, i64 %sv, i64 %so, "
         "i64 %accum) nounwind {",
         "entry:",
         "  %acc.on = icmp ne i64 %accum, 0",
         "  %anyh = icmp sgt i64 %heads, 0",
         "  %anyr = icmp sgt i64 %rows, 0",
         "  %go = and i1 %anyh, %anyr",
         "  br i1 %go, label %hloop, label %end",
         "hloop:",
         "  %hd = phi i64 [0, %entry], [%hd.next, %hnext]",
         "  %po = mul i64 %hd, %sp",
         "  %ph = getelementptr float, ptr %p, i64 %po",
         "  %vo = mul i64 %hd, %sv",
         "  %vh = getelementptr float, ptr %v, i64 %vo",
         "  %oo = mul i64 %hd, %so",
         "  %oh = getelementptr float, ptr %out, i64 %oo",
         "  br label %rloop",
         "rloop:",
         "  %m = phi i64 [0, %hloop], [%m.next, %rnext]",
         "  %pro = mul i64 %m, %ldp",
         "  %prow = getelementptr float, ptr %ph, i64 %pro",
         "  %oro = mul i64 %m, %ldo",
         "  %orow = getelementptr float, ptr %oh, i64 %oro",
         "  %lp = getelementptr i64, ptr %len, i64 %m",
         "  %K = load i64, ptr %lp, align 8",
         "  %nv4 = and i64 %nv, -4",
         "  %any4 = icmp sgt i64 %nv4, 0",
         "  br i1 %any4, label %c4.top, label %c4.done"]

    def vload(p: str, w: int, t: str, tag: str) -> list[str]:
        """%{p}.v{tag}_{w}: V row t, columns of vector j + w."""
        return [f"  %{p}.vr{tag}_{w} = mul i64 {t}, %ldv",
                f"  %{p}.vc{tag}_{w} = add i64 %{p}.j, {w}",
                f"  %{p}.vc8{tag}_{w} = shl i64 %{p}.vc{tag}_{w}, 3",
                f"  %{p}.vx{tag}_{w} = add i64 %{p}.vr{tag}_{w}, %{p}.vc8{tag}_{w}",
                f"  %{p}.vp{tag}_{w} = getelementptr float, ptr %vh, i64 %{p}.vx{tag}_{w}",
                f"  %{p}.v{tag}_{w} = load {_VF}, ptr %{p}.vp{tag}_{w}, align 4"]

    def pload(p: str, t: str, tag: str) -> list[str]:
        return [f"  %{p}.pp{tag} = getelementptr float, ptr %prow, i64 {t}",
                f"  %{p}.px{tag} = load float, ptr %{p}.pp{tag}, align 4",
                *_splat(f"%{p}.pv{tag}", f"%{p}.px{tag}")]

    def chunk(W: int, p: str, j0: str, first: str, back: str, done: str) -> list[str]:
        Cs = [f"%{p}.C{w}" for w in range(W)]
        G = [f"{p}.top:",
             f"  %{p}.j = phi i64 [{j0}, %{first}], [%{p}.j.next, %{p}.store]"]
        for w in range(W):  # C's start: the output row (accumulating) or zeros
            G += [f"  %{p}.ic{w} = add i64 %{p}.j, {w}",
                  f"  %{p}.ic8{w} = shl i64 %{p}.ic{w}, 3",
                  f"  %{p}.ip{w} = getelementptr float, ptr %orow, i64 %{p}.ic8{w}",
                  f"  %{p}.il{w} = load {_VF}, ptr %{p}.ip{w}, align 4",
                  f"  %{p}.I{w} = select i1 %acc.on, {_VF} %{p}.il{w}, {_VF} zeroinitializer"]
        if not m1:
            G += ["  %" + p + ".anyk = icmp sgt i64 %K, 0",
                  f"  br i1 %{p}.anyk, label %{p}.kb, label %{p}.store",
                  f"{p}.kb:",
                  f"  %{p}.kb0 = phi i64 [0, %{p}.top], [%{p}.kb1, %{p}.kbnext]"]
            G += [f"  {Cs[w]} = phi {_VF} [%{p}.I{w}, %{p}.top], "
                  f"[{Cs[w]}.n, %{p}.kbnext]" for w in range(W)]
            G += [f"  %{p}.te0 = add i64 %{p}.kb0, %ks",
                  f"  %{p}.tlt = icmp slt i64 %{p}.te0, %K",
                  f"  %{p}.te = select i1 %{p}.tlt, i64 %{p}.te0, i64 %K",
                  f"  br label %{p}.t",
                  f"{p}.t:",
                  f"  %{p}.tt = phi i64 [%{p}.kb0, %{p}.kb], [%{p}.tt.next, %{p}.t]"]
            G += [f"  %{p}.acc{w} = phi {_VF} [zeroinitializer, %{p}.kb], "
                  f"[%{p}.acc{w}.n, %{p}.t]" for w in range(W)]
            G += pload(p, f"%{p}.tt", "")
            for w in range(W):
                G += vload(p, w, f"%{p}.tt", "")
                G.append(f"  %{p}.acc{w}.n = call {_VF} {_FMA}({_VF} %{p}.pv, "
                         f"{_VF} %{p}.v_{w}, {_VF} %{p}.acc{w})")
            G += [*latch(f"{p}.tt", "1", f"{p}.tmore", f"%{p}.te", f"{p}.t", f"{p}.kbnext"),
                  f"{p}.kbnext:",
                  f"  %{p}.kb00 = icmp eq i64 %{p}.kb0, 0",
                  f"  %{p}.noacc = xor i1 %acc.on, true",
                  f"  %{p}.isfirst = and i1 %{p}.kb00, %{p}.noacc"]
            for w in range(W):  # alpha = 1: C = sum, then fma(sum, 1, C) = C + sum
                G += [f"  %{p}.a{w} = fadd {_VF} %{p}.acc{w}.n, {Cs[w]}",
                      f"  {Cs[w]}.n = select i1 %{p}.isfirst, {_VF} %{p}.acc{w}.n, "
                      f"{_VF} %{p}.a{w}"]
            G += [f"  %{p}.kb1 = add i64 %{p}.kb0, %ks",
                  f"  %{p}.kbmore = icmp slt i64 %{p}.kb1, %K",
                  f"  br i1 %{p}.kbmore, label %{p}.kb, label %{p}.store",
                  f"{p}.store:"]
            G += [f"  %{p}.R{w} = phi {_VF} [%{p}.I{w}, %{p}.top], "
                  f"[{Cs[w]}.n, %{p}.kbnext]" for w in range(W)]
        else:
            G += ["  %" + p + ".K4 = and i64 %K, -4",
                  f"  %{p}.any4 = icmp sgt i64 %{p}.K4, 0",
                  f"  br i1 %{p}.any4, label %{p}.q, label %{p}.qdone",
                  f"{p}.q:",
                  f"  %{p}.tq = phi i64 [0, %{p}.top], [%{p}.tq.next, %{p}.q]"]
            G += [f"  {Cs[w]} = phi {_VF} [%{p}.I{w}, %{p}.top], "
                  f"[{Cs[w]}.n, %{p}.q]" for w in range(W)]
            for u in range(4):
                G.append(f"  %{p}.t{u} = add i64 %{p}.tq, {u}")
                G += pload(p, f"%{p}.t{u}", str(u))
            for w in range(W):
                for u in range(4):
                    G += vload(p, w, f"%{p}.t{u}", str(u))
                    G.append(f"  %{p}.m{u}_{w} = fmul {_VF} %{p}.pv{u}, %{p}.v{u}_{w}")
                G += [f"  %{p}.s1_{w} = fadd {_VF} %{p}.m0_{w}, %{p}.m1_{w}",
                      f"  %{p}.s2_{w} = fadd {_VF} %{p}.s1_{w}, %{p}.m2_{w}",
                      f"  %{p}.s3_{w} = fadd {_VF} %{p}.s2_{w}, %{p}.m3_{w}",
                      f"  {Cs[w]}.n = fadd {_VF} %{p}.s3_{w}, {Cs[w]}"]
            G += [*latch(f"{p}.tq", "4", f"{p}.qmore", f"%{p}.K4", f"{p}.q", f"{p}.qdone"),
                  f"{p}.qdone:"]
            G += [f"  %{p}.D{w} = phi {_VF} [%{p}.I{w}, %{p}.top], [{Cs[w]}.n, %{p}.q]"
                  for w in range(W)]
            G += [f"  %{p}.r = sub i64 %K, %{p}.K4",
                  f"  %{p}.r2 = and i64 %{p}.r, 2",
                  f"  %{p}.has2 = icmp ne i64 %{p}.r2, 0",
                  f"  br i1 %{p}.has2, label %{p}.two, label %{p}.twodone",
                  f"{p}.two:",
                  f"  %{p}.u0 = add i64 %{p}.K4, 0",
                  f"  %{p}.u1 = add i64 %{p}.K4, 1"]
            G += pload(p, f"%{p}.u0", "a") + pload(p, f"%{p}.u1", "b")
            for w in range(W):
                G += vload(p, w, f"%{p}.u0", "a") + vload(p, w, f"%{p}.u1", "b")
                G += [f"  %{p}.ma_{w} = fmul {_VF} %{p}.pva, %{p}.va_{w}",
                      f"  %{p}.mb_{w} = fmul {_VF} %{p}.pvb, %{p}.vb_{w}",
                      f"  %{p}.sab_{w} = fadd {_VF} %{p}.ma_{w}, %{p}.mb_{w}",
                      f"  %{p}.E{w} = fadd {_VF} %{p}.sab_{w}, %{p}.D{w}"]
            G += [f"  br label %{p}.twodone",
                  f"{p}.twodone:"]
            G += [f"  %{p}.F{w} = phi {_VF} [%{p}.D{w}, %{p}.qdone], [%{p}.E{w}, %{p}.two]"
                  for w in range(W)]
            G += [f"  %{p}.r1 = and i64 %{p}.r, 1",
                  f"  %{p}.has1 = icmp ne i64 %{p}.r1, 0",
                  f"  br i1 %{p}.has1, label %{p}.one, label %{p}.store",
                  f"{p}.one:",
                  f"  %{p}.u2 = sub i64 %K, 1"]
            G += pload(p, f"%{p}.u2", "c")
            for w in range(W):
                G += vload(p, w, f"%{p}.u2", "c")
                G += [f"  %{p}.mc_{w} = fmul {_VF} %{p}.pvc, %{p}.vc_{w}",
                      f"  %{p}.H{w} = fadd {_VF} %{p}.mc_{w}, %{p}.F{w}"]
            G += [f"  br label %{p}.store",
                  f"{p}.store:"]
            G += [f"  %{p}.R{w} = phi {_VF} [%{p}.F{w}, %{p}.twodone], [%{p}.H{w}, %{p}.one]"
                  for w in range(W)]
        for w in range(W):
            G += [f"  %{p}.oc{w} = add i64 %{p}.j, {w}",
                  f"  %{p}.oc8{w} = shl i64 %{p}.oc{w}, 3",
                  f"  %{p}.op{w} = getelementptr float, ptr %orow, i64 %{p}.oc8{w}",
                  f"  store {_VF} %{p}.R{w}, ptr %{p}.op{w}, align 4"]
        G += latch(f"{p}.j", W, f"{p}.jmore", back, f"{p}.top", done)
        return G

    L += chunk(4, "c4", "0", "rloop", "%nv4", "c4.done")
    L += ["c4.done:",
          "  %anyc = icmp slt i64 %nv4, %nv",
          "  br i1 %anyc, label %c1.top, label %rnext"]
    L += chunk(1, "c1", "%nv4", "c4.done", "%nv", "rnext")
    L += ["rnext:",
          *latch("m", "1", "mmore", "%rows", "rloop", "hnext"),
          "hnext:",
          *latch("hd", "1", "hmore", "%heads", "hloop", "end"),
          "end:",
          "  ret void",
          "}"]
    return L


# the kernels' arguments: p a pointer, i an i64, f a float
_SIGS = {"rope_rows": "piippiii", "scores": "ppppiiiiifiiiii", "online": "piipppppiip",
         "decode": "pppppiiiiiiifiip", "pv": "pipipiipiiiiiii", "pv1": "pipipiipiiiiiii"}
_TYPES = {"p": "ptr", "i": "i64", "f": "float"}
# the kernels a thread's share of the work calls (spin.py's jobs: one argument block each)
_JOBS = ("scores", "online", "decode", "pv", "pv1")


def _job_ir(name: str) -> list[str]:
    """{name}_job(a): @name on the words of the argument block ``a`` (pointers and integers
    as i64 words, a float as the float32 bits in a word's low half): spin.py's job form."""
    L = [f"define void @{name}_job(ptr %a) nounwind {{", "entry:"]
    args = []
    for i, kind in enumerate(_SIGS[name]):
        L += [f"  %a{i}.p = getelementptr i64, ptr %a, i64 {i}",
              f"  %a{i} = load {_TYPES[kind]}, ptr %a{i}.p, align 8"]
        args.append(f"{_TYPES[kind]} %a{i}")
    return L + [f"  call void @{name}({', '.join(args)})", "  ret void", "}"]


def _decode_grab_ir() -> list[str]:
    """decode_grab(a): a = decode_job's block (its n0 unused, its N the head count) then an
    i64 counter and the bytes between the heads' score rows: takes the next head from the
    counter (atomically) and runs @decode on it alone, until none is left. Every thread of a
    split runs it on the same block, so one that starts late takes only the heads left."""
    L = ["define void @decode_grab(ptr %a) nounwind {", "entry:"]
    args = []
    for i, kind in enumerate(_SIGS["decode"]):
        L += [f"  %a{i}.p = getelementptr i64, ptr %a, i64 {i}",
              f"  %a{i} = load {_TYPES[kind]}, ptr %a{i}.p, align 8"]
        args.append(f"{_TYPES[kind]} %a{i}")
    args[4], args[5], args[6] = "ptr %scp", "i64 %h", "i64 %h1"
    return L + ["  %cp = getelementptr i64, ptr %a, i64 16",
                "  %stp = getelementptr i64, ptr %a, i64 17",
                "  %st = load i64, ptr %stp, align 8",
                "  br label %next",
                "next:",
                "  %h = atomicrmw add ptr %cp, i64 1 seq_cst",
                "  %more = icmp slt i64 %h, %a6",
                "  br i1 %more, label %run, label %end",
                "run:",
                "  %h1 = add i64 %h, 1",
                "  %so = mul i64 %h, %st",
                "  %scp = getelementptr i8, ptr %a4, i64 %so",
                f"  call void @decode({', '.join(args)})",
                "  br label %next",
                "end:",
                "  ret void",
                "}"]


# decode_step's constants block (i64 words), one per node: built once, never written after
STEP_WORDS = ("N", "Nkv", "H", "scale", "window", "cos", "sin", "half", "inter", "rotary")


def _copy8_ir(tag: str, dst: str, src: str, n: str, before: str, after: str) -> list[str]:
    """``n`` floats (a positive multiple of 8) from ``src`` to ``dst``, 8 at a time, from block
    ``before`` on to block ``after`` (the loader links no memcpy)."""
    return [f"  br label %{tag}.loop",
            f"{tag}.loop:",
            f"  %{tag} = phi i64 [0, %{before}], [%{tag}.next, %{tag}.loop]",
            f"  %{tag}.s = getelementptr float, ptr {src}, i64 %{tag}",
            f"  %{tag}.d = getelementptr float, ptr {dst}, i64 %{tag}",
            f"  %{tag}.v = load {_VF}, ptr %{tag}.s, align 4",
            f"  store {_VF} %{tag}.v, ptr %{tag}.d, align 4",
            *latch(tag, "8", f"{tag}.more", n, f"{tag}.loop", after)]


def _decode_step_ir() -> list[str]:
    """decode_step(q, out, k, v, c, pos, total, sk): one new token of one sequence in one call
    (a ctypes call costs ~0.25 us an argument: @rope_rows' and @decode's 24 were more than
    the small model's attention itself): the packed row q ((N + 2 Nkv) H floats) copied to
    the stack, its q and k heads rotated at position ``pos`` (@rope_rows, where the block's
    ``rotary``), its k and v heads written at row total - 1 of the caches k and v (kv heads
    sk floats apart, rows of H), then @decode over ``total`` keys into out (N H floats), its
    scores on the stack: the same kernels on the same operands as the calls one by one.
    ``c``: STEP_WORDS (scale as its float32 bits, window -1 for none, cos / sin the rotary
    caches' first rows of ``half`` floats)."""
    L = ["define void @decode_step(ptr %q, ptr %out, ptr %k, ptr %v, ptr %c, i64 %pos, "
         "i64 %total, i64 %sk) nounwind {",
         "entry:"]
    for i, name in enumerate(STEP_WORDS):
        ty = "ptr" if name in ("cos", "sin") else "i64"
        L += [f"  %{name}.p = getelementptr i64, ptr %c, i64 {i}",
              f"  %{name} = load {ty}, ptr %{name}.p, align 8"]
    return L + [
        "  %scale.i = trunc i64 %scale to i32",
        "  %alpha = bitcast i32 %scale.i to float",
        "  %G = udiv i64 %N, %Nkv",
        "  %NK = add i64 %N, %Nkv",
        "  %rows = add i64 %NK, %Nkv",
        "  %W = mul i64 %rows, %H",
        "  %x = alloca float, i64 %W, align 32",
        "  %sc = alloca float, i64 %total, align 32",
        *_copy8_ir("cq", "%x", "%q", "%W", "entry", "copied"),
        "copied:",
        "  %rot = icmp ne i64 %rotary, 0",
        "  br i1 %rot, label %rope, label %write",
        "rope:",
        "  %co = mul i64 %pos, %half",
        "  %cs = getelementptr float, ptr %cos, i64 %co",
        "  %sn = getelementptr float, ptr %sin, i64 %co",
        "  call void @rope_rows(ptr %x, i64 %NK, i64 %H, ptr %cs, ptr %sn, i64 %half, "
        "i64 %inter, i64 1)",
        "  br label %write",
        "write:",
        "  %p = sub i64 %total, 1",
        "  %po = mul i64 %p, %H",
        "  br label %kv",
        "kv:",
        "  %h = phi i64 [0, %write], [%h.next, %vdone]",
        "  %ho = mul i64 %h, %sk",
        "  %hro = add i64 %ho, %po",
        "  %kr = getelementptr float, ptr %k, i64 %hro",
        "  %vr = getelementptr float, ptr %v, i64 %hro",
        "  %xk.h = add i64 %N, %h",
        "  %xk.o = mul i64 %xk.h, %H",
        "  %xk = getelementptr float, ptr %x, i64 %xk.o",
        "  %xv.h = add i64 %NK, %h",
        "  %xv.o = mul i64 %xv.h, %H",
        "  %xv = getelementptr float, ptr %x, i64 %xv.o",
        *_copy8_ir("ck", "%kr", "%xk", "%H", "kv", "kdone"),
        "kdone:",
        *_copy8_ir("cv", "%vr", "%xv", "%H", "kdone", "vdone"),
        "vdone:",
        *latch("h", "1", "hmore", "%Nkv", "kv", "attend"),
        "attend:",
        "  %inwin0 = icmp sge i64 %window, 0",
        "  %inwin1 = icmp slt i64 %window, %total",
        "  %inwin = and i1 %inwin0, %inwin1",
        "  %wsd = sub i64 %total, %window",
        "  %ws = select i1 %inwin, i64 %wsd, i64 0",
        "  call void @decode(ptr %x, ptr %k, ptr %v, ptr %out, ptr %sc, i64 0, i64 %N, i64 %G, "
        "i64 %total, i64 %H, i64 %sk, i64 %sk, float %alpha, i64 %ws, i64 0, ptr null)",
        "  ret void",
        "}"]


def _seq_ir() -> list[str]:
    """seq(a): a = [n, fn_0, args_0, .., fn_{n-1}, args_{n-1}]: fn_i(args_i) in order (one
    thread's whole share of a prompt: every KV block's kernels for its query rows)."""
    return ["define void @seq(ptr %a) nounwind {",
            "entry:",
            "  %n = load i64, ptr %a, align 8",
            "  %any = icmp sgt i64 %n, 0",
            "  br i1 %any, label %loop, label %end",
            "loop:",
            "  %i = phi i64 [0, %entry], [%i.next, %loop]",
            "  %i2 = shl i64 %i, 1",
            "  %fo = add i64 %i2, 1",
            "  %fp = getelementptr i64, ptr %a, i64 %fo",
            "  %f = load ptr, ptr %fp, align 8",
            "  %ao = add i64 %i2, 2",
            "  %ap = getelementptr i64, ptr %a, i64 %ao",
            "  %args = load ptr, ptr %ap, align 8",
            "  call void %f(ptr %args)",
            *latch("i", "1", "more", "%n", "loop", "end"),
            "end:",
            "  ret void",
            "}"]


def module_ir(target=None) -> str:
    return "\n".join([
        *_rope_rows_ir(), *_scores_ir(), *_sumexp_ir(), *_online_ir(), *_decode_ir(),
        *_pv_ir(False), *_pv_ir(True), *[line for n in _JOBS for line in _job_ir(n)],
        *_seq_ir(), *_decode_grab_ir(), *_decode_step_ir(),
        f"declare {_VF} @llvm.fma.v8f32({_VF}, {_VF}, {_VF})",
        "declare float @llvm.fma.f32(float, float, float)",
        f"declare {_VF} @llvm.masked.load.v8f32.p0(ptr, i32, <8 x i1>, {_VF})",
        f"declare void @llvm.masked.store.v8f32.p0({_VF}, ptr, i32, <8 x i1>)"])


_CT = {"p": ctypes.c_void_p, "i": ctypes.c_int64, "f": ctypes.c_float}
_JOB = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_PROTOS = {**{n: ctypes.CFUNCTYPE(None, *[_CT[c] for c in sig]) for n, sig in _SIGS.items()},
           **{f"{n}_job": _JOB for n in _JOBS}, "seq": _JOB, "decode_grab": _JOB,
           "decode_step": ctypes.CFUNCTYPE(None, *[ctypes.c_void_p] * 5, *[ctypes.c_int64] * 3)}


def _module() -> jit.Module:
    return jit.compile_module("gqa", module_ir, _PROTOS, REQUIRES)


def kernels() -> jit.Module | None:
    """The compiled module for the target selected now, or None where it cannot run (one
    lookup per call of a kernel: it follows compiled.disabled() and forced targets)."""
    try:
        return _module()
    except jit.Unavailable:
        return None


def unavailable() -> str | None:
    """None when the kernels run here, else why not (asked per call: a remembered answer)."""
    try:
        _module()
    except jit.Unavailable as exc:
        return str(exc)
    return None


def mlas_stride_k(N: int, K: int) -> int:
    """MLAS's K stride of an SGEMM with A not transposed (MlasSgemmOperation: strides of 128
    x 128, the N stride doubled while K fits in half the K stride, else the K stride doubled
    while N fits in half the N stride)."""
    stride_n = stride_k = 128
    if N >= K:
        while stride_k // 2 >= K:
            stride_n, stride_k = stride_n * 2, stride_k // 2
    else:
        while stride_n > 16 and stride_n // 2 >= N:
            stride_n, stride_k = stride_n // 2, stride_k * 2
    return stride_k


_LIBM_EXPF = None


def _libm_expf():
    """The C library's expf (std::exp of a float in onnxruntime's C++), as a ctypes function."""
    global _LIBM_EXPF
    if _LIBM_EXPF is None:
        libm = ctypes.CDLL(ctypes.util.find_library("m") or "libm.so.6")
        fn = libm.expf
        fn.restype, fn.argtypes = ctypes.c_float, [ctypes.c_float]
        _LIBM_EXPF = fn
    return _LIBM_EXPF


_EXPF: int | None = None


def _expf() -> int:
    """The address of the C library's expf, for the compiled kernels to call."""
    global _EXPF
    if _EXPF is None:
        _EXPF = ctypes.cast(_libm_expf(), ctypes.c_void_p).value
    return _EXPF


_L2: int | None = None


def l2_cache_size() -> int:
    """sysconf(_SC_LEVEL2_CACHE_SIZE) as onnxruntime's Env reads it (its flash attention's
    block sizes follow it); 0 where unknown. Read once per process."""
    global _L2
    if _L2 is None:
        try:
            _L2 = max(int(ctypes.CDLL(None).sysconf(191)), 0)  # glibc's _SC_LEVEL2_CACHE_SIZE
        except (OSError, AttributeError):
            _L2 = 0
    return _L2


def decode_packed(fn, qkv: np.ndarray, N: int, Nkv: int, cos: np.ndarray | None,
                  sin: np.ndarray | None, interleaved: bool) -> np.ndarray:
    """One new token's packed (N + 2 Nkv) * H row: q and k heads rotated in place on a copy
    (``rope_rows``; cos / sin: one position's rows of rot / 2 floats, None without rotary).
    Returns the copy as (N + 2 Nkv, H)."""
    H = qkv.size // (N + 2 * Nkv)
    x = np.array(qkv, np.float32).reshape(N + 2 * Nkv, H)
    if cos is not None:
        c = np.ascontiguousarray(cos, np.float32)
        s = np.ascontiguousarray(sin, np.float32)
        fn.rope_rows(address(x), N + Nkv, H, address(c), address(s), c.size, int(interleaved),
                     1)
    return x


def rope_heads(fn, x: np.ndarray, cos: np.ndarray, sin: np.ndarray, interleaved: bool
               ) -> np.ndarray:
    """``x`` (heads, S, H) rotated (a contiguous float32 copy), position s at cos / sin row s
    ((S, rot / 2) each: consecutive positions' rows of the caches)."""
    y = np.array(x, np.float32, order="C")
    heads, S, H = y.shape
    c = np.ascontiguousarray(cos, np.float32)
    s = np.ascontiguousarray(sin, np.float32)
    if y.size:
        fn.rope_rows(address(y), heads * S, H, address(c), address(s), c.shape[-1],
                     int(interleaved), S)
    return y


# Multiply-adds (Q K^T and S x V) from which one call is split over the threads (spin.py's
# pool): under them the hand-off and the argument blocks cost about what the second thread
# saves (a decode step of the small Llama, 8 heads of 32 x ~150 keys: ~77 K, stays whole)
DECODE_SPLIT = 1 << 17
PROMPT_SPLIT = 1 << 18


def _ranges(n: int, parts: int) -> list[tuple[int, int]]:
    """n tasks over ``parts`` threads as MLAS hands them out (the first n % parts one more)."""
    q, r = divmod(n, parts)
    return [(i * q + min(i, r), (i + 1) * q + min(i + 1, r)) for i in range(parts)]


def _word(x: float) -> int:
    """A float argument's word in an argument block: the float32's bits."""
    return struct.unpack("<i", struct.pack("<f", x))[0]


def _decode_words(q: int, k: int, v: int, out: int, sc: int, n0: int, N: int, G: int, T: int,
                  H: int, sk: int, sv: int, alpha: float, ws: int, raw: int, ml: int
                  ) -> list[int]:
    """decode_job's argument block (decode_grab's first 16 words): @decode's arguments as
    words, alpha as its float32 bits."""
    return [q, k, v, out, sc, n0, N, G, T, H, sk, sv, _word(alpha), ws, raw, ml]


def attend(q: np.ndarray, k: np.ndarray, v: np.ndarray, past: int, total: int, alpha: float,
           window: int = -1, l2: int | None = None, fn: jit.Module | None = None,
           split: bool = False, threads: int = 1, out: np.ndarray | None = None,
           scratch: Scratch | None = None) -> np.ndarray:
    """One sequence's attention as onnxruntime's GroupQueryAttention computes it (its flash
    path): ``q`` (N, S, H) float32 (rotary applied), ``k`` and ``v`` (Nkv, T, H) float32 with
    rows contiguous (the cache: T >= total, the first ``total`` keys valid), query s at
    position past + s seeing keys up to there (the last ``window`` of them with window >= 0).
    ``split``: one new token whose batch x heads is below onnxruntime's thread count, where
    it splits the keys in KV blocks (flash decoding). ``threads``: the session's intra-op
    threads, over which the work is split (spin.py's pool; above DECODE_SPLIT /
    PROMPT_SPLIT) in onnxruntime's units: one token's query heads or, with ``split``, its KV
    blocks; a prompt's query rows of each kv head. Each output element is computed on one
    thread in the same order, so the numbers do not depend on ``threads``. Returns (S, N * H)
    float32: ``out`` where given (C-contiguous; a prompt's result is written there), its
    temporaries from ``scratch`` where given (a session's, kept between calls)."""
    N, S, H = q.shape
    Nkv = k.shape[0]
    fn = fn or _module()
    alpha = float(np.float32(alpha))
    l2 = l2_cache_size() if l2 is None else l2
    if S > 1:
        return _prefill(fn, q, k, v, past, total, alpha, window, l2, threads, out,
                        scratch or Scratch())
    # MlasGQADecodeGQAThreaded's tasks (query heads), or MlasFlashDecodingGQAThreaded's
    # (blocks of keys, every head: each block's maximum, sum and raw output)
    kvb = min(max(l2 // (4 * 4 * 2 * H), 1), max(total, 1))
    chunks = -(-total // kvb) if split else 1
    qc = np.ascontiguousarray(q.reshape(N, H))
    ws = total - window if 0 <= window < total else 0
    out = np.empty((chunks, N, H), np.float32)
    ml = np.empty((chunks, N, 2), np.float32)
    if chunks == 1:
        decode_heads(fn, address(qc), address(k), address(v), address(out), N, N // Nkv,
                     total, H, k.strides[0] // 4, v.strides[0] // 4, alpha, ws, threads)
        return out.reshape(1, N * H)
    sc = np.empty((chunks, kvb), np.float32)
    qa, ka, va, oa, sa, ma = (address(x) for x in (qc, k, v, out, sc, ml))
    kr, vr = k.strides[1], v.strides[1]
    spin.run_blocks(fn.decode_job, np.array([
        _decode_words(qa, ka + ir * kr, va + ir * vr, oa + c * N * H * 4, sa + c * kvb * 4, 0,
                      N, N // Nkv, R, H, k.strides[0] // 4, v.strides[0] // 4, alpha,
                      min(max(ws - ir, 0), R), 1, ma + c * N * 8)
        for c, ir, R in ((c, c * kvb, min(kvb, total - c * kvb)) for c in range(chunks))],
        np.int64), threads)
    return _reduce_chunks(out, ml).reshape(1, N * H)


def decode_heads(fn, q: int, k: int, v: int, out: int, N: int, G: int, T: int, H: int,
                 sk: int, sv: int, alpha: float, ws: int, threads: int = 1) -> None:
    """One new token's attention over T keys, MlasGQADecodeGQAThreaded's tasks (query
    heads): the ``decode`` kernel on addresses (q and out: N rows of H floats; k and v: a
    kv head's rows of H floats, heads sk / sv floats apart, head n's the n / G-th). Where
    the work reaches DECODE_SPLIT and spin.py's workers run here, the heads are taken one
    at a time from a shared counter by every thread of the split (``decode_grab``, one
    argument block for all): the calling thread starts at once and a worker that starts
    late takes only the heads left (two halves fixed up front left the caller running or
    waiting for the late one's half), with one small block built per call (two lists of
    words cost ~8 us of Python). Each head is computed whole on one thread."""
    pool = spin.usable() if threads > 1 and 2 * N * T * H >= DECODE_SPLIT else None
    if pool is None:
        sc = np.empty(max(T, 1), np.float32)
        fn.decode(q, k, v, out, address(sc), 0, N, G, T, H, sk, sv, alpha, ws, 0, None)
        return
    sc = np.empty((N, max(T, 1)), np.float32)  # each head's scores
    # decode_grab's block: the counter at 0, the score rows' stride
    block = np.array(_decode_words(q, k, v, out, address(sc), 0, N, G, T, H, sk, sv, alpha, ws,
                                   0, 0) + [0, sc.strides[0]], np.int64)
    at = address(block)
    pool.fork(_job_addresses(fn)[4], np.full(min(threads, pool.size + 1, N), at, np.int64))


def _reduce_chunks(out: np.ndarray, ml: np.ndarray) -> np.ndarray:
    """MlasFlashDecodingGQAReduceThreaded: per head, the largest chunk maximum gm; over the
    chunks in order (those with a positive sum), r = expf(m - gm), l += r * sum and o += r *
    chunk output (a multiply and an add each); o * (1 / l)."""
    expf = _libm_expf()
    chunks, N, H = out.shape
    gm = np.full(N, _LOWEST, np.float32)
    for c in range(chunks):
        gm = np.where(gm < ml[c, :, 0], ml[c, :, 0], gm)  # std::max(gm, m)
    o = np.zeros((N, H), np.float32)
    gl = np.zeros(N, np.float32)
    for c in range(chunks):
        for n in range(N):
            m, s = ml[c, n]
            if s <= 0:
                continue
            r = np.float32(expf(float(np.float32(m - gm[n]))))
            gl[n] = np.float32(gl[n] + np.float32(r * s))
            o[n] = o[n] + r * out[c, n]
    inv = np.zeros(N, np.float32)
    np.divide(np.float32(1), gl, out=inv, where=gl > 0)
    return o * inv[:, None]


_JOB_ADDRESSES: dict[int, tuple[object, list[int]]] = {}


def _job_addresses(fn) -> list[int]:
    """The machine-code addresses of ``fn``'s scores, online, pv, pv1 jobs and decode_grab
    (per module)."""
    got = _JOB_ADDRESSES.get(id(fn))
    if got is None or got[0] is not fn:
        got = _JOB_ADDRESSES[id(fn)] = (fn, [spin.function_address(f) for f in (
            fn.scores_job, fn.online_job, fn.pv_job, fn.pv1_job, fn.decode_grab)])
    return got[1]


def _row_units(work: np.ndarray, Nkv: int, threads: int) -> list[tuple[int, int, int, int]]:
    """A prompt's tasks (kv heads h0..h1, 8-row blocks b0..b1): with one thread, or at least
    as many kv heads as threads, ranges of whole heads (MLAS's split of its tasks); else each
    head's row blocks in ceil(threads / Nkv) ranges of about equal work (``work``: keys per
    row block; a causal prompt's later rows see more)."""
    nb = len(work)
    if threads <= 1 or Nkv >= threads:
        return [(h0, h1, 0, nb) for h0, h1 in _ranges(Nkv, max(1, min(threads, Nkv)))]
    parts = min(-(-threads // Nkv), nb)
    cum = np.cumsum(work)
    cuts = [0, *np.searchsorted(cum, cum[-1] * np.arange(1, parts) / parts, "right").tolist(),
            nb]
    cuts = sorted(set(cuts))
    return [(h, h + 1, b0, b1) for h in range(Nkv) for b0, b1 in zip(cuts, cuts[1:], strict=False)]


def _prefill(fn, q, k, v, past: int, total: int, alpha: float, window: int,
             l2: int, threads: int, out: np.ndarray | None, scratch: Scratch) -> np.ndarray:
    """MlasFlashAttentionGQAThreaded: per head and block of q_block query rows, KV blocks of
    kv_block keys (both from the L2 cache size): scores by SGEMM (``scores``), the masked
    keys at the lowest float (``online``), the online softmax step (``online``), O += exp
    scores x V by SGEMM (``pv``; ``pv1`` for a block of one query row), O / l at the end. A
    row's numbers depend on its query block only through that block's row count, so the rows
    go to the threads in any grouping: each task (kv heads, 8-row blocks; _row_units) runs
    every KV block's kernels for its rows in order on one thread (``seq``)."""
    N, S, H = q.shape
    Nkv = k.shape[0]
    G = N // Nkv
    M = S * G
    M8 = -(-M // 8) * 8
    kvb = max(l2 // (4 * 4 * 2 * H), 1)
    qb = min(kvb, 2 * H, S)
    kvb = min(kvb, total)
    # the large temporaries from the scratch memory (fresh ones cost ~500 page faults a call)
    qt, rows, O, sc = scratch.take(((Nkv, H, M8), (Nkv, M, H), (Nkv, M8, H), (Nkv, M8, kvb)))
    # the query rows of each kv head as (s, g), transposed into qt [H][M8]: rows of H first
    # (whole rows copied), then 2-D transposes of 128 rows (32 KiB: a direct 4-D transpose
    # reads across pages, a whole head's misses the caches: 2-3x the time)
    rows.reshape(Nkv, S, G, H)[...] = q.reshape(Nkv, G, S, H).transpose(0, 2, 1, 3)
    for h in range(Nkv):
        for r in range(0, M, 128):
            qt[h, :, r:min(r + 128, M)] = rows[h, r:r + 128].T
    qt[:, :, M:] = 0
    O.fill(0)
    limit = np.zeros(M8, np.int64)  # keys a row may see: [start, limit)
    limit[:M] = np.repeat(past + 1 + np.arange(S, dtype=np.int64), G)
    start = np.zeros(M8, np.int64)
    if window >= 0:
        start[:M] = np.where(limit[:M] > window, limit[:M] - window, 0)
    one_row = S % qb == 1  # the last block holds one query row: its S x V is MLAS's M == 1
    rows_main = (S - 1) * G if one_row else M
    m = np.full(Nkv * M8, _LOWEST, np.float32)
    lsum = np.zeros(Nkv * M8, np.float32)
    irs = np.arange(0, min(total, past + S), kvb, dtype=np.int64)
    Rs = np.minimum(kvb, total - irs)[:, None]
    # per KV block: the keys each 8-row block's scores need (up to its last row's limit),
    # each row's keys before its causal limit (cnt) and before its window (masked)
    tl = np.clip(limit.reshape(-1, 8).max(axis=1)[None] - irs[:, None], 0, Rs)
    cnt = np.ascontiguousarray(np.broadcast_to(
        np.clip(limit[None] - irs[:, None], 0, Rs)[:, None], (len(irs), Nkv, M8)))
    masked = np.zeros_like(cnt) if window < 0 else np.ascontiguousarray(np.broadcast_to(
        np.clip(start[None] - irs[:, None], 0, Rs)[:, None], cnt.shape))
    work = np.minimum(limit.reshape(-1, 8).max(axis=1), total)
    threads = threads if 2 * H * N * int(np.minimum(limit[:M], total).sum()) // G >= \
        PROMPT_SPLIT else 1
    units = _row_units(work, Nkv, threads)
    qa, ka, va, sa, ta, ca, wa, mla, la, oa = (address(x) for x in (
        qt, k, v, sc, tl, cnt, masked, m, lsum, O))
    jobs = _job_addresses(fn)
    expf = _expf()
    sk, sv = k.strides[0] // 4, v.strides[0] // 4
    a = _word(alpha)
    calls, seqs = [], []
    for h0, h1, b0, b1 in units:
        r0, r1, nh = 8 * b0, 8 * b1, h1 - h0
        hr = h0 * M8 + r0  # the task's first row, as a row of every (kv head, row) array
        seq = []
        for i, (ir, R) in enumerate(zip(irs.tolist(), Rs[:, 0].tolist(), strict=True)):
            if not tl[i, b0:b1].any():  # past the causal limit of every row: nothing to add
                continue
            kb, vb = ka + h0 * sk * 4 + ir * k.strides[1], va + h0 * sv * 4 + ir * v.strides[1]
            ci = ca + (i * Nkv * M8 + hr) * 8
            lens = ca + (i * Nkv * M8 + r0) * 8  # a head's rows (the same for every head)
            seq.append((0, [qa + (h0 * H * M8 + r0) * 4, kb, sa + hr * kvb * 4,
                            ta + (i * tl.shape[1] + b0) * 8, b1 - b0, M8, H, k.strides[1] // 4,
                            mlas_stride_k(R, H), a, nh, H * M8, sk, M8 * kvb, kvb]))
            rows = (r1 - r0) if nh == 1 else nh * M8  # whole heads: rows across them
            seq.append((1, [sa + hr * kvb * 4, rows, kvb, ci, wa + (ci - ca), mla + hr * 4,
                            la + hr * 4, oa + hr * H * 4, H, int(ir == 0), expf]))
            for j, (p0, p1) in enumerate(((r0, min(r1, rows_main)),
                                          (max(r0, rows_main), min(r1, M) if one_row else 0))):
                if p1 > p0:
                    seq.append((2 + j, [sa + (h0 * M8 + p0) * kvb * 4, kvb, vb, v.strides[1] // 4,
                                        oa + (h0 * M8 + p0) * H * 4, H, p1 - p0,
                                        lens + (p0 - r0) * 8, H // 8,
                                        0 if j else mlas_stride_k(H, R), nh, M8 * kvb, sv,
                                        M8 * H, int(ir > 0)]))
        seqs.append([(len(calls) + n, jobs[f]) for n, (f, _) in enumerate(seq)])
        calls += [w for _, w in seq]
    words = np.array([w + [0] * (16 - len(w)) for w in calls] or [[0] * 16], np.int64)
    wa0 = address(words)
    width = max(map(len, seqs), default=0)
    program = np.array([[len(seq)] + [x for i, f in seq for x in (f, wa0 + i * 128)]
                        + [0, 0] * (width - len(seq)) for seq in seqs], np.int64)
    spin.run_blocks(fn.seq, program, threads)
    inv = np.zeros(Nkv * M8, np.float32)
    np.divide(np.float32(1), lsum, out=inv, where=lsum > 0)
    if out is None:
        out = np.empty((S, N * H), np.float32)
    # O / l, written straight into the (S, N H) layout
    np.multiply(O[:, :M].reshape(Nkv, S, G, H).transpose(1, 0, 2, 3),
                inv.reshape(Nkv, M8)[:, :M].reshape(Nkv, S, G, 1).transpose(1, 0, 2, 3),
                out=out.reshape(S, Nkv, G, H))
    return out


class Scratch:
    """Float32 work memory for a prompt's temporaries, one block per thread, grown to the
    largest call up to ``keep`` bytes and kept (fresh allocations of a few MB each call cost
    ~500 page faults: glibc hands large blocks back to the system); a larger call's block is
    its own. ``SCRATCH``, the process's, is shared by every GroupQueryAttention node: one per
    node held 24 x 13 MB after a 512-token prompt of the 0.5b model."""

    def __init__(self, keep: int = 1 << 62) -> None:
        self._local = threading.local()
        self.keep = keep

    def take(self, shapes: tuple[tuple[int, ...], ...]) -> list[np.ndarray]:
        """Uninitialized float32 arrays of ``shapes``, 64-byte aligned, valid until this
        thread's next take."""
        counts = [math.prod(s) for s in shapes]
        sizes = [-(-n // 16) * 16 for n in counts]
        buf = getattr(self._local, "buf", None)
        if buf is None or buf.size < sum(sizes) + 16:
            buf = np.empty(sum(sizes) + 16, np.float32)
            if buf.nbytes <= self.keep:
                self._local.buf = buf
        at = (-buf.ctypes.data % 64) // 4
        views = []
        for shape, n, size in zip(shapes, counts, sizes, strict=True):
            views.append(buf[at:at + n].reshape(shape))
            at += size
        return views


# a prompt of ~600 tokens at the 0.5b model's shape (14 / 2 heads of 64) at most
SCRATCH = Scratch(keep=16 << 20)

BUNDLE = {"gqa": (module_ir, REQUIRES)}

__all__ = ["BUNDLE", "DECODE_SPLIT", "PROMPT_SPLIT", "REQUIRES", "SCRATCH", "Scratch", "attend",
           "decode_heads", "decode_packed", "kernels", "l2_cache_size", "mlas_stride_k",
           "module_ir", "rope_heads", "unavailable"]
