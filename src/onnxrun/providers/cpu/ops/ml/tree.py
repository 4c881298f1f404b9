"""Tree ensembles: TreeEnsembleClassifier / TreeEnsembleRegressor (ai.onnx.ml 1 and 3) and
TreeEnsemble (ai.onnx.ml 5).

Every tree of the ensemble is flattened into one set of node arrays (feature, threshold, mode,
true child, false child; leaves point to themselves). Evaluation advances all (row, tree) pairs
one level at a time with array gathers, compacting away the pairs that reached a leaf, so a run
costs a handful of numpy calls per tree level whatever the number of rows and trees. Leaf
weights are then aggregated with one matrix product (one target per tree, gradient boosting),
dense per-node weight tables, or ``np.bincount`` over the weight lists.

Aggregation, base values, post-transforms and the binary-classifier rules follow onnxruntime's
``tree_ensemble_aggregator.h``, quirks included: scores of classes no leaf wrote are 0, a binary
classifier with weights for both classes returns the raw labels 0 / 1, and so on. Two deliberate
departures, where onnxruntime contradicts the specification: TreeEnsemble-5 reads
post_transform 1 as SOFTMAX and 2 as LOGISTIC (onnxruntime swaps them), and BRANCH_MEMBER tests
exact membership (onnxruntime's integer fast path also matches some non-integral inputs).
"""

from __future__ import annotations

import numpy as np

from ...kernels import KernelContext, op
from ._common import binary_scores, check_post_transform, probit, transform_scores

# -- node modes ---------------------------------------------------------------------------------

_MODE_NAMES = ("BRANCH_LEQ", "BRANCH_LT", "BRANCH_GTE", "BRANCH_GT", "BRANCH_EQ", "BRANCH_NEQ",
               "BRANCH_MEMBER", "LEAF")
LEQ, LT, GTE, GT, EQ, NEQ, MEMBER, LEAF = range(8)
_MODE_CODE = {name: i for i, name in enumerate(_MODE_NAMES)}

# Whether a mode goes to the true branch when x < t, x == t, x > t, x is NaN.
_TRUTH = np.array(
    [[1, 1, 0, 0], [1, 0, 0, 0], [0, 1, 1, 0], [0, 0, 1, 0], [0, 1, 0, 0], [1, 0, 1, 1],
     [0, 0, 0, 0], [0, 0, 0, 0]],
    dtype=bool,
)
_COMPARE = {LEQ: np.less_equal, LT: np.less, GTE: np.greater_equal, GT: np.greater,
            EQ: np.equal, NEQ: np.not_equal}

AGGREGATES_V5 = ("AVERAGE", "SUM", "MIN", "MAX")
TRANSFORMS_V5 = ("NONE", "SOFTMAX", "LOGISTIC", "SOFTMAX_ZERO", "PROBIT")

RAW_ONE, RAW_ZERO = -2, -1  # label indices of onnxruntime's raw binary labels 1 and 0

_CHUNK = 1 << 17  # (row, tree) pairs evaluated at once: bounds the temporary arrays
_DENSE_LIMIT = 1 << 24  # larger node x target weight tables aggregate from the weight lists


class Forest:
    """All trees' nodes in flat arrays, plus each leaf's weights (target, value) in CSR form."""

    def __init__(self, feature, threshold, mode, true_idx, false_idx, missing_true, roots,
                 leaf_targets, leaf_values, leaf_start, leaf_count, n_targets: int,
                 member_sets=None) -> None:
        mode = np.asarray(mode, dtype=np.int8)
        n = len(mode)
        self.n_nodes = n
        is_leaf = mode == LEAF
        self.is_leaf = is_leaf
        idx = np.arange(n, dtype=np.intp)
        true_idx = np.asarray(true_idx, dtype=np.intp)
        false_idx = np.asarray(false_idx, dtype=np.intp)
        inner = ~is_leaf
        for name, child in (("true", true_idx), ("false", false_idx)):
            bad = inner & ((child < 0) | (child >= n))
            if bad.any():
                raise ValueError(f"node {int(np.flatnonzero(bad)[0])}: {name} branch out of range")
        self.true_idx = np.where(is_leaf, idx, true_idx)
        self.false_idx = np.where(is_leaf, idx, false_idx)
        feature = np.asarray(feature, dtype=np.intp)
        if (feature[inner] < 0).any():
            raise ValueError("negative feature id in a tree node")
        self.feature = np.where(is_leaf, 0, feature)
        self.max_feature = int(feature[inner].max()) if inner.any() else -1
        threshold = np.asarray(threshold)
        self.thr_dtype = threshold.dtype if threshold.dtype.kind == "f" else np.dtype(np.float32)
        present = set(np.unique(mode[inner]).tolist())
        self.single_mode = present.pop() if len(present) == 1 and MEMBER not in present else None
        self.truth = _TRUTH[mode]  # [n, 4] per node
        self.missing = np.asarray(missing_true, dtype=bool) & inner
        self.has_missing = bool(self.missing.any())
        self.roots = np.asarray(roots, dtype=np.intp)
        self.n_trees = len(self.roots)
        if self.n_trees and ((self.roots < 0) | (self.roots >= n)).any():
            raise ValueError("tree root out of range")
        self.min_leaf_depth = self._check_acyclic()
        # The evaluation state of a (row, tree) pair is 2 * node: hot node attributes are stored
        # twice so the state indexes them directly, and child2[state + condition] is the next
        # state (child2 holds 2 * false child, 2 * true child).
        self.roots2 = 2 * self.roots
        self.child2 = np.empty(2 * n, dtype=np.intp)
        self.child2[0::2] = 2 * self.false_idx
        self.child2[1::2] = 2 * self.true_idx
        self.feature2 = np.repeat(self.feature, 2)
        self.leaf2 = np.repeat(is_leaf, 2)
        self.thr64_2 = np.repeat(threshold.astype(np.float64), 2)
        self.thr32_2 = np.repeat(threshold, 2) if threshold.dtype == np.float32 else None
        # leaf weights
        self.leaf_targets = np.asarray(leaf_targets, dtype=np.intp)
        self.leaf_values = np.asarray(leaf_values, dtype=np.float64)
        self.leaf_start = np.asarray(leaf_start, dtype=np.intp)
        self.leaf_count = np.asarray(leaf_count, dtype=np.intp)
        self.one_weight = bool((self.leaf_count[is_leaf] == 1).all())
        # BRANCH_MEMBER: (node, rank of value) pairs as sorted int64 keys
        self.is_member = mode == MEMBER
        self.has_members = bool(self.is_member.any())
        if self.has_members:
            sets = member_sets or {}
            values = np.unique(np.concatenate(
                [np.asarray(v, dtype=np.float64) for v in sets.values()] + [np.zeros(0)]))
            values = values[~np.isnan(values)]
            self.member_values = values
            width = len(values) + 1
            keys = [node * width + np.searchsorted(values, np.asarray(v, dtype=np.float64))
                    for node, v in sets.items() if len(v)]
            self.member_keys = np.unique(np.concatenate(keys + [np.zeros(0, np.int64)]).astype(
                np.int64))
            self.member_width = width
        self._prepare_targets(n_targets)

    def _check_acyclic(self) -> int:
        """Refuse cycles; return the depth of the shallowest leaf (levels every row descends)."""
        frontier = np.unique(self.roots)
        shallowest = None
        for depth in range(self.n_nodes + 1):
            leaf = self.is_leaf[frontier]
            if shallowest is None and leaf.any():
                shallowest = depth
            frontier = frontier[~leaf]
            if frontier.size == 0:
                return shallowest or 0
            frontier = np.unique(np.concatenate(
                (self.true_idx[frontier], self.false_idx[frontier])))
        raise ValueError("the trees contain a cycle")

    # -- evaluation ------------------------------------------------------------------------------

    def _members(self, x: np.ndarray, nodes: np.ndarray) -> np.ndarray:
        values = self.member_values
        if values.size == 0:
            return np.zeros(x.shape, dtype=bool)
        r = np.searchsorted(values, x)
        exact = values[np.minimum(r, values.size - 1)] == x
        keys = nodes.astype(np.int64) * self.member_width + r
        pos = np.minimum(np.searchsorted(self.member_keys, keys), self.member_keys.size - 1)
        return exact & (self.member_keys[pos] == keys)

    def _condition(self, x: np.ndarray, state: np.ndarray, thr2: np.ndarray) -> np.ndarray:
        """Whether each (row, tree) pair at ``state`` (2 * node) takes the true branch."""
        t = thr2[state]
        if self.single_mode is not None:
            cond = _COMPARE[self.single_mode](x, t)
            if self.has_missing:
                cond |= self.missing[state >> 1] & np.isnan(x)
            return cond
        nodes = state >> 1
        truth = self.truth[nodes]
        cond = (x < t) & truth[:, 0]
        cond |= (x == t) & truth[:, 1]
        cond |= (x > t) & truth[:, 2]
        cond |= np.isnan(x) & truth[:, 3]
        if self.has_members:
            m = self.is_member[nodes]
            if m.any():
                cond[m] = self._members(x[m], nodes[m])
        if self.has_missing:
            cond |= self.missing[nodes] & np.isnan(x)
        return cond

    def _prepare(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Input rows in the comparison type, and the thresholds in that type."""
        if X.ndim == 1:
            X = X.reshape(1, -1)
        elif X.ndim != 2:
            raise ValueError(f"TreeEnsemble only works on 1D, 2D tensors (got {X.ndim}D)")
        if self.max_feature >= X.shape[1]:
            raise ValueError(
                f"One path in the graph requests feature {self.max_feature} but input tensor has "
                f"{X.shape[1]} features."
            )
        if X.dtype == np.float32 and self.thr32_2 is not None:
            return np.ascontiguousarray(X), self.thr32_2
        if X.dtype.kind in "iub":
            # C++ compares an integer with a float threshold after converting it to that type
            X = X.astype(self.thr_dtype)
        return np.ascontiguousarray(X, dtype=np.float64), self.thr64_2

    def leaves(self, X: np.ndarray) -> np.ndarray:
        """[N, n_trees] index of the leaf each row reaches in each tree."""
        X, thr2 = self._prepare(X)
        N, F = X.shape
        T = self.n_trees
        out = np.empty((N, T), dtype=np.intp)
        if N == 0 or T == 0:
            return out
        flat = X.reshape(-1)
        feature2, child2, leaf2, cond = self.feature2, self.child2, self.leaf2, self._condition
        step = max(1, _CHUNK // T)
        for r0 in range(0, N, step):
            r1 = min(N, r0 + step)
            s = np.tile(self.roots2, r1 - r0)
            offset = np.repeat(np.arange(r0, r1, dtype=np.intp) * F, T)
            # no pair can reach a leaf before the shallowest one: no checks on these levels
            for _ in range(self.min_leaf_depth):
                s = child2[s + cond(flat[offset + feature2[s]], s, thr2)]
            # then keep a working set of pairs, compacted once a quarter of it sits on leaves
            # (a leaf is its own child, so pairs on leaves may go on being stepped harmlessly)
            act = None
            inside = ~leaf2[s]
            n_inside = np.count_nonzero(inside)
            while n_inside:
                if n_inside < 0.75 * inside.size:
                    if act is None:
                        out_s, act = s, np.flatnonzero(inside)
                    else:
                        out_s[act] = s
                        act = act[inside]
                    s, offset = s[inside], offset[inside]
                s = child2[s + cond(flat[offset + feature2[s]], s, thr2)]
                inside = ~leaf2[s]
                n_inside = np.count_nonzero(inside)
            if act is not None:
                out_s[act] = s
                s = out_s
            out[r0:r1] = (s >> 1).reshape(r1 - r0, T)
        return out

    # -- aggregation -----------------------------------------------------------------------------

    def _prepare_targets(self, n_targets: int) -> None:
        """Arrange the leaf weights for aggregating ``n_targets`` scores."""
        K = self.n_targets = n_targets
        n = self.n_nodes
        has = self.leaf_count > 0
        # onnxruntime's single-target score: a leaf's first weight
        self.first = np.zeros(n, dtype=np.float64)
        self.first[has] = self.leaf_values[self.leaf_start[has]]
        self.tree_onehot = self.dense = None
        if K == 1:
            return
        node = np.repeat(np.arange(n, dtype=np.intp), self.leaf_count)
        tree_target = self._tree_targets()
        if tree_target is not None:
            # every leaf of a tree holds one weight for the tree's own target (gradient
            # boosting): the scores are one matrix product
            self.tree_onehot = np.zeros((self.n_trees, K))
            self.tree_onehot[np.arange(self.n_trees), tree_target] = 1.0
            self.tree_has = self.tree_onehot.any(axis=0)
        elif n * K <= _DENSE_LIMIT:
            W = np.zeros((n, K))
            np.add.at(W, (node, self.leaf_targets), self.leaf_values)
            Hn = np.zeros((n, K), dtype=bool)
            Hn[node, self.leaf_targets] = True
            lo = np.full((n, K), np.inf)
            np.minimum.at(lo, (node, self.leaf_targets), self.leaf_values)
            hi = np.full((n, K), -np.inf)
            np.maximum.at(hi, (node, self.leaf_targets), self.leaf_values)
            leaves = self.is_leaf
            self.dense = {"SUM": W, "MIN": lo, "MAX": hi, "has": Hn,
                          "full": bool(Hn[leaves].all())}

    def _tree_targets(self) -> np.ndarray | None:
        """The single target of each tree when every leaf has one weight for it, else None."""
        if not self.one_weight or self.n_trees == 0:
            return None
        node, tree = self.roots, np.arange(self.n_trees)
        target = np.full(self.n_trees, -1)
        while node.size:
            leaf = self.is_leaf[node]
            t_leaf = self.leaf_targets[self.leaf_start[node[leaf]]]
            prev = target[tree[leaf]]
            if ((prev >= 0) & (prev != t_leaf)).any():
                return None
            target[tree[leaf]] = t_leaf
            if (target[tree[leaf]] != t_leaf).any():  # two leaves of a tree on one level
                return None
            node, tree = node[~leaf], tree[~leaf]
            node = np.concatenate((self.true_idx[node], self.false_idx[node]))
            tree = np.concatenate((tree, tree))
            pairs = np.unique(np.stack((node, tree)), axis=1)  # shared subtrees: visit once
            node, tree = pairs[0], pairs[1]
        return target

    def aggregate(self, L: np.ndarray, agg: str) -> tuple[np.ndarray, np.ndarray]:
        """Scores [N, K] and whether any leaf wrote each score (onnxruntime's has_score)."""
        N, T = L.shape
        K = self.n_targets
        if K == 1:
            v = self.first[L]
            if agg in ("SUM", "AVERAGE"):
                S = v.sum(axis=1)
            elif T == 0:
                S = np.zeros(N)
            else:
                S = v.min(axis=1) if agg == "MIN" else v.max(axis=1)
            return S.reshape(N, 1), np.full((N, 1), T > 0)
        kind = "SUM" if agg in ("SUM", "AVERAGE") else agg
        if self.tree_onehot is not None and kind == "SUM":
            return self.first[L] @ self.tree_onehot, np.broadcast_to(self.tree_has, (N, K))
        if self.dense is not None:
            W, Hn = self.dense[kind], self.dense["has"]
            S = np.empty((N, K))
            H = np.empty((N, K), dtype=bool)
            reduce = {"SUM": np.sum, "MIN": np.min, "MAX": np.max}[kind]
            step = max(1, _CHUNK // max(T * K, 1))
            for r0 in range(0, N, step):
                part = L[r0:r0 + step]
                S[r0:r0 + step] = reduce(W[part], axis=1) if T else 0.0
                if self.dense["full"]:
                    H[r0:r0 + step] = T > 0
                else:
                    H[r0:r0 + step] = Hn[part].any(axis=1)
            if kind != "SUM":
                S = np.where(H, S, 0.0)
            return S, H
        return self._sparse(L, kind)

    def _sparse(self, L: np.ndarray, kind: str) -> tuple[np.ndarray, np.ndarray]:
        """Aggregation through the weight lists, for forests too large for dense tables."""
        N, T = L.shape
        K = self.n_targets
        flat = L.reshape(-1)
        counts = self.leaf_count[flat]
        rep = np.repeat(np.arange(flat.size), counts)
        ends = np.cumsum(counts)
        within = np.arange(ends[-1] if ends.size else 0) - np.repeat(ends - counts, counts)
        entries = self.leaf_start[flat][rep] + within
        key = (rep // T) * K + self.leaf_targets[entries]
        vals = self.leaf_values[entries]
        H = np.bincount(key, minlength=N * K) > 0
        if kind == "SUM":
            S = np.bincount(key, weights=vals, minlength=N * K)
        else:
            S = np.full(N * K, np.inf if kind == "MIN" else -np.inf)
            (np.minimum if kind == "MIN" else np.maximum).at(S, key, vals)
            S = np.where(H, S, 0.0)
        return S.reshape(N, K), H.reshape(N, K)


# -- building forests ---------------------------------------------------------------------------


def _leaf_csr(n_nodes: int, node_of_weight: np.ndarray, targets, values):
    """Group weights by node (stable: a node keeps its weights in attribute order)."""
    order = np.argsort(node_of_weight, kind="stable")
    nodes = node_of_weight[order]
    count = np.bincount(nodes, minlength=n_nodes).astype(np.intp)
    start = np.cumsum(count) - count
    return (np.asarray(targets, dtype=np.intp)[order],
            np.asarray(values, dtype=np.float64)[order], start, count)


def forest_from_v3(*, treeids, nodeids, featureids, thresholds, modes, truenodeids, falsenodeids,
                   missing, w_treeids, w_nodeids, w_ids, w_values, n_targets) -> Forest:
    """Build a Forest from the (tree id, node id) addressed attributes of ai.onnx.ml 1 / 3."""
    treeids = np.asarray(treeids, dtype=np.int64)
    nodeids = np.asarray(nodeids, dtype=np.int64)
    n = len(treeids)
    lengths = {len(nodeids), len(featureids), len(thresholds), len(modes), len(truenodeids),
               len(falsenodeids)}
    if lengths != {n}:
        raise ValueError("all nodes_* attributes must have the same length")
    if not (len(w_treeids) == len(w_nodeids) == len(w_ids) == len(w_values)):
        raise ValueError("all target/class weight attributes must have the same length")
    try:
        mode = np.array([_MODE_CODE[m] for m in modes], dtype=np.int8)
    except KeyError as e:
        raise ValueError(f"unknown node mode {e}") from None
    if (mode == MEMBER).any():
        raise ValueError("BRANCH_MEMBER is only supported by TreeEnsemble (ai.onnx.ml 5)")
    if n and (nodeids.min() < 0 or treeids.min() < 0):
        raise ValueError("negative tree or node id")
    width = int(nodeids.max()) + 1 if n else 1
    keys = treeids * width + nodeids
    order = np.argsort(keys, kind="stable")
    sorted_keys = keys[order]
    if n > 1 and (sorted_keys[1:] == sorted_keys[:-1]).any():
        i = order[1:][sorted_keys[1:] == sorted_keys[:-1]][0]
        raise ValueError(f"Node {nodeids[i]} in tree {treeids[i]} is already there.")

    def find(tids, nids, what):
        tids = np.asarray(tids, dtype=np.int64)
        nids = np.asarray(nids, dtype=np.int64)
        k = tids * width + nids
        pos = np.minimum(np.searchsorted(sorted_keys, k), max(n - 1, 0))
        ok = (nids >= 0) & (nids < width)
        if n:
            ok &= sorted_keys[pos] == k
        else:
            ok &= False
        if not ok.all():
            j = int(np.flatnonzero(~ok)[0])
            raise ValueError(f"Unable to find node {tids[j]}-{nids[j]} ({what}).")
        return order[pos]

    inner = mode != LEAF
    true_idx = np.zeros(n, dtype=np.intp)
    false_idx = np.zeros(n, dtype=np.intp)
    true_idx[inner] = find(treeids[inner], np.asarray(truenodeids)[inner], "truenode")
    false_idx[inner] = find(treeids[inner], np.asarray(falsenodeids)[inner], "falsenode")
    missing_true = np.zeros(n, dtype=bool)
    if len(missing):
        m = np.asarray(missing, dtype=np.int64)[:n] == 1
        missing_true[: len(m)] = m
    # onnxruntime: a tree starts wherever the tree id changes in the node list
    roots = np.flatnonzero(np.r_[True, treeids[1:] != treeids[:-1]]) if n else np.zeros(0, int)
    w_node = find(w_treeids, w_nodeids, "weights") if len(w_ids) else np.zeros(0, np.intp)
    on_leaf = ~inner[w_node]  # weights on inner nodes are ignored, as onnxruntime does
    targets, values, start, count = _leaf_csr(
        n, w_node[on_leaf], np.asarray(w_ids)[on_leaf], np.asarray(w_values)[on_leaf])
    return Forest(featureids, thresholds, mode, true_idx, false_idx, missing_true, roots,
                  targets, values, start, count, n_targets)


def forest_from_v5(*, tree_roots, nodes_featureids, nodes_splits, nodes_modes, nodes_truenodeids,
                   nodes_trueleafs, nodes_falsenodeids, nodes_falseleafs,
                   nodes_missing_value_tracks_true, leaf_targetids, leaf_weights,
                   membership_values, n_targets) -> Forest:
    """Build a Forest from TreeEnsemble-5 attributes: inner nodes first, then the leaves."""
    n = len(nodes_featureids)
    modes = np.asarray(nodes_modes).reshape(-1).astype(np.int64)
    splits = np.asarray(nodes_splits).reshape(-1)
    arrays = (modes, splits, nodes_truenodeids, nodes_trueleafs, nodes_falsenodeids,
              nodes_falseleafs)
    if any(len(a) != n for a in arrays):
        raise ValueError("all nodes_* attributes must have the same length")
    if len(leaf_targetids) != np.asarray(leaf_weights).size:
        raise ValueError("leaf_targetids and leaf_weights must have the same length")
    if ((modes < 0) | (modes > MEMBER)).any():
        raise ValueError("nodes_modes must be in [0, 6]")
    n_leaves = len(leaf_targetids)
    true_leaf = np.asarray(nodes_trueleafs, dtype=bool)
    false_leaf = np.asarray(nodes_falseleafs, dtype=bool)
    t = np.asarray(nodes_truenodeids, dtype=np.intp)
    f = np.asarray(nodes_falsenodeids, dtype=np.intp)
    for leafy, ids in ((true_leaf, t), (false_leaf, f)):
        limit = np.where(leafy, n_leaves, n)
        if ((ids < 0) | (ids >= limit)).any():
            raise ValueError("a node's branch points outside the nodes / leaves")
    true_idx = np.where(true_leaf, n + t, t)
    false_idx = np.where(false_leaf, n + f, f)
    total = n + n_leaves
    mode = np.concatenate([modes.astype(np.int8), np.full(n_leaves, LEAF, np.int8)])
    feature = np.concatenate([np.asarray(nodes_featureids, dtype=np.intp),
                              np.zeros(n_leaves, np.intp)])
    thr_dtype = splits.dtype if splits.dtype.kind == "f" else np.dtype(np.float32)
    thresholds = np.concatenate([splits.astype(thr_dtype), np.zeros(n_leaves, thr_dtype)])
    missing = np.zeros(total, dtype=bool)
    if len(nodes_missing_value_tracks_true):
        missing[:n] = np.asarray(nodes_missing_value_tracks_true, dtype=np.int64)[:n] == 1
    roots = np.asarray(tree_roots, dtype=np.intp)
    if ((roots < 0) | (roots >= max(n, 1))).any() or (len(roots) and n == 0):
        raise ValueError("tree_roots out of range")
    # a one-leaf tree is a node whose true and false branches are the same leaf
    if n:
        single = true_leaf[roots] & false_leaf[roots] & (t[roots] == f[roots])
        roots = np.where(single, n + t[roots], roots)
    member_sets = {}
    if (modes == MEMBER).any():
        values = np.asarray(membership_values, dtype=np.float64).reshape(-1)
        bounds = np.flatnonzero(np.isnan(values))
        starts = np.r_[0, bounds + 1]
        for k, node in enumerate(np.flatnonzero(modes == MEMBER)):
            if k >= len(starts):
                member_sets[int(node)] = np.zeros(0)
                continue
            end = bounds[k] if k < len(bounds) else len(values)
            member_sets[int(node)] = values[starts[k]:end]
    leaf_nodes = n + np.arange(n_leaves, dtype=np.intp)
    targets, values, start, count = _leaf_csr(
        total, leaf_nodes, leaf_targetids, np.asarray(leaf_weights).reshape(-1))
    return Forest(feature, thresholds, mode, np.r_[true_idx, leaf_nodes],
                  np.r_[false_idx, leaf_nodes], missing, roots, targets, values, start, count,
                  n_targets, member_sets)


# -- finalization -------------------------------------------------------------------------------


def regression_scores(S: np.ndarray, H: np.ndarray, n_trees: int, agg: str, base: np.ndarray,
                      post_transform: str) -> np.ndarray:
    """onnxruntime's TreeAggregator{Sum,Average,Min,Max}::FinalizeScores[1] (float64)."""
    K = S.shape[1]
    if K == 1:
        origin = base[0] if len(base) == 1 else 0.0
        s = S[:, 0]
        if agg == "AVERAGE" and n_trees:
            s = s / n_trees
        s = s + origin
        if agg in ("MIN", "MAX"):
            s = np.where(H[:, 0], s, origin)
        if post_transform == "PROBIT":
            s = probit(s).astype(np.float64)
        return s.reshape(-1, 1)
    if agg == "AVERAGE" and n_trees:
        S = S / n_trees
    if len(base) == K:
        S = S + base
    # a score no leaf wrote stays 0, base value or not (onnxruntime's ScoreValue::has_score)
    S = np.where(H, S, 0.0)
    return transform_scores(S, post_transform)


def classifier_scores(S: np.ndarray, H: np.ndarray, base: np.ndarray, post_transform: str,
                      binary_case: bool, all_positive: bool) -> tuple[np.ndarray, np.ndarray]:
    """Scores and label index per row (onnxruntime's TreeAggregatorClassifier::FinalizeScores).

    Label indices RAW_ONE / RAW_ZERO stand for the raw labels 1 / 0 onnxruntime writes for a
    binary classifier whose weights cover both classes.
    """
    N, C = S.shape
    B = len(base)
    if C > 2:
        n = min(B, C)
        if n:
            S = S.copy()
            S[:, :n] += base[:n]
            H = H.copy()
            H[:, :n] = True
        label = np.where(H, S, -np.inf).argmax(axis=1)
        return transform_scores(np.where(H, S, 0.0), post_transform), label
    if C == 1:
        s = S[:, 0] + (base[0] if B == 1 else 0.0)
        z = probit(s).astype(np.float64) if post_transform == "PROBIT" else s
        return z.reshape(-1, 1), np.where(s > 0, RAW_ONE, RAW_ZERO)
    S = S.copy()
    H = H.copy()
    s0, s1, h0, h1 = S[:, 0], S[:, 1], H[:, 0], H[:, 1]
    wa = np.full(N, -1)
    single = np.zeros(N, dtype=bool)  # onnxruntime pops the second score: one-score output
    if B == 2:
        both = h1.copy()
        new1 = np.where(both, base[1] + s0, s1 + base[1])
        s0[:] = np.where(both, -new1, s0 + base[0])
        s1[:] = new1
    elif B == 1:  # onnxruntime accepts one base value for two classes
        s0 += base[0]
        single = ~h1
    else:
        wa[:] = 3
        single = ~h1
    pos = np.where(h1, s1, np.where(h0, s0, 0.0))
    if binary_case:
        if all_positive:
            win = pos > 0.5
            wa = np.where(win, 0, 1)
        else:
            win = pos > 0
            wa = np.where(win, 2, 3)
        label = np.where(win, 1, 0)
    else:
        label = np.where(pos > 0, RAW_ONE, RAW_ZERO)
    Z = transform_scores(np.where(H, S, 0.0), post_transform)
    if single.any():
        one = binary_scores(np.where(h0, s0, 0.0)[single], post_transform, wa[single])
        Z[single] = one
    return Z, label


def _labels_out(label: np.ndarray, ints, strings) -> np.ndarray:
    # the two extra entries are what RAW_ONE (-2) and RAW_ZERO (-1) index
    if strings:
        names = np.array(list(strings) + [strings[1] if len(strings) > 1 else strings[0],
                                          strings[0]], dtype=object)
        return names[label]
    return np.array(list(ints) + [1, 0], dtype=np.int64)[label]


def _floats(values, tensor, dtype=np.float32) -> np.ndarray:
    """A float attribute given either as a list or as its *_as_tensor twin."""
    if tensor is not None:
        if values:
            raise ValueError("an attribute and its *_as_tensor twin cannot both be set")
        return np.asarray(tensor).reshape(-1)
    return np.asarray(values if values is not None else [], dtype=dtype)


def _base_values(values, tensor, n: int, binary: bool = False) -> np.ndarray:
    base = _floats(values, tensor).astype(np.float64)
    # onnxruntime also takes a single base value for a two-class classifier
    if len(base) not in (0, n) and not (binary and n == 2 and len(base) == 1):
        raise ValueError(f"base_values should have 0 or {n} values.")
    return base


# -- kernels ------------------------------------------------------------------------------------


@op("TreeEnsembleRegressor", 1, 3, domain="ai.onnx.ml")
class TreeEnsembleRegressor:
    def __init__(self, ctx: KernelContext, *, aggregate_function="SUM", base_values=None,
                 base_values_as_tensor=None, n_targets=None, nodes_falsenodeids=(),
                 nodes_featureids=(), nodes_hitrates=None, nodes_hitrates_as_tensor=None,
                 nodes_missing_value_tracks_true=(), nodes_modes=(), nodes_nodeids=(),
                 nodes_treeids=(), nodes_truenodeids=(), nodes_values=None,
                 nodes_values_as_tensor=None, post_transform="NONE", target_ids=(),
                 target_nodeids=(), target_treeids=(), target_weights=None,
                 target_weights_as_tensor=None):
        if aggregate_function not in AGGREGATES_V5:
            raise ValueError(f"unknown aggregate_function '{aggregate_function}'")
        if not n_targets or n_targets <= 0:
            raise ValueError("n_targets must be a positive integer")
        self.agg = aggregate_function
        self.post = check_post_transform(post_transform)
        self.n_targets = int(n_targets)
        self.base = _base_values(base_values, base_values_as_tensor, self.n_targets)
        weights = _floats(target_weights, target_weights_as_tensor)
        if len(target_ids) and (min(target_ids) < 0 or max(target_ids) >= self.n_targets):
            raise ValueError("target_ids must be in [0, n_targets)")
        self.forest = forest_from_v3(
            treeids=nodes_treeids, nodeids=nodes_nodeids, featureids=nodes_featureids,
            thresholds=_floats(nodes_values, nodes_values_as_tensor), modes=nodes_modes,
            truenodeids=nodes_truenodeids, falsenodeids=nodes_falsenodeids,
            missing=nodes_missing_value_tracks_true, w_treeids=target_treeids,
            w_nodeids=target_nodeids, w_ids=target_ids, w_values=weights,
            n_targets=self.n_targets)

    def __call__(self, X):
        f = self.forest
        S, H = f.aggregate(f.leaves(X), self.agg)
        return regression_scores(S, H, f.n_trees, self.agg, self.base, self.post).astype(
            np.float32)


@op("TreeEnsembleClassifier", 1, 3, domain="ai.onnx.ml")
class TreeEnsembleClassifier:
    def __init__(self, ctx: KernelContext, *, base_values=None, base_values_as_tensor=None,
                 class_ids=(), class_nodeids=(), class_treeids=(), class_weights=None,
                 class_weights_as_tensor=None, classlabels_int64s=None, classlabels_strings=None,
                 nodes_falsenodeids=(), nodes_featureids=(), nodes_hitrates=None,
                 nodes_hitrates_as_tensor=None, nodes_missing_value_tracks_true=(),
                 nodes_modes=(), nodes_nodeids=(), nodes_treeids=(), nodes_truenodeids=(),
                 nodes_values=None, nodes_values_as_tensor=None, post_transform="NONE"):
        if classlabels_strings and classlabels_int64s:
            raise ValueError("only one of classlabels_int64s and classlabels_strings may be set")
        self.strings = list(classlabels_strings or [])
        self.ints = list(classlabels_int64s or [])
        self.n_classes = len(self.strings) or len(self.ints)
        if self.n_classes == 0:
            raise ValueError("classlabels_int64s or classlabels_strings must be set")
        self.post = check_post_transform(post_transform)
        self.base = _base_values(base_values, base_values_as_tensor, self.n_classes, True)
        weights = _floats(class_weights, class_weights_as_tensor)
        if len(class_ids) and (min(class_ids) < 0 or max(class_ids) >= self.n_classes):
            raise ValueError("class_ids must be in [0, number of class labels)")
        self.binary_case = self.n_classes == 2 and len(set(class_ids)) == 1
        self.all_positive = bool((weights >= 0).all())
        self.forest = forest_from_v3(
            treeids=nodes_treeids, nodeids=nodes_nodeids, featureids=nodes_featureids,
            thresholds=_floats(nodes_values, nodes_values_as_tensor), modes=nodes_modes,
            truenodeids=nodes_truenodeids, falsenodeids=nodes_falsenodeids,
            missing=nodes_missing_value_tracks_true, w_treeids=class_treeids,
            w_nodeids=class_nodeids, w_ids=class_ids, w_values=weights,
            n_targets=self.n_classes)

    def __call__(self, X):
        f = self.forest
        S, H = f.aggregate(f.leaves(X), "SUM")
        Z, label = classifier_scores(S, H, self.base, self.post, self.binary_case,
                                     self.all_positive)
        return _labels_out(label, self.ints, self.strings), Z.astype(np.float32)


@op("TreeEnsemble", 5, domain="ai.onnx.ml")
class TreeEnsemble:
    def __init__(self, ctx: KernelContext, *, aggregate_function=1, leaf_targetids,
                 leaf_weights, membership_values=None, n_targets=None, nodes_falseleafs,
                 nodes_falsenodeids, nodes_featureids, nodes_hitrates=None,
                 nodes_missing_value_tracks_true=(), nodes_modes, nodes_splits, nodes_trueleafs,
                 nodes_truenodeids, post_transform=0, tree_roots):
        if aggregate_function not in range(4):
            raise ValueError(f"aggregate_function must be in [0, 3], got {aggregate_function}")
        if post_transform not in range(5):
            raise ValueError(f"post_transform must be in [0, 4], got {post_transform}")
        if not n_targets or n_targets <= 0:
            raise ValueError("n_targets must be a positive integer")
        self.agg = AGGREGATES_V5[aggregate_function]
        self.post = TRANSFORMS_V5[post_transform]
        self.n_targets = int(n_targets)
        if len(leaf_targetids) and (min(leaf_targetids) < 0
                                    or max(leaf_targetids) >= self.n_targets):
            raise ValueError("leaf_targetids must be in [0, n_targets)")
        self.forest = forest_from_v5(
            tree_roots=tree_roots, nodes_featureids=nodes_featureids, nodes_splits=nodes_splits,
            nodes_modes=nodes_modes, nodes_truenodeids=nodes_truenodeids,
            nodes_trueleafs=nodes_trueleafs, nodes_falsenodeids=nodes_falsenodeids,
            nodes_falseleafs=nodes_falseleafs,
            nodes_missing_value_tracks_true=nodes_missing_value_tracks_true,
            leaf_targetids=leaf_targetids, leaf_weights=leaf_weights,
            membership_values=membership_values if membership_values is not None else [],
            n_targets=self.n_targets)

    def __call__(self, X):
        f = self.forest
        S, H = f.aggregate(f.leaves(X), self.agg)
        Y = regression_scores(S, H, f.n_trees, self.agg, np.zeros(0), self.post)
        return Y.astype(X.dtype)
