"""Graph fusions onnxruntime's quantization tool applies before quantizing (for QNN and
friends): an operator subgraph replaced by the one operator it computes, so that it is
quantized as one. Each ``Fusion(model).apply()`` edits an ``ONNXModel`` in place and returns
whether it changed anything."""

from __future__ import annotations

from .fusion import Fusion
from .fusion_gelu import FusionGelu
from .fusion_layernorm import FusionLayerNormalization

__all__ = ["Fusion", "FusionGelu", "FusionLayerNormalization"]
