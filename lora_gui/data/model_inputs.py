"""Model inputs of one training micro-batch: the collated tensors, minus what changes nothing.

Right-padded batches under full causal attention do not need their padding mask: every pad sits
after the last real token of its row, so causality already keeps real tokens from seeing pads,
and pads carry no loss (label -100), so nothing flows back from them. Without the mask SDPA runs
its causal kernel (flash attention, also on CPUs) instead of the masked math kernel, which on a
CPU keeps batch x heads x S x S float scores, their softmax and their gradient per layer
(8 rows x 4 heads x 1024^2 x 4 bytes = 128 MiB each). Same loss and gradients up to float
summation order; less memory and less time.

The mask stays where it matters: eager attention (the traditional baseline keeps its dense mask),
windowed or other custom attention, packed rows (document boundaries come from position ids) and
any batch that is not right-padded.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from lora_gui.data.batching import MicroBatch, collate
from lora_gui.data.text import TokenizedSample

CAUSAL_KERNEL_BACKENDS = ("sdpa",)  # attention implementations that take is_causal without a mask


def attention_implementation(model: torch.nn.Module) -> str | None:
    """The transformers attention implementation of a (wrapped) model, or None if unknown."""
    seen = model
    for _ in range(4):  # DDP / accelerate wrappers -> PeftModel -> the causal LM
        config = getattr(seen, "config", None)
        if config is not None and hasattr(config, "_attn_implementation"):
            return config._attn_implementation
        seen = getattr(seen, "module", None) or getattr(seen, "base_model", None)
        if seen is None:
            return None
    return None


def is_right_padding_mask(mask: torch.Tensor) -> bool:
    """True when every row of a (batch, seq) 0/1 mask is ones followed only by zeros."""
    return bool((mask[:, 1:] <= mask[:, :-1]).all())


def drop_redundant_padding_mask(batch: dict[str, torch.Tensor],
                                attn_implementation: str | None) -> dict[str, torch.Tensor]:
    """The batch without its attention mask when the mask changes no trained token (see module).

    Args:
        batch: collated tensors (input_ids, labels and attention_mask or position_ids).
        attn_implementation: the model's attention implementation ('sdpa', 'eager', ...).

    Returns:
        The same dict when the mask is needed, else a copy without ``attention_mask``.
    """
    mask = batch.get("attention_mask")
    if (mask is None or attn_implementation not in CAUSAL_KERNEL_BACKENDS
            or "position_ids" in batch or not is_right_padding_mask(mask)):
        return batch
    return {k: v for k, v in batch.items() if k != "attention_mask"}


def training_batch(model: torch.nn.Module, samples: Sequence[TokenizedSample],
                   micro_batch: MicroBatch, pad_id: int,
                   device: torch.device) -> dict[str, torch.Tensor]:
    """Collated tensors of one training micro-batch on ``device``, mask dropped where redundant."""
    batch = drop_redundant_padding_mask(collate(samples, micro_batch, pad_id),
                                        attention_implementation(model))
    return {k: v.to(device) for k, v in batch.items()}
