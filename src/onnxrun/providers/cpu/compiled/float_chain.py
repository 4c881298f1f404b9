"""A program of float32 element-wise operations on arrays of n floats, run in one call: a
run of small Add / Sub / Mul / Div / Sqrt nodes (fuse.py) costs one ctypes call instead of
one numpy ufunc call (~300 ns of dispatch, for 16 floats) a node.

The program is a list of (op, dst, a, b) register indices; a register is a pointer to n
floats (an input, a constant broadcast to n once, a temporary, an output). Each operation is
one IEEE operation per element, rounded as numpy's ufunc rounds it (no ``contract`` flag: no
fused multiply-add), so the results are numpy's bits. dst may be a or b (same element read,
then written).
"""

from __future__ import annotations

import ctypes

from . import jit

REQUIRES = ()  # generic vector IR: every target

# op codes, in the order of _OPS
_OPS = (("add", "fadd"), ("sub", "fsub"), ("mul", "fmul"), ("div", "fdiv"), ("sqrt", None))
OPS = {name: code for code, (name, _) in enumerate(_OPS)}
_V = "<16 x float>"


def _loops(code: int, name: str, inst: str | None) -> list[str]:
    """The blocks of one operation: 16 floats a step, then one at a time; both end at %next."""
    p = f"o{code}"

    def compute(ty: str, a: str, b: str, r: str) -> str:
        if inst is not None:
            return f"  {r} = {inst} {ty} {a}, {b}"
        fn = "@llvm.sqrt.v16f32" if ty == _V else "@llvm.sqrt.f32"
        return f"  {r} = call {ty} {fn}({ty} {a})"

    return [
        f"{p}:",
        f"  br i1 %anyv, label %{p}.v, label %{p}.t0",
        f"{p}.v:",
        f"  %{p}.i = phi i64 [0, %{p}], [%{p}.in, %{p}.v]",
        f"  %{p}.ap = getelementptr float, ptr %pa, i64 %{p}.i",
        f"  %{p}.av = load {_V}, ptr %{p}.ap, align 4",
        f"  %{p}.bp = getelementptr float, ptr %pb, i64 %{p}.i",
        f"  %{p}.bv = load {_V}, ptr %{p}.bp, align 4",
        compute(_V, f"%{p}.av", f"%{p}.bv", f"%{p}.rv"),
        f"  %{p}.dp = getelementptr float, ptr %pd, i64 %{p}.i",
        f"  store {_V} %{p}.rv, ptr %{p}.dp, align 4",
        f"  %{p}.in = add i64 %{p}.i, 16",
        f"  %{p}.more = icmp slt i64 %{p}.in, %n16",
        f"  br i1 %{p}.more, label %{p}.v, label %{p}.t0",
        f"{p}.t0:",
        f"  br i1 %anyt, label %{p}.t, label %next",
        f"{p}.t:",
        f"  %{p}.j = phi i64 [%n16, %{p}.t0], [%{p}.jn, %{p}.t]",
        f"  %{p}.sap = getelementptr float, ptr %pa, i64 %{p}.j",
        f"  %{p}.sa = load float, ptr %{p}.sap, align 4",
        f"  %{p}.sbp = getelementptr float, ptr %pb, i64 %{p}.j",
        f"  %{p}.sb = load float, ptr %{p}.sbp, align 4",
        compute("float", f"%{p}.sa", f"%{p}.sb", f"%{p}.sr"),
        f"  %{p}.sdp = getelementptr float, ptr %pd, i64 %{p}.j",
        f"  store float %{p}.sr, ptr %{p}.sdp, align 4",
        f"  %{p}.jn = add i64 %{p}.j, 1",
        f"  %{p}.tmore = icmp slt i64 %{p}.jn, %n",
        f"  br i1 %{p}.tmore, label %{p}.t, label %next",
    ]


def module_ir(target=None) -> str:
    """``@float_chain(prog, nops, regs, n)``: for k in [0, nops), with (op, d, a, b) =
    prog[4k:4k+4] (int64), regs[d][i] = regs[a][i] <op> regs[b][i] for i in [0, n) (sqrt reads
    a only; b must still point at n floats)."""
    cases = " ".join(f"i64 {code}, label %o{code}" for code in range(len(_OPS)))
    L = [f"declare {_V} @llvm.sqrt.v16f32({_V})",
         "declare float @llvm.sqrt.f32(float)",
         "define void @float_chain(ptr noalias %prog, i64 %nops, ptr noalias %regs, i64 %n) "
         "nounwind {",
         "entry:",
         "  %n16 = and i64 %n, -16",
         "  %anyv = icmp sgt i64 %n16, 0",
         "  %anyt = icmp slt i64 %n16, %n",
         "  %any = icmp sgt i64 %nops, 0",
         "  br i1 %any, label %op, label %end",
         "op:",
         "  %k = phi i64 [0, %entry], [%kn, %next]",
         "  %at = mul i64 %k, 4",
         "  %cp = getelementptr i64, ptr %prog, i64 %at",
         "  %code = load i64, ptr %cp, align 8"]
    for i, r in ((1, "d"), (2, "a"), (3, "b")):
        L += [f"  %{r}p = getelementptr i64, ptr %cp, i64 {i}",
              f"  %{r} = load i64, ptr %{r}p, align 8",
              f"  %{r}r = getelementptr ptr, ptr %regs, i64 %{r}",
              f"  %p{r} = load ptr, ptr %{r}r, align 8"]
    L.append(f"  switch i64 %code, label %next [ {cases} ]")
    for code, (name, inst) in enumerate(_OPS):
        L += _loops(code, name, inst)
    L += ["next:",
          "  %kn = add i64 %k, 1",
          "  %kmore = icmp slt i64 %kn, %nops",
          "  br i1 %kmore, label %op, label %end",
          "end:",
          "  ret void",
          "}"]
    return "\n".join(L)


_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64)


def _module() -> jit.Module:
    return jit.compile_module("float_chain", module_ir, {"float_chain": _FN}, REQUIRES)


def unavailable() -> str | None:
    """None when the kernel runs here, else why not."""
    return jit.why_unavailable(REQUIRES) or jit.why_not_loaded("float_chain", _module)


def function():
    """The compiled ``float_chain`` (ctypes; releases the GIL): call ``unavailable()`` first."""
    return _module().float_chain


# compiled with the other kernels on first use (jit._BUNDLE)
BUNDLE = {"float_chain": (module_ir, REQUIRES)}

__all__ = ["BUNDLE", "OPS", "function", "module_ir", "unavailable"]
