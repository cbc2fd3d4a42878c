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

from lora_gui.config import ConfigError, RunConfig
from lora_gui.engine.core.lock import held_here, release_run_folder

F = TypeVar("F", bound=Callable[..., Any])
RUN_MARKERS = ("config.json", "checkpoints", "adapter", "run.json", "metrics.jsonl")


def holds_run(out: Path) -> bool:
    """Whether ``out`` holds files of an earlier run."""
    return any((Path(out) / name).exists() for name in RUN_MARKERS)


def check_inputs(cfg: RunConfig) -> None:
    """Reads the run's data (and, for text, resolves the model and its length limit).

    Raises:
        DataError, ImageDataError, ModelError, ConfigError: naming the file, folder or value.
    """
    if cfg.task == "image":  # the folder, its captions and the buckets, as the run reads them
        from lora_gui.engine.image.train import load_image_data

        load_image_data(cfg)
        return
    from lora_gui.data.text import load_documents
    from lora_gui.models import text as text_models

    load_documents(cfg.data_path())
    source = text_models.resolve_model_source(cfg.model)
    limit = text_models.max_positions(source)
    if limit is not None and cfg.max_seq_len > limit:
        raise ConfigError(f"max_seq_len: {cfg.max_seq_len} is above the model's limit of {limit}")


def check_before_replacing(cfg: RunConfig, out: Path, *, resume: bool, overwrite: bool) -> None:
    """Checks the inputs when this run would replace a run in ``out``; nothing otherwise."""
    if overwrite and not resume and holds_run(out):
        check_inputs(cfg)


def writes_run_folder(fn: F) -> F:
    """Decorator of ``train_*(cfg, out, *, resume, overwrite, ...)``: checks the inputs before a
    run is replaced, and releases the folder's writer lock (taken in ``prepare_run_dir``, before
    anything is written) when the run returns or raises."""
    signature = inspect.signature(fn)

    @functools.wraps(fn)
    def inner(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        cfg, out = bound.arguments["cfg"], Path(bound.arguments["out"])
        check_before_replacing(cfg, out, resume=bound.arguments["resume"],
                               overwrite=bound.arguments["overwrite"])
        held_before = held_here(out)  # a refused second run must not free the holder's lock
        try:
            return fn(*args, **kwargs)
        finally:
            if not held_before:
                release_run_folder(out)

    return inner  # type: ignore[return-value]
