"""Exact 8-bit matrix products: sum_k (A[m,k] - a_zp) * (B[k,n] - b_zp[n]), on every target.

Why: numpy has no integer GEMM faster than float32 BLAS, so every int8 product used to be a
float32 GEMM plus conversions, and an int8 model ran slower than its float32 original. One
``vpdpbusd`` multiplies 64 unsigned bytes by 64 signed bytes and adds each group of four into
sixteen int32 lanes, exactly; the kernel here reaches 4-5x OpenBLAS's float32 GEMM on the same
shapes (docs/PERFORMANCE.md), with results identical to onnxruntime's integer kernels. Other
targets compute the same instruction's result (``ir.dot_u8s8``: AVX-VNNI's 256-bit form, or
bytes widened to 16 bits and ``vpmaddwd``, exact where onnxruntime's AVX2 ``vpmaddubsw``
saturates), on the same packed layout, with fewer rows per tile (``rows_per_tile``).

Layout (as in oneDNN and MLAS): B is packed once per session into panels of 32 columns, each
panel ``[K/4][32 columns][4 k]`` bytes, so one 64-byte load is 16 columns x 4 k; four bytes of
a row of A are broadcast to all lanes. A tile of R <= 8 rows x 32 columns keeps 2R accumulators
in registers for the whole K loop. A must be uint8 and B int8 (the instruction's operand
types); other combinations are shifted by 128 exactly and the shift moves into the zero points:

    sum (A - za)(B - zb) = sum A*B - za * colsum(B) - zb * rowsum(A) + K * za * zb

``init[n] = K*za*zb[n] - za*colsum(B)[n]`` starts each accumulator; the ``zb * rowsum(A)`` term is
applied per tile when some zb is not zero. The epilogue either stores int32, or float32
``float(acc) * scale[n] (+ bias[n])`` rounded exactly as onnxruntime's MLAS output processor does
(a multiply then an add, never fused). Padding: K is padded to a multiple of 4 with zero rows of
B (so bytes of A past K multiply zero), N to a multiple of 32 with zero columns; partial panels
store through a mask.
"""

from __future__ import annotations

import ctypes

import numpy as np

from . import ir, jit
from .jit import address
from .layout import aligned_zeros

REQUIRES = ()  # every target: ir.dot_u8s8
NR = 32  # columns per panel: two 16-lane (int32) vectors


def rows_per_tile(target: jit.Target) -> int:
    """Rows of A per tile: with AVX-512, 16 accumulators + 2 B registers + 1 broadcast of 32
    zmm registers; with 256-bit registers each accumulator takes two of 16 ymm."""
    return 8 if target.lanes == 16 else 3


MR = 8  # rows per tile on AVX-512 (rows_per_tile)
L2_BYTES_FOR_A = 192 * 1024  # rows of A per block: the block stays in L2 across all panels

_V, _VF, _VB = ir.V, ir.VF, ir.VB
_ELEM = {"i32": "i32", "f32": "i32", "f32c": "i32", "q8": "i8"}  # output element, for addresses


def _tile(target: jit.Target, R: int, mode: str) -> str:
    """One R x 32 tile over the whole K: accumulate, correct, scale, store (masked if partial)."""
    out_t = {"i32": _V, "f32": _VF, "f32c": _VF, "q8": _VB}[mode]
    elem = _ELEM[mode]
    L = [f"define internal void @tile{R}_{mode}(ptr %A, i64 %lda, ptr %B, i64 %G, ptr %init, "
         "ptr %rowc, ptr %zb, ptr %scale, ptr %bias, ptr %yq, ptr %C, i64 %ldc, i64 %ncols) "
         "nounwind {",
         "entry:",
         f"  %i0 = load {_V}, ptr %init, align 4",
         "  %ip1 = getelementptr i32, ptr %init, i64 16",
         f"  %i1 = load {_V}, ptr %ip1, align 4"]
    L += [f"  %ro{r} = mul i64 {r}, %lda" for r in range(R)]
    L += ["  br label %loop", "loop:", "  %g = phi i64 [0, %entry], [%gn, %loop]"]
    for r in range(R):
        for c in range(2):
            L.append(f"  %a{r}_{c} = phi {_V} [%i{c}, %entry], [%n{r}_{c}, %loop]")
    L += ["  %bo = shl i64 %g, 7",
          "  %bp0 = getelementptr i8, ptr %B, i64 %bo",
          f"  %b0 = load {_V}, ptr %bp0, align 1",
          "  %bp1 = getelementptr i8, ptr %bp0, i64 64",
          f"  %b1 = load {_V}, ptr %bp1, align 1",
          "  %ao = shl i64 %g, 2"]
    for r in range(R):
        L += [f"  %ax{r} = add i64 %ro{r}, %ao",
              f"  %ap{r} = getelementptr i8, ptr %A, i64 %ax{r}",
              f"  %as{r} = load i32, ptr %ap{r}, align 1",
              *ir.splat(f"%av{r}", f"%as{r}", _V)]
        for c in range(2):
            L += ir.dot_u8s8(target, f"%n{r}_{c}", f"%a{r}_{c}", f"%av{r}", f"%b{c}")
    L += ["  %gn = add i64 %g, 1",
          "  %more = icmp ult i64 %gn, %G",
          "  br i1 %more, label %loop, label %corr_check",
          # - zb[n] * rowsum(A)[m], only when some column's zero point is not zero
          "corr_check:",
          "  %hasc = icmp ne ptr %rowc, null",
          "  br i1 %hasc, label %corr, label %epi",
          "corr:",
          f"  %z0 = load {_V}, ptr %zb, align 4",
          "  %zp1 = getelementptr i32, ptr %zb, i64 16",
          f"  %z1 = load {_V}, ptr %zp1, align 4"]
    for r in range(R):
        L += [f"  %rcp{r} = getelementptr i32, ptr %rowc, i64 {r}",
              f"  %rcs{r} = load i32, ptr %rcp{r}, align 4",
              *ir.splat(f"%rcv{r}", f"%rcs{r}", _V)]
        for c in range(2):
            L += [f"  %m{r}_{c} = mul {_V} %rcv{r}, %z{c}",
                  f"  %k{r}_{c} = sub {_V} %n{r}_{c}, %m{r}_{c}"]
    L += ["  br label %epi", "epi:"]
    for r in range(R):
        for c in range(2):
            L.append(f"  %e{r}_{c} = phi {_V} [%n{r}_{c}, %corr_check], [%k{r}_{c}, %corr]")
    if mode in ("f32", "f32c"):  # float(acc) * scale (+ bias): two roundings, as MLAS
        L += [f"  %s0 = load {_VF}, ptr %scale, align 4",
              "  %sp1 = getelementptr float, ptr %scale, i64 16",
              f"  %s1 = load {_VF}, ptr %sp1, align 4",
              "  %hasb = icmp ne ptr %bias, null",
              "  br i1 %hasb, label %addb, label %noadd",
              "addb:",
              f"  %bb0 = load {_VF}, ptr %bias, align 4",
              "  %bbp1 = getelementptr float, ptr %bias, i64 16",
              f"  %bb1 = load {_VF}, ptr %bbp1, align 4",
              "  br label %scaled",
              "noadd:",
              "  br label %scaled",
              "scaled:",
              f"  %q0 = phi {_VF} [%bb0, %addb], [zeroinitializer, %noadd]",
              f"  %q1 = phi {_VF} [%bb1, %addb], [zeroinitializer, %noadd]"]
        for r in range(R):
            for c in range(2):
                L += [f"  %f{r}_{c} = sitofp {_V} %e{r}_{c} to {_VF}",
                      f"  %fm{r}_{c} = fmul {_VF} %f{r}_{c}, %s{c}",
                      f"  %fb{r}_{c} = fadd {_VF} %fm{r}_{c}, %q{c}",
                      # adding +0.0 would turn -0.0 into +0.0: keep the product without a bias
                      f"  %{'v' if mode == 'f32c' else 'o'}{r}_{c} = select i1 %hasb, "
                      f"{_VF} %fb{r}_{c}, {_VF} %fm{r}_{c}"]
        if mode == "f32c":  # then clipped to %yq = (lo, hi), as np.clip: NaN stays NaN
            L += ir.load_params("%yq", ("clo", "chi"))
            for r in range(R):
                for c in range(2):
                    t = f"%k{r}_{c}."
                    L += [f"  {t}lt = fcmp olt {_VF} %v{r}_{c}, %clo",
                          f"  {t}l = select <16 x i1> {t}lt, {_VF} %clo, {_VF} %v{r}_{c}",
                          f"  {t}gt = fcmp ogt {_VF} {t}l, %chi",
                          f"  %o{r}_{c} = select <16 x i1> {t}gt, {_VF} %chi, {_VF} {t}l"]
    elif mode == "q8":  # requantized: clamp(rint(float(acc) * scale) + zp, lo, hi), as MLAS
        L += [f"  %s0 = load {_VF}, ptr %scale, align 4",
              "  %sp1 = getelementptr float, ptr %scale, i64 16",
              f"  %s1 = load {_VF}, ptr %sp1, align 4"]
        L += ir.load_params("%yq", ("zp", "lo", "hi"))
        for r in range(R):
            for c in range(2):
                t = f"%y{r}_{c}."
                L += [f"  {t}f = sitofp {_V} %e{r}_{c} to {_VF}",
                      f"  {t}m = fmul {_VF} {t}f, %s{c}",
                      *ir.requantize(f"%o{r}_{c}", f"{t}m", "%zp", "%lo", "%hi")]
    else:
        for r in range(R):
            for c in range(2):
                L.append(f"  %o{r}_{c} = or {_V} %e{r}_{c}, zeroinitializer")
    L += ["  %full = icmp eq i64 %ncols, 32",
          "  br i1 %full, label %store, label %mstore",
          "store:"]
    for r in range(R):
        L.append(f"  %co{r} = mul i64 {r}, %ldc")
        for c in range(2):
            L += [f"  %cx{r}_{c} = add i64 %co{r}, {16 * c}",
                  f"  %cp{r}_{c} = getelementptr {elem}, ptr %C, i64 %cx{r}_{c}",
                  f"  store {out_t} %o{r}_{c}, ptr %cp{r}_{c}, align 1"]
    L += ["  ret void", "mstore:",
          *ir.lane_mask("%mk0", "%ncols"),
          *ir.lane_mask("%mk1", "%ncols", 16)]
    suffix = {"i32": "v16i32", "f32": "v16f32", "f32c": "v16f32", "q8": "v16i8"}[mode]
    for r in range(R):
        L.append(f"  %mo{r} = mul i64 {r}, %ldc")
        for c in range(2):
            L += [f"  %mx{r}_{c} = add i64 %mo{r}, {16 * c}",
                  f"  %mp{r}_{c} = getelementptr {elem}, ptr %C, i64 %mx{r}_{c}",
                  f"  call void @llvm.masked.store.{suffix}.p0({out_t} %o{r}_{c}, "
                  f"ptr %mp{r}_{c}, i32 1, <16 x i1> %mk{c})"]
    L += ["  ret void", "}"]
    return "\n".join(L)


def _gemm(mode: str, MR: int) -> str:
    """Blocks of rows of A (kept in L2), then panels [p0, p1), then tiles of MR rows."""
    tails = " ".join(f"i64 {r}, label %t{r}" for r in range(1, MR))
    elem = _ELEM[mode]
    call_args = ("ptr %tap, i64 %lda, ptr %bpan, i64 %G, ptr %initp, ptr %trc, ptr %zbp, "
                 "ptr %scp, ptr %bip, ptr %yq, ptr %tcp, i64 %ldc, i64 %ncols")
    L = [f"define void @gemm_{mode}(ptr %A, i64 %lda, ptr %Bp, i64 %G, ptr %init, ptr %rowc, "
         "ptr %zb, ptr %scale, ptr %bias, ptr %yq, ptr %C, i64 %ldc, i64 %M, i64 %N, i64 %p0, "
         "i64 %p1, i64 %mblock) nounwind {",
         "entry:",
         "  %pstride = shl i64 %G, 7",
         "  %hasrc = icmp ne ptr %rowc, null",
         "  %hasbias = icmp ne ptr %bias, null",
         "  %work = icmp slt i64 %p0, %p1",
         "  %rows = icmp sgt i64 %M, 0",
         "  %any = and i1 %work, %rows",
         "  br i1 %any, label %bloop, label %end",
         "bloop:",  # m0: first row of the block
         "  %m0 = phi i64 [0, %entry], [%m0n, %bnext]",
         "  %m0e = add i64 %m0, %mblock",
         "  %bend.lt = icmp slt i64 %m0e, %M",
         "  %bend = select i1 %bend.lt, i64 %m0e, i64 %M",
         "  %brows = sub i64 %bend, %m0",
         f"  %bfull.r = urem i64 %brows, {MR}",
         "  %bfull.n = sub i64 %brows, %bfull.r",
         "  %bfull = add i64 %m0, %bfull.n",
         "  %rem = sub i64 %bend, %bfull",
         "  br label %ploop",
         "ploop:",
         "  %p = phi i64 [%p0, %bloop], [%pn, %pnext]",
         "  %boff = mul i64 %p, %pstride",
         "  %bpan = getelementptr i8, ptr %Bp, i64 %boff",
         "  %col = shl i64 %p, 5",
         "  %left = sub i64 %N, %col",
         "  %wide = icmp sgt i64 %left, 32",
         "  %ncols = select i1 %wide, i64 32, i64 %left",
         "  %initp = getelementptr i32, ptr %init, i64 %col",
         "  %zbp = getelementptr i32, ptr %zb, i64 %col",
         "  %scp = getelementptr float, ptr %scale, i64 %col",
         "  %bip.g = getelementptr float, ptr %bias, i64 %col",
         "  %bip = select i1 %hasbias, ptr %bip.g, ptr null",
         f"  %cpan = getelementptr {elem}, ptr %C, i64 %col",
         "  %hasfull = icmp slt i64 %m0, %bfull",
         "  br i1 %hasfull, label %mloop, label %tail",
         "mloop:",
         "  %m = phi i64 [%m0, %ploop], [%mn, %mloop]",
         "  %aoff = mul i64 %m, %lda",
         "  %ap = getelementptr i8, ptr %A, i64 %aoff",
         "  %coff = mul i64 %m, %ldc",
         f"  %cp = getelementptr {elem}, ptr %cpan, i64 %coff",
         "  %rcg = getelementptr i32, ptr %rowc, i64 %m",
         "  %rc = select i1 %hasrc, ptr %rcg, ptr null",
         f"  call void @tile{MR}_{mode}(ptr %ap, i64 %lda, ptr %bpan, i64 %G, ptr %initp, "
         "ptr %rc, ptr %zbp, ptr %scp, ptr %bip, ptr %yq, ptr %cp, i64 %ldc, i64 %ncols)",
         f"  %mn = add i64 %m, {MR}",
         "  %mdone = icmp sge i64 %mn, %bfull",
         "  br i1 %mdone, label %tail, label %mloop",
         "tail:",
         "  %taoff = mul i64 %bfull, %lda",
         "  %tap = getelementptr i8, ptr %A, i64 %taoff",
         "  %tcoff = mul i64 %bfull, %ldc",
         f"  %tcp = getelementptr {elem}, ptr %cpan, i64 %tcoff",
         "  %trcg = getelementptr i32, ptr %rowc, i64 %bfull",
         "  %trc = select i1 %hasrc, ptr %trcg, ptr null",
         f"  switch i64 %rem, label %pnext [{tails}]"]
    for r in range(1, MR):
        L += [f"t{r}:", f"  call void @tile{r}_{mode}({call_args})", "  br label %pnext"]
    L += ["pnext:",
          "  %pn = add i64 %p, 1",
          "  %pdone = icmp sge i64 %pn, %p1",
          "  br i1 %pdone, label %bnext, label %ploop",
          "bnext:",
          "  %m0n = add i64 %m0, %mblock",
          "  %bdone = icmp sge i64 %m0n, %M",
          "  br i1 %bdone, label %end, label %bloop",
          "end:",
          "  ret void",
          "}"]
    return "\n".join(L)


def module_ir(target: jit.Target) -> str:
    decls = ir.dot_declarations(target) + ir.declarations("store.i32", "store.f32", "store.i8",
                                                          "rint", "minnum", "maxnum")
    MR = rows_per_tile(target)
    tiles = [_tile(target, r, mode) for mode in _MODES for r in range(1, MR + 1)]
    return "\n\n".join(decls + tiles + [_gemm(mode, MR) for mode in _MODES])


_MODES = ("i32", "f32", "f32c", "q8")
_P, _I = ctypes.c_void_p, ctypes.c_int64
_GEMM_PROTO = ctypes.CFUNCTYPE(None, _P, _I, _P, _I, _P, _P, _P, _P, _P, _P, _P, _I, _I, _I, _I,
                               _I, _I)


def _module() -> jit.Module:
    return jit.compile_module("int8_gemm", module_ir,
                              {f"gemm_{mode}": _GEMM_PROTO for mode in _MODES}, REQUIRES)


def unavailable() -> str | None:
    """None when the kernel can run here (its object loaded), else why not."""
    return jit.why_unavailable(REQUIRES) or jit.why_not_loaded("int8_gemm", _module)


def _padded(v: np.ndarray, n: int, dtype) -> np.ndarray:
    out = np.zeros(n, dtype)
    out[: v.size] = v
    return out


class PackedB:
    """A constant (K, N) 8-bit matrix with its zero point (scalar or per column), packed once
    for the VNNI kernel. Holds only the packed bytes (the same size as the matrix) and per
    column int32 sums."""

    __slots__ = ("K", "N", "G", "width", "panels", "zb_nonzero", "_zb32", "_slope",
                 "_slope32", "_panels_ptr", "_zb_ptr", "_mblock", "_functions", "_mr")

    def __init__(self, B: np.ndarray, zero_point=None) -> None:
        if B.ndim != 2 or B.dtype not in (np.int8, np.uint8):
            raise ValueError(f"PackedB: expected a 2-D int8/uint8 matrix, got {B.dtype}{B.shape}")
        module = _module()
        self._functions = {mode: getattr(module, f"gemm_{mode}") for mode in _MODES}
        self._mr = MR = rows_per_tile(module.target)
        K, N = B.shape
        K4, NP = -(-K // 4) * 4, -(-N // NR)
        zb = np.zeros(N, np.int64) if zero_point is None else np.broadcast_to(
            np.asarray(zero_point, np.int64).reshape(-1), (N,)).copy()
        if B.dtype == np.uint8:  # the instruction takes signed bytes: B - 128 and zb - 128
            Bs = (B.view(np.int8) ^ np.int8(-128))
            zb -= 128
        else:
            Bs = B
        full = np.zeros((K4, NP * NR), np.int8)
        full[:K, :N] = Bs
        # each 64-byte load (on a cache line) is 16 columns x 4 k in ir.dot_u8s8's order:
        # VNNI [K4/4, 4, NP, 2, 16] -> [NP, K4/4, 2, 16, 4]; else [.., 2, 16, 2 pairs, 2] ->
        # [NP, K4/4, 2, 2 pairs, 16, 2]
        self.panels = aligned_zeros((NP, K4 // 4, NR, 4), np.int8)
        if ir.vnni(module.target):
            self.panels[...] = full.reshape(K4 // 4, 4, NP, NR).transpose(2, 0, 3, 1)
        else:
            self.panels.reshape(NP, K4 // 4, 2, 2, 16, 2)[...] = \
                full.reshape(K4 // 4, 2, 2, NP, 2, 16).transpose(3, 0, 4, 1, 5, 2)
        self._panels_ptr = self.panels.ctypes.data
        self.K, self.N, self.G, self.width = K, N, K4 // 4, NP * NR
        zb = _padded(zb, self.width, np.int64)
        self._zb32 = zb.astype(np.int32)
        self._zb_ptr = self._zb32.ctypes.data
        self.zb_nonzero = bool(np.any(zb))
        # the zero-point terms start the accumulators: a_zp * (K * zb - colsum(B)); int32
        # arithmetic when that fits for any 8-bit a_zp (at most 383 after an int8 A's shift)
        self._slope = K * zb - _padded(Bs.sum(axis=0, dtype=np.int64), self.width, np.int64)
        self._slope32 = self._slope.astype(np.int32) if \
            int(np.abs(self._slope).max(initial=0)) * 383 < (1 << 31) else None
        self._mblock = max(MR, (L2_BYTES_FOR_A // K4) // MR * MR)

    def init(self, a_zero_point: int, int_bias=None) -> np.ndarray:
        """int32 starting values of the accumulators: the zero-point terms for a scalar zero
        point of A (as uint8), plus an int32 bias per column."""
        if int_bias is None and self._slope32 is not None:
            return np.multiply(self._slope32, np.int32(a_zero_point))
        v = a_zero_point * self._slope
        if int_bias is not None:
            v[: self.N] += np.asarray(int_bias, np.int64).reshape(-1)
        if np.abs(v).max(initial=0) >= 1 << 31:
            raise OverflowError("int8 GEMM: zero-point terms overflow int32")
        return v.astype(np.int32)

    def _columns(self, v, dtype) -> np.ndarray:
        """A per-tensor or per-column parameter as a padded row of ``width``."""
        if type(v) is np.ndarray and v.dtype == dtype and v.shape == (self.width,):
            return v  # already padded by the caller
        v = np.asarray(v, dtype)
        if v.size == 1:
            return np.full(self.width, v.reshape(()), dtype)
        return _padded(v.reshape(-1), self.width, dtype)

    def matmul(self, A: np.ndarray, a_zero_point: int = 0, *, scale=None, bias=None,
               int_bias=None, requantize=None, clip=None, out: np.ndarray | None = None,
               threads: int = 1) -> np.ndarray:
        """(A - a_zero_point) @ (B - zb) (+ ``int_bias``, int32 per column) for a 2-D uint8 or
        int8 A. Returns int32; or, given ``scale`` (scalar or per column), float32
        ``float(acc) * scale + bias``, then clipped to ``clip=(lo, hi)`` if given (a fused
        Relu / Clip); or, given also ``requantize=(zero_point, dtype)``, 8-bit
        ``clamp(rint(float(acc) * scale) + zero_point)``. ``out``: a C-contiguous (M, N) array
        of the result's type to write into."""
        if A.ndim != 2 or A.shape[1] != self.K:
            raise ValueError(f"expected A of shape [M, {self.K}], got {list(A.shape)}")
        if A.dtype == np.int8:  # unsigned bytes for the instruction: A + 128, zero point too
            A = A.view(np.uint8) ^ np.uint8(128)
            a_zero_point += 128
        elif A.dtype != np.uint8:
            raise TypeError(f"expected A of type uint8 or int8, got {A.dtype}")
        M = A.shape[0]
        K4 = self.G * 4
        if A.shape[1] != K4 or not A.flags.c_contiguous:
            Ap = np.empty((M, K4), np.uint8)  # bytes past K meet zero rows of B: any value does
            Ap[:, : self.K] = A
            A = Ap
        init = self.init(int(a_zero_point), int_bias)
        rowc = A[:, : self.K].sum(axis=1, dtype=np.int32) if self.zb_nonzero else None
        sc = bi = yq = None
        if scale is None:
            mode, dtype = "i32", np.dtype(np.int32)
        else:
            sc = self._columns(scale, np.float32)
            if requantize is None:
                mode, dtype = "f32", np.dtype(np.float32)
                bi = None if bias is None else self._columns(bias, np.float32)
                if clip is not None:
                    mode, yq = "f32c", np.array(clip, np.float32)
            else:
                mode, dtype = "q8", np.dtype(requantize[1])
                info = np.iinfo(dtype)
                yq = np.array([requantize[0], info.min, info.max], np.float32)
        if out is None:
            out = np.empty((M, self.N), dtype)
        elif out.shape != (M, self.N) or out.dtype != dtype or not out.flags.c_contiguous:
            raise ValueError(f"out must be a C-contiguous {dtype}[{M}, {self.N}] array")
        if M == 0 or self.N == 0:
            return out
        if self.K == 0:  # no products: the accumulators are their starting values
            return self._epilogue(np.broadcast_to(init[: self.N], (M, self.N)), mode, sc, bi,
                                  yq, out)
        fn = self._functions[mode]
        npan, MR = self.width // NR, self._mr
        a_ptr, out_ptr = address(A), address(out)
        rowc_ptr = None if rowc is None else address(rowc)
        fixed = (self._panels_ptr, self.G, address(init))
        cols = (self._zb_ptr, None if sc is None else address(sc),
                None if bi is None else address(bi), None if yq is None else address(yq))
        if threads <= 1 or M * npan < 2 * MR:
            fn(a_ptr, K4, *fixed, rowc_ptr, *cols, out_ptr, self.N, M, self.N, 0, npan,
               self._mblock)
            return out

        def rows(m0: int, m1: int, p0: int = 0, p1: int = npan) -> None:
            fn(a_ptr + m0 * K4, K4, *fixed, None if rowc_ptr is None else rowc_ptr + 4 * m0,
               *cols, out_ptr + m0 * self.N * dtype.itemsize, self.N, m1 - m0, self.N, p0, p1,
               self._mblock)

        from ..parallel import run_ranges, split

        if M >= 2 * MR * threads and npan < 2 * threads:
            # few panels (a convolution's output channels): split the rows instead
            run_ranges(rows, [(a * MR, min(M, b * MR)) for a, b in split(-(-M // MR), threads)])
        elif npan > 1:
            run_ranges(lambda p0, p1: rows(0, M, p0, p1), split(npan, threads))
        else:
            rows(0, M)
        return out

    def _epilogue(self, acc, mode, sc, bi, yq, out):
        if mode == "i32":
            out[...] = acc
            return out
        v = acc.astype(np.float32) * sc[: self.N]
        if mode in ("f32", "f32c"):
            out[...] = v if bi is None else v + bi[: self.N]
            if mode == "f32c":
                np.clip(out, yq[0], yq[1], out=out)
            return out
        out[...] = np.clip(np.rint(v) + yq[0], yq[1], yq[2])
        return out



# compiled with the other kernels on first use (jit._BUNDLE)
BUNDLE = {"int8_gemm": (module_ir, REQUIRES)}

__all__ = ["BUNDLE", "MR", "NR", "PackedB", "REQUIRES", "module_ir", "rows_per_tile",
           "unavailable"]
