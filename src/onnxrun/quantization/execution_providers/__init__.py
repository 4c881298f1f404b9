"""Quantization configurations for other execution providers' QDQ models (``qnn``)."""
