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


class Bottleneck(nn.Module):
    def __init__(self, cin: int, width: int, stride: int) -> None:
        super().__init__()
        cout = 4 * width
        self.body = nn.Sequential(_conv_bn(cin, width, 1, 1), _conv_bn(width, width, 3, stride),
                                  _conv_bn(width, cout, 1, 1, act=False))
        self.shortcut = (nn.Sequential() if stride == 1 and cin == cout
                         else _conv_bn(cin, cout, 1, stride, act=False))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x) + self.shortcut(x))


class ResNet50(nn.Module):
    """ResNet-50 v1.5 (He et al. 2016; the stride on the 3x3 convolution), 224x224, 1000 classes."""

    def __init__(self, classes: int = 1000) -> None:
        super().__init__()
        layers: list[nn.Module] = [_conv_bn(3, 64, 7, 2), nn.MaxPool2d(3, 2, 1)]
        cin = 64
        for width, blocks, stride in [(64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)]:
            for i in range(blocks):
                layers.append(Bottleneck(cin, width, stride if i == 0 else 1))
                cin = 4 * width
        self.features = nn.Sequential(*layers)
        self.fc = nn.Linear(cin, classes)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        return self.fc(self.features(image).mean(dim=(2, 3)))


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


def _make_divisible(value: float, divisor: int = 8) -> int:
    rounded = max(divisor, int(value + divisor / 2) // divisor * divisor)
    return rounded + divisor if rounded < 0.9 * value else rounded


class SqueezeExcite(nn.Module):
    def __init__(self, channels: int, reduction: int = 4) -> None:
        super().__init__()
        squeezed = _make_divisible(channels / reduction)
        self.reduce = nn.Conv2d(channels, squeezed, 1)
        self.expand = nn.Conv2d(squeezed, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = nn.functional.adaptive_avg_pool2d(x, 1)
        return x * nn.functional.hardsigmoid(self.expand(torch.relu(self.reduce(scale))))


class MobileNetV3Block(nn.Module):
    def __init__(self, cin: int, hidden: int, cout: int, kernel: int, stride: int, se: bool, hswish: bool) -> None:
        super().__init__()
        act: type[nn.Module] = nn.Hardswish if hswish else nn.ReLU
        layers: list[nn.Module] = []
        if hidden != cin:
            layers += [nn.Conv2d(cin, hidden, 1, bias=False), nn.BatchNorm2d(hidden), act()]
        layers += [nn.Conv2d(hidden, hidden, kernel, stride, kernel // 2, groups=hidden, bias=False),
                   nn.BatchNorm2d(hidden), act()]
        if se:
            layers.append(SqueezeExcite(hidden))
        layers += [nn.Conv2d(hidden, cout, 1, bias=False), nn.BatchNorm2d(cout)]
        self.body = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x) if self.residual else self.body(x)


class MobileNetV3Backbone(nn.Module):
    """MobileNetV3-large (Howard et al. 2019) feature extractor: maps at strides 4, 8, 16 and 32."""

    # kernel, expansion, output channels, squeeze-excite, hard-swish, stride; a feature map after each stage.
    STAGES = [
        [(3, 16, 16, False, False, 1), (3, 64, 24, False, False, 2), (3, 72, 24, False, False, 1)],
        [(5, 72, 40, True, False, 2), (5, 120, 40, True, False, 1), (5, 120, 40, True, False, 1)],
        [(3, 240, 80, False, True, 2), (3, 200, 80, False, True, 1), (3, 184, 80, False, True, 1),
         (3, 184, 80, False, True, 1), (3, 480, 112, True, True, 1), (3, 672, 112, True, True, 1)],
        [(5, 672, 160, True, True, 2), (5, 960, 160, True, True, 1), (5, 960, 160, True, True, 1)],
    ]

    def __init__(self, scale: float = 0.5) -> None:
        super().__init__()
        cin = _make_divisible(16 * scale)
        self.stem = nn.Sequential(nn.Conv2d(3, cin, 3, 2, 1, bias=False), nn.BatchNorm2d(cin), nn.Hardswish())
        self.stages = nn.ModuleList()
        self.out_channels: list[int] = []
        for i, stage in enumerate(self.STAGES):
            blocks: list[nn.Module] = []
            for kernel, expansion, cout, se, hswish, stride in stage:
                hidden, cout = _make_divisible(expansion * scale), _make_divisible(cout * scale)
                blocks.append(MobileNetV3Block(cin, hidden, cout, kernel, stride, se, hswish))
                cin = cout
            if i == len(self.STAGES) - 1:
                last = _make_divisible(960 * scale)
                blocks += [nn.Conv2d(cin, last, 1, bias=False), nn.BatchNorm2d(last), nn.Hardswish()]
                cin = last
            self.stages.append(nn.Sequential(*blocks))
            self.out_channels.append(cin)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        x = self.stem(x)
        features = []
        for stage in self.stages:
            x = stage(x)
            features.append(x)
        return features


class DBNet(nn.Module):
    """A DBNet-style text detector (Liao et al. 2020), as PaddleOCR's mobile detector builds it.

    MobileNetV3-large x0.5 backbone; FPN neck: bias-free 1x1 convolutions to
    96 channels, nearest upsampling and adds top-down, bias-free 3x3
    convolutions to 24 channels, every level upsampled to stride 4 and
    concatenated; probability head: 3x3 convolution, then two stride-2
    ConvTranspose (kernel 2) back to the input's size, then a sigmoid.
    """

    def __init__(self, neck: int = 96) -> None:
        super().__init__()
        self.backbone = MobileNetV3Backbone()
        self.lateral = nn.ModuleList(nn.Conv2d(c, neck, 1, bias=False) for c in self.backbone.out_channels)
        self.smooth = nn.ModuleList(nn.Conv2d(neck, neck // 4, 3, padding=1, bias=False)
                                    for _ in self.backbone.out_channels)
        quarter = neck // 4
        self.head = nn.Sequential(
            nn.Conv2d(neck, quarter, 3, padding=1, bias=False), nn.BatchNorm2d(quarter), nn.ReLU(),
            nn.ConvTranspose2d(quarter, quarter, 2, 2), nn.BatchNorm2d(quarter), nn.ReLU(),
            nn.ConvTranspose2d(quarter, 1, 2, 2), nn.Sigmoid())

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        c2, c3, c4, c5 = (conv(f) for conv, f in zip(self.lateral, self.backbone(image)))
        up = nn.functional.interpolate
        p4 = c4 + up(c5, scale_factor=2.0, mode="nearest")
        p3 = c3 + up(p4, scale_factor=2.0, mode="nearest")
        p2 = c2 + up(p3, scale_factor=2.0, mode="nearest")
        levels = [conv(p) for conv, p in zip(self.smooth, (p2, p3, p4, c5))]
        fused = torch.cat([levels[0]] + [up(level, scale_factor=float(2 ** i), mode="nearest")
                                         for i, level in enumerate(levels[1:], start=1)], dim=1)
        return self.head(fused)


class UNet(nn.Module):
    """A segmentation U-Net (Ronneberger et al. 2015) as a binary-mask model ships: four levels of two 3x3
    convolutions with batch norm and ReLU6 (this file's unit), ``width`` to ``8 * width`` channels, max pooling down, 2x2
    ConvTranspose up, skip concatenations, a 1x1 convolution and a sigmoid."""

    def __init__(self, width: int = 16, classes: int = 2) -> None:
        super().__init__()

        def block(cin: int, cout: int) -> nn.Sequential:
            return nn.Sequential(_conv_bn(cin, cout, 3, 1), _conv_bn(cout, cout, 3, 1))

        w = width
        self.down = nn.ModuleList([block(3, w), block(w, 2 * w), block(2 * w, 4 * w), block(4 * w, 8 * w)])
        self.up = nn.ModuleList(nn.ConvTranspose2d(c, c // 2, 2, 2) for c in (8 * w, 4 * w, 2 * w))
        self.merge = nn.ModuleList([block(8 * w, 4 * w), block(4 * w, 2 * w), block(2 * w, w)])
        self.head = nn.Conv2d(w, classes, 1)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        skips = []
        x = image
        for level, block in enumerate(self.down):
            x = block(x)
            if level < 3:
                skips.append(x)
                x = nn.functional.max_pool2d(x, 2)
        for up, merge in zip(self.up, self.merge):
            x = merge(torch.cat([up(x), skips.pop()], 1))
        return torch.sigmoid(self.head(x))


class VoiceActivity(nn.Module):
    """A voice-activity detector in the style of Silero VAD: conv1d over each frame's samples, LSTM over frames.

    Input ``[1, frames, 576]`` (512 new samples and 64 of context at 16 kHz);
    each frame: a learned STFT (conv1d, kernel 256, stride 128, 129 bins of
    real and imaginary parts) and its magnitude, then four conv1d+ReLU layers
    (two at stride 2) down to 128 features; an LSTM over the frames, then a
    linear layer and a sigmoid: ``[1, frames, 1]`` speech probabilities.
    """

    def __init__(self, samples: int = 576, bins: int = 129, hidden: int = 128) -> None:
        super().__init__()
        self.samples, self.bins = samples, bins
        self.stft = nn.Conv1d(1, 2 * bins, 256, stride=128, padding=64, bias=False)
        self.encoder = nn.Sequential(
            nn.Conv1d(bins, 128, 3, padding=1), nn.ReLU(),
            nn.Conv1d(128, 64, 3, stride=2, padding=1), nn.ReLU(),
            nn.Conv1d(64, 64, 3, stride=2, padding=1), nn.ReLU(),
            nn.Conv1d(64, hidden, 3, padding=1), nn.ReLU())
        self.lstm = nn.LSTM(hidden, hidden, batch_first=True)
        self.decoder = nn.Linear(hidden, 1)

    def forward(self, audio: torch.Tensor) -> torch.Tensor:
        batch, frames, _ = audio.shape
        spectrum = self.stft(audio.reshape(batch * frames, 1, self.samples))
        real, imag = spectrum[:, :self.bins], spectrum[:, self.bins:]
        features = self.encoder(torch.sqrt(real * real + imag * imag))
        features = features.mean(dim=2).reshape(batch, frames, -1)
        hidden, _ = self.lstm(features)
        return torch.sigmoid(self.decoder(torch.relu(hidden)))


def randomized(model: nn.Module, seed: int = 0) -> nn.Module:
    """Random weights and non-trivial batch-norm statistics, in eval mode."""
    torch.manual_seed(seed)
    for module in model.modules():
        if isinstance(module, nn.BatchNorm2d):
            module.running_mean.uniform_(-0.1, 0.1)
            module.running_var.uniform_(0.5, 1.5)
    return model.eval()
