"""Tiny model configs built in code (no downloads) for the memory tests."""

from __future__ import annotations

import pytest
from transformers import GPT2Config, GPTNeoXConfig, LlamaConfig, MistralConfig, Qwen2Config

TINY_UNET = {
    "_class_name": "UNet2DConditionModel", "block_out_channels": [32, 64],
    "down_block_types": ["CrossAttnDownBlock2D", "DownBlock2D"],
    "up_block_types": ["UpBlock2D", "CrossAttnUpBlock2D"], "layers_per_block": 1,
    "cross_attention_dim": 32, "attention_head_dim": 8, "norm_num_groups": 8, "sample_size": 8,
}
TINY_UNET_XL = dict(TINY_UNET, addition_embed_type="text_time", addition_time_embed_dim=8,
                    projection_class_embeddings_input_dim=80, transformer_layers_per_block=[1, 2],
                    use_linear_projection=True)


def tiny_llama(layers: int = 2, vocab: int = 1000) -> LlamaConfig:
    return LlamaConfig(vocab_size=vocab, hidden_size=128, intermediate_size=344, num_hidden_layers=layers,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048)


TEXT_CONFIGS = {
    "llama": tiny_llama(),
    "qwen2": Qwen2Config(vocab_size=1000, hidden_size=128, intermediate_size=344, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048),
    "mistral": MistralConfig(vocab_size=1000, hidden_size=128, intermediate_size=344, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, sliding_window=64),
    "gpt2": GPT2Config(vocab_size=1000, n_embd=128, n_layer=2, n_head=4, n_positions=1024,
                       bos_token_id=0, eos_token_id=0),
    "gpt_neox": GPTNeoXConfig(vocab_size=1000, hidden_size=128, intermediate_size=512, num_hidden_layers=2,
                              num_attention_heads=4),
}


@pytest.fixture
def llama_cfg() -> LlamaConfig:
    return tiny_llama()
