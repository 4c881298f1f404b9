"""Kernel registries: operators keyed by (domain, op_type, since_version).

An operator is a plain function whose signature is its schema::

    @op("Gemm", 7, 9, 11, 13)
    def Gemm(A, B, C=None, *, alpha=1.0, beta=1.0, transA=0, transB=0): ...

Inputs are positional (optional ones default to None); attributes are keyword-only parameters
with the specification's defaults (no default = required). For operators that need work at
session creation (weights re-arranged, constant inputs read once), the kernel is a class::

    @op("Conv", 1, 11)
    class Conv:
        def __init__(self, ctx: KernelContext, *, group=1, ...): ...   # once per session
        def __call__(self, X, W, B=None): ...                          # every run: arithmetic only

A kernel returns one value for one output, or a tuple for several. Class kernels must not
mutate ``self`` in ``__call__``: one session may run on several threads at once.
"""

from __future__ import annotations

import bisect
import functools
import importlib
import inspect
import types
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..ir import Node
from ..proto import onnx

REQUIRED = inspect.Parameter.empty


@dataclass
class KernelContext:
    """What a kernel may know about its node when it is prepared (never per run)."""

    node: Node
    opset: int  # the model's opset version for the node's domain
    constants: list[np.ndarray | None]  # per input: its value when constant, else None
    outputs_used: list[bool]  # per output: whether anything reads it
    num_implicit_inputs: int = 0  # outer-scope values appended after the node's own inputs
    provider: Any = None
    session_options: Any = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.node.label

    @property
    def num_inputs(self) -> int:
        """Number of the node's own inputs (implicit outer-scope values not counted)."""
        return len(self.node.inputs)

    @property
    def num_outputs(self) -> int:
        return len(self.node.outputs)

    def constant(self, index: int) -> np.ndarray | None:
        return self.constants[index] if index < len(self.constants) else None

    def has_input(self, index: int) -> bool:
        """Whether the node's own input ``index`` is given (not a missing optional one)."""
        return index < self.num_inputs and self.node.inputs[index] is not None

    def constants_of(self, indices) -> list[np.ndarray | None] | None:
        """The values of inputs ``indices`` (None where an optional input is missing) when
        every given one is constant, else None: what a kernel prepares once."""
        values = []
        for i in indices:
            if not self.has_input(i):
                values.append(None)
                continue
            v = self.constant(i)
            if v is None:
                return None
            values.append(v)
        return values

    def input_type(self, index: int) -> onnx.TypeProto | None:
        if not self.has_input(index):
            return None
        return self.node.inputs[index].type

    def input_shape(self, index: int) -> list[int | str | None] | None:
        from ..dtypes import type_shape

        return type_shape(self.input_type(index))

    def output_used(self, index: int) -> bool:
        return index < len(self.outputs_used) and self.outputs_used[index]


@dataclass(frozen=True)
class KernelDef:
    domain: str
    op_type: str
    since_version: int
    impl: Callable[..., Any]
    is_class: bool

    @functools.cached_property
    def attributes(self) -> dict[str, Any]:
        """Attribute name -> default (REQUIRED when none). Read from the signature when first
        needed: for every registered kernel, that was a good part of a first session's
        creation time."""
        return _attribute_params(self.impl, self.is_class)

    @functools.cached_property
    def min_inputs(self) -> int:
        """How many inputs a run passes at the least: the call's positional parameters
        without a default (a node with fewer cannot run)."""
        fn = self.impl.__call__ if self.is_class else self.impl
        if type(fn) is types.FunctionType and not hasattr(fn, "__wrapped__"):
            required = fn.__code__.co_argcount - len(fn.__defaults__ or ())
            return required - 1 if self.is_class else required  # not self
        return sum(
            1 for p in inspect.signature(fn).parameters.values()
            if p.kind in (inspect.Parameter.POSITIONAL_ONLY,
                          inspect.Parameter.POSITIONAL_OR_KEYWORD)
            and p.default is REQUIRED and not (self.is_class and p.name == "self")
        )

    def instantiate(self, ctx: KernelContext, attrs: dict[str, Any]) -> Callable[..., Any]:
        """Bind parsed attributes (and prepare a class kernel): the result takes inputs only."""
        bound = {k: v for k, v in attrs.items() if k in self.attributes}
        missing = [k for k, d in self.attributes.items() if d is REQUIRED and k not in bound]
        if missing:
            raise ValueError(f"missing required attribute(s) {', '.join(missing)}")
        if self.is_class:
            return self.impl(ctx, **bound)
        return functools.partial(self.impl, **bound) if bound else self.impl


def text_attribute(value: Any) -> str:
    """A STRING attribute as a kernel's text: bytes as the model stores it, or what a Python
    caller passed."""
    return value.decode() if isinstance(value, bytes) else str(value)


def takes_out(kernel: Callable[..., Any]) -> Callable[..., Any]:
    """Mark a kernel function whose keyword-only ``out`` (not an attribute) is an array to
    write its one output into: ``kernel(*inputs, out=array)`` fills ``array`` (of the shape,
    dtype and strides its fresh output had when it last ran on inputs of these shapes) and
    returns it; ``out=None`` returns a fresh array. The executor hands such buffers out
    (memory.py); a class kernel says the same with ``accepts_out = True``."""
    kernel.accepts_out = True  # type: ignore[attr-defined]
    return kernel


def _attribute_params(impl: Callable[..., Any], is_class: bool) -> dict[str, Any]:
    fn = impl.__init__ if is_class else impl
    if type(fn) is types.FunctionType and not hasattr(fn, "__wrapped__"):
        # a plain function: its keyword-only parameters read off the code object (what
        # inspect.signature finds, ~30x cheaper: a first session reads one per kernel class)
        code = fn.__code__
        defaults = fn.__kwdefaults__ or {}
        names = code.co_varnames[code.co_argcount:code.co_argcount + code.co_kwonlyargcount]
        params = {name: defaults.get(name, REQUIRED) for name in names}
    else:
        sig = inspect.signature(fn)
        params = {
            p.name: p.default
            for p in sig.parameters.values()
            if p.kind is inspect.Parameter.KEYWORD_ONLY
        }
    if not is_class and getattr(impl, "accepts_out", False) is True:
        params.pop("out", None)  # the executor's buffer (takes_out), not an attribute
    return params


class KernelRegistry:
    """The kernels of one execution provider."""

    def __init__(self, provider_name: str) -> None:
        self.provider_name = provider_name
        # (domain, op_type) -> since_versions (sorted) and the parallel list of KernelDefs
        self._versions: dict[tuple[str, str], list[int]] = {}
        self._defs: dict[tuple[str, str], list[KernelDef]] = {}
        # Lazily registered kernels (see ``defer``): (domain, op_type) -> modules not yet imported
        # that register it, and what imports every module (None once done).
        self._deferred: dict[tuple[str, str], tuple[str, ...]] = {}
        self._import_rest: Callable[[], None] | None = None

    def defer(self, modules_by_op: Mapping[tuple[str, str], Iterable[str]],
              import_all: Callable[[], None]) -> None:
        """Register kernels lazily: the modules named for an operator are imported the first
        time it is looked up, so a session imports only the kernel families its model uses.
        ``import_all`` imports every module: a lookup that finds nothing calls it once, so an
        operator missing from ``modules_by_op`` is still found."""
        for key, modules in modules_by_op.items():
            self._deferred[key] = (*self._deferred.get(key, ()), *modules)
        self._import_rest = import_all

    def import_all(self) -> None:
        """Import every deferred kernel module now."""
        for key in list(self._deferred):
            self._import_deferred(key)
        if self._import_rest is not None:
            import_rest, self._import_rest = self._import_rest, None
            import_rest()

    def _import_deferred(self, key: tuple[str, str]) -> None:
        modules = self._deferred.get(key)
        if modules is None:
            return
        # Kernels registered for this operator before its modules load (a custom kernel meant
        # to override a built-in one) are registered again afterwards: they keep precedence, as
        # when every module was imported first.
        earlier = list(self._defs.get(key, ()))
        for name in modules:
            # A thread importing a module another thread is importing waits until it is done.
            importlib.import_module(name)
        self._deferred.pop(key, None)
        for kdef in earlier:
            self.add(kdef)

    def register(self, op_type: str, *since_versions: int, domain: str = ""
                 ) -> Callable[[Any], Any]:
        """Decorator: register ``impl`` for each listed since-version (default: 1)."""
        domain = "" if domain == "ai.onnx" else domain
        versions = since_versions or (1,)

        def decorate(impl: Any) -> Any:
            is_class = inspect.isclass(impl)
            for v in versions:
                self.add(KernelDef(domain, op_type, v, impl, is_class))
            return impl

        return decorate

    def add(self, kdef: KernelDef) -> None:
        key = (kdef.domain, kdef.op_type)
        versions = self._versions.setdefault(key, [])
        defs = self._defs.setdefault(key, [])
        i = bisect.bisect_left(versions, kdef.since_version)
        if i < len(versions) and versions[i] == kdef.since_version:
            defs[i] = kdef  # re-registration replaces (custom kernels may override built-ins)
        else:
            versions.insert(i, kdef.since_version)
            defs.insert(i, kdef)

    def lookup(self, domain: str, op_type: str, opset: int) -> KernelDef | None:
        """The kernel with the highest since_version not above ``opset``."""
        key = ("" if domain == "ai.onnx" else domain, op_type)
        if key in self._deferred:
            self._import_deferred(key)
        versions = self._versions.get(key)
        if not versions:
            if self._import_rest is None:
                return None
            self.import_all()
            versions = self._versions.get(key)
            if not versions:
                return None
        i = bisect.bisect_right(versions, opset) - 1
        return self._defs[key][i] if i >= 0 else None

    def operators(self) -> list[tuple[str, str, int]]:
        self.import_all()
        return sorted((d, o, v) for (d, o), vs in self._versions.items() for v in vs)
