"""What a run folder says about its run, read from the files alone (no process of ours needed).

A run whose process died from outside (kill -9, the kernel's out-of-memory killer, a power cut)
writes no run.json; its writer lock (:mod:`lora_gui.engine.core.lock`) is then no longer held.
:func:`folder_state` tells that apart from a run that is still writing, and says the last step
it recorded and the checkpoint a ``--resume`` would continue from.
"""

from __future__ import annotations

import errno
import json
from dataclasses import dataclass
from pathlib import Path

from lora_gui.engine.core.checkpoint import latest_checkpoint
from lora_gui.engine.core.lock import LOCK_FILE, lock_is_live


@dataclass(frozen=True)
class FolderState:
    """A run folder's status: running | completed | stopped | out_of_memory | failed | empty."""

    status: str
    last_step: int | None
    resume_from: Path | None
    message: str


def last_recorded_step(out: Path) -> int | None:
    """The step of the last complete line of metrics.jsonl (a half-written line is skipped)."""
    path = Path(out) / "metrics.jsonl"
    try:
        lines = path.read_bytes().splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        try:
            return int(json.loads(line)["step"])
        except (ValueError, KeyError, TypeError):
            continue
    return None


def resume_hint(out: Path) -> str:
    """Where a resume continues from, as a sentence."""
    ckpt = latest_checkpoint(Path(out))
    if ckpt is None:
        return f"no checkpoint was saved yet; `--resume {out}` starts again from step 0"
    step = int(ckpt.name.split("-")[-1])
    return (f"the last good checkpoint is step {step} ({ckpt}); continue with "
            f"`python -m lora_gui train --resume {out}` or the Resume button")


def died_message(out: Path, how: str) -> str:
    """The failure text of a run whose process ended without finishing (``how``: the cause)."""
    step = last_recorded_step(out)
    at = f"after step {step}" if step is not None else "before its first step"
    return f"the training process {how} {at}; {resume_hint(out)}"


def folder_state(out: Path) -> FolderState:
    """The status of the run in ``out`` from its lock, run.json, metrics and checkpoints."""
    out = Path(out)
    step, ckpt = last_recorded_step(out), latest_checkpoint(out)
    if lock_is_live(out):
        return FolderState("running", step, ckpt, "a process is writing into this folder")
    summary = out / "run.json"
    if summary.is_file() and not (out / LOCK_FILE).exists():
        try:
            saved = json.loads(summary.read_text(encoding="utf-8"))
            status, steps = saved["status"], int(saved.get("steps") or 0)
        except (OSError, ValueError, KeyError, TypeError):
            status, steps = None, 0
        if status and (step is None or step <= steps):  # else: a later segment did not finish
            return FolderState(status, step, ckpt, f"the run ended: {status}")
    if (out / LOCK_FILE).exists() or (out / "config.json").is_file():
        return FolderState("failed", step, ckpt,
                           died_message(out, "ended from outside (killed, e.g. kill -9 or the "
                                             "out-of-memory killer)"))
    return FolderState("empty", None, None, "no run here")


STORAGE_ERRNOS = {errno.ENOSPC: "no space left on the disk", errno.EDQUOT: "the disk quota is used up",
                  errno.EROFS: "the folder is on a read-only file system",
                  errno.EACCES: "no permission to write there", errno.EPERM: "no permission to write there",
                  errno.EIO: "the disk reported an input/output error"}


def storage_error_message(err: OSError, out: Path) -> str | None:
    """A user message for a failed write of the run in ``out`` (full disk, quota, read-only
    folder, no permission), naming the file and what is kept; None for other errors."""
    reason = STORAGE_ERRNOS.get(err.errno)
    if reason is None:
        return None
    where = err.filename or out
    if latest_checkpoint(Path(out)) is None and not (Path(out) / "config.json").is_file():
        return f"{out}: could not write {where}: {reason}; nothing was written"
    return (f"{out}: could not write {where}: {reason}. Nothing written before was lost: "
            f"{resume_hint(out)} once the folder is writable and has free space")


def failure_message(err: BaseException, out: Path) -> str:
    """How a failed run is described to the user (storage errors in words, others by type)."""
    if isinstance(err, OSError):
        text = storage_error_message(err, out)
        if text:
            return text
    return f"{type(err).__name__}: {err}"
