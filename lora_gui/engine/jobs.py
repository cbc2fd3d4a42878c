"""One background training job at a time, for the UI: start, stop, re-attach, events.

The job runs the same :func:`lora_gui.engine.train` as the CLI in a worker thread (torch
releases the GIL in its kernels, so the page stays responsive). The UI only reads: ``snapshot()`` returns the
records so far; the engine never calls the UI.
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lora_gui.config import RunConfig
from lora_gui.engine import train
from lora_gui.engine.core.control import TrainControl
from lora_gui.engine.core.runstate import failure_message
from lora_gui.errors import UserError

log = logging.getLogger(__name__)


class JobBusyError(UserError, RuntimeError):
    """A job is already running; the message names it."""


@dataclass
class Job:
    """A training run owned by the :class:`JobManager`."""

    name: str
    out: Path
    cfg: RunConfig
    kind: str = "training"  # training | compare (any work started with JobManager.start_work)
    control: TrainControl = field(default_factory=TrainControl)
    status: str = "starting"  # starting | running | completed | stopped | failed
    phase: str = "loading"  # loading | training | saving | done
    error: str | None = None
    summary: dict[str, Any] | None = None
    started: float = field(default_factory=time.time)
    records: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    samples: list[dict[str, Any]] = field(default_factory=list)  # memory monitor, 2 Hz
    phases: list[tuple[str, float]] = field(default_factory=list)  # (phase, start time)
    predicted_bytes: int | None = None
    total_steps: int | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add_record(self, record: dict[str, Any]) -> None:
        with self._lock:
            self.status = "running"
            self.records.append(record)

    def add_event(self, text: str) -> None:
        with self._lock:
            self.events.append({"time": time.time(), "event": text})

    def on_engine_event(self, event: dict[str, Any]) -> None:
        """Phases, plan, checkpoints and out-of-memory recoveries from the engine."""
        kind = event.get("event")
        if kind == "phase":
            with self._lock:
                self.phase = event["phase"]
                self.phases.append((event["phase"], event["time"]))
            return
        if kind == "plan":
            self.predicted_bytes = event.get("predicted_peak_bytes")
            self.total_steps = event.get("total_steps")
            caps = event.get("caps")
            if caps:
                self.add_event(f"planned micro-batch per length bucket: {caps}")
            return
        if kind == "checkpoint":
            self.add_event(f"step {event['step']}: checkpoint saved ({event['reason']})")
        elif kind == "oom":
            self.add_event(f"step {event['step']}: out of memory, recovered by splitting: {event['message']}")
        else:
            self.add_event(str(event))

    def add_sample(self, sample: dict[str, Any]) -> None:
        with self._lock:
            self.samples.append(sample)

    def snapshot(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        with self._lock:
            return list(self.records), list(self.events)

    def memory_snapshot(self) -> tuple[list[dict[str, Any]], list[tuple[str, float]]]:
        with self._lock:
            return list(self.samples), list(self.phases)

    @property
    def running(self) -> bool:
        return self.status in ("starting", "running")


class JobManager:
    """Owns at most one running job; a second start is refused with the running job's name."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.job: Job | None = None

    def start(self, cfg: RunConfig, out: Path, *, resume: bool = False, overwrite: bool = False,
              processes: int = 1) -> Job:
        """Starts a job in a thread, or with ``processes`` > 1 as an ``accelerate launch``
        subprocess on that many local GPUs (followed through its run folder)."""
        with self._lock:
            if self.job is not None and self.job.running:
                raise JobBusyError(f"a job is already running: {self.job.name} (in {self.job.out}); "
                                   "stop it first")
            job = Job(name=out.name, out=out, cfg=cfg)
            self.job = job
        job.control.on_record = job.add_record
        job.control.on_event = job.on_engine_event
        job.control.on_sample = job.add_sample
        job.add_event(f"{'resuming' if resume else 'starting'} {job.name}")
        target, args = (self._run, (job, resume, overwrite)) if processes <= 1 else (
            self._run_launched, (job, processes, resume, overwrite))
        thread = threading.Thread(target=target, args=args, daemon=True, name=f"train-{job.name}")
        thread.start()
        return job

    def start_work(self, name: str, out: Path, cfg: RunConfig, kind: str,
                   work: Callable[[Job], dict[str, Any]]) -> Job:
        """Starts other background work (a comparison) as the one job: the same busy check, stop
        (``job.control.stop``) and status; ``work(job)`` returns the job's summary."""
        with self._lock:
            if self.job is not None and self.job.running:
                raise JobBusyError(f"a job is already running: {self.job.name} (in {self.job.out}); "
                                   "stop it first")
            job = Job(name=name, out=out, cfg=cfg, kind=kind)
            self.job = job
        job.add_event(f"starting {kind} {name}")

        def run() -> None:
            try:
                job.status = "running"
                job.summary = work(job)
                job.status = "stopped" if job.control.stop.is_set() else "completed"
                job.add_event(f"{job.status}: results in {job.out}")
            except Exception as err:  # the job must never stay "running" after a failure
                job.status, job.error = "failed", f"{type(err).__name__}: {err}"
                job.add_event(f"failed: {job.error}")
                log.debug("job %s failed:\n%s", job.name, traceback.format_exc())
            finally:
                job.phase = "done"
                job.phases.append(("done", time.time()))

        threading.Thread(target=run, daemon=True, name=f"{kind}-{name}").start()
        return job

    def _run(self, job: Job, resume: bool, overwrite: bool) -> None:
        try:
            job.summary = train(job.cfg, job.out, resume=resume, overwrite=overwrite,
                                control=job.control, progress=False)
            job.status = job.summary["status"]
            job.add_event(f"{job.status}: adapter saved in {job.summary['adapter']}")
        except Exception as err:  # the job must never stay "running" after a failure
            job.status, job.error = "failed", failure_message(err, job.out)
            job.add_event(f"failed: {job.error}")
            log.debug("job %s failed:\n%s", job.name, traceback.format_exc())
        finally:
            job.phase = "done"
            job.phases.append(("done", time.time()))

    def _run_launched(self, job: Job, processes: int, resume: bool, overwrite: bool) -> None:
        from lora_gui.engine.launch import run_launched

        try:
            run_launched(job, processes, resume, overwrite, job.out.parent / ".launch")
        except Exception as err:  # the job must never stay "running" after a failure
            job.status, job.error = "failed", f"{type(err).__name__}: {err}"
            job.add_event(f"failed: {job.error}")
        finally:
            job.phase = "done"
            job.phases.append(("done", time.time()))

    def stop(self) -> str:
        """Asks the running job to checkpoint and stop after the current step."""
        job = self.job
        if job is None or not job.running:
            return "no job is running"
        job.control.stop.set()
        job.add_event("stop requested: saving a checkpoint after the current step")
        return f"stopping {job.name}"
