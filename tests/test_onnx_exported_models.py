"""Real architectures exported from torch to ONNX load through forge.from_onnx and match onnxruntime (1e-4).

BERT-style encoders go through both exporters (TorchScript-based at opsets
14-17, with a dynamic batch and sequence; dynamo at opset 18), their masks
through Shape -> ConstantOfShape -> Expand -> Where as Hugging Face exports them.
"""

from __future__ import annotations

import io
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest

torch = pytest.importorskip("torch", reason="the torch extra is installed by ./scripts/setup")

from torch_models import MaskedBertEncoder, MobileNetV3Style, TinyViT, build  # noqa: E402

import forge  # noqa: E402

TOLERANCE = 1e-4


def export(model, args, names, opset, dynamo, dynamic=None):
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if dynamo:
            program = torch.onnx.export(model, args, input_names=names, opset_version=opset, dynamo=True,
                                        dynamic_shapes=dynamic)
            return program.model_proto
        torch.onnx.export(model, args, buffer, input_names=names, opset_version=opset, dynamo=False,
                          dynamic_axes=dynamic)
    return onnx.load_from_string(buffer.getvalue())


def compare(model_proto, feeds, shape=None):
    expected = ort.InferenceSession(model_proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, feeds)[0]
    ir = forge.from_onnx(model_proto, shape=shape)
    got = ir.get_inference_function()(*feeds.values())
    got = got[0] if isinstance(got, list) else got
    np.testing.assert_allclose(got, expected, rtol=TOLERANCE, atol=TOLERANCE)
    return ir


def bert_inputs(batch, seq):
    ids = torch.randint(0, 100, (batch, seq), generator=torch.Generator().manual_seed(batch * 31 + seq))
    mask = torch.ones(batch, seq, dtype=torch.int64)
    mask[0, seq // 2:] = 0  # padding in the first sequence
    return ids, mask


@pytest.mark.parametrize("opset", [14, 15, 16, 17])
def test_bert_torchscript_exporter_dynamic_batch_and_sequence(opset):
    model = build(MaskedBertEncoder, seed=opset)
    ids, mask = bert_inputs(2, 16)
    dynamic = {"input_ids": {0: "batch", 1: "sequence"}, "attention_mask": {0: "batch", 1: "sequence"}}
    proto = export(model, (ids, mask), ["input_ids", "attention_mask"], opset, dynamo=False, dynamic=dynamic)
    ops = {node.op_type for node in proto.graph.node}
    assert {"Shape", "Where"} <= ops and ({"ConstantOfShape", "Expand"} & ops)
    # Imported with its dynamic batch and sequence, run at two sizes...
    ir = forge.from_onnx(proto)
    assert ir.input_shapes == [(-1, -1), (-1, -1)]
    run = ir.get_inference_function()
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    for batch, seq in ((2, 16), (3, 9)):
        ids, mask = bert_inputs(batch, seq)
        feeds = {"input_ids": ids.numpy(), "attention_mask": mask.numpy()}
        np.testing.assert_allclose(run(*feeds.values()), session.run(None, feeds)[0], rtol=TOLERANCE, atol=TOLERANCE)
    # ... and with the shape fixed on import, so the shape arithmetic folds away.
    ids, mask = bert_inputs(3, 9)
    compare(proto, {"input_ids": ids.numpy(), "attention_mask": mask.numpy()},
            shape={"input_ids": (3, 9), "attention_mask": (3, 9)})


def test_bert_dynamo_exporter_opset_18():
    model = build(MaskedBertEncoder, seed=18)
    ids, mask = bert_inputs(2, 16)
    proto = export(model, (ids, mask), ["input_ids", "attention_mask"], 18, dynamo=True)
    compare(proto, {"input_ids": ids.numpy(), "attention_mask": mask.numpy()})


@pytest.mark.parametrize("dynamo", [False, True])
def test_vit_style_encoder(dynamo):
    model = build(TinyViT, seed=3)
    x = torch.randn(2, 3, 32, 32)
    proto = export(model, (x,), ["image"], 18 if dynamo else 17, dynamo=dynamo)
    compare(proto, {"image": x.numpy()})


@pytest.mark.parametrize("dynamo", [False, True])
def test_mobilenet_v3_style_network(dynamo):
    model = build(MobileNetV3Style, seed=4)
    x = torch.randn(1, 3, 64, 64)
    proto = export(model, (x,), ["image"], 18 if dynamo else 17, dynamo=dynamo)
    ir = compare(proto, {"image": x.numpy()})
    assert {"nn.conv2d"} <= set(ir.operators)
