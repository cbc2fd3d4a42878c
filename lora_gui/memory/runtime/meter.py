"""Peak memory of each training step, from the best source the device has.

- CUDA: ``torch.cuda.max_memory_allocated`` (source ``cuda_allocator``); a budget is enforced by
  ``torch.cuda.set_per_process_memory_fraction``.
- CPU: :class:`StorageTracker` live tensor-storage bytes (source ``tracker``); a budget is a
  simulated VRAM budget that raises ``torch.OutOfMemoryError`` like the CUDA allocator would.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from lora_gui.memory.runtime.tracker import MEMORY_SOURCE as TRACKER_SOURCE
from lora_gui.memory.runtime.tracker import StorageTracker
from lora_gui.units import GB  # noqa: F401  (budgets in decimal GB, as cards are labelled)


class PeakMeter:
    """Context manager that measures per-step peak bytes on ``device``."""

    def __init__(self, device: torch.device, budget_bytes: int | None = None) -> None:
        self.device = device
        self.budget_bytes = budget_bytes
        self.tracker: StorageTracker | None = None
        if device.type == "cuda":
            self.source = "cuda_allocator"
            if budget_bytes:
                total = torch.cuda.get_device_properties(device).total_memory
                torch.cuda.set_per_process_memory_fraction(min(1.0, budget_bytes / total), device)
        else:
            self.source = TRACKER_SOURCE
            self.tracker = StorageTracker(budget_bytes=budget_bytes)

    def __enter__(self) -> PeakMeter:
        if self.tracker is not None:
            self.tracker.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.tracker is not None:
            self.tracker.__exit__(*exc)

    def track(self, tensors: Iterable[torch.Tensor]) -> None:
        """Counts tensors that existed before measuring started (weights, restored state)."""
        if self.tracker is not None:
            self.tracker.track(list(tensors))

    def start_step(self) -> None:
        if self.tracker is not None:
            self.tracker.reset_peak()
        else:
            torch.cuda.reset_peak_memory_stats(self.device)

    def step_peak(self) -> int:
        """Peak bytes since the last start_step()."""
        if self.tracker is not None:
            return self.tracker.peak_bytes
        return torch.cuda.max_memory_allocated(self.device)

    def live_bytes(self) -> int:
        if self.tracker is not None:
            return self.tracker.live_bytes
        return torch.cuda.memory_allocated(self.device)
