"""Shape, Size, Constant and ConstantOfShape: static values become constants, so that the arithmetic on them folds.

TVM's importer turns ``Shape`` into a Relax shape value, which most operators
cannot take ("cannot handle ShapeExpr inputs"). When the input's shape is
static, Forge emits an int64 constant instead; dynamic shapes still go to TVM.
``Size`` and ``ConstantOfShape`` also take such shape values (inside an ``If``
branch, or for a dynamic shape), and ``ConstantOfShape`` takes the empty shape
(a scalar), which TVM's converter rejects. ``Expand`` to a shape read at run
time broadcasts both ways, as ONNX defines it.
"""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper
import tvm
from tvm import relax, te, tirx, topi

from forge_core.errors import InvalidModelError, ModelImportError
from forge_core.runtime.signature import RUN_TIME_CHECK
from forge_onnx.constant_folding import MAX_FOLDED_ELEMENTS
from forge_onnx.converters import ConverterContext
from forge_onnx.symbolic_values import dims_analyzer, symbolic_ints


def static_shape(expr: relax.Expr) -> list[int] | None:
    """The dims of a tensor expression whose shape is fully static, else None."""
    ty = expr.ty
    if not isinstance(ty, relax.TensorType) or not isinstance(ty.shape, relax.ShapeExpr):
        return None
    dims = []
    for value in ty.shape.values:
        if not isinstance(value, tirx.IntImm):
            return None
        dims.append(int(value.value))
    return dims


def shape(bb: relax.BlockBuilder, inputs: list[Any], attrs: dict[str, Any], context: ConverterContext) -> relax.Expr:
    """Shape: an int64 constant for a static input shape (``start``/``end`` honoured)."""
    dims = static_shape(inputs[0])
    if dims is None:
        return context.tvm_convert("Shape", inputs)
    start, end = int(attrs.get("start", 0)), attrs.get("end")
    selected = dims[start:] if end is None else dims[start:int(end)]
    return relax.const(np.array(selected, dtype=np.int64), "int64")


def _int64_scalar(value: int) -> relax.Expr:
    return relax.const(np.array(value, dtype=np.int64), "int64")


def size(bb: relax.BlockBuilder, inputs: list[Any], attrs: dict[str, Any], context: ConverterContext) -> relax.Expr:
    """Size: an int64 scalar constant for a static input shape, or for a shape value (its rank)."""
    x = inputs[0]
    if isinstance(x.ty, relax.ShapeType):
        # A shape value (``Shape`` of a dynamic tensor) is a 1-D tensor in ONNX: its size is its rank.
        if x.ty.ndim < 0:
            return relax.op.size(bb.emit(relax.op.shape_to_tensor(x)))
        return _int64_scalar(int(x.ty.ndim))
    dims = static_shape(x)
    if dims is None:
        return context.tvm_convert("Size", inputs)
    return _int64_scalar(int(np.prod(dims, dtype=np.int64)))


def _fill_value(attrs: dict[str, Any], node: str) -> np.ndarray:
    """ConstantOfShape's ``value`` attribute as a 0-d array (float32 zero when absent)."""
    if "value" not in attrs:
        return np.array(0.0, dtype=np.float32)
    value = numpy_helper.to_array(attrs["value"])
    if value.size != 1:
        raise InvalidModelError(f"ConstantOfShape {node!r}: value must hold one element, given shape {value.shape}")
    return value.reshape(())


def _constant_dims(shape_operand: relax.Expr) -> list[int] | None:
    """The dims that a ConstantOfShape's shape operand holds, when they are known at import."""
    if isinstance(shape_operand, relax.ShapeExpr):
        if all(isinstance(v, tirx.IntImm) for v in shape_operand.values):
            return [int(v.value) for v in shape_operand.values]
        return None
    if hasattr(shape_operand, "value"):  # a constant tensor
        return [int(v) for v in np.asarray(shape_operand.value.numpy()).reshape(-1)]
    return None


def run_time_shape(bb: relax.BlockBuilder, operand: relax.Expr, node: str,
                    op: str = "ConstantOfShape") -> relax.ShapeExpr:
    """A shape whose dims are the run-time values of a 1-D int64 tensor (or a shape value): named dims."""
    ty = operand.ty
    if isinstance(ty, relax.ShapeType) and ty.ndim >= 0:
        value, rank = operand, ty.ndim
    elif isinstance(ty, relax.TensorType) and ty.ndim == 1 and isinstance(ty.shape, relax.ShapeExpr) \
            and isinstance(ty.shape.values[0], tirx.IntImm):
        value, rank = bb.emit(relax.op.tensor_to_shape(operand)), int(ty.shape.values[0].value)
    else:
        raise ModelImportError(f"{op} {node!r}: the shape operand must be a 1-D tensor of known length, given {ty}")
    prefix = re.sub(r"\W+", "_", node).strip("_") or "shape"
    dims = [tirx.Var(f"{prefix}_d{axis}", "int64") for axis in range(rank)]
    bb.match_cast(value, relax.ShapeType(dims))
    return relax.ShapeExpr(dims)


def constant_of_shape(bb: relax.BlockBuilder, inputs: list[Any], attrs: dict[str, Any],
                      context: ConverterContext) -> relax.Expr:
    """ConstantOfShape: ``value`` broadcast to the shape operand, the empty shape (a scalar) included.

    A known shape gives a constant (up to the folding limit); one computed from dims, a broadcast to those
    dims; one read from a tensor at run time, a broadcast to named dims.
    """
    fill = _fill_value(attrs, context.node)
    dtype = str(fill.dtype)
    shape_operand = inputs[0]
    dims = _constant_dims(shape_operand)
    if dims is not None:
        if any(d < 0 for d in dims):
            raise InvalidModelError(f"ConstantOfShape {context.node!r}: negative dimension in shape {dims}")
        if int(np.prod(dims, dtype=np.int64)) <= MAX_FOLDED_ELEMENTS:
            return relax.const(np.full(dims, fill, dtype=dtype), dtype)
        target = relax.ShapeExpr(dims)
    else:
        values = symbolic_ints(bb, shape_operand)
        target = relax.ShapeExpr(values) if values is not None else run_time_shape(bb, shape_operand, context.node)
    return relax.op.broadcast_to(relax.const(fill, dtype), target)



def expand(bb: relax.BlockBuilder, inputs: list[Any], attrs: dict[str, Any], context: ConverterContext) -> relax.Expr:
    """Expand, broadcasting both ways as ONNX defines it when the shape is only known at run time.

    A shape known at import (a constant, a shape expression, or arithmetic on dims) goes to TVM's converter.
    For one read from a tensor at run time, TVM broadcast the input to the shape as given, so a 1 in the
    shape where the input has 3 gave 1 (wrong numbers, no error); here each output dim is the larger of the
    two, the broadcast of valid operands.
    """
    data, shape_operand = inputs[0], inputs[1]
    if isinstance(shape_operand, (relax.ShapeExpr, tvm.ir.GenericConst)):
        return context.tvm_convert("Expand", inputs)
    values = symbolic_ints(bb, shape_operand)
    if values is not None:
        return context.tvm_convert("Expand", [data, relax.ShapeExpr(values)])
    data_dims = static_or_symbolic_dims(data)
    if data_dims is None:
        raise ModelImportError(f"Expand {context.node!r}: the input's rank must be known, given {data.ty}")
    target = list(run_time_shape(bb, shape_operand, context.node, "Expand").values)
    rank = max(len(target), len(data_dims))
    one = tirx.IntImm("int64", 1)
    data_dims = [one] * (rank - len(data_dims)) + data_dims
    target = [one] * (rank - len(target)) + target
    if len(data_dims) != data.ty.ndim:
        data = bb.emit(relax.op.reshape(data, relax.ShapeExpr(data_dims)))
    return relax.op.broadcast_to(data, relax.ShapeExpr([tirx.max(a, b) for a, b in zip(data_dims, target)]))


def _values_of_dims(bb: relax.BlockBuilder, operand: relax.Expr, subject: str) -> list[Any]:
    """The values of a shape-like operand as expressions of the input's dims, or a ValueError naming the fix;
    ``subject`` ends with its verb (``"Pad 'p': its pads are"``)."""
    values = symbolic_ints(bb, operand)
    if values is None:
        raise ModelImportError(
            f"{subject} computed from values known only at run time (given {operand.ty}), which Forge cannot "
            "follow back to the input's dims; give the model's inputs static shapes (from_onnx(shape={...})) so "
            "that they are known at import")
    return values


def reshape(bb: relax.BlockBuilder, inputs: list[Any], attrs: dict[str, Any], context: ConverterContext) -> relax.Expr:
    """Reshape, whose target shape may be computed from dynamic dims (Paddle2ONNX's ``Shape -> Slice -> Concat``).

    A shape known at import (a constant or a shape expression) goes to TVM's converter. A shape computed
    from the input's dims (through Cast, Gather, Concat, arithmetic, ReduceProd...) becomes the expression
    of those dims, with ONNX's ``0`` (copy the input's dim, unless ``allowzero``) and ``-1`` (the rest)
    resolved. A shape read from data at run time cannot be: its ``0`` and ``-1`` would need the values.
    """
    data, shape_operand = inputs[0], inputs[1]
    if isinstance(shape_operand, (relax.ShapeExpr, tvm.ir.GenericConst)) or isinstance(data, relax.ShapeExpr):
        return context.tvm_convert("Reshape", inputs)
    values = _values_of_dims(bb, shape_operand, f"Reshape {context.node!r}: its target shape is")
    dims = static_or_symbolic_dims(data)
    allowzero = bool(attrs.get("allowzero", 0))
    resolved = []
    for axis, value in enumerate(values):
        if isinstance(value, tirx.IntImm) and int(value.value) == 0 and not allowzero:
            if dims is None or axis >= len(dims):
                raise InvalidModelError(f"Reshape {context.node!r}: shape[{axis}] = 0 copies the input's dim {axis}, "
                                        f"which the input ({data.ty}) does not have")
            value = dims[axis]
        resolved.append(value)
    unknown = [axis for axis, v in enumerate(resolved) if isinstance(v, tirx.IntImm) and int(v.value) == -1]
    if len(unknown) > 1:
        raise InvalidModelError(f"Reshape {context.node!r}: the shape has -1 at {len(unknown)} places, at most one "
                                "allowed")
    if unknown:
        if dims is None:
            raise ModelImportError(f"Reshape {context.node!r}: a -1 in the shape needs the input's dims, given "
                                   f"{data.ty}")
        one = tirx.IntImm("int64", 1)
        known = math.prod((v for axis, v in enumerate(resolved) if axis != unknown[0]), start=one)
        resolved[unknown[0]] = tirx.floordiv(math.prod(dims, start=one), known)
    return relax.op.reshape(data, relax.ShapeExpr(resolved))


def squeeze(bb: relax.BlockBuilder, inputs: list[Any], attrs: dict[str, Any], context: ConverterContext) -> relax.Expr:
    """Squeeze, where an axis to squeeze may have a dynamic extent (a conv's output length from a dynamic input).

    ONNX requires each squeezed axis to be 1, and onnxruntime checks it when it runs. An extent that Relax
    cannot prove to be 1 at import is match-cast to 1, which checks the same when the model runs (in an If
    branch, a check guarded by the branch's condition); TVM's converter then squeezes.
    """
    inputs = list(inputs) + [None] * (2 - len(inputs))  # TVM's converter reads inputs[1] (the axes) as optional
    data, axes_operand = inputs[0], inputs[1]
    dims = static_or_symbolic_dims(data) if isinstance(data, relax.Expr) else None
    if axes_operand is not None:
        axes = _constant_dims(axes_operand) if isinstance(axes_operand, (relax.ShapeExpr, tvm.ir.GenericConst)) \
            else None
    else:
        axes = list(attrs["axes"]) if attrs.get("axes") else None
    if dims is None or axes is None:
        return context.tvm_convert("Squeeze", inputs)
    analyzer = dims_analyzer(*dims)
    one = tirx.IntImm("int64", 1)
    wanted, changed = list(dims), False
    for axis in axes:
        axis = int(axis) + len(dims) if int(axis) < 0 else int(axis)
        if 0 <= axis < len(dims) and not isinstance(dims[axis], tirx.IntImm) \
                and not analyzer.can_prove_equal(dims[axis], one):
            wanted[axis], changed = one, True
    if not changed:
        return context.tvm_convert("Squeeze", inputs)
    branch = context.branch_taken()
    if branch is None:
        bound = data if isinstance(data, relax.Var) else bb.emit(data)
        data = bb.match_cast(bound, relax.TensorType(wanted, data.ty.dtype))
        return context.tvm_convert("Squeeze", [data, *inputs[1:]])
    # In an If branch, whose bindings TVM's importer runs whichever branch is taken: check the extents only
    # when this branch runs; the axes are then dropped by a max over them, exactly the element when the extent
    # is 1, and of any extent (0 included) in the branch not taken, whose values nothing reads.
    squeezed = [axis for axis, (d, w) in enumerate(zip(dims, wanted)) if w is one and d is not one]
    extents = bb.emit(relax.op.shape_to_tensor(relax.ShapeExpr([dims[a] for a in squeezed])))
    others = relax.op.sum(relax.op.astype(relax.op.not_equal(extents, relax.const(1, "int64")), "int64"))
    all_one = bb.emit(relax.op.equal(others, relax.const(0, "int64")))
    fine = bb.emit(relax.op.logical_or(relax.op.logical_not(branch), all_one))
    bb.emit(relax.op.assert_op(fine, [extents], f"{RUN_TIME_CHECK}Squeeze {context.node!r}: the axes {squeezed} to "
                                                 f"squeeze must have extent 1 (ONNX requires it), given {{}}"))
    dropped = bb.emit(relax.op.max(data, axis=squeezed, keepdims=True))
    return context.tvm_convert("Squeeze", [dropped, *inputs[1:]])


_OPEN_END = 2**31 - 1
"""An end at or past this means "to the end of the axis": exporters write INT32_MAX or INT64_MAX for ``x[1:]``."""


def slice_(bb: relax.BlockBuilder, inputs: list[Any], attrs: dict[str, Any], context: ConverterContext) -> relax.Expr:
    """Slice, whose open ends on a symbolic axis end at the axis's extent; Slice-1's attributes as inputs.

    tf2onnx and the PyTorch exporters write ``x[1:]`` with an end of INT32_MAX or INT64_MAX, and tf2onnx slices
    every axis (``begin 0, end INT32_MAX`` on the batch). On a symbolic axis ``n`` TVM's converter keeps that end,
    and the sliced extent becomes ``min(2147483647, n) - min(0, n)``: an expression no later dim is proven equal
    to, on which TVM's FuseTIR recursed without end (Keras's NASNetMobile with a dynamic batch, through tf2onnx,
    crashed the process). An axis sliced whole is dropped from the slice; an open end after another begin
    becomes ``n`` itself, which selects the same elements; a reversed slice's open start and end become
    ``n - 1`` and ``-n - 1``.
    """
    if context.opset >= 10:
        inputs = list(inputs) + [None] * (5 - len(inputs))  # TVM's converter reads inputs[3] and [4] as optional
    else:  # Slice-1 (the PyTorch exporter at opset 9): starts, ends and axes are attributes; TVM reads inputs
        if "starts" not in attrs or "ends" not in attrs:
            raise InvalidModelError(f"Slice {context.node!r} (opset {context.opset}) needs its starts and ends "
                                    "attributes")
        as_input = [relax.const(np.asarray(list(attrs[key]), "int64"), "int64") if key in attrs else None
                    for key in ("starts", "ends", "axes")]
        inputs = [inputs[0], *as_input, None]
    result = context.tvm_convert("Slice", inputs)
    if not (isinstance(result, relax.Call) and getattr(result.op, "name", None) == "relax.strided_slice"):
        return result
    data, axes, begin, end, strides = result.args
    dims = static_or_symbolic_dims(data)
    if dims is None or not all(isinstance(t, relax.Tuple) for t in (axes, begin, end, strides)):
        return result
    kept: list[tuple[Any, Any, Any, Any]] = []
    changed = False
    for axis, start, stop, step in zip(axes.fields, begin.fields, end.fields, strides.fields):
        dim = dims[int(axis.value)] if isinstance(axis, tirx.IntImm) else None
        open_end = isinstance(stop, tirx.IntImm) and int(stop.value) >= _OPEN_END
        if dim is not None and not isinstance(dim, tirx.IntImm) and isinstance(step, tirx.IntImm) \
                and int(step.value) < 0:
            # x[::-1] (PyTorch's flip, a reflect pad): the open start and end become the axis's ends. Kept,
            # -INT64_MAX made the extent min(9223372036854775806, ...), which TVM's arithmetic overflowed.
            from_end = isinstance(start, tirx.IntImm) and int(start.value) >= _OPEN_END
            to_front = isinstance(stop, tirx.IntImm) and int(stop.value) <= -_OPEN_END
            if from_end or to_front:
                changed = True
            kept.append((axis, dim - 1 if from_end else start, -dim - 1 if to_front else stop, step))
        elif dim is None or isinstance(dim, tirx.IntImm) or not open_end \
                or not (isinstance(step, tirx.IntImm) and int(step.value) > 0):
            kept.append((axis, start, stop, step))
        elif isinstance(start, tirx.IntImm) and int(start.value) == 0 and int(step.value) == 1:
            changed = True  # the whole axis
        else:
            kept.append((axis, start, dim, step))
            changed = True
    if changed:
        if not kept:
            return data
        result = relax.op.strided_slice(data, *[list(column) for column in zip(*kept)],
                                        assume_inbound=bool(result.attrs.assume_inbound))
    return _with_cancelling_extents(bb, result, dims, axes.fields, begin.fields, end.fields, strides.fields)


def _cancelling_extent(dim: Any, start: Any, stop: Any) -> Any | None:
    """The extent of ``x[start:stop]`` on a dynamic axis ``dim`` (constant bounds, step 1) in a form whose sums
    cancel: ``min(b, n)`` for ``x[:b]``, ``n - min(b, n)`` for ``x[b:]``, ``n - min(k, n)`` for ``x[:-k]``.
    Relax's own, ``max(n - 1, 0)`` beside ``min(1, n)``, add up to ``n`` only by cases, which Relax cannot
    prove; None where no such form is known."""
    if not (isinstance(start, tirx.IntImm) and isinstance(stop, tirx.IntImm)):
        return None
    b, e = int(start.value), int(stop.value)
    if b < 0 or (b == 0 and e >= _OPEN_END):
        return None
    if e >= _OPEN_END:
        return dim - tirx.min(tirx.IntImm("int64", b), dim)
    if e >= 0:
        prefix = tirx.min(tirx.IntImm("int64", e), dim)
    else:
        prefix = dim - tirx.min(tirx.IntImm("int64", -e), dim)
    return prefix if b == 0 else prefix - tirx.min(tirx.IntImm("int64", b), prefix)


def _with_cancelling_extents(bb: relax.BlockBuilder, value: relax.Expr, dims: list[Any], axes: Any, begin: Any,
                             end: Any, strides: Any) -> relax.Expr:
    """``value`` (a slice of a tensor of ``dims``) typed with :func:`_cancelling_extent`'s extents on its dynamic
    axes, where Relax typed them otherwise: onnx-asr's NeMo preprocessors join ``x[:, :1]`` and a difference of
    ``x[:, 1:]`` and ``x[:, :-1]`` back into a signal of the input's length, which the model then masks; typed
    ``min(1, n) + max(n - 1, 0)``, it could be matched to ``n`` only at run time, and building the model
    crashed TVM (a recursion in CanonicalizeTIRVariables)."""
    value = bb.normalize(value)
    ty = value.ty
    if not isinstance(ty, relax.TensorType) or not isinstance(ty.shape, relax.ShapeExpr):
        return value
    wanted, changed = list(ty.shape.values), False
    for axis, start, stop, step in zip(axes, begin, end, strides):
        if not isinstance(axis, tirx.IntImm) or not (isinstance(step, tirx.IntImm) and int(step.value) == 1):
            continue
        index = int(axis.value) % len(dims)
        if not isinstance(dims[index], tirx.Var):  # a dim of its own only (magika's min(1000000000, n) is not)
            continue
        # Relax's extent where it simplifies to one without min or max (a dim carried through a loop keeps
        # its form so), else the one whose sums cancel.
        plain = dims_analyzer(dims[index], wanted[index]).simplify(wanted[index])
        if "min(" in str(plain) or "max(" in str(plain):
            extent = _cancelling_extent(dims[index], start, stop)
            if extent is not None and str(extent) != str(wanted[index]):
                wanted[index], changed = extent, True
    if not changed:
        return value
    bound = value if isinstance(value, relax.Var) else bb.emit(value)
    return bb.match_cast(bound, relax.TensorType(wanted, ty.dtype))


def static_or_symbolic_dims(expr: relax.Expr) -> list[Any] | None:
    """The dims of a tensor whose shape is a shape expression (static or symbolic), else None."""
    ty = expr.ty
    if not isinstance(ty, relax.TensorType) or not isinstance(ty.shape, relax.ShapeExpr):
        return None
    return list(ty.shape.values)


_SCALAR_ATTRS = {
    "value_float": np.float32,
    "value_int": np.int64,
}
_LIST_ATTRS = {
    "value_floats": np.float32,
    "value_ints": np.int64,
}


def constant(bb: relax.BlockBuilder, inputs: list[Any], attrs: dict[str, Any],
             context: ConverterContext) -> relax.Expr:
    """Constant, from any of its value attributes (tensor, sparse tensor, scalars, lists)."""
    if "value" in attrs:
        array = numpy_helper.to_array(attrs["value"])
    elif "sparse_value" in attrs:
        sparse: onnx.SparseTensorProto = attrs["sparse_value"]
        values = numpy_helper.to_array(sparse.values)
        indices = numpy_helper.to_array(sparse.indices)
        array = np.zeros(tuple(sparse.dims), dtype=values.dtype)
        flat = indices if indices.ndim == 1 else np.ravel_multi_index(indices.T, array.shape)
        array.reshape(-1)[flat] = values
    else:
        for name, dtype in _SCALAR_ATTRS.items():
            if name in attrs:
                array = np.array(attrs[name], dtype=dtype)
                break
        else:
            for name, dtype in _LIST_ATTRS.items():
                if name in attrs:
                    array = np.array(list(attrs[name]), dtype=dtype)
                    break
            else:
                raise ModelImportError("Constant has no supported value attribute "
                                       f"(given: {', '.join(attrs) or 'none'})")
    if array.dtype == object:
        raise ModelImportError("string constants are not supported")
    return relax.const(array, str(array.dtype))  # relax.const alone narrows int64 to int32


_PAD_TE = {"constant": "pad", "edge": "replicate_pad", "reflect": "mirror_pad"}


def pad(bb: relax.BlockBuilder, inputs: list[Any], attrs: dict[str, Any], context: ConverterContext) -> relax.Expr:
    """Pad, whose pads may be computed from dynamic dims (tf2onnx's ``SAME`` padding of an image of any size).

    Pads known at import go to TVM's converter, which refused any other ("Dynamic pads are not supported yet").
    Pads that shape arithmetic computes from the input's dims become expressions of those dims. Pads not proven
    non-negative at import are checked when the model runs: a negative pad crops, which the padding would not
    do, so a size that makes one raises ``InputError`` naming the node.
    """
    if context.opset >= 11:
        inputs = list(inputs) + [None] * (3 - len(inputs))  # TVM's converter reads inputs[2] (optional)
    operand = inputs[1] if context.opset >= 11 else None
    if operand is None or isinstance(operand, tvm.ir.GenericConst):
        return context.tvm_convert("Pad", inputs)
    values = _values_of_dims(bb, operand, f"Pad {context.node!r}: its pads are")
    data = inputs[0]
    dims = static_or_symbolic_dims(data)
    if dims is None:
        raise ModelImportError(f"Pad {context.node!r}: the input's rank must be known, given {data.ty}")
    rank = len(dims)
    axes = list(range(rank))
    if len(inputs) > 3 and inputs[3] is not None:
        given = symbolic_ints(bb, inputs[3])
        if given is None or not all(isinstance(a, tirx.IntImm) for a in given):
            raise ModelImportError(f"Pad {context.node!r}: its axes must be known at import, given {inputs[3].ty}")
        axes = [int(a.value) % rank for a in given]
    if len(values) != 2 * len(axes):
        raise InvalidModelError(f"Pad {context.node!r}: {len(values)} pads for {len(axes)} axes "
                                f"(expected {2 * len(axes)})")
    zero = tirx.IntImm("int64", 0)
    before, after = [zero] * rank, [zero] * rank
    for index, axis in enumerate(axes):
        before[axis], after[axis] = values[index], values[index + len(axes)]
    analyzer = dims_analyzer(*values)
    if not all(analyzer.can_prove(value >= 0) for value in values):
        # A negative pad crops (ONNX allows it); the padding below does not: checked when the model runs.
        pads = bb.emit(relax.op.shape_to_tensor(relax.ShapeExpr(values)))
        negative = relax.op.sum(relax.op.astype(relax.op.less(pads, relax.const(0, "int64")), "int64"))
        fine = bb.emit(relax.op.equal(negative, relax.const(0, "int64")))
        bb.emit(relax.op.assert_op(fine, [pads], f"{RUN_TIME_CHECK}Pad {context.node!r}: its pads, computed from the "
                                                 "input's dims, must not be negative here (a negative pad crops, "
                                                 "which Forge's padding of dynamic dims does not do), given {}"))
    mode = attrs.get("mode", b"constant")
    mode = mode.decode() if isinstance(mode, bytes) else str(mode)
    if mode not in _PAD_TE:
        raise ModelImportError(f"Pad {context.node!r}: mode {mode!r} with pads computed from dynamic dims is not "
                               f"supported (supported: {', '.join(_PAD_TE)}); give the model's inputs static shapes")
    if mode == "constant":
        fill = 0.0
        if len(inputs) > 2 and inputs[2] is not None:
            if not isinstance(inputs[2], tvm.ir.GenericConst):
                raise ModelImportError(f"Pad {context.node!r}: its constant_value must be known at import")
            fill = inputs[2].value.numpy().item()
        return bb.emit_te(topi.nn.pad, data, before, after, fill)
    if mode == "reflect":
        return bb.emit_te(topi.nn.mirror_pad, data, before, after, "REFLECT")
    return bb.emit_te(topi.nn.replicate_pad, data, before, after)


def concat(bb: relax.BlockBuilder, inputs: list[Any], attrs: dict[str, Any], context: ConverterContext) -> Any:
    """Concat as TVM converts it, its joined axis's extent simplified where it is a sum of dynamic extents
    (``min(1, n) + (n - min(1, n))`` is ``n``: the signal onnx-asr's NeMo preprocessors rebuild from its
    slices, which the model then masks with a mask of ``n``; unsimplified, the two could only be matched at
    run time, and TVM's FuseTIR then refused the model: "Inconsistent buffers")."""
    result = context.tvm_convert("Concat", inputs)
    if not isinstance(result, relax.Expr) or isinstance(result, relax.ShapeExpr):
        return result
    result = bb.normalize(result)
    ty = result.ty
    if not isinstance(ty, relax.TensorType) or not isinstance(ty.shape, relax.ShapeExpr) \
            or all(isinstance(d, tirx.IntImm) for d in ty.shape.values):
        return result
    analyzer = dims_analyzer(*ty.shape.values)
    simplified = [analyzer.simplify(d) for d in ty.shape.values]
    if all(str(a) == str(b) for a, b in zip(simplified, ty.shape.values)):
        return result
    parts = list(result.args[0].fields) if isinstance(result, relax.Call) and isinstance(result.args[0], relax.Tuple) \
        else None
    if parts is None or len(parts) < 2:
        return result
    axis = int(result.attrs.axis) % len(simplified)
    extents = [static_or_symbolic_dims(p)[axis] for p in parts]

    def joined(*tensors: Any) -> Any:
        # One compute whose output has the simplified shape (not a match_cast of TVM's concat to it, which TVM's
        # CanonicalizeTIRVariables recursed on without end when a fused reader took it).
        def element(*index: Any) -> Any:
            offsets = [tirx.IntImm("int64", 0)]
            for extent in extents[:-1]:
                offsets.append(offsets[-1] + extent)
            value = tensors[-1][(*index[:axis], index[axis] - offsets[-1], *index[axis + 1:])]
            for k in range(len(tensors) - 2, -1, -1):
                inner = tensors[k][(*index[:axis], index[axis] - offsets[k], *index[axis + 1:])]
                value = tirx.if_then_else(index[axis] < offsets[k + 1], inner, value)
            return value

        return te.compute(simplified, element, name="concatenate")

    return bb.emit_te(joined, *parts, primfunc_name_hint="concatenate")


CONVERTERS = {"Shape": shape, "Size": size, "Constant": constant, "ConstantOfShape": constant_of_shape,
              "Reshape": reshape, "Squeeze": squeeze,
              "Expand": expand, "Slice": slice_, "Pad": pad, "Concat": concat}


def center_crop_pad(bb: relax.BlockBuilder, inputs: list[Any], attrs: dict[str, Any],
                    context: ConverterContext) -> relax.Expr:
    """CenterCropPad to a constant shape: crop centered (extra on the end), pad with zeros centered."""
    x, target = inputs[0], inputs[1]
    dims = static_shape(x)
    if dims is None or not hasattr(target, "value"):
        raise ModelImportError("CenterCropPad needs a static input shape and a constant target shape")
    sizes = [int(v) for v in np.asarray(target.value.numpy()).reshape(-1)]
    rank = len(dims)
    axes = [int(a) % rank for a in attrs.get("axes", range(rank))]
    begin, end, pads = [], [], [0] * (2 * rank)
    for axis, size in zip(axes, sizes):
        current = dims[axis]
        if size < current:
            start = (current - size) // 2
            begin.append(start)
            end.append(start + size)
        else:
            begin.append(0)
            end.append(current)
            before = (size - current) // 2
            pads[2 * axis], pads[2 * axis + 1] = before, size - current - before
    cropped = bb.emit(relax.op.strided_slice(x, axes=axes, begin=begin, end=end))
    if any(pads):
        return relax.op.nn.pad(cropped, pads, pad_value=0.0)
    return cropped


CONVERTERS["CenterCropPad"] = center_crop_pad
