"""Text-encoder LoRA for SD 1.x / SDXL (``train_text_encoder``, its own ``text_encoder_lr``).

As diffusers' ``train_dreambooth_lora_sdxl.py`` / ``train_text_to_image_lora_sdxl.py`` do: LoRA
on the CLIP encoders' attention projections (q_proj, k_proj, v_proj, out_proj) with the run's
rank and alpha, captions encoded every step with gradients (so the embeddings cannot be cached:
``cache_latents`` must be ``off``), one optimizer with a second parameter group at
``text_encoder_lr``, and the adapter saved with the pipeline's ``save_lora_weights``
(``text_encoder`` / ``text_encoder_2`` keys) so ``pipe.load_lora_weights`` loads all of it.

Costs: the text encoders stay on the device (their weights), their LoRA weights, gradients and
AdamW state, and their activations kept for backward (a 77-token CLIP forward per image). The
memory plan adds :func:`lora_gui.memory.predict.text_encoder_step.training_bytes` (a fake-tensor
trace of the encoders' own LoRA step),
which over-counts slightly (the two peaks do not coincide): err high. Checkpoints keep the
encoders' LoRA in ``text_encoder_lora.safetensors`` next to the UNet's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from peft import LoraConfig, get_peft_model_state_dict, set_peft_model_state_dict
from safetensors.torch import load_file, save_file

from lora_gui.config import ConfigError, RunConfig

TEXT_ENCODER_LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "out_proj"]
CHECKPOINT_FILE = "text_encoder_lora.safetensors"
PREFIXES = ("text_encoder", "text_encoder_2")  # diffusers' names of the first and second encoder


def check(cfg: RunConfig, kind: str) -> None:
    """Refuses the combinations text-encoder LoRA cannot run with.

    Raises:
        ConfigError: a DiT model, or cached text embeddings.
    """
    if not cfg.train_text_encoder:
        return
    if kind not in ("sd", "sdxl"):
        raise ConfigError(f"train_text_encoder: supported for SD 1.x / SDXL pipelines, not {kind}")
    if cfg.resolved_cache_latents() != "off":
        raise ConfigError("train_text_encoder: the text embeddings change while the encoder trains, so "
                          "they cannot be cached; set cache_latents=off")


def attach(model, cfg: RunConfig) -> None:
    """Adds a trainable LoRA adapter to each CLIP text encoder (no-op unless train_text_encoder)."""
    check(cfg, model.kind)
    if not cfg.train_text_encoder:
        return
    for encoder in model.text_encoders:
        encoder.add_adapter(LoraConfig(r=cfg.lora_rank, lora_alpha=cfg.lora_alpha,
                                       lora_dropout=cfg.lora_dropout, init_lora_weights="gaussian",
                                       target_modules=TEXT_ENCODER_LORA_TARGETS))
        for p in encoder.parameters():
            if p.requires_grad:
                p.data = p.data.float()
        encoder.train()
    model.info["train_text_encoder"] = True


def trains(model) -> bool:
    """True when the run trains the text encoders' LoRA."""
    return bool(model.info.get("train_text_encoder"))


def param_groups(model, cfg: RunConfig) -> list:
    """The optimizer's parameters: the UNet's LoRA (at ``lr``) and, when trained, the text
    encoders' LoRA at ``text_encoder_lr`` (a plain list when only the UNet trains)."""
    unet = [p for p in model.unet.parameters() if p.requires_grad]
    if not trains(model):
        return unet
    text = [p for e in model.text_encoders for p in e.parameters() if p.requires_grad]
    return [{"params": unet, "lr": cfg.lr}, {"params": text, "lr": cfg.text_encoder_lr}]


def lora_layers(model) -> dict[str, dict[str, torch.Tensor]]:
    """``{"text_encoder": peft state dict, "text_encoder_2": ...}`` of the trained encoders."""
    if not trains(model):
        return {}
    return {prefix: {k: v.detach().float().cpu().contiguous()
                     for k, v in get_peft_model_state_dict(e).items()}
            for prefix, e in zip(PREFIXES, model.text_encoders, strict=False)}


def save_kwargs(model) -> dict[str, Any]:
    """Keyword arguments of ``save_lora_weights`` for the encoders (diffusers keys + alpha metadata)."""
    from diffusers.utils import convert_state_dict_to_diffusers

    out: dict[str, Any] = {}
    for (prefix, layers), encoder in zip(lora_layers(model).items(), model.text_encoders, strict=False):
        out[f"{prefix}_lora_layers"] = convert_state_dict_to_diffusers(layers)
        out[f"{prefix}_lora_adapter_metadata"] = encoder.peft_config["default"].to_dict()
    return out


def save_checkpoint_part(folder: Path, model) -> None:
    """Writes the encoders' LoRA into a checkpoint folder (nothing when they do not train)."""
    layers = lora_layers(model)
    if layers:
        flat = {f"{prefix}.{k}": v for prefix, sd in layers.items() for k, v in sd.items()}
        save_file(flat, folder / CHECKPOINT_FILE)


def load_checkpoint_part(folder: Path | None, model) -> None:
    """Restores the encoders' LoRA from a checkpoint folder.

    Raises:
        ConfigError: the checkpoint has no text-encoder LoRA while this run trains one.
    """
    if folder is None or not trains(model):
        return
    path = folder / CHECKPOINT_FILE
    if not path.is_file():
        raise ConfigError(f"{folder}: this checkpoint has no text-encoder LoRA (train_text_encoder was off)")
    flat = load_file(path)
    for prefix, encoder in zip(PREFIXES, model.text_encoders, strict=False):
        own = {k[len(prefix) + 1:]: v for k, v in flat.items() if k.split(".", 1)[0] == prefix}
        set_peft_model_state_dict(encoder, own)
