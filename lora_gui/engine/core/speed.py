"""A run's speed against the machine: each step's useful FLOPs and model FLOPs utilisation (MFU)
in its record, and the run's totals in run.json (:mod:`lora_gui.models.flops` counts and measures)."""

from __future__ import annotations

from typing import Any

import torch

from lora_gui.models.flops import MachinePeak, compute_dtype, machine_peak, mfu


def run_peak(device: torch.device, mixed_precision: str, model: torch.nn.Module,
             headroom_bytes: int | None = None) -> MachinePeak | None:
    """The device's measured matmul peak in the dtype the run's matmuls use (once per process).
    ``headroom_bytes``: what the run's plan leaves above what is resident now (its predicted step
    peak minus the live bytes); the probe's matmuls stay inside it, so measuring the machine never
    raises the run's peak above its plan."""
    return machine_peak(device, compute_dtype(mixed_precision, model), headroom_bytes)


def headroom(predicted: int | None, meter: Any) -> int | None:
    """Bytes the run's plan leaves above what the meter sees live now (None without a plan)."""
    return None if not predicted else max(0, int(predicted) - meter.live_bytes())


def step_speed(flops: int | None, seconds: float, peak: MachinePeak | None, processes: int) -> dict[str, Any]:
    """A step record's ``flops`` (useful work of the whole step, every process) and ``mfu``."""
    if flops is None:
        return {}
    return {"flops": flops, "mfu": mfu(flops, seconds, peak.flops_per_s if peak else None, processes)}


def run_speed(records: list[dict[str, Any]], peak: MachinePeak | None, processes: int) -> dict[str, Any]:
    """run.json's speed against the machine: useful FLOPs over the timed steps, FLOP/s, ``mfu``
    (None when a step has no count) and the peak it is measured against, with its source."""
    counted = [r for r in records if r.get("flops") is not None]
    if not counted or len(counted) < len(records) or peak is None:
        return {"mfu": None}
    flops = sum(r["flops"] for r in counted)
    seconds = sum(r["seconds"] for r in counted)
    return {"useful_flops": flops, "flops_per_s": flops / seconds if seconds else None,
            "mfu": mfu(flops, seconds, peak.flops_per_s, processes), "mfu_processes": processes,
            **peak.as_dict()}
