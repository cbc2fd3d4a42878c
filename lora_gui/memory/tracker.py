"""Live tensor-storage bytes, counted by a TorchDispatchMode: the CPU stand-in for the CUDA allocator.

Every tensor that an op returns is looked at once; its storage is counted the first time it is
seen (views share a storage, so they are free) and uncounted by a weakref callback when the
storage dies. This works on real CPU tensors, CUDA tensors and fake tensors alike, which is what
lets the planner trace a training step of an 8B model on a laptop.

Differences from ``torch.cuda.max_memory_allocated``, by design: no 512-byte rounding (the trace
adds it as a named overhead), no allocator caching or fragmentation, and ``UntypedStorage.resize_``
is not seen (no op in a LoRA training step uses it).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.weak import WeakIdKeyDictionary

MEMORY_SOURCE = "tracker"


class StorageTracker(TorchDispatchMode):
    """Counts live storage bytes of every tensor created while the mode is active.

    Use as a context manager around the work to measure; call :meth:`track` for tensors that
    existed before (model weights). ``budget_bytes`` makes the tracker a simulated VRAM budget:
    an op whose outputs would push live bytes past it raises ``torch.OutOfMemoryError``.
    """

    def __init__(self, budget_bytes: int | None = None) -> None:
        super().__init__()
        self.budget_bytes = budget_bytes
        self.live_bytes = 0  # bytes of storages alive now
        self.peak_bytes = 0  # max of live_bytes since the last reset_peak()
        self._seen: WeakIdKeyDictionary = WeakIdKeyDictionary()  # storage -> (bytes, weakref)

    # -- counting ---------------------------------------------------------------------------
    def _free(self, nbytes: int, _ref: weakref.ref) -> None:
        self.live_bytes -= nbytes

    def _new_storages(self, tensors: Iterable[object]) -> list[tuple[torch.UntypedStorage, int]]:
        found: dict[int, tuple[torch.UntypedStorage, int]] = {}
        for tensor in tensors:
            if not isinstance(tensor, torch.Tensor) or tensor.layout != torch.strided:
                continue
            storage = tensor.untyped_storage()
            if storage in self._seen or id(storage) in found:
                continue
            found[id(storage)] = (storage, storage.nbytes())
        return list(found.values())

    def _count(self, storages: list[tuple[torch.UntypedStorage, int]]) -> None:
        for storage, nbytes in storages:
            ref = weakref.ref(storage, lambda r, n=nbytes: self._free(n, r))
            self._seen[storage] = (nbytes, ref)
            self.live_bytes += nbytes
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)

    def track(self, tensors: Iterable[torch.Tensor] | torch.Tensor) -> None:
        """Counts tensors created outside the mode (weights, buffers, loaded optimizer state)."""
        if isinstance(tensors, torch.Tensor):
            tensors = [tensors]
        self._count(self._new_storages(tensors))

    def reset_peak(self) -> None:
        """Starts a new peak window at the current live bytes (e.g. at each training step)."""
        self.peak_bytes = self.live_bytes

    # -- dispatch ---------------------------------------------------------------------------
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        new = self._new_storages(tree_leaves(out))
        if new and self.budget_bytes is not None:
            wanted = self.live_bytes + sum(n for _, n in new)
            if wanted > self.budget_bytes:
                del out, new  # the op's outputs die here, as a failed allocation would leave them
                raise torch.OutOfMemoryError(
                    f"simulated VRAM budget exceeded in {func}: {wanted / 2**20:.1f} MiB live "
                    f"would pass the budget of {self.budget_bytes / 2**20:.1f} MiB (source: tracker)"
                )
        self._count(new)
        return out
