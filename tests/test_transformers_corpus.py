"""Real architectures from Hugging Face ``transformers``, through every export route users take, against torch.

The models (``hf_models``) are the real implementations at a tiny size with
random weights: BERT, DistilBERT, RoBERTa, GPT-2, the T5 encoder, ViT,
MobileViT and the Whisper encoder. Each goes through two routes or more
(GPT-2 three), and each route takes two models or more:

* ``torchscript<opset>``: ``torch.onnx.export(..., dynamo=False)`` at opset 14
  or 17, then ``forge.from_onnx``; ``-dynamic`` exports the batch (and, for
  text, the sequence) as dynamic axes, and the import runs at two sizes;
* ``dynamo``: ``torch.onnx.export(..., dynamo=True)`` (opset 18), then ``forge.from_onnx``; ``-dynamic``
  gives ``dynamic_shapes`` (the batch a named ``Dim``, the sequence ``Dim.AUTO``), as Hugging Face's
  exports leave them;
* ``from_torch``: ``forge.from_torch`` on the module (``torch.export``, or
  its ONNX fallback where that route fails, as for GPT-2);
* ``from_torch-traced``: ``forge.from_torch`` on ``torch.jit.trace(module)``.

Outputs are compared with the module itself on random inputs (rtol 1e-4,
atol 1e-4 of the output's largest magnitude), through the inference function
and, for the cases marked ``compile``, through the compiled artifact run by
``forge.Runtime``.
"""

from __future__ import annotations

import io
import logging
import warnings
from dataclasses import dataclass

import numpy as np
import onnx
import pytest

torch = pytest.importorskip("torch", reason="the torch extra is installed by ./scripts/setup")
pytest.importorskip("transformers", reason="transformers is in the test extra")

from model_factory import assert_matches_framework  # noqa: E402
from hf_models import ARCHITECTURES, Architecture  # noqa: E402

import forge  # noqa: E402

pytestmark = pytest.mark.corpus

BATCH, LENGTH = 2, 12
OTHER_SIZES = (3, 7)  # a second (batch, sequence length) for dynamic imports


@dataclass(frozen=True)
class Case:
    model: str
    route: str
    compile: bool = False

    @property
    def id(self) -> str:
        return f"{self.model}-{self.route}" + ("-compile" if self.compile else "")


CASES = [
    Case("bert", "torchscript14-dynamic", compile=True),
    Case("bert", "from_torch"),
    Case("distilbert", "torchscript14", compile=True),
    Case("distilbert", "dynamo"),
    Case("roberta", "torchscript17-dynamic"),
    Case("roberta", "from_torch-traced"),
    Case("gpt2", "torchscript14-dynamic"),
    Case("gpt2", "from_torch", compile=True),
    Case("gpt2", "dynamo"),
    Case("bert", "dynamo-dynamic", compile=True),
    Case("gpt2", "dynamo-dynamic"),
    Case("t5-encoder", "torchscript17-dynamic"),
    Case("t5-encoder", "from_torch-traced"),
    Case("vit", "torchscript17"),
    Case("vit", "from_torch", compile=True),
    Case("mobilevit", "torchscript17"),
    Case("mobilevit", "from_torch-traced"),
    Case("whisper-encoder", "torchscript14"),
    Case("whisper-encoder", "from_torch"),
]

# torch's own dynamo exporter fails on the T5 encoder before Forge sees a graph; kept to notice a fix.
T5_DYNAMO = pytest.param(
    Case("t5-encoder", "dynamo"), id="t5-encoder-dynamo",
    marks=pytest.mark.xfail(
        strict=True, raises=Exception,
        reason="torch.onnx.export(dynamo=True) itself fails in its decomposition step (torch 2.13): ValueError: "
               "Cannot view a tensor with shape torch.Size([2, 12, 4, 8]) and strides (384, 8, 96, 1) as a "
               "tensor with shape (2, 12, 32) (T5Attention's view after SDPA); no ONNX model reaches Forge"))


def reference(model: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> np.ndarray:
    with torch.no_grad():
        return model(*inputs).numpy()


def export_torchscript(model, inputs, arch: Architecture, opset: int, dynamic: bool) -> onnx.ModelProto:
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation and tracer notes
        torch.onnx.export(model, inputs, buffer, input_names=list(arch.input_names), output_names=["output"],
                          opset_version=opset, dynamo=False, dynamic_axes=arch.dynamic_axes if dynamic else None)
    return onnx.load_from_string(buffer.getvalue())


def export_dynamo(model, inputs, arch: Architecture, dynamic: bool = False) -> onnx.ModelProto:
    shapes = None
    if dynamic:
        batch = torch.export.Dim("batch", min=1, max=64)
        shapes = {name: {axis: batch if axis == 0 else torch.export.Dim.AUTO for axis in arch.dynamic_axes[name]}
                  for name in arch.input_names}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(model, inputs, input_names=list(arch.input_names), opset_version=18,
                                    dynamo=True, verbose=False, dynamic_shapes=shapes)
    return program.model_proto


def load(case: Case, model, inputs, arch: Architecture) -> forge.IRModule:
    route = case.route
    if route.startswith("torchscript"):
        opset = int(route.removeprefix("torchscript").split("-")[0])
        return forge.from_onnx(export_torchscript(model, inputs, arch, opset, route.endswith("-dynamic")))
    if route.startswith("dynamo"):
        return forge.from_onnx(export_dynamo(model, inputs, arch, dynamic=route.endswith("-dynamic")))
    if route == "from_torch":
        return forge.from_torch(model, example_inputs=inputs)
    if route == "from_torch-traced":
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # TracerWarnings on the models' Python-side shape checks
            traced = torch.jit.trace(model, inputs)
        infos = [(name, (tuple(t.shape), str(t.dtype))) for name, t in zip(arch.input_names, inputs)]
        return forge.from_torch(traced, infos)
    raise AssertionError(f"unknown route {route}")


def check(case: Case, tmp_path) -> None:
    arch = ARCHITECTURES[case.model]
    model = arch.build(seed=len(case.id))
    inputs = arch.inputs(BATCH, LENGTH, seed=1)
    ir = load(case, model, inputs, arch)
    assert ir.input_names == list(arch.input_names)
    run = ir.get_inference_function()
    sizes = [(BATCH, LENGTH)]
    if case.route.endswith("-dynamic"):
        dynamic_axes = [sorted(arch.dynamic_axes[name]) for name in arch.input_names]
        assert [[axis for axis, size in enumerate(shape) if size == forge.DYNAMIC_DIM]
                for shape in ir.input_shapes] == dynamic_axes
        sizes.append(OTHER_SIZES)
    for batch, length in sizes:
        values = arch.inputs(batch, length, seed=batch + length)
        assert_matches_framework(run(*[v.numpy() for v in values]), reference(model, values))
    if case.compile:
        ir.compile(output_path=tmp_path / "artifact")
        runtime = forge.Runtime(tmp_path / "artifact")
        for batch, length in sizes:
            values = arch.inputs(batch, length, seed=batch * length)
            assert_matches_framework(runtime.infer(*[v.numpy() for v in values]), reference(model, values))


def _param(case: Case | object) -> object:
    if isinstance(case, Case):
        return pytest.param(case, id=case.id)
    return pytest.param(*case.values, id=case.values[0].id, marks=case.marks)


@pytest.mark.parametrize("case", [_param(c) for c in CASES] + [T5_DYNAMO])
def test_transformers_architecture(case, tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="forge.torch"):
        check(case, tmp_path)
    if case.model == "gpt2" and case.route == "from_torch":
        # torch's decomposition of GPT-2's exported program fails (a view's strides after SDPA): the
        # ONNX fallback takes it, saying so once.
        fallbacks = [r.getMessage() for r in caplog.records if r.name == "forge.torch"]
        assert len(fallbacks) == 1 and "decomposition to core ATen failed" in fallbacks[0]


def test_every_architecture_and_route_is_covered():
    """The matrix above covers every model through two routes or more, and every route with two models or more."""
    cases = [c if isinstance(c, Case) else c.values[0] for c in CASES]
    models = {c.model for c in cases}
    assert models == set(ARCHITECTURES)
    for model in models:
        assert len([c for c in cases if c.model == model]) >= 2, model
    for route in {c.route for c in cases}:
        assert len({c.model for c in cases if c.route == route}) >= 2, route
    assert len({c.model for c in cases if c.compile}) >= 3



THREE_BATCHES = [1, 3, 8]


@pytest.mark.parametrize("model_name, route", [("bert", "export-Dim"), ("distilbert", "input_infos")])
def test_from_torch_keeps_the_batch_dynamic(model_name, route, tmp_path):
    """``torch.export`` with ``Dim`` on the batch (an ExportedProgram the user made), or ``input_infos`` with -1
    (Forge exports with ``Dim.AUTO``): the batch stays dynamic, and the inference function and one artifact (with
    a bucket at batch 1) match the module at three batches.

    A dynamic sequence: the next test.
    """
    arch = ARCHITECTURES[model_name]
    model = arch.build(seed=4).eval()
    inputs = arch.inputs(BATCH, LENGTH, seed=1)
    if route == "export-Dim":
        batch = torch.export.Dim("batch", max=64)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            program = torch.export.export(model, inputs, dynamic_shapes=tuple({0: batch} for _ in inputs),
                                          strict=False)
        ir = forge.from_torch(program)
    else:
        infos = [(name, ((-1, LENGTH), str(t.dtype).removeprefix("torch.")))
                 for name, t in zip(arch.input_names, inputs)]
        ir = forge.from_torch(model, infos)
    assert ir.input_shapes == [(-1, LENGTH)] * len(inputs)
    run = ir.get_inference_function()
    ir.compile(output_path=tmp_path / "artifact", shape_buckets=[{name: (1, LENGTH) for name in ir.input_names}])
    runtime = forge.Runtime(tmp_path / "artifact")
    for batch_size in THREE_BATCHES:
        values = arch.inputs(batch_size, LENGTH, seed=batch_size)
        want = reference(model, values)
        assert_matches_framework(run(*[v.numpy() for v in values]), want)
        assert_matches_framework(runtime.infer(*[v.numpy() for v in values]), want)


@pytest.mark.parametrize("route", ["input_infos", "export-Dim"])
def test_a_dynamic_sequence_keeps_the_torch_export_route(route, caplog):
    """With the sequence dynamic, ``torch.export`` slices BERT's position table of 64 to the sequence, which
    TVM clamped to ``min(sequence, 64)``: Relax could not relate it to the sequence and the sum lost its shape;
    ``from_torch(model, input_infos)`` fell back to the ONNX route, and an ExportedProgram (``Dim`` on batch
    and sequence) was refused. The bound torch records for the sequence (``max=64``, or the table's 64 that
    ``Dim.AUTO`` infers from the slice's guard) proves the slice in bounds: the torch.export route keeps the
    model, the numbers match at three (batch, sequence) sizes, and a sequence past the table is refused."""
    arch = ARCHITECTURES["bert"]
    model = arch.build(seed=4).eval()
    with caplog.at_level(logging.WARNING, logger="forge.torch"):
        if route == "input_infos":
            ir = forge.from_torch(model, [(name, ((-1, -1), "int64")) for name in arch.input_names])
        else:
            inputs = arch.inputs(BATCH, LENGTH, seed=1)
            dims = {0: torch.export.Dim("batch", max=64), 1: torch.export.Dim("sequence", max=64)}
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                ir = forge.from_torch(torch.export.export(model, inputs, dynamic_shapes=tuple(dims for _ in inputs),
                                                          strict=False))
    assert not [r.getMessage() for r in caplog.records if "loaded through ONNX" in r.getMessage()]
    assert ir.input_shapes == [(-1, -1)] * 2
    run = ir.get_inference_function()
    for batch_size, length in [(1, 7), (3, 33), (8, 64)]:
        values = arch.inputs(batch_size, length, seed=batch_size)
        assert_matches_framework(run(*[v.numpy() for v in values]), reference(model, values))
    # past the table of 64 the slice would read beyond it (a segmentation fault): refused, naming the input
    with pytest.raises(forge.InputError, match=r"input 'input_ids' axis 1 .* must be at most 64.*\[80\]"):
        run(*[v.numpy() for v in arch.inputs(1, 80, seed=1)])
