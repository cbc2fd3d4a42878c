"""The CUDA caching allocator's settings a run uses: ``expandable_segments:True`` by default.

PyTorch reads ``PYTORCH_CUDA_ALLOC_CONF`` once, when its CUDA allocator first starts
(``c10/cuda/CUDAAllocatorConfig.cpp``), so the setting must be in the process environment before
the first CUDA tensor: the CLI sets it at start-up (before the engine imports torch) and the
dashboard's launcher puts it in the environment of the run's process. A value the user already
set is kept; the plan then models what it says (:func:`expandable_segments_planned`).

Why: with expandable segments each pool of the allocator is one segment that grows by whole
pages, so the memory a run reserves stays close to what it allocates (the replay of
:mod:`lora_gui.memory.predict.allocator` measures how close), where separate ``cudaMalloc``
segments leave unusable slivers (about 10% of the peak on the traced Llama steps).
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

ENV = "PYTORCH_CUDA_ALLOC_CONF"
EXPANDABLE = "expandable_segments:True"


def use_expandable_segments(environ: MutableMapping[str, str] | None = None) -> bool:
    """Puts ``expandable_segments:True`` in ``environ`` (default: this process's) unless the
    user set ``PYTORCH_CUDA_ALLOC_CONF``; returns whether expandable segments are then on."""
    env = os.environ if environ is None else environ
    env.setdefault(ENV, EXPANDABLE)
    return expandable_segments_planned(env)


def expandable_segments_planned(environ: MutableMapping[str, str] | None = None) -> bool:
    """Whether a run started from ``environ`` gets expandable segments: on when the variable is
    unset (the run sets it), else as the variable says (PyTorch's default there: off)."""
    env = os.environ if environ is None else environ
    value = env.get(ENV)
    if value is None:
        return True
    options = {}
    for item in value.replace(",", " ").split():
        key, _, val = item.partition(":")
        options[key.strip()] = val.strip()
    return options.get("expandable_segments", "False").lower() == "true"
