"""LinearClassifier and LinearRegressor (ai.onnx.ml 1): one GEMM, then onnxruntime's labelling
and score post-transform rules (``linearclassifier.cc``, ``linearregressor.cc``).

Like onnxruntime, inputs are converted to float32 and the scores are computed in float32.
"""

from __future__ import annotations

import numpy as np

from ...kernels import KernelContext, op
from ._common import (
    as_float_input,
    binary_scores,
    check_post_transform,
    probit,
    rows_2d,
    transform_scores,
)


class _Weights:
    """The [features, targets] float32 weights for an input's feature count. onnxruntime reads
    the coefficients attribute as a row-major [targets, features] matrix of the *input's*
    feature count, so a model whose attribute holds more values than that (e.g. a classifier
    fed fewer columns than it was trained on) uses the leading ones; fewer values is an error."""

    def __init__(self, coefficients, n_targets: int) -> None:
        coef = np.asarray(coefficients, dtype=np.float32).reshape(-1)
        if n_targets <= 0 or coef.size == 0:
            raise ValueError(
                f"coefficients has {coef.size} values: not enough for {n_targets} targets")
        self.coef, self.n_targets = coef, n_targets
        self._by_features: dict[int, np.ndarray] = {}
        if coef.size % n_targets == 0:
            self.for_features(coef.size // n_targets)  # the usual case, prepared once

    def for_features(self, n_features: int) -> np.ndarray:
        W = self._by_features.get(n_features)
        if W is None:
            need = n_features * self.n_targets
            if need > self.coef.size:
                raise ValueError(
                    f"{n_features} input features need {need} coefficients ({self.n_targets} "
                    f"targets), the attribute has {self.coef.size}")
            W = np.ascontiguousarray(self.coef[:need].reshape(self.n_targets, n_features).T)
            self._by_features[n_features] = W
        return W


def _gemm(X: np.ndarray, weights: _Weights, intercepts: np.ndarray | None) -> np.ndarray:
    X = rows_2d(as_float_input(X))
    scores = X @ weights.for_features(X.shape[1])
    if intercepts is not None:
        scores += intercepts
    return scores


@op("LinearClassifier", 1, domain="ai.onnx.ml")
class LinearClassifier:
    def __init__(self, ctx: KernelContext, *, coefficients, classlabels_ints=None,
                 classlabels_strings=None, intercepts=None, multi_class=0,
                 post_transform="NONE"):
        if classlabels_ints and classlabels_strings:
            raise ValueError("only one of classlabels_ints and classlabels_strings may be set")
        self.strings = list(classlabels_strings or [])
        self.ints = list(classlabels_ints or [])
        self.labels = (np.array(self.strings, dtype=object) if self.strings
                       else np.array(self.ints, dtype=np.int64))
        self.post = check_post_transform(post_transform)
        self.intercepts = np.asarray(intercepts or [], dtype=np.float32)
        # onnxruntime takes the number of scores from the intercepts
        self.n_targets = len(self.intercepts)
        if self.n_targets == 0:
            raise ValueError("LinearClassifier needs intercepts (one per class score)")
        self.weights = _Weights(coefficients, self.n_targets)
        if self.n_targets == 1 and len(self.labels) != 2:
            raise ValueError(
                "LinearClassifier: one score (binary classification) needs exactly 2 class labels"
            )
        if self.n_targets > 1 and len(self.labels) < self.n_targets:
            raise ValueError(
                f"{self.n_targets} class scores but only {len(self.labels)} class labels"
            )

    def __call__(self, X):
        scores = _gemm(X, self.weights, self.intercepts)
        N = scores.shape[0]
        if self.n_targets == 1:
            label = self.labels[(scores[:, 0] > 0).astype(np.intp)]
        else:
            label = self.labels[scores.argmax(axis=1)]
        if self.n_targets > 1:
            Z = transform_scores(scores, self.post)
        elif self.post == "PROBIT":
            # onnxruntime transforms the packed scores in place: rows stay packed at the front
            Z = np.zeros(2 * N, dtype=np.float32)
            Z[:N] = probit(scores[:, 0])
            Z = Z.reshape(N, 2)
        else:
            # one score, two labels: a second column is added ([1 - s, s], or logistic)
            Z = binary_scores(scores[:, 0], self.post, 1)
        return label, Z.astype(np.float32, copy=False)


@op("LinearRegressor", 1, domain="ai.onnx.ml")
class LinearRegressor:
    def __init__(self, ctx: KernelContext, *, coefficients=None, intercepts=None,
                 post_transform="NONE", targets=1):
        if coefficients is None:
            raise ValueError("LinearRegressor needs coefficients")
        self.n_targets = int(targets)
        self.weights = _Weights(coefficients, self.n_targets)
        inter = np.asarray(intercepts or [], dtype=np.float32)
        # onnxruntime ignores intercepts whose count is not the number of targets
        self.intercepts = inter if len(inter) == self.n_targets else None
        self.post = check_post_transform(post_transform)

    def __call__(self, X):
        if X.ndim > 2:
            raise ValueError(f"Input shape had more than 2 dimension. Dims={X.ndim}")
        Y = _gemm(X, self.weights, self.intercepts)
        if self.n_targets > 1:
            Y = transform_scores(Y, self.post)
        elif self.post == "PROBIT":
            Y = probit(Y)
        return Y.astype(np.float32, copy=False)
