"""Rank-aware pieces shared by the training loops (text now, image with a few lines).

A run started by ``accelerate launch --num_processes N -m lora_gui train ...`` has N processes
(ranks). What they share, and how:

- **one run folder**: only the main process writes (records, checkpoints, adapter, run.json);
  decisions that read the folder (refuse it, load a checkpoint) are taken by the main process and
  broadcast, errors included, so every rank fails with the same clear message (:meth:`Dist.on_main`);
- **gradients**: LoRA parameters are replicated; after every rank has run its micro-batches the
  gradients are summed with one all-reduce in 25 MB buckets (:meth:`Dist.all_reduce_grads`,
  DDP's default bucket size). That is data-parallel training like DDP, without DDP's hooks inside
  backward: those would leave a rank waiting in an all-reduce that a rank which ran out of memory
  never joins, so the out-of-memory decision could not be taken together. A LoRA's gradients are
  about 0.5% of the weights, so not overlapping their all-reduce with backward costs little;
- **decisions**: out-of-memory (any rank -> all split), stop (any rank asked -> all stop), peak
  memory per rank, memory samples: small collectives once per optimizer step.

With one process nothing here calls torch.distributed, so the single-process path is unchanged.

A loop uses it like this (engine/text/train.py does; the image loop needs the same few lines)::

    dist = Dist.from_env()                                  # before anything is written
    dist.on_main(lambda: prepare_run_dir(out, ...))         # folder decisions: main, broadcast
    check_world_size(dist.world_size, n_samples, cfg.batch_size)
    ...  # model, optimizer; several ranks: broadcast LoRA params, no DDP wrapper (see above)
    share = split_step(global_step, dist.world_size, lengths, ...)[dist.rank]  # data/shard.py
    stats = run_guarded(run_share, step, caps, zero_grad, on_oom, agree_on_oom(dist))
    dist.all_reduce_grads(trainable); optimizer.step()
    record.update(combine_step_stats(dist, meter.step_peak(), loss, real, padded))
    relay.flush()                                           # SampleRelay: memory samples by rank
    RecordLog(..., write=dist.is_main); checkpoints and the adapter: main only
    if stop_agreed(dist, control.stop.is_set(), out): ...   # every rank stops at the same step
"""

from __future__ import annotations

import functools
import logging
import os
import pickle
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import torch.distributed as tdist

from lora_gui.config import ConfigError

log = logging.getLogger(__name__)
T = TypeVar("T")
BUCKET_BYTES = 25 * 2**20  # all-reduce bucket (DDP's default bucket_cap_mb = 25)
CPU_LAUNCH_HINT = ("use `accelerate launch --multi_gpu --num_processes N ...`: without a GPU it starts "
                   "N processes on the CPU with the gloo backend")


def launched_world_size() -> int:
    """Processes of this job as the launcher (torchrun / accelerate launch / mpirun) set them."""
    for key in ("WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE"):
        if os.environ.get(key):
            return int(os.environ[key])
    return 1


def check_cpu_launch() -> None:
    """Without a GPU, ``accelerate launch --num_processes N`` (N > 1), with or without ``--cpu``,
    starts ONE process unless mpirun is configured: its simple launcher sets MASTER_ADDR (and
    ACCELERATE_MIXED_PRECISION) but no WORLD_SIZE. Refuse instead of silently training alone.

    Raises:
        ConfigError: with the command that does start N processes on a CPU.
    """
    by_accelerate = "ACCELERATE_MIXED_PRECISION" in os.environ
    if by_accelerate and os.environ.get("MASTER_ADDR") and launched_world_size() == 1:
        raise ConfigError("accelerate launch --num_processes N started one process (without a GPU its "
                          f"launcher needs mpirun for more); {CPU_LAUNCH_HINT}")


@dataclass
class Dist:
    """This process's place in the job and the collectives the loops need (all ranks call them)."""

    rank: int = 0
    world_size: int = 1
    device: torch.device = torch.device("cpu")

    @classmethod
    def from_env(cls) -> Dist:
        """Joins the process group a launcher prepared (through accelerate), or a single process."""
        check_cpu_launch()
        if launched_world_size() == 1:
            return cls()
        from accelerate import PartialState

        state = PartialState(cpu=not torch.cuda.is_available())
        return cls(state.process_index, state.num_processes, state.device)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def active(self) -> bool:
        """More than one process: collectives are real."""
        return self.world_size > 1

    # -- decisions ------------------------------------------------------------------------------
    def any(self, flag: bool) -> bool:
        """True on every rank when the flag is true on any rank."""
        if not self.active:
            return bool(flag)
        t = torch.tensor([1.0 if flag else 0.0], device=self.device)
        tdist.all_reduce(t, op=tdist.ReduceOp.MAX)
        return bool(t.item())

    def gather_floats(self, values: Sequence[float]) -> list[list[float]]:
        """Every rank's vector of floats (float64: exact for byte counts below 2**53), by rank."""
        if not self.active:
            return [list(values)]
        mine = torch.tensor(list(values), dtype=torch.float64, device=self.device)
        out = [torch.empty_like(mine) for _ in range(self.world_size)]
        tdist.all_gather(out, mine)
        return [t.tolist() for t in out]

    def gather_to_main(self, obj: Any) -> list[Any] | None:
        """Every rank's picklable object on the main process (None elsewhere)."""
        if not self.active:
            return [obj]
        out: list[Any] | None = [None] * self.world_size if self.is_main else None
        tdist.gather_object(obj, out, dst=0)
        return out

    def broadcast(self, obj: T) -> T:
        """The main process's object on every rank."""
        if not self.active:
            return obj
        box = [obj]
        tdist.broadcast_object_list(box, src=0, device=self.device)
        return box[0]

    def on_main(self, fn: Callable[[], T]) -> T:
        """Runs ``fn`` on the main process only and gives its result, or raises its error, on
        every rank (file-system decisions taken once, failures reported the same everywhere)."""
        if not self.active:
            return fn()
        result, error = None, None
        if self.is_main:
            try:
                result = fn()
            except Exception as err:  # re-raised below on every rank, main included
                error = err
            try:
                pickle.dumps(error)
            except Exception:  # an error that cannot travel still ends every rank
                error = RuntimeError(f"{type(error).__name__}: {error}")
        result, error = self.broadcast((result, error))
        if error is not None:
            raise error
        return result

    def barrier(self) -> None:
        if self.active:
            tdist.barrier()

    # -- gradients and parameters ---------------------------------------------------------------
    def all_reduce_grads(self, params: Iterable[torch.nn.Parameter],
                         bucket_bytes: int = BUCKET_BYTES) -> None:
        """Sums the gradients of replicated parameters over ranks, in flat buckets. Each rank's
        loss is already divided by the global target-token count, so the sum is the gradient of
        the global batch (no division by the world size)."""
        if not self.active:
            return
        grads = [p.grad for p in params if p.grad is not None]
        for bucket in _buckets(grads, bucket_bytes):
            flat = torch._utils._flatten_dense_tensors(bucket)
            tdist.all_reduce(flat)
            for g, synced in zip(bucket, torch._utils._unflatten_dense_tensors(flat, bucket)):
                g.copy_(synced)

    def broadcast_params(self, params: Iterable[torch.Tensor]) -> None:
        """Makes replicated parameters identical to the main process's (LoRA init)."""
        if self.active:
            for p in params:
                tdist.broadcast(p.data, src=0)

    def release(self) -> None:
        """Leaves the process group at the end of a launched run (no warning at exit)."""
        if self.active and tdist.is_initialized():
            tdist.barrier()
            tdist.destroy_process_group()


def _buckets(tensors: list[torch.Tensor], limit: int) -> Iterable[list[torch.Tensor]]:
    bucket: list[torch.Tensor] = []
    size = 0
    for t in tensors:
        nbytes = t.numel() * t.element_size()
        if bucket and (size + nbytes > limit or t.dtype != bucket[0].dtype):
            yield bucket
            bucket, size = [], 0
        bucket.append(t)
        size += nbytes
    if bucket:
        yield bucket


def check_world_size(world_size: int, train_samples: int, batch_size: int) -> None:
    """Every rank needs samples to train: refuse launches with more processes than that.

    Raises:
        ConfigError: naming the number of processes, samples and batch size.
    """
    if world_size > train_samples:
        raise ConfigError(f"{world_size} processes but only {train_samples} training samples: launch at "
                          f"most {train_samples} processes (--num_processes) or use more data")
    if world_size > batch_size:
        raise ConfigError(f"batch_size: {batch_size} samples per optimizer step cannot be shared by "
                          f"{world_size} processes (each needs at least one); set batch_size to "
                          f"{world_size} or more (the global batch: it is split across processes)")


def enable_autocast(model: torch.nn.Module, accelerator) -> None:
    """The mixed-precision autocast that ``accelerator.prepare(model)`` adds, for a model that
    data-parallel training keeps unwrapped (no DDP; FSDP sharded by us)."""
    if not accelerator.native_amp:
        return
    forward = model.forward

    @functools.wraps(forward)
    def autocast_forward(*args: Any, **kwargs: Any) -> Any:
        with accelerator.autocast():
            return forward(*args, **kwargs)

    model.forward = autocast_forward


def local_tensors(tensors: Iterable[torch.Tensor]) -> list[torch.Tensor]:
    """This rank's storage of each tensor: the local shard of an FSDP DTensor, else the tensor."""
    return [t.to_local() if hasattr(t, "to_local") else t for t in tensors]


def rank_peaks(values: list[list[float]], column: int) -> list[int]:
    """One column of :meth:`Dist.gather_floats` output as ints, by rank."""
    return [int(v[column]) for v in values]


# -- per-step helpers for the training loops ---------------------------------------------------
STOP_FILE = "STOP"  # `touch RUN/STOP` stops a run after its current step (the dashboard does)
DEBUG_SAMPLES_ENV = "LORA_GUI_DEBUG_SAMPLES"  # "1": each record lists the samples every rank trained
INJECT_OOM_ENV = "LORA_GUI_INJECT_OOM"  # test hook "RANK:STEP": that rank's step runs out of memory once


def stop_agreed(dist: Dist, asked: bool, run_dir: Any) -> bool:
    """True on every rank when this rank's caller asked, the main process finds RUN/STOP, or any
    other rank was asked (a Ctrl-C reaches the ranks at different moments)."""
    if dist.is_main and run_dir is not None and (run_dir / STOP_FILE).exists():
        asked = True
    return dist.any(asked)


def agree_on_oom(dist: Dist):
    """The guard's ``agree`` for several ranks: every rank's failure of this try, by rank."""
    from lora_gui.memory.runtime.guard import OomReport

    def agree(failure) -> list[OomReport]:
        mine = [0.0, 0.0, 0.0] if failure is None else [
            1.0, float(failure.micro_batch.seq_len), float(len(failure.micro_batch.indices))]
        rows = dist.gather_floats(mine)
        return [OomReport(r, int(row[1]), int(row[2]),
                          f"rank {r}: out of memory at micro-batch {int(row[2])} x {int(row[1])} tokens")
                for r, row in enumerate(rows) if row[0]]

    return agree


def injected_oom(rank: int, step: int) -> bool:
    """Test hook: True once for the rank and 1-based step named in LORA_GUI_INJECT_OOM."""
    spec = os.environ.get(INJECT_OOM_ENV)
    if not spec or ":" not in spec:
        return False
    want_rank, want_step = (int(x) for x in spec.split(":"))
    if (rank, step) != (want_rank, want_step):
        return False
    os.environ[INJECT_OOM_ENV] = ""  # once: the retry after the split must run
    return True


def combine_step_stats(dist: Dist, peak: int | None, loss: float, real: int,
                       padded: int) -> dict[str, Any]:
    """One step's figures over all ranks: loss and tokens summed (each rank's loss is already a
    share of the global mean), ``peak_bytes`` = the largest rank, plus ``peak_bytes_by_rank``.
    ``peak`` None: the step's memory was not measured (every rank decides alike), so both are None."""
    rows = dist.gather_floats([-1 if peak is None else peak, loss, real, padded])
    peaks = [int(r[0]) for r in rows]
    measured = min(peaks) >= 0
    return {"loss": sum(r[1] for r in rows), "real_tokens": int(sum(r[2] for r in rows)),
            "padded_tokens": int(sum(r[3] for r in rows)), "peak_bytes": max(peaks) if measured else None,
            "peak_bytes_by_rank": peaks if measured else None}

def zero_missing_grads(params: list[torch.nn.Parameter]) -> None:
    """Zero gradients where a rank trained nothing this step, so every rank all-reduces the same
    tensors (after the sum every parameter holds the global gradient, as with one process)."""
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)


class SampleRelay:
    """Memory-monitor samples of every rank, brought to the main process once a step.

    The monitor thread of each rank buffers its samples (no collective from a thread); the loop
    calls :meth:`flush` after each optimizer step and the main process hands every rank's samples,
    labelled with ``rank``, to ``sink``. One process: samples go straight to the sink.
    """

    def __init__(self, dist: Dist, sink: Callable[[dict[str, Any]], None]) -> None:
        self.dist = dist
        self.sink = sink
        self._buffer: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    def add(self, sample: dict[str, Any]) -> None:
        if not self.dist.active:
            self.sink(sample)
            return
        with self._lock:
            self._buffer.append({**sample, "rank": self.dist.rank})

    def flush(self) -> None:
        if not self.dist.active:
            return
        with self._lock:
            mine, self._buffer = self._buffer, []
        gathered = self.dist.gather_to_main(mine)
        for samples in gathered or []:
            for sample in samples:
                self.sink(sample)
