"""Tiny randomly initialised models of each supported family, and what a brute-force
reference needs to know about them, written independently of captum_cw."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import transformers
from torch import Tensor, nn

SEED = 0


@dataclass(frozen=True)
class TinyFamily:
    name: str
    build: Callable[[], nn.Module]
    kind: str  # "decoder", "encoder" or "vision"
    attention_class: str
    value_of: Callable[[nn.Module, Tensor], Tensor]  # (attention module, its value-path output) -> [b, n, kv*d]
    value_path: str  # submodule of the attention module whose output holds v
    projection: Callable[[nn.Module, nn.Module], nn.Module]  # (model, attention module) -> output projection
    padding_side: str = "left"

    def projection_weight(self, projection: nn.Module) -> Tensor:
        """W_O as ``(heads * d_head, d_model)``."""
        return projection.weight if self.name == "gpt2" else projection.weight.t()


def _linear_projection(name: str):
    def projection(model: nn.Module, attention: nn.Module):
        return attention.get_submodule(name)

    return projection


def _sibling_projection(model: nn.Module, attention: nn.Module):
    for module in model.modules():
        if getattr(module, "self", None) is attention:
            return module.output.dense
    raise AssertionError("projection not found")


def _conv1d_projection(model: nn.Module, attention: nn.Module):
    return attention.c_proj


def _plain(module: nn.Module, output: Tensor) -> Tensor:
    return output


def _gpt2_value(module: nn.Module, output: Tensor) -> Tensor:
    return output.split(module.split_size, dim=2)[2]


def _decoder(config_class, **extra):
    def build():
        torch.manual_seed(SEED)
        config = config_class(
            vocab_size=64,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=64,
            initializer_range=0.2,
            **extra,
        )
        return transformers.AutoModelForCausalLM.from_config(config).eval()

    return build


def _gpt2():
    torch.manual_seed(SEED)
    config = transformers.GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=4, n_positions=64,
                                     initializer_range=0.2)
    return transformers.GPT2LMHeadModel(config).eval()


def _bert():
    torch.manual_seed(SEED)
    config = transformers.BertConfig(
        vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=64, initializer_range=0.2,
    )
    return transformers.BertModel(config, add_pooling_layer=False).eval()


def _vit():
    torch.manual_seed(SEED)
    config = transformers.ViTConfig(
        image_size=16, patch_size=4, num_channels=3, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, initializer_range=0.2,
    )
    return transformers.ViTModel(config, add_pooling_layer=False).eval()


FAMILIES = {
    "llama": TinyFamily("llama", _decoder(transformers.LlamaConfig), "decoder", "LlamaAttention", _plain, "v_proj",
                        _linear_projection("o_proj")),
    "mistral": TinyFamily("mistral", _decoder(transformers.MistralConfig, sliding_window=5), "decoder",
                          "MistralAttention", _plain, "v_proj", _linear_projection("o_proj")),
    "qwen2": TinyFamily("qwen2", _decoder(transformers.Qwen2Config), "decoder", "Qwen2Attention", _plain, "v_proj",
                        _linear_projection("o_proj")),
    "qwen3": TinyFamily("qwen3", _decoder(transformers.Qwen3Config, head_dim=8), "decoder", "Qwen3Attention", _plain,
                        "v_proj", _linear_projection("o_proj")),
    "gemma3_text": TinyFamily(
        "gemma3_text",
        _decoder(transformers.Gemma3TextConfig, head_dim=8, sliding_window=4,
                 layer_types=["sliding_attention", "full_attention"], query_pre_attn_scalar=8),
        "decoder", "Gemma3Attention", _plain, "v_proj", _linear_projection("o_proj"),
    ),
    "gpt2": TinyFamily("gpt2", _gpt2, "decoder", "GPT2Attention", _gpt2_value, "c_attn", _conv1d_projection),
    "bert": TinyFamily("bert", _bert, "encoder", "BertSelfAttention", _plain, "value", _sibling_projection,
                       padding_side="right"),
    "vit": TinyFamily("vit", _vit, "vision", "ViTAttention", _plain, "v_proj", _linear_projection("o_proj")),
}


def example_inputs(family: TinyFamily) -> tuple[Tensor, Tensor | None]:
    """Inputs with padding: left padding for decoders, right padding for encoders; pixels for vision."""
    generator = torch.Generator().manual_seed(1)
    if family.kind == "vision":
        return torch.randn(2, 3, 16, 16, generator=generator), None
    ids = torch.randint(3, 64, (2, 9), generator=generator)
    mask = torch.ones(2, 9, dtype=torch.long)
    if family.padding_side == "left":
        mask[1, :3] = 0
    else:
        mask[1, -3:] = 0
    return ids, mask
