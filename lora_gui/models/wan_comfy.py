"""A Wan LoRA in ComfyUI's key names (``export_kohya`` on a Wan video run).

ComfyUI loads a Wan model with the original Wan code's layer names (``blocks.N.self_attn.q``,
``cross_attn.o``, ``ffn.0``...) under ``diffusion_model.``, and its LoRA loader maps every
``diffusion_model.<layer>`` to that layer, reading ``<layer>.lora_down.weight``,
``<layer>.lora_up.weight`` and the scalar ``<layer>.alpha`` (scale ``alpha / rank``), the layout
musubi-tuner and the Wan LoRAs users share are in. diffusers reads the same file
(``WanPipeline.load_lora_weights`` converts it back with its
``_convert_non_diffusers_wan_lora_to_diffusers``): the inverse of the map below.
"""

from __future__ import annotations

from typing import Any

import torch

from lora_gui.errors import UserError

READERS = ("ComfyUI (LoraLoader on a Wan 2.1 / 2.2 model: diffusion_model.blocks.N.self_attn.q... with "
           "lora_down / lora_up / alpha), diffusers WanPipeline.load_lora_weights")
PREFIX = "diffusion_model."
# diffusers' WanTransformer3DModel module -> the original Wan layer ComfyUI's model holds
ATTENTIONS = {"attn1": "self_attn", "attn2": "cross_attn"}
PROJECTIONS = {"to_q": "q", "to_k": "k", "to_v": "v", "to_out.0": "o", "add_k_proj": "k_img",
               "add_v_proj": "v_img"}
FEED_FORWARD = {"ffn.net.0.proj": "ffn.0", "ffn.net.2": "ffn.2"}
HALVES = {"lora_A.weight": "lora_down.weight", "lora_B.weight": "lora_up.weight"}


class WanExportError(UserError, ValueError):
    """A layer of the adapter has no name in ComfyUI's Wan layout; the message names it."""


def comfy_layer(module: str) -> str:
    """``blocks.3.attn1.to_q`` -> ``blocks.3.self_attn.q`` (the original Wan layer's name).

    Raises:
        WanExportError: a module outside the attention projections and feed-forward of a block.
    """
    parts = module.split(".")
    if len(parts) >= 4 and parts[0] == "blocks" and parts[1].isdigit():
        block, rest = f"blocks.{parts[1]}", ".".join(parts[2:])
        head, _, proj = rest.partition(".")
        if head in ATTENTIONS and proj in PROJECTIONS:
            return f"{block}.{ATTENTIONS[head]}.{PROJECTIONS[proj]}"
        if rest in FEED_FORWARD:
            return f"{block}.{FEED_FORWARD[rest]}"
    raise WanExportError(f"lora_targets: {module} has no name in ComfyUI's Wan layout (the attention "
                         "projections and feed-forward layers of the blocks have); export_kohya cannot "
                         "write it")


def comfy_wan_state_dict(peft_state: dict[str, torch.Tensor], alpha: float) -> dict[str, torch.Tensor]:
    """A Wan transformer's peft LoRA state (``blocks.0.attn1.to_q.lora_A.weight``...) in ComfyUI's
    names: down / up weights as they are (float32) and each layer's alpha as a scalar tensor.

    Raises:
        WanExportError: a tensor that is not a plain LoRA's A or B (DoRA, LoHa, LoKr), or a layer
            ComfyUI's Wan layout does not have.
    """
    out: dict[str, torch.Tensor] = {}
    for key, tensor in sorted(peft_state.items()):
        half = next((h for h in HALVES if key.endswith("." + h)), None)
        if half is None:
            raise WanExportError(f"export_kohya: {key} is not a LoRA A / B weight; ComfyUI's Wan layout "
                                 "is written for plain LoRA adapters")
        layer = PREFIX + comfy_layer(key[: -len(half) - 1])
        out[f"{layer}.{HALVES[half]}"] = tensor.detach().float().cpu().clone()  # its own copy
        out[f"{layer}.alpha"] = torch.tensor(float(alpha))
    if not out:
        raise WanExportError("export_kohya: the adapter holds no LoRA weights to write")
    return out


def check_exportable(transformer: Any, adapter: str) -> None:
    """Refuses, before a run starts, an adapter this layout cannot hold: not a plain LoRA, or on a
    layer with no ComfyUI name.

    Raises:
        WanExportError: naming the adapter kind or the layer.
    """
    if adapter != "lora":
        raise WanExportError(f"export_kohya: ComfyUI's Wan layout is written for plain LoRA adapters, "
                             f"not {adapter}; turn export_kohya off or train a LoRA")
    for name, module in transformer.named_modules():
        if hasattr(module, "lora_A"):
            comfy_layer(name)
