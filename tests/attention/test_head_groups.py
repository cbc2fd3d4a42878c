"""Attention in head groups gives the single call's result (forward and gradients, fp32, CPU)."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, MistralConfig

from lora_gui.attention import configure_windowed
from lora_gui.attention.head_groups import GROUPS_ATTR, enable_attention_head_groups
from lora_gui.models.errors import ModelError
from lora_gui.models.long_context import apply_long_context

COMMON = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=8,
              vocab_size=97, max_position_embeddings=256, attention_dropout=0.0)
IDS = torch.randint(0, 97, (2, 40), generator=torch.Generator().manual_seed(0))


def _pair(config, impl: str, groups: int):
    """A model and a copy with the same weights that runs its attention in ``groups`` calls."""
    torch.manual_seed(0)
    ref = AutoModelForCausalLM.from_config(copy.deepcopy(config), attn_implementation=impl)
    grouped = AutoModelForCausalLM.from_config(copy.deepcopy(config), attn_implementation=impl)
    grouped.load_state_dict(ref.state_dict())
    assert enable_attention_head_groups(grouped, groups) == config.num_hidden_layers
    return ref, grouped


def _check_same(ref, grouped, **inputs) -> None:
    want = ref(input_ids=IDS, **inputs, labels=IDS)
    got = grouped(input_ids=IDS, **inputs, labels=IDS)
    assert torch.allclose(got.logits, want.logits, atol=1e-5, rtol=1e-5)
    want.loss.backward()
    got.loss.backward()
    for (name, a), b in zip(ref.named_parameters(), grouped.parameters()):
        assert torch.allclose(a.grad, b.grad, atol=1e-5, rtol=1e-4), name


@pytest.mark.parametrize("kv_heads,groups", [(4, 4), (4, 2), (8, 8), (8, 2)])
def test_sdpa_causal_and_padded_match_one_call(kv_heads, groups):
    config = LlamaConfig(num_key_value_heads=kv_heads, **COMMON)
    ref, grouped = _pair(config, "sdpa", groups)
    _check_same(ref, grouped)  # causal, no mask: the flash path with enable_gqa
    ref.zero_grad(), grouped.zero_grad()
    mask = torch.ones_like(IDS)
    mask[1, 30:] = 0  # right padding: a 4D mask reaches SDPA (repeat_kv path)
    _check_same(ref, grouped, attention_mask=mask)


def test_native_sliding_window_matches_one_call():
    config = MistralConfig(num_key_value_heads=4, sliding_window=8, **COMMON)  # window < 40 tokens
    ref, grouped = _pair(config, "sdpa", 4)
    _check_same(ref, grouped)


def test_windowed_attention_matches_one_call():
    config = LlamaConfig(num_key_value_heads=4, **COMMON)
    configure_windowed(config, window=8, global_tokens=2)
    ref, grouped = _pair(config, "windowed", 2)
    _check_same(ref, grouped)


def test_groups_are_checked_and_off_by_default():
    config = LlamaConfig(num_key_value_heads=4, **COMMON)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    with pytest.raises(ModelError, match="3 does not divide this model's 4 key/value heads; use one of"):
        apply_long_context(model, attention_head_groups=3)
    assert enable_attention_head_groups(model, 0) == 0
    assert not any(hasattr(m, GROUPS_ATTR) for m in model.modules())
    eager = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    with pytest.raises(ValueError, match="needs the sdpa or windowed attention"):
        enable_attention_head_groups(eager, 2)


def test_run_config_refuses_eager():
    from lora_gui.config import ConfigError, RunConfig

    with pytest.raises(ConfigError, match="attention_head_groups: needs attn_backend sdpa"):
        RunConfig(attention_head_groups=8, attn_backend="eager").validate()
