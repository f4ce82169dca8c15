"""``torch.jit.trace`` of eval-mode ``nn.TransformerEncoderLayer`` / ``nn.MultiheadAttention`` under
``torch.no_grad()``: the trace holds PyTorch's fused fast-path ops (``aten::_transformer_encoder_layer_fwd``,
``aten::_native_multi_head_attention``), which Forge decomposes while exporting to ONNX. Checked against the
traced module itself (torch) on random inputs, at opsets 14, 17 and 18.
"""

from __future__ import annotations

import io
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the torch extra is installed by ./scripts/setup")

import forge  # noqa: E402

nn = torch.nn

HIDDEN, HEADS, BATCH, LENGTH = 32, 4, 2, 6


class PaddedEncoderLayer(nn.Module):
    """One encoder layer with a key padding mask (bool, True = padding)."""

    def __init__(self, norm_first: bool, activation: str) -> None:
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(HIDDEN, HEADS, 2 * HIDDEN, dropout=0.0, activation=activation,
                                                batch_first=True, norm_first=norm_first)

    def forward(self, tokens: torch.Tensor, padding: torch.Tensor) -> torch.Tensor:
        return self.layer(tokens, src_key_padding_mask=padding)


class CausalEncoderLayer(nn.Module):
    """One encoder layer with an additive (L, L) causal mask."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(HIDDEN, HEADS, 2 * HIDDEN, dropout=0.0, batch_first=True)

    def forward(self, tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.layer(tokens, src_mask=mask)


class SelfAttention(nn.Module):
    """nn.MultiheadAttention's fast path, returning its head-averaged attention weights too."""

    def __init__(self) -> None:
        super().__init__()
        self.attention = nn.MultiheadAttention(HIDDEN, HEADS, batch_first=True)

    def forward(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.attention(tokens, tokens, tokens)


def _randomized(module: nn.Module, seed: int) -> nn.Module:
    """Norm scales and biases re-drawn (PyTorch starts them at 1 and 0), eval mode."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in module.named_parameters():
            if parameter.ndim == 1:
                base = 1.0 if "norm" in name and name.endswith("weight") else 0.0
                parameter.copy_(base + 0.3 * torch.randn(parameter.shape, generator=generator))
    return module.eval()


def _tokens(seed):
    return torch.randn(BATCH, LENGTH, HIDDEN, generator=torch.Generator().manual_seed(seed))


def _cases():
    padding = torch.zeros(BATCH, LENGTH, dtype=torch.bool)
    padding[0, LENGTH - 2:] = True
    causal = torch.triu(torch.full((LENGTH, LENGTH), float("-inf")), diagonal=1)
    return {
        "post-norm-relu-padding": (lambda: PaddedEncoderLayer(False, "relu"), lambda s: (_tokens(s), padding),
                                   [("tokens", (BATCH, LENGTH, HIDDEN)), ("padding", ((BATCH, LENGTH), "bool"))]),
        "pre-norm-gelu-padding": (lambda: PaddedEncoderLayer(True, "gelu"), lambda s: (_tokens(s), padding),
                                  [("tokens", (BATCH, LENGTH, HIDDEN)), ("padding", ((BATCH, LENGTH), "bool"))]),
        "causal-mask": (CausalEncoderLayer, lambda s: (_tokens(s), causal),
                        [("tokens", (BATCH, LENGTH, HIDDEN)), ("mask", (LENGTH, LENGTH))]),
        "encoder-stack": (lambda: nn.TransformerEncoder(
            nn.TransformerEncoderLayer(HIDDEN, HEADS, 2 * HIDDEN, dropout=0.0, batch_first=True), 2,
            enable_nested_tensor=False), lambda s: (_tokens(s),), [("tokens", (BATCH, LENGTH, HIDDEN))]),
        "multi-head-attention": (SelfAttention, lambda s: (_tokens(s),), [("tokens", (BATCH, LENGTH, HIDDEN))]),
    }


# Each case at one opset; the decomposition differs by opset in LayerNormalization (from 17) and in
# ReduceMean's axes (an input from 18: the head-averaged attention weights).
OPSETS = {"post-norm-relu-padding": 14, "pre-norm-gelu-padding": 17, "causal-mask": 14, "encoder-stack": 17,
          "multi-head-attention": 18}


@pytest.mark.parametrize("case, opset", list(OPSETS.items()), ids=[f"{c}-opset{o}" for c, o in OPSETS.items()])
def test_traced_fast_path_modules_load_and_match_torch(case, opset):
    from torch.onnx._internal.torchscript_exporter import registration

    build, inputs, infos = _cases()[case]
    torch.manual_seed(3)
    model = _randomized(build(), seed=opset)
    example = inputs(0)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the tracer's notes on the fast path's Python branches
        traced = torch.jit.trace(model, example)
    fused = {n.kind() for n in traced.inlined_graph.nodes()} & {
        "aten::_transformer_encoder_layer_fwd", "aten::_native_multi_head_attention"}
    assert fused, "the trace should hold PyTorch's fused fast-path op"
    ir = forge.from_torch(traced, infos, onnx_opset=opset)
    run = ir.get_inference_function()
    for seed in (1, 2):
        values = inputs(seed)
        with torch.no_grad():
            want = traced(*values)
        want = [w.numpy() for w in want] if isinstance(want, tuple) else [want.numpy()]
        got = run(*[v.numpy() for v in values])
        got = got if isinstance(got, list) else [got]
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=2e-5)
    # The symbolics exist only while Forge exports.
    for op in fused:
        assert not registration.registry.is_registered_op(op, opset)


def test_fused_ops_without_forge_still_fail_to_export():
    """The exporter alone cannot export the trace (the failure Forge works around), so the test above tests it."""
    model = _randomized(CausalEncoderLayer(), seed=0)
    example = (_tokens(0), torch.zeros(LENGTH, LENGTH))
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(model, example)
        with pytest.raises(Exception, match="_transformer_encoder_layer_fwd"):
            torch.onnx.export(traced, example, io.BytesIO(), opset_version=17, dynamo=False)
