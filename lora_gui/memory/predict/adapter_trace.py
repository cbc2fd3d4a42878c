"""What the memory trace needs to run the adapter variants' real peft layers on fake tensors.

Two places where a variant's layer asks its tensors for values, which fake tensors (and a meta
model) do not have; each patch changes no tensor that is allocated, so the trace still counts
exactly what the real step holds (checked against the same step on real tensors in tests).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn


@contextlib.contextmanager
def adapter_always_on(fake: bool) -> Iterator[None]:
    """LoHa / LoKr layers draw ``torch.rand(1)`` each forward to decide module dropout, and
    branch on it: a fake tensor has no value to branch on. Runs only allow module dropout 0,
    so that draw always keeps the adapter on: under fake tensors it is the number 1.0 (its
    comparison with the dropout is then a plain bool; the real draw is 4 bytes, freed at once).
    Only those two peft modules see the change (their own ``torch`` name): every other
    ``torch.rand`` of the process, other threads' included, is untouched."""
    if not fake:
        yield
        return
    from peft.tuners.loha import layer as loha_layer
    from peft.tuners.lokr import layer as lokr_layer

    class _AlwaysOn:
        """torch, except that ``rand(1)`` is 1.0."""

        def __getattr__(self, name: str) -> Any:
            return getattr(torch, name)

        @staticmethod
        def rand(*size: Any, **kwargs: Any) -> Any:
            if size in ((1,), ((1,),)) and not kwargs:
                return 1.0
            return torch.rand(*size, **kwargs)

    modules = (loha_layer, lokr_layer)
    for module in modules:
        module.torch = _AlwaysOn()
    try:
        yield
    finally:
        for module in modules:
            module.torch = torch


@contextlib.contextmanager
def quantized_dora() -> Iterator[None]:
    """DoRA on a quantized base dequantizes each base weight (init: its norm; every forward: the
    norm of W + BA). peft recognises a quantized weight by its class, which the trace's
    materialized parameters do not keep, so here the trace's quantized layers dequantize as
    bitsandbytes would: 4-bit through ``dequantize_4bit`` with the layer's quant state, int8
    through the row scales; on the meta device (init), a meta weight of the layer's shape."""
    from peft.tuners.lora import dora

    real = dora.dequantize_module_weight

    def dequantize(module: nn.Module) -> torch.Tensor:
        weight = getattr(module, "weight", None)
        if weight is None or type(weight).__name__ in ("Params4bit", "Int8Params"):
            return real(module)
        if weight.is_meta and hasattr(module, "out_features"):
            return torch.empty(module.out_features, module.in_features, device="meta")
        import bitsandbytes as bnb

        if getattr(weight, "quant_state", None) is not None:
            return bnb.functional.dequantize_4bit(weight.data, weight.quant_state)
        state = getattr(module, "state", None)
        if state is not None and getattr(state, "SCB", None) is not None:
            return bnb.functional.int8_vectorwise_dequant(weight.data, state.SCB)
        return real(module)

    dora.dequantize_module_weight = dequantize
    try:
        yield
    finally:
        dora.dequantize_module_weight = real
