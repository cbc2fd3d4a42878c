"""``plan --longest`` for an image run: the largest resolution at batch 1 and the largest batch
at the chosen resolution under the budget (the image planner's estimates; source: predicted).

An image run has no sequence length: its memory grows with the pixels and the batch, so the
question "how long can my samples be" becomes "how large, and how many at once".
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from lora_gui.config import IMAGE_GRID, ConfigError, RunConfig
from lora_gui.memory.predict import planner

RESOLUTIONS = tuple(range(512, 1537, IMAGE_GRID))  # px: the resolution setting's range
MAX_BATCH = 64


def longest_image(cfg: RunConfig, budget_bytes: int, device: str = "cuda") -> dict[str, Any]:
    """Largest resolution (batch 1) and largest batch at ``cfg.resolution`` that fit.

    Returns:
        ``{"task": "image", "largest_resolution", "peak_bytes_at_largest", "batch_at_resolution",
        "resolution", "budget_bytes", "device", "source"}``; resolution None / batch 0: nothing fits.

    Raises:
        ConfigError: nothing fits even at 512 px and batch 1 (with the figure).
    """
    from lora_gui.memory.predict.image_run_plan import estimated_image_step

    budget = planner.check_budget(budget_bytes)
    fixed = replace(cfg, image_batch="fixed")  # the batch asked for, not a batch table's

    def peak(resolution: int, batch: int) -> int:
        step = estimated_image_step(replace(fixed, resolution=resolution, batch_size=batch), device)
        return step.peak_bytes

    k = planner._largest(lambda i: peak(RESOLUTIONS[i - 1], 1), budget, len(RESOLUTIONS))
    if not k:
        need = peak(RESOLUTIONS[0], 1)
        raise ConfigError(f"nothing fits: {RESOLUTIONS[0]} px at batch 1 needs {need / 1e9:.2f} GB; "
                          f"the budget is {budget / 1e9:.2f} GB (try gradient_checkpointing=true)")
    batch = planner._largest(lambda b: peak(cfg.resolution, b), budget, MAX_BATCH)
    largest = RESOLUTIONS[k - 1]
    return {"task": "image", "largest_resolution": largest, "peak_bytes_at_largest": peak(largest, 1),
            "resolution": cfg.resolution, "batch_at_resolution": batch, "budget_bytes": budget,
            "device": device, "source": "predicted (estimate)",
            "note": "image runs have no sequence length: the largest resolution at batch 1 and the "
                    "largest batch at the chosen resolution instead"}
