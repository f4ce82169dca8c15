"""``forge.from_torch``: PyTorch to Forge's IRModule, with the automatic ONNX fallback."""

from __future__ import annotations

import contextlib
import logging
import re
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch

from forge_core.errors import ForgeError, ModelImportError, OptionTypeError
from forge_core.ir.module import IRModule
from forge_core.ir.naming import rename_inputs, with_output_names
from forge_core.runtime.signature import DYNAMIC_DIM
from forge_core.tvm_import import enable_torch_interop
from forge_torch import export_route, onnx_route
from forge_torch.input_infos import (
    InputInfo,
    dynamic_shapes_for,
    infos_from_examples,
    parse_input_infos,
)

logger = logging.getLogger("forge.torch")

DEFAULT_ONNX_OPSET = 17


def _flatten(value: Any) -> list[Any]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [leaf for item in value for leaf in _flatten(item)]
    if isinstance(value, dict):
        return [leaf for item in value.values() for leaf in _flatten(item)]
    return []


def _reason(exc: BaseException) -> str:
    """An error's message on one line."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    return lines[0] + (" " + "; ".join(lines[1:]) if len(lines) > 1 else "")


def _signature(model: Any, input_infos: Sequence[Any] | None, example_inputs: Any,
               default_type: str) -> tuple[list[InputInfo], tuple[torch.Tensor, ...]]:
    if isinstance(model, torch.export.ExportedProgram):
        args, _ = model.example_inputs or ((), {})
        examples = tuple(args)
        names = [spec.arg.name for spec in model.graph_signature.input_specs
                 if spec.kind == torch.export.graph_signature.InputKind.USER_INPUT]
        infos = parse_input_infos(input_infos, default_type) if input_infos else [
            InputInfo(name, tuple(t.shape), t.dtype) for name, t in zip(names, examples)]
        return infos, examples
    if example_inputs is not None:
        examples = tuple(example_inputs) if isinstance(example_inputs, (list, tuple)) else (example_inputs,)
        for index, example in enumerate(examples):
            if not isinstance(example, torch.Tensor):
                raise ModelImportError(
                    f"from_torch: example_inputs[{index}] is {example!r:.60} of type {type(example).__name__}, not "
                    "a torch.Tensor: a Forge model takes tensors only (make other arguments attributes or defaults "
                    "of the module)"
                )
        infos = parse_input_infos(input_infos, default_type) if input_infos else infos_from_examples(model, examples)
        if len(infos) != len(examples):
            raise ModelImportError(
                f"from_torch: input_infos names {len(infos)} inputs ({', '.join(i.name for i in infos)}); "
                f"example_inputs has {len(examples)} tensors"
            )
        return infos, examples
    if input_infos:
        infos = parse_input_infos(input_infos, default_type)
        generator = torch.Generator().manual_seed(0)
        return infos, tuple(info.example(generator) for info in infos)
    raise ModelImportError(
        "from_torch needs input_infos, e.g. [('input0', (1, 3, 224, 224))], or example_inputs to trace the model"
    )


def _describe(infos: Sequence[InputInfo]) -> str:
    return ", ".join(f"{info.name}: {tuple('?' if d is None else d for d in info.shape)} "
                     f"{str(info.dtype).removeprefix('torch.')}" for info in infos)


def _output_problem(value: Any, path: str = "output") -> str | None:
    """Where the model's output holds something other than tensors (in tuples, lists and dicts), or None."""
    if isinstance(value, torch.Tensor):
        return None
    if isinstance(value, (list, tuple)):
        return next((p for i, item in enumerate(value) if (p := _output_problem(item, f"{path}[{i}]"))), None)
    if isinstance(value, dict):
        return next((p for k, item in value.items() if (p := _output_problem(item, f"{path}[{k!r}]"))), None)
    return f"{path} is None" if value is None else f"{path} is {value!r:.40} of type {type(value).__name__}"


@contextlib.contextmanager
def _state_kept(model: Any) -> Iterator[None]:
    """Put the module's buffers back as they were: a forward that updates them (a step counter, running
    statistics) must not change the model Forge converts, nor the user's module."""
    buffers = [(buffer, buffer.detach().clone()) for buffer in model.buffers()] \
        if isinstance(model, torch.nn.Module) else []
    try:
        yield
    finally:
        with torch.no_grad():
            for buffer, saved in buffers:
                if buffer.shape == saved.shape:
                    buffer.copy_(saved)


def _count_outputs(runnable: Any, examples: tuple[torch.Tensor, ...], infos: Sequence[InputInfo]) -> int:
    """Run the model once on (copies of) its example inputs: the number of output tensors."""
    try:
        with torch.no_grad(), _state_kept(runnable):
            outputs = runnable(*[t.clone() for t in examples])
    except Exception as exc:  # noqa: BLE001 - the model's own code raises anything
        raise ModelImportError(
            f"from_torch: running the model on its example inputs ({_describe(infos)}) failed: "
            f"{type(exc).__name__}: {_reason(exc)}"
        ) from exc
    problem = _output_problem(outputs)
    if problem is not None:
        raise ModelImportError(
            f"from_torch: the model's {problem}; Forge converts models whose outputs are tensors, or tuples, "
            "lists and dicts of tensors"
        )
    return len(_flatten(outputs))


def _data_dependent(error: BaseException) -> str | None:
    """Where torch.export found Python control flow on input values (``file:line: code``), or None."""
    cause: BaseException | None = error
    while cause is not None and type(cause).__name__ != "GuardOnDataDependentSymNode":
        cause = cause.__cause__
    if cause is None:
        return None
    where = re.search(r'File "([^"]+)", line (\d+), in (\w+)\n\s*(.+)', str(cause))
    return f"{where[1]}:{where[2]} in {where[3]}: {where[4].strip()}" if where else "(no source line)"


def _check_dynamic(ir: IRModule, infos: Sequence[InputInfo]) -> None:
    for info, shape in zip(infos, ir.input_shapes):
        for axis in info.dynamic_axes:
            if shape is not None and axis < len(shape) and shape[axis] != DYNAMIC_DIM:
                warnings.warn(
                    f"from_torch: input {info.name!r} axis {axis} was asked to be dynamic, but the model fixes it "
                    f"to {shape[axis]}",
                    stacklevel=4,
                )


def load_torch(
    script_module: Any,
    input_infos: Sequence[Any] | None = None,
    custom_convert_map: Mapping[str, Callable[..., Any]] | None = None,
    default_type: str = "float32",
    use_parser_friendly_name: bool = False,
    keep_quantized_weight: bool = False,
    *,
    example_inputs: Any = None,
    fallback_to_onnx: bool = True,
    onnx_opset: int = DEFAULT_ONNX_OPSET,
    fold_constants: bool = True,
    fold_batch_norms: bool = True,
) -> IRModule:
    """Load a PyTorch model into a Forge IRModule. See :func:`forge.from_torch`."""
    if use_parser_friendly_name:
        warnings.warn("from_torch: use_parser_friendly_name is not honoured: Relax names are not parsed as text, "
                      "so parameter names need no rewriting", UserWarning, stacklevel=3)
    if keep_quantized_weight:
        warnings.warn("from_torch: keep_quantized_weight is not honoured: TVM's Relax importers unpack quantized "
                      "PyTorch weights to float", UserWarning, stacklevel=3)
    enable_torch_interop()
    is_script = isinstance(script_module, torch.jit.ScriptModule)
    is_program = isinstance(script_module, torch.export.ExportedProgram)
    if not (is_script or is_program or isinstance(script_module, torch.nn.Module)):
        raise OptionTypeError(
            "from_torch expects a torch.nn.Module, a torch.export.ExportedProgram or a traced TorchScript module, "
            f"not {type(script_module).__name__}"
        )
    if is_script and custom_convert_map:
        warnings.warn("from_torch: custom_convert_map applies to the torch.export route; a TorchScript module "
                      "goes through ONNX, where it is not used", UserWarning, stacklevel=3)
    infos, examples = _signature(script_module, input_infos, example_inputs, default_type)
    runnable = script_module.module() if is_program else script_module
    if not is_program:
        runnable.eval()
    output_names = [f"output_{i}" for i in range(_count_outputs(runnable, examples, infos))]
    ir_options = {"fold_constants": fold_constants, "fold_batch_norms": fold_batch_norms}

    def through_onnx() -> IRModule:
        # The exporter runs the model: it must not update the module's buffers either.
        with _state_kept(runnable):
            return onnx_route.load_through_onnx(runnable, examples, infos, output_names, onnx_opset, **ir_options)

    if is_script:
        ir = through_onnx()
        logger.info("from_torch: TorchScript module loaded through ONNX")
        _check_dynamic(ir, infos)
        return ir

    try:
        program = script_module if is_program else export_route.export(
            script_module, examples, dynamic_shapes_for(infos))
        mod = export_route.import_exported_program(program, custom_convert_map)
    except ForgeError as direct_error:
        if not fallback_to_onnx:
            raise
        branch = _data_dependent(direct_error)
        if branch is not None:
            # The ONNX exporter traces: it would keep the branch the example inputs take, for every input.
            raise ModelImportError(
                f"from_torch: the model's Python control flow depends on the values of its inputs, at {branch}. "
                "torch.export cannot convert it, and the ONNX route would trace only the branch the example "
                "inputs take. Express it with tensor operations (torch.where, torch.cond), or move it out of "
                f"forward. torch.export: {_reason(direct_error)}"
            ) from direct_error
        try:
            ir = through_onnx()
        except Exception as onnx_error:  # noqa: BLE001 - report both routes whatever failed
            raise ModelImportError(
                "from_torch: both routes failed.\n"
                f"torch.export route: {direct_error}\n"
                f"ONNX route: {onnx_error}"
            ) from onnx_error
        logger.warning("from_torch: loaded through ONNX, because the torch.export route failed: %s",
                       _reason(direct_error))
        _check_dynamic(ir, infos)
        return ir
    mod = rename_inputs(mod, [info.name for info in infos])
    mod = with_output_names(mod, output_names)
    ir = IRModule(mod, **ir_options)
    logger.info("from_torch: loaded through torch.export")
    _check_dynamic(ir, infos)
    return ir
