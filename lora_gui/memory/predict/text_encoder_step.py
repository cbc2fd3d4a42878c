"""Peak bytes of training SD 1.x / SDXL text encoders' LoRA (``train_text_encoder``), traced on
fake tensors (source: predicted). The LoRA itself is :mod:`lora_gui.models.text_encoder_lora`."""

from __future__ import annotations

import torch

from lora_gui.config import RunConfig
from lora_gui.memory.predict.trace import attach_lora
from lora_gui.memory.predict.trace_step import trace_step
from lora_gui.models.text_encoder_lora import TEXT_ENCODER_LORA_TARGETS, trains


def training_bytes(model, cfg: RunConfig, batch_size: int, dtype: torch.dtype, device: str) -> int:
    """Extra peak bytes of training the encoders' LoRA (0 when off): a fake-tensor trace of each
    encoder's LoRA step (77 tokens x ``batch_size``) less its frozen weights, which the plan
    already counts as resident."""
    if not trains(model):
        return 0
    return encoders_training_bytes(model.text_encoders, cfg, batch_size, dtype, device)


def encoders_training_bytes(encoders: list, cfg: RunConfig, batch_size: int, dtype: torch.dtype,
                            device: str) -> int:
    """:func:`training_bytes` of CLIP text encoders given as modules (loaded, or built on the
    meta device from their configs: only ``type(encoder)`` and ``encoder.config`` are read)."""
    total = 0
    for encoder in encoders:
        with torch.device("meta"):
            meta = type(encoder)(encoder.config)
        torch.nn.Module.to(meta, dtype)
        peft = attach_lora(meta, cfg.lora_rank, cfg.lora_alpha, TEXT_ENCODER_LORA_TARGETS, cfg.lora_dropout)
        vocab = encoder.config.vocab_size

        def make_inputs(vocab=vocab) -> dict:
            return {"input_ids": torch.randint(0, vocab, (batch_size, 77))}

        def loss_fn(m, batch, _tracker) -> torch.Tensor:
            out = m(input_ids=batch["input_ids"], output_hidden_states=True)
            return out.hidden_states[-2].float().mean()

        res = trace_step(peft, fake=True, device=device, make_inputs=make_inputs, loss_fn=loss_fn, head=None,
                          gradient_checkpointing=False, warm_steps=0)
        total += res.traced_peak_bytes - res.breakdown["frozen_weights"]
    return total
