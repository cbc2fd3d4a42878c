"""FSDP loading on the main process only: no other process ever holds the whole base model.

The main process loads (and quantizes) the base as a single run does; every other process builds
the same modules on the meta device (:mod:`lora_gui.models.skeleton`: no memory for weights) from
a small description the main process broadcasts (the 4-bit layers' packed shapes and quantization
state). After FSDP has sharded the model on every process (``fully_shard`` is local: the main
process keeps its shard of the real weights, the others shards of nothing), the others allocate
their shards (``to_empty``) and the main process broadcasts each frozen tensor in turn; each
process copies its own rows (``torch.chunk`` along dim 0, FSDP2's layout). Buffers (rotary
frequencies) and the LoRA weights are broadcast whole.

Host memory while loading: the main process one full copy (as a single run) plus its shards; any
other process its shards plus the largest single tensor in flight (the broadcast buffer) -- not
the whole model. accelerate's ``cpu_ram_efficient_loading`` does the same for plain weights but
skips a model with 4-bit parameters (accelerate 1.15, ``fsdp2_prepare_model``), hence this.

Checked with 2 gloo processes on a CPU (tests/engine/test_multiprocess_nf4.py). On GPUs the same
steps run around accelerate's FSDP plugin (the main process loads onto its card; the others are
not moved to theirs before sharding); that path has not run on several GPUs yet.

A LoRA initialisation that reads the base weights (EVA, CorDA, PiSSA, OLoRA, LoftQ) runs on the
main process alone, which holds them; the others attach the adapter with peft's default init on
their skeleton. The broadcast after sharding then carries the main process's initialised LoRA
weights and, for the inits that leave a residual in the base (PiSSA, OLoRA, CorDA: full-precision
bases only, the settings refuse them on a 4-bit one), its modified base weights.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as tdist
from torch import nn

from lora_gui.engine.core.distributed import Dist
from lora_gui.engine.core.fsdp import fsdp_requested

DEBUG_WEIGHTS_ENV = "LORA_GUI_DEBUG_WEIGHTS"  # test hook "1": each process writes its weights at step 1


def main_loads_only(dist: Dist) -> bool:
    """An FSDP run of several processes: the main process loads, the others receive shards."""
    return dist.active and fsdp_requested()


def offload_requested() -> bool:
    """The accelerate FSDP config's ``fsdp_offload_params``: the shards live in host memory."""
    return os.environ.get("FSDP_OFFLOAD_PARAMS", "false").lower() == "true"


def load_on_main(dist: Dist, load: Callable[[dict[str, Any] | None], nn.Module],
                 device: torch.device) -> nn.Module:
    """``load(None)`` on the main process; ``load(layout)`` (a meta-device skeleton) elsewhere,
    with the main process's description of its loaded model."""
    from lora_gui.models.skeleton import describe

    model = load(None) if dist.is_main else None
    layout = dist.broadcast(describe(model) if dist.is_main else None)
    if dist.is_main:
        return model
    for spec in layout["layers"].values():  # pickled on the main process's device
        spec["quant_state"].to(device)
    return load(layout)


def held_bytes(model: nn.Module) -> int:
    """Bytes of the weights and buffers this process holds (a meta-device tensor holds none)."""
    tensors = list(model.parameters()) + list(model.buffers())
    return sum(t.numel() * t.element_size() for t in tensors if not t.is_meta)


def materialize_trainable(model: nn.Module, device: torch.device) -> None:
    """The LoRA weights peft made on the skeleton's meta device, allocated (values: broadcast
    from the main process later, :func:`fill_from_main`) before the optimizer takes them."""
    for module in model.modules():
        for name, p in list(module._parameters.items()):
            if p is not None and p.requires_grad and p.is_meta:
                module._parameters[name] = nn.Parameter(torch.empty(p.shape, dtype=p.dtype, device=device))


def full_frozen(model: nn.Module, dist: Dist) -> dict[str, torch.Tensor] | None:
    """The main process's whole frozen tensors by name, kept alive across sharding (None elsewhere)."""
    if not dist.is_main:
        return None
    return {name: p.detach() for name, p in model.named_parameters() if not p.requires_grad}


def fill_from_main(model: nn.Module, full: dict[str, torch.Tensor] | None, dist: Dist,
                   device: torch.device, offload: bool = False) -> None:
    """After sharding: every other process allocates its shards and receives their values; the
    buffers and LoRA weights are broadcast whole (the main process's values everywhere)."""
    mine = [(name, tuple(p.shape), str(p.dtype)) for name, p in model.named_parameters()]
    mine += [(name, tuple(b.shape), str(b.dtype)) for name, b in model.named_buffers()]
    theirs = dist.broadcast(mine if dist.is_main else None)
    if dist.any(mine != theirs):  # every rank stops alike rather than hang in a broadcast
        extra = sorted(set(mine) ^ set(theirs))[:3]
        raise RuntimeError(f"FSDP loading: rank {dist.rank}'s model skeleton differs from the main "
                           f"process's loaded model (first differences: {extra})")
    if not dist.is_main:
        model.to_empty(device=torch.device("cpu") if offload else device)
    for name, p in model.named_parameters():
        if p.requires_grad:
            continue
        whole = (full[name].to(device) if full is not None
                 else torch.empty(p.shape, dtype=p.dtype, device=device))
        tdist.broadcast(whole, src=0)
        if not dist.is_main:
            local, piece = p, whole
            if hasattr(p, "to_local"):  # a shard: this rank's rows (none where rows run out)
                local, chunks = p.to_local(), torch.chunk(whole, dist.world_size, dim=0)
                piece = chunks[dist.rank] if dist.rank < len(chunks) else whole[:0]
            if piece.shape != local.shape:
                raise RuntimeError(f"FSDP loading: {name}: shard {tuple(local.shape)} is not rows of "
                                   f"{tuple(whole.shape)} chunked {dist.world_size} ways")
            with torch.no_grad():
                local.copy_(piece)
        del whole
    for b in model.buffers():
        staged = b.to(device)
        tdist.broadcast(staged, src=0)
        if not dist.is_main:
            b.copy_(staged)
    for p in model.parameters():
        if p.requires_grad:
            staged = p.data.to(device)
            tdist.broadcast(staged, src=0)
            if not dist.is_main:
                p.data.copy_(staged)


def dump_weights(model: nn.Module, out: Path, dist: Dist) -> Path | None:
    """Test hook (``LORA_GUI_DEBUG_WEIGHTS=1``): this process's weights as they stand before step
    1 -- the trainable ones whole, the frozen ones this process's shard -- written to
    ``RUN/weights-rank{N}.safetensors`` so a test can compare the processes. None when off."""
    if os.environ.get(DEBUG_WEIGHTS_ENV) != "1":
        return None
    from safetensors.torch import save_file

    tensors = {}
    for name, p in model.named_parameters():
        local = p.to_local() if hasattr(p, "to_local") else p
        tensors[name] = local.detach().as_subclass(torch.Tensor).to("cpu").contiguous().clone()
    path = out / f"weights-rank{dist.rank}.safetensors"
    save_file(tensors, str(path))
    return path
