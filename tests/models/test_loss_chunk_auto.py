"""loss_chunk=-1 (the default): chunked loss on in optimized mode, off in traditional."""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from lora_gui.config import AUTO_LOSS_CHUNK, RunConfig, apply_overrides
from lora_gui.memory.predict.run_plan import step_kwargs
from lora_gui.models.text import ModelError, load_model_for


@pytest.mark.parametrize("overrides,expected", [
    ({}, AUTO_LOSS_CHUNK),
    ({"mode": "traditional"}, 0),
    ({"loss_chunk": 0}, 0),
    ({"mode": "traditional", "loss_chunk": 256}, 256),
])
def test_resolved_loss_chunk(overrides, expected):
    cfg = apply_overrides(RunConfig(), overrides)
    assert cfg.resolved_loss_chunk() == expected
    assert step_kwargs(cfg, "cpu")["loss_chunk"] == expected  # the planner traces what runs


def test_below_auto_is_refused_with_the_range():
    with pytest.raises(ValueError, match=r"loss_chunk: -2 is out of range \[-1"):
        apply_overrides(RunConfig(), {"loss_chunk": -2})


def _tiny_model_dir(tmp_path, **extra):
    config = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
                         **extra)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(tmp_path)
    return str(tmp_path)


def test_optimized_default_loads_with_the_chunked_loss(tmp_path):
    source = _tiny_model_dir(tmp_path)
    assert load_model_for(RunConfig(), source).loss_chunk == AUTO_LOSS_CHUNK
    assert not hasattr(load_model_for(RunConfig(mode="traditional"), source), "loss_chunk")


def test_auto_keeps_the_full_loss_on_a_head_it_cannot_mimic(tmp_path):
    source = _tiny_model_dir(tmp_path, logit_scale=0.5)  # a Cohere-style rescaled head
    assert not hasattr(load_model_for(RunConfig(), source), "loss_chunk")
    with pytest.raises(ModelError, match="logit_scale"):
        load_model_for(RunConfig(loss_chunk=512), source)
