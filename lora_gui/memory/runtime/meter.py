"""Peak memory of each training step, from the best source the device has.

- CUDA: ``torch.cuda.max_memory_allocated`` (source ``cuda_allocator``); a budget is enforced by
  ``torch.cuda.set_per_process_memory_fraction``.
- CPU: :class:`StorageTracker` live tensor-storage bytes (source ``tracker``); a budget is a
  simulated VRAM budget that raises ``torch.OutOfMemoryError`` like the CUDA allocator would.

The tracker sends every op of a step through Python, which slows a CPU step 2-3x. A step's
memory is fixed by its shape (the bucket or padded lengths and the micro-batches it is cut into,
the micro-batch caps) once the optimizer state exists, which the run's first optimizer step
creates. So unless ``every_step`` is set, the tracker measures the first :data:`SHAPE_STEPS`
steps of each distinct shape and later steps of a measured shape run without it: their
:meth:`PeakMeter.step_peak` is None (not measured), and the run's peak is the largest measured
step. A gradient-accumulated step is one optimizer step here (all its micro-batches run inside
it), so each measured step includes its accumulation and its optimizer update.

A step whose micro-batches are each no larger than one of a step already measured with the
optimizer state resident is not measured either (:meth:`StepShape.covered_by`; the measured
micro-batches may come from different steps): the same code runs on tensors that are each no
larger, so its live bytes are no larger at any point. Packed rows and mixed-length buckets
rarely repeat a shape exactly; most of their steps are covered by earlier ones.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass

import torch

from lora_gui.memory.runtime.tracker import MEMORY_SOURCE as TRACKER_SOURCE
from lora_gui.memory.runtime.tracker import StorageTracker
from lora_gui.units import GB  # noqa: F401  (budgets in decimal GB, as cards are labelled)

SHAPE_STEPS = 2  # steps of each shape the tracker measures: the first, and one with optimizer state
MicroKey = tuple[int, int, Hashable]  # a micro-batch's (rows, tokens a row, kind: its code path)


@dataclass(frozen=True)
class StepShape:
    """What a step's memory depends on: its micro-batches in run order and ``other`` (the image
    bucket, the micro-batch caps: anything else must be equal for one step to be within another).

    A micro-batch's ``kind`` decides which code runs (a padding or packed-document mask, a
    filler): two micro-batches compare only when their kinds are equal.
    """

    micro: tuple[MicroKey, ...]
    other: Hashable = None

    def covered_by(self, measured: Sequence[StepShape]) -> bool:
        """Whether each of this step's micro-batches is no larger than one of ``measured``'s: no
        more rows, no longer rows, the same kind and ``other``. Then each micro-batch peaks no
        higher than that one did, and the step no higher than the largest of those steps.

        The first micro-batch of a step runs without the adapter's gradients (they are freed
        between steps), every later one with them: a later micro-batch is matched only by a
        later one."""
        pool = [step for step in measured if step.other == self.other and step.micro]
        if not self.micro or not pool:
            return False

        def fits(a: MicroKey, b: MicroKey) -> bool:
            return a[2] == b[2] and a[0] <= b[0] and a[1] <= b[1]

        anywhere = [b for step in pool for b in step.micro]
        later = [b for step in pool for b in step.micro[1:]]
        return (any(fits(self.micro[0], b) for b in anywhere)
                and all(any(fits(a, b) for b in later) for a in self.micro[1:]))


class PeakMeter:
    """Context manager that measures per-step peak bytes on ``device``.

    ``every_step``: on a CPU run, the tracker measures every step (else the first
    :data:`SHAPE_STEPS` of each step shape, see the module doc); a CUDA run measures every step.
    """

    def __init__(self, device: torch.device, budget_bytes: int | None = None,
                 every_step: bool = True) -> None:
        self.device = device
        self.budget_bytes = budget_bytes
        self.every_step = every_step
        self.tracker: StorageTracker | None = None
        self.measuring = True  # whether the current step is measured
        self.measured_steps = 0  # training steps measured so far (CPU)
        self.unmeasured_steps = 0  # training steps of an already measured shape, run without it
        self._shape_counts: dict[Hashable, int] = {}
        self._settled: list[StepShape] = []  # measured with the optimizer state resident
        self._inside = False  # within the ``with`` block
        self._pushed = False  # the tracker's dispatch mode is active
        if device.type == "cuda":
            self.source = "cuda_allocator"
            if budget_bytes:
                total = torch.cuda.get_device_properties(device).total_memory
                torch.cuda.set_per_process_memory_fraction(min(1.0, budget_bytes / total), device)
        else:
            self.source = TRACKER_SOURCE
            self.tracker = StorageTracker(budget_bytes=budget_bytes)

    def __enter__(self) -> PeakMeter:
        self._inside = True
        if self.tracker is not None and self.measuring:
            self._push()
        return self

    def __exit__(self, *exc: object) -> None:
        self._inside = False
        if self._pushed:
            self._pushed = False
            self.tracker.__exit__(*exc)

    def _push(self) -> None:
        self.tracker.__enter__()
        self._pushed = True

    def track(self, tensors: Iterable[torch.Tensor]) -> None:
        """Counts tensors that existed before measuring started (weights, restored state)."""
        if self.tracker is not None:
            self.tracker.track(list(tensors))

    def start_step(self, shape: Hashable | None = None,
                   resident: Iterable[torch.Tensor] = (), settled: bool = False) -> bool:
        """Starts a step's peak window; returns whether the step is measured.

        Args:
            shape: what the step's memory depends on (None: unknown, always measured); a
                :class:`StepShape` is also skipped when it is within a settled measured step.
            resident: tensors that outlive steps (optimizer state): counted when measuring
                resumes after unmeasured steps, in case one of those created them.
            settled: the optimizer state already exists (its first update has run), so this
                step's measured peak bounds the smaller steps after it.
        """
        if self.tracker is None:
            torch.cuda.reset_peak_memory_stats(self.device)
            return True
        seen = self._shape_counts.get(shape, 0)
        measure = self.every_step or shape is None or seen < SHAPE_STEPS
        if measure and not self.every_step and isinstance(shape, StepShape):
            measure = not shape.covered_by(self._settled)  # itself included
        if measure and settled and isinstance(shape, StepShape):
            self._settled.append(shape)
        if shape is not None:  # a training step (not the caching pass): counted in coverage()
            self._shape_counts[shape] = seen + 1
            self.measured_steps += measure
            self.unmeasured_steps += not measure
        if self._inside and measure and not self._pushed:
            self._push()
            self.tracker.track(resident)
        elif self._inside and not measure and self._pushed:
            self._pushed = False
            self.tracker.__exit__(None, None, None)
        self.measuring = measure
        if measure:
            self.tracker.reset_peak()
        return measure

    def step_peak(self) -> int | None:
        """Peak bytes since the last start_step(); None when that step was not measured."""
        if self.tracker is not None:
            return self.tracker.peak_bytes if self.measuring else None
        return torch.cuda.max_memory_allocated(self.device)

    def step_host_peak(self) -> int | None:
        """Host bytes the tracker counted apart since the last start_step() (host-kept weights,
        offloaded tensors); None on a GPU run or when that step was not measured."""
        if self.tracker is not None and self.measuring:
            return self.tracker.host_peak_bytes
        return None

    def sampled_live_bytes(self) -> int | None:
        """Live bytes for the memory monitor; None while a step runs without the tracker (its
        activations are not counted then, so the figure would be too low)."""
        return self.live_bytes() if self.measuring else None

    def coverage(self) -> dict[str, object]:
        """How the steps' peaks were measured, for run.json."""
        if self.tracker is None or self.every_step:
            return {"measured_steps": "every step"}
        return {"measured_steps": f"the first {SHAPE_STEPS} of each step shape, and none whose "
                                  "micro-batches are each within a measured one",
                "steps_measured": self.measured_steps, "steps_not_measured": self.unmeasured_steps,
                "step_shapes": len(self._shape_counts)}

    def live_bytes(self) -> int:
        if self.tracker is not None:
            return self.tracker.live_bytes
        return torch.cuda.memory_allocated(self.device)
