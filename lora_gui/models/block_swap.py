"""Block swap for video transformers (Wan, LTX-Video): the frozen base weights of the last N
transformer blocks stay in host memory (pinned when a GPU is present) and are copied to the
device only while their block runs, as musubi-tuner's ``blocks_to_swap`` does. The LoRA weights
(and their gradients and optimizer state) stay on the device. Same loss and gradients as without.

How a swapped block runs (:func:`_swapped_forward`):

- forward: every frozen parameter and buffer of the block is copied to the device, the block's
  own ``forward`` runs on those copies (each module's parameter slot points at the copy for the
  duration of the call), and the copies are released when it returns;
- without gradient checkpointing, autograd would keep the copies it saves for the backward (a
  linear layer saves its weight) until the backward, which would undo the saving: a saved-tensor
  hook packs every saved view of a copy as a reference to the host weight and the backward
  unpacks it into a fresh device copy, freed when that backward op is done;
- with gradient checkpointing (non-reentrant, the block is the checkpointed unit), the forward
  saves nothing inside the block and the backward's recompute runs this same forward again: the
  block's copies are made again and live until the recomputed graph's backward has used them;
  a block ``checkpoint_layers`` leaves unchecked runs as without checkpointing (the hook above).

So the device holds at most about one swapped block's weights at a time (copies are made on the
current CUDA stream, in order: no prefetch of the next block yet). On a CPU the same code runs:
the host weights are marked (:func:`lora_gui.memory.runtime.tracker.mark_host`), the "device"
copies are real copies, so the tracker's device figure and host figure show what a CUDA run keeps
where; the planner's trace runs this code on fake tensors and counts the same bytes.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from lora_gui.memory.runtime.tracker import mark_host
from lora_gui.models.errors import ModelError

BLOCK_LISTS = ("blocks", "transformer_blocks")  # Wan's and LTX-Video's ModuleList of blocks


@dataclass
class _Swap:
    """One swapped block: its host tensors as (module, slot dict name, key)."""

    base: nn.Module  # the transformer (its ``gradient_checkpointing`` says how the block runs)
    slots: list[tuple[nn.Module, str, str]] = field(default_factory=list)
    pin: bool = False


def transformer_blocks(model: nn.Module) -> list[nn.Module]:
    """The video transformer's blocks, in order (``model`` may be a peft wrapper).

    Raises:
        ModelError: the model has no block list (not a Wan / LTX-Video transformer).
    """
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    for name in BLOCK_LISTS:
        blocks = getattr(base, name, None)
        if isinstance(blocks, nn.ModuleList):
            return list(blocks)
    raise ModelError(f"blocks_to_swap: {type(base).__name__} has no transformer blocks to swap "
                     "(block swap is for Wan and LTX-Video transformers)")


def check_blocks_to_swap(n: int, total: int) -> None:
    """Refuses a ``blocks_to_swap`` outside 0..``total`` (the model's block count), naming both.

    Raises:
        ModelError: n < 0 or n > total.
    """
    if not 0 <= n <= total:
        raise ModelError(f"blocks_to_swap: {n} is not possible for this model, which has {total} "
                         f"transformer blocks; set 0 (off) up to {total}")


def _host_copy(t: torch.Tensor, pin: bool) -> torch.Tensor:
    out = t.detach().to("cpu")
    return out.pin_memory() if pin else out


def _device_copy(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A new device tensor with ``host``'s values (a real copy on a CPU too, as a GPU run makes one)."""
    out = torch.empty(host.shape, dtype=host.dtype, device=device)
    out.copy_(host, non_blocking=device.type == "cuda")  # pinned source: ordered on the current stream
    return out


def _slot_dicts(module: nn.Module) -> tuple[tuple[str, dict], ...]:
    return (("_parameters", module._parameters), ("_buffers", module._buffers))


def _host_apply(self: nn.Module, fn: Callable, recurse: bool = True) -> nn.Module:
    """``Module._apply`` that leaves this module's host tensors on the host: moves skip them,
    dtype casts apply (the cast copy is kept on the host and marked again)."""
    held = {(kind, key): getattr(self, kind)[key] for kind, key in self._swap_host_slots}
    for kind, key in held:
        getattr(self, kind)[key] = None  # Module._apply skips empty slots
    try:
        type(self)._apply(self, fn, recurse)
    finally:
        for (kind, key), t in held.items():
            getattr(self, kind)[key] = t
    for t in held.values():
        probe = fn(torch.empty(0, dtype=t.dtype, device=t.device))
        if probe.dtype != t.dtype:
            t.data = _host_copy(t.data.to(probe.dtype), self._swap_pin)
            mark_host(t)
    return self


def _input_device(args: tuple, kwargs: dict) -> torch.device:
    for value in (*args, *kwargs.values()):
        if torch.is_tensor(value):
            return value.device
    raise ModelError("blocks_to_swap: a swapped block was called without a tensor input")


def _swapped_forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
    """The block's own forward on device copies of its host weights (see the module doc)."""
    swap: _Swap = self._block_swap
    device = _input_device(args, kwargs)
    hosts = {}  # storage key of a device copy -> its host tensor (the copies live through the call)
    originals = []
    try:
        for module, kind, key in swap.slots:
            slot = getattr(module, kind)
            host = slot[key]
            copy = _device_copy(host, device)
            hosts[copy.untyped_storage()._cdata] = host
            originals.append((slot, key, host))
            slot[key] = copy  # the forward reads the copy
            del copy
        # recomputed in the backward: checkpointing on and this block among the first
        # checkpoint_layers (lora_gui.models.checkpointing marks each block)
        checkpointed = bool(getattr(swap.base, "gradient_checkpointing", False)) \
            and getattr(self, "_checkpointed", True)
        if not torch.is_grad_enabled() or checkpointed:  # nothing saved here outlives the call
            return type(self).forward(self, *args, **kwargs)

        def pack(t: torch.Tensor) -> Any:
            host = hosts.get(t.untyped_storage()._cdata) if t.layout == torch.strided else None
            if host is None:
                return ("kept", t)
            return ("host", host, t.size(), t.stride(), t.storage_offset(), device)

        with torch.autograd.graph.saved_tensors_hooks(pack, _unpack):
            return type(self).forward(self, *args, **kwargs)
    finally:
        for slot, key, value in originals:
            slot[key] = value  # the copies die here unless autograd saved them


def _unpack(packed: Any) -> torch.Tensor:
    if packed[0] == "kept":
        return packed[1]
    _, host, size, stride, offset, device = packed
    return _device_copy(host, device).as_strided(size, stride, offset)


def enable_block_swap(model: nn.Module, n: int, *, pin: bool = False) -> list[torch.Tensor]:
    """Keeps the frozen weights of the last ``n`` transformer blocks in host memory (see the
    module doc); later ``model.to(device)`` calls leave them there. ``pin``: page-locked host
    memory (a GPU run: faster copies). Call after LoRA is attached.

    Returns:
        The host tensors (each swapped block's frozen parameters and buffers).

    Raises:
        ModelError: ``n`` outside 0..the model's block count, or no block list.
    """
    blocks = transformer_blocks(model)
    check_blocks_to_swap(n, len(blocks))
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    host: list[torch.Tensor] = []
    for block in blocks[len(blocks) - n:]:
        swap = _Swap(base, pin=pin)
        for module in block.modules():
            slots = []
            for kind, slot in _slot_dicts(module):
                for key, t in slot.items():
                    if t is None or t.requires_grad:
                        continue  # LoRA weights stay on the device
                    if t.device.type != "cpu" or pin:
                        t.data = _host_copy(t.data, pin)
                    mark_host(t)
                    host.append(t)
                    slots.append((kind, key))
                    swap.slots.append((module, kind, key))
            if slots:
                module._swap_host_slots = slots
                module._swap_pin = pin
                module._apply = types.MethodType(_host_apply, module)
        block._block_swap = swap
        block.forward = types.MethodType(_swapped_forward, block)
    return host


def swapped_bytes(model: nn.Module, n: int) -> int:
    """Bytes of the frozen weights of the last ``n`` blocks (what block swap keeps on the host)."""
    blocks = transformer_blocks(model)
    seen: dict[int, int] = {}
    for block in blocks[len(blocks) - n:] if n else []:
        for t in (*block.parameters(), *block.buffers()):
            if not t.requires_grad:
                seen[id(t.untyped_storage())] = t.untyped_storage().nbytes()
    return sum(seen.values())
