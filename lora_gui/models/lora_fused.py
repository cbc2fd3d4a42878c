"""LoRA folded into one matmul of the base layer's pass: ``base(x).addmm_(A x, B^T, alpha=scale)``
instead of peft's ``base(x) + B(A(x)) * scale``, which makes two full-width temporaries (the
scaled LoRA output and the sum) and their backward (a full-width multiply). The adapter's
product is added into the base layer's own output, in place: no full-width tensor is made or
copied (an out-of-place ``addmm`` copies the base output into a new one first). Same value and
gradients up to float rounding; the tensors autograd keeps are the same (A's input, ``A x``).

Only plain LoRA takes the fused path: one active adapter, no dropout, no DoRA or other variant,
no LoRA bias, not merged, the same dtype in the base output and the adapter (or autocast on);
anything else runs peft's own forward, unchanged.
"""

from __future__ import annotations

import types
from typing import Any

import torch
from torch import nn

from lora_gui.models.cuda_autocast import autocast_dtype


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
    return name if same or autocast_dtype(x.device.type) is not None else None


def _fused_forward(self: Any, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    if args or kwargs or self.disable_adapters or self.merged:
        return type(self).forward(self, x, *args, **kwargs)
    # the base layer on the flattened input: its output is a fresh 2D tensor (not a view) that
    # the adapter's product can be added into in place
    result = self.base_layer(x.reshape(-1, x.shape[-1]))
    name = _plain(self, x, result, args, kwargs)
    if name is None:  # peft's own path (its base pass again: rare, never in a plain LoRA run)
        return type(self).forward(self, x, *args, **kwargs)
    a = self.lora_A[name].weight  # (r, in)
    b = self.lora_B[name].weight  # (out, r)
    # as peft's forward casts A's input (under autocast a float32 input becomes the 16-bit copy
    # that lean_backward shares between layers): the same tensors kept as peft's path
    ax = nn.functional.linear(self._cast_input_dtype(x, a.dtype), a)
    ax = ax.reshape(-1, ax.shape[-1])
    operands = _in_place_operands(self, result, ax, b)
    if operands is not None:
        ax, b = operands
        out = result.addmm_(ax, b.t(), alpha=self.scaling[name])
    else:  # the base output is shared
        out = torch.addmm(result, ax, b.t(), alpha=self.scaling[name])
    return out.view(*x.shape[:-1], out.shape[-1])


def _in_place_operands(layer: Any, result: torch.Tensor, ax: torch.Tensor,
                       b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(A x, B)`` in the base output's dtype when the adapter's product may be added into that
    output in place, else None: the base is a linear layer (whose backward does not read its
    output), the output is a tensor of its own (not a view of another), and no forward hook of the
    base layer was handed it (a hook may keep it and must see the base's values). Under autocast
    the operands are cast as autocast's own ``addmm`` would cast them (an in-place op is not cast)."""
    hooks = layer.base_layer._forward_hooks or nn.modules.module._global_forward_hooks
    if not isinstance(layer.base_layer, nn.Linear) or result._base is not None or hooks \
            or not result.is_contiguous():
        return None
    if ax.dtype == b.dtype == result.dtype:
        return ax, b
    if autocast_dtype(result.device.type) == result.dtype:
        return ax.to(result.dtype), b.to(result.dtype)
    return None


def fuse_lora(model: nn.Module) -> int:
    """Gives every peft LoRA ``Linear`` of ``model`` the fused forward; returns how many."""
    from peft.tuners.lora.layer import Linear

    count = 0
    for module in model.modules():
        if type(module) is Linear:
            module.forward = types.MethodType(_fused_forward, module)
            count += 1
    return count
