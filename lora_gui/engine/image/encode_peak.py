"""The image run's encoding pass: what is on the device while pictures and captions are encoded.

With a latent cache on a GPU the denoiser (UNet / transformer with its LoRA) joins the device
only after the caching pass, so that pass holds just the VAE and the text encoders: for Flux.1
that keeps the 12B transformer (about 24 GB in bf16) off the card while the T5 encoder (about
9.5 GB) runs. On a CPU the host is the device and everything is in the same memory anyway;
without a cache every step encodes, so the denoiser is there too.
"""

from __future__ import annotations

import torch

from lora_gui.config import RunConfig
from lora_gui.memory.predict.encode_trace import denoiser_waits_for_cache


def encoding_pass_bytes(cfg: RunConfig, model, buckets: list[tuple[int, int]], device: torch.device,
                        held: int = 0, optimizer_bytes: int = 0) -> int:
    """Predicted peak of the encoding pass (source: predicted): the weights on the device at that
    time, ``held`` bytes the run keeps there (a CPU run's cached inputs), the traced transient of
    encoding the largest picture of ``buckets`` ((width, height) px) or the held-out square, and
    the CUDA overheads the step's trace also adds. With ``cache_latents=off`` every step encodes
    its batch while the optimizer state (``optimizer_bytes``, from the step's trace) is alive."""
    from lora_gui.memory.predict.encode_trace import module_bytes, trace_encode_peak
    from lora_gui.memory.predict.trace import CUBLAS_WORKSPACE_BYTES, CUDA_CONTEXT_BYTES

    modules = [model.vae, *model.text_encoders]
    if not denoiser_waits_for_cache(cfg.resolved_cache_latents(), device.type):
        modules.insert(0, model.unet)
    pictures = [*set(buckets), (cfg.resolution, cfg.resolution)]
    encoding = module_bytes(modules) + held + trace_encode_peak(model, pictures, device)
    if cfg.resolved_cache_latents() == "off":
        encoding += optimizer_bytes
    if device.type == "cuda":
        encoding += CUDA_CONTEXT_BYTES + CUBLAS_WORKSPACE_BYTES
    return encoding
