"""TVM's Relax TFLite importer, with dynamic dimensions and every converter failure named.

Dynamic dimensions become TIR variables in the input types: the batch (axis 0)
is one variable ``batch`` shared by every input, any other dynamic axis a
variable ``<input>_dim<axis>``. TVM's converters handle such shapes for
convolutions, pooling, elementwise ops and matmuls, and
:mod:`forge_tf.symbolic_shapes` evaluates the shape arithmetic of reshapes;
where a converter still cannot, the import fails and the loaders take their
fallback route.
"""

from __future__ import annotations

import functools
import operator
import re
import traceback
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import tvm
from tvm import relax, tirx
from tvm.relax.frontend.tflite import from_tflite
from tvm.relax.frontend.tflite.tflite_frontend import OperatorConverter, TensorWrapper

from forge_core.errors import (
    ForgeError, InvalidModelError, ModelImportError, OperatorConversionError, UnsupportedOperatorError,
)
from forge_core.ir.loops import INT64_MAX, LoopSpec, build_loop
from forge_core.ir.index_checks import emit_index_check
from forge_tf.console import captured_output
from forge_tf.custom_ops import PluginConverterError, TFLiteConverterContext, call_plugin_converter, plugin_converters
from forge_tf.hybrid import FloatView, dequantized, hybrid_weights
from forge_tf.operator_support import MOVES_QUANTIZED_VALUES, operator_code
from forge_tf.resource_variables import RESOURCE_OPS
from forge_tf.signature import Dim
from forge_tf.symbolic_shapes import SymbolicShapes, symbolic_int_lists
from forge_tf.tflite_model import TFLiteModel, tensor_name

BATCH_VAR = "batch"


class ForgeOperatorConverter(SymbolicShapes, OperatorConverter):
    """TVM's converter, with shape arithmetic on dynamic dimensions (:mod:`forge_tf.symbolic_shapes`) and
    every per-operator failure named by the op and its first output tensor.

    With ``check_declared`` (the model's own input shapes and types), every
    operator's result must have the dtype and the static shape that the
    flatbuffer declares for its output: TFLite's converter writes them exactly,
    and an operator whose code, inputs, options or types a corrupt file changed
    computes something else, which TFLite's interpreter rejects.
    """

    # GATHER, the slices and splits move int8 values exactly when their outputs keep their input's scale and
    # zero point, which forge_tf.operator_support.check_operators requires of them before conversion starts;
    # the resource-variable ops move stored values.
    _SUPPORTED_QUANTIZED_OPS = OperatorConverter._SUPPORTED_QUANTIZED_OPS | MOVES_QUANTIZED_VALUES | RESOURCE_OPS

    def __init__(self, model: Any, subgraph: Any, *args: Any, check_declared: bool = False, **kwargs: Any) -> None:
        super().__init__(model, subgraph, *args, **kwargs)
        self._init_symbolic_shapes()
        self._check_declared = check_declared
        self._run_time_dims: list[tirx.Var] = []  # dims known at run time only, made by convert_slice and below
        self._plugin_converters = plugin_converters()
        converters = {**self.convert_map, **{code: functools.partial(self._convert_with_plugin, code)
                                             for code in self._plugin_converters}}
        self.convert_map = {code: self._named(code, convert) for code, convert in converters.items()}
        codes = [operator_code(model, subgraph.Operators(i)) for i in range(subgraph.OperatorsLength())]
        self._hybrid_weights = hybrid_weights(model, subgraph, codes)

    def check_unsupported_ops(self) -> None:
        """Nothing: :func:`forge_tf.operator_support.check_operators` checked every subgraph's operators before
        conversion started, as TVM's check does, less what Forge converts besides (plugins' ops, hybrid and
        value-moving quantized ops, assignments of state variables), and reported them all at once."""

    def convert_read_variable(self, op: Any) -> Any:
        """A read of a state variable before the invocation assigns it: the state input
        (:mod:`forge_tf.resource_variables`); other reads as TVM's (the value last assigned, or the init's)."""
        output = self.get_output_tensors(op)[0]
        state_input = getattr(self.subgraph, "state_reads", {}).get(output.tensor_idx)
        if state_input is not None:
            return self.exp_tab.get_expr(tensor_name(self.subgraph, state_input))
        return super().convert_read_variable(op)

    def convert_assign_variable(self, op: Any) -> Any:
        """An assignment outside the init subgraph: later reads in this invocation get the value; the last one
        assigned to a state variable is the state output (:mod:`forge_tf.resource_variables`)."""
        if self.conversion_state["in_call_once_init"]:
            return super().convert_assign_variable(op)
        inputs = self.get_input_tensors(op)
        if len(inputs) != 2 or self.get_output_tensors(op):
            raise tvm.error.OpNotImplemented("ASSIGN_VARIABLE expects a resource handle and a value, and no outputs")
        key = self._get_resource_key_for_handle(inputs[0], "ASSIGN_VARIABLE")
        self.conversion_state["resource_values"][key] = self.get_tensor_expr(inputs[1])
        return None

    def convert_fill(self, op: Any) -> Any:
        """FILL whose value is a constant tensor (Keras 3's LSTM and GRU fill their TensorList buffers so); TVM's
        converter looked the value up among computed tensors only ("KeyError: 'arith.constant'")."""
        inputs = self.get_input_tensors(op)
        if len(inputs) != 2:
            raise tvm.error.OpNotImplemented(f"FILL takes a shape and a value; it has {len(inputs)} inputs")
        value = self.get_tensor_expr(inputs[1])
        if isinstance(getattr(value, "ty", None), relax.TensorType) and value.ty.ndim not in (0, -1):
            value = relax.op.reshape(value, [])
        shape, _ = self._get_shape_expr_from_tensor(inputs[0], "fill_dim")
        return relax.op.full(shape, value)

    def convert_while(self, op: Any) -> Any:
        """WHILE on Forge's chunked loop (:func:`forge_core.ir.loops.build_loop`), the cond and body subgraphs
        lowered to functions as TVM's converter lowers them. TVM's converter calls the body function once per
        iteration, each call nested in the last: TVM's VM recurses on the C++ stack, which a Keras LSTM over a
        few thousand steps overflowed (the process crashed)."""
        from tflite.WhileOptions import WhileOptions

        opts = self._get_builtin_options(op, WhileOptions)
        cond_index, body_index = int(opts.CondSubgraphIndex()), int(opts.BodySubgraphIndex())
        inputs, outputs = self.get_input_tensors(op), self.get_output_tensors(op)
        if not inputs or len(outputs) != len(inputs):
            raise tvm.error.OpNotImplemented("WHILE needs loop-carried values, one output for each")
        cond_graph = self._check_subgraph_interface(cond_index, "WHILE", input_tensors=inputs, output_count=1)
        self._check_subgraph_interface(body_index, "WHILE", input_tensors=inputs, output_tensors=inputs)
        for given, returned in zip(inputs, outputs):
            self._check_tensor_metadata_match(given, returned, "WHILE", "loop state")
        self._require_scalar_bool_tensor(cond_graph.Tensors(int(cond_graph.Outputs(0))), "WHILE")
        cond_function = self._lower_subgraph_to_function(cond_index, f"tflite_while_cond_{cond_index}", "WHILE")
        body_function = self._lower_subgraph_to_function(body_index, f"tflite_while_body_{body_index}", "WHILE")
        bb = self.bb
        carried = [self.get_tensor_expr(tensor) for tensor in inputs]

        def condition(values: list[Any]) -> Any:
            value = bb.emit(relax.Call(cond_function, values))
            return bb.emit(relax.op.reshape(value, [])) if value.ty.ndim != 0 else value

        def step(i: Any, cond: Any, values: list[Any], captured: dict[str, Any]) -> tuple[Any, list[Any], list[Any]]:
            result = bb.emit(relax.Call(body_function, values))
            following = [bb.emit(relax.TupleGetItem(result, k)) for k in range(len(values))] \
                if isinstance(result.ty, relax.TupleType) else [result]
            return condition(following), following, []

        node = tensor_name(self.subgraph, outputs[0].tensor_idx)
        spec = LoopSpec("tflite", "WHILE", node, [f"state{k}" for k in range(len(carried))], carried, {}, [], step)
        finals, _ = build_loop(bb, spec, relax.const(INT64_MAX, "int64"), condition(carried))
        return finals[0] if len(finals) == 1 else relax.Tuple(finals)

    def convert_slice(self, op: Any) -> Any:
        """SLICE, also where its begin or size is computed at run time: Keras 3's LSTM and GRU, converted to
        TFLite, write each step's output into their TensorList as ``concat(list[:t], item, list[t + 1:])``
        inside the WHILE body, at the loop's index ``t`` (TVM's converter needs both at import)."""
        inputs = self.get_input_tensors(op)
        if len(inputs) != 3 or not any(self.has_expr(t.tensor_idx) for t in inputs[1:]):
            return super().convert_slice(op)
        data = self.get_tensor_expr(inputs[0])
        rank = data.ty.ndim
        begin_given, size_given = self.get_tensor_expr(inputs[1]), self.get_tensor_expr(inputs[2])
        begin = relax.op.astype(begin_given, "int64")
        size = relax.op.astype(size_given, "int64")
        extents = relax.op.shape_to_tensor(relax.op.shape_of(data))
        end = relax.op.where(relax.op.equal(size, relax.const(-1, "int64")), extents, relax.op.add(begin, size))
        strides = relax.const(np.ones(rank, "int64"), "int64")
        sliced = self.bb.emit(relax.op.dynamic_strided_slice(data, self.bb.normalize(begin), self.bb.normalize(end),
                                                             strides))
        # The extents known at import: a size given, or the rest of a static axis from a begin given.
        starts = _known_elements(self.bb, begin_given, rank)
        sizes = _known_elements(self.bb, size_given, rank)
        shape = data.ty.shape.values if isinstance(data.ty.shape, relax.ShapeExpr) else [None] * rank
        name = self._dim_label(int(op.Outputs(0)))
        dims = []
        for axis in range(rank):
            start, size, extent = starts[axis], sizes[axis], shape[axis]
            if size is not None and size >= 0:
                dims.append(tirx.IntImm("int64", size))
            elif size == -1 and start is not None and isinstance(extent, tirx.IntImm):
                dims.append(tirx.IntImm("int64", max(int(extent) - start, 0)))
            else:
                dims.append(self._run_time_dim(f"{name}_d{axis}"))
        return self.bb.match_cast(sliced, relax.TensorType(dims, data.ty.dtype))

    def get_op_code_str(self, op: Any) -> str:
        """TVM's, with a custom operator a plugin converts named by its custom code."""
        code = operator_code(self.model, op)
        if code in self._plugin_converters:
            return code
        return str(super().get_op_code_str(op))

    def _computed_constant(self, wrapper: Any, expr: Any) -> np.ndarray | None:
        """The value of an input the model computes from constants alone at import: float16 weights behind a
        DEQUANTIZE (MediaPipe's selfie segmentation feeds its Convolution2DTransposeBias so), a DENSIFY's
        dense weights. None for anything else."""
        if self.is_prefetched(wrapper.tensor_idx):
            return np.asarray(self.get_prefetched_node(wrapper.tensor_idx))
        for _ in range(8):  # through the variables bound to it
            if isinstance(expr, relax.Var):
                expr = self.bb.lookup_binding(expr)
            elif isinstance(expr, tvm.ir.GenericConst):
                return expr.value.numpy()
            elif isinstance(expr, relax.Call) and getattr(expr.op, "name", "") == "relax.astype" \
                    and isinstance(expr.args[0], tvm.ir.GenericConst):
                return expr.args[0].value.numpy().astype(str(expr.attrs.dtype))
            else:
                return None
        return None

    def _convert_with_plugin(self, code: str, op: Any) -> Any:
        """A plugin's converter (:mod:`forge_tf.custom_ops`) on the operator's inputs, options and context."""
        converter = self._plugin_converters[code]
        inputs, constants = [], []
        for wrapper in self.get_input_tensors(op):
            if wrapper.tensor_idx < 0:
                inputs.append(None)
                constants.append(None)
                continue
            constant = not self.has_expr(wrapper.tensor_idx) and wrapper.buffer.DataLength() > 0
            expr = self.get_tensor_expr(wrapper)
            constants.append(self.get_tensor_value(wrapper) if constant else self._computed_constant(wrapper, expr))
            inputs.append(expr)
        outputs = self.get_output_tensors(op)
        if op.CustomOptionsLength():
            options: Any = op.CustomOptionsAsNumpy().tobytes()
        elif code.isupper() and op.BuiltinOptions() is not None:  # a builtin's name; custom codes are not
            options = op.BuiltinOptions()
        else:
            options = b""
        context = TFLiteConverterContext(
            op_type=code, node=tensor_name(self.subgraph, outputs[0].tensor_idx) if outputs else f"<{code}>",
            constants=tuple(constants),
            output_shapes=tuple(tuple(int(d) for d in w.tensor.ShapeAsNumpy()) if w.tensor.ShapeLength() else ()
                                for w in outputs),
            output_dtypes=tuple(self.get_tensor_type_str(w.tensor.Type()) for w in outputs),
            plugin=converter.plugin,
        )
        try:
            return call_plugin_converter(converter, self.bb, inputs, options, context)
        except PluginConverterError as exc:
            raise ModelImportError(str(exc)) from exc.__cause__

    def get_tensors(self, tensors_idx_list: Any) -> list[Any]:
        """TVM's, with the int8 weights of hybrid ops (:mod:`forge_tf.hybrid`) as the float tensors they
        stand for."""
        wrappers = super().get_tensors(tensors_idx_list)
        if not self._hybrid_weights:
            return wrappers
        return [TensorWrapper(w.tensor_idx, FloatView(w.tensor), w.buffer, None)
                if w.tensor_idx in self._hybrid_weights else w for w in wrappers]

    def get_tensor_value(self, tensor_wrapper: Any, is_sparse: bool = False) -> Any:
        """TVM's, with a clear error where a converter needs a value the model computes at run time."""
        tensor = tensor_wrapper.tensor
        if isinstance(tensor, FloatView) and not is_sparse:
            return dequantized(self.model, tensor._tensor)
        if self.is_prefetched(tensor_wrapper.tensor_idx):
            # A DENSIFY's dense weights (computed at import), read by a DEQUANTIZE of float16 weights: MediaPipe's
            # sparse float16 detectors (face_detection_full_range_sparse, pose_detection).
            return self.get_prefetched_node(tensor_wrapper.tensor_idx)
        if tensor_wrapper.buffer.DataLength() == 0 and tensor.ShapeLength() \
                and int(np.prod(tensor.ShapeAsNumpy())) > 0:
            raise tvm.error.OpNotImplemented(
                f"TVM's converter needs the value of tensor {tensor_name(self.subgraph, tensor_wrapper.tensor_idx)!r} "
                "at import, and the model computes it at run time"
            )
        return super().get_tensor_value(tensor_wrapper, is_sparse)

    def _declared_dims(self, op: Any, result: Any) -> Any:
        """A one-output result whose dims Relax could not infer, typed with what the flatbuffer declares (its
        shape signature: a static dim where it gives one, a new symbolic dim where it gives -1), checked when
        the model runs. Inside a WHILE body, a slice at the loop's index (``list[:t]``) has a dim known only at
        run time, and the TensorList joined back from the slices has the static shape the loop carries."""
        outputs = self.get_output_tensors(op)
        ty = getattr(result, "ty", None)
        if len(outputs) != 1 or not isinstance(ty, relax.TensorType) or ty.ndim < 0:
            return result
        tensor = outputs[0].tensor
        declared = tensor.ShapeSignatureAsNumpy() if tensor.ShapeSignatureLength() else tensor.ShapeAsNumpy() \
            if tensor.ShapeLength() else None
        if declared is None or len(declared) != ty.ndim:
            return result
        dims = list(ty.shape.values) if isinstance(ty.shape, relax.ShapeExpr) else [None] * ty.ndim
        wanted, changed = [], False
        name = self._dim_label(outputs[0].tensor_idx)
        for axis, (dim, size) in enumerate(zip(dims, declared)):
            # Only a dim Relax does not know, or one computed from run-time dims of Forge's own: a dim of a
            # dynamic input (a batch the caller made dynamic) stays as Relax infers it.
            if dim is not None and (isinstance(dim, tirx.IntImm) or int(size) < 0 or not self._from_run_time(dim)):
                wanted.append(dim)
            elif int(size) >= 0:
                wanted.append(tirx.IntImm("int64", int(size)))
                changed = True
            else:
                wanted.append(self._run_time_dim(f"{name}_d{axis}"))
                changed = True
        if not changed:
            return result
        bound = result if isinstance(result, relax.Var) else self.bb.emit(result)
        return self.bb.match_cast(bound, relax.TensorType(wanted, ty.dtype))

    def _dim_label(self, tensor_index: int) -> str:
        """A tensor's name as the prefix of the symbolic dims made for it: an identifier."""
        return re.sub(r"\W+", "_", tensor_name(self.subgraph, tensor_index)).strip("_") or "value"

    def _run_time_dim(self, name: str) -> tirx.Var:
        dim = tirx.Var(name, "int64")
        self._run_time_dims.append(dim)
        return dim

    def _from_run_time(self, dim: Any) -> bool:
        used = tvm.tirx.analysis.undefined_vars(dim)
        return any(v.same_as(d) for v in used for d in self._run_time_dims)

    def _lost_shape(self, op: Any, result: Any) -> str | None:
        """Why a result has no shape although its inputs have one (e.g. a concatenation of a dynamic batch
        with a batch of 1): later passes cannot compile a tensor of unknown shape. None when it has one."""
        types = list(result.ty.fields) if isinstance(result.ty, relax.TupleType) else [result.ty]
        if all(not isinstance(ty, relax.TensorType) or isinstance(ty.shape, relax.ShapeExpr) for ty in types):
            return None
        shapes = []
        for wrapper in self.get_input_tensors(op):
            if wrapper.tensor_idx < 0 or not self.has_expr(wrapper.tensor_idx):
                continue
            ty = self.bb.normalize(self.get_expr(wrapper.tensor_idx)).ty
            if not isinstance(getattr(ty, "shape", None), relax.ShapeExpr):
                return None  # the shape was unknown before this op
            shapes.append(tuple(int(d) if isinstance(d, tirx.IntImm) else str(d) for d in ty.shape.values))
        return f"the shapes of its inputs {', '.join(map(str, shapes))} do not determine the shape of its output"

    def _declared_mismatch(self, op: Any, result: Any) -> str | None:
        """How the converted result differs from the op's declared outputs, or None."""
        outputs = self.get_output_tensors(op)
        ty = result.ty
        types = list(ty.fields) if isinstance(ty, relax.TupleType) else [ty]
        if len(types) != len(outputs):
            return None
        for wrapper, field in zip(outputs, types):
            tensor = wrapper.tensor
            name = tensor_name(self.subgraph, wrapper.tensor_idx)
            try:
                declared_dtype = self.get_tensor_type_str(tensor.Type())
            except Exception:  # noqa: BLE001 - a type TVM has no name for: nothing to compare
                continue
            dtype = getattr(field, "dtype", None)
            if dtype is not None and str(dtype) != declared_dtype:
                return f"it computes {name!r} as {dtype}; the model declares {declared_dtype}"
            shape = getattr(field, "shape", None)
            declared = [int(d) for d in tensor.ShapeAsNumpy()] if tensor.ShapeLength() else []
            if shape is None or not isinstance(shape, relax.ShapeExpr) or not declared:
                continue
            # The inputs have their stored static shapes: every static dimension is the stored one, the
            # batch too (stored as 1 where shape_signature has -1). A dimension that depends on data is symbolic.
            dims = list(shape.values)
            if len(dims) != len(declared) or any(
                    isinstance(dim, tirx.IntImm) and int(dim) != declared[axis] for axis, dim in enumerate(dims)):
                computed = tuple(int(d) if isinstance(d, tirx.IntImm) else str(d) for d in dims)
                return f"it computes {name!r} of shape {computed}; the model declares {tuple(declared)}"
        return None

    def convert_fully_connected(self, op: Any) -> Any:
        """TVM's FULLY_CONNECTED, flattening the leading dims unless ``keep_num_dims``, as TFLite defines it.

        TVM multiplies an N-d input as it is: Keras's VGG16 at 32x32 (Flatten of a 1x1 map, which the TFLite
        converter folds into the FULLY_CONNECTED) came out as (1, 1, 1, 1000) instead of (1, 1000).
        """
        from tflite.FullyConnectedOptions import FullyConnectedOptions

        out = super().convert_fully_connected(op)
        options = FullyConnectedOptions()
        options.Init(op.BuiltinOptions().Bytes, op.BuiltinOptions().Pos)
        rank = len(self.get_input_tensors(op)[0].tensor.ShapeAsNumpy())
        if options.KeepNumDims() or rank <= 2:
            return out
        units = int(self.get_input_tensors(op)[1].tensor.ShapeAsNumpy()[0])
        # The quantized path returns its requantize unnormalized (a reshape needs its type).
        return relax.op.reshape(self.bb.normalize(out), [-1, units])

    def convert_split_v(self, op: Any) -> Any:
        """TVM's SPLIT_V, with constant sizes that hold a 0 or a -1 ("the rest") taken as slices.

        TVM's split takes the sizes' running sums as split points, which must rise strictly: a split of size 0
        (which TFLite's interpreter runs, giving an empty output) failed to build, and a -1 other than last
        would have split at a negative point.
        """
        inputs = self.get_input_tensors(op)
        if len(inputs) != 3 or self.has_expr(inputs[1].tensor_idx):
            return super().convert_split_v(op)
        sizes = [int(size) for size in np.ravel(self.get_tensor_value(inputs[1]))]
        if all(size > 0 for size in sizes):
            return super().convert_split_v(op)
        data = self.get_expr(inputs[0].tensor_idx)
        shape = data.ty.shape
        axis = int(np.ravel(self.get_tensor_value(inputs[2]))[0]) % len(shape)
        if sizes.count(-1) == 1:
            if not isinstance(shape[axis], tirx.IntImm):
                return super().convert_split_v(op)
            sizes[sizes.index(-1)] = int(shape[axis]) - sum(size for size in sizes if size != -1)
        outputs, start = [], 0
        for size in sizes:
            outputs.append(relax.op.strided_slice(data, axes=[axis], begin=[start], end=[start + size]))
            start += size
        return relax.Tuple(outputs) if len(outputs) > 1 else outputs[0]

    def convert_transpose_conv(self, op: Any) -> Any:
        """TVM's TRANSPOSE_CONV, with its fused activation applied.

        TVM's converter drops ``TransposeConvOptions.FusedActivationFunction``:
        Keras's ``Conv2DTranspose(..., activation="relu")`` came out without its
        ReLU, every negative output wrong.
        """
        from tflite.ActivationFunctionType import ActivationFunctionType
        from tflite.TransposeConvOptions import TransposeConvOptions

        out = super().convert_transpose_conv(op)
        options = TransposeConvOptions()
        options.Init(op.BuiltinOptions().Bytes, op.BuiltinOptions().Pos)
        activation = options.FusedActivationFunction()
        if activation == ActivationFunctionType.NONE:
            return out
        output = self.get_output_tensors(op)[0]
        if output.qnn_params:
            from tvm.relax.frontend.tflite.tflite_frontend import get_scalar_from_constant

            return self.convert_qnn_fused_activation_function(
                expr=out, fused_activation_fn=activation,
                scale=get_scalar_from_constant(output.qnn_params["scale"]),
                zero_point=get_scalar_from_constant(output.qnn_params["zero_point"]),
                dtype=self.get_tensor_type_str(output.tensor.Type()))
        return self.convert_fused_activation_function(out, activation)

    def _named(self, code: str, convert: Callable[..., Any]) -> Callable[..., Any]:
        symbolic = self.symbolic_converter(code)

        def call(op: Any) -> Any:
            try:
                result = symbolic(op) if symbolic is not None else None
                if result is None:
                    result = convert(op=op)
                if result is None:
                    return None
                result = _checked_take(self.bb, result, self._op_label(code, op))
                # Type inference runs here, so that an op whose types or shapes do not fit (a corrupt model,
                # a dtype_dict the graph cannot take) is named like any other failure.
                result = self._declared_dims(op, self.bb.normalize(result))
                lost = self._lost_shape(op, result) or _compared_types(result)
                if lost is not None:
                    raise ModelImportError(lost)
                mismatch = self._declared_mismatch(op, result) if self._check_declared else None
                if mismatch is not None:
                    raise InvalidModelError(mismatch)
                return result
            except (OperatorConversionError, UnsupportedOperatorError):
                raise
            except ModelImportError as exc:  # the checks above and symbolic_shapes refuse with these: named too
                raise self._conversion_error(code, op, exc) from exc
            except ForgeError:
                raise
            except Exception as exc:  # noqa: BLE001 - converters fail with anything from asserts to TVMError
                raise self._conversion_error(code, op, described_assertion(exc)) from exc

        return call

    def _op_label(self, code: str, op: Any) -> str:
        """``op`` in a message: its code and its first output tensor's name."""
        output = int(op.Outputs(0)) if op.OutputsLength() else -1
        return f"{code} {tensor_name(self.subgraph, output)!r}" if output >= 0 else code

    def _conversion_error(self, code: str, op: Any, cause: BaseException) -> OperatorConversionError:
        """``cause`` as the failure of ``op``, named by its first output tensor."""
        output = int(op.Outputs(0)) if op.OutputsLength() else -1
        node = tensor_name(self.subgraph, output) if output >= 0 else f"<{code} without outputs>"
        return OperatorConversionError("tflite", operator_code(self.model, op), node, cause)


def _known_elements(bb: relax.BlockBuilder, expr: Any, length: int) -> list[int | None]:
    """The elements of a 1-D int tensor that import knows (constants, joined by concatenations and casts, through
    the bindings), None for the ones computed at run time."""
    unknown: list[int | None] = [None] * length
    seen = 0
    while isinstance(expr, relax.Var) and seen < 64:  # through the bindings to the value
        bound = bb.lookup_binding(expr)
        if bound is None:
            return unknown
        expr, seen = bound, seen + 1
    if isinstance(expr, tvm.ir.GenericConst):
        values = expr.value.numpy().reshape(-1)
        return [int(v) for v in values] if values.size == length else unknown
    if not isinstance(expr, relax.Call) or not isinstance(expr.op, tvm.ir.Op):
        return unknown
    name = str(expr.op.name)
    if name == "relax.astype":
        return _known_elements(bb, expr.args[0], length)
    if name == "relax.concat" and isinstance(expr.args[0], relax.Tuple):
        parts: list[int | None] = []
        for field in expr.args[0].fields:
            ty = getattr(field, "ty", None)
            if not isinstance(ty, relax.TensorType) or not isinstance(ty.shape, relax.ShapeExpr) \
                    or len(ty.shape.values) != 1 or not isinstance(ty.shape.values[0], tirx.IntImm):
                return unknown
            parts += _known_elements(bb, field, int(ty.shape.values[0]))
        return parts if len(parts) == length else unknown
    return unknown


def _checked_take(bb: relax.BlockBuilder, result: Any, what: str) -> Any:
    """A GATHER's or EMBEDDING_LOOKUP's ``take`` of indices known only at run time, with a run-time check.

    TVM's converters ask for mode "fast", which reads outside the tensor for an index out of range (a crash,
    or numbers from other memory), where TFLite raises ("gather index out of bounds"). Forge had clamped such
    an index (the first or last slice: a wrong number without a word); it now refuses the run as the
    interpreter does: the count of indices outside ``[0, n)``, ``n`` the extent of the axis taken, must be 0
    (:data:`~forge_core.runtime.signature.RUN_TIME_CHECK`, raised as ``InputError``). Constant indices are
    checked by the converter at import. ``what`` names the operator in the message.
    """
    if not isinstance(result, relax.Call) or not isinstance(result.op, tvm.ir.Op) or result.op.name != "relax.take" \
            or str(result.attrs.mode) != "fast" or isinstance(result.args[1], tvm.ir.GenericConst):
        return result
    data, indices = result.args
    axis = result.attrs.axis
    ty = bb.normalize(data).ty
    if not isinstance(ty, relax.TensorType) or not isinstance(ty.shape, relax.ShapeExpr):
        return result
    dims = list(ty.shape.values)
    if axis is None:  # the flattened tensor's elements
        extent = functools.reduce(operator.mul, dims) if dims else tirx.IntImm("int64", 1)
    else:
        axis = int(axis) + len(dims) if int(axis) < 0 else int(axis)
        if not 0 <= axis < len(dims):
            return result  # Relax's type inference refuses the take itself
        extent = dims[axis]
    emit_index_check(bb, indices, [extent], label=what, where="the axis it takes", reference="TFLite's interpreter")
    return result


_COMPARISONS = frozenset({"relax.less", "relax.less_equal", "relax.greater", "relax.greater_equal", "relax.equal",
                          "relax.not_equal"})


def _compared_types(result: Any) -> str | None:
    """Why a comparison's operands cannot be compared (Relax infers its type without checking them, and
    compiling fails later), or None."""
    if not isinstance(result, relax.Call) or not isinstance(result.op, tvm.ir.Op) \
            or result.op.name not in _COMPARISONS:
        return None
    dtypes = [str(arg.ty.dtype) for arg in result.args if isinstance(arg.ty, relax.TensorType)]
    return None if len(set(dtypes)) <= 1 else f"it compares tensors of types {' and '.join(dtypes)}"


def described_assertion(exc: BaseException) -> BaseException:
    """``exc``, or for a bare ``assert`` of TVM's converter, an AssertionError quoting the failed check."""
    if not isinstance(exc, AssertionError) or str(exc).strip():
        return exc
    frames = traceback.extract_tb(exc.__traceback__)
    line = frames[-1].line if frames else ""
    return AssertionError(f"TVM's check `{line}` failed" if line else "TVM's converter rejected the operator")


def _var_name(text: str) -> str:
    return re.sub(r"\W", "_", text)


def shapes_with_variables(shapes: Mapping[str, Sequence[Dim]]) -> dict[str, tuple[Any, ...]]:
    """Shapes for TVM's importer: a ``tirx.Var`` in place of each dynamic dimension."""
    batch = tirx.Var(BATCH_VAR, "int64")
    typed: dict[str, tuple[Any, ...]] = {}
    for name, dims in shapes.items():
        typed[name] = tuple(
            (batch if axis == 0 else tirx.Var(f"{_var_name(name)}_dim{axis}", "int64")) if dim is None else int(dim)
            for axis, dim in enumerate(dims)
        )
    return typed


class _InputProbe:
    """Tells whether a dimension of ``main``'s outputs depends on its dynamic input dimensions.

    It evaluates the dimension with every input variable set to 1, then to
    1000 and more: a dimension that comes out as the same constant both times
    does not grow with the inputs. (A bound alone would not do: TVM writes
    ``min(2147483647, batch)`` for an open-ended slice, bounded yet dynamic.)
    """

    def __init__(self, mod: tvm.IRModule) -> None:
        self.small, self.large = tvm.sym.Analyzer(), tvm.sym.Analyzer()
        variables: list[tirx.Var] = []
        for param in mod["main"].params:
            for dim in getattr(getattr(param.ty, "shape", None), "values", []):
                if isinstance(dim, tirx.Var) and not any(dim.same_as(v) for v in variables):
                    variables.append(dim)
        for offset, var in enumerate(variables):
            dtype = str(getattr(var.ty, "dtype", "int64"))
            self.small.bind(var, tirx.IntImm(dtype, 1))
            self.large.bind(var, tirx.IntImm(dtype, 1000 + 7 * offset))

    def is_fixed(self, dim: Any) -> bool:
        small, large = self.small.simplify(dim), self.large.simplify(dim)
        return isinstance(small, tirx.IntImm) and isinstance(large, tirx.IntImm) and int(small) == int(large)


def _output_types(mod: tvm.IRModule) -> list[Any]:
    ret = mod["main"].ret_ty
    return list(ret.fields) if isinstance(ret, relax.TupleType) else [ret]


def outputs_are_fixed(mod: tvm.IRModule) -> bool:
    """Whether no output dimension of ``main`` depends on its dynamic input dimensions."""
    probe = _InputProbe(mod)
    for field in _output_types(mod):
        shape = getattr(field, "shape", None)
        if shape is None or not all(probe.is_fixed(dim) for dim in shape.values):
            return False
    return True


def fixed_dynamic_dims(mod: tvm.IRModule, tflite_model: TFLiteModel) -> list[str]:
    """Output dimensions the import fixed although they should grow with the dynamic inputs.

    When the converter that wrote the flatbuffer knew of dynamic inputs (some
    input's ``shape_signature`` has a -1), an output axis is dynamic where its
    own signature says -1. Otherwise (a static model given dynamic shapes), an
    output's symbolic axes are checked, or its first axis when all are
    constant. An axis is fixed when it does not depend on the dynamic inputs
    (:class:`_InputProbe`): the TFLite graph or a converter used the size the
    flatbuffer stores, 1 (e.g. ``min(1, batch)``). Returns descriptions such as
    ``"output 0 axis 0 is 1"``.
    """
    probe = _InputProbe(mod)
    tracked = any(size < 0 for info in tflite_model.inputs for size in info.signature)
    fixed = []
    for index, (field, info) in enumerate(zip(_output_types(mod), tflite_model.outputs)):
        shape = getattr(field, "shape", None)
        if shape is None:
            continue
        dims = list(shape.values)
        if tracked:
            axes = [axis for axis, size in enumerate(info.signature) if size < 0]
        else:
            axes = [axis for axis, dim in enumerate(dims) if not isinstance(dim, tirx.IntImm)] or [0]
        for axis in axes:
            if axis < len(dims) and probe.is_fixed(dims[axis]):
                fixed.append(f"output {index} axis {axis} is {int(probe.small.simplify(dims[axis]))}")
    return fixed


def _shape_text(ty: Any) -> str:
    shape = getattr(ty, "shape", None)
    if not isinstance(shape, relax.ShapeExpr):
        return "(?)"
    return "(" + ", ".join(str(int(d)) if isinstance(d, tirx.IntImm) else str(d) for d in shape.values) + ")"


def _count(ty: Any) -> Any:
    shape = getattr(ty, "shape", None)
    return functools.reduce(operator.mul, shape.values, tirx.IntImm("int64", 1)) \
        if isinstance(shape, relax.ShapeExpr) else None


def unsafe_operation(mod: tvm.IRModule) -> str | None:
    """The first operation of ``main`` that cannot be compiled safely, described; or None.

    That is an operation whose inputs have shapes and whose output has none (a
    concatenation of a dynamic batch with a batch of 1, valid only when the
    batch is 1), or a reshape to more elements than its input has for some
    size (at least 1) of the dynamic dimensions: Relax checks neither, and
    such a reshape reads past its input when it runs. (A reshape of a dynamic
    batch to a batch of 1 is safe: :func:`fixed_dynamic_dims` reports it.)
    """
    analyzer = tvm.sym.Analyzer()
    for var in _shape_vars(mod):
        dtype = str(getattr(var.ty, "dtype", "int64"))
        analyzer.bind(var, tvm.ir.Range(tirx.IntImm(dtype, 1), tirx.IntImm(dtype, 1 << 31)))
    for block in mod["main"].body.blocks:
        for binding in block.bindings:
            ty, value = binding.var.ty, binding.value
            if not isinstance(value, relax.Call) or not isinstance(value.op, tvm.ir.Op):
                continue
            if value.op.name == "relax.reshape" and isinstance(value.args[0].ty, relax.TensorType):
                before, after = _count(value.args[0].ty), _count(ty)
                if before is not None and after is not None and not analyzer.can_prove(after <= before):
                    return (f"relax.reshape ({binding.var.name}) of the shape {_shape_text(value.args[0].ty)} to "
                            f"{_shape_text(ty)} needs more elements than its input has for some sizes of the "
                            "dynamic dimensions")
            if not isinstance(ty, relax.TensorType) or isinstance(ty.shape, relax.ShapeExpr):
                continue
            tensors = [arg for arg in value.args if isinstance(arg.ty, relax.TensorType)]
            tensors += [field for arg in value.args if isinstance(arg, relax.Tuple) for field in arg.fields]
            if tensors and all(isinstance(t.ty.shape, relax.ShapeExpr) for t in tensors
                               if isinstance(t.ty, relax.TensorType)):
                shapes = ", ".join(_shape_text(t.ty) for t in tensors)
                return f"{value.op.name} ({binding.var.name}) of inputs of shapes {shapes} has no known shape"
    return None


def _shape_vars(mod: tvm.IRModule) -> list[tirx.Var]:
    """The dynamic dimensions of ``main``'s inputs."""
    found: list[tirx.Var] = []
    for param in mod["main"].params:
        for dim in getattr(getattr(param.ty, "shape", None), "values", []):
            if isinstance(dim, tirx.Var) and not any(dim.same_as(v) for v in found):
                found.append(dim)
    return found


def import_tflite(
    tflite_model: TFLiteModel,
    shapes: Mapping[str, Sequence[Dim]] | None = None,
    dtypes: Mapping[str, str] | None = None,
) -> tvm.IRModule:
    """A Relax module from a TFLite model whose operators :func:`check_operators` accepted.

    ``shapes`` and ``dtypes`` override inputs by TFLite tensor name; a None
    dimension is dynamic.
    """
    stored = {info.name: info for info in tflite_model.inputs}
    as_stored = all(name in stored and tuple(shape) == stored[name].shape for name, shape in (shapes or {}).items()) \
        and all(name in stored and dtype == stored[name].dtype for name, dtype in (dtypes or {}).items())
    try:
        with captured_output("TVM's TFLite importer"), symbolic_int_lists():
            mod = from_tflite(
                tflite_model.model,
                shape_dict=shapes_with_variables(shapes or {}),
                dtype_dict=dict(dtypes or {}),
                op_converter=functools.partial(ForgeOperatorConverter, check_declared=as_stored),
            )
    except ForgeError:
        raise
    except Exception as exc:  # noqa: BLE001 - TVM raises anything from asserts to TVMError
        raise ModelImportError(f"TVM's TFLite importer failed: {type(exc).__name__}: {exc}") from exc
    # The importer also attaches every weight as the attribute "params", a Relay-era copy of the
    # constants already in the graph; it would double the weights held and hashed.
    updated = tvm.IRModule(dict(mod.functions), attrs=mod.attrs)
    updated["main"] = mod["main"].without_attr("params")
    unsafe = unsafe_operation(updated)
    if unsafe is not None:
        raise ModelImportError(f"TVM's TFLite importer built a module that cannot be compiled safely: {unsafe}")
    return updated
