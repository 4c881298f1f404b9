"""Step 6 of a session: the run loop. It only moves values between slots and calls kernels."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, NamedTuple

from . import profile
from .dtypes import describe
from .errors import Fail, RuntimeException
from .ir import Node


class Step(NamedTuple):
    kernel: Callable[..., Any]
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    frees: tuple[int, ...]
    node: Node
    provider: str = "CPUExecutionProvider"


class RunTerminated(Fail):
    """RunOptions.terminate was set while the run was in progress (onnxruntime raises Fail)."""


def run_steps(steps: list[Step], slots: list[Any], names: list[str], run_options: Any = None
              ) -> None:
    profiler = profile.active()
    if profiler is not None:
        _run_steps_profiled(steps, slots, run_options, profiler)
        return
    check_terminate = run_options is not None
    for kernel, ins, outs, frees, node, _ in steps:
        if check_terminate and run_options.terminate:
            raise RunTerminated("Exiting due to terminate flag being set to true.")
        args = [slots[i] for i in ins]
        try:
            result = kernel(*args)
        except RunTerminated:
            raise
        except Exception as e:
            raise kernel_error(node, args, e) from e
        if type(result) is tuple:
            for s, r in zip(outs, result, strict=False):
                slots[s] = r
        else:
            slots[outs[0]] = result
        for s in frees:
            slots[s] = None


def _run_steps_profiled(steps: list[Step], slots: list[Any], run_options: Any,
                        profiler: profile.Profiler) -> None:
    """The same loop, timing each node and recording its input and output shapes."""
    clock = time.perf_counter_ns
    for kernel, ins, outs, frees, node, provider in steps:
        if run_options is not None and run_options.terminate:
            raise RunTerminated("Exiting due to terminate flag being set to true.")
        args = [slots[i] for i in ins]
        start = clock()
        try:
            result = kernel(*args)
        except RunTerminated:
            raise
        except Exception as e:
            raise kernel_error(node, args, e) from e
        end = clock()
        results = result if type(result) is tuple else (result,)
        profiler.node_event(node, provider, args[: len(node.inputs)], list(results), start, end)
        for s, r in zip(outs, results, strict=False):
            slots[s] = r
        for s in frees:
            slots[s] = None


def kernel_error(node: Node, args: list[Any], error: Exception) -> RuntimeException:
    if isinstance(error, RuntimeException) and "while running node" in str(error):
        # An error from inside a subgraph: keep its node context and add ours in front.
        return RuntimeException(
            f"while running node '{node.label}' ({node.op_type}) subgraph: {error}"
        )
    shapes = ", ".join(describe(a) for a in args[: len(node.inputs)])
    return RuntimeException(
        f"while running node '{node.label}' ({node.op_type}) with inputs {shapes}: "
        f"{type(error).__name__}: {error}"
    )
