"""Small example models, under the names onnxruntime's documentation uses
(``onnxruntime.datasets.get_example("logreg_iris.onnx")``): ``logreg_iris.onnx`` (a logistic
regression on two iris features: LinearClassifier, Normalizer, ZipMap), ``mul_1.onnx``
(Y = X * W, X and W float[3,2]) and ``sigmoid.onnx`` (float[3,4,5]). The files are built by
``python -m onnxrun.datasets.build``.
"""

from __future__ import annotations

import os


def get_example(name: str) -> str:
    """The absolute file name of the example model ``name``."""
    here = os.path.dirname(os.path.abspath(__file__))
    full = os.path.join(here, name)
    if os.path.basename(name) != name or not name.endswith(".onnx") or not os.path.isfile(full):
        examples = sorted(f for f in os.listdir(here) if f.endswith(".onnx"))
        raise FileNotFoundError(f"Unable to find example '{name}'; the examples are {examples}")
    return full


__all__ = ["get_example"]
