"""Recurrent layers: LSTM, GRU and RNN (every opset, layout 0 and 1, all three directions).

All directions advance together: state arrays are ``[num_directions, batch, hidden]``, the input
projection ``X·W^T + biases`` for every time step (and both directions) is one GEMM done up
front, and each step only does the recurrent ``H·R^T`` (a stacked matmul over directions) and the
gate arithmetic. The reverse direction reads a time-reversed copy of that projection, reversed per
batch row when ``sequence_lens`` is given, and its outputs are un-reversed at the end. Rows whose
sequence has ended keep their state and emit zeros, as onnxruntime does.

The usual float32 LSTM (sigmoid, tanh, tanh; no peepholes) and GRU (sigmoid, tanh;
linear_before_reset) on full-length sequences of up to COMPILED_MAX_ROWS rows run each
direction's whole recurrence in one compiled call (``compiled/lstm.py``), the directions on
threads of their own; elsewhere (and without llvmlite) the numpy step loop below.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..kernels import KernelContext, op
from ..parallel import threads_for

# -- activations -----------------------------------------------------------------------------------

# name -> (takes alpha, takes beta, default alpha, default beta). Unlisted defaults are 0, and
# alpha/beta are consumed only by the functions that take them: both as onnxruntime does.
_ACT_ARGS: dict[str, tuple[bool, bool, float, float]] = {
    "relu": (False, False, 0.0, 0.0),
    "tanh": (False, False, 0.0, 0.0),
    "sigmoid": (False, False, 0.0, 0.0),
    "affine": (True, True, 0.0, 0.0),
    "leakyrelu": (True, False, 0.01, 0.0),
    "thresholdedrelu": (True, False, 0.0, 0.0),
    "scaledtanh": (True, True, 0.0, 0.0),
    "hardsigmoid": (True, True, 0.2, 0.5),
    "elu": (True, False, 1.0, 0.0),
    "softsign": (False, False, 0.0, 0.0),
    "softplus": (False, False, 0.0, 0.0),
}


class _Act:
    """One activation function. Works in place on C-contiguous temporaries; a strided view is
    read once into a new contiguous array (ufuncs writing back to strided memory are slow)."""

    __slots__ = ("name", "alpha", "beta", "key")

    def __init__(self, name: str, alpha: float, beta: float) -> None:
        self.name, self.alpha, self.beta = name, alpha, beta
        self.key = (name, alpha, beta)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        name, a, b = self.name, self.alpha, self.beta
        out = x if x.flags.c_contiguous else None
        if name == "sigmoid":  # 0.5·(1 + tanh(x/2)): no overflow for large |x|
            y = np.multiply(x, 0.5, out=out)
            np.tanh(y, out=y)
            y += 1
            y *= 0.5
            return y
        if name == "tanh":
            return np.tanh(x, out=out)
        if name == "relu":
            return np.maximum(x, 0, out=out)
        if name in ("affine", "hardsigmoid"):
            y = np.multiply(x, a, out=out)
            y += b
            return np.clip(y, 0, 1, out=y) if name == "hardsigmoid" else y
        if name == "leakyrelu":
            return np.where(x < 0, x * a, x)
        if name == "thresholdedrelu":
            return np.where(x < a, 0, x)
        if name == "scaledtanh":
            y = np.multiply(x, b, out=out)
            np.tanh(y, out=y)
            y *= a
            return y
        if name == "elu":
            return np.where(x < 0, np.expm1(x) * a, x)
        if name == "softsign":
            return np.divide(x, np.abs(x) + 1, out=out)
        if name == "softplus":
            return np.logaddexp(x, 0, out=out)
        raise AssertionError(name)  # pragma: no cover - rejected in _activations


def _activations(
    names: list[str] | None, defaults: list[str], alphas: list[float] | None,
    betas: list[float] | None, num_directions: int,
) -> list[list[_Act]]:
    """Per direction, the op's activation functions (f, g, h for LSTM)."""
    per_dir = len(defaults)
    names = list(names) if names else defaults * num_directions
    if len(names) == per_dir and num_directions == 2:
        names = names * 2  # one set given for a bidirectional layer: both directions use it
    if len(names) != per_dir * num_directions:
        raise ValueError(
            f"expected {per_dir * num_directions} activations for {num_directions} direction(s), "
            f"got {len(names)}"
        )
    alpha_it = iter(alphas or ())
    beta_it = iter(betas or ())
    acts: list[_Act] = []
    for name in names:
        key = name.lower()
        spec = _ACT_ARGS.get(key)
        if spec is None:
            raise ValueError(f"unsupported activation function '{name}'")
        takes_a, takes_b, da, db = spec
        alpha = float(next(alpha_it, da)) if takes_a else 0.0
        beta = float(next(beta_it, db)) if takes_b else 0.0
        acts.append(_Act(key, alpha, beta))
    return [acts[d * per_dir:(d + 1) * per_dir] for d in range(num_directions)]


def _apply(acts: list[_Act], x: np.ndarray) -> np.ndarray:
    """Each direction's activation of ``x[d]`` (one call when all directions agree)."""
    if all(a.key == acts[0].key for a in acts):
        return acts[0](x)
    out = np.empty(x.shape, x.dtype)
    for d, a in enumerate(acts):
        out[d] = a(x[d])
    return out


F32_MAX = float(np.finfo(np.float32).max)


def clip_gates(x: np.ndarray, clip: float | None, biased: bool = False) -> None:
    """onnxruntime's clip of a gate's pre-activation, in place. With a bias B it is
    ``max(-b, min(b, x))`` in C++'s std::min/max, which turn a NaN into +b, b the clip or
    FLT_MAX when none is set (so a NaN input gives finite outputs); without B a plain clip,
    which keeps NaN (and none without a clip)."""
    if biased:
        bound = F32_MAX if clip is None else clip
        np.fmin(x, bound, out=x)  # fmin/fmax ignore NaN: NaN -> bound, as std::min(b, NaN)
        np.fmax(x, -bound, out=x)
    elif clip is not None:
        np.clip(x, -clip, clip, out=x)


# -- shared set-up --------------------------------------------------------------------------------


def _directions(direction: str) -> list[bool]:
    """Per direction, whether it runs backwards in time."""
    d = direction.lower() if isinstance(direction, str) else direction
    if d in ("forward", "foward"):  # the opset-1 schemas spell the default "foward"
        return [False]
    if d == "reverse":
        return [True]
    if d == "bidirectional":
        return [False, True]
    raise ValueError(f"invalid direction '{direction}'")


def _compute_dtype(dtype: np.dtype) -> np.dtype:
    return dtype if dtype in (np.float32, np.float64) else np.dtype(np.float32)


def _split_bias(B: np.ndarray | None, D: int, n: int, H: int, dt: np.dtype
                ) -> tuple[np.ndarray, np.ndarray]:
    """W and R biases, each ``[D, n*H]`` (zeros when B is absent)."""
    if B is None:
        z = np.zeros((D, n * H), dt)
        return z, z
    B = np.asarray(B, dt).reshape(D, 2 * n * H)
    return B[:, : n * H], B[:, n * H:]


def _wt(W: np.ndarray, dt: np.dtype) -> np.ndarray:
    """``[D, G, I]`` -> ``[I, D*G]``: the right operand of the all-steps input GEMM, a new
    array."""
    D, G, I = W.shape
    rows = np.asarray(W, dt).reshape(D * G, I)
    if rows.nbytes < _WT_BLOCKED_BYTES:
        return np.array(rows.T, order="C")  # a copy of its own (LSTM halves it in place)
    # 16 rows of W at a time: each row of W^T is written 64 bytes at a time, where numpy's
    # copy of the whole transpose writes W^T a float at a time across every cache line
    # (LSTM 2x256's [2048, 512]: 3.7 -> 1.5 ms)
    out = np.empty((I, D * G), dt)
    for j in range(0, D * G, 16):
        out[:, j:j + 16] = rows[j:j + 16].T
    return out


_WT_BLOCKED_BYTES = 1 << 21  # smaller weights transpose within the cache as fast either way


def _rt(R: np.ndarray, dt: np.dtype) -> np.ndarray:
    """``[D, G, H]`` -> ``[D, H, G]`` for the stacked per-step ``H·R^T``."""
    return np.ascontiguousarray(np.asarray(R, dt).transpose(0, 2, 1))


class _Recurrent:
    """What LSTM, GRU and RNN share: attributes, layout, the input GEMM, the step loop."""

    n_gates = 1
    default_acts: list[str] = []
    weight_inputs: tuple[int, ...] = (1, 2, 3)  # inputs that _prepare() reads

    def _setup(self, ctx: KernelContext, activation_alpha, activation_beta, activations, clip,
               direction, hidden_size, layout) -> None:
        self.reverse = _directions(direction)
        self.D = len(self.reverse)
        self.acts = _activations(activations, self.default_acts, activation_alpha,
                                 activation_beta, self.D)
        self.clip = None if clip is None else float(clip)
        self.hidden_size = hidden_size
        self.layout = int(layout)
        self.want_y = ctx.output_used(0) or ctx.num_outputs == 0
        self.threads = threads_for(ctx)
        static = ctx.constants_of(self.weight_inputs)
        self.prepared = None
        if static is not None and static[0] is not None:
            dt = _compute_dtype(np.asarray(static[0]).dtype)
            self.prepared = _with_packed_input(self._prepare(dt, *static))
        # the prepared weights replace the constants: the session drops its own (plan.py);
        # X shares their element type, so no run asks for another preparation
        self.prepacked_inputs = () if self.prepared is None else \
            tuple(i for i in self.weight_inputs if ctx.has_input(i))

    def _prepare(self, dt: np.dtype, *weights: Any) -> dict[str, Any]:
        raise NotImplementedError

    def _weights(self, dt: np.dtype, *weights: Any) -> dict[str, Any]:
        p = self.prepared
        if p is None or p["dtype"] != dt:
            if weights[0] is None:  # released: only the prepared dtype can run
                raise TypeError(f"X's element type (computed as {dt}) differs from the "
                                f"weights' ({p['dtype']})")
            p = self._prepare(dt, *weights)
        return p

    def _check(self, W: np.ndarray, R: np.ndarray) -> int:
        D, G = self.D, self.n_gates
        H = R.shape[-1]
        if self.hidden_size is not None and H != self.hidden_size:
            raise ValueError(f"R has hidden size {H}, attribute hidden_size is {self.hidden_size}")
        if W.ndim != 3 or W.shape[:2] != (D, G * H):
            raise ValueError(f"W must have shape [{D}, {G * H}, input_size], got {list(W.shape)}")
        if R.shape != (D, G * H, H):
            raise ValueError(f"R must have shape [{D}, {G * H}, {H}], got {list(R.shape)}")
        return H

    def _states_in(self, state: np.ndarray | None, B: int, H: int, dt: np.dtype) -> np.ndarray:
        if state is None:
            return np.zeros((self.D, B, H), dt)
        s = np.asarray(state, dt)
        if self.layout:
            s = s.transpose(1, 0, 2)
        if s.shape != (self.D, B, H):
            raise ValueError(f"initial state has shape {list(state.shape)}, "
                             f"expected {[self.D, B, H] if not self.layout else [B, self.D, H]}")
        return s

    def _run(self, X: np.ndarray, w: dict[str, Any], sequence_lens: Any,
             states: list[np.ndarray], cell: Callable[..., list[np.ndarray]],
             recurrences: list | None = None) -> tuple[np.ndarray | None, list[np.ndarray]]:
        """Project the inputs, run ``cell(x_step, *states, out=None)`` over time (``out``, when
        given, is where the first new state may be written: Y's step), un-reverse outputs.
        ``recurrences`` (compiled, one per direction) replace the step loop on full-length
        sequences.

        Returns Y as ``[T, D, B, H]`` (None when unused) and the final states ``[D, B, H]``.
        """
        D = self.D
        Xt = X.transpose(1, 0, 2) if self.layout else X  # [T, B, I]
        T, B, I = Xt.shape
        G = w["bias"].shape[0] // D
        H = states[0].shape[-1]
        lens = None
        if sequence_lens is not None:
            lens = np.asarray(sequence_lens).astype(np.int64).reshape(-1)
            if lens.shape[0] != B or (lens < 0).any() or (lens > T).any():
                raise ValueError(f"invalid sequence_lens {lens.tolist()} for sequence length {T} "
                                 f"and batch size {B}")
            if (lens == T).all():
                lens = None
        steps = T if lens is None else int(lens.max(initial=0))

        # All steps' input projections (plus biases) as one GEMM: [T, B, D, G].
        xw = _input_product(w, Xt[:steps].reshape(steps * B, I), self.threads)
        xw = xw.reshape(steps, B, D, G)
        # Time index read at each step by a reversed direction, per batch row.
        rev_index = None
        if lens is not None and any(self.reverse):
            s = np.arange(steps)[:, None]
            rev_index = np.where(s < lens, lens - 1 - s, s)  # an involution on [0, steps)
        if D == 1 and not self.reverse[0]:
            xs = xw.transpose(0, 2, 1, 3)  # [T, 1, B, G], a view
        else:
            xs = np.empty((steps, D, B, G), xw.dtype)
            for d, rev in enumerate(self.reverse):
                if not rev:
                    xs[:, d] = xw[:, :, d]
                elif rev_index is None:
                    xs[:, d] = xw[::-1, :, d]
                else:
                    xs[:, d] = xw[rev_index, np.arange(B), d]
        del xw

        ys = np.zeros((T, D, B, H), states[0].dtype) if self.want_y else None
        min_len = steps if lens is None else int(lens.min())
        if recurrences is not None and lens is None:
            whole = ys if ys is not None else np.empty((T, D, B, H), states[0].dtype)
            states = self._run_compiled(recurrences, xs, states, whole)
            steps = 0  # the loop below has nothing left to do

        for s in range(steps):
            if s < min_len:  # the cell may write its output straight into Y
                dst = None if ys is None else ys[s]
                new = cell(xs[s], *states, out=dst)
                if dst is not None and new[0] is not dst:
                    dst[...] = new[0]
            else:  # some rows have finished: they keep their state, emit zeros
                new = cell(xs[s], *states)
                active = (s < lens)[:, None]
                new = [np.where(active, n, o) for n, o in zip(new, states, strict=True)]
                if ys is not None:
                    np.copyto(ys[s], new[0], where=active)
            states = new
        if ys is not None:  # the last output state may be a view of Y, reordered below
            states = [states[0].copy(), *states[1:]]
        if lens is not None and (lens == 0).any():
            states = [np.where((lens == 0)[:, None], 0, st).astype(st.dtype) for st in states]

        if ys is not None:
            for d, rev in enumerate(self.reverse):
                if not rev:
                    continue
                if rev_index is None:
                    ys[:, d] = ys[::-1, d].copy()
                else:
                    ys[:steps, d] = ys[rev_index, d, np.arange(B)]
        return ys, states

    def _run_compiled(self, recurrences: list, xs: np.ndarray, states: list[np.ndarray],
                      ys: np.ndarray) -> list[np.ndarray]:
        """Each direction's whole recurrence in one compiled call (``xs`` [T, D, B, G], ``ys``
        [T, D, B, H] in processing order); the directions on ``threads`` threads at once (the
        calls release the GIL). Returns the final states."""
        h = np.array(states[0], order="C")  # written in place: [D, B, H]
        c = np.array(states[1], order="C") if len(states) > 1 else None  # a GRU has none

        from ..compiled.lstm import run_directions  # loaded: the recurrences come from it

        run_directions(recurrences, [(xs[:, d], h[d], None if c is None else c[d], ys[:, d])
                                     for d in range(len(recurrences))], self.threads)
        return [h] if c is None else [h, c]

    def _outputs(self, dtype: np.dtype, ys: np.ndarray | None, states: list[np.ndarray]
                 ) -> tuple[np.ndarray | None, ...]:
        if ys is not None and self.layout:
            ys = np.ascontiguousarray(ys.transpose(2, 0, 1, 3))  # [B, T, D, H]
        if self.layout:
            states = [np.ascontiguousarray(st.transpose(1, 0, 2)) for st in states]
        out = [ys, *states]
        return tuple(None if a is None else a.astype(dtype, copy=False) for a in out)


# -- LSTM ---------------------------------------------------------------------------------------


@op("LSTM", 1, 7, 14, 22)
class LSTM(_Recurrent):
    n_gates = 4
    default_acts = ["Sigmoid", "Tanh", "Tanh"]
    weight_inputs = (1, 2, 3, 7)

    def __init__(self, ctx: KernelContext, *, activation_alpha=None, activation_beta=None,
                 activations=None, clip=None, direction="forward", hidden_size=None,
                 input_forget=0, layout=0, output_sequence=0) -> None:
        self.input_forget = bool(input_forget)
        self._setup(ctx, activation_alpha, activation_beta, activations, clip, direction,
                    hidden_size, layout)
        # the prepared float32 weights when every float32 X of up to COMPILED_MAX_ROWS rows
        # goes straight to _compiled_forward (forward, one direction, no peepholes): the
        # checks that do not depend on the inputs, made once
        p = self.prepared
        self.streaming = p if p is not None and p["dtype"] == np.float32 and p["fast"] and \
            p["recurrences"] is not None and self.D == 1 and not self.reverse[0] and \
            not self.layout else None

    def _prepare(self, dt, W, R, B, P) -> dict[str, Any]:
        H = self._check(W, R)
        D = self.D
        wb, rb = _split_bias(B, D, 4, H, dt)
        peep = None
        if P is not None:
            P = np.asarray(P, dt).reshape(D, 3, 1, H)
            peep = (P[:, 0], P[:, 1], P[:, 2])  # i, o, f: each [D, 1, H]
        WT, bias = _wt(W, dt), (wb + rb).reshape(-1)
        # The usual cell (sigmoid, tanh, tanh; no peepholes) takes one tanh over all four
        # gates: sigmoid(x) = (1 + tanh(x / 2)) / 2, the halving folded into the weights of i, o, f.
        usual = ["sigmoid", "tanh", "tanh"]
        fast = (peep is None and not self.input_forget
                and all([a.name for a in acts] == usual for acts in self.acts))
        recurrences = None
        if fast:
            half = sigmoid_halves(H, 4, dt)
            WT *= np.tile(half, D)  # _wt's own copy: no second one
            bias = bias * np.tile(half, D)
            # R's rows halved, R^T a view of them: the recurrences' panels are cut from the
            # rows (the same products as halving a transposed copy, two copies fewer)
            RT = (np.asarray(R, dt) * half[:, None]).transpose(0, 2, 1)
            recurrences = _compiled_recurrences(RT, half, self.clip, biased=B is not None)
            # None: the recurrences' panels hold R; _recurrent_weights rebuilds it
            RT = None if recurrences is not None else np.ascontiguousarray(RT)
        else:
            RT = _rt(R, dt)
        return {"dtype": dt, "WT": WT, "I": WT.shape[0], "bias": bias, "RT": RT, "P": peep,
                "H": H, "fast": fast, "half": half if fast else None, "recurrences": recurrences,
                "biased": B is not None}

    def __call__(self, X, W, R, B=None, sequence_lens=None, initial_h=None, initial_c=None,
                 P=None):
        w = self.streaming
        if w is not None and sequence_lens is None and X.__class__ is np.ndarray and \
                X.dtype == np.float32 and X.ndim == 3 and 0 < X.shape[1] <= COMPILED_MAX_ROWS \
                and X.shape[0] > 0:  # empty sequences / batches: the general path's shapes
            return self._compiled_forward(X, w, initial_h, initial_c)
        dt = _compute_dtype(X.dtype)
        w = self._weights(dt, W, R, B, P)
        H, peep, clip, biased = w["H"], w["P"], self.clip, w["biased"]
        f_act, g_act, h_act = ([a[k] for a in self.acts] for k in range(3))
        input_forget = self.input_forget
        Xc = np.asarray(X, dt)
        batch = Xc.shape[0 if self.layout else 1]
        h0 = self._states_in(initial_h, batch, H, dt)
        c0 = self._states_in(initial_c, batch, H, dt)

        if w["fast"] and w["recurrences"] is not None and sequence_lens is None and \
                self.D == 1 and not self.reverse[0] and not self.layout and \
                X.dtype == np.float32 and X.ndim == 3 and 0 < X.shape[1] <= COMPILED_MAX_ROWS and \
                X.shape[0] > 0:  # weights fed at run time
            return self._compiled_forward(X, w, initial_h, initial_c)
        if w["fast"]:
            cell = fast_lstm_cell(H, lambda h, out: np.matmul(h, _recurrent_weights(w), out=out),
                                  w["half"], clip, biased)
            # the compiled recurrence streams R once per step and group of 4 rows: while that
            # beats one GEMM of all rows per step
            whole = w["recurrences"] if batch <= COMPILED_MAX_ROWS else None
            ys, (hT, cT) = self._run(Xc, w, sequence_lens, [h0, c0], cell,
                                     whole)
            return self._outputs(X.dtype, ys, [hT, cT])

        RT = w["RT"]

        def cell(x, h, c, out=None):
            g = np.matmul(h, RT)  # [D, B, 4H]; gate order i, o, f, c
            g += x
            if peep is None:
                clip_gates(g, clip, biased)
                iof = _apply(f_act, g[..., :3 * H])  # i, o, f in one pass
                i, o, f = iof[..., :H], iof[..., H:2 * H], iof[..., 2 * H:]
            else:
                i, f = g[..., :H], g[..., 2 * H:3 * H]
                i += peep[0] * c
                f += peep[2] * c
                clip_gates(i, clip, biased)
                clip_gates(g[..., 2 * H:], clip, biased)  # f, c; o waits for its peephole
                i, f = _apply(f_act, i), _apply(f_act, f)
            if input_forget:
                f = 1 - i
            c_new = _apply(g_act, g[..., 3 * H:])
            c_new *= i
            c_new += f * c
            if peep is not None:
                o = g[..., H:2 * H]
                o += peep[1] * c_new
                clip_gates(o, clip, biased)
                o = _apply(f_act, o)
            h_new = _apply(h_act, c_new.copy())
            h_new *= o
            return [h_new, c_new]

        ys, (hT, cT) = self._run(Xc, w, sequence_lens, [h0, c0], cell)
        return self._outputs(X.dtype, ys, [hT, cT])


    def _compiled_forward(self, X: np.ndarray, w: dict[str, Any], initial_h, initial_c
                          ) -> tuple[np.ndarray | None, np.ndarray, np.ndarray]:
        """The usual forward float32 LSTM on whole sequences (a streaming model's one step a
        call): what _run does for it (the input GEMM, the compiled recurrence on copies of the
        states, in place), the same operations, without the generality's Python."""
        T, B, I = X.shape
        H = w["H"]
        if T == B == 1 and w is self.prepared and I == w["I"]:  # one step of one row:
            # the input product inside the recurrence (weights prepared once, not per call)
            stacked = w.get("stacked") or _stacked_recurrence(self, w, I)
            xh = np.empty(I + H, np.float32)  # x, then h (updated in place)
            xh[:I] = X.reshape(I)
            xh[I:] = 0 if initial_h is None else _state_copy(self, initial_h, 1, H).reshape(H)
            c = _state_copy(self, initial_c, 1, H)
            ys = np.zeros((1, 1, 1, H), np.float32) if self.want_y else None
            stacked.run_stacked(w["bias"], xh, c, ys)
            return ys, xh[I:].reshape(1, 1, H), c
        h = _state_copy(self, initial_h, B, H)  # [1, B, H], updated in place
        c = _state_copy(self, initial_c, B, H)
        xw = _input_product(w, X.reshape(T * B, I), self.threads)
        ys = np.zeros((T, 1, B, H), np.float32) if self.want_y else None
        # the arrays are made here with the layout the recurrence reads: no checks
        w["recurrences"][0].run_fresh(xw, h, c, ys, T, B)
        return ys, h, c


def _stacked_recurrence(rnn: _Recurrent, w: dict[str, Any], I: int):
    """The recurrence on [W^T; R^T] (made on the first one-step, one-row call: a streaming
    model's; 4H (I + H) floats more, which other models never make)."""
    from ..compiled import lstm

    rec = w["recurrences"][0]
    WT = w["WT"] if w["WT"] is not None else w["packed"].matrix()
    stacked = lstm.Float32Recurrence(np.vstack([WT, rec.dense()]), rec.half, rnn.clip,
                                     biased=w["biased"], inputs=I)
    w["stacked"] = stacked  # two threads making it at once make equal ones
    return stacked


def _state_copy(rnn: _Recurrent, state: np.ndarray | None, B: int, H: int) -> np.ndarray:
    """A C-contiguous float32 copy of an initial state [1, B, H] (zeros without one)."""
    if state is None:
        return np.zeros((1, B, H), np.float32)
    if state.__class__ is np.ndarray and state.dtype == np.float32 and \
            state.shape == (1, B, H):
        return state.copy()  # C order
    return np.array(rnn._states_in(state, B, H, np.float32), order="C")


def _with_packed_input(w: dict[str, Any]) -> dict[str, Any]:
    """Constant float32 weights: W^T packed once into the compiled GEMM's panels, which then
    hold the only copy (W^T is rebuilt from them where a one-row stacked recurrence needs it)."""
    if w["dtype"] == np.float32:
        from .linalg import packed_weights

        packed = packed_weights(w["WT"])
        if packed is not None:
            w["packed"], w["WT"] = packed, None
    return w


def _input_product(w: dict[str, Any], rows: np.ndarray, threads: int) -> np.ndarray:
    """``rows`` [n, I] @ W^T + biases: the compiled GEMM on the prepared panels (split over the
    session's threads; OpenBLAS, which the session holds to one thread, took 3.1 ms of an LSTM
    layer's 128 x 512 x 2048 product at 1 thread, the panels 2.5 at 1 and 1.3 at 2), else
    numpy's GEMM."""
    packed = w.get("packed")
    if packed is not None and rows.dtype == np.float32:
        from .linalg import run_packed

        return run_packed(packed, rows, threads, bias=w["bias"], released=True)
    xw = np.matmul(rows, w["WT"])
    xw += w["bias"]
    return xw


# Rows up to which the compiled recurrence was measured to beat the numpy loop (one GEMM per
# step for all rows; H=256, 1 thread: 1.7x at 1 row, 1.7x at 16, 1.2x at 64)
COMPILED_MAX_ROWS = 64


def _compiled_recurrences(RT: np.ndarray, half: np.ndarray, clip: float | None,
                          kind: str = "lstm", rbh: np.ndarray | None = None,
                          biased: bool = False) -> list | None:
    """One compiled float32 recurrence per direction of ``RT`` [D, H, gates*H] (an LSTM's
    halved; a GRU's as it is, with ``rbh`` [D, H]), or None where they cannot run here (not
    float32, no llvmlite, a CPU below AVX2+FMA)."""
    if RT.dtype != np.float32:
        return None
    from ..compiled import lstm
    from ..compiled.jit import Unavailable

    try:
        return [lstm.Float32Recurrence(R, half, clip, kind, None if rbh is None else rbh[d],
                                       biased=biased)
                for d, R in enumerate(RT)]
    except (Unavailable, ValueError):
        return None


def _dense_weights(w: dict[str, Any]) -> np.ndarray:
    """R^T [D, H, gates*H] back from the compiled recurrences' panels, where those hold the
    only copy: for the numpy cell, on the first run that needs it (sequence_lens, many rows)."""
    return np.stack([r.dense() for r in w["recurrences"]])


def _recurrent_weights(w: dict[str, Any]) -> np.ndarray:
    """The halved R^T [D, H, 4H] for the numpy cell; where compiled recurrences hold the only
    copy (in their panels), rebuilt once, on the first run that needs it (sequence_lens, many
    rows)."""
    RT = w["RT"]
    if RT is None:
        RT = w["RT"] = _dense_weights(w)
    return RT


def sigmoid_halves(H: int, gates: int, dt=np.float32) -> np.ndarray:
    """Per gate column: 1/2 for the sigmoid gates (all but the last: an LSTM's i, o, f, a
    GRU's z, r), whose sigmoid is computed as tanh(x / 2) / 2 + 1/2; 1 for the last (tanh)."""
    return np.concatenate((np.full((gates - 1) * H, 0.5, dt), np.ones(H, dt)))


def fast_lstm_cell(H: int, recurrent, half: np.ndarray, clip: float | None,
                   biased: bool = False):
    """The usual LSTM cell (sigmoid, tanh, tanh; no peepholes) in ten numpy calls a step, on
    gates whose i, o, f parts come halved (input part and ``recurrent(h, out)``, which writes
    h's product into ``out``): those gates' tanh, times 1/2 plus 1/2, is their sigmoid.
    ``biased``: the LSTM has a B, and its gates are clipped as onnxruntime's are (clip_gates)."""
    shift = 1 - half  # 1/2 for i, o, f; 0 for c
    if biased:
        bound = half * np.float32(F32_MAX if clip is None else clip)
    else:
        bound = None if clip is None else half * clip
    buffers: list[np.ndarray] = []  # gates [..., B, 4H] and its i, o, f, c views; scratch

    def cell(x, h, c, out=None):
        if not buffers:
            g = np.empty(x.shape, x.dtype)
            buffers.extend((g, g[..., :H], g[..., H:2 * H], g[..., 2 * H:3 * H],
                            g[..., 3 * H:], np.empty(c.shape, c.dtype)))
        g, i, o, f, cc, t = buffers
        recurrent(h, g)  # gate order i, o, f, c
        g += x
        if biased:  # clip_gates' NaN -> +bound, halved where the gates are
            np.fmin(g, bound, out=g)
            if clip is not None:  # (without a clip, -inf and -FLT_MAX have the same tanh)
                np.fmax(g, -bound, out=g)
        elif bound is not None:
            np.clip(g, -bound, bound, out=g)
        np.tanh(g, out=g)
        g *= half
        g += shift
        c_new = np.multiply(f, c)
        np.multiply(i, cc, out=t)
        c_new += t
        np.tanh(c_new, out=t)
        return [np.multiply(o, t, out=out), c_new]

    return cell


# -- GRU ----------------------------------------------------------------------------------------


@op("GRU", 1, 3, 7, 14, 22)
class GRU(_Recurrent):
    n_gates = 3
    default_acts = ["Sigmoid", "Tanh"]

    def __init__(self, ctx: KernelContext, *, activation_alpha=None, activation_beta=None,
                 activations=None, clip=None, direction="forward", hidden_size=None, layout=0,
                 linear_before_reset=0, output_sequence=0) -> None:
        self.linear_before_reset = bool(linear_before_reset)
        self._setup(ctx, activation_alpha, activation_beta, activations, clip, direction,
                    hidden_size, layout)

    def _prepare(self, dt, W, R, B) -> dict[str, Any]:
        H = self._check(W, R)
        D = self.D
        wb, rb = _split_bias(B, D, 3, H, dt)
        bias = wb.copy()
        if self.linear_before_reset:
            bias[:, :2 * H] += rb[:, :2 * H]  # Rbh stays inside r·(H·Rh^T + Rbh)
        else:
            bias += rb
        RT = _rt(R, dt)  # [D, H, 3H]; gate order z, r, h
        recurrences = None
        usual = all([a.name for a in acts] == ["sigmoid", "tanh"] for acts in self.acts)
        if self.linear_before_reset and usual:
            half = sigmoid_halves(H, 3, dt)
            recurrences = _compiled_recurrences(RT, half, self.clip, "gru", rb[:, 2 * H:],
                                                biased=B is not None)
        return {"dtype": dt, "WT": _wt(W, dt), "bias": bias.reshape(-1), "H": H,
                # the compiled recurrences' panels hold R; _gru_weights rebuilds it if needed
                "RT_zr": None if recurrences else np.ascontiguousarray(RT[..., :2 * H]),
                "RT_h": None if recurrences else np.ascontiguousarray(RT[..., 2 * H:]),
                "Rbh": np.ascontiguousarray(rb[:, 2 * H:]).reshape(D, 1, H),
                "recurrences": recurrences, "biased": B is not None}

    def __call__(self, X, W, R, B=None, sequence_lens=None, initial_h=None):
        dt = _compute_dtype(X.dtype)
        w = self._weights(dt, W, R, B)
        H, clip, biased = w["H"], self.clip, w["biased"]
        f_act, g_act = ([a[k] for a in self.acts] for k in range(2))
        Xc = np.asarray(X, dt)
        h0 = self._states_in(initial_h, Xc.shape[0 if self.layout else 1], H, dt)

        Rbh = w["Rbh"]
        lbr = self.linear_before_reset

        # Two matmuls (z|r, then h) keep every temporary contiguous.
        def cell(x, h, out=None):
            RT_zr, RT_h = _gru_weights(w)
            zr = np.matmul(h, RT_zr)  # [D, B, 2H]; gate order z, r
            zr += x[..., :2 * H]
            clip_gates(zr, clip, biased)
            zr = _apply(f_act, zr)
            if lbr:
                hh = np.matmul(h, RT_h)
                hh += Rbh
                hh *= zr[..., H:]
            else:
                hh = np.matmul(zr[..., H:] * h, RT_h)
            hh += x[..., 2 * H:]
            clip_gates(hh, clip, biased)
            hh = _apply(g_act, hh)
            return [_blend(zr[..., :H], hh, h)]

        whole = w["recurrences"] if h0.shape[1] <= COMPILED_MAX_ROWS else None
        ys, (hT,) = self._run(Xc, w, sequence_lens, [h0], cell, whole)
        return self._outputs(X.dtype, ys, [hT])


def _gru_weights(w: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """(R^T of z|r, R^T of h) for the numpy cell; rebuilt once from the compiled recurrences'
    panels where those hold the only copy."""
    if w["RT_zr"] is None:
        RT = _dense_weights(w)
        H = RT.shape[1]
        w["RT_h"] = np.ascontiguousarray(RT[..., 2 * H:])
        w["RT_zr"] = np.ascontiguousarray(RT[..., :2 * H])
    return w["RT_zr"], w["RT_h"]


def _blend(z: np.ndarray, hh: np.ndarray, h: np.ndarray) -> np.ndarray:
    """(1 - z)·hh + z·h, computed as hh + z·(h - hh)."""
    out = np.subtract(h, hh)
    out *= z
    out += hh
    return out


# -- RNN ----------------------------------------------------------------------------------------


@op("RNN", 1, 7, 14, 22)
class RNN(_Recurrent):
    n_gates = 1
    default_acts = ["Tanh"]

    def __init__(self, ctx: KernelContext, *, activation_alpha=None, activation_beta=None,
                 activations=None, clip=None, direction="forward", hidden_size=None, layout=0,
                 output_sequence=0) -> None:
        self._setup(ctx, activation_alpha, activation_beta, activations, clip, direction,
                    hidden_size, layout)

    def _prepare(self, dt, W, R, B) -> dict[str, Any]:
        H = self._check(W, R)
        wb, rb = _split_bias(B, self.D, 1, H, dt)
        return {"dtype": dt, "WT": _wt(W, dt), "bias": (wb + rb).reshape(-1), "RT": _rt(R, dt),
                "H": H}

    def __call__(self, X, W, R, B=None, sequence_lens=None, initial_h=None):
        dt = _compute_dtype(X.dtype)
        w = self._weights(dt, W, R, B)
        RT, clip, f_act = w["RT"], self.clip, [a[0] for a in self.acts]
        Xc = np.asarray(X, dt)
        h0 = self._states_in(initial_h, Xc.shape[0 if self.layout else 1], w["H"], dt)

        def cell(x, h, out=None):
            a = np.matmul(h, RT)
            a += x
            clip_gates(a, clip)
            return [_apply(f_act, a)]

        ys, (hT,) = self._run(Xc, w, sequence_lens, [h0], cell)
        return self._outputs(X.dtype, ys, [hT])
