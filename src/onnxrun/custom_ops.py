"""Public registration of Python kernels for custom operators.

    import onnxrun

    @onnxrun.register_custom_op("MyRelu", domain="my.domain")
    def my_relu(X, *, alpha=0.0):
        return np.where(X > 0, X, alpha * X)

The kernel follows the same convention as the built-in CPU kernels (see
``onnxrun.providers.registry``): inputs positional, attributes keyword-only, or a class with
``__init__(ctx, **attrs)`` and ``__call__(*inputs)``. A model that uses the domain must import it
in its ``opset_import``; registration must happen before the session is created.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def register_custom_op(op_type: str, domain: str, *since_versions: int
                       ) -> Callable[[Any], Any]:
    """Decorator registering a CPU kernel for ``(domain, op_type)`` (since_version 1 by default)."""
    if not domain or domain == "ai.onnx":
        raise ValueError("custom operators need their own domain (not the default ai.onnx)")
    from .providers.cpu import CPUExecutionProvider, cpu_kernels

    CPUExecutionProvider()  # load the built-in kernels first so a custom one can override them
    return cpu_kernels.register(op_type, *since_versions, domain=domain)
