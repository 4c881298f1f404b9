"""Index arrays as numpy's index type, on 32-bit platforms too.

numpy's index type (``np.intp``) is int32 on 32-bit platforms (Pyodide's wasm32): ``np.take``,
``take_along_axis``, ``repeat``, ``bincount`` and friends refuse int64 indices there (a 'safe'
cast to intp fails), and a plain cast would wrap large values around into wrong, in-range
ones. Every indexing kernel passes its indices through ``as_intp``: a no-op where intp is int64,
elsewhere a checked cast, so an index too large for the platform is an IndexError, as an index
out of the data's range is.
"""

from __future__ import annotations

import numpy as np

INTP = np.dtype(np.intp)
_LIMITS = np.iinfo(INTP)


def as_intp(indices: np.ndarray | int, what: str = "index") -> np.ndarray:
    """``indices`` (integers) as an intp array; values outside intp's range raise IndexError."""
    a = np.asarray(indices)
    if a.dtype == INTP:
        return a
    if a.dtype.kind not in "iu":
        return a  # booleans, floats: numpy's own error (or meaning) applies
    if np.iinfo(a.dtype).max > _LIMITS.max or np.iinfo(a.dtype).min < _LIMITS.min:
        if a.size:
            lo, hi = int(a.min()), int(a.max())
            if lo < _LIMITS.min or hi > _LIMITS.max:
                bad = lo if lo < _LIMITS.min else hi
                raise IndexError(
                    f"{what} {bad} is out of range: this platform indexes with "
                    f"{INTP.itemsize * 8}-bit integers"
                )
    return a.astype(INTP)
