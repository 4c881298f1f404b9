"""Constant sharing: initializers of one graph holding the same dtype, shape and bytes become
one. Exporters repeat scalar constants (0, 1, 0.5, eps...) once per use, and folded weights are
often identical; one copy saves memory and lets common-subexpression elimination see that two
nodes read the same value. Overridable initializers (also graph inputs) and graph outputs keep
their own identity."""

from __future__ import annotations

from collections import Counter, defaultdict

import numpy as np

from ...ir import Model, Value
from ..base import BASIC, GraphPass, PassResult, register_pass
from ..graph_utils import all_graphs, is_graph_input, is_graph_output

_PIECE = 64 << 10  # bytes compared at a time
_SAMPLE = 16  # elements compared before whole buffers: most candidates differ early


def _fingerprint(arr: np.ndarray) -> tuple:
    flat = arr.reshape(-1)
    step = max(1, flat.size // _SAMPLE)
    return (arr.dtype.str, arr.shape, flat[::step][:_SAMPLE].tobytes())


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    """Bitwise equal (so NaN payloads and -0.0 are told apart): the values are exchangeable."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    x = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
    y = np.ascontiguousarray(b).reshape(-1).view(np.uint8)
    # Piece by piece as bytes objects (one memcmp each; copies small enough to stay in cache
    # and off fresh pages, where array_equal's boolean temporaries of 1 MiB faulted in pages
    # for every compare: ShuffleNet's zoo file shares 334 constants), stopping at the first
    # difference.
    return all(x[i:i + _PIECE].tobytes() == y[i:i + _PIECE].tobytes()
               for i in range(0, x.size, _PIECE))


@register_pass
class ConstantSharing(GraphPass):
    name = "ConstantSharing"
    level = BASIC
    order = 12

    def run(self, model: Model) -> PassResult:
        changes: Counter = Counter()
        for graph in list(all_graphs(model.graph)):
            groups: dict[tuple, list[Value]] = defaultdict(list)
            for v in graph.initializers.values():
                arr = v.const_value
                if (arr is None or arr.dtype == object or not v.uses or is_graph_input(v)
                        or is_graph_output(v)):
                    continue
                groups[_fingerprint(arr)].append(v)
            for members in groups.values():
                kept: list[Value] = []
                for v in members:
                    same = next((k for k in kept if _same(k.const_value, v.const_value)), None)
                    if same is None:
                        kept.append(v)
                        continue
                    v.replace_all_uses_with(same)
                    del graph.initializers[v.name]
                    changes["initializers"] += 1
        return PassResult(bool(changes), changes)
