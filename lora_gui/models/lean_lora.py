"""peft's LoRA ``Linear`` layers (and QLoRA's) that keep their 16-bit input for the backward, not
the float32 copies their adapters make of it (part of ``lean_backward``: see
:mod:`lora_gui.models.lean_backward` for what is kept and why).

peft keeps adapters in float32 over 16-bit frozen weights, so each adapter casts the layer's input
to float32 and ``lora_A`` keeps that copy: q, k and v keep three float32 copies of one 16-bit
tensor. Here the 16-bit input is kept instead, once for every adapter that reads it, and the copy
is recomputed (one cast) in the backward. Under autocast (a GPU run's mixed precision) peft's cast
is skipped and ``lora_A`` reads the input itself (the same values: the round trip is exact), or,
for a float32 input, the adapters share the first 16-bit copy any of them kept. An input marked as
rebuilt (:func:`~lora_gui.models.stand_ins.rebuilt_from`: a norm's output, the gated MLP's
product) is kept as that recompute instead. Not for other adapter variants (DoRA, ...) nor with
LoRA dropout (its mask would be drawn in another dtype).
"""

from __future__ import annotations

import sys
import types
from typing import Any

import torch
from torch import nn
from torch.autograd.graph import saved_tensors_hooks
from torch.utils.weak import WeakIdKeyDictionary

from lora_gui.models.cuda_autocast import autocast_dtype
from lora_gui.models.stand_ins import Recompute, other_hooks_active, unpack


class _Casts:
    """Pack hook for one peft LoRA layer's forward: what the layer's adapter saves of its float32
    copy of the input (``lora_A``'s matmul input) leaves as a recompute of that copy from the
    input itself, which is shared by every adapter reading the same tensor."""

    __slots__ = ("made",)

    def __init__(self) -> None:
        self.made: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # id(copy) -> (copy, input)

    def cast(self, layer: nn.Module, x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        out = type(layer)._cast_input_dtype(layer, x, dtype)
        if out is not None and out is not x:
            self.made[id(out)] = (out, x)
        return out

    def pack(self, t: torch.Tensor) -> object:
        base = t if t._base is None else t._base  # the matmul saves a 2D view of the copy
        made = self.made.get(id(base))
        if made is None or made[0] is not base:
            return t
        # the copy's source, or how the source itself is rebuilt when nothing else keeps it
        return Recompute(_CastView(t, base.dtype), getattr(made[1], "_lean_rebuild", None) or made[1])


class _CastView:
    """Recomputes a saved view of ``x.to(dtype)``: the same values, sizes and strides.
    ``origin``: where ``x`` starts in the view's storage (x itself may be a view)."""

    __slots__ = ("dtype", "offset", "shape", "stride")

    def __init__(self, view: torch.Tensor, dtype: torch.dtype, origin: int = 0) -> None:
        self.shape, self.stride, self.offset = view.shape, view.stride(), view.storage_offset() - origin
        self.dtype = dtype

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        y = x.to(self.dtype)
        return y.as_strided(self.shape, self.stride, y.storage_offset() + self.offset)


class _Rebuilt:
    """Pack hook for one LoRA layer's forward whose input ``x`` carries ``_lean_rebuild`` (a
    recompute of ``x`` from tensors the graph keeps anyway: the gated MLP's product): what the
    adapter saves of ``x`` itself (``lora_A``'s input, or a 2D view of it) leaves as that
    recompute, so ``x`` is freed once the layer has run."""

    __slots__ = ("x",)

    def __init__(self, x: torch.Tensor) -> None:
        self.x: torch.Tensor | None = x

    def pack(self, t: torch.Tensor) -> object:
        x = self.x
        if x is None:
            return t
        if t is x or t._base is x:
            return Recompute(_CastView(t, t.dtype), x._lean_rebuild)
        if _window_of(t, x):  # x is itself a view (an attention output's part): t a view of it
            return Recompute(_CastView(t, t.dtype, origin=x.storage_offset()), x._lean_rebuild)
        return t

    def run(self, inner: Any, x: torch.Tensor, args: tuple, kwargs: dict) -> torch.Tensor:
        """``inner(x, *args, **kwargs)`` with this pack hook when ``x`` can be rebuilt."""
        if getattr(x, "_lean_rebuild", None) is None:
            return inner(x, *args, **kwargs)
        try:
            with saved_tensors_hooks(self.pack, unpack):
                return inner(x, *args, **kwargs)
        finally:
            self.x = None  # autograd keeps the pack hook: it must not keep x


def _window_of(t: torch.Tensor, x: torch.Tensor) -> bool:
    """``t`` is a contiguous view of the memory of the contiguous tensor ``x``, within it."""
    if t._base is None or x._base is not t._base or not (t.is_contiguous() and x.is_contiguous()):
        return False
    start, end = x.storage_offset(), x.storage_offset() + x.numel()
    return start <= t.storage_offset() and t.storage_offset() + t.numel() <= end


def _no_cast(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return t


class _SharedCasts:
    """Pack hook for one peft LoRA layer's forward under autocast when its input ``x`` is float32
    (a float32 norm's output under CUDA's autocast, read by q, k and v): each adapter still casts
    ``x`` to 16 bits itself, as autocast would (the same graph, the same gradients), but what
    ``lora_A`` keeps of its copy is the first copy of ``x`` any layer kept: the values are equal,
    so one copy is kept where autocast keeps one per adapter; none where ``x`` is a norm's output
    rebuilt from the norm's input (:func:`~lora_gui.models.stand_ins.rebuilt_from`)."""

    __slots__ = ("dtype", "made", "x")

    def __init__(self, x: torch.Tensor, dtype: torch.dtype) -> None:
        self.x: torch.Tensor | None = x
        self.dtype = dtype
        self.made: dict[int, torch.Tensor] = {}  # id -> this layer's own copies of x

    def cast(self, t: torch.Tensor, _adapter_dtype: torch.dtype) -> torch.Tensor:
        copy = t.to(self.dtype)  # what autocast makes for lora_A
        if t is self.x:
            self.made[id(copy)] = copy
        return copy

    def pack(self, t: torch.Tensor) -> object:
        base = t if t._base is None else t._base  # the matmul may save a 2D view of the copy
        if self.made.get(id(base)) is not base or self.x is None:
            return t
        rebuild = getattr(self.x, "_lean_rebuild", None)
        if rebuild is not None:  # a norm's output: the copy is recomputed from the norm's input
            return Recompute(_CastView(t, self.dtype), rebuild)
        first = _FIRST_COPIES.get(self.x)
        if first is None or first.shape != base.shape or first.stride() != base.stride():
            _FIRST_COPIES[self.x] = base  # this one is kept: later layers keep it too
            return t
        return first if t is base else first.as_strided(t.shape, t.stride(), t.storage_offset())


_FIRST_COPIES = WeakIdKeyDictionary()  # a float32 input -> the 16-bit copy of it a LoRA layer kept


def _lean_lora_forward(self: nn.Module, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    inner = self._lean_inner_forward
    if not torch.is_grad_enabled() or self.disable_adapters or self.merged or self.lora_variant:
        return inner(x, *args, **kwargs)
    cast = autocast_dtype(x.device.type)
    if cast is not None:  # a GPU run's mixed precision
        return _lora_under_autocast(self, inner, x, cast, args, kwargs)
    if other_hooks_active():
        return inner(x, *args, **kwargs)  # checkpointing decides
    if all(a.weight.dtype == x.dtype for a in self.lora_A.values()):
        return _Rebuilt(x).run(inner, x, args, kwargs)  # nothing is cast: lora_A keeps x itself
    casts = _Casts()
    self._cast_input_dtype = lambda t, dtype: casts.cast(self, t, dtype)
    try:
        with saved_tensors_hooks(casts.pack, unpack):
            return inner(x, *args, **kwargs)
    finally:
        del self._cast_input_dtype  # the class's own method again
        casts.made.clear()  # autograd keeps the pack hook: it must not keep the copies


def _lora_under_autocast(self: nn.Module, inner: Any, x: torch.Tensor, cast: torch.dtype, args: tuple,
                         kwargs: dict) -> torch.Tensor:
    plain = all(isinstance(d, nn.Identity) for d in self.lora_dropout.values())
    if not plain:  # a dropout mask would be drawn in another dtype
        return inner(x, *args, **kwargs)
    if x.dtype == cast:
        # autocast casts peft's float32 copy straight back to x's dtype for lora_A (the same
        # values: the round trip is exact) and keeps that second copy: lora_A reads x itself
        self._cast_input_dtype = _no_cast
        try:
            return _Rebuilt(x).run(inner, x, args, kwargs) if not other_hooks_active() else inner(
                x, *args, **kwargs)
        finally:
            del self._cast_input_dtype
    if x.dtype != torch.float32 or other_hooks_active():
        return inner(x, *args, **kwargs)
    shared = _SharedCasts(x, cast)
    self._cast_input_dtype = shared.cast
    try:
        with saved_tensors_hooks(shared.pack, unpack):
            return inner(x, *args, **kwargs)
    finally:
        del self._cast_input_dtype
        shared.made.clear()  # autograd keeps the pack hook: it must not keep the copies or x
        shared.x = None


def _lora_linear_types() -> tuple[type, ...]:
    """peft's LoRA ``Linear`` and its bitsandbytes (QLoRA) forms, whose adapters read their input
    the same way (``_cast_input_dtype``, then ``lora_A``)."""
    try:
        from peft.tuners.lora.layer import Linear
    except ImportError:
        return ()
    bnb = sys.modules.get("peft.tuners.lora.bnb")  # not imported: no QLoRA layer exists
    return (Linear, *(getattr(bnb, n) for n in ("Linear4bit", "Linear8bitLt") if hasattr(bnb, n)))


def lean_lora_layers(module: nn.Module) -> int:
    """Gives every plain peft LoRA ``Linear`` (and QLoRA's) the forward above, around whatever
    forward it has (peft's, or the fused one). Returns how many."""
    types_ = _lora_linear_types()
    count = 0
    for m in module.modules():
        if type(m) in types_ and "_lean_inner_forward" not in m.__dict__:
            m._lean_inner_forward = m.forward  # bound: the class's or an instance override
            m.forward = types.MethodType(_lean_lora_forward, m)
            count += 1
    return count
