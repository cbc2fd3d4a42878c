"""The planner for DiT (SD3 / Flux) runs: micro-batch per resolution bucket under a budget, what
fits where, and whether the text embeddings fit (source: predicted).

Peaks come from :func:`lora_gui.memory.predict.dit_trace.estimate_dit_step` (trace-calibrated, linear
in pixels with SDPA) plus the weights of whatever stays resident besides the transformer: with
``cache_latents=off`` the VAE and the text encoders (T5-XXL alone is 9.5 GB in bf16). Cached
text embeddings live in host RAM (``ram``) or on disk (``disk``): a Flux caption is 512 T5
tokens x 4096 x 4 bytes = 8 MiB, so a large data set's embeddings can outgrow the RAM; the
check says so and points to the disk cache.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from lora_gui.config import ConfigError, RunConfig
from lora_gui.memory.predict import planner
from lora_gui.memory.predict.dit_trace import (
    VAE_FACTOR,
    dit_kind,
    estimate_dit_step,
    text_encoder_bytes,
    trace_dit_step,
)
from lora_gui.memory.predict.model_configs import bundled_models, is_dit_config, load_model_config
from lora_gui.memory.predict.trace import TraceResult
from lora_gui.models.precision import planned_weights_dtype

CACHE_BYTES_PER_VALUE = 4  # cached embeddings are stored as float32 (engine/image/inputs.py)
# the SD3 / Flux AutoencoderKL (16 latent channels), kept in float32 by the engine
VAE_CONFIG = {"latent_channels": 16, "block_out_channels": (128, 256, 512, 512), "layers_per_block": 2,
              "down_block_types": ("DownEncoderBlock2D",) * 4, "up_block_types": ("UpDecoderBlock2D",) * 4,
              "use_quant_conv": False, "use_post_quant_conv": False}


def vae_params() -> int:
    """Parameters of the SD3 / Flux VAE (built on the meta device from its config)."""
    from diffusers import AutoencoderKL

    with torch.device("meta"):
        return sum(p.numel() for p in AutoencoderKL(**VAE_CONFIG).parameters())


def text_cache_bytes(images: int, text_tokens: int, width: int, pooled: int = 0) -> int:
    """Host bytes of the cached prompt embeddings of ``images`` images (one entry per image)."""
    return images * (text_tokens * width + pooled) * CACHE_BYTES_PER_VALUE


def check_text_cache(cache_mode: str, images: int, text_tokens: int, width: int, ram_budget_bytes: int,
                     pooled: int = 0) -> int:
    """Refuses a RAM cache of text embeddings larger than the RAM budget; returns its bytes.
    ``images``: the distinct captions (the cache holds each one's embeddings once).

    Raises:
        ConfigError: naming the bytes, the budget and the disk cache that avoids it.
    """
    need = text_cache_bytes(images, text_tokens, width, pooled)
    if cache_mode == "ram" and need > ram_budget_bytes:
        raise ConfigError(
            f"cache_latents: the T5 / CLIP embeddings of {images} distinct captions ({text_tokens} "
            f"tokens x {width} floats each) need {need / 1e9:.2f} GB of RAM, more than the "
            f"{ram_budget_bytes / 1e9:.2f} GB available; set cache_latents=disk to keep them on disk "
            "(or lower text_max_length)")
    return need


def resident_bytes(kind: str, cache_mode: str, dtype: torch.dtype | str) -> int:
    """Weights that stay on the device besides the transformer: VAE (float32) + text encoders,
    only when nothing is cached (``cache_latents=off``)."""
    if cache_mode != "off":
        return 0
    return vae_params() * 4 + text_encoder_bytes(kind, dtype)


def plan_dit(config: Any, budget_bytes: float, resolutions: Sequence[int | tuple[int, int]], *,
             effective_batch: int = 8, max_batch: int = 64, resident: int = 0, **step: Any) -> planner.Plan:
    """Largest micro-batch per resolution bucket of a DiT step (plus ``resident`` bytes).

    Args:
        config: SD3 / Flux transformer config or bundled name; budget_bytes: bytes;
        resolutions: pixels or (h, w) buckets; effective_batch, max_batch: as ``plan_image``.
        resident: bytes of VAE / text encoders kept on the device (``cache_latents=off``).
        **step: lora_rank, gradient_checkpointing, dtype, device, text_seq_len.

    Returns:
        A :class:`~lora_gui.memory.predict.planner.Plan`; when it does not fit, the suggestions include
        caching the embeddings (frees the text encoders) and gradient checkpointing.
    """
    budget = planner.check_budget(budget_bytes)
    area = lambda r: r * r if isinstance(r, int) else r[0] * r[1]  # noqa: E731
    largest = max(resolutions, key=area)

    def peak(b: int, res: Any, **change: Any) -> int:
        kw = {**step, **change}
        return estimate_dit_step(config, batch_size=b, resolution=res, **kw).peak_bytes + resident

    def step_peak(b: int, res: Any) -> int:  # a later micro-batch runs beside the earlier ones' gradients
        return planner.accumulated_peak(
            lambda n: estimate_dit_step(config, batch_size=n, resolution=res, **step), b,
            effective_batch) + resident

    plans = []
    for res in resolutions:
        mb = planner._largest(lambda b, res=res: step_peak(b, res), budget, max_batch)
        accum = math.ceil(effective_batch / mb) if mb else 0
        plans.append(planner.BucketPlan(res, mb, accum, step_peak(max(mb, 1), res)))
    base = peak(1, largest)
    sugg: list[planner.Suggestion] = []
    if not all(p.micro_batch for p in plans):
        if resident:
            p = base - resident
            sugg.append(planner.Suggestion("cache_latents=disk (frees the VAE and the T5 / CLIP encoders)",
                                           p, resident, p <= budget))
        if not step.get("gradient_checkpointing"):
            p = peak(1, largest, gradient_checkpointing=True)
            sugg.append(planner.Suggestion("gradient_checkpointing=True", p, base - p, p <= budget))
    frozen = estimate_dit_step(config, batch_size=1, resolution=largest, **step).breakdown["frozen_weights"]
    return planner._finish(budget, plans, base, frozen + resident, sugg)


def what_fits_where_dit(config: Any, *, chosen: int, cards_gb: Sequence[int] = planner.CARDS_GB,
                        max_batch: int = 64, resident: int = 0, **step: Any) -> list[planner.CardFit]:
    """Per card: the largest resolution (512-1536 px, steps of 64) at batch 1 and the largest batch
    at ``chosen`` px (one GPU; DiT runs are not sharded with FSDP)."""
    sizes = list(range(512, 1537, 64))

    def peak(b: int, res: int) -> int:
        return estimate_dit_step(config, batch_size=b, resolution=res, **step).peak_bytes + resident

    rows = []
    for gb in cards_gb:
        budget = planner.check_budget(gb * planner.GB)
        k = planner._largest(lambda i: peak(1, sizes[i - 1]), budget, len(sizes))
        rows.append(planner.CardFit(gb, sizes[k - 1] if k else None,
                                    planner._largest(lambda b: peak(b, chosen), budget, max_batch)))
    return rows


def dit_config_for(cfg: RunConfig) -> dict[str, Any] | None:
    """The transformer config of the run's model (bundled name or pipeline folder / Hub id), or
    None when the model is not a DiT."""
    if cfg.model in bundled_models():
        conf = load_model_config(cfg.model)
        return dict(conf) if is_dit_config(conf) else None
    if cfg.model == "builtin":
        return None
    from lora_gui.models.diffusion import _model_index, resolve_pipeline_source
    from lora_gui.models.dit import DIT_PIPELINES, DIT_TRANSFORMERS

    source = resolve_pipeline_source(cfg.model)
    name = _model_index(source).get("_class_name")
    if name not in DIT_PIPELINES:
        return None
    if Path(source).is_dir():
        path = Path(source) / "transformer" / "config.json"
    else:
        from huggingface_hub import hf_hub_download

        path = Path(hf_hub_download(source, "transformer/config.json"))
    class_name = DIT_TRANSFORMERS[DIT_PIPELINES[name]]
    return {**json.loads(path.read_text(encoding="utf-8")), "_class_name": class_name}


def plan_dit_run(cfg: RunConfig, config: dict[str, Any], budget_bytes: int, device: str = "cuda",
                 ) -> tuple[planner.Plan, TraceResult, list[tuple[int, int]]]:
    """``plan`` for a DiT run: per-bucket micro-batch, the trace of the largest bucket at its
    micro-batch, and the buckets as (height, width)."""
    from lora_gui.data.images import make_buckets
    from lora_gui.memory.predict.dit_trace import default_text_tokens

    dtype = planned_weights_dtype(cfg.precision, device)
    kind = dit_kind(config)
    step = {"lora_rank": cfg.lora_rank, "gradient_checkpointing": cfg.gradient_checkpointing, "dtype": dtype,
            "device": device, "text_seq_len": default_text_tokens(kind, cfg.text_max_length),
            "image_window": cfg.image_window, "vae_factor": pipeline_vae_factor(cfg),
            "lean_backward": cfg.resolved_lean_backward()}
    buckets = make_buckets(cfg.resolution, cfg.bucket_max_ratio) if cfg.resolved_aspect_buckets() \
        else [(cfg.resolution, cfg.resolution)]
    shapes = sorted({(h, w) for w, h in buckets if w <= h})
    resident = 0 if cfg.resolved_cache_latents() != "off" else pipeline_encoders(cfg, kind, dtype)[1]
    plan = plan_dit(config, budget_bytes, shapes, effective_batch=cfg.batch_size, max_batch=cfg.batch_size,
                    resident=resident, **step)
    worst = max(plan.buckets, key=lambda b: b.peak_bytes)
    traced = trace_dit_step(config, batch_size=max(1, worst.micro_batch), resolution=worst.bucket,
                            attention=cfg.resolved_attn_backend(), **step)
    traced.peak_bytes += resident
    traced.info["resident_encoder_bytes"] = resident
    encoding = encoding_pass_bytes(cfg, kind, traced, max(shapes, key=lambda s: s[0] * s[1]), dtype)
    traced.info["encoding_pass_bytes"] = encoding
    if encoding > traced.peak_bytes:  # the caching pass, not a training step, is the run's peak
        traced.peak_bytes = encoding
    if encoding > budget_bytes:
        plan = replace(plan, fits=False, min_bytes_needed=max(plan.min_bytes_needed, encoding),
                       message=f"does not fit: encoding the pictures needs {encoding / planner.GB:.2f} GB "
                       "(the VAE and text encoders on the device, and the transformer unless the "
                       "latents are cached)")
    return plan, traced, shapes


def encoding_pass_bytes(cfg: RunConfig, kind: str, step: TraceResult, largest_hw: tuple[int, int],
                        dtype: torch.dtype) -> int:
    """Peak of the run's encoding pass (source: predicted; the rule is
    :func:`lora_gui.memory.predict.encode_trace.planned_encoding_pass`), with the VAE (float32) and the
    text encoders in ``dtype`` of the run's pipeline (the folder's own, or SD3.5 / Flux.1's for
    a bundled name); the transformer joins after a GPU run's caching pass
    (engine.image.encode_peak)."""
    from lora_gui.memory.predict.encode_trace import planned_encoding_pass

    vae_config, encoders = pipeline_encoders(cfg, kind, dtype)
    return planned_encoding_pass(cfg.resolved_cache_latents(), step, encoders, vae_config, *largest_hw)


def pipeline_vae_factor(cfg: RunConfig) -> int:
    """The downsampling of the run's pipeline VAE (8 for SD3 / Flux and a bundled transformer name;
    the built-in drawing model's VAE: 4), read from its folder's config (nothing loaded)."""
    if cfg.model in bundled_models():
        return VAE_FACTOR
    from diffusers import AutoencoderKL

    from lora_gui.memory.predict.pipeline_shapes import config_folder
    from lora_gui.models.diffusion import resolve_pipeline_source
    from lora_gui.models.dit import vae_factor

    root = config_folder(resolve_pipeline_source(cfg.model))
    return vae_factor(AutoencoderKL.load_config(root / "vae")["block_out_channels"])


def pipeline_largest_side(cfg: RunConfig) -> int | None:
    """The largest image side (px) the run's model can train: an SD3 transformer's position
    embedding stops at ``pos_embed_max_size`` patches (the built-in drawing model: 64 px); None for
    Flux and UNets, which have no such limit."""
    from lora_gui.memory.predict.dit_trace import largest_side

    config = dit_config_for(cfg)
    return None if config is None else largest_side(config, pipeline_vae_factor(cfg))


def pipeline_encoders(cfg: RunConfig, kind: str, dtype: torch.dtype) -> tuple[dict[str, Any], int]:
    """(VAE config, bytes of the VAE in float32 plus the text encoders in ``dtype``) of the run's
    pipeline, built on the meta device from its folder's configs (nothing loaded); a bundled
    transformer name stands for SD3.5 / Flux.1, whose VAE and encoders are bundled here."""
    if cfg.model in bundled_models():
        return VAE_CONFIG, vae_params() * 4 + text_encoder_bytes(kind, dtype)
    import transformers
    from accelerate import init_empty_weights
    from diffusers import AutoencoderKL

    from lora_gui.memory.predict.pipeline_shapes import config_folder
    from lora_gui.models.diffusion import _model_index, resolve_pipeline_source

    root = config_folder(resolve_pipeline_source(cfg.model))
    vae_config = {k: v for k, v in AutoencoderKL.load_config(root / "vae").items() if not k.startswith("_")}
    size = torch.empty((), dtype=dtype).element_size()
    total = 0
    with init_empty_weights():
        total += sum(p.numel() * 4 for p in AutoencoderKL.from_config(vae_config).parameters())
        for name, entry in _model_index(str(root)).items():
            if name.startswith("text_encoder") and isinstance(entry, list) and entry[1]:
                conf = transformers.AutoConfig.from_pretrained(root / name)
                total += sum(p.numel() * size for p in getattr(transformers, entry[1])(conf).parameters())
    return vae_config, total
