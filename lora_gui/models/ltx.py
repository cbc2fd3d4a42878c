"""LTX-Video (``LTXPipeline``: ``LTXVideoTransformer3DModel``, ``AutoencoderKLLTXVideo``, a T5
text encoder) as a video run trains it: what differs from Wan in the flow-matching step.

The recipe is finetrainers' LTX-Video LoRA (``ltx_video`` model specification) and what
``LTXPipeline`` undoes when it decodes:

- latents: the VAE's latent sample normalised per channel with the VAE's ``latents_mean`` /
  ``latents_std`` buffers, ``(x - mean) * scaling_factor / std`` (``LTXPipeline._normalize_latents``);
- the transformer reads packed tokens ``(B, T/pt * h/p * w/p, C * pt * p * p)``
  (``LTXPipeline._pack_latents``), the prompt's T5 states with their attention mask (padding
  masked in cross-attention, as the pipeline passes it), the timestep ``sigma * 1000`` and the
  rotary positions scaled by ``(temporal factor / frame rate, spatial factor, spatial factor)``
  at the pipeline's default 25 frames a second;
- noisy input ``(1 - sigma) * x0 + sigma * noise``, target ``noise - x0``, the weighting scheme's
  MSE (logit-normal timestep draws by default, as finetrainers' LTX-Video example trains).

Clips are ``8k + 1`` frames for the published VAE (the first frame alone, then 8 frames a latent
frame) and multiples of 32 px a side (32x spatial compression, patch 1).
"""

from __future__ import annotations

from typing import Any

import torch

from lora_gui.data.video_batches import VideoGeometry

FRAME_RATE = 25  # frames a second: LTXPipeline's default frame_rate, the rotary scale's time unit
DEFAULT_TEXT_LENGTH = 128  # LTXPipeline's max_sequence_length default (T5 tokens)
DEFAULT_WEIGHTING = "logit_normal"  # finetrainers' LTX-Video example (--flow_weighting_scheme)


def vae_factors(vae_config: dict[str, Any]) -> tuple[int, int]:
    """(temporal, spatial) compression of an ``AutoencoderKLLTXVideo`` config, computed as the
    class computes them when the config does not state them: patch x 2^(scaling stages)."""
    scaling = vae_config.get("spatio_temporal_scaling", (True, True, True, False))
    stages = 2 ** sum(bool(s) for s in scaling)
    temporal = vae_config.get("temporal_compression_ratio") or int(vae_config.get("patch_size_t", 1)) * stages
    spatial = vae_config.get("spatial_compression_ratio") or int(vae_config.get("patch_size", 4)) * stages
    return int(temporal), int(spatial)


def geometry_of(vae_config: dict[str, Any], transformer_config: dict[str, Any]) -> VideoGeometry:
    """How an LTX-Video pipeline turns clips into tokens, from its VAE and transformer configs."""
    temporal, spatial = vae_factors(vae_config)
    return VideoGeometry(temporal=temporal, spatial=spatial,
                         patch=int(transformer_config.get("patch_size", 1)),
                         patch_t=int(transformer_config.get("patch_size_t", 1)))


def latent_channels(transformer_config: dict[str, Any]) -> int:
    """The VAE's latent channels the transformer reads: its input width over the packed patch."""
    p, pt = int(transformer_config.get("patch_size", 1)), int(transformer_config.get("patch_size_t", 1))
    return int(transformer_config.get("in_channels", 128)) // (p * p * pt)


def rope_scale(geometry: VideoGeometry, frame_rate: float = FRAME_RATE) -> tuple[float, float, float]:
    """The rotary positions' scale: latent frame duration in seconds, px per latent pixel (x2)."""
    return geometry.temporal / frame_rate, float(geometry.spatial), float(geometry.spatial)


def normalise_latents(vae: Any, latents: torch.Tensor) -> torch.Tensor:
    """(B, C, T, h, w) VAE latents -> the transformer's space (``LTXPipeline._normalize_latents``)."""
    from diffusers import LTXPipeline

    return LTXPipeline._normalize_latents(latents, vae.latents_mean, vae.latents_std,
                                          float(vae.config.scaling_factor))


@torch.no_grad()
def encode_prompts(pipe: Any, captions: list[str], device: torch.device,
                   text_length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompt embeddings (B, text_length, D) and their attention mask (B, text_length), 1.0 on
    the prompt's tokens, through the pipeline's own ``encode_prompt``."""
    embeds, mask, _negative, _negative_mask = pipe.encode_prompt(
        prompt=captions, do_classifier_free_guidance=False, max_sequence_length=text_length, device=device)
    return embeds, mask.to(torch.float32)


def predict_velocity(transformer: Any, noisy: torch.Tensor, timesteps: torch.Tensor, hidden: torch.Tensor,
                     text_mask: torch.Tensor | None, scale: tuple[float, float, float]) -> torch.Tensor:
    """The transformer's prediction for (B, C, T, h, w) noisy latents, unpacked to their shape:
    packs them into tokens, passes the token grid and the rotary scale, unpacks the output."""
    from diffusers import LTXPipeline

    base = transformer.get_base_model() if hasattr(transformer, "get_base_model") else transformer
    p, pt = int(base.config.patch_size), int(base.config.patch_size_t)
    _, _, t, h, w = noisy.shape
    packed = LTXPipeline._pack_latents(noisy, p, pt).to(hidden.dtype)
    grid = (t // pt, h // p, w // p)
    pred = transformer(hidden_states=packed, encoder_hidden_states=hidden, timestep=timesteps,
                       encoder_attention_mask=text_mask, num_frames=grid[0], height=grid[1], width=grid[2],
                       rope_interpolation_scale=scale, return_dict=False)[0]
    return LTXPipeline._unpack_latents(pred, *grid, p, pt)
