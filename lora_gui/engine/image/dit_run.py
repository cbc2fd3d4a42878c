"""The DiT (SD3 / Flux) parts of an image run's set-up: bucket checks and the memory plan.

The image loop (:mod:`lora_gui.engine.image.train`) stays the same for UNets and DiTs; the
model load (:func:`lora_gui.models.diffusion.load_image_model`), the loss
(:func:`lora_gui.engine.image.inputs.unet_loss` -> :class:`lora_gui.models.dit.FlowMatching`) and
this memory plan are where a DiT run differs.
"""

from __future__ import annotations

import logging
import math

import torch

from lora_gui.config import ConfigError, RunConfig
from lora_gui.memory.runtime.guard import BatchCaps
from lora_gui.models import dit

log = logging.getLogger(__name__)


def host_ram_bytes() -> int:
    """Available host RAM (bytes), the budget of an in-RAM embedding cache."""
    import psutil

    return int(psutil.virtual_memory().available)


def image_tokens(bucket: tuple[int, int], factor: int) -> int:
    """Image tokens of a (width, height) bucket at ``factor`` px per token side."""
    return (bucket[0] // factor) * (bucket[1] // factor)


def traced_area(bucket: tuple[int, int], factor: int, image_window: int) -> int:
    """Pixels the step's memory grows with: the bucket's, or with windowed image attention the
    bucket rounded up to whole tiles of image tokens (a 36 x 28 token picture holds 5 x 4 tiles of
    8 x 8, as many scores as 40 x 32 tokens), so the largest micro-batch is found by its tiles."""
    if not image_window:
        return bucket[0] * bucket[1]
    from lora_gui.attention.image_window import DEFAULT_TILE

    side = DEFAULT_TILE * factor  # px per tile side
    return math.ceil(bucket[0] / side) * side * math.ceil(bucket[1] / side) * side


def dit_memory_plan(cfg: RunConfig, model, data, budget: int | None, device: torch.device,
                    weights_dtype: torch.dtype, world_size: int = 1,
                    ram_budget: int | None = None) -> tuple[BatchCaps, int | None]:
    """Checks the buckets and the embedding cache, then returns the micro-batch caps per bucket
    (keyed by the loop's latent-pixel count) and the predicted peak of the largest micro-batch
    (source: predicted; fake-tensor trace of the flow-matching step plus the VAE / text encoders
    when they stay resident).

    Raises:
        ModelError: a bucket that is not a multiple of the patch size x VAE factor.
        ConfigError: the text embeddings do not fit the RAM budget with ``cache_latents=ram``;
            ``export_kohya`` (a UNet key format).
    """
    from lora_gui.data.image_batches import latent_tokens, table_batch
    from lora_gui.memory.predict.dit_plan import check_text_cache, plan_dit
    from lora_gui.memory.predict.dit_trace import trace_dit_step

    if cfg.export_kohya:
        raise ConfigError("export_kohya: the kohya / A1111 key format is written for SD 1.x / SDXL UNets; "
                          "a DiT adapter is saved in diffusers' format (load_lora_weights) only")
    used = sorted(set(data.buckets), key=lambda b: b[0] * b[1])
    factor = model.info["patch_factor"]
    dit.check_resolution(model.kind, factor, used + [(cfg.resolution, cfg.resolution)])
    config = {**dict(model.unet.config), "_class_name": dit.DIT_TRANSFORMERS[model.kind]}
    text_tokens = model.info["text_tokens"]
    width = int(config.get("joint_attention_dim", 4096))
    cache = cfg.resolved_cache_latents()
    check_text_cache(cache, len(data.train), text_tokens, width,
                     host_ram_bytes() if ram_budget is None else ram_budget)
    resident = 0 if cache != "off" else sum(
        p.numel() * p.element_size() for m in (model.vae, *model.text_encoders) for p in m.parameters())
    step = {"lora_rank": cfg.lora_rank, "gradient_checkpointing": cfg.gradient_checkpointing,
            "dtype": weights_dtype, "device": device.type, "text_seq_len": text_tokens,
            "image_window": cfg.image_window}
    caps = BatchCaps()
    if cfg.resolved_image_batch() == "adaptive":
        if budget:
            plan = plan_dit(config, budget, [(b[1], b[0]) for b in used], effective_batch=cfg.batch_size,
                            max_batch=cfg.batch_size, resident=resident, **step)
            caps.caps = {latent_tokens((p.bucket[1], p.bucket[0])): max(1, p.micro_batch)
                         for p in plan.buckets}
        else:
            caps.caps = {latent_tokens(b): min(cfg.batch_size, table_batch(cfg, b)) for b in used}
    per_rank = math.ceil(cfg.batch_size / world_size)
    sizes = {b: min(per_rank, caps.cap(latent_tokens(b)) or per_rank,
                    math.ceil(data.buckets.count(b) / world_size)) for b in used}
    by_area = lambda b: sizes[b] * b[0] * b[1]  # noqa: E731
    by_tiles = lambda b: sizes[b] * traced_area(b, factor, cfg.image_window)  # noqa: E731
    # the largest micro-batch by pixels and, with windowed attention, by whole tiles (which one
    # holds more depends on the model's width): both are traced, the larger counts
    worst = {max(used, key=lambda b: (by_area(b), by_tiles(b))),
             max(used, key=lambda b: (by_tiles(b), by_area(b)))}
    predicted = None
    try:
        traced = max((trace_dit_step(config, batch_size=sizes[b], resolution=(b[1], b[0]),
                                     target_modules=dit.lora_targets(model.kind, cfg.lora_targets),
                                     lora_alpha=cfg.lora_alpha, attention=cfg.resolved_attn_backend(),
                                     weighting_scheme=model.noise_scheduler.weighting_scheme, **step)
                      for b in sorted(worst)), key=lambda t: t.peak_bytes)
        predicted = run_peak(cfg, model, data, device, traced.peak_bytes + resident,
                             traced.breakdown.get("optimizer_state", 0))
    except (ValueError, NotImplementedError, RuntimeError) as err:  # prediction is advisory
        log.warning("no memory prediction for %s: %s", cfg.model, err)
    return caps, predicted


def run_peak(cfg: RunConfig, model, data, device: torch.device, step_peak: int,
             optimizer_bytes: int = 0) -> int:
    """The run's predicted peak (source: predicted) from its training step's (``step_peak``:
    the traced step plus the VAE / text encoders when they stay resident): the larger of

    - the step plus what the run holds on the device between steps (on a CPU run, the host is
      the device: the cached latents / embeddings and the encoded held-out set), and
    - the encoding pass (caching pass, or each step's encoding with ``cache_latents=off``):
      the weights on the device then (VAE and text encoders, and the transformer with LoRA
      unless it joins after the cache: :mod:`lora_gui.engine.image.encode_peak`) plus the held
      inputs plus the traced transient of encoding the largest picture, plus the optimizer
      state (``optimizer_bytes``) when every step encodes (``cache_latents=off``).
    """
    from lora_gui.engine.image.encode_peak import encoding_pass_bytes
    from lora_gui.memory.predict.encode_trace import held_bytes

    cache = cfg.resolved_cache_latents()
    conf = dict(model.unet.config)
    embed_dtype = next(model.text_encoders[0].parameters()).dtype if model.text_encoders else torch.float32
    held = 0 if device.type == "cuda" else held_bytes(
        train_buckets=[data.buckets[i] for i in range(len(data.train))], eval_images=len(data.held_out),
        resolution=cfg.resolution, latent_channels=int(model.vae.config.latent_channels),
        vae_factor=int(model.noise_scheduler.vae_scale_factor), text_tokens=int(model.info["text_tokens"]),
        text_width=int(conf.get("joint_attention_dim", 4096)),
        pooled=int(conf.get("pooled_projection_dim", 0)), embed_dtype=embed_dtype, cache_mode=cache)
    encoding = encoding_pass_bytes(cfg, model, data.buckets, device, held, optimizer_bytes)
    if encoding > step_peak + held:
        log.info("the encoding pass (%.0f MiB) is this run's predicted peak, above its training "
                 "step (%.0f MiB)", encoding / 2**20, (step_peak + held) / 2**20)
    return max(step_peak + held, encoding)
