"""ONNX-ML (``ai.onnx.ml``): the operators scikit-learn exports hold (skl2onnx, onnxmltools).

Each converter computes what onnxruntime's CPU kernel computes, which is what skl2onnx checks its exports
against, including where onnxruntime departs from the operator spec (the compile log says so):

- ``LinearClassifier`` / ``LinearRegressor``: ``X @ coefficients.T + intercepts``; the label is decided on the
  raw scores; with one score per row, onnxruntime applies PROBIT only (LOGISTIC and SOFTMAX are ignored), and
  a binary classifier's probabilities are ``[1 - p, p]``, ``p`` the score (its logistic for LOGISTIC).
- ``TreeEnsembleClassifier`` / ``TreeEnsembleRegressor`` (the ``nodes_*`` attributes of opsets 1 to 3): every
  tree is walked at once, one level a step, with gathers (``max depth`` steps); a NaN feature takes the false
  branch unless ``nodes_missing_value_tracks_true`` says otherwise (BRANCH_NEQ: true); leaf weights are summed
  in the input's precision (float32, float64 for a float64 input); a binary classifier follows onnxruntime's
  rules for its label and its two probability columns.
- ``Scaler``, ``Normalizer`` (MAX, L1, L2 as onnxruntime: L2 is ``sign(x) sqrt(x^2 / sum x^2)``), ``Imputer``,
  ``Binarizer``, ``ArrayFeatureExtractor``.
- ``ZipMap``: onnxruntime returns a list of ``{label: probability}`` maps; Forge computes tensors, so the output
  is the probabilities tensor ``(N, classes)``, its columns in the order of the labels (the compile log names
  them). Class labels given as strings make the label output the class index, as the log says.

- ``SVMClassifier`` / ``SVMRegressor``: the kernels (LINEAR, POLY, RBF, SIGMOID) against every support vector,
  libsvm's pairwise decision values and votes (the label: the first class with the most votes; two classes:
  scores ``[-d, d]``), liblinear's form without support vectors, a one-class SVM's ``+1``/``-1``.

Not converted: string inputs (an error naming the node), an ``SVMClassifier`` with probabilities (``prob_a``:
onnxruntime's pairwise coupling iterates to a tolerance; an error saying so), the opset-5 ``TreeEnsemble`` (the
importer's unsupported-operator error), and the combinations where onnxruntime leaves a probability column
unwritten (an error saying so).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np
import tvm
from tvm import relax

from forge_core.errors import InvalidModelError, ModelImportError
from forge_onnx.converters import ConverterContext, attr_text

DOMAIN = "ai.onnx.ml"
logger = logging.getLogger("forge.onnx")

_TRANSFORMS = ("NONE", "LOGISTIC", "SOFTMAX", "SOFTMAX_ZERO", "PROBIT")


def _texts(values: Any) -> list[str]:
    return [attr_text(v) for v in (values or [])]


def _floats(attrs: dict[str, Any], name: str) -> np.ndarray:
    value = attrs.get(name)
    if value is None:
        return np.zeros(0, np.float32)
    return np.asarray(value, dtype=np.float32).reshape(-1)


def _ints(attrs: dict[str, Any], name: str) -> np.ndarray:
    value = attrs.get(name)
    if value is None:
        return np.zeros(0, np.int64)
    return np.asarray(value, dtype=np.int64).reshape(-1)


def _const(value: Any, dtype: str) -> relax.Expr:
    return relax.const(np.asarray(value, dtype=dtype), dtype)


def _dtype(x: relax.Expr) -> str:
    return str(x.ty.dtype)


def _shape(x: relax.Expr) -> list[Any]:
    shape = x.ty.shape
    return list(shape.values) if shape is not None and hasattr(shape, "values") else []


def _static(dim: Any) -> int | None:
    return int(dim.value) if hasattr(dim, "value") else (int(dim) if isinstance(dim, int) else None)


def _features(x: relax.Expr, op: str, node: str, allowed: Sequence[str]) -> relax.Expr:
    """``x`` as the kernels see it: rank 1 is one row, rank 2 rows of features; other ranks refused."""
    dtype = _dtype(x)
    if dtype not in allowed:
        raise ModelImportError(f"{op} {node!r}: input dtype {dtype} is not supported (onnxruntime's kernel takes "
                               f"{', '.join(allowed)})")
    rank = x.ty.ndim
    if rank == 1:
        return relax.op.expand_dims(x, 0)
    if rank != 2:
        raise ModelImportError(f"{op} {node!r}: expected an input of rank 1 or 2 (rows of features), given rank "
                               f"{rank}")
    return x


def _post_transform(attrs: dict[str, Any], op: str, node: str) -> str:
    name = attr_text(attrs.get("post_transform"), "NONE")
    if name not in _TRANSFORMS:
        raise InvalidModelError(f"{op} {node!r}: post_transform {name!r} is not one of {', '.join(_TRANSFORMS)}")
    return name


# -- the post transforms, as onnxruntime computes them (in float32) ---------------------------------------

def _probit(p: relax.Expr) -> relax.Expr:
    """onnxruntime's probit: sqrt(2) * erfinv(2p - 1), erfinv by Winitzki's approximation (a = 0.147)."""
    x = relax.op.subtract(relax.op.multiply(p, _const(2.0, "float32")), _const(1.0, "float32"))
    sign = relax.op.where(relax.op.less(x, _const(0.0, "float32")), _const(-1.0, "float32"), _const(1.0, "float32"))
    w = relax.op.multiply(relax.op.subtract(_const(1.0, "float32"), x), relax.op.add(_const(1.0, "float32"), x))
    log_w = relax.op.log(w)
    t = relax.op.add(_const(2.0 / (np.float32(np.pi) * np.float32(0.147)), "float32"),
                     relax.op.multiply(_const(0.5, "float32"), log_w))
    u = relax.op.multiply(_const(1.0 / np.float32(0.147), "float32"), log_w)
    inner = relax.op.sqrt(relax.op.subtract(relax.op.multiply(t, t), u))
    erfinv = relax.op.multiply(sign, relax.op.sqrt(relax.op.subtract(inner, t)))
    return relax.op.multiply(_const(np.sqrt(2.0), "float32"), erfinv)


def _softmax_zero(s: relax.Expr) -> relax.Expr:
    """Softmax over the last axis where values within 1e-7 of zero stay (near) zero and count for nothing."""
    peak = relax.op.max(s, axis=[-1], keepdims=True)
    nonzero = relax.op.greater(relax.op.abs(s), _const(1e-7, "float32"))
    e = relax.op.where(nonzero, relax.op.exp(relax.op.subtract(s, peak)),
                       relax.op.multiply(s, relax.op.exp(relax.op.negative(peak))))
    total = relax.op.sum(relax.op.where(nonzero, e, _const(0.0, "float32")), axis=[-1], keepdims=True)
    return relax.op.divide(e, total)


def _transform(s: relax.Expr, name: str) -> relax.Expr:
    """The post transform of a row of two or more scores (float32)."""
    if name == "LOGISTIC":
        return relax.op.sigmoid(s)
    if name == "SOFTMAX":
        return relax.op.nn.softmax(s, axis=-1)
    if name == "SOFTMAX_ZERO":
        return _softmax_zero(s)
    if name == "PROBIT":
        return _probit(s)
    return s


def _single_score_transform(s: relax.Expr, name: str, op: str, node: str) -> relax.Expr:
    """One score a row: onnxruntime applies PROBIT only."""
    if name == "PROBIT":
        return _probit(s)
    if name != "NONE":
        logger.warning("%s %r: post_transform %s on a single score is ignored, as onnxruntime does (the operator "
                       "spec applies it): the output is the raw score", op, node, name)
    return s


def _first_max(s: relax.Expr) -> relax.Expr:
    """The index of the first largest score of each row (NaN scores never win)."""
    return relax.op.argmax(relax.op.where(relax.op.isnan(s), _const(-np.inf, _dtype(s)), s), axis=-1)


def _labels(attrs: dict[str, Any], op: str, node: str, prefix: str) -> np.ndarray:
    """The class labels as int64 (string labels: their indices)."""
    strings = _texts(attrs.get(f"{prefix}_strings"))
    if strings:
        logger.warning("%s %r: its class labels are strings %s; Forge computes tensors of numbers, so the label "
                       "output holds each label's index in that list", op, node, strings)
        return np.arange(len(strings), dtype=np.int64)
    key = f"{prefix}_ints" if f"{prefix}_ints" in attrs else f"{prefix}_int64s"
    return _ints(attrs, key)


def _label_of(index: relax.Expr, labels: np.ndarray) -> relax.Expr:
    return relax.op.take(_const(labels, "int64"), index, axis=0)


# -- linear models ------------------------------------------------------------------------------------------

def _linear_scores(x: relax.Expr, attrs: dict[str, Any], classes: int, op: str, node: str) -> relax.Expr:
    coefficients = _floats(attrs, "coefficients")
    features = _static(_shape(x)[1]) if _shape(x) else None
    if classes <= 0 or coefficients.size % classes:
        raise InvalidModelError(f"{op} {node!r}: {coefficients.size} coefficients do not make {classes} rows")
    weights = coefficients.reshape(classes, -1)
    if features is not None and weights.shape[1] != features:
        raise InvalidModelError(f"{op} {node!r}: coefficients of {weights.shape[1]} features a row, the input has "
                                f"{features}")
    x = relax.op.astype(x, "float32") if _dtype(x) != "float32" else x
    return relax.op.matmul(x, _const(np.ascontiguousarray(weights.T), "float32"))


def linear_classifier(bb: relax.BlockBuilder, inputs: list[Any], attrs: dict[str, Any],
                      context: ConverterContext) -> relax.Expr:
    """LinearClassifier: scores X @ W.T + b, the label from the raw scores, probabilities as onnxruntime's."""
    op, node = "LinearClassifier", context.node
    x = _features(inputs[0], op, node, ("float32", "float64", "int32", "int64"))
    intercepts = _floats(attrs, "intercepts")
    classes = intercepts.size
    transform = _post_transform(attrs, op, node)
    labels = _labels(attrs, op, node, "classlabels")
    scores = bb.normalize(relax.op.add(_linear_scores(x, attrs, classes, op, node), _const(intercepts, "float32")))
    if classes >= 2:
        if labels.size < classes:
            raise InvalidModelError(f"{op} {node!r}: {classes} classes and {labels.size} class labels")
        label = _label_of(_first_max(scores), labels)
        return relax.Tuple([label, _transform(scores, transform)])
    positive, negative = (labels[1], labels[0]) if labels.size == 2 else (1, 0)
    s = relax.op.squeeze(scores, axis=[1])
    label = relax.op.where(relax.op.greater(s, _const(0.0, "float32")), _const(positive, "int64"),
                           _const(negative, "int64"))
    if labels.size == 2:
        if transform == "PROBIT":
            raise ModelImportError(f"{op} {node!r}: a binary classifier (one score, two labels) with post_transform "
                                   "PROBIT: onnxruntime leaves half of its probabilities unwritten, so there is no "
                                   "reference to compute; re-export with two rows of coefficients")
        if transform == "LOGISTIC":
            s = relax.op.sigmoid(s)
        elif transform != "NONE":
            logger.warning("%s %r: a binary classifier with one score gives [1 - s, s] without its post_transform "
                           "%s, as onnxruntime does", op, node, transform)
        return relax.Tuple([label, relax.op.stack([relax.op.subtract(_const(1.0, "float32"), s), s], axis=1)])
    return relax.Tuple([label, _single_score_transform(scores, transform, op, node)])


def linear_regressor(bb: relax.BlockBuilder, inputs: list[Any], attrs: dict[str, Any],
                     context: ConverterContext) -> relax.Expr:
    """LinearRegressor: X @ W.T + b (intercepts used when there is one per target)."""
    op, node = "LinearRegressor", context.node
    x = _features(inputs[0], op, node, ("float32",))
    targets = int(attrs.get("targets", 1))
    transform = _post_transform(attrs, op, node)
    y = _linear_scores(x, attrs, targets, op, node)
    intercepts = _floats(attrs, "intercepts")
    if intercepts.size == targets:
        y = relax.op.add(y, _const(intercepts, "float32"))
    if targets == 1:
        return _single_score_transform(y, transform, op, node)
    return _transform(y, transform)


# -- trees --------------------------------------------------------------------------------------------------

_MODES = {"BRANCH_LEQ": relax.op.less_equal, "BRANCH_LT": relax.op.less, "BRANCH_GTE": relax.op.greater_equal,
          "BRANCH_GT": relax.op.greater, "BRANCH_EQ": relax.op.equal,
          # not (v == t): true for a NaN feature, as C++'s != (TVM's not_equal is an ordered comparison: false)
          "BRANCH_NEQ": lambda v, t: relax.op.logical_not(relax.op.equal(v, t))}


class _Forest:
    """A tree ensemble's nodes in flat arrays (global indices, trees in the order they appear), and its leaves'
    weights as a ``(nodes, columns)`` table."""

    def __init__(self, attrs: dict[str, Any], prefix: str, columns: int, op: str, node: str) -> None:
        self.op, self.node = op, node
        if attrs.get("nodes_values_as_tensor") is not None or attrs.get(f"{prefix}_weights_as_tensor") is not None:
            raise ModelImportError(f"{op} {node!r}: the *_as_tensor attributes (float64 thresholds) are not supported")
        tree_ids, node_ids = _ints(attrs, "nodes_treeids"), _ints(attrs, "nodes_nodeids")
        modes = _texts(attrs.get("nodes_modes"))
        count = tree_ids.size
        if not count or node_ids.size != count or len(modes) != count:
            raise InvalidModelError(f"{op} {node!r}: nodes_treeids, nodes_nodeids and nodes_modes must have one entry "
                                    f"a node, given {tree_ids.size}, {node_ids.size} and {len(modes)}")
        unknown = sorted(set(modes) - set(_MODES) - {"LEAF"})
        if unknown:
            raise InvalidModelError(f"{op} {node!r}: node modes {unknown} are not among {sorted(_MODES)} and LEAF")
        features = _ints(attrs, "nodes_featureids")
        thresholds = _floats(attrs, "nodes_values")
        true_ids, false_ids = _ints(attrs, "nodes_truenodeids"), _ints(attrs, "nodes_falsenodeids")
        tracks = _ints(attrs, "nodes_missing_value_tracks_true")
        tracks = np.concatenate([tracks, np.zeros(max(count - tracks.size, 0), np.int64)])[:count] == 1
        for name, values in (("nodes_featureids", features), ("nodes_values", thresholds),
                             ("nodes_truenodeids", true_ids), ("nodes_falsenodeids", false_ids)):
            if values.size != count:
                raise InvalidModelError(f"{op} {node!r}: {name} has {values.size} entries for {count} nodes")
        position = {(int(t), int(n)): i for i, (t, n) in enumerate(zip(tree_ids, node_ids))}
        if len(position) != count:
            raise InvalidModelError(f"{op} {node!r}: two nodes share a (treeid, nodeid)")
        self.roots = [0] + [i for i in range(1, count) if tree_ids[i] != tree_ids[i - 1]]
        if len({int(tree_ids[i]) for i in self.roots}) != len(self.roots):
            raise InvalidModelError(f"{op} {node!r}: a tree's nodes are not listed together")
        self.leaf = np.array([m == "LEAF" for m in modes])
        self.true_child = np.arange(count, dtype=np.int64)
        self.false_child = np.arange(count, dtype=np.int64)
        for i in np.flatnonzero(~self.leaf):
            tree = int(tree_ids[i])
            for children, ids in ((self.true_child, true_ids), (self.false_child, false_ids)):
                child = position.get((tree, int(ids[i])))
                if child is None or child == i:
                    raise InvalidModelError(f"{op} {node!r}: node {int(node_ids[i])} of tree {tree} points to "
                                            f"node {int(ids[i])}, which its tree does not have")
                children[i] = child
        self.features = np.where(self.leaf, 0, features).astype(np.int64)
        self.thresholds, self.tracks = thresholds, tracks & ~self.leaf
        self.modes = modes
        self.depth = self._depth()
        # Leaf weights: each (tree, node, column, weight) tuple on a leaf adds to its column.
        weight_trees, weight_nodes = _ints(attrs, f"{prefix}_treeids"), _ints(attrs, f"{prefix}_nodeids")
        weight_ids, weights = _ints(attrs, f"{prefix}_ids"), _floats(attrs, f"{prefix}_weights")
        if not weight_trees.size == weight_nodes.size == weight_ids.size == weights.size:
            raise InvalidModelError(f"{op} {node!r}: {prefix}_treeids, _nodeids, _ids and _weights differ in length")
        self.weights = np.zeros((count, max(columns, 1)), np.float64)
        self.scored = np.zeros((count, max(columns, 1)), bool)
        self.used_columns = set(int(c) for c in weight_ids)
        first_only = columns == 1
        for t, n, column, weight in sorted(zip(weight_trees, weight_nodes, weight_ids, weights),
                                           key=lambda w: (int(w[0]), int(w[1]))):
            i = position.get((int(t), int(n)))
            if i is None or not self.leaf[i]:
                continue  # onnxruntime ignores a weight on a branch node
            column = 0 if first_only else int(column)
            if not 0 <= column < columns:
                raise InvalidModelError(f"{op} {node!r}: a leaf weight for column {column} of {columns}")
            if first_only and self.scored[i, 0]:
                continue  # one output: the first weight of each leaf only
            self.weights[i, column] += weight
            self.scored[i, column] = True
        if first_only:  # a leaf without a weight gives its nodes_values entry
            unscored = self.leaf & ~self.scored[:, 0]
            self.weights[unscored, 0] = thresholds[unscored]
            self.scored[self.leaf, 0] = True

    def _depth(self) -> int:
        deepest = 0
        for root in self.roots:
            stack = [(root, 0)]
            while stack:
                i, depth = stack.pop()
                if depth > len(self.leaf):
                    raise InvalidModelError(f"{self.op} {self.node!r}: a tree has a cycle")
                if self.leaf[i]:
                    deepest = max(deepest, depth)
                else:
                    stack += [(int(self.true_child[i]), depth + 1), (int(self.false_child[i]), depth + 1)]
        return deepest

    def leaves(self, bb: relax.BlockBuilder, x: relax.Expr, dtype: str) -> relax.Expr:
        """The leaf each row reaches in each tree: ``(rows, trees)`` int64 global node indices."""
        features = _static(_shape(x)[1])
        if features is not None and int(self.features.max(initial=0)) >= features:
            raise InvalidModelError(f"{self.op} {self.node!r}: a node reads feature {int(self.features.max())}, the "
                                    f"input has {features}")
        thresholds = self.thresholds.astype(dtype)
        mode_names = sorted({m for m, leaf in zip(self.modes, self.leaf) if not leaf})
        codes = np.array([mode_names.index(m) if m in mode_names else 0 for m in self.modes], np.int64)
        tracking = bool(self.tracks.any())
        # (rows, trees): every row starts at every tree's root
        rows = relax.op.zeros_like(relax.op.take(x, _const(np.zeros(len(self.roots), np.int64), "int64"), axis=1),
                                   dtype="int64")
        index = bb.normalize(relax.op.add(rows, _const(np.asarray(self.roots, np.int64), "int64")))
        table = {name: _const(values, str(values.dtype)) for name, values in (
            ("features", self.features), ("thresholds", thresholds), ("true", self.true_child),
            ("false", self.false_child), ("codes", codes), ("tracks", self.tracks))}
        for _ in range(self.depth):
            value = bb.normalize(relax.op.gather_elements(x, relax.op.take(table["features"], index, axis=0), axis=1))
            threshold = relax.op.take(table["thresholds"], index, axis=0)
            taken = None
            for code, name in enumerate(mode_names):
                compared = _MODES[name](value, threshold)
                taken = compared if taken is None else relax.op.where(
                    relax.op.equal(relax.op.take(table["codes"], index, axis=0), _const(code, "int64")),
                    compared, taken)
            if taken is None:  # every tree is a single leaf
                break
            if tracking:
                taken = relax.op.logical_or(taken, relax.op.logical_and(
                    relax.op.isnan(value), relax.op.take(table["tracks"], index, axis=0)))
            index = bb.normalize(relax.op.where(taken, relax.op.take(table["true"], index, axis=0),
                                                relax.op.take(table["false"], index, axis=0)))
        return index

    def gathered(self, bb: relax.BlockBuilder, index: relax.Expr, dtype: str) -> tuple[relax.Expr, relax.Expr]:
        """Per row, tree and column: the leaf's weight and whether it has one, ``(rows, trees, columns)``."""
        weights = bb.normalize(relax.op.take(_const(self.weights.astype(dtype), dtype), index, axis=0))
        scored = bb.normalize(relax.op.take(_const(self.scored, "bool"), index, axis=0))
        return weights, scored


def _scored_by_any_tree(scored: relax.Expr) -> relax.Expr:
    """``(rows, trees, columns)`` -> ``(rows, columns)``: whether any reached leaf has a weight for the column."""
    return relax.op.greater(relax.op.max(relax.op.astype(scored, "int32"), axis=[1]), _const(0, "int32"))


def _tree_input(bb: relax.BlockBuilder, x: relax.Expr, op: str, node: str,
                allowed: Sequence[str]) -> tuple[relax.Expr, str]:
    """The features compared with the thresholds: float32 (integers rounded to it), float64 for float64."""
    x = _features(x, op, node, allowed)
    dtype = "float64" if _dtype(x) == "float64" else "float32"
    return bb.normalize(x if _dtype(x) == dtype else relax.op.astype(x, dtype)), dtype


def tree_ensemble_regressor(bb: relax.BlockBuilder, inputs: list[Any], attrs: dict[str, Any],
                            context: ConverterContext) -> relax.Expr:
    """TreeEnsembleRegressor: the leaves' target weights aggregated over the trees (SUM, AVERAGE, MIN, MAX)."""
    op, node = "TreeEnsembleRegressor", context.node
    x, dtype = _tree_input(bb, inputs[0], op, node, ("float32", "float64"))
    targets = int(attrs.get("n_targets", 0))
    if targets <= 0:
        raise InvalidModelError(f"{op} {node!r}: n_targets must be positive, given {targets}")
    aggregate = attr_text(attrs.get("aggregate_function"), "SUM")
    if aggregate not in ("SUM", "AVERAGE", "MIN", "MAX"):
        raise InvalidModelError(f"{op} {node!r}: aggregate_function {aggregate!r} is not SUM, AVERAGE, MIN or MAX")
    transform = _post_transform(attrs, op, node)
    if attrs.get("base_values_as_tensor") is not None:
        raise ModelImportError(f"{op} {node!r}: base_values_as_tensor (float64 base values) is not supported")
    forest = _Forest(attrs, "target", targets, op, node)
    weights, scored = forest.gathered(bb, forest.leaves(bb, x, dtype), dtype)
    trees = len(forest.roots)
    if aggregate in ("SUM", "AVERAGE"):
        y = relax.op.sum(weights, axis=[1])
        if aggregate == "AVERAGE":
            y = relax.op.divide(y, _const(trees, dtype))
    else:
        empty = _const(np.inf if aggregate == "MIN" else -np.inf, dtype)
        masked = relax.op.where(scored, weights, empty)
        y = relax.op.min(masked, axis=[1]) if aggregate == "MIN" else relax.op.max(masked, axis=[1])
    base = _floats(attrs, "base_values")
    if targets == 1:
        if base.size == 1:
            y = relax.op.add(y, _const(base, dtype))
        y = relax.op.astype(y, "float32") if dtype != "float32" else y
        return _single_score_transform(y, transform, op, node)
    if base.size == targets:
        y = relax.op.add(y, _const(base, dtype))
    has = _scored_by_any_tree(scored)
    y = relax.op.where(has, y, _const(0.0, dtype))  # a target no reached leaf scored is 0, base value included
    y = relax.op.astype(y, "float32") if dtype != "float32" else y
    return _transform(y, transform)


def tree_ensemble_classifier(bb: relax.BlockBuilder, inputs: list[Any], attrs: dict[str, Any],
                             context: ConverterContext) -> relax.Expr:
    """TreeEnsembleClassifier: the leaves' class weights summed over the trees; label and probabilities as
    onnxruntime's."""
    op, node = "TreeEnsembleClassifier", context.node
    x, dtype = _tree_input(bb, inputs[0], op, node, ("float32", "float64", "int32", "int64"))
    transform = _post_transform(attrs, op, node)
    if attrs.get("base_values_as_tensor") is not None:
        raise ModelImportError(f"{op} {node!r}: base_values_as_tensor (float64 base values) is not supported")
    labels = _labels(attrs, op, node, "classlabels")
    classes = labels.size
    if classes < 2:
        raise ModelImportError(f"{op} {node!r}: {classes} class label(s); a classifier needs two or more")
    forest = _Forest(attrs, "class", classes, op, node)
    weights, scored = forest.gathered(bb, forest.leaves(bb, x, dtype), dtype)
    sums = bb.normalize(relax.op.sum(weights, axis=[1]))
    has = bb.normalize(_scored_by_any_tree(scored))
    base = _floats(attrs, "base_values")

    def column(values: relax.Expr, c: int) -> relax.Expr:
        return relax.op.squeeze(relax.op.strided_slice(values, axes=[1], begin=[c], end=[c + 1]), axis=[1])

    def to_float(values: relax.Expr) -> relax.Expr:
        return relax.op.astype(values, "float32") if dtype != "float32" else values

    zero = _const(0.0, dtype)
    if classes > 2:
        if base.size:
            padded = np.zeros(classes, np.float64)
            padded[:min(base.size, classes)] = base[:classes]
            sums = relax.op.add(sums, _const(padded, dtype))
            has = relax.op.logical_or(has, _const(np.arange(classes) < base.size, "bool"))
        has = bb.normalize(has)
        sums = bb.normalize(sums)
        index = _first_max(bb.normalize(relax.op.where(has, sums, _const(-np.inf, dtype))))
        label = _label_of(index, labels)
        return relax.Tuple([label, _transform(to_float(relax.op.where(has, sums, zero)), transform)])

    # Two classes: onnxruntime's rules (not an argmax).
    p0, p1 = column(sums, 0), column(sums, 1)
    h0, h1 = column(has, 0), column(has, 1)
    one_id = len(forest.used_columns) == 1
    positive_weights = bool((_floats(attrs, "class_weights") >= 0).all())
    two_columns: relax.Expr | bool  # whether a row's probabilities are the transform of both columns (K == 2)
    if base.size == 2:
        p1, p0 = (relax.op.where(h1, relax.op.add(p0, _const(base[1], dtype)), _const(base[1], dtype)),
                  relax.op.where(h1, relax.op.negative(relax.op.add(p0, _const(base[1], dtype))),
                                 relax.op.add(p0, _const(base[0], dtype))))
        two_columns = True
    else:
        if base.size == 1:
            p0 = relax.op.add(p0, _const(base[0], dtype))
        elif base.size > 2:
            raise ModelImportError(f"{op} {node!r}: {base.size} base values for 2 classes")
        two_columns = h1
    p0, p1 = bb.normalize(p0), bb.normalize(p1)
    v0, v1 = relax.op.where(h0, p0, zero), relax.op.where(h1, p1, zero)
    positive = bb.normalize(relax.op.where(h1, p1, v0))  # class 1's score where a leaf gave one
    if one_id:
        cut = 0.5 if positive_weights else 0.0
        above = relax.op.greater(positive, _const(cut, dtype))
        label = relax.op.where(above, _const(labels[1], "int64"), _const(labels[0], "int64"))
    else:
        if base.size == 1:
            raise ModelImportError(f"{op} {node!r}: two classes scored by both class ids with one base value: "
                                   "onnxruntime leaves the second probability column unwritten for rows whose "
                                   "leaves score class 0 only, so there is no reference to compute")
        # onnxruntime's label is then 1 or 0 itself, not classlabels_int64s[1] or [0]
        label = relax.op.where(relax.op.greater(positive, zero), _const(1, "int64"), _const(0, "int64"))
    both = _transform(to_float(relax.op.stack([v0, v1], axis=1)), transform)
    if two_columns is True:
        return relax.Tuple([label, both])
    if transform == "PROBIT":
        raise ModelImportError(f"{op} {node!r}: a binary classifier with post_transform PROBIT: onnxruntime leaves "
                               "the second probability column unwritten for rows whose leaves score one class, so "
                               "there is no reference to compute")
    s = to_float(v0)
    if one_id and positive_weights:
        p = relax.op.sigmoid(s) if transform == "LOGISTIC" else s
        single = relax.op.stack([relax.op.subtract(_const(1.0, "float32"), p), p], axis=1)
        if transform not in ("NONE", "LOGISTIC"):
            logger.warning("%s %r: a binary classifier with non-negative weights gives [1 - s, s] without its "
                           "post_transform %s, as onnxruntime does", op, node, transform)
    elif transform == "LOGISTIC":
        single = relax.op.stack([relax.op.sigmoid(relax.op.negative(s)), relax.op.sigmoid(s)], axis=1)
    else:
        single = relax.op.stack([relax.op.negative(s), s], axis=1)
    rows = relax.op.expand_dims(two_columns, 1)
    return relax.Tuple([label, relax.op.where(rows, both, single)])


# -- preprocessing ------------------------------------------------------------------------------------------

def _per_column(values: np.ndarray, x: relax.Expr, op: str, node: str, name: str, dtype: str) -> relax.Expr:
    """``values`` broadcast along the rows: one value, or one a column (the last axis)."""
    if values.size == 1:
        return _const(values[0], dtype)
    columns = _static(_shape(x)[-1]) if _shape(x) else None
    if x.ty.ndim > 2 or (columns is not None and columns != values.size):
        raise InvalidModelError(f"{op} {node!r}: {name} has {values.size} values for an input of shape "
                                f"{[_static(d) for d in _shape(x)]}; it needs 1 or one a column")
    return _const(values, dtype)


def scaler(bb: relax.BlockBuilder, inputs: list[Any], attrs: dict[str, Any], context: ConverterContext) -> relax.Expr:
    """Scaler: (X - offset) * scale, in float32 (float64 inputs computed in float64, then rounded)."""
    op, node = "Scaler", context.node
    x = inputs[0]
    scale, offset = _floats(attrs, "scale"), _floats(attrs, "offset")
    if not scale.size or offset.size != scale.size:
        raise InvalidModelError(f"{op} {node!r}: scale and offset need the same number of values, given "
                                f"{scale.size} and {offset.size}")
    dtype = "float64" if _dtype(x) == "float64" else "float32"
    x = x if _dtype(x) == dtype else relax.op.astype(x, dtype)
    y = relax.op.multiply(relax.op.subtract(x, _per_column(offset, x, op, node, "offset", dtype)),
                          _per_column(scale, x, op, node, "scale", dtype))
    return relax.op.astype(y, "float32") if dtype != "float32" else y


def normalizer(bb: relax.BlockBuilder, inputs: list[Any], attrs: dict[str, Any],
               context: ConverterContext) -> relax.Expr:
    """Normalizer: each row divided by its (signed) MAX, its L1 norm, or L2 as ``sign(x) sqrt(x^2 / sum x^2)``;
    a row whose divisor is 0 is kept."""
    op, node = "Normalizer", context.node
    norm = attr_text(attrs.get("norm"), "MAX")
    x = inputs[0]
    if x.ty.ndim not in (1, 2):
        raise ModelImportError(f"{op} {node!r}: expected rank 1 or 2, given rank {x.ty.ndim}")
    axis = x.ty.ndim - 1
    source = x
    x = x if _dtype(x) == "float32" else relax.op.astype(x, "float32")
    zero = _const(0.0, "float32")
    if norm == "MAX":
        divisor = relax.op.max(relax.op.where(relax.op.isnan(x), _const(-np.inf, "float32"), x), axis=[axis],
                               keepdims=True)
        return relax.op.where(relax.op.equal(divisor, zero), x, relax.op.divide(x, divisor))
    if norm == "L1":
        divisor = relax.op.sum(relax.op.astype(relax.op.abs(source), "float32"), axis=[axis], keepdims=True)
        return relax.op.where(relax.op.equal(divisor, zero), x, relax.op.divide(x, divisor))
    if norm == "L2":
        squares = relax.op.astype(relax.op.multiply(source, source), "float32")
        total = relax.op.sum(squares, axis=[axis], keepdims=True)
        magnitude = relax.op.sqrt(relax.op.divide(squares, total))
        signed = relax.op.where(relax.op.less(x, zero), relax.op.negative(magnitude), magnitude)
        return relax.op.where(relax.op.equal(total, zero), x, signed)
    raise InvalidModelError(f"{op} {node!r}: norm {norm!r} is not MAX, L1 or L2")


def imputer(bb: relax.BlockBuilder, inputs: list[Any], attrs: dict[str, Any], context: ConverterContext) -> relax.Expr:
    """Imputer: each value equal to the replaced value (NaN matching NaN) becomes its column's imputed value."""
    op, node = "Imputer", context.node
    x = inputs[0]
    dtype = _dtype(x)
    if dtype == "float32":
        imputed, replaced = _floats(attrs, "imputed_value_floats"), float(attrs.get("replaced_value_float", 0.0))
    elif dtype == "int64":
        imputed, replaced = _ints(attrs, "imputed_value_int64s"), int(attrs.get("replaced_value_int64", 0))
    else:
        raise ModelImportError(f"{op} {node!r}: input dtype {dtype} is not supported (float32 or int64)")
    if not imputed.size:
        raise InvalidModelError(f"{op} {node!r}: no imputed values for a {dtype} input")
    columns = _static(_shape(x)[-1]) if _shape(x) else None
    values = _const(imputed, dtype) if imputed.size > 1 and columns == imputed.size else _const(imputed[0], dtype)
    if dtype == "float32" and np.isnan(replaced):
        hit = relax.op.isnan(x)
    else:
        hit = relax.op.equal(x, _const(replaced, dtype))
    return relax.op.where(hit, values, x)


def binarizer(bb: relax.BlockBuilder, inputs: list[Any], attrs: dict[str, Any],
              context: ConverterContext) -> relax.Expr:
    """Binarizer: 1 where X > threshold, else 0."""
    x = inputs[0]
    dtype = _dtype(x)
    threshold = _const(float(attrs.get("threshold", 0.0)), dtype)
    return relax.op.where(relax.op.greater(x, threshold), _const(1.0, dtype), _const(0.0, dtype))


def array_feature_extractor(bb: relax.BlockBuilder, inputs: list[Any], attrs: dict[str, Any],
                            context: ConverterContext) -> relax.Expr:
    """ArrayFeatureExtractor: X's last axis at the (flattened) indices Y; a rank-1 X gives (1, K)."""
    op, node = "ArrayFeatureExtractor", context.node
    x, indices = inputs
    if isinstance(indices, tvm.ir.GenericConst):
        values = indices.value.numpy().reshape(-1)
        size = _static(_shape(x)[-1]) if _shape(x) else None
        if not values.size or (values < 0).any() or (size is not None and (values >= size).any()):
            raise InvalidModelError(f"{op} {node!r}: indices {values.tolist()} are not all in [0, {size}) "
                                    "(onnxruntime refuses them)")
        flat: relax.Expr = _const(values.astype(np.int64), "int64")
    else:
        flat = relax.op.reshape(indices, [-1])
    y = relax.op.take(x, flat, axis=x.ty.ndim - 1)
    return relax.op.expand_dims(y, 0) if x.ty.ndim == 1 else y


def zip_map(bb: relax.BlockBuilder, inputs: list[Any], attrs: dict[str, Any], context: ConverterContext) -> relax.Expr:
    """ZipMap: the probabilities tensor itself, its columns in label order (onnxruntime: a list of maps)."""
    labels = _texts(attrs.get("classlabels_strings")) or [int(v) for v in _ints(attrs, "classlabels_int64s")]
    logger.warning("ZipMap %r: the output is the probabilities tensor (rows, %d), its columns for the labels %s in "
                   "that order; onnxruntime returns one {label: probability} map a row", context.node, len(labels),
                   labels)
    return inputs[0]

# -- support vector machines ----------------------------------------------------------------------------------

_KERNELS = ("LINEAR", "POLY", "RBF", "SIGMOID")


def _svm_kernel(x: relax.Expr, vectors: np.ndarray, attrs: dict[str, Any], kernel: str, offset: float,
                op: str, node: str) -> relax.Expr:
    """``K(x, v)`` for every row of ``x`` and every row of ``vectors``, as onnxruntime's ``batched_kernel_dot``:
    LINEAR ``x.v + offset``, POLY ``(gamma x.v + coef0)^degree``, SIGMOID ``tanh(gamma x.v + coef0)``, RBF
    ``exp(-gamma |x - v|^2)`` (the squared differences summed, not expanded)."""
    if kernel not in _KERNELS:
        raise InvalidModelError(f"{op} {node!r}: kernel_type {kernel!r} is not one of {', '.join(_KERNELS)}")
    params = _floats(attrs, "kernel_params")
    gamma, coef0, degree = (float(v) for v in params[:3]) if params.size >= 3 else (0.0, 0.0, 0.0)
    features = _static(_shape(x)[1]) if _shape(x) else None
    if features is not None and vectors.shape[1] != features:
        raise InvalidModelError(f"{op} {node!r}: vectors of {vectors.shape[1]} features, the input has {features}")
    x = relax.op.astype(x, "float32") if _dtype(x) != "float32" else x
    if kernel == "RBF":
        diff = relax.op.subtract(relax.op.expand_dims(x, 1), _const(vectors[None], "float32"))
        distance = relax.op.sum(relax.op.multiply(diff, diff), axis=[2])
        return relax.op.exp(relax.op.multiply(_const(-gamma, "float32"), distance))
    dot = relax.op.matmul(x, _const(np.ascontiguousarray(vectors.T), "float32"))
    if kernel == "LINEAR":
        return relax.op.add(dot, _const(offset, "float32")) if offset else dot
    scaled = relax.op.add(relax.op.multiply(dot, _const(gamma, "float32")), _const(coef0, "float32"))
    if kernel == "SIGMOID":
        return relax.op.tanh(scaled)
    return relax.op.power(scaled, _const(degree, "float32"))


def _support_vectors(attrs: dict[str, Any], count: int, op: str, node: str) -> np.ndarray:
    vectors = _floats(attrs, "support_vectors")
    if count <= 0 or vectors.size == 0 or vectors.size % count:
        raise InvalidModelError(f"{op} {node!r}: {vectors.size} support vector values do not make {count} vectors")
    return vectors.reshape(count, -1)


def svm_regressor(bb: relax.BlockBuilder, inputs: list[Any], attrs: dict[str, Any],
                  context: ConverterContext) -> relax.Expr:
    """SVMRegressor: ``sum_i coef_i K(x, sv_i) + rho`` (or ``K(x, coefficients) + rho`` with no support vectors,
    liblinear's form), ``+1``/``-1`` by sign for a one-class SVM. onnxruntime applies no post_transform."""
    op, node = "SVMRegressor", context.node
    x = _features(inputs[0], op, node, ("float32",))
    coefficients, rho = _floats(attrs, "coefficients"), _floats(attrs, "rho")
    if coefficients.size == 0 or rho.size == 0:
        raise InvalidModelError(f"{op} {node!r}: coefficients and rho are required")
    count = int(attrs.get("n_supports", 0))
    if count > 0:
        vectors = _support_vectors(attrs, count, op, node)
        if coefficients.size < count:
            raise InvalidModelError(f"{op} {node!r}: {coefficients.size} coefficients for {count} support vectors")
        kernels = _svm_kernel(x, vectors, attrs, attr_text(attrs.get("kernel_type"), "LINEAR"), 0.0, op, node)
        y = relax.op.add(relax.op.matmul(kernels, _const(coefficients[:count].reshape(count, 1), "float32")),
                         _const(rho[0], "float32"))
    else:
        y = _svm_kernel(x, coefficients.reshape(1, -1), attrs, "LINEAR", float(rho[0]), op, node)
    if int(attrs.get("one_class", 0)):
        y = relax.op.where(relax.op.greater(y, _const(0.0, "float32")), _const(1.0, "float32"),
                           _const(-1.0, "float32"))
    transform = _post_transform(attrs, op, node)
    if transform != "NONE":
        logger.warning("%s %r: post_transform %s is ignored, as onnxruntime does", op, node, transform)
    return y


def svm_classifier(bb: relax.BlockBuilder, inputs: list[Any], attrs: dict[str, Any],
                   context: ConverterContext) -> relax.Expr:
    """SVMClassifier, as onnxruntime's kernel computes it.

    With support vectors (libsvm's SVC): the decision value of every pair of classes ``i < j`` (``sum`` over
    both classes' vectors of ``coefficients[., v] K(x, v) + rho``), a vote for ``i`` where it is positive, else
    for ``j``; the label is the first class with the most votes, the scores are the decision values (post
    transformed over the row), and for two classes ``[-d, d]`` (``[1 - d, d]`` with a post_transform). Without
    support vectors (liblinear's form): one score a class, ``K(x, coefficients[c]) + rho[0]``. A model with
    probabilities (``prob_a``, scikit-learn's ``probability=True``) is refused: onnxruntime couples the pairwise
    probabilities by an iteration that stops at a tolerance, which Forge does not reproduce yet.
    """
    op, node = "SVMClassifier", context.node
    x = bb.normalize(_features(inputs[0], op, node, ("float32", "float64", "int32", "int64")))
    labels = _labels(attrs, op, node, "classlabels")
    classes = labels.size
    coefficients, rho = _floats(attrs, "coefficients"), _floats(attrs, "rho")
    per_class = _ints(attrs, "vectors_per_class")
    transform = _post_transform(attrs, op, node)
    if classes < 2 or coefficients.size == 0 or rho.size == 0:
        raise InvalidModelError(f"{op} {node!r}: class labels (two or more), coefficients and rho are required")
    if _floats(attrs, "prob_a").size:
        raise ModelImportError(
            f"{op} {node!r}: a classifier with probabilities (prob_a, prob_b: scikit-learn's probability=True) is "
            "not converted yet: onnxruntime couples the pairwise probabilities by an iteration that stops at a "
            "tolerance. Export without probabilities (the label and the decision values convert), or run this "
            "model with onnxruntime")
    kernel = attr_text(attrs.get("kernel_type"), "LINEAR")
    if per_class.size == 0:  # liblinear's form: one row of coefficients a class
        if coefficients.size % classes:
            raise InvalidModelError(f"{op} {node!r}: {coefficients.size} coefficients do not make {classes} rows")
        scores = bb.normalize(_svm_kernel(x, coefficients.reshape(classes, -1), attrs, "LINEAR", float(rho[0]),
                                          op, node))
        label = _label_of(_first_max(scores), labels)
        if classes == 2:
            logger.warning("%s %r: a two-class classifier without support vectors: the label is the first "
                           "highest score's", op, node)
        return relax.Tuple([label, _transform(scores, transform)])
    if per_class.size != classes or (per_class < 0).any():
        raise InvalidModelError(f"{op} {node!r}: vectors_per_class {per_class.tolist()} for {classes} classes")
    count = int(per_class.sum())
    vectors = _support_vectors(attrs, count, op, node)
    pairs = classes * (classes - 1) // 2
    if coefficients.size < (classes - 1) * count or rho.size < pairs:
        raise InvalidModelError(f"{op} {node!r}: {coefficients.size} coefficients and {rho.size} rho for "
                                f"{classes} classes and {count} support vectors: expected {(classes - 1) * count} "
                                f"and {pairs}")
    coefs = coefficients[:(classes - 1) * count].reshape(classes - 1, count)
    starts = np.concatenate([[0], np.cumsum(per_class)[:-1]]).astype(int)
    # One column a pair: the coefficient each support vector takes in that pair's decision value (0 elsewhere).
    weights = np.zeros((count, pairs), np.float64)
    votes_for = np.zeros((pairs, classes), np.int64)
    pair = 0
    for i in range(classes - 1):
        for j in range(i + 1, classes):
            si, sj = starts[i], starts[j]
            weights[si:si + per_class[i], pair] = coefs[j - 1, si:si + per_class[i]]
            weights[sj:sj + per_class[j], pair] = coefs[i, sj:sj + per_class[j]]
            votes_for[pair, i], votes_for[pair, j] = 1, -1
            pair += 1
    kernels = _svm_kernel(x, vectors, attrs, kernel, 0.0, op, node)
    decisions = bb.normalize(relax.op.add(relax.op.matmul(kernels, _const(weights.astype(np.float32), "float32")),
                                          _const(rho[:pairs], "float32")))
    # Votes: pair (i, j) votes i where its value is > 0, else j.
    positive = relax.op.astype(relax.op.greater(decisions, _const(0.0, "float32")), "int64")
    for_i = _const(np.maximum(votes_for, 0), "int64")
    for_j = _const(np.maximum(-votes_for, 0), "int64")
    votes = relax.op.add(relax.op.matmul(positive, for_i),
                         relax.op.matmul(relax.op.subtract(_const(1, "int64"), positive), for_j))
    label = _label_of(relax.op.argmax(votes, axis=-1), labels)
    if classes == 2:
        if transform == "PROBIT":
            raise ModelImportError(f"{op} {node!r}: two classes with post_transform PROBIT: onnxruntime leaves "
                                   "half of its scores unwritten, so there is no reference to compute")
        d = relax.op.squeeze(decisions, axis=[1])
        first = relax.op.negative(d) if transform == "NONE" else relax.op.subtract(_const(1.0, "float32"), d)
        if transform != "NONE":
            logger.warning("%s %r: two classes give [1 - d, d] without post_transform %s, as onnxruntime does",
                           op, node, transform)
        return relax.Tuple([label, relax.op.stack([first, d], axis=1)])
    return relax.Tuple([label, _transform(decisions, transform)])


CONVERTERS = {
    "LinearClassifier": linear_classifier, "LinearRegressor": linear_regressor,
    "TreeEnsembleClassifier": tree_ensemble_classifier, "TreeEnsembleRegressor": tree_ensemble_regressor,
    "Scaler": scaler, "Normalizer": normalizer, "Imputer": imputer, "Binarizer": binarizer,
    "ArrayFeatureExtractor": array_feature_extractor, "ZipMap": zip_map,
    "SVMClassifier": svm_classifier, "SVMRegressor": svm_regressor,
}
