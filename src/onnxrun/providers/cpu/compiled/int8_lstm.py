"""A whole direction of a quantized LSTM in one call: every time step's quantization of h,
its 8-bit product with R (VNNI), the gates and the cell update, without returning to Python.

Why: an LSTM step is small (a [B, H] x [H, 4H] product and 5H activations), so the numpy
cell spent ~30 us a step in per-call overhead — more than the arithmetic — and an int8 LSTM
ran no faster than its float32 original. Here a step of a 256-unit LSTM costs a few us.

Arithmetic per step, as the numpy path (``DynamicQuantizeLSTM._fast_direction``) and
onnxruntime compute it:
    codes, a_scale, zp = dynamic uint8 quantization of h (per tensor, over all rows)
    g = float(codes - zp) @ (R - zb) * (a_scale * r_scale[n]) + x[t]       (exact integers)
    with i, o, f pre-halved: g = tanh(clip(g)) * half + shift   (sigmoid of i, o, f; tanh of c)
    c = f * c + i * cc;  h = o * tanh(c)
rounded in the same order (no fused multiply-adds), except tanh (``ir.tanh_function``, ~2
ulp like numpy's). R is a ``PackedB``; rows of a batch run one at a time, each a
matrix-vector product over four independent accumulator chains per 16 columns.
"""

from __future__ import annotations

import ctypes

import numpy as np

from . import ir, jit, quantize
from .int8_gemm import REQUIRES, PackedB
from .jit import address

_V, _VF = ir.V, ir.VF
_VDP = "@llvm.x86.avx512.vpdpbusd.512"
CHAINS = 4  # accumulators per 16 columns: vpdpbusd's latency, hidden


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


def _step_function() -> list[str]:
    """``@lstm_u8``: all ``steps`` of one direction.

    xw [steps, B, 4H] inputs' part (biased, i/o/f halved); h, c [B, H] the state, updated in
    place; ys [steps, B, H] each step's h; panels/G/width R packed (PackedB); slope [width]
    int32 ``K*zb - colsum(R)``; zb [width] int32; cols [4, width] float32: a step's scale
    factor r_scale (halved for i, o, f), half, shift, clip bound (inf: none); codes [B, 4G]
    uint8 and gates [width] float32 scratch; params [2] float32 scratch."""
    L = ["define void @lstm_u8(ptr %xw, ptr %h, ptr %c, ptr %ys, i64 %steps, i64 %B, i64 %H, "
         "ptr %panels, i64 %G, i64 %width, ptr %slope, ptr %zb, ptr %cols, ptr %codes, "
         "ptr %gates, ptr %params, ptr %rowc, float %flat_scale) nounwind {",
         "entry:",
         "  %G4 = shl i64 %G, 2",
         "  %pstride = shl i64 %G, 7",
         "  %H4 = shl i64 %H, 2",
         "  %npan = lshr i64 %width, 5",
         "  %n = mul i64 %B, %H",
         "  %gfull = and i64 %G, -4",
         "  %c_half = getelementptr float, ptr %cols, i64 %width",
         "  %c_shift = getelementptr float, ptr %c_half, i64 %width",
         "  %c_bound = getelementptr float, ptr %c_shift, i64 %width",
         "  %pz = getelementptr float, ptr %params, i64 1",
         "  %work = icmp sgt i64 %n, 0",
         "  %any = icmp sgt i64 %steps, 0",
         "  %go = and i1 %work, %any",
         "  br i1 %go, label %step, label %end",

         # -- one time step: quantize h (all rows), then each row's product, gates, cell
         "step:",
         "  %t = phi i64 [0, %entry], [%tn, %row_next]",
         "  call void @dq_params(ptr %h, i64 %n, ptr %params, float %flat_scale)",
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
         "  %qsum = call i32 @dq_codes(ptr %qx, i64 %H, ptr %qd, float %a_scale, float %zpf)",
         "  %qs.p = getelementptr i32, ptr %rowc, i64 %qb",
         "  store i32 %qsum, ptr %qs.p, align 4",
         "  %qbn = add i64 %qb, 1",
         "  %qmore = icmp ult i64 %qbn, %B",
         "  br i1 %qmore, label %codes_loop, label %row",

         "row:",
         "  %b = phi i64 [0, %codes_loop], [%bn, %cell_done]",
         "  %arow.o = mul i64 %b, %G4",
         "  %arow = getelementptr i8, ptr %codes, i64 %arow.o",
         "  %rc.p = getelementptr i32, ptr %rowc, i64 %b",
         "  %rcs = load i32, ptr %rc.p, align 4",
         *ir.splat("%rcv", "%rcs", _V),
         "  %tb = mul i64 %t, %B",
         "  %tbb = add i64 %tb, %b",
         "  %xrow.o = mul i64 %tbb, %H4",
         "  %xrow = getelementptr float, ptr %xw, i64 %xrow.o",
         "  br label %panel",

         # -- one panel of 32 columns: the product over K, then its gates
         "panel:",
         "  %p = phi i64 [0, %row], [%pn, %panel_end]",
         "  %boff = mul i64 %p, %pstride",
         "  %bpan = getelementptr i8, ptr %panels, i64 %boff",
         "  %col = shl i64 %p, 5",
         "  %col16 = add i64 %col, 16"]
    for c, at in enumerate(("%col", "%col16")):
        L += [*_vector_at(f"%sl{c}", "%slope", at, _V, "i32"),
              f"  %init{c} = mul {_V} %sl{c}, %zpv"]
    L += ["  %has4 = icmp ne i64 %gfull, 0",
          "  br i1 %has4, label %k4, label %kmid",
          "k4:",
          "  %g = phi i64 [0, %panel], [%gn, %k4]"]
    for j in range(CHAINS):
        for c in range(2):
            start = f"%init{c}" if j == 0 else "zeroinitializer"
            L.append(f"  %a{j}_{c} = phi {_V} [{start}, %panel], [%n{j}_{c}, %k4]")
    for j in range(CHAINS):
        L += [f"  %gg{j} = add i64 %g, {j}",
              f"  %bo{j} = shl i64 %gg{j}, 7",
              f"  %bp{j}_0 = getelementptr i8, ptr %bpan, i64 %bo{j}",
              f"  %b{j}_0 = load {_V}, ptr %bp{j}_0, align 64",
              f"  %bp{j}_1 = getelementptr i8, ptr %bp{j}_0, i64 64",
              f"  %b{j}_1 = load {_V}, ptr %bp{j}_1, align 64",
              f"  %ao{j} = shl i64 %gg{j}, 2",
              f"  %ap{j} = getelementptr i8, ptr %arow, i64 %ao{j}",
              f"  %as{j} = load i32, ptr %ap{j}, align 1",
              *ir.splat(f"%av{j}", f"%as{j}", _V)]
        for c in range(2):
            L.append(f"  %n{j}_{c} = call {_V} {_VDP}({_V} %a{j}_{c}, {_V} %av{j}, "
                     f"{_V} %b{j}_{c})")
    L += [f"  %gn = add i64 %g, {CHAINS}",
          "  %kmore = icmp ult i64 %gn, %gfull",
          "  br i1 %kmore, label %k4, label %k4_sum",
          "k4_sum:"]
    for c in range(2):
        L += [f"  %s01_{c} = add {_V} %n0_{c}, %n1_{c}",
              f"  %s23_{c} = add {_V} %n2_{c}, %n3_{c}",
              f"  %s_{c} = add {_V} %s01_{c}, %s23_{c}"]
    L += ["  br label %kmid", "kmid:"]
    for c in range(2):
        L.append(f"  %m{c} = phi {_V} [%init{c}, %panel], [%s_{c}, %k4_sum]")
    L += ["  %hasrem = icmp ult i64 %gfull, %G",
          "  br i1 %hasrem, label %krem, label %kend",
          "krem:",  # the last K/4 mod 4 groups, on one chain
          "  %gr = phi i64 [%gfull, %kmid], [%grn, %krem]"]
    for c in range(2):
        L.append(f"  %r{c} = phi {_V} [%m{c}, %kmid], [%rn{c}, %krem]")
    L += ["  %bor = shl i64 %gr, 7",
          "  %bpr0 = getelementptr i8, ptr %bpan, i64 %bor",
          f"  %br0 = load {_V}, ptr %bpr0, align 64",
          "  %bpr1 = getelementptr i8, ptr %bpr0, i64 64",
          f"  %br1 = load {_V}, ptr %bpr1, align 64",
          "  %aor = shl i64 %gr, 2",
          "  %apr = getelementptr i8, ptr %arow, i64 %aor",
          "  %asr = load i32, ptr %apr, align 1",
          *ir.splat("%avr", "%asr", _V)]
    for c in range(2):
        L.append(f"  %rn{c} = call {_V} {_VDP}({_V} %r{c}, {_V} %avr, {_V} %br{c})")
    L += ["  %grn = add i64 %gr, 1",
          "  %rmore = icmp ult i64 %grn, %G",
          "  br i1 %rmore, label %krem, label %kend",
          "kend:"]
    for c in range(2):
        L.append(f"  %acc{c} = phi {_V} [%m{c}, %kmid], [%rn{c}, %krem]")
    # the gates of these 32 columns: - zb * rowsum(codes) (zb is 0 for symmetric weights),
    # float(acc) * (a_scale * r_scale) + x, clip, tanh, * half + shift
    L += ["  %left = sub i64 %H4, %col",
          *ir.lane_mask("%mk0", "%left"),
          *ir.lane_mask("%mk1", "%left", 16)]
    for c, at in enumerate(("%col", "%col16")):
        L += [*_vector_at(f"%zb{c}", "%zb", at, _V, "i32"),
              f"  %zr{c} = mul {_V} %zb{c}, %rcv",
              f"  %e{c} = sub {_V} %acc{c}, %zr{c}",
              f"  %f{c} = sitofp {_V} %e{c} to {_VF}",
              *_vector_at(f"%rs{c}", "%cols", at),
              f"  %sc{c} = fmul {_VF} %asv, %rs{c}",
              f"  %fm{c} = fmul {_VF} %f{c}, %sc{c}",
              *_vector_at(f"%x{c}", "%xrow", at, mask=f"%mk{c}"),
              f"  %gx{c} = fadd {_VF} %fm{c}, %x{c}",
              *_vector_at(f"%bd{c}", "%c_bound", at),
              f"  %nbd{c} = fneg {_VF} %bd{c}",
              # numpy's clip: NaN stays NaN
              f"  %lt{c} = fcmp olt {_VF} %gx{c}, %nbd{c}",
              f"  %gl{c} = select <16 x i1> %lt{c}, {_VF} %nbd{c}, {_VF} %gx{c}",
              f"  %gt{c} = fcmp ogt {_VF} %gl{c}, %bd{c}",
              f"  %gc{c} = select <16 x i1> %gt{c}, {_VF} %bd{c}, {_VF} %gl{c}",
              f"  %th{c} = call {_VF} @tanh16({_VF} %gc{c})",
              *_vector_at(f"%hf{c}", "%c_half", at),
              *_vector_at(f"%sh{c}", "%c_shift", at),
              f"  %ga{c} = fmul {_VF} %th{c}, %hf{c}",
              f"  %gs{c} = fadd {_VF} %ga{c}, %sh{c}",
              f"  %gp{c} = getelementptr float, ptr %gates, i64 {at}",
              f"  store {_VF} %gs{c}, ptr %gp{c}, align 4"]
    L += ["  br label %panel_end",
          "panel_end:",
          "  %pn = add i64 %p, 1",
          "  %pmore = icmp ult i64 %pn, %npan",
          "  br i1 %pmore, label %panel, label %cell",

          # -- the cell update of row b, 16 units at a time: gates are i, o, f, c
          "cell:",
          "  %hrow.o = mul i64 %b, %H",
          "  %hrow = getelementptr float, ptr %h, i64 %hrow.o",
          "  %crow = getelementptr float, ptr %c, i64 %hrow.o",
          "  %yrow.o = mul i64 %tbb, %H",
          "  %yrow = getelementptr float, ptr %ys, i64 %yrow.o",
          "  %go_o = getelementptr float, ptr %gates, i64 %H",
          "  %H2 = shl i64 %H, 1",
          "  %go_f = getelementptr float, ptr %gates, i64 %H2",
          "  %H3 = mul i64 %H, 3",
          "  %go_c = getelementptr float, ptr %gates, i64 %H3",
          "  br label %unit",
          "unit:",
          "  %u = phi i64 [0, %cell], [%un, %unit]",
          "  %uleft = sub i64 %H, %u",
          *ir.lane_mask("%um", "%uleft"),
          *_vector_at("%gi", "%gates", "%u", mask="%um"),
          *_vector_at("%gov", "%go_o", "%u", mask="%um"),
          *_vector_at("%gf", "%go_f", "%u", mask="%um"),
          *_vector_at("%gcc", "%go_c", "%u", mask="%um"),
          *_vector_at("%cold", "%crow", "%u", mask="%um"),
          f"  %cf = fmul {_VF} %gf, %cold",
          f"  %ic = fmul {_VF} %gi, %gcc",
          f"  %cnew = fadd {_VF} %cf, %ic",
          f"  %tc = call {_VF} @tanh16({_VF} %cnew)",
          f"  %hnew = fmul {_VF} %gov, %tc",
          *_store_at("%cnew", "%crow", "%u", "%um"),
          *_store_at("%hnew", "%hrow", "%u", "%um"),
          *_store_at("%hnew", "%yrow", "%u", "%um"),
          "  %un = add i64 %u, 16",
          "  %umore = icmp ult i64 %un, %H",
          "  br i1 %umore, label %unit, label %cell_done",
          "cell_done:",
          "  %bn = add i64 %b, 1",
          "  %bmore = icmp ult i64 %bn, %B",
          "  br i1 %bmore, label %row, label %row_next",
          "row_next:",
          "  %tn = add i64 %t, 1",
          "  %tmore = icmp ult i64 %tn, %steps",
          "  br i1 %tmore, label %step, label %end",
          "end:",
          "  ret void",
          "}"]
    return L


def module_ir() -> str:
    decls = {*quantize.declarations(),
             *ir.declarations("vpdpbusd", "store.f32", "fma", "fabs", "copysign")}
    return "\n".join([*sorted(decls),
                      "", *quantize.functions(), "", *ir.tanh_function(), "",
                      *_step_function()])


_P, _I = ctypes.c_void_p, ctypes.c_int64
_PROTO = ctypes.CFUNCTYPE(None, _P, _P, _P, _P, _I, _I, _I, _P, _I, _I, _P, _P, _P, _P, _P, _P,
                          _P, ctypes.c_float)


def unavailable() -> str | None:
    return jit.why_unavailable(REQUIRES)


_compiled: list = []


def _function():
    if not _compiled:
        _compiled.append(jit.compile_module("int8_lstm", module_ir(), {"lstm_u8": _PROTO},
                                            REQUIRES).lstm_u8)
    return _compiled[0]


class LSTMDirection:
    """One direction's recurrent weights prepared for ``run``: R packed (a ``PackedB``) and the
    per-column factors. ``r_scale`` is R's scale (scalar or per column), ``half`` the factor
    applied to the gates' pre-activations (1/2 for i, o, f: their sigmoid is a tanh), ``clip``
    the cell clip or None."""

    def __init__(self, packed: PackedB, r_scale, half: np.ndarray, clip: float | None) -> None:
        if packed.N % 4 or packed.K != packed.N // 4:
            raise ValueError(f"LSTM R must be [H, 4H], got [{packed.K}, {packed.N}]")
        if packed._slope32 is None:  # noqa: SLF001 - zero-point terms must fit int32
            raise ValueError("LSTM R: zero-point terms overflow int32")
        self.packed, self.H, self.half = packed, packed.K, half
        width = packed.width
        cols = np.zeros((4, width), np.float32)
        cols[0] = packed._columns(np.asarray(r_scale, np.float32) * half, np.float32)  # noqa: SLF001
        cols[1, : half.size] = half
        cols[2, : half.size] = 1 - half
        cols[3] = np.inf
        if clip is not None:
            cols[3, : half.size] = half * np.float32(clip)
        self.cols = cols
        self.fn = _function()

    def run(self, xw: np.ndarray, h: np.ndarray, c: np.ndarray, ys: np.ndarray) -> None:
        """All steps: ``xw`` [steps, B, 4H] (biased, halved), ``h``/``c`` [B, H] (updated in
        place to the final state), ``ys`` [steps, B, H] receives every step's h. All float32
        and C-contiguous."""
        steps, B = xw.shape[:2]
        H, p = self.H, self.packed
        for name, a, shape in (("xw", xw, (steps, B, 4 * H)), ("h", h, (B, H)),
                               ("c", c, (B, H)), ("ys", ys, (steps, B, H))):
            if a.shape != shape or a.dtype != np.float32 or not a.flags.c_contiguous:
                raise ValueError(f"LSTMDirection.run: {name} must be a C-contiguous "
                                 f"float32{list(shape)}, got {a.dtype}{list(a.shape)}")
            if name != "xw" and not a.flags.writeable:
                raise ValueError(f"LSTMDirection.run: {name} must be writeable")
        codes = np.zeros((B, p.G * 4), np.uint8)
        gates = np.empty(p.width, np.float32)
        params = np.empty(2, np.float32)
        rowc = np.empty(max(B, 1), np.int32)
        self.fn(address(xw), address(h), address(c), address(ys), steps, B, H,
                p._panels_ptr, p.G, p.width, address(p._slope32), p._zb_ptr,  # noqa: SLF001
                address(self.cols), address(codes), address(gates), address(params),
                address(rowc), 1.0)


# compiled with the other kernels on first use (jit._BUNDLE)
BUNDLE = {"int8_lstm": (module_ir, REQUIRES)}

__all__ = ["BUNDLE", "LSTMDirection", "module_ir", "unavailable"]
