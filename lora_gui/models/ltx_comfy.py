"""An LTX-Video LoRA in ComfyUI's key names (``export_kohya`` on an LTX-Video run).

ComfyUI's LTX-Video model (``comfy/ldm/lightricks``) names its blocks as diffusers'
``LTXVideoTransformer3DModel`` does (``transformer_blocks.N.attn1.to_q``, ``attn2.to_out.0``,
``ff.net.0.proj``, ``ff.net.2``), and its LoRA loader maps every ``diffusion_model.<layer>`` to
that layer, reading ``<layer>.lora_B.weight`` (up) and ``<layer>.lora_A.weight`` (down): the
layout LTX-Video-Trainer writes for ComfyUI. Such a file carries no ``alpha``: ComfyUI then
scales the delta by 1 and diffusers (``LTXPipeline.load_lora_weights``, which strips the
``diffusion_model.`` prefix with its ``_convert_non_diffusers_ltxv_lora_to_diffusers``) sets
``lora_alpha`` to the rank, also a scale of 1. So the run's scale (``lora_alpha / lora_rank``,
``lora_alpha / sqrt(rank)`` for rank-stabilised LoRA) is folded into ``lora_B``: both readers add
the delta the run trained. Outside the blocks ComfyUI's names differ from diffusers'
(``patchify_proj`` for ``proj_in``, ``adaln_single`` for ``time_embed``), so only block layers
are written; any other is refused by name before the run starts.
"""

from __future__ import annotations

import re
from typing import Any

import torch

from lora_gui.errors import UserError

READERS = ("ComfyUI (LoraLoader on an LTX-Video model: diffusion_model.transformer_blocks.N.attn1.to_q... "
           "with lora_A / lora_B, the scale folded in), diffusers LTXPipeline.load_lora_weights")
PREFIX = "diffusion_model."
# a block layer ComfyUI's LTX-Video model holds under the same name as diffusers'
BLOCK_LAYER = re.compile(r"transformer_blocks\.\d+\."
                         r"(attn[12]\.(to_q|to_k|to_v|to_out\.0)|ff\.net\.(0\.proj|2))")
HALVES = ("lora_A.weight", "lora_B.weight")


class LtxExportError(UserError, ValueError):
    """A layer of the adapter has no name in ComfyUI's LTX-Video layout; the message names it."""


def comfy_layer(module: str) -> str:
    """``transformer_blocks.3.attn1.to_q`` -> itself (ComfyUI's layer of that name).

    Raises:
        LtxExportError: a module outside the attention projections and feed-forward of a block.
    """
    if BLOCK_LAYER.fullmatch(module):
        return module
    raise LtxExportError(f"lora_targets: {module} has no name in ComfyUI's LTX-Video layout (the attention "
                         "projections and feed-forward layers of the blocks have); export_kohya cannot "
                         "write it")


def comfy_ltx_state_dict(peft_state: dict[str, torch.Tensor], scale: float) -> dict[str, torch.Tensor]:
    """An LTX-Video transformer's peft LoRA state (``transformer_blocks.0.attn1.to_q.lora_A.weight``...)
    in ComfyUI's names, float32, with ``scale`` (the run's LoRA scale) folded into each ``lora_B``.

    Raises:
        LtxExportError: a tensor that is not a plain LoRA's A or B (DoRA, LoHa, LoKr), or a layer
            ComfyUI's LTX-Video layout does not have.
    """
    out: dict[str, torch.Tensor] = {}
    for key, tensor in sorted(peft_state.items()):
        half = next((h for h in HALVES if key.endswith("." + h)), None)
        if half is None:
            raise LtxExportError(f"export_kohya: {key} is not a LoRA A / B weight; ComfyUI's LTX-Video "
                                 "layout is written for plain LoRA adapters")
        layer = PREFIX + comfy_layer(key[: -len(half) - 1])
        weight = tensor.detach().float().cpu().clone()  # its own copy
        out[f"{layer}.{half}"] = weight * scale if half == "lora_B.weight" else weight
    if not out:
        raise LtxExportError("export_kohya: the adapter holds no LoRA weights to write")
    return out


def lora_scale(config: Any) -> float:
    """The scale peft applies to a LoRA's delta: ``lora_alpha / r``, ``/ sqrt(r)`` when rank-stabilised.

    Raises:
        LtxExportError: per-layer ranks or alphas (one scale cannot be folded for every layer).
    """
    if getattr(config, "rank_pattern", None) or getattr(config, "alpha_pattern", None):
        raise LtxExportError("export_kohya: per-layer ranks or alphas cannot be written in ComfyUI's "
                             "LTX-Video layout; turn export_kohya off")
    rank = int(config.r)
    return float(config.lora_alpha) / (rank ** 0.5 if getattr(config, "use_rslora", False) else rank)


def check_exportable(transformer: Any, adapter: str) -> None:
    """Refuses, before a run starts, an adapter this layout cannot hold: not a plain LoRA, or on a
    layer with no ComfyUI name.

    Raises:
        LtxExportError: naming the adapter kind or the layer.
    """
    if adapter != "lora":
        raise LtxExportError(f"export_kohya: ComfyUI's LTX-Video layout is written for plain LoRA adapters, "
                             f"not {adapter}; turn export_kohya off or train a LoRA")
    for name, module in transformer.named_modules():
        if hasattr(module, "lora_A"):
            comfy_layer(name)
