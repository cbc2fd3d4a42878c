"""Bad input never costs a run: what a new run reads is checked before an older run is replaced.

``--overwrite`` (and the dashboard's Start, which replaces a run of the same name) deletes the
run a folder holds. The data and model of the new run are read first, so a bad data file, an
empty image folder or a missing model is refused while the old run, its checkpoints and its
adapter are still there. The cost: an overwriting run reads its data twice (text: the file;
images: every image is probed once more), and only when the folder holds a run.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from lora_gui.config import RunConfig
from lora_gui.engine.core.lock import held_here, release_run_folder

F = TypeVar("F", bound=Callable[..., Any])
RUN_MARKERS = ("config.json", "checkpoints", "adapter", "run.json", "metrics.jsonl")


def holds_run(out: Path) -> bool:
    """Whether ``out`` holds files of an earlier run."""
    return any((Path(out) / name).exists() for name in RUN_MARKERS)


InputCheck = Callable[[RunConfig], Any]  # reads a run's inputs; raises a user error naming them


def check_before_replacing(cfg: RunConfig, out: Path, check_inputs: InputCheck, *, resume: bool,
                           overwrite: bool) -> None:
    """Runs the task's ``check_inputs`` when this run would replace a run in ``out``."""
    if overwrite and not resume and holds_run(out):
        check_inputs(cfg)


def writes_run_folder(check_inputs: InputCheck) -> Callable[[F], F]:
    """Decorator of a task's ``train_*(cfg, out, *, resume, overwrite, ...)``: runs the task's
    ``check_inputs`` before a run is replaced, and releases the folder's writer lock (taken in
    ``prepare_run_dir``, before anything is written) when the run returns or raises."""
    return functools.partial(_wrap, check_inputs=check_inputs)  # type: ignore[return-value]


def _wrap(fn: F, check_inputs: InputCheck) -> F:
    signature = inspect.signature(fn)

    @functools.wraps(fn)
    def inner(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        cfg, out = bound.arguments["cfg"], Path(bound.arguments["out"])
        check_before_replacing(cfg, out, check_inputs, resume=bound.arguments["resume"],
                               overwrite=bound.arguments["overwrite"])
        held_before = held_here(out)  # a refused second run must not free the holder's lock
        try:
            return fn(*args, **kwargs)
        finally:
            if not held_before:
                release_run_folder(out)

    return inner  # type: ignore[return-value]
