"""The memory of an adapter initialisation that decomposes weights (``lora_init`` pissa / olora),
traced on fake tensors with peft's own code, as the run executes it before its first step.

PiSSA runs an SVD of every adapted weight, one layer at a time, in float32: while a layer is
decomposed the model's weights, the adapter tensors made so far, a float32 copy of the layer's
weight (none when it is float32 already), its factors U (out x k), S (k) and Vh (k x in) and the
residual ``W - scale B A`` (out x in, float32) are alive; the largest adapted weight sets the peak.
OLoRA does the same with a QR decomposition. The run measures the same pass with the tracker
(CPU) or the CUDA allocator, and its peak counts when it is above the training steps' (small
models at short lengths). LAPACK's own workspace on a CPU is not a tensor and is counted by
neither side.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import nn

DECOMPOSING_INITS = ("pissa", "olora")
INIT_PASSES = (*DECOMPOSING_INITS, "loftq", "eva", "corda")  # run before step 1, saved for a resume


def init_peak_bytes(config: Any, *, dtype: torch.dtype, target_modules: Any, spec: Any,
                    device: str = "cpu") -> int:
    """Predicted peak (bytes, source: predicted) of attaching ``spec`` with its decomposing
    initialisation to the causal LM of ``config`` held in ``dtype``: the model built on the meta
    device and peft's initialisation run on it under the tracker (the SVD / QR of meta tensors
    gives the factors' shapes).

    Raises:
        ValueError: ``spec`` has no decomposing initialisation.
    """
    from lora_gui.memory.predict.trace import CUDA_CONTEXT_BYTES
    from lora_gui.memory.predict.trace_build import build_text_model
    from lora_gui.memory.runtime.tracker import StorageTracker
    from lora_gui.models.adapters import attach_adapter

    if spec.init not in DECOMPOSING_INITS:
        raise ValueError(f"lora_init {spec.init!r} does not decompose weights")
    model = build_text_model(config, attn_implementation="sdpa", dtype=dtype, lora_rank=spec.rank,
                             lora_alpha=spec.alpha, target_modules=target_modules, lora=False)
    tracker = StorageTracker()  # on the meta device: shapes and dtypes, storages of their size
    tracker.track([*model.parameters(), *model.buffers()])
    with tracker, torch.device("meta"):  # peft's new layers on the meta device too
        attach_adapter(model, dataclasses.replace(spec, dropout=0.0), target_modules, task_type="CAUSAL_LM")
    return tracker.peak_bytes + (CUDA_CONTEXT_BYTES if device == "cuda" else 0)


def measured_init(model: nn.Module, attach: Any, device: torch.device) -> tuple[Any, int, str]:
    """Runs ``attach()`` (the run's own adapter attach) and measures its peak: the CUDA
    allocator's on a GPU, else the tracker's over the model's tensors and what the attach makes.
    Returns (attach's result, peak bytes, source)."""
    from lora_gui.memory.runtime.tracker import MEMORY_SOURCE, StorageTracker

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        result = attach()
        return result, int(torch.cuda.max_memory_allocated(device)), "cuda_allocator"
    tracker = StorageTracker()
    tracker.track([*model.parameters(), *model.buffers()])
    with tracker:
        result = attach()
    return result, tracker.peak_bytes, MEMORY_SOURCE
