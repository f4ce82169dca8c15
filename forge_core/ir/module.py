"""``forge.IRModule`` (alias ``forge.RelayModule``): a model in TVM's IR plus its weights."""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
import tvm
from tvm import relax

from forge_core.errors import ModelImportError, ModelStateError, OptionError, OptionTypeError
from forge_core.ir import identity, introspection, weights
from forge_core.ir.naming import OUTPUT_NAMES_ATTR
from forge_core.ir.state import initial_state
from forge_core.passes import PassContext, run_passes
from forge_core.quantization.calibration_data import CalibrationData
from forge_core.runtime.signature import SignatureSurface, TensorSpec
from forge_core.settings import COMPILE_DEFAULTS as _C
from forge_core.settings import COMPILE_POSITIONAL, keyword_only_after
from forge_core.settings import QUANTIZE_DEFAULTS as _Q

if TYPE_CHECKING:
    from forge_core.graph import Graph, Node
    from forge_core.quantization.quantize import QuantizationInfo
    from forge_core.quantization.report import QuantizationReport

_KEEP = object()  # _commit: leave the calibration data as it is


@dataclass(frozen=True)
class ModuleState:
    """Flags that later transforms set (calibration, quantization, partitioning, splitting)."""

    is_calibrated: bool = False
    is_quantized: bool = False
    is_tensorrt: bool = False
    is_split_tensors: bool = False


def _as_relax_module(mod: Any) -> tvm.IRModule:
    if isinstance(mod, IRModule):
        return mod.mod
    if isinstance(mod, relax.Function):
        return tvm.IRModule({"main": mod})
    if not isinstance(mod, tvm.IRModule):
        raise OptionTypeError(
            f"IRModule expects a TVM Relax IRModule or relax.Function, not {type(mod).__name__}. "
            "Load models with forge.from_onnx() and the other loaders."
        )
    names = [gv.name_hint for gv in mod.functions]
    if "main" not in names or not isinstance(mod["main"], relax.Function):
        raise ModelImportError(f"The IRModule has no Relax function 'main' (functions: {', '.join(sorted(names)) or 'none'})")
    return mod


def _check_params(mod: tvm.IRModule, params: Mapping[str, Any]) -> None:
    param_names = {v.name for v in mod["main"].params}
    unknown = sorted(set(params) - param_names)
    if unknown:
        raise OptionError(
            f"params holds names that are not parameters of main: {', '.join(map(repr, unknown))}. "
            f"main's parameters: {', '.join(sorted(param_names))}"
        )


@dataclass(frozen=True)
class _Undo:
    """The module before a reversible transform, and the fingerprint right after it."""

    pass_name: str
    mod: tvm.IRModule
    params: dict[str, weights.Tensor]
    fingerprint_after: str

    def copy(self) -> _Undo:
        return _Undo(self.pass_name, weights.deep_copy_module(self.mod),
                     {name: weights.copy_tensor(t) for name, t in self.params.items()}, self.fingerprint_after)


class IRModule(SignatureSurface):
    """A model in TVM's intermediate representation (Relax), with its weights.

    Forge's IRModule wraps a TVM ``IRModule`` and the weights that are not
    frozen into it. It is what every loader returns and what ``compile()``
    consumes.

    Args:
        mod: A TVM Relax ``IRModule`` with a ``main`` function, or a ``relax.Function``.
        params: The weights of the module that are not "frozen" into the graph:
            a dict from a parameter name of ``main`` to a numpy array or TVM tensor.
            Every other parameter of ``main`` is a model input. Defaults to None.
        inline_partitions: Inlines all partitions (e.g. TensorRT subgraphs) into
            ``main`` during initialization if enabled. Defaults to False.
        fold_constants: Folds all constant branches during initialization if
            enabled; a quantized weight (``dequantize`` of an int8 constant
            read by a convolution or matmul) stays quantized, for the integer
            kernels. Defaults to True.
        fold_batch_norms: Folds all inference batch norms into the preceding
            convolutions (or into a scale and shift) during initialization if
            enabled. Defaults to True.

    Shapes: a dynamic dimension is reported as ``-1`` in ``input_shapes`` and
    ``output_shapes``.
    """

    def __init__(
        self,
        mod: Any,
        params: Mapping[str, Any] | None = None,
        inline_partitions: bool = False,
        fold_constants: bool = True,
        fold_batch_norms: bool = True,
    ) -> None:
        relax_mod = _as_relax_module(mod)
        tensors = weights.normalize_params(params)
        _check_params(relax_mod, tensors)
        passes = []
        if inline_partitions:
            passes.append("inline_partitions")
        if fold_constants:
            passes.append("fold_constants")
        if fold_batch_norms:
            passes.append("fold_batch_norms")
        relax_mod = run_passes(relax_mod, passes, PassContext(options={"stage": "import"}))
        self._start(None)
        self._commit(mod=relax_mod, params=tensors, state=ModuleState())

    def _start(self, tuning_database: os.PathLike[str] | str | None) -> None:
        self._version = 0
        self._mod: tvm.IRModule | None = None
        self._params: dict[str, weights.Tensor] = {}
        self._state = ModuleState()
        self._calibration: CalibrationData | None = None
        self._quantization: QuantizationInfo | None = None
        self._undo: _Undo | None = None
        self.tuning_database = tuning_database

    def _commit(
        self,
        *,
        mod: tvm.IRModule | None = None,
        params: dict[str, weights.Tensor] | None = None,
        state: ModuleState | None = None,
        calibration: CalibrationData | None | object = _KEEP,
        quantization: QuantizationInfo | None | object = _KEEP,
        undo: _Undo | None | object = _KEEP,
    ) -> None:
        """The one place where the module's IR, weights, state flags and calibration data change.

        Every transform (graph edits, batch size, tensor splitting, calibration,
        quantization) goes through here: the parts are checked against each
        other, and graphs and nodes see the change (:attr:`version`). ``undo``
        records the module before a reversible transform (the deprecated
        ``partition_for_tensorrt``), which ``inline_partitions`` restores while
        the module is unchanged since.
        """
        new_mod = self._mod if mod is None else _as_relax_module(mod)
        new_params = self._params if params is None else params
        if mod is not None or params is not None:
            _check_params(new_mod, new_params)
        new_state = self._state if state is None else state
        if calibration is not _KEEP:
            self._calibration = calibration if calibration else None  # type: ignore[assignment]
            new_state = replace(new_state, is_calibrated=self._calibration is not None)
        if quantization is not _KEEP:
            self._quantization = quantization  # type: ignore[assignment]
        if undo is not _KEEP:
            self._undo = undo  # type: ignore[assignment]
        self._mod, self._params, self._state = new_mod, new_params, new_state
        self._version += 1

    def with_state(self, **flags: bool) -> IRModule:
        """A copy sharing this module's IR and weights, with some state flags set.

        For frontends and transforms: e.g. a loader of a quantized model returns
        ``IRModule(mod).with_state(is_quantized=True)``. Flags are the
        ``ModuleState`` fields.
        """
        unknown = set(flags) - set(vars(self._state))
        if unknown:
            raise OptionTypeError(f"Unknown state flags: {', '.join(sorted(unknown))}")
        return IRModule.from_parts(self._mod, self._params, state=replace(self._state, **flags),
                                   tuning_database=self.tuning_database, calibration=self._calibration,
                                   quantization=self._quantization)

    @classmethod
    def from_parts(cls, mod: tvm.IRModule, params: Mapping[str, weights.Tensor] | None = None, *,
                   state: ModuleState | None = None,
                   tuning_database: os.PathLike[str] | str | None = None,
                   calibration: CalibrationData | None = None,
                   quantization: QuantizationInfo | None = None) -> IRModule:
        """An IRModule of these parts as they are: no import passes run (unlike the constructor).

        For frontends and Forge's own modules that build a module from another
        one's IR and weights (the graph API's sub-graph functions, calibration's
        instrumented model). The parts are checked against each other.

        Args:
            mod: A TVM Relax ``IRModule`` with a ``main`` function.
            params: The weights of ``main``'s parameters that are not inputs.
            state: The state flags (``ModuleState``); defaults to none set.
            tuning_database: As the ``tuning_database`` attribute.
            calibration: Calibration statistics of this IR, if any.
            quantization: How the module was quantized, if it was.
        """
        obj = cls.__new__(cls)
        obj._start(tuning_database)
        obj._commit(mod=mod, params=dict(params or {}), state=state or ModuleState(), calibration=calibration,
                    quantization=quantization)
        return obj

    # ------------------------------------------------------------------
    # The IR
    # ------------------------------------------------------------------

    @property
    def mod(self) -> tvm.IRModule:
        """The TVM Relax IRModule (prints as the IR text)."""
        return self._mod

    @property
    def typed_mod(self) -> tvm.IRModule:
        """The TVM Relax IRModule, re-normalized with every type annotation checked.

        This property is a quick means of validating the module: it raises
        TVM's error, naming the offending expression, for a module that is not
        well formed.
        """
        relax.analysis.well_formed(self._mod)
        return relax.transform.Normalize()(self._mod)

    @property
    def params(self) -> Mapping[str, weights.Tensor]:
        """The weights of the module that are not "frozen" into the graph (read-only).

        A read-only view: ``ir.params[name] = ...`` raises ``TypeError``.
        Change weights through the graph API (``node.set_value(...)``), which
        keeps the module consistent.
        """
        return MappingProxyType(self._params)

    @property
    def version(self) -> int:
        """A counter that grows with every change of the module (IR, weights, state, calibration)."""
        return self._version

    @property
    def _main(self) -> relax.Function:
        return self._mod["main"]

    # ------------------------------------------------------------------
    # Graphs and nodes
    # ------------------------------------------------------------------

    @property
    def graphs(self) -> dict[str, Graph]:
        """The module's computational graphs by name, ``"main"`` first (see :class:`forge.Graph`)."""
        from forge_core.graph import Graph

        names = [name for name, _ in introspection.relax_functions(self._mod)]
        return {name: Graph(self, name) for name in sorted(names, key=lambda n: (n != "main", n))}

    @property
    def main(self) -> Graph:
        """The module's "main" computational graph."""
        from forge_core.graph import Graph

        return Graph(self, "main")

    @property
    def input_nodes(self) -> list[Node]:
        """The main graph's input nodes, in input order."""
        return self.main.inputs

    @property
    def output_node(self) -> Node:
        """The main graph's output node."""
        return self.main.output

    def __iter__(self) -> Iterator[Node]:
        """Iterator over the main graph's nodes, in topological order."""
        return iter(self.main)

    # ------------------------------------------------------------------
    # Inputs and outputs
    # ------------------------------------------------------------------

    @property
    def input_specs(self) -> list[TensorSpec]:
        """Name, shape and dtype of each model input (weights in ``params`` excluded)."""
        return introspection.input_specs([var for var in self._main.params if var.name not in self._params])

    @property
    def output_specs(self) -> list[TensorSpec]:
        """Name, shape and dtype of each model output."""
        specs = introspection.output_specs(self._main)
        names = self._main.attrs.get(OUTPUT_NAMES_ATTR) if self._main.attrs is not None else None
        if names is not None and len(names) == len(specs):
            specs = [replace(spec, name=str(name)) for spec, name in zip(specs, names)]
        return specs

    @property
    def initial_state(self) -> dict[str, np.ndarray]:
        """Where a stateful model's state inputs start, by input name; empty for a stateless model.

        A streaming model's state (TFLite resource variables) is explicit: each
        state input ``x`` has an output ``x_next`` holding its next value. Feed
        these values to the first call, and each ``x_next`` output back as the
        next call's ``x``, to run the model as its own runtime does.

        Returns:
            A dict of input name to the value the source model assigns first
            (quantized state as its stored integers).
        """
        return initial_state(self._main)

    # ------------------------------------------------------------------
    # Graph facts
    # ------------------------------------------------------------------

    @property
    def operators(self) -> dict[str, int]:
        """Full count of the module's operators, e.g. ``{"nn.conv2d": 53, "add": 16}``."""
        return introspection.count_operators(self._mod)

    @property
    def graph_count(self) -> int:
        """Number of computational graphs in the module, the "main" graph included (at least 1)."""
        return sum(1 for _ in introspection.relax_functions(self._mod))

    @property
    def subgraph_count(self) -> int:
        """Number of computational subgraphs, the "main" graph excluded (at least 0)."""
        return self.graph_count - 1

    @property
    def weights_nbytes(self) -> int:
        """Bytes of weights: constants in the graph plus ``params``."""
        return weights.weights_nbytes(self._mod, self._params)

    # ------------------------------------------------------------------
    # State flags
    # ------------------------------------------------------------------

    @property
    def is_calibrated(self) -> bool:
        """Flag to check if the module is calibrated or not."""
        return self._state.is_calibrated

    @property
    def is_quantized(self) -> bool:
        """Flag to check if the module is quantized or not."""
        return self._state.is_quantized

    @property
    def is_tensorrt(self) -> bool:
        """Flag to check if the module is partitioned for TensorRT or not."""
        return self._state.is_tensorrt

    @property
    def is_split_tensors(self) -> bool:
        """Flag to check if the module has been tensor-split or not."""
        return self._state.is_split_tensors

    # ------------------------------------------------------------------
    # Identity
    # ------------------------------------------------------------------

    @property
    def fingerprint(self) -> str:
        """Deterministic hashing of the module's structure and data (hex SHA-256).

        To get a structural hash (excluding data) use the ``hash()`` function.
        """
        return identity.fingerprint(self._mod, self._params)

    def __hash__(self) -> int:
        """Structural hash of the module: equal for one architecture with other weights."""
        return identity.structural_hash(self._mod, self._params)

    def __eq__(self, other: object) -> bool:
        """Compares for equality of hash (structure, not weights), as the docs define it."""
        if not isinstance(other, IRModule):
            return NotImplemented
        return hash(self) == hash(other)

    # ------------------------------------------------------------------
    # Copying and running
    # ------------------------------------------------------------------

    def copy(self) -> IRModule:
        """Get a deepcopy of the IRModule.

        Copying is useful to keep a "checkpoint" before in-place transforms such
        as quantization or partitioning. Weights are copied too: editing the
        copy's constants or params leaves the original unchanged.
        """
        params = {name: weights.copy_tensor(t) for name, t in self._params.items()}
        calibration = self._calibration.copy() if self._calibration is not None else None
        duplicate = IRModule.from_parts(weights.deep_copy_module(self._mod), params, state=self._state,
                                        tuning_database=self.tuning_database, calibration=calibration,
                                        quantization=self._quantization)
        if self._undo is not None:
            duplicate._commit(undo=self._undo.copy())
        return duplicate

    def __copy__(self) -> IRModule:
        return self.copy()

    def __deepcopy__(self, memo: dict[int, Any]) -> IRModule:
        return self.copy()

    def get_inference_function(self, target: str = "llvm") -> Callable[..., np.ndarray | list[np.ndarray]]:
        """Get a Python callable that emulates the model's inference.

        This is for debugging and validating accuracy; it is not an optimized
        compilation and should not be used to measure latency. Its kernels
        run in parallel and in vectors, but compute each output in the order
        of TVM's plain loops, with no fast-math and no layout change, so its
        numbers are the reference's. The callable
        takes numpy arrays positionally, ``func(input0, input1, ...)``, and
        returns a numpy array, or a list of arrays when the model has several
        outputs. Wrong input counts, shapes or dtypes raise
        :class:`forge.InputError` naming the input.

        Args:
            target: The device target; a user typically should not need to set
                this, unless running on GPU (``"cuda"``). Defaults to ``"llvm"``.

        Returns:
            Inference function

        Raises:
            forge.CompilationError: TVM could not build the module (its error,
                which names the offending call, is in the message).
        """
        from forge_core.errors import CompilationError, ForgeError
        from forge_core.ir.inference import build_inference_function
        from forge_core.targets import resolve_target

        tvm_target = resolve_target(target, host_cpu=False)  # generic code: quick to build
        bound = weights.bind_params(self._mod, self._params)
        try:
            return build_inference_function(bound, tvm_target, self.input_specs, self.output_specs)
        except ForgeError:
            raise
        except Exception as exc:  # noqa: BLE001 - TVM and LLVM fail with many error types
            raise CompilationError(f"Building the inference function for {tvm_target.kind.name} failed: "
                                   f"{type(exc).__name__}: {str(exc).strip()}") from exc

    # ------------------------------------------------------------------
    # Transforms (in place)
    # ------------------------------------------------------------------

    def apply_pass(self, name: str, force: bool = False, **options: Any) -> None:
        """Runs the registered pass ``name`` on the module, in place.

        Every pass a plugin registers is available, Forge's own included; see
        :func:`forge.list_passes`. ``options`` reach the pass as
        ``context.options``, e.g. ``ir.apply_pass("set_batch_size", batch_size=8)``
        or ``ir.apply_pass("set_channel_layout", layout="last")``.

        Args:
            name: The pass's registered name.
            force: For a pass that changes the nodes calibration describes
                (``split_tensors``): discard the calibration data instead of
                raising.
            **options: The pass's options.

        Raises:
            forge.PluginNotInstalledError: No pass of that name (the error lists them).
            ValueError: The pass would discard calibration data and ``force`` is False,
                or the pass rejects the module or its options.
        """
        self._run_pass(name, options, force=force)

    def _run_pass(self, name: str, options: Mapping[str, Any], *, force: bool = False, extra: str | None = None,
                  undo: _Undo | None = None) -> None:
        """``apply_pass``'s work; ``extra`` names the plugin's install extra, ``undo`` is committed with the result."""
        from forge_core.plugin_manager import get_plugin_manager

        spec = get_plugin_manager().get_pass(name, extra=extra)
        if spec.discards_calibration and self._calibration is not None and not force:
            raise ModelStateError(
                f"{name} changes the nodes that this module's calibration data describes; "
                f"pass force=True to discard the calibration data, or run {name} before calibrating"
            )
        mod = run_passes(self._mod, [name], PassContext(options=dict(options), params=self._params))
        state = replace(self._state, **spec.sets_flags) if spec.sets_flags else None
        self._commit(mod=mod, state=state, undo=undo,
                     **({"calibration": None} if spec.discards_calibration else {}))

    def set_batch_size(self, batch_size: int) -> None:
        """Sets the IRModule's batch-size

        The leading dimension of every input is its batch. A symbolic batch
        (an export with a dynamic batch axis) is bound to ``batch_size``; a fixed
        one is replaced and every shape after it inferred again, with the
        reshapes that spell out the old batch (``Reshape`` to ``[1, 2048]``)
        rewritten. The outputs then equal ``batch_size`` batch-1 runs stacked.
        Calibration data stays valid: it describes the same nodes.

        Args:
            batch_size: The desired batch-size for the model.

        Returns:
            None. This method operates in place.

        Raises:
            ValueError: ``batch_size`` is not a positive integer, or a node keeps
                the old batch (a shape fixed inside the model that cannot be
                rewritten, a kernel built for the old shapes); the error names it.
        """
        self.apply_pass("set_batch_size", batch_size=batch_size)

    def split_tensors(self, force: bool = False) -> None:
        """Performs tensor splitting on the weight tensors of convolution layers.

        Each convolution (1-D, 2-D or 3-D, without groups) becomes two
        convolutions over the halves of its weight along the output channels,
        whose results are concatenated: the same values, from two smaller
        weight tensors that quantization can scale separately. Sets
        ``is_split_tensors``.

        Args:
            force: If False, the operation will raise a ValueError when
                previously captured calibration data is detected. When True, the
                operation will wipe previously recorded calibration data.
                Default is False.

        Returns:
            None. This method operates in place.
        """
        self.apply_pass("split_tensors", force=force)

    # ------------------------------------------------------------------
    # Calibration and quantization
    # ------------------------------------------------------------------

    def calibrate(self, calib_data: Iterable[Any], reset: bool = True, use_cuda: bool = True) -> None:
        """Calibrates the model by tracking intermediate layer statistics.

        This method collects statistics from intermediate layers of the model
        using the provided calibration dataset: for every activation that
        quantization reads, each sample's minimum and maximum and a histogram of
        its magnitudes; and each weight's per-channel extrema. These statistics
        are used for deriving quantization parameters in a subsequent
        quantization process. It's essential that the calibration data is
        representative of the model's expected real-world inputs. Samples are
        streamed: memory holds one sample's intermediate values at a time.

        Note: Ensure that the calibration data is in the form of numpy arrays
        and has undergone the necessary pre-processing steps required for the
        model.

        Args:
            calib_data: An iterable of data samples for calibration: each an
                array (single-input models), a tuple or list of arrays in input
                order, or a dict keyed by input name. The samples should be in a
                format compatible with the model's input requirements. Inspect
                the ``RelayModule.input_shapes``.
            reset: If True, any previous calibration data is cleared before new
                data is processed. Defaults to True.
            use_cuda: If True, Forge will utilize CUDA devices for calibration
                if GPUs can be found. Operation will fall back to CPU if GPUs are
                not found. Default is True.

        Returns:
            None. This method operates in place.

        Raises:
            ValueError: If ``calib_data`` is not an iterable of samples, holds
                none, or a sample does not match the model's inputs (the error
                names the sample's index, the input, and the expected and given
                shape or dtype).
        """
        from forge_core.quantization.calibrate import calibrate

        data = calibrate(self, calib_data, previous=None if reset else self._calibration, use_cuda=use_cuda)
        self._commit(calibration=data)

    def quantize(
        self,
        activation_dtype: str = _Q.activation_dtype,
        kernel_dtype: str | None = _Q.kernel_dtype,
        bias_dtype: str | None = _Q.bias_dtype,
        per_channel: bool = _Q.per_channel,
        calib_method: str = _Q.calib_method,
        quant_type: str = _Q.quant_type,
        *,
        exclude: Iterable[str] = _Q.exclude,
        percentile: float = _Q.percentile,
    ) -> None:
        """Applies quantization to the model with specified parameters.

        This method quantizes the model's activations, kernels, and biases to
        the specified data types. If kernel_dtype and bias_dtype are None, they
        default to the activation_dtype. The quantization can be "static"
        (requiring prior calibration), "dynamic" (no calibration needed), or
        "any" (prioritizing static if possible).

        Convolutions and dense layers (matmuls with a constant weight) are
        quantized, and in static quantization the adds and concats between
        them; softmax, normalizations and other operators stay float. The
        result is QDQ (quantize/dequantize pairs) in TVM's IR: see the README's
        "Quantization" section for the policy and the IR's shape. Biases are
        int32 with scale = input scale x weight scale (static) or stay float
        (dynamic).

        Note: When using "static" quant_type, ensure calibration is performed
        beforehand. If split_tensors is enabled, existing calibration data is
        discarded due to graph changes, necessitating fresh calib_data.

        Args:
            activation_dtype: Data type for activations ("int8", "uint8"),
                default is "int8".
            kernel_dtype: Data type for kernels ("int8", "uint8"), defaults to
                activation_dtype.
            bias_dtype: Data type for biases ("int8", "uint8", "int32"),
                defaults to activation_dtype; biases are accumulated in int32.
            per_channel: If True, performs per-channel quantization on kernels.
                Default is False.
            calib_method: Method for calibration ("average", "entropy",
                "minmax", "percentile", "mse"), default is "average". "average" -
                computed average of the min-max extrema across calibration data,
                "entropy" - distribution-based maximization of entropy of
                quantized values (KL-divergence threshold search), "minmax" -
                absolute most extreme min-max values across calibration data,
                "percentile" - computed 99-th percentile cut-offs across
                calibration data, "mse" - the cut-offs minimizing the expected
                squared error of the quantized values (rounding inside,
                clipping beyond; Forge's addition). "entropy" can clip hard
                where a layer's values pile up on one value (flat image
                backgrounds): check :meth:`quantization_report`.
            quant_type: Type of quantization ("static", "dynamic", "any"),
                default is "any".
            exclude: Node names (see ``ir.main``) to keep float, e.g. the layers
                :meth:`quantization_report` shows losing accuracy.
            percentile: The cut-off of the "percentile" method, e.g. 99.99.

        Returns:
            None. This method operates in place.

        Raises:
            ValueError: A dtype, calib_method or quant_type string that is not
                one of the above; quant_type="static" without calibration; an
                already quantized module; an ``exclude`` name that is no node.
        """
        from forge_core.quantization.quantize import quantize

        if self._state.is_quantized:
            raise ModelStateError("the module is already quantized; quantize a copy() taken before quantizing")
        reference = self.copy()
        mod, params, info = quantize(
            self, self._calibration, activation_dtype=activation_dtype, kernel_dtype=kernel_dtype,
            bias_dtype=bias_dtype, per_channel=per_channel, calib_method=calib_method, quant_type=quant_type,
            exclude=exclude, percentile=percentile)
        info.reference = reference
        self._commit(mod=mod, params=params, state=replace(self._state, is_quantized=True), quantization=info)

    @property
    def quantization_info(self) -> QuantizationInfo | None:
        """How :meth:`quantize` quantized this module (settings and each layer's parameters), else None."""
        return self._quantization

    def quantization_report(self, calib_data: Iterable[Any], use_cuda: bool = True) -> QuantizationReport:
        """Each quantized layer's output SQNR against the float model, over ``calib_data``.

        A layer whose SQNR drops far below its predecessors' is the one to pass
        to ``quantize(exclude=[...])``. ``print(report)`` shows the table.

        Args:
            calib_data: Samples as :meth:`calibrate` takes them.
            use_cuda: As for :meth:`calibrate`.

        Raises:
            ValueError: The module was not quantized by :meth:`quantize`.
        """
        from forge_core.quantization.report import quantization_report

        if self._quantization is None or self._quantization.reference is None:
            raise ModelStateError("quantization_report() needs a module quantized by quantize()")
        return quantization_report(self, self._quantization, calib_data, use_cuda=use_cuda)

    # ------------------------------------------------------------------
    # Compilation
    # ------------------------------------------------------------------

    @keyword_only_after(*COMPILE_POSITIONAL)
    def compile(
        self,
        target: str | dict[str, Any] = "llvm",
        *,
        host: str | dict[str, Any] | None = _C.host,  # type: ignore[assignment]
        output_path: str | os.PathLike[str] | None = _C.output_path,
        opt_level: int = _C.opt_level,
        set_float16: bool = _C.set_float16,
        set_channel_layout: str | None = _C.set_channel_layout,
        export_relay: bool = _C.export_relay,
        export_metadata: bool = _C.export_metadata,
        force_overwrite: bool = _C.force_overwrite,
        uuid: str | None = _C.uuid,
        encrypt_password: str | None = _C.encrypt_password,
        shape_buckets: Sequence[Mapping[str, Sequence[int]]] | None = _C.shape_buckets,
    ) -> None:
        """Compiles the model for a specified target with various configuration options.

        The artifact directory holds ``model_library.so`` (load it with
        :class:`forge.Runtime`), plus ``model_relay.txt`` and
        ``model_metadata.json`` when asked. Files are written to a temporary
        directory beside ``output_path`` and moved in at the end: a failed
        compile leaves ``output_path`` as it was.

        Args:
            target: A target string (``"llvm"``, ``"llvm -mcpu=skylake"``,
                ``"cuda -arch=sm_86"``), a target tag (``"raspberry-pi/5"``, see
                :func:`forge.list_target_tags`), a JSON string, or a dict with a
                ``"kind"`` key and any of ``keys``, ``device``, ``libs``,
                ``mcpu``, ``model``, ``mtriple``, ``mattr``, ``mfloat-abi``,
                ``mabi``, ``num-cores``, ``host``. Defaults to ``"llvm"``.
            host: The host CPU when ``target`` is a GPU, in any form ``target``
                takes. Defaults to the machine compiling.
            output_path: The directory to write the artifact to; it is created.
                Defaults to ``./compile_output``.
            opt_level: Optimization level from 0 to 4; every level includes the
                ones below. 0: lower every operator on its own. 1: operator
                fusion. 2: compile-time constant folding, common-subexpression
                and dead-code elimination. 3 (default): inference
                simplifications (dropout removed, batch and layer norms
                decomposed) and vectorizable approximations of exp, erf, tanh
                and softmax (a few ulps). 4: LLVM fast-math flags; results may
                change in the last bits.
            set_float16: If True, converts float32 operators to float16 where
                the operator permits, accumulating in float32; inputs and
                outputs stay float32. Default is False.
            set_channel_layout: ``"first"`` (NCHW) or ``"last"`` (NHWC) converts
                convolutions to that data layout; None (default) keeps the
                model's layout. The model's inputs keep their layout.
            export_relay: If True, writes the final IR text to ``model_relay.txt``.
            export_metadata: If True, writes ``model_metadata.json`` (schema in
                the README).
            force_overwrite: If True, replaces a non-empty ``output_path``;
                otherwise that raises ``ValueError``. Default is False.
            uuid: A uuid for the artifact, stored in its metadata and inside
                the library; a random uuid4 when None.
            encrypt_password: If given, ``model_library.so`` is written
                encrypted (AES-256-GCM) beside its key file ``modelKey.bin``
                (the data key, wrapped under scrypt of this password); run it
                with ``Runtime(library, key_path, password)``. An empty
                password raises ``ValueError``; a weak one warns with
                ``forge.WeakPasswordWarning``.
            shape_buckets: For a model with dynamic dims, the sizes to build a
                static copy of the model for, as ``[{"x": (1, 3, 224, 224)},
                ...]`` (every input with a dynamic dim, in every bucket). The
                artifact runs inputs of a bucket's shapes exactly on that copy,
                as fast as a static artifact, and any other size on the generic
                dynamic code. Each bucket adds its kernels, and where its
                schedules repack weights a copy of them, to the library.

        Returns:
            None. The method writes ``output_path``.

        Raises:
            ValueError: An invalid option (a shape bucket the model cannot
                take names the input and its shape), or a non-empty ``output_path``
                without ``force_overwrite``.
            forge.TargetError: An unknown tag or malformed target (the error
                suggests close tag names).
            forge.CompilationError: The build failed, or the toolchain for a
                cross target is missing (the error names what to install).
            forge.FileAccessError: ``output_path`` cannot be written: its
                directory is read-only, or the disk filled up (an ``OSError``
                with the system's errno, naming the file). Checked before the
                build where it can be; nothing partial is left either way.
        """
        from forge_core.compiler.compile import compile_module

        compile_module(
            self, target=target, host=host, output_path=output_path, opt_level=opt_level,
            set_float16=set_float16, set_channel_layout=set_channel_layout, export_relay=export_relay,
            export_metadata=export_metadata, force_overwrite=force_overwrite, uuid=uuid,
            encrypt_password=encrypt_password, shape_buckets=shape_buckets,
        )

    @keyword_only_after("work_dir", "trials", "time_budget", "trials_per_task", "opt_level", "set_float16",
                        "set_channel_layout", "progress", "rpc")
    def tune(
        self,
        target: str | dict[str, Any] = "llvm",
        *,
        work_dir: str | os.PathLike[str] = "./tuning_database",
        trials: int = 2000,
        time_budget: float | None = None,
        trials_per_task: int | None = None,
        opt_level: int = _C.opt_level,
        set_float16: bool = _C.set_float16,
        set_channel_layout: str | None = _C.set_channel_layout,
        progress: bool = True,
        rpc: Any = None,
    ) -> Any:
        """Tunes the model's operators for a CPU target with MetaSchedule.

        The database written to ``work_dir`` starts with Forge's default
        schedule of every operator, measured like the tuned candidates, so the
        best record is never slower than the default. Afterwards this module's
        ``tuning_database`` is ``work_dir``: ``compile()`` applies the best
        records without running trials. Another module of the same model uses
        them after ``ir.tuning_database = work_dir``. Tune with the same
        ``opt_level``, ``set_float16`` and ``set_channel_layout`` you compile
        with: records match operators exactly.

        Args:
            target: A CPU target in any form ``compile()`` takes; defaults to
                this machine. It needs a core count (``"llvm"`` has one).
            work_dir: The database directory; created, or extended when it exists.
                The session writes into a copy beside it, each record as it is
                measured, read back and renamed into place: a write that
                fails (a full disk) leaves the old database as it was and
                raises ``forge.FileAccessError``; a session stopped otherwise
                (Ctrl-C, a tracker gone) keeps the old records and those
                measured before it stopped.
            trials: The trial budget over all operators. 0 measures the
                default schedules only.
            time_budget: Seconds after which tuning stops (the trials in flight
                finish first); None for no limit.
            trials_per_task: The most trials one operator gets.
            opt_level: As in ``compile()``.
            set_float16: As in ``compile()``.
            set_channel_layout: As in ``compile()``.
            progress: Show a progress bar on the terminal.
            rpc: Measure on remote boards instead of this machine: a
                ``forge.RemoteDevices`` (or a mapping with its fields:
                ``{"tracker": "host:9190", "key": "rpi5"}``). Candidates are
                built here for ``target`` (cross-compiled) and measured on
                every device of the key registered with TVM's RPC tracker,
                one candidate a device, all in parallel. A device that
                disconnects fails its candidate and tuning goes on with the
                others; the database is written as results arrive, and a
                session that stops early (the tracker gone, Ctrl-C) keeps what
                it measured.

        Raises:
            forge.TrackerUnreachableError: The tracker does not answer within
                ``rpc``'s ``timeout`` (checked before any work).
            forge.RemoteDeviceError: The tracker has no device of the key.

        Returns:
            A ``forge_core.tuning.TuningReport``: tasks, trials, time, and each
            operator's default and best measured latency.
        """
        from forge_core.compiler.options import CompileOptions
        from forge_core.tuning.progress import progress_bar
        from forge_core.tuning.session import tune_module

        options = CompileOptions.validate(
            opt_level=opt_level, set_float16=set_float16, set_channel_layout=set_channel_layout,
        )
        with progress_bar(enabled=progress) as report:
            result = tune_module(
                self, target, work_dir=work_dir, trials=trials, time_budget=time_budget,
                trials_per_task=trials_per_task, options=options, progress=report, rpc=rpc,
            )
        self.tuning_database = work_dir
        return result

    # ------------------------------------------------------------------
    # Loaders, as the docs also spell them: forge.RelayModule.from_onnx(...)
    # ------------------------------------------------------------------

    @staticmethod
    def from_onnx(*args: Any, **kwargs: Any) -> IRModule:
        """Same as :func:`forge.from_onnx`."""
        from forge_core import loaders

        return loaders.from_onnx(*args, **kwargs)

    @staticmethod
    def from_torch(*args: Any, **kwargs: Any) -> IRModule:
        """Same as :func:`forge.from_torch`."""
        from forge_core import loaders

        return loaders.from_torch(*args, **kwargs)

    @staticmethod
    def from_tensorflow(*args: Any, **kwargs: Any) -> IRModule:
        """Same as :func:`forge.from_tensorflow`."""
        from forge_core import loaders

        return loaders.from_tensorflow(*args, **kwargs)

    @staticmethod
    def from_keras(*args: Any, **kwargs: Any) -> IRModule:
        """Same as :func:`forge.from_keras`."""
        from forge_core import loaders

        return loaders.from_keras(*args, **kwargs)

    @staticmethod
    def from_tflite(*args: Any, **kwargs: Any) -> IRModule:
        """Same as :func:`forge.from_tflite`."""
        from forge_core import loaders

        return loaders.from_tflite(*args, **kwargs)

    # ------------------------------------------------------------------
    # Deprecated Relay-era partition API
    # ------------------------------------------------------------------

    def partition_for_tensorrt(
        self,
        remove_stacks: bool = True,
        simplify_batch_matmul: bool = True,
        simplify_scalar_add: bool = True,
        remove_no_mac_subgraphs: bool = True,
    ) -> None:
        """DEPRECATED: use ``forge.ONNXModule`` for TensorRT optimization.

        Partitions the module for TensorRT by separating TensorRT-compatible
        subgraphs from the "main" graph, with TVM's TensorRT patterns (the
        ``forge-tensorrt`` plugin). Afterwards ``is_tensorrt`` is True,
        ``subgraph_count`` counts the partitions (``tensorrt_0``...), and
        ``graphs`` shows each as its own graph. ``inline_partitions()``
        undoes it. Operates in place.

        Args:
            remove_stacks: Rewrite ``stack`` (no TensorRT pattern) as
                ``expand_dims`` and ``concat`` first. Defaults to True.
            simplify_batch_matmul: Rewrite a "static" batch matmul (a constant
                second operand with unit batch) as one 2-D matmul. Defaults
                to True.
            simplify_scalar_add: Give the constant of a scalar add the rank of
                the tensor it is added to (broadcast): TensorRT's bridge
                takes no scalar adds. Defaults to True.
            remove_no_mac_subgraphs: Inline back any partition without a
                multiply-accumulate operator (convolution, matmul). Defaults
                to True.

        Raises:
            forge.PluginNotInstalledError: The ``forge-tensorrt`` plugin is
                not installed (``pip install 'forge-core[tensorrt]'``).
            ValueError: The module is partitioned already.
        """
        warnings.warn(
            "IRModule.partition_for_tensorrt() is deprecated and will be removed; use forge.ONNXModule for "
            "TensorRT.",
            DeprecationWarning,
            stacklevel=2,
        )
        flags = {"remove_stacks": remove_stacks, "simplify_batch_matmul": simplify_batch_matmul,
                 "simplify_scalar_add": simplify_scalar_add, "remove_no_mac_subgraphs": remove_no_mac_subgraphs}
        before = _Undo("partition_for_tensorrt", self._mod, dict(self._params), "")
        self._run_pass("partition_for_tensorrt", flags, extra="tensorrt")
        self._commit(undo=replace(before, fingerprint_after=self.fingerprint))

    def inline_partitions(self) -> None:
        """DEPRECATED: use ``forge.ONNXModule`` for TensorRT optimization.

        Undoes any partitions and inlines them back into the "main" graph, the
        inverse of ``partition_for_tensorrt()``: when the partitioned module
        is unchanged since, the module is exactly what it was before (same
        fingerprint, the flags' rewrites undone too). After edits in between,
        or for partitions made elsewhere, every partition and the composite
        functions inside it are inlined where they are called (the same
        computation; alias bindings removed). Operates in place.
        """
        warnings.warn(
            "IRModule.inline_partitions() is deprecated and will be removed; use forge.ONNXModule for TensorRT.",
            DeprecationWarning,
            stacklevel=2,
        )
        from forge_core.plugin_manager import get_plugin_manager

        undo = self._undo
        if undo is not None and undo.pass_name == "partition_for_tensorrt" and undo.fingerprint_after == self.fingerprint:
            self._commit(mod=undo.mod, params=undo.params, state=replace(self._state, is_tensorrt=False), undo=None)
            return
        if "inline_tensorrt_partitions" in get_plugin_manager().passes():
            self._run_pass("inline_tensorrt_partitions", {}, undo=None)
        else:  # partitions made elsewhere, without the forge-tensorrt plugin: Forge's own inlining
            self._commit(mod=run_passes(self._mod, ["inline_partitions"]),
                         state=replace(self._state, is_tensorrt=False), undo=None)

    # ------------------------------------------------------------------
    # Display
    # ------------------------------------------------------------------

    def summary(self) -> str:
        """A text summary: inputs, outputs, operator counts and the size of the weights."""
        ops = self.operators
        nbytes = self.weights_nbytes
        lines = [
            f"IRModule: {self.input_count} input(s), {self.output_count} output(s), "
            f"{sum(ops.values())} operator calls of {len(ops)} kinds, weights {weights.format_bytes(nbytes)}",
            "Inputs:",
            *[f"  {spec.describe()}" for spec in self.input_specs],
            "Outputs:",
            *[f"  {spec.describe()}" for spec in self.output_specs],
            f"Graphs: {self.graph_count} (subgraphs: {self.subgraph_count}); params: {len(self._params)}",
            "Flags: " + ", ".join(f"{k}={v}" for k, v in vars(self._state).items()),
        ]
        state = self.initial_state
        if state:
            lines.append(f"State: {len(state)} input(s) fed back from the output of the same name + '_next', starting "
                         "at IRModule.initial_state: " + ", ".join(state))
        lines.append("Operators:")
        width = max((len(name) for name in ops), default=0)
        lines += [f"  {name:<{width}}  {count:>6}" for name, count in ops.items()]
        return "\n".join(lines)

    def __repr__(self) -> str:
        ins = ", ".join(s.describe() for s in self.input_specs)
        outs = ", ".join(s.describe() for s in self.output_specs)
        top = ", ".join(f"{k}={v}" for k, v in list(self.operators.items())[:6])
        return (
            f"<forge.IRModule inputs=[{ins}] outputs=[{outs}] ops={{{top}{', ...' if len(self.operators) > 6 else ''}}} "
            f"weights={weights.format_bytes(self.weights_nbytes)}>"
        )

    def __str__(self) -> str:
        return self.summary()


RelayModule = IRModule
"""The docs' name for :class:`IRModule`."""

