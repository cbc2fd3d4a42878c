"""The kohya-layout file of a DiT run (SD3, Flux.1): which key layout each adapter gets, and the
Flux.1 conversion from diffusers' module names to Black Forest Labs' (the names kohya's
sd-scripts write and ComfyUI / Forge map).

- Flux.1, plain LoRA: kohya sd-scripts' layout (``networks/lora_flux.py``): ``lora_unet_`` + the
  BFL module path with ``_`` for ``.``, ``.lora_down.weight`` / ``.lora_up.weight`` / ``.alpha``.
  BFL fuses layers that diffusers keeps apart: ``double_blocks.N.img_attn.qkv`` is
  ``transformer_blocks.N.attn.to_q / to_k / to_v`` stacked on the output axis,
  ``txt_attn.qkv`` the ``add_q / k / v_proj``, and ``single_blocks.N.linear1`` is
  ``single_transformer_blocks.N.attn.to_q / to_k / to_v`` and ``proj_mlp``. A fused layer's
  LoRA is exact: ``lora_down`` is the parts' A stacked (n r, in), ``lora_up`` is their B
  block-diagonal (sum of outputs, n r) with zero rows for a part that has no adapter, and its
  alpha is n x alpha, because the readers scale by alpha / rows of ``lora_down``. Readers map these
  names from the model's own weights (``lora_unet_`` + the BFL path): ComfyUI and Forge
  (``model_lora_keys_unet``), and diffusers' ``load_lora_weights`` converts them back
  (``_convert_kohya_flux_lora_to_diffusers``, written for Flux.1's real widths).
- SD3, and DoRA / LoHa / LoKr on Flux.1: OneTrainer's layout, ``lora_transformer_`` + the
  diffusers module path with ``_`` for ``.``, with the same LoRA / LyCORIS tensors as a UNet
  run's file (:func:`lora_gui.models.image_adapter.kohya_state_dict`). ComfyUI maps these names
  for SD3 and Flux.1 (``model_lora_keys_unet``); Forge and kohya's sd-scripts do not.
"""

from __future__ import annotations

import re

import torch

# diffusers module (inside a Flux block) -> (BFL module, part index, parts of the fused layer)
_DOUBLE = {
    "attn.to_q": ("img_attn.qkv", 0, 3), "attn.to_k": ("img_attn.qkv", 1, 3),
    "attn.to_v": ("img_attn.qkv", 2, 3), "attn.to_out.0": ("img_attn.proj", 0, 1),
    "attn.add_q_proj": ("txt_attn.qkv", 0, 3), "attn.add_k_proj": ("txt_attn.qkv", 1, 3),
    "attn.add_v_proj": ("txt_attn.qkv", 2, 3), "attn.to_add_out": ("txt_attn.proj", 0, 1),
    "ff.net.0.proj": ("img_mlp.0", 0, 1), "ff.net.2": ("img_mlp.2", 0, 1),
    "ff_context.net.0.proj": ("txt_mlp.0", 0, 1), "ff_context.net.2": ("txt_mlp.2", 0, 1),
    "norm1.linear": ("img_mod.lin", 0, 1), "norm1_context.linear": ("txt_mod.lin", 0, 1)}
_SINGLE = {
    "attn.to_q": ("linear1", 0, 4), "attn.to_k": ("linear1", 1, 4), "attn.to_v": ("linear1", 2, 4),
    "proj_mlp": ("linear1", 3, 4), "proj_out": ("linear2", 0, 1), "norm.linear": ("modulation.lin", 0, 1)}
_PART_NAMES = {("double", "img_attn.qkv"): ("attn.to_q", "attn.to_k", "attn.to_v"),
               ("double", "txt_attn.qkv"): ("attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj"),
               ("single", "linear1"): ("attn.to_q", "attn.to_k", "attn.to_v", "proj_mlp")}
_TOP = {"x_embedder": "img_in", "context_embedder": "txt_in", "proj_out": "final_layer.linear"}
_BLOCK = re.compile(r"^(transformer_blocks|single_transformer_blocks)\.(\d+)\.(.+)$")
_LORA = re.compile(r"\.(lora_A|lora_B)\.weight$")


def bfl_name(module: str) -> tuple[str, int, int] | None:
    """A diffusers Flux.1 module path -> (BFL module path, part index, parts), None if BFL has no
    plain counterpart (``norm_out.linear`` swaps its halves, the embedders are nested)."""
    if module in _TOP:
        return _TOP[module], 0, 1
    match = _BLOCK.match(module)
    if match is None:
        return None
    double = match.group(1) == "transformer_blocks"
    found = (_DOUBLE if double else _SINGLE).get(match.group(3))
    if found is None:
        return None
    return f"{'double_blocks' if double else 'single_blocks'}.{match.group(2)}.{found[0]}", found[1], found[2]


def unmapped_flux_modules(modules: list[str]) -> list[str]:
    """The adapted Flux.1 modules that have no place in the kohya layout."""
    return [m for m in modules if bfl_name(m) is None]


def _part_out(bfl: str, index: int, module: str, out_features: dict[str, int]) -> int:
    """Output rows of part ``index`` of a fused BFL layer, read from the diffusers model's layer
    (``module`` is another part of the same block)."""
    block = "single" if bfl.startswith("single_blocks") else "double"
    names = _PART_NAMES[(block, bfl.split(".", 2)[2])]
    return out_features[".".join(module.split(".")[:2]) + "." + names[index]]


def flux_kohya_state_dict(peft_state: dict[str, torch.Tensor], rank: int, alpha: float,
                          out_features: dict[str, int]) -> dict[str, torch.Tensor]:
    """kohya sd-scripts' Flux.1 layout of a plain-LoRA peft state dict (keys as
    ``get_peft_model_state_dict`` gives them); ``out_features`` maps each diffusers Linear's path to
    its output size (for the fused layers' rows). See the module docstring.

    Raises:
        ValueError: a tensor that is not LoRA's A or B, or a module with no BFL name (names it).
    """
    fused: dict[str, dict[int, tuple[str, dict[str, torch.Tensor]]]] = {}
    parts_of: dict[str, int] = {}
    for key, value in peft_state.items():
        match = _LORA.search(key)
        module = key[:match.start()] if match else key
        found = bfl_name(module) if match else None
        if found is None:
            raise ValueError(f"{key}: no place for it in kohya's Flux.1 layout (plain LoRA on the "
                             "transformer blocks, x_embedder, context_embedder and proj_out)")
        bfl, index, parts = found
        parts_of[bfl] = parts
        entry = fused.setdefault(bfl, {}).setdefault(index, (module, {}))
        entry[1][match.group(1)] = value.detach().float().cpu()
    out: dict[str, torch.Tensor] = {}
    for bfl, by_index in fused.items():
        name = "lora_unet_" + bfl.replace(".", "_")
        adapted = sorted(by_index)
        module = by_index[adapted[0]][0]
        rows = [by_index[i][1]["lora_B"].shape[0] if i in by_index
                else _part_out(bfl, i, module, out_features) for i in range(parts_of[bfl])]
        down = torch.cat([by_index[i][1]["lora_A"] for i in adapted])  # (n r, in)
        up = torch.zeros(sum(rows), len(adapted) * rank)  # block-diagonal B, zero rows for parts without one
        for slot, i in enumerate(adapted):
            start = sum(rows[:i])
            up[start:start + rows[i], slot * rank:(slot + 1) * rank] = by_index[i][1]["lora_B"]
        out[f"{name}.lora_down.weight"] = down.contiguous()
        out[f"{name}.lora_up.weight"] = up
        out[f"{name}.alpha"] = torch.tensor(float(alpha) * len(adapted))  # readers: alpha / (n r)
    return out


def layout(kind: str, adapter: str) -> str:
    """'sd-scripts' (Flux.1, plain LoRA) or 'onetrainer' (SD3; DoRA / LoHa / LoKr on Flux.1)."""
    return "sd-scripts" if kind == "flux" and adapter == "lora" else "onetrainer"
