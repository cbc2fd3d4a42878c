"""Trace-calibrated estimates of image steps (UNet and DiT), shared by
:func:`lora_gui.memory.predict.estimate.estimate_unet_step` and
:func:`lora_gui.memory.predict.dit_trace.estimate_dit_step`.

With SDPA (no S x S term) every activation of a UNet or DiT step is linear in the pixel count
and the batch, so two fake traces at batch 1 give the whole surface: fixed bytes (frozen
weights, LoRA, AdamW state) + batch x (a + b x pixels).
"""

from __future__ import annotations

from collections.abc import Callable

from lora_gui.memory.predict.trace import CATEGORIES, CUBLAS_WORKSPACE_BYTES, CUDA_CONTEXT_BYTES, TraceResult

FIXED = ("frozen_weights", "lora_params", "optimizer_state")  # do not grow with the batch
PER_IMAGE = ("activations", "temporaries", "gradients")


def fit_pixel_line(trace_at: Callable[[int], TraceResult], low_px: int,
                   high_px: int) -> tuple[dict[str, int], float, float]:
    """Traces batch 1 at ``low_px`` and ``high_px`` (square) and fits the per-image bytes.

    Args:
        trace_at: resolution (px) -> the fake-tensor trace of one step at batch 1.

    Returns:
        (fixed bytes by category, a = per-image bytes at 0 px, b = bytes per pixel per image).
    """
    lo, hi = trace_at(low_px), trace_at(high_px)
    fixed = {k: lo.breakdown[k] for k in FIXED}
    per = [sum(r.breakdown[k] for k in PER_IMAGE) for r in (lo, hi)]
    slope = (per[1] - per[0]) / (high_px * high_px - low_px * low_px)  # bytes per pixel per image
    return fixed, per[0] - slope * low_px * low_px, slope


def calibrated_step(fit: tuple[dict[str, int], float, float], *, batch_size: int,
                    resolution: int | tuple[int, int], device: str) -> TraceResult:
    """The estimate of a step at ``batch_size`` x ``resolution`` from :func:`fit_pixel_line`'s fit
    (CUDA context and cuBLAS workspace added for ``device="cuda"``;
    ``info["source"] = "predicted (trace-calibrated)"``)."""
    h, w = (resolution, resolution) if isinstance(resolution, int) else resolution
    fixed, a, b = fit
    breakdown = dict.fromkeys(CATEGORIES, 0)
    breakdown.update(fixed, activations=int(batch_size * (a + b * h * w)))
    traced = sum(breakdown.values())
    overheads = {"cuda_context": 0, "cublas_workspace": 0, "allocator_rounding": 0}
    if device == "cuda":
        from lora_gui.memory.predict.allocator import cache_allowance

        overheads.update(cuda_context=CUDA_CONTEXT_BYTES, cublas_workspace=CUBLAS_WORKSPACE_BYTES,
                         allocator_cache=cache_allowance(traced + CUBLAS_WORKSPACE_BYTES))
    info = {"source": "predicted (trace-calibrated)", "batch_size": batch_size, "resolution": (h, w)}
    return TraceResult(traced + sum(overheads.values()), traced, breakdown, overheads, device, 0.0, info)
