"""Running a module on a stream of samples while watching some of its intermediate tensors.

Calibration and the quantization report both need intermediate values. The
module's ``main`` is rebuilt to return, after its own outputs, the watched
nodes' values; it is compiled once with Forge's pipeline (fast kernels), and
each sample's values are handed to a callback and dropped before the next
sample runs: memory holds one sample's tensors, whatever the sample count.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import numpy as np
import tvm
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from tvm import relax

from forge_core.errors import InputError, OptionError
from forge_core.graph.index import build_index
from forge_core.runtime.signature import TensorSpec, check_inputs

if TYPE_CHECKING:
    from forge_core.ir.parts import ModuleParts

logger = logging.getLogger("forge.quantization")


def watching(mod: tvm.IRModule, params: Mapping[str, Any], names: Sequence[str]) -> tuple[tvm.IRModule, int]:
    """``mod`` whose ``main`` also returns the nodes ``names``; and how many outputs come before them."""
    plain = relax.transform.ToNonDataflow()(mod)
    func = plain["main"]
    index = build_index("main", func, params)  # same names as the original's: same bindings, same order
    missing = [name for name in names if name not in index.records]
    if missing:
        raise OptionError(f"nodes not found in main: {', '.join(missing)}")
    body = func.body
    result = body.body
    outputs = list(result.fields) if isinstance(result, relax.Tuple) else [result]
    watched = [index.records[name].expr for name in names]
    new_body = relax.BlockBuilder().normalize(relax.SeqExpr(body.blocks, relax.Tuple(outputs + watched)))
    new_func = relax.Function(func.params, new_body, None, func.is_pure, func.attrs)
    updated = tvm.IRModule(dict(plain.functions), attrs=plain.attrs)
    updated["main"] = new_func
    updated = relax.transform.Normalize()(updated)
    return relax.transform.ConvertToDataflow()(updated), len(outputs)


def pick_target(use_cuda: bool) -> str:
    """``"cuda"`` when asked for and present, else ``"llvm"`` (saying so once when CUDA was asked for)."""
    if use_cuda:
        if tvm.runtime.device("cuda", 0).exist:
            return "cuda"
        logger.info("use_cuda=True but no CUDA device was found: running on the CPU")
    return "llvm"


def sample_arrays(sample: Any, specs: Sequence[TensorSpec], index: int) -> list[np.ndarray]:
    """One calibration sample as the model's positional inputs, checked.

    A sample is an array (single-input models), a tuple or list of arrays in
    input order, or a dict keyed by input name.

    Raises:
        forge.InputError: The sample does not fit the model; the message names
            the sample's index, the input and the expected and given shape or dtype.
    """
    names = [spec.name for spec in specs]
    if isinstance(sample, Mapping):
        unknown = [key for key in sample if key not in names]
        absent = [name for name in names if name not in sample]
        if unknown or absent:
            raise InputError(
                f"calibration sample {index}: " + "; ".join(
                    part for part in (f"unknown input name(s) {', '.join(map(repr, unknown))}" if unknown else "",
                                      f"missing input(s) {', '.join(map(repr, absent))}" if absent else "")
                    if part) + f" (the model's inputs are {', '.join(map(repr, names))})")
        arrays = [sample[name] for name in names]
    elif isinstance(sample, (tuple, list)):
        arrays = list(sample)
    else:
        arrays = [sample]
    try:
        return check_inputs(specs, arrays)
    except InputError as exc:
        raise InputError(f"calibration sample {index}: {exc}") from None


@contextmanager
def progress(label: str, total: int | None, enabled: bool = True) -> Iterator[Callable[[], None]]:
    """A rich progress bar on stderr; yields ``advance()``."""
    if not enabled:
        yield lambda: None
        return
    with Progress(TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  transient=False) as bar:
        task = bar.add_task("", total=total)
        yield lambda: bar.advance(task)


def compile_watching(ir: ModuleParts, names: Sequence[str], target: str) -> tuple[Callable[..., Any], int]:
    """``ir`` compiled (Forge's pipeline, in memory) to also return ``names``; and its own output count."""
    from forge_core.compiler.compile import compile_to_function
    instrumented, skip = watching(ir.mod, ir.params, names)
    return compile_to_function(ir.from_parts(instrumented, ir.params), target), skip


def stream(ir: ModuleParts, names: Sequence[str], samples: Iterable[Any], on_sample: Callable[[int, list[np.ndarray]], None],
           *, target: str = "llvm", label: str = "Calibrating", show_progress: bool = True) -> int:
    """Run ``ir`` on every sample, calling ``on_sample(index, [watched values])``; returns the sample count."""
    function, skip = compile_watching(ir, names, target)
    specs = ir.input_specs
    total = len(samples) if hasattr(samples, "__len__") else None  # type: ignore[arg-type]
    count = 0
    with progress(label, total, show_progress) as advance:
        for index, sample in enumerate(samples):
            arrays = sample_arrays(sample, specs, index)
            results = function(*arrays)
            results = results if isinstance(results, list) else [results]
            on_sample(index, results[skip:])
            count += 1
            advance()
    return count
