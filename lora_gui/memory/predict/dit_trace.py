"""Peak memory of one DiT (SD3 / Flux) LoRA training step: a fake-tensor trace and a
trace-calibrated estimate, beside :func:`lora_gui.memory.predict.trace.trace_unet_step`.

The step traced is the engine's own: :meth:`lora_gui.models.dit.FlowMatching.loss_at` (noisy
latents from cached latents and noise, Flux's 2 x 2 packing and position ids, the transformer,
the weighted flow-matching MSE), then backward, AdamW step and ``zero_grad`` through the shared
:func:`lora_gui.memory.predict.trace_step.trace_step`. Latents and text embeddings are assumed
cached (the VAE and text encoders are not part of the step; see :func:`text_encoder_bytes` for
their weights).

A DiT's sequence is ``text tokens + (H / f) * (W / f)`` image tokens, ``f`` = patch size x VAE
factor (16 for SD3 and Flux; the VAE factor is the pipeline's own, ``vae_factor``: the built-in
drawing model's VAE downsamples 4x). With SDPA every activation is linear in that length, so the
estimate (two traces at batch 1, cached per config) is fixed bytes + batch x (a + b x pixels).
"""

from __future__ import annotations

import functools
import json
import types
from typing import Any

import torch
from torch import nn

from lora_gui.memory.predict.calibrated import calibrated_step, fit_pixel_line
from lora_gui.memory.predict.model_configs import is_dit_config, load_model_config
from lora_gui.memory.predict.trace import (
    TraceResult,
    _check_common,
    as_dtype,
    attach_lora,
    run_autocast,
)
from lora_gui.memory.predict.trace_step import trace_step

VAE_FACTOR = 8  # SD3 / Flux VAEs: 8x downsampling (a pipeline's own: models.dit.vae_factor)
CALIBRATION_PX = (512, 1024)  # the estimate's two traced resolutions, where the model reaches them
# T5-XXL encoder, CLIP ViT-L/14 and OpenCLIP bigG/14 text towers (their published configs): the
# text encoders an SD3.5 / Flux.1 run keeps resident when the embeddings are not cached.
TEXT_ENCODER_CONFIGS: dict[str, tuple[str, dict[str, Any]]] = {
    "clip_l": ("clip", {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12,
                        "num_attention_heads": 12, "vocab_size": 49408, "projection_dim": 768}),
    "clip_g": ("clip", {"hidden_size": 1280, "intermediate_size": 5120, "num_hidden_layers": 32,
                        "num_attention_heads": 20, "vocab_size": 49408, "projection_dim": 1280}),
    "t5_xxl": ("t5", {"d_model": 4096, "d_ff": 10240, "d_kv": 64, "num_heads": 64, "num_layers": 24,
                      "vocab_size": 32128, "feed_forward_proj": "gated-gelu"}),
}
ENCODERS_BY_KIND = {"sd3": ("clip_l", "clip_g", "t5_xxl"), "flux": ("clip_l", "t5_xxl")}


def dit_kind(config: dict[str, Any]) -> str:
    """'sd3' or 'flux' from the config's class name."""
    return "flux" if config["_class_name"] == "FluxTransformer2DModel" else "sd3"


def build_dit(config: dict[str, Any], *, dtype: torch.dtype, lora_rank: int, lora_alpha: float | None,
              target_modules: Any, lora_dropout: float = 0.0, adapter: Any = None,
              lean_backward: bool = True) -> nn.Module:
    """The SD3 / Flux transformer of ``config`` on the meta device with LoRA attached (still
    meta); ``lean_backward``: as the run's (:mod:`lora_gui.models.lean_backward`)."""
    import diffusers

    cls = getattr(diffusers, config["_class_name"])
    labels = ("architectures", "model_type")  # preset labels, not constructor arguments
    kwargs = {k: v for k, v in config.items() if not k.startswith("_") and k not in labels}
    with torch.device("meta"):
        model = cls.from_config(kwargs)
    nn.Module.to(model, dtype)
    model.train()
    return attach_lora(model, lora_rank, lora_alpha, target_modules, lora_dropout, adapter=adapter,
                       lean_backward=lean_backward)


def largest_side(config: dict[str, Any], vae_factor: int = VAE_FACTOR) -> int | None:
    """The largest image side (px) an SD3 transformer's position embedding covers
    (``pos_embed_max_size`` patches); None for Flux (rotary positions: no limit)."""
    if dit_kind(config) == "flux" or not config.get("pos_embed_max_size"):
        return None
    return int(config["pos_embed_max_size"]) * int(config.get("patch_size", 2)) * vae_factor


def calibration_sizes(config: dict[str, Any], vae_factor: int = VAE_FACTOR) -> tuple[int, int]:
    """The two square resolutions the estimate traces: 512 and 1024 px, or for a model whose
    position embedding stops below 1024 px, half its largest side and that side."""
    top = largest_side(config, vae_factor)
    if top is None or top >= CALIBRATION_PX[1]:
        return CALIBRATION_PX
    factor = int(config.get("patch_size", 2)) * vae_factor
    low = max(factor, top // 2 // factor * factor)
    if low >= top:
        raise ValueError(f"this transformer covers at most {top} px: too small to estimate its steps")
    return low, top


def default_text_tokens(kind: str, text_max_length: int = 0) -> int:
    """Tokens of the prompt embeddings: SD3 = 77 CLIP + T5 tokens; Flux = T5 tokens."""
    from lora_gui.models.dit import text_length_for

    t5 = text_length_for(kind, text_max_length)
    return 77 + t5 if kind == "sd3" else t5


def trace_dit_step(config: Any, *, batch_size: int, resolution: int | tuple[int, int],
                   lora_rank: int = 16, lora_alpha: float | None = None, target_modules: Any = None,
                   gradient_checkpointing: bool = False, dtype: torch.dtype | str = torch.bfloat16,
                   device: str = "cuda", text_seq_len: int | None = None, lora_dropout: float = 0.0,
                   fake: bool = True, warm_steps: int = 0, attention: str = "sdpa",
                   weighting_scheme: str = "none", image_window: int = 0, adapter: Any = None,
                   vae_factor: int = VAE_FACTOR, lean_backward: bool = True,
                   grads_before: bool = False) -> TraceResult:
    """Traces one LoRA training step of an SD3Transformer2DModel or FluxTransformer2DModel.

    Args:
        config: a transformer config dict / path / bundled name (``"flux.1-dev"``, ``"sd3.5-medium"``).
        batch_size: images per micro-batch.
        resolution: pixels (square) or (height, width), multiples of 16.
        lora_rank, lora_alpha, lora_dropout: LoRA settings.
        target_modules: peft targets (default: the diffusers script's for the model kind).
        gradient_checkpointing: diffusers' per-block checkpointing.
        dtype: frozen weights dtype (LoRA stays float32).
        device: 'cuda' adds the CUDA overheads; fake / warm_steps: as in ``trace_text_step``.
        text_seq_len: prompt-embedding tokens (default: :func:`default_text_tokens`).
        attention: 'sdpa' (the model's processors) or 'eager' (math SDPA: S x S scores kept).
        weighting_scheme: the loss weighting (changes a few temporaries only).
        image_window: windowed attention over image tokens (radius in tokens; 0 = full).
        adapter: the run's :class:`lora_gui.models.adapters.AdapterSpec` (None: LoRA).
        vae_factor: the pipeline VAE's downsampling (:func:`lora_gui.models.dit.vae_factor`; 8 for
            SD3 / Flux).
        grads_before: the LoRA gradients exist before the forward (a micro-batch after the
            first of an accumulated step).

    Returns:
        A :class:`~lora_gui.memory.predict.trace.TraceResult`.
    """
    from diffusers import FlowMatchEulerDiscreteScheduler

    from lora_gui.models.dit import FlowMatching, lora_targets, set_dit_attention

    _check_common(batch_size, device)
    h, w = (resolution, resolution) if isinstance(resolution, int) else resolution
    cfg = load_model_config(config)
    if not is_dit_config(cfg):
        raise ValueError("not an SD3Transformer2DModel / FluxTransformer2DModel config")
    kind = dit_kind(cfg)
    factor = vae_factor * (2 if kind == "flux" else int(cfg.get("patch_size", 2)))
    if h < factor or w < factor or h % factor or w % factor:
        raise ValueError(f"resolution must be a positive multiple of {factor}, got {resolution}")
    dt = as_dtype(dtype)
    targets = target_modules or lora_targets(kind, "all-linear")
    model = build_dit(cfg, dtype=dt, lora_rank=lora_rank, lora_alpha=lora_alpha, target_modules=targets,
                      lora_dropout=lora_dropout, adapter=adapter, lean_backward=lean_backward)
    if attention not in ("sdpa", "eager"):
        raise ValueError(f"attention must be 'sdpa' or 'eager', got {attention!r}")
    set_dit_attention(model.get_base_model(), attention, image_window)
    tokens = text_seq_len or default_text_tokens(kind)
    channels = cfg.get("in_channels", 64) // 4 if kind == "flux" else cfg.get("in_channels", 16)
    objective = FlowMatching(kind, FlowMatchEulerDiscreteScheduler(), weighting_scheme,
                             guidance=3.5 if cfg.get("guidance_embeds") else None,
                             vae_scale_factor=vae_factor, precondition_outputs=kind == "sd3")
    pooled_dim = cfg.get("pooled_projection_dim", 768)

    def make_inputs() -> dict:
        lat = (batch_size, channels, h // vae_factor, w // vae_factor)
        width = cfg.get("joint_attention_dim", 4096)
        enc = types.SimpleNamespace(latents=torch.randn(lat),
                                    hidden=torch.randn(batch_size, tokens, width, dtype=dt),
                                    pooled=torch.randn(batch_size, pooled_dim, dtype=dt))
        sigmas = torch.rand(batch_size)
        return {"enc": enc, "noise": torch.randn(lat), "sigmas": sigmas, "timesteps": sigmas * 1000,
                "draws": torch.zeros(batch_size, dtype=torch.long)}  # the run's int64 timestep draws

    def loss_fn(m: nn.Module, batch: dict, _tracker) -> torch.Tensor:
        loss = objective.loss_at(m, batch["enc"], batch["noise"], batch["sigmas"], batch["timesteps"])
        # the image loop holds its batch (latents, embeddings, noise, draws) until the backward
        # is done: the inputs live as long as the loss tensor does (freed right after backward)
        loss.held_inputs = batch
        return loss

    res = trace_step(model, fake=fake, device=device, make_inputs=make_inputs, loss_fn=loss_fn, head=None,
                      gradient_checkpointing=gradient_checkpointing, warm_steps=warm_steps,
                      autocast=run_autocast(device, dt), grads_before=grads_before)
    res.info.update(model_type=kind, batch_size=batch_size, resolution=(h, w), text_tokens=tokens,
                    image_tokens=(h // factor) * (w // factor), source="tracker" if not fake else "predicted")
    return res


@functools.lru_cache(maxsize=16)
def _calibration(cfg_json: str, lora_rank: int, gradient_checkpointing: bool, dtype: str,
                 text_seq_len: int | None, image_window: int = 0,
                 device: str = "cpu", adapter: Any = None, vae_factor: int = VAE_FACTOR,
                 lean_backward: bool = True) -> tuple[dict[str, int], float, float]:
    """Two fake traces (batch 1 at :func:`calibration_sizes`: 512 and 1024 px) -> fixed bytes and
    per-image a + b * pixels (traced for ``device``: on CUDA the attention kernels' backward
    workspaces are in them)."""
    cfg = json.loads(cfg_json)
    kw = {"batch_size": 1, "lora_rank": lora_rank, "gradient_checkpointing": gradient_checkpointing,
          "dtype": dtype, "device": device, "text_seq_len": text_seq_len, "image_window": image_window,
          "adapter": adapter, "vae_factor": vae_factor, "lean_backward": lean_backward}
    return fit_pixel_line(lambda px: trace_dit_step(cfg, resolution=px, **kw),
                          *calibration_sizes(cfg, vae_factor))


def estimate_dit_step(config: Any, *, batch_size: int, resolution: int | tuple[int, int], lora_rank: int = 16,
                      gradient_checkpointing: bool = False, dtype: Any = "bfloat16", device: str = "cuda",
                      text_seq_len: int | None = None, image_window: int = 0,
                      adapter: Any = None, vae_factor: int = VAE_FACTOR,
                      lean_backward: bool = True) -> TraceResult:
    """Trace-calibrated estimate of a DiT step with SDPA (linear in pixels and batch, see the
    module docstring; windowed image attention is linear too); default LoRA targets.
    ``info["source"] = "predicted (trace-calibrated)"``."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    cfg = dict(load_model_config(config))
    key = json.dumps(cfg, sort_keys=True, default=str)
    fit = _calibration(key, lora_rank, gradient_checkpointing, str(dtype).replace("torch.", ""), text_seq_len,
                       image_window, "cuda" if device == "cuda" else "cpu", adapter, vae_factor,
                       lean_backward)
    return calibrated_step(fit, batch_size=batch_size, resolution=resolution, device=device)


@functools.lru_cache(maxsize=8)
def text_encoder_params(name: str) -> int:
    """Parameters of a bundled text-encoder config (built on the meta device, no weights)."""
    from transformers import CLIPTextConfig, CLIPTextModelWithProjection, T5Config, T5EncoderModel

    family, conf = TEXT_ENCODER_CONFIGS[name]
    with torch.device("meta"):
        model = (CLIPTextModelWithProjection(CLIPTextConfig(**conf)) if family == "clip"
                 else T5EncoderModel(T5Config(**conf)))
    return sum(p.numel() for p in model.parameters())


def text_encoder_bytes(kind: str, dtype: torch.dtype | str = torch.bfloat16) -> int:
    """Weights of the text encoders of an SD3.5 / Flux.1 pipeline in ``dtype``."""
    size = torch.empty((), dtype=as_dtype(dtype)).element_size()
    return sum(text_encoder_params(n) for n in ENCODERS_BY_KIND[kind]) * size
