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
"""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import math
import os
import random
import shutil
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.state import AcceleratorState
from peft import set_peft_model_state_dict
from tqdm.auto import tqdm
from transformers import get_cosine_schedule_with_warmup

from lora_gui.config import ConfigError, RunConfig
from lora_gui.data import images as image_data
from lora_gui.data.batching import MicroBatch, Step
from lora_gui.engine.core.checkpoint import (
    latest_checkpoint,
    restore_training_state,
    save_checkpoint,
    write_atomic,
)
from lora_gui.engine.parallel.distributed import (
    DEBUG_SAMPLES_ENV,
    INJECT_OOM_ENV,
    STOP_FILE,
    Dist,
    SampleRelay,
    agree_on_oom,
    check_world_size,
    combine_step_stats,
    injected_oom,
    stop_agreed,
)
from lora_gui.engine.image.inputs import InputSource, build_inputs, eval_loss, unet_loss
from lora_gui.engine.image.ranks import (
    image_noise,
    image_sampler_state,
    prepare_image,
    rank_share,
    refuse_fsdp,
    zero_missing_grads,
)
from lora_gui.engine.image.samples import generate_samples, sample_prompts
from lora_gui.engine.image.summary import image_summary
from lora_gui.engine.core.precision import choose_precision
from lora_gui.engine.core.records import RecordLog
from lora_gui.engine.core.resume import read_resume_checkpoint
from lora_gui.engine.core.rundir import prepare_run_dir, save_run_config
from lora_gui.engine.text.train import TrainControl
from lora_gui.memory.guard import (
    BatchCaps,
    MicroBatchOutOfMemory,
    RunOutOfMemoryError,
    free_memory,
    run_guarded,
)
from lora_gui.memory.meter import GB, PeakMeter
from lora_gui.memory.monitor import MemoryMonitor
from lora_gui.models import diffusion as dm
from lora_gui.models import text_encoder_lora

log = logging.getLogger(__name__)
Bucket = tuple[int, int]  # (width, height) px


@dataclass
class ImageData:
    """Training images with their buckets, and the held-out images."""

    train: list[image_data.ImageItem]
    buckets: list[Bucket]
    held_out: list[image_data.ImageItem]


def load_image_data(cfg: RunConfig) -> ImageData:
    """Reads the folder, holds out ``eval_fraction`` of it (seeded) and assigns buckets."""
    image_data.check_resolution(cfg.resolution)
    items = image_data.load_image_folder(cfg.data_path())
    order = list(range(len(items)))
    random.Random(cfg.seed).shuffle(order)
    n_eval = min(len(items) - 1, math.ceil(len(items) * cfg.eval_fraction)) if cfg.eval_fraction else 0
    held = sorted(order[:n_eval])
    train = [items[i] for i in sorted(order[n_eval:])]
    if cfg.resolved_aspect_buckets():
        choices = image_data.make_buckets(cfg.resolution, cfg.bucket_max_ratio)
    else:  # traditional: every image resized and centre-cropped to a square
        choices = [(cfg.resolution, cfg.resolution)]
    train, buckets = image_data.assign_buckets(train, choices, cfg.bucket_no_upscale)
    return ImageData(train, buckets, [items[i] for i in held])


def latent_tokens(bucket: Bucket) -> int:
    """Latent pixels of a bucket: the UNet's sequence length at its first level."""
    return (bucket[0] // 8) * (bucket[1] // 8)


def table_batch(cfg: RunConfig, bucket: Bucket) -> int:
    """batch_table's micro-batch for the smallest listed resolution whose area covers the bucket."""
    table = cfg.batch_by_resolution()
    covering = [r for r in sorted(table) if r * r >= bucket[0] * bucket[1]]
    return table[covering[0]] if covering else 1


def epoch_plan(cfg: RunConfig, buckets: list[Bucket], epoch: int) -> list[Step]:
    """Steps of ``batch_size`` same-bucket images (the last of a bucket may be smaller), in a
    seeded order; one micro-batch each (the caps of the guard cut them when adaptive)."""
    groups: dict[Bucket, list[int]] = defaultdict(list)
    for i, b in enumerate(buckets):
        groups[b].append(i)
    rng = random.Random(cfg.seed * 1_000_003 + epoch)
    steps = []
    for bucket in sorted(groups):
        idx = groups[bucket]
        rng.shuffle(idx)
        for start in range(0, len(idx), cfg.batch_size):
            chunk = tuple(idx[start : start + cfg.batch_size])
            steps.append(Step((MicroBatch(chunk, latent_tokens(bucket)),)))
    rng.shuffle(steps)
    return steps


def _memory_plan(cfg: RunConfig, model: dm.ImageModel, data: ImageData, budget: int | None,
                 device: torch.device, weights_dtype: torch.dtype,
                 world_size: int = 1) -> tuple[BatchCaps, int | None]:
    """Micro-batch caps per bucket (adaptive: the planner under a budget, else batch_table) and
    the predicted peak of the run's largest micro-batch (source: predicted; fake-tensor trace
    of the UNet step plus the VAE / text encoders when they stay resident), per process: with
    several, a process trains at most ceil(batch_size / world_size) images of a step."""
    from lora_gui.memory import planner
    from lora_gui.memory.trace import trace_unet_step

    if dm.dit.is_dit_kind(model.kind):  # SD3 / Flux: flow-matching step, patch-size checks
        from lora_gui.engine.image.dit_run import dit_memory_plan

        return dit_memory_plan(cfg, model, data, budget, device, weights_dtype, world_size)
    caps = BatchCaps()
    used = sorted(set(data.buckets), key=lambda b: b[0] * b[1])
    unet_config = {**dict(model.unet.config), "_class_name": "UNet2DConditionModel"}
    step = {"lora_rank": cfg.lora_rank, "gradient_checkpointing": cfg.gradient_checkpointing,
            "dtype": weights_dtype, "device": device.type}
    if cfg.resolved_image_batch() == "adaptive":
        if budget:
            plan = planner.plan_image(unet_config, budget, [(b[1], b[0]) for b in used],
                                      effective_batch=cfg.batch_size, max_batch=cfg.batch_size, **step)
            caps.caps = {latent_tokens((p.bucket[1], p.bucket[0])): max(1, p.micro_batch)
                         for p in plan.buckets}
        else:
            caps.caps = {latent_tokens(b): min(cfg.batch_size, table_batch(cfg, b)) for b in used}
    per_rank = math.ceil(cfg.batch_size / world_size)
    sizes = {b: min(per_rank, caps.cap(latent_tokens(b)) or per_rank,
                    math.ceil(data.buckets.count(b) / world_size)) for b in used}
    worst = max(used, key=lambda b: sizes[b] * b[0] * b[1])
    predicted = None
    try:
        traced = trace_unet_step(unet_config, batch_size=sizes[worst], resolution=(worst[1], worst[0]),
                                 target_modules=dm.lora_targets(cfg), lora_alpha=cfg.lora_alpha,
                                 attention=cfg.resolved_attn_backend(),
                                 text_seq_len=model.tokenizers[0].model_max_length, **step)
        resident = 0 if cfg.resolved_cache_latents() != "off" else sum(
            p.numel() * p.element_size() for m in (model.vae, *model.text_encoders) for p in m.parameters())
        predicted = traced.peak_bytes + resident + text_encoder_lora.training_bytes(
            model, cfg, sizes[worst], weights_dtype, device.type)
    except (ValueError, NotImplementedError, RuntimeError) as err:  # prediction is advisory
        log.warning("no memory prediction for %s: %s", cfg.model, err)
    return caps, predicted


def _make_optimizer(cfg: RunConfig, params: list[torch.nn.Parameter], device: torch.device):
    """AdamW, or bitsandbytes' 8-bit AdamW (optimizer state in 8 bits: 2 bytes/param instead of 8)."""
    choice = cfg.optimizer
    has_bnb = device.type == "cuda" and _bitsandbytes_present()
    if choice == "auto":
        choice = "adamw8bit" if cfg.mode == "optimized" and has_bnb else "adamw"
    if choice == "adamw8bit":
        if not has_bnb:
            raise ConfigError("optimizer: adamw8bit needs bitsandbytes and a CUDA GPU")
        import bitsandbytes as bnb

        return bnb.optim.AdamW8bit(params, lr=cfg.lr, weight_decay=cfg.weight_decay), choice
    return torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay), choice


def _bitsandbytes_present() -> bool:
    import importlib.util

    return importlib.util.find_spec("bitsandbytes") is not None


@dataclass
class _Session:
    """Everything one image run holds while it trains (built by :func:`_setup`)."""

    cfg: RunConfig
    out: Path
    data: ImageData
    model: dm.ImageModel
    inputs: InputSource
    eval_set: list
    accelerator: Accelerator
    unet: Any
    optimizer: Any
    scheduler: Any
    state: dict[str, Any]
    metrics: RecordLog
    events: RecordLog
    meter: PeakMeter
    caps: BatchCaps
    predicted: int | None
    per_epoch: int
    total: int
    control: TrainControl
    dtype: torch.dtype
    info: dict[str, Any]
    dist: Dist

    def event(self, event: dict[str, Any]) -> None:
        """Appends to events.jsonl and tells the listener."""
        event = {"step": self.state["step"], "time": time.time(), **event}
        self.events.append(event)
        self.control.emit(event)

    def checkpoint(self, reason: str) -> None:
        """Saves a checkpoint from the main process (LoRA weights are the same on every rank)."""
        if not self.dist.is_main:
            return
        path = save_checkpoint(self.out, self.state["step"], self.accelerator.unwrap_model(self.unet),
                               self.optimizer, self.scheduler, self.state)
        text_encoder_lora.save_checkpoint_part(path, self.model)
        self.event({"event": "checkpoint", "reason": reason, "path": str(path)})

    def on_oom(self, event: dict[str, Any]) -> None:
        self.event({**event, "step": self.state["step"] + 1})
        log.warning("step %d: %s", self.state["step"] + 1, event["message"])


def _load_model(cfg: RunConfig, device: torch.device) -> tuple[dm.ImageModel, str, torch.dtype]:
    """The pipeline parts on the device with LoRA on the UNet and the run's attention kernel."""
    source = dm.resolve_pipeline_source(cfg.model)
    mixed = choose_precision(cfg.precision, device)  # CPU 'auto': fp32 (no probe for images)
    weights = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(mixed) if device.type == "cuda" else None
    dtype = weights or torch.float32
    model = dm.load_image_model(source, dtype, cfg)
    torch.manual_seed(cfg.seed)  # LoRA init
    dm.attach_unet_lora(model.unet, cfg)
    text_encoder_lora.attach(model, cfg)  # SD 1.x / SDXL with train_text_encoder
    dm.set_attention_backend(model.unet, cfg.resolved_attn_backend())
    if cfg.gradient_checkpointing:
        model.unet.enable_gradient_checkpointing()
    for module in (model.unet, model.vae, *model.text_encoders):
        module.to(device)
    model.unet.train()
    return model, mixed, dtype


def _prepare_folder(out: Path, resume: bool, overwrite: bool) -> None:
    """The run folder's decisions (the main process's; see Dist.on_main)."""
    prepare_run_dir(out, resume=resume, overwrite=overwrite)
    if not resume:  # image-only leftovers of a replaced run (not in the shared RUN_FILES list)
        for name in ("samples", "cache"):
            shutil.rmtree(out / name, ignore_errors=True)
    (out / STOP_FILE).unlink(missing_ok=True)


def _setup(cfg: RunConfig, out: Path, resume: bool, overwrite: bool, control: TrainControl) -> _Session:
    """Validates, loads data and model, caches, restores a checkpoint, plans memory. Folder
    decisions are the main process's, broadcast with any error to every rank."""
    refuse_fsdp()  # before anything is written, on every rank
    dist = Dist.from_env()
    dist.on_main(lambda: _prepare_folder(out, resume, overwrite))
    control.phase("loading")
    data = load_image_data(cfg)
    if dist.active:
        check_world_size(dist.world_size, len(data.train), cfg.batch_size)
    if not resume:
        dist.on_main(lambda: save_run_config(out, cfg))
    sampler = image_sampler_state(cfg, data.buckets)
    device = dist.device if dist.active else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model, mixed, dtype = _load_model(cfg, device)
    ckpt = dist.on_main(lambda: read_resume_checkpoint(out, sampler, model.unet)) if resume else None
    if ckpt is not None:  # a resumed run keeps the precision it started with
        set_peft_model_state_dict(model.unet, ckpt["adapter"])
        text_encoder_lora.load_checkpoint_part(latest_checkpoint(out), model)
        mixed = ckpt["trainer"]["precision"]
    if resume:
        dist.on_main(lambda: save_run_config(out, cfg))
    budget = int(cfg.budget_gb * GB) or None
    caps, predicted = dist.on_main(lambda: _memory_plan(cfg, model, data, budget, device, dtype,
                                                        dist.world_size))
    meter = PeakMeter(device, budget)
    modules = (model.unet, model.vae, *model.text_encoders)
    meter.track(t for m in modules for t in (*m.parameters(), *m.buffers()))
    inputs, eval_set, info = build_inputs(cfg, out, model, data, device, meter, control, dist)
    AcceleratorState._reset_state()  # one process may run several jobs (the UI) in other precisions
    accelerator = Accelerator(cpu=device.type == "cpu", mixed_precision=mixed)
    per_epoch = len(epoch_plan(cfg, data.buckets, 0))
    total = cfg.max_steps or per_epoch * cfg.epochs
    optimizer, info["optimizer"] = _make_optimizer(cfg, text_encoder_lora.param_groups(model, cfg), device)
    scheduler = get_cosine_schedule_with_warmup(optimizer, min(cfg.warmup_steps, total), total)
    unet, optimizer, scheduler = prepare_image(accelerator, dist, model.unet, optimizer, scheduler)
    state: dict[str, Any] = {"step": 0, "base_eval_loss": None, "precision": mixed}
    if resume and ckpt is None:
        log.warning("%s: no checkpoint yet; starting from step 0", out)
    if ckpt is not None:
        state = restore_training_state(ckpt, optimizer, scheduler)
    state.update(sampler=sampler, world_size=dist.world_size)
    if dist.active:  # own dropout stream per rank (the checkpoint holds the main process's RNG)
        torch.manual_seed(cfg.seed * 7919 + 1_000_003 * dist.rank + state["step"])
    if state["base_eval_loss"] is None and dist.is_main:
        state["base_eval_loss"] = eval_loss(unet, model.noise_scheduler, eval_set, device, dtype)
    meter.track(t for s in optimizer.state.values() for t in s.values() if torch.is_tensor(t))
    main = dist.is_main
    session = _Session(cfg, out, data, model, inputs, eval_set, accelerator, unet, optimizer, scheduler,
                       state, RecordLog(out / "metrics.jsonl", keep_until_step=state["step"], write=main),
                       RecordLog(out / "events.jsonl", keep_until_step=state["step"] if resume else None,
                                 write=main),
                       meter, caps, predicted, per_epoch, total, control, dtype, info, dist)
    session.event({"event": "plan", "caps": caps.caps, "predicted_peak_bytes": predicted,
                   "budget_bytes": budget, "total_steps": total, "world_size": dist.world_size, **info})
    return session


def run_image_step(run: _Session, step: Step, n_images: int | None = None) -> dict[str, Any]:
    """Forward + backward of every micro-batch of one optimizer step (no optimizer update).

    ``n_images``: the loss normaliser; with several ranks, the images of the *global* step
    (default: this step's own). Filler micro-batches (a rank's share ran out of images) train
    nothing. Each image's noise and timestep come from :func:`image_noise` (seeded per image).
    """
    n_images = n_images or len(step.indices)
    loss_sum = 0.0
    sched = run.model.noise_scheduler
    for mb in step.micro_batches:
        if mb.filler:
            continue
        try:
            enc = run.inputs.batch(mb.indices, run.dtype, run.state["step"] + 1)
            noise, timesteps = image_noise(run.cfg.seed, run.state["step"] + 1, mb.indices,
                                           enc.latents.shape[1:], sched.config.num_train_timesteps,
                                           enc.latents.device)
            loss = unet_loss(run.unet, sched, enc, noise, timesteps, reduction="sum") / n_images
            run.accelerator.backward(loss)
        except torch.OutOfMemoryError as err:
            raise MicroBatchOutOfMemory(mb, err) from None
        loss_sum += loss.item()
        del loss, enc, noise
    return {"loss": loss_sum, "images": sum(len(mb.indices) for mb in step.micro_batches if not mb.filler)}


def _run_share(run: _Session, step: Step) -> dict[str, Any]:
    """This rank's share of a global step (the guard's runner, caps applied): forward and backward."""
    mine = rank_share(step, run.dist, run.caps.cap if run.caps.caps else None)
    if injected_oom(run.dist.rank, run.state["step"] + 1):
        big = max(mine.micro_batches, key=lambda mb: len(mb.indices))
        raise MicroBatchOutOfMemory(big, torch.OutOfMemoryError("injected by " + INJECT_OOM_ENV))
    stats = run_image_step(run, mine, len(step.indices))
    indices = [i for mb in mine.micro_batches if not mb.filler for i in mb.indices]
    return {**stats, "indices": indices, "micro_batches": len(mine.micro_batches)}


def _one_step(run: _Session, step: Step, epoch: int) -> dict[str, Any]:
    """One optimizer step under the memory guard; returns its metric record (every rank's)."""
    run.meter.start_step()
    start = time.perf_counter()
    agree = agree_on_oom(run.dist) if run.dist.active else None
    stats = run_guarded(lambda st: _run_share(run, st), step, run.caps,
                        lambda: run.optimizer.zero_grad(set_to_none=True), run.on_oom, agree)
    trainable = [p for group in run.optimizer.param_groups for p in group["params"]]  # UNet (+ text) LoRA
    if run.dist.active:
        zero_missing_grads(trainable)
        run.dist.all_reduce_grads(trainable)
    run.accelerator.clip_grad_norm_(trainable, 1.0)
    run.optimizer.step()
    run.scheduler.step()
    run.optimizer.zero_grad(set_to_none=True)
    seconds = time.perf_counter() - start
    run.state["step"] += 1
    w, h = run.data.buckets[step.indices[0]]
    total = combine_step_stats(run.dist, run.meter.step_peak(), stats["loss"], stats["images"], 0)
    record = {"step": run.state["step"], "total_steps": run.total, "epoch": epoch, "loss": total["loss"],
              "lr": run.scheduler.get_last_lr()[0], "images": total["real_tokens"], "bucket": f"{w}x{h}",
              "latent_tokens": latent_tokens((w, h)), "batch_size": len(step.indices),
              "micro_batches": stats["micro_batches"], "seconds": seconds,
              "images_per_s": total["real_tokens"] / seconds, "peak_bytes": total["peak_bytes"],
              "peak_bytes_by_rank": total["peak_bytes_by_rank"], "memory_source": run.meter.source,
              "time": time.time()}
    if os.environ.get(DEBUG_SAMPLES_ENV) == "1":
        record["samples_by_rank"] = run.dist.gather_to_main(stats["indices"])
    return record


def _loop(run: _Session, control: TrainControl, progress: bool) -> tuple[str, str | None]:
    """Steps until done, stopped or out of memory; returns (status, message)."""
    main = run.dist.is_main
    bar = tqdm(total=run.total, initial=run.state["step"], disable=not (progress and main), unit="step")
    plan_epoch_index, plan = -1, []
    samples = RecordLog(run.out / "memory.jsonl", keep_until_step=run.state["step"], write=main)

    def on_sample(sample: dict[str, Any]) -> None:
        sample = {"step": run.state["step"], **sample}
        samples.append(sample)
        if control.on_sample:
            control.on_sample(sample)

    relay = SampleRelay(run.dist, on_sample)
    control.phase("training")
    monitor = MemoryMonitor(relay.add, interval_s=1 / run.cfg.monitor_hz if run.cfg.monitor_hz else 0,
                            live_bytes=run.meter.live_bytes if run.meter.tracker else None)
    with run.meter, bar, (monitor if run.cfg.monitor_hz else contextlib.nullcontext()):
        while run.state["step"] < run.total:
            if stop_agreed(run.dist, control.stop.is_set(), run.out):
                return "stopped", None
            epoch, index = divmod(run.state["step"], run.per_epoch)
            if epoch != plan_epoch_index:
                plan_epoch_index, plan = epoch, epoch_plan(run.cfg, run.data.buckets, epoch)
            try:
                record = _one_step(run, plan[index], epoch)
            except RunOutOfMemoryError as err:
                return "out_of_memory", str(err)
            relay.flush()
            run.metrics.append(record)
            if control.on_record:
                control.on_record(record)
            bar.update(1)
            bar.set_postfix(loss=f"{record['loss']:.3f}", peak_mb=f"{record['peak_bytes'] / 2**20:.0f}")
            if run.state["step"] % run.cfg.checkpoint_every == 0:
                run.checkpoint("periodic")
    return "completed", None


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
    if cfg.task != "image":
        raise ConfigError(f"task: train_image needs task=image, got {cfg.task!r}")
    out = Path(out)
    control = control or TrainControl()
    run = _setup(cfg, out, resume, overwrite, control)
    status, message = _loop(run, control, progress)
    control.phase("saving")
    run.checkpoint(status)
    control.phase("evaluating")
    final_eval = None
    try:  # the main process evaluates (the LoRA weights are the same on every rank)
        if run.dist.is_main:
            final_eval = eval_loss(run.unet, run.model.noise_scheduler, run.eval_set,
                                   run.accelerator.device, run.dtype)
    except torch.OutOfMemoryError as err:
        log.warning("evaluation ran out of memory: %s", err)
    control.phase("saving")
    adapter = out / "adapter"
    if run.dist.is_main:
        adapter = dm.save_adapter(run.model, out, cfg.export_kohya)
    summary = image_summary(run, status, message, final_eval, adapter)
    if not run.dist.is_main:  # samples and run.json are the main process's
        return summary
    write_atomic(out / "run.json", json.dumps(summary, indent=1))
    prompts, source, device = sample_prompts(run.data, cfg.sample_images), run.model.source, \
        run.accelerator.device.type
    if prompts and status == "completed":
        control.phase("sampling")
        del run  # free the training UNet, optimizer and caches before the pipeline loads
        gc.collect()
        free_memory()
        try:
            summary["samples"] = generate_samples(cfg, source, adapter, prompts, out, device)
        except torch.OutOfMemoryError as err:
            log.warning("sampling ran out of memory: %s", err)
        write_atomic(out / "run.json", json.dumps(summary, indent=1))
    return summary
