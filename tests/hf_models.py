"""Tiny Hugging Face ``transformers`` architectures with random weights, built from their configs (no download).

Each model is the real ``transformers`` implementation (``AutoConfig.for_model``
and ``from_config``) at a tiny size: two layers, hidden size 32 (MobileViT's
stages 32-64). Its weights are re-drawn so that activations keep a sane scale
through the layers (matrices ~ N(0, 1/fan_in), so attention is far from
uniform) and no weight is all-equal (norm scales in [0.5, 1.5], biases and
batch-norm statistics random). Every model is wrapped to take tensors and
return one tensor, as users export them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import transformers
from torch import nn

VOCAB = 100


def randomize(model: nn.Module, seed: int) -> nn.Module:
    """Re-draw every weight (see the module docstring) and put the model in eval mode."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            shape = parameter.shape
            if parameter.ndim >= 2:
                fan_in = math.prod(shape[1:])
                parameter.copy_(torch.randn(shape, generator=generator) / math.sqrt(fan_in))
            elif bool((parameter == 1).all()):  # a norm's scale
                parameter.copy_(torch.rand(shape, generator=generator) + 0.5)
            else:
                parameter.copy_(torch.randn(shape, generator=generator) * 0.1)
        for module in model.modules():
            if isinstance(module, nn.modules.batchnorm._BatchNorm) and module.running_mean is not None:
                module.running_mean.copy_((torch.rand(module.running_mean.shape, generator=generator) - 0.5) * 0.4)
                module.running_var.copy_(torch.rand(module.running_var.shape, generator=generator) + 0.5)
    return model.eval()


class TextEncoder(nn.Module):
    """``input_ids`` and ``attention_mask`` in, the last hidden state out."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


class ImageEncoder(nn.Module):
    """``pixel_values`` in, the last hidden state (or the logits of a classifier) out."""

    def __init__(self, model: nn.Module, output: str = "last_hidden_state") -> None:
        super().__init__()
        self.model = model
        self.output = output

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return getattr(self.model(pixel_values=pixel_values), self.output)


class AudioEncoder(nn.Module):
    """Log-mel ``input_features`` in, the encoder's last hidden state out (Whisper's encoder)."""

    def __init__(self, encoder: nn.Module) -> None:
        super().__init__()
        self.encoder = encoder

    def forward(self, input_features: torch.Tensor) -> torch.Tensor:
        return self.encoder(input_features=input_features).last_hidden_state


def _config(model_type: str, **options: object) -> transformers.PretrainedConfig:
    return transformers.AutoConfig.for_model(model_type, **options)


def _text_inputs(batch: int, length: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random token ids, and a mask that pads the end of the first sequence."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, VOCAB, (batch, length), generator=generator)
    mask = torch.ones(batch, length, dtype=torch.int64)
    mask[0, length - length // 3:] = 0
    return ids, mask


def _image_inputs(size: int) -> Callable[[int, int, int], tuple[torch.Tensor, ...]]:
    def make(batch: int, length: int, seed: int) -> tuple[torch.Tensor, ...]:
        generator = torch.Generator().manual_seed(seed)
        return (torch.randn(batch, 3, size, size, generator=generator),)

    return make


def _audio_inputs(mels: int, frames: int) -> Callable[[int, int, int], tuple[torch.Tensor, ...]]:
    def make(batch: int, length: int, seed: int) -> tuple[torch.Tensor, ...]:
        generator = torch.Generator().manual_seed(seed)
        return (torch.randn(batch, mels, frames, generator=generator),)

    return make


@dataclass(frozen=True)
class Architecture:
    """A tiny real architecture, its example inputs and which of their axes may vary."""

    name: str
    build_model: Callable[[], nn.Module]
    make_inputs: Callable[[int, int, int], tuple[torch.Tensor, ...]]
    """``(batch, sequence length, seed)`` to example inputs; image and audio models ignore the length."""
    input_names: tuple[str, ...]
    dynamic_axes: dict[str, dict[int, str]] = field(default_factory=dict)
    """For the TorchScript exporter: every input's variable axes (batch, and sequence for text)."""

    def build(self, seed: int = 0) -> nn.Module:
        torch.manual_seed(seed)
        return randomize(self.build_model(), seed)

    def inputs(self, batch: int = 2, length: int = 12, seed: int = 0) -> tuple[torch.Tensor, ...]:
        return self.make_inputs(batch, length, seed)

    @property
    def is_text(self) -> bool:
        return self.input_names == ("input_ids", "attention_mask")


_TEXT_AXES = {"input_ids": {0: "batch", 1: "sequence"}, "attention_mask": {0: "batch", 1: "sequence"}}
_TEXT_NAMES = ("input_ids", "attention_mask")
_TINY_BERT = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                  intermediate_size=64, max_position_embeddings=64)


def _bert() -> nn.Module:
    return TextEncoder(transformers.AutoModel.from_config(_config("bert", **_TINY_BERT)))


def _roberta() -> nn.Module:
    # RoBERTa's positions start after the padding index; token ids 1 (its padding) never occur in the inputs.
    return TextEncoder(transformers.AutoModel.from_config(_config("roberta", **_TINY_BERT, pad_token_id=1)))


def _distilbert() -> nn.Module:
    config = _config("distilbert", vocab_size=VOCAB, dim=32, n_layers=2, n_heads=4, hidden_dim=64,
                     max_position_embeddings=64)
    return TextEncoder(transformers.AutoModel.from_config(config))


def _gpt2() -> nn.Module:
    config = _config("gpt2", vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64, use_cache=False,
                     bos_token_id=0, eos_token_id=0)
    return TextEncoder(transformers.AutoModel.from_config(config))


def _t5_encoder() -> nn.Module:
    config = _config("t5", vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
                     relative_attention_num_buckets=8, relative_attention_max_distance=16, use_cache=False)
    return TextEncoder(transformers.T5EncoderModel(config))


def _vit() -> nn.Module:
    config = _config("vit", image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=64)
    return ImageEncoder(transformers.AutoModel.from_config(config, add_pooling_layer=False))


def _mobilevit() -> nn.Module:
    config = _config("mobilevit", image_size=64, hidden_sizes=[32, 48, 64], neck_hidden_sizes=[8, 16, 24, 32, 48, 64, 96],
                     num_attention_heads=4, num_labels=10)
    return ImageEncoder(transformers.AutoModelForImageClassification.from_config(config), output="logits")


WHISPER_MELS, WHISPER_FRAMES = 16, 32


def _whisper_encoder() -> nn.Module:
    config = _config("whisper", num_mel_bins=WHISPER_MELS, d_model=32, encoder_layers=2, encoder_attention_heads=4,
                     encoder_ffn_dim=64, decoder_layers=1, decoder_attention_heads=4, decoder_ffn_dim=64,
                     max_source_positions=WHISPER_FRAMES // 2, vocab_size=VOCAB, pad_token_id=0, bos_token_id=1,
                     eos_token_id=1, decoder_start_token_id=1, begin_suppress_tokens=None)
    return AudioEncoder(transformers.AutoModel.from_config(config).get_encoder())


ARCHITECTURES = {
    arch.name: arch
    for arch in (
        Architecture("bert", _bert, _text_inputs, _TEXT_NAMES, _TEXT_AXES),
        Architecture("distilbert", _distilbert, _text_inputs, _TEXT_NAMES, _TEXT_AXES),
        Architecture("roberta", _roberta, _text_inputs, _TEXT_NAMES, _TEXT_AXES),
        Architecture("gpt2", _gpt2, _text_inputs, _TEXT_NAMES, _TEXT_AXES),
        Architecture("t5-encoder", _t5_encoder, _text_inputs, _TEXT_NAMES, _TEXT_AXES),
        Architecture("vit", _vit, _image_inputs(32), ("pixel_values",), {"pixel_values": {0: "batch"}}),
        Architecture("mobilevit", _mobilevit, _image_inputs(64), ("pixel_values",), {"pixel_values": {0: "batch"}}),
        Architecture("whisper-encoder", _whisper_encoder, _audio_inputs(WHISPER_MELS, WHISPER_FRAMES),
                     ("input_features",), {"input_features": {0: "batch"}}),
    )
}
