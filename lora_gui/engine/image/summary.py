"""The run.json summary of an image run and its resolved memory switches."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from lora_gui.config import RunConfig
from lora_gui.engine.core.speed import run_speed
from lora_gui.engine.core.summary import measured_records, memory_report, peaks_by_rank
from lora_gui.memory.predict.image_speed import image_speed_report
from lora_gui.models.diffusion_files import KOHYA_FILE

if TYPE_CHECKING:  # the loop imports this module
    from lora_gui.engine.image.train import ImageSession


def image_summary(run: ImageSession, status: str, message: str | None, eval_loss_value: float | None,
                  adapter: Path) -> dict[str, Any]:
    """run.json of an image run (``run``: the loop's session): totals over the step records,
    memory (steps and the caching pass), the resolved switches, the config."""
    records = run.metrics.snapshot()
    images = sum(r["images"] for r in records)
    seconds = sum(r["seconds"] for r in records)
    peaks = [r["peak_bytes"] for r in measured_records(records)]  # steps the meter measured
    cache_peak = run.cache_peak_bytes or 0
    cfg = run.cfg
    summary = {
        "status": status, "message": message, "task": cfg.task,
        "final_loss": records[-1]["loss"] if records else None, "eval_loss": eval_loss_value,
        "base_eval_loss": run.state.base_eval_loss, "steps": len(records), "images": images,
        "images_per_s": images / seconds if seconds else None,
        "images_per_s_with_caching": images / (seconds + run.cache_seconds) if seconds else None,
        "train_seconds": seconds, "cache_seconds": run.cache_seconds,
        # the run's peak: training steps and the one-time caching pass (whichever is higher)
        "peak_bytes": max([*peaks, cache_peak]) if peaks else None,
        "train_peak_bytes": max(peaks) if peaks else None, "cache_peak_bytes": cache_peak,
        "mean_step_peak_bytes": sum(peaks) / len(peaks) if peaks else None,
        "host_peak_bytes": max((r.get("host_peak_bytes", 0) for r in records), default=0),  # tracker
        "memory_source": run.meter.source, **run.meter.coverage(), "budget_bytes": run.meter.budget_bytes,
        "predicted_peak_bytes": run.predicted, "prediction": run.prediction,
        "oom_events": [e for e in run.events.snapshot() if e.get("event") == "oom"],
        "adapter": str(adapter), "kohya_adapter": str(adapter / KOHYA_FILE) if cfg.export_kohya else None,
        "device": str(run.accelerator.device), "precision": run.accelerator.mixed_precision,
        "optimizer": run.optimizer_name, "train_images": len(run.data.train),
        "eval_images": len(run.data.held_out), "resolution": cfg.resolution,
        "buckets": {"x".join(map(str, b)): run.data.buckets.count(b) for b in sorted(set(run.data.buckets))},
        "micro_batch_caps": run.caps.caps, "switches": resolved_switches(cfg), "samples": [],
        "world_size": run.dist.world_size, "fsdp": False,
        "peak_bytes_by_rank": peaks_by_rank(records),
        **(speed := run_speed(records, run.peak, run.dist.world_size)),
        **image_speed_report(run.prediction, records, speed.get("mfu")),
        "config": cfg.to_dict(),
    }
    summary["memory_report"] = memory_report(summary)
    return summary


def resolved_switches(cfg: RunConfig) -> dict[str, Any]:
    """The image memory switches with 'auto' resolved by the mode (for compare rows)."""
    return {"cache_latents": cfg.resolved_cache_latents(), "aspect_buckets": cfg.resolved_aspect_buckets(),
            "attn_backend": cfg.resolved_attn_backend(), "image_batch": cfg.resolved_image_batch(),
            "gradient_checkpointing": cfg.gradient_checkpointing,
            "lean_backward": cfg.resolved_lean_backward()}
