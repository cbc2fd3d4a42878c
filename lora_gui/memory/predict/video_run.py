"""A video run's predicted peak (source: predicted): the one function the video run calls when it
starts (:func:`video_run_prediction`, through :func:`lora_gui.memory.predict.image_run.image_run_prediction`)
and that ``plan`` calls before it, on the same pipeline built on the meta device, so both give
the same bytes; and :func:`trace_video_step`, the fake-tensor trace of one step of a Wan or
LTX-Video transformer for a (width, height, frames) clip bucket, from a loaded model or a bundled
config (``presets/models/wan2.1-t2v-14b.json``, ``ltx-video-2b.json``: no weights read).

The step traced is the engine's own: :meth:`lora_gui.models.dit.FlowMatching.loss_at` on video
latents (B, C, T, h, w) (noisy latents, the transformer, the flow-matching MSE), then backward,
AdamW step and ``zero_grad`` through the shared
:func:`lora_gui.memory.predict.trace_step.trace_step`.
A clip is ``T x (h / 2) x (w / 2)`` tokens (``T = (frames - 1) / 4 + 1`` latent frames, ``h``,
``w`` the latent sides): 832 x 480 x 81 frames is 21 x 30 x 52 = 32,760 tokens for Wan 2.1.
LTX-Video packs ``T x h x w`` latent pixels (8 frames and 32 px each) into as many tokens and
reads the prompt's attention mask beside its embeddings.

The run's peak is the larger of the largest micro-batch's step plus what stays beside it (on a
CPU, where the host is the device: the cached latents and caption embeddings and the encoded
held-out clips) and the caching pass (VAE and text encoder weights, the VAE encoder's
activations on the largest clip, traced on fake tensors with the run's own encode code).
"""

from __future__ import annotations

import math
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

from lora_gui.config import ConfigError, RunConfig
from lora_gui.data.video_batches import VideoData, VideoGeometry, clip_tokens
from lora_gui.memory.predict.encode_trace import (
    CACHE_BYTES_PER_VALUE,
    _fake_weights,
    denoiser_waits_for_cache,
    module_bytes,
)
from lora_gui.memory.predict.trace import (
    CUBLAS_WORKSPACE_BYTES,
    CUDA_CONTEXT_BYTES,
    TraceResult,
    _check_common,
    as_dtype,
    attach_lora,
    run_autocast,
)
from lora_gui.memory.predict.trace_step import accumulated_trace, trace_step
from lora_gui.memory.runtime.guard import BatchCaps
from lora_gui.memory.runtime.tracker import StorageTracker

Bucket = tuple[int, int, int]  # (width px, height px, frames)


@dataclass
class VideoPrediction:
    """A video run's plan (source: predicted), read as the image run reads its
    :class:`~lora_gui.memory.predict.image_run.ImagePrediction`.

    Attributes:
        caps: micro-batch cap per bucket (keyed by :func:`lora_gui.data.video_batches.clip_tokens`).
        peak_bytes: the run's predicted peak (the step with what stays beside it, or the caching pass).
        train_peak_bytes: the training steps' peak alone (run.json's ``train_peak_bytes``).
        step: the trace of the largest micro-batch.
    """

    caps: BatchCaps
    peak_bytes: int | None = None
    train_peak_bytes: int | None = None
    step: TraceResult | None = None
    plan: None = None  # the image planner's per-bucket table; a video plan keeps its caps only

    def figures(self, device_type: str) -> dict[str, Any] | None:
        """What run.json's ``prediction`` holds (None without a prediction)."""
        if self.peak_bytes is None or self.step is None:
            return None
        return {"peak_bytes": self.peak_bytes, "train_peak_bytes": self.train_peak_bytes,
                "source": "predicted", "device": device_type, "kernel": self.step.info.get("kernel"),
                "batch_size": self.step.info.get("batch_size"),
                "host_bytes": self.step.info.get("host_bytes", 0),  # block swap's host weights
                "blocks_to_swap": self.step.info.get("blocks_to_swap", 0)}

    def applied(self, cfg: RunConfig) -> RunConfig:
        """``cfg`` unchanged: a video run checkpoints the blocks its ``checkpoint_layers`` says."""
        return cfg


def build_video_transformer(config: dict[str, Any], *, dtype: torch.dtype, lora_rank: int,
                            lora_alpha: float | None, target_modules: Any, adapter: Any = None,
                            lean_backward: bool = True, quantization: str = "none") -> nn.Module:
    """The video transformer of ``config`` on the meta device with the run's adapter (still meta)
    and its base-weight storage (``quantization`` fp8: diffusers' layerwise casting hooks, which
    the traced step runs as the run does)."""
    import diffusers

    from lora_gui.models.video_quant import apply_base_storage

    cls = getattr(diffusers, config["_class_name"])
    kwargs = {k: v for k, v in config.items() if not k.startswith("_")}
    with torch.device("meta"):
        model = cls.from_config(kwargs)
    nn.Module.to(model, dtype)
    model.train()
    model = attach_lora(model, lora_rank, lora_alpha, target_modules, 0.0, adapter=adapter,
                        lean_backward=lean_backward)
    apply_base_storage(model, quantization, dtype)
    return model


def trace_video_step(config: dict[str, Any], *, batch_size: int, bucket: Bucket, geometry: VideoGeometry,
                     text_tokens: int, text_width: int, lora_rank: int = 16, lora_alpha: float | None = None,
                     target_modules: Any = None, gradient_checkpointing: bool = False,
                     dtype: torch.dtype | str = torch.bfloat16, device: str = "cuda", fake: bool = True,
                     attention: str = "sdpa", weighting_scheme: str = "none", adapter: Any = None,
                     lean_backward: bool = True, blocks_to_swap: int = 0, quantization: str = "none",
                     optimizer: str = "adamw", video_window: tuple[int, int, int] | None = None,
                     checkpoint_layers: int = 0, grads_before: bool = False) -> TraceResult:
    """Traces one LoRA training step of a WanTransformer3DModel or LTXVideoTransformer3DModel on
    ``batch_size`` clips of ``bucket`` (width, height, frames) with ``text_tokens`` x
    ``text_width`` prompt embeddings (and LTX-Video's prompt mask). ``blocks_to_swap``: the last N
    blocks' frozen weights in host memory (:mod:`lora_gui.models.block_swap`, the run's own code):
    counted in ``info["host_bytes"]``, their device copies in the peak. ``quantization``: the base
    weights' storage (none / fp8; applied before the swap, as the run does); ``optimizer``: adamw or
    bitsandbytes' 8-bit AdamW, as the run resolves it. ``video_window``: windowed space-time
    self-attention, traced with the blocked kernel the CPU run runs (a run on CUDA uses
    FlexAttention; :mod:`lora_gui.attention.video_window` says what each keeps).
    ``checkpoint_layers``: with ``gradient_checkpointing``, only the first N blocks are
    checkpointed, the run's own code (:mod:`lora_gui.models.checkpointing`); 0: every block.
    ``grads_before``: the LoRA gradients exist before the forward (a later micro-batch of a step).

    Raises:
        ValueError: a config that is not a video transformer's; a bucket off the model's grid;
            ``blocks_to_swap`` or ``checkpoint_layers`` off the model's block count (a ModelError).
    """
    from diffusers import FlowMatchEulerDiscreteScheduler

    from lora_gui.models import ltx
    from lora_gui.models.dit import FlowMatching
    from lora_gui.models.video import LORA_TARGETS, VIDEO_TRANSFORMERS, rope_scale_for, set_video_attention

    _check_common(batch_size, device)
    kinds = {name: kind for kind, name in VIDEO_TRANSFORMERS.items()}
    kind = kinds.get(config.get("_class_name"))
    if kind is None:
        raise ValueError(f"not a video transformer config: {config.get('_class_name')!r} (expected one of "
                         f"{', '.join(kinds)})")
    w, h, frames = bucket
    if w % geometry.grid or h % geometry.grid or (frames - 1) % geometry.temporal:
        raise ValueError(f"clip {w}x{h}x{frames} is off this model's grid ({geometry.grid} px, "
                         f"{geometry.temporal}k+1 frames)")
    dt = as_dtype(dtype)
    model = build_video_transformer(config, dtype=dt, lora_rank=lora_rank, lora_alpha=lora_alpha,
                                    target_modules=target_modules or LORA_TARGETS, adapter=adapter,
                                    lean_backward=lean_backward, quantization=quantization)
    set_video_attention(model.get_base_model(), attention, video_window)
    objective = FlowMatching(kind, FlowMatchEulerDiscreteScheduler(), weighting_scheme,
                             rope_scale=rope_scale_for(kind, geometry))
    channels = ltx.latent_channels(config) if kind == "ltx" else int(config.get("in_channels", 16))
    latent = (batch_size, channels, *geometry.latent_shape(bucket))

    def make_inputs() -> dict:
        # the cached prompt mask (LTX-Video) reaches the step in the weights' dtype, as the embeddings
        mask = torch.ones(batch_size, text_tokens, dtype=dt) if kind == "ltx" else None
        enc = types.SimpleNamespace(latents=torch.randn(latent), pooled=None, text_mask=mask,
                                    hidden=torch.randn(batch_size, text_tokens, text_width, dtype=dt))
        sigmas = torch.rand(batch_size)
        return {"enc": enc, "noise": torch.randn(latent), "sigmas": sigmas, "timesteps": sigmas * 1000,
                "draws": torch.zeros(batch_size, dtype=torch.long)}  # the run's int64 timestep draws

    def loss_fn(m: nn.Module, batch: dict, _tracker) -> torch.Tensor:
        loss = objective.loss_at(m, batch["enc"], batch["noise"], batch["sigmas"], batch["timesteps"])
        loss.held_inputs = batch  # the loop holds its batch until the backward is done
        return loss

    def swap(m: nn.Module, _make: Any) -> None:  # after the weights are made, as the run's load
        from lora_gui.models.block_swap import enable_block_swap

        enable_block_swap(m, blocks_to_swap)

    res = trace_step(model, fake=fake, device=device, make_inputs=make_inputs, loss_fn=loss_fn, head=None,
                      gradient_checkpointing=gradient_checkpointing, warm_steps=0,
                      checkpoint_layers=checkpoint_layers if gradient_checkpointing else 0,
                      autocast=run_autocast(device, dt), setup=swap if blocks_to_swap else None,
                      optimizer=optimizer, grads_before=grads_before)
    res.info.update(quantization=quantization, optimizer=optimizer, model_type=kind, batch_size=batch_size,
                    bucket=list(bucket), text_tokens=text_tokens,
                    video_window=list(video_window) if video_window else None,
                    video_tokens=batch_size * geometry.tokens(bucket), source="predicted",
                    blocks_to_swap=blocks_to_swap,
                    checkpoint_layers=checkpoint_layers if gradient_checkpointing else 0)
    return res


def trace_clip_encode_peak(model: Any, buckets: list[Bucket], device: torch.device,
                           batches: dict[Bucket, int] | None = None) -> int:
    """Largest transient bytes of encoding one clip of any of ``buckets`` (``batches``: that many
    clips of each bucket at once, as a step without a cache encodes its micro-batch) and its caption with
    the run's VAE and text encoder: the pixels, the VAE encoder's activations, the latent
    distribution and sample (fake tensors through the run's own
    :func:`lora_gui.models.diffusion.encode_latents`), then the prompt embeddings beside the
    latents (with LTX-Video's prompt mask; Wan's ``encode_prompt`` trims each prompt by its
    length, a value fake tensors do not have: its output is counted, its activations, one
    caption's, are left out)."""
    from lora_gui.models.diffusion import encode_latents

    if device.type == "cuda" and not torch.cuda.is_available():
        device = torch.device("cpu")  # a plan for a GPU made without one: the same bytes
    modules = [model.vae, *model.text_encoders]
    batches = batches or {}
    size = lambda b: batches.get(b, 1) * math.prod(b)  # noqa: E731
    largest = max(size(b) for b in buckets)
    embed = next(model.text_encoders[0].parameters())
    prompt = int(model.info["text_tokens"]) * int(model.info["text_width"]) * embed.element_size()
    if model.kind == "ltx":  # the prompt's attention mask beside it, in float32
        prompt += int(model.info["text_tokens"]) * CACHE_BYTES_PER_VALUE
    peak = 0
    for w, h, f in sorted(b for b in set(buckets) if size(b) == largest):
        n = batches.get((w, h, f), 1)
        mode = FakeTensorMode(allow_non_fake_inputs=True)
        tracker = StorageTracker()
        with torch.no_grad(), mode, _fake_weights(modules, mode, device) as fakes:
            tracker.track(fakes)
            start = tracker.live_bytes
            with tracker:
                pixels = [torch.empty(3, f, h, w) for _ in range(n)]  # load_clip's float32 (3, F, H, W)
                latents = encode_latents(model, pixels, device, sample=True)
                after = tracker.live_bytes - start  # the pixels and latents, while the prompt encodes
                del latents, pixels
        peak = max(peak, tracker.peak_bytes - start, after + n * prompt)
    return peak


def clip_held_bytes(data: VideoData, geometry: VideoGeometry, channels: int, text_tokens: int,
                    text_width: int, embed_dtype: torch.dtype, cache_mode: str, caching_pass: bool,
                    text_mask: bool = False) -> int:
    """Host bytes a video run keeps between steps: the encoded held-out clips (latents float32,
    embeddings in the encoder's dtype) and, with ``cache_latents=ram``, every training clip's
    latents and each distinct caption's embeddings (float32); ``caching_pass``: at that pass's
    peak, where a repeated caption's fresh embeddings live beside the kept copy (one more);
    ``text_mask``: each prompt's float32 attention mask beside its embeddings (LTX-Video)."""
    size = torch.empty((), dtype=embed_dtype).element_size()
    lat = lambda b: channels * math.prod(geometry.latent_shape(b)) * CACHE_BYTES_PER_VALUE  # noqa: E731
    prompt = text_tokens * text_width
    mask = text_tokens * CACHE_BYTES_PER_VALUE if text_mask else 0  # bytes of one prompt's mask
    held = sum(lat(b) + prompt * size + mask for b in data.held_buckets)
    if cache_mode == "ram":
        captions = len({item.caption for item in data.train})
        held += sum(lat(b) for b in data.buckets)
        repeated = caching_pass and captions < len(data.buckets)
        held += (captions + repeated) * (prompt * CACHE_BYTES_PER_VALUE + mask)
    return held


def video_run_prediction(cfg: RunConfig, model: Any, data: VideoData, budget: int | None,
                         device: torch.device, weights_dtype: torch.dtype,
                         world_size: int = 1) -> VideoPrediction:
    """The run's micro-batch cap per (size, frames) bucket (adaptive under a budget: the largest
    micro-batch whose traced step fits) and its predicted peak, per process.

    Raises:
        WanExportError, LtxExportError: export_kohya with an adapter ComfyUI's Wan / LTX-Video layout
            cannot hold.
    """
    from lora_gui.models.adapters import adapter_spec
    from lora_gui.models.video import lora_targets

    if cfg.export_kohya:  # ComfyUI's names for the kind (Wan's or LTX-Video's), checked before the run
        from lora_gui.models import ltx_comfy, wan_comfy

        layout = wan_comfy if model.kind == "wan" else ltx_comfy
        layout.check_exportable(model.unet, adapter_spec(cfg).kind)
    from lora_gui.models import ltx
    from lora_gui.models.video import VIDEO_TRANSFORMERS

    geometry: VideoGeometry = model.info["geometry"]
    config = {**dict(model.unet.config), "_class_name": VIDEO_TRANSFORMERS[model.kind]}
    channels = ltx.latent_channels(config) if model.kind == "ltx" else int(config.get("in_channels", 16))
    cache = cfg.resolved_cache_latents()
    encoders = (model.vae, *model.text_encoders)
    resident = 0 if cache != "off" else module_bytes(encoders)
    step = {"geometry": geometry, "text_tokens": int(model.info["text_tokens"]),
            "text_width": int(model.info["text_width"]), "lora_rank": cfg.lora_rank,
            "lora_alpha": cfg.lora_alpha, "target_modules": lora_targets(cfg.lora_targets),
            "gradient_checkpointing": cfg.gradient_checkpointing,
            "dtype": weights_dtype, "device": device.type, "attention": cfg.resolved_attn_backend(),
            "weighting_scheme": model.noise_scheduler.weighting_scheme, "adapter": adapter_spec(cfg),
            "lean_backward": cfg.resolved_lean_backward(), "blocks_to_swap": cfg.blocks_to_swap,
            "quantization": cfg.quantization, "optimizer": cfg.resolved_optimizer(device.type),
            "video_window": cfg.resolved_video_window(), "checkpoint_layers": cfg.checkpoint_layers}
    used = sorted(set(data.buckets), key=geometry.tokens)
    per_rank = math.ceil(cfg.batch_size / world_size)
    out = VideoPrediction(BatchCaps())
    embed_dtype = next(model.text_encoders[0].parameters()).dtype if model.text_encoders else torch.float32
    held, caching = (0 if device.type == "cuda" else clip_held_bytes(
        data, geometry, channels, step["text_tokens"], step["text_width"], embed_dtype, cache,
        caching_pass=p, text_mask=model.kind == "ltx") for p in (False, True))
    traces: dict[tuple[Bucket, int, bool], TraceResult] = {}
    clips = {b: min(per_rank, math.ceil(data.buckets.count(b) / world_size)) for b in used}  # a step's

    def traced(bucket: Bucket, batch: int) -> TraceResult:  # a step of micro-batches of ``batch``
        def one(size: int, grads_before: bool) -> TraceResult:
            if (bucket, size, grads_before) not in traces:
                traces[bucket, size, grads_before] = trace_video_step(
                    config, batch_size=size, bucket=bucket, grads_before=grads_before, **step)
            return traces[bucket, size, grads_before]
        return accumulated_trace(one, batch, clips[bucket])

    if budget and cfg.resolved_image_batch() == "adaptive":  # the largest micro-batch that fits
        for bucket in used:
            out.caps.caps[clip_tokens(bucket)] = largest_that_fits(
                list(range(per_rank, 0, -1)), lambda m, b=bucket: traced(b, m), budget - resident - held)[0]
    sizes = {b: min(clips[b], out.caps.cap(clip_tokens(b)) or per_rank) for b in used}
    later = {b: min(sizes[b], clips[b] - sizes[b]) for b in used}  # the largest later micro-batch
    worst = {max(used, key=lambda b: (sizes[b] * geometry.tokens(b), b))}
    if any(later.values()):
        worst.add(max(used, key=lambda b: (later[b] * geometry.tokens(b), b)))
    out.step = max((traced(b, sizes[b]) for b in sorted(worst)), key=lambda t: t.peak_bytes)
    train_peak = out.step.peak_bytes + resident + held
    modules = [*encoders] if denoiser_waits_for_cache(cache, device.type) else [model.unet, *encoders]
    # the caching pass encodes one clip at a time; without a cache each step encodes its micro-batch
    if model.unet in modules:  # swapped blocks' weights stay on the host through the pass too
        modules_bytes = module_bytes(modules) - int(out.step.info.get("host_bytes", 0) or 0)
    else:
        modules_bytes = module_bytes(modules)
    encoding = modules_bytes + caching + trace_clip_encode_peak(
        model, [*data.buckets, *data.held_buckets], device, sizes if cache == "off" else None)
    if cache == "off":  # every step encodes beside the optimizer state
        encoding += out.step.breakdown.get("optimizer_state", 0)
    if device.type == "cuda":
        encoding += CUDA_CONTEXT_BYTES + CUBLAS_WORKSPACE_BYTES
    out.step.info["encoding_pass_bytes"] = encoding
    out.peak_bytes = max(train_peak, encoding)
    out.train_peak_bytes = out.peak_bytes if cache == "off" else train_peak  # steps encode too
    return out


def bundled_video_config(name: str) -> dict[str, Any] | None:
    """A bundled video transformer config (``presets/models/<name>.json`` with its ``_vae`` and
    ``_text`` shapes), or None when ``name`` is not one."""
    import json

    from lora_gui.memory.predict.model_configs import PRESET_DIR

    path = PRESET_DIR / f"{name}.json"
    if not path.is_file():
        return None
    config = json.loads(path.read_text(encoding="utf-8"))
    video = ("WanTransformer3DModel", "LTXVideoTransformer3DModel")
    return config if config.get("_class_name") in video else None


def check_clip_shape(cfg: RunConfig, config: dict[str, Any]) -> None:
    """The run's clip on a bundled config's grid, each refusal naming its field and value (the
    trace would only say the clip is off the grid; a pipeline's clips: its data reader).

    Raises:
        VideoDataError (naming video_frames) / ConfigError (naming resolution).
    """
    from lora_gui.data.video_batches import clip_size
    from lora_gui.data.videos import check_video_frames

    geometry = shape_geometry(config)
    check_video_frames(cfg.video_frames, geometry.temporal)
    width, height = clip_size(cfg)
    if width % geometry.grid or height % geometry.grid:
        raise ConfigError(f"resolution: {width}x{height} is not a multiple of {cfg.model}'s "
                          f"{geometry.grid} px grid on both sides")


def plan_video_shape(cfg: RunConfig, config: dict[str, Any], budget: int | None,
                     device: str) -> VideoPrediction:
    """`plan` for a bundled video config (no pipeline, no data): one clip bucket, the run's
    ``resolution`` (a side or WxH) and ``video_frames``, ``batch_size`` clips a step (under a
    budget: the largest micro-batch that fits), latents and embeddings cached (the text encoder
    resident beside the step without a cache). The caching pass is not planned here (the bundled
    config has no VAE weights to trace); a run on the real pipeline plans it.

    Raises:
        VideoDataError / ConfigError: a clip off the model's grid (:func:`check_clip_shape`).
    """
    from lora_gui.data.video_batches import clip_size
    from lora_gui.models.adapters import adapter_spec
    from lora_gui.models.precision import planned_weights_dtype
    from lora_gui.models.video import lora_targets

    check_clip_shape(cfg, config)
    text = config["_text"]
    geometry = shape_geometry(config)
    bucket = (*clip_size(cfg), cfg.video_frames)
    dtype = planned_weights_dtype(cfg.precision, device)
    resident = 0 if cfg.resolved_cache_latents() != "off" else \
        int(text["encoder_params"]) * torch.empty((), dtype=dtype).element_size()
    step = {"geometry": geometry, "text_tokens": text_length_or(cfg, int(text["tokens"])),
            "text_width": int(text["width"]), "lora_rank": cfg.lora_rank, "lora_alpha": cfg.lora_alpha,
            "target_modules": lora_targets(cfg.lora_targets),
            "gradient_checkpointing": cfg.gradient_checkpointing, "dtype": dtype, "device": device,
            "attention": cfg.resolved_attn_backend(),
            "adapter": adapter_spec(cfg), "lean_backward": cfg.resolved_lean_backward(),
            "blocks_to_swap": cfg.blocks_to_swap, "quantization": cfg.quantization,
            "optimizer": cfg.resolved_optimizer(device), "video_window": cfg.resolved_video_window(),
            "checkpoint_layers": cfg.checkpoint_layers}
    out = VideoPrediction(BatchCaps())
    def traced(size: int, grads_before: bool) -> TraceResult:
        return trace_video_step(config, batch_size=size, bucket=bucket, grads_before=grads_before, **step)

    batch, out.step = largest_that_fits(halvings(cfg.batch_size),
                                        lambda b: accumulated_trace(traced, b, cfg.batch_size),
                                        budget - resident if budget else None)
    out.caps.caps = {clip_tokens(bucket): batch}
    out.peak_bytes = out.train_peak_bytes = out.step.peak_bytes + resident
    return out


def largest_that_fits(sizes: list[int], trace: Callable[[int], TraceResult],
                      budget: int | None) -> tuple[int, TraceResult]:
    """(micro-batch, its trace): the first of ``sizes`` (largest first) whose traced peak fits
    ``budget``; the last (smallest) when none does, the first without a budget.

    The peak rises with the micro-batch, so this is the answer a walk down the sizes finds, with
    fewer traces: the smallest size, then the largest, then halving the sizes between: one trace
    when not even the smallest fits (a large model on a small card, the slowest question to
    trace), two when the largest fits, about 2 + log2(len(sizes)) otherwise. Each is a trace of
    the whole step (about 20 s of CPU for a 14B transformer)."""
    traced: dict[int, TraceResult] = {}

    def fits(i: int) -> bool:
        if sizes[i] not in traced:
            traced[sizes[i]] = trace(sizes[i])
        return budget is None or traced[sizes[i]].peak_bytes <= budget

    last = len(sizes) - 1
    if budget is not None and not fits(last):
        return sizes[last], traced[sizes[last]]  # not even the smallest fits
    if fits(0):
        return sizes[0], traced[sizes[0]]
    low, high = 0, last  # sizes[low] does not fit, sizes[high] fits
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (low, mid) if fits(mid) else (mid, high)
    return sizes[high], traced[sizes[high]]


def halvings(batch_size: int) -> list[int]:
    """``batch_size``, half of it, ... 1 (the micro-batches a bundled config's plan tries)."""
    sizes = [batch_size]
    while sizes[-1] > 1:
        sizes.append(max(1, sizes[-1] // 2))
    return sizes


def shape_geometry(config: dict[str, Any]) -> VideoGeometry:
    """A shape config's clip geometry: its ``_vae`` factors and the transformer's patch (Wan's
    (t, h, w) tuple, or LTX-Video's ``patch_size`` and ``patch_size_t``)."""
    patch = config.get("patch_size", (1, 2, 2))
    vae = config["_vae"]
    patch_t, patch_s = (int(patch[0]), int(patch[1])) if isinstance(patch, (list, tuple)) else \
        (int(config.get("patch_size_t", 1)), int(patch))
    return VideoGeometry(int(vae["scale_factor_temporal"]), int(vae["scale_factor_spatial"]),
                         patch_s, patch_t)


def text_length_or(cfg: RunConfig, default: int) -> int:
    """The run's prompt length: ``text_max_length``, else the pipeline's default."""
    return int(cfg.text_max_length) or default


def shape_config(cfg: RunConfig) -> dict[str, Any]:
    """The run's transformer config with its ``_vae`` and ``_text`` shapes: a bundled one, or
    read from the pipeline built on the meta device (no weights read)."""
    config = bundled_video_config(cfg.model)
    if config is not None:
        return config
    from lora_gui.models.diffusion import image_model_for_run
    from lora_gui.models.video import VIDEO_TRANSFORMERS

    model = image_model_for_run(cfg, torch.bfloat16, weights=False)
    if model.kind not in VIDEO_TRANSFORMERS:
        raise ValueError(f"{cfg.model} is not a video pipeline")
    geometry: VideoGeometry = model.info["geometry"]
    encoder = sum(p.numel() for m in model.text_encoders for p in m.parameters())
    return {**dict(model.unet.config), "_class_name": VIDEO_TRANSFORMERS[model.kind],
            "_vae": {"scale_factor_temporal": geometry.temporal, "scale_factor_spatial": geometry.spatial},
            "_text": {"tokens": int(model.info["text_tokens"]), "width": int(model.info["text_width"]),
                      "encoder_params": encoder}}
