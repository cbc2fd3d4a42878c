"""A base model with no weights (meta device), the same modules as the main process's loaded one.

Under FSDP only the main process loads (and quantizes) the base; every other process builds this
skeleton, which takes no memory for its weights, and receives its shards after sharding
(:mod:`lora_gui.engine.core.fsdp_loading`). What the skeleton needs from the loaded model is
small and picklable (:func:`describe`): for each 4-bit Linear its packed weight's shape and
storage dtype and its quantization state (the block scales, about 1/16 of the packed bytes with
double quantization off, 1/64 with it on), which every rank keeps whole, as it does when every
rank loads the model.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


def describe(model: nn.Module) -> dict[str, Any]:
    """What a skeleton of this loaded model needs: its 4-bit layers, by module name."""
    import bitsandbytes as bnb

    layers = {}
    for name, module in model.named_modules():
        if isinstance(module, bnb.nn.Linear4bit):
            w = module.weight
            layers[name] = {
                "in": module.in_features, "out": module.out_features, "bias": module.bias is not None,
                "compute_dtype": module.compute_dtype, "quant_storage": module.quant_storage,
                "shape": tuple(w.shape), "dtype": w.dtype, "blocksize": w.blocksize,
                "compress_statistics": w.compress_statistics, "quant_type": w.quant_type,
                "quant_state": w.quant_state}
    return {"layers": layers}


def meta_skeleton(source: str, attn_backend: str, dtype: torch.dtype, layout: dict[str, Any],
                  quantization_config: Any = None) -> nn.Module:
    """The causal LM of ``source`` with every parameter on the meta device (no memory), its
    Linear layers named in ``layout`` (:func:`describe`) 4-bit with the main process's
    quantization state; buffers (rotary frequencies) are real, as loading makes them."""
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(source)
    with init_empty_weights(include_buffers=False):
        model = AutoModelForCausalLM.from_config(config, attn_implementation=attn_backend, dtype=dtype)
    model.tie_weights()  # from_config leaves a tied head untied; loading ties it
    model.config.use_cache = False  # training: no KV cache (as load_base_model sets it)
    if layout["layers"]:
        _quantize_on_meta(model, layout["layers"], quantization_config)
    return model


def _quantize_on_meta(model: nn.Module, layers: dict[str, dict[str, Any]], quantization_config: Any) -> None:
    import bitsandbytes as bnb

    for name, spec in layers.items():
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        layer = bnb.nn.Linear4bit(spec["in"], spec["out"], bias=spec["bias"],
                                  compute_dtype=spec["compute_dtype"], quant_type=spec["quant_type"],
                                  quant_storage=spec["quant_storage"], device="meta")
        layer.weight = bnb.nn.Params4bit(
            torch.empty(spec["shape"], dtype=spec["dtype"], device="meta"), requires_grad=False,
            quant_state=spec["quant_state"], blocksize=spec["blocksize"],
            compress_statistics=spec["compress_statistics"], quant_type=spec["quant_type"],
            quant_storage=spec["quant_storage"], bnb_quantized=True, module=layer)
        layer.quant_state = spec["quant_state"]  # put back on the gathered weight at each forward
        layer.source_cls = type(getattr(parent, child))
        setattr(parent, child, layer)
    # what transformers sets on a model it quantized while loading (peft and the checks read it)
    model.is_quantized, model.is_loaded_in_4bit, model.quantization_method = True, True, "bitsandbytes"
    if quantization_config is not None:
        from transformers.quantizers import AutoHfQuantizer

        model.config.quantization_config = quantization_config
        model.hf_quantizer = AutoHfQuantizer.from_config(quantization_config, pre_quantized=False)
