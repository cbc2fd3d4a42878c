"""The one training loop: steps until done, stopped or out of memory, with the memory monitor,
the progress bar, step records and periodic checkpoints; and the optimizer step every task
takes after its forward and backward passes. A task provides two functions: its epoch plan
(the steps of an epoch, a pure function of the seed and the epoch) and its step runner."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import replace
from typing import Any

from tqdm.auto import tqdm

from lora_gui.data.batching import Step
from lora_gui.engine.core.distributed import SampleRelay, agree_on_oom, stop_agreed, zero_missing_grads
from lora_gui.engine.core.records import RecordLog
from lora_gui.engine.core.session import RunSession
from lora_gui.memory.runtime.guard import RunOutOfMemoryError, run_guarded
from lora_gui.memory.runtime.meter import StepShape
from lora_gui.memory.runtime.monitor import MemoryMonitor
from lora_gui.units import gb

PlanEpoch = Callable[[int], list[Step]]
OneStep = Callable[[Step, int], dict[str, Any]]  # (step, epoch) -> the step's metric record


def step_shape(step: Step, kinds: Sequence[Hashable] | None = None,
               other: Hashable = None) -> StepShape:
    """What a step's memory depends on, for the CPU meter: each micro-batch's rows and padded
    length, with its kind (a packed row or rows, filler, and the task's own ``kinds`` per
    micro-batch: whether it builds a mask), and ``other`` (the image bucket)."""
    kinds = kinds or [None] * len(step.micro_batches)
    return StepShape(tuple((1 if mb.packed else len(mb.indices), mb.seq_len, (mb.packed, mb.filler, kind))
                           for mb, kind in zip(step.micro_batches, kinds, strict=True)), other)


def optimizer_step(run: RunSession, step: Step, runner: Callable[[Step], dict[str, Any]],
                   agree_across_ranks: bool = True,
                   shape: StepShape | None = None) -> tuple[dict[str, Any], float]:
    """Forward and backward of ``step`` under the memory guard (``runner`` does this rank's
    share; an out-of-memory error splits the micro-batch and retries the same step), then the
    gradient all-reduce over ranks, clipping at norm 1, the optimizer and scheduler updates.

    Args:
        agree_across_ranks: every rank learns of any rank's out-of-memory error and splits the
            same way (off under FSDP, where a rank cannot stop inside the all-gathers).
        shape: the step's shape (:func:`step_shape`) for the CPU memory meter, which measures
            the first steps of each shape and none whose micro-batches are each within a
            measured one (with the micro-batch caps, which re-cut a step; with several ranks,
            exact shapes only);
            None: measured.

    Returns:
        The runner's statistics and the step's wall seconds; ``run.state.step`` is advanced.
    """
    key: Hashable = None if shape is None else replace(
        shape, other=(shape.other, tuple(sorted(run.caps.caps.items()))))
    if key is not None and run.dist.active:  # a rank's share of a smaller step need not be
        key = (key.micro, key.other)  # smaller than its share of a larger one: exact shapes only
    run.meter.start_step(key, (t for s in run.optimizer.state.values() for t in s.values()
                               if hasattr(t, "untyped_storage")), settled=bool(run.optimizer.state))
    start = time.perf_counter()
    agree = agree_on_oom(run.dist) if run.dist.active and agree_across_ranks else None
    stats = run_guarded(runner, step, run.caps, lambda: run.optimizer.zero_grad(set_to_none=True),
                        run.on_oom, agree)
    trainable = run.trainable()
    if run.dist.active:
        zero_missing_grads(trainable)  # a rank that trained nothing still joins the all-reduce
        run.dist.all_reduce_grads(trainable)
    run.accelerator.clip_grad_norm_(trainable, 1.0)
    _step_optimizer(run.optimizer)
    run.scheduler.step()
    run.optimizer.zero_grad(set_to_none=True)
    run.state.step += 1
    return stats, time.perf_counter() - start


def _step_optimizer(optimizer: Any) -> None:
    """The optimizer update. accelerate's wrapper searches for an optional package (``lomo_optim``)
    twice on every step, an importlib lookup of about 0.5 ms each on a CPU; where it has nothing
    else to do (no gradient scaler, no XLA, gradients in sync) the wrapped optimizer steps itself."""
    inner = getattr(optimizer, "optimizer", None)
    state = getattr(optimizer, "accelerator_state", None)
    if (inner is None or state is None or getattr(optimizer, "scaler", None) is not None
            or state.distributed_type == "XLA"  # a str enum
            or not optimizer.gradient_state.sync_gradients):
        optimizer.step()
    else:
        inner.step()


def _sample_log(run: RunSession) -> Callable[[dict[str, Any]], None]:
    """memory.jsonl (main process) plus the control's listener, for the monitor's samples."""
    samples = RecordLog(run.out / "memory.jsonl", keep_until_step=run.state.step, write=run.dist.is_main)

    def on_sample(sample: dict[str, Any]) -> None:
        sample = {"step": run.state.step, **sample}
        samples.append(sample)
        if run.control.on_sample:
            run.control.on_sample(sample)

    return on_sample


def progress_text(record: dict[str, Any]) -> str:
    """The progress bar's words after a step: 'loss 4.987, peak 0.123 GB' (a CPU run measures the
    first steps of each step shape: the others say so instead of a peak)."""
    peak = record.get("peak_bytes")  # None: a step the CPU meter did not measure
    shown = "peak not measured" if peak is None else f"peak {gb(peak)}"
    return f"loss {record['loss']:.3f}, {shown}"


def run_loop(run: RunSession, plan_epoch: PlanEpoch, one_step: OneStep,
             progress: bool = True) -> tuple[str, str | None]:
    """Steps until ``run.total``, a stop request (or STOP file) or an out-of-memory error the
    guard could not recover; returns (status, message) with status completed | stopped |
    out_of_memory."""
    bar = tqdm(total=run.total, initial=run.state.step, disable=not (progress and run.dist.is_main),
               unit="step")
    relay = SampleRelay(run.dist, _sample_log(run))
    run.control.phase("training")
    hz = run.cfg.monitor_hz
    monitor = MemoryMonitor(relay.add, interval_s=1 / hz if hz else 0,
                            live_bytes=run.meter.sampled_live_bytes if run.meter.tracker else None)
    planned_epoch, plan = -1, []
    with run.meter, bar, (monitor if hz else contextlib.nullcontext()):
        while run.state.step < run.total:
            if stop_agreed(run.dist, run.control.stop.is_set(), run.out):
                return "stopped", None
            epoch, index = divmod(run.state.step, run.per_epoch)
            if epoch != planned_epoch:
                planned_epoch, plan = epoch, plan_epoch(epoch)
            try:
                record = one_step(plan[index], epoch)
            except RunOutOfMemoryError as err:
                return "out_of_memory", str(err)
            relay.flush()
            run.metrics.append(record)
            if run.control.on_record:
                run.control.on_record(record)
            bar.update(1)
            bar.set_postfix_str(progress_text(record))
            if run.state.step % run.cfg.checkpoint_every == 0:
                run.checkpoint("periodic")
    return "completed", None
