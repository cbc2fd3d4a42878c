"""Frozen layers that keep for the backward only what it reads.

autograd saves, for each op, what any of its input gradients could need. With the weights
frozen some of that is never read, yet stays alive from the forward to the backward:

- ``Conv2d``: the convolution's backward is one formula for input, weight and bias, so its input
  is saved even when only the input's gradient is wanted, which needs the weight alone. In a
  UNet that input is the SiLU output of every ResNet block (twice per block) and, in each
  upsampler, the tensor after the 2x nearest upsampling, four times the block's input.
- diffusers' ``GEGLU`` (the feed-forward of SD 1.x / SDXL transformer blocks): ``h * gelu(g)``
  keeps ``gelu(g)`` beside the projection ``[h, g]`` it came from; it is recomputed from ``g``
  in the backward (one elementwise pass) instead of kept: a third of that block's saved bytes.

Both give the same gradients, bit for bit: the backward calls the kernels autograd would
(``convolution_backward`` for the input only; ``gelu_backward``). A layer is replaced only where
the same result is certain: a plain ``Conv2d`` with zero padding mode whose weight and bias do
not require grad at the call (a trainable one, e.g. an adapter's own convolution, takes torch's
path), and diffusers' own ``GEGLU``. The run and the memory planner's trace apply the same
function, so plans count what the run holds.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


class _FrozenConv2dFn(torch.autograd.Function):
    """conv2d whose weight and bias take no gradient: saves the weight, not the input."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                stride: tuple[int, ...], padding: Any, dilation: tuple[int, ...],
                groups: int) -> torch.Tensor:
        ctx.save_for_backward(weight)
        ctx.conf = (x.shape, x.dtype, stride, padding, dilation, groups)
        return F.conv2d(x, weight, bias, stride, padding, dilation, groups)

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        (weight,) = ctx.saved_tensors
        shape, dtype, stride, padding, dilation, groups = ctx.conf
        # the kernel reads only the input's sizes when just the input's gradient is asked for
        # (torch.nn.grad.conv2d_input passes the same stand-in)
        stand_in = grad_out.new_empty(1, dtype=dtype).expand(shape)
        grad_in = torch.ops.aten.convolution_backward(
            grad_out, stand_in, weight, None, list(stride), list(padding), list(dilation), False,
            [0, 0], groups, (True, False, False))[0]
        return grad_in, None, None, None, None, None, None


class LeanConv2d(nn.Conv2d):
    """``nn.Conv2d`` that does not keep its input for the backward while it is frozen."""

    def _conv_forward(self, input: torch.Tensor, weight: torch.Tensor,
                      bias: torch.Tensor | None) -> torch.Tensor:
        frozen = not weight.requires_grad and (bias is None or not bias.requires_grad)
        if (self.padding_mode != "zeros" or not frozen or not input.requires_grad
                or not torch.is_grad_enabled() or isinstance(self.padding, str)):
            return super()._conv_forward(input, weight, bias)
        return _FrozenConv2dFn.apply(input, weight, bias, self.stride, self.padding, self.dilation,
                                     self.groups)


class _GegluFn(torch.autograd.Function):
    """``h * gelu(g)`` for ``[h, g] = proj`` (split on the last dimension): saves ``proj`` only."""

    @staticmethod
    def forward(ctx: Any, proj: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(proj)
        hidden, gate = proj.chunk(2, dim=-1)
        return hidden * F.gelu(gate)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        (proj,) = ctx.saved_tensors
        hidden, gate = proj.chunk(2, dim=-1)
        # the order autograd's own graph runs: mul's two gradients, then gelu's
        grad_hidden = grad * F.gelu(gate)
        grad_gate = torch.ops.aten.gelu_backward(grad * hidden, gate)
        return torch.cat([grad_hidden, grad_gate], dim=-1)


def _lean_geglu_class() -> type[nn.Module] | None:
    try:
        from diffusers.models.activations import GEGLU
    except ImportError:  # diffusers missing: nothing of its to replace
        return None

    class LeanGEGLU(GEGLU):
        """diffusers' GEGLU that recomputes ``gelu(gate)`` in the backward instead of keeping it."""

        def forward(self, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
            proj = self.proj(hidden_states)
            kernels_here = proj.device.type in ("cpu", "cuda", "meta")  # diffusers' own path elsewhere
            if not proj.requires_grad or not torch.is_grad_enabled() or not kernels_here:
                hidden, gate = proj.chunk(2, dim=-1)
                return hidden * self.gelu(gate)
            return _GegluFn.apply(proj)

    LeanGEGLU.__name__ = LeanGEGLU.__qualname__ = "LeanGEGLU"
    return LeanGEGLU


_LEAN_GEGLU = _lean_geglu_class()


def lean_frozen_layers(module: nn.Module) -> int:
    """Turns every plain ``nn.Conv2d`` and diffusers ``GEGLU`` in ``module`` into its lean
    subclass (same parameters, state dict and output; see the module doc). Returns how many."""
    swaps: list[tuple[type, type]] = [(nn.Conv2d, LeanConv2d)]
    if _LEAN_GEGLU is not None:
        swaps.append((_LEAN_GEGLU.__mro__[1], _LEAN_GEGLU))
    count = 0
    for m in module.modules():
        for plain, lean in swaps:
            if type(m) is plain:  # exact type: a subclass may change what its forward computes
                m.__class__ = lean
                count += 1
    return count
