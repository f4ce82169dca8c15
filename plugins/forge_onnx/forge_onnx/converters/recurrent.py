"""RNN, GRU and LSTM: one matrix product for the input projection, then one kernel for the whole sequence.

ONNX's layouts (``layout`` 0 and 1), gate orders (GRU ``zrh``, LSTM ``iofc``),
directions (forward, reverse, bidirectional), activations with their
alpha/beta, ``clip``, LSTM peepholes and ``input_forget``, GRU
``linear_before_reset``, initial states, ``sequence_lens`` (every direction)
and the outputs ``Y``, ``Y_h``, ``Y_c`` follow the specification.

The graph a node becomes:

* ``X W^T + Wb (+ Rb)`` for every time step, gate and direction at once: one
  ``matmul`` and one ``add`` (which fuse), with ``W`` and the biases
  rearranged into the kernel's tile order (constants fold at import);
* one ``call_tir`` of the kernel (``recurrent_kernel.py``) that runs every
  step: ``H R^T``, the gates and the state update, tile by tile;
* ``permute_dims`` for ``layout`` 1.

float32 and float64 compute in their own type; float16 computes in float32.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import tvm
from tvm import relax

from forge_core.errors import InvalidModelError, ModelImportError
from forge_core.runtime.signature import RUN_TIME_CHECK
from forge_onnx.converters import ConverterContext, constant_value
from forge_onnx.converters.quantized import dynamically_quantized
from forge_onnx.converters.recurrent_kernel import LANES, RecurrentCell, build_kernel
from forge_onnx.converters.recurrent_math import activations
from forge_onnx.converters.shapes import static_or_symbolic_dims, static_shape

DEFAULT_ACTIVATIONS = {"rnn": ["Tanh"], "gru": ["Sigmoid", "Tanh"], "lstm": ["Sigmoid", "Tanh", "Tanh"]}
_COMPUTE_DTYPE = {"float16": "float32", "float32": "float32", "float64": "float64"}


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _given(inputs: list[Any], index: int) -> Any | None:
    """Optional input ``index``, or None when the node omits it."""
    return inputs[index] if len(inputs) > index and inputs[index] is not None else None


@dataclass
class _Node:
    """One recurrent node's operands, in ``layout`` 0 and the kernel's compute type."""

    kind: str
    x: relax.Expr
    w: relax.Expr
    r: relax.Expr
    bias: relax.Expr | None
    lengths: relax.Expr | None
    initial_h: relax.Expr | None
    initial_c: relax.Expr | None
    peepholes: relax.Expr | None
    cell: RecurrentCell
    dtype: str
    """The node's own type (float16 outputs are cast back)."""
    layout: int
    seq: Any
    """The sequence length: an int, or X's symbolic dim."""
    batch: Any
    """The batch: an int, or X's symbolic dim."""


def _read(bb: relax.BlockBuilder, kind: str, inputs: list[Any], attrs: dict[str, Any],
          context: ConverterContext) -> _Node:
    x, w, r = inputs[0], inputs[1], inputs[2]
    dtype = str(x.ty.dtype)
    if dtype not in _COMPUTE_DTYPE:
        raise InvalidModelError(f"recurrent operators take float16, float32 or float64, not {dtype}")
    compute = _COMPUTE_DTYPE[dtype]
    layout = int(attrs.get("layout", 0))
    if layout not in (0, 1):
        raise InvalidModelError(f"layout must be 0 or 1, given {layout}")

    def operand(value: relax.Expr | None, batch_first: bool = False) -> relax.Expr | None:
        if value is None:
            return None
        if batch_first and layout == 1:
            value = _permuted(bb, value, [1, 0, 2])
        if str(value.ty.dtype) == compute:
            return value
        return _apply(bb, [value], lambda a: a.astype(compute), lambda e: relax.op.astype(e, compute))

    x = operand(x, batch_first=True)
    shape = _dims(x)
    if shape is None or len(shape) != 3:
        raise ModelImportError(f"X must have rank 3 with known dims (dynamic ones named), given {x.ty}")
    if not isinstance(shape[2], int):
        raise ModelImportError(f"X's input size (its last dim) must be static, given {shape[2]}: W's shape depends "
                               "on it")
    seq, batch, _ = shape
    r_shape = static_shape(r)
    if r_shape is None:
        raise ModelImportError("recurrent operators need a static R shape")
    hidden = int(attrs["hidden_size"]) if "hidden_size" in attrs else r_shape[-1]
    direction = _text(attrs.get("direction", "forward"))
    reverse = {"forward": (False,), "reverse": (True,), "bidirectional": (False, True)}.get(direction)
    if reverse is None:
        raise InvalidModelError(f"unknown direction {direction!r}")
    names = [_text(n) for n in attrs.get("activations", [])] or DEFAULT_ACTIVATIONS[kind] * len(reverse)
    per = len(DEFAULT_ACTIVATIONS[kind])
    if len(names) != per * len(reverse):
        raise InvalidModelError(f"{kind.upper()} takes {per} activations per direction, given {len(names)}")
    functions = activations(names, list(attrs.get("activation_alpha", [])), list(attrs.get("activation_beta", [])))
    lengths = _given(inputs, 4)
    if lengths is not None:
        lengths = bb.emit(relax.op.astype(lengths, "int32"))
    initial_h, initial_c = operand(_given(inputs, 5), True), operand(_given(inputs, 6), True)
    initial_h = _with_batch(bb, initial_h, batch, f"{kind.upper()} {context.node!r} input initial_h", context)
    initial_c = _with_batch(bb, initial_c, batch, f"{kind.upper()} {context.node!r} input initial_c", context)
    peepholes = operand(_given(inputs, 7)) if kind == "lstm" else None
    clip = attrs.get("clip")
    cell = RecurrentCell(
        kind=kind, seq=seq if isinstance(seq, int) else None, batch=batch if isinstance(batch, int) else None,
        hidden=hidden, reverse=reverse,
        activations=tuple(tuple(functions[d * per:(d + 1) * per]) for d in range(len(reverse))),
        clip=None if clip is None else float(clip),
        linear_before_reset=kind == "gru" and bool(attrs.get("linear_before_reset", 0)),
        input_forget=kind == "lstm" and bool(attrs.get("input_forget", 0)),
        peepholes=peepholes is not None, lengths=lengths is not None,
        initial_h=initial_h is not None, initial_c=initial_c is not None, dtype=compute,
    )
    node = _Node(kind, x, operand(w), operand(r), operand(_given(inputs, 3)), lengths, initial_h, initial_c,
                 peepholes, cell, dtype, layout, seq, batch)
    _check_shapes(node, shape[2])
    return node


def _with_batch(bb: relax.BlockBuilder, state: relax.Expr | None, batch: Any, what: str,
                context: ConverterContext) -> relax.Expr | None:
    """A state whose batch is a dynamic dim of its own (Silero VAD's ``state`` input, dims named apart from the
    audio's): checked at run time to be X's batch, then typed with it, as the kernel takes them."""
    dims = None if state is None else _dims(state)
    if dims is None or len(dims) != 3 or isinstance(dims[1], int) or isinstance(batch, int) \
            or tvm.sym.Analyzer().can_prove_equal(dims[1], batch):
        return state
    sizes = bb.emit(relax.op.shape_to_tensor(relax.ShapeExpr([dims[1], batch])))
    agree = bb.emit(relax.op.equal(relax.op.take(sizes, relax.const(0, "int64")),
                                   relax.op.take(sizes, relax.const(1, "int64"))))
    branch = context.branch_taken()
    if branch is not None:  # in an If branch: checked when the branch runs
        agree = bb.emit(relax.op.logical_or(relax.op.logical_not(branch), agree))
    bb.emit(relax.op.assert_op(agree, [sizes], f"{RUN_TIME_CHECK}{what}: its batch (dim 1) must be X's batch; "
                                                f"given (state, X) {{}}"))
    bound = state if isinstance(state, relax.Var) else bb.emit(state)
    return bb.match_cast(bound, relax.TensorType([dims[0], batch, dims[2]], str(state.ty.dtype)))


def _dims(value: relax.Expr) -> list[Any] | None:
    """A tensor's dims: ints where static, Relax's expressions where dynamic; None when only its rank is known."""
    dims = static_or_symbolic_dims(value)
    return None if dims is None else [int(v.value) if isinstance(v, tvm.tirx.IntImm) else v for v in dims]


def _same_dims(given: list[Any] | None, want: list[Any]) -> bool:
    if given is None or len(given) != len(want):
        return False
    for a, b in zip(given, want):
        if isinstance(a, int) and isinstance(b, int):
            if a != b:
                return False
        elif not isinstance(a, int) and not isinstance(b, int) and tvm.sym.Analyzer().can_prove(a != b):
            return False
    # A dynamic dim against a static one, or two dynamic ones Relax cannot relate (X's batch and a state input's,
    # each named by its graph input), is checked at run time: the kernel binds both to one dim.
    return True


def _check_shapes(node: _Node, inputs: int) -> None:
    """Every operand's shape as ONNX defines it from ``hidden_size``, the directions and X: else ValueError.

    A dynamic batch is compared where Relax can relate the dims; the kernel checks the rest when it runs.
    """
    cell = node.cell
    dirs, gates, hidden, batch = cell.directions, cell.gates, cell.hidden, node.batch
    expected = {"W": (node.w, [dirs, gates * hidden, inputs]), "R": (node.r, [dirs, gates * hidden, hidden]),
                "B": (node.bias, [dirs, 2 * gates * hidden]), "sequence_lens": (node.lengths, [batch]),
                "initial_h": (node.initial_h, [dirs, batch, hidden]),
                "initial_c": (node.initial_c, [dirs, batch, hidden]), "P": (node.peepholes, [dirs, 3 * hidden])}
    for name, (value, want) in expected.items():
        if value is not None and not _same_dims(_dims(value), want):
            given = _dims(value)
            raise InvalidModelError(f"{node.kind.upper()} input {name} has shape "
                                    f"{list(given) if given is not None else 'unknown'}, expected {list(want)} "
                                    f"(layout 0) for hidden_size {hidden} and {dirs} direction(s)")


def _apply(bb: relax.BlockBuilder, values: list[relax.Expr], on_arrays: Callable[..., np.ndarray],
           on_exprs: Callable[..., relax.Expr]) -> relax.Expr:
    """``on_arrays`` on the values when all are constants (weights: rearranged here, once), else ``on_exprs``."""
    arrays = [constant_value(v) for v in values]
    if all(a is not None for a in arrays):
        result = np.ascontiguousarray(on_arrays(*arrays))
        return relax.const(result, str(result.dtype))
    return bb.emit(on_exprs(*values))


def _unit_rows(cell: RecurrentCell, groups: int) -> np.ndarray:
    """Row of ``[dirs * groups * hidden + 1, ...]`` each ``[dirs, tiles, groups, LANES]`` slot takes.

    Unit ``j = tile * LANES + lane`` of group ``g`` is row ``(d * groups + g) * hidden + j``; slots past
    ``hidden`` (the last tile's padding) take the extra last row, zeros.
    """
    d, t, g, lane = np.meshgrid(np.arange(cell.directions), np.arange(cell.tiles), np.arange(groups),
                                np.arange(LANES), indexing="ij")
    unit = t * LANES + lane
    rows = (d * groups + g) * cell.hidden + unit
    return np.where(unit < cell.hidden, rows, cell.directions * groups * cell.hidden).astype("int64")


def _tiled(bb: relax.BlockBuilder, value: relax.Expr, cell: RecurrentCell, groups: int) -> relax.Expr:
    """``[dirs, groups * hidden, *rest]`` -> ``[dirs, tiles, groups, LANES, *rest]``: units padded with zeros."""
    rest = static_shape(value)[2:]
    width = int(np.prod(rest, dtype=np.int64))
    rows = _unit_rows(cell, groups)
    shape = [*rows.shape, *rest]
    count = cell.directions * groups * cell.hidden

    def on_array(a: np.ndarray) -> np.ndarray:
        flat = np.concatenate([a.reshape(count, width), np.zeros((1, width), a.dtype)])
        return flat[rows.ravel()].reshape(shape)

    def on_expr(e: relax.Expr) -> relax.Expr:
        flat = relax.op.concat([relax.op.reshape(e, [count, width]), relax.op.zeros([1, width], cell.dtype)])
        return relax.op.reshape(relax.op.take(flat, relax.const(rows.ravel(), "int64"), axis=0), shape)

    return _apply(bb, [value], on_array, on_expr)


def _permuted(bb: relax.BlockBuilder, value: relax.Expr, axes: list[int]) -> relax.Expr:
    return _apply(bb, [value], lambda a: a.transpose(axes), lambda e: relax.op.permute_dims(e, axes))


def _reshaped(bb: relax.BlockBuilder, value: relax.Expr, shape: list[int]) -> relax.Expr:
    return _apply(bb, [value], lambda a: a.reshape(shape), lambda e: relax.op.reshape(e, shape))


def _biases(bb: relax.BlockBuilder, node: _Node) -> tuple[relax.Expr, relax.Expr | None]:
    """The projection's bias ``[dirs, gates * hidden]``: Wb + Rb; and GRU's Rb of gate h ``[dirs, hidden]``
    when ``linear_before_reset`` keeps it apart (the reset gate multiplies it; the projection then has Wb only)."""
    cell = node.cell
    gates, hidden, dirs = cell.gates, cell.hidden, cell.directions
    apart = cell.linear_before_reset
    if node.bias is None:
        zeros = relax.const(np.zeros((dirs, hidden), cell.dtype), cell.dtype)
        return relax.const(np.zeros((dirs, gates * hidden), cell.dtype), cell.dtype), zeros if apart else None
    halves = _reshaped(bb, node.bias, [dirs, 2, gates * hidden])

    def joined_array(b: np.ndarray) -> np.ndarray:
        recurrent = b[:, 1].copy()
        if apart:
            recurrent[:, 2 * hidden:] = 0
        return b[:, 0] + recurrent

    def joined_expr(b: relax.Expr) -> relax.Expr:
        w_bias = relax.op.reshape(relax.op.strided_slice(b, [1], [0], [1]), [dirs, gates * hidden])
        r_bias = relax.op.reshape(relax.op.strided_slice(b, [1], [1], [2]), [dirs, gates * hidden])
        if apart:
            r_bias = relax.op.concat([relax.op.strided_slice(r_bias, [1], [0], [2 * hidden]),
                                      relax.op.zeros([dirs, hidden], cell.dtype)], axis=1)
        return relax.op.add(w_bias, r_bias)

    joined = _apply(bb, [halves], joined_array, joined_expr)
    if not apart:
        return joined, None
    h_bias = _apply(bb, [halves], lambda b: b[:, 1, 2 * hidden:], lambda e: relax.op.reshape(
        relax.op.strided_slice(e, [1, 2], [1, 2 * hidden], [2, 3 * hidden]), [dirs, hidden]))
    return joined, h_bias


def _projection(bb: relax.BlockBuilder, node: _Node, bias: relax.Expr) -> relax.Expr:
    """``X W^T + bias`` for every step, direction and gate at once: ``[seq, batch, dirs, tiles, gates, LANES]``."""
    cell = node.cell
    inputs = _dims(node.x)[2]
    columns = cell.directions * cell.tiles * cell.gates * LANES
    w_t = _permuted(bb, _reshaped(bb, _tiled(bb, node.w, cell, cell.gates), [columns, inputs]), [1, 0])
    rows = bb.emit(relax.op.reshape(node.x, [node.seq * node.batch, inputs]))
    xw = bb.emit(relax.op.matmul(rows, w_t))
    xw = bb.emit(relax.op.add(xw, _reshaped(bb, _tiled(bb, bias, cell, cell.gates), [columns])))
    return bb.emit(relax.op.reshape(xw, [node.seq, node.batch, cell.directions, cell.tiles, cell.gates, LANES]))


EXACT_FLOAT_SUMS = 1 << 24
"""Integer sums below this are exact in float32: a quantized product whose sums stay below it is computed in
float32 (the vector unit's multiply-adds, any order of summation), else in int32."""


def exact_sums_type(weights: np.ndarray, rows: int) -> str:
    """``"float32"`` when every sum of ``rows`` products of a uint8 level less its zero point (at most 255 in
    magnitude) and one of ``weights`` stays below :data:`EXACT_FLOAT_SUMS`, else ``"int32"``."""
    largest = int(np.abs(weights.astype(np.int64)).max(initial=0))
    return "float32" if rows * 255 * largest < EXACT_FLOAT_SUMS else "int32"


@dataclass(frozen=True)
class WeightScales:
    """A quantized node's weight scales, ``[dirs, gates * hidden]`` constants (per row of ``W`` and ``R``, a
    per-direction scale repeated): its ``W`` and ``R`` are then integers less their zero points."""

    w: np.ndarray
    r: np.ndarray


def _quantized_projection(bb: relax.BlockBuilder, node: _Node, bias: relax.Expr, scales: WeightScales) -> relax.Expr:
    """:func:`_projection` as onnxruntime's ``DynamicQuantizeLSTM`` computes it: ``X`` quantized over the steps
    it runs (up to the longest ``sequence_lens``), an exact product with the integer ``W``, times the scales."""
    cell = node.cell
    inputs = _dims(node.x)[2]
    columns = cell.directions * cell.tiles * cell.gates * LANES
    w_t = _permuted(bb, _reshaped(bb, _tiled(bb, node.w, cell, cell.gates), [columns, inputs]), [1, 0])
    sums = exact_sums_type(constant_value(node.w), inputs)
    w_t = _apply(bb, [w_t], lambda a: a.astype(sums), lambda e: relax.op.astype(e, sums))
    counted = node.x
    if node.lengths is not None:  # steps past every row's length are not quantized (zeros leave the range as is)
        steps = relax.op.arange(0, node.seq, 1, "int32")
        running = relax.op.less(relax.op.reshape(steps, [node.seq, 1, 1]), relax.op.max(node.lengths))
        counted = bb.emit(relax.op.where(running, node.x, relax.const(0.0, "float32")))
    levels, scale = dynamically_quantized(bb, node.x, counted)
    rows = bb.emit(relax.op.reshape(relax.op.astype(levels, sums), [node.seq * node.batch, inputs]))
    product = bb.emit(relax.op.matmul(rows, w_t, out_dtype=sums))
    tiled_scales = _reshaped(bb, _tiled(bb, relax.const(scales.w), cell, cell.gates), [columns])
    xw = bb.emit(relax.op.multiply(relax.op.astype(product, "float32"), relax.op.multiply(scale, tiled_scales)))
    xw = bb.emit(relax.op.add(xw, _reshaped(bb, _tiled(bb, bias, cell, cell.gates), [columns])))
    return bb.emit(relax.op.reshape(xw, [node.seq, node.batch, cell.directions, cell.tiles, cell.gates, LANES]))


def _convert(bb: relax.BlockBuilder, kind: str, inputs: list[Any], attrs: dict[str, Any],
             context: ConverterContext, scales: WeightScales | None = None) -> relax.Expr:
    node = _read(bb, kind, inputs, attrs, context)
    if scales is not None:
        recurrent_weights = constant_value(node.r)
        node.cell = dataclasses.replace(node.cell, quantized=exact_sums_type(recurrent_weights, node.cell.hidden))
    cell = node.cell
    bias, h_bias = _biases(bb, node)
    # R^T tiled: [dirs, tiles, gates, LANES, hidden] -> [dirs, tiles, hidden, gates, LANES]
    r_t = _permuted(bb, _tiled(bb, node.r, cell, cell.gates), [0, 1, 4, 2, 3])
    if scales is None:
        args = [_projection(bb, node, bias), r_t]
    else:
        sums = cell.quantized
        args = [_quantized_projection(bb, node, bias, scales),
                _apply(bb, [r_t], lambda a: a.astype(sums), lambda e: relax.op.astype(e, sums)),
                _tiled(bb, relax.const(scales.r), cell, cell.gates)]
    if h_bias is not None:
        args.append(_reshaped(bb, _tiled(bb, h_bias, cell, 1), [cell.directions, cell.tiles, LANES]))
    if node.peepholes is not None:  # [dirs, 3 * hidden] -> [dirs, 3, tiles, LANES]
        args.append(_permuted(bb, _tiled(bb, node.peepholes, cell, 3), [0, 2, 1, 3]))
    args += [a for a in (node.lengths, node.initial_h, node.initial_c) if a is not None]
    kernel = bb.add_func(build_kernel(cell), f"{kind}_sequence")
    out_types = [relax.TensorType(shape, cell.dtype) for shape in cell.output_shapes_for(node.seq, node.batch)]
    results = bb.emit(relax.call_tir(kernel, relax.Tuple(args), out_types))
    outputs = []
    for index in range(len(out_types)):
        value = bb.emit(relax.TupleGetItem(results, index))
        if node.layout == 1:
            value = bb.emit(relax.op.permute_dims(value, [2, 0, 1, 3] if index == 0 else [1, 0, 2]))
        if node.dtype != cell.dtype:
            value = bb.emit(relax.op.astype(value, node.dtype))
        outputs.append(value)
    return relax.Tuple(outputs)


def rnn(bb: relax.BlockBuilder, inputs: list[Any], attrs: dict[str, Any], context: ConverterContext) -> relax.Expr:
    """RNN: H_t = f(X_t W^T + H_(t-1) R^T + Wb + Rb)."""
    return _convert(bb, "rnn", inputs, attrs, context)


def gru(bb: relax.BlockBuilder, inputs: list[Any], attrs: dict[str, Any], context: ConverterContext) -> relax.Expr:
    """GRU with gates z, r, h; ``linear_before_reset`` as specified."""
    return _convert(bb, "gru", inputs, attrs, context)


def lstm(bb: relax.BlockBuilder, inputs: list[Any], attrs: dict[str, Any], context: ConverterContext,
         scales: WeightScales | None = None) -> relax.Expr:
    """LSTM with gates i, o, f, c; peepholes and ``input_forget`` as specified.

    With ``scales``, ``W`` and ``R`` are int8 weights less their zero points (any integer type) and the node
    computes as onnxruntime's ``DynamicQuantizeLSTM``: ``X`` and each step's hidden state quantized to uint8 on
    the fly, integer products scaled back to float32.
    """
    return _convert(bb, "lstm", inputs, attrs, context, scales)


CONVERTERS = {"RNN": rnn, "GRU": gru, "LSTM": lstm}
