"""ai.onnx.ml kernels (classic machine-learning operators)."""
