"""One background job at a time, for the UI: start, stop, re-attach, events.

A training job is a process of its own running the same CLI a user would (see
:mod:`lora_gui.engine.jobs.launch`): it outlives the dashboard, and a dashboard started later
re-attaches to it (:meth:`JobManager.attach_live`). A worker thread follows its run folder into
the job. Other work (a comparison) runs in a worker thread of the server. The UI only reads:
``snapshot()`` returns the records so far; the engine never calls the UI.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lora_gui.config import RunConfig
from lora_gui.engine.core.control import TrainControl
from lora_gui.engine.core.runstate import failure_message
from lora_gui.engine.jobs.card_guard import claim_card, release_card, start_lock
from lora_gui.errors import UserError

log = logging.getLogger(__name__)


class JobBusyError(UserError, RuntimeError):
    """A job is already running; the message names it."""


def plan_caps_text(caps: dict[Any, int], names: dict[Any, str] | None = None) -> str:
    """The plan's micro-batch caps as an event line: per length bucket (tokens) for text runs,
    per resolution bucket (W x H px) for image runs, whose caps the engine keys by latent size."""
    if names:  # JSON round trips turn the int keys into strings: look both up
        named = {names.get(k, names.get(str(k), f"{k} latent px")): v for k, v in caps.items()}
        return f"planned micro-batch per resolution bucket (W x H px): {named}"
    return f"planned micro-batch per length bucket (tokens): {caps}"


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
    pid: int | None = None  # the training process (the launcher with several processes)
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
                self.add_event(plan_caps_text(caps, event.get("bucket_names")))
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

    def __init__(self, gate: Callable[[RunConfig], None] | None = None) -> None:
        self._lock = threading.Lock()
        self.job: Job | None = None
        # the dashboard's path check (lora_gui.ui.paths.check_config): every run and comparison
        # this manager starts (Start, Resume, the queue's runner) passes it first; None: no limit
        self.gate = gate
        self.queue_runner = None  # the queue's runner (jobs/queue_runner.py), once run_queue is called

    def run_queue(self, runs_root: Path, every_s: float = 1.0):
        """Starts the queue of ``runs_root`` (``runs_root/queue.json``) from a background thread:
        the next queued run starts as this manager's job when the card is free. Returns the
        :class:`lora_gui.engine.jobs.queue_runner.QueueRunner` (its ``problem`` is the line to show,
        e.g. when another dashboard runs that queue)."""
        from lora_gui.engine.jobs.queue_runner import QueueRunner

        if self.queue_runner is None:
            self.queue_runner = QueueRunner(self, runs_root)
            threading.Thread(target=self.queue_runner.loop, args=(every_s,), daemon=True,
                             name="queue-runner").start()
        return self.queue_runner

    def start(self, cfg: RunConfig, out: Path, *, resume: bool = False, overwrite: bool = False,
              processes: int = 1, fsdp: bool = False, offload: bool = False) -> Job:
        """Starts a training run as a process of its own (``python -m lora_gui train``, or
        ``accelerate launch`` on ``processes`` local GPUs, with ``fsdp`` sharding the frozen
        weights, ``offload`` keeping the shards in host memory), followed through its run folder."""
        if self.gate is not None:
            self.gate(cfg)  # paths outside the dashboard's folders: refused before anything starts
        with start_lock(out.parent), self._lock:  # one run on the card across dashboards
            if self.job is not None and self.job.running:
                raise JobBusyError(f"a job is already running: {self.job.name} (in {self.job.out}); "
                                   "stop it first")
            claim_card(out.parent, out)
            job = Job(name=out.name, out=out, cfg=cfg)
            self.job = job
        job.control.on_record = job.add_record
        job.control.on_event = job.on_engine_event
        job.control.on_sample = job.add_sample
        job.add_event(f"{'resuming' if resume else 'starting'} {job.name}")
        thread = threading.Thread(target=self._run_launched,
                                  args=(job, processes, resume, overwrite, fsdp, offload),
                                  daemon=True, name=f"train-{job.name}")
        thread.start()
        return job

    def start_work(self, name: str, out: Path, cfg: RunConfig, kind: str,
                   work: Callable[[Job], dict[str, Any]]) -> Job:
        """Starts other background work (a comparison) as the one job: the same busy check, stop
        (``job.control.stop``) and status; ``work(job)`` returns the job's summary."""
        if self.gate is not None:
            self.gate(cfg)
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

    def _run_launched(self, job: Job, processes: int, resume: bool, overwrite: bool, fsdp: bool = False,
                      offload: bool = False) -> None:
        from lora_gui.engine.jobs.launch import run_launched

        launch_dir = job.out.parent / ".launch"
        try:
            self._guarded(job, lambda: run_launched(job, processes, resume, overwrite, launch_dir,
                                                    fsdp=fsdp, offload=offload))
        finally:
            release_card(job.out.parent, job.out)

    @staticmethod
    def _guarded(job: Job, work: Callable[[], None]) -> None:
        try:
            work()
        except Exception as err:  # the job must never stay "running" after a failure
            job.status, job.error = "failed", failure_message(err, job.out)
            job.add_event(f"failed: {job.error}")
            log.debug("job %s failed:\n%s", job.name, traceback.format_exc())
        finally:
            job.phase = "done"
            job.phases.append(("done", time.time()))

    def attach_live(self, runs_root: Path) -> Job | None:
        """Re-attaches to the newest run under ``runs_root`` whose writer is alive (a dashboard
        started while a run trains): its records so far are read back, and it is followed to
        its end. None when no run is alive or a job is already running here."""
        from lora_gui.engine.core.lock import lock_is_live, read_lock
        from lora_gui.engine.core.rundir import load_run_config
        from lora_gui.engine.jobs.launch import follow_existing

        live = [d for d in Path(runs_root).glob("*") if d.is_dir() and lock_is_live(d)]
        with self._lock:
            if not live or (self.job is not None and self.job.running):
                return None
            out = max(live, key=lambda d: (read_lock(d).started if read_lock(d) else 0.0))
            try:
                cfg = load_run_config(out)
            except UserError as err:
                log.warning("cannot re-attach to %s: %s", out, err)
                return None
            job = Job(name=out.name, out=out, cfg=cfg, status="running", phase="training")
            info = read_lock(out)
            job.pid = info.pid if info else None
            self.job = job
        job.add_event(f"re-attached to {job.name}, which kept training while the dashboard was away")
        threading.Thread(target=self._guarded, args=(job, lambda: follow_existing(job)), daemon=True,
                         name=f"follow-{job.name}").start()
        return job

    def stop(self) -> str:
        """Asks the running job to checkpoint and stop after the current step; asked again while
        a training process still runs, ends that process (its last checkpoint stays)."""
        job = self.job
        if job is None or not job.running:
            return "no job is running"
        if job.control.stop.is_set() and job.pid is not None:
            try:  # its process group: a launcher and its ranks too
                os.killpg(os.getpgid(job.pid), signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                return f"{job.name} has already ended"
            job.add_event("stopped at once: the process was ended; resume from its last checkpoint")
            return f"ending {job.name} now"
        job.control.stop.set()  # the follower writes RUN/STOP, which the training process reads
        job.add_event("stop requested: saving a checkpoint after the current step (Stop again to end it now)")
        return f"stopping {job.name}"
