"""Live tensor-storage bytes, counted by a TorchDispatchMode: the CPU stand-in for the CUDA allocator.

Every tensor that an op returns is looked at once; its storage is counted the first time it is
seen (views share a storage, so they are free) and uncounted by a weakref callback when the
storage dies. This works on real CPU tensors, CUDA tensors and fake tensors alike, which is what
lets the planner trace a training step of an 8B model on a laptop.

Differences from ``torch.cuda.max_memory_allocated``, by design: no 512-byte rounding (the trace
adds it as a named overhead), no allocator caching or fragmentation.

``UntypedStorage.resize_`` is not an op, so no dispatch mode sees it; FSDP2 frees a gathered
layer's weights by resizing their storages to 0 bytes and gathers them again into the same
storages. While a tracker is active, :func:`_tracked_resize` wraps the method and moves a seen
storage's bytes by the change (without it an FSDP run's tracked peak would hold every layer
ever gathered).

Host memory: storages created inside :func:`on_host` (the long-context switches' host copies:
offloaded checkpoints, a host-side embedding table and its looked-up rows) and tensors marked
with :func:`mark_host` are counted apart, in ``host_live_bytes`` / ``host_peak_bytes``, and not
in the device figures: on a CUDA run they live in (pinned) host RAM, not on the card. On a CPU
run host and "device" are the same RAM; the split says which bytes a CUDA run keeps off the card.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Iterable, Iterator

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.weak import WeakIdKeyDictionary

from lora_gui.units import gb

MEMORY_SOURCE = "tracker"
_DEVICE = torch.ops.prim.device.default  # tensor.device asked by C++ code of a fake tensor
_HOST_SCOPE = threading.local()  # depth of nested on_host() blocks, per thread
_HOST_TENSORS: WeakIdKeyDictionary = WeakIdKeyDictionary()  # storage -> True (mark_host)
_ACTIVE: list[StorageTracker] = []  # trackers inside their ``with`` block (resize_ reports to them)
_RESIZE = torch._C.StorageBase.resize_  # the storage method itself (C++)


def _tracked_resize(storage: torch.UntypedStorage, size: int) -> torch.UntypedStorage:
    """``UntypedStorage.resize_`` that tells every active tracker the new size (bytes)."""
    out = _RESIZE(storage, size)
    for tracker in _ACTIVE:
        tracker._resized(storage._cdata, int(size))
    return out


@contextlib.contextmanager
def on_host() -> Iterator[None]:
    """Storages created in this block are host memory (counted apart by every tracker)."""
    _HOST_SCOPE.depth = getattr(_HOST_SCOPE, "depth", 0) + 1
    try:
        yield
    finally:
        _HOST_SCOPE.depth -= 1


def in_host_scope() -> bool:
    return getattr(_HOST_SCOPE, "depth", 0) > 0


def mark_host(tensor: torch.Tensor) -> None:
    """Marks a tensor that lives in host memory (a host-side weight) for :meth:`StorageTracker.track`."""
    _HOST_TENSORS[tensor.untyped_storage()] = True


def is_host_tensor(tensor: torch.Tensor) -> bool:
    return tensor.untyped_storage() in _HOST_TENSORS


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
        self.host_live_bytes = 0  # bytes of host storages alive now (see the module doc)
        self.host_peak_bytes = 0  # max of host_live_bytes since the last reset_peak()
        # storage's C++ address (``_cdata``) -> (bytes, weakref): a plain dict, cheaper per op than a
        # weak-keyed one; the weakref's callback removes the entry when the storage dies, before
        # its address can be reused
        self._seen: dict[int, tuple[int, weakref.ref]] = {}
        self._host_keys: set[int] = set()  # keys of the host storages in _seen

    def __enter__(self) -> StorageTracker:
        _ACTIVE.append(self)
        torch.UntypedStorage.resize_ = _tracked_resize
        return super().__enter__()

    def __exit__(self, *exc: object) -> None:
        if self in _ACTIVE:
            _ACTIVE.remove(self)
        if not _ACTIVE:
            torch.UntypedStorage.resize_ = _RESIZE
        super().__exit__(*exc)

    # -- counting ---------------------------------------------------------------------------
    def _free(self, key: int, nbytes: int) -> None:
        entry = self._seen.pop(key, None)
        self.live_bytes -= entry[0] if entry else nbytes

    def _resized(self, key: int, nbytes: int) -> None:
        """A seen storage resized in place to ``nbytes`` (FSDP's free and re-gather)."""
        entry = self._seen.get(key)
        if entry is None or entry[0] == nbytes:
            return
        self._seen[key] = (nbytes, entry[1])
        if key in self._host_keys:
            self.host_live_bytes += nbytes - entry[0]
            self.host_peak_bytes = max(self.host_peak_bytes, self.host_live_bytes)
            return
        self.live_bytes += nbytes - entry[0]
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)

    def _new_storages(self, tensors: Iterable[object]) -> list[tuple[torch.UntypedStorage, int]]:
        found: dict[int, tuple[torch.UntypedStorage, int]] = {}
        for tensor in tensors:
            if not isinstance(tensor, torch.Tensor) or tensor.layout != torch.strided:
                continue
            storage = tensor.untyped_storage()
            key = storage._cdata
            if key in self._seen or key in found:
                continue
            found[key] = (storage, storage.nbytes())
        return list(found.values())

    def _count(self, storages: list[tuple[torch.UntypedStorage, int]]) -> None:
        for storage, nbytes in storages:
            key = storage._cdata
            ref = weakref.ref(storage, lambda _r, k=key, n=nbytes: self._free(k, n))
            self._seen[key] = (nbytes, ref)
            self.live_bytes += nbytes
        if self.live_bytes > self.peak_bytes:
            self.peak_bytes = self.live_bytes

    def _free_host(self, key: int, nbytes: int) -> None:
        entry = self._seen.pop(key, None)
        self._host_keys.discard(key)
        self.host_live_bytes -= entry[0] if entry else nbytes

    def _count_host(self, storages: list[tuple[torch.UntypedStorage, int]]) -> None:
        for storage, nbytes in storages:
            key = storage._cdata
            ref = weakref.ref(storage, lambda _r, k=key, n=nbytes: self._free_host(k, n))
            self._seen[key] = (nbytes, ref)
            self._host_keys.add(key)
            self.host_live_bytes += nbytes
        self.host_peak_bytes = max(self.host_peak_bytes, self.host_live_bytes)

    def track(self, tensors: Iterable[torch.Tensor] | torch.Tensor) -> None:
        """Counts tensors created outside the mode (weights, buffers, loaded optimizer state);
        those marked with :func:`mark_host` count as host memory."""
        if isinstance(tensors, torch.Tensor):
            tensors = [tensors]
        tensors = list(tensors)
        self._count_host(self._new_storages(t for t in tensors if is_host_tensor(t)))
        self._count(self._new_storages(t for t in tensors if not is_host_tensor(t)))

    def reset_peak(self) -> None:
        """Starts a new peak window at the current live bytes (e.g. at each training step)."""
        self.peak_bytes = self.live_bytes
        self.host_peak_bytes = self.host_live_bytes

    # -- dispatch ---------------------------------------------------------------------------
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return track_op(self, func, types, args, kwargs)


def track_op(self: StorageTracker, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN201 (dispatch API)
    """Runs one op under the tracker ``self`` and counts the storages its outputs bring.

    The per-op path of every trace (an 8B step runs 10^5-10^6 ops through it): ``prim.device``
    (which the autograd engine asks of fake tensors: two thirds of the calls) is answered here as
    the fake mode's own handler answers it, an op that returns no tensor returns at once, and a
    single tensor output skips the pytree walk. A tracker class that never runs under
    ``torch.compile`` may bind this as its ``__torch_dispatch__`` directly (see ``_PhaseTracker``),
    without the per-call wrapper that keeps dynamo out."""
    if func is _DEVICE and len(args) == 1 and isinstance(args[0], FakeTensor):
        return args[0].device  # what the fake mode's own handler answers, without a dispatch
    out = func(*args, **(kwargs or {}))
    if type(out) is torch.Tensor:  # most ops of a real step: one plain tensor (views: a seen storage)
        if out.layout != torch.strided or out.untyped_storage()._cdata in self._seen:
            return out
        new = self._new_storages((out,))
    elif isinstance(out, torch.Tensor):  # a tensor subclass (a trace's fake tensors)
        new = self._new_storages((out,))
    elif isinstance(out, (tuple, list, dict)):
        new = self._new_storages(tree_leaves(out))
    else:  # a device, a number, None: no storage
        return out
    if new and in_host_scope():  # host memory: outside the device budget and peak
        self._count_host(new)
        return out
    if new and self.budget_bytes is not None:
        wanted = self.live_bytes + sum(n for _, n in new)
        if wanted > self.budget_bytes:
            del out, new  # the op's outputs die here, as a failed allocation would leave them
            raise torch.OutOfMemoryError(
                f"simulated VRAM budget exceeded in {func}: {gb(wanted)} live "
                f"would pass the budget of {gb(self.budget_bytes)} (source: tracker)"
            )
    self._count(new)
    return out
