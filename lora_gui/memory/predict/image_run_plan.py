"""The planner applied to an image run: UNet or DiT shapes, buckets of the resolution, per-bucket batch.

Used by ``python -m lora_gui plan`` when ``task=image`` (the text path is :mod:`run_plan`).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import torch

from lora_gui.config import RunConfig
from lora_gui.memory.predict import planner
from lora_gui.memory.predict.model_configs import bundled_models, load_model_config
from lora_gui.memory.predict.trace import TraceResult, trace_unet_step
from lora_gui.models.precision import planned_weights_dtype

log = logging.getLogger(__name__)


def unet_config_for(cfg: RunConfig) -> dict[str, Any]:
    """UNet shapes: a bundled name (sd15-unet, sdxl-unet), the built-in pipeline or a local one."""
    if cfg.model in bundled_models():
        return dict(load_model_config(cfg.model))
    from lora_gui.models.diffusion import resolve_pipeline_source

    source = resolve_pipeline_source(cfg.model)
    if Path(source).is_dir():
        path = Path(source) / "unet" / "config.json"
    else:
        from huggingface_hub import hf_hub_download

        path = Path(hf_hub_download(source, "unet/config.json"))
    return {**json.loads(path.read_text(encoding="utf-8")), "_class_name": "UNet2DConditionModel"}


def plan_image_run(cfg: RunConfig, budget_bytes: int, device: str = "cuda",
                   ) -> tuple[planner.Plan, TraceResult, list[tuple[int, int]]]:
    """Micro-batch per bucket under the budget (trace-calibrated estimate), the trace of the
    largest bucket at its planned micro-batch, and the buckets as (height, width)."""
    from lora_gui.data.images import make_buckets
    from lora_gui.memory.predict.dit_plan import dit_config_for, plan_dit_run

    dit_config = dit_config_for(cfg)
    if dit_config is not None:  # SD3 / Flux: the DiT planner
        return plan_dit_run(cfg, dit_config, budget_bytes, device)
    unet = unet_config_for(cfg)
    dtype = planned_weights_dtype(cfg.precision, device)
    step = {"lora_rank": cfg.lora_rank, "gradient_checkpointing": cfg.gradient_checkpointing,
            "dtype": dtype, "device": device, "lean_backward": cfg.resolved_lean_backward()}
    buckets = make_buckets(cfg.resolution, cfg.bucket_max_ratio) if cfg.resolved_aspect_buckets() \
        else [(cfg.resolution, cfg.resolution)]
    shapes = sorted({(h, w) for w, h in buckets if w <= h})  # one of each mirrored pair
    resident, info = unet_run_extras(cfg, dtype, device)
    plan = planner.plan_image(unet, budget_bytes, shapes, effective_batch=cfg.batch_size,
                              max_batch=cfg.batch_size, resident=resident, **step)
    worst = max(plan.buckets, key=lambda b: b.peak_bytes)
    traced = trace_unet_step(unet, batch_size=max(1, worst.micro_batch), resolution=worst.bucket,
                             attention=cfg.resolved_attn_backend(), **step)
    traced.peak_bytes += resident
    traced.info.update(info)
    return plan, traced, shapes


def unet_run_extras(cfg: RunConfig, dtype: torch.dtype, device: str) -> tuple[int, dict[str, int]]:
    """Bytes an SD 1.x / SDXL run holds on the device besides the UNet step, as the run's own
    prediction counts them (source: predicted): the VAE (float32) and text encoders when nothing
    is cached (``cache_latents=off``), and with ``train_text_encoder`` the encoders' LoRA step
    (LoRA weights, gradients, AdamW state, activations; traced at ``batch_size`` captions).
    Encoder shapes come from the pipeline folder's configs (nothing is loaded); a bundled UNet
    name has no pipeline, so only its text encoders' LoRA is left out and logged.

    Raises:
        ConfigError: ``train_text_encoder`` with cached embeddings (as the run refuses it).
    """
    from lora_gui.memory.predict.text_encoder_step import encoders_training_bytes
    from lora_gui.models import text_encoder_lora

    info = {"resident_encoder_bytes": 0, "text_encoder_lora_bytes": 0}
    if cfg.model in bundled_models():
        if cfg.train_text_encoder:
            log.warning("plan: %s is a UNet config without its text encoders; their LoRA is not counted",
                        cfg.model)
        return 0, info
    text_encoder_lora.check(cfg, "sd")
    from lora_gui.memory.predict.pipeline_shapes import pipeline_sizes, pipeline_text_encoders
    from lora_gui.models.diffusion import resolve_pipeline_source

    source = resolve_pipeline_source(cfg.model)
    if cfg.resolved_cache_latents() == "off":
        info["resident_encoder_bytes"] = pipeline_sizes(source, dtype)[1]
    if cfg.train_text_encoder:
        info["text_encoder_lora_bytes"] = encoders_training_bytes(
            pipeline_text_encoders(source), cfg, cfg.batch_size, dtype, device)
    return sum(info.values()), info


def estimated_image_step(cfg: RunConfig, device: str = "cuda") -> TraceResult:
    """Peak of the run's largest UNet micro-batch (square at ``resolution``) for the UI: the
    trace-calibrated estimate with SDPA (instant after two cached traces), the fake-tensor trace
    with eager attention (its S x S scores are not linear in pixels)."""
    from lora_gui.memory.predict.dit_plan import dit_config_for
    from lora_gui.memory.predict.estimate import estimate_unet_step

    dtype = planned_weights_dtype(cfg.precision, device)
    dit_config = dit_config_for(cfg)
    if dit_config is not None:
        return _estimated_dit_step(cfg, dit_config, dtype, device)
    unet = unet_config_for(cfg)
    batch = cfg.batch_size
    if cfg.resolved_image_batch() == "adaptive":
        table = cfg.batch_by_resolution()
        covering = [r for r in sorted(table) if r >= cfg.resolution]
        batch = min(batch, table[covering[0]] if covering else 1)
    step = {"batch_size": batch, "resolution": cfg.resolution, "lora_rank": cfg.lora_rank,
            "gradient_checkpointing": cfg.gradient_checkpointing, "dtype": dtype, "device": device,
            "lean_backward": cfg.resolved_lean_backward()}
    if cfg.resolved_attn_backend() == "sdpa":
        return estimate_unet_step(unet, **step)
    return trace_unet_step(unet, attention="eager", **step)


def _estimated_dit_step(cfg: RunConfig, config: dict[str, Any], dtype: torch.dtype,
                        device: str) -> TraceResult:
    """The DiT counterpart of :func:`estimated_image_step` (plus VAE / text encoders when resident)."""
    from lora_gui.memory.predict.dit_plan import pipeline_vae_factor, resident_bytes
    from lora_gui.memory.predict.dit_trace import (
        default_text_tokens,
        dit_kind,
        estimate_dit_step,
        trace_dit_step,
    )

    kind = dit_kind(config)
    step = {"batch_size": cfg.batch_size, "resolution": cfg.resolution, "lora_rank": cfg.lora_rank,
            "gradient_checkpointing": cfg.gradient_checkpointing, "dtype": dtype, "device": device,
            "text_seq_len": default_text_tokens(kind, cfg.text_max_length), "image_window": cfg.image_window,
            "vae_factor": pipeline_vae_factor(cfg), "lean_backward": cfg.resolved_lean_backward()}
    if cfg.resolved_attn_backend() == "sdpa":
        result = estimate_dit_step(config, **step)
    else:
        result = trace_dit_step(config, attention="eager", **step)
    result.peak_bytes += resident_bytes(kind, cfg.resolved_cache_latents(), dtype)
    return result
