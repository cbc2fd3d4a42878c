"""Frozen layers that keep for the backward only what it reads.

autograd saves, for each op, what any of its input gradients could need. With the weights
frozen some of that is never read, yet stays alive from the forward to the backward:

- ``Conv2d``: the convolution's backward is one formula for input, weight and bias, so its input
  is saved even when only the input's gradient is wanted, which needs the weight alone. In a
  UNet that input is the SiLU output of every ResNet block (twice per block) and, in each
  upsampler, the tensor after the 2x nearest upsampling, four times the block's input.
- ``GroupNorm`` then ``SiLU`` (twice in every ResNet block, and before the UNet's last
  convolution): the SiLU keeps the normalised tensor although the norm keeps its own input, from
  which the backward recomputes it (one normalisation pass) instead.
- diffusers' ``GEGLU`` (the feed-forward of SD 1.x / SDXL transformer blocks): ``h * gelu(g)``
  keeps ``gelu(g)`` beside the projection ``[h, g]`` it came from; it is recomputed from ``g``
  in the backward (one elementwise pass) instead of kept: a third of that block's saved bytes.

Each runs torch's own ops and backward: a saved-tensor hook swaps what the op saves for a
stand-in (the convolution's input: its sizes only, all its backward reads for the input's
gradient, as ``torch.nn.grad.conv2d_input`` does; the norm's output and ``gelu(g)``: recomputed
when the backward asks), so the gradients are the same, bit for bit. A hook costs less than a
custom autograd Function (about 20 against 50-70 microseconds a layer here). A layer is changed
only where the result is certain: a plain ``Conv2d`` with zero padding mode whose weight and
bias do not require grad at the call (a trainable one, e.g. an adapter's own convolution, keeps
torch's path), a plain ``SiLU`` reading a plain ``GroupNorm``'s output, and diffusers' own
``GEGLU``; and not inside a checkpointed block (another saved-tensor hook decides there). The
run and the memory planner's trace apply the same function, so plans count what the run holds.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.graph import saved_tensors_hooks


class _Sizes:
    """Stands in for a saved tensor whose values the backward never reads."""

    __slots__ = ("device", "dtype", "shape")

    def __init__(self, t: torch.Tensor) -> None:
        self.shape, self.dtype, self.device = t.shape, t.dtype, t.device


class _Recompute:
    """Stands in for a saved tensor that the backward recomputes: ``fn(arg)``."""

    __slots__ = ("arg", "fn")

    def __init__(self, fn: Any, arg: torch.Tensor) -> None:
        self.fn, self.arg = fn, arg


class _Swap:
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
            with saved_tensors_hooks(self.pack, _unpack):
                return op(*args)
        finally:
            self.target = None


def _other_hooks_active() -> bool:
    """True inside another saved-tensor hook (non-reentrant checkpointing, offloading): that one
    decides what is kept there, and a stand-in holding the norm's input or the projection would
    keep alive what a checkpointed block lets go. Unknown (no such torch API): True."""
    top = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)
    return top is None or top(False) is not None


def _unpack(saved: object) -> torch.Tensor:
    if type(saved) is _Sizes:  # an expanded 1-element tensor: the sizes, no storage of that size
        return torch.empty(1, dtype=saved.dtype, device=saved.device).expand(saved.shape)
    if type(saved) is _Recompute:
        return saved.fn(saved.arg)
    return saved  # type: ignore[return-value]


class LeanConv2d(nn.Conv2d):
    """``nn.Conv2d`` that does not keep its input for the backward while it is frozen."""

    def _conv_forward(self, input: torch.Tensor, weight: torch.Tensor,
                      bias: torch.Tensor | None) -> torch.Tensor:
        frozen = not weight.requires_grad and (bias is None or not bias.requires_grad)
        if (self.padding_mode != "zeros" or not frozen or not input.requires_grad
                or not torch.is_grad_enabled() or _other_hooks_active()):
            return super()._conv_forward(input, weight, bias)
        return _Swap(input, _Sizes(input)).run(F.conv2d, input, weight, bias, self.stride, self.padding,
                                                self.dilation, self.groups)


class LeanGroupNorm(nn.GroupNorm):
    """``nn.GroupNorm`` whose output, when a :class:`LeanSiLU` reads it next, is recomputed
    from the input in the backward instead of kept (the norm keeps its input anyway)."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        out = F.group_norm(input, self.num_groups, self.weight, self.bias, self.eps)
        if out.requires_grad:
            out._lean_norm = (self, input)  # read by LeanSiLU; dies with the output
        return out

    def recompute(self, input: torch.Tensor) -> torch.Tensor:
        return F.group_norm(input, self.num_groups, self.weight, self.bias, self.eps)


class LeanSiLU(nn.SiLU):
    """``nn.SiLU`` that keeps a :class:`LeanGroupNorm` output it reads as a recompute, not a
    tensor: a UNet ResNet block's two normalised activations (one elementwise pass each)."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        norm = getattr(input, "_lean_norm", None)
        if norm is None or self.inplace or not torch.is_grad_enabled() or _other_hooks_active():
            return F.silu(input, inplace=self.inplace)
        module, source = norm
        return _Swap(input, _Recompute(module.recompute, source)).run(F.silu, input)


def _lean_geglu_class() -> type[nn.Module] | None:
    try:
        from diffusers.models.activations import GEGLU
    except ImportError:  # diffusers missing: nothing of its to replace
        return None

    class LeanGEGLU(GEGLU):
        """diffusers' GEGLU that recomputes ``gelu(gate)`` in the backward instead of keeping it."""

        def forward(self, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
            proj = self.proj(hidden_states)
            hidden, gate = proj.chunk(2, dim=-1)
            kernels_here = proj.device.type in ("cpu", "cuda", "meta")  # diffusers' own path elsewhere
            if (not hidden.requires_grad or not torch.is_grad_enabled() or not kernels_here
                    or _other_hooks_active()):
                return hidden * self.gelu(gate)
            act = F.gelu(gate)
            # the product saves hidden and act; act goes, gate stays (gelu's backward keeps it)
            return _Swap(act, _Recompute(F.gelu, gate)).run(torch.mul, hidden, act)

    LeanGEGLU.__name__ = LeanGEGLU.__qualname__ = "LeanGEGLU"
    return LeanGEGLU


_LEAN_GEGLU = _lean_geglu_class()


def lean_frozen_layers(module: nn.Module) -> int:
    """Turns every plain ``nn.Conv2d``, ``nn.GroupNorm``, ``nn.SiLU`` and diffusers ``GEGLU`` in
    ``module`` into its lean subclass (same parameters, state dict and output; see the module
    doc). Returns how many."""
    swaps: list[tuple[type, type]] = [(nn.Conv2d, LeanConv2d), (nn.GroupNorm, LeanGroupNorm),
                                      (nn.SiLU, LeanSiLU)]
    if _LEAN_GEGLU is not None:
        swaps.append((_LEAN_GEGLU.__mro__[1], _LEAN_GEGLU))
    count = 0
    for m in module.modules():
        for plain, lean in swaps:
            if type(m) is plain:  # exact type: a subclass may change what its forward computes
                m.__class__ = lean
                count += 1
    return count
