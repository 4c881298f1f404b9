"""Plans (step 5): a run of small float32 element-wise steps as one step.

A step whose kernel is a bare numpy ufunc (Add, Sub, Mul, Div, Sqrt of float32 tensors whose
type is known when the session is made) costs its ufunc's dispatch, ~300 ns, whatever its
size; on 16 floats that is the whole node. Consecutive such steps on one static shape (of at
most MAX_ELEMENTS: above it, memory.py's in-place and arena buffers matter more than a
dispatch) become one step whose kernel runs them as one compiled program
(compiled/float_chain.py): the same IEEE operation per element, so numpy's bits. Values
only read inside the run are never made; those read later (or fetched) are its outputs.
Operands of another shape, dtype or layout at run time take the ufuncs one by one.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .execute import Step, kernel_error
from .ir import Value
from .proto import onnx

MAX_ELEMENTS = 1 << 14  # 64 KiB of float32: memory.py pools outputs from there
# The fused call pays ~5-7 us hot (an address per operand and output: ~0.5 us each through
# ctypes, the register block, the call) against ~0.35 us hot a ufunc step (~1.5 us in a
# run): shorter runs (VAD's STFT magnitude, four steps) stay as they are.
MIN_STEPS = 8

_F32 = np.dtype(np.float32)
_OPS = {np.add: "add", np.subtract: "sub", np.multiply: "mul", np.true_divide: "div",
        np.sqrt: "sqrt"}


def _static_f32_shape(v: Value | None) -> tuple[int, ...] | None:
    """The value's shape where its type says float32 and every dimension is a number."""
    tp = None if v is None else v.type
    if tp is None or tp.WhichOneof("value") != "tensor_type":
        return None
    tt = tp.tensor_type
    if tt.elem_type != onnx.TensorProto.FLOAT or not tt.HasField("shape"):
        return None
    dims = []
    for d in tt.shape.dim:
        if d.WhichOneof("value") != "dim_value" or d.dim_value < 0:
            return None
        dims.append(d.dim_value)
    return tuple(dims)


def _fusable(step: Step) -> tuple[int, ...] | None:
    """The step's output shape where it may join a run, else None."""
    if step.kernel.__class__ is not np.ufunc or step.kernel not in _OPS or \
            len(step.outputs) != 1 or step.provider != "CPUExecutionProvider" or \
            len(step.inputs) != step.kernel.nin:
        return None
    shape = _static_f32_shape(step.node.outputs[0])
    if shape is None or math.prod(shape) > MAX_ELEMENTS:
        return None
    return shape


def fuse_steps(steps: list[Step], constants: dict[int, Any]) -> list[Step]:
    """``steps`` (a plan's, frees set) with each run of at least MIN_STEPS fusable steps of one
    shape made one step (``FusedElementwise``). ``constants``: slot -> the value every run
    reads there (initializers that no feed overrides)."""
    groups: list[list[Step]] = []  # runs of fusable steps, or single steps
    shape: tuple[int, ...] | None = None
    made: set[int] = set()  # the slots the last run writes
    for step in steps:
        got = _fusable(step)
        if got is not None and shape is not None and got == shape and \
                _operands_fit(step, got, made, constants):
            groups[-1].append(step)
            made.update(step.outputs)
            continue
        made = set(step.outputs)
        shape = got if got is not None and _operands_fit(step, got, set(), constants) else None
        groups.append([step])
    if all(len(g) < MIN_STEPS for g in groups):
        return steps
    # only now: a session without such runs never loads the compiled kernels for this
    from .providers.cpu.compiled import float_chain

    if float_chain.unavailable() is not None:
        return steps
    out: list[Step] = []
    for g in groups:
        if len(g) >= MIN_STEPS:
            out.append(_fused(g, _fusable(g[0]), constants))
        else:
            out.extend(g)
    return out


def _operands_fit(step: Step, shape: tuple[int, ...], made: set[int],
                  constants: dict[int, Any]) -> bool:
    """Whether each operand is ``made`` in the run, a float32 constant that broadcasts to
    ``shape``, or a value whose type says float32 of ``shape``."""
    for s, v in zip(step.inputs, step.node.inputs, strict=True):
        if s in made:
            continue
        c = constants.get(s)
        if c is not None:
            if not isinstance(c, np.ndarray) or c.dtype != _F32 or c.ndim > len(shape) or \
                    any(a not in (1, b) for a, b in
                        zip(c.shape[::-1], shape[::-1][:c.ndim], strict=True)):
                return False
        elif _static_f32_shape(v) != shape:
            return False
    return True


def _fused(run: list[Step], shape: tuple[int, ...], constants: dict[int, Any]) -> Step:
    made = {s for st in run for s in st.outputs}
    freed = {s for st in run for s in st.frees}
    inputs: list[int] = []
    for st in run:
        for s in st.inputs:
            if s not in made and s not in constants and s not in inputs:
                inputs.append(s)
    # read after the run (or fetched): its outputs; the others live only inside it
    outputs = [s for st in run for s in st.outputs if s not in freed]
    frees = tuple(s for st in run for s in st.frees if s not in made)
    kernel = FusedElementwise(run, inputs, outputs, shape, constants)
    return Step(kernel, tuple(inputs), tuple(outputs), frees, run[0].node, run[0].provider)


class FusedElementwise:
    """A run of element-wise float32 steps as one compiled program on their static shape;
    its numpy fallback (operands of another shape, dtype or layout) calls the ufuncs one by
    one and names the node that fails, as the run loop would have."""

    calls_blas = False

    def __init__(self, run: list[Step], inputs: list[int], outputs: list[int],
                 shape: tuple[int, ...], constants: dict[int, Any]) -> None:
        from .providers.cpu.compiled import float_chain
        from .providers.cpu.compiled.jit import address

        self.steps = list(run)
        self.inputs, self.outputs, self.shape = tuple(inputs), tuple(outputs), shape
        self._fn = float_chain.function()
        self._address = address
        # registers: the inputs, the constants (broadcast to the shape once), temporaries
        # (reused once their value is dead), the outputs
        reg: dict[int, tuple[str, int]] = {s: ("r", i) for i, s in enumerate(inputs)}
        self._constants: list[np.ndarray] = []
        self._given = {s: constants[s] for st in run for s in st.inputs if s in constants}
        for s, c in self._given.items():
            reg[s] = ("r", len(inputs) + len(self._constants))
            self._constants.append(np.ascontiguousarray(np.broadcast_to(c, shape), np.float32))
        last = {s: k for k, st in enumerate(run) for s in st.inputs}
        free: list[int] = []
        n_temps = 0
        ops = []
        for k, st in enumerate(run):
            srcs = [reg[s] for s in st.inputs]
            for s in set(st.inputs):  # dying here: its register may take this step's output
                if reg[s][0] == "t" and last[s] == k:
                    free.append(reg[s][1])
            out = st.outputs[0]
            if out in outputs:
                reg[out] = ("o", outputs.index(out))
            else:
                t = free.pop() if free else n_temps
                n_temps = max(n_temps, t + 1)
                reg[out] = ("t", t)
            ops.append((float_chain.OPS[_OPS[st.kernel]], reg[out], srcs[0], srcs[-1]))
        first_temp = len(inputs) + len(self._constants)
        base = {"r": 0, "t": first_temp, "o": first_temp + n_temps}
        self._program = np.array([(code, *(base[kind] + i for kind, i in regs))
                                  for code, *regs in ops], np.int64)
        self._regs = np.zeros(first_temp + n_temps + len(outputs), np.int64)
        for i, c in enumerate(self._constants):
            self._regs[len(inputs) + i] = address(c)
        self._n = int(np.prod(shape))
        self._temps = (n_temps, self._n)
        self._first_temp, self._first_out = first_temp, first_temp + n_temps
        self._prog = (address(self._program), len(ops))

    def __call__(self, *args: Any) -> Any:
        shape = self.shape
        for x in args:
            if x.__class__ is not np.ndarray or x.dtype is not _F32 or x.shape != shape or \
                    not x.flags.c_contiguous:
                return self._numpy(args)
        address = self._address
        regs = self._regs.copy()  # a block per call: concurrent runs share the kernel
        for i, x in enumerate(args):
            regs[i] = address(x)
        temps = np.empty(self._temps, np.float32)
        step = 4 * self._n
        t0 = address(temps) if self._temps[0] else 0
        for i in range(self._temps[0]):
            regs[self._first_temp + i] = t0 + i * step
        outs = [np.empty(shape, np.float32) for _ in self.outputs]
        for i, o in enumerate(outs):
            regs[self._first_out + i] = address(o)
        self._fn(self._prog[0], self._prog[1], address(regs), self._n)
        return outs[0] if len(outs) == 1 else tuple(outs)

    def _numpy(self, args: tuple[Any, ...]) -> Any:
        """The steps' ufuncs one by one (what the plan ran before it was fused)."""
        values = {**self._given, **dict(zip(self.inputs, args, strict=True))}
        for st in self.steps:
            operands = [values[s] for s in st.inputs]
            try:
                values[st.outputs[0]] = st.kernel(*operands)
            except Exception as e:
                error = kernel_error(st.node, operands, e)
                error.names_its_node = True  # the run loop passes it on as it is
                raise error from e
        outs = [values[s] for s in self.outputs]
        return outs[0] if len(outs) == 1 else tuple(outs)
