"""FusedConv (com.microsoft): Conv, plus the optional Z input summed in, then one of the
activations FusedGemm takes (``fused.make_activation``). A module of its own so that models
without convolutions (FusedGemm, FusedMatMul) do not import ``conv.py``.
"""

from __future__ import annotations

from ...kernels import KernelContext, op
from ..conv import Conv
from .fused import MS, activation_arguments, make_activation


@op("FusedConv", 1, domain=MS)
class FusedConv(Conv):
    """Conv, plus the optional Z input summed in, then the activation."""

    def __init__(self, ctx: KernelContext, *, activation="", activation_params=None,
                 auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=None,
                 strides=None) -> None:
        super().__init__(ctx, auto_pad=auto_pad, dilations=dilations, group=group,
                         kernel_shape=kernel_shape, pads=pads, strides=strides)
        self.act = make_activation(activation, *activation_arguments(activation_params))

    def __call__(self, X, W, B=None, Z=None, *, out=None):
        # the activation runs in place on the (compute-dtype) output, bias and Z added
        return self._forward(X, W, B, Z, self.act, out)
