"""Memory switches for long sequences: each trades speed for accelerator memory, none changes
the result (same loss and gradients up to float summation order).

- ``offload_checkpoints``: with gradient checkpointing, each decoder layer's checkpointed input
  (batch x seq x hidden in the weights' dtype, the only tensor a checkpointed layer keeps) is
  copied to host memory in the forward (pinned, on a side CUDA stream so the copy overlaps the
  next layer's compute) and copied back when the backward recomputes that layer. The device
  keeps one layer input at a time instead of one per layer. Built on torch's saved-tensor hooks
  around the checkpoint call: non-reentrant checkpointing saves the layer's positional inputs
  (the hidden states) under the hooks active where it is called.
- ``mlp_chunk``: each decoder layer's ``mlp`` (gate/up/down and their LoRA branches) runs over
  ``mlp_chunk`` tokens at a time, each chunk under non-reentrant activation checkpointing: the
  forward keeps only the chunk inputs (views of the MLP input, no copy) and the backward
  recomputes one chunk at a time, so the MLP's intermediates (tokens x intermediate size) exist
  for one chunk, not the whole sequence. Costs one more MLP forward per step.
- ``embeddings_on_host``: the frozen input embedding table stays in host memory; a lookup
  gathers the rows of the batch's ids on the host and moves only those rows (tokens x hidden) to
  the device. The table must be frozen and not shared with the output head.

Host storages are created inside :func:`lora_gui.memory.runtime.tracker.on_host`, so the tracker (and
with it the planner's trace, which runs this same code on fake tensors) counts them as host
memory, apart from the device peak. On a CPU run the "device" copies are real copies in the
same RAM: the split is what a CUDA run keeps off the card.
"""

from __future__ import annotations

import logging
import types
from collections.abc import Callable
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from lora_gui.memory.runtime.tracker import mark_host, on_host
from lora_gui.models.cuda_autocast import checkpoint
from lora_gui.models.errors import ModelError

log = logging.getLogger(__name__)


# -- host <-> device copies -------------------------------------------------------------------
class _Offloader:
    """Copies a tensor to host memory and back; on CUDA pinned and on a side stream."""

    def __init__(self) -> None:
        self._streams: dict[torch.device, Any] = {}

    def _stream(self, device: torch.device) -> Any:
        if device not in self._streams:
            self._streams[device] = torch.cuda.Stream(device)
        return self._streams[device]

    def to_host(self, t: torch.Tensor) -> tuple[torch.Tensor, Any, torch.device]:
        """A host copy of ``t``; on CUDA the copy runs on a side stream (an event marks its end)."""
        with on_host():
            host = torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=t.is_cuda)
        if not t.is_cuda:
            with on_host():
                host.copy_(t)
            return host, None, t.device
        stream = self._stream(t.device)
        stream.wait_stream(torch.cuda.current_stream(t.device))  # t is computed
        with torch.cuda.stream(stream):
            host.copy_(t, non_blocking=True)
            event = torch.cuda.Event()
            event.record(stream)
        t.record_stream(stream)  # the allocator keeps t's block until the copy is done
        return host, event, t.device

    @staticmethod
    def to_device(packed: tuple[torch.Tensor, Any, torch.device]) -> torch.Tensor:
        """A new device copy of a host tensor (a copy on CPU too, as a CUDA run makes one)."""
        host, event, device = packed
        if event is not None:
            torch.cuda.current_stream(device).wait_event(event)
        out = torch.empty(host.shape, dtype=host.dtype, device=device)
        out.copy_(host, non_blocking=host.is_pinned())
        return out


_OFFLOADER = _Offloader()


# -- offloaded checkpoints --------------------------------------------------------------------
def _decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The transformer's decoder layers (modules with ``self_attn`` and ``mlp``)."""
    return [m for m in model.modules() if hasattr(m, "self_attn") and hasattr(m, "mlp")]


def _offloaded_checkpoint(inner: Callable, fn: Callable, *args: Any) -> Any:
    """``inner(fn, *args)`` (the checkpoint call) with the hidden states (``args[0]``), which the
    checkpoint saves, packed to host memory."""
    # a list, emptied after the call: the hooks may outlive the call and must not keep the
    # device tensor alive (that would keep the memory offloading is meant to free)
    target = [args[0]] if args and torch.is_tensor(args[0]) else []

    def pack(t: torch.Tensor) -> Any:
        if target and t is target[0]:  # the same object: checkpoint saves its inputs as given
            return ("host", _OFFLOADER.to_host(t))
        return ("kept", t)

    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, _unpack):
            return inner(fn, *args)
    finally:
        target.clear()


def _unpack(packed: Any) -> torch.Tensor:
    kind, value = packed
    return _OFFLOADER.to_device(value) if kind == "host" else value


def enable_offloaded_checkpoints(model: nn.Module) -> int:
    """Keeps every checkpointed decoder layer's input in host memory (see the module doc).

    Call after gradient checkpointing is switched on. Returns the number of layers changed.

    Raises:
        ModelError: checkpointing is not on, or the model has no checkpointable decoder layers.
    """
    layers = [m for m in _decoder_layers(model) if hasattr(m, "_gradient_checkpointing_func")
              and getattr(m, "gradient_checkpointing", False)]  # not the layers checkpoint_layers keeps
    if not layers:
        raise ModelError("offload_checkpoints: needs gradient_checkpointing on a transformers "
                         "decoder (checkpointed layers); this model has none switched on")
    for layer in layers:
        inner = layer._gradient_checkpointing_func
        if getattr(inner, "func", None) is not _offloaded_checkpoint:
            layer._gradient_checkpointing_func = partial(_offloaded_checkpoint, inner)
    return len(layers)


# -- sequence-tiled MLP -----------------------------------------------------------------------
def _tiled_mlp_forward(self: nn.Module, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    """The MLP over ``self.mlp_chunk`` tokens at a time (checkpointed per chunk under grad)."""
    plain = type(self).forward.__get__(self)
    chunk = self.mlp_chunk
    flat = x.reshape(-1, x.shape[-1])  # (tokens, hidden): a view of a contiguous input
    if flat.shape[0] <= chunk or args or kwargs:
        return plain(x, *args, **kwargs)
    grad = torch.is_grad_enabled()
    parts = [checkpoint(plain, flat[s:s + chunk], use_reentrant=False) if grad else plain(flat[s:s + chunk])
             for s in range(0, flat.shape[0], chunk)]
    out = torch.cat(parts)
    del parts
    return out.view(*x.shape[:-1], out.shape[-1])


def enable_tiled_mlp(model: nn.Module, chunk: int) -> int:
    """Runs every decoder layer's ``mlp`` over ``chunk`` tokens at a time (see the module doc).

    Module names and the state dict do not change (the instance's forward is replaced).
    Returns the number of MLPs changed.

    Raises:
        ModelError: chunk < 1, or no decoder layer with an ``mlp`` submodule.
    """
    if chunk < 1:
        raise ModelError(f"mlp_chunk: must be >= 1 to tile the MLP, got {chunk}")
    mlps = [layer.mlp for layer in _decoder_layers(model)]
    if not mlps:
        raise ModelError("mlp_chunk: this model has no decoder layers with an 'mlp' submodule "
                         "(Llama, Qwen2, Mistral style); set mlp_chunk: 0")
    for mlp in mlps:
        mlp.mlp_chunk = chunk
        mlp.forward = types.MethodType(_tiled_mlp_forward, mlp)
    return len(mlps)


# -- input embeddings on the host ---------------------------------------------------------------
def _host_lookup(self: nn.Embedding, input_ids: torch.Tensor) -> torch.Tensor:
    """Gathers the rows on the host and returns a device copy of just those rows."""
    with on_host():
        rows = F.embedding(input_ids.to(self.weight.device), self.weight, self.padding_idx,
                           self.max_norm, self.norm_type, self.scale_grad_by_freq, self.sparse)
    if input_ids.is_cuda:
        return rows.pin_memory().to(input_ids.device, non_blocking=True)
    out = torch.empty(rows.shape, dtype=rows.dtype, device=input_ids.device)
    return out.copy_(rows)  # a device copy, as a CUDA run makes one


def _host_apply(self: nn.Embedding, fn: Callable, recurse: bool = True) -> nn.Embedding:
    """``Module._apply`` that keeps the table on the host: dtype casts apply, moves do not."""
    probe = fn(torch.empty(0, dtype=self.weight.dtype, device=self.weight.device))
    if probe.dtype != self.weight.dtype:
        self.weight.data = self.weight.data.to(probe.dtype)
        mark_host(self.weight)
    return self


def enable_host_embeddings(model: nn.Module) -> torch.Tensor:
    """Keeps the frozen input embedding table in host memory (see the module doc); later
    ``model.to(device)`` calls leave it there. Returns the host table.

    Raises:
        ModelError: the table is trained, wrapped (trained chat-token rows), or tied to the
            output head (the head needs it on the accelerator), or FSDP is on.
    """
    import os

    if os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true":
        raise ModelError("embeddings_on_host: not supported with FSDP (it shards the table over the "
                         "GPUs instead); launch without FSDP or set embeddings_on_host: false")
    emb = model.get_input_embeddings()
    if type(emb) is not nn.Embedding:
        raise ModelError("embeddings_on_host: the input embeddings are not a plain embedding "
                         f"table ({type(emb).__name__}: e.g. new chat-template token rows are "
                         "trained); set embeddings_on_host: false")
    if emb.weight.requires_grad:
        raise ModelError("embeddings_on_host: the input embedding table is trained; it must be "
                         "frozen to stay in host memory")
    head = model.get_output_embeddings()
    if head is not None and getattr(head, "weight", None) is emb.weight:
        raise ModelError("embeddings_on_host: this model ties its input embeddings to the output "
                         "head, which needs the table on the accelerator; set embeddings_on_host: false")
    if emb.weight.device.type != "cpu":
        emb.weight.data = emb.weight.data.to("cpu")
    mark_host(emb.weight)
    emb.forward = types.MethodType(_host_lookup, emb)
    emb._apply = types.MethodType(_host_apply, emb)
    return emb.weight


def apply_long_context(model: nn.Module, *, offload_checkpoints: bool = False, mlp_chunk: int = 0,
                       embeddings_on_host: bool = False,
                       attention_head_groups: int = 0) -> list[torch.Tensor]:
    """Switches on the requested long-context memory switches on a (peft-wrapped) causal LM.

    Call after LoRA is attached and gradient checkpointing is switched on.

    Returns:
        The tensors that now live in host memory for the whole run (the embedding table).
    """
    host: list[torch.Tensor] = []
    if attention_head_groups > 1:  # attention per group of key/value heads (lora_gui.attention.head_groups)
        from lora_gui.attention.head_groups import enable_attention_head_groups

        try:
            enable_attention_head_groups(model, attention_head_groups)
        except ValueError as err:
            raise ModelError(str(err)) from None
    if mlp_chunk:
        log.info("tiled MLP over %d tokens in %d layers", mlp_chunk, enable_tiled_mlp(model, mlp_chunk))
    if offload_checkpoints:
        log.info("offloaded checkpoints in %d layers", enable_offloaded_checkpoints(model))
    if embeddings_on_host:
        host.append(enable_host_embeddings(model))
    return host
