"""A whole direction of an LSTM in one call: at every time step the product of h with R, the
gates and the cell update, without returning to Python. Two products: 8-bit (DynamicQuantizeLSTM:
h quantized to uint8 per step, VNNI against int8 R) and float32 (LSTM: FMA against R).

Why: an LSTM step is small (a [B, H] x [H, 4H] product and 5H activations), so the numpy cell
spent ~30 us a step in per-call overhead, more than the arithmetic: the int8 LSTM ran no faster
than its float32 original, and both trailed onnxruntime. Here a step of a 256-unit LSTM costs a
few us (the product streams R from L2: 256 KB in 8 bits, 1 MB in float32).

Arithmetic per step, as the numpy paths (``rnn.fast_lstm_cell``) compute it, the gates i, o, f
coming pre-halved (the input part x[t] and R's columns or scale): their sigmoid is a tanh:
    8-bit:   codes, a_scale, zp = dynamic uint8 quantization of h (per tensor, all rows)
             g = float(sum (codes - zp)(R - zb)) * (a_scale * r_scale[n]) + x[t]   (exact ints)
    float32: g = h @ R + x[t]
    g = tanh(clip(g)) * half + shift         (sigmoid for i, o, f; tanh for the cell input c~)
    c = f * c + i * c~;  h = o * tanh(c)
rounded in the same order (no fused multiply-add outside the product), except tanh
(``ir.tanh_function``, <= 3 ulp like numpy's) and, in float32, the product's summation order.
Rows of a batch go four at a time through R (one pass over R per step and group of rows), with
eight accumulator chains in flight (K unrolled by 4 for a single row, by 2 for two) to hide the
multiply-add latency.
"""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING

import numpy as np

from . import ir, jit
from .jit import address
from .layout import aligned_empty

if TYPE_CHECKING:
    from .int8_gemm import PackedB

# int8_gemm's constants, restated so that a float LSTM's session does not import the int8
# GEMM's module (nor quantize's): the u8 mode reads R as an int8_gemm.PackedB, NR columns a
# panel, as the IR's shifts by 5 read every panel (the float32 R is packed the same way);
# tests/test_lazy_imports.py checks that they agree.
NR = 32
INT8_REQUIRES = ()  # int8_gemm.REQUIRES: every target (ir.dot_u8s8)
FLOAT_REQUIRES = ()  # generic vector IR: every target
_V, _VF = ir.V, ir.VF
CHAINS = 4  # accumulator chains per row and 16 columns for one row: the latency, hidden
GROUP = 4  # rows of the batch per pass over R (each row adds two accumulators per chain)


def _vector_at(name: str, base: str, index: str, vtype: str = _VF, elem: str = "float",
               mask: str | None = None) -> list[str]:
    """``name`` = the 16 elements of ``base`` from ``index`` on (masked lanes read 0)."""
    lines = [f"  {name}.p = getelementptr {elem}, ptr {base}, i64 {index}"]
    if mask is None:
        return lines + [f"  {name} = load {vtype}, ptr {name}.p, align 4"]
    return lines + [f"  {name} = call {vtype} @llvm.masked.load.v16f32.p0(ptr {name}.p, i32 4, "
                    f"<16 x i1> {mask}, {vtype} zeroinitializer)"]


def _store_at(value: str, base: str, index: str, mask: str) -> list[str]:
    at = f"{base}.{value[1:]}.sp"
    return [f"  {at} = getelementptr float, ptr {base}, i64 {index}",
            f"  call void @llvm.masked.store.v16f32.p0({_VF} {value}, ptr {at}, i32 4, "
            f"<16 x i1> {mask})"]


def _product_step(target, mode: str, j: int, k: str, rows: int, acc, out) -> list[str]:
    """One step of K (a group of 4 bytes in 8 bits, one row of R in float32) for ``rows`` rows
    and the panel's two column vectors: ``out[r][c]`` = ``acc[r][c]`` + h part x R part."""
    vt = _V if mode == "u8" else _VF
    L = [f"  %bo{j} = shl i64 {k}, 7",  # 32 columns x (4 bytes or 1 float) per step of K
         f"  %bp{j}_0 = getelementptr i8, ptr %bpan, i64 %bo{j}",
         f"  %b{j}_0 = load {vt}, ptr %bp{j}_0, align 64",
         f"  %bp{j}_1 = getelementptr i8, ptr %bp{j}_0, i64 64",
         f"  %b{j}_1 = load {vt}, ptr %bp{j}_1, align 64"]
    for r in range(rows):
        a = f"%av{j}r{r}"
        if mode == "u8":
            L += [f"  {a}.o = shl i64 {k}, 2",
                  f"  {a}.x = add i64 {a}.o, %ro{r}",
                  f"  {a}.p = getelementptr i8, ptr %arow, i64 {a}.x",
                  f"  {a}.w = load i32, ptr {a}.p, align 1",
                  *ir.splat(a, f"{a}.w", _V)]
        else:
            L += [f"  {a}.x = add i64 {k}, %ro{r}",
                  f"  {a}.p = getelementptr float, ptr %arow, i64 {a}.x",
                  f"  {a}.w = load float, ptr {a}.p, align 4",
                  *ir.splat(a, f"{a}.w")]
        for c in range(2):
            if mode == "u8":
                L += ir.dot_u8s8(target, out[r][c], acc[r][c], a, f"%b{j}_{c}")
            else:
                L.append(f"  {out[r][c]} = call {_VF} @llvm.fma.v16f32({_VF} {a}, "
                         f"{_VF} %b{j}_{c}, {_VF} {acc[r][c]})")
    return L


def _group_function(target, mode: str, rows: int, kind: str = "lstm") -> list[str]:
    """``@group{rows}``: one step for ``rows`` consecutive rows of the batch, R streamed once
    for all of them: per panel of 32 columns the product (K unrolled so that 8 accumulator
    chains are in flight), then the gates; then each row's cell update. ``kind`` "lstm" (gates
    i, o, f, c~; inputs pre-halved) or "gru" (z, r, h with linear_before_reset: z and r
    activated here, halved after the clip; h's product kept raw plus Rbh for the cell)."""
    u8 = mode == "u8"
    gru = kind == "gru"
    vt = _V if u8 else _VF
    unroll = max(1, CHAINS // rows)
    L = [f"define internal void @group{rows}(ptr %arow, i64 %lda, ptr %xrow, ptr %hrow, "
         "ptr %crow, ptr %yrow, ptr %rcp, i64 %H, i64 %G, i64 %width, ptr %panels, "
         f"ptr %slope, ptr %zb, ptr %cols, ptr %gates, {_V} %zpv, {_VF} %asv) nounwind {{",
         "entry:",
         "  %pstride = shl i64 %G, 7",  # bytes per panel: G x 32 x (4 bytes or 1 float)
         f"  %HG = mul i64 %H, {3 if gru else 4}",  # gate columns: a row of x
         "  %npan = lshr i64 %width, 5",
         f"  %gfull = and i64 %G, {-unroll}",
         "  %c_half = getelementptr float, ptr %cols, i64 %width",
         "  %c_shift = getelementptr float, ptr %c_half, i64 %width",
         "  %c_bound = getelementptr float, ptr %c_shift, i64 %width",
         "  %c_act = getelementptr float, ptr %c_bound, i64 %width",
         "  %c_nan = getelementptr float, ptr %c_act, i64 %width"]
    for r in range(rows):
        L += [f"  %ro{r} = mul i64 %lda, {r}",
              f"  %xo{r} = mul i64 %HG, {r}",
              f"  %go{r} = mul i64 %width, {r}"]
        if u8:
            L += [f"  %rc{r}.p = getelementptr i32, ptr %rcp, i64 {r}",
                  f"  %rc{r}.s = load i32, ptr %rc{r}.p, align 4",
                  *ir.splat(f"%rcv{r}", f"%rc{r}.s", _V)]
    L += ["  br label %panel",
          "panel:",
          "  %p = phi i64 [0, %entry], [%pn, %kend]",
          "  %boff = mul i64 %p, %pstride",
          "  %bpan = getelementptr i8, ptr %panels, i64 %boff",
          "  %col = shl i64 %p, 5",
          "  %col16 = add i64 %col, 16"]
    if u8:  # the zero-point terms start the accumulators
        for c, at in enumerate(("%col", "%col16")):
            L += [*_vector_at(f"%sl{c}", "%slope", at, _V, "i32"),
                  f"  %init{c} = mul {_V} %sl{c}, %zpv"]
        init = ["%init0", "%init1"]
    else:
        init = ["zeroinitializer", "zeroinitializer"]
    L += ["  %hasfull = icmp ne i64 %gfull, 0",
          "  br i1 %hasfull, label %kloop, label %kmid",
          "kloop:",
          "  %g = phi i64 [0, %panel], [%gn, %kloop]"]

    def names(prefix: str, j: int) -> list[list[str]]:
        return [[f"%{prefix}{j}_{r}_{c}" for c in range(2)] for r in range(rows)]

    for j in range(unroll):
        for r in range(rows):
            for c in range(2):
                start = init[c] if j == 0 else "zeroinitializer"
                L.append(f"  %a{j}_{r}_{c} = phi {vt} [{start}, %panel], "
                         f"[%n{j}_{r}_{c}, %kloop]")
    for j in range(unroll):
        L.append(f"  %gg{j} = add i64 %g, {j}")
        L += _product_step(target, mode, j, f"%gg{j}", rows, names("a", j), names("n", j))
    add = "add" if u8 else "fadd"
    L += [f"  %gn = add i64 %g, {unroll}",
          "  %kmore = icmp ult i64 %gn, %gfull",
          "  br i1 %kmore, label %kloop, label %ksum",
          "ksum:"]
    summed = names("n", 0)
    for j in range(1, unroll):  # chains summed in a fixed order
        nxt = names("s", j)
        for r in range(rows):
            for c in range(2):
                L.append(f"  {nxt[r][c]} = {add} {vt} {summed[r][c]}, %n{j}_{r}_{c}")
        summed = nxt
    L += ["  br label %kmid", "kmid:"]
    for r in range(rows):
        for c in range(2):
            L.append(f"  %m{r}_{c} = phi {vt} [{init[c]}, %panel], [{summed[r][c]}, %ksum]")
    L += ["  %hasrem = icmp ult i64 %gfull, %G",
          "  br i1 %hasrem, label %krem, label %kend",
          "krem:",  # the last G mod unroll steps of K, one chain per accumulator
          "  %gr = phi i64 [%gfull, %kmid], [%grn, %krem]"]
    for r in range(rows):
        for c in range(2):
            L.append(f"  %q{r}_{c} = phi {vt} [%m{r}_{c}, %kmid], [%qn{r}_{c}, %krem]")
    L += _product_step(target, mode, 99, "%gr", rows,
                       [[f"%q{r}_{c}" for c in range(2)] for r in range(rows)],
                       [[f"%qn{r}_{c}" for c in range(2)] for r in range(rows)])
    L += ["  %grn = add i64 %gr, 1",
          "  %rmore = icmp ult i64 %grn, %G",
          "  br i1 %rmore, label %krem, label %kend",
          "kend:"]
    for r in range(rows):
        for c in range(2):
            L.append(f"  %acc{r}_{c} = phi {vt} [%m{r}_{c}, %kmid], [%qn{r}_{c}, %krem]")
    # the gates of these 32 columns: (8-bit: - zb * rowsum(codes), zb is 0 for symmetric
    # weights; float(acc) * (a_scale * r_scale)) + x, clip, tanh, * half + shift
    L += ["  %left = sub i64 %HG, %col",
          *ir.lane_mask("%mk0", "%left"),
          *ir.lane_mask("%mk1", "%left", 16)]
    for c, at in enumerate(("%col", "%col16")):
        L += [*_vector_at(f"%bd{c}", "%c_bound", at),
              f"  %nbd{c} = fneg {_VF} %bd{c}",
              *_vector_at(f"%nv{c}", "%c_nan", at),
              *_vector_at(f"%hf{c}", "%c_half", at),
              *_vector_at(f"%sh{c}", "%c_shift", at)]
        if gru:  # cols[0]: Rbh on h's columns; cols[4]: 1 on the activated (z, r) columns
            L += [*_vector_at(f"%rb{c}", "%cols", at),
                  *_vector_at(f"%af{c}", "%c_act", at),
                  f"  %act{c} = fcmp ogt {_VF} %af{c}, zeroinitializer"]
        if u8:
            L += [*_vector_at(f"%zb{c}", "%zb", at, _V, "i32"),
                  *_vector_at(f"%rs{c}", "%cols", at),
                  f"  %sc{c} = fmul {_VF} %asv, %rs{c}"]
        for r in range(rows):
            t = f"%e{r}_{c}"
            if u8:
                L += [f"  {t}.z = mul {_V} %zb{c}, %rcv{r}",
                      f"  {t}.i = sub {_V} %acc{r}_{c}, {t}.z",
                      f"  {t}.f = sitofp {_V} {t}.i to {_VF}",
                      f"  {t}.m = fmul {_VF} {t}.f, %sc{c}"]
                product = f"{t}.m"
            else:
                product = f"%acc{r}_{c}"
            L += [f"  {t}.xo = add i64 %xo{r}, {at}",
                  *_vector_at(f"{t}.x", "%xrow", f"{t}.xo", mask=f"%mk{c}"),
                  f"  {t}.g0 = fadd {_VF} {product}, {t}.x",
                  # a NaN becomes cols[5]: the bound where onnxruntime's std::min/max clip
                  # applies (a biased LSTM, see rnn.clip_gates), NaN (kept) elsewhere
                  f"  {t}.un = fcmp uno {_VF} {t}.g0, zeroinitializer",
                  f"  {t}.g = select <16 x i1> {t}.un, {_VF} %nv{c}, {_VF} {t}.g0",
                  # numpy's clip: NaN stays NaN
                  f"  {t}.lt = fcmp olt {_VF} {t}.g, %nbd{c}",
                  f"  {t}.gl = select <16 x i1> {t}.lt, {_VF} %nbd{c}, {_VF} {t}.g",
                  f"  {t}.gt = fcmp ogt {_VF} {t}.gl, %bd{c}",
                  f"  {t}.gc = select <16 x i1> {t}.gt, {_VF} %bd{c}, {_VF} {t}.gl"]
            if gru:  # halved after the clip: exactly the halved sum the LSTM gets
                L += [f"  {t}.gh = fmul {_VF} {t}.gc, %hf{c}",
                      f"  {t}.th = call {_VF} @tanh16({_VF} {t}.gh)"]
            else:
                L.append(f"  {t}.th = call {_VF} @tanh16({_VF} {t}.gc)")
            L += [f"  {t}.ga = fmul {_VF} {t}.th, %hf{c}",
                  f"  {t}.gs{'a' if gru else ''} = fadd {_VF} {t}.ga, %sh{c}"]
            if gru:
                L += [f"  {t}.raw = fadd {_VF} {product}, %rb{c}",
                      f"  {t}.gs = select <16 x i1> %act{c}, {_VF} {t}.gsa, {_VF} {t}.raw"]
            L += [f"  {t}.go = add i64 %go{r}, {at}",
                  f"  {t}.gp = getelementptr float, ptr %gates, i64 {t}.go",
                  f"  store {_VF} {t}.gs, ptr {t}.gp, align 4"]
    L += ["  %pn = add i64 %p, 1",
          "  %pmore = icmp ult i64 %pn, %npan",
          "  br i1 %pmore, label %panel, label %cell0"]
    L += (_gru_cells if gru else _lstm_cells)(rows)
    L += ["done:", "  ret void", "}"]
    return L


def _unit_loops(rows: int, row_lines, unit_lines) -> list[str]:
    """Each row's cell update in turn (blocks %cell{r}, then %done), 16 units at a time: per row
    ``row_lines(r)`` (its pointers), per 16 units ``unit_lines(r, u, mask)`` (loads, arithmetic,
    the new h as ``{u}hn``), then h stored into the state and into ys."""
    L = []
    for r in range(rows):
        nxt = f"%cell{r + 1}" if r + 1 < rows else "%done"
        u = f"%u{r}"
        L += [f"cell{r}:",
              f"  %sr{r} = mul i64 %H, {r}",
              f"  %hr{r} = getelementptr float, ptr %hrow, i64 %sr{r}",
              f"  %yr{r} = getelementptr float, ptr %yrow, i64 %sr{r}",
              *row_lines(r),
              f"  br label %unit{r}",
              f"unit{r}:",
              f"  {u} = phi i64 [0, %cell{r}], [{u}n, %unit{r}]",
              f"  {u}l = sub i64 %H, {u}",
              *ir.lane_mask(f"{u}m", f"{u}l"),
              *unit_lines(r, u, f"{u}m"),
              *_store_at(f"{u}hn", f"%hr{r}", u, f"{u}m"),
              *_store_at(f"{u}hn", f"%yr{r}", u, f"{u}m"),
              f"  {u}n = add i64 {u}, 16",
              f"  {u}more = icmp ult i64 {u}n, %H",
              f"  br i1 {u}more, label %unit{r}, label {nxt}"]
    return L


def _lstm_cells(rows: int) -> list[str]:
    """Each row's LSTM update: gates i, o, f, c~ (activated); c' = f c + i c~, h' = o tanh(c')."""
    def row_lines(r):
        return [f"  %gi{r}.b = getelementptr float, ptr %gates, i64 %go{r}",
                f"  %gi{r}.o = getelementptr float, ptr %gi{r}.b, i64 %H",
                f"  %gi{r}.f = getelementptr float, ptr %gi{r}.o, i64 %H",
                f"  %gi{r}.c = getelementptr float, ptr %gi{r}.f, i64 %H",
                f"  %cr{r} = getelementptr float, ptr %crow, i64 %sr{r}"]

    def unit_lines(r, u, m):
        return [*_vector_at(f"{u}i", f"%gi{r}.b", u, mask=m),
                *_vector_at(f"{u}o", f"%gi{r}.o", u, mask=m),
                *_vector_at(f"{u}f", f"%gi{r}.f", u, mask=m),
                *_vector_at(f"{u}c", f"%gi{r}.c", u, mask=m),
                *_vector_at(f"{u}old", f"%cr{r}", u, mask=m),
                f"  {u}cf = fmul {_VF} {u}f, {u}old",
                f"  {u}ic = fmul {_VF} {u}i, {u}c",
                f"  {u}cn = fadd {_VF} {u}cf, {u}ic",
                f"  {u}tc = call {_VF} @tanh16({_VF} {u}cn)",
                f"  {u}hn = fmul {_VF} {u}o, {u}tc",
                *_store_at(f"{u}cn", f"%cr{r}", u, m)]

    return _unit_loops(rows, row_lines, unit_lines)


def _gru_cells(rows: int) -> list[str]:
    """Each row's GRU update, as rnn.GRU computes it (linear_before_reset):
    n = tanh(clip((h R_h + Rbh) * r + x_h)); h' = (h - n) * z + n."""
    def row_lines(r):
        return [f"  %gz{r} = getelementptr float, ptr %gates, i64 %go{r}",
                f"  %gr{r} = getelementptr float, ptr %gz{r}, i64 %H",
                f"  %gh{r} = getelementptr float, ptr %gr{r}, i64 %H",
                *(["  %H2 = shl i64 %H, 1"] if r == 0 else []),
                f"  %xh{r}.o = add i64 %xo{r}, %H2",
                f"  %xh{r} = getelementptr float, ptr %xrow, i64 %xh{r}.o",
                f"  %bh{r} = getelementptr float, ptr %c_bound, i64 %H2",
                f"  %nh{r} = getelementptr float, ptr %c_nan, i64 %H2"]

    def unit_lines(r, u, m):
        return [*_vector_at(f"{u}z", f"%gz{r}", u, mask=m),
                *_vector_at(f"{u}r", f"%gr{r}", u, mask=m),
                *_vector_at(f"{u}h", f"%gh{r}", u, mask=m),
                *_vector_at(f"{u}x", f"%xh{r}", u, mask=m),
                *_vector_at(f"{u}b", f"%bh{r}", u, mask=m),
                *_vector_at(f"{u}old", f"%hr{r}", u, mask=m),
                *_vector_at(f"{u}nv", f"%nh{r}", u, mask=m),
                f"  {u}hr = fmul {_VF} {u}h, {u}r",
                f"  {u}p0 = fadd {_VF} {u}hr, {u}x",
                # a NaN becomes cols[5] (the bound with B, NaN without), as in the gates
                f"  {u}un = fcmp uno {_VF} {u}p0, zeroinitializer",
                f"  {u}p = select <16 x i1> {u}un, {_VF} {u}nv, {_VF} {u}p0",
                f"  {u}nb = fneg {_VF} {u}b",
                f"  {u}lt = fcmp olt {_VF} {u}p, {u}nb",
                f"  {u}pl = select <16 x i1> {u}lt, {_VF} {u}nb, {_VF} {u}p",
                f"  {u}gt = fcmp ogt {_VF} {u}pl, {u}b",
                f"  {u}pc = select <16 x i1> {u}gt, {_VF} {u}b, {_VF} {u}pl",
                f"  {u}nn = call {_VF} @tanh16({_VF} {u}pc)",
                f"  {u}d = fsub {_VF} {u}old, {u}nn",
                f"  {u}dz = fmul {_VF} {u}d, {u}z",
                f"  {u}hn = fadd {_VF} {u}dz, {u}nn"]

    return _unit_loops(rows, row_lines, unit_lines)


def _step_function(mode: str, kind: str = "lstm") -> list[str]:
    """``@lstm_u8`` / ``@lstm_f32``: all ``steps`` of one direction.

    xw: steps x [B, 4H] inputs' part (biased, i/o/f halved), ``xs`` floats between steps;
    h, c [B, H]: the state, updated in place; ys: steps x [B, H], ``ys_step`` floats apart,
    each step's h. R: ``panels`` of 32 columns over K steps (``G``: K/4 groups in 8 bits, H
    rows in float32), ``width`` columns in all. cols [4, width] float32: a step's scale factor
    (8-bit: r_scale, halved for i, o, f), half, shift, clip bound (inf: none). 8-bit only:
    slope [width] int32 ``K*zb - colsum(R)``, zb [width] int32, scratch codes [B, 4G] uint8,
    params [2] float32, rowc [B] int32. gates [GROUP, width] float32 scratch."""
    u8 = mode == "u8"
    tails = " ".join(f"i64 {r}, label %g{r}" for r in range(1, GROUP))
    L = [f"define void @{kind}_{mode}(ptr %xw, i64 %xs, ptr %h, ptr %c, ptr %ys, i64 %ys_step, "
         "i64 %steps, i64 %B, i64 %H, ptr %panels, i64 %G, i64 %width, ptr %slope, ptr %zb, "
         "ptr %cols, ptr %codes, ptr %gates, ptr %params, ptr %rowc, float %flat_scale) "
         "nounwind {",
         "entry:",
         "  %G4 = shl i64 %G, 2",
         f"  %HG = mul i64 %H, {3 if kind == 'gru' else 4}",  # gate columns: a row of x
         "  %n = mul i64 %B, %H",
         f"  %lda = {'add i64 %G4, 0' if u8 else 'add i64 %H, 0'}",
         "  %pz = getelementptr float, ptr %params, i64 1",
         "  %work = icmp sgt i64 %n, 0",
         "  %any = icmp sgt i64 %steps, 0",
         "  %go = and i1 %work, %any",
         "  br i1 %go, label %step, label %end",
         "step:",
         "  %t = phi i64 [0, %entry], [%tn, %row_next]",
         "  %xstep.o = mul i64 %t, %xs",
         "  %xstep = getelementptr float, ptr %xw, i64 %xstep.o",
         "  %ystep.o = mul i64 %t, %ys_step",
         "  %ystep = getelementptr float, ptr %ys, i64 %ystep.o"]
    if u8:  # quantize h (all rows, one scale), then each row's codes and their sum
        L += ["  call void @dq_params(ptr %h, i64 %n, ptr %params, float %flat_scale)",
              "  %a_scale = load float, ptr %params, align 4",
              "  %zpf = load float, ptr %pz, align 4",
              "  %zpi = fptosi float %zpf to i32",
              *ir.splat("%zpv", "%zpi", _V),
              *ir.splat("%asv", "%a_scale"),
              "  br label %codes_loop",
              "codes_loop:",
              "  %qb = phi i64 [0, %step], [%qbn, %codes_loop]",
              "  %qx.o = mul i64 %qb, %H",
              "  %qx = getelementptr float, ptr %h, i64 %qx.o",
              "  %qd.o = mul i64 %qb, %G4",
              "  %qd = getelementptr i8, ptr %codes, i64 %qd.o",
              "  %qsum = call i32 @dq_codes(ptr %qx, i64 %H, ptr %qd, float %a_scale, "
              "float %zpf)",
              "  %qs.p = getelementptr i32, ptr %rowc, i64 %qb",
              "  store i32 %qsum, ptr %qs.p, align 4",
              "  %qbn = add i64 %qb, 1",
              "  %qmore = icmp ult i64 %qbn, %B",
              "  br i1 %qmore, label %codes_loop, label %rows"]
        first, zpv, asv = "%codes_loop", "%zpv", "%asv"
    else:
        L += ["  br label %rows"]
        first, zpv, asv = "%step", "zeroinitializer", "zeroinitializer"
    call = ("ptr %arow, i64 %lda, ptr %xrow, ptr %hrow, ptr %crow, ptr %yrow, ptr %rcp, "
            "i64 %H, i64 %G, i64 %width, ptr %panels, ptr %slope, ptr %zb, ptr %cols, "
            f"ptr %gates, {_V} {zpv}, {_VF} {asv}")
    L += ["rows:",  # groups of GROUP rows, then the last few
          f"  %b = phi i64 [0, {first}], [%bn, %group_done]",
          "  %hrow.o = mul i64 %b, %H",
          "  %hrow = getelementptr float, ptr %h, i64 %hrow.o",
          "  %crow = getelementptr float, ptr %c, i64 %hrow.o",
          "  %yrow = getelementptr float, ptr %ystep, i64 %hrow.o",
          "  %xrow.o = mul i64 %b, %HG",
          "  %xrow = getelementptr float, ptr %xstep, i64 %xrow.o",
          "  %rcp = getelementptr i32, ptr %rowc, i64 %b"]
    if u8:
        L += ["  %arow.o = mul i64 %b, %G4",
              "  %arow = getelementptr i8, ptr %codes, i64 %arow.o"]
    else:
        # h's row is the product's A but for a stacked step (G = inputs + H, one row): A is
        # [x, h] in one buffer, h's part last (Float32Recurrence.run_stacked)
        L += ["  %arow.o = sub i64 %H, %G",
              "  %arow = getelementptr float, ptr %hrow, i64 %arow.o"]
    L += ["  %left = sub i64 %B, %b",
          f"  %full = icmp sge i64 %left, {GROUP}",
          f"  %take = select i1 %full, i64 {GROUP}, i64 %left",
          f"  switch i64 %take, label %g{GROUP} [{tails}]"]
    for r in range(1, GROUP + 1):
        L += [f"g{r}:", f"  call void @group{r}({call})", "  br label %group_done"]
    L += ["group_done:",
          "  %bn = add i64 %b, %take",
          "  %bmore = icmp ult i64 %bn, %B",
          "  br i1 %bmore, label %rows, label %row_next",
          "row_next:",
          "  %tn = add i64 %t, 1",
          "  %tmore = icmp ult i64 %tn, %steps",
          "  br i1 %tmore, label %step, label %end",
          "end:",
          "  ret void",
          "}"]
    return L


# the step function's arguments, in order: a block of int64 words (the float's bits in the
# last) for ``@{kind}_{mode}_block``, which a call with one argument reaches (ctypes converts
# 20 arguments in ~5-8 us: about what a streaming LSTM step's products cost)
_ARGS = ("ptr", "i64", "ptr", "ptr", "ptr", "i64", "i64", "i64", "i64", "ptr", "i64", "i64",
         "ptr", "ptr", "ptr", "ptr", "ptr", "ptr", "ptr", "float")
XW, H_PTR, C_PTR, YS = 0, 2, 3, 4  # the words a call changes


def _block_function(mode: str, kind: str) -> list[str]:
    """``@{kind}_{mode}_block(ptr %a)``: ``@{kind}_{mode}`` on the words of ``%a``."""
    L = [f"define void @{kind}_{mode}_block(ptr %a) nounwind {{", "entry:"]
    args = []
    for i, t in enumerate(_ARGS):
        L += [f"  %w{i}.p = getelementptr i64, ptr %a, i64 {i}"]
        if t == "float":
            L += [f"  %w{i}.i = load i32, ptr %w{i}.p, align 8",
                  f"  %w{i} = bitcast i32 %w{i}.i to float"]
        else:
            L += [f"  %w{i} = load {t}, ptr %w{i}.p, align 8"]
        args.append(f"{t} %w{i}")
    return L + [f"  call void @{kind}_{mode}({', '.join(args)})", "  ret void", "}"]


def _module_ir(target: jit.Target, mode: str, kind: str = "lstm") -> str:
    decls = {*ir.declarations("store.f32", "load.f32", "fma", "fabs", "copysign", "rint",
                              "minnum")}
    helpers = []
    if mode == "u8":
        from . import quantize

        decls |= {*quantize.declarations(), *ir.dot_declarations(target)}
        helpers = [*quantize.functions(), ""]
    groups = [line for rows in range(1, GROUP + 1)
              for line in _group_function(target, mode, rows, kind)]
    return "\n".join([*sorted(decls), "", *helpers, *ir.tanh_function(), "", *groups, "",
                      *_step_function(mode, kind), "", *_block_function(mode, kind)])


def module_ir_u8(target: jit.Target) -> str:
    return _module_ir(target, "u8")


def module_ir_f32(target: jit.Target) -> str:
    return _module_ir(target, "f32")


def module_ir_gru(target: jit.Target) -> str:
    return _module_ir(target, "f32", "gru")


_P, _I = ctypes.c_void_p, ctypes.c_int64
_PROTO = ctypes.CFUNCTYPE(None, _P, _I, _P, _P, _P, _I, _I, _I, _I, _P, _I, _I, _P, _P, _P, _P,
                          _P, _P, _P, ctypes.c_float)
_BLOCK_PROTO = ctypes.CFUNCTYPE(None, _P)


_MODULES = {"lstm_u8": module_ir_u8, "lstm_f32": module_ir_f32, "gru_f32": module_ir_gru}


def _function(name: str):
    """The compiled ``name`` (lstm_u8, lstm_f32, gru_f32); raises ``jit.Unavailable`` where it
    cannot run (checked at every preparation: ``compiled.disabled()`` and the environment
    switch apply)."""
    requires = INT8_REQUIRES if name.endswith("u8") else FLOAT_REQUIRES
    reason = jit.why_unavailable(requires)
    if reason:
        raise jit.Unavailable(reason)
    return getattr(jit.compile_module(name, _MODULES[name], _signatures(name), requires), name)


def _signatures(name: str) -> dict:
    return {name: _PROTO, f"{name}_block": _BLOCK_PROTO}


def _block_function_of(name: str):
    """``_function(name)``'s ``_block`` entry (one pointer: the argument block)."""
    _function(name)  # the checks and the compilation
    requires = INT8_REQUIRES if name.endswith("u8") else FLOAT_REQUIRES
    return getattr(jit.compile_module(name, _MODULES[name], _signatures(name), requires),
                   f"{name}_block")


def _gate_columns(width: int, half: np.ndarray, clip: float | None, scale=None,
                  gru: bool = False, biased: bool = False) -> np.ndarray:
    """[6, width] float32: the step's scale factor (8-bit) or Rbh (GRU), half, shift, clip
    bound (inf: no clip; halved where the LSTM's inputs come halved), activated columns (GRU),
    what a NaN pre-activation becomes: with ``biased`` (an LSTM or GRU with B) onnxruntime's clip
    makes it +bound (its FLT_MAX, halved, when no clip is set: inf here, the same after tanh),
    else it stays NaN."""
    cols = np.zeros((6, width), np.float32)
    n = half.size
    if scale is not None:
        cols[0, :n] = scale
    cols[1, :n] = half
    cols[2, :n] = 1 - half
    cols[3] = np.inf
    if clip is not None:
        cols[3, :n] = np.float32(clip) if gru else half * np.float32(clip)
    if gru:
        cols[4, : 2 * (n // 3)] = 1
    cols[5] = cols[3] if biased else np.nan
    return cols


class _Recurrence:
    """What both products share: the gate factors and ``run``'s checks and call."""

    gates = 4  # an LSTM's i, o, f, c~; a GRU's z, r, h: 3 (and no cell state)
    H = 0
    width = 0
    half: np.ndarray
    cols: np.ndarray

    def run(self, xw: np.ndarray, h: np.ndarray, c: np.ndarray | None, ys: np.ndarray) -> None:
        """All steps: ``xw`` [steps, B, gates*H] (biased; an LSTM's i/o/f halved), ``h``/``c``
        [B, H] (updated in place to the final state; a GRU has no ``c``: None), ``ys``
        [steps, B, H] receives every step's h. float32; h and c C-contiguous, xw and ys
        contiguous but for their first (step) axis."""
        args = self._checked(xw, h, c, ys)
        if args is not None:
            self._call(*args)

    def _checked(self, xw: np.ndarray, h: np.ndarray, c: np.ndarray | None, ys: np.ndarray
                 ) -> tuple | None:
        """``run``'s checks; ``_call``'s arguments, or None where there is nothing to do."""
        steps, B = xw.shape[:2]
        H = self.H
        arrays = [("xw", xw, (steps, B, self.gates * H)), ("h", h, (B, H)),
                  ("ys", ys, (steps, B, H))]
        if self.gates == 4:
            arrays.append(("c", c, (B, H)))
        for name, a, shape in arrays:
            whole = a.flags.c_contiguous if name in ("h", "c") else (
                a[0].flags.c_contiguous and a.strides[0] % 4 == 0 if a.shape[0] else True)
            if a.shape != shape or a.dtype != np.float32 or not whole:
                raise ValueError(f"{type(self).__name__}.run: {name} must be a contiguous "
                                 f"float32{list(shape)}, got {a.dtype}{list(a.shape)}")
            if name != "xw" and not a.flags.writeable:
                raise ValueError(f"{type(self).__name__}.run: {name} must be writeable")
        if steps == 0 or B == 0:
            return None
        return (xw, xw.strides[0] // 4, h, h if c is None else c, ys, ys.strides[0] // 4,
                steps, B)

    def _call(self, xw, xs, h, c, ys, ys_step, steps, B) -> None:  # pragma: no cover
        raise NotImplementedError


class Int8Recurrence(_Recurrence):
    """DynamicQuantizeLSTM's recurrence for one direction: R packed (a ``PackedB``, int8 or
    uint8 with zero points) with its scale (scalar or per column); ``half`` the factor of the
    gates' pre-activations (1/2 for i, o, f), ``clip`` the cell clip or None, ``biased``
    whether the LSTM has a B (onnxruntime's clip turns NaN gates into +clip then)."""

    def __init__(self, packed: PackedB, r_scale, half: np.ndarray, clip: float | None,
                 biased: bool = False) -> None:
        if packed.N % 4 or packed.K != packed.N // 4 or half.shape != (packed.N,):
            raise ValueError(f"LSTM R must be [H, 4H], got [{packed.K}, {packed.N}]")
        if packed._slope32 is None:  # noqa: SLF001 - the zero-point terms must fit int32
            raise ValueError("LSTM R: zero-point terms overflow int32")
        self.packed, self.H, self.half, self.width = packed, packed.K, half, packed.width
        scale = np.broadcast_to(np.asarray(r_scale, np.float32).reshape(-1), half.shape)
        self.cols = _gate_columns(packed.width, half, clip, (scale * half).astype(np.float32),
                                  biased=biased)
        self.fn = _function("lstm_u8")

    def _call(self, xw, xs, h, c, ys, ys_step, steps, B) -> None:
        p = self.packed
        codes = np.zeros((B, p.G * 4), np.uint8)  # bytes past K meet zero rows of R
        gates = np.empty((GROUP, p.width), np.float32)
        params = np.empty(2, np.float32)
        rowc = np.empty(B, np.int32)
        self.fn(address(xw), xs, address(h), address(c), address(ys), ys_step, steps, B,
                self.H, p._panels_ptr, p.G, p.width, address(p._slope32),  # noqa: SLF001
                p._zb_ptr, address(self.cols), address(codes), address(gates),  # noqa: SLF001
                address(params), address(rowc), 1.0)


class Float32Recurrence(_Recurrence):
    """A float32 recurrence for one direction on ``RT`` [H, gates*H], laid out once in panels
    of 32 columns. ``kind`` "lstm": R^T of i, o, f, c~ with i, o, f already halved, as
    rnn.LSTM prepares it; "gru": R^T of z, r, h as it is, with ``rbh`` (Rbh, [H]) and
    linear_before_reset semantics. ``biased``: the LSTM or GRU has a B (see Int8Recurrence)."""

    def __init__(self, RT: np.ndarray, half: np.ndarray, clip: float | None,
                 kind: str = "lstm", rbh: np.ndarray | None = None,
                 biased: bool = False, inputs: int = 0) -> None:
        H = RT.shape[0] - inputs  # ``inputs`` > 0: [W^T; R^T] for run_stacked (an LSTM)
        self.gates = 3 if kind == "gru" else 4
        self.inputs = inputs
        n = self.gates * H
        if RT.ndim != 2 or RT.shape[1] != n or half.shape != (n,) or H <= 0 or \
                (kind == "gru") != (rbh is not None) or (inputs and kind == "gru"):
            raise ValueError(f"{kind.upper()} R^T must be [H, {self.gates}H], got "
                             f"{list(RT.shape)}")
        K = inputs + H
        npan, whole = -(-n // NR), n // NR
        # Panel p is RT[:, 32 p: 32 p + 32], copied straight from RT (a view of R's halved rows,
        # as rnn.LSTM hands it: each panel 32 of those rows, a cache-sized transpose), only
        # the last panel's missing columns zeroed: no padded copy of the whole of R^T.
        self.panels = aligned_empty((npan, K, NR), np.float32)  # 64-byte aligned loads
        self.panels[:whole] = RT[:, :whole * NR].reshape(K, whole, NR).transpose(1, 0, 2)
        if whole < npan:
            self.panels[whole, :, :n - whole * NR] = RT[:, whole * NR:]
            self.panels[whole, :, n - whole * NR:] = 0
        self.H, self.half, self.width = H, half, npan * NR
        raw = None
        if rbh is not None:  # added to h's columns of the product (cols[0])
            raw = np.zeros(n, np.float32)
            raw[2 * H:] = np.asarray(rbh, np.float32).reshape(-1)
        self.cols = _gate_columns(self.width, half, clip, raw, gru=kind == "gru",
                                  biased=biased)
        self._panels_ptr, self._cols_ptr = address(self.panels), address(self.cols)
        self._scratch: dict[tuple[int, int], list] = {}  # run_fresh's, per (steps, B)
        self.fn = _function(f"{kind}_f32")
        self._block_fn = _block_function_of(f"{kind}_f32")

    def dense(self) -> np.ndarray:
        """R^T [H, gates*H] back from the panels (for a numpy path: the panels are the only
        copy)."""
        H = self.H
        return np.ascontiguousarray(self.panels.transpose(1, 0, 2).reshape(
            self.inputs + H, -1)[self.inputs:, : self.gates * H])

    def _call(self, xw, xs, h, c, ys, ys_step, steps, B) -> None:
        words, _gates = self._block(xw, xs, h, c, ys, ys_step, steps, B)
        self._block_fn(address(words))

    def _block(self, xw, xs, h, c, ys, ys_step, steps, B) -> tuple[np.ndarray, np.ndarray]:
        """The kernel's argument block for ``_call``'s arguments, and the scratch it points
        at (both to be kept alive through the call)."""
        if self.inputs:
            raise ValueError("a stacked recurrence runs one step of one row: run_stacked")
        gates = np.empty((GROUP, self.width), np.float32)
        words = np.array([address(xw), xs, address(h), address(c), address(ys), ys_step, steps,
                          B, self.H, self._panels_ptr, self.H, self.width, 0, 0,
                          self._cols_ptr, 0, address(gates), 0, 0, _float_word(1.0)], np.int64)
        return words, gates

    def run_stacked(self, bias: np.ndarray, xh: np.ndarray, c: np.ndarray,
                    ys: np.ndarray | None) -> None:
        """One step of one row with the input product inside (a recurrence made with
        ``inputs`` = I, on [W^T; R^T]): gates = [x, h] @ [W^T; R^T] + bias, so a streaming
        step streams both weights in one pass, no separate GEMV and bias add. ``xh`` [I + H]
        holds x then h (h updated in place), ``c`` [1, 1, H], ``ys`` [1, 1, 1, H] or None,
        ``bias`` [4H]; all contiguous float32 (the caller made them)."""
        self._fresh(bias, address(xh) + 4 * self.inputs, c, ys, 1, 1)

    def run_fresh(self, xw: np.ndarray, h: np.ndarray, c: np.ndarray, ys: np.ndarray | None,
                  steps: int, B: int) -> None:
        """``run`` without its checks, for a caller that has just made the arrays: ``xw``
        [steps * B, gates*H], ``h`` / ``c`` [1, B, H], ``ys`` [steps, 1, B, H] (None: the
        steps' h are not wanted), all new C-contiguous float32 (a streaming LSTM's step a
        call: the checks and the reshapes cost more than the step's products). The kernel's
        scratch (and an unwanted ys) come from a pool per shape with the kernel's argument
        block, only the arrays' addresses written per call: list pop / append are atomic, so
        concurrent runs take different buffers and blocks."""
        if self.inputs:
            raise ValueError("a stacked recurrence runs one step of one row: run_stacked")
        self._fresh(xw, address(h), c, ys, steps, B)

    def _fresh(self, xw, h_ptr: int, c, ys, steps: int, B: int) -> None:
        pool = self._scratch.get((steps, B))
        try:
            block, ys_ptr, keep = pool.pop()
        except (AttributeError, IndexError):
            gates = np.empty((GROUP, self.width), np.float32)
            unwanted = np.empty((steps, 1, B, self.H), np.float32)
            ys_ptr = address(unwanted)
            block = (ctypes.c_int64 * len(_ARGS))(
                0, B * self.gates * self.H, 0, 0, 0, B * self.H, steps, B, self.H,
                self._panels_ptr, self.inputs + self.H, self.width, 0, 0, self._cols_ptr, 0,
                address(gates), 0, 0, _float_word(1.0))
            keep = (gates, unwanted)
            if pool is None and len(self._scratch) < 16:
                pool = self._scratch.setdefault((steps, B), [])
        block[XW] = address(xw)
        block[H_PTR] = h_ptr
        block[C_PTR] = address(c)
        block[YS] = ys_ptr if ys is None else address(ys)
        self._block_fn(ctypes.addressof(block))
        if pool is not None:
            pool.append((block, ys_ptr, keep))


def run_directions(recurrences: list, calls: list[tuple], threads: int) -> None:
    """``recurrences[d].run(*calls[d])`` for every direction, on up to ``threads`` threads at
    once. Float32 recurrences of one kind go to spin.py's workers by one fork of their
    argument blocks: a worker still spinning from the layer's input product starts at once,
    and a direction no worker has begun is run by the caller (parallel.py's queue woke a
    Python thread, which then waited for the GIL and for a core). 8-bit ones go to
    parallel.py's threads."""
    from ..parallel import run_each
    from . import spin

    fns = {id(fn): fn for fn in (getattr(r, "_block_fn", None) for r in recurrences)}
    pool = spin.usable() if threads > 1 and len(recurrences) > 1 else None
    if pool is None or len(fns) != 1 or None in fns.values() or \
            len(recurrences) - 1 > pool.size:
        run_each(lambda d: recurrences[d].run(*calls[d]), len(recurrences), threads)
        return
    parts = [(r, r._checked(*a)) for r, a in zip(recurrences, calls, strict=True)]
    blocks = [r._block(*a) for r, a in parts if a is not None]  # (words, scratch) each
    if blocks:
        argv = np.array([address(words) for words, _ in blocks], np.int64)
        pool.fork(spin.function_address(next(iter(fns.values()))), argv)


def _float_word(value: float) -> int:
    """A float32's bits as an argument block's word."""
    return int(np.array(value, np.float32).view(np.int32))


# compiled with the other kernels on first use (jit._BUNDLE)
BUNDLE = {"lstm_u8": (module_ir_u8, INT8_REQUIRES), "lstm_f32": (module_ir_f32, FLOAT_REQUIRES),
          "gru_f32": (module_ir_gru, FLOAT_REQUIRES)}

__all__ = ["BUNDLE", "FLOAT_REQUIRES", "Float32Recurrence", "Int8Recurrence", "module_ir_f32",
           "module_ir_gru", "module_ir_u8", "run_directions"]
