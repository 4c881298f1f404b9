"""Command-line tools: ``onnxrun info`` and ``onnxrun run`` (see ``onnxrun.tools.cli``)."""
