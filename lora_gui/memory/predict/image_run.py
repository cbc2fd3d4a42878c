"""An image run's predicted peak (source: predicted), UNet and DiT alike: the one function the
image run calls when it starts (:func:`image_run_prediction`) and that the dashboard's form and
``python -m lora_gui plan`` call before it, on the same pipeline built on the meta device
(:func:`lora_gui.models.diffusion.image_model_for_run` with ``weights=False``), so every entry
point gives the same bytes by construction.

The peak is the larger of the training step (the largest micro-batch, traced on fake tensors,
plus what stays on the device beside it) and the encoding pass. With a latent cache on a GPU
the denoiser (UNet / transformer with its LoRA) joins the device only after the caching pass,
so that pass holds just the VAE and the text encoders: for Flux.1 that keeps the 12B
transformer (about 24 GB in bf16) off the card while the T5 encoder (about 9.5 GB) runs. On a
CPU the host is the device and everything is in the same memory anyway; without a cache every
step encodes, so the denoiser is there too.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any

import torch

from lora_gui.config import ConfigError, RunConfig
from lora_gui.data.image_batches import ImageData, executed_bucket_sizes, latent_tokens, table_batch
from lora_gui.memory.predict import planner
from lora_gui.memory.predict.encode_trace import denoiser_waits_for_cache, module_bytes, trace_encode_peak
from lora_gui.memory.predict.text_encoder_step import training_bytes
from lora_gui.memory.predict.trace import CUBLAS_WORKSPACE_BYTES, CUDA_CONTEXT_BYTES, TraceResult
from lora_gui.memory.runtime.guard import BatchCaps
from lora_gui.models import dit
from lora_gui.models.adapters import adapter_spec
from lora_gui.models.diffusion import ImageModel, lora_targets, resolve_pipeline_source
from lora_gui.units import gb

log = logging.getLogger(__name__)


@dataclass
class ImagePrediction:
    """An image run's plan (source: predicted).

    Attributes:
        caps: micro-batch cap per bucket (keyed by latent pixels, as the loop reads them).
        peak_bytes: the run's predicted peak (None: the planner could not trace this model).
        train_peak_bytes: the training steps' peak alone, with what stays beside them (the
            figure to set against run.json's ``train_peak_bytes``; the caching pass apart).
        step: the trace of the largest micro-batch.
        plan: the per-bucket plan under the budget (None without a budget or a fixed batch).
        speed: the predicted images/s and MFU with their source
            (:func:`lora_gui.memory.predict.image_speed.predicted_image_speed`; empty for video).
        checkpoint_choice: whether the run checkpoints, when its plan chose
            (:mod:`lora_gui.memory.predict.image_checkpoint_choice`; None: as set).
    """

    caps: BatchCaps
    peak_bytes: int | None = None
    train_peak_bytes: int | None = None
    step: TraceResult | None = None
    plan: planner.Plan | None = None
    speed: dict[str, Any] = field(default_factory=dict)
    checkpoint_choice: Any = None

    def applied(self, cfg: RunConfig) -> RunConfig:
        """``cfg`` with the checkpointing the plan chose (unchanged when it did not choose)."""
        return self.checkpoint_choice.applied(cfg) if self.checkpoint_choice is not None else cfg

    def figures(self, device_type: str) -> dict[str, Any] | None:
        """What run.json's ``prediction`` holds (None without a prediction)."""
        if self.peak_bytes is None or self.step is None:
            return None
        chosen = {"image_checkpointing": self.checkpoint_choice.to_json()} if self.checkpoint_choice else {}
        return {"peak_bytes": self.peak_bytes, "train_peak_bytes": self.train_peak_bytes,
                "source": "predicted", "device": device_type, "kernel": self.step.info.get("kernel"),
                "batch_size": self.step.info.get("batch_size"), **self.speed, **chosen}


def image_run_prediction(cfg: RunConfig, model: ImageModel, data: ImageData, budget: int | None,
                         device: torch.device, weights_dtype: torch.dtype,
                         world_size: int = 1) -> ImagePrediction:
    """The run's micro-batch caps per bucket (adaptive: the planner under a budget, else
    batch_table) and its predicted peak, per process (with several, a process trains at most
    ceil(batch_size / world_size) images of a step); a checkpointing run under a budget with the
    fastest choice, planned with checkpointing off too, takes the faster plan that fits
    (:mod:`lora_gui.memory.predict.image_checkpoint_choice`; the run applies
    :meth:`ImagePrediction.applied`). The image run calls it with the pipeline on the meta device,
    as the form and the CLI do.

    Raises:
        ModelError / ConfigError: buckets, embedding cache or export settings the run refuses.
    """
    if model.kind in ("wan", "ltx"):  # a video run: clips of (width, height, frames)
        from lora_gui.memory.predict.video_run import video_run_prediction

        return video_run_prediction(cfg, model, data, budget, device, weights_dtype, world_size)
    from lora_gui.memory.predict import image_checkpoint_choice

    def planned(run: RunConfig) -> ImagePrediction:
        return _image_prediction(run, model, data, budget, device, weights_dtype, world_size)

    out = planned(cfg)
    if image_checkpoint_choice.chooses_image_checkpointing(cfg, budget):
        out = image_checkpoint_choice.choose(cfg, budget, out, planned)
    return out


def _image_prediction(cfg: RunConfig, model: ImageModel, data: ImageData, budget: int | None,
                      device: torch.device, weights_dtype: torch.dtype, world_size: int) -> ImagePrediction:
    """One image plan with the run's settings as they are (:func:`image_run_prediction`)."""
    if dit.is_dit_kind(model.kind):  # SD3 / Flux: flow-matching step, patch-size checks
        out = dit_memory_plan(cfg, model, data, budget, device, weights_dtype, world_size)
    else:
        out = unet_run_prediction(cfg, model, data, budget, device, weights_dtype, world_size)
    if out.peak_bytes is not None:  # the speed the plan predicts, beside its peak
        out.speed = run_speed(cfg, model, data, out.caps, device, weights_dtype, world_size)
    return out


def run_speed(cfg: RunConfig, model: ImageModel, data: ImageData, caps: BatchCaps, device: torch.device,
              weights_dtype: torch.dtype, world_size: int = 1) -> dict[str, Any]:
    """The run's predicted images/s and MFU (:mod:`lora_gui.memory.predict.image_speed`): its
    steps as it trains them, each cut by the plan's caps, timed on the run's own denoiser."""
    from lora_gui.memory.predict.image_speed import image_step_time_model, predicted_image_speed, run_steps

    steps = run_steps(cfg, data.buckets)
    if not steps:
        return {}
    cap = lambda b: caps.cap(latent_tokens(b)) if caps.caps else None  # noqa: E731
    sizes: dict[tuple[int, int], int] = {}
    for bucket, images in steps:
        share = math.ceil(images / world_size)
        sizes[bucket] = max(sizes.get(bucket, 0), min(share, cap(bucket) or share))
    timing, source = image_step_time_model(cfg, model, sizes, device.type, weights_dtype)
    return predicted_image_speed(timing, source, steps, cap, world_size)


def unet_run_prediction(cfg: RunConfig, model: ImageModel, data: ImageData, budget: int | None,
                        device: torch.device, weights_dtype: torch.dtype, world_size: int = 1,
                        ) -> ImagePrediction:
    """An SD 1.x / SDXL run's caps and predicted peak (:func:`image_run_prediction`)."""
    unet_config = {**dict(model.unet.config), "_class_name": "UNet2DConditionModel"}
    resident = sum(p.numel() * p.element_size()
                   for m in (model.vae, *model.text_encoders) for p in m.parameters())
    out = ImagePrediction(BatchCaps())
    try:
        out.caps.caps, traced, predicted, out.plan = image_memory_plan(
            cfg, unet_config, data.buckets, model.tokenizers[0].model_max_length, resident, budget,
            device.type, weights_dtype, world_size, resolve_pipeline_source(cfg.model))
        encoders = training_bytes(model, cfg, traced.info.get("batch_size") or 1, weights_dtype, device.type)
        held = unet_held_bytes(cfg, model, data, device)  # beside the step
        encoding = traced.info.get("encoding_pass_bytes", 0) + unet_held_bytes(cfg, model, data, device,
                                                                                caching_pass=True)
        traced.info["encoding_pass_bytes"] = encoding
        out.peak_bytes, out.step = max(predicted + held + encoders, encoding), traced
        out.train_peak_bytes = traced.info["train_peak_bytes"] + held + encoders
    except (ValueError, NotImplementedError, RuntimeError) as err:  # prediction is advisory
        log.warning("no memory prediction for %s: %s", cfg.model, err)
    return out


def distinct_captions(data: ImageData) -> int:
    """Captions a RAM cache holds embeddings for: one per distinct caption of the training set."""
    return len({item.caption for item in data.train})


def unet_held_bytes(cfg: RunConfig, model: ImageModel, data: ImageData, device: torch.device,
                    caching_pass: bool = False) -> int:
    """What an SD 1.x / SDXL run on a CPU keeps between steps (source: predicted), where the host
    is the device: the cached latents and prompt embeddings of every training image and the
    encoded held-out set (SDXL: with the pooled embedding and the 6 micro-conditioning ids);
    ``caching_pass``: at the caching pass's peak (``encode_trace.held_bytes``). 0 on a GPU, whose
    cache is in host RAM."""
    if device.type == "cuda":
        return 0
    from lora_gui.memory.predict.encode_trace import held_bytes

    conf = model.unet.config
    width = conf.cross_attention_dim
    pooled = time_ids = 0
    if model.kind == "sdxl":
        pooled, time_ids = int(model.text_encoders[-1].config.projection_dim), 6  # text_embeds, time ids
    embed_dtype = next(model.text_encoders[0].parameters()).dtype if model.text_encoders else torch.float32
    return held_bytes(
        train_buckets=[data.buckets[i] for i in range(len(data.train))], eval_images=len(data.held_out),
        resolution=cfg.resolution, latent_channels=int(model.vae.config.latent_channels),
        vae_factor=dit.vae_factor(model.vae.config.block_out_channels),
        text_tokens=int(model.tokenizers[0].model_max_length),
        text_width=int(max(width) if isinstance(width, (list, tuple)) else width), pooled=pooled,
        embed_dtype=embed_dtype, cache_mode=cfg.resolved_cache_latents(), time_ids=time_ids,
        train_captions=distinct_captions(data), caching_pass=caching_pass)


def image_memory_plan(cfg: RunConfig, unet_config: dict[str, Any], buckets: list[tuple[int, int]],
                      text_seq_len: int, resident_bytes: int, budget: int | None, device: str,
                      weights_dtype: torch.dtype, world_size: int = 1, source: str | None = None,
                      ) -> tuple[dict[int, int], TraceResult, int, planner.Plan | None]:
    """Image run: caps per bucket (adaptive: the planner under a budget, else batch_table), the
    trace of the largest micro-batch, the run's peak (that step plus the VAE / text encoders
    when they stay on the device (no latent cache), or the encoding pass when it is higher:
    :func:`unet_encoding_pass`, counted when ``source``, the pipeline folder, is given), and
    the plan under a budget.

    Args:
        buckets: the bucket (width, height) px of every training image, as the run assigns them.
        text_seq_len: the tokenizer's length (77 for CLIP).
        resident_bytes: parameter bytes of the VAE and text encoders on the device.
        world_size: processes; each trains at most ceil(batch_size / world_size) images a step.
    """
    from lora_gui.memory.predict.trace import trace_unet_step

    used = sorted(set(buckets), key=lambda b: b[0] * b[1])
    step = {"lora_rank": cfg.lora_rank, "gradient_checkpointing": cfg.gradient_checkpointing,
            "dtype": weights_dtype, "device": device, "adapter": adapter_spec(cfg),
            "lean_backward": cfg.resolved_lean_backward()}
    caps: dict[int, int] = {}
    plan = None
    if cfg.resolved_image_batch() == "adaptive":
        if budget:
            plan = planner.plan_image(unet_config, budget, [(b[1], b[0]) for b in used],
                                      effective_batch=cfg.batch_size, max_batch=cfg.batch_size, **step)
            caps = {latent_tokens((p.bucket[1], p.bucket[0])): max(1, p.micro_batch) for p in plan.buckets}
        else:
            caps = {latent_tokens(b): min(cfg.batch_size, table_batch(cfg, b)) for b in used}
    per_rank = math.ceil(cfg.batch_size / world_size)

    def cap(bucket: tuple[int, int]) -> int:
        above = [n for n in caps if n >= latent_tokens(bucket)]
        return caps[min(above)] if above else per_rank

    executed = executed_bucket_sizes(cfg, buckets, world_size)  # the steps the run trains, no more
    traces = []
    for grads_before, sizes in micro_batch_shapes(executed, per_rank, cap).items():
        worst = max(sizes, key=lambda b: sizes[b] * b[0] * b[1])
        traces.append(trace_unet_step(
            unet_config, batch_size=sizes[worst], resolution=(worst[1], worst[0]),
            target_modules=lora_targets(cfg), lora_alpha=cfg.lora_alpha,
            attention=cfg.resolved_attn_backend(), text_seq_len=text_seq_len, grads_before=grads_before,
            **step))
    traced = max(traces, key=lambda t: t.peak_bytes)
    resident = 0 if cfg.resolved_cache_latents() != "off" else resident_bytes
    peak = traced.peak_bytes + resident
    traced.info["train_peak_bytes"] = peak
    if source is not None:
        pictures = [*used, (cfg.resolution, cfg.resolution)]  # the held-out set is encoded square
        try:
            encoding = unet_encoding_pass(cfg, traced, source, resident_bytes,
                                          max(pictures, key=lambda b: b[0] * b[1]))
        except OSError as err:  # the pipeline's VAE config cannot be read (offline hub id)
            log.warning("the encoding pass is not predicted: %s", err)
            encoding = 0
        traced.info["encoding_pass_bytes"] = encoding
        if encoding > peak:
            log.info("the encoding pass (%s) is this run's predicted peak, above its training "
                     "step (%s)", gb(encoding), gb(peak))
            peak = encoding
    return caps, traced, peak, plan


def micro_batch_shapes(executed: dict[tuple[int, int], int], per_rank: int, cap: Any,
                       ) -> dict[bool, dict[tuple[int, int], int]]:
    """The micro-batches of the run's steps whose peaks the prediction traces, by whether the
    LoRA gradients exist before them: each bucket's first micro-batch of a step, and where a step
    holds more than one, its largest later micro-batch, which runs beside the gradients the
    earlier ones left (gradient accumulation adds into them). ``executed``: the most images a
    step of each (width, height) bucket trains on this process; ``cap(bucket)``: its micro-batch
    cap. A bucket whose steps fit one micro-batch has no later one."""
    first, later = {}, {}
    for bucket, images in executed.items():
        images = min(per_rank, images)
        size = min(cap(bucket) or images, images)
        first[bucket] = size
        if images > size:
            later[bucket] = min(size, images - size)
    return {False: first, **({True: later} if later else {})}


def unet_encoding_pass(cfg: RunConfig, step: TraceResult, source: str, encoder_bytes: int,
                       largest: tuple[int, int]) -> int:
    """Predicted peak of an SD 1.x / SDXL run's encoding pass (source: predicted), from the
    pipeline folder's configs (nothing loaded; the form and the run compute the same figure):
    the VAE and text encoders (``encoder_bytes``), the UNet with its LoRA unless it joins the
    device after the latent cache (:func:`lora_gui.memory.predict.encode_trace.denoiser_waits_for_cache`),
    the VAE encoder's activations on the ``largest`` (width, height) px picture (fake-tensor
    trace) and the CUDA overheads of ``step``."""
    from diffusers import AutoencoderKL

    from lora_gui.memory.predict.encode_trace import planned_encoding_pass
    from lora_gui.memory.predict.pipeline_shapes import config_folder

    vae_config = {k: v for k, v in AutoencoderKL.load_config(config_folder(source) / "vae").items()
                  if not k.startswith("_")}
    width, height = largest
    return planned_encoding_pass(cfg.resolved_cache_latents(), step, encoder_bytes, vae_config,
                                 height, width)


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


def _check_flux_kohya(transformer: Any, targets: list[str]) -> None:
    """Refuses, before training, a Flux.1 LoRA target that kohya's Flux.1 layout cannot name."""
    from lora_gui.models.dit_kohya import unmapped_flux_modules

    names = [n for n, m in transformer.named_modules() if hasattr(m, "out_features")
             and "lora_" not in n and not n.endswith("base_layer")
             and any(n == t or n.endswith("." + t) for t in targets)]
    missing = unmapped_flux_modules(names)
    if missing:
        raise ConfigError(f"export_kohya: kohya's Flux.1 layout has no name for {missing[0]} "
                          f"({len(missing)} adapted layers in all); leave it out of lora_targets, or "
                          "turn export_kohya off and use pytorch_lora_weights.safetensors")


def dit_memory_plan(cfg: RunConfig, model: ImageModel, data: ImageData, budget: int | None,
                    device: torch.device, weights_dtype: torch.dtype, world_size: int = 1,
                    ram_budget: int | None = None) -> ImagePrediction:
    """Checks the buckets and the embedding cache, then returns the micro-batch caps per bucket
    (keyed by the loop's latent-pixel count) and the predicted peak of the largest micro-batch
    (source: predicted; fake-tensor trace of the flow-matching step plus the VAE / text encoders
    when they stay resident), or of the encoding pass when it is higher.

    Raises:
        ModelError: a bucket that is not a multiple of the patch size x VAE factor.
        ConfigError: the text embeddings do not fit the RAM budget with ``cache_latents=ram``;
            ``export_kohya`` of a Flux.1 layer that kohya's layout has no name for.
    """
    from lora_gui.memory.predict.dit_plan import check_text_cache, plan_dit
    from lora_gui.memory.predict.dit_trace import trace_dit_step

    if cfg.export_kohya and model.kind == "flux" and cfg.adapter == "lora":
        _check_flux_kohya(model.unet, dit.lora_targets(model.kind, cfg.lora_targets))
    used = sorted(set(data.buckets), key=lambda b: b[0] * b[1])
    factor = model.info["patch_factor"]
    dit.check_resolution(model.kind, factor, used + [(cfg.resolution, cfg.resolution)])
    config = {**dict(model.unet.config), "_class_name": dit.DIT_TRANSFORMERS[model.kind]}
    text_tokens = model.info["text_tokens"]
    width = int(config.get("joint_attention_dim", 4096))
    cache = cfg.resolved_cache_latents()
    check_text_cache(cache, distinct_captions(data), text_tokens, width,
                     host_ram_bytes() if ram_budget is None else ram_budget)
    resident = 0 if cache != "off" else sum(
        p.numel() * p.element_size() for m in (model.vae, *model.text_encoders) for p in m.parameters())
    step = {"lora_rank": cfg.lora_rank, "gradient_checkpointing": cfg.gradient_checkpointing,
            "dtype": weights_dtype, "device": device.type, "text_seq_len": text_tokens,
            "image_window": cfg.image_window, "adapter": adapter_spec(cfg),
            "vae_factor": dit.vae_factor(model.vae.config.block_out_channels),
            "lean_backward": cfg.resolved_lean_backward()}
    out = ImagePrediction(BatchCaps())
    caps = out.caps
    if cfg.resolved_image_batch() == "adaptive":
        if budget:
            out.plan = plan_dit(config, budget, [(b[1], b[0]) for b in used], effective_batch=cfg.batch_size,
                                max_batch=cfg.batch_size, resident=resident, **step)
            caps.caps = {latent_tokens((p.bucket[1], p.bucket[0])): max(1, p.micro_batch)
                         for p in out.plan.buckets}
        else:
            caps.caps = {latent_tokens(b): min(cfg.batch_size, table_batch(cfg, b)) for b in used}
    per_rank = math.ceil(cfg.batch_size / world_size)
    executed = executed_bucket_sizes(cfg, data.buckets, world_size)  # the steps the run trains, no more
    shapes = micro_batch_shapes(executed, per_rank, lambda b: caps.cap(latent_tokens(b)))
    worst = []
    for grads_before, sizes in shapes.items():
        by_area = lambda b, sizes=sizes: sizes[b] * b[0] * b[1]  # noqa: E731
        by_tiles = lambda b, sizes=sizes: sizes[b] * traced_area(b, factor, cfg.image_window)  # noqa: E731
        # the largest micro-batch by pixels and, with windowed attention, by whole tiles (which one
        # holds more depends on the model's width): both are traced, the larger counts
        largest = {max(sizes, key=lambda b: (by_area(b), by_tiles(b))),
                   max(sizes, key=lambda b: (by_tiles(b), by_area(b)))}
        worst += [(b, sizes[b], grads_before) for b in sorted(largest)]
    try:
        out.step = max((trace_dit_step(config, batch_size=size, resolution=(b[1], b[0]),
                                       target_modules=dit.lora_targets(model.kind, cfg.lora_targets),
                                       lora_alpha=cfg.lora_alpha, attention=cfg.resolved_attn_backend(),
                                       weighting_scheme=model.noise_scheduler.weighting_scheme,
                                       grads_before=grads_before, **step)
                        for b, size, grads_before in worst), key=lambda t: t.peak_bytes)
        out.peak_bytes, out.train_peak_bytes, encoding = run_peak(
            cfg, model, data, device, out.step.peak_bytes + resident,
            out.step.breakdown.get("optimizer_state", 0))
        out.step.info["encoding_pass_bytes"] = encoding
    except (ValueError, NotImplementedError, RuntimeError) as err:  # prediction is advisory
        log.warning("no memory prediction for %s: %s", cfg.model, err)
    return out


def run_peak(cfg: RunConfig, model: ImageModel, data: ImageData, device: torch.device, step_peak: int,
             optimizer_bytes: int = 0) -> tuple[int, int, int]:
    """The run's predicted peak, its training steps' peak and its encoding pass's peak (source:
    predicted) from its
    training step's (``step_peak``: the traced step plus the VAE / text encoders when they
    stay resident). The run's peak is the larger of

    - the step plus what the run holds on the device between steps (on a CPU run, the host is
      the device: the cached latents / embeddings and the encoded held-out set), and
    - the encoding pass (caching pass, or each step's encoding with ``cache_latents=off``):
      the weights on the device then (VAE and text encoders, and the transformer with LoRA
      unless it joins after the cache: :func:`encoding_pass_bytes`) plus the held
      inputs plus the traced transient of encoding the largest picture, plus the optimizer
      state (``optimizer_bytes``) when every step encodes (``cache_latents=off``).
    """
    from lora_gui.memory.predict.encode_trace import held_bytes

    cache = cfg.resolved_cache_latents()
    conf = dict(model.unet.config)
    embed_dtype = next(model.text_encoders[0].parameters()).dtype if model.text_encoders else torch.float32
    held, caching = (0 if device.type == "cuda" else held_bytes(
        train_buckets=[data.buckets[i] for i in range(len(data.train))], eval_images=len(data.held_out),
        resolution=cfg.resolution, latent_channels=int(model.vae.config.latent_channels),
        vae_factor=int(model.noise_scheduler.vae_scale_factor), text_tokens=int(model.info["text_tokens"]),
        text_width=int(conf.get("joint_attention_dim", 4096)),
        pooled=int(conf.get("pooled_projection_dim", 0)), embed_dtype=embed_dtype, cache_mode=cache,
        train_captions=distinct_captions(data), caching_pass=pass_peak) for pass_peak in (False, True))
    encoding = encoding_pass_bytes(cfg, model, data.buckets, device, caching, optimizer_bytes)
    if encoding > step_peak + held:
        log.info("the encoding pass (%s) is this run's predicted peak, above its training "
                 "step (%s)", gb(encoding), gb(step_peak + held))
    return max(step_peak + held, encoding), step_peak + held, encoding


def encoding_pass_bytes(cfg: RunConfig, model, buckets: list[tuple[int, int]], device: torch.device,
                        held: int = 0, optimizer_bytes: int = 0) -> int:
    """Predicted peak of the encoding pass (source: predicted): the weights on the device at that
    time, ``held`` bytes the run keeps there (a CPU run's cached inputs), the traced transient of
    encoding the largest picture of ``buckets`` ((width, height) px) or the held-out square, and
    the CUDA overheads the step's trace also adds. With ``cache_latents=off`` every step encodes
    its batch while the optimizer state (``optimizer_bytes``, from the step's trace) is alive."""

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
