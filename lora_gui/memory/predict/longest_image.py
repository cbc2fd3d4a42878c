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


def candidate_resolutions(cfg: RunConfig) -> tuple[int, ...]:
    """The resolutions to try: 512-1536 px, up to the largest side the model covers (an SD3
    transformer's position embedding; the built-in drawing model stops at 64 px)."""
    from lora_gui.memory.predict.dit_plan import pipeline_largest_side

    top = pipeline_largest_side(cfg)
    if top is None or top >= RESOLUTIONS[-1]:
        return RESOLUTIONS
    low = RESOLUTIONS[0] if top >= RESOLUTIONS[0] else IMAGE_GRID  # small models: every 64 px up
    covered = tuple(range(low, top + 1, IMAGE_GRID))
    if not covered:
        raise ConfigError(f"model: its transformer covers at most {top} px, below the smallest "
                          f"resolution setting ({IMAGE_GRID} px)")
    return covered


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

    sizes = candidate_resolutions(cfg)
    k = planner._largest(lambda i: peak(sizes[i - 1], 1), budget, len(sizes))
    if not k:
        need = peak(sizes[0], 1)
        raise ConfigError(f"nothing fits: {sizes[0]} px at batch 1 needs {need / 1e9:.2f} GB; "
                          f"the budget is {budget / 1e9:.2f} GB (try gradient_checkpointing=true)")
    batch = planner._largest(lambda b: peak(cfg.resolution, b), budget, MAX_BATCH)
    largest = sizes[k - 1]
    return {"task": "image", "largest_resolution": largest, "peak_bytes_at_largest": peak(largest, 1),
            "resolution": cfg.resolution, "batch_at_resolution": batch, "budget_bytes": budget,
            "device": device, "source": "predicted (estimate)",
            "note": "image runs have no sequence length: the largest resolution at batch 1 and the "
                    "largest batch at the chosen resolution instead"
                    + (f"; this model's transformer covers at most {sizes[-1]} px" if sizes != RESOLUTIONS
                       else "")}
