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
    implementations: tuple[str, ...] = ("eager", "sdpa")  # those the family supports
    own_positions: bool = False  # positions come from the mask or the ids (OPT, RoBERTa), not from arange

    def position_ids(self, real: Tensor) -> Tensor | None:
        """Position ids of one unpadded example whose real tokens sat at ``real`` in the padded batch;
        None lets the model number them itself (families that skip padding when they number tokens)."""
        return None if self.own_positions else real[None]

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


def _phi3_value(module: nn.Module, output: Tensor) -> Tensor:  # fused [q | k | v], GQA-sized k and v
    return output[..., -module.num_key_value_heads * module.head_dim:]


def _gpt_neox_value(module: nn.Module, output: Tensor) -> Tensor:  # per head [q | k | v]
    per_head = output.unflatten(-1, (-1, 3 * module.head_size))  # [b, n, head, 3 * d]
    return per_head[..., 2 * module.head_size:].flatten(2)


def _falcon_value(module: nn.Module, output: Tensor) -> Tensor:  # multi-query: [q heads | k | v], one KV head
    return output[..., -module.head_dim:]


def _falcon_grouped_value(module: nn.Module, output: Tensor) -> Tensor:  # per KV group [its q heads | k | v]
    grouped = output.unflatten(-1, (module.num_kv_heads, -1, module.head_dim))  # [b, n, kv, group + 2, d]
    return grouped[..., -1, :].flatten(-2)


def _decoder(config_class, model_kwargs=None, **extra):
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
        return transformers.AutoModelForCausalLM.from_config(config, **(model_kwargs or {})).eval()

    return build


def _gpt_neox():
    torch.manual_seed(SEED)
    config = transformers.GPTNeoXConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, max_position_embeddings=64, initializer_range=0.2)
    return transformers.GPTNeoXForCausalLM(config).eval()


def _falcon(**layout):
    def build():
        torch.manual_seed(SEED)
        config = transformers.FalconConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                           initializer_range=0.2, **layout)
        return transformers.FalconForCausalLM(config).eval()

    return build


def _opt():
    torch.manual_seed(SEED)
    config = transformers.OPTConfig(vocab_size=64, hidden_size=32, ffn_dim=64, num_hidden_layers=2,
                                    num_attention_heads=4, max_position_embeddings=64, word_embed_proj_dim=32,
                                    init_std=0.2)
    return transformers.OPTForCausalLM(config).eval()


def _roberta():
    torch.manual_seed(SEED)
    config = transformers.RobertaConfig(
        vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=64, initializer_range=0.2,
    )
    return transformers.RobertaModel(config, add_pooling_layer=False).eval()


def _distilbert():
    torch.manual_seed(SEED)
    config = transformers.DistilBertConfig(vocab_size=64, dim=32, n_layers=2, n_heads=4, hidden_dim=64,
                                           max_position_embeddings=64, initializer_range=0.2)
    return transformers.DistilBertModel(config).eval()


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
    # registered in issue #14: the first eight keep the exhaustive matrix in the default run, these in -m slow
    "phi3": TinyFamily("phi3", _decoder(transformers.Phi3Config, pad_token_id=0), "decoder", "Phi3Attention",
                       _phi3_value, "qkv_proj", _linear_projection("o_proj")),
    "olmo2": TinyFamily("olmo2", _decoder(transformers.Olmo2Config), "decoder", "Olmo2Attention", _plain, "v_proj",
                        _linear_projection("o_proj")),
    "gpt_neox": TinyFamily("gpt_neox", _gpt_neox, "decoder", "GPTNeoXAttention", _gpt_neox_value, "query_key_value",
                           _linear_projection("dense")),
    "stablelm": TinyFamily("stablelm", _decoder(transformers.StableLmConfig, use_qkv_bias=True), "decoder",
                           "StableLmAttention", _plain, "v_proj", _linear_projection("o_proj")),
    "gemma2": TinyFamily(
        "gemma2",
        _decoder(transformers.Gemma2Config, head_dim=8, sliding_window=4, query_pre_attn_scalar=8,
                 layer_types=["sliding_attention", "full_attention"], attn_logit_softcapping=1.0),
        "decoder", "Gemma2Attention", _plain, "v_proj", _linear_projection("o_proj"),
        implementations=("eager",),  # transformers refuses sdpa for it (no softcapping)
    ),
    "mixtral": TinyFamily(
        "mixtral",
        _decoder(transformers.MixtralConfig, {"experts_implementation": "eager"},  # grouped_mm has no float64
                 num_local_experts=2, num_experts_per_tok=1),
        "decoder", "MixtralAttention", _plain, "v_proj", _linear_projection("o_proj"),
    ),
    "granite": TinyFamily(
        "granite",
        _decoder(transformers.GraniteConfig, attention_multiplier=0.3, embedding_multiplier=2.0,
                 residual_multiplier=0.5, logits_scaling=2.0),
        "decoder", "GraniteAttention", _plain, "v_proj", _linear_projection("o_proj"),
    ),
    "roberta": TinyFamily("roberta", _roberta, "encoder", "RobertaSelfAttention", _plain, "value",
                          _sibling_projection, padding_side="right", own_positions=True),
    "opt": TinyFamily("opt", _opt, "decoder", "OPTAttention", _plain, "v_proj", _linear_projection("out_proj"),
                      own_positions=True),
    "smollm3": TinyFamily("smollm3", _decoder(transformers.SmolLM3Config, pad_token_id=0, no_rope_layers=[1, 0]),
                          "decoder", "SmolLM3Attention", _plain, "v_proj", _linear_projection("o_proj")),
    "distilbert": TinyFamily("distilbert", _distilbert, "encoder", "DistilBertSelfAttention", _plain, "v_lin",
                             _linear_projection("out_lin"), padding_side="right"),
    # on the attention interface since transformers 5.25
    # Falcon-7B: multi-query (one KV head), rotary, parallel attention and MLP
    "falcon": TinyFamily("falcon", _falcon(multi_query=True, parallel_attn=True), "decoder", "FalconAttention",
                         _falcon_value, "query_key_value", _linear_projection("dense")),
    # Falcon-40B/180B and Falcon2: grouped query heads with their key and value per group
    "falcon_grouped": TinyFamily("falcon_grouped", _falcon(new_decoder_architecture=True, num_kv_heads=2), "decoder",
                                 "FalconAttention", _falcon_grouped_value, "query_key_value",
                                 _linear_projection("dense")),
}


def _xlm_roberta():
    torch.manual_seed(SEED)
    config = transformers.XLMRobertaConfig(
        vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=64, initializer_range=0.2,
    )
    return transformers.XLMRobertaModel(config, add_pooling_layer=False).eval()


# families captum_cw does not register: it must discover them (tests/test_discovery.py)
UNREGISTERED = {
    "starcoder2": TinyFamily("starcoder2", _decoder(transformers.Starcoder2Config, sliding_window=5,
                                                       bos_token_id=1, eos_token_id=2), "decoder",
                             "Starcoder2Attention", _plain, "v_proj", _linear_projection("o_proj")),
    "xlm-roberta": TinyFamily("xlm-roberta", _xlm_roberta, "encoder", "XLMRobertaSelfAttention", _plain, "value",
                              _sibling_projection, padding_side="right", own_positions=True),
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
