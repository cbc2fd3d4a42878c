"""The Train tab's status line: the run's state, its progress bar and ETA while it trains, the
time it trained once it ended (the figure the Runs tab shows), and whether the message under
the run buttons is about a start or stop that is over. No gradio here."""

from __future__ import annotations

import time
from typing import Any

from lora_gui.ui import common


def _progress(done: int, total: int | None, elapsed: float, running: bool = True,
              per_step: float | None = None) -> str:
    """A text progress bar; while the run trains, its ETA (``per_step`` seconds a step, else the
    seconds so far over the steps done); once it has ended, the time it trained instead."""
    if not total:
        return f"step {done}"
    filled = min(20, round(20 * done / total))
    if not running:
        tail = f", trained {elapsed:.0f} s"
    else:
        rate = per_step if per_step is not None else (elapsed / done if done else None)
        tail = f", ETA {rate * max(0, total - done):.0f} s" if done and rate is not None else ""
    return f"`{'█' * filled}{'░' * (20 - filled)}` step {done}/{total}{tail}"


ETA_STEPS = 50  # recent steps whose measured seconds give the ETA's pace


def step_seconds(records: list[dict[str, Any]]) -> float | None:
    """Seconds a step over the recent step records (each record's own measured time): the ETA
    moves when a step ends, never while the run waits between steps."""
    recent = [r["seconds"] for r in records[-ETA_STEPS:] if r.get("seconds")]
    return sum(recent) / len(recent) if recent else None


def trained_seconds(job: Any, records: list[dict[str, Any]] | None) -> float | None:
    """The seconds a run trained as the Runs tab shows them: run.json's ``train_seconds`` (the
    steps' own times), else the sum over the step records; None without either."""
    summary = getattr(job, "summary", None) or {}
    if summary.get("train_seconds") is not None:
        return float(summary["train_seconds"])
    times = [r["seconds"] for r in records or () if r.get("seconds") is not None]
    return float(sum(times)) if times else None


def status_line(job: Any, done: int, now: float | None = None,
                records: list[dict[str, Any]] | None = None) -> str:
    """The run's one-line status: its state ("stopping" as soon as Stop is pressed), progress
    and ETA (none once it has ended: the clock stops when the run does). With the run's step
    records, the ETA follows the steps' measured times and an ended run shows the training
    time the Runs tab shows."""
    now = time.time() if now is None else now
    phases = list(job.phases)
    train_start = next((t for name, t in phases if name == "training"), job.started)
    ended = next((t for name, t in phases if name == "done"), None)
    state = job.status
    if job.running and job.control.stop.is_set():
        state = "stopping (after the current step)"
    elapsed = (ended if ended is not None and not job.running else now) - train_start
    per_step = step_seconds(records) if records else None
    if not job.running:
        elapsed = trained_seconds(job, records) or elapsed
    return (f"**{job.name}**: {state} ({job.phase}) · "
            f"{_progress(done, job.total_steps, max(0.0, elapsed), job.running, per_step)}")


# what the message under the buttons says while a run starts or stops (cleared once it ended)
IN_FLIGHT = ("Started **", "Resuming **", "stopping ", "ending ")


def stale_message(message: str | None) -> Any:
    """"" for a message about a start or stop that is over (the status line says how the run
    ended), else None (the message stays)."""
    job = common.MANAGER.job
    if not message or job is None or job.running:
        return None
    return "" if str(message).startswith(IN_FLIGHT) else None
