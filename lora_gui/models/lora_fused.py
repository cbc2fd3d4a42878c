"""LoRA folded into one matmul of the base layer's pass: ``addmm(base(x), A x, B^T, alpha=scale)``
instead of peft's ``base(x) + B(A(x)) * scale``, which makes two full-width temporaries (the
scaled LoRA output and the sum) and their backward (a full-width multiply). Same value and
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
    result = self.base_layer(x)
    name = _plain(self, x, result, args, kwargs)
    if name is None:  # peft's own path (its base pass again: rare, never in a plain LoRA run)
        return type(self).forward(self, x, *args, **kwargs)
    a = self.lora_A[name].weight  # (r, in)
    b = self.lora_B[name].weight  # (out, r)
    # as peft's forward casts A's input (under autocast a float32 input becomes the 16-bit copy
    # that lean_backward shares between layers): the same tensors kept as peft's path
    ax = nn.functional.linear(self._cast_input_dtype(x, a.dtype), a)
    out = torch.addmm(result.reshape(-1, result.shape[-1]), ax.reshape(-1, ax.shape[-1]), b.t(),
                      alpha=self.scaling[name])
    return out.view(result.shape)


def fuse_lora(model: nn.Module) -> int:
    """Gives every peft LoRA ``Linear`` of ``model`` the fused forward; returns how many."""
    from peft.tuners.lora.layer import Linear

    count = 0
    for module in model.modules():
        if type(module) is Linear:
            module.forward = types.MethodType(_fused_forward, module)
            count += 1
    return count
