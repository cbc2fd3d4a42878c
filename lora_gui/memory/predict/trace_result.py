"""What a trace measures: the categories of memory, the CUDA-side overheads it adds, the result
of one traced step (:class:`TraceResult`) and the tracker that records when each storage lives
and in which phase of the step (source: predicted)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from lora_gui.memory.predict.cuda_kernels import CUBLAS_HANDLES as _HANDLES
from lora_gui.memory.predict.cuda_kernels import CUBLAS_WORKSPACE_PER_HANDLE as _CUBLAS
from lora_gui.memory.predict.cuda_kernels import CUBLASLT_WORKSPACE_BYTES as _CUBLASLT
from lora_gui.memory.runtime.tracker import StorageTracker, track_op

CATEGORIES = ("frozen_weights", "lora_params", "gradients", "optimizer_state", "activations", "temporaries")
UNET_LORA_TARGETS = ("to_q", "to_k", "to_v", "to_out.0")
BATCH_MASKS = ("none", "padding", "packed")  # what a text micro-batch tells attention

# -- CUDA-side overheads the trace cannot see (bytes) ---------------------------------------
# CUDA context + kernels loaded lazily by torch + the libraries' own device memory, outside
# torch.cuda.max_memory_allocated(). Measured on an H200 (torch 2.11 + CUDA 13.0, driver 580;
# bench/gpu/check.py, source cuda_mem_get_info: total - free - reserved): 619 MiB after the first
# tensor, 765 MiB once cuBLAS and flash attention ran, 919 MiB after text, NF4 (bitsandbytes),
# DiT and UNet steps had run in the same process. Cards with fewer multiprocessors hold less,
# so plans err high there; a run on a card reads its own figure before planning
# (lora_gui.memory.runtime.cuda_context) and plans against less when the card holds more.
CUDA_CONTEXT_BYTES = 920 * 2**20
# cuBLAS + cuBLASLt workspaces, allocated through the caching allocator on the first matmul (so
# inside max_memory_allocated): 32 MiB (":4096:8" on Hopper) for each of the two threads that run
# matmuls (forward, autograd's backward) + 1 MiB cuBLASLt (cuda_kernels).
CUBLAS_WORKSPACE_BYTES = _HANDLES * _CUBLAS + _CUBLASLT
# The caching allocator rounds every block up to a multiple of 512 bytes (kMinBlockSize).
CUDA_ALLOC_ROUNDING = 512
CUDA_OVERHEADS_DOC = (
    "cuda_context: CUDA context, lazily loaded kernels and the libraries' own memory (920 MiB, "
    "measured on an H200; outside the allocator); "
    "cublas_workspace: 2 x 32 MiB cuBLAS (torch default ':4096:8' on Hopper, one per thread that "
    "runs matmuls: forward and autograd's backward) + 1 MiB cuBLASLt; "
    "allocator_rounding: every live block at the peak rounded up to 512 bytes (computed from "
    "the traced storages); kernel workspaces (attention backward) are inside the trace, at the "
    "moment they are alive; reserved beyond allocated: the caching-allocator replay."
)


@dataclass
class TraceResult:
    """Peak memory of one steady-state training step.

    Attributes:
        peak_bytes: traced peak plus every CUDA overhead: what the card must hold.
        traced_peak_bytes: peak of live tensor storages in the trace alone (source: tracker).
        breakdown: category -> bytes alive at the traced peak; sums to ``traced_peak_bytes``.
        cuda_overheads: name -> bytes (``cuda_context``, ``cublas_workspace``,
            ``allocator_rounding``, ``allocator_cache``: reserved beyond allocated, from the
            caching-allocator replay); all 0 for ``device="cpu"``.
        device: the device the prediction is for ("cuda" or "cpu").
        seconds: wall time of the trace.
        info: parameter counts, model type, number of counted allocations, the phase of the peak.
    """

    peak_bytes: int
    traced_peak_bytes: int
    breakdown: dict[str, int]
    cuda_overheads: dict[str, int]
    device: str
    seconds: float
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def allocator_peak_bytes(self) -> int:
        """What ``torch.cuda.max_memory_allocated`` should show: all but the CUDA context and
        the allocator's cache beyond its live blocks."""
        return self.reserved_peak_bytes - self.cuda_overheads.get("allocator_cache", 0)

    @property
    def reserved_peak_bytes(self) -> int:
        """What ``torch.cuda.max_memory_reserved`` should show: all but the CUDA context
        (``peak_bytes`` is this plus the context: what nvidia-smi shows)."""
        return self.peak_bytes - self.cuda_overheads.get("cuda_context", 0)


class _Record:
    """One counted storage: size, category and the events at which it was born and died."""

    __slots__ = ("nbytes", "category", "born", "died")

    def __init__(self, nbytes: int, category: str, born: int) -> None:
        self.nbytes, self.category, self.born, self.died = nbytes, category, born, None


class _PhaseTracker(StorageTracker):
    """StorageTracker that keeps a record per storage so the peak can be broken down exactly.

    A trace never runs under ``torch.compile``: its dispatch is bound unwrapped (torch wraps a
    mode's ``__torch_dispatch__`` to keep dynamo out, a cost on each of the trace's ops)."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False

    __torch_dispatch__ = track_op

    def __init__(self) -> None:
        super().__init__()
        self.category = "activations"  # category given to storages counted from now on
        self.phase = "forward"
        self.events = 0  # incremented on every count and free
        self.peak_event = 0
        self.peak_phase = "forward"
        self.records: list[_Record] = []
        self.head_entered = False
        self.start_event = 0  # the event at which the measured step starts

    def _count(self, storages: list[tuple[torch.UntypedStorage, int]]) -> None:
        for storage, nbytes in storages:
            self.events += 1
            rec = _Record(nbytes, self.category, self.events)
            self.records.append(rec)
            key = storage._cdata  # the base tracker's key: the storage's C++ address
            ref = torch.utils.weak.weakref.ref(storage, lambda _r, rec=rec, k=key: self._die(rec, k))
            self._seen[key] = (rec, ref)
            self.live_bytes += nbytes
            if self.live_bytes > self.peak_bytes:
                self.peak_bytes, self.peak_event, self.peak_phase = self.live_bytes, self.events, self.phase

    def _die(self, rec: _Record, key: int) -> None:
        self._seen.pop(key, None)
        self.events += 1
        rec.died = self.events
        self.live_bytes -= rec.nbytes

    def enter_head(self, x: torch.Tensor) -> None:
        """Marks the start of the head (logits + loss): allocations are temporaries until the
        backward's gradient reaches ``x``, the head's input."""
        self.category = self.phase = "temporaries"
        self.head_entered = True
        if x.requires_grad:
            x.register_hook(lambda g: setattr(self, "category", "activations"))

    def record_of(self, tensor: torch.Tensor) -> _Record | None:
        entry = self._seen.get(tensor.untyped_storage()._cdata)
        return entry[0] if entry and isinstance(entry[0], _Record) else None

    def live_at_peak(self) -> list[_Record]:
        p = self.peak_event
        return [r for r in self.records if r.born <= p and (r.died is None or r.died > p)]


