"""Out-of-memory recovery: split the micro-batch that failed, retry the same step, remember.

A budget is enforced by the device (CUDA: ``set_per_process_memory_fraction``; CPU: the
tracker's simulated VRAM budget), so an out-of-memory here is a real ``torch.OutOfMemoryError``.
On one, the step's partial gradients are dropped and the whole step is run again with the
failing length bucket's micro-batch cap halved. The loss of every micro-batch is normalised by
the step's target-token count, so the retried step's gradient equals the unsplit one (within
float summation order) and no sample is skipped. The lowered cap holds for the rest of the run.
Three failures at micro-batch 1 end the run with :class:`RunOutOfMemoryError`.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from lora_gui.data.batching import MicroBatch, Step

MAX_FAILURES_AT_ONE = 3


class MicroBatchOutOfMemory(RuntimeError):
    """Raised by a step runner: which micro-batch ran out of memory."""

    def __init__(self, micro_batch: MicroBatch, cause: BaseException) -> None:
        super().__init__(f"out of memory at micro-batch {len(micro_batch.indices)} x "
                         f"{micro_batch.seq_len} tokens: {cause}")
        self.micro_batch = micro_batch


class RunOutOfMemoryError(RuntimeError):
    """Even one sample of this length does not fit; the message says what would."""


@dataclass
class BatchCaps:
    """Largest micro-batch per padded length, lowered on out-of-memory (starts from the plan)."""

    caps: dict[int, int] = field(default_factory=dict)

    def cap(self, seq_len: int) -> int | None:
        """The cap of the smallest bucket at or above seq_len, and no more than any shorter
        bucket's: rows of more tokens never fit more of them (an out-of-memory error at one
        length caps the longer lengths too, not only the shorter ones). None: no cap."""
        above = [n for n in self.caps if n >= seq_len]
        caps = [c for n, c in self.caps.items() if n < seq_len]
        if above:
            caps.append(self.caps[min(above)])
        return min(caps) if caps else None

    def apply(self, step: Step) -> Step:
        """The same samples, micro-batches re-cut so none is above its cap."""
        out: list[MicroBatch] = []
        for mb in step.micro_batches:
            cap = self.cap(mb.seq_len) if not mb.packed else None
            size = cap or len(mb.indices)
            out += [replace(mb, indices=mb.indices[i : i + size])
                    for i in range(0, len(mb.indices), size)]
        return Step(tuple(out))


def free_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


@dataclass(frozen=True)
class OomReport:
    """One rank's out-of-memory in one try of a step (what every rank needs to decide)."""

    rank: int
    seq_len: int
    size: int  # samples in the micro-batch that failed
    message: str


def run_guarded(run: Callable[[Step], dict[str, Any]], step: Step, caps: BatchCaps,
                zero_grad: Callable[[], None], on_event: Callable[[dict[str, Any]], None],
                agree: Callable[[MicroBatchOutOfMemory | None], list[OomReport]] | None = None,
                ) -> dict[str, Any]:
    """Runs ``run(step)`` and recovers from out-of-memory by splitting (see module doc).

    Args:
        agree: with several data-parallel ranks, gathers every rank's failure of this try (None
            when it ran clean) so that all ranks retry, and lower the same caps, together.
    """
    failures_at_one = 0
    while True:
        result, failure = None, None
        try:
            result = run(caps.apply(step))
        except MicroBatchOutOfMemory as oom:
            failure = oom
        reports = agree(failure) if agree else [] if failure is None else [
            OomReport(0, failure.micro_batch.seq_len, len(failure.micro_batch.indices), str(failure))]
        if not reports:
            return result
        zero_grad()
        free_memory()
        for report in reports:  # in rank order, so every rank changes the caps the same way
            failures_at_one = _lower_cap(report, caps, failures_at_one, on_event)


def _lower_cap(report: OomReport, caps: BatchCaps, failures_at_one: int,
               on_event: Callable[[dict[str, Any]], None]) -> int:
    """Halves the failing bucket's cap (or counts a failure at one sample); returns the count."""
    event = {"event": "oom", "rank": report.rank, "micro_batch": report.size, "seq_len": report.seq_len,
             "message": report.message}
    if report.size == 1:
        failures_at_one += 1
        on_event({**event, "failures_at_one": failures_at_one})
        if failures_at_one >= MAX_FAILURES_AT_ONE:
            raise RunOutOfMemoryError(
                f"one sample of {report.seq_len} tokens does not fit the budget "
                f"({failures_at_one} tries); lower max_seq_len, switch on "
                "gradient_checkpointing or raise budget_gb (see `python -m lora_gui plan`)"
            ) from None
        return failures_at_one
    new_cap = max(1, report.size // 2)
    caps.caps[report.seq_len] = min(new_cap, caps.caps.get(report.seq_len, new_cap))
    on_event({**event, "new_cap": caps.caps[report.seq_len]})
    return failures_at_one
