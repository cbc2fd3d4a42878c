"""Activation checkpointing for training, one switch for the run and for the planner's trace.

Non-reentrant checkpointing (``torch.utils.checkpoint(..., use_reentrant=False)``) carries the
gradient to the LoRA weights inside a checkpointed layer whether or not the layer's input
requires grad. transformers' ``gradient_checkpointing_enable`` (and peft, when it wraps a model
that already checkpoints) still add a hook that makes the input embeddings' output require grad,
which only the reentrant kind needs. That output then becomes a leaf of the graph: autograd keeps
it on the device until the backward ends (with offloaded checkpoints it would otherwise live only
in host memory) and computes its gradient for nothing. Each is batch x sequence x hidden in the
compute dtype: 8 KB a token for an 8B Llama in bf16, 2.8 GB at 340k tokens. The hook is removed.

The recompute runs under the autocast its forward ran under, emulated or real
(:func:`lora_gui.models.cuda_autocast.checkpoint_contexts`): a plan's trace of a GPU step
recomputes what the card recomputes.

``layers``: only the first N decoder layers are checkpointed; the last ones keep their activations
as without checkpointing and are not recomputed (one forward of each such layer saved a step).
The backward reaches them first, so their activations are freed before any checkpointed layer is
recomputed: a recompute holds what it held with every layer checkpointed (and the kept layers'
LoRA gradients); the cost is the kept activations at the start of the backward. The planner
traces the same split, so a plan says what each choice holds. transformers 5.x can skip layers
too (``every_n_layers``), but it keeps the activations of layers between checkpointed ones,
which are still alive when those are recomputed: a higher peak for the same forwards saved.

A video transformer (diffusers' Wan, LTX-Video) does the same over its transformer blocks:
diffusers' own switch is on, and the function it calls for each block
(``_gradient_checkpointing_func``) checkpoints the first N blocks and calls the others as they
are (each block's ``_checkpointed`` says which; block swap reads it to know whether a swapped
block's saved weights must be packed as host references, :mod:`lora_gui.models.block_swap`).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from lora_gui.models.cuda_autocast import checkpoint, checkpoint_contexts
from lora_gui.models.errors import ModelError


def enable_checkpointing(model: nn.Module, layers: int = 0) -> None:
    """Switches on non-reentrant activation checkpointing: transformers' or diffusers' own
    switch (``model`` may be a peft wrapper); for a transformers model without the input hook
    that non-reentrant checkpointing does not need (see the module doc).

    ``layers``: checkpoint only the first ``layers`` decoder layers, or a video transformer's
    first ``layers`` blocks (0: every one).

    Raises:
        ModelError: ``layers`` is more than the model's decoder layers or blocks, or the model is
            neither a transformers decoder nor a video transformer.
    """
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if layers and not hasattr(base, "gradient_checkpointing_enable") and _video_blocks(base) is None:
        raise ModelError("checkpoint_layers: only a text model's decoder layers or a video "
                         "transformer's blocks can be checkpointed in part; set 0 to checkpoint "
                         "every block")
    if hasattr(base, "gradient_checkpointing_enable"):  # transformers
        kwargs = {"use_reentrant": False, "context_fn": checkpoint_contexts}
        if hasattr(base, "activation_checkpointing_enable"):  # the name since transformers 5.x
            base.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:
            base.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
        if hasattr(base, "disable_input_require_grads"):
            base.disable_input_require_grads()
        if layers:
            _keep_last_layers(base, layers)
    else:  # diffusers: a module's own __call__, non-reentrant (as diffusers' default function)
        blocks = _video_blocks(base) or []
        if layers > len(blocks):
            raise ModelError(f"checkpoint_layers: {layers} is more than this model's {len(blocks)} "
                             f"transformer blocks; set at most {len(blocks)}, or 0 to checkpoint every block")
        for i, block in enumerate(blocks):
            block._checkpointed = not layers or i < layers
        base.enable_gradient_checkpointing(_checkpoint_block)


def _checkpoint_block(module: nn.Module, *args: Any) -> Any:
    """diffusers' ``_gradient_checkpointing_func``: the block's ``__call__`` checkpointed
    (non-reentrant), or called as it is for a block ``checkpoint_layers`` leaves out."""
    if not getattr(module, "_checkpointed", True):
        return module(*args)
    return checkpoint(module.__call__, *args, use_reentrant=False)


def _video_blocks(base: nn.Module) -> list[nn.Module] | None:
    """A diffusers video transformer's blocks in order (Wan's ``blocks``, LTX-Video's
    ``transformer_blocks``), or None for any other model."""
    from lora_gui.models.video import is_video_module

    if not is_video_module(base):
        return None
    from lora_gui.models.block_swap import transformer_blocks

    return transformer_blocks(base)


def checkpointed_layers(model: nn.Module) -> list[nn.Module]:
    """The transformers decoder layers that recompute their forward in the backward, in order."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    return [m for m in model.modules()
            if isinstance(m, GradientCheckpointingLayer) and m.gradient_checkpointing]


def _keep_last_layers(base: nn.Module, layers: int) -> None:
    """Leaves every decoder layer after the first ``layers`` unchecked (module doc)."""
    found = checkpointed_layers(base)
    if layers > len(found):
        raise ModelError(f"checkpoint_layers: {layers} is more than this model's {len(found)} decoder "
                         f"layers; set at most {len(found)}, or 0 to checkpoint every layer")
    for layer in found[layers:]:
        layer.gradient_checkpointing = False
