"""One writer per run folder: ``RUN/run.lock`` holds the writer's pid, host and start time.

The lock is an advisory ``flock`` on that file, so the kernel drops it the moment its process
ends, however it ends (kill -9, the out-of-memory killer, a second Ctrl-C): a lock file whose
``flock`` can be taken is stale, and its content says whose it was (taken over with a warning).
A live holder refuses every other writer, ``--overwrite`` and ``--resume`` included, in another
process or in another thread of this one (the dashboard). Only the main process of an
``accelerate launch`` takes it. Platforms without ``fcntl`` fall back to the recorded pid.
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from lora_gui.errors import UserError

try:
    import fcntl
except ImportError:  # Windows: the recorded pid decides
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger(__name__)
LOCK_FILE = "run.lock"
FLOCK_TRIES, FLOCK_RETRY_S = 5, 0.05  # about 0.2 s of retries before a holder counts as live
F = TypeVar("F", bound=Callable[..., Any])

_held: dict[Path, tuple[int, int]] = {}  # lock path -> (descriptor, thread id), held by this process
_held_guard = threading.Lock()


class RunDirError(UserError, ValueError):
    """The output folder cannot be used as asked; nothing in it was changed."""


class RunFolderLockedError(RunDirError):
    """Another live process (or job of this one) writes into the run folder."""


@dataclass(frozen=True)
class LockInfo:
    """What a lock file says about its writer."""

    pid: int
    host: str
    started: float
    command: str = ""

    def describe(self) -> str:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.started))
        command = f" ({self.command})" if self.command else ""
        return f"pid {self.pid} on {self.host}, started {when}{command}"


def read_lock(folder: Path) -> LockInfo | None:
    """The lock file's writer, or None when there is none (or it cannot be read)."""
    try:
        data = json.loads((Path(folder) / LOCK_FILE).read_text(encoding="utf-8"))
        return LockInfo(int(data["pid"]), str(data["host"]), float(data["started"]),
                        str(data.get("command", "")))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def lock_is_live(folder: Path) -> bool:
    """Whether a writer holds ``folder`` right now (this process's own jobs included)."""
    path = (Path(folder) / LOCK_FILE).resolve()
    with _held_guard:
        if path in _held:
            return True
    if not path.is_file():
        return False
    if fcntl is None:
        info = read_lock(folder)
        return info is not None and _pid_alive(info.pid)
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True  # someone holds it exclusively
    finally:
        os.close(fd)  # closing drops our shared lock too
    return False


def _refuse(folder: Path, info: LockInfo | None) -> RunFolderLockedError:
    who = info.describe() if info else "another process"
    return RunFolderLockedError(
        f"{folder}: another run is writing into this folder ({who}); wait for it to end or stop it, "
        f"or choose another folder. --overwrite and --resume are refused while it runs")


def _flock_soon(fd: int) -> bool:
    """An exclusive flock on ``fd``, retried briefly: a reader's :func:`lock_is_live` check holds
    a shared lock for a moment and must not read as a writer."""
    for attempt in range(FLOCK_TRIES):
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if attempt + 1 < FLOCK_TRIES:
                time.sleep(FLOCK_RETRY_S)
    return False


def _try_flock(path: Path) -> int | None:
    """An open descriptor of ``path`` holding an exclusive flock, or None when held elsewhere."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        if not _flock_soon(fd):
            os.close(fd)
            return None
        try:  # the holder may have removed the file between our open and flock: retry on the new one
            same = os.path.samestat(os.fstat(fd), os.stat(path))
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)


def _write_info(fd: int) -> None:
    info = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time(),
            "command": " ".join(sys.argv[:3])[:200]}
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(info) + "\n").encode(), 0)
    os.fsync(fd)


def acquire_run_folder(folder: Path) -> None:
    """Makes this process the folder's one writer; creates ``folder`` if needed.

    Raises:
        RunFolderLockedError: a live writer holds it (its pid, host and start time named).
        OSError: the folder cannot be created or written (read-only, full disk).
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = (folder / LOCK_FILE).resolve()
    with _held_guard:
        if path in _held:  # another job of this process (a dashboard thread) writes here
            raise _refuse(folder, read_lock(folder))
        previous = read_lock(folder)
        if fcntl is None:
            if previous and previous.pid != os.getpid() and _pid_alive(previous.pid):
                raise _refuse(folder, previous)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        else:
            fd = _try_flock(path)
            if fd is None:
                raise _refuse(folder, read_lock(folder))
        try:
            _write_info(fd)
        except OSError:
            os.close(fd)
            raise
        _held[path] = (fd, threading.get_ident())
    if previous is not None:
        log.warning("%s: taking over a stale lock of a writer that ended without releasing it (%s)",
                    folder, previous.describe())


def held_here(folder: Path) -> bool:
    """Whether this thread holds the lock on ``folder``."""
    entry = _held.get((Path(folder) / LOCK_FILE).resolve())
    return entry is not None and entry[1] == threading.get_ident()


def release_run_folder(folder: Path) -> None:
    """Removes the lock this thread holds on ``folder`` (nothing when it holds none: a lock of
    another job of this process stays)."""
    path = (Path(folder) / LOCK_FILE).resolve()
    with _held_guard:
        entry = _held.get(path)
        if entry is None or entry[1] != threading.get_ident():
            return
        del _held[path]
        try:
            path.unlink(missing_ok=True)  # still under our flock: nobody can take it in between
        except OSError as err:  # a read-only folder: the kernel still drops the flock below
            log.warning("%s: could not remove the lock file (%s)", path, err)
        finally:
            os.close(entry[0])


def _folder_arg(fn: Callable[..., Any], arg: str, args: tuple, kwargs: dict) -> Path | None:
    value = inspect.signature(fn).bind_partial(*args, **kwargs).arguments.get(arg)
    return None if value is None else Path(value)


def holds_run_folder(arg: str = "out") -> Callable[[F], F]:
    """Decorator: take the lock on the folder passed as ``arg`` before the function runs and
    release it after (one-process writers such as ``compare``)."""

    def wrap(fn: F) -> F:
        @functools.wraps(fn)
        def inner(*args: Any, **kwargs: Any) -> Any:
            folder = _folder_arg(fn, arg, args, kwargs)
            acquire_run_folder(folder)  # refused when held, by this thread too
            try:
                return fn(*args, **kwargs)
            finally:
                release_run_folder(folder)

        return inner  # type: ignore[return-value]

    return wrap
