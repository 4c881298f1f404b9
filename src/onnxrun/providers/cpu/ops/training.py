"""Optimizers of the ai.onnx.preview.training domain: Adagrad, Adam and Momentum.

Each takes R (learning rate) and T (iteration count) followed by N tensors to optimize, then
their N gradients and the optimizer states, and returns the updated tensors then the updated
states. Arithmetic runs in float64 and is cast back to each input's dtype. (``Gradient``, which
differentiates the enclosing graph, is in gradient.py.)
"""

from __future__ import annotations

import numpy as np

from ..kernels import op

_DOMAIN = "ai.onnx.preview.training"


def _split(inputs: tuple, groups: int, name: str) -> list[tuple]:
    if len(inputs) % groups or not inputs:
        raise ValueError(f"{name}: expected a multiple of {groups} tensors after R and T, "
                         f"got {len(inputs)}")
    n = len(inputs) // groups
    return [inputs[k * n:(k + 1) * n] for k in range(groups)]


def _scalar(v) -> float:
    return float(np.asarray(v, dtype=np.float64).reshape(-1)[0])


@op("Adagrad", 1, domain=_DOMAIN)
def Adagrad(R, T, *inputs, decay_factor=0.0, epsilon=1e-6, norm_coefficient=0.0):
    xs, gs, hs = _split(inputs, 3, "Adagrad")
    r = _scalar(R) / (1.0 + _scalar(T) * decay_factor)
    new_x, new_h = [], []
    for x, g, h in zip(xs, gs, hs, strict=True):
        xd = x.astype(np.float64)
        g_reg = norm_coefficient * xd + g
        h_new = h + g_reg * g_reg
        new_x.append((xd - r * g_reg / (np.sqrt(h_new) + epsilon)).astype(x.dtype))
        new_h.append(h_new.astype(h.dtype))
    return tuple(new_x + new_h)


@op("Adam", 1, domain=_DOMAIN)
def Adam(R, T, *inputs, alpha=0.9, beta=0.999, epsilon=1e-6, norm_coefficient=0.0,
         norm_coefficient_post=0.0):
    xs, gs, vs, hs = _split(inputs, 4, "Adam")
    t = _scalar(T)
    r = _scalar(R)
    if t > 0:  # bias correction of both moments
        r = r * np.sqrt(1 - beta ** t) / (1 - alpha ** t)
    new_x, new_v, new_h = [], [], []
    for x, g, v, h in zip(xs, gs, vs, hs, strict=True):
        xd = x.astype(np.float64)
        g_reg = norm_coefficient * xd + g
        v_new = alpha * v.astype(np.float64) + (1 - alpha) * g_reg
        h_new = beta * h.astype(np.float64) + (1 - beta) * (g_reg * g_reg)
        x_new = xd - r * (v_new / (np.sqrt(h_new) + epsilon))
        new_x.append(((1 - norm_coefficient_post) * x_new).astype(x.dtype))
        new_v.append(v_new.astype(v.dtype))
        new_h.append(h_new.astype(h.dtype))
    return tuple(new_x + new_v + new_h)


@op("Momentum", 1, domain=_DOMAIN)
def Momentum(R, T, *inputs, alpha, beta, mode, norm_coefficient):
    if mode not in ("standard", "nesterov"):
        raise ValueError(f"Momentum: mode must be 'standard' or 'nesterov', got '{mode}'")
    xs, gs, vs = _split(inputs, 3, "Momentum")
    r = _scalar(R)
    beta_t = beta if _scalar(T) > 0 else 1.0  # the first step takes the whole gradient
    new_x, new_v = [], []
    for x, g, v in zip(xs, gs, vs, strict=True):
        xd = x.astype(np.float64)
        g_reg = norm_coefficient * xd + g
        v_new = alpha * v.astype(np.float64) + beta_t * g_reg
        step = v_new if mode == "standard" else g_reg + alpha * v_new
        new_x.append((xd - r * step).astype(x.dtype))
        new_v.append(v_new.astype(v.dtype))
    return tuple(new_x + new_v)
