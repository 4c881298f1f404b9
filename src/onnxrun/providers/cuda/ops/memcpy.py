"""onnxruntime's MemcpyFromHost / MemcpyToHost: the copies ``onnxrun.memcpy`` inserts between
the CPU provider's values and the device's, once, at plan time. A copy of an initializer is
made when the session is created and handed out by every run."""

from __future__ import annotations

from ..kernels import KernelContext, op


@op("MemcpyFromHost", 1)
class MemcpyFromHost:
    def __init__(self, ctx: KernelContext) -> None:
        self.device = ctx.provider.backend
        constant = ctx.constant(0)
        self.constant = None if constant is None else self.device.to_device(constant)

    def __call__(self, X):
        if self.constant is not None:
            return self.constant
        if self.device.is_device_array(X):
            return X  # a feed that is already on the device (IOBinding, DLPack)
        return self.device.to_device(X)


@op("MemcpyToHost", 1)
class MemcpyToHost:
    def __init__(self, ctx: KernelContext) -> None:
        self.device = ctx.provider.backend

    def __call__(self, X):
        return self.device.to_host(X)
