"""onnxruntime's float32 RMS normalizations in one pass per row, operation for operation as
ops/contrib/transformer.py's numpy path (which follows onnxruntime 1.32 on x86-64 to the bit):

- ``lanes`` (SimplifiedLayerNormalization): the squares summed in 8 lanes with fused
  multiply-adds, the lanes added as ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7)), then
  inv = 1 / sqrt(sum / n + epsilon) and y = (x * inv) * scale; rows a multiple of 8 long.
- ``skip`` (SkipSimplifiedLayerNormalization): s = (input + skip) [+ bias], its squares summed
  one by one (square, then add: no contraction), rms = sqrt(sum / n + epsilon),
  y = (s / rms) * scale, inv = 1 / rms; the sum s is written too.

A decode step normalizes one row of a few hundred floats: numpy's passes (the lanes' loop
above all) cost tens of microseconds there, one call of this a microsecond or two."""

from __future__ import annotations

import ctypes
from typing import Any, NamedTuple

import numpy as np

from . import jit

REQUIRES = ("avx2", "fma")
_VF = "<8 x float>"


def _splat(name: str, scalar: str) -> list[str]:
    return [f"  %{name}.0 = insertelement {_VF} poison, float {scalar}, i64 0",
            f"  %{name} = shufflevector {_VF} %{name}.0, {_VF} poison, <8 x i32> zeroinitializer"]


def _lanes_ir() -> list[str]:
    L = ["define void @rms_lanes(ptr noalias %x, ptr noalias %scale, ptr noalias %y, "
         "ptr noalias %inv, i64 %rows, i64 %n, float %eps) nounwind {",
         "entry:",
         "  %nf = uitofp i64 %n to float",
         "  %any = icmp sgt i64 %rows, 0",
         "  br i1 %any, label %row, label %end",
         "row:",
         "  %r = phi i64 [0, %entry], [%r.next, %scaled]",
         "  %off = mul i64 %r, %n",
         "  %xr = getelementptr float, ptr %x, i64 %off",
         "  %yr = getelementptr float, ptr %y, i64 %off",
         "  br label %sq",
         "sq:",
         "  %i = phi i64 [0, %row], [%i.next, %sq]",
         f"  %acc = phi {_VF} [zeroinitializer, %row], [%acc.next, %sq]",
         "  %xp = getelementptr float, ptr %xr, i64 %i",
         f"  %v = load {_VF}, ptr %xp, align 4",
         f"  %acc.next = call {_VF} @llvm.fma.v8f32({_VF} %v, {_VF} %v, {_VF} %acc)",
         "  %i.next = add i64 %i, 8",
         "  %more = icmp slt i64 %i.next, %n",
         "  br i1 %more, label %sq, label %sum",
         "sum:"]
    for k in range(8):
        L.append(f"  %a{k} = extractelement {_VF} %acc.next, i64 {k}")
    L += ["  %h0 = fadd float %a0, %a4", "  %h1 = fadd float %a1, %a5",
          "  %h2 = fadd float %a2, %a6", "  %h3 = fadd float %a3, %a7",
          "  %h02 = fadd float %h0, %h2", "  %h13 = fadd float %h1, %h3",
          "  %ss = fadd float %h02, %h13",
          "  %ms = fdiv float %ss, %nf",
          "  %mse = fadd float %ms, %eps",
          "  %rms = call float @llvm.sqrt.f32(float %mse)",
          "  %iv = fdiv float 1.0, %rms",
          "  %invp = getelementptr float, ptr %inv, i64 %r",
          "  store float %iv, ptr %invp, align 4",
          *_splat("viv", "%iv"),
          "  br label %scale.loop",
          "scale.loop:",
          "  %j = phi i64 [0, %sum], [%j.next, %scale.loop]",
          "  %xq = getelementptr float, ptr %xr, i64 %j",
          f"  %w = load {_VF}, ptr %xq, align 4",
          "  %gp = getelementptr float, ptr %scale, i64 %j",
          f"  %g = load {_VF}, ptr %gp, align 4",
          f"  %t = fmul {_VF} %w, %viv",
          f"  %o = fmul {_VF} %t, %g",
          "  %yp = getelementptr float, ptr %yr, i64 %j",
          f"  store {_VF} %o, ptr %yp, align 4",
          "  %j.next = add i64 %j, 8",
          "  %jmore = icmp slt i64 %j.next, %n",
          "  br i1 %jmore, label %scale.loop, label %scaled",
          "scaled:",
          "  %r.next = add i64 %r, 1",
          "  %rmore = icmp slt i64 %r.next, %rows",
          "  br i1 %rmore, label %row, label %end",
          "end:",
          "  ret void",
          "}"]
    return L


def _elementwise(label: str, after: str, n8: str, n: str, body: list[tuple[str, str]],
                 ptrs: dict[str, str], out: tuple[str, str], d: tuple[str, str] = ("", "")
                 ) -> list[str]:
    """A loop over [0, n): 8 at a time up to n8, then one by one, computing ``body`` (pairs
    of (name, instruction template: {t} the type, {p} the loop's prefix, {d} ``d``'s vector
    or scalar value)) from loads of ``ptrs`` (name -> base pointer) and storing ``out``
    (value name, base pointer). Falls through to ``after``."""
    L = []
    for kind, ty, lo, hi, step, dv in (("v", _VF, "0", n8, 8, d[0]),
                                       ("s", "float", n8, n, 1, d[1])):
        head, loop = f"{label}.{kind}", f"{label}.{kind}.loop"
        nxt = f"{label}.s" if kind == "v" else after
        L += [f"  br label %{head}", f"{head}:",
              f"  %{head}.any = icmp slt i64 {lo}, {hi}",
              f"  br i1 %{head}.any, label %{loop}, label %{nxt}",
              f"{loop}:",
              f"  %{loop}.i = phi i64 [{lo}, %{head}], [%{loop}.n, %{loop}]"]
        for name, base in ptrs.items():
            L += [f"  %{loop}.{name}p = getelementptr float, ptr {base}, i64 %{loop}.i",
                  f"  %{loop}.{name} = load {ty}, ptr %{loop}.{name}p, align 4"]
        for name, tmpl in body:
            L.append(f"  %{loop}.{name} = " + tmpl.format(t=ty, p=f"%{loop}.", d=dv))
        L += [f"  %{loop}.op = getelementptr float, ptr {out[1]}, i64 %{loop}.i",
              f"  store {ty} %{loop}.{out[0]}, ptr %{loop}.op, align 4",
              f"  %{loop}.n = add i64 %{loop}.i, {step}",
              f"  %{loop}.more = icmp slt i64 %{loop}.n, {hi}",
              f"  br i1 %{loop}.more, label %{loop}, label %{nxt}"]
    return L


def _skip_ir() -> list[str]:
    L = ["define void @rms_skip(ptr noalias %a, ptr noalias %b, ptr noalias %bias, "
         "ptr noalias %scale, ptr noalias %y, ptr noalias %s, ptr noalias %inv, i64 %rows, "
         "i64 %n, float %eps, i64 %hasbias) nounwind {",
         "entry:",
         "  %nf = uitofp i64 %n to float",
         "  %n8 = and i64 %n, -8",
         "  %withbias = icmp ne i64 %hasbias, 0",
         "  %any = icmp sgt i64 %rows, 0",
         "  br i1 %any, label %row, label %end",
         "row:",
         "  %r = phi i64 [0, %entry], [%r.next, %scaled]",
         "  %off = mul i64 %r, %n",
         "  %ar = getelementptr float, ptr %a, i64 %off",
         "  %br = getelementptr float, ptr %b, i64 %off",
         "  %sr = getelementptr float, ptr %s, i64 %off",
         "  %yr = getelementptr float, ptr %y, i64 %off",
         "  br i1 %withbias, label %sum3, label %sum2"]
    L += ["sum2:"] + _elementwise("add2", "squares", "%n8", "%n",
                                  [("o", "fadd {t} {p}a, {p}b")],
                                  {"a": "%ar", "b": "%br"}, ("o", "%sr"))
    L += ["sum3:"] + _elementwise("add3", "squares", "%n8", "%n",
                                  [("t", "fadd {t} {p}a, {p}b"), ("o", "fadd {t} {p}t, {p}c")],
                                  {"a": "%ar", "b": "%br", "c": "%bias"}, ("o", "%sr"))
    L += ["squares:",
          "  br label %sq",
          "sq:",
          "  %i = phi i64 [0, %squares], [%i.next, %sq]",
          "  %acc = phi float [0.0, %squares], [%acc.next, %sq]",
          "  %sp = getelementptr float, ptr %sr, i64 %i",
          "  %v = load float, ptr %sp, align 4",
          "  %v2 = fmul float %v, %v",
          "  %acc.next = fadd float %acc, %v2",
          "  %i.next = add i64 %i, 1",
          "  %more = icmp slt i64 %i.next, %n",
          "  br i1 %more, label %sq, label %stats",
          "stats:",
          "  %ms = fdiv float %acc.next, %nf",
          "  %mse = fadd float %ms, %eps",
          "  %rms = call float @llvm.sqrt.f32(float %mse)",
          "  %iv = fdiv float 1.0, %rms",
          "  %invp = getelementptr float, ptr %inv, i64 %r",
          "  store float %iv, ptr %invp, align 4",
          *_splat("vrms", "%rms")]
    # y = (s / rms) * scale
    L += _elementwise("norm", "scaled", "%n8", "%n",
                      [("q", "fdiv {t} {p}s, {d}"), ("o", "fmul {t} {p}q, {p}g")],
                      {"s": "%sr", "g": "%scale"}, ("o", "%yr"), ("%vrms", "%rms"))
    L += ["scaled:",
          "  %r.next = add i64 %r, 1",
          "  %rmore = icmp slt i64 %r.next, %rows",
          "  br i1 %rmore, label %row, label %end",
          "end:",
          "  ret void",
          "}"]
    return L


# the bound calls' constants block (i64 words; epsilon as its float32 bits), one per node
# rows whose unread inv_std_var may go to the stack (a null inv); more: the caller passes one
STACK_ROWS = 4096
LANES_WORDS = ("scale", "n", "eps")
SKIP_WORDS = ("scale", "n", "eps", "bias", "hasbias")


def _bound_ir() -> list[str]:
    """rms_lanes_c(x, y, inv, c, rows) and rms_skip_c(a, b, y, s, inv, c, rows): @rms_lanes and
    @rms_skip with a node's constants (LANES_WORDS, SKIP_WORDS) in one block ``c`` (a ctypes
    call costs ~0.25 us an argument: as much as a decode step's row), inv null where the node's
    inv_std_var is not used (its values then go to the stack: the caller passes one past
    STACK_ROWS rows)."""
    def words(names: tuple[str, ...]) -> list[str]:
        L = []
        for i, name in enumerate(names):
            ty = "ptr" if name in ("scale", "bias") else "i64"
            L += [f"  %{name}.p = getelementptr i64, ptr %c, i64 {i}",
                  f"  %{name} = load {ty}, ptr %{name}.p, align 8"]
        return L + ["  %eps.i = trunc i64 %eps to i32",
                    "  %epsf = bitcast i32 %eps.i to float",
                    "  %noinv = icmp eq ptr %inv, null",
                    "  br i1 %noinv, label %stack, label %go",
                    "stack:",
                    "  %tmp = alloca float, i64 %rows, align 4",
                    "  br label %go",
                    "go:",
                    "  %invp = phi ptr [%tmp, %stack], [%inv, %entry]"]
    return ["define void @rms_lanes_c(ptr %x, ptr %y, ptr %inv, ptr %c, i64 %rows) nounwind {",
            "entry:", *words(LANES_WORDS),
            "  call void @rms_lanes(ptr %x, ptr %scale, ptr %y, ptr %invp, i64 %rows, i64 %n, "
            "float %epsf)",
            "  ret void", "}",
            "define void @rms_skip_c(ptr %a, ptr %b, ptr %y, ptr %s, ptr %inv, ptr %c, "
            "i64 %rows) nounwind {",
            "entry:", *words(SKIP_WORDS),
            "  call void @rms_skip(ptr %a, ptr %b, ptr %bias, ptr %scale, ptr %y, ptr %s, "
            "ptr %invp, i64 %rows, i64 %n, float %epsf, i64 %hasbias)",
            "  ret void", "}"]


def module_ir(target=None) -> str:
    return "\n".join([*_lanes_ir(), *_skip_ir(), *_bound_ir(),
                      f"declare {_VF} @llvm.fma.v8f32({_VF}, {_VF}, {_VF})",
                      "declare float @llvm.sqrt.f32(float)"])


_P, _I, _F = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
_SIGNATURES = {"rms_lanes": ctypes.CFUNCTYPE(None, _P, _P, _P, _P, _I, _I, _F),
               "rms_skip": ctypes.CFUNCTYPE(None, _P, _P, _P, _P, _P, _P, _P, _I, _I, _F, _I),
               "rms_lanes_c": ctypes.CFUNCTYPE(None, _P, _P, _P, _P, _I),
               "rms_skip_c": ctypes.CFUNCTYPE(None, _P, _P, _P, _P, _P, _P, _I)}


def _module() -> jit.Module:
    return jit.compile_module("rms_norm", module_ir, _SIGNATURES, REQUIRES)


def unavailable() -> str | None:
    """None when the kernels run here, else why not (asked once, when a kernel is prepared)."""
    return jit.why_unavailable(REQUIRES) or jit.why_not_loaded("rms_norm", _module)


class RmsNorm:
    """The compiled functions, taken once (a kernel holds this from its preparation: looking
    the module up per call would cost as much as a decode step's normalization)."""

    def __init__(self) -> None:
        module = _module()
        self._lanes, self._skip = module.rms_lanes, module.rms_skip
        self.lanes_c, self.skip_c = module.rms_lanes_c, module.rms_skip_c
        # the last scale and bias seen, with their addresses: they are constants, read-only,
        # and a read-only array's address costs ~3 us (ndarray.ctypes)
        self._known: tuple[tuple[np.ndarray, int], ...] = ()

    def _address(self, a: np.ndarray) -> int:
        for array, addr in self._known:
            if array is a:
                return addr
        addr = jit.address(a)
        if not a.flags.writeable:
            self._known = ((a, addr), *self._known[:1])
        return addr

    def lanes(self, x: np.ndarray, scale: np.ndarray, epsilon: float
              ) -> tuple[np.ndarray, np.ndarray]:
        """(Y, inv) of the rows of contiguous float32 ``x`` (rows, n), n a multiple of 8, by
        the contiguous float32 ``scale`` (n,)."""
        rows, n = x.shape
        y = np.empty((rows, n), np.float32)
        inv = np.empty(rows, np.float32)
        self._lanes(jit.address(x), self._address(scale), jit.address(y), jit.address(inv),
                    rows, n, epsilon)
        return y, inv

    def skip(self, a: np.ndarray, b: np.ndarray, bias: np.ndarray | None, scale: np.ndarray,
             epsilon: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(Y, inv, sum) of float32 ``a`` + ``b`` [+ bias (n,)], any shape (the same), by
        ``scale`` (n,) over the last axis (n > 0 long): Y and the sum in a's shape, inv with
        a last axis of 1. The outputs are made in those shapes and C-contiguous inputs read
        as they come: a decode step's call is the kernel's and little else."""
        shape = a.shape
        if not a.flags.c_contiguous:
            a = np.ascontiguousarray(a)
        if not b.flags.c_contiguous:
            b = np.ascontiguousarray(b)
        n = shape[-1]
        y = np.empty(shape, np.float32)
        s = np.empty(shape, np.float32)
        inv = np.empty(shape[:-1] + (1,), np.float32)
        addr = jit.address
        self._skip(addr(a), addr(b), 0 if bias is None else self._address(bias),
                   self._address(scale), addr(y), addr(s), addr(inv), a.size // n, n, epsilon,
                   bias is not None)
        return y, inv, s


class Bound(NamedTuple):
    """A node's constant scale (and bias) bound into the constants block of rms_lanes_c /
    rms_skip_c: the node calls ``fn(..., address, rows)`` while ``scale`` and ``bias`` (the
    arrays it was given, held here with the block) come back; made once, never written."""

    scale: Any
    bias: Any
    n: int
    words: np.ndarray
    address: int


UNBOUND = Bound(object(), object(), 0, np.zeros(0, np.int64), 0)  # not bound yet
NEVER = Bound(object(), object(), 0, np.zeros(0, np.int64), 0)  # not constants: not tried again


def bind(scale: np.ndarray, bias: np.ndarray | None, epsilon: float, skip: bool
         ) -> Bound | None:
    """The block of a read-only (constant) float32 ``scale`` (n,) [and ``bias`` (n,)]; None
    where they are not constants of that kind (a computed scale changes each run)."""
    held = [a for a in (scale, bias) if a is not None]
    if any(a.flags.writeable or a.dtype != np.float32 or a.ndim != 1 or a.size != scale.size
           or not a.flags.c_contiguous for a in held) or not scale.size:
        return None
    eps = int(np.float32(epsilon).view(np.int32))
    words = [jit.address(scale), scale.size, eps]
    if skip:
        words += [0 if bias is None else jit.address(bias), int(bias is not None)]
    block = np.array(words, np.int64)
    return Bound(scale, bias, scale.size, block, jit.address(block))


def kernels() -> RmsNorm | None:
    """The compiled normalizations, or None where they do not run here."""
    return RmsNorm() if unavailable() is None else None


BUNDLE = {"rms_norm": (module_ir, REQUIRES)}

__all__ = ["BUNDLE", "NEVER", "REQUIRES", "STACK_ROWS", "UNBOUND", "Bound", "RmsNorm", "bind",
           "kernels", "module_ir", "unavailable"]
