"""The run summary (run.json) from step records: tokens, speed, peak memory per rank, report.
Shared by the training loops."""

from __future__ import annotations

from typing import Any

from lora_gui.config import RunConfig


def measured_records(records: list[dict]) -> list[dict]:
    """The step records with a measured peak (a CPU run skips the tracker on later steps of an
    already measured step shape: those carry ``peak_bytes`` None)."""
    return [r for r in records if r.get("peak_bytes") is not None]


def peaks_by_rank(records: list[dict]) -> list[int]:
    """Each rank's largest step peak over the records (a resumed run may change the rank count)."""
    by_rank: list[int] = []
    for r in measured_records(records):
        for k, peak in enumerate(r.get("peak_bytes_by_rank") or [r["peak_bytes"]]):
            by_rank[k:k + 1] = [max(by_rank[k], peak)] if k < len(by_rank) else [peak]
    return by_rank


def run_summary(cfg: RunConfig, records: list[dict], extra: dict) -> dict[str, Any]:
    """run.json: totals over the step records, ``extra`` (status, eval, memory...), the config.
    ``peak_bytes_by_rank``: each rank's largest step peak (a resumed run may change the count)."""
    real = sum(r["real_tokens"] for r in records)
    padded = sum(r["padded_tokens"] for r in records)
    seconds = sum(r["seconds"] for r in records)
    peaks = [r["peak_bytes"] for r in measured_records(records)]
    by_rank = peaks_by_rank(records)
    return {
        "final_loss": records[-1]["loss"] if records else None,
        "real_tokens": real,
        "padded_tokens": padded,
        "padding_efficiency": real / padded if padded else None,
        "real_tokens_per_s": real / seconds if seconds else None,
        "train_seconds": seconds,
        "peak_bytes": max(peaks) if peaks else None,
        "peak_bytes_by_rank": by_rank,
        "mean_step_peak_bytes": sum(peaks) / len(peaks) if peaks else None,
        "steps": len(records),
        **extra,
        "config": cfg.to_dict(),
    }


def memory_report(summary: dict[str, Any]) -> dict[str, Any]:
    """Peak, mean, budget use and predicted vs measured peak, each figure with its source."""
    peak, budget, predicted = summary["peak_bytes"], summary["budget_bytes"], summary["predicted_peak_bytes"]
    return {
        "peak_bytes": peak, "mean_step_peak_bytes": summary["mean_step_peak_bytes"],
        "source": summary["memory_source"], "measured_steps": summary.get("measured_steps"),
        "budget_bytes": budget,
        "budget_utilization": peak / budget if peak and budget else None,
        "predicted_peak_bytes": predicted, "predicted_source": "predicted",
        "predicted_vs_measured": predicted / peak - 1 if peak and predicted else None,
        "predicted_device": (summary.get("prediction") or {}).get("device"),
        "predicted_kernel": (summary.get("prediction") or {}).get("kernel"),
        "oom_events_recovered": sum(1 for e in summary["oom_events"] if "new_cap" in e),
    }
