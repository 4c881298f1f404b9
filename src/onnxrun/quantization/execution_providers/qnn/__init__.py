"""QDQ models for onnxruntime's QNN execution provider: ``get_qnn_qdq_config`` (tensor overrides
that QNN's operators need, mixed precision fixed up) and ``qnn_preprocess_model``."""

from __future__ import annotations

from .preprocess import qnn_preprocess_model
from .quant_config import get_qnn_qdq_config

__all__ = ["get_qnn_qdq_config", "qnn_preprocess_model"]
