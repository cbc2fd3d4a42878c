"""Stand-ins for saved tensors: what an op's saved-tensor pack hook keeps instead of a tensor
whose values the backward can get another way (its sizes alone, or a recompute from tensors the
graph keeps anyway), and the unpack hook that turns them back into tensors
(:mod:`lora_gui.models.lean_backward`, :mod:`lora_gui.models.lean_mlp`,
:mod:`lora_gui.models.lean_attention`); and :func:`rebuilt_from`, which marks a tensor the LoRA
layers that read it keep as a recompute."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import Any

import torch
from torch.autograd.graph import saved_tensors_hooks

from lora_gui.models.cuda_autocast import same_autocast

# the narrowest model (features a token) whose tensors a recompute stands in for where the
# recompute is a choice (a norm's output rebuilt for the LoRA layers that read it, an attention
# kernel's query and key). A recompute costs one elementwise pass a feature plus fixed per-op
# overheads, the block's matmuls cost about width x width a token, so the recompute's share of a
# step falls with the width: the bundled 64-wide SD3-shaped model ran 1.17x slower for 12% fewer
# bytes at 4 x 64 px, 256-wide SD3.5- and Flux-shaped ones 1.04x for 8% (bench/speed/norm_rebuild.py);
# models people train are 320-3,072 wide (the bundled text model 256).
# A property of the model, not of the tensor's size, so a step's bytes stay linear in its pixels,
# batch and tokens (the calibrated image estimates rely on it).
MIN_REBUILD_WIDTH = 256


def worth_rebuilding(width: int) -> bool:
    """A recompute is worth its cost in a model ``width`` features a token wide
    (:data:`MIN_REBUILD_WIDTH`)."""
    return width >= MIN_REBUILD_WIDTH


class Sizes:
    """Stands in for a saved tensor whose values the backward never reads."""

    __slots__ = ("device", "dtype", "shape")

    def __init__(self, t: torch.Tensor) -> None:
        self.shape, self.dtype, self.device = t.shape, t.dtype, t.device


class Recompute:
    """Stands in for a saved tensor that the backward recomputes: ``fn(arg)``."""

    __slots__ = ("arg", "fn")

    def __init__(self, fn: Any, arg: torch.Tensor) -> None:
        self.fn, self.arg = fn, arg


class Swap:
    """Pack hook: ``target`` (by identity) leaves as ``stand_in``; anything else is kept.

    autograd keeps each saved tensor's pack hook beside its unpack hook until the backward, so
    :meth:`run` drops the reference to ``target`` once the op has saved what it saves."""

    __slots__ = ("stand_in", "target")

    def __init__(self, target: torch.Tensor, stand_in: object) -> None:
        self.target: torch.Tensor | None = target
        self.stand_in = stand_in

    def pack(self, t: torch.Tensor) -> object:
        return self.stand_in if t is self.target else t

    def run(self, op: Any, *args: Any) -> torch.Tensor:
        """``op(*args)`` with this pack hook; ``target`` is let go afterwards."""
        try:
            with saved_tensors_hooks(self.pack, unpack):
                return op(*args)
        finally:
            self.target = None


def other_hooks_active() -> bool:
    """True inside another saved-tensor hook (non-reentrant checkpointing, offloading): that one
    decides what is kept there, and a stand-in holding the norm's input or the projection would
    keep alive what a checkpointed block lets go. Unknown (no such torch API): True."""
    top = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)
    return top is None or top(False) is not None


def unpack(saved: object) -> torch.Tensor:
    if type(saved) is Sizes:  # an expanded 1-element tensor: the sizes, no storage of that size
        return torch.empty(1, dtype=saved.dtype, device=saved.device).expand(saved.shape)
    if type(saved) is Recompute:  # its argument may be a recompute too (a rebuilt input's view)
        return saved.fn(unpack(saved.arg) if type(saved.arg) is Recompute else saved.arg)
    return saved  # type: ignore[return-value]


class ReadOnce:
    """A tensor recomputed for the LoRA layers that read it (a norm's output: q, k and v read one
    norm's, gate and up the other's; an activation; an attention output's part): made at the
    first read and handed to the others. The
    recompute is held by what autograd saved for those layers, so it goes when the last of
    them has run its backward."""

    __slots__ = ("fn", "out")

    def __init__(self, fn: Any) -> None:
        self.fn = fn
        self.out: torch.Tensor | None = None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.out is None:
            with torch.no_grad():
                self.out = self.fn(x)
        return self.out


# whether rebuilds are made in this context: always in a run; a plan that must not lean on them
# (their saving is not yet confirmed on a card) traces the step without them
_REBUILDS = contextvars.ContextVar("lora_gui_rebuilds", default=True)


@contextlib.contextmanager
def rebuilds_made(on: bool) -> Iterator[None]:
    """Within the block (this thread only), :func:`rebuilt_from` marks nothing when ``on`` is
    False: the step keeps what it would keep without the rebuilds. The planner traces with it
    to leave a margin for savings no card has confirmed yet."""
    token = _REBUILDS.set(on)
    try:
        yield
    finally:
        _REBUILDS.reset(token)


def rebuilt_from(out: object, x: torch.Tensor, fn: Any) -> None:
    """Marks a norm's (or an activation's) output ``out`` as rebuilt from its input ``x`` by
    ``fn`` for the LoRA layers that read it (``lean_backward``'s ``_Rebuilt``, ``_Casts``,
    ``_SharedCasts``): they keep ``x``, which the norm's (the activation's) own backward
    keeps anyway when ``x`` requires grad, and the output is recomputed from it once for all of
    them, under the forward's autocast. Not in models narrower than
    :data:`MIN_REBUILD_WIDTH`: there the recompute costs more than it saves."""
    if (isinstance(out, torch.Tensor) and out is not x and out.requires_grad and x.requires_grad
            and out.is_contiguous() and worth_rebuilding(out.shape[-1]) and torch.is_grad_enabled()
            and not other_hooks_active() and _REBUILDS.get()):
        out._lean_rebuild = Recompute(ReadOnce(same_autocast(fn, x.device.type)), x)
