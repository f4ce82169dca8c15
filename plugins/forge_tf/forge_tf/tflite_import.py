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

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import tvm
from tvm import relax, tirx
from tvm.relax.frontend.tflite import from_tflite
from tvm.relax.frontend.tflite.tflite_frontend import OperatorConverter

from forge_core.errors import ForgeError, ModelImportError, OperatorConversionError
from forge_tf.console import captured_output
from forge_tf.operator_support import operator_code
from forge_tf.signature import Dim
from forge_tf.symbolic_shapes import SymbolicShapes, symbolic_int_lists
from forge_tf.tflite_model import TFLiteModel, tensor_name

BATCH_VAR = "batch"


class ForgeOperatorConverter(SymbolicShapes, OperatorConverter):
    """TVM's converter, with shape arithmetic on dynamic dimensions (:mod:`forge_tf.symbolic_shapes`) and
    every per-operator failure named by the op and its first output tensor."""

    def __init__(self, model: Any, subgraph: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(model, subgraph, *args, **kwargs)
        self._init_symbolic_shapes()
        self.convert_map = {code: self._named(code, convert) for code, convert in self.convert_map.items()}

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
        return relax.op.reshape(out, [-1, units])

    def _named(self, code: str, convert: Callable[..., Any]) -> Callable[..., Any]:
        symbolic = self.symbolic_converter(code)

        def call(op: Any) -> Any:
            try:
                if symbolic is not None:
                    result = symbolic(op)
                    if result is not None:
                        return result
                return convert(op=op)
            except ForgeError:
                raise
            except Exception as exc:  # noqa: BLE001 - converters fail with anything from asserts to TVMError
                output = int(op.Outputs(0)) if op.OutputsLength() else -1
                node = tensor_name(self.subgraph, output) if output >= 0 else f"<{code} without outputs>"
                raise OperatorConversionError("tflite", operator_code(self.model, op), node, exc) from exc

        return call


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


def import_tflite(
    tflite_model: TFLiteModel,
    shapes: Mapping[str, Sequence[Dim]] | None = None,
    dtypes: Mapping[str, str] | None = None,
) -> tvm.IRModule:
    """A Relax module from a TFLite model whose operators :func:`check_operators` accepted.

    ``shapes`` and ``dtypes`` override inputs by TFLite tensor name; a None
    dimension is dynamic.
    """
    try:
        with captured_output("TVM's TFLite importer"), symbolic_int_lists():
            mod = from_tflite(
                tflite_model.model,
                shape_dict=shapes_with_variables(shapes or {}),
                dtype_dict=dict(dtypes or {}),
                op_converter=ForgeOperatorConverter,
            )
    except ForgeError:
        raise
    except Exception as exc:  # noqa: BLE001 - TVM raises anything from asserts to TVMError
        raise ModelImportError(f"TVM's TFLite importer failed: {type(exc).__name__}: {exc}") from exc
    # The importer also attaches every weight as the attribute "params", a Relay-era copy of the
    # constants already in the graph; it would double the weights held and hashed.
    updated = tvm.IRModule(dict(mod.functions), attrs=mod.attrs)
    updated["main"] = mod["main"].without_attr("params")
    return updated
