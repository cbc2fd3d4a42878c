"""The fused LoRA forward: the same loss, gradients and tracked peak as peft's own forward, and
peft's forward wherever the fused path does not apply."""

import copy

import torch
from peft import LoraConfig, get_peft_model
from transformers import Qwen2Config, Qwen2ForCausalLM

from lora_gui.memory.runtime.tracker import StorageTracker
from lora_gui.models.lora_fused import fuse_lora


def _model(dropout: float = 0.0):
    config = Qwen2Config(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2)
    torch.manual_seed(0)
    model = get_peft_model(Qwen2ForCausalLM(config), LoraConfig(r=4, lora_alpha=8, lora_dropout=dropout,
                                                                 target_modules="all-linear"))
    for name, p in model.named_parameters():
        if "lora_B" in name:  # B starts at zero: give it values so the adapter's path counts
            torch.nn.init.normal_(p, std=0.1)
    return model


def _step(model, ids):
    model.zero_grad(set_to_none=True)
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    return loss.item(), {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}


def test_fused_matches_peft_forward_and_its_peak():
    plain = _model()
    fused = copy.deepcopy(plain)
    assert fuse_lora(fused) == 2 * 7  # every projection of both layers
    ids = torch.randint(0, 128, (2, 24))
    loss_p, grads_p = _step(plain, ids)
    loss_f, grads_f = _step(fused, ids)
    assert abs(loss_p - loss_f) < 1e-5
    for name, g in grads_p.items():
        torch.testing.assert_close(grads_f[name], g, rtol=1e-4, atol=1e-6)
    peaks = []
    for model in (plain, fused):
        tracker = StorageTracker()
        tracker.track(list(model.parameters()) + [p.grad for p in model.parameters() if p.grad is not None])
        with tracker:
            _step(model, ids)
        peaks.append(tracker.peak_bytes)
    assert peaks[1] <= peaks[0]  # no tensor more than peft's path (the plan's figure holds)


def test_dropout_and_disabled_adapters_keep_peft_forward():
    model = _model(dropout=0.5)
    fuse_lora(model)
    model.eval()  # dropout inactive but still a Dropout module: peft's path, same output as unfused
    ids = torch.randint(0, 128, (1, 8))
    reference = copy.deepcopy(model)
    for m in reference.modules():
        m.__dict__.pop("forward", None)  # back to the class's forward
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=ids).logits, reference(input_ids=ids).logits)
        with model.disable_adapter():
            base = model(input_ids=ids).logits
        with reference.disable_adapter():
            torch.testing.assert_close(base, reference(input_ids=ids).logits)


def test_fused_under_cpu_autocast_with_lean_layers_keeps_no_more_than_peft():
    """A CPU run in bf16 keeps float32 weights, so q, k and v (and gate and up) read a float32
    input that autocast casts for each adapter; lean_backward keeps one 16-bit copy for all of
    them. The fused forward wrapped by the lean layers (the engine's order) keeps the same: it
    casts A's input as peft does (it used to cast inside its own matmul, one copy per adapter:
    6 MiB above the plan on the built-in model at 1,024 tokens)."""
    from lora_gui.models.lean_backward import lean_frozen_layers

    plain = _model()
    fused = copy.deepcopy(plain)
    fuse_lora(fused)
    for model in (plain, fused):
        lean_frozen_layers(model)
    ids = torch.randint(0, 128, (2, 64))
    peaks, results = [], []
    for model in (plain, fused):
        tracker = StorageTracker()
        tracker.track(list(model.parameters()))
        with tracker, torch.autocast("cpu", dtype=torch.bfloat16):
            results.append(_step(model, ids))
        peaks.append(tracker.peak_bytes)
    assert peaks[1] <= peaks[0], peaks
    assert abs(results[0][0] - results[1][0]) < 2e-2  # bf16 rounding differs in the summation order
