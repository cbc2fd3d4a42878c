"""The queue on the dashboard: Add to queue (Train tab), the queue's table with reorder and
cancel, a sweep of one setting, and the overlay of a finished sweep (Runs tab). The queue itself
is engine/jobs/queue_file.py and engine/jobs/queue_runner.py; the server's job manager runs it."""

from __future__ import annotations

from typing import Any

from lora_gui.engine.jobs import queue_runner
from lora_gui.engine.jobs.queue_file import Entry, Queue
from lora_gui.errors import clip
from lora_gui.ui import common, gpu_share, paths
from lora_gui.ui.tabs import runs_handlers, train_handlers

QUEUE_COLUMNS = ("#", "id", "run", "state", "sweep", "message")
SWEEP_MOST = 8  # runs a sweep's overlay draws


def _entries() -> tuple[list[Entry], str]:
    """(entries, a line about the queue: a bad file moved aside, another dashboard running it)."""
    try:
        entries = Queue(common.runs_root()).entries()
    except common.USER_ERRORS as err:
        return [], f"Error: {err}"
    runner = common.MANAGER.queue_runner
    return entries, (f"Note: {runner.problem}" if runner is not None and runner.problem else "")


def add_from_form(run_name: str, processes: Any, values: dict[str, Any],
                  sharing: str = gpu_share.REPLICATED) -> tuple[str, dict[str, str]]:
    """Add to queue: the Train form's settings through the same checks as Start (returns the
    message and {setting: message} for the fields), then the queue's own checks. ``sharing``:
    how several GPUs share the run, kept with the entry and launched as Start launches it."""
    cfg, errors = train_handlers.config_from_form(values)
    if cfg is None:
        return "Error: fix the settings marked below.", errors
    try:
        n = train_handlers.check_processes(processes, cfg.task)
        parallel = gpu_share.parallel_from_form(n, sharing, "processes")
        gpu_share.check_for_run(parallel, cfg.task, cfg.quantization)
        entry = queue_runner.add(common.runs_root(), cfg, run_name, n, gate=paths.check_config,
                                 fsdp=parallel.fsdp, offload=parallel.offload)
    except common.USER_ERRORS as err:
        return f"Error: {err}", {}
    position = [e.id for e in Queue(common.runs_root()).entries()].index(entry.id) + 1
    return (f"Queued **{entry.name}** at position {position}; it starts when the card is free "
            "(the Runs tab shows the queue)"), {}


def queue_rows() -> tuple[list[list[Any]], str]:
    """The queue's table (in order) and the line about it."""
    entries, line = _entries()
    rows = [[i, e.id, e.name, e.state, e.sweep or "", e.message] for i, e in enumerate(entries, 1)]
    return rows, line


def entry_choices() -> list[tuple[str, str]]:
    """(label, id) of the entries that can still move or be cancelled."""
    entries, _ = _entries()
    return [(f"{e.name} ({e.state}, {e.id})", e.id) for e in entries if e.state in ("queued", "started")]


def sweep_choices() -> list[tuple[str, str]]:
    """(label, sweep id) of every sweep in the queue."""
    entries, _ = _entries()
    groups = queue_runner.sweep_groups(entries)
    return [(f"{group[0].name.rsplit('-', 1)[0]} ({sum(e.state == 'done' for e in group)}/{len(group)} "
             f"done, {sweep})", sweep) for sweep, group in groups.items()]


def _act(action, *args: Any) -> str:
    try:
        return action(common.runs_root(), *args)
    except common.USER_ERRORS as err:
        return f"Error: {err}"


def move_by(entry_id: str | None, delta: int) -> str:
    if not entry_id:
        return "Error: pick a queued run first"
    return _act(queue_runner.step, entry_id, delta)


def move_to(entry_id: str | None, position: Any) -> str:
    if not entry_id:
        return "Error: pick a queued run first"
    try:
        return _act(queue_runner.move, entry_id, int(position))
    except (TypeError, ValueError):
        return f"Error: position {clip(position)} is not a whole number"


def cancel(entry_id: str | None) -> str:
    if not entry_id:
        return "Error: pick a queued run first"
    return _act(queue_runner.cancel, entry_id)


def queue_sweep(preset: str, key: str, values: str, base_name: str) -> str:
    """One run per value of ``key`` on the preset's settings, every one checked first."""
    try:
        base, errors = train_handlers.config_from_form(train_handlers.form_values(preset))
        if base is None:  # the preset with the budget the Train form gives it (this GPU's memory)
            return "Error: " + "; ".join(errors.values())
        entries = queue_runner.sweep(common.runs_root(), base, (key or "").strip(), values or "",
                                     (base_name or preset or "").strip(), gate=paths.check_config)
    except common.USER_ERRORS as err:
        return f"Error: {err}"
    return (f"Queued a sweep of **{key}** ({entries[0].sweep}): "
            + ", ".join(e.name for e in entries))


def overlay_sweep(sweep_id: str | None, smoothing: float = 0.0) -> tuple[str, Any, Any, Any]:
    """(message, memory, loss, throughput) of a sweep's finished runs, one line each."""
    entries, _ = _entries()
    group = queue_runner.sweep_groups(entries).get(sweep_id or "")
    if not group:
        return "Error: pick a sweep first", None, None, None
    done = [e.name for e in group if e.state == "done"]
    if len(done) < 2:
        return (f"Error: {len(done)} of the sweep's {len(group)} runs finished; the overlay needs "
                "two", None, None, None)
    return runs_handlers.overlay(done, smoothing, most=SWEEP_MOST)
