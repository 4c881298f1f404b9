"""The ai.onnx.ml domain: scikit-learn models converted with skl2onnx (labels against
scikit-learn, probabilities against scikit-learn and onnxruntime), one-node models of every
operator against onnxruntime (including its binary-classifier quirks), randomized tree
ensembles, and the ai.onnx.ml ONNX conformance cases."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxrun

# scikit-learn deprecates SVC(probability=True) (still what skl2onnx converts)
pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")

F, D, I64, I32, S = (TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.INT64,
                     TensorProto.INT32, TensorProto.STRING)

# -- harness ------------------------------------------------------------------------------------


def ml_model(node, inputs, outputs, ml_opset=1, opset=17):
    """``inputs`` / ``outputs``: (name, elem type or TypeProto) pairs."""
    def info(name, t):
        if isinstance(t, onnx.TypeProto):
            return helper.make_value_info(name, t)
        return helper.make_tensor_value_info(name, t, None)

    graph = helper.make_graph([node], "g", [info(*i) for i in inputs], [info(*o) for o in outputs])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset),
                                                helper.make_opsetid("ai.onnx.ml", ml_opset)])
    m.ir_version = 10 if opset >= 21 else 8
    return m


def ml_node(op, inputs=("X",), outputs=("Y",), **attrs):
    return helper.make_node(op, list(inputs), list(outputs), domain="ai.onnx.ml", **attrs)


def run_onnxrun(model, feeds):
    data = model if isinstance(model, bytes) else model.SerializeToString()
    return onnxrun.InferenceSession(data).run(None, feeds)


def run_ort(model, feeds):
    data = model if isinstance(model, bytes) else model.SerializeToString()
    so = ort.SessionOptions()
    so.log_severity_level = 3
    return ort.InferenceSession(data, so).run(None, feeds)


def assert_same(got, want, rtol=1e-5, atol=1e-6):
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        if isinstance(w, list):  # ZipMap: a list of dicts
            assert isinstance(g, list) and len(g) == len(w)
            for dg, dw in zip(g, w, strict=True):
                assert list(dg) == list(dw)
                np.testing.assert_allclose(list(dg.values()), list(dw.values()), rtol, atol)
            continue
        g, w = np.asarray(g), np.asarray(w)
        assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, g.dtype, w.shape, w.dtype)
        if w.dtype == object:
            assert (g == w).all(), (g, w)
        else:
            np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, equal_nan=True)


def check_vs_ort(model, feeds, rtol=1e-5, atol=1e-6):
    assert_same(run_onnxrun(model, feeds), run_ort(model, feeds), rtol, atol)


def check_errors_like_ort(model, feeds):
    with pytest.raises(Exception):  # noqa: B017 - onnxruntime's own error classes differ
        run_ort(model, feeds)
    with pytest.raises(Exception):  # noqa: B017
        run_onnxrun(model, feeds)


# -- scikit-learn models ------------------------------------------------------------------------

try:
    import skl2onnx
    import sklearn  # noqa: F401
except ImportError:  # pragma: no cover - test dependencies
    skl2onnx = None

needs_skl2onnx = pytest.mark.skipif(
    skl2onnx is None,
    reason="scikit-learn and skl2onnx are needed to convert scikit-learn models "
    "(pip install scikit-learn skl2onnx)",
)


def _datasets():
    from sklearn import datasets
    from sklearn.preprocessing import StandardScaler

    out = {}
    for name, loader in (("iris", datasets.load_iris), ("cancer", datasets.load_breast_cancer),
                         ("diabetes", datasets.load_diabetes), ("digits", datasets.load_digits)):
        X, y = loader(return_X_y=True)
        out[name] = (X.astype(np.float32), y)
        # SVMs see standardized data: onnxruntime's float32 kernels lose too much on raw
        # breast-cancer features (sums of ~1e6 terms cancelling)
        out[name + "_std"] = (StandardScaler().fit_transform(X).astype(np.float32), y)
    return out


_DATA: dict = {}


def data(name):
    if not _DATA:
        _DATA.update(_datasets())
    return _DATA[name]


def _models():
    from sklearn import ensemble, linear_model, neighbors, svm, tree

    E = ensemble
    clf = [
        ("rf_iris", lambda: E.RandomForestClassifier(20, max_depth=6, random_state=0), "iris"),
        ("rf_cancer_labels_3_7", lambda: E.RandomForestClassifier(15, random_state=0),
         "cancer:3/7"),
        ("extra_trees_digits", lambda: E.ExtraTreesClassifier(10, max_depth=8, random_state=0),
         "digits"),
        ("gb_iris", lambda: E.GradientBoostingClassifier(n_estimators=20, random_state=0),
         "iris"),
        ("gb_cancer", lambda: E.GradientBoostingClassifier(n_estimators=20, random_state=0),
         "cancer"),
        ("tree_iris", lambda: tree.DecisionTreeClassifier(random_state=0), "iris"),
        ("logreg_binary", lambda: linear_model.LogisticRegression(max_iter=3000), "cancer_std"),
        ("logreg_multiclass", lambda: linear_model.LogisticRegression(max_iter=500), "iris"),
        ("linear_svc", lambda: svm.LinearSVC(), "iris_std"),
        ("knn", lambda: neighbors.KNeighborsClassifier(), "iris"),
    ]
    for kernel in ("linear", "rbf", "poly", "sigmoid"):
        for proba in (True, False):
            for ds in ("iris_std", "cancer_std"):
                clf.append((f"svc_{kernel}_{'proba' if proba else 'decision'}_{ds}",
                            lambda k=kernel, p=proba: svm.SVC(kernel=k, probability=p,
                                                              random_state=0), ds))
    reg = [
        ("rf_reg", lambda: E.RandomForestRegressor(15, max_depth=8, random_state=0)),
        ("gb_reg", lambda: E.GradientBoostingRegressor(n_estimators=30, random_state=0)),
        ("tree_reg", lambda: tree.DecisionTreeRegressor(max_depth=6, random_state=0)),
        ("linear_reg", lambda: linear_model.LinearRegression()),
        ("knn_reg", lambda: neighbors.KNeighborsRegressor()),
    ] + [(f"svr_{k}", lambda k=k: svm.SVR(kernel=k)) for k in ("linear", "rbf", "poly", "sigmoid")]
    return clf, reg


_CLF, _REG = _models() if skl2onnx is not None else ([], [])


def _convert(model, X):
    from unittest import mock

    import skl2onnx.common._container as container
    from skl2onnx import to_onnx

    make_node = container.make_node

    def ints_not_bools(*args, **attrs):
        # skl2onnx 1.20 passes numpy booleans (HistGradientBoosting's missing-value sides) to
        # onnx.helper, which refuses them in an INTS attribute
        attrs = {k: [int(x) if isinstance(x, bool | np.bool_) else x for x in v]
                 if isinstance(v, list) else v for k, v in attrs.items()}
        return make_node(*args, **attrs)

    try:
        with mock.patch.object(container, "make_node", ints_not_bools):
            return to_onnx(model, X[:1]).SerializeToString()
    except Exception as e:  # skl2onnx cannot convert every estimator with every numpy
        pytest.skip(f"skl2onnx cannot convert {type(model).__name__}: {str(e)[:120]}")


def _probabilities(out):
    """[N, C] from a ZipMap list of dicts (keys sorted) or a tensor."""
    if isinstance(out, list):
        return np.array([[d[k] for k in sorted(d)] for d in out], dtype=np.float64)
    return np.asarray(out, dtype=np.float64)


@needs_skl2onnx
@pytest.mark.parametrize("name,make,ds", _CLF, ids=[c[0] for c in _CLF])
def test_sklearn_classifier(name, make, ds):
    ds, _, relabel = ds.partition(":")
    X, y = data(ds)
    if relabel:  # labels other than 0/1 exercise onnxruntime's binary labelling rules
        neg, pos = (int(v) for v in relabel.split("/"))
        y = np.where(y > 0, pos, neg)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = make().fit(X, y)
    onx = _convert(model, X)
    feeds = {onnx.load_from_string(onx).graph.input[0].name: X}
    got, want = run_onnxrun(onx, feeds), run_ort(onx, feeds)
    np.testing.assert_array_equal(got[0], model.predict(X))
    np.testing.assert_array_equal(got[0], want[0])
    # onnxruntime computes SVM kernels in float32, onnxrun in float64 (as scikit-learn does)
    tol = 1e-4 if "svc" in name else 1e-5
    assert_same(got[1:], want[1:], rtol=tol, atol=tol)
    if hasattr(model, "predict_proba") and "decision" not in name:
        np.testing.assert_allclose(_probabilities(got[1]), model.predict_proba(X), atol=tol)


@needs_skl2onnx
@pytest.mark.parametrize("name,make", _REG, ids=[r[0] for r in _REG])
def test_sklearn_regressor(name, make):
    X, y = data("diabetes_std" if name.startswith("svr") else "diabetes")
    model = make().fit(X, y)
    onx = _convert(model, X)
    feeds = {onnx.load_from_string(onx).graph.input[0].name: X}
    got, want = run_onnxrun(onx, feeds), run_ort(onx, feeds)
    scale = np.abs(y).max()
    np.testing.assert_allclose(got[0].ravel(), model.predict(X), rtol=1e-5, atol=1e-5 * scale)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-5 * scale)


@needs_skl2onnx
def test_sklearn_hist_gradient_boosting_with_missing_values():
    """HistGradientBoosting learns which side missing values go: nodes_missing_value_tracks_true
    with NaN inputs, for a classifier and a regressor."""
    from sklearn.ensemble import HistGradientBoostingClassifier, HistGradientBoostingRegressor

    for make, ds in ((HistGradientBoostingClassifier, "iris"),
                     (HistGradientBoostingRegressor, "diabetes")):
        X, y = data(ds)
        X = X.copy()
        X[::5, 2] = np.nan
        X[1::7, 0] = np.nan
        model = make(max_iter=15, random_state=0).fit(X, y)
        onx = _convert(model, X)
        got, want = run_onnxrun(onx, {"X": X}), run_ort(onx, {"X": X})
        if ds == "iris":
            np.testing.assert_array_equal(got[0], model.predict(X))
            np.testing.assert_allclose(_probabilities(got[1]), model.predict_proba(X), atol=1e-5)
            assert_same(got, want)
        else:
            np.testing.assert_allclose(got[0].ravel(), model.predict(X), rtol=1e-5, atol=1e-3)
            np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-3)


@needs_skl2onnx
def test_sklearn_multi_target_regressors():
    from sklearn import ensemble, linear_model

    X, y = data("diabetes")
    Y = np.c_[y, np.sqrt(y)]
    for model in (linear_model.Ridge(), ensemble.RandomForestRegressor(10, max_depth=5,
                                                                       random_state=0)):
        model.fit(X, Y)
        onx = _convert(model, X)
        feeds = {onnx.load_from_string(onx).graph.input[0].name: X}
        got = run_onnxrun(onx, feeds)
        np.testing.assert_allclose(got[0], model.predict(X), rtol=1e-5, atol=1e-3)
        check_vs_ort(onx, feeds, rtol=1e-5, atol=1e-3)


@needs_skl2onnx
def test_sklearn_pipeline_column_transformer():
    """StandardScaler on numeric columns + OneHotEncoder on string columns + LogisticRegression,
    one graph input per column (an unseen category included)."""
    from skl2onnx import convert_sklearn
    from skl2onnx.common.data_types import FloatTensorType, StringTensorType
    from sklearn.compose import ColumnTransformer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import Pipeline
    from sklearn.preprocessing import OneHotEncoder, StandardScaler

    X, y = data("iris")
    rng = np.random.default_rng(0)
    table = np.empty((len(X), 5), dtype=object)
    table[:, :3] = X[:, :3]
    table[:, 3] = rng.choice(["red", "green", "blue"], len(X))
    table[:, 4] = np.where(X[:, 3] > 1.0, "big", "small")
    pipe = Pipeline([
        ("pre", ColumnTransformer([("num", StandardScaler(), [0, 1, 2]),
                                   ("cat", OneHotEncoder(handle_unknown="ignore"), [3, 4])])),
        ("lr", LogisticRegression(max_iter=1000)),
    ]).fit(table, y)
    names = ["a", "b", "c", "color", "size"]
    types = [(n, FloatTensorType([None, 1]) if i < 3 else StringTensorType([None, 1]))
             for i, n in enumerate(names)]
    onx = convert_sklearn(pipe, initial_types=types).SerializeToString()
    table[0, 3] = "purple"  # unknown category: all-zero one-hot
    feeds = {n: table[:, [i]].astype(np.float32 if i < 3 else object)
             for i, n in enumerate(names)}
    got, want = run_onnxrun(onx, feeds), run_ort(onx, feeds)
    np.testing.assert_array_equal(got[0], pipe.predict(table))
    assert_same(got, want)
    np.testing.assert_allclose(_probabilities(got[1]), pipe.predict_proba(table), atol=1e-5)


@needs_skl2onnx
def test_sklearn_dict_vectorizer_pipeline():
    """A map input (a Python dict, as onnxruntime takes it) through DictVectorizer."""
    from skl2onnx import convert_sklearn
    from skl2onnx.common.data_types import DictionaryType, FloatTensorType, StringTensorType
    from sklearn.feature_extraction import DictVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline

    rows = [{"a": 1.0, "b": 2.0}, {"a": 3.0, "c": 1.0}, {"b": 5.0, "c": 2.0}, {"a": 0.5}]
    pipe = make_pipeline(DictVectorizer(sparse=False), LogisticRegression()).fit(rows,
                                                                               [0, 1, 1, 0])
    map_type = DictionaryType(StringTensorType([1]), FloatTensorType([1]))
    onx = convert_sklearn(pipe, initial_types=[("input", map_type)]).SerializeToString()
    for row in rows + [{"b": 1.0, "unseen": 4.0}]:
        got, want = run_onnxrun(onx, {"input": row}), run_ort(onx, {"input": row})
        assert_same(got, want)
        np.testing.assert_array_equal(got[0], pipe.predict([row]))
        np.testing.assert_allclose(_probabilities(got[1]), pipe.predict_proba([row]), atol=1e-5)


@needs_skl2onnx
def test_sklearn_zipmap_output_is_a_list_of_dicts():
    from sklearn.ensemble import RandomForestClassifier

    X, y = data("iris")
    model = RandomForestClassifier(5, max_depth=3, random_state=0).fit(X, y)
    onx = _convert(model, X)
    got = run_onnxrun(onx, {"X": X[:3]})[1]
    want = run_ort(onx, {"X": X[:3]})[1]
    assert type(got) is list and all(type(d) is dict for d in got)
    assert [type(k) for k in got[0]] == [int, int, int]
    assert [type(v) for v in got[0].values()] == [float, float, float]
    assert got == want


# -- tree ensembles: one-node models against onnxruntime -----------------------------------------

_ONE_SPLIT = dict(nodes_treeids=[0, 0, 0], nodes_nodeids=[0, 1, 2], nodes_featureids=[0, 0, 0],
                  nodes_values=[0.0, 0.0, 0.0], nodes_modes=["BRANCH_LEQ", "LEAF", "LEAF"],
                  nodes_truenodeids=[1, 0, 0], nodes_falsenodeids=[2, 0, 0])

_BINARY_CASES = {
    "both_classes": dict(class_treeids=[0] * 4, class_nodeids=[1, 1, 2, 2], class_ids=[0, 1, 0, 1],
                         class_weights=[0.8, 0.2, 0.3, 0.7]),
    "class1_positive": dict(class_treeids=[0, 0], class_nodeids=[1, 2], class_ids=[1, 1],
                            class_weights=[0.2, 0.7]),
    "class1_mixed": dict(class_treeids=[0, 0], class_nodeids=[1, 2], class_ids=[1, 1],
                         class_weights=[-0.2, 0.7]),
    "class0_positive": dict(class_treeids=[0, 0], class_nodeids=[1, 2], class_ids=[0, 0],
                            class_weights=[0.2, 0.7]),
    "class0_mixed": dict(class_treeids=[0, 0], class_nodeids=[1, 2], class_ids=[0, 0],
                         class_weights=[-0.2, 0.7]),
}


@pytest.mark.parametrize("post", ["NONE", "LOGISTIC", "SOFTMAX", "SOFTMAX_ZERO"])
@pytest.mark.parametrize("base", [None, [0.5, 0.25]])
@pytest.mark.parametrize("case", list(_BINARY_CASES))
def test_tree_classifier_binary_rules(case, base, post):
    """onnxruntime's binary rules: weights for one class only, all positive or mixed, base values;
    a classifier with weights for both classes returns the raw labels 0 / 1."""
    attrs = dict(_ONE_SPLIT, **_BINARY_CASES[case], classlabels_int64s=[3, 7],
                 post_transform=post)
    if base:
        attrs["base_values"] = base
    m = ml_model(ml_node("TreeEnsembleClassifier", outputs=("Y", "Z"), **attrs), [("X", F)],
                 [("Y", I64), ("Z", F)])
    check_vs_ort(m, {"X": np.array([[-1.0], [0.5], [2.0], [0.0]], np.float32)})


@pytest.mark.parametrize("post", ["NONE", "SOFTMAX", "SOFTMAX_ZERO", "LOGISTIC", "PROBIT"])
def test_tree_classifier_partial_multiclass_and_strings(post):
    # classes no leaf writes score 0 and are left out of the argmax
    attrs = dict(_ONE_SPLIT, class_treeids=[0, 0], class_nodeids=[1, 2], class_ids=[1, 2],
                 class_weights=[-0.2, -0.7], post_transform=post)
    X = np.array([[-1.0], [0.5]], np.float32)
    for labels, yt in ((dict(classlabels_int64s=[3, 7, 9]), I64),
                       (dict(classlabels_strings=["a", "b", "c"]), S)):
        m = ml_model(ml_node("TreeEnsembleClassifier", outputs=("Y", "Z"), **attrs, **labels),
                     [("X", F)], [("Y", yt), ("Z", F)])
        check_vs_ort(m, {"X": X})


def _random_forest_attrs(rng, n_trees, n_features, depth, modes, values):
    cols = {k: [] for k in ("tree", "node", "feat", "value", "mode", "true", "false", "missing")}

    def build(tree, d):
        nid = len([t for t in cols["tree"] if t == tree])
        for k in cols:
            cols[k].append(0)
        pos = len(cols["tree"]) - 1
        cols["tree"][pos], cols["node"][pos] = tree, nid
        if d == 0 or rng.random() < 0.25:
            cols["mode"][pos] = "LEAF"
            return nid
        cols["feat"][pos] = int(rng.integers(0, n_features))
        cols["value"][pos] = float(rng.choice(values))
        cols["mode"][pos] = str(rng.choice(modes))
        cols["missing"][pos] = int(rng.random() < 0.3)
        cols["true"][pos] = build(tree, d - 1)
        cols["false"][pos] = build(tree, d - 1)
        return nid

    for t in range(n_trees):
        build(t, depth)
    attrs = dict(nodes_treeids=cols["tree"], nodes_nodeids=cols["node"],
                 nodes_featureids=cols["feat"], nodes_values=[float(v) for v in cols["value"]],
                 nodes_modes=cols["mode"], nodes_truenodeids=cols["true"],
                 nodes_falsenodeids=cols["false"],
                 nodes_missing_value_tracks_true=cols["missing"])
    leaves = [(t, n) for t, n, m in zip(cols["tree"], cols["node"], cols["mode"], strict=True)
              if m == "LEAF"]
    return attrs, leaves


_MODES = ["BRANCH_LEQ", "BRANCH_LT", "BRANCH_GTE", "BRANCH_GT", "BRANCH_EQ", "BRANCH_NEQ"]


@pytest.mark.parametrize("seed", range(12))
def test_random_tree_ensembles_v3(seed):
    """Random trees (every node mode, NaN inputs, missing_value_tracks_true, several weights per
    leaf, base values, every aggregate and post-transform) against onnxruntime."""
    rng = np.random.default_rng(seed)
    for _ in range(6):
        n_features = int(rng.integers(1, 5))
        values = np.round(rng.normal(size=6), 1)
        modes = _MODES if rng.random() < 0.5 else [str(rng.choice(_MODES))]
        attrs, leaves = _random_forest_attrs(rng, int(rng.integers(1, 6)), n_features,
                                             int(rng.integers(1, 5)), modes, values)
        classifier = rng.random() < 0.5
        K = int(rng.integers(2 if classifier else 1, 5))
        w = {"tree": [], "node": [], "id": [], "weight": []}
        for t, n in leaves:
            for k in range(K):
                if rng.random() < 0.6:
                    for key, v in zip(w, (t, n, k, float(np.round(rng.normal(), 2))),
                                      strict=True):
                        w[key].append(v)
        if not w["id"]:
            continue
        post = str(rng.choice(["NONE", "SOFTMAX", "LOGISTIC", "SOFTMAX_ZERO"]))
        base = [float(b) for b in np.round(rng.normal(size=K), 2)] if rng.random() < 0.5 else []
        xtype = rng.choice(["float", "double"] + (["int64"] if classifier else []))
        if xtype == "int64":
            X = rng.choice(np.r_[np.round(values * 3), 1, -1], size=(8, n_features))
            X, xt = X.astype(np.int64), I64
        else:
            X = rng.choice(np.r_[values, np.nan, 0.05], size=(8, n_features))
            X, xt = (X.astype(np.float32), F) if xtype == "float" else (X, D)
        if classifier:
            node = ml_node("TreeEnsembleClassifier", outputs=("Y", "Z"), **attrs,
                           class_treeids=w["tree"], class_nodeids=w["node"], class_ids=w["id"],
                           class_weights=w["weight"], classlabels_int64s=list(range(10, 10 + K)),
                           post_transform=post, **({"base_values": base} if base else {}))
            m = ml_model(node, [("X", xt)], [("Y", I64), ("Z", F)])
        else:
            agg = str(rng.choice(["SUM", "AVERAGE", "MIN", "MAX"]))
            node = ml_node("TreeEnsembleRegressor", **attrs, target_treeids=w["tree"],
                           target_nodeids=w["node"], target_ids=w["id"],
                           target_weights=w["weight"], n_targets=K, post_transform=post,
                           aggregate_function=agg, **({"base_values": base} if base else {}))
            m = ml_model(node, [("X", xt)], [("Y", F)])
        check_vs_ort(m, {"X": X}, rtol=1e-4, atol=1e-5)


def test_tree_ensemble_v3_as_tensor_attributes():
    attrs = dict(_ONE_SPLIT)
    attrs["nodes_values_as_tensor"] = numpy_helper.from_array(np.array([0.1, 0, 0]))
    del attrs["nodes_values"]
    node = ml_node("TreeEnsembleRegressor", **attrs, n_targets=1, target_treeids=[0, 0],
                   target_nodeids=[1, 2], target_ids=[0, 0],
                   target_weights_as_tensor=numpy_helper.from_array(np.array([1.5, -2.5])),
                   base_values_as_tensor=numpy_helper.from_array(np.array([0.25])))
    m = ml_model(node, [("X", D)], [("Y", F)], ml_opset=3)
    X = np.array([[0.1], [0.10000001], [-3.0]])
    check_vs_ort(m, {"X": X})
    np.testing.assert_allclose(run_onnxrun(m, {"X": X})[0].ravel(), [1.75, -2.25, 1.75])


def _random_v5(rng, n_targets, dtype):
    nodes = {k: [] for k in ("feat", "split", "mode", "t", "tl", "f", "fl", "miss")}
    members, leaf_t, leaf_w, roots = [], [], [], []
    values = np.round(rng.normal(size=5), 1)

    def leaf():
        leaf_t.append(int(rng.integers(0, n_targets)))
        leaf_w.append(float(np.round(rng.normal(), 2)))
        return len(leaf_t) - 1

    def build(d):
        i = len(nodes["feat"])
        for k in nodes:
            nodes[k].append(0)
        mode = int(rng.integers(0, 7))
        nodes["feat"][i], nodes["mode"][i] = int(rng.integers(0, 3)), mode
        nodes["split"][i], nodes["miss"][i] = float(rng.choice(values)), int(rng.random() < 0.3)
        if mode == 6:
            members.extend(list(rng.choice([-2.0, -1.0, 0.0, 1.0, 3.0], size=2, replace=False))
                           + [np.nan])
        for side, is_leaf in (("t", "tl"), ("f", "fl")):
            if d == 0 or rng.random() < 0.3:
                nodes[side][i], nodes[is_leaf][i] = leaf(), 1
            else:
                nodes[side][i], nodes[is_leaf][i] = build(d - 1), 0
        return i

    for _ in range(int(rng.integers(1, 5))):
        if rng.random() < 0.15:  # a one-leaf tree: a node whose branches are the same leaf
            i = len(nodes["feat"])
            for k in nodes:
                nodes[k].append(0)
            leaf_id = leaf()
            nodes["t"][i] = nodes["f"][i] = leaf_id
            nodes["tl"][i] = nodes["fl"][i] = 1
            roots.append(i)
        else:
            roots.append(build(int(rng.integers(1, 4))))
    attrs = dict(
        tree_roots=roots, nodes_featureids=nodes["feat"],
        nodes_splits=numpy_helper.from_array(np.array(nodes["split"], dtype)),
        nodes_modes=numpy_helper.from_array(np.array(nodes["mode"], np.uint8)),
        nodes_truenodeids=nodes["t"], nodes_trueleafs=nodes["tl"],
        nodes_falsenodeids=nodes["f"], nodes_falseleafs=nodes["fl"],
        nodes_missing_value_tracks_true=nodes["miss"], leaf_targetids=leaf_t,
        leaf_weights=numpy_helper.from_array(np.array(leaf_w, dtype)), n_targets=n_targets,
        aggregate_function=int(rng.integers(0, 4)), post_transform=int(rng.integers(0, 5)))
    if members:
        attrs["membership_values"] = numpy_helper.from_array(np.array(members, dtype))
    X = rng.choice(np.r_[values, -2.0, -1.0, 0.0, 1.0, 3.0, np.nan], size=(9, 3)).astype(dtype)
    if members:  # onnxruntime tests set membership on integral values only
        X = np.where(np.isnan(X), X, np.round(X))
    return attrs, X


@pytest.mark.parametrize("seed", range(8))
def test_random_tree_ensembles_v5(seed):
    """TreeEnsemble-5 (BRANCH_MEMBER included) against onnxruntime. onnxruntime swaps the
    codes of SOFTMAX (1) and LOGISTIC (2) against the specification; onnxrun follows the
    specification, so onnxruntime is given the other code."""
    rng = np.random.default_rng(100 + seed)
    for _ in range(8):
        dtype = np.float32 if rng.random() < 0.6 else np.float64
        attrs, X = _random_v5(rng, int(rng.integers(1, 4)), dtype)
        xt = F if dtype == np.float32 else D
        m = ml_model(ml_node("TreeEnsemble", **attrs), [("X", xt)], [("Y", xt)], ml_opset=5,
                     opset=21)
        post = attrs["post_transform"]
        m_ort = m
        if post in (1, 2):
            m_ort = ml_model(ml_node("TreeEnsemble", **dict(attrs, post_transform=3 - post)),
                             [("X", xt)], [("Y", xt)], ml_opset=5, opset=21)
        assert_same(run_onnxrun(m, {"X": X}), run_ort(m_ort, {"X": X}), rtol=1e-4, atol=1e-5)


def _v5_stump(**extra):
    attrs = dict(tree_roots=[0], nodes_featureids=[0],
                 nodes_splits=numpy_helper.from_array(np.array([0.0], np.float32)),
                 nodes_modes=numpy_helper.from_array(np.array([0], np.uint8)),
                 nodes_truenodeids=[0], nodes_trueleafs=[1], nodes_falsenodeids=[1],
                 nodes_falseleafs=[1], leaf_targetids=[0, 1],
                 leaf_weights=numpy_helper.from_array(np.array([1.0, -1.0], np.float32)),
                 n_targets=2)
    attrs.update(extra)
    return ml_model(ml_node("TreeEnsemble", **attrs), [("X", F)], [("Y", F)], ml_opset=5,
                    opset=21)


def test_tree_ensemble_v5_post_transform_codes_follow_the_spec():
    X = np.array([[-1.0], [1.0]], np.float32)
    scores = np.array([[1.0, 0.0], [0.0, -1.0]])
    soft = np.exp(scores) / np.exp(scores).sum(axis=1, keepdims=True)
    np.testing.assert_allclose(run_onnxrun(_v5_stump(post_transform=1), {"X": X})[0], soft,
                               rtol=1e-6)
    np.testing.assert_allclose(run_onnxrun(_v5_stump(post_transform=2), {"X": X})[0],
                               1 / (1 + np.exp(-scores)), rtol=1e-6)


def test_tree_ensemble_v5_set_membership_is_exact():
    # spec semantics: x is a member only if it equals one of the values (onnxruntime's
    # integer fast path also accepts some non-integral x)
    m = _v5_stump(nodes_modes=numpy_helper.from_array(np.array([6], np.uint8)),
                  membership_values=numpy_helper.from_array(
                      np.array([1.0, 3.0, 70.0, np.nan], np.float32)),
                  nodes_missing_value_tracks_true=[1])
    X = np.array([[1.0], [1.5], [3.0], [3.7], [70.0], [np.nan], [2.0]], np.float32)
    got = run_onnxrun(m, {"X": X})[0]
    np.testing.assert_array_equal(got[:, 0], [1, 0, 1, 0, 1, 1, 0])


def test_tree_ensemble_errors():
    bad_child = dict(_ONE_SPLIT, nodes_truenodeids=[5, 0, 0])
    node = ml_node("TreeEnsembleRegressor", **bad_child, n_targets=1, target_treeids=[0],
                   target_nodeids=[1], target_ids=[0], target_weights=[1.0])
    with pytest.raises(Exception, match="Unable to find node"):
        run_onnxrun(ml_model(node, [("X", F)], [("Y", F)]), {"X": np.zeros((1, 1), np.float32)})
    node = ml_node("TreeEnsembleRegressor", **_ONE_SPLIT, n_targets=1, target_treeids=[0],
                   target_nodeids=[1], target_ids=[0], target_weights=[1.0],
                   base_values=[1.0, 2.0])
    check_errors_like_ort(ml_model(node, [("X", F)], [("Y", F)]),
                          {"X": np.zeros((1, 1), np.float32)})
    node = ml_node("TreeEnsembleRegressor", **dict(_ONE_SPLIT, nodes_featureids=[3, 0, 0]),
                   n_targets=1, target_treeids=[0], target_nodeids=[1], target_ids=[0],
                   target_weights=[1.0])
    check_errors_like_ort(ml_model(node, [("X", F)], [("Y", F)]),
                          {"X": np.zeros((2, 2), np.float32)})


def test_tree_ensemble_large_batch_matches_onnxruntime():
    """Deep and shallow forests on a batch large enough to be evaluated in several chunks."""
    rng = np.random.default_rng(7)
    attrs, leaves = _random_forest_attrs(rng, 40, 6, 9, ["BRANCH_LEQ"],
                                         np.round(rng.normal(size=50), 2))
    node = ml_node("TreeEnsembleClassifier", outputs=("Y", "Z"), **attrs,
                   class_treeids=[t for t, _ in leaves for _ in range(3)],
                   class_nodeids=[n for _, n in leaves for _ in range(3)],
                   class_ids=[k for _ in leaves for k in range(3)],
                   class_weights=list(np.round(rng.random(3 * len(leaves)), 3)),
                   classlabels_int64s=[0, 1, 2], post_transform="SOFTMAX")
    X = rng.normal(size=(5000, 6)).astype(np.float32)
    check_vs_ort(ml_model(node, [("X", F)], [("Y", I64), ("Z", F)]), {"X": X})


# -- linear models and SVMs ---------------------------------------------------------------------

_POSTS = ["NONE", "LOGISTIC", "SOFTMAX", "SOFTMAX_ZERO"]


@pytest.mark.parametrize("post", _POSTS + ["PROBIT"])
@pytest.mark.parametrize("n_scores,labels", [(1, [3, 7]), (1, ["a", "b"]), (2, [4, 5]),
                                             (3, [1, 2, 3]), (3, ["x", "y", "z"])])
def test_linear_classifier(n_scores, labels, post):
    if post == "PROBIT" and n_scores == 1:
        pytest.skip("onnxruntime leaves half of that output uninitialized")
    rng = np.random.default_rng(n_scores)
    kw = dict(coefficients=list(np.round(rng.normal(size=3 * n_scores), 2)),
              intercepts=list(np.round(rng.normal(size=n_scores), 2)), post_transform=post)
    strings = isinstance(labels[0], str)
    kw["classlabels_strings" if strings else "classlabels_ints"] = labels
    m = ml_model(ml_node("LinearClassifier", outputs=("Y", "Z"), **kw), [("X", F)],
                 [("Y", S if strings else I64), ("Z", F)])
    check_vs_ort(m, {"X": rng.normal(size=(6, 3)).astype(np.float32)})


def test_linear_classifier_input_types_and_errors():
    node = ml_node("LinearClassifier", outputs=("Y", "Z"), coefficients=[1.0, 2, 3, -1, 0.5, 2],
                   intercepts=[0.1, -0.2], classlabels_ints=[0, 1])
    X = np.array([[1, -2, 3], [0, 4, -1]])
    for dtype, xt in ((np.float64, D), (np.int64, I64), (np.int32, I32)):
        check_vs_ort(ml_model(node, [("X", xt)], [("Y", I64), ("Z", F)]),
                     {"X": X.astype(dtype)})
    one_label = ml_node("LinearClassifier", outputs=("Y", "Z"), coefficients=[1.0, 2.0],
                        intercepts=[0.5], classlabels_ints=[5])
    check_errors_like_ort(ml_model(one_label, [("X", F)], [("Y", I64), ("Z", F)]),
                          {"X": np.ones((1, 2), np.float32)})


def test_string_categories_match_exactly_trailing_nuls_included():
    """numpy's str arrays drop trailing NULs; onnxruntime's std::string keys keep them."""
    node = ml_node("OneHotEncoder", cats_strings=["A\0A", "B", "C\0"], zeros=1)
    m = ml_model(node, [("X", S)], [("Y", F)])
    for items in (["A\0A", "B", "C\0"], ["A\0A\0", "B\0", "C"], ["A", "A\0A", "C\0\0"]):
        check_vs_ort(m, {"X": np.array([items], dtype=object)})


def test_map_input_keys_must_have_the_map_key_type():
    node = ml_node("DictVectorizer", int64_vocabulary=[0, 1, 2])
    m_type = helper.make_map_type_proto(TensorProto.INT64, helper.make_tensor_type_proto(
        TensorProto.FLOAT, []))
    graph = helper.make_graph([node], "g", [helper.make_value_info("X", m_type)],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                helper.make_opsetid("ai.onnx.ml", 1)])
    for x in ({0: 1.5, 2: -3.0}, {np.int64(1): np.float32(2.0)}, {np.int32(2): np.float64(1)}):
        check_vs_ort(m, {"X": x})
    for engine in (onnxrun, ort):
        with pytest.raises(RuntimeError, match="Unexpected key type  <class 'str'>, it cannot "
                                               "be linked to C type int64_t"):
            engine.InferenceSession(m.SerializeToString()).run(None, {"X": {0: 1.0, "a": 2.0}})


def test_linear_models_with_more_coefficients_than_input_features():
    """onnxruntime reads the coefficients as [targets, the input's features] and uses the
    leading values (its iris example model holds 4 features' weights and takes 2 columns);
    too few coefficients for the input is an error in both."""
    coefficients = [0.4, 1.4, -2.1, -1.0, 0.6, -1.7, 0.5, -1.4, -1.7, -1.2, 2.2, 2.4]
    node = ml_node("LinearClassifier", outputs=("Y", "Z"), coefficients=coefficients,
                   intercepts=[0.25, 0.58, -0.94], classlabels_ints=[0, 1, 2],
                   post_transform="LOGISTIC")
    m = ml_model(node, [("X", F)], [("Y", I64), ("Z", F)])
    X = np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], np.float32)
    check_vs_ort(m, {"X": X})
    check_vs_ort(m, {"X": np.ones((2, 4), np.float32)})
    with pytest.raises(onnxrun.RuntimeException, match="need 15 coefficients"):
        run_onnxrun(m, {"X": np.ones((2, 5), np.float32)})
    reg = ml_node("LinearRegressor", coefficients=coefficients[:6], intercepts=[0.5, -1.0],
                  targets=2)
    check_vs_ort(ml_model(reg, [("X", F)], [("Y", F)]), {"X": X})


@pytest.mark.parametrize("post", _POSTS + ["PROBIT"])
@pytest.mark.parametrize("targets", [1, 2])
def test_linear_regressor(targets, post):
    rng = np.random.default_rng(targets)
    node = ml_node("LinearRegressor", coefficients=list(rng.normal(size=3 * targets)),
                   intercepts=list(rng.normal(size=targets)), targets=targets,
                   post_transform=post)
    check_vs_ort(ml_model(node, [("X", F)], [("Y", F)]),
                 {"X": rng.normal(size=(5, 3)).astype(np.float32)})


def _svc_attrs(kernel, proba, n_classes):
    from skl2onnx import to_onnx
    from sklearn.svm import SVC

    X, y = data("iris_std")
    y = y if n_classes == 3 else (y > 0).astype(int)
    model = SVC(kernel=kernel, probability=proba, random_state=0).fit(X, y)
    onx = to_onnx(model, X[:1], options={"zipmap": False})
    svm_node = next(n for n in onx.graph.node if n.op_type == "SVMClassifier")
    return svm_node, X


@needs_skl2onnx
@pytest.mark.parametrize("kernel", ["rbf", "poly"])
@pytest.mark.parametrize("proba", [False, True])
@pytest.mark.parametrize("n_classes", [2, 3])
def test_svm_classifier_post_transforms_and_string_labels(kernel, proba, n_classes):
    svm_node, X = _svc_attrs(kernel, proba, n_classes)
    for post in _POSTS:
        node = ml_node("SVMClassifier", outputs=("Y", "Z"))
        node.attribute.extend(a for a in svm_node.attribute
                              if a.name not in ("post_transform", "classlabels_ints"))
        node.attribute.append(helper.make_attribute("post_transform", post))
        node.attribute.append(helper.make_attribute(
            "classlabels_strings", [f"c{i}" for i in range(n_classes)]))
        m = ml_model(node, [("X", F)], [("Y", S), ("Z", F)])
        check_vs_ort(m, {"X": X}, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("n_classes", [2, 3])
@pytest.mark.parametrize("post", ["NONE", "LOGISTIC", "SOFTMAX"])
def test_svm_classifier_liblinear_form(n_classes, post):
    rng = np.random.default_rng(n_classes)
    for coef, prob in ((rng.normal(size=4 * n_classes), {}),
                       (np.abs(rng.normal(size=4 * n_classes)), dict(prob_a=[1.0],
                                                                     prob_b=[0.5]))):
        node = ml_node("SVMClassifier", outputs=("Y", "Z"), coefficients=list(coef), rho=[0.3],
                       classlabels_ints=list(range(n_classes)), kernel_type="LINEAR",
                       kernel_params=[0.1, 0.0, 3.0], post_transform=post, **prob)
        check_vs_ort(ml_model(node, [("X", F)], [("Y", I64), ("Z", F)]),
                     {"X": rng.normal(size=(20, 4)).astype(np.float32)})


@needs_skl2onnx
def test_svm_one_class_and_double_input():
    from skl2onnx import to_onnx
    from sklearn.svm import OneClassSVM

    X, _ = data("iris_std")
    onx = to_onnx(OneClassSVM().fit(X), X[:1])
    check_vs_ort(onx, {onx.graph.input[0].name: X}, rtol=1e-4, atol=1e-4)
    svm_node, _ = _svc_attrs("rbf", True, 3)
    node = ml_node("SVMClassifier", outputs=("Y", "Z"))
    node.attribute.extend(svm_node.attribute)
    m = ml_model(node, [("X", D)], [("Y", I64), ("Z", F)])
    check_vs_ort(m, {"X": X.astype(np.float64)}, rtol=1e-4, atol=1e-4)


# -- preprocessing ------------------------------------------------------------------------------

_X = np.random.default_rng(0).normal(size=(4, 3)).astype(np.float32)
_TYPED = [(_X, F), (_X.astype(np.float64), D), ((_X * 5).astype(np.int64), I64),
          ((_X * 5).astype(np.int32), I32)]


def _one(op, X, xt, yt, ml_opset=1, **attrs):
    return ml_model(ml_node(op, **attrs), [("X", xt)], [("Y", yt)], ml_opset=ml_opset), {"X": X}


@pytest.mark.parametrize("X,xt", _TYPED, ids=["float", "double", "int64", "int32"])
def test_scaler_and_normalizer(X, xt):
    check_vs_ort(*_one("Scaler", X, xt, F, offset=[0.5, -1.0, 2.0], scale=[2.0, 0.5, -1.0]))
    check_vs_ort(*_one("Scaler", X, xt, F, offset=[0.5], scale=[3.0]))
    for norm in ("MAX", "L1", "L2"):
        check_vs_ort(*_one("Normalizer", X, xt, F, norm=norm))
        check_vs_ort(*_one("Normalizer", X[0], xt, F, norm=norm))
        check_vs_ort(*_one("Normalizer", X * 0, xt, F, norm=norm))
    check_errors_like_ort(*_one("Normalizer", X.reshape(2, 2, 3), xt, F, norm="L1"))


def test_binarizer_and_imputer():
    check_vs_ort(*_one("Binarizer", _X, F, F, threshold=0.2))
    check_vs_ort(*_one("Binarizer", _X, F, F))
    check_errors_like_ort(*_one("Binarizer", np.array([1, np.nan], np.float32), F, F))
    Xn = _X.copy()
    Xn[0, 1] = Xn[2, 0] = np.nan
    for values in ([1.0, 2.0, 3.0], [7.0]):
        check_vs_ort(*_one("Imputer", Xn, F, F, imputed_value_floats=values,
                           replaced_value_float=np.nan))
    check_vs_ort(*_one("Imputer", np.round(_X), F, F, imputed_value_floats=[7.0, 8.0, 9.0],
                       replaced_value_float=0.0))
    Xi = np.array([[1, 0, 3], [0, 5, 0]], np.int64)
    for values in ([7, 8, 9], [7]):
        check_vs_ort(*_one("Imputer", Xi, I64, I64, imputed_value_int64s=values,
                           replaced_value_int64=0))


def test_one_hot_encoder():
    ints = np.array([[1, 3], [4, 9]], np.int64)
    check_vs_ort(*_one("OneHotEncoder", ints, I64, F, cats_int64s=[1, 2, 3, 4, 2]))
    check_errors_like_ort(*_one("OneHotEncoder", ints, I64, F, cats_int64s=[1, 2, 3, 4],
                                zeros=0))
    floats = np.array([[1.7, 3.2], [-4.5, 2.0]])
    check_vs_ort(*_one("OneHotEncoder", floats.astype(np.float32), F, F, cats_int64s=[1, 2, -4]))
    check_vs_ort(*_one("OneHotEncoder", floats, D, F, cats_int64s=[1, 2, 3, -4]))
    strings = np.array([["a", "b"], ["c", "zz"]], dtype=object)
    check_vs_ort(*_one("OneHotEncoder", strings, S, F, cats_strings=["a", "b", "c", "a"]))


_STR = np.array(["a", "b", "q", "a"], dtype=object)
_LABEL_ENCODERS = [
    (1, _STR, S, I64, dict(classes_strings=["a", "b", "c", "a"], default_int64=-5)),
    (1, np.array([0, 2, 7]), I64, S, dict(classes_strings=["a", "b", "c"], default_string="z")),
    (2, _STR, S, I64, dict(keys_strings=["a", "b", "a"], values_int64s=[1, 2, 3])),
    (2, _STR, S, F, dict(keys_strings=["a", "b"], values_floats=[1.5, 2.5])),
    (2, _STR, S, S, dict(keys_strings=["a", "b"], values_strings=["x", "y"], default_string="d")),
    (2, np.array([1, 5, 9]), I64, S, dict(keys_int64s=[1, 5], values_strings=["x", "y"])),
    (2, np.array([1, 5, 9]), I64, F, dict(keys_int64s=[1, 5], values_floats=[0.5, 0.25])),
    (2, np.array([1, 5, 9]), I64, I64, dict(keys_int64s=[1, 5], values_int64s=[10, 50],
                                             default_int64=7)),
    (2, np.array([1.5, 5, np.nan], np.float32), F, I64, dict(keys_floats=[1.5, 5.0],
                                                             values_int64s=[10, 50])),
    (2, np.array([1.5, 5, 9], np.float32), F, S, dict(keys_floats=[1.5, 5.0],
                                                      values_strings=["p", "q"])),
    (4, np.array([1.5, 5, np.nan, 2], np.float32), F, I64,
     dict(keys_floats=[1.5, 5.0, np.nan], values_int64s=[10, 50, 99])),
    (4, np.array([1, 5, 9]), I64, F, dict(keys_int64s=[1, 5], values_floats=[0.5, 0.25])),
    (4, np.array([1.5, 5, 9]), D, D,
     dict(keys_tensor=numpy_helper.from_array(np.array([1.5, 5.0])),
          values_tensor=numpy_helper.from_array(np.array([0.1, 0.2])),
          default_tensor=numpy_helper.from_array(np.array([-3.0])))),
    (4, np.array([1.5, 5, 9]), D, S,
     dict(keys_tensor=numpy_helper.from_array(np.array([1.5, 5.0])), values_strings=["u", "v"])),
    (4, _STR, S, TensorProto.INT16,
     dict(keys_strings=["a", "b"], values_tensor=numpy_helper.from_array(np.array([3, 4],
                                                                                  np.int16)),
          default_tensor=numpy_helper.from_array(np.array([-9], np.int16)))),
    (4, np.array([1, 5, 9]), I64, D,
     dict(keys_int64s=[1, 5], values_tensor=numpy_helper.from_array(np.array([3.5, 4.5])))),
]


@pytest.mark.parametrize("version,X,xt,yt,attrs", _LABEL_ENCODERS)
def test_label_encoder(version, X, xt, yt, attrs):
    check_vs_ort(*_one("LabelEncoder", X, xt, yt, ml_opset=version, **attrs))


def test_category_mapper():
    check_vs_ort(*_one("CategoryMapper", _STR, S, I64, cats_strings=["a", "b", "a"],
                       cats_int64s=[1, 2, 3]))
    check_vs_ort(*_one("CategoryMapper", np.array([1, 2, 9]), I64, S,
                       cats_strings=["a", "b", "c"], cats_int64s=[1, 2, 1], default_string="z"))


@pytest.mark.parametrize("X,xt", _TYPED + [(np.array([["a", "b", "c"]], dtype=object), S)],
                         ids=["float", "double", "int64", "int32", "string"])
def test_array_feature_extractor(X, xt):
    m = ml_model(ml_node("ArrayFeatureExtractor", inputs=("X", "I")), [("X", xt), ("I", I64)],
                 [("Y", xt)])
    check_vs_ort(m, {"X": X, "I": np.array([2, 0], np.int64)})
    check_vs_ort(m, {"X": X[0], "I": np.array([1], np.int64)})  # 1-D: one [1, n] row
    check_errors_like_ort(m, {"X": X, "I": np.array([3], np.int64)})


def test_feature_vectorizer():
    m = ml_model(ml_node("FeatureVectorizer", inputs=("A", "B", "C"), inputdimensions=[2, 3, 1]),
                 [("A", F), ("B", F), ("C", F)], [("Y", F)])
    check_vs_ort(m, {"A": _X[:, :2], "B": np.ones((4, 2), np.float32),  # padded with zeros
                     "C": np.arange(8, dtype=np.float32).reshape(4, 2)})  # truncated


@pytest.mark.parametrize("labels", [dict(classlabels_strings=["b", "a", "c"]),
                                    dict(classlabels_int64s=[5, 3, 9, 3])])
def test_zipmap(labels):
    key = S if "classlabels_strings" in labels else I64
    out = helper.make_sequence_type_proto(helper.make_map_type_proto(
        key, helper.make_tensor_type_proto(F, None)))
    m = ml_model(ml_node("ZipMap", **labels), [("X", F)], [("Y", out)])
    n = len(next(iter(labels.values())))
    X = np.random.default_rng(1).random((3, n)).astype(np.float32)
    for feed in (X, X[0]):
        got, want = run_onnxrun(m, {"X": feed}), run_ort(m, {"X": feed})
        assert got == want  # same keys in the same (sorted) order, same Python floats
    check_errors_like_ort(m, {"X": X[:, :2]})


def _map_model(op, key, value, yt, **attrs):
    map_type = helper.make_map_type_proto(key, helper.make_tensor_type_proto(value, None))
    return ml_model(ml_node(op, **attrs), [("X", map_type)], [("Y", yt)])


def test_dict_vectorizer():
    m = _map_model("DictVectorizer", S, F, F, string_vocabulary=["a", "c", "b", "zz"])
    check_vs_ort(m, {"X": {"a": 1.5, "b": 2.0, "q": 3.0}})
    m = _map_model("DictVectorizer", I64, F, F, int64_vocabulary=[5, 1, 7])
    check_vs_ort(m, {"X": {1: 1.5, 5: 2.0, 9: 3.0}})
    # maps onnxruntime's Python binding cannot take
    m = _map_model("DictVectorizer", I64, S, S, int64_vocabulary=[5, 1, 7])
    np.testing.assert_array_equal(run_onnxrun(m, {"X": {1: "x", 5: "y"}})[0], [["y", "x", ""]])
    m = _map_model("DictVectorizer", S, D, D, string_vocabulary=["a", "b"])
    got = run_onnxrun(m, {"X": {"b": 2.5}})[0]
    assert got.dtype == np.float64 and got.tolist() == [[0.0, 2.5]]


def test_cast_map():
    m = _map_model("CastMap", I64, F, F, cast_to="TO_FLOAT")
    check_vs_ort(m, {"X": {3: 1.5, 1: 2.0}})
    m = _map_model("CastMap", I64, F, I64, cast_to="TO_INT64", map_form="SPARSE", max_map=5)
    check_vs_ort(m, {"X": {3: 1.5, 1: -2.7, 7: 3.0}})
    m = _map_model("CastMap", I64, F, S, cast_to="TO_STRING")
    check_vs_ort(m, {"X": {3: 1.5, 1: 2.0}})
    m = _map_model("CastMap", I64, S, I64, cast_to="TO_INT64", map_form="SPARSE", max_map=4)
    np.testing.assert_array_equal(run_onnxrun(m, {"X": {3: "15", 0: "-2"}})[0], [[-2, 0, 0, 15]])
    m = _map_model("CastMap", I64, S, S, cast_to="TO_STRING", map_form="SPARSE", max_map=3)
    assert run_onnxrun(m, {"X": {2: "ab"}})[0].tolist() == [["0.f", "0.f", "ab"]]


# -- conformance --------------------------------------------------------------------------------


def _ml_conformance_cases():
    import onnx.backend.test.case.node as node_cases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            # only the ai.onnx.ml case modules: collecting every case takes ~10 s
            import onnx.backend.test.case.node.ai_onnx_ml as ml_cases
            from onnx.backend.test.case.utils import import_recursive

            import_recursive(ml_cases)
            cases = list(node_cases._NodeTestCases)
        except (ImportError, AttributeError):  # another onnx layout
            cases = node_cases.collect_testcases(None)
    return [c for c in cases if any(n.domain == "ai.onnx.ml" for n in c.model.graph.node)]


_CONFORMANCE = _ml_conformance_cases()


@pytest.mark.parametrize("case", _CONFORMANCE, ids=[c.name for c in _CONFORMANCE])
def test_ml_conformance(case):
    names = [i.name for i in case.model.graph.input]
    session = onnxrun.InferenceSession(case.model.SerializeToString())
    for inputs, outputs in case.data_sets:
        got = session.run(None, dict(zip(names, inputs, strict=True)))
        for g, w in zip(got, outputs, strict=True):
            w = np.asarray(w)
            assert g.dtype == w.dtype and g.shape == w.shape
            if w.dtype == object:
                assert (g == w).all()
            else:
                np.testing.assert_allclose(g, w, rtol=case.rtol, atol=case.atol)
