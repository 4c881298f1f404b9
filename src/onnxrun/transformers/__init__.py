"""Model tools of ``onnxruntime.transformers`` that onnxrun provides with the same API.

``onnxrun.transformers.float16.convert_float_to_float16`` converts a float32 model to float16.
"""

from __future__ import annotations
