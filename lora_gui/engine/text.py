"""The text training loop: LoRA on a causal LM with accelerate, token-weighted gradient
accumulation over variable micro-batches, per-step peak memory, atomic checkpoints, resume.

Loss normalisation: every micro-batch's summed token loss is divided by the number of target
tokens in the whole optimizer step (``num_items_in_batch``), so a step's gradient is the same
however the step is cut into micro-batches (the accumulation bug Hugging Face fixed in 2024).
"""

from __future__ import annotations

import json
import logging
import math
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
from tqdm.auto import tqdm
from transformers import get_cosine_schedule_with_warmup

from lora_gui.config import ConfigError, RunConfig
from lora_gui.data.batching import Step, collate, count_targets, plan_epoch, round_up
from lora_gui.data.text import TokenizedSample, load_documents, split_documents, tokenize_documents
from lora_gui.engine.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint, write_atomic
from lora_gui.engine.precision import choose_precision
from lora_gui.engine.records import RecordLog
from lora_gui.engine.rundir import prepare_run_dir, save_run_config
from lora_gui.memory.meter import GB, PeakMeter
from lora_gui.models import text as text_models

log = logging.getLogger(__name__)
EVAL_TOKEN_BUDGET = 8192  # padded tokens per eval micro-batch (no activations kept: no_grad)


@dataclass
class TextData:
    """Tokenized train and held-out samples plus the pad id."""

    train: list[TokenizedSample]
    held_out: list[TokenizedSample]
    pad_id: int


@dataclass
class TrainControl:
    """How a caller steers a running job: a stop request and a record listener."""

    stop: threading.Event = field(default_factory=threading.Event)
    on_record: Callable[[dict[str, Any]], None] | None = None


def load_text_data(cfg: RunConfig, tokenizer) -> TextData:
    docs = load_documents(cfg.data_path())
    train_docs, eval_docs = split_documents(docs, cfg.eval_fraction, cfg.seed)
    train = tokenize_documents(train_docs, tokenizer, cfg.max_seq_len)
    if not train:
        raise ConfigError(f"data: {cfg.data_path()} has no document of 2 or more tokens")
    return TextData(train, tokenize_documents(eval_docs, tokenizer, cfg.max_seq_len),
                    tokenizer.pad_token_id)


def steps_per_epoch(cfg: RunConfig, n_samples: int) -> int:
    return math.ceil(n_samples / cfg.batch_size)


def epoch_plan(cfg: RunConfig, data: TextData, epoch: int) -> list[Step]:
    return plan_epoch([len(s) for s in data.train], cfg.resolved_batching(),
                      batch_size=cfg.batch_size, max_seq_len=cfg.max_seq_len, seed=cfg.seed,
                      epoch=epoch, token_budget=cfg.token_budget, pad_multiple=cfg.pad_multiple)


@torch.no_grad()
def evaluate(model, samples: list[TokenizedSample], pad_id: int, device: torch.device) -> float | None:
    """Token-weighted mean loss over samples (full attention, padded to the longest, 64-rounded)."""
    if not samples:
        return None
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    plan = plan_epoch([len(s) for s in samples], "bucketed", batch_size=len(samples),
                      max_seq_len=max(len(s) for s in samples), seed=0, epoch=0,
                      token_budget=EVAL_TOKEN_BUDGET)
    for step in plan:
        for mb in step.micro_batches:
            batch = {k: v.to(device) for k, v in collate(samples, mb, pad_id).items()}
            n = count_targets(batch)
            if n:
                total += model(**batch, num_items_in_batch=n).loss.item() * n
                count += n
    model.train(was_training)
    return total / count if count else None


def run_step(model, accelerator: Accelerator, data: TextData, step: Step) -> dict[str, float]:
    """Forward and backward of every micro-batch of one optimizer step (no optimizer update)."""
    batches = [collate(data.train, mb, data.pad_id) for mb in step.micro_batches]
    n_targets = sum(count_targets(b) for b in batches)
    loss_sum = 0.0
    for batch in batches:
        batch = {k: v.to(accelerator.device) for k, v in batch.items()}
        loss = model(**batch, num_items_in_batch=n_targets).loss
        accelerator.backward(loss)
        loss_sum += loss.item()
        del loss, batch
    real = sum(len(data.train[i]) for i in step.indices)
    padded = sum(len(mb.indices) * mb.seq_len for mb in step.micro_batches) if not \
        step.micro_batches[0].packed else real
    return {"loss": loss_sum, "real_tokens": real, "padded_tokens": padded,
            "target_tokens": n_targets}


def _summary(cfg: RunConfig, records: list[dict], extra: dict) -> dict[str, Any]:
    real = sum(r["real_tokens"] for r in records)
    padded = sum(r["padded_tokens"] for r in records)
    seconds = sum(r["seconds"] for r in records)
    peaks = [r["peak_bytes"] for r in records]
    return {
        "final_loss": records[-1]["loss"] if records else None,
        "real_tokens": real,
        "padded_tokens": padded,
        "padding_efficiency": real / padded if padded else None,
        "real_tokens_per_s": real / seconds if seconds else None,
        "train_seconds": seconds,
        "peak_bytes": max(peaks) if peaks else None,
        "mean_step_peak_bytes": sum(peaks) / len(peaks) if peaks else None,
        "steps": len(records),
        **extra,
        "config": cfg.to_dict(),
    }


def _save_adapter(model, out: Path) -> Path:
    """Saves the peft adapter into out/adapter atomically (temp folder, then rename)."""
    final = out / "adapter"
    tmp = Path(tempfile.mkdtemp(dir=out, prefix=".adapter-"))
    model.save_pretrained(tmp)
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)
    return final


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
    prepare_run_dir(out, resume=resume, overwrite=overwrite)
    source = text_models.resolve_model_source(cfg.model)
    limit = text_models.max_positions(source)
    if limit is not None and cfg.max_seq_len > limit:
        raise ConfigError(f"max_seq_len: {cfg.max_seq_len} is above the model's limit of {limit}")
    save_run_config(out, cfg)
    tokenizer = text_models.load_tokenizer(source)
    data = load_text_data(cfg, tokenizer)

    torch.manual_seed(cfg.seed)  # LoRA init
    accelerator = Accelerator(cpu=not torch.cuda.is_available(),
                              mixed_precision=choose_precision(cfg.precision, torch.device(
                                  "cuda" if torch.cuda.is_available() else "cpu")))
    model = text_models.attach_lora(text_models.load_base_model(source, cfg.resolved_attn_backend()), cfg)
    if cfg.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    per_epoch = steps_per_epoch(cfg, len(data.train))
    total = cfg.max_steps or per_epoch * cfg.epochs
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.lr,
                                  weight_decay=cfg.weight_decay)
    scheduler = get_cosine_schedule_with_warmup(optimizer, min(cfg.warmup_steps, total), total)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    device = accelerator.device

    state: dict[str, Any] = {"step": 0, "base_eval_loss": None}
    ckpt = latest_checkpoint(out) if resume else None
    if resume and ckpt is None:
        log.warning("%s: no checkpoint yet; starting from step 0", out)
    if ckpt is not None:
        state = load_checkpoint(ckpt, accelerator.unwrap_model(model), optimizer, scheduler)
    if state["base_eval_loss"] is None:
        state["base_eval_loss"] = evaluate(model, data.held_out, data.pad_id, device)
    metrics = RecordLog(out / "metrics.jsonl", keep_until_step=state["step"])
    events = RecordLog(out / "events.jsonl", keep_until_step=state["step"] if resume else None)
    budget = int(cfg.budget_gb * GB) or None
    meter = PeakMeter(device, budget)
    meter.track(list(accelerator.unwrap_model(model).parameters())
                + list(accelerator.unwrap_model(model).buffers())
                + [t for s in optimizer.state.values() for t in s.values() if torch.is_tensor(t)])

    def checkpoint(step: int, reason: str) -> None:
        path = save_checkpoint(out, step, accelerator.unwrap_model(model), optimizer, scheduler, state)
        events.append({"step": step, "event": "checkpoint", "reason": reason, "path": str(path)})

    status = "completed"
    bar = tqdm(total=total, initial=state["step"], disable=not progress, unit="step")
    with meter:
        plan_epoch_index, plan = -1, []
        while state["step"] < total:
            if control.stop.is_set():
                status = "stopped"
                break
            epoch, index = divmod(state["step"], per_epoch)
            if epoch != plan_epoch_index:
                plan_epoch_index, plan = epoch, epoch_plan(cfg, data, epoch)
            meter.start_step()
            start = time.perf_counter()
            stats = run_step(model, accelerator, data, plan[index])
            accelerator.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            seconds = time.perf_counter() - start
            state["step"] += 1
            step = plan[index]
            record = {"step": state["step"], "epoch": epoch, "loss": stats["loss"],
                      "lr": scheduler.get_last_lr()[0], "real_tokens": stats["real_tokens"],
                      "padded_tokens": stats["padded_tokens"], "batch_size": len(step.indices),
                      "micro_batches": len(step.micro_batches),
                      "seq_len": max(mb.seq_len for mb in step.micro_batches), "seconds": seconds,
                      "tokens_per_s": stats["real_tokens"] / seconds, "peak_bytes": meter.step_peak(),
                      "memory_source": meter.source, "time": time.time()}
            metrics.append(record)
            if control.on_record:
                control.on_record(record)
            bar.update(1)
            bar.set_postfix(loss=f"{stats['loss']:.3f}", peak_mb=f"{record['peak_bytes'] / 2**20:.0f}")
            if state["step"] % cfg.checkpoint_every == 0:
                checkpoint(state["step"], "periodic")
        bar.close()
        checkpoint(state["step"], status)
        eval_loss = evaluate(model, data.held_out, data.pad_id, device)
    adapter = _save_adapter(accelerator.unwrap_model(model), out)
    summary = _summary(cfg, metrics.snapshot(), {
        "status": status, "eval_loss": eval_loss, "base_eval_loss": state["base_eval_loss"],
        "memory_source": meter.source, "budget_bytes": budget, "adapter": str(adapter),
        "device": str(device), "precision": accelerator.mixed_precision,
        "train_samples": len(data.train), "eval_samples": len(data.held_out),
        "max_padded_len": round_up(max(len(s) for s in data.train), cfg.pad_multiple)})
    write_atomic(out / "run.json", json.dumps(summary, indent=1))
    return summary
