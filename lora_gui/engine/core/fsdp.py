"""FSDP for LoRA: shard the frozen base weights across ranks, keep the small LoRA weights whole.

Asked for with an accelerate FSDP config (``accelerate launch --config_file
presets/accelerate/fsdp.yaml ...``, which sets ``ACCELERATE_USE_FSDP``). Each decoder layer
becomes one FSDP2 unit (``fully_shard``), the embedding another, the final norm + output head a
third that stays gathered from forward into backward (as accelerate arranges them), then the
root. The LoRA parameters are *ignored* by FSDP (``ignored_params``): they stay ordinary,
replicated tensors whose gradients the loop all-reduces itself, exactly as without FSDP, so
the adapter, the optimizer state and the checkpoints are the same files with or without FSDP
and a run can resume under any number of processes.

Saves: (N-1)/N of the frozen weights on every GPU. Costs: one all-gather per layer in forward
and again in backward (``reshard_after_forward``), and the unsharded layers while they run.

On GPUs accelerate's FSDP plugin applies it (FSDP2 with the config's options) with the LoRA
modules passed as ``ignored_modules``; accelerate does not enable FSDP on CPU (its state keeps
``MULTI_CPU``), so there :func:`shard_frozen` calls ``fully_shard`` directly, same layout.

A 4-bit (nf4) base: FSDP2 shards it, FSDP1 is not needed. Tried on torch 2.13, accelerate
1.15 and bitsandbytes 0.50.2 (gloo, 2 processes, the bundled model): ``fully_shard`` turns
each packed ``Params4bit`` into a DTensor of its rows (the packed bytes split over the ranks)
and drops the parameter's ``quant_state``; bitsandbytes' ``Linear4bit`` keeps a copy on the
module and puts it back on the gathered weight at every forward, so forward, backward and the
loss are those of one process (equal to the last digit on the bundled model). The packed
weights are stored in the compute dtype (``bnb_4bit_quant_storage``, set by
:func:`lora_gui.models.quant.bnb_config` under FSDP) as PEFT's and Answer.AI's recipes require
for FSDP1's flat parameter; FSDP2 shards uint8 storage too, but one dtype per layer keeps the
GPU path (accelerate's plugin) on the recipe's settings. The quantization state (the absmax
scales: 4 bytes per 64 weights, about 1 byte per 64 with ``double_quant``) is not a parameter:
every rank keeps all of it. int8 is refused (its row scales live in the parameter object and
the layer's matmul state, which a sharded parameter does not carry), and so is parameter
offload on a CPU (the weights are already in host memory): :func:`lora_gui.models.quant.check_fsdp`.

Loading: only the main process loads the quantized base; the others build it on the meta device
and receive their shards after sharding (:mod:`lora_gui.engine.core.fsdp_loading`), so no process
but the main one ever holds the whole model. A LoRA initialisation that reads the base weights
(EVA, CorDA, PiSSA, OLoRA, LoftQ) still loads it on every process.
"""

from __future__ import annotations

import logging
import os

from torch import nn

from lora_gui.config import ConfigError
from lora_gui.errors import UserError

log = logging.getLogger(__name__)


class FsdpOutOfMemoryError(UserError, RuntimeError):
    """Out of memory in an FSDP run: the whole job stops (see :func:`fsdp_oom_message`)."""


def fsdp_requested() -> bool:
    """An accelerate FSDP config (or ``--use_fsdp``) launched this process."""
    return os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true"


def _base_model(model: nn.Module) -> nn.Module:
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def layer_classes(model: nn.Module, names: list[str] | None = None) -> tuple[type, ...]:
    """The transformer-layer classes FSDP wraps one unit each: ``names`` (the accelerate config's
    ``fsdp_transformer_layer_cls_to_wrap``) or the model's own ``_no_split_modules``.

    Raises:
        ConfigError: when the model names no layer class, or a named class is not in the model.
    """
    base = _base_model(model)
    kind = type(base).__name__
    env = os.environ.get("FSDP_TRANSFORMER_CLS_TO_WRAP")
    wanted = list(names or (env.split(",") if env else getattr(base, "_no_split_modules", None) or []))
    hint = ("set fsdp_transformer_layer_cls_to_wrap in the accelerate config to its decoder-layer class, "
            "or train it without FSDP")
    if not wanted:
        raise ConfigError(f"FSDP: cannot wrap {kind}: it declares no transformer layer class "
                          f"(_no_split_modules) to shard one unit each; {hint}")
    by_name = {type(m).__name__: type(m) for m in base.modules()}
    missing = [n.strip() for n in wanted if n.strip() not in by_name]
    if missing:
        raise ConfigError(f"FSDP: cannot wrap {kind}: it has no layer class {', '.join(missing)} "
                          f"(fsdp_transformer_layer_cls_to_wrap); {hint}")
    return tuple(by_name[n.strip()] for n in wanted)


def lora_modules(model: nn.Module) -> list[nn.Module]:
    """Modules that own the trainable (LoRA) parameters: FSDP must leave them whole."""
    return [m for m in model.modules()
            if any(p.requires_grad for p in m.parameters(recurse=False))]


def shard_frozen(model: nn.Module, reshard_after_forward: bool = True) -> nn.Module:
    """Applies FSDP2 ``fully_shard`` in place (accelerate's layout, LoRA parameters ignored).

    Needs an initialised process group (the launcher's). Returns the model.
    """
    from torch.distributed.fsdp import fully_shard

    classes = layer_classes(model)
    ignored = {p for p in model.parameters() if p.requires_grad}
    kwargs = {"ignored_params": ignored}
    base = _base_model(model)
    for module in list(base.modules()):
        if isinstance(module, classes):
            fully_shard(module, reshard_after_forward=reshard_after_forward, **kwargs)
    embed, head = base.get_input_embeddings(), base.get_output_embeddings()
    tied = head is not None and embed is not None and head.weight is embed.weight
    if embed is not None and not tied:
        fully_shard(embed, reshard_after_forward=reshard_after_forward, **kwargs)
    norm = getattr(getattr(base, "model", None), "norm", None)
    tail = [m for m in (norm, embed if tied else None, head) if m is not None]
    if tail:  # used at the end of forward and the start of backward: keep it gathered between
        fully_shard(tail, reshard_after_forward=False, **kwargs)
    fully_shard(model, **kwargs)
    return model


def prepare_with_accelerate(accelerator, model: nn.Module, optimizer):
    """accelerate's FSDP plugin (GPUs) with the LoRA modules ignored; checks the layer class
    first. The scheduler is not prepared: accelerate would step it once per process."""
    plugin = accelerator.state.fsdp_plugin
    layer_classes(model, plugin.transformer_cls_names_to_wrap)
    plugin.ignored_modules = lora_modules(model)
    # a process that built the base on the meta device (fsdp_loading) is not moved to its GPU:
    # FSDP shards it on meta and its shards are allocated and filled after (nothing to copy)
    skeleton = any(p.is_meta for p in model.parameters())
    return accelerator.prepare(model, optimizer, device_placement=[not skeleton, True])


def frozen_local_bytes(model: nn.Module) -> int:
    """Bytes of frozen weights this rank holds (its shards under FSDP, all of them without)."""
    total = 0
    for p in model.parameters():
        if not p.requires_grad:
            local = p.to_local() if hasattr(p, "to_local") else p
            total += local.numel() * local.element_size()
    return total


def fsdp_oom_message(err: BaseException) -> str:
    return (f"out of memory under FSDP ({err}): splitting the micro-batch needs every rank to "
            "stop at the same point, which FSDP's per-layer all-gathers do not allow mid-step; "
            "lower token_budget or budget_gb's planned batch, or switch on gradient_checkpointing")


def reshard(model: nn.Module) -> None:
    """Frees every FSDP unit's gathered weights (a no-op without FSDP). Units kept gathered from
    forward into backward stay gathered after a no_grad forward (evaluation) otherwise."""
    from torch.distributed.fsdp import FSDPModule

    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()

