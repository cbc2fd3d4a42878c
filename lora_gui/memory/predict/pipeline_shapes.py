"""Shapes of an image pipeline's VAE and text encoders, read from its folder's config files
(built on the meta device: no weights are read), for the planner and the run's prediction."""

from __future__ import annotations

from pathlib import Path

import torch


def pipeline_sizes(source: str, dtype: torch.dtype) -> tuple[int, int]:
    """(tokenizer length, parameter bytes of VAE (fp32) and text encoders (``dtype``)) of a
    local pipeline folder, from its configs on the meta device: nothing is read into memory."""
    import json

    from accelerate import init_empty_weights
    from diffusers import AutoencoderKL

    root = config_folder(source)
    tokenizer = json.loads((root / "tokenizer" / "tokenizer_config.json").read_text(encoding="utf-8"))
    with init_empty_weights():
        vae = AutoencoderKL.from_config(AutoencoderKL.load_config(root / "vae"))
    encoders = pipeline_text_encoders(source)
    size = torch.tensor([], dtype=dtype).element_size()
    resident = sum(p.numel() * 4 for p in vae.parameters())  # the VAE stays fp32 (overflows in fp16)
    resident += sum(p.numel() * size for m in encoders for p in m.parameters())
    return int(tokenizer.get("model_max_length", 77)), resident


def config_folder(source: str) -> Path:
    """A local pipeline folder, or the Hub repository's config files (no weights)."""
    root = Path(source)
    if not root.is_dir():
        from huggingface_hub import snapshot_download

        root = Path(snapshot_download(source, allow_patterns=["*.json", "*.txt"]))
    return root


def pipeline_text_encoders(source: str) -> list[torch.nn.Module]:
    """The SD 1.x / SDXL pipeline's CLIP text encoders built on the meta device from their configs."""
    from accelerate import init_empty_weights
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    root = config_folder(source)
    with init_empty_weights():
        encoders = [CLIPTextModel(CLIPTextConfig.from_pretrained(root / "text_encoder"))]
        if (root / "text_encoder_2").is_dir():
            second = CLIPTextConfig.from_pretrained(root / "text_encoder_2")
            encoders.append(CLIPTextModelWithProjection(second))
    return encoders
