"""The real side of the quantized-trace check: a model loaded the way the engine loads it
(transformers' BitsAndBytesConfig, LoRA through lora_gui.models.text) runs one steady-state step
on real CPU tensors, counted by the StorageTracker (source: tracker).

Used by bench/memory/trace_accuracy.py and tests/memory/test_quant_trace.py.
"""

from __future__ import annotations

import tempfile
from typing import Any

import torch

from lora_gui.config import RunConfig, apply_overrides
from lora_gui.memory.runtime.tracker import StorageTracker


def save_random_model(config: Any, folder: str, dtype: torch.dtype = torch.float32) -> None:
    """A causal LM with random weights from ``config``, saved with save_pretrained (``dtype``:
    bfloat16 halves what an 8B model writes)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config, dtype=dtype).save_pretrained(folder)


def engine_step_peak(config: Any, *, quantization: str, batch_size: int, seq_len: int,
                     gradient_checkpointing: bool, lora_rank: int = 16, optimizer: str = "adamw",
                     attn: str = "sdpa", dtype: torch.dtype = torch.float32,
                     peft_prepare: bool = False) -> int:
    """Peak live bytes (source: tracker) of the second training step of the engine's quantized
    model on CPU (``dtype`` compute, float32 by default): weights, quantization state, LoRA,
    optimizer state and the step's activations and temporaries. ``peft_prepare``: run peft's
    ``prepare_model_for_kbit_training`` before LoRA is attached (what most QLoRA scripts do)."""
    from lora_gui.engine.core.optim import make_optimizer
    from lora_gui.models import text as text_models
    from lora_gui.models.checkpointing import enable_checkpointing
    from lora_gui.models.quant import quant_state_tensors

    cfg = apply_overrides(RunConfig(), {
        "quantization": quantization, "gradient_checkpointing": gradient_checkpointing,
        "lora_rank": lora_rank, "lora_alpha": float(lora_rank), "precision": "fp32",
        "optimizer": optimizer, "attn_backend": attn, "max_seq_len": max(seq_len, 16),
        "loss_chunk": 0})  # the full loss, as the trace it is compared with (loss_chunk=0)
    with tempfile.TemporaryDirectory() as folder:
        save_random_model(config, folder)
        base = text_models.load_model_for(cfg, folder, dtype)
        if peft_prepare:
            from peft import prepare_model_for_kbit_training

            base = prepare_model_for_kbit_training(base, use_gradient_checkpointing=False)
        model = text_models.attach_lora(base, cfg)
    if gradient_checkpointing:
        enable_checkpointing(model)
    model.train()
    trainable = [p for p in model.parameters() if p.requires_grad]
    opt, _ = make_optimizer(cfg, trainable, torch.device("cpu"))
    if optimizer == "adamw":  # the trace's AdamW runs its per-parameter loop, as torch does on CPU
        opt = torch.optim.AdamW(trainable, lr=1e-3, foreach=False)
    ids = torch.randint(0, config.vocab_size, (batch_size, seq_len))

    def step() -> None:
        model(input_ids=ids, labels=ids, use_cache=False).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()  # the first step creates the optimizer state
    tracker = StorageTracker()
    tracker.track(list(model.parameters()) + list(model.buffers()) + quant_state_tensors(model)
                  + [t for s in opt.state.values() for t in s.values() if torch.is_tensor(t)]
                  + [ids])
    with tracker:
        tracker.reset_peak()
        step()
    return tracker.peak_bytes
