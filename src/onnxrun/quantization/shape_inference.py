"""onnxruntime's module name for ``quant_pre_process`` (onnxrun keeps it in ``preprocess``)."""

from __future__ import annotations

from .preprocess import quant_pre_process

__all__ = ["quant_pre_process"]
