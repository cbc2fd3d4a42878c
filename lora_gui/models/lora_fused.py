"""LoRA folded into one matmul of the base layer's pass: ``addmm(base(x), A x, B^T, alpha=scale)``
instead of peft's ``base(x) + B(A(x)) * scale``, which makes two full-width temporaries (the
scaled LoRA output and the sum) and their backward (a full-width multiply). Same value and
gradients up to float rounding; the tensors autograd keeps are the same (A's input, ``A x``).

Merged (``merged=True``): the adapter folded into the layer's weight for each pass,
``W' = W + scale * B A`` (out x in x r multiply-adds, small beside the batch's matmul), so the
forward is one matmul ``x W'^T`` and the input's gradient one matmul ``g W'``; the adapter's own
gradients come from ``g B`` and ``x A^T`` (recomputed in the backward, rank-sized). It saves the
forward's rank-r update of the full-width output and the backward's rank-r update of the full-width
input gradient; autograd keeps only the layer's input (which peft's path keeps too, for A's
gradient), and ``W'`` lives only during one matmul (out x in floats; recomputed in the backward).

Only plain LoRA takes the fused path: one active adapter, no dropout, no DoRA or other variant,
no LoRA bias, not merged, the same dtype in the base output and the adapter (or autocast on);
anything else runs peft's own forward, unchanged.
"""

from __future__ import annotations

import types
from typing import Any

import torch
from torch import nn


def _plain(layer: Any, x: torch.Tensor, result: torch.Tensor, args: tuple, kwargs: dict) -> str | None:
    """The adapter's name when the fused path computes exactly what peft would, else None."""
    if args or kwargs or layer.disable_adapters or layer.merged or len(layer.active_adapters) != 1:
        return None
    name = layer.active_adapters[0]
    if name not in layer.lora_A or name in getattr(layer, "lora_variant", {}):
        return None
    if not isinstance(layer.lora_dropout[name], nn.Identity) or layer.lora_B[name].bias is not None:
        return None
    same = x.dtype == result.dtype == layer.lora_A[name].weight.dtype
    return name if same or torch.is_autocast_enabled(x.device.type) else None


class _MergedLinear(torch.autograd.Function):
    """``x (W + scale B A)^T + bias`` with gradients for x, A and B (W and bias frozen)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None,
                a: torch.Tensor, b: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.save_for_backward(x, w, a, b)
        ctx.scale = scale
        return nn.functional.linear(x, torch.addmm(w, b, a, alpha=scale), bias)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        x, w, a, b = ctx.saved_tensors
        g2, x2 = grad.reshape(-1, grad.shape[-1]), x.reshape(-1, x.shape[-1])
        grad_x = None
        if ctx.needs_input_grad[0]:  # one matmul through the merged weight
            grad_x = (g2 @ torch.addmm(w, b, a, alpha=ctx.scale)).view(x.shape)
        gb = g2 @ b  # (N, r): the gradient at A's output, unscaled
        grad_a = torch.mm(gb.t(), x2).mul_(ctx.scale)  # (r, in)
        grad_b = torch.mm(g2.t(), x2 @ a.t()).mul_(ctx.scale)  # (out, r)
        return grad_x, None, None, grad_a, grad_b, None


def _merged_forward(self: Any, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    base = self.base_layer
    if (args or kwargs or self.disable_adapters or self.merged or type(base) is not nn.Linear
            or base.weight.requires_grad or torch.is_autocast_enabled(x.device.type)):
        return _fused_forward(self, x, *args, **kwargs)
    name = _plain(self, x, x, args, kwargs)
    if name is None or x.dtype != base.weight.dtype:
        return _fused_forward(self, x, *args, **kwargs)
    return _MergedLinear.apply(x, base.weight, base.bias, self.lora_A[name].weight,
                               self.lora_B[name].weight, self.scaling[name])


def _fused_forward(self: Any, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    if args or kwargs or self.disable_adapters or self.merged:
        return type(self).forward(self, x, *args, **kwargs)
    result = self.base_layer(x)
    name = _plain(self, x, result, args, kwargs)
    if name is None:  # peft's own path (its base pass again: rare, never in a plain LoRA run)
        return type(self).forward(self, x, *args, **kwargs)
    a = self.lora_A[name].weight  # (r, in)
    b = self.lora_B[name].weight  # (out, r)
    ax = nn.functional.linear(x, a)
    out = torch.addmm(result.reshape(-1, result.shape[-1]), ax.reshape(-1, ax.shape[-1]), b.t(),
                      alpha=self.scaling[name])
    return out.view(result.shape)


def fuse_lora(model: nn.Module, merged: bool = False) -> int:
    """Gives every peft LoRA ``Linear`` of ``model`` the fused forward (``merged``: the adapter
    folded into the weight for each pass); returns how many."""
    from peft.tuners.lora.layer import Linear

    count = 0
    forward = _merged_forward if merged else _fused_forward
    for module in model.modules():
        if type(module) is Linear:
            module.forward = types.MethodType(forward, module)
            count += 1
    return count
