"""The run queue: ``RUNS/queue.json``, the runs waiting for the card, in order.

Each entry is a run's full settings (what its config.json will hold), a run name (its folder
under the runs folder, reserved when queued), an id and a state: queued -> started -> done |
failed | cancelled. The file is rewritten atomically (a temporary file, fsync, rename) under an
exclusive ``flock`` on ``RUNS/.queue/queue.lock``, so a dashboard and the CLI may change it at
once and a crash leaves the old or the new queue, never half of one. It survives restarts.

An entry is started at most once: the runner claims it by creating ``RUNS/.queue/claims/ID``
with ``O_CREAT | O_EXCL`` (atomic on one file system) before it launches anything; a claim that
exists already means the entry was started before, and it is never started again. One process
runs the queue at a time: it holds ``RUNS/.queue/runner.lock`` (see :class:`RunnerLock`).

A queue file edited by hand into something unreadable is moved aside (``queue.json.bad``,
numbered when one exists) with one line naming the file and what is wrong; nothing is dropped
silently.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from lora_gui.errors import UserError, clip

try:
    import fcntl
except ImportError:  # Windows: one dashboard per runs folder is assumed
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger(__name__)
QUEUE_FILE = "queue.json"
QUEUE_DIR = ".queue"  # locks and claims, beside the run folders
MARKER = "queued.json"  # in a reserved run folder until its run starts
STATES = ("queued", "started", "done", "failed", "cancelled")
ENDED = ("done", "failed", "cancelled")
VERSION = 1


class QueueError(UserError, ValueError):
    """A queue operation cannot be done as asked (the message names the entry or value)."""


class QueueFileError(QueueError):
    """The queue file is not a queue; it was moved aside (the message says where)."""


@dataclass
class Entry:
    """One queued run."""

    id: str
    name: str  # the run folder's name under the runs folder
    config: dict[str, Any]  # every RunConfig setting, as config.json holds them
    state: str = "queued"
    processes: int = 1
    fsdp: bool = False  # several processes: the frozen weights sharded (FSDP), as Start launches them
    offload: bool = False  # FSDP's shards in host memory
    out: str | None = None  # the run folder, once started
    message: str = ""  # why it failed, how it ended
    sweep: str | None = None  # the sweep it belongs to (runs queued together, one value each)
    added: float = field(default_factory=time.time)  # unix seconds
    started: float | None = None
    ended: float | None = None
    pid: int | None = None  # the run's process, once launched

    def label(self) -> str:
        return f"{self.name} ({self.id})"


def new_id() -> str:
    return uuid.uuid4().hex[:8]


def queue_path(runs_root: Path) -> Path:
    return Path(runs_root) / QUEUE_FILE


def _entry(raw: Any, where: str, index: int) -> Entry:
    """One entry read back, or a QueueFileError naming the entry and field."""
    at = f"entries[{index}]"
    if not isinstance(raw, dict):
        raise QueueFileError(f"{where}: {at} is not an object")
    known = {f for f in Entry.__dataclass_fields__}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise QueueFileError(f"{where}: {at} has unknown field(s) {', '.join(unknown)}")
    for key, kind in (("id", str), ("name", str), ("config", dict)):
        if not isinstance(raw.get(key), kind):
            raise QueueFileError(f"{where}: {at}.{key}: expected {kind.__name__}, got {raw.get(key)!r}")
    if raw.get("state", "queued") not in STATES:
        raise QueueFileError(f"{where}: {at}.state: {raw.get('state')!r} is not one of {', '.join(STATES)}")
    processes = raw.get("processes", 1)
    if isinstance(processes, bool) or not isinstance(processes, int) or processes < 1:
        raise QueueFileError(f"{where}: {at}.processes: expected a whole number >= 1, got {processes!r}")
    for key in ("fsdp", "offload"):
        if not isinstance(raw.get(key, False), bool):
            raise QueueFileError(f"{where}: {at}.{key}: expected true or false, got {raw.get(key)!r}")
    return Entry(**raw)


def parse_queue(text: str, where: str) -> list[Entry]:
    """The entries of a queue file's text; QueueFileError naming what is wrong."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise QueueFileError(f"{where}: not valid JSON ({err})") from None
    if not isinstance(data, dict) or not isinstance(data.get("entries"), list):
        raise QueueFileError(f"{where}: expected an object with an \"entries\" list")
    entries = [_entry(raw, where, i) for i, raw in enumerate(data["entries"])]
    seen: set[str] = set()
    for entry in entries:
        if entry.id in seen:
            raise QueueFileError(f"{where}: id {entry.id!r} appears twice")
        seen.add(entry.id)
    return entries


def _aside(path: Path) -> Path:
    """A free name beside ``path`` for a bad copy: queue.json.bad, .bad.2, ..."""
    target, n = path.with_name(path.name + ".bad"), 1
    while target.exists():
        n += 1
        target = path.with_name(f"{path.name}.bad.{n}")
    return target


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with tmp.open("w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


class Queue:
    """The queue file of one runs folder. Read it with :meth:`entries`; change it inside
    ``with queue.edit() as entries:`` (locked, written back atomically when the block ends)."""

    def __init__(self, runs_root: Path) -> None:
        self.root = Path(runs_root)
        self.path = queue_path(self.root)
        self.dir = self.root / QUEUE_DIR

    def _read(self) -> list[Entry]:
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return []
        except UnicodeDecodeError as err:
            return self._bad(f"{self.path}: not text ({err})")
        try:
            return parse_queue(text, str(self.path))
        except QueueFileError as err:
            return self._bad(str(err))

    def _bad(self, what: str) -> list[Entry]:
        target = _aside(self.path)
        os.replace(self.path, target)
        log.warning("%s", what)
        raise QueueFileError(f"{what}; moved aside to {target} (nothing was started from it); the "
                             f"queue starts empty: fix that file and move it back to restore it")

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.dir / "queue.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            if fcntl is not None:
                fcntl.flock(fd, fcntl.LOCK_EX)  # held for a read-modify-write: milliseconds
            yield
        finally:
            os.close(fd)  # drops the flock

    def entries(self) -> list[Entry]:
        """The queue as it is now (QueueFileError once when the file is not a queue)."""
        if not self.path.is_file():
            return []
        with self._locked():
            return self._read()

    @contextlib.contextmanager
    def edit(self) -> Iterator[list[Entry]]:
        """The entries, locked; the list as left by the block is written back atomically (only
        when it changed: a runner looks every second)."""
        with self._locked():
            entries = self._read()
            before = [asdict(e) for e in entries]
            yield entries
            after = [asdict(e) for e in entries]
            if after != before or not self.path.is_file():
                body = {"version": VERSION, "entries": after}
                _write_atomic(self.path, json.dumps(body, indent=1) + "\n")

    def find(self, entries: list[Entry], key: str) -> Entry:
        """The entry with this id, or else the newest with this run name."""
        for entry in entries:
            if entry.id == key:
                return entry
        named = [e for e in entries if e.name == key]
        if not named:
            raise QueueError(f"{self.path}: no entry {clip(key)} (give an id or a run name from "
                             "`queue list`)")
        return named[-1]

    def claim(self, entry: Entry) -> bool:
        """Claims ``entry`` for one start, atomically across processes: False when it was
        claimed before (it must never start again)."""
        claims = self.dir / "claims"
        claims.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(claims / entry.id, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w") as fh:
            json.dump({"pid": os.getpid(), "host": socket.gethostname(), "time": time.time()}, fh)
        return True


class RunnerLock:
    """Held by the one process that starts the queue's runs (a dashboard or ``queue run``) for
    as long as it runs the queue; the kernel drops it when that process ends, however it ends."""

    def __init__(self, runs_root: Path) -> None:
        self.path = Path(runs_root) / QUEUE_DIR / "runner.lock"
        self.fd: int | None = None

    def acquire(self) -> bool:
        """True when this process now runs the queue (or already did)."""
        if self.fd is not None:
            return True
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        if fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                return False
        info = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time()}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(info) + "\n").encode(), 0)
        self.fd = fd
        return True

    def holder(self) -> str:
        """Who holds it, in words (for the line a second dashboard shows)."""
        try:
            info = json.loads(self.path.read_text(encoding="utf-8"))
            when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(info["started"]))
            return f"pid {info['pid']} on {info['host']}, since {when}"
        except (OSError, ValueError, KeyError, TypeError):
            return "another process"

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
