"""Mixed precision chosen by measured capability, not by habit, and the dtype the frozen weights
get from it (one rule for the run and its plan).

- CUDA: bf16 where the GPU supports it (``torch.cuda.is_bf16_supported``), else fp16.
- CPU: it depends on the instruction set and the model's shapes, so 'auto' times a real
  forward+backward of the run's own model on a small batch in fp32 and under bf16 autocast and
  picks bf16 only when it is at least ``CPU_BF16_MIN_SPEEDUP`` times faster. On this project's
  2-core machine (avx512_bf16) a 512x512 matmul alone was 2.5x faster in bf16 but a step of the
  built-in model only 1.2-1.5x, and the issue's author saw a step 20x slower on another: a
  threshold of 2x keeps runs of the same config on the same machine in the same precision
  instead of flipping with timing noise.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

CPU_BF16_MIN_SPEEDUP = 2.0  # bf16 must halve the step time to be worth its rounding on a CPU


def _best_time(step: Callable[[], None], bf16: bool, repeats: int = 3) -> float:
    best = float("inf")
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        step()  # warm-up (oneDNN picks kernels on first use)
        for _ in range(repeats):
            start = time.perf_counter()
            step()
            best = min(best, time.perf_counter() - start)
    return best


def cpu_bf16_speedup(step: Callable[[], None]) -> float:
    """fp32 time / bf16-autocast time of ``step`` (a forward+backward of the real model)."""
    return _best_time(step, False) / _best_time(step, True)


def choose_precision(requested: str, device: torch.device,
                     probe_step: Callable[[], None] | None = None) -> str:
    """Maps the 'precision' setting to accelerate's mixed_precision ('no', 'bf16', 'fp16').

    Args:
        requested: 'auto', 'fp32', 'bf16' or 'fp16'.
        device: where the run trains.
        probe_step: on CPU with 'auto', one forward+backward of the run's model to time; without
            it a CPU run stays in fp32.
    """
    if requested == "fp32":
        return "no"
    if requested in ("bf16", "fp16"):
        return requested
    if device.type == "cuda":
        return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    if probe_step is None or not cpu_may_run_bf16_fast():
        return "no"
    return "bf16" if cpu_bf16_speedup(probe_step) >= CPU_BF16_MIN_SPEEDUP else "no"


def cpu_may_run_bf16_fast() -> bool:
    """False where torch's CPU kernels top out at AVX2: x86 without AVX-512 has no bf16 dot
    products, so bf16 is emulated and never twice as fast; timing it would cost the run ~5 s of
    CPU for nothing. Elsewhere (AVX-512, ARM) only a timing can tell."""
    return torch.backends.cpu.get_cpu_capability() != "AVX2"


def weights_dtype(mixed: str, device_type: str, text: bool = False) -> torch.dtype:
    """Frozen weights in the compute dtype on GPUs (half the bytes; LoRA weights stay fp32 in
    peft), and for a text run in bf16 on a CPU: under autocast a float32 weight is cast to bf16
    again in every forward (and again in a checkpointed layer's recompute), 11-15% of a bf16
    step of the built-in model. Image runs on a CPU keep float32 weights.

    Args:
        mixed: accelerate's mixed_precision ('no', 'bf16', 'fp16'), see :func:`choose_precision`.
        device_type: 'cuda' or 'cpu'.
        text: a text run (a causal language model).
    """
    if device_type == "cuda":
        return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(mixed, torch.float32)
    return torch.bfloat16 if text and mixed == "bf16" else torch.float32


def cast_frozen(model: torch.nn.Module, dtype: torch.dtype) -> int:
    """Frozen floating-point parameters cast to ``dtype`` (the adapter's stay as they are), as
    if the base had been loaded in it; returns how many were cast. For a CPU run whose precision
    was chosen after its weights were loaded ('auto' times the loaded model first). Packed
    4-bit weights stored in a floating dtype (FSDP's ``bnb_4bit_quant_storage``) are bytes, not
    values: they are left alone."""
    count = 0
    for param in model.parameters():
        if getattr(param, "bnb_quantized", False):
            continue
        if not param.requires_grad and param.is_floating_point() and param.dtype != dtype:
            param.data = param.data.to(dtype)
            count += 1
    return count


def planned_weights_dtype(precision: str, device_type: str, text: bool = False) -> torch.dtype:
    """The frozen weights' dtype a run with this ``precision`` setting gets on ``device_type``,
    without asking the device: 'auto' on CUDA plans bf16 (a card without bf16 runs fp16, the
    same 2 bytes a value), so a plan for a GPU can be made on a machine without one; 'auto' on
    a CPU plans float32 (the run times its model first and plans again with what it chose)."""
    if device_type == "cpu" and precision == "auto":
        return torch.float32
    mixed = {"fp32": "no", "fp16": "fp16"}.get(precision, "bf16")
    return weights_dtype(mixed, device_type, text)
