"""What this card holds outside the caching allocator, read before a run is planned.

A plan counts a fixed CUDA context (the driver's context, the kernels loaded so far and the
libraries' handles). The real figure depends on the card, the driver and the CUDA build: an
H200 with a CUDA 13 build held 1.3-1.5 GB outside the allocator during training, far above what a
consumer card holds. So a run on a card reads it (source: ``cuda_mem_get_info``: cudaMemGetInfo's
total - free - the allocator's reserve, which also counts other processes on the same card, memory
this run cannot use either) and plans against a budget lowered by what exceeds the plan's figure.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from lora_gui.units import gb

log = logging.getLogger(__name__)

SOURCE = "cuda_mem_get_info"


def outside_allocator_bytes(device: torch.device) -> int | None:
    """Bytes the card holds outside this process's caching allocator (None off CUDA)."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    torch.cuda.synchronize(device)
    free, total = torch.cuda.mem_get_info(device)
    return int(total - free - torch.cuda.memory_reserved(device))


def budget_for_plan(budget: int | None, device: torch.device, planned_context: int,
                    measured: int | None = None) -> tuple[int | None, dict[str, Any]]:
    """The budget a plan should use on this card, and what was read (for the run's summary).

    Args:
        budget: the run's memory budget in bytes (None: no budget).
        device: the run's device; off CUDA nothing is read and the budget is unchanged.
        planned_context: the context bytes the plan already counts inside the budget.
        measured: a reading to use instead of reading the card (tests).

    The plan counts ``planned_context`` inside the budget; when the card holds more, the excess
    comes off the budget, so "fits" means fits on this card. A card holding less keeps the budget
    (the plan errs high, never low).
    """
    if measured is None:
        measured = outside_allocator_bytes(device)
    if measured is None:
        return budget, {}
    excess = max(0, measured - planned_context)
    info = {"cuda_outside_allocator_bytes": measured, "cuda_context_planned_bytes": planned_context,
            "cuda_context_source": SOURCE}
    if budget is None or excess == 0:
        return budget, info
    log.info("this card holds %s outside the allocator, %s more than the plan counts: "
             "planning against %s", gb(measured), gb(excess), gb(budget - excess))
    return max(0, budget - excess), {**info, "budget_lowered_by_bytes": excess}
