"""The gated MLP of a decoder layer (Llama, Mistral, Qwen, Gemma ...: ``down(act(gate(x)) *
up(x))``) keeping for the backward only what it reads.

autograd keeps four tensors of the MLP's intermediate width (3.5-4x the hidden size) per token
between a layer's forward and its backward: ``gate`` (the activation's backward reads it),
``act(gate)`` and ``up`` (the product's backward reads each for the other's gradient) and the
product itself, which the ``down_proj`` adapter's ``lora_A`` keeps for its weight gradient. Two
of them are one elementwise pass away from the other two:

- the product is recomputed from ``gate`` and ``up`` when ``lora_A``'s backward asks for it
  (plain LoRA on ``down_proj``; :class:`lora_gui.models.lean_lora._Rebuilt`);
- ``act(gate)`` is recomputed from ``gate`` when the product's backward asks for it, which
  comes next: the one the product's recompute made is handed over.

So an MLP keeps two intermediate-width tensors a token instead of four: in a decoder layer
without checkpointing that is about a third of what it saves (Unsloth's and Liger's fused
SwiGLU keep the same two). The cost is two elementwise passes of the intermediate width in the
backward (the activation and the product; the activation alone without an adapter on
``down_proj``). The ops and their order are torch's own, so the loss and gradients are the same,
bit for bit. A module is changed only where that is certain:
its class's ``forward`` is exactly transformers' gated form and its activation is one torch op
that keeps its own input (SiLU, GELU); not inside a checkpointed layer or a tiled MLP, whose own
saved-tensor hook decides there. The run and the memory planner's trace apply the same function.
"""

from __future__ import annotations

import functools
import inspect
import types
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from lora_gui.models.cuda_autocast import same_autocast
from lora_gui.models.stand_ins import Recompute, Swap, other_hooks_active

_GATED_FORWARD = ["def forward(self, x):",
                  "down_proj = self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))",
                  "return down_proj"]


@functools.cache
def _gated_forward(cls: type) -> bool:
    """True when ``cls.forward`` is transformers' gated MLP, line for line."""
    try:
        source = inspect.getsource(cls.forward)
    except (OSError, TypeError):
        return False
    lines = [line.strip() for line in source.splitlines()]
    return [line for line in lines if line and not line.startswith("#")] == _GATED_FORWARD


def _single_op_activation(act: Any) -> bool:
    """True for an activation that is one torch op keeping its own input (so its input is kept
    anyway and recomputing from it keeps nothing more)."""
    if isinstance(act, nn.SiLU):  # and lora_gui's LeanSiLU, which is plain SiLU on an MLP's gate
        return not act.inplace
    if type(act) is nn.GELU:
        return True
    name = type(act).__name__
    if name == "SiLUActivation":  # transformers' "silu": F.silu
        return True
    if name in ("GELUTanh", "GELUActivation"):  # F.gelu (not the Python formula fallback)
        fn = getattr(act, "act", None)
        return fn is F.gelu or (isinstance(fn, functools.partial) and fn.func is F.gelu)
    return False


class _Recomputed:
    """One MLP's recomputes in the backward: the product ``act(gate) * up`` (read first, by
    ``down_proj``'s adapter) keeps the ``act(gate)`` it made for the product's own backward,
    which reads it next, so the activation runs once (two passes, not three)."""

    __slots__ = ("act", "act_fn")

    def __init__(self, act_fn: Any) -> None:
        self.act_fn = act_fn
        self.act: torch.Tensor | None = None

    def product(self, pair: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        gate, up = pair
        self.act = self.act_fn(gate)
        return self.act * up

    def activation(self, gate: torch.Tensor) -> torch.Tensor:
        act, self.act = self.act, None
        return self.act_fn(gate) if act is None else act


def _lean_mlp_forward(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
    if not torch.is_grad_enabled() or other_hooks_active():
        return self._lean_inner_forward(x)
    gate = self.gate_proj(x)  # the same ops in the same order as transformers' forward
    act = self.act_fn(gate)
    up = self.up_proj(x)
    if not (act.requires_grad or up.requires_grad):
        return self.down_proj(act * up)
    device, recomputed = gate.device.type, _Recomputed(self.act_fn)
    # the product saves act and up; act goes (recomputed from gate, which its backward keeps)
    product = Swap(act, Recompute(same_autocast(recomputed.activation, device), gate)).run(
        torch.mul, act, up)
    del act
    if product.requires_grad and product.is_contiguous():
        # read by the down_proj adapter (lean_lora._Rebuilt): it keeps this, not the product
        product._lean_rebuild = Recompute(same_autocast(recomputed.product, device), (gate, up))
    return self.down_proj(product)


def lean_gated_mlps(module: nn.Module) -> int:
    """Gives every gated MLP of ``module`` (transformers' form, a one-op activation, no forward
    set on the instance by other code) the forward above, around its class's. Returns how many."""
    count = 0
    for m in module.modules():
        if (all(hasattr(m, n) for n in ("gate_proj", "up_proj", "down_proj", "act_fn"))
                and "_lean_inner_forward" not in m.__dict__ and "forward" not in m.__dict__
                and _gated_forward(type(m)) and _single_op_activation(m.act_fn)):
            m._lean_inner_forward = m.forward
            m.forward = types.MethodType(_lean_mlp_forward, m)
            count += 1
    return count
