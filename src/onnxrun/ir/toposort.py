"""The one topological sort every stage uses (validation, planning, serialization)."""

from __future__ import annotations

import heapq
from collections.abc import Sequence


def stable_topological_order(deps: Sequence[set[int]]) -> tuple[list[int], list[int]]:
    """Kahn's algorithm over node indices; ``deps[i]`` holds the indices node ``i`` reads from.

    Among ready nodes the lowest index goes first, so a list that is already sorted comes back
    unchanged. Returns ``(order, stuck)``: ``stuck`` lists the nodes that are on, or wait on, a
    cycle (empty for a DAG). Self-edges are ignored.
    """
    users: list[list[int]] = [[] for _ in deps]
    pending = [0] * len(deps)
    for i, ds in enumerate(deps):
        ds = ds - {i}
        pending[i] = len(ds)
        for d in ds:
            users[d].append(i)
    ready = [i for i, count in enumerate(pending) if count == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for u in users[i]:
            pending[u] -= 1
            if pending[u] == 0:
                heapq.heappush(ready, u)
    return order, [i for i, count in enumerate(pending) if count > 0]
