"""One run on the card per runs folder, across dashboards and the queue.

Every run a dashboard starts (its Start button, its queue) goes through
:meth:`lora_gui.engine.jobs.manager.JobManager.start`, which calls :func:`claim_card` first. Under an
exclusive ``flock`` on ``RUNS/.queue/start.lock`` (held only for the check and the note, so two
dashboards never both see a free card) it refuses when a run under the runs folder trains (its
folder's lock is live, whoever started it: another dashboard, the queue, the CLI) or another
start is under way: ``RUNS/.queue/starting/NAME.json`` notes a run launched whose process may
not have taken its folder's lock yet (a launch takes seconds). A note counts while its run's
process lives, or, before that process is known, while the dashboard that wrote it lives and
for at most :data:`LAUNCH_GRACE_S`; the job removes it when the run ends. Without ``fcntl``
(Windows) the check still runs, without the lock around it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from lora_gui.engine.core.lock import lock_is_live, read_lock
from lora_gui.errors import UserError

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger(__name__)
GUARD_DIR = ".queue"  # beside the run folders, with the queue's own locks
LAUNCH_GRACE_S = 120.0  # seconds a launch may take before its process id is noted
_held = threading.local()  # runs folders whose start lock this thread holds (re-entrant)


class CardBusyError(UserError, RuntimeError):
    """Another run trains (or is starting) on the card; the message names it."""


def _dir(runs_root: Path) -> Path:
    return Path(runs_root) / GUARD_DIR


@contextlib.contextmanager
def start_lock(runs_root: Path) -> Iterator[None]:
    """Holds ``RUNS/.queue/start.lock`` (re-entrant within one thread)."""
    key = str(Path(runs_root).resolve())
    held: set[str] = getattr(_held, "roots", set())
    _held.roots = held
    if key in held or fcntl is None:
        yield
        return
    _dir(runs_root).mkdir(parents=True, exist_ok=True)
    fd = os.open(_dir(runs_root) / "start.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # another start holds it for milliseconds
        held.add(key)
        yield
    finally:
        held.discard(key)
        os.close(fd)


def _alive(pid: object) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _note_path(runs_root: Path, out: Path) -> Path:
    return _dir(runs_root) / "starting" / f"{Path(out).name}.json"


def _note_counts(note: dict) -> bool:
    if _alive(note.get("pid")):
        return True
    if note.get("pid"):
        return False  # its process has ended
    fresh = time.time() - float(note.get("time", 0)) < LAUNCH_GRACE_S
    return fresh and _alive(note.get("dashboard_pid"))


def busy_with(runs_root: Path, out: Path | None = None) -> str | None:
    """The run that holds the card, in words, or None when it is free. ``out`` (the folder
    about to start) is left out: its own lock refuses a second writer by itself."""
    root = Path(runs_root)
    if not root.is_dir():
        return None
    skip = Path(out).resolve() if out is not None else None
    for folder in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        if folder.resolve() != skip and lock_is_live(folder):
            info = read_lock(folder)
            return f"{folder.name} ({info.describe() if info else 'a live process'})"
    notes = _dir(root) / "starting"
    for path in sorted(notes.glob("*.json")) if notes.is_dir() else []:
        try:
            note = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if skip is not None and path.stem == skip.name:
            continue
        if isinstance(note, dict) and _note_counts(note):
            return f"{path.stem} (starting, launched by pid {note.get('dashboard_pid')})"
        path.unlink(missing_ok=True)  # its run ended or never began: the note is stale
    return None


def claim_card(runs_root: Path, out: Path) -> None:
    """Refuses (:class:`CardBusyError`) when another run holds the card, else notes that a run
    starts in ``out``; call under :func:`start_lock`."""
    holder = busy_with(runs_root, out)
    if holder is not None:
        raise CardBusyError(f"a run is training on this card: {holder}; stop it first, or add this "
                            "one to the queue to start it when the card is free")
    path = _note_path(runs_root, out)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"dashboard_pid": os.getpid(), "pid": None, "time": time.time(),
                               "out": str(out)}), encoding="utf-8")
    os.replace(tmp, path)


def note_pid(runs_root: Path, out: Path, pid: int) -> None:
    """Records the started run's process id in its note (the note then lives as long as it)."""
    path = _note_path(runs_root, out)
    try:
        note = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    note["pid"] = pid
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(note), encoding="utf-8")
    os.replace(tmp, path)


def release_card(runs_root: Path, out: Path) -> None:
    """Removes the run's note (its job ended)."""
    _note_path(runs_root, out).unlink(missing_ok=True)
