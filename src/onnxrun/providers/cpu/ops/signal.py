"""Signal processing: DFT, STFT, the window generators and MelWeightMatrix.

Complex tensors are real tensors whose last dimension is 1 (real) or 2 (real, imaginary); the
transforms run on numpy's pocketfft and are converted back to that layout.
"""

from __future__ import annotations

import numpy as np

from ....dtypes import np_dtype
from ..kernels import KernelContext, op


def _scalar_int(v, name: str) -> int:
    if v is None:
        raise ValueError(f"{name} is required")
    a = np.asarray(v)
    if a.size != 1:
        raise ValueError(f"{name} must be a scalar, got shape {a.shape}")
    return int(a.reshape(()))


def _to_complex(x: np.ndarray) -> tuple[np.ndarray, bool]:
    """(signal without the last dim, whether it is real)."""
    if x.shape[-1] == 1:
        return x[..., 0], True
    if x.shape[-1] != 2:
        raise ValueError(f"last dimension must be 1 (real) or 2 (complex), got {x.shape[-1]}")
    return x[..., 0] + 1j * x[..., 1], False


def _from_complex(c: np.ndarray, dtype: np.dtype) -> np.ndarray:
    out = np.empty(c.shape + (2,), dtype=dtype)
    out[..., 0] = c.real
    out[..., 1] = c.imag
    return out


def _work_dtype(dtype: np.dtype) -> np.dtype:
    # pocketfft computes in float32 or float64; half precision goes through float32
    return np.dtype(np.float64) if dtype == np.float64 else np.dtype(np.float32)


def _dft(x, length, axis, inverse, onesided):
    dtype = x.dtype
    if axis < 0:
        axis += x.ndim
    if not 0 <= axis < x.ndim - 1:
        raise ValueError(f"DFT axis {axis} out of range for input of rank {x.ndim}")
    sig, real = _to_complex(x.astype(_work_dtype(dtype), copy=False))
    n_axis = x.shape[axis]
    if inverse and onesided:
        n = 2 * (n_axis - 1) if length is None else length
        return np.fft.irfft(sig, n=n, axis=axis)[..., None].astype(dtype, copy=False)
    n = n_axis if length is None else length
    if inverse:
        res = np.fft.ifft(sig, n=n, axis=axis)
    elif onesided and real:
        res = np.fft.rfft(sig, n=n, axis=axis)
    else:
        res = np.fft.fft(sig, n=n, axis=axis)
        if onesided:
            res = np.take(res, np.arange(n // 2 + 1), axis=axis)
    return _from_complex(res, dtype)


@op("DFT", 17)
def DFT_17(input, dft_length=None, *, axis=1, inverse=0, onesided=0):
    length = None if dft_length is None else _scalar_int(dft_length, "dft_length")
    return _dft(input, length, axis, inverse, onesided)


@op("DFT", 20)
def DFT(input, dft_length=None, axis=None, *, inverse=0, onesided=0):
    length = None if dft_length is None else _scalar_int(dft_length, "dft_length")
    ax = -2 if axis is None else _scalar_int(axis, "axis")
    return _dft(input, length, ax, inverse, onesided)


@op("STFT", 17)
def STFT(signal, frame_step, window=None, frame_length=None, *, onesided=1):
    dtype = signal.dtype
    step = _scalar_int(frame_step, "frame_step")
    if frame_length is not None:
        length = _scalar_int(frame_length, "frame_length")
        if window is not None and window.shape[0] != length:
            raise ValueError("STFT: window length must equal frame_length")
    elif window is not None:
        length = window.shape[0]
    else:
        length = signal.shape[1]
    if signal.ndim != 3:
        raise ValueError("STFT: signal must be [batch, signal_length, 1 or 2]")
    if step <= 0 or length <= 0 or length > signal.shape[1]:
        raise ValueError("STFT: invalid frame_step/frame_length for the signal length")
    n_frames = 1 + (signal.shape[1] - length) // step
    sig, real = _to_complex(signal.astype(_work_dtype(dtype), copy=False))
    # [batch, n_frames, length] strided view of the frames (no copy until the window product)
    frames = np.lib.stride_tricks.sliding_window_view(sig, length, axis=1)[:, ::step][:, :n_frames]
    if window is not None:
        frames = frames * window.astype(frames.real.dtype, copy=False)
    if onesided and real and (window is None or window.dtype.kind != "c"):
        res = np.fft.rfft(frames, n=length, axis=-1)
    else:
        res = np.fft.fft(frames, n=length, axis=-1)
    return _from_complex(res, dtype)


# -- windows ----------------------------------------------------------------------------------


def _window(size, periodic, output_datatype, coeffs):
    n = _scalar_int(size, "size")
    denom = n if periodic else n - 1
    k = np.arange(n, dtype=np.float64)
    res = np.zeros(n, dtype=np.float64)
    # sum_i a_i cos(2 pi i k / N), a_0 constant
    for i, a in enumerate(coeffs):
        res += a if i == 0 else a * np.cos(2.0 * np.pi * i * k / denom)
    return res.astype(np_dtype(output_datatype))


@op("HannWindow", 17)
def HannWindow(size, *, output_datatype=1, periodic=1):
    return _window(size, periodic, output_datatype, (0.5, -0.5))


@op("HammingWindow", 17)
def HammingWindow(size, *, output_datatype=1, periodic=1):
    alpha = 25.0 / 46.0
    return _window(size, periodic, output_datatype, (alpha, -(1.0 - alpha)))


@op("BlackmanWindow", 17)
def BlackmanWindow(size, *, output_datatype=1, periodic=1):
    return _window(size, periodic, output_datatype, (0.42, -0.5, 0.08))


@op("MelWeightMatrix", 17)
class MelWeightMatrix:
    def __init__(self, ctx: KernelContext, *, output_datatype=1):
        self.dtype = np_dtype(output_datatype)

    def __call__(self, num_mel_bins, dft_length, sample_rate, lower_edge_hertz,
                 upper_edge_hertz):
        n_mel = _scalar_int(num_mel_bins, "num_mel_bins")
        dft = _scalar_int(dft_length, "dft_length")
        rate = _scalar_int(sample_rate, "sample_rate")
        n_spec = dft // 2 + 1
        lo = np.asarray(lower_edge_hertz).reshape(())
        hi = np.asarray(upper_edge_hertz).reshape(())
        # same operation order as the reference so that the floor() below lands identically
        lo_mel = 2595 * np.log1p(lo / 700) / np.log(10)
        hi_mel = 2595 * np.log1p(hi / 700) / np.log(10)
        step = (hi_mel - lo_mel) / (n_mel + 2)
        bins = np.arange(0, n_mel + 2) * step + lo_mel
        bins = 700 * np.expm1(bins / 2595 * np.log(10))
        bins = (((dft + 1) * bins) // rate).astype(np.int64)
        lft, ctr, rgt = bins[None, :-2], bins[None, 1:-1], bins[None, 2:]
        j = np.arange(n_spec)[:, None]
        out = np.zeros((n_spec, n_mel), dtype=np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            rise = (j - lft) / (ctr - lft)
            fall = (rgt - j) / (rgt - ctr)
        up = (j >= lft) & (j <= ctr) & (ctr > lft)
        out = np.where(up, rise, out)
        out = np.where((j == ctr) & (ctr == lft), 1.0, out)
        down = (j >= ctr) & (j < rgt)
        out = np.where(down, fall, out)
        return out.astype(self.dtype)
