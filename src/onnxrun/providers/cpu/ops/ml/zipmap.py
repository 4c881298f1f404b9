"""ZipMap (ai.onnx.ml 1): one dict per row, label -> score, as onnxruntime returns it.

onnxruntime builds a ``std::map`` per row, so its Python dicts iterate in sorted key order and a
repeated label keeps the score of its last column; the lists here are built the same way.
"""

from __future__ import annotations

import numpy as np

from ...kernels import KernelContext, op


@op("ZipMap", 1, domain="ai.onnx.ml")
class ZipMap:
    def __init__(self, ctx: KernelContext, *, classlabels_int64s=None, classlabels_strings=None):
        ints = list(classlabels_int64s or [])
        strings = list(classlabels_strings or [])
        if bool(ints) == bool(strings):
            raise ValueError("Must provide classlabels_strings or classlabels_int64s but not both.")
        labels = strings or [int(i) for i in ints]
        self.n_labels = len(labels)
        last = {label: i for i, label in enumerate(labels)}  # the last column of each label
        self.keys = sorted(last)
        self.columns = np.array([last[k] for k in self.keys], dtype=np.intp)

    def __call__(self, X):
        if X.ndim == 0:
            raise ValueError("Zipmap does not support empty dim count")
        if X.ndim > 2:
            raise ValueError("Zipmap only supports 1D or 2D input tensors")
        rows = X.reshape(1, -1) if X.ndim == 1 else X
        if rows.shape[1] != self.n_labels:
            raise ValueError(
                f"Input features_per_batch[{rows.shape[1]}] != number of classlabels"
                f"[{self.n_labels}]"
            )
        keys = self.keys
        values = rows[:, self.columns].astype(np.float32, copy=False).tolist()
        return [dict(zip(keys, row, strict=True)) for row in values]
