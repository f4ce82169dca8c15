"""PyTorch models with random weights for the torch plugin's tests (torch.nn only, no torchvision)."""

from __future__ import annotations

import torch
from torch import nn


def _randomize_batch_norms(model: nn.Module) -> nn.Module:
    for module in model.modules():
        if isinstance(module, (nn.BatchNorm1d, nn.BatchNorm2d)):
            module.running_mean.uniform_(-0.5, 0.5)
            module.running_var.uniform_(0.5, 1.5)
            module.weight.data.uniform_(0.5, 1.5)
            module.bias.data.uniform_(-0.2, 0.2)
    return model.eval()


class ResidualCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU())
        self.block = nn.Sequential(nn.Conv2d(16, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                                   nn.Conv2d(16, 16, 3, padding=1), nn.BatchNorm2d(16))
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10))

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        x = self.stem(image)
        x = torch.relu(x + self.block(x))
        return self.head(nn.functional.max_pool2d(x, 2))


class InvertedResidual(nn.Module):
    def __init__(self, channels: int, expand: int = 4) -> None:
        super().__init__()
        hidden = channels * expand
        self.body = nn.Sequential(
            nn.Conv2d(channels, hidden, 1, bias=False), nn.BatchNorm2d(hidden), nn.ReLU6(),
            nn.Conv2d(hidden, hidden, 3, padding=1, groups=hidden, bias=False), nn.BatchNorm2d(hidden), nn.ReLU6(),
            nn.Conv2d(hidden, channels, 1, bias=False), nn.BatchNorm2d(channels),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x)


class MobileNetV2Style(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(16),
                                  nn.ReLU6())
        self.blocks = nn.Sequential(InvertedResidual(16), InvertedResidual(16))
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.stem(x)))


class EncoderBlock(nn.Module):
    """Attention, LayerNorm and GELU, as a BERT layer has them."""

    def __init__(self, hidden: int = 64, heads: int = 4) -> None:
        super().__init__()
        self.attention = nn.MultiheadAttention(hidden, heads, batch_first=True)
        self.norm1 = nn.LayerNorm(hidden)
        self.ffn = nn.Sequential(nn.Linear(hidden, 4 * hidden), nn.GELU(), nn.Linear(4 * hidden, hidden))
        self.norm2 = nn.LayerNorm(hidden)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        attended, _ = self.attention(tokens, tokens, tokens, need_weights=False)
        x = self.norm1(tokens + attended)
        return self.norm2(x + self.ffn(x))


class TwoInTwoOut(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(50, 32)
        self.proj = nn.Linear(32, 32)

    def forward(self, features: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mixed = self.proj(features) + self.embed(ids)
        return torch.softmax(mixed, dim=-1), mixed.sum(dim=1)


class WithRReLU(nn.Module):
    """nn.RReLU in eval mode: a real op (rrelu_with_noise) that TVM's exported-program importer lacks."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.act = nn.RReLU(0.1, 0.3)
        self.fc = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.act(self.conv(x)).mean(dim=(2, 3)))


class WithLogCumSumExp(nn.Module):
    """logcumsumexp: neither TVM's exported-program importer nor the ONNX exporter handles it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.logcumsumexp(x, dim=1) + torch.special.erfinv(torch.tanh(x))


def build(cls: type[nn.Module], seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return _randomize_batch_norms(cls())


class MaskedBertEncoder(nn.Module):
    """A BERT-style encoder as Hugging Face writes one: token, position and token-type embeddings, and an
    attention mask turned into an additive bias through zeros_like/expand/masked_fill (Shape ->
    ConstantOfShape -> Expand -> Where once exported)."""

    def __init__(self, layers: int = 2, hidden: int = 64, heads: int = 4, vocab: int = 100) -> None:
        super().__init__()
        self.heads = heads
        self.tokens = nn.Embedding(vocab, hidden)
        self.positions = nn.Embedding(64, hidden)
        self.token_types = nn.Embedding(2, hidden)
        self.norm = nn.LayerNorm(hidden, eps=1e-12)
        self.layers = nn.ModuleList(
            nn.ModuleDict({
                "qkv": nn.Linear(hidden, 3 * hidden), "out": nn.Linear(hidden, hidden),
                "norm1": nn.LayerNorm(hidden, eps=1e-12), "ffn_in": nn.Linear(hidden, 4 * hidden),
                "ffn_out": nn.Linear(4 * hidden, hidden), "norm2": nn.LayerNorm(hidden, eps=1e-12),
            }) for _ in range(layers))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        batch, seq = input_ids.shape
        positions = torch.arange(seq, device=input_ids.device).unsqueeze(0).expand(batch, seq)
        x = self.tokens(input_ids) + self.positions(positions) + self.token_types(torch.zeros_like(input_ids))
        x = self.norm(x)
        inverted = 1.0 - attention_mask[:, None, None, :].to(x.dtype)
        bias = inverted.masked_fill(inverted.to(torch.bool), torch.finfo(x.dtype).min).expand(batch, 1, seq, seq)
        head_dim = x.shape[-1] // self.heads
        for layer in self.layers:
            q, k, v = layer["qkv"](x).reshape(batch, seq, 3, self.heads, head_dim).permute(2, 0, 3, 1, 4)
            scores = torch.matmul(q, k.transpose(-1, -2)) / head_dim ** 0.5 + bias
            context = torch.matmul(torch.softmax(scores, dim=-1), v).transpose(1, 2).reshape(batch, seq, -1)
            x = layer["norm1"](x + layer["out"](context))
            x = layer["norm2"](x + layer["ffn_out"](nn.functional.gelu(layer["ffn_in"](x))))
        return x


class TinyViT(nn.Module):
    """A ViT-style encoder: patch embedding, class token, position embeddings, transformer layers."""

    def __init__(self, image: int = 32, patch: int = 8, hidden: int = 64, heads: int = 4, layers: int = 2) -> None:
        super().__init__()
        self.patches = nn.Conv2d(3, hidden, patch, stride=patch)
        self.cls = nn.Parameter(torch.randn(1, 1, hidden) * 0.02)
        self.position = nn.Parameter(torch.randn(1, (image // patch) ** 2 + 1, hidden) * 0.02)
        layer = nn.TransformerEncoderLayer(hidden, heads, 4 * hidden, dropout=0.0, activation="gelu",
                                           batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(hidden)
        self.head = nn.Linear(hidden, 10)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        x = self.patches(image).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.position
        return self.head(self.norm(self.encoder(x))[:, 0])


class SqueezeExcite(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.reduce = nn.Conv2d(channels, channels // 4, 1)
        self.expand = nn.Conv2d(channels // 4, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = nn.functional.hardsigmoid(self.expand(nn.functional.relu(self.reduce(x.mean((2, 3), keepdim=True)))))
        return x * scale


class MobileNetV3Style(nn.Module):
    """MobileNetV3 building blocks: hardswish, depthwise convolutions, squeeze-and-excite."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1, bias=False), nn.BatchNorm2d(16), nn.Hardswish())
        self.block = nn.Sequential(
            nn.Conv2d(16, 64, 1, bias=False), nn.BatchNorm2d(64), nn.Hardswish(),
            nn.Conv2d(64, 64, 3, 2, 1, groups=64, bias=False), nn.BatchNorm2d(64), nn.Hardswish(),
            SqueezeExcite(64),
            nn.Conv2d(64, 24, 1, bias=False), nn.BatchNorm2d(24),
        )
        self.head = nn.Sequential(nn.Conv2d(24, 96, 1), nn.Hardswish(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                                  nn.Linear(96, 10))

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        return self.head(self.block(self.stem(image)))
