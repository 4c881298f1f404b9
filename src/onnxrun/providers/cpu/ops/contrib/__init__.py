"""com.microsoft kernels: the contrib operators onnxruntime's optimizer and tools write."""
