"""Where a lora_gui training step's time goes: torch.profiler around the engine's own training
loop (the 'training' phase to the 'saving' phase), every op's self time put in one group.

Groups (by op name, input shapes and the op's ancestors in the profiler's tree):
- attention: scaled-dot-product attention kernels, forward and backward;
- matmuls (frozen weights): mm / addmm / bmm / linear whose operands have no LoRA-rank dimension;
- LoRA: matmuls with a dimension equal to the LoRA rank (A and B, forward and backward);
- loss: cross entropy, log-softmax, NLL, and every op of lora_gui's fused chunked loss (forward
  and backward; the LM head's matmul is a matmul);
- optimizer: every op under ``Optimizer.step`` (AdamW, clipping apart) and ``zero_grad``;
- other ops: norms, activations, rotary, copies, casts, elementwise adds;
- python / framework: the loop's wall time not inside any op (Python, autograd bookkeeping,
  the engine's records), i.e. wall time minus the ops' self times.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

FUSED_LOSS = "_FusedLinearCrossEntropy"  # lora_gui's chunked loss (an autograd Function)
MATMULS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear", "aten::baddbmm")
GROUPS = ("attention", "matmuls (frozen weights)", "LoRA", "loss", "optimizer", "other ops",
          "python / framework")


def _ancestors(event: Any) -> list[str]:
    names, parent = [], event.cpu_parent
    while parent is not None:
        names.append(parent.name)
        parent = parent.cpu_parent
    return names


def _group(event: Any, rank: int) -> str:
    name, above = event.name, _ancestors(event)
    if any(a.startswith("Optimizer.") for a in above) or name.startswith("Optimizer."):
        return "optimizer"
    if "scaled_dot_product" in name or "flash_attention" in name or any(
            "scaled_dot_product" in a for a in above):
        return "attention"
    if any(k in name for k in ("cross_entropy", "log_softmax", "nll_loss")) or any(
            k in a for a in above for k in ("cross_entropy", "nll_loss", "log_softmax")):
        return "loss"
    if name in MATMULS:
        shapes = [s for s in (event.input_shapes or []) if isinstance(s, list)]
        if any(rank in s for s in shapes if s):
            return "LoRA"
        return "matmuls (frozen weights)"
    if any(FUSED_LOSS in a for a in above):  # the chunked loss's own ops, its head matmuls apart
        return "loss"
    if name.startswith("aten::") or name.startswith("autograd::"):
        return "other ops"
    return "python / framework"  # autograd nodes' and record ranges' own time


class StepProfile:
    """Start with :meth:`start` when training begins, :meth:`stop` when it ends; :meth:`split`
    gives seconds per group."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.prof = profile(activities=[ProfilerActivity.CPU], record_shapes=True)
        self.wall = 0.0
        self._t0 = 0.0

    def start(self) -> None:
        self.prof.start()
        self._t0 = time.perf_counter()

    def stop(self) -> None:
        self.wall = time.perf_counter() - self._t0
        self.prof.stop()

    def split(self) -> dict[str, float]:
        seconds = dict.fromkeys(GROUPS, 0.0)
        busy = 0.0
        for ev in self.prof.events():
            if ev.device_type != torch.autograd.DeviceType.CPU:
                continue
            self_s = ev.self_cpu_time_total / 1e6
            group = _group(ev, self.rank)
            if group != "python / framework":
                busy += self_s
                seconds[group] += self_s
        seconds["python / framework"] = max(0.0, self.wall - busy)
        return seconds


def format_split(name: str, seconds: dict[str, float]) -> str:
    total = sum(seconds.values()) or 1.0
    cells = " | ".join(f"{seconds[g]:.2f} s ({seconds[g] / total:.0%})" for g in GROUPS)
    return f"| {name} | {total:.2f} s | {cells} |"


def header() -> str:
    return ("| run | profiled wall | " + " | ".join(GROUPS) + " |\n|---|---|" + "---|" * len(GROUPS))


def top_ops(profile: StepProfile, group: str, n: int = 12) -> list[tuple[str, float]]:
    """The ops with the most self time in one group (to see what to attack)."""
    totals: dict[str, float] = {}
    for ev in profile.prof.events():
        if ev.device_type == torch.autograd.DeviceType.CPU and _group(ev, profile.rank) == group:
            totals[ev.name] = totals.get(ev.name, 0.0) + ev.self_cpu_time_total / 1e6
    return sorted(totals.items(), key=lambda kv: -kv[1])[:n]
