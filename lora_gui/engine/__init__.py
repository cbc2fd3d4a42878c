"""The training engine: one core (engine/core) under one loop per task (engine/text,
engine/image), comparisons (engine/compare), several processes (engine/core/distributed.py),
the dashboard's runs as processes of their own and the queue (engine/jobs), and a finished run's
export (engine/export). :func:`train` is the one entry point."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lora_gui.config import RunConfig
    from lora_gui.engine.core.control import TrainControl


def train(cfg: RunConfig, out: str | Path, *, resume: bool = False, overwrite: bool = False,
          control: TrainControl | None = None, progress: bool = True) -> dict[str, Any]:
    """Trains the run's task (``cfg.task``: text or image) into ``out``; returns run.json's summary.

    Args:
        cfg: validated settings (for a resume, the run's saved config).
        out: the run folder.
        resume: continue from the newest checkpoint in ``out``.
        overwrite: replace a run that ``out`` already holds.
        control: stop request and listeners (the dashboard's job and compare rows use it).
        progress: show a progress bar.
    """
    if cfg.task in ("image", "video"):  # a video run is the image run on clips
        from lora_gui.engine.image.train import train_image as train_task
    else:
        from lora_gui.engine.text.train import train_text as train_task
    return train_task(cfg, out, resume=resume, overwrite=overwrite, control=control, progress=progress)


def check_inputs(cfg: RunConfig) -> None:
    """Reads the run's data (and for text its model's limits) as the run would, raising the
    user error that names a bad file or value; nothing is written."""
    if cfg.task in ("image", "video"):
        from lora_gui.engine.image.clips import load_run_data as check
    else:
        from lora_gui.engine.text.inputs import check_text_inputs as check
    check(cfg)
