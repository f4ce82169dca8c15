"""ONNX-ML (``ai.onnx.ml``) models as scikit-learn exports them, against onnxruntime
(``forge_onnx/converters/ml.py``).

Real exports: skl2onnx's conversion of scikit-learn models trained here on the iris and digits data (linear
models, trees and forests, gradient boosting, scalers, normalizers, imputers, pipelines), loaded with their
batch left dynamic and run on held-out rows with noise. Then hand-built models for what exporters write
less often: every branch mode, missing values, each post transform, float64 and integer inputs, and the
binary-classifier rules onnxruntime follows. ZipMap's list of maps is compared as the tensor Forge returns.
"""

from __future__ import annotations

import logging
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto
from onnx import helper as oh

import forge
from forge_core.errors import ModelImportError

skl2onnx = pytest.importorskip("skl2onnx", reason="the test extra installs skl2onnx (./scripts/setup)")
from sklearn import datasets, ensemble, impute, linear_model, pipeline, preprocessing, svm, tree  # noqa: E402

ML = oh.make_opsetid("ai.onnx.ml", 1)


def _reference(model: onnx.ModelProto, x: np.ndarray) -> list[np.ndarray]:
    """onnxruntime's outputs, a ZipMap's list of maps as the (rows, labels) array of its values."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1  # trees summed in tree order
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    outputs = []
    for value in session.run(None, {session.get_inputs()[0].name: x}):
        if isinstance(value, list):
            keys = list(value[0])
            value = np.array([[row[k] for k in keys] for row in value], np.float32)
        outputs.append(np.asarray(value))
    return outputs


def _forge(model: onnx.ModelProto, x: np.ndarray) -> list[np.ndarray]:
    result = forge.from_onnx(model).get_inference_function()(x)
    return [np.asarray(r) for r in (result if isinstance(result, list) else [result])]


def _assert_same(got: list[np.ndarray], want: list[np.ndarray], atol: float = 1e-5) -> None:
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.dtype == w.dtype and g.shape == w.shape, (i, g.dtype, g.shape, w.dtype, w.shape)
        if w.dtype.kind in "iu":
            np.testing.assert_array_equal(g, w, err_msg=f"output {i}")
        else:
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=atol, err_msg=f"output {i}")


# -- scikit-learn's exports -----------------------------------------------------------------------------------

def _iris() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    x, y = datasets.load_iris(return_X_y=True)
    rng = np.random.default_rng(0)
    held_out = x + rng.normal(0.0, 0.3, x.shape)  # rows off the training points, ties at thresholds unlikely
    return x.astype(np.float32), y, held_out.astype(np.float32)


def _digits() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    x, y = datasets.load_digits(return_X_y=True)
    rng = np.random.default_rng(1)
    return x[:1200].astype(np.float32), y[:1200], (x[1200:] + rng.normal(0, 0.5, x[1200:].shape)).astype(np.float32)


ESTIMATORS = {
    "logistic-regression-pipeline": lambda: pipeline.make_pipeline(preprocessing.StandardScaler(),
                                                                   linear_model.LogisticRegression(max_iter=500)),
    "logistic-regression-binary": lambda: linear_model.LogisticRegression(max_iter=500),
    "linear-svc": lambda: svm.LinearSVC(),
    "random-forest": lambda: ensemble.RandomForestClassifier(n_estimators=7, max_depth=5, random_state=0),
    "random-forest-binary": lambda: ensemble.RandomForestClassifier(n_estimators=7, max_depth=5, random_state=0),
    "extra-trees": lambda: ensemble.ExtraTreesClassifier(n_estimators=5, max_depth=6, random_state=0),
    "gradient-boosting": lambda: ensemble.GradientBoostingClassifier(n_estimators=6, random_state=0),
    "gradient-boosting-binary": lambda: ensemble.GradientBoostingClassifier(n_estimators=6, random_state=0),
    "decision-tree": lambda: tree.DecisionTreeClassifier(random_state=0),
    "imputer-minmax-normalizer": lambda: pipeline.make_pipeline(
        impute.SimpleImputer(), preprocessing.MinMaxScaler(), preprocessing.Normalizer(),
        linear_model.LogisticRegression(max_iter=500)),
    "linear-regression": lambda: linear_model.LinearRegression(),
    "ridge-two-targets": lambda: linear_model.Ridge(),
    "random-forest-regressor": lambda: ensemble.RandomForestRegressor(n_estimators=4, max_depth=6, random_state=0),
    "random-forest-regressor-two-targets": lambda: ensemble.RandomForestRegressor(n_estimators=3, max_depth=4,
                                                                                  random_state=0),
    "gradient-boosting-regressor": lambda: ensemble.GradientBoostingRegressor(n_estimators=5, random_state=0),
    "digits-random-forest": lambda: ensemble.RandomForestClassifier(n_estimators=10, max_depth=8, random_state=0),
    "digits-logistic-regression": lambda: pipeline.make_pipeline(preprocessing.StandardScaler(),
                                                                 linear_model.LogisticRegression(max_iter=300)),
}


REGRESSORS = {"linear-regression", "ridge-two-targets", "random-forest-regressor",
              "random-forest-regressor-two-targets", "gradient-boosting-regressor"}


def _fit(name: str):
    x, y, held_out = (_digits() if name.startswith("digits") else _iris())
    if name.endswith("binary"):
        y = (y > 0).astype(np.int64)
    elif name in REGRESSORS:
        y = x[:, :2] if "two-targets" in name else x[:, 0]
        x = x[:, 1:]
        held_out = held_out[:, 1:]
    estimator = ESTIMATORS[name]()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # convergence warnings of few iterations
        estimator.fit(x, y)
    return estimator, x, held_out


@pytest.mark.parametrize("name", list(ESTIMATORS))
def test_scikit_learn_export_gives_onnxruntimes_numbers_at_a_dynamic_batch(name):
    estimator, x, held_out = _fit(name)
    model = skl2onnx.to_onnx(estimator, x[:1])
    ir = forge.from_onnx(model)
    assert ir.input_shapes[0][0] == -1, ir.input_shapes  # the batch stays dynamic
    run = ir.get_inference_function()
    for rows in (held_out, held_out[:1], held_out[:7]):
        got = run(rows)
        _assert_same([np.asarray(r) for r in (got if isinstance(got, list) else [got])], _reference(model, rows))


SVMS = {
    "svc-rbf": lambda: svm.SVC(kernel="rbf", gamma=0.5),
    "svc-poly-binary": lambda: svm.SVC(kernel="poly", degree=3, gamma=0.3, coef0=0.5),
    "svc-sigmoid": lambda: svm.SVC(kernel="sigmoid", gamma=0.05, coef0=0.1),
    "nu-svc-linear-binary": lambda: svm.NuSVC(kernel="linear", nu=0.3),
    "digits-svc-rbf": lambda: svm.SVC(kernel="rbf", gamma=0.001),
    "svr-rbf": lambda: svm.SVR(kernel="rbf", gamma=0.5),
    "svr-poly": lambda: svm.SVR(kernel="poly", degree=2, gamma=0.3, coef0=1.0),
    "nu-svr-linear": lambda: svm.NuSVR(kernel="linear"),
    "one-class-svm": lambda: svm.OneClassSVM(gamma=0.5),
}


@pytest.mark.parametrize("name", list(SVMS))
def test_scikit_learn_svm_gives_onnxruntimes_labels_and_scores_at_a_dynamic_batch(name):
    """SVMClassifier (libsvm's pairwise decision values and votes, every kernel; two classes too) and
    SVMRegressor (one-class included): labels identical, scores within 1e-4 of their scale (float32 sums of
    kernel values that cancel, in another order than onnxruntime's GEMM)."""
    x, y, held_out = _digits() if name.startswith("digits") else _iris()
    if name.endswith("binary"):
        y = (y > 0).astype(np.int64)
    elif "svr" in name or "one-class" in name:
        x, held_out, y = x[:, 1:], held_out[:, 1:], x[:, 0]
    estimator = SVMS[name]().fit(x, y)
    model = skl2onnx.to_onnx(estimator, x[:1])
    assert any(node.op_type.startswith("SVM") for node in model.graph.node)
    ir = forge.from_onnx(model)
    assert ir.input_shapes[0][0] == -1, ir.input_shapes
    run = ir.get_inference_function()
    for rows in (held_out, held_out[:1], held_out[:5]):
        got = run(rows)
        got = [np.asarray(r) for r in (got if isinstance(got, list) else [got])]
        want = _reference(model, rows)
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert g.dtype == w.dtype and g.shape == w.shape
            if w.dtype.kind in "iu":
                np.testing.assert_array_equal(g, w)
            else:
                np.testing.assert_allclose(g, w, rtol=0, atol=1e-4 * max(1.0, float(np.abs(w).max())))


def test_an_svm_with_probabilities_is_refused_naming_why():
    x, y, _ = _iris()
    model = skl2onnx.to_onnx(svm.SVC(probability=True, random_state=0).fit(x, y), x[:1])
    with pytest.raises(ModelImportError, match="probability=True"):
        forge.from_onnx(model)


def test_scikit_learn_pipeline_compiles_and_runs_from_its_artifact(tmp_path):
    estimator, x, held_out = _fit("imputer-minmax-normalizer")
    model = skl2onnx.to_onnx(estimator, x[:1])
    held_out = held_out.copy()
    held_out[::5, 2] = np.nan  # SimpleImputer's missing values
    forge.from_onnx(model).compile(output_path=tmp_path / "artifact")
    got = forge.Runtime(tmp_path / "artifact").infer(held_out)
    _assert_same([np.asarray(g) for g in got], _reference(model, held_out))


def test_zip_map_says_its_output_is_the_probabilities_tensor(caplog):
    estimator, x, held_out = _fit("random-forest")
    model = skl2onnx.to_onnx(estimator, x[:1])
    with caplog.at_level(logging.WARNING, logger="forge.onnx"):
        ir = forge.from_onnx(model)
    said = [r.getMessage() for r in caplog.records if "ZipMap" in r.getMessage()]
    assert said and "probabilities tensor (rows, 3)" in said[0] and "[0, 1, 2]" in said[0], said
    assert ir.output_shapes[1][1:] == (3,)


# -- hand-built trees -----------------------------------------------------------------------------------------

def _tree_model(op: str, attrs: dict | list[dict], x_type: int = TensorProto.FLOAT, features: int = 3,
                outputs: tuple[tuple[str, int], ...] = (("label", TensorProto.INT64), ("scores", TensorProto.FLOAT)),
                ) -> onnx.ModelProto:
    """One ``op`` node on the input ``x`` for each attribute set: the cases of a test in one model (one compile),
    node i's outputs named ``<output>_<i>``."""
    cases = attrs if isinstance(attrs, list) else [attrs]
    nodes = [oh.make_node(op, ["x"], [f"{name}_{i}" for name, _ in outputs], domain="ai.onnx.ml", name=f"case_{i}",
                          **case) for i, case in enumerate(cases)]
    graph = oh.make_graph(nodes, "cases", [oh.make_tensor_value_info("x", x_type, ["n", features])],
                          [oh.make_tensor_value_info(f"{name}_{i}", t, None)
                           for i in range(len(cases)) for name, t in outputs])
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17), ML], ir_version=9)


def _two_trees(modes: list[str], tracks: list[int] | None = None) -> dict:
    """Two trees of depth 2 (tree 0 listed from node id 3 down: its root is its first node, not node 0), with
    the given branch modes on their three branch nodes each, and weights for three classes."""
    rng = np.random.default_rng(7)
    attrs = {
        "nodes_treeids": [0] * 7 + [1] * 7,
        "nodes_nodeids": [3, 4, 5, 0, 1, 2, 6] + [0, 1, 2, 3, 4, 5, 6],
        # tree 0: 3 -> (4, 5); 4 -> (0, 1); 5 -> (2, 6) ; tree 1: 0 -> (1, 2); 1 -> (3, 4); 2 -> (5, 6)
        "nodes_truenodeids": [4, 0, 2, 0, 0, 0, 0] + [1, 3, 5, 0, 0, 0, 0],
        "nodes_falsenodeids": [5, 1, 6, 0, 0, 0, 0] + [2, 4, 6, 0, 0, 0, 0],
        "nodes_featureids": [0, 1, 2, 0, 0, 0, 0] + [2, 0, 1, 0, 0, 0, 0],
        "nodes_values": [0.1, -0.3, 0.5, 0, 0, 0, 0] + [0.0, 0.2, -0.1, 0, 0, 0, 0],
        "nodes_modes": [modes[0], modes[1 % len(modes)], modes[2 % len(modes)], "LEAF", "LEAF", "LEAF", "LEAF"]
                       + [modes[3 % len(modes)], modes[4 % len(modes)], modes[5 % len(modes)]] + ["LEAF"] * 4,
    }
    if tracks is not None:
        attrs["nodes_missing_value_tracks_true"] = tracks
    leaves = [(0, n) for n in (0, 1, 2, 6)] + [(1, n) for n in (3, 4, 5, 6)]
    class_ids = [c for _ in leaves for c in range(3)]
    attrs.update(class_treeids=[t for t, _ in leaves for _ in range(3)],
                 class_nodeids=[n for _, n in leaves for _ in range(3)], class_ids=class_ids,
                 class_weights=rng.normal(0, 1, len(class_ids)).round(3).tolist(), classlabels_int64s=[10, 20, 30])
    return attrs


def _rows(n: int = 64, features: int = 3, seed: int = 3) -> np.ndarray:
    x = np.random.default_rng(seed).normal(0, 0.6, (n, features)).astype(np.float32)
    x[::9, 0] = 0.1  # values on a threshold: <= and < differ
    x[::11, 2] = 0.5
    return x


MODE_SETS = [["BRANCH_LEQ"], ["BRANCH_LT"], ["BRANCH_GTE"], ["BRANCH_GT"], ["BRANCH_EQ", "BRANCH_LEQ"],
             ["BRANCH_NEQ", "BRANCH_LT", "BRANCH_GT"],
             ["BRANCH_LEQ", "BRANCH_LT", "BRANCH_GTE", "BRANCH_GT", "BRANCH_EQ", "BRANCH_NEQ"]]


def test_tree_classifier_modes_and_transforms():
    """Each branch mode (alone and mixed in one tree), then each post transform on the mixed tree."""
    cases = [_two_trees(modes) for modes in MODE_SETS]
    for transform in ("SOFTMAX", "LOGISTIC", "SOFTMAX_ZERO", "PROBIT"):
        attrs = _two_trees(MODE_SETS[-1])
        attrs["post_transform"] = transform
        if transform == "PROBIT":  # probit of probabilities: scores in (0, 1)
            attrs["class_weights"] = (np.abs(np.asarray(attrs["class_weights"])) / 8).round(4).tolist()
        cases.append(attrs)
    model = _tree_model("TreeEnsembleClassifier", cases)
    x = _rows()
    _assert_same(_forge(model, x), _reference(model, x), atol=1e-4)  # PROBIT: Winitzki's erfinv, in float32


def test_tree_missing_values_follow_the_tracks():
    """NaN features: the false branch (BRANCH_NEQ: the true one) unless nodes_missing_value_tracks_true says."""
    tracks = [1, 0, 1, 0, 0, 0, 0] + [0, 1, 1, 0, 0, 0, 0]
    cases = [_two_trees(modes, track) for modes in (["BRANCH_LEQ"], ["BRANCH_NEQ", "BRANCH_GT"])
             for track in (None, tracks)]
    model = _tree_model("TreeEnsembleClassifier", cases)
    x = _rows()
    x[::3, 0] = np.nan
    x[1::4, 2] = np.nan
    x[2::5, 1] = np.nan
    _assert_same(_forge(model, x), _reference(model, x))


@pytest.mark.parametrize("x_type", [TensorProto.DOUBLE, TensorProto.INT64, TensorProto.INT32])
def test_tree_classifier_on_float64_and_integer_inputs(x_type):
    model = _tree_model("TreeEnsembleClassifier", _two_trees(["BRANCH_LEQ", "BRANCH_LT"]), x_type=x_type)
    dtype = onnx.helper.tensor_dtype_to_np_dtype(x_type)
    x = _rows() if dtype.kind == "f" else np.random.default_rng(4).integers(-2, 3, (40, 3))
    x = x.astype(dtype)
    if dtype == np.float64:
        x[::7, 0] = np.float64(np.float32(0.1))  # the float32 threshold widened: equal in float64
    _assert_same(_forge(model, x), _reference(model, x))


def _regressor(targets: int, aggregate: str, transform: str = "NONE", base: list[float] | None = None) -> dict:
    attrs = _two_trees(["BRANCH_LEQ"])
    for key in ("class_treeids", "class_nodeids", "class_ids", "class_weights", "classlabels_int64s"):
        attrs.pop(key)
    rng = np.random.default_rng(9)
    # Leaves of tree 0 weigh target 0 only (and target 1 on one leaf): some rows leave target 1 unscored.
    weights = [(0, 0, 0), (0, 1, 0), (0, 2, 0), (0, 6, 0), (0, 6, 1), (1, 3, 0), (1, 4, 0), (1, 5, 0), (1, 6, 0)]
    if targets > 2:
        weights += [(1, 3, 2), (1, 4, 2), (1, 5, 2), (1, 6, 2), (1, 5, 1)]
    weights = [(t, n, min(c, targets - 1)) for t, n, c in weights]
    attrs.update(target_treeids=[w[0] for w in weights], target_nodeids=[w[1] for w in weights],
                 target_ids=[w[2] for w in weights], target_weights=rng.normal(0, 1, len(weights)).round(3).tolist(),
                 n_targets=targets, aggregate_function=aggregate, post_transform=transform)
    if base is not None:
        attrs["base_values"] = base
    return attrs


def test_tree_regressor_aggregates_and_transforms():
    """SUM, AVERAGE, MIN, MAX of one and of three targets (base values; a target some rows' leaves leave
    unscored), then transforms of three targets."""
    cases = [_regressor(targets, aggregate, base=[0.25] * targets) for targets in (1, 3)
             for aggregate in ("SUM", "AVERAGE", "MIN", "MAX")]
    cases += [_regressor(3, "SUM", transform) for transform in ("SOFTMAX", "LOGISTIC")]
    model = _tree_model("TreeEnsembleRegressor", cases, outputs=(("y", TensorProto.FLOAT),))
    x = _rows()
    _assert_same(_forge(model, x), _reference(model, x))


def _binary(class_ids: list[int], weights: list[float], base: list[float] | None, transform: str) -> dict:
    attrs = _two_trees(["BRANCH_LEQ"])
    leaves = [(0, n) for n in (0, 1, 2, 6)] + [(1, n) for n in (3, 4, 5, 6)]
    chosen = [(t, n, c, w) for (t, n), c, w in zip(leaves, class_ids, weights)]
    attrs.update(class_treeids=[c[0] for c in chosen], class_nodeids=[c[1] for c in chosen],
                 class_ids=[c[2] for c in chosen], class_weights=[c[3] for c in chosen],
                 classlabels_int64s=[4, 9], post_transform=transform)
    if base is not None:
        attrs["base_values"] = base
    return attrs


MIXED = [0.4, -0.7, 1.1, -0.2, 0.3, -0.9, 0.6, -0.05]
POSITIVE = [0.1, 0.35, 0.05, 0.3, 0.2, 0.15, 0.4, 0.25]


BINARY_CASES = [
    ("lightgbm-style", [0] * 8, MIXED, None, "LOGISTIC"),
    ("one-id-raw", [0] * 8, MIXED, None, "NONE"),
    ("one-id-positive", [0] * 8, POSITIVE, None, "NONE"),
    ("one-id-positive-base", [0] * 8, POSITIVE, [0.1], "NONE"),
    ("one-id-positive-logistic", [0] * 8, POSITIVE, None, "LOGISTIC"),
    ("one-id-positive-softmax", [0] * 8, POSITIVE, None, "SOFTMAX"),
    ("class-one-only", [1] * 8, MIXED, None, "LOGISTIC"),
    ("both-ids", [0, 1, 0, 1, 1, 0, 1, 0], MIXED, None, "NONE"),
    ("both-ids-softmax", [0, 1, 0, 1, 1, 0, 1, 0], MIXED, None, "SOFTMAX"),
    ("two-base-values", [0, 1, 0, 1, 1, 0, 1, 0], MIXED, [0.2, -0.3], "LOGISTIC"),
    ("two-base-values-one-id", [0] * 8, MIXED, [0.2, -0.3], "NONE"),
]


def test_binary_tree_classifier_follows_onnxruntimes_rules():
    """Not an argmax: one class id or both, weights all non-negative or not, 0 to 2 base values, each as
    onnxruntime decides the label and the two probability columns."""
    cases = [_binary(class_ids, weights, base, transform) for _, class_ids, weights, base, transform in BINARY_CASES]
    model = _tree_model("TreeEnsembleClassifier", cases)
    x = _rows(80)
    _assert_same(_forge(model, x), _reference(model, x))


def test_binary_classifier_without_a_reference_is_refused():
    """PROBIT on a one-score binary classifier: onnxruntime leaves a column unwritten; Forge says so."""
    model = _tree_model("TreeEnsembleClassifier", _binary([0] * 8, MIXED, None, "PROBIT"))
    with pytest.raises(ModelImportError, match="PROBIT.*unwritten"):
        forge.from_onnx(model)


# -- linear models and preprocessing --------------------------------------------------------------------------

def _linear(op: str, attrs: dict | list[dict], outputs, x_type=TensorProto.FLOAT, features: int = 4) -> onnx.ModelProto:
    return _tree_model(op, attrs, x_type=x_type, features=features, outputs=outputs)


def _linear_case(classes: int, transform: str) -> dict:
    rng = np.random.default_rng(classes)
    attrs = {"coefficients": rng.normal(0, 1, classes * 4).tolist(), "intercepts": rng.normal(0, 1, classes).tolist(),
             "classlabels_ints": [3, 5, 7] if classes > 1 else [4, 9], "post_transform": transform}
    if transform == "PROBIT":  # probabilities in (0, 1)
        attrs["coefficients"] = (np.abs(attrs["coefficients"]) / 20).tolist()
        attrs["intercepts"] = [0.3] * classes
    return attrs


def test_linear_classifier_transforms():
    """Three classes: the label from the raw scores, each transform on them. One score and two labels (a binary
    classifier): the label by the score's sign, the probabilities [1 - p, p], p the score or its logistic; with
    PROBIT onnxruntime leaves half of them unwritten, and Forge refuses it."""
    transforms = ("NONE", "LOGISTIC", "SOFTMAX", "SOFTMAX_ZERO", "PROBIT")
    cases = [_linear_case(3, t) for t in transforms] + [_linear_case(1, t) for t in transforms[:-1]]
    outputs = (("label", TensorProto.INT64), ("scores", TensorProto.FLOAT))
    model = _linear("LinearClassifier", cases, outputs)
    x = np.abs(_rows(50, 4))  # PROBIT's scores in (0, 1); the others' signs vary with the coefficients
    _assert_same(_forge(model, x), _reference(model, x), atol=1e-4)
    with pytest.raises(ModelImportError, match="PROBIT.*unwritten"):
        forge.from_onnx(_linear("LinearClassifier", _linear_case(1, "PROBIT"), outputs))


@pytest.mark.parametrize("x_type", [TensorProto.DOUBLE, TensorProto.INT64])
def test_linear_classifier_casts_its_input_to_float(x_type):
    rng = np.random.default_rng(11)
    attrs = {"coefficients": rng.normal(0, 1, 8).tolist(), "intercepts": [0.1, -0.2], "classlabels_ints": [0, 1]}
    model = _linear("LinearClassifier", attrs, (("label", TensorProto.INT64), ("scores", TensorProto.FLOAT)),
                    x_type=x_type)
    x = rng.integers(-3, 4, (30, 4)).astype(onnx.helper.tensor_dtype_to_np_dtype(x_type))
    _assert_same(_forge(model, x), _reference(model, x))


def test_normalizer():
    model = _linear("Normalizer", [{"norm": norm} for norm in ("MAX", "L1", "L2")], (("y", TensorProto.FLOAT),))
    x = _rows(20, 4)
    x[3] = 0.0  # a zero row stays
    x[5] = -np.abs(x[5])  # a negative max
    _assert_same(_forge(model, x), _reference(model, x))


def test_scaler_imputer_binarizer_and_array_feature_extractor():
    rng = np.random.default_rng(5)
    nodes = [
        oh.make_node("Imputer", ["x"], ["filled"], domain="ai.onnx.ml", imputed_value_floats=[1.5, -2.0, 0.5, 3.0],
                     replaced_value_float=float("nan")),
        oh.make_node("Scaler", ["filled"], ["scaled"], domain="ai.onnx.ml", offset=rng.normal(0, 1, 4).tolist(),
                     scale=rng.uniform(0.5, 2, 4).tolist()),
        oh.make_node("Binarizer", ["scaled"], ["bits"], domain="ai.onnx.ml", threshold=0.25),
        oh.make_node("ArrayFeatureExtractor", ["scaled", "picked"], ["picked_features"], domain="ai.onnx.ml"),
    ]
    graph = oh.make_graph(
        nodes, "prep", [oh.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
        [oh.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in ("scaled", "bits", "picked_features")],
        initializer=[onnx.numpy_helper.from_array(np.array([3, 0, 3], np.int64), "picked")])
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17), ML], ir_version=9)
    x = _rows(25, 4)
    x[::4, 1] = np.nan
    _assert_same(_forge(model, x), _reference(model, x))


def test_imputer_of_int64_and_a_single_scale():
    nodes = [oh.make_node("Imputer", ["x"], ["filled"], domain="ai.onnx.ml", imputed_value_int64s=[7],
                          replaced_value_int64=-1),
             oh.make_node("Scaler", ["filled"], ["y"], domain="ai.onnx.ml", offset=[1.0], scale=[0.5])]
    graph = oh.make_graph(nodes, "prep", [oh.make_tensor_value_info("x", TensorProto.INT64, ["n", 3])],
                          [oh.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17), ML], ir_version=9)
    x = np.random.default_rng(2).integers(-2, 4, (12, 3)).astype(np.int64)
    _assert_same(_forge(model, x), _reference(model, x))


def test_string_class_labels_give_indices_and_say_so(caplog):
    attrs = _two_trees(["BRANCH_LEQ"])
    attrs.pop("classlabels_int64s")
    attrs["classlabels_strings"] = ["setosa", "versicolor", "virginica"]
    model = _tree_model("TreeEnsembleClassifier", attrs,
                        outputs=(("label", TensorProto.STRING), ("scores", TensorProto.FLOAT)))
    x = _rows()
    with caplog.at_level(logging.WARNING, logger="forge.onnx"):
        label, scores = _forge(model, x)
    want_label, want_scores = _reference(model, x)
    assert [["setosa", "versicolor", "virginica"][i] for i in label] == list(want_label)
    np.testing.assert_allclose(scores, want_scores, rtol=1e-5, atol=1e-6)
    assert any("label output holds each label's index" in r.getMessage() for r in caplog.records)
