"""The public API, with onnxruntime's names."""
