"""Quick measured comparison: the rows a newcomer needs to see the difference, in minutes.

The full comparison measures two questions on two kinds of data with every optimization alone
(about 18 runs a length). The quick one measures the memory question (same work) on the
preset's real documents for traditional, strong baseline and optimized only: 3 runs a length
(images: a resolution) of a few steps each. Rows are ordinary compare.json rows.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lora_gui.config import RunConfig
from lora_gui.engine.compare.spec import CompareSettings
from lora_gui.engine.compare.text_rows import run_comparison

QUICK_STEPS = 3  # optimizer steps a row: the first step's peak is already the run's peak shape
QUICK_EVAL_SAMPLES = 2


def quick_settings(seq_lens: list[int], steps: int = QUICK_STEPS) -> CompareSettings:
    """Memory question, corpus data, no one-switch-alone rows, a few steps, 2 eval samples."""
    return CompareSettings(seq_lens=list(seq_lens), steps=steps, questions=["memory"],
                           data_kinds=["corpus"], ablations=False,
                           eval_samples=QUICK_EVAL_SAMPLES).validate()


def expected_rows(base: RunConfig, sizes: list[int]) -> int:
    """How many rows a quick comparison fills (the progress bar's total)."""
    return 3 * len(sizes)


def run_quick(base: RunConfig, sizes: list[int], out: Path, *, steps: int = QUICK_STEPS,
              stop: threading.Event | None = None, overwrite: bool = False,
              on_row: Callable[[dict[str, Any]], None] | None = None,
              progress: bool = False) -> dict[str, Any]:
    """Measures traditional / strong baseline / optimized per length (text) or resolution (image)
    into ``out/compare.json``; resumes the rows already there unless ``overwrite``. ``on_row``
    is called with each text row (image rows: read compare.json, written after every row)."""
    if base.task == "image":
        from lora_gui.engine.compare.image_rows import run_image_comparison

        return run_image_comparison(base, list(sizes), steps, out, overwrite=overwrite, stop=stop,
                                    progress=progress, ablations=False, questions=("memory",))
    return run_comparison(base, quick_settings(sizes, steps), out, overwrite=overwrite, stop=stop,
                          on_row=on_row, progress=progress)
