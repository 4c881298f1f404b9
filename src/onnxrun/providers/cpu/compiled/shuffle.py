"""A channel shuffle of channels-last float32 pixels: each pixel's (b, a) block of channels
transposed to (a, b), out[p, i * b + j] = in[p, j * a + i] (ShuffleNet's Reshape -> Transpose
-> Reshape, whose last Reshape is the one copy at the layout level: ``ops/tensor.py``).

Why: numpy copies it as b strided copies (every b-th float out), ~4 cycles a float; here 8
channels of each of the b groups are loaded as vectors and interleaved by one shuffle into
8 * b consecutive floats (the rest of a pixel, a % 8 channels, as the last 8 channels again,
overlapping: ShuffleNet's a = 28, 34 and 68 spent about half their time on them one float at
a time; only a < 8 goes float by float). A copy: the numbers are the input's, bit for bit.
"""

from __future__ import annotations

import ctypes

import numpy as np

from . import jit
from .jit import address

REQUIRES = ()  # generic vector IR: every target
MAX_GROUPS = 8
_P, _I = ctypes.c_void_p, ctypes.c_int64
_PROTO = ctypes.CFUNCTYPE(None, _P, _P, _I, _I)


def _lanes(idx) -> str:
    """A shuffle mask, typed."""
    idx = list(idx)
    return f"<{len(idx)} x i32> <" + ", ".join(f"i32 {i}" for i in idx) + ">"


def _block(b: int, i: str, t: str) -> list[str]:
    """Channels ``i``..``i``+7 of each of the b groups of pixel %xp loaded as vectors and
    interleaved by one shuffle into 8 * b consecutive floats of %yp (names suffixed ``t``)."""
    V8 = "<8 x float>"
    L = []
    for j in range(b):
        L += [f"  %oj{j}{t} = mul i64 %a, {j}",
              f"  %o{j}{t} = add i64 %oj{j}{t}, {i}",
              f"  %q{j}{t} = getelementptr float, ptr %xp, i64 %o{j}{t}",
              f"  %v{j}{t} = load {V8}, ptr %q{j}{t}, align 4"]
    # widen to one vector of 8 * b lanes: v0 ++ v1 ++ ... (a power-of-two tree of concats)
    parts, width, n = [f"%v{j}{t}" for j in range(b)], 8, 0
    while len(parts) > 1:
        nxt = []
        for k in range(0, len(parts) - 1, 2):
            name = f"%c{n}{t}"
            n += 1
            L.append(f"  {name} = shufflevector <{width} x float> {parts[k]}, "
                     f"<{width} x float> {parts[k + 1]}, {_lanes(range(2 * width))}")
            nxt.append(name)
        if len(parts) % 2:  # the odd one out, padded to the doubled width
            name = f"%c{n}{t}"
            n += 1
            L.append(f"  {name} = shufflevector <{width} x float> {parts[-1]}, "
                     f"<{width} x float> poison, {_lanes(range(2 * width))}")
            nxt.append(name)
        parts, width = nxt, 2 * width
    order = [j * 8 + k for k in range(8) for j in range(b)]  # out k * b + j <- v_j[k]
    return L + [f"  %s{t} = shufflevector <{width} x float> {parts[0]}, <{width} x float> "
                f"poison, {_lanes(order)}",
                f"  %yo{t} = mul i64 {i}, {b}",
                f"  %yq{t} = getelementptr float, ptr %yp, i64 %yo{t}",
                f"  store <{8 * b} x float> %s{t}, ptr %yq{t}, align 4"]


def module_ir(b: int) -> str:
    """``@shuffle_f32(ptr %X, ptr %Y, i64 %P, i64 %a)``: P pixels of a * b floats each."""
    L = ["define void @shuffle_f32(ptr %X, ptr %Y, i64 %P, i64 %a) nounwind {",
         "entry:",
         f"  %pix = mul i64 %a, {b}",
         "  %a8 = and i64 %a, -8",
         "  %anyp = icmp sgt i64 %P, 0",
         "  br i1 %anyp, label %ploop, label %end",
         "ploop:",
         "  %p = phi i64 [0, %entry], [%pn, %pnext]",
         "  %base = mul i64 %p, %pix",
         "  %xp = getelementptr float, ptr %X, i64 %base",
         "  %yp = getelementptr float, ptr %Y, i64 %base",
         "  %anyv = icmp sgt i64 %a8, 0",
         "  br i1 %anyv, label %vloop, label %vdone",
         "vloop:",  # channels i..i+7 of every group: one interleaving shuffle
         "  %i = phi i64 [0, %ploop], [%in, %vloop]"]
    L += _block(b, "%i", "")
    L += ["  %in = add i64 %i, 8",
          "  %vmore = icmp slt i64 %in, %a8",
          "  br i1 %vmore, label %vloop, label %vdone",
          "vdone:",
          "  %anys = icmp slt i64 %a8, %a",
          "  br i1 %anys, label %tail, label %pnext",
          "tail:",  # a % 8 channels left: the last 8 again, overlapping (a copy: the same
          # values stored twice), where a >= 8; else one float at a time
          "  %wide = icmp ne i64 %a8, 0",
          "  br i1 %wide, label %vlast, label %sloop",
          "vlast:",
          "  %il = sub i64 %a, 8"]
    L += _block(b, "%il", "l")
    L += ["  br label %pnext",
          "sloop:",
          "  %k = phi i64 [0, %tail], [%kn, %sloop]"]
    for j in range(b):
        L += [f"  %sj{j} = mul i64 %a, {j}",
              f"  %so{j} = add i64 %sj{j}, %k",
              f"  %sq{j} = getelementptr float, ptr %xp, i64 %so{j}",
              f"  %sv{j} = load float, ptr %sq{j}, align 4",
              f"  %sk{j} = mul i64 %k, {b}",
              f"  %sy{j} = add i64 %sk{j}, {j}",
              f"  %sr{j} = getelementptr float, ptr %yp, i64 %sy{j}",
              f"  store float %sv{j}, ptr %sr{j}, align 4"]
    L += ["  %kn = add i64 %k, 1",
          "  %smore = icmp slt i64 %kn, %a",
          "  br i1 %smore, label %sloop, label %pnext",
          "pnext:",
          "  %pn = add i64 %p, 1",
          "  %pmore = icmp slt i64 %pn, %P",
          "  br i1 %pmore, label %ploop, label %end",
          "end:",
          "  ret void",
          "}"]
    return "\n".join(L)


def shuffle(X: np.ndarray, b: int, out: np.ndarray | None = None) -> np.ndarray:
    """(P, b, a) float32 pixels (C-contiguous) as a (P, a, b) array, new or ``out`` (a
    C-contiguous one apart from X): each pixel's block transposed. Raises ``jit.Unavailable``
    where the kernel cannot run here."""
    if X.ndim != 3 or X.shape[1] != b or X.dtype != np.float32 or not X.flags.c_contiguous \
            or not 0 < b <= MAX_GROUPS:
        raise ValueError(f"channel shuffle: expected contiguous float32 [P, {b}, a] with at "
                         f"most {MAX_GROUPS} groups, got {X.dtype}{list(X.shape)}")
    reason = jit.why_unavailable(REQUIRES)
    if reason:
        raise jit.Unavailable(reason)
    fn = jit.compile_module(f"shuffle_f32_{b}", lambda target: module_ir(b),
                            {"shuffle_f32": _PROTO}, REQUIRES).shuffle_f32
    P, _, a = X.shape
    if out is None:
        Y = np.empty((P, a, b), np.float32)
    elif out.shape != (P, a, b) or out.dtype != np.float32 or not out.flags.c_contiguous:
        raise ValueError(f"channel shuffle: out must be a C-contiguous float32 {[P, a, b]}")
    else:
        Y = out
    if Y.size:
        fn(address(X), address(Y), P, a)
    return Y


# compiled with the other kernels on first use (jit._BUNDLE): ShuffleNet's 4 groups
BUNDLE = {"shuffle_f32_4": ((lambda target: module_ir(4)), REQUIRES)}

__all__ = ["BUNDLE", "MAX_GROUPS", "REQUIRES", "module_ir", "shuffle"]
