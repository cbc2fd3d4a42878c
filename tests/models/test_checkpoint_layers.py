"""Checkpointing only the first decoder layers (``checkpoint_layers``): the same loss and LoRA
gradients, the kept layers run their forward once, and the planner traces what the run holds."""

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, LlamaConfig

from lora_gui.config import ConfigError, RunConfig
from lora_gui.memory.predict.estimate import estimate_text_step
from lora_gui.memory.predict.trace import trace_text_step
from lora_gui.memory.runtime.tracker import StorageTracker
from lora_gui.models.checkpointing import checkpointed_layers, enable_checkpointing
from lora_gui.models.errors import ModelError
from lora_gui.models.long_context import apply_long_context

CONFIG = LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                     tie_word_embeddings=False)


def _model():
    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_config(CONFIG, attn_implementation="sdpa")
    return get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))


def _step(model):
    """Loss, LoRA gradients and how often each layer's MLP ran in one training step."""
    model.train()
    calls = [0] * CONFIG.num_hidden_layers
    mlps = [layer.mlp for layer in model.base_model.model.model.layers]
    for i, mlp in enumerate(mlps):  # the forward calls themselves, recomputes included
        def counted(x, i=i, forward=mlp.forward):
            calls[i] += 1
            return forward(x)
        mlp.forward = counted
    torch.manual_seed(1)
    ids = torch.randint(0, 97, (2, 37))
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    for mlp in mlps:
        del mlp.forward
    return loss.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}, calls


@pytest.mark.parametrize("layers", [1, 2, 3])
def test_first_layers_recompute_and_the_kept_ones_run_once(layers):
    full, partial = _model(), _model()
    enable_checkpointing(full)
    enable_checkpointing(partial, layers)
    assert len(checkpointed_layers(full)) == 4 and len(checkpointed_layers(partial)) == layers
    loss0, grads0, calls0 = _step(full)
    loss1, grads1, calls1 = _step(partial)
    assert calls0 == [2, 2, 2, 2]
    assert calls1 == [2] * layers + [1] * (4 - layers)
    assert torch.equal(loss0, loss1)
    assert grads0.keys() == grads1.keys() and len(grads0) == 2 * 7 * 4
    for name, g in grads0.items():
        assert torch.allclose(g, grads1[name], rtol=1e-5, atol=1e-7), name


def test_more_layers_than_the_model_has_is_refused():
    with pytest.raises(ModelError, match="checkpoint_layers: 5 is more than this model's 4 decoder layers"):
        enable_checkpointing(_model(), 5)
    with pytest.raises(ConfigError, match="checkpoint_layers: needs gradient_checkpointing"):
        RunConfig(checkpoint_layers=2).validate()
    RunConfig(checkpoint_layers=2, gradient_checkpointing=True).validate()
    with pytest.raises(ConfigError, match="checkpoint_layers: applies to text runs"):
        RunConfig(task="image", checkpoint_layers=2, gradient_checkpointing=True).validate()


def test_offload_moves_only_the_checkpointed_inputs():
    model = _model()
    enable_checkpointing(model, 1)
    apply_long_context(model, offload_checkpoints=True)
    ids = torch.randint(0, 97, (2, 37))
    with StorageTracker() as t:
        loss = model(input_ids=ids, labels=ids).loss
        assert t.host_live_bytes == 2 * 37 * 32 * 4  # the one checkpointed layer's float32 input
        loss.backward()
    assert t.host_live_bytes == 0


def test_plan_peaks_fall_as_more_layers_are_checkpointed_and_the_estimate_follows():
    kw = dict(batch_size=2, seq_len=256, gradient_checkpointing=True, dtype="float32", device="cpu",
              loss_chunk=256)
    peaks = [trace_text_step(CONFIG, checkpoint_layers=k, **kw).peak_bytes for k in (1, 2, 3, 4)]
    assert peaks[:3] == sorted(peaks[:3], reverse=True) and peaks[0] > peaks[-1]
    # checkpointing the last layer as well buys nothing here: the step peaks in its backward,
    # where its recompute holds what a checkpointed layer keeps (norm outputs, the MLP's four
    # tensors) and a layer left unchecked keeps less (lora_gui.models.lean_backward)
    assert peaks[2] <= peaks[3]
    assert peaks[-1] == trace_text_step(CONFIG, **kw).peak_bytes  # every layer: the default
    off = {**kw, "gradient_checkpointing": False}
    plain = trace_text_step(CONFIG, **off).peak_bytes
    assert plain > peaks[0]  # one checkpointed layer still saves its activations
    # checkpoint_layers means nothing without checkpointing
    assert trace_text_step(CONFIG, checkpoint_layers=2, **off).peak_bytes == plain
    for k, traced in zip((1, 2, 3, 4), peaks):
        estimated = estimate_text_step(CONFIG, checkpoint_layers=k, **kw).peak_bytes
        assert abs(estimated / traced - 1) < 0.15, (k, estimated, traced)


def test_fewest_layers_keep_the_plan_under_the_budget_with_the_same_micro_batches():
    from dataclasses import replace

    from lora_gui.config import apply_overrides
    from lora_gui.memory.predict.run import fewest_checkpointed_layers, predict
    from lora_gui.presets import load_config

    cfg = apply_overrides(load_config("text-demo", {}), {"gradient_checkpointing": True, "precision": "fp32",
                                                         "batch_choice": "largest"})  # every layer kept
    budget = 100_000_000
    now = predict(cfg, budget, "cpu")
    n, pred = fewest_checkpointed_layers(cfg, budget, "cpu", now=now)
    assert pred.peak_bytes <= budget and pred.bucket_batches == now.bucket_batches and n < 4
    one_fewer = predict(replace(cfg, checkpoint_layers=n - 1), budget, "cpu") if n > 1 else None
    assert one_fewer is None or one_fewer.peak_bytes > budget \
        or one_fewer.bucket_batches != now.bucket_batches
    assert fewest_checkpointed_layers(replace(cfg, gradient_checkpointing=False), budget, "cpu") is None
