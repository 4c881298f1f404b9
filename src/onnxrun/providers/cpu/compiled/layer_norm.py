"""float32 layer normalization over the last axis, a row per iteration, ranges of rows on
spin.py's workers: LayerNormalization and SkipLayerNormalization (s = input + skip [+ bias],
the sum written too when asked).

Why: the numpy path (``ops.contrib.transformer._layer_norm``) is five passes over the data and
a dozen calls per node: BERT's twelve normalizations were 4% of a run, all of it on one thread
at 2, and a decode step's single row of a few hundred floats paid ~50 us of calls for ~1 us of
arithmetic. Here a row (kept in the L1 cache) is read three times: its sum, the sum of its
squared deviations, the result.

Per row, as the numpy path but with its sums in 16 lanes added as a tree (so not its bits):
mean = sum(s) * (1 / n), d = s - mean, var = sum(d * d) * (1 / n), inv = 1 / sqrt(var +
epsilon), y = ((d * inv) * gamma) [+ beta]; no fused multiply-adds.

``ln_rows`` (words: X, skip, bias, gamma, beta, Y, S, mean, inv, n, flags, epsilon's float
bits, r0, r1): rows r0 .. r1 of n floats; flags: 1 skip, 2 bias, 4 beta, 8 write S, 16 gamma
and beta one float per row (InstanceNormalization: y = d * inv * gamma[r] + beta[r]). Absent
operands are given as any readable pointer of n floats (their lanes are never used).
"""

from __future__ import annotations

import ctypes

import numpy as np

from ..parallel import work_ranges
from . import ir, jit, spin
from .jit import address

REQUIRES = ()
_VF = ir.VF
# floats per range of rows on the intra-op threads at least (~20-40 us of one core's work)
RANGE_FLOATS = 1 << 15


def _store(label: str, value: str, ptr: str, n: str) -> list[str]:
    """Store %value at %ptr in the chunk loop ``n``: a plain store for a whole chunk, a masked
    one for the row's last, partial chunk (a masked store is microcoded on AMD); ends in the
    block ``label``."""
    return [f"  %full.{label} = icmp eq i64 %l16.{n}, 16",
            f"  br i1 %full.{label}, label %st.{label}, label %stm.{label}",
            f"st.{label}:",
            f"  store {_VF} {value}, ptr {ptr}, align 4",
            f"  br label %{label}",
            f"stm.{label}:",
            f"  call void @llvm.masked.store.v16f32.p0({_VF} {value}, ptr {ptr}, i32 4, "
            f"<16 x i1> %mask.{n})",
            f"  br label %{label}",
            f"{label}:"]


def _row_pass(name: str, start: str, end: str, body: list[str], acc: str | None,
              latch: str | None = None) -> list[str]:
    """The chunk loop ``%i.{name}`` over the row (the last chunk masked by %mask.{name})
    running ``body`` (names suffixed .{name}, the chunk's value loaded as %s.{name}), which
    ends in the block ``latch`` (default: the loop's own); with ``acc``, %{acc} sums the
    vector %{acc}.add of each chunk."""
    n, latch = name, latch or name
    L = [f"  br label %{n}",
         f"{n}:",
         f"  %i.{n} = phi i64 [0, %{start}], [%in.{n}, %{latch}]"]
    if acc:
        L.append(f"  %{acc}.p = phi {_VF} [zeroinitializer, %{start}], [%{acc}, %{latch}]")
    L += [f"  %left.{n} = sub i64 %n, %i.{n}",
          f"  %lc.{n} = icmp sgt i64 %left.{n}, 16",
          f"  %l16.{n} = select i1 %lc.{n}, i64 16, i64 %left.{n}",
          *ir.lane_mask(f"%mask.{n}", f"%l16.{n}"),
          f"  %at.{n} = add i64 %row, %i.{n}"]
    for src in ("X", "K", "B"):  # the row's input, skip and bias (the bias along the row)
        at = f"%i.{n}" if src == "B" else f"%at.{n}"
        L += [f"  %p{src}.{n} = getelementptr float, ptr %{src}, i64 {at}",
              f"  %v{src}.{n} = call {_VF} @llvm.masked.load.v16f32.p0(ptr %p{src}.{n}, i32 4, "
              f"<16 x i1> %mask.{n}, {_VF} zeroinitializer)"]
    L += [f"  %sk.{n} = fadd {_VF} %vX.{n}, %vK.{n}",
          f"  %s1.{n} = select i1 %hask, {_VF} %sk.{n}, {_VF} %vX.{n}",
          f"  %sb.{n} = fadd {_VF} %s1.{n}, %vB.{n}",
          f"  %s.{n} = select i1 %hasb, {_VF} %sb.{n}, {_VF} %s1.{n}"]
    for line in body:
        L.append(line)
        if acc and line.startswith(f"  %{acc}.add ="):
            L.append(f"  %{acc} = fadd {_VF} %{acc}.p, %{acc}.add")
    L += [f"  %in.{n} = add i64 %i.{n}, 16",
          f"  %more.{n} = icmp slt i64 %in.{n}, %n",
          f"  br i1 %more.{n}, label %{n}, label %{end}"]
    return L


def _ir() -> list[str]:
    names = ("X", "K", "B", "G", "Be", "Y", "S", "M", "I", "n", "flags", "epsb", "r0", "r1")
    L = ["define void @ln_rows(ptr %args) nounwind {", "entry:"]
    for i, v in enumerate(names):
        ty = "ptr" if i < 9 else "i64"
        L += [f"  %{v}.p = getelementptr i64, ptr %args, i64 {i}",
              f"  %{v} = load {ty}, ptr %{v}.p, align 8"]
    L += ["  %fk = and i64 %flags, 1", "  %hask = icmp ne i64 %fk, 0",
          "  %fb = and i64 %flags, 2", "  %hasb = icmp ne i64 %fb, 0",
          "  %fe = and i64 %flags, 4", "  %hasbeta = icmp ne i64 %fe, 0",
          "  %fs = and i64 %flags, 8", "  %wants = icmp ne i64 %fs, 0",
          "  %fa = and i64 %flags, 16", "  %rowaff = icmp ne i64 %fa, 0",
          "  %eps32 = trunc i64 %epsb to i32",
          "  %eps = bitcast i32 %eps32 to float",
          "  %nf = uitofp i64 %n to float",
          "  %invn = fdiv float 1.0, %nf",
          "  %go1 = icmp slt i64 %r0, %r1",
          "  %go2 = icmp sgt i64 %n, 0",
          "  %go = and i1 %go1, %go2",
          "  br i1 %go, label %rloop, label %end",
          "rloop:",
          "  %r = phi i64 [%r0, %entry], [%rn, %rnext]",
          "  %row = mul i64 %r, %n"]
    # pass 1: the sum (written out when asked) and its total
    L += _row_pass("sum", "rloop", "stat1", [
        f"  %tot.add = select <16 x i1> %mask.sum, {_VF} %s.sum, {_VF} zeroinitializer",
        "  br i1 %wants, label %wr, label %wrd",
        "wr:",
        "  %pS.sum = getelementptr float, ptr %S, i64 %at.sum",
        *_store("wrd", "%s.sum", "%pS.sum", "sum")], "tot", latch="wrd")
    L += ["stat1:", *ir.hsum("%tot", "%total"),
          "  %mean = fmul float %total, %invn",
          *ir.splat("%meanv", "%mean")]
    # pass 2: the squared deviations
    L += _row_pass("var", "stat1", "stat2", [
        f"  %d.var = fsub {_VF} %s.var, %meanv",
        f"  %dd.var = fmul {_VF} %d.var, %d.var",
        f"  %sq.add = select <16 x i1> %mask.var, {_VF} %dd.var, {_VF} zeroinitializer"], "sq")
    L += ["stat2:", *ir.hsum("%sq", "%sqs"),
          "  %variance = fmul float %sqs, %invn",
          "  %vare = fadd float %variance, %eps",
          "  %sd = call float @llvm.sqrt.f32(float %vare)",
          "  %inv = fdiv float 1.0, %sd",
          *ir.splat("%invv", "%inv"),
          "  %pM = getelementptr float, ptr %M, i64 %r",
          "  store float %mean, ptr %pM, align 4",
          "  %pI = getelementptr float, ptr %I, i64 %r",
          "  store float %inv, ptr %pI, align 4",
          "  br i1 %rowaff, label %stat2r, label %stat2c",
          # per-row affine (flag 16, InstanceNormalization's per channel): gamma[r], beta[r]
          "stat2r:",
          "  %pGr = getelementptr float, ptr %G, i64 %r",
          "  %gr = load float, ptr %pGr, align 4",
          "  %pEr = getelementptr float, ptr %Be, i64 %r",
          "  %er = load float, ptr %pEr, align 4",
          *ir.splat("%grv", "%gr"), *ir.splat("%erv", "%er")]
    L += _row_pass("outr", "stat2r", "rnext", [
        f"  %d.outr = fsub {_VF} %s.outr, %meanv",
        f"  %n1.outr = fmul {_VF} %d.outr, %invv",
        f"  %n2.outr = fmul {_VF} %n1.outr, %grv",
        f"  %y.outr = fadd {_VF} %n2.outr, %erv",
        "  %pY.outr = getelementptr float, ptr %Y, i64 %at.outr",
        *_store("ydr", "%y.outr", "%pY.outr", "outr")], None, latch="ydr")
    L += ["stat2c:"]
    # pass 3: the result
    L += _row_pass("out", "stat2c", "rnext", [
        f"  %d.out = fsub {_VF} %s.out, %meanv",
        f"  %n1.out = fmul {_VF} %d.out, %invv",
        "  %pG.out = getelementptr float, ptr %G, i64 %i.out",
        f"  %g.out = call {_VF} @llvm.masked.load.v16f32.p0(ptr %pG.out, i32 4, "
        f"<16 x i1> %mask.out, {_VF} zeroinitializer)",
        f"  %n2.out = fmul {_VF} %n1.out, %g.out",
        "  %pE.out = getelementptr float, ptr %Be, i64 %i.out",
        f"  %e.out = call {_VF} @llvm.masked.load.v16f32.p0(ptr %pE.out, i32 4, "
        f"<16 x i1> %mask.out, {_VF} zeroinitializer)",
        f"  %n3.out = fadd {_VF} %n2.out, %e.out",
        f"  %y.out = select i1 %hasbeta, {_VF} %n3.out, {_VF} %n2.out",
        "  %pY.out = getelementptr float, ptr %Y, i64 %at.out",
        *_store("yd", "%y.out", "%pY.out", "out")], None, latch="yd")
    L += ["rnext:",
          "  %rn = add i64 %r, 1",
          "  %rmore = icmp slt i64 %rn, %r1",
          "  br i1 %rmore, label %rloop, label %end",
          "end:",
          "  ret void",
          "}"]
    return L


def module_ir(target=None) -> str:
    """Generic 16-lane IR, the same for every target (LLVM splits it on 8-lane ones)."""
    decls = ir.declarations("load.f32", "store.f32") + ["declare float @llvm.sqrt.f32(float)"]
    return "\n\n".join(["\n".join(decls), "\n".join(_ir())])


_JOB = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


def _module() -> jit.Module:
    return jit.compile_module("layer_norm", module_ir, {"ln_rows": _JOB}, REQUIRES)


def unavailable() -> str | None:
    """None when the kernel can run here (its object loaded), else why not."""
    return jit.why_unavailable(REQUIRES) or jit.why_not_loaded("layer_norm", _module)


def _vector(a: np.ndarray | None, n: int, name: str) -> np.ndarray | None:
    if a is None:
        return None
    if a.dtype != np.float32 or a.size != n:
        raise ValueError(f"layer_norm: {name} must hold {n} float32 values, got "
                         f"{a.dtype}{list(a.shape)}")
    return np.ascontiguousarray(a).reshape(n)


def function():
    """The compiled job (a kernel takes it once, when it is prepared: the module's lookup
    costs more than a decode step's one-row normalization)."""
    return _module().ln_rows


def layer_norm(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray | None, epsilon: float,
               skip: np.ndarray | None = None, bias: np.ndarray | None = None,
               want_sum: bool = False, threads: int = 1, fn=None,
               out: np.ndarray | None = None):
    """The rows of the C-contiguous float32 (rows, n) ``x`` (+ ``skip``, its shape, + ``bias``)
    normalized, times ``gamma`` (+ ``beta``): (Y, mean (rows,), inv_std (rows,), the sum
    or None), new arrays (Y in ``out`` when it is a C-contiguous float32 (rows, n) array);
    ranges of rows on up to ``threads`` threads (each row's arithmetic is the same on any).
    ``fn``: function(), where the caller holds it."""
    if x.ndim != 2 or x.dtype != np.float32 or not x.flags.c_contiguous:
        raise ValueError("layer_norm: expected a C-contiguous float32 (rows, n) array")
    rows, n = x.shape
    if skip is not None and (skip.shape != x.shape or skip.dtype != np.float32 or
                             not skip.flags.c_contiguous):
        raise ValueError(f"layer_norm: skip must be a C-contiguous float32 {list(x.shape)}")
    gamma = _vector(gamma, n, "gamma")
    beta, bias = _vector(beta, n, "beta"), _vector(bias, n, "bias")
    Y = out if out is not None and out.shape == (rows, n) and out.dtype == np.float32 and \
        out.flags.c_contiguous else np.empty((rows, n), np.float32)
    S = np.empty((rows, n), np.float32) if want_sum else None
    mean, inv = np.empty(rows, np.float32), np.empty(rows, np.float32)
    if x.size == 0:
        return Y, mean, inv, S
    flags = (skip is not None) | (bias is not None) << 1 | (beta is not None) << 2 | \
        want_sum << 3
    eps = int(np.array(epsilon, np.float32).view(np.uint32))
    at = address(x)  # the stand-in of an absent operand: read, never used
    head = [at if skip is None else address(skip), address(gamma if bias is None else bias),
            address(gamma), address(gamma if beta is None else beta), address(Y),
            at if S is None else address(S), address(mean), address(inv), n, flags, eps]
    _launch(fn or function(), [at] + head, rows, n, threads)
    return Y, mean, inv, S


def _launch(fn, head: list, rows: int, n: int, threads: int) -> None:
    """``ln_rows`` over rows [0, rows) of n floats (``head``: its words before r0, r1): one
    call, or, with threads and rows enough for two ranges, ranges of RANGE_FLOATS floats
    at least, taken in turn by the caller and spin.py's workers (each row's arithmetic is
    the same on any thread)."""
    ranges = work_ranges(rows, threads, n, least=RANGE_FLOATS) if threads > 1 and \
        rows * n >= 2 * RANGE_FLOATS else ((0, rows),)
    # (the block held by a name through the call: its address alone would let it be freed)
    blocks = np.array([head + [r0, r1] for r0, r1 in ranges], np.int64)
    if len(ranges) == 1:
        fn(address(blocks))
    else:
        spin.run_blocks(fn, blocks, threads)


def instance_norm(x: np.ndarray, scale: np.ndarray, bias: np.ndarray, epsilon: float,
                  threads: int = 1, fn=None, out: np.ndarray | None = None) -> np.ndarray:
    """Each row of the C-contiguous float32 (rows, n) ``x`` normalized, times ``scale[r]``
    plus ``bias[r]`` (float32 (rows,) each): InstanceNormalization's rows (one per image
    and channel), as a new array (or in ``out``, a C-contiguous float32 (rows, n))."""
    if x.ndim != 2 or x.dtype != np.float32 or not x.flags.c_contiguous:
        raise ValueError("instance_norm: expected a C-contiguous float32 (rows, n) array")
    rows, n = x.shape
    scale = np.ascontiguousarray(scale, np.float32).reshape(-1)
    bias = np.ascontiguousarray(bias, np.float32).reshape(-1)
    if scale.size != rows or bias.size != rows:
        raise ValueError(f"instance_norm: scale and bias must have {rows} values, got "
                         f"{scale.size} and {bias.size}")
    Y = out if out is not None and out.shape == (rows, n) and out.dtype == np.float32 and \
        out.flags.c_contiguous else np.empty((rows, n), np.float32)
    if x.size == 0:
        return Y
    stats = np.empty((2, rows), np.float32)  # mean, inv (written, not returned)
    eps = int(np.array(epsilon, np.float32).view(np.uint32))
    at, st = address(x), address(stats)
    head = [at, at, at, address(scale), address(bias), address(Y), at, st, st + 4 * rows, n,
            16, eps]
    _launch(fn or function(), head, rows, n, threads)
    return Y


class Bound:
    """A node's constant gamma (and beta, bias) bound once: ``run`` then costs a few words
    and one call (SVTR's 128 x 128 SkipLayerNormalization: layer_norm's checks, copies and
    argument block were ~15 us of a 30 us call). Holds the arrays it was given, so that a
    call can tell them by identity (constants come back as the same arrays every run)."""

    __slots__ = ("gamma", "beta", "bias", "n", "words", "fn")

    def __init__(self, gamma: np.ndarray, beta: np.ndarray | None, bias: np.ndarray | None,
                 epsilon: float, fn) -> None:
        self.gamma, self.beta, self.bias, self.n, self.fn = gamma, beta, bias, gamma.size, fn
        eps = int(np.array(epsilon, np.float32).view(np.uint32))
        flags = (bias is not None) << 1 | (beta is not None) << 2
        # the words after X and skip: bias, gamma, beta (gamma standing in), n, flags, eps
        self.words = (address(gamma if bias is None else bias), address(gamma),
                      address(gamma if beta is None else beta), self.n, flags, eps)

    def run(self, x: np.ndarray, skip: np.ndarray | None, want_sum: bool, threads: int,
            out: np.ndarray | None = None):
        """layer_norm's result for C-contiguous float32 (rows, n) ``x`` (and ``skip``), Y in
        ``out`` when given (a C-contiguous float32 (rows, n), the caller checked)."""
        rows, n = x.shape
        Y = np.empty((rows, n), np.float32) if out is None else out
        S = np.empty((rows, n), np.float32) if want_sum else None
        stats = np.empty((2, rows), np.float32)  # mean, inv
        if rows == 0:
            return Y, stats[0], stats[1], S
        at, (b, g, be, n_, flags, eps) = address(x), self.words
        st = address(stats)
        head = [at, at if skip is None else address(skip), b, g, be, address(Y),
                at if S is None else address(S), st, st + 4 * rows, n_,
                flags | (skip is not None) | want_sum << 3, eps]
        _launch(self.fn, head, rows, n, threads)
        return Y, stats[0], stats[1], S


def bind(gamma: np.ndarray, beta: np.ndarray | None, bias: np.ndarray | None,
         epsilon: float) -> Bound | None:
    """``Bound`` for read-only (constant) C-contiguous float32 vectors of one size; None where
    they are not such (a computed gamma changes each run: layer_norm then)."""
    held = [a for a in (gamma, beta, bias) if a is not None]
    if gamma is None or not gamma.size or any(
            a.flags.writeable or a.dtype != np.float32 or a.ndim != 1 or a.size != gamma.size
            or not a.flags.c_contiguous for a in held):
        return None
    return Bound(gamma, beta, bias, epsilon, function())


BUNDLE = {"layer_norm": (module_ir, REQUIRES)}

__all__ = ["BUNDLE", "REQUIRES", "Bound", "bind", "function", "instance_norm", "layer_norm",
           "module_ir", "unavailable"]
