"""The set-up steps every task's run shares: device, weights dtype, accelerator, scheduler,
restored or fresh training state, record files. A task's ``_setup`` calls them in order
between its own data and model steps."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.state import AcceleratorState
from transformers import get_cosine_schedule_with_warmup

from lora_gui.config import RunConfig
from lora_gui.engine.core.checkpoint import restore_training_state
from lora_gui.engine.core.distributed import Dist
from lora_gui.engine.core.records import RecordLog
from lora_gui.engine.core.state import TrainState
from lora_gui.engine.core.trackers import Trackers, open_trackers

log = logging.getLogger(__name__)


def run_device(dist: Dist) -> torch.device:
    """The launch's device for this rank, else the GPU when there is one, else the CPU."""
    if dist.active:
        return dist.device
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def new_accelerator(device: torch.device, mixed: str) -> Accelerator:
    """A fresh accelerator: one process may run several jobs (the dashboard) in other precisions."""
    AcceleratorState._reset_state()
    return Accelerator(cpu=device.type == "cpu", mixed_precision=mixed)


def cosine_scheduler(cfg: RunConfig, optimizer: torch.optim.Optimizer, total: int) -> Any:
    """Linear warm-up over ``warmup_steps`` (at most the run), then cosine decay to zero."""
    return get_cosine_schedule_with_warmup(optimizer, min(cfg.warmup_steps, total), total)


def start_state(cfg: RunConfig, out: Path, ckpt: dict[str, Any] | None, resume: bool, optimizer: Any,
                scheduler: Any, fresh: TrainState, sampler: dict[str, Any], dist: Dist) -> TrainState:
    """The checkpoint's state (optimizer, scheduler and RNG restored) or ``fresh``, with the
    sampler and world size of this launch, and each rank's own dropout stream."""
    if resume and ckpt is None:
        log.warning("%s: no checkpoint yet; starting from step 0", out)
    if ckpt is not None:
        state = TrainState.from_dict(restore_training_state(ckpt, optimizer, scheduler))
    else:
        state = fresh
    state.sampler, state.world_size = sampler, dist.world_size
    if dist.active:  # own dropout stream per rank (the checkpoint holds the main process's RNG)
        torch.manual_seed(cfg.seed * 7919 + 1_000_003 * dist.rank + state.step)
    return state


def open_logs(out: Path, state: TrainState, resume: bool, dist: Dist) -> tuple[RecordLog, RecordLog]:
    """metrics.jsonl and events.jsonl, cut back to the resumed step (main process writes)."""
    main = dist.is_main
    metrics = RecordLog(out / "metrics.jsonl", keep_until_step=state.step, write=main)
    events = RecordLog(out / "events.jsonl", keep_until_step=state.step if resume else None, write=main)
    return metrics, events


def attach_trackers(cfg: RunConfig, out: Path, state: TrainState, resume: bool, dist: Dist,
                    metrics: RecordLog, memory_source: str) -> Trackers | None:
    """Starts the run's experiment trackers (main process; report_to) and makes them a sink of
    metrics.jsonl, so every step record reaches them as it is written."""
    trackers = open_trackers(cfg, out, state.step, resume, dist.is_main, {"memory_source": memory_source})
    if trackers is not None:
        metrics.sinks.append(trackers.record)
    return trackers
