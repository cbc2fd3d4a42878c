"""One training step measured on the device for the GPU check (bench/gpu/check.py and its
sections): its peak allocated bytes, its max_memory_reserved, the median seconds of a few timed
steps and the speed columns (tokens or images per second, useful FLOPs, MFU); a model built on
fake tensors given random weights; and the run-wide --plan-only switch every section reads."""

from __future__ import annotations

import gc
import statistics
import time
from typing import Any

import torch

from lora_gui.memory.predict import trace as tr
from lora_gui.models import flops

RESERVED: list[int] = []  # max_memory_reserved of the last measured step (0 on a CPU)
SECONDS: list[float] = []  # median wall seconds of the last row's timed steps
TIMED_STEPS = 3  # steady-state steps timed after the measured one (speed rows)
PLAN_ONLY: list[bool] = [False]  # --plan-only: compute and keep the plans, measure nothing


def real_step_peak(model: torch.nn.Module, make_loss, device: str) -> int:
    """Peak allocated bytes of one steady-state step (a warm step creates the AdamW state);
    the step's max_memory_reserved is left in ``RESERVED[-1]``, the median seconds of
    :data:`TIMED_STEPS` further steps in ``SECONDS[-1]``."""
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    for measured in (False, True):
        if measured and device == "cuda":
            release()
            torch.cuda.reset_peak_memory_stats()
        make_loss().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    peak = torch.cuda.max_memory_allocated() if device == "cuda" else 0
    RESERVED.append(torch.cuda.max_memory_reserved() if device == "cuda" else 0)
    times = []
    for _ in range(TIMED_STEPS):
        t0 = time.perf_counter()
        make_loss().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    SECONDS.append(statistics.median(times))
    return peak


def release() -> None:
    """Frees what earlier rows left (models held in reference cycles until the collector runs,
    cached segments) so a row's peaks are its own step's."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def speed_columns(model: torch.nn.Module, make_loss, device: str, dtype: torch.dtype, unit: str, count: int,
           text_lengths: list[int] | None = None) -> dict[str, Any]:
    """The speed columns of a row: ``unit``/s (tokens or images per step over the median step),
    the step's useful FLOPs (text: counted from the modules; image: torch's counter on fake
    inputs) and MFU against this device's measured matmul peak in ``dtype``."""
    seconds = SECONDS[-1]
    if text_lengths is not None:
        step_flops = flops.text_flops(model).step(text_lengths)
    else:
        step_flops = flops.counted_step_flops(model, make_loss)
    peak = flops.machine_peak(device, dtype)
    return {"step_s": seconds, f"{unit}_per_s": count / seconds, "useful_flops": step_flops,
            "peak_flops_per_s": peak.flops_per_s, "peak_source": peak.source,
            "mfu": flops.mfu(step_flops, seconds, peak.flops_per_s)}


def reserved_columns(measured: int, predicted: tr.TraceResult) -> dict[str, Any]:
    """The reserved-memory columns of a row: measured (max_memory_reserved) vs planned (the
    caching-allocator replay), and what nvidia-smi would show (planned reserved + context)."""
    reserved = RESERVED[-1] if RESERVED else 0
    return {"measured_reserved_bytes": reserved, "predicted_reserved_bytes": predicted.reserved_peak_bytes,
            "predicted_nvidia_smi_bytes": predicted.peak_bytes,
            "reserved_error": predicted.reserved_peak_bytes / reserved - 1 if reserved else None,
            "kernel": predicted.info.get("kernel"),
            "attention_workspace_bytes": predicted.info.get("attention_workspace_bytes", 0)}


def materialized(model: torch.nn.Module, device: str, dtype: torch.dtype) -> torch.nn.Module:
    def make(t: torch.Tensor) -> torch.Tensor:
        if t.is_floating_point():
            return (torch.randn(t.shape, device=device, dtype=torch.float32) * 0.02).to(t.dtype)
        return torch.zeros(t.shape, device=device, dtype=t.dtype)

    tr.materialize(model, make)
    for name, buf in model.named_buffers():  # rotary inv_freq must hold real values
        if name.endswith("inv_freq"):
            base = getattr(model.config, "rope_theta", 10000.0) if hasattr(model, "config") else 1e4
            dim = buf.shape[0] * 2
            buf.copy_(1.0 / (base ** (torch.arange(0, dim, 2, device=device).float() / dim)))
    return model.train()
