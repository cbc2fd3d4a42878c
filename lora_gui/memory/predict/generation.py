"""Memory that trying a run (generation) needs, and whether a running training job leaves it.

The prediction is a closed form that errs high (source: ``predicted``):

- text: the base weights (their safetensors sizes) + the adapter + the KV cache of
  ``prompt + new`` tokens (2 x layers x kv_heads x head_dim per token) + last-position logits
  in fp32, times a 1.25 margin for allocator rounding and temporaries;
- image: the pipeline's weights + the adapter, times 1.5 for the UNet's activations at batch 1
  (classifier-free guidance doubles it) and the VAE decode.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from lora_gui.memory.runtime.meter import GB
from lora_gui.units import gb

TEXT_MARGIN = 1.25
IMAGE_MARGIN = 1.5


@dataclass(frozen=True)
class Room:
    """A verdict on whether generation fits next to a running job (all figures in bytes)."""

    fits: bool
    need_bytes: int
    free_bytes: int | None
    message: str


def _weights_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*.safetensors")) + sum(
        p.stat().st_size for p in folder.rglob("*.bin"))


def text_generation_bytes(model_dir: Path, adapter_dir: Path, tokens: int, dtype_bytes: int = 4) -> int:
    """Predicted peak bytes of generating up to ``tokens`` (prompt + new) with a text run."""
    cfg = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    layers = cfg.get("num_hidden_layers", 32)
    heads = cfg.get("num_attention_heads", 32)
    kv_heads = cfg.get("num_key_value_heads") or heads
    head_dim = cfg.get("head_dim") or cfg.get("hidden_size", 4096) // heads
    kv_cache = 2 * layers * kv_heads * head_dim * tokens * dtype_bytes
    logits = cfg.get("vocab_size", 32000) * 4 * 2  # fp32 logits of the last position, and softmax
    weights = _weights_bytes(model_dir) * dtype_bytes // 4 + _weights_bytes(adapter_dir)
    return int((weights + kv_cache + logits) * TEXT_MARGIN)


def image_generation_bytes(pipeline_dir: Path, adapter_dir: Path) -> int:
    """Predicted peak bytes of one base and one adapter picture (one pipeline in memory)."""
    return int((_weights_bytes(pipeline_dir) + _weights_bytes(adapter_dir)) * IMAGE_MARGIN)


def job_held_bytes(job) -> tuple[int, str]:
    """Bytes the running job holds on the device: its largest measured step peak or its
    prediction, whichever is larger, and the source of that figure."""
    records, _ = job.snapshot()
    measured = max((r.get("peak_bytes") or 0 for r in records), default=0)
    predicted = job.predicted_bytes or 0
    if measured >= predicted:
        return measured, records[-1].get("memory_source", "tracker") if records else "tracker"
    return predicted, "predicted"


def device_total_bytes(job) -> tuple[int | None, str]:
    """The memory generation shares with the job: the GPU's total, or on a machine without
    one the job's simulated VRAM budget (None when there is neither)."""
    if torch.cuda.is_available():
        return torch.cuda.get_device_properties(0).total_memory, "this GPU"
    if job is not None and job.cfg.budget_gb:
        return int(job.cfg.budget_gb * GB), "the running job's simulated VRAM budget"
    return None, "no GPU and no budget"


def room_for_generation(need_bytes: int, job) -> Room:
    """Whether ``need_bytes`` fit beside ``job`` (a lora_gui.engine.jobs.manager.Job or None)."""
    if job is None or not job.running:
        return Room(True, need_bytes, None, "no training job is running")
    total, what = device_total_bytes(job)
    if total is None:
        return Room(True, need_bytes, None, "no device limit: generation runs in the CPU's RAM")
    held, source = job_held_bytes(job)
    free = total - held
    if need_bytes <= free:
        return Room(True, need_bytes, free, f"fits: needs {gb(need_bytes)} (predicted), "
                    f"{gb(free)} free of {what}")
    return Room(False, need_bytes, free, (
        f"Not enough memory to try a run while '{job.name}' trains: generation needs "
        f"{gb(need_bytes)} (predicted), the job holds {gb(held)} ({source}) of "
        f"{gb(total)} ({what}), leaving {gb(max(free, 0))}. Stop the job or "
        "wait for it to finish."))
