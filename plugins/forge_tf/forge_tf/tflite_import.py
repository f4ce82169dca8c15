"""TVM's Relax TFLite importer, with dynamic dimensions and every converter failure named.

Dynamic dimensions become TIR variables in the input types: the batch (axis 0)
is one variable ``batch`` shared by every input, any other dynamic axis a
variable ``<input>_dim<axis>``. TVM's converters handle such shapes for
convolutions, pooling, elementwise ops and 2-D matmuls; where one cannot, the
import fails and the loaders take their fallback route.
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
from forge_tf.tflite_model import TFLiteModel, tensor_name

BATCH_VAR = "batch"


class _NamedFailures(OperatorConverter):
    """TVM's converter, with every per-operator failure named by the op and its first output tensor."""

    def __init__(self, model: Any, subgraph: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(model, subgraph, *args, **kwargs)
        self.convert_map = {code: self._named(code, convert) for code, convert in self.convert_map.items()}

    def _named(self, code: str, convert: Callable[..., Any]) -> Callable[..., Any]:
        def call(op: Any) -> Any:
            try:
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


def symbolic_shapes(shapes: Mapping[str, Sequence[Dim]]) -> dict[str, tuple[Any, ...]]:
    """Shapes for TVM's importer: a ``tirx.Var`` in place of each dynamic dimension."""
    batch = tirx.Var(BATCH_VAR, "int64")
    typed: dict[str, tuple[Any, ...]] = {}
    for name, dims in shapes.items():
        typed[name] = tuple(
            (batch if axis == 0 else tirx.Var(f"{_var_name(name)}_dim{axis}", "int64")) if dim is None else int(dim)
            for axis, dim in enumerate(dims)
        )
    return typed


def has_dynamic_output(mod: tvm.IRModule) -> bool:
    """Whether some output of ``main`` keeps a dimension that is not a constant."""
    ret = mod["main"].ret_ty
    fields = ret.fields if isinstance(ret, relax.TupleType) else [ret]
    for field in fields:
        shape = getattr(field, "shape", None)
        if shape is None:
            return True
        if any(not isinstance(dim, tirx.IntImm) for dim in shape.values):
            return True
    return False


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
        with captured_output("TVM's TFLite importer"):
            mod = from_tflite(
                tflite_model.model,
                shape_dict=symbolic_shapes(shapes or {}),
                dtype_dict=dict(dtypes or {}),
                op_converter=_NamedFailures,
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
