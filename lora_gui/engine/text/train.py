"""The text training loop: LoRA on a causal LM with accelerate, token-weighted gradient
accumulation over variable micro-batches, per-step peak memory, atomic checkpoints, resume.

Loss normalisation: every micro-batch's summed token loss is divided by the number of target
tokens in the whole optimizer step (``num_items_in_batch``), so a step's gradient is the same
however the step is cut into micro-batches (the accumulation bug Hugging Face fixed in 2024).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.state import AcceleratorState
from accelerate.utils import DistributedType
from peft import set_peft_model_state_dict
from tqdm.auto import tqdm
from transformers import get_cosine_schedule_with_warmup

from lora_gui.config import ConfigError, RunConfig
from lora_gui.data.batching import Step, collate, count_targets, plan_epoch, round_up
from lora_gui.data.shard import split_step, step_targets
from lora_gui.data.text import TokenizedSample
from lora_gui.data.training_data import load_samples
from lora_gui.engine.parallel import fsdp
from lora_gui.engine.core.checkpoint import restore_training_state, save_checkpoint, write_atomic
from lora_gui.engine.parallel.distributed import (
    DEBUG_SAMPLES_ENV,
    INJECT_OOM_ENV,
    STOP_FILE,
    Dist,
    SampleRelay,
    agree_on_oom,
    check_world_size,
    combine_step_stats,
    enable_autocast,
    injected_oom,
    local_tensors,
    rank_peaks,
    stop_agreed,
)
from lora_gui.engine.parallel.fsdp import FsdpOutOfMemoryError
from lora_gui.engine.core.precision import choose_precision
from lora_gui.engine.core.records import RecordLog
from lora_gui.engine.core.resume import read_resume_checkpoint, sampler_state
from lora_gui.engine.core.rundir import prepare_run_dir, save_run_config
from lora_gui.engine.core.summary import memory_report, run_summary
from lora_gui.memory.guard import BatchCaps, MicroBatchOutOfMemory, RunOutOfMemoryError, run_guarded
from lora_gui.memory.meter import GB, PeakMeter
from lora_gui.memory.monitor import MemoryMonitor
from lora_gui.memory.parallel import Parallel
from lora_gui.models import text as text_models

log = logging.getLogger(__name__)
EVAL_TOKEN_BUDGET = 8192  # padded tokens per eval micro-batch (no activations kept: no_grad)


@dataclass
class TextData:
    """Tokenized train and held-out samples plus the pad id."""

    train: list[TokenizedSample]
    held_out: list[TokenizedSample]
    pad_id: int
    tokenizer: Any = None  # chat data: carries the chat template, saved with the adapter
    is_chat: bool = False


@dataclass
class TrainControl:
    """How a caller steers and watches a run: a stop request and listeners for step records,
    events (phases, checkpoints, out-of-memory recoveries) and memory samples."""

    stop: threading.Event = field(default_factory=threading.Event)
    on_record: Callable[[dict[str, Any]], None] | None = None
    on_event: Callable[[dict[str, Any]], None] | None = None
    on_sample: Callable[[dict[str, Any]], None] | None = None

    def emit(self, event: dict[str, Any]) -> None:
        if self.on_event:
            self.on_event(event)

    def phase(self, name: str) -> None:
        """Marks the start of a phase: loading, training, evaluating, saving."""
        self.emit({"event": "phase", "phase": name, "time": time.time()})


def load_text_data(cfg: RunConfig, tokenizer) -> TextData:
    loaded = load_samples(cfg.data_path(), tokenizer, data_format=cfg.data_format,
                          max_seq_len=cfg.max_seq_len, eval_fraction=cfg.eval_fraction, seed=cfg.seed,
                          chat_template=cfg.chat_template, train_on_prompt=cfg.train_on_prompt)
    if not loaded.train:
        raise ConfigError(f"data: {cfg.data_path()} has no document of 2 or more tokens")
    return TextData(loaded.train, loaded.held_out, tokenizer.pad_token_id, tokenizer, loaded.is_chat)


def steps_per_epoch(cfg: RunConfig, n_samples: int) -> int:
    return math.ceil(n_samples / cfg.batch_size)


def epoch_plan(cfg: RunConfig, data: TextData, epoch: int, planned: bool = False) -> list[Step]:
    """The epoch's steps. ``planned``: the planner's caps per bucket (applied by the guard)
    size the micro-batches instead of the token budget (adaptive batch under a VRAM budget)."""
    token_budget = cfg.batch_size * cfg.max_seq_len if planned else cfg.token_budget
    return plan_epoch([len(s) for s in data.train], cfg.resolved_batching(),
                      batch_size=cfg.batch_size, max_seq_len=cfg.max_seq_len, seed=cfg.seed,
                      epoch=epoch, token_budget=token_budget, pad_multiple=cfg.pad_multiple)


@torch.no_grad()
def evaluate(model, samples: list[TokenizedSample], pad_id: int, device: torch.device,
             token_budget: int = EVAL_TOKEN_BUDGET) -> float | None:
    """Token-weighted mean loss over samples (bucketed: padded to the longest, 64-rounded)."""
    if not samples:
        return None
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    plan = plan_epoch([len(s) for s in samples], "bucketed", batch_size=len(samples),
                      max_seq_len=max(len(s) for s in samples), seed=0, epoch=0,
                      token_budget=token_budget)
    for step in plan:
        for mb in step.micro_batches:
            batch = {k: v.to(device) for k, v in collate(samples, mb, pad_id).items()}
            n = count_targets(batch)
            if n:
                total += model(**batch, num_items_in_batch=n).loss.item() * n
                count += n
    model.train(was_training)
    fsdp.reshard(model)  # no backward after a no_grad forward: free the gathered FSDP units now
    return total / count if count else None


def run_step(model, accelerator: Accelerator, data: TextData, step: Step,
             n_targets: int | None = None) -> dict[str, float]:
    """Forward and backward of every micro-batch of one optimizer step (no optimizer update).

    ``n_targets``: the loss normaliser; with several ranks, the target tokens of the *global*
    step (default: this step's own, from the samples, no tensors needed).
    """
    if n_targets is None:
        n_targets = step_targets(data.train, step)
    loss_sum = 0.0
    for mb in step.micro_batches:
        try:
            batch = {k: v.to(accelerator.device) for k, v in collate(data.train, mb, data.pad_id).items()}
            loss = model(**batch, num_items_in_batch=n_targets).loss
            accelerator.backward(loss)
        except torch.OutOfMemoryError as err:
            raise MicroBatchOutOfMemory(mb, err) from None
        loss_sum += loss.item()
        del loss, batch
    real = sum(len(data.train[i]) for i in step.indices)  # fillers are not counted as trained
    padded = sum(len(mb.indices) * mb.seq_len for mb in step.micro_batches) if not \
        step.micro_batches[0].packed else real + sum(mb.seq_len for mb in step.micro_batches if mb.filler)
    return {"loss": loss_sum, "real_tokens": real, "padded_tokens": padded,
            "target_tokens": n_targets}


def _probe_step(model, data: TextData) -> Callable[[], None]:
    """One forward+backward of the run's model on a small real batch (for the precision probe)."""
    sample = min(data.train[: 8], key=len)
    ids = torch.tensor([sample.input_ids[:64]] * 2)

    def step() -> None:
        model(input_ids=ids, labels=ids).loss.backward()
        model.zero_grad(set_to_none=True)

    return step


def _memory_plan(cfg: RunConfig, source: str, budget: int | None, device: torch.device,
                 parallel: Parallel | None = None) -> tuple[BatchCaps, int | None]:
    """Micro-batch caps per length bucket under the budget (adaptive batch, optimized modes) and
    the predicted peak of the run's largest micro-batch (source: predicted), per GPU."""
    from lora_gui.memory import run_plan

    caps = BatchCaps()
    predicted = None
    try:
        if budget and cfg.resolved_batching() == "bucketed":
            plan, step = run_plan.plan_and_predict(cfg, budget, device.type, source, parallel=parallel)
            caps.caps = {int(b.bucket): max(1, b.micro_batch) for b in plan.buckets}
            predicted = step.peak_bytes
        else:
            predicted = run_plan.predicted_step(cfg, device.type, source, parallel=parallel).peak_bytes
    except (ValueError, NotImplementedError, RuntimeError) as err:  # prediction is advisory
        log.warning("no memory prediction for %s: %s", cfg.model, err)
    return caps, predicted


def _save_adapter(model, out: Path) -> Path:
    """Saves the peft adapter into out/adapter atomically (temp folder, then rename)."""
    final = out / "adapter"
    tmp = Path(tempfile.mkdtemp(dir=out, prefix=".adapter-"))
    trainable = {n: p for n, p in model.named_parameters() if p.requires_grad}  # peft names them
    model.save_pretrained(tmp, state_dict=trainable, save_embedding_layers=False)  # chat tokens: rows only
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)
    return final


@dataclass
class _Session:
    """Everything one run holds while it trains (built by :func:`_setup`)."""

    cfg: RunConfig
    out: Path
    data: TextData
    accelerator: Accelerator
    model: Any
    optimizer: torch.optim.Optimizer
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
    dist: Dist = field(default_factory=Dist)
    fsdp: bool = False
    token_budget: int = 2048  # micro-batch cut of each rank's share (as the epoch plan's)
    frozen_bytes_by_rank: list[int] = field(default_factory=list)

    def event(self, event: dict[str, Any]) -> None:
        """Appends to events.jsonl (main process) and tells the listener."""
        event = {"step": self.state["step"], "time": time.time(), **event}
        self.events.append(event)
        self.control.emit(event)

    def checkpoint(self, reason: str) -> None:
        """Saves a checkpoint from the main process (LoRA weights are the same on every rank)."""
        if not self.dist.is_main:
            return
        step = self.state["step"]
        path = save_checkpoint(self.out, step, self.accelerator.unwrap_model(self.model), self.optimizer,
                               self.scheduler, self.state)
        self.event({"event": "checkpoint", "reason": reason, "path": str(path)})

    def on_oom(self, event: dict[str, Any]) -> None:
        self.event({**event, "step": self.state["step"] + 1})
        log.warning("step %d: %s", self.state["step"] + 1, event["message"])


def _prepare(accelerator: Accelerator, dist: Dist, model, optimizer,
             scheduler) -> tuple[Any, Any, Any, bool]:
    """One process: accelerate as before. Several: LoRA weights replicated (broadcast from the
    main process), frozen weights replicated or sharded by FSDP; the scheduler stays unprepared
    (accelerate would step it once per process: the global batch is one step)."""
    if accelerator.distributed_type == DistributedType.FSDP:  # GPUs: accelerate's plugin, LoRA ignored
        model, optimizer = fsdp.prepare_with_accelerate(accelerator, model, optimizer)
        enable_autocast(model, accelerator)
        return model, optimizer, scheduler, True
    if not dist.active:
        return (*accelerator.prepare(model, optimizer, scheduler), False)
    use_fsdp = fsdp.fsdp_requested()  # on CPU accelerate keeps MULTI_CPU: shard with fully_shard
    dist.broadcast_params(p for p in model.parameters() if p.requires_grad)
    model.to(accelerator.device)
    if use_fsdp:
        fsdp.shard_frozen(model)
    optimizer = accelerator.prepare(optimizer)
    enable_autocast(model, accelerator)
    return model, optimizer, scheduler, use_fsdp


def _setup(cfg: RunConfig, out: Path, resume: bool, overwrite: bool, control: TrainControl) -> _Session:
    """Validates against the model, loads data and model, restores a checkpoint, plans memory.
    Folder decisions are the main process's, broadcast with any error to every rank."""
    dist = Dist.from_env()
    control.phase("loading")
    source = text_models.resolve_model_source(cfg.model)
    limit = text_models.max_positions(source)
    if limit is not None and cfg.max_seq_len > limit:
        raise ConfigError(f"max_seq_len: {cfg.max_seq_len} is above the model's limit of {limit}")
    data = load_text_data(cfg, text_models.load_tokenizer(source))  # bad data: nothing written yet
    dist.on_main(lambda: prepare_run_dir(out, resume=resume, overwrite=overwrite))
    if not resume:
        dist.on_main(lambda: save_run_config(out, cfg))
    if dist.active:
        check_world_size(dist.world_size, len(data.train), cfg.batch_size)
    sampler = sampler_state(cfg, [len(s) for s in data.train])

    torch.manual_seed(cfg.seed)  # LoRA init (the same on every rank; broadcast from main anyway)
    device = dist.device if dist.active else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    mixed = choose_precision(cfg.precision, device)  # on CPU: measured on the model below
    # Frozen weights in the compute dtype on GPUs (LoRA weights stay fp32 in peft); fp32 on CPU.
    weights = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(mixed) if device.type == "cuda" else None
    model = text_models.attach_lora(text_models.load_model_for(cfg, source, weights or torch.float32), cfg,
                                    data.tokenizer if data.is_chat else None)
    ckpt = dist.on_main(lambda: read_resume_checkpoint(out, sampler, model)) if resume else None
    if ckpt is not None:  # a resumed run keeps the precision it started with
        set_peft_model_state_dict(model, ckpt["adapter"])
        mixed = ckpt["trainer"]["precision"]
    elif device.type == "cpu" and cfg.precision == "auto":
        mixed = dist.on_main(lambda: choose_precision("auto", device, _probe_step(model, data)))
    if resume:
        dist.on_main(lambda: save_run_config(out, cfg))
    AcceleratorState._reset_state()  # one process may run several jobs (the UI) in other precisions
    accelerator = Accelerator(cpu=device.type == "cpu", mixed_precision=mixed)
    if cfg.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    per_epoch = steps_per_epoch(cfg, len(data.train))
    total = cfg.max_steps or per_epoch * cfg.epochs
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.lr,
                                  weight_decay=cfg.weight_decay)
    scheduler = get_cosine_schedule_with_warmup(optimizer, min(cfg.warmup_steps, total), total)
    model, optimizer, scheduler, sharded = _prepare(accelerator, dist, model, optimizer, scheduler)

    state: dict[str, Any] = {"step": 0, "base_eval_loss": None, "precision": mixed}
    if resume and ckpt is None:
        log.warning("%s: no checkpoint yet; starting from step 0", out)
    if ckpt is not None:
        state = restore_training_state(ckpt, optimizer, scheduler)
    state.update(sampler=sampler, world_size=dist.world_size)
    if dist.active:  # own dropout stream per rank (the checkpoint holds the main process's RNG)
        torch.manual_seed(cfg.seed * 7919 + 1_000_003 * dist.rank + state["step"])
    if state["base_eval_loss"] is None:
        state["base_eval_loss"] = evaluate(model, data.held_out, data.pad_id, accelerator.device,
                                           cfg.token_budget)
    budget = int(cfg.budget_gb * GB) or None
    caps, predicted = _memory_plan(cfg, source, budget, accelerator.device,
                                   Parallel(dist.world_size, sharded) if dist.active else None)
    meter = PeakMeter(accelerator.device, budget)
    unwrapped = accelerator.unwrap_model(model)
    meter.track(local_tensors(list(unwrapped.parameters()) + list(unwrapped.buffers())
                + [t for s in optimizer.state.values() for t in s.values() if torch.is_tensor(t)]))
    main = dist.is_main
    session = _Session(cfg, out, data, accelerator, model, optimizer, scheduler, state,
                       RecordLog(out / "metrics.jsonl", keep_until_step=state["step"], write=main),
                       RecordLog(out / "events.jsonl", keep_until_step=state["step"] if resume else None,
                                 write=main),
                       meter, caps, predicted, per_epoch, total, control, dist, sharded,
                       cfg.batch_size * cfg.max_seq_len if caps.caps else cfg.token_budget,
                       rank_peaks(dist.gather_floats([fsdp.frozen_local_bytes(unwrapped)]), 0))
    if main:
        (out / STOP_FILE).unlink(missing_ok=True)
    session.event({"event": "plan", "caps": caps.caps, "predicted_peak_bytes": predicted,
                   "budget_bytes": budget, "total_steps": total, "world_size": dist.world_size,
                   "fsdp": sharded, "frozen_bytes_by_rank": session.frozen_bytes_by_rank})
    return session


def _run_share(run: _Session, step: Step) -> dict[str, Any]:
    """This rank's share of a global step (the guard's runner): forward and backward only."""
    shares = split_step(step, run.dist.world_size, [len(s) for s in run.data.train],
                        batching=run.cfg.resolved_batching(), max_seq_len=run.cfg.max_seq_len,
                        pad_multiple=run.cfg.pad_multiple, token_budget=run.token_budget,
                        cap_for_len=run.caps.cap if run.caps.caps else None)
    mine = shares[run.dist.rank]
    try:
        if injected_oom(run.dist.rank, run.state["step"] + 1):
            big = max(mine.micro_batches, key=lambda mb: len(mb.indices))
            raise MicroBatchOutOfMemory(big, torch.OutOfMemoryError("injected by " + INJECT_OOM_ENV))
        stats = run_step(run.model, run.accelerator, run.data, mine, step_targets(run.data.train, step))
    except MicroBatchOutOfMemory as oom:
        if run.fsdp:  # no way to stop every rank at the same point inside FSDP's all-gathers
            raise FsdpOutOfMemoryError(fsdp.fsdp_oom_message(oom)) from None
        raise
    return {**stats, "indices": mine.indices, "micro_batches": len(mine.micro_batches)}


def _one_step(run: _Session, step: Step, epoch: int) -> dict[str, Any]:
    """One optimizer step under the memory guard; returns its metric record (every rank's)."""
    run.meter.start_step()
    start = time.perf_counter()
    agree = agree_on_oom(run.dist) if run.dist.active and not run.fsdp else None
    stats = run_guarded(lambda st: _run_share(run, st), step, run.caps,
                        lambda: run.optimizer.zero_grad(set_to_none=True), run.on_oom, agree)
    trainable = [p for p in run.model.parameters() if p.requires_grad]
    run.dist.all_reduce_grads(trainable)
    run.accelerator.clip_grad_norm_(trainable, 1.0)
    run.optimizer.step()
    run.scheduler.step()
    run.optimizer.zero_grad(set_to_none=True)
    seconds = time.perf_counter() - start
    run.state["step"] += 1
    total = combine_step_stats(run.dist, run.meter.step_peak(), stats["loss"], stats["real_tokens"],
                               stats["padded_tokens"])
    record = {"step": run.state["step"], "total_steps": run.total, "epoch": epoch, "loss": total["loss"],
              "lr": run.scheduler.get_last_lr()[0], "real_tokens": total["real_tokens"],
              "padded_tokens": total["padded_tokens"], "batch_size": len(step.indices),
              "micro_batches": stats["micro_batches"],
              "seq_len": max(mb.seq_len for mb in step.micro_batches), "seconds": seconds,
              "tokens_per_s": total["real_tokens"] / seconds, "peak_bytes": total["peak_bytes"],
              "peak_bytes_by_rank": total["peak_bytes_by_rank"],
              "memory_source": run.meter.source, "time": time.time()}
    if os.environ.get(DEBUG_SAMPLES_ENV) == "1":
        record["samples_by_rank"] = run.dist.gather_to_main(stats["indices"])
    return record


def _loop(run: _Session, control: TrainControl, progress: bool) -> tuple[str, str | None]:
    """Steps until done, stopped or out of memory; returns (status, message)."""
    bar = tqdm(total=run.total, initial=run.state["step"], disable=not (progress and run.dist.is_main),
               unit="step")
    plan_epoch_index, plan = -1, []
    samples = RecordLog(run.out / "memory.jsonl", keep_until_step=run.state["step"], write=run.dist.is_main)

    def on_sample(sample: dict[str, Any]) -> None:
        sample = {"step": run.state["step"], **sample}
        samples.append(sample)
        if control.on_sample:
            control.on_sample(sample)

    relay = SampleRelay(run.dist, on_sample)
    control.phase("training")
    monitor = MemoryMonitor(relay.add,
                            interval_s=1 / run.cfg.monitor_hz if run.cfg.monitor_hz else 0,
                            live_bytes=run.meter.live_bytes if run.meter.tracker else None)
    with run.meter, bar, (monitor if run.cfg.monitor_hz else contextlib.nullcontext()):
        while run.state["step"] < run.total:
            if stop_agreed(run.dist, control.stop.is_set(), run.out):
                return "stopped", None
            epoch, index = divmod(run.state["step"], run.per_epoch)
            if epoch != plan_epoch_index:
                plan_epoch_index, plan = epoch, epoch_plan(run.cfg, run.data, epoch, bool(run.caps.caps))
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


def _final_eval(run: _Session) -> tuple[float | None, float | None]:
    """Held-out loss with the run's attention and, for windowed runs, with full attention too."""
    args = (run.data.held_out, run.data.pad_id, run.accelerator.device, run.cfg.token_budget)
    try:
        loss = evaluate(run.model, *args)
        full = None
        if run.cfg.attention == "windowed":  # the adapter is used with full attention at inference
            with text_models.attention_backend(run.model, run.cfg.resolved_attn_backend()):
                full = evaluate(run.model, *args)
    except torch.OutOfMemoryError as err:
        log.warning("evaluation ran out of memory: %s", err)
        return None, None
    return loss, full


def train_text(cfg: RunConfig, out: str | Path, *, resume: bool = False, overwrite: bool = False,
               control: TrainControl | None = None, progress: bool = True) -> dict[str, Any]:
    """Trains a text LoRA and writes the run folder; returns the run.json summary.

    Args:
        cfg: validated settings (for a resume, the run's saved config).
        out: run folder (adapter/, metrics.jsonl, events.jsonl, run.json, checkpoints/).
        resume: continue from the newest checkpoint in ``out``.
        overwrite: replace a run that ``out`` already holds.
        control: stop request and record listener (the UI's job uses it).
    """
    out = Path(out)
    control = control or TrainControl()
    run = _setup(cfg, out, resume, overwrite, control)
    status, message = _loop(run, control, progress)
    control.phase("saving")
    run.checkpoint(status)
    control.phase("evaluating")
    eval_loss, eval_full = _final_eval(run)
    control.phase("saving")
    adapter = out / "adapter"
    if run.dist.is_main:
        _save_adapter(run.accelerator.unwrap_model(run.model), out)
        if run.data.is_chat:  # the chat template (and its added tokens) go with the adapter
            run.data.tokenizer.save_pretrained(adapter)
    summary = run_summary(cfg, run.metrics.snapshot(), {
        "status": status, "message": message, "eval_loss": eval_loss,
        "eval_loss_full_attention": eval_full, "base_eval_loss": run.state["base_eval_loss"],
        "memory_source": run.meter.source, "budget_bytes": run.meter.budget_bytes,
        "predicted_peak_bytes": run.predicted,
        "oom_events": [e for e in run.events.snapshot() if e.get("event") == "oom"],
        "adapter": str(adapter), "device": str(run.accelerator.device),
        "precision": run.accelerator.mixed_precision, "train_samples": len(run.data.train),
        "eval_samples": len(run.data.held_out),
        "max_padded_len": round_up(max(len(s) for s in run.data.train), cfg.pad_multiple),
        "world_size": run.dist.world_size, "fsdp": run.fsdp,
        "frozen_bytes_by_rank": run.frozen_bytes_by_rank})
    summary["memory_report"] = memory_report(summary)
    if run.dist.is_main:
        write_atomic(out / "run.json", json.dumps(summary, indent=1))
    return summary
