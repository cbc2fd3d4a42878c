"""fp8 base weights for video runs (``quantization: fp8``): diffusers' layerwise casting.

``ModelMixin.enable_layerwise_casting(storage_dtype=torch.float8_e4m3fn, compute_dtype=...)``
stores every Linear (and conv) weight of the transformer in float8 e4m3 (1 byte a weight) and,
around each layer's forward, brings that layer's weights back to the compute dtype (a hook
calls ``module.to(compute)`` before and ``module.to(float8)`` after). The matmuls themselves run
in the compute dtype on every device (no fp8 matmul, so a CPU runs it too and a GPU's fp8 tensor
cores are not used).

Left in the compute dtype, as diffusers' defaults leave them: the patch embedding, norms, the
condition embedder (time and text embeddings), ``proj_out``, Wan's ``scale_shift_table`` and the
model's ``_keep_in_fp32_modules``; and every LoRA / LoHa / LoKr weight (diffusers adds peft's
adapter names to its skip patterns, and stops peft from casting a LoRA layer's input to the
storage dtype). It is applied after LoRA is attached, so the adapter is created in the compute
dtype (peft would otherwise make it in the base weight's float8).

Memory, as the trace counts it (the hooks run on fake tensors in
:mod:`lora_gui.memory.predict.video_run`): 1 byte a cast weight at rest, plus the upcast copy of
each layer while it runs. A frozen layer whose input needs a gradient keeps its upcast weight
for the backward (autograd saves it), so without gradient checkpointing every layer's copy is
alive at the end of the forward (more than no fp8 at all); with checkpointing only one block's
copies are (during its recompute). The settings therefore ask for ``gradient_checkpointing``.

The hooks cast as ``module.to(dtype)`` does on real tensors (each floating-point parameter's
data set to its cast, the Parameter kept; :func:`cast_like_module_to`): on fake tensors (the
memory trace, the run's FLOP count, which swaps fake weights in) ``module.to`` would swap the
parameter objects instead, which torch refuses for a tensor the memory tracker watches.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import nn

FP8_STORAGE = torch.float8_e4m3fn  # what musubi-tuner and ai-toolkit store as "fp8" for Wan
LAYERWISE_CASTING = "layerwise_casting"  # diffusers' name of the hook (hooks/layerwise_casting.py)


def base_module(model: Any) -> Any:
    """The diffusers model under a peft wrapper (or the model itself)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def apply_fp8_storage(model: Any, compute_dtype: torch.dtype) -> int:
    """Stores the transformer's weights in float8 e4m3 with diffusers' layerwise casting, in
    place (after LoRA is attached); returns how many layers were cast.

    Raises:
        ValueError: a model that is not a diffusers model (no ``enable_layerwise_casting``).
    """
    base = base_module(model)
    if not hasattr(base, "enable_layerwise_casting"):
        raise ValueError(f"quantization: fp8 needs a diffusers model, not {type(base).__name__}")
    base.enable_layerwise_casting(storage_dtype=FP8_STORAGE, compute_dtype=compute_dtype)
    return cast_like_module_to(base)


def apply_base_storage(model: Any, quantization: str, compute_dtype: torch.dtype) -> None:
    """A video run's base-weight storage: ``fp8`` casts, ``none`` leaves the model as it is.

    Raises:
        ValueError: a storage video runs do not build.
    """
    if quantization == "none":
        return
    if quantization != "fp8":
        raise ValueError(f"quantization: {quantization} is not built for video runs (fp8 or none)")
    apply_fp8_storage(model, compute_dtype)


def cast_in_place(module: nn.Module, dtype: torch.dtype) -> None:
    """What ``module.to(dtype)`` does to a module of real tensors: floating-point parameters
    get cast data (same Parameter objects), floating-point buffers are replaced.

    Real weights under a fake-tensor mode (the run's FLOP count runs the real model on fake
    inputs) are not touched: the layer holds a fake cast Parameter while it runs and gets its own
    Parameter object back from the cast after the forward (or before the next one, should a
    forward have failed), so the count leaves the real weights as they were."""
    from torch._subclasses.fake_tensor import is_fake

    with torch.no_grad():
        for m in module.modules():
            kept = m.__dict__.setdefault("_real_weights", {})
            for name in list(kept):  # back from a fake-mode forward: the layer's own Parameters
                m._parameters[name] = kept.pop(name)
            for name, p in m._parameters.items():
                if p is None or not p.is_floating_point() or p.dtype == dtype:
                    continue
                cast = p.data.to(dtype)
                if is_fake(cast) and not is_fake(p):
                    kept[name] = p  # the real Parameter, untouched
                    m._parameters[name] = nn.Parameter(cast, requires_grad=p.requires_grad)
                else:
                    p.data = cast
            for key, b in m._buffers.items():
                if b is not None and b.is_floating_point() and b.dtype != dtype:
                    m._buffers[key] = b.to(dtype)


def cast_like_module_to(model: nn.Module) -> int:
    """Makes every layerwise-casting hook of ``model`` cast with :func:`cast_in_place` (what
    ``module.to`` does on real tensors, on fake ones too); returns how many hooks it rebound.
    diffusers' hook registry calls the functions kept in each hook's ``fn_ref``: those are
    replaced, the hook's dtypes kept."""
    count = 0
    for module in model.modules():
        registry = getattr(module, "_diffusers_hook", None)
        hook = registry.get_hook(LAYERWISE_CASTING) if registry is not None else None
        if hook is None:
            continue
        hook.fn_ref.pre_forward = functools.partial(_pre_forward, hook.compute_dtype)
        hook.fn_ref.post_forward = functools.partial(_post_forward, hook.storage_dtype)
        count += 1
    return count


def _pre_forward(dtype: torch.dtype, module: nn.Module, *args: Any, **kwargs: Any) -> tuple:
    cast_in_place(module, dtype)
    return args, kwargs


def _post_forward(dtype: torch.dtype, module: nn.Module, output: Any) -> Any:
    cast_in_place(module, dtype)
    return output
