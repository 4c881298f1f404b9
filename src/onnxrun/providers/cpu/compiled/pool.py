"""MaxPool and AveragePool in float32 on channels-last input: the depthwise kernel's loops
(``depthwise.py``: a row of output pixels per 16-channel chunk, padding masked instead of
copied) with the taps' maximum or sum in place of their weighted sum; from 64 channels
(``PIXEL_MAJOR_CHANNELS``) the other loop order, each pixel's chunks in turn (``_kernel``:
every tap reads a pixel's channels in order).

Why: numpy pools one spatial axis at a time in strided passes, each a fresh intermediate,
then copies the result into the channels-last output: 3-8x onnxruntime's time on the pools
of SqueezeNet, ShuffleNet and YOLO's SPPF (docs/PERFORMANCE.md, session 9). Here each output
pixel's chunk is read once per tap and stored once.

MaxPool gives numpy's numbers exactly (a NaN wins, as in ``np.maximum``); AveragePool sums
the window's taps in row order, then multiplies by the pixel's 1 / count (the numpy path's
factor, ``pool._counts``): results agree with the numpy path to float32 rounding.
"""

from __future__ import annotations

import ctypes

import numpy as np

from ..parallel import work_ranges
from . import depthwise, ir, jit, spin
from .jit import address

REQUIRES = ()  # generic vector IR: every target
MAX_TAPS = depthwise.MAX_TAPS
_P, _I = ctypes.c_void_p, ctypes.c_int64
_PROTO = ctypes.CFUNCTYPE(None, _P, _P, _P, _P, _P, *([_I] * 16))
_UNUSED = np.zeros(16, np.float32)  # the depthwise kernel's bias / bounds, never read here
_JOB = ctypes.CFUNCTYPE(None, _P)
# the depthwise kernel's (its loops are these): below, a pool stays on the calling thread
# (SqueezeNet's three 3x3 max pools, ShuffleNet's one, the global average pools' one row)
MIN_TAPS_PER_RANGE = depthwise.MIN_TAPS_PER_RANGE
# channels from which a pool's pixels are outer and their chunks inner (@pool_px_f32)
PIXEL_MAJOR_CHANNELS = 64


_VF = ir.VF


def _fold_tap(L: list[str], op: str, prev: str | None, x: str, acc: str) -> str:
    """The taps so far (``prev``, None before the first) with the next tap ``x``, in row
    order as the numpy path reduces them: their sum, or numpy's maximum (a NaN wins), named
    ``acc``; its lines appended to ``L``. Returns the value to go on with."""
    if prev is None:
        return x
    if op == "avg":
        L.append(f"  {acc} = fadd {_VF} {prev}, {x}")
    else:
        L += depthwise.numpy_maximum(acc, x, prev)
    return acc


def _taps(tag: str, c0: str, kh: int, kw: int, op: str, checked: bool,
          masked: bool) -> list[str]:
    """The 16-channel chunk from channel ``c0`` (an i64 value) of the output pixel ``%ow``:
    its taps read (``checked``: a tap outside the image reads the fill instead, ``-inf`` or
    0, its address clamped inside; ``masked``: lanes ``%mask`` only, C < 16) and reduced in
    row order as the numpy path does, then stored."""
    t = f"%{tag}"
    fill = depthwise._NEG_INF if op == "max" else "zeroinitializer"
    L, prev = [], None
    for i in range(kh):
        for j in range(kw):
            k = i * kw + j
            x = f"{t}.x{k}"
            L += [f"  {t}.a{k} = add i64 %off{k}, {c0}",
                  f"  {t}.p{k} = getelementptr float, ptr %X, i64 {t}.a{k}",
                  depthwise.tap_load(x, f"{t}.p{k}", "%mask", fill, masked)]
            if checked:
                L.append(f"  {t}.v{k} = select i1 %ok{k}, {_VF} {x}, {_VF} {fill}")
                x = f"{t}.v{k}"
            prev = _fold_tap(L, op, prev, x, f"{t}.acc{k}")
    if op == "avg":  # times the pixel's 1 / count
        L += [f"  {t}.o = fmul {_VF} {prev}, %sv"]
        prev = f"{t}.o"
    L += [f"  {t}.ya = add i64 %ya, {c0}",
          f"  {t}.yp = getelementptr float, ptr %Y, i64 {t}.ya",
          f"  call void @llvm.masked.store.v16f32.p0({_VF} {prev}, ptr {t}.yp, i32 4, "
          "<16 x i1> %mask)" if masked else f"  store {_VF} {prev}, ptr {t}.yp, align 4"]
    return L


def _output_row(kh: int, row: str) -> list[str]:
    """Block ``rloop``'s start: output row ``%r`` (image or plane ``%n`` = r / Ho, its row
    ``%oh``, its first byte's offset ``%nb`` = n * ``%img``, avg's factors' row ``%srow``),
    its first input row ``%ih``; then each tap row i: ``%rv{i}`` inside the image, ``%ro{i}``
    its offset (``%nb`` + the row, clamped to row 0, times ``row`` floats)."""
    L = ["rloop:",
         "  %r = phi i64 [%r0, %entry], [%rn, %rnext]",
         "  %n = udiv i64 %r, %Ho",
         "  %oh = urem i64 %r, %Ho",
         "  %ih0 = mul i64 %oh, %sh",
         "  %ih = sub i64 %ih0, %pt",
         "  %nb = mul i64 %n, %img",
         "  %srow = mul i64 %oh, %Wo"]
    for i in range(kh):
        L += [f"  %rd{i} = mul i64 %dh, {i}",
              f"  %rr{i} = add i64 %ih, %rd{i}",
              f"  %rv{i} = icmp ult i64 %rr{i}, %H",
              f"  %rs{i} = select i1 %rv{i}, i64 %rr{i}, i64 0",
              f"  %rm{i} = mul i64 %rs{i}, {row}",
              f"  %ro{i} = add i64 %nb, %rm{i}"]
    return L


def _kernel(kh: int, kw: int, op: str) -> str:
    """``@pool_px_f32``, ``@pool_f32``'s other loop order (the same parameters; ``%W``: avg's
    (Ho, Wo) factors, ``%bias``, ``%bounds``, ``%Cp``, ``%ow_lo``, ``%ow_hi`` unread): rows
    [r0, r1) of output
    pixels (n, oh) of the channels-last (N, H, Wd, C) input, each pixel's channels in
    16-channel chunks one after another, so that each tap reads a pixel's C floats in order
    (chunks outer and pixels inner read every pixel's lines in C / 16 separate passes: 1.4-1.5x
    the time on SqueezeNet's first pool, 96 channels). A partial last chunk is the last 16
    channels again (each channel pooled alone: the same values stored twice), or, under 16
    channels, masked. Windows are read in place: a tap outside the image reads the fill."""
    L = ["define void @pool_px_f32(ptr %X, ptr %W, ptr %bias, ptr %bounds, ptr %Y, i64 %C, "
         "i64 %Cp, i64 %H, i64 %Wd, i64 %Ho, i64 %Wo, i64 %sh, i64 %sw, i64 %dh, i64 %dw, "
         "i64 %pt, i64 %pl, i64 %ow_lo, i64 %ow_hi, i64 %r0, i64 %r1) nounwind {",
         "entry:",
         "  %rowc = mul i64 %Wd, %C",
         "  %img = mul i64 %H, %rowc",
         "  %cfull = and i64 %C, -16",  # chunks [0, cfull), then C - 16 where C % 16
         "  %ctail = sub i64 %C, %cfull",
         "  %tail = icmp ne i64 %ctail, 0",
         "  %small = icmp slt i64 %C, 16",
         "  %clast = sub i64 %C, 16",
         *ir.lane_mask("%mask", "%C"),
         "  %any = icmp slt i64 %r0, %r1",
         "  br i1 %any, label %rloop, label %end",
         *_output_row(kh, "%rowc"),
         "  %yr = mul i64 %r, %Wo",
         "  %yrow = mul i64 %yr, %C"]
    L += ["  br label %ploop",
          "ploop:",
          "  %ow = phi i64 [0, %rloop], [%own, %pnext]",
          "  %cw0 = mul i64 %ow, %sw",
          "  %cw = sub i64 %cw0, %pl",
          "  %yo = mul i64 %ow, %C",
          "  %ya = add i64 %yrow, %yo"]
    if op == "avg":
        L += ["  %si = add i64 %srow, %ow",
              "  %sp = getelementptr float, ptr %W, i64 %si",
              "  %sf = load float, ptr %sp, align 4",
              *ir.splat("%sv", "%sf")]
    for j in range(kw):  # each tap column: inside the image, its offset (clamped to 0)
        L += [f"  %cd{j} = mul i64 %dw, {j}",
              f"  %cj{j} = add i64 %cw, %cd{j}",
              f"  %cv{j} = icmp ult i64 %cj{j}, %Wd",
              f"  %cs{j} = select i1 %cv{j}, i64 %cj{j}, i64 0",
              f"  %co{j} = mul i64 %cs{j}, %C"]
    okall = "true"
    for i in range(kh):
        for j in range(kw):
            k = i * kw + j
            L += [f"  %off{k} = add i64 %ro{i}, %co{j}",
                  f"  %ok{k} = and i1 %rv{i}, %cv{j}",
                  f"  %all{k} = and i1 {okall}, %ok{k}"]
            okall = f"%all{k}"
    L += [f"  %inside = or i1 {okall}, false",
          "  br i1 %small, label %small.c, label %wide.pre",
          "small.c:",
          # under 16 channels: one masked chunk at 0 (addresses clamped: always checked)
          *_taps("sm", "0", kh, kw, op, True, True),
          "  br label %pnext",
          "wide.pre:",
          "  br i1 %inside, label %fast.c, label %slow.c"]
    for tag, checked in (("fast", False), ("slow", True)):
        L += [f"{tag}.c:",
              f"  %c0.{tag} = phi i64 [0, %wide.pre], [%cn.{tag}, %{tag}.next]",
              *_taps(tag, f"%c0.{tag}", kh, kw, op, checked, False),
              f"  %cn.{tag}a = add i64 %c0.{tag}, 16",
              # after the whole chunks, the last 16 channels once where C % 16
              f"  %past.{tag} = icmp sge i64 %cn.{tag}a, %cfull",
              f"  %once.{tag} = icmp ne i64 %c0.{tag}, %clast",  # (not a multiple of 16)
              f"  %again.{tag} = and i1 %tail, %once.{tag}",
              f"  %cn.{tag} = select i1 %past.{tag}, i64 %clast, i64 %cn.{tag}a",
              f"  %more.{tag}a = icmp slt i64 %cn.{tag}a, %cfull",
              f"  %more.{tag}b = and i1 %past.{tag}, %again.{tag}",
              f"  %more.{tag} = or i1 %more.{tag}a, %more.{tag}b",
              f"  br i1 %more.{tag}, label %{tag}.next, label %pnext",
              f"{tag}.next:",
              f"  br label %{tag}.c"]
    L += ["pnext:",
          "  %own = add i64 %ow, 1",
          "  %pmore = icmp slt i64 %own, %Wo",
          "  br i1 %pmore, label %ploop, label %rnext",
          *ir.chunk_and_row_loop_end()[3:]]  # the next output row, else return
    return "\n".join(L)


def module_ir(kh: int, kw: int, op: str) -> str:
    """``@pool_f32`` for a kh x kw window, ``op`` "max" or "avg" (the depthwise kernel's
    loops: chunks outer, pixels inner), and ``@pool_px_f32`` (pixels outer, chunks inner)."""
    # @pool_job, @pool_px_job: the same on an argument block, a range of output rows per
    # spin.py worker
    types = ("ptr",) * 5 + ("i64",) * 16
    return "\n\n".join(ir.declarations("load.f32", "store.f32") + [
        depthwise._kernel(kh, kw, op), _kernel(kh, kw, op),
        "\n".join(ir.job("pool_job", "pool_f32", types)),
        "\n".join(ir.job("pool_px_job", "pool_px_f32", types))])


def pool(X: np.ndarray, op: str, kernel: tuple[int, int], heads: tuple[int, int],
         outs: tuple[int, int], strides: tuple[int, int], dilations: tuple[int, int],
         scale: np.ndarray | None = None, threads: int = 1,
         out: np.ndarray | None = None) -> np.ndarray:
    """The (N, Ho, Wo, C) pool of the C-contiguous channels-last (N, H, W, C) float32 ``X``,
    windows from (-heads) on, padding never read; ``scale`` (avg): each output pixel's factor,
    (Ho, Wo) float32; into ``out`` when it is a C-contiguous float32 array of that shape.
    Raises ``jit.Unavailable`` where the kernel cannot run here."""
    kh, kw = kernel
    _require(op, kh, kw)
    module = jit.compile_module(f"pool_{op}_{kh}x{kw}", lambda target: module_ir(kh, kw, op),
                                {"pool_f32": _PROTO, "pool_job": _JOB,
                                 "pool_px_f32": _PROTO, "pool_px_job": _JOB}, REQUIRES)
    N, H, Wd, C = X.shape
    if X.dtype != np.float32 or not X.flags.c_contiguous:
        raise ValueError("pool: expected a contiguous float32 [N, H, W, C]")
    Ho, Wo = outs
    out = _output(out, (N, Ho, Wo, C))
    if out.size == 0:
        return out
    (sh, sw), (dh, dw), (pt, pl) = strides, dilations, heads
    # output columns whose windows lie inside the image's columns: [ow_lo, ow_hi)
    ow_lo = min(Wo, -(-pl // sw))
    last = Wd - 1 - (kw - 1) * dw + pl
    ow_hi = max(ow_lo, min(Wo, last // sw + 1 if last >= 0 else 0))
    scale = _factors(op, scale, outs)
    args = (address(X), address(scale), address(_UNUSED), address(_UNUSED), address(out), C, C,
            H, Wd, Ho, Wo, sh, sw, dh, dw, pt, pl, ow_lo, ow_hi)
    # from two chunks a pixel, each pixel's chunks in turn: every tap then reads its C floats
    # in order, where a pass per chunk read one line of each pixel (96 channels at 111 x 111,
    # 3x3 stride 2: 299 -> 159 us); under that, the chunk-outer loops' cheaper edges win
    # (16 channels at 75 x 75: 19 against 27 us)
    fn, job = (module.pool_px_f32, module.pool_px_job) if C >= PIXEL_MAJOR_CHANNELS else \
        (module.pool_f32, module.pool_job)
    _run_rows(fn, job, args, N * Ho, Wo * C * kh * kw, threads)
    return out


def _require(op: str, kh: int, kw: int) -> None:
    """Raises ValueError for a window the kernels do not compile, ``jit.Unavailable`` where
    they cannot run here."""
    if op not in ("max", "avg") or not 0 < kh * kw <= MAX_TAPS:
        raise ValueError(f"pool: op {op!r} over {kh} x {kw} taps is not compiled")
    reason = jit.why_unavailable(REQUIRES)
    if reason:
        raise jit.Unavailable(reason)


def _output(out: np.ndarray | None, shape: tuple[int, ...]) -> np.ndarray:
    """``out`` where it is a C-contiguous float32 array of ``shape``, else a new one."""
    if out is None or out.shape != shape or out.dtype != np.float32 or \
            not out.flags.c_contiguous:
        return np.empty(shape, np.float32)
    return out


def _factors(op: str, scale: np.ndarray | None, outs: tuple[int, int]) -> np.ndarray:
    """avg's (Ho, Wo) float32 factors, checked; max's stand-in (never read)."""
    if op != "avg":
        return _UNUSED
    scale = np.ascontiguousarray(scale, np.float32)
    if scale.shape != tuple(outs):
        raise ValueError(f"pool: the scale must be {list(outs)}, got {list(scale.shape)}")
    return scale


def _run_rows(fn, job, args: tuple, rows: int, taps_per_row: int, threads: int) -> None:
    """``fn(*args, r0, r1)`` over the output rows [0, rows): on this thread, or in ranges of
    at least MIN_TAPS_PER_RANGE taps that the caller and spin.py's workers take in turn
    (``job``: the same on an argument block)."""
    ranges = work_ranges(rows, threads, taps_per_row, least=MIN_TAPS_PER_RANGE)
    if len(ranges) > 1:
        spin.run_blocks(job, np.array([args + (r0, r1) for r0, r1 in ranges], np.int64),
                        threads)
    else:
        fn(*args, 0, rows)


def _nchw_kernel(kh: int, kw: int, op: str, sw: int) -> str:
    """``@pool_nchw_f32(X, S, Y, H, Wd, Ho, Wo, sh, dh, dw, pt, pl, r0, r1)``: output rows
    [r0, r1) (row r: plane r / Ho, output row r % Ho) of the planar (N*C, H, Wd) ``X`` into
    the planar (N*C, Ho, Wo) ``Y``, 16 output columns a vector. Column stride ``sw`` is the
    module's: 1 reads each tap's 16 columns at once, 2 reads 32 and keeps the even ones, any
    other gathers. A tap column outside the image is a masked-off lane (never read) and reads
    the fill; a tap row outside is read from row 0 and replaced by the fill. ``S``: avg's
    (Ho, Wo) factors (1 / count). Taps reduced in row order, as the channels-last kernel."""
    fill = depthwise._NEG_INF if op == "max" else "zeroinitializer"
    V, VF = ir.V, _VF
    L = ["define void @pool_nchw_f32(ptr %X, ptr %S, ptr %Y, i64 %H, i64 %Wd, i64 %Ho, "
         "i64 %Wo, i64 %sh, i64 %dh, i64 %dw, i64 %pt, i64 %pl, i64 %r0, i64 %r1) nounwind {",
         "entry:",
         "  %img = mul i64 %H, %Wd",
         "  %wd32 = trunc i64 %Wd to i32",
         *ir.splat("%wdv", "%wd32", V),
         "  %any = icmp slt i64 %r0, %r1",
         "  br i1 %any, label %rloop, label %end",
         *_output_row(kh, "%Wd"),  # (%n: the plane)
         "  %yrow = mul i64 %r, %Wo"]
    L += ["  br label %cloop",
          "cloop:",
          "  %ow = phi i64 [0, %rloop], [%own, %cnext]",
          "  %left = sub i64 %Wo, %ow",
          *ir.lane_mask("%om", "%left"),  # output lanes inside the row
          f"  %cw0 = mul i64 %ow, {sw}",
          "  %cw = sub i64 %cw0, %pl"]
    lanes = 32 if sw == 2 else 16
    step = 1 if sw in (1, 2) else sw
    for j in range(kw):  # each tap column: its first input column, which lanes are inside
        L += [f"  %cd{j} = mul i64 %dw, {j}",
              f"  %cj{j} = add i64 %cw, %cd{j}",
              f"  %cj{j}.t = trunc i64 %cj{j} to i32",
              *ir.splat(f"%cj{j}.v", f"%cj{j}.t", V)]
        for h in range(lanes // 16):
            offs = "<" + ", ".join(f"i32 {(16 * h + k) * step}" for k in range(16)) + ">"
            L += [f"  %col{j}.{h} = add {V} %cj{j}.v, {offs}",
                  f"  %in{j}.{h} = icmp ult {V} %col{j}.{h}, %wdv"]
    prev = None
    even = "<" + ", ".join(f"i32 {2 * k}" for k in range(16)) + ">"
    for i in range(kh):
        for j in range(kw):
            k = i * kw + j
            L += [f"  %a{k} = add i64 %ro{i}, %cj{j}",
                  f"  %p{k} = getelementptr float, ptr %X, i64 %a{k}"]
            if sw == 1:
                L.append(depthwise.tap_load(f"%x{k}", f"%p{k}", f"%in{j}.0", fill, True))
            elif sw == 2:
                L += [depthwise.tap_load(f"%x{k}.0", f"%p{k}", f"%in{j}.0", fill, True),
                      f"  %p{k}.1 = getelementptr float, ptr %p{k}, i64 16",
                      depthwise.tap_load(f"%x{k}.1", f"%p{k}.1", f"%in{j}.1", fill, True),
                      f"  %x{k} = shufflevector {VF} %x{k}.0, {VF} %x{k}.1, <16 x i32> {even}"]
            else:
                offs = "<" + ", ".join(f"i32 {q * sw}" for q in range(16)) + ">"
                L += [f"  %g{k} = getelementptr float, ptr %p{k}, {V} {offs}",
                      f"  %x{k} = call {VF} @llvm.masked.gather.v16f32.v16p0(<16 x ptr> "
                      f"%g{k}, i32 4, <16 x i1> %in{j}.0, {VF} {fill})"]
            L.append(f"  %v{k} = select i1 %rv{i}, {VF} %x{k}, {VF} {fill}")
            prev = _fold_tap(L, op, prev, f"%v{k}", f"%acc{k}")
    if op == "avg":  # times each output pixel's 1 / count
        L += ["  %sa = add i64 %srow, %ow",
              "  %sp = getelementptr float, ptr %S, i64 %sa",
              f"  %sv = call {VF} @llvm.masked.load.v16f32.p0(ptr %sp, i32 4, <16 x i1> %om, "
              f"{VF} zeroinitializer)",
              f"  %o = fmul {VF} {prev}, %sv"]
        prev = "%o"
    L += ["  %ya = add i64 %yrow, %ow",
          "  %yp = getelementptr float, ptr %Y, i64 %ya",
          f"  call void @llvm.masked.store.v16f32.p0({VF} {prev}, ptr %yp, i32 4, "
          "<16 x i1> %om)",
          "  br label %cnext",
          "cnext:",
          "  %own = add i64 %ow, 16",
          "  %cmore = icmp slt i64 %own, %Wo",
          "  br i1 %cmore, label %cloop, label %rnext",
          *ir.row_loop_end("%rloop")]
    return "\n".join(L)


def nchw_module_ir(kh: int, kw: int, op: str, sw: int) -> str:
    """``@pool_nchw_f32`` for a kh x kw window of column stride ``sw`` (1, 2, or any other
    by gathers) and its job (``@pool_nchw_job``: a range of output rows per spin.py worker)."""
    types = ("ptr",) * 3 + ("i64",) * 11
    return "\n\n".join(ir.declarations("load.f32", "store.f32") + [
        f"declare {_VF} @llvm.masked.gather.v16f32.v16p0(<16 x ptr>, i32, <16 x i1>, {_VF})",
        _nchw_kernel(kh, kw, op, sw),
        "\n".join(ir.job("pool_nchw_job", "pool_nchw_f32", types))])


_NCHW_PROTO = ctypes.CFUNCTYPE(None, _P, _P, _P, *([_I] * 11))


def _stride_variant(sw: int) -> int:
    return sw if sw in (1, 2) else 0  # 0: gathers, the stride an argument of the IR only


def pool_nchw(X: np.ndarray, op: str, kernel: tuple[int, int], heads: tuple[int, int],
              outs: tuple[int, int], strides: tuple[int, int], dilations: tuple[int, int],
              scale: np.ndarray | None = None, threads: int = 1,
              out: np.ndarray | None = None) -> np.ndarray:
    """The (N, C, Ho, Wo) pool of the C-contiguous planar (N, C, H, W) float32 ``X``, windows
    from (-heads) on, padding never read; ``scale`` (avg): each output pixel's factor, (Ho,
    Wo) float32; into ``out`` when it is a C-contiguous float32 array of that shape. Raises
    ``jit.Unavailable`` where the kernel cannot run here."""
    kh, kw = kernel
    _require(op, kh, kw)
    if X.dtype != np.float32 or X.ndim != 4 or not X.flags.c_contiguous:
        raise ValueError("pool: expected a contiguous float32 [N, C, H, W]")
    N, C, H, Wd = X.shape
    if H * Wd >= 1 << 31 or Wd + max(kw * dilations[1], strides[1] * 32) >= 1 << 31:
        raise ValueError("pool: a plane too large for the kernel's 32-bit column lanes")
    sw = strides[1]
    variant = _stride_variant(sw)
    module = jit.compile_module(
        f"pool_nchw_{op}_{kh}x{kw}_s{variant or 'g'}",
        lambda target: nchw_module_ir(kh, kw, op, variant or sw),
        {"pool_nchw_f32": _NCHW_PROTO, "pool_nchw_job": _JOB}, REQUIRES)
    Ho, Wo = outs
    out = _output(out, (N, C, Ho, Wo))
    if out.size == 0:
        return out
    scale = _factors(op, scale, outs)
    args = (address(X), address(scale), address(out), H, Wd, Ho, Wo, strides[0],
            dilations[0], dilations[1], heads[0], heads[1])
    _run_rows(module.pool_nchw_f32, module.pool_nchw_job, args, N * C * Ho, Wo * kh * kw,
              threads)
    return out


# compiled with the other kernels on first use (jit._BUNDLE): the suite's CNN pools
BUNDLE = {f"pool_{op}_{k}x{k}": ((lambda target, k=k, op=op: module_ir(k, k, op)), REQUIRES)
          for op in ("max", "avg") for k in (3,)}
# planar: the zoo CNNs' max pools where no layout change reaches them (AlexNet, ZFNet,
# GoogLeNet; every pool at optimization levels below the layout level)
BUNDLE.update({f"pool_nchw_max_{k}x{k}_s{s}": (
    (lambda target, k=k, s=s: nchw_module_ir(k, k, "max", s)), REQUIRES)
    for k, s in ((3, 2), (2, 2), (3, 1))})

__all__ = ["BUNDLE", "MAX_TAPS", "PIXEL_MAJOR_CHANNELS", "REQUIRES", "module_ir",
           "nchw_module_ir", "pool", "pool_nchw"]
