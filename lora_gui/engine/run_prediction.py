"""The memory plan of a run, in one place: what the engine plans when it starts, and what the form
shows before it starts.

``text_memory_plan`` and ``image_memory_plan`` are the functions the text and image engines call
in their ``_memory_plan`` (micro-batch caps per bucket under the budget and the predicted peak of
the run's largest micro-batch). :func:`predict_run` builds the same inputs without loading any
weights (the run's real data buckets, the model's shapes from its config files) and calls the
same function, so the form's figure is the figure the run will log. :func:`estimate_run` is the
instant closed-form estimate the form shows while the plan is computed.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any

import torch

from lora_gui.config import RunConfig
from lora_gui.memory.predict import planner
from lora_gui.memory.predict.parallel import Parallel
from lora_gui.memory.predict.pipeline_shapes import pipeline_sizes, pipeline_text_encoders
from lora_gui.memory.predict.trace import TraceResult

log = logging.getLogger(__name__)


@dataclass
class RunPrediction:
    """What the planner says about a run (source: predicted)."""

    peak_bytes: int
    device: str
    how: str  # "plan" (the run's own function) or "estimate" (closed form, instant)
    caps: dict[int, int] = field(default_factory=dict)  # micro-batch per bucket (latent / tokens)
    plan: planner.Plan | None = None
    step: TraceResult | None = None
    bucket_batches: list[tuple[str, int]] = field(default_factory=list)  # (bucket, micro-batch)


# -- the engines' functions ------------------------------------------------------------------
def text_memory_plan(cfg: RunConfig, source: str | None, budget: int | None, device: str,
                     parallel: Parallel | None = None, lengths: list[int] | None = None,
                     added_tokens: int | None = None,
                     ) -> tuple[dict[int, int], TraceResult, planner.Plan | None, dict[str, Any]]:
    """Text run: caps per length bucket under the budget (bucketed batching only), the trace of
    the worst micro-batch the run will execute on its real data (:func:`predict_run` of
    :mod:`lora_gui.memory.predict.run_predict`), the plan (None without a budget or with fixed/packed
    batches) and the prediction's figures (peak, device, kernel, micro-batch).

    Args:
        lengths: token lengths of the training samples (the run passes them; the form lets the
            planner read and tokenize the data as the run will).
        added_tokens: embedding rows the run added for a chat template's tokens (the run passes
            them with ``lengths``; the form lets the planner read them from the data).
    """
    from lora_gui.memory.predict import run_plan
    from lora_gui.memory.predict.run_predict import predict_run as predict_text_run
    from lora_gui.memory.runtime.guard import BatchCaps

    caps, plan = BatchCaps(), None
    if budget and cfg.resolved_batching() == "bucketed":
        plan = run_plan.plan_run(cfg, budget, device, source, parallel=parallel)
        caps.caps = {int(b.bucket): max(1, b.micro_batch) for b in plan.buckets}
    pred = predict_text_run(cfg, device, source, lengths=lengths, parallel=parallel, caps=caps,
                            added_tokens=added_tokens)
    return caps.caps, pred.step, plan, pred.to_json()


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
    from lora_gui.data.image_batches import latent_tokens, table_batch
    from lora_gui.memory.predict.trace import trace_unet_step
    from lora_gui.models.diffusion import lora_targets

    used = sorted(set(buckets), key=lambda b: b[0] * b[1])
    step = {"lora_rank": cfg.lora_rank, "gradient_checkpointing": cfg.gradient_checkpointing,
            "dtype": weights_dtype, "device": device}
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

    sizes = {b: min(per_rank, cap(b), math.ceil(buckets.count(b) / world_size)) for b in used}
    worst = max(used, key=lambda b: sizes[b] * b[0] * b[1])
    traced = trace_unet_step(unet_config, batch_size=sizes[worst], resolution=(worst[1], worst[0]),
                             target_modules=lora_targets(cfg), lora_alpha=cfg.lora_alpha,
                             attention=cfg.resolved_attn_backend(), text_seq_len=text_seq_len, **step)
    resident = 0 if cfg.resolved_cache_latents() != "off" else resident_bytes
    peak = traced.peak_bytes + resident
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
            log.info("the encoding pass (%.0f MiB) is this run's predicted peak, above its training "
                     "step (%.0f MiB)", encoding / 2**20, peak / 2**20)
            peak = encoding
    return caps, traced, peak, plan


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


# -- the form ----------------------------------------------------------------------------------
def run_device() -> str:
    """Where a run started here trains: 'cuda' when torch sees a GPU, else 'cpu'."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def predict_run(cfg: RunConfig, processes: int = 1, device: str | None = None) -> RunPrediction:
    """The plan the run will make when it starts (same function, same inputs; no weights loaded).

    Raises:
        UserError: the model or data cannot be read (the message names it).
        ValueError / NotImplementedError: the planner cannot trace this model.
    """
    device = device or run_device()
    from lora_gui.memory.runtime.meter import GB

    budget = int(cfg.budget_gb * GB) or None  # as the engines read budget_gb
    if cfg.task == "image":
        return _predict_image(cfg, budget, device, processes)
    from lora_gui.models.text import resolve_model_source

    parallel = Parallel(processes, False) if processes > 1 else None
    caps, step, plan, _ = text_memory_plan(cfg, resolve_model_source(cfg.model), budget, device, parallel)
    rows = [(str(k), v) for k, v in sorted(caps.items())]
    return RunPrediction(step.peak_bytes, device, "plan", caps, plan, step, rows)


def _predict_image(cfg: RunConfig, budget: int | None, device: str, processes: int) -> RunPrediction:
    from lora_gui.data.image_batches import load_image_data
    from lora_gui.memory.predict.image_run_plan import unet_config_for
    from lora_gui.models.diffusion import resolve_pipeline_source
    from lora_gui.models.precision import planned_weights_dtype

    source = resolve_pipeline_source(cfg.model)
    dtype = planned_weights_dtype(cfg.precision, device)
    data = load_image_data(cfg)
    seq_len, resident = pipeline_sizes(source, dtype)
    caps, traced, peak, plan = image_memory_plan(cfg, unet_config_for(cfg), data.buckets, seq_len,
                                                 resident, budget, device, dtype, processes, source)
    if cfg.train_text_encoder:  # as engine/image/train.py adds it to the run's prediction
        from lora_gui.memory.predict.text_encoder_step import encoders_training_bytes

        peak += encoders_training_bytes(pipeline_text_encoders(source), cfg,
                                        traced.info.get("batch_size") or 1, dtype, device)
    from lora_gui.data.image_batches import latent_tokens

    used = sorted(set(data.buckets), key=lambda b: b[0] * b[1])
    rows = [(f"{w}x{h}", caps.get(latent_tokens((w, h)), min(cfg.batch_size, data.buckets.count((w, h)))))
            for w, h in used]
    return RunPrediction(peak, device, "plan", caps, plan, traced, rows)


def estimate_run(cfg: RunConfig, device: str | None = None) -> RunPrediction:
    """Instant closed-form estimate of the run's largest micro-batch (the form shows it while
    :func:`predict_run` computes the plan)."""
    from lora_gui.memory.predict import run_plan
    from lora_gui.memory.predict.image_run_plan import estimated_image_step

    device = device or run_device()
    step = estimated_image_step(cfg, device) if cfg.task == "image" else run_plan.estimated_step(cfg, device)
    return RunPrediction(step.peak_bytes, device, "estimate", step=step)
