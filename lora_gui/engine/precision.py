"""Mixed precision chosen by measured capability, not by habit.

On GPUs with bf16 support bf16 autocast is both smaller and faster. On CPUs it depends on the
instruction set: on this project's 2-core CI machine a bf16-autocast step was ~20x slower than
fp32. So on CPU 'auto' times a small matmul forward+backward both ways and picks bf16 only when
it is clearly faster.
"""

from __future__ import annotations

import functools
import time

import torch

CPU_BF16_MIN_SPEEDUP = 1.2  # bf16 must beat fp32 by 20% to be worth its rounding


def _time_cpu(bf16: bool, repeats: int = 3) -> float:
    layer = torch.nn.Linear(512, 512)
    x = torch.randn(256, 512)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            layer(x).float().sum().backward()
        best = min(best, time.perf_counter() - start)
    return best


@functools.cache
def cpu_bf16_is_faster() -> bool:
    """Measures once per process whether bf16 autocast beats fp32 on this CPU."""
    return _time_cpu(False) / _time_cpu(True) >= CPU_BF16_MIN_SPEEDUP


def choose_precision(requested: str, device: torch.device) -> str:
    """Maps the 'precision' setting to accelerate's mixed_precision ('no', 'bf16', 'fp16')."""
    if requested == "fp32":
        return "no"
    if requested in ("bf16", "fp16"):
        return requested
    if device.type == "cuda":
        return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    return "bf16" if cpu_bf16_is_faster() else "no"
