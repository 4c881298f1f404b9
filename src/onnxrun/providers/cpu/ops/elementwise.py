"""Elementwise arithmetic: binary operators with numpy broadcasting, and unary math."""

from __future__ import annotations

import numpy as np

from ..kernels import op


@op("Add", 1, 6, 7, 13, 14)
def Add(A, B):
    return np.add(A, B)


@op("Sub", 1, 6, 7, 13, 14)
def Sub(A, B):
    return np.subtract(A, B)


@op("Mul", 1, 6, 7, 13, 14)
def Mul(A, B):
    return np.multiply(A, B)


@op("Relu", 1, 6, 13, 14)
def Relu(X):
    return np.maximum(X, X.dtype.type(0))


@op("Identity", 1, 13, 14, 16, 19, 21, 25)
def Identity(input):  # noqa: A002 - the schema's name
    return input
