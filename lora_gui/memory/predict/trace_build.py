"""The model a trace runs: the real architecture built from its config on the meta device, the
run's adapter attached with peft, and meta tensors replaced by fake (or random) ones. Used by
:mod:`lora_gui.memory.predict.trace` and the image traces beside it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from lora_gui.attention.documents import enable_document_attention
from lora_gui.memory.predict.adapter_trace import quantized_dora
from lora_gui.memory.predict.model_configs import ModelConfig


def as_dtype(dtype: torch.dtype | str) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    names = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
             "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}
    if dtype not in names:
        raise ValueError(f"dtype must be one of {sorted(names)}, got {dtype!r}")
    return names[dtype]


def attach_lora(model: nn.Module, rank: int, alpha: float | None, targets: Any, dropout: float,
                 new_token_ids: list[int] | None = None, adapter: Any = None,
                 lean_backward: bool = False) -> nn.Module:
    """The run's adapter (``adapter``: a :class:`lora_gui.models.adapters.AdapterSpec`; None:
    plain LoRA) through the engine's own builder, with the rank, alpha and dropout given here;
    ``lean_backward``: then the layers an optimized run makes lean
    (:func:`lora_gui.models.lean_backward.lean_frozen_layers`), as the engine does after its adapter."""
    import dataclasses

    from lora_gui.models.adapters import AdapterSpec, attach_adapter

    if rank < 1:
        raise ValueError(f"lora rank must be >= 1, got {rank}")
    tokens = None
    if new_token_ids:  # chat-template tokens added to the vocabulary: their rows train (as the engine)
        from lora_gui.models.text import trainable_token_targets

        tokens = trainable_token_targets(model, new_token_ids)
    spec = dataclasses.replace((adapter or AdapterSpec()).for_trace(), rank=rank,
                               alpha=alpha if alpha is not None else rank, dropout=dropout)
    with quantized_dora():
        model = attach_adapter(model, spec, targets, tokens=tokens)
    if lean_backward:
        from lora_gui.models.lean_backward import lean_frozen_layers

        lean_frozen_layers(model)
    return model


def materialize(model: nn.Module, make: Callable[[torch.Tensor], torch.Tensor]) -> None:
    """Replaces every meta parameter and buffer by ``make(meta)``, keeping tied weights tied."""
    done: dict[int, torch.Tensor] = {}
    for module in model.modules():
        for name, p in list(module._parameters.items()):
            if p is None:
                continue
            if id(p) not in done:
                done[id(p)] = nn.Parameter(make(p), requires_grad=p.requires_grad)
            module._parameters[name] = done[id(p)]
        for name, b in list(module._buffers.items()):
            if b is not None:
                if id(b) not in done:
                    done[id(b)] = make(b)
                module._buffers[name] = done[id(b)]


def build_text_model(config: ModelConfig, *, attn_implementation: str, dtype: torch.dtype,
                     lora_rank: int, lora_alpha: float | None, target_modules: Any,
                     lora_dropout: float = 0.0, loss_chunk: int = 0, lora: bool = True,
                     new_token_ids: list[int] | None = None, adapter: Any = None,
                     lean_backward: bool = False) -> nn.Module:
    """Builds a causal LM from its config on the meta device and attaches LoRA (still meta);
    ``loss_chunk`` > 0 switches on the chunked loss as the engine does; ``lora=False`` leaves
    LoRA to be attached later (after quantization, :mod:`lora_gui.memory.predict.quant`);
    ``lean_backward`` as :func:`attach_lora`."""
    from transformers import AutoModelForCausalLM

    if attn_implementation not in ("eager", "sdpa", "windowed"):
        raise ValueError(f"attn_implementation must be 'eager', 'sdpa' or 'windowed', "
                         f"got {attn_implementation!r}")
    if attn_implementation == "windowed":  # W and G come from the config (configure_windowed)
        from lora_gui.attention import register_windowed_attention

        register_windowed_attention()
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, attn_implementation=attn_implementation, dtype=dtype)
    if loss_chunk:
        from lora_gui.models.chunked_loss import enable_chunked_loss

        enable_chunked_loss(model, loss_chunk)
    enable_document_attention(model)  # as the engine's models (lora_gui.models.text)
    if not lora:
        return model
    return attach_lora(model, lora_rank, lora_alpha, target_modules, lora_dropout, new_token_ids, adapter,
                       lean_backward)


def build_unet(config: ModelConfig, *, dtype: torch.dtype, lora_rank: int, lora_alpha: float | None,
               target_modules: Any, lora_dropout: float = 0.0, adapter: Any = None,
               lean_backward: bool = True) -> nn.Module:
    """Builds a diffusers UNet2DConditionModel on the meta device and attaches the adapter (still
    meta); ``lean_backward``: the run's frozen layers that keep only what their backward reads
    (:mod:`lora_gui.models.lean_backward`)."""
    from diffusers import UNet2DConditionModel

    drop = ("architectures", "model_type")  # our preset labels, not UNet arguments
    cfg = {k: v for k, v in dict(config).items() if not k.startswith("_") and k not in drop}
    with torch.device("meta"):
        unet = UNet2DConditionModel.from_config(cfg)
    nn.Module.to(unet, dtype)  # plain cast (diffusers' .to() warns about fp32 modules it has none of)
    unet.train()
    return attach_lora(unet, lora_rank, lora_alpha, target_modules, lora_dropout, adapter=adapter,
                       lean_backward=lean_backward)


