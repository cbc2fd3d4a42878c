"""Queueing runs and starting them one after the other (the queue file: :mod:`queue_file`).

:func:`add` checks a run (settings, data, model, the run's own plan against its budget) and
queues it, reserving its run folder; :func:`sweep` queues one run per value of a setting.
:class:`QueueRunner` starts the next queued run when the card is free (no job of this process
running and no live run folder under the runs folder), as its own process through the job
manager (the dashboard's Start path), after checking it again. The dashboard ticks it from a
background thread (:meth:`lora_gui.engine.jobs.manager.JobManager.run_queue`); ``python -m lora_gui
queue run`` ticks it in the foreground until the queue is done (:func:`run_to_end`).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lora_gui.config import ConfigError, RunConfig, apply_overrides, parse_value
from lora_gui.engine.core.lock import lock_is_live
from lora_gui.engine.core.rundir import RUN_FILES, run_folder
from lora_gui.engine.core.runstate import folder_state
from lora_gui.engine.jobs.card_guard import busy_with, start_lock
from lora_gui.engine.jobs.queue_file import (
    ENDED,
    MARKER,
    Entry,
    Queue,
    QueueError,
    QueueFileError,
    RunnerLock,
    new_id,
)
from lora_gui.errors import USER_ERRORS, clip
from lora_gui.units import GB, gb

if TYPE_CHECKING:
    from lora_gui.engine.jobs.manager import JobManager

log = logging.getLogger(__name__)
TICK_S = 1.0  # seconds between two looks at the card and the queue


# -- checks --------------------------------------------------------------------------------------
Gate = Callable[[RunConfig], None]  # the dashboard's path check; raises a user error


def check_run(config: dict[str, Any] | RunConfig, name: str, processes: int = 1,
              gate: Gate | None = None, fsdp: bool = False, offload: bool = False) -> RunConfig:
    """The run's settings validated, passed through ``gate`` (the dashboard's path check, before
    any file is looked at), its data and model found and its own plan (the planner's
    ``predict``, as the Train tab and the run use; per GPU with ``fsdp`` / ``offload``) within its
    budget; raises a user error naming the setting, file or figure otherwise."""
    from lora_gui.memory.predict import predict

    values = config.to_dict() if isinstance(config, RunConfig) else config
    cfg = apply_overrides(RunConfig(), values, where=f"queued run {name}")
    if gate is not None:
        gate(cfg)
    data = cfg.data_path()
    if not data.exists():
        raise ConfigError(f"queued run {name}: data: {data} not found")
    try:
        pred = predict(cfg, processes=processes, fsdp=fsdp, offload=offload)  # reads data, model config
    except (ValueError, NotImplementedError, RuntimeError) as err:
        raise QueueError(f"queued run {name}: no plan for these settings ({err})") from None
    budget = int(cfg.budget_gb * GB) or None
    fits = pred.plan.fits if pred.plan is not None else True  # as the Train tab's verdict
    fits = fits and pred.peak_bytes <= (budget or pred.peak_bytes)
    if not fits:
        raise QueueError(f"queued run {name}: predicted peak {gb(pred.peak_bytes)} does not "
                         f"fit budget_gb {cfg.budget_gb:g} ({gb(budget)}; source: predicted)")
    return cfg


def _reserve(root: Path, name: str, entries: list[Entry]) -> Path:
    """The run folder ``root/name`` for a new entry: refused when a queued or running entry
    has that name or the folder holds a run."""
    out = run_folder(root, name)
    if any(e.name == out.name and e.state not in ENDED for e in entries):
        raise QueueError(f"run name {out.name!r} is queued already; pick another run name")
    if out.is_dir() and any((out / f).exists() for f in RUN_FILES):
        raise QueueError(f"{out}: holds another run; pick another run name (or delete that run)")
    return out


# -- changing the queue --------------------------------------------------------------------------
def add(root: Path, config: dict[str, Any] | RunConfig, name: str, processes: int = 1,
        sweep_id: str | None = None, gate: Gate | None = None, fsdp: bool = False,
        offload: bool = False) -> Entry:
    """Checks the run (``gate``: the dashboard's path check) and appends it to the queue of
    ``root``; its run folder is reserved. ``fsdp`` / ``offload``: how its ``processes`` share the
    model, kept with the entry and launched as Start launches it."""
    root = Path(root)
    out = _reserve(root, name, Queue(root).entries())  # quick refusals before the plan's seconds
    if offload and not fsdp:
        raise ConfigError(f"queued run {name}: offload keeps FSDP's shards in host memory: ask for FSDP too")
    fsdp = fsdp and processes > 1  # one process: nothing to share (as the dashboard's form reads it)
    offload = offload and fsdp
    cfg = check_run(config, out.name, processes, gate, fsdp, offload)
    entry = Entry(id=new_id(), name=out.name, config=cfg.to_dict(), processes=processes, sweep=sweep_id,
                  fsdp=fsdp, offload=offload)
    with Queue(root).edit() as entries:
        _reserve(root, name, entries)  # again, under the lock
        out.mkdir(parents=True, exist_ok=True)
        (out / MARKER).write_text(f'{{"id": "{entry.id}"}}\n', encoding="utf-8")
        entries.append(entry)
    return entry


def sweep_values(key: str, text: str) -> list[Any]:
    """``1e-4,2e-4`` -> the setting's typed values (ConfigError naming the setting)."""
    values = [parse_value(key, part.strip()) for part in str(text).split(",") if part.strip()]
    if len(values) < 2:
        raise ConfigError(f"sweep {key}: give two or more comma-separated values, got {clip(text)}")
    return values


def _value_name(value: Any) -> str:
    text = f"{value:g}" if isinstance(value, float) else str(value)
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in text)


def sweep(root: Path, base: RunConfig, key: str, values_text: str, base_name: str,
          processes: int = 1, gate: Gate | None = None, fsdp: bool = False,
          offload: bool = False) -> list[Entry]:
    """Queues one run per value of ``key`` (named BASE-KEY-VALUE), every one checked first
    (``gate``: the dashboard's path check, on every swept value): nothing is queued when one of
    them is refused."""
    values = sweep_values(key, values_text)
    configs = [apply_overrides(base, {key: v}, where=f"sweep {key}={clip(v)}") for v in values]
    names = [f"{base_name}-{key}-{_value_name(v)}" for v in values]
    entries = Queue(root).entries()
    for name in names:
        _reserve(Path(root), name, entries)
    if gate is not None:  # every value's paths before the first plan's seconds
        for cfg in configs:
            gate(cfg)
    for cfg, name in zip(configs, names):
        check_run(cfg, name, processes, gate, fsdp, offload)
    sweep_id = new_id()
    return [add(root, cfg, name, processes, sweep_id=sweep_id, gate=gate, fsdp=fsdp, offload=offload)
            for cfg, name in zip(configs, names)]


def _free_folder(root: Path, entry: Entry) -> None:
    """Removes the reservation of a queued entry (its marker, and the folder when empty)."""
    out = Path(root) / entry.name
    (out / MARKER).unlink(missing_ok=True)
    try:
        out.rmdir()
    except OSError:
        pass  # not empty or gone: left as it is


def cancel(root: Path, key: str) -> str:
    """Cancels a queued entry; a started one is asked to stop (checkpoint, then stop)."""
    with Queue(root).edit() as entries:
        entry = Queue(root).find(entries, key)
        if entry.state == "queued":
            entry.state, entry.ended, entry.message = "cancelled", time.time(), "cancelled before it started"
            _free_folder(root, entry)
            return f"cancelled {entry.label()}"
        if entry.state == "started" and (Path(root) / entry.name).is_dir():
            (Path(root) / entry.name / "STOP").touch()  # the run reads it after its current step
            return f"asked {entry.label()} to stop after its current step (a checkpoint is saved)"
        return f"{entry.label()} has ended already ({entry.state})"


def move(root: Path, key: str, position: int) -> str:
    """Moves an entry to ``position`` (1 = first) in the queue's order."""
    with Queue(root).edit() as entries:
        entry = Queue(root).find(entries, key)
        if entry.state != "queued":
            raise QueueError(f"{entry.label()} is {entry.state}; only queued runs can move")
        entries.remove(entry)
        index = min(max(int(position), 1), len(entries) + 1) - 1
        entries.insert(index, entry)
        return f"moved {entry.label()} to position {index + 1}"


def step(root: Path, key: str, delta: int) -> str:
    """Moves a queued entry up (delta -1) or down (+1) past its neighbouring queued entry."""
    entries = Queue(root).entries()
    entry = Queue(root).find(entries, key)
    queued = [e.id for e in entries if e.state == "queued"]
    if entry.id not in queued:
        raise QueueError(f"{entry.label()} is {entry.state}; only queued runs can move")
    other = queued.index(entry.id) + delta
    if not 0 <= other < len(queued):
        return f"{entry.label()} is already {'first' if delta < 0 else 'last'} of the queued runs"
    return move(root, entry.id, [e.id for e in entries].index(queued[other]) + 1)


# -- starting the queue's runs -------------------------------------------------------------------
def _pid_alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _ended(entry: Entry, state: str, message: str) -> None:
    entry.state, entry.message, entry.ended = state, message, time.time()


class QueueRunner:
    """Starts the queue's runs, one at a time, through ``manager`` (see the module's doc)."""

    def __init__(self, manager: JobManager, runs_root: Path,
                 say: Callable[[str], None] | None = None) -> None:
        self.manager, self.root = manager, Path(runs_root)
        self.queue, self.lock = Queue(self.root), RunnerLock(self.root)
        self.say = say or log.info
        self.current: str | None = None  # the entry whose run this manager's job is
        self.problem = ""  # the last line to show (another runner, a bad queue file)
        self.starting = True  # False: finish what runs, start nothing more (Ctrl-C on `queue run`)
        self._stop = threading.Event()

    def card_busy(self) -> bool:
        """A job of this process runs, or a run folder under the runs folder has a live writer."""
        job = self.manager.job
        if job is not None and job.running:
            return True
        return busy_with(self.root) is not None  # a live run folder, or a start under way

    def tick(self) -> Entry | None:
        """Settles ended runs and starts the next queued run when the card is free; returns the
        entry started (None when none was)."""
        if not self.queue.path.is_file() and self.lock.fd is None:
            return None  # no queue here: nothing to run, no files written
        if not self.lock.acquire():
            line = (f"the queue in {self.root} is run by another dashboard or `queue run` "
                    f"({self.lock.holder()}); this one shows it and starts none of its runs")
            if line != self.problem:
                log.warning("%s", line)
            self.problem = line
            return None
        self.problem = ""
        try:
            self._settle()
            while self.starting and not self.card_busy():
                entry = next((e for e in self.queue.entries() if e.state == "queued"), None)
                if entry is None:
                    return None
                if self._start(entry):
                    return entry
        except QueueFileError as err:
            self.problem = str(err)
            log.warning("%s", err)
        return None

    def _settle(self) -> None:
        """Marks started entries whose run ended as done, failed or cancelled."""
        job = self.manager.job
        with self.queue.edit() as entries:
            for entry in (e for e in entries if e.state == "started"):
                if entry.id == self.current and job is not None:
                    entry.pid = entry.pid or job.pid
                    if not job.running:
                        self._ended_job(entry, job)
                    continue
                out = self.root / entry.name
                if lock_is_live(out) or _pid_alive(entry.pid):
                    continue  # training in another process (started before a restart)
                self._ended_folder(entry, out)

    def _ended_job(self, entry: Entry, job: Any) -> None:
        self.current = None
        steps = len(job.records)
        if job.status == "completed":
            _ended(entry, "done", f"completed {steps} steps")
        elif job.status == "stopped":
            _ended(entry, "cancelled", f"stopped at step {steps}; resume it from the Runs tab")
        else:
            _ended(entry, "failed", job.error or "failed")
        self.say(f"{entry.name}: {entry.state} ({entry.message})")

    def _ended_folder(self, entry: Entry, out: Path) -> None:
        state = folder_state(out)
        if state.status == "completed":
            _ended(entry, "done", f"completed {state.last_step or 0} steps")
        elif state.status == "stopped":
            _ended(entry, "cancelled", f"stopped at step {state.last_step or 0}")
        elif state.status == "empty":
            _ended(entry, "failed", f"{out}: the run never began (its launcher ended first; see "
                                    f"{self.root / '.launch' / (entry.name + '.log')})")
        else:
            _ended(entry, "failed", state.message)
        self.say(f"{entry.name}: {entry.state} ({entry.message})")

    def _fail(self, entry_id: str, message: str) -> None:
        with self.queue.edit() as entries:
            for entry in entries:
                if entry.id == entry_id:
                    _ended(entry, "failed", message)
        self.say(f"failed to start: {message}")

    def _start(self, entry: Entry) -> bool:
        """Checks ``entry`` again, claims it and launches its run; False when it failed (the
        next entry may start)."""
        try:
            out = run_folder(self.root, entry.name)  # a hand-edited name stays inside the runs folder
        except USER_ERRORS as err:
            self._fail(entry.id, f"{self.queue.path}: entry {entry.id}: {err}")
            return False
        if not out.is_dir():
            self._fail(entry.id, f"{out}: the run folder was deleted while its run was queued; skipped")
            return False
        if any((out / f).exists() for f in RUN_FILES):
            self._fail(entry.id, f"{out}: holds another run started there after this one was queued; "
                                 "skipped")
            return False
        try:
            cfg = check_run(entry.config, entry.name, entry.processes, getattr(self.manager, "gate", None),
                            entry.fsdp, entry.offload)
        except USER_ERRORS as err:
            self._fail(entry.id, str(err))
            return False
        with start_lock(self.root):  # no Start of another dashboard between the check and the launch
            if self.card_busy():
                return False  # stays queued: it starts when the card is free
            with self.queue.edit() as entries:
                now = next((e for e in entries if e.id == entry.id), None)
                if now is None or now.state != "queued":
                    return False  # cancelled while it was checked
                if not self.queue.claim(now):
                    _ended(now, "failed", f"{now.label()} was started once already (claim in "
                                          f"{self.queue.dir / 'claims'}); never started twice")
                    return False
                now.state, now.out, now.started = "started", str(out), time.time()
            (out / MARKER).unlink(missing_ok=True)
            try:
                job = self.manager.start(cfg, out, processes=entry.processes, fsdp=entry.fsdp,
                                         offload=entry.offload)
            except USER_ERRORS as err:
                self._fail(entry.id, str(err))
                return False
        self.current = entry.id
        self._note_pid(entry.id, job)
        self.say(f"started {entry.label()} -> {job.out}")
        return True

    def _note_pid(self, entry_id: str, job: Any, wait_s: float = 2.0) -> None:
        """Writes the run's process id into its entry as soon as it is known, so that a runner
        after a restart sees the run alive before the run takes its folder's lock."""
        deadline = time.monotonic() + wait_s
        while job.pid is None and job.running and time.monotonic() < deadline:
            time.sleep(0.02)
        if job.pid is None:
            return  # the next tick's settle writes it
        with self.queue.edit() as entries:
            for entry in entries:
                if entry.id == entry_id:
                    entry.pid = job.pid

    def idle(self) -> bool:
        """Nothing queued (or starting stopped) and nothing of the queue still running."""
        entries = self.queue.entries()
        waiting = self.starting and any(e.state == "queued" for e in entries)
        return not waiting and not any(e.state == "started" for e in entries)

    def loop(self, every_s: float = TICK_S) -> None:
        """Ticks until :meth:`close` (the dashboard's background thread)."""
        while not self._stop.is_set():
            try:
                self.tick()
            except Exception:  # the thread must outlive one bad tick; the next one retries
                log.exception("queue runner: tick failed")
            self._stop.wait(every_s)

    def close(self) -> None:
        self._stop.set()
        self.lock.release()


def run_to_end(manager: JobManager, root: Path, say: Callable[[str], None], stop: threading.Event,
               every_s: float = TICK_S) -> int:
    """``queue run``: runs the queue of ``root`` in the foreground until nothing is queued or
    running; ``stop`` set (Ctrl-C) stops the current run and starts nothing more. Returns the
    number of entries that failed."""
    runner = QueueRunner(manager, root, say)
    if not runner.lock.acquire():
        raise QueueError(f"the queue in {root} is run by another dashboard or `queue run` "
                         f"({runner.lock.holder()}); let that one run it")
    failed_before = {e.id for e in runner.queue.entries() if e.state == "failed"}
    stopped = False
    try:
        while True:
            if stop.is_set() and not stopped:
                runner.starting, stopped = False, True
                if manager.job is not None and manager.job.running:
                    say(manager.stop())
            runner.tick()
            if runner.idle():
                break
            time.sleep(every_s)
    finally:
        runner.close()
    return sum(e.state == "failed" and e.id not in failed_before for e in runner.queue.entries())


def sweep_groups(entries: list[Entry]) -> dict[str, list[Entry]]:
    """Sweep id -> its entries, in queue order."""
    groups: dict[str, list[Entry]] = {}
    for entry in entries:
        if entry.sweep:
            groups.setdefault(entry.sweep, []).append(entry)
    return groups

