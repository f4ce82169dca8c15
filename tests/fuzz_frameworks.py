"""The TFLite, PyTorch and Keras families of the malformed-model fuzz corpus (tests/model_fuzz.py).

* ``tflite``: mutations of small real ``.tflite`` flatbuffers that TensorFlow's
  converter writes once per corpus into ``workdir`` (a float CNN with a
  ``Flatten``, a two-input two-output model with an ``Embedding``, and a
  full-integer int8 CNN). Byte-level kinds flip bits, set bytes, write 32-bit
  values, truncate, insert, delete and splice (a range of another base model
  too); targeted kinds edit one field in place, found through the ``tflite``
  package: a tensor's shape, shape signature, type, buffer index, name or
  constant data, an operator's opcode index, inputs, outputs or builtin
  options, an operator code, the subgraph's inputs and outputs, a vector's
  length, quantization scales and zero points; an ``options`` kind gives
  ``from_tflite`` a wrong ``shape_dict`` or ``dtype_dict``, or a dynamic
  batch, and ``mutated-dynamic`` an edited field with a dynamic batch (TVM's
  importer on symbolic shapes, or the tf2onnx route). Each case stores
  its edits (``["set", offset, hex]``, ``["insert", offset, hex]``,
  ``["delete", offset, length]``, ``["truncate", length]``), applied in
  :func:`run_case`. A model Forge loads is run on random inputs and compared
  with ``tf.lite.Interpreter``'s builtin kernels (quantized outputs within one
  step, see :func:`_interpreter`; shapes and types only where a mutation made
  NaN flow through a max or a ReLU); a model the interpreter rejects must not
  load, and one it cannot run must not run in Forge either (an index out of
  range included: Forge refuses it when the model runs). The interpreter runs each model at the
  operator versions of its base (Forge does not read versions).
* ``torch``: modules that fail to export or are awkward to: data-dependent
  control flow and ``.item()``, ``nonzero``-driven shapes, ops without a
  converter, custom autograd Functions, Python side effects, in-place ops on
  inputs and buffers, outputs that are dicts, None, strings or ints, forwards
  that raise, example inputs or ``input_infos`` of the wrong count, dtype or
  shape, TorchScript and ExportedProgram inputs, and plain models. A model
  Forge loads is compared with eager PyTorch (a fresh copy of the module, on
  the example inputs and on inputs of the other sign, so that a branch baked
  into a trace shows).
* ``keras``: layers TFLite rejects or Forge cannot convert (Lambda layers
  with NumPy, ``tf.py_function``, Python control flow on tensors or ops
  without TFLite builtins, string and ragged inputs, layers that raise,
  unusual dtypes, stateful RNNs, wrong ``shape`` options, models without
  inputs), and layers that convert. A model Forge loads is compared with the
  Keras model.

A construction of the torch and keras families is picked by case index and
built in the worker from the case's seed (random sizes and weights).
"""

from __future__ import annotations

import contextlib
import io
import math
import os
import random
import struct
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # TensorFlow's C++ start-up notices

Case = dict[str, Any]
Edit = list[Any]
"""``["set", offset, hex]``, ``["insert", offset, hex]``, ``["delete", offset, length]`` or ``["truncate", length]``."""

RTOL = 1e-4
MAX_RUN_ELEMENTS = 1 << 20  # inputs larger than this are not run: the signature is compared instead


def make_cases(family: str, seed: int, count: int, workdir: Path) -> list[Case]:
    """``count`` seeded cases of ``family`` ("tflite", "torch" or "keras"); case i is the same for any count."""
    if family == "tflite":
        return _tflite_cases(seed, count, workdir)
    if family in ("torch", "keras"):
        constructions = TORCH_CASES if family == "torch" else KERAS_CASES
        # Every construction once per round, in an order of the seed's; then again with other sizes and weights.
        order = sorted(constructions, key=lambda name: random.Random(f"{family}:{seed}:{name}").random())
        cases = []
        for index in range(count):
            rng = random.Random(f"{family}:{seed}:{index}")
            kind = order[index % len(order)]
            cases.append({"id": f"{family}-s{seed}-{index:05d}", "family": family, "kind": kind,
                          "seed": rng.randrange(1 << 30), "names": list(constructions[kind].names)})
        return cases
    raise ValueError(f"fuzz_frameworks makes the tflite, torch and keras families' cases, not {family!r}")


def run_case(case: Case) -> str | None:
    """Load the case through Forge; when it loads, compare it with its framework. Exceptions propagate."""
    if case["family"] == "tflite":
        return _run_tflite(case)
    if case["family"] == "torch":
        return _run_torch(case)
    if case["family"] == "keras":
        return _run_keras(case)
    raise ValueError(f"unknown family {case['family']!r}")


def _note_phase(phase: str) -> None:
    from model_fuzz import note_phase

    note_phase(phase)


# ----------------------------------------------------------------------------------------------------
# Comparing outputs
# ----------------------------------------------------------------------------------------------------


def _as_list(result: Any) -> list[np.ndarray]:
    return [np.asarray(r) for r in result] if isinstance(result, (list, tuple)) else [np.asarray(result)]


def compare_signatures(got: Sequence[np.ndarray], want: Sequence[np.ndarray], reference: str) -> str | None:
    """None when Forge's outputs have the reference's count, shapes and dtypes; else what differs."""
    if len(got) != len(want):
        return f"{len(got)} outputs, {reference} gives {len(want)}"
    for index, (g, w) in enumerate(zip(got, want)):
        g, w = np.asarray(g), np.asarray(w)
        if g.shape != w.shape or g.dtype != w.dtype:
            return f"output {index}: {g.dtype} {g.shape}, {reference} gives {w.dtype} {w.shape}"
    return None


def compare(got: Sequence[np.ndarray], want: Sequence[np.ndarray], reference: str,
            rtol: float = RTOL, int_tolerance: Sequence[int] | None = None) -> str | None:
    """None when Forge's outputs match the reference's; else what differs.

    Shapes and dtypes must be equal; floats match within ``rtol`` of the
    largest finite reference value, NaN where the reference has NaN and
    infinities of the same sign; integers and booleans exactly, or within
    ``int_tolerance[i]`` for output ``i``.
    """
    different = compare_signatures(got, want, reference)
    if different is not None:
        return different
    for index, (g, w) in enumerate(zip(got, want)):
        tolerance = int_tolerance[index] if int_tolerance is not None else 0
        g, w = np.asarray(g), np.asarray(w)
        if w.dtype.kind in "fc":
            finite = np.isfinite(w)
            scale = float(np.max(np.abs(w[finite]), initial=1.0))
            if not np.allclose(g.astype(w.dtype), w, rtol=rtol, atol=rtol * scale, equal_nan=True):
                diff = np.abs(g.astype(np.float64) - w.astype(np.float64))
                worst = float(np.nanmax(diff)) if diff.size and not np.all(np.isnan(diff)) else float("nan")
                return f"output {index}: differs from {reference} by up to {worst:.3g} (scale {scale:.3g})"
        elif np.any(np.abs(g.astype(np.int64) - w.astype(np.int64)) > tolerance):
            wrong = int(np.count_nonzero(np.abs(g.astype(np.int64) - w.astype(np.int64)) > tolerance))
            return f"output {index}: {wrong} of {w.size} elements differ from {reference}" + (
                f" by more than {tolerance}" if tolerance else "")
    return None


def _random_array(rng: np.random.Generator, shape: Sequence[int], dtype: Any, high: int = 4) -> np.ndarray:
    """Standard-normal floats; integers in [0, high) (indices stay in range), the full range for 8-bit."""
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.random(tuple(shape)) < 0.5
    if dtype.kind in "iu":
        if dtype.itemsize == 1:
            info = np.iinfo(dtype)
            return rng.integers(int(info.min), int(info.max) + 1, tuple(shape)).astype(dtype)
        return rng.integers(0, high, tuple(shape)).astype(dtype)
    return rng.standard_normal(tuple(shape)).astype(dtype)


# ----------------------------------------------------------------------------------------------------
# TFLite: base models
# ----------------------------------------------------------------------------------------------------


def _quiet() -> contextlib.AbstractContextManager[Any]:
    """Silence what TensorFlow's converter prints ("Saved artifact at ...")."""
    stack = contextlib.ExitStack()
    stack.enter_context(contextlib.redirect_stdout(io.StringIO()))
    stack.enter_context(warnings.catch_warnings())
    warnings.simplefilter("ignore")
    return stack


def _tflite_bases() -> dict[str, bytes]:
    """The base flatbuffers, converted by TensorFlow from seeded Keras models."""
    import keras
    import tensorflow as tf

    bases = {}
    with _quiet():
        keras.utils.set_random_seed(17)
        image = keras.Input((6, 6, 2), name="image")
        x = keras.layers.Conv2D(3, 3, padding="same", activation="relu", name="conv")(image)
        x = keras.layers.Flatten(name="flatten")(keras.layers.MaxPooling2D(name="pool")(x))
        x = keras.layers.Softmax(name="probabilities")(keras.layers.Dense(4, name="dense")(x))
        bases["cnn"] = tf.lite.TFLiteConverter.from_keras_model(keras.Model(image, x)).convert()

        features = keras.Input((5,), name="features")
        ids = keras.Input((3,), dtype="int32", name="ids")
        hidden = keras.layers.Dense(6, activation="tanh", name="hidden")(features)
        embedded = keras.layers.GlobalAveragePooling1D(name="mean")(keras.layers.Embedding(8, 6, name="embed")(ids))
        product = keras.layers.Multiply(name="product")([hidden, embedded])
        score = keras.layers.Dense(2, name="score")(keras.layers.Concatenate(name="joined")([hidden, embedded]))
        model = keras.Model([features, ids], [product, score])
        bases["two_in_two_out"] = tf.lite.TFLiteConverter.from_keras_model(model).convert()

        image = keras.Input((5, 5, 2), name="image")
        x = keras.layers.Conv2D(4, 3, activation="relu", name="conv")(image)
        x = keras.layers.Dense(3, name="dense")(keras.layers.GlobalAveragePooling2D(name="pool")(x))
        quantized = keras.Model(image, x)
        calibration = np.random.default_rng(17)

        def representative() -> Iterator[list[np.ndarray]]:
            for _ in range(16):
                yield [calibration.uniform(-1.0, 1.0, (1, 5, 5, 2)).astype("float32")]

        converter = tf.lite.TFLiteConverter.from_keras_model(quantized)
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        converter.representative_dataset = representative
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
        converter.inference_input_type = converter.inference_output_type = tf.int8
        bases["int8"] = converter.convert()
    return bases


# ----------------------------------------------------------------------------------------------------
# TFLite: where the fields are
# ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Field:
    """A field of the base flatbuffer that an edit can overwrite in place."""

    offset: int
    fmt: str
    """struct format of the stored value (``"<i"``, ``"<b"``...)."""
    what: str
    """For names: ``"tensor 'conv/Relu' shape[1]"``."""
    names: tuple[str, ...]


def _slot(table: Any, slot: int) -> int:
    return table._tab.Offset(4 + 2 * slot)


def _scalar_field(table: Any, slot: int, fmt: str, what: str, names: tuple[str, ...]) -> list[Field]:
    offset = _slot(table, slot)
    return [Field(table._tab.Pos + offset, fmt, what, names)] if offset else []


def _vector_fields(table: Any, slot: int, fmt: str, what: str, names: tuple[str, ...],
                   length_too: bool = False) -> list[Field]:
    offset = _slot(table, slot)
    if not offset:
        return []
    start, length = table._tab.Vector(offset), table._tab.VectorLen(offset)
    size = struct.calcsize(fmt)
    fields = [Field(start + size * i, fmt, f"{what}[{i}]", names) for i in range(length)]
    return fields + ([Field(start - 4, "<I", f"{what} length", names)] if length_too else [])


def _tensor_name(subgraph: Any, index: int) -> str:
    name = subgraph.Tensors(index).Name()
    return name.decode() if name else f"tensor {index}"


def _fields(data: bytes) -> dict[str, list[Field]]:
    """The editable fields of a base model, by kind."""
    import tflite
    from tflite.BuiltinOperator import BuiltinOperator

    builtin_names = {v: k for k, v in vars(BuiltinOperator).items() if isinstance(v, int)}
    model = tflite.Model.GetRootAsModel(data, 0)
    subgraph = model.Subgraphs(0)
    fields: dict[str, list[Field]] = {kind: [] for kind in TFLITE_FIELD_KINDS}
    buffers = [model.Buffers(i) for i in range(model.BuffersLength())]
    # An error about a tensor may name it, or the node (an operator's first output) that reads or writes it.
    related: dict[int, set[str]] = {i: {_tensor_name(subgraph, i)} for i in range(subgraph.TensorsLength())}
    by_code: dict[int, set[str]] = {}
    for index in range(subgraph.OperatorsLength()):
        op = subgraph.Operators(index)
        node = _tensor_name(subgraph, op.Outputs(0)) if op.OutputsLength() else f"operator {index}"
        by_code.setdefault(op.OpcodeIndex(), set()).add(node)
        for tensor in [*op.InputsAsNumpy(), *op.OutputsAsNumpy()] if op.InputsLength() else op.OutputsAsNumpy():
            if tensor >= 0:
                related[int(tensor)].add(node)
    every_node = tuple(sorted(set().union(*by_code.values())))
    for index in range(subgraph.TensorsLength()):
        tensor = subgraph.Tensors(index)
        name = _tensor_name(subgraph, index)
        names = tuple(sorted(related[index]))
        fields["tensor-shape"] += _vector_fields(tensor, 0, "<i", f"tensor {name!r} shape", names + ("shape",))
        fields["tensor-shape-signature"] += _vector_fields(tensor, 7, "<i", f"tensor {name!r} shape_signature",
                                                           names + ("shape_signature",))
        fields["tensor-type"] += _scalar_field(tensor, 1, "<b", f"tensor {name!r} type", names + ("type",))
        fields["tensor-buffer"] += _scalar_field(tensor, 2, "<I", f"tensor {name!r} buffer", names + ("buffer",))
        fields["tensor-name"] += _vector_fields(tensor, 3, "<B", f"tensor {name!r} name", ("name", "utf-8",
                                                                                            *names))
        fields["vector-length"] += _vector_fields(tensor, 0, "<i", f"tensor {name!r} shape", names + ("shape",),
                                                  True)[-1:]
        buffer = buffers[tensor.Buffer()] if tensor.Buffer() < len(buffers) else None
        if buffer is not None and buffer.DataLength():
            fields["constant-data"] += _vector_fields(buffer, 0, "<B", f"tensor {name!r} data", names)
            fields["vector-length"] += _vector_fields(buffer, 0, "<B", f"tensor {name!r} data", names + ("data",),
                                                      True)[-1:]
        quantization = tensor.Quantization()
        if quantization is not None:
            fields["quant-scale"] += _vector_fields(quantization, 2, "<f", f"tensor {name!r} scale",
                                                    names + ("scale",))
            fields["quant-zero-point"] += _vector_fields(quantization, 3, "<q", f"tensor {name!r} zero_point",
                                                         names + ("zero point", "zero_point"))
    for index in range(subgraph.OperatorsLength()):
        op = subgraph.Operators(index)
        code = model.OperatorCodes(op.OpcodeIndex())
        op_name = builtin_names.get(max(code.BuiltinCode(), code.DeprecatedBuiltinCode()), "CUSTOM")
        output = _tensor_name(subgraph, op.Outputs(0)) if op.OutputsLength() else f"operator {index}"
        names = (output, op_name, f"operator {index}")
        fields["opcode-index"] += _scalar_field(op, 0, "<I", f"operator {index} opcode_index",
                                                names + ("opcode_index",))
        # Another input changes what the op computes: a later node may be the one that fails.
        fields["op-inputs"] += _vector_fields(op, 1, "<i", f"operator {index} inputs", names + ("inputs", *every_node))
        fields["op-outputs"] += _vector_fields(op, 2, "<i", f"operator {index} outputs", names + ("outputs",))
        fields["vector-length"] += _vector_fields(op, 1, "<i", f"operator {index} inputs", names + ("inputs",),
                                                  True)[-1:]
        options = op.BuiltinOptions()
        if options is not None:
            vtable = options.Pos - struct.unpack_from("<i", data, options.Pos)[0]
            vtable_size = struct.unpack_from("<H", data, vtable)[0]
            for entry in range(4, vtable_size, 2):
                offset = struct.unpack_from("<H", data, vtable + entry)[0]
                if offset:
                    # A changed option changes what the op computes: a later node may be the one that fails.
                    fields["op-options"].append(Field(options.Pos + offset, "<B", f"operator {index} option "
                                                      f"{(entry - 4) // 2}", ("options", *every_node)))
    for index in range(model.OperatorCodesLength()):
        code = model.OperatorCodes(index)
        names = ("operator code", "opcode", *sorted(by_code.get(index, ())))
        fields["builtin-code"] += _scalar_field(code, 3, "<i", f"operator code {index} builtin_code", names)
        fields["builtin-code"] += _scalar_field(code, 0, "<b", f"operator code {index} deprecated_builtin_code",
                                                names)
    every = tuple(sorted(set().union(*related.values())))
    fields["subgraph-io"] += _vector_fields(subgraph, 1, "<i", "subgraph inputs", ("inputs", "input", *every))
    fields["subgraph-io"] += _vector_fields(subgraph, 2, "<i", "subgraph outputs", ("outputs", "output", *every))
    fields["vector-length"] += _vector_fields(subgraph, 0, "<i", "subgraph tensors", ("tensor", "tensors"), True)[-1:]
    fields["vector-length"] += _vector_fields(subgraph, 3, "<i", "subgraph operators", ("operator", "operators"), True)[-1:]
    fields["vector-length"] += _vector_fields(model, 4, "<i", "model buffers", ("buffer", "buffers"), True)[-1:]
    return fields


TFLITE_FIELD_KINDS = ("tensor-shape", "tensor-shape-signature", "tensor-type", "tensor-buffer", "tensor-name",
                      "constant-data", "quant-scale", "quant-zero-point", "opcode-index", "op-inputs", "op-outputs",
                      "op-options", "builtin-code", "subgraph-io", "vector-length")
# A corrupt file's error names the file as TFLite and the table or node: Forge's checks name the subgraph,
# tensor, operator or buffer; a converter's failure the node.
BYTE_NAMES = ["TFLite", "tflite", "model", "subgraph", "tensor", "operator", "buffer", "node"]
TFLITE_BYTE_KINDS = ("bit-flip", "byte-set", "int32-write", "truncate", "insert", "delete", "splice")
TFLITE_KINDS = (*TFLITE_BYTE_KINDS, *TFLITE_FIELD_KINDS, "options", "mutated-dynamic")
# Interesting values per format, beside random ones.
_INT_VALUES = (0, 1, -1, 2, 3, 7, 255, 1 << 16, (1 << 31) - 1, -(1 << 31), -2)


def _new_value(field: Field, old: int | float, rng: random.Random, count: int) -> int | float:
    """A value for ``field`` other than ``old``: edge cases, an index just out of range, or a random one."""
    kind = field.fmt[-1]
    if kind == "f":
        # Scales that make no sense, and others that do (far ones saturate differently in TFLite and TVM).
        return rng.choice([0.0, -0.0, -1.0, float("nan"), float("inf"), old * 2, old / 3, old * 64, old / 64])
    if kind == "q":
        return rng.choice([-129, 128, 300, 1 << 40, -(1 << 62), int(old) + 1])
    lo, hi = {"b": (-128, 127), "B": (0, 255), "i": (-(1 << 31), (1 << 31) - 1), "I": (0, (1 << 32) - 1)}[kind]
    candidates = [v for v in (*_INT_VALUES, count, count + 1, rng.randrange(max(count, 1)), rng.randint(lo, hi))
                  if lo <= v <= hi and v != old]
    return rng.choice(candidates)


def _field_edit(data: bytes, kind: str, fields: list[Field], rng: random.Random,
                counts: dict[str, int]) -> tuple[list[Edit], str, list[str]]:
    field = rng.choice(fields)
    old = struct.unpack_from(field.fmt, data, field.offset)[0]
    count = {"tensor-buffer": counts["buffers"], "opcode-index": counts["codes"]}.get(kind, counts["tensors"])
    if kind == "constant-data":
        new: Any = rng.randrange(256)
    elif kind == "tensor-name":
        new = rng.choice([0xFF, 0x80, 0xC3, 0, ord("x")])
    elif kind == "op-options":
        new = rng.choice([0, 1, 2, 3, 7, 100, 255])
    elif kind == "tensor-type":
        new = rng.choice([v for v in (0, 1, 2, 3, 4, 5, 6, 7, 9, 10, 13, 17, 19, 100, -1) if v != old])
    else:
        new = _new_value(field, old, rng, count)
    packed = struct.pack(field.fmt, new)
    return [["set", field.offset, packed.hex()]], f"{field.what}: {old!r} -> {new!r}", list(field.names)


def _byte_edit(data: bytes, kind: str, rng: random.Random, donor: bytes) -> tuple[list[Edit], str]:
    size = len(data)
    if kind == "bit-flip":
        edits = []
        for _ in range(rng.choice([1, 1, 2, 3, 8])):
            offset = rng.randrange(size)
            edits.append(["set", offset, bytes([data[offset] ^ (1 << rng.randrange(8))]).hex()])
        return edits, f"{len(edits)} bit flips"
    if kind == "byte-set":
        edits = [["set", rng.randrange(size), bytes([rng.choice([0, 0xFF, 0x7F, 0x80, rng.randrange(256)])]).hex()]
                 for _ in range(rng.randint(1, 4))]
        return edits, f"{len(edits)} bytes set"
    if kind == "int32-write":
        offset = rng.randrange(0, size - 4, 4)
        value = rng.choice([*_INT_VALUES, size, size - 4, size + 4, rng.randrange(size)])
        return [["set", offset, struct.pack("<i", value).hex()]], f"int32 {value} at {offset}"
    if kind == "truncate":
        length = rng.choice([rng.randrange(size), rng.randrange(8), size - rng.randint(1, 16)])
        return [["truncate", length]], f"truncated to {length} bytes"
    if kind == "insert":
        offset, length = rng.randrange(size + 1), rng.choice([1, 2, 4, 8, rng.randint(1, 256)])
        return [["insert", offset, rng.randbytes(length).hex()]], f"{length} bytes inserted at {offset}"
    if kind == "delete":
        offset = rng.randrange(size)
        length = rng.choice([1, 4, rng.randint(1, 256)])
        return [["delete", offset, length]], f"{length} bytes deleted at {offset}"
    # splice: a range of this model or of another base copied over another range
    source = donor if rng.random() < 0.5 else data
    length = rng.randint(1, min(512, len(source), size))
    start, offset = rng.randrange(len(source) - length + 1), rng.randrange(size - length + 1)
    return [["set", offset, source[start:start + length].hex()]], f"{length} bytes spliced at {offset}"


def apply_edits(data: bytes, edits: Sequence[Edit]) -> bytes:
    """The base bytes with a case's edits applied in order."""
    out = bytearray(data)
    for edit in edits:
        if edit[0] == "set":
            chunk = bytes.fromhex(edit[2])
            out[edit[1]:edit[1] + len(chunk)] = chunk
        elif edit[0] == "insert":
            out[edit[1]:edit[1]] = bytes.fromhex(edit[2])
        elif edit[0] == "delete":
            del out[edit[1]:edit[1] + edit[2]]
        elif edit[0] == "truncate":
            del out[edit[1]:]
        else:
            raise ValueError(f"unknown edit {edit!r}")
    return bytes(out)


def _options_case(data: bytes, rng: random.Random) -> tuple[dict[str, Any], str, list[str]]:
    """``from_tflite`` options that do not fit the model: names, ranks, sizes and dtypes."""
    import tflite

    model = tflite.Model.GetRootAsModel(data, 0)
    subgraph = model.Subgraphs(0)
    name = _tensor_name(subgraph, subgraph.Inputs(0))
    # A shape or dtype the graph cannot take fails at the first operator that sees it.
    nodes = [name] + [_tensor_name(subgraph, subgraph.Operators(i).Outputs(0))
                      for i in range(subgraph.OperatorsLength())]
    shape = [int(d) for d in subgraph.Tensors(subgraph.Inputs(0)).ShapeAsNumpy()]
    choice = rng.randrange(9)
    if choice == 0:
        return {"shape_dict": {"no_such_input": shape}}, "shape_dict names no input", ["no_such_input"]
    if choice == 1:
        return {"shape_dict": {name: shape + [1]}}, "shape_dict of another rank", [name]
    if choice == 2:
        return {"shape_dict": {name: [0, *shape[1:]]}}, "shape_dict with a 0", [name]
    if choice == 3:
        return {"shape_dict": {name: [-5, *shape[1:]]}}, "shape_dict with -5", [name]
    if choice == 4:
        return {"dtype_dict": {name: "floaty"}}, "dtype_dict with an unknown dtype", ["floaty"]
    if choice == 5:
        return {"dtype_dict": {name: rng.choice(["int32", "float16", "uint8", "bool"])}}, "dtype_dict of another " \
            "type", nodes
    if choice == 6:
        return {"shape_dict": {name: [*shape[:-1], shape[-1] + 1]}}, "shape_dict with another size", nodes
    if choice == 7:
        return {"shape_dict": {name: [None, *shape[1:]]}}, "shape_dict with a dynamic batch", nodes
    return {"shape_dict": dynamic_batch(data)}, "shape_dict with a dynamic batch on every input", nodes


def dynamic_batch(data: bytes) -> dict[str, list[int | None]]:
    """A ``shape_dict`` making every input's batch dynamic (TVM's importer, or the tf2onnx route)."""
    import tflite

    subgraph = tflite.Model.GetRootAsModel(data, 0).Subgraphs(0)
    return {_tensor_name(subgraph, int(i)): [None, *[int(d) for d in subgraph.Tensors(int(i)).ShapeAsNumpy()[1:]]]
            for i in subgraph.InputsAsNumpy()}


def _tflite_cases(seed: int, count: int, workdir: Path) -> list[Case]:
    bases = _tflite_bases()
    paths = {}
    for name, data in bases.items():
        paths[name] = workdir / f"base-{name}.tflite"
        paths[name].write_bytes(data)
    fields = {name: _fields(data) for name, data in bases.items()}
    counts = {}
    for name, data in bases.items():
        import tflite

        model = tflite.Model.GetRootAsModel(data, 0)
        counts[name] = {"buffers": model.BuffersLength(), "codes": model.OperatorCodesLength(),
                        "tensors": model.Subgraphs(0).TensorsLength()}
    cases = []
    for index in range(count):
        rng = random.Random(f"tflite:{seed}:{index}")
        kind = rng.choice(TFLITE_KINDS)
        base = rng.choice([name for name in bases if fields[name].get(kind, True)])
        data = bases[base]
        case: Case = {"id": f"tflite-s{seed}-{index:05d}", "family": "tflite", "kind": kind, "base": base,
                      "path": str(paths[base])}
        if kind in TFLITE_BYTE_KINDS:
            donor = bases[rng.choice(sorted(bases))]
            case["edits"], case["detail"] = _byte_edit(data, kind, rng, donor)
            case["names"] = BYTE_NAMES
        elif kind == "options":
            case["edits"] = []
            case["options"], case["detail"], case["names"] = _options_case(data, rng)
        elif kind == "mutated-dynamic":
            # A field edited, loaded with a dynamic batch: TVM's importer on symbolic shapes, or the tf2onnx
            # route, which reads the flatbuffer with tf.lite.Interpreter.
            field_kind = rng.choice([k for k in TFLITE_FIELD_KINDS if fields[base][k]])
            case["edits"], case["detail"], case["names"] = _field_edit(data, field_kind, fields[base][field_kind],
                                                                       rng, counts[base])
            case["options"] = {"shape_dict": dynamic_batch(data)}
            case["names"] = [*case["names"], *BYTE_NAMES]
        else:
            case["edits"], case["detail"], case["names"] = _field_edit(data, kind, fields[base][kind], rng,
                                                                       counts[base])
        cases.append(case)
    return cases


# ----------------------------------------------------------------------------------------------------
# TFLite: running a case
# ----------------------------------------------------------------------------------------------------


def _interpreter(data: bytes, shapes: Sequence[Sequence[int]] | None = None) -> Any:
    """TFLite's interpreter with its builtin kernels, every tensor kept, tensors allocated (kernels prepared).

    Not the XNNPACK delegate: it takes every tensor's stored shape as true and
    lacks some quantization parameters the kernels take. Its int8 kernels round
    some values differently from the builtin ones (Forge follows XNNPACK's bit
    for bit): quantized outputs are compared within one step.
    """
    import tensorflow as tf

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tf.lite.Interpreter's deprecation notice (LiteRT)
        interpreter = tf.lite.Interpreter(
            model_content=data, num_threads=1, experimental_preserve_all_tensors=True,
            experimental_op_resolver_type=tf.lite.experimental.OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
    for detail, shape in zip(interpreter.get_input_details(), shapes or ()):
        if tuple(shape) != tuple(detail["shape"]):
            interpreter.resize_tensor_input(detail["index"], list(shape))
    interpreter.allocate_tensors()
    return interpreter


def _with_base_versions(data: bytes, base: bytes) -> bytes:
    """``data`` with its operator codes' versions as in ``base`` (when a mutation left them in place).

    TFLite's interpreter refuses an operator version it does not know; Forge
    converts an operator by its code, options and tensor types, and does not
    read the version. The reference runs the same graph at versions it knows.
    """
    import tflite

    if len(data) != len(base):
        return data
    model = tflite.Model.GetRootAsModel(base, 0)
    fixed = bytearray(data)
    for index in range(model.OperatorCodesLength()):
        code = model.OperatorCodes(index)
        offset = _slot(code, 2)
        if offset:
            position = code._tab.Pos + offset
            fixed[position:position + 4] = base[position:position + 4]
    return bytes(fixed)


def _stored_input_shapes(data: bytes) -> list[tuple[int, ...]]:
    """The input shapes the flatbuffer stores (read with the tflite package: the interpreter has not seen it)."""
    import tflite

    subgraph = tflite.Model.GetRootAsModel(data, 0).Subgraphs(0)
    return [tuple(int(d) for d in subgraph.Tensors(int(i)).ShapeAsNumpy()) if subgraph.Tensors(int(i)).ShapeLength()
            else () for i in subgraph.InputsAsNumpy()]


def _non_finite(interpreter: Any) -> list[str]:
    """The float tensors that hold NaN or infinity after a run."""
    names = []
    for detail in interpreter.get_tensor_details():
        try:
            value = interpreter.get_tensor(detail["index"])
        except ValueError:  # a tensor without data (e.g. an unused scratch buffer)
            continue
        if value.dtype.kind == "f" and not np.isfinite(value).all():
            names.append(detail["name"])
    return names


def _run_tflite(case: Case) -> str | None:
    import forge

    base = Path(case["path"]).read_bytes()
    data = apply_edits(base, case["edits"])
    _note_phase("forge")
    ir = forge.from_tflite(data, **case.get("options", {}))
    _note_phase("reference")
    data = _with_base_versions(data, base)
    stored = _stored_input_shapes(data)
    # Forge's shapes, a dynamic dimension at its stored size: a shape_dict may give others.
    shapes = [tuple(s if d < 0 else d for d, s in zip(shape, old)) if len(shape) == len(old) else tuple(shape)
              for shape, old in zip(ir.input_shapes, stored)]
    if len(shapes) != len(stored) or (shapes != stored and "shape_dict" not in case.get("options", {})):
        return f"input shapes {ir.input_shapes}; the flatbuffer has {stored}"
    if any(math.prod(shape) > MAX_RUN_ELEMENTS for shape in shapes):
        return None
    try:
        interpreter = _interpreter(data, shapes)
    except Exception as exc:  # noqa: BLE001 - the interpreter's verdict, whatever its type
        return f"Forge loaded a model TFLite's interpreter rejects: {type(exc).__name__}: {str(exc)[:300]}"
    inputs, outputs = interpreter.get_input_details(), interpreter.get_output_details()
    rng = np.random.default_rng(0)
    arrays = [_random_array(rng, shape, detail["dtype"]) for shape, detail in zip(shapes, inputs)]
    try:
        for detail, array in zip(inputs, arrays):
            interpreter.set_tensor(detail["index"], array)
        interpreter.invoke()
    except Exception as exc:  # noqa: BLE001 - the interpreter's verdict, whatever its type
        _note_phase("forge")
        ir.get_inference_function()(*arrays)
        # TFLite checks at run time what only the inputs' sizes decide (a reshape of a dynamic batch): Forge
        # must not compute numbers either.
        return f"Forge ran a model TFLite's interpreter cannot run: {type(exc).__name__}: {str(exc)[:300]}"
    want = [interpreter.get_tensor(detail["index"]) for detail in outputs]
    quantized = [bool(detail["quantization"][0]) for detail in outputs]
    non_finite = _non_finite(interpreter)
    _note_phase("forge")
    got = _as_list(ir.get_inference_function()(*arrays))
    if non_finite:
        # NaN met by a max or a ReLU: IEEE 754 leaves the result to the implementation, and TFLite's kernels
        # and TVM's differ (weights made infinite by a mutation). Shapes and types still must agree.
        return compare_signatures(got, want, "TFLite's interpreter")
    return compare(got, want, "TFLite's interpreter", int_tolerance=[1 if q else 0 for q in quantized])


# ----------------------------------------------------------------------------------------------------
# Constructions of the torch and keras families
# ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Construction:
    """One torch or keras case construction: ``build(seed)``, and the names an error about it should mention."""

    build: Callable[[int], Any]
    names: tuple[str, ...] = ()


def _register(table: dict[str, Construction], name: str, *names: str) -> Callable[[Callable[[int], Any]], Any]:
    def register(build: Callable[[int], Any]) -> Callable[[int], Any]:
        table[name] = Construction(build, names)
        return build

    return register


TORCH_CASES: dict[str, Construction] = {}
KERAS_CASES: dict[str, Construction] = {}


# ----------------------------------------------------------------------------------------------------
# PyTorch
# ----------------------------------------------------------------------------------------------------


@dataclass
class TorchBuild:
    """A module for ``forge.from_torch``, its arguments, and the eager reference to compare with."""

    module: Any
    kwargs: dict[str, Any]
    inputs: list[tuple[Any, ...]]
    """Input sets to compare on: the example inputs, and others (of the other sign, so a baked branch shows)."""
    reference: Any = None
    """The eager module (a copy made before Forge saw the module); each input set runs on a fresh copy of it."""


def _torch_build(module: Any, example: tuple[Any, ...], *, infos: list[Any] | None = None,
                 others: list[tuple[Any, ...]] | None = None, **kwargs: Any) -> TorchBuild:
    """The usual case: a module, its example inputs (or ``input_infos`` describing them), and other inputs."""
    import copy

    import torch

    if not isinstance(module, torch.jit.ScriptModule):
        module.eval()
    reference = copy.deepcopy(module)
    if others is None:
        others = [tuple(-1.5 * t if isinstance(t, torch.Tensor) and t.is_floating_point() else t for t in example)]
    if infos is not None:
        kwargs["input_infos"] = infos
    else:
        kwargs["example_inputs"] = tuple(t.clone() if isinstance(t, torch.Tensor) else t for t in example)
    return TorchBuild(module, kwargs, [example, *others], reference)


def _flatten_outputs(value: Any) -> list[Any]:
    import torch

    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [leaf for item in value for leaf in _flatten_outputs(item)]
    if isinstance(value, dict):
        return [leaf for item in value.values() for leaf in _flatten_outputs(item)]
    return [value]


def _to_numpy(value: Any) -> np.ndarray:
    import torch

    if isinstance(value, torch.Tensor):
        return value.detach().numpy()
    return np.asarray(value)


def _run_torch(case: Case) -> str | None:
    import copy

    import forge
    import torch

    torch.manual_seed(case["seed"])
    build = TORCH_CASES[case["kind"]].build(case["seed"])
    _note_phase("forge")
    ir = forge.from_torch(build.module, **build.kwargs)
    run = ir.get_inference_function()
    for index, inputs in enumerate(build.inputs):
        _note_phase("reference")
        reference = copy.deepcopy(build.reference)
        with torch.no_grad():
            want = [_to_numpy(v) for v in _flatten_outputs(reference(*[
                t.clone() if isinstance(t, torch.Tensor) else t for t in inputs]))]
        _note_phase("forge")
        got = _as_list(run(*[_to_numpy(t) for t in inputs]))
        wrong = compare(got, want, "eager PyTorch")
        if wrong is not None:
            return f"input set {index}: {wrong}"
    return None


def _torch_sizes(seed: int) -> tuple[int, int, int]:
    """Batch, features and hidden sizes of a case."""
    rng = random.Random(seed)
    return rng.randint(1, 3), rng.randint(2, 6), rng.randint(2, 8)


def _nn() -> Any:
    import torch

    return torch.nn


@_register(TORCH_CASES, "plain-mlp")
def _plain_mlp(seed: int) -> TorchBuild:
    import torch

    batch, features, hidden = _torch_sizes(seed)
    nn = _nn()
    model = nn.Sequential(nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, 3))
    return _torch_build(model, (torch.randn(batch, features),))


@_register(TORCH_CASES, "plain-cnn")
def _plain_cnn(seed: int) -> TorchBuild:
    import torch

    batch, channels, hidden = _torch_sizes(seed)
    nn = _nn()
    model = nn.Sequential(nn.Conv2d(channels, hidden, 3, padding=1), nn.BatchNorm2d(hidden), nn.ReLU(),
                          nn.MaxPool2d(2), nn.Flatten(), nn.Linear(hidden * 16, 4))
    with torch.no_grad():
        model[1].running_mean.uniform_(-0.2, 0.2)
        model[1].running_var.uniform_(0.5, 1.5)
    return _torch_build(model, (torch.randn(batch, channels, 8, 8),),
                        infos=[("image", (batch, channels, 8, 8))])


def _torch_x(seed: int) -> Any:
    import torch

    batch, features, _ = _torch_sizes(seed)
    return torch.randn(batch, features)


@_register(TORCH_CASES, "branch-on-data", "control flow", "forward")
def _branch_on_data(seed: int) -> TorchBuild:
    class Branch(_nn().Module):
        def forward(self, x: Any) -> Any:
            if x.sum() > 0:
                return x * 2
            return x - 1

    x = _torch_x(seed).abs() + 0.1
    return _torch_build(Branch(), (x,))


@_register(TORCH_CASES, "item-scalar", "item", "x")
def _item_scalar(seed: int) -> TorchBuild:
    class ItemScale(_nn().Module):
        def forward(self, x: Any) -> Any:
            return x * x.max().item()

    return _torch_build(ItemScale(), (_torch_x(seed),))


@_register(TORCH_CASES, "loop-count-from-data", "control flow", "forward")
def _loop_count(seed: int) -> TorchBuild:
    class Loop(_nn().Module):
        def forward(self, x: Any) -> Any:
            for _ in range(int(x.abs().sum()) % 3 + 1):
                x = x * 2 + 1
            return x

    x = _torch_x(seed)
    return _torch_build(Loop(), (x,), others=[(x * 3.7,)])


@_register(TORCH_CASES, "nonzero-mask", "nonzero", "index", "x")
def _nonzero_mask(seed: int) -> TorchBuild:
    class Mask(_nn().Module):
        def forward(self, x: Any) -> Any:
            return x[x > 0] * 2

    return _torch_build(Mask(), (_torch_x(seed),))


@_register(TORCH_CASES, "unique", "unique", "_unique2")
def _unique(seed: int) -> TorchBuild:
    import torch

    class Unique(_nn().Module):
        def forward(self, x: Any) -> Any:
            return torch.unique(x.round())

    return _torch_build(Unique(), (_torch_x(seed) * 3,))


@_register(TORCH_CASES, "no-converter-fft", "_fft_r2c", "fft_rfft", "aten::fft_rfft")
def _fft(seed: int) -> TorchBuild:
    import torch

    class Spectrum(_nn().Module):
        def forward(self, x: Any) -> Any:
            return torch.fft.rfft(x).abs()

    return _torch_build(Spectrum(), (_torch_x(seed),))


@_register(TORCH_CASES, "no-converter-svd", "_linalg_svd", "linalg_svdvals", "aten::linalg_svdvals")
def _svd(seed: int) -> TorchBuild:
    import torch

    class Singular(_nn().Module):
        def forward(self, x: Any) -> Any:
            return torch.linalg.svdvals(x)

    return _torch_build(Singular(), (_torch_x(seed),))


@_register(TORCH_CASES, "complex-output", "view_as_complex", "aten::view_as_complex", "complex64")
def _complex_output(seed: int) -> TorchBuild:
    import torch

    class Complex(_nn().Module):
        def forward(self, x: Any) -> Any:
            return torch.view_as_complex(x)

    return _torch_build(Complex(), (torch.randn(_torch_sizes(seed)[0] + 1, 2),))


@_register(TORCH_CASES, "python-side-effects")
def _side_effects(seed: int) -> TorchBuild:
    class Chatty(_nn().Module):
        def __init__(self) -> None:
            super().__init__()
            self.calls: list[int] = []

        def forward(self, x: Any) -> Any:
            self.calls.append(len(self.calls))
            print(f"forward call {len(self.calls)}")
            return x + len(self.calls) * 0 + 1

    return _torch_build(Chatty(), (_torch_x(seed),))


@_register(TORCH_CASES, "autograd-function")
def _autograd_function(seed: int) -> TorchBuild:
    import torch

    class DoubledRelu(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: Any) -> Any:
            return x.clamp(min=0) * 2

        @staticmethod
        def backward(ctx: Any, grad: Any) -> Any:
            return grad

    class WithFunction(_nn().Module):
        def forward(self, x: Any) -> Any:
            return DoubledRelu.apply(x) + 1

    return _torch_build(WithFunction(), (_torch_x(seed),))


@_register(TORCH_CASES, "inplace-on-input")
def _inplace_on_input(seed: int) -> TorchBuild:
    class Inplace(_nn().Module):
        def forward(self, x: Any) -> Any:
            x.mul_(3).add_(1)
            return x * 2

    return _torch_build(Inplace(), (_torch_x(seed),))


@_register(TORCH_CASES, "buffer-mutation", "steps")
def _buffer_mutation(seed: int) -> TorchBuild:
    import torch

    class Counter(_nn().Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("steps", torch.ones(1))

        def forward(self, x: Any) -> Any:
            self.steps.add_(1)
            return x * self.steps

    return _torch_build(Counter(), (_torch_x(seed),))


@_register(TORCH_CASES, "dict-output")
def _dict_output(seed: int) -> TorchBuild:
    class Heads(_nn().Module):
        def forward(self, x: Any) -> Any:
            return {"sum": x.sum(-1), "double": x * 2, "pair": (x - 1, x.relu())}

    return _torch_build(Heads(), (_torch_x(seed),))


@_register(TORCH_CASES, "none-output", "None", "output")
def _none_output(seed: int) -> TorchBuild:
    class Nothing(_nn().Module):
        def forward(self, x: Any) -> Any:
            return None

    return _torch_build(Nothing(), (_torch_x(seed),))


@_register(TORCH_CASES, "tuple-with-none", "None", "output")
def _tuple_with_none(seed: int) -> TorchBuild:
    class Partial(_nn().Module):
        def forward(self, x: Any) -> Any:
            return x + 1, None

    return _torch_build(Partial(), (_torch_x(seed),))


@_register(TORCH_CASES, "string-output", "str", "output")
def _string_output(seed: int) -> TorchBuild:
    class Text(_nn().Module):
        def forward(self, x: Any) -> Any:
            return f"shape {tuple(x.shape)}"

    return _torch_build(Text(), (_torch_x(seed),))


@_register(TORCH_CASES, "int-output", "int", "output")
def _int_output(seed: int) -> TorchBuild:
    class Count(_nn().Module):
        def forward(self, x: Any) -> Any:
            return x.shape[0]

    return _torch_build(Count(), (_torch_x(seed),))


@_register(TORCH_CASES, "forward-raises", "ValueError", "refuses")
def _forward_raises(seed: int) -> TorchBuild:
    class Refuses(_nn().Module):
        def forward(self, x: Any) -> Any:
            raise ValueError("this module refuses every input")

    return _torch_build(Refuses(), (_torch_x(seed),))


@_register(TORCH_CASES, "missing-argument", "y", "forward")
def _missing_argument(seed: int) -> TorchBuild:
    class Pair(_nn().Module):
        def forward(self, x: Any, y: Any) -> Any:
            return x + y

    return _torch_build(Pair(), (_torch_x(seed),))


@_register(TORCH_CASES, "extra-argument", "forward", "positional")
def _extra_argument(seed: int) -> TorchBuild:
    x = _torch_x(seed)
    return _torch_build(_nn().ReLU(), (x, x.clone()))


@_register(TORCH_CASES, "input-infos-wrong-shape", "mat1", "features", "shape")
def _wrong_shape(seed: int) -> TorchBuild:
    batch, features, hidden = _torch_sizes(seed)
    import torch

    return _torch_build(_nn().Linear(features, hidden), (torch.randn(batch, features + 1),),
                        infos=[("features", (batch, features + 1))])


@_register(TORCH_CASES, "input-infos-wrong-dtype", "features", "dtype", "Long", "Float")
def _wrong_dtype(seed: int) -> TorchBuild:
    batch, features, hidden = _torch_sizes(seed)
    import torch

    return _torch_build(_nn().Linear(features, hidden), (torch.zeros(batch, features, dtype=torch.int64),),
                        infos=[("features", ((batch, features), "int64"))])


@_register(TORCH_CASES, "input-infos-malformed", "input_infos")
def _malformed_infos(seed: int) -> TorchBuild:
    batch, features, hidden = _torch_sizes(seed)
    import torch

    bad = random.Random(seed).choice([
        [("features", "abc")], [("features", 5)], [("features", (batch, "x"))], ["features"],
        [("features", (batch, 2.5))], [("features", ((batch, features), "complex7"))], [("features",)],
        [("features", ((batch, features), "float32", "extra"))], [(3, (batch, features))], "features",
    ])
    build = _torch_build(_nn().Linear(features, hidden), (torch.randn(batch, features),), infos=[])
    build.kwargs["input_infos"] = bad
    return build


@_register(TORCH_CASES, "infos-and-examples-disagree", "input_infos", "example_inputs")
def _infos_and_examples(seed: int) -> TorchBuild:
    batch, features, hidden = _torch_sizes(seed)
    import torch

    x = torch.randn(batch, features)
    build = _torch_build(_nn().Linear(features, hidden), (x,))
    build.kwargs["input_infos"] = [("a", (batch, features)), ("b", (batch, features))]
    return build


@_register(TORCH_CASES, "non-tensor-input", "example_inputs", "bool", "flag")
def _non_tensor_input(seed: int) -> TorchBuild:
    class Flagged(_nn().Module):
        def forward(self, x: Any, flag: bool) -> Any:
            return x + 1 if flag else x

    return _torch_build(Flagged(), (_torch_x(seed), True))


@_register(TORCH_CASES, "scripted-branch")
def _scripted_branch(seed: int) -> TorchBuild:
    import torch

    class Branch(_nn().Module):
        # Unannotated: TorchScript takes x as a Tensor (it would read "Any" as its Any type).
        def forward(self, x):  # noqa: ANN001, ANN202
            if bool(x.sum() > 0):
                return x * 2
            return x - 1

    batch, features, _ = _torch_sizes(seed)
    x = _torch_x(seed).abs() + 0.1
    return _torch_build(torch.jit.script(Branch()), (x,), infos=[("x", (batch, features))])


@_register(TORCH_CASES, "traced-module")
def _traced_module(seed: int) -> TorchBuild:
    import torch

    batch, features, hidden = _torch_sizes(seed)
    nn = _nn()
    x = torch.randn(batch, features)
    traced = torch.jit.trace(nn.Sequential(nn.Linear(features, hidden), nn.Tanh()).eval(), (x,))
    return _torch_build(traced, (x,), infos=[("x", (batch, features))])


@_register(TORCH_CASES, "exported-program")
def _exported_program(seed: int) -> TorchBuild:
    import torch

    batch, features, hidden = _torch_sizes(seed)
    nn = _nn()
    x = torch.randn(batch, features)
    model = nn.Sequential(nn.Linear(features, hidden), nn.GELU()).eval()
    build = _torch_build(model, (x,))
    build.module, build.kwargs = torch.export.export(model, (x,)), {}
    return build


@_register(TORCH_CASES, "lstm-state-tuple")
def _lstm(seed: int) -> TorchBuild:
    import torch

    batch, features, hidden = _torch_sizes(seed)
    return _torch_build(_nn().LSTM(features, hidden, batch_first=True), (torch.randn(batch, 4, features),))


@_register(TORCH_CASES, "embedding-int-input")
def _embedding(seed: int) -> TorchBuild:
    import torch

    batch, _, hidden = _torch_sizes(seed)
    nn = _nn()
    model = nn.Sequential(nn.Embedding(10, hidden), nn.Flatten(), nn.Linear(hidden * 5, 2))
    ids = torch.randint(0, 10, (batch, 5))
    return _torch_build(model, (ids,), others=[(torch.randint(0, 10, (batch, 5)),)],
                        infos=[("ids", ((batch, 5), "int64"))])


@_register(TORCH_CASES, "zero-size-input", "input0", "0")
def _zero_size(seed: int) -> TorchBuild:
    import torch

    _, features, hidden = _torch_sizes(seed)
    return _torch_build(_nn().Linear(features, hidden), (torch.randn(0, features),), others=[],
                        infos=[("input0", (0, features))])


@_register(TORCH_CASES, "float64-model")
def _float64(seed: int) -> TorchBuild:
    import torch

    batch, features, hidden = _torch_sizes(seed)
    model = _nn().Linear(features, hidden).double()
    return _torch_build(model, (torch.randn(batch, features, dtype=torch.float64),),
                        infos=[("x", ((batch, features), "float64"))])


@_register(TORCH_CASES, "dynamic-batch")
def _dynamic_batch(seed: int) -> TorchBuild:
    import torch

    _, features, hidden = _torch_sizes(seed)
    nn = _nn()
    model = nn.Sequential(nn.Linear(features, hidden), nn.Softmax(-1))
    return _torch_build(model, (torch.randn(3, features),), others=[(torch.randn(5, features),)],
                        infos=[("x", (-1, features))])


@_register(TORCH_CASES, "aliased-outputs")
def _aliased_outputs(seed: int) -> TorchBuild:
    class Alias(_nn().Module):
        def forward(self, x: Any) -> Any:
            return x, x, x.t()

    return _torch_build(Alias(), (_torch_x(seed),))


# ----------------------------------------------------------------------------------------------------
# Keras
# ----------------------------------------------------------------------------------------------------


@dataclass
class KerasBuild:
    """A Keras model for ``forge.from_keras``, its options, and input sets (channels-last) to compare on."""

    model: Any
    kwargs: dict[str, Any]
    inputs: list[list[np.ndarray]]
    rtol: float = RTOL


def _keras_outputs(value: Any) -> list[np.ndarray]:
    """Keras's outputs in Forge's order: a dict's values in sorted key order, a list's in its order."""
    if isinstance(value, dict):
        return [np.asarray(value[key]) for key in sorted(value)]
    if isinstance(value, (list, tuple)):
        return [np.asarray(v) for v in value]
    return [np.asarray(value)]


def _run_keras(case: Case) -> str | None:
    import forge

    with _quiet():
        import keras

        keras.utils.set_random_seed(case["seed"] % (1 << 31))
        build = KERAS_CASES[case["kind"]].build(case["seed"])
    _note_phase("forge")
    ir = forge.from_keras(build.model, **build.kwargs)
    run = ir.get_inference_function()
    nchw = build.kwargs.get("layout", "NCHW") == "NCHW"
    for index, inputs in enumerate(build.inputs):
        _note_phase("reference")
        for layer in build.model.layers:
            if getattr(layer, "stateful", False):
                layer.reset_state()  # each input set as a first call
        want = _keras_outputs(build.model(inputs if len(inputs) > 1 else inputs[0], training=False))
        _note_phase("forge")
        fed = [np.ascontiguousarray(a.transpose(0, 3, 1, 2)) if nchw and a.ndim == 4 else a for a in inputs]
        got = _as_list(run(*fed))
        got = [g.transpose(0, 2, 3, 1) if nchw and g.ndim == 4 else g for g in got]
        wrong = compare(got, want, "Keras", rtol=build.rtol)
        if wrong is not None:
            return f"input set {index}: {wrong}"
    return None


def _keras_sizes(seed: int) -> tuple[int, int, int]:
    """Batch, features and units of a case."""
    rng = random.Random(seed)
    return rng.randint(1, 2), rng.randint(2, 6), rng.randint(2, 6)


def _normal(seed: int, *shape: int, dtype: str = "float32") -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def _keras_build(model: Any, inputs: list[np.ndarray], rtol: float = RTOL, **kwargs: Any) -> KerasBuild:
    """The usual case: the inputs, and the same of the other sign."""
    other = [-1.5 * a if a.dtype.kind == "f" else a for a in inputs]
    return KerasBuild(model, kwargs, [inputs, other], rtol)


def _keras_layer(call: Callable[[Any], Any], output_shape: Callable[[Any], Any] | None = None,
                 name: str = "custom") -> Any:
    """A Keras layer running ``call``; with ``output_shape``, Keras never traces ``call`` to build the model."""
    import keras

    class Custom(keras.layers.Layer):
        def call(self, x: Any) -> Any:
            return call(x)

        def compute_output_shape(self, input_shape: Any) -> Any:
            return output_shape(input_shape) if output_shape is not None else input_shape

    return Custom(name=name)


@_register(KERAS_CASES, "dense-ok")
def _keras_dense(seed: int) -> KerasBuild:
    import keras

    batch, features, units = _keras_sizes(seed)
    x = keras.Input((features,), name="features")
    y = keras.layers.Dense(units, activation="relu")(x)
    model = keras.Model(x, keras.layers.Dense(3, activation="softmax")(y))
    return _keras_build(model, [_normal(seed, batch, features)], shape={"features": (batch, features)})


@_register(KERAS_CASES, "cnn-ok")
def _keras_cnn(seed: int) -> KerasBuild:
    import keras

    batch, channels, units = _keras_sizes(seed)
    x = keras.Input((8, 8, channels), name="image")
    y = keras.layers.Conv2D(units, 3, padding="same", use_bias=False)(x)
    y = keras.layers.ReLU()(keras.layers.BatchNormalization()(y))
    y = keras.layers.Flatten()(keras.layers.MaxPooling2D()(y))
    model = keras.Model(x, keras.layers.Dense(4)(keras.layers.Dropout(0.5)(y)))
    return _keras_build(model, [_normal(seed, 1, 8, 8, channels)])


@_register(KERAS_CASES, "lstm")
def _keras_lstm(seed: int) -> KerasBuild:
    import keras

    _, features, units = _keras_sizes(seed)
    x = keras.Input((5, features), name="sequence")
    model = keras.Model(x, keras.layers.LSTM(units)(x))
    return _keras_build(model, [_normal(seed, 1, 5, features)])


@_register(KERAS_CASES, "gru-sequences")
def _keras_gru(seed: int) -> KerasBuild:
    import keras

    _, features, units = _keras_sizes(seed)
    x = keras.Input((4, features), name="sequence")
    model = keras.Model(x, keras.layers.GRU(units, return_sequences=True)(x))
    return _keras_build(model, [_normal(seed, 1, 4, features)])


@_register(KERAS_CASES, "stateful-rnn", "stateful", "SimpleRNN", "simple_rnn", "VarHandleOp", "ReadVariableOp")
def _keras_stateful_rnn(seed: int) -> KerasBuild:
    import keras

    _, features, units = _keras_sizes(seed)
    x = keras.Input((3, features), batch_size=1, name="sequence")
    model = keras.Model(x, keras.layers.SimpleRNN(units, stateful=True)(x))
    return _keras_build(model, [_normal(seed, 1, 3, features)])


@_register(KERAS_CASES, "transpose-and-resize")
def _keras_transpose_resize(seed: int) -> KerasBuild:
    import keras

    _, channels, units = _keras_sizes(seed)
    x = keras.Input((5, 5, channels), name="image")
    y = keras.layers.Conv2DTranspose(units, 3, strides=2, padding="same")(x)
    y = keras.layers.UpSampling2D()(keras.layers.DepthwiseConv2D(3, padding="same")(y))
    model = keras.Model(x, keras.layers.Resizing(7, 9, interpolation="bilinear")(y))
    return _keras_build(model, [_normal(seed, 1, 5, 5, channels)])


@_register(KERAS_CASES, "lambda-numpy", "numpy", "Tracing")
def _keras_lambda_numpy(seed: int) -> KerasBuild:
    import keras

    batch, features, _ = _keras_sizes(seed)
    x = keras.Input((features,), name="features")
    model = keras.Model(x, _keras_layer(lambda t: np.sin(t.numpy()) * 2, name="numpy_sine")(x))
    return _keras_build(model, [_normal(seed, batch, features)], shape={"features": (batch, features)})


@_register(KERAS_CASES, "py-function", "EagerPyFunc", "py_function", "PyFunc")
def _keras_py_function(seed: int) -> KerasBuild:
    import keras
    import tensorflow as tf

    batch, features, _ = _keras_sizes(seed)
    x = keras.Input((features,), name="features")

    def through_python(t: Any) -> Any:
        result = tf.py_function(lambda v: np.cos(v.numpy()), [t], tf.float32)
        result.set_shape(t.shape)
        return result

    model = keras.Model(x, _keras_layer(through_python, name="python_cosine")(x))
    return _keras_build(model, [_normal(seed, batch, features)], shape={"features": (batch, features)})


@_register(KERAS_CASES, "python-branch-on-tensor", "bool", "Tracing", "tf.Tensor")
def _keras_python_branch(seed: int) -> KerasBuild:
    import keras
    import tensorflow as tf

    batch, features, _ = _keras_sizes(seed)
    x = keras.Input((features,), name="features")

    def branch(t: Any) -> Any:
        if tf.reduce_sum(t) > 0:
            return t * 2
        return t - 1

    model = keras.Model(x, _keras_layer(branch, name="python_branch")(x))
    return _keras_build(model, [np.abs(_normal(seed, batch, features))], shape={"features": (batch, features)})


@_register(KERAS_CASES, "no-tflite-builtin", "BesselI0e", "FlexBesselI0e", "Erfinv", "FlexErfinv")
def _keras_no_builtin(seed: int) -> KerasBuild:
    import keras
    import tensorflow as tf

    batch, features, _ = _keras_sizes(seed)
    x = keras.Input((features,), name="features")
    y = _keras_layer(lambda t: tf.math.bessel_i0e(t) + tf.math.erfinv(tf.tanh(t)), name="special")(x)
    return _keras_build(keras.Model(x, y), [_normal(seed, batch, features)], shape={"features": (batch, features)})


@_register(KERAS_CASES, "string-input", "string", "text", "StringLength", "str")
def _keras_string_input(seed: int) -> KerasBuild:
    import keras
    import tensorflow as tf

    x = keras.Input((), dtype="string", name="text")
    y = _keras_layer(lambda t: tf.cast(tf.strings.length(t), tf.float32)[:, None], lambda s: (s[0], 1),
                     name="text_length")(x)
    model = keras.Model(x, keras.layers.Dense(2)(y))
    words = np.array([b"forge", b"tvm"][: _keras_sizes(seed)[0]], dtype=object)
    return KerasBuild(model, {}, [[words]])


@_register(KERAS_CASES, "ragged-input", "ragged", "RaggedTensor", "tokens")
def _keras_ragged_input(seed: int) -> KerasBuild:
    import keras
    import tensorflow as tf

    x = keras.Input((None,), ragged=True, name="tokens")
    y = _keras_layer(lambda t: tf.cast(t.row_lengths(), tf.float32)[:, None], lambda s: (s[0], 1),
                     name="row_lengths")(x)
    model = keras.Model(x, keras.layers.Dense(2)(y))
    return KerasBuild(model, {}, [[tf.ragged.constant([[1, 2, 3], [4]])]])


@_register(KERAS_CASES, "float16-layers")
def _keras_float16(seed: int) -> KerasBuild:
    import keras

    batch, features, units = _keras_sizes(seed)
    x = keras.Input((features,), dtype="float16", name="features")
    y = keras.layers.Dense(units, activation="tanh", dtype="float16")(x)
    model = keras.Model(x, keras.layers.Dense(2, dtype="float16")(y))
    return _keras_build(model, [_normal(seed, batch, features, dtype="float16")], rtol=1e-2,
                        shape={"features": (batch, features)})


@_register(KERAS_CASES, "float64-layers")
def _keras_float64(seed: int) -> KerasBuild:
    import keras

    batch, features, units = _keras_sizes(seed)
    x = keras.Input((features,), dtype="float64", name="features")
    y = keras.layers.Dense(units, activation="sigmoid", dtype="float64")(x)
    model = keras.Model(x, keras.layers.Dense(2, dtype="float64")(y))
    return _keras_build(model, [_normal(seed, batch, features, dtype="float64")],
                        shape={"features": (batch, features)})


@_register(KERAS_CASES, "int8-and-bool-inputs")
def _keras_int8_bool(seed: int) -> KerasBuild:
    import keras
    import tensorflow as tf

    batch, features, _ = _keras_sizes(seed)
    codes = keras.Input((features,), dtype="int8", name="codes")
    keep = keras.Input((features,), dtype="bool", name="keep")
    values = _keras_layer(lambda t: tf.cast(t, tf.float32) / 16.0, name="to_float")(codes)
    kept = keras.layers.Lambda(lambda pair: tf.where(pair[1], pair[0], -pair[0]), output_shape=(features,))(
        [values, keep])
    model = keras.Model([codes, keep], keras.layers.Dense(2)(kept))
    rng = np.random.default_rng(seed)
    sets = [[rng.integers(-128, 128, (batch, features)).astype("int8"), rng.random((batch, features)) < 0.5]
            for _ in range(2)]
    return KerasBuild(model, {"shape": {"codes": (batch, features), "keep": (batch, features)}}, sets)


@_register(KERAS_CASES, "layer-raises", "ValueError", "Tracing", "refuses")
def _keras_layer_raises(seed: int) -> KerasBuild:
    import keras

    batch, features, _ = _keras_sizes(seed)
    x = keras.Input((features,), name="features")

    def refuse(t: Any) -> Any:
        raise ValueError("this layer refuses every input")

    model = keras.Model(x, _keras_layer(refuse, name="refusing")(x))
    return _keras_build(model, [_normal(seed, batch, features)])


@_register(KERAS_CASES, "subclassed-without-inputs", "declares no inputs", "shape")
def _keras_subclassed(seed: int) -> KerasBuild:
    import keras

    batch, features, units = _keras_sizes(seed)

    class Net(keras.Model):
        def __init__(self) -> None:
            super().__init__(name="net")
            self.hidden = keras.layers.Dense(units, activation="relu")
            self.out = keras.layers.Dense(2)

        def call(self, x: Any) -> Any:
            return self.out(self.hidden(x))

    return _keras_build(Net(), [_normal(seed, batch, features)])


@_register(KERAS_CASES, "subclassed-with-shape")
def _keras_subclassed_shape(seed: int) -> KerasBuild:
    build = _keras_subclassed(seed)
    batch, features = build.inputs[0][0].shape
    build.model(build.inputs[0][0])  # builds its weights
    build.kwargs["shape"] = {"x": (batch, features)}
    return build


@_register(KERAS_CASES, "shape-option-wrong", "shape", "image", "no_such_input", "rank")
def _keras_wrong_shape(seed: int) -> KerasBuild:
    import keras

    _, channels, units = _keras_sizes(seed)
    x = keras.Input((6, 6, channels), name="image")
    model = keras.Model(x, keras.layers.Conv2D(units, 3)(x))
    shape = random.Random(seed).choice([{"image": (1, channels, 6)}, {"no_such_input": (1, channels, 6, 6)},
                                        {"image": (1, channels, 0, 6)}, {"image": (1, channels, 6, "x")},
                                        {"image": "big"}, {"image": (1, channels + 1, 6, 6)}])
    return _keras_build(model, [_normal(seed, 1, 6, 6, channels)], shape=shape)


@_register(KERAS_CASES, "unknown-inner-dimension", "sequence", "axis 1", "shape")
def _keras_unknown_dim(seed: int) -> KerasBuild:
    import keras

    _, features, units = _keras_sizes(seed)
    x = keras.Input((None, features), name="sequence")
    model = keras.Model(x, keras.layers.Dense(units)(x))
    return _keras_build(model, [_normal(seed, 1, 3, features)])


@_register(KERAS_CASES, "dict-outputs")
def _keras_dict_outputs(seed: int) -> KerasBuild:
    import keras

    batch, features, units = _keras_sizes(seed)
    x = keras.Input((features,), name="features")
    hidden = keras.layers.Dense(units, activation="gelu")(x)
    outputs = {"score": keras.layers.Dense(1)(hidden), "logits": keras.layers.Dense(3)(hidden)}
    return _keras_build(keras.Model(x, outputs), [_normal(seed, batch, features)],
                        shape={"features": (batch, features)})


@_register(KERAS_CASES, "two-inputs-two-outputs")
def _keras_two_by_two(seed: int) -> KerasBuild:
    import keras

    _, channels, units = _keras_sizes(seed)
    image = keras.Input((6, 6, channels), name="image")
    extra = keras.Input((3,), name="extra")
    features = keras.layers.Conv2D(units, 3, padding="same", activation="relu")(image)
    pooled = keras.layers.GlobalAveragePooling2D()(features)
    joined = keras.layers.Concatenate()([pooled, extra])
    model = keras.Model([image, extra], [keras.layers.Dense(2)(joined), features])
    return _keras_build(model, [_normal(seed, 1, 6, 6, channels), _normal(seed + 1, 1, 3)])


@_register(KERAS_CASES, "masked-embedding")
def _keras_masked_embedding(seed: int) -> KerasBuild:
    import keras

    batch, _, units = _keras_sizes(seed)
    ids = keras.Input((6,), dtype="int32", name="ids")
    y = keras.layers.Embedding(10, units, mask_zero=True)(ids)
    model = keras.Model(ids, keras.layers.Dense(2)(keras.layers.GlobalAveragePooling1D()(y)))
    rng = np.random.default_rng(seed)
    sets = [[rng.integers(0, 10, (batch, 6)).astype("int32")] for _ in range(2)]
    sets[0][0][:, -2:] = 0  # padding
    return KerasBuild(model, {"shape": {"ids": (batch, 6)}}, sets)


@_register(KERAS_CASES, "complex-values", "Complex", "complex64", "ComplexAbs", "FlexComplex")
def _keras_complex(seed: int) -> KerasBuild:
    import keras
    import tensorflow as tf

    batch, features, _ = _keras_sizes(seed)
    x = keras.Input((features,), name="features")
    y = _keras_layer(lambda t: tf.abs(tf.complex(t, 2.0 * t) * tf.complex(t, -t)), name="complex_magnitude")(x)
    return _keras_build(keras.Model(x, y), [_normal(seed, batch, features)], shape={"features": (batch, features)})
