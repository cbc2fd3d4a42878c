"""The run session every task's loop builds: what one run holds while it trains, and the three
things every loop does the same way (events, checkpoints, out-of-memory reports).

A task subclasses :class:`RunSession` with its own data and model parts (see
``engine/text/train.py`` and ``engine/image/train.py``); the shared loop in
:mod:`lora_gui.engine.core.loop` drives any of them.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator

from lora_gui.config import RunConfig
from lora_gui.engine.core.checkpoint import save_checkpoint
from lora_gui.engine.core.control import TrainControl
from lora_gui.engine.core.distributed import Dist
from lora_gui.engine.core.records import RecordLog
from lora_gui.engine.core.state import TrainState
from lora_gui.engine.core.trackers import Trackers
from lora_gui.memory.runtime.guard import BatchCaps
from lora_gui.memory.runtime.meter import PeakMeter

log = logging.getLogger(__name__)


@dataclass(kw_only=True)
class RunSession:
    """Everything a run holds while it trains, shared by every task.

    Attributes:
        model: the module being trained (a peft text model, a UNet with LoRA...), as prepared by
            accelerate; its trainable parameters are the LoRA weights.
        caps: micro-batch caps per length bucket (the planner's, lowered by the OOM guard).
        predicted: predicted peak bytes of the run's largest micro-batch (source: predicted).
        prediction: how it was predicted (device, attention kernel, the peak micro-batch...).
        per_epoch, total: optimizer steps per epoch and in the whole run.
    """

    cfg: RunConfig
    out: Path
    control: TrainControl
    dist: Dist
    accelerator: Accelerator
    model: Any
    optimizer: Any
    scheduler: Any
    state: TrainState
    metrics: RecordLog
    events: RecordLog
    meter: PeakMeter
    caps: BatchCaps
    predicted: int | None
    per_epoch: int
    total: int
    prediction: dict[str, Any] | None = None
    trackers: Trackers | None = None  # report_to, main process only
    peak: Any = None  # the device's measured matmul peak (lora_gui.models.flops.MachinePeak), for MFU

    def trainable(self) -> list[torch.nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    def event(self, event: dict[str, Any]) -> None:
        """Appends to events.jsonl (main process) and tells the listener."""
        event = {"step": self.state.step, "time": time.time(), **event}
        self.events.append(event)
        self.control.emit(event)

    def checkpoint(self, reason: str) -> None:
        """Saves a checkpoint from the main process (LoRA weights are the same on every rank)."""
        if not self.dist.is_main:
            return
        path = save_checkpoint(self.out, self.state.step, self.accelerator.unwrap_model(self.model),
                               self.optimizer, self.scheduler, self.state.to_dict())
        self.event({"event": "checkpoint", "reason": reason, "path": str(path)})

    def on_oom(self, event: dict[str, Any]) -> None:
        """The guard's report of a recovered out-of-memory error (split and retried)."""
        self.event({**event, "step": self.state.step + 1})
        log.warning("step %d: %s", self.state.step + 1, event["message"])

    def plan_event(self, budget: int | None, **extra: Any) -> None:
        """The run's memory plan, first event of every run (the dashboard reads it)."""
        self.event({"event": "plan", "caps": self.caps.caps, "predicted_peak_bytes": self.predicted,
                    "prediction": self.prediction, "budget_bytes": budget, "total_steps": self.total,
                    "world_size": self.dist.world_size, **extra})
        if self.trackers is not None:  # budget, prediction and the base model's loss, at the start
            self.trackers.log({"budget_bytes": budget, "predicted_peak_bytes": self.predicted,
                               "base_eval_loss": self.state.base_eval_loss}, self.state.step)
