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
"""

from __future__ import annotations

from torch import nn

from lora_gui.models.cuda_autocast import checkpoint, checkpoint_contexts


def enable_checkpointing(model: nn.Module) -> None:
    """Switches on non-reentrant activation checkpointing: transformers' or diffusers' own
    switch (``model`` may be a peft wrapper); for a transformers model without the input hook
    that non-reentrant checkpointing does not need (see the module doc)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if hasattr(base, "gradient_checkpointing_enable"):  # transformers
        kwargs = {"use_reentrant": False, "context_fn": checkpoint_contexts}
        if hasattr(base, "activation_checkpointing_enable"):  # the name since transformers 5.x
            base.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:
            base.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
        if hasattr(base, "disable_input_require_grads"):
            base.disable_input_require_grads()
    else:  # diffusers: a module's own __call__, non-reentrant (as diffusers' default function)
        base.enable_gradient_checkpointing(lambda module, *args: checkpoint(module.__call__, *args,
                                                                            use_reentrant=False))
