"""SVMClassifier and SVMRegressor (ai.onnx.ml 1), following onnxruntime's ``svmclassifier.cc`` /
``svmregressor.cc``: libsvm one-vs-one decision values and votes, Platt probabilities coupled
with libsvm's ``multiclass_probability`` (run in float32 for all rows at once), and onnxruntime's
rules for labels and binary score columns.
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

_KERNELS = ("LINEAR", "POLY", "RBF", "SIGMOID")
_CHUNK = 1 << 22  # kernel values computed at once (rows x support vectors)


class _Kernel:
    def __init__(self, kernel_type: str, kernel_params) -> None:
        if kernel_type not in _KERNELS:
            raise ValueError(f"unknown kernel_type '{kernel_type}'")
        self.type = kernel_type
        params = list(kernel_params or [])
        if params and len(params) < 3:
            raise ValueError("kernel_params must hold gamma, coef0 and degree")
        self.gamma, self.coef0, self.degree = (float(np.float32(p)) for p in params[:3]) \
            if params else (0.0, 0.0, 0.0)

    def __call__(self, X: np.ndarray, B: np.ndarray, c_linear: float = 0.0) -> np.ndarray:
        """[N, M] kernel values between the rows of X [N, F] and of B [M, F] (float64)."""
        X = X.astype(np.float64)
        if self.type == "RBF":
            d = (X * X).sum(axis=1)[:, None] + (B * B).sum(axis=1)[None, :] - 2.0 * (X @ B.T)
            return np.exp(-self.gamma * np.maximum(d, 0.0))
        if self.type == "LINEAR":
            return X @ B.T + c_linear
        out = self.gamma * (X @ B.T) + self.coef0
        if self.type == "POLY":
            d = self.degree
            if d == int(d) and 1 <= d <= 8:
                # repeated products: np.power with a float exponent is ~100x slower
                res = out.copy()
                for _ in range(int(d) - 1):
                    res *= out
                return res
            with np.errstate(invalid="ignore", divide="ignore"):
                return out ** d
        return np.tanh(out)

    def reduce(self, X: np.ndarray, B: np.ndarray, M: np.ndarray) -> np.ndarray:
        """kernel(X, B) @ M, a block of rows at a time so the kernel matrix stays small."""
        step = max(1, _CHUNK // max(len(B), 1))
        if len(X) <= step:
            return self(X, B) @ M
        out = np.empty((len(X),) + M.shape[1:])
        for r0 in range(0, len(X), step):
            out[r0:r0 + step] = self(X[r0:r0 + step], B) @ M
        return out


def _logistic32(v: np.ndarray) -> np.ndarray:
    one = np.float32(1)
    e = one / (one + np.exp(-np.abs(v)))
    return np.where(v < 0, one - e, e)


def multiclass_probability(r: np.ndarray) -> np.ndarray:
    """libsvm's pairwise coupling (onnxruntime's float32 version), for all rows at once.

    ``r`` is [N, k, k] with r[i, j] the probability of class i against class j. Each row stops
    iterating when its own convergence test passes, exactly as the per-row loop would.
    """
    N, k, _ = r.shape
    f32 = np.float32
    Q = np.zeros((N, k, k), dtype=f32)
    for i in range(k):
        for j in range(k):
            if j != i:
                Q[:, i, i] += r[:, j, i] * r[:, j, i]
        for j in range(i):
            Q[:, i, j] = Q[:, j, i]
        for j in range(i + 1, k):
            Q[:, i, j] = -r[:, j, i] * r[:, i, j]
    p = np.full((N, k), f32(1) / f32(k), dtype=f32)
    eps = f32(0.005) / f32(k)
    active = np.arange(N)
    for _ in range(100):
        Qa, pa = Q[active], p[active]
        Qp = np.zeros_like(pa)
        for j in range(k):
            Qp += Qa[:, :, j] * pa[:, j:j + 1]
        pQp = np.zeros(len(active), dtype=f32)
        for i in range(k):
            pQp += pa[:, i] * Qp[:, i]
        err = np.abs(Qp - pQp[:, None]).max(axis=1)
        going = err >= eps
        active, Qa, pa, Qp, pQp = (a[going] for a in (active, Qa, pa, Qp, pQp))
        if active.size == 0:
            break
        for i in range(k):
            qii = Qa[:, i, i]
            diff = (-Qp[:, i] + pQp) / qii
            pa[:, i] += diff
            d1 = f32(1) + diff
            pQp = (pQp + diff * (diff * qii + f32(2) * Qp[:, i])) / d1 / d1
            Qp = (Qp + diff[:, None] * Qa[:, i, :]) / d1[:, None]
            pa /= d1[:, None]
        p[active] = pa
    return p


@op("SVMClassifier", 1, domain="ai.onnx.ml")
class SVMClassifier:
    def __init__(self, ctx: KernelContext, *, classlabels_ints=None, classlabels_strings=None,
                 coefficients=None, kernel_params=None, kernel_type="LINEAR",
                 post_transform="NONE", prob_a=None, prob_b=None, rho=None,
                 support_vectors=None, vectors_per_class=None):
        self.strings = list(classlabels_strings or [])
        self.ints = list(classlabels_ints or [])
        if not self.strings and not self.ints:
            raise ValueError("classlabels_ints or classlabels_strings must be set")
        self.labels = (np.array(self.strings, dtype=object) if self.strings
                       else np.array(self.ints, dtype=np.int64))
        C = self.n_classes = len(self.labels)
        self.post = check_post_transform(post_transform)
        coef = np.asarray(coefficients or [], dtype=np.float32)
        if coef.size == 0:
            raise ValueError("SVMClassifier needs coefficients")
        self.rho = np.asarray(rho or [], dtype=np.float32).astype(np.float64)
        if self.rho.size == 0:
            raise ValueError("SVMClassifier needs rho")
        self.prob_a = np.asarray(prob_a or [], dtype=np.float32)
        self.prob_b = np.asarray(prob_b or [], dtype=np.float32)
        if len(self.prob_a) != len(self.prob_b):
            raise ValueError("prob_a and prob_b must have the same length")
        self.all_positive = bool((coef >= 0).all())
        self.n_pairs = C * (C - 1) // 2
        vpc = [int(v) for v in (vectors_per_class or [])]
        V = sum(vpc)
        self.svc = V > 0
        self.kernel = _Kernel(kernel_type, kernel_params)
        if not self.svc:
            # liblinear form: one weight row per class, the kernel is linear
            self.kernel = _Kernel("LINEAR", kernel_params)
            if coef.size % C:
                raise ValueError("coefficients must hold one row per class")
            self.weights = coef.reshape(C, -1).astype(np.float64)
            self.n_features = self.weights.shape[1]
            # probabilities need support vectors; prob_a only changes the binary label rule
            self.have_proba = len(self.prob_a) > 0
            return
        sv = np.asarray(support_vectors or [], dtype=np.float32)
        if sv.size == 0 or sv.size % V:
            raise ValueError("support_vectors must hold vectors_per_class vectors")
        self.support = sv.reshape(V, -1).astype(np.float64)
        self.n_features = self.support.shape[1]
        if len(vpc) != C:
            raise ValueError("vectors_per_class needs one count per class")
        if coef.size != (C - 1) * V:
            raise ValueError(f"coefficients must hold (classes - 1) x {V} values")
        if self.rho.size < self.n_pairs:
            raise ValueError(f"rho must hold {self.n_pairs} values (one per class pair)")
        coef = coef.reshape(C - 1, V).astype(np.float64)
        start = np.r_[0, np.cumsum(vpc)]
        # decision value of pair (i, j) = kernels @ column: coef[j-1] on class i's vectors,
        # coef[i] on class j's vectors
        M = np.zeros((V, self.n_pairs))
        pi, pj = [], []
        for i in range(C - 1):
            for j in range(i + 1, C):
                k = len(pi)
                M[start[i]:start[i + 1], k] = coef[j - 1, start[i]:start[i + 1]]
                M[start[j]:start[j + 1], k] = coef[i, start[j]:start[j + 1]]
                pi.append(i)
                pj.append(j)
        self.pair_matrix = M
        self.pair_i = np.array(pi, dtype=np.intp)
        self.pair_j = np.array(pj, dtype=np.intp)
        self.have_proba = len(self.prob_a) > 0
        if self.have_proba and len(self.prob_a) < self.n_pairs:
            raise ValueError(f"prob_a / prob_b must hold {self.n_pairs} values")

    def _check(self, X: np.ndarray) -> np.ndarray:
        X = rows_2d(as_float_input(X))
        if X.shape[1] != self.n_features:
            raise ValueError(f"expected {self.n_features} features, got {X.shape[1]}")
        return X

    def _probabilities(self, D: np.ndarray) -> np.ndarray:
        N, C = D.shape[0], self.n_classes
        f32 = np.float32
        val = D.astype(f32) * self.prob_a[: self.n_pairs] + self.prob_b[: self.n_pairs]
        p = f32(1) - _logistic32(val)
        p = np.minimum(np.maximum(p, f32(1e-7)), f32(1) - f32(1e-7))
        r = np.zeros((N, C, C), dtype=f32)
        r[:, self.pair_i, self.pair_j] = p
        r[:, self.pair_j, self.pair_i] = f32(1) - p
        return multiclass_probability(r)

    def __call__(self, X):
        X = self._check(X)
        N, C = X.shape[0], self.n_classes
        wa = -1  # onnxruntime's add_second_class
        if not self.svc:
            scores = self.kernel(X, self.weights, float(self.rho[0]))
            maxclass = scores.argmax(axis=1) if C else np.zeros(N, np.intp)
            max_weight = scores.max(axis=1) if C else np.zeros(N)
        else:
            D = self.kernel.reduce(X, self.support, self.pair_matrix) + self.rho[: self.n_pairs]
            winner = np.where(D > 0, self.pair_i, self.pair_j)
            rows = np.repeat(np.arange(N) * C, self.n_pairs)
            votes = np.bincount(rows + winner.reshape(-1), minlength=N * C).reshape(N, C)
            maxclass = votes.argmax(axis=1)
            max_weight = np.zeros(N)
            if self.have_proba:
                scores = self._probabilities(D)
            else:
                scores = D
                if C <= 2:
                    wa = 2 if self.post == "NONE" else 0
        # labels
        if self.n_pairs == 1:
            if len(self.labels) == 2:
                if self.have_proba:
                    label = self.labels[maxclass]
                else:
                    top = ((self.all_positive & (max_weight >= 0.5))
                           | ((max_weight > 0) & (not self.all_positive)))
                    label = np.where(top, self.labels[1], self.labels[maxclass])
            else:
                pos, neg = ("1", "0") if self.strings else (1, 0)
                label = np.where(max_weight > 0, pos, neg)
            label = label.astype(object if self.strings else np.int64)
        else:
            label = self.labels[maxclass]
        # scores
        if scores.shape[1] > 1:
            Z = transform_scores(scores, self.post)
        elif wa >= 0:
            Z = binary_scores(scores[:, 0], self.post, wa)
        elif self.post == "PROBIT":
            Z = probit(scores)
        else:
            Z = scores
        return label, np.asarray(Z, dtype=np.float32)


@op("SVMRegressor", 1, domain="ai.onnx.ml")
class SVMRegressor:
    def __init__(self, ctx: KernelContext, *, coefficients=None, kernel_params=None,
                 kernel_type="LINEAR", n_supports=0, one_class=0, post_transform="NONE",
                 rho=None, support_vectors=None):
        coef = np.asarray(coefficients or [], dtype=np.float32).astype(np.float64)
        if coef.size == 0:
            raise ValueError("SVMRegressor needs coefficients")
        rho = np.asarray(rho or [], dtype=np.float32)
        if rho.size == 0:
            raise ValueError("SVMRegressor needs rho")
        self.rho = float(rho[0])
        self.one_class = bool(one_class)
        check_post_transform(post_transform)  # onnxruntime ignores it
        self.coef = coef
        V = int(n_supports)
        self.svc = V > 0
        if self.svc:
            sv = np.asarray(support_vectors or [], dtype=np.float32)
            if sv.size == 0 or sv.size % V or coef.size != V:
                raise ValueError("support_vectors / coefficients do not match n_supports")
            self.support = sv.reshape(V, -1).astype(np.float64)
            self.n_features = self.support.shape[1]
            self.kernel = _Kernel(kernel_type, kernel_params)
        else:
            self.n_features = coef.size
            self.kernel = _Kernel("LINEAR", kernel_params)

    def __call__(self, X):
        X = rows_2d(as_float_input(X))
        if X.shape[1] != self.n_features:
            raise ValueError(f"expected {self.n_features} features, got {X.shape[1]}")
        if self.svc:
            Y = self.kernel.reduce(X, self.support, self.coef) + self.rho
        else:
            Y = self.kernel(X, self.coef.reshape(1, -1), self.rho)[:, 0]
        if self.one_class:
            Y = np.where(Y > 0, 1.0, -1.0)
        return Y.reshape(-1, 1).astype(np.float32)
