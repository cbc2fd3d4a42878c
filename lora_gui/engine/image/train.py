"""The image training loop: LoRA on a diffusion model's UNet, per-bucket micro-batches with
image-weighted gradient accumulation, per-step peak memory, atomic checkpoints, resume, samples.

A second readable loop next to :mod:`lora_gui.engine.text.train`, sharing its leaf helpers (run folder,
checkpoints, records, peak meter, out-of-memory guard, monitor, planner). Each memory switch is
one setting whose 'auto' follows ``mode`` (see :mod:`lora_gui.config`): ``cache_latents``,
``aspect_buckets``, ``attn_backend``, ``image_batch``, ``gradient_checkpointing``.

Loss normalisation: each micro-batch's summed per-image MSE is divided by the number of images
in the whole optimizer step, so the gradient is the same however the step is cut.
Several processes (``accelerate launch``): each global step is dealt to the ranks and the
loss divided by the step's global image count, so N processes train what one process trains with
the same global batch (see :mod:`lora_gui.engine.image.ranks`); the main process alone writes the
run folder and makes the samples. Resolution is sequence length here: a bucket of W x H px is
(W/8) x (H/8) latent tokens, the key the planner's caps and the guard use.

A video run (``task: video``) is this loop on clips: its data, encoding, bucket keys and samples
come from :mod:`lora_gui.engine.image.clips`, its step is the same flow-matching loss on video
latents, its plan :mod:`lora_gui.memory.predict.video_run`.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import shutil
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from peft import set_peft_model_state_dict

from lora_gui.config import ConfigError, RunConfig
from lora_gui.data.batching import Step
from lora_gui.data.image_batches import (  # noqa: F401  (re-exported)
    Bucket,
    ImageData,
    epoch_plan,
    latent_tokens,
    load_image_data,
    resolution_names,
    table_batch,
)
from lora_gui.engine.core.checkpoint import latest_checkpoint, save_checkpoint, write_atomic
from lora_gui.engine.core.control import TrainControl
from lora_gui.engine.core.distributed import (
    DEBUG_SAMPLES_ENV,
    INJECT_OOM_ENV,
    STOP_FILE,
    Dist,
    check_world_size,
    combine_step_stats,
    injected_oom,
)
from lora_gui.engine.core.loop import optimizer_step, run_loop, step_shape
from lora_gui.engine.core.optim import make_optimizer
from lora_gui.engine.core.preflight import writes_run_folder
from lora_gui.engine.core.resume import read_resume_checkpoint
from lora_gui.engine.core.rundir import prepare_run_dir, save_run_config
from lora_gui.engine.core.session import RunSession
from lora_gui.engine.core.setup import (
    attach_trackers,
    cosine_scheduler,
    new_accelerator,
    open_logs,
    run_device,
    start_state,
)
from lora_gui.engine.core.speed import headroom, run_peak, step_speed
from lora_gui.engine.core.state import TrainState
from lora_gui.engine.core.trackers import check_trackers, closing_values
from lora_gui.engine.image import clips
from lora_gui.engine.image.inputs import InputSource, build_inputs, eval_loss
from lora_gui.engine.image.ranks import (
    image_noise,
    image_sampler_state,
    prepare_image,
    rank_share,
    refuse_fsdp,
)
from lora_gui.engine.image.samples import generate_samples, sample_prompts
from lora_gui.engine.image.speed import BucketFlops
from lora_gui.engine.image.summary import image_summary
from lora_gui.memory.predict.encode_trace import denoiser_waits_for_cache
from lora_gui.memory.predict.image_run import image_run_prediction
from lora_gui.memory.predict.trace_result import CUDA_CONTEXT_BYTES
from lora_gui.memory.runtime.cuda_context import budget_for_plan
from lora_gui.memory.runtime.guard import MicroBatchOutOfMemory, free_memory
from lora_gui.memory.runtime.meter import GB, PeakMeter
from lora_gui.models import diffusion as dm
from lora_gui.models import diffusion_files, text_encoder_lora
from lora_gui.models.denoise import unet_loss
from lora_gui.models.precision import choose_precision, weights_dtype

log = logging.getLogger(__name__)


@dataclass(kw_only=True)
class ImageSession(RunSession):
    """An image run: the shared session (``model`` is the UNet with LoRA) plus the pipeline's
    other parts, the images, their encoded inputs and the caching pass's figures.

    Attributes:
        pipeline: VAE, text encoders, tokenizers and noise scheduler (encoders freed once cached).
        eval_set: the encoded held-out images (main process).
        dtype: frozen weights' dtype (the compute dtype on GPUs, fp32 on a CPU).
        cache_seconds, cache_peak_bytes: the one-time caching pass (0 without a cache).
        optimizer_name: adamw or adamw8bit, as resolved.
    """

    pipeline: dm.ImageModel
    data: ImageData
    inputs: InputSource
    eval_set: list
    dtype: torch.dtype
    cache_seconds: float = 0.0
    cache_peak_bytes: int = 0
    optimizer_name: str = "adamw"
    flop_counts: BucketFlops = field(default_factory=BucketFlops)  # useful FLOPs per image, by bucket

    def trainable(self) -> list[torch.nn.Parameter]:
        """The UNet's LoRA weights and, with train_text_encoder, the text encoders' (the optimizer's
        parameter groups)."""
        return [p for group in self.optimizer.param_groups for p in group["params"]]

    def checkpoint(self, reason: str) -> None:
        """The shared checkpoint plus the text encoders' LoRA weights when they train."""
        if not self.dist.is_main:
            return
        path = save_checkpoint(self.out, self.state.step, self.accelerator.unwrap_model(self.model),
                               self.optimizer, self.scheduler, self.state.to_dict())
        text_encoder_lora.save_checkpoint_part(path, self.pipeline)
        self.event({"event": "checkpoint", "reason": reason, "path": str(path)})


def _load_model(cfg: RunConfig, device: torch.device) -> tuple[dm.ImageModel, str, torch.dtype]:
    """The pipeline parts on the device with LoRA on the UNet and the run's attention kernel."""
    mixed = choose_precision(cfg.precision, device)  # CPU 'auto': fp32 (no probe for images)
    dtype = weights_dtype(mixed, device.type)
    model = dm.image_model_for_run(cfg, dtype)
    waits = denoiser_waits_for_cache(cfg.resolved_cache_latents(), device.type)
    for module in (model.vae, *model.text_encoders, *([] if waits else [model.unet])):
        module.to(device)  # a waiting denoiser joins after the caching pass (see image_run)
    model.unet.train()
    return model, mixed, dtype


def _prepare_folder(out: Path, resume: bool, overwrite: bool) -> None:
    """The run folder's decisions (the main process's; see Dist.on_main)."""
    prepare_run_dir(out, resume=resume, overwrite=overwrite)
    if not resume:  # image-only leftovers of a replaced run (not in the shared RUN_FILES list)
        for name in ("samples", "cache"):
            shutil.rmtree(out / name, ignore_errors=True)
    (out / STOP_FILE).unlink(missing_ok=True)


def _setup(cfg: RunConfig, out: Path, resume: bool, overwrite: bool,
           control: TrainControl) -> ImageSession:
    """Validates, loads data and model, caches, restores a checkpoint, plans memory. Folder
    decisions are the main process's, broadcast with any error to every rank."""
    refuse_fsdp()  # before anything is written, on every rank
    check_trackers(cfg)  # a missing tracker package or login: refused before any work
    dist = Dist.from_env()
    dist.on_main(lambda: _prepare_folder(out, resume, overwrite))
    control.phase("loading")
    data = clips.load_run_data(cfg)  # pictures, or a video run's clips
    if dist.active:
        check_world_size(dist.world_size, len(data.train), cfg.batch_size)
    if not resume:
        dist.on_main(lambda: save_run_config(out, cfg))
    sampler = image_sampler_state(cfg, data.buckets)
    device = run_device(dist)
    budget = int(cfg.budget_gb * GB) or None
    plan_budget, card_context = budget_for_plan(budget, device, CUDA_CONTEXT_BYTES)
    dtype = weights_dtype(choose_precision(cfg.precision, device), device.type)

    def plan() -> tuple:  # the form and `plan` call the same function on the same meta-device pipeline
        # planned before the weights are loaded: the plan reads shapes only, and the speed timing it
        # runs builds a second denoiser, which must not sit beside the loaded one on a GPU
        shapes = dm.image_model_for_run(cfg, dtype, weights=False)
        planned = image_run_prediction(cfg, shapes, data, plan_budget, device, dtype, dist.world_size)
        return (planned.caps, planned.peak_bytes, {**planned.figures(device.type), **card_context},
                planned.applied(cfg).gradient_checkpointing)

    caps, predicted, prediction, checkpointing = dist.on_main(plan)
    asked = cfg  # run.json keeps the settings as given; the run trains with the plan's choice
    if checkpointing != cfg.gradient_checkpointing:  # every rank: the main process's choice
        cfg = replace(cfg, gradient_checkpointing=checkpointing)
        log.info("gradient checkpointing off: the plan predicts the run faster without it, inside the "
                 "budget (%s images/s against %s)", *_speeds(prediction))
    model, mixed, dtype = _load_model(cfg, device)
    ckpt = dist.on_main(lambda: read_resume_checkpoint(out, sampler, model.unet)) if resume else None
    if ckpt is not None:  # a resumed run keeps the precision it started with
        set_peft_model_state_dict(model.unet, ckpt["adapter"])
        text_encoder_lora.load_checkpoint_part(latest_checkpoint(out), model)
        mixed = ckpt["trainer"]["precision"]
    if resume:
        dist.on_main(lambda: save_run_config(out, asked))
    meter = PeakMeter(device, budget, every_step=cfg.measure_every_step)
    modules = (model.unet, model.vae, *model.text_encoders)
    meter.track(t for m in modules for t in (*m.parameters(), *m.buffers()))
    inputs, eval_set, cache = build_inputs(cfg, out, model, data, device, meter, control, dist)
    model.unet.to(device)  # no-op unless it waited for the cache
    accelerator = new_accelerator(device, mixed)
    per_epoch = len(clips.epoch_plan(cfg, data, 0))
    total = cfg.max_steps or per_epoch * cfg.epochs
    optimizer, optimizer_name = make_optimizer(cfg, text_encoder_lora.param_groups(model, cfg), device)
    scheduler = cosine_scheduler(cfg, optimizer, total)
    unet, optimizer, scheduler = prepare_image(accelerator, dist, model.unet, optimizer, scheduler)
    state = start_state(cfg, out, ckpt, resume, optimizer, scheduler,
                        TrainState(precision=mixed, optimizer=optimizer_name), sampler, dist)
    if state.base_eval_loss is None and dist.is_main:
        state.base_eval_loss = eval_loss(unet, model.noise_scheduler, eval_set, device, dtype)
    meter.track(t for s in optimizer.state.values() for t in s.values() if torch.is_tensor(t))
    flop_counts = BucketFlops()  # useful FLOPs of every bucket, counted once before the loop
    flop_counts.count_buckets(inputs, data.buckets, dtype, cfg.seed, unet, model.noise_scheduler)
    metrics, events = open_logs(out, state, resume, dist)
    session = ImageSession(
        cfg=cfg, out=out, control=control, dist=dist, accelerator=accelerator, model=unet,
        optimizer=optimizer, scheduler=scheduler, state=state, metrics=metrics, events=events,
        meter=meter, caps=caps, predicted=predicted, per_epoch=per_epoch, total=total, pipeline=model,
        data=data, inputs=inputs, eval_set=eval_set, dtype=dtype, cache_seconds=cache["cache_seconds"],
        cache_peak_bytes=cache["cache_peak_bytes"], optimizer_name=optimizer_name, prediction=prediction,
        flop_counts=flop_counts,
        peak=run_peak(accelerator.device, accelerator.mixed_precision, unet, headroom(predicted, meter)),
        trackers=attach_trackers(cfg, out, state, resume, dist, metrics, meter.source))
    session.plan_event(budget, **cache, optimizer=optimizer_name,
                       bucket_names=clips.bucket_names(data))
    return session


def _speeds(prediction: dict[str, Any]) -> tuple[str, str]:
    """The predicted images/s without and with checkpointing, for the log line."""
    speed = prediction["image_checkpointing"]["predicted_images_per_s"]
    return f"{speed['off']:,.2f}", f"{speed['on']:,.2f}"


def run_image_step(run: ImageSession, step: Step, n_images: int | None = None) -> dict[str, Any]:
    """Forward + backward of every micro-batch of one optimizer step (no optimizer update).

    ``n_images``: the loss normaliser; with several ranks, the images of the *global* step
    (default: this step's own). Filler micro-batches (a rank's share ran out of images) train
    nothing. Each image's noise and timestep come from :func:`image_noise` (seeded per image).
    """
    n_images = n_images or len(step.indices)
    loss_sum = 0.0
    sched = run.pipeline.noise_scheduler
    for mb in step.micro_batches:
        if mb.filler:
            continue
        try:
            enc = run.inputs.batch(mb.indices, run.dtype, run.state.step + 1)
            noise, timesteps = image_noise(run.cfg.seed, run.state.step + 1, mb.indices,
                                           enc.latents.shape[1:], sched.config.num_train_timesteps,
                                           enc.latents.device)
            run.flop_counts.offer(enc, noise, timesteps)
            loss = unet_loss(run.model, sched, enc, noise, timesteps, reduction="sum") / n_images
            run.accelerator.backward(loss)
        except torch.OutOfMemoryError as err:
            raise MicroBatchOutOfMemory(mb, err) from None
        loss_sum += loss.item()
        del loss, enc, noise
    return {"loss": loss_sum, "images": sum(len(mb.indices) for mb in step.micro_batches if not mb.filler)}


def _run_share(run: ImageSession, step: Step) -> dict[str, Any]:
    """This rank's share of a global step (the guard's runner, caps applied): forward and backward."""
    mine = rank_share(step, run.dist, run.caps.cap if run.caps.caps else None)
    if injected_oom(run.dist.rank, run.state.step + 1):
        big = max(mine.micro_batches, key=lambda mb: len(mb.indices))
        raise MicroBatchOutOfMemory(big, torch.OutOfMemoryError("injected by " + INJECT_OOM_ENV))
    stats = run_image_step(run, mine, len(step.indices))
    indices = [i for mb in mine.micro_batches if not mb.filler for i in mb.indices]
    return {**stats, "indices": indices, "micro_batches": len(mine.micro_batches)}


def _one_step(run: ImageSession, step: Step, epoch: int) -> dict[str, Any]:
    """One optimizer step; returns its metric record (every rank's figures combined)."""
    bucket = run.data.buckets[step.indices[0]]  # (w, h) px, or (w, h, frames) for a clip
    stats, seconds = optimizer_step(run, step, lambda st: _run_share(run, st),
                                    shape=step_shape(step, other=bucket))
    total = combine_step_stats(run.dist, run.meter.step_peak(), stats["loss"], stats["images"], 0)
    images = total["real_tokens"]  # combine_step_stats sums the count it is given: images here
    record = {"step": run.state.step, "total_steps": run.total, "epoch": epoch, "loss": total["loss"],
              "lr": run.scheduler.get_last_lr()[0], "images": images, "bucket": clips.bucket_name(bucket),
              "latent_tokens": clips.bucket_key(run.data, bucket), "batch_size": len(step.indices),
              "micro_batches": stats["micro_batches"], "seconds": seconds,
              "images_per_s": images / seconds, "peak_bytes": total["peak_bytes"],
              "peak_bytes_by_rank": total["peak_bytes_by_rank"], "memory_source": run.meter.source,
              "time": time.time()}
    host = run.meter.step_host_peak()
    if host:  # block swap's host weights (tracker, CPU run)
        record["host_peak_bytes"] = host
    run.flop_counts.count_pending(run.model, run.pipeline.noise_scheduler)  # a bucket not counted yet
    record.update(step_speed(run.flop_counts.step(images), seconds, run.peak, run.dist.world_size))
    if os.environ.get(DEBUG_SAMPLES_ENV) == "1":
        record["samples_by_rank"] = run.dist.gather_to_main(stats["indices"])
    return record


@writes_run_folder(clips.load_run_data)  # inputs checked before a run is replaced; lock released
def train_image(cfg: RunConfig, out: str | Path, *, resume: bool = False, overwrite: bool = False,
                control: TrainControl | None = None, progress: bool = True) -> dict[str, Any]:
    """Trains a UNet LoRA and writes the run folder; returns the run.json summary.

    Args:
        cfg: validated settings with ``task='image'`` (for a resume, the run's saved config).
        out: run folder (adapter/, samples/, metrics.jsonl, events.jsonl, memory.jsonl,
            run.json, checkpoints/).
        resume: continue from the newest checkpoint in ``out``.
        overwrite: replace a run that ``out`` already holds.
        control: stop request and record listener (the UI's job uses it).
        progress: show a progress bar.
    """
    if cfg.task not in ("image", "video"):
        raise ConfigError(f"task: train_image needs task=image or video, got {cfg.task!r}")
    out = Path(out)
    control = control or TrainControl()
    run = _setup(cfg, out, resume, overwrite, control)
    status, message = run_loop(run, lambda epoch: clips.epoch_plan(cfg, run.data, epoch),
                               lambda step, epoch: _one_step(run, step, epoch), progress)
    control.phase("saving")
    run.checkpoint(status)
    control.phase("evaluating")
    final_eval = None
    try:  # the main process evaluates (the LoRA weights are the same on every rank)
        if run.dist.is_main:
            final_eval = eval_loss(run.model, run.pipeline.noise_scheduler, run.eval_set,
                                   run.accelerator.device, run.dtype)
    except torch.OutOfMemoryError as err:
        log.warning("evaluation ran out of memory: %s", err)
    control.phase("saving")
    adapter = out / "adapter"
    if run.dist.is_main:
        adapter = diffusion_files.save_adapter(run.pipeline, out, cfg.export_kohya)
    summary = image_summary(run, status, message, final_eval, adapter)
    if not run.dist.is_main:  # samples and run.json are the main process's
        return summary
    write_atomic(out / "run.json", json.dumps(summary, indent=1))
    prompts, source, device = sample_prompts(run.data, cfg.sample_images), run.pipeline.source, \
        run.accelerator.device.type
    trackers, last_step = run.trackers, run.state.step
    if prompts and status == "completed":
        control.phase("sampling")
        del run  # free the training UNet, optimizer and caches before the pipeline loads
        gc.collect()
        free_memory()
        try:
            sample = clips.generate_clips if cfg.task == "video" else generate_samples
            summary["samples"] = sample(cfg, source, adapter, prompts, out, device)
        except torch.OutOfMemoryError as err:
            log.warning("sampling ran out of memory: %s", err)
        write_atomic(out / "run.json", json.dumps(summary, indent=1))
    if trackers is not None:
        trackers.images([Path(p) for p in summary.get("samples") or []], last_step)
        trackers.finish(closing_values(summary), last_step)
    return summary
