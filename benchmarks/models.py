"""Models of the CPU benchmark, built in torch.nn with random weights (no downloads, no torchvision)."""

from __future__ import annotations

import math

import torch
from torch import nn


def _conv_bn(cin: int, cout: int, kernel: int, stride: int, groups: int = 1, act: bool = True) -> nn.Sequential:
    layers: list[nn.Module] = [nn.Conv2d(cin, cout, kernel, stride, kernel // 2, groups=groups, bias=False),
                               nn.BatchNorm2d(cout)]
    if act:
        layers.append(nn.ReLU6(inplace=True))
    return nn.Sequential(*layers)


class InvertedResidual(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, expand: int) -> None:
        super().__init__()
        hidden = cin * expand
        layers = [] if expand == 1 else [_conv_bn(cin, hidden, 1, 1)]
        layers += [_conv_bn(hidden, hidden, 3, stride, groups=hidden), _conv_bn(hidden, cout, 1, 1, act=False)]
        self.body = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x) if self.residual else self.body(x)


class MobileNetV2(nn.Module):
    """MobileNetV2 (Sandler et al. 2018), width 1.0, 224x224, 1000 classes."""

    SETTINGS = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
                (6, 320, 1, 1)]

    def __init__(self, classes: int = 1000) -> None:
        super().__init__()
        layers: list[nn.Module] = [_conv_bn(3, 32, 3, 2)]
        cin = 32
        for expand, cout, repeats, stride in self.SETTINGS:
            for i in range(repeats):
                layers.append(InvertedResidual(cin, cout, stride if i == 0 else 1, expand))
                cin = cout
        layers.append(_conv_bn(cin, 1280, 1, 1))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(1280, classes))

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(image).mean(dim=(2, 3)))


class EncoderLayer(nn.Module):
    def __init__(self, hidden: int, heads: int, intermediate: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.out = nn.Linear(hidden, hidden)
        self.norm1 = nn.LayerNorm(hidden, eps=1e-12)
        self.ffn_in = nn.Linear(hidden, intermediate)
        self.ffn_out = nn.Linear(intermediate, hidden)
        self.norm2 = nn.LayerNorm(hidden, eps=1e-12)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, hidden = x.shape
        head_dim = hidden // self.heads
        q, k, v = self.qkv(x).reshape(batch, seq, 3, self.heads, head_dim).permute(2, 0, 3, 1, 4)
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(head_dim)
        context = torch.matmul(torch.softmax(scores, dim=-1), v).transpose(1, 2).reshape(batch, seq, hidden)
        x = self.norm1(x + self.out(context))
        return self.norm2(x + self.ffn_out(nn.functional.gelu(self.ffn_in(x))))


class BertEncoder(nn.Module):
    """A BERT-style encoder the size of MiniLM: 6 layers, hidden 384, 12 heads, FFN 1536."""

    def __init__(self, layers: int = 6, hidden: int = 384, heads: int = 12, vocab: int = 30522,
                 max_positions: int = 512) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab, hidden)
        self.positions = nn.Embedding(max_positions, hidden)
        self.norm = nn.LayerNorm(hidden, eps=1e-12)
        self.layers = nn.ModuleList(EncoderLayer(hidden, heads, 4 * hidden) for _ in range(layers))

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device).unsqueeze(0)
        x = self.norm(self.tokens(input_ids) + self.positions(positions))
        for layer in self.layers:
            x = layer(x)
        return x


def randomized(model: nn.Module, seed: int = 0) -> nn.Module:
    """Random weights and non-trivial batch-norm statistics, in eval mode."""
    torch.manual_seed(seed)
    for module in model.modules():
        if isinstance(module, nn.BatchNorm2d):
            module.running_mean.uniform_(-0.1, 0.1)
            module.running_var.uniform_(0.5, 1.5)
    return model.eval()
