"""Quick measured comparison: the rows a newcomer needs to see the difference, in minutes.

The full comparison measures two questions on two kinds of data with every optimization alone
(about 18 runs a length). The quick one measures the memory question (same work) on the
preset's real documents for traditional, strong baseline and optimized only: 3 runs a length
(images: a resolution) of two steps each. Rows are ordinary compare.json rows.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from lora_gui.config import RunConfig
from lora_gui.engine.compare.spec import CompareSettings
from lora_gui.engine.compare.text_rows import run_comparison

# Optimizer steps a row. Two is the fewest that measure the peak: bucketed batches come longest
# first, so step 1 holds the longest samples (traditional pads every step to the full length),
# and step 2 is the first with the optimizer's states allocated (speed is read from step 2 on).
# Every row's peak was the same as with 3 steps; the comparison's CPU time fell by about a
# quarter (docs/BENCHMARKS.md).
QUICK_STEPS = 2
QUICK_EVAL_SAMPLES = 2
log = logging.getLogger(__name__)


def quick_settings(seq_lens: list[int], steps: int = QUICK_STEPS) -> CompareSettings:
    """Memory question, corpus data, no one-switch-alone rows, a few steps, 2 eval samples."""
    return CompareSettings(seq_lens=list(seq_lens), steps=steps, questions=["memory"],
                           data_kinds=["corpus"], ablations=False,
                           eval_samples=QUICK_EVAL_SAMPLES).validate()


def expected_rows(base: RunConfig, sizes: list[int]) -> int:
    """How many rows a quick comparison fills (the progress bar's total)."""
    return 3 * len(sizes)


@contextmanager
def cpu_threads_for_load() -> Iterator[int]:
    """On CPU, torch's intra-op threads for the comparison: no more than the cores other
    processes leave idle (1-minute load average), at least one; restored afterwards.

    Why: an OpenMP thread on a core another process holds is descheduled, and its partner
    threads wait for it at every operator. On the shared 2-core machine (load average ~8) the
    quick comparison took 9 min 38 s and 216 s of CPU with 2 threads, 3 min 58 s and 96 s with
    1 (docs/BENCHMARKS.md). Memory figures do not depend on it (same tensors); on an idle
    machine nothing changes. Yields the thread count used.
    """
    import torch

    before = torch.get_num_threads()
    try:
        load = os.getloadavg()[0]
    except OSError:  # no load average on this platform: leave torch's choice
        load = 0.0
    idle = (os.cpu_count() or 1) - round(load)
    threads = before if torch.cuda.is_available() else max(1, min(before, idle))
    if threads != before:
        log.info("comparison on a busy CPU (load %.1f): %d torch thread(s) instead of %d",
                 load, threads, before)
        torch.set_num_threads(threads)
    try:
        yield threads
    finally:
        torch.set_num_threads(before)


def run_quick(base: RunConfig, sizes: list[int], out: Path, *, steps: int = QUICK_STEPS,
              stop: threading.Event | None = None, overwrite: bool = False,
              on_row: Callable[[dict[str, Any]], None] | None = None,
              progress: bool = False) -> dict[str, Any]:
    """Measures traditional / strong baseline / optimized per length (text) or resolution (image)
    into ``out/compare.json``; resumes the rows already there unless ``overwrite``. ``on_row``
    is called with each text row (image rows: read compare.json, written after every row)."""
    with cpu_threads_for_load():
        if base.task == "image":
            from lora_gui.engine.compare.image_rows import run_image_comparison

            return run_image_comparison(base, list(sizes), steps, out, overwrite=overwrite, stop=stop,
                                        progress=progress, ablations=False, questions=("memory",))
        return run_comparison(base, quick_settings(sizes, steps), out, overwrite=overwrite, stop=stop,
                              on_row=on_row, progress=progress)
