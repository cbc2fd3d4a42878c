"""Quantized base weights for text runs (QLoRA): load through transformers' BitsAndBytesConfig.

``quantization: nf4`` stores every Linear layer of the decoder in 4-bit NormalFloat (packed two
weights a byte, plus a scale per 64 weights; ``double_quant`` quantizes those scales too), and
``int8`` in 8-bit with a float32 scale per output row. Embeddings, norms and the output head stay
in the compute dtype (transformers keeps the head out of the conversion). LoRA is attached on top
of the quantized layers by peft, which knows bitsandbytes' layer classes.

What we do instead of peft's ``prepare_model_for_kbit_training`` (see :func:`prepare_for_training`):
that helper casts every 16-bit parameter that is not 4-bit (embeddings, norms, output head) to
float32, which costs 2 bytes per such weight (about 2.1 GB for Llama-3.1-8B: embeddings and
head are 1.05 B weights) and slows every step; here they stay in the compute dtype, as the
compute dtype is what the layers run in anyway.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn

from lora_gui.adapter_settings import TEXT_QUANTIZATIONS
from lora_gui.config import RunConfig
from lora_gui.models.errors import ModelError

log = logging.getLogger(__name__)
INSTALL_HINT = "pip install bitsandbytes==0.50.2"
QUANTIZED = tuple(q for q in TEXT_QUANTIZATIONS if q != "none")  # fp8 is video's (video_quant)


def check_bitsandbytes(quantization: str, device: torch.device, precision: str = "auto") -> None:
    """Fails with a clear ModelError when this machine cannot run ``quantization``.

    Raises:
        ModelError: bitsandbytes missing (says what to install), a CPU without AVX2 (bitsandbytes'
            CPU kernels need it), or int8 with fp16 compute on a CPU.
    """
    import importlib.util

    if importlib.util.find_spec("bitsandbytes") is None:
        raise ModelError(f"quantization: {quantization} needs bitsandbytes ({INSTALL_HINT}), or "
                         "use quantization: none")
    if device.type == "cpu":
        capability = torch.backends.cpu.get_cpu_capability()  # "DEFAULT", "AVX2", "AVX512", ...
        if not capability.startswith("AVX"):
            raise ModelError(f"quantization: {quantization} on a CPU needs AVX2 (this CPU reports "
                             f"{capability}); use quantization: none here, or a CUDA GPU")
        if quantization == "int8" and precision == "fp16":
            raise ModelError("quantization: int8 with precision fp16 does not run on a CPU (no fp16 "
                             "matmul kernels); use precision fp32 or bf16, or quantization: nf4")


def check_fsdp(quantization: str, device: torch.device) -> bool:
    """Whether this process shards its frozen weights with FSDP, refusing what cannot work.

    nf4 under FSDP is supported (:mod:`lora_gui.engine.core.fsdp` says how); int8 is not:
    bitsandbytes keeps an int8 weight's row scales in the parameter object and its matmul state,
    which FSDP's sharded parameters do not carry. Parameter offload (accelerate's
    ``fsdp_offload_params``) is refused on a CPU: the weights already live in host memory.

    Raises:
        ModelError: naming the setting to change.
    """
    import os

    if os.environ.get("ACCELERATE_USE_FSDP", "false").lower() != "true":
        return False
    if quantization == "int8":
        raise ModelError("quantization: int8 is not supported with FSDP; use quantization: nf4 "
                         "(sharded over the processes) or launch without FSDP")
    offload = os.environ.get("FSDP_OFFLOAD_PARAMS", "false").lower() == "true"
    if offload and device.type == "cpu":
        raise ModelError("fsdp_offload_params: true does nothing on a CPU (the weights already live "
                         "in host memory); set it to false in the accelerate config for a CPU run")
    return True


def bnb_config(quantization: str, double_quant: bool, compute_dtype: torch.dtype,
               fsdp: bool = False) -> Any:
    """transformers' BitsAndBytesConfig for ``nf4`` or ``int8`` with this compute dtype.

    Under FSDP the packed 4-bit weights are stored in the compute dtype's elements
    (``bnb_4bit_quant_storage``; the same bytes, two weights a byte), as PEFT's and Answer.AI's
    FSDP recipes set it: a decoder layer's parameters then share one dtype, which FSDP1's flat
    parameter (accelerate on GPUs with ``use_orig_params: false``) needs."""
    from transformers import BitsAndBytesConfig

    if quantization == "nf4":
        return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                  bnb_4bit_use_double_quant=double_quant,
                                  bnb_4bit_compute_dtype=compute_dtype,
                                  bnb_4bit_quant_storage=compute_dtype if fsdp else torch.uint8)
    if quantization == "int8":
        return BitsAndBytesConfig(load_in_8bit=True)
    raise ValueError(f"quantization must be one of {QUANTIZED}, got {quantization!r}")


def quantized_linear_classes() -> tuple[type, ...]:
    """bitsandbytes' quantized Linear layers (Linear4bit, Linear8bitLt)."""
    import bitsandbytes as bnb

    return (bnb.nn.Linear4bit, bnb.nn.Linear8bitLt)


def check_quantized(model: nn.Module, quantization: str) -> int:
    """Checks that the decoder's linear layers were quantized; returns how many were.

    Raises:
        ModelError: naming the first linear-like layer (nn.Linear or GPT-2's Conv1D) of the
            decoder that bitsandbytes left in full precision, or saying none was quantized.
    """
    from transformers.pytorch_utils import Conv1D

    head = model.get_output_embeddings()
    quantized = quantized_linear_classes()
    count = 0
    for name, module in model.named_modules():
        if isinstance(module, quantized):
            count += 1
        elif isinstance(module, (nn.Linear, Conv1D)) and module is not head:
            raise ModelError(f"quantization: {quantization}: layer '{name}' "
                             f"({type(module).__name__}) cannot be quantized by bitsandbytes; use "
                             "quantization: none for this model")
    if not count:
        raise ModelError(f"quantization: {quantization}: no layer of this model could be quantized; "
                         "use quantization: none")
    return count


def load_quantized(source: str, cfg: RunConfig, attn_backend: str, compute_dtype: torch.dtype,
                   device: torch.device) -> nn.Module:
    """Loads the causal LM with its Linear layers in NF4 or int8 (frozen), the rest in
    ``compute_dtype``; checks the machine and the layers first (clear messages)."""
    from transformers import AutoModelForCausalLM

    check_bitsandbytes(cfg.quantization, device, cfg.precision)
    fsdp = check_fsdp(cfg.quantization, device)
    if device.type == "cuda":
        device_map: Any = {"": torch.cuda.current_device()}
    else:
        device_map = {"": "cpu"}
    model = AutoModelForCausalLM.from_pretrained(
        source, attn_implementation=attn_backend, dtype=compute_dtype, device_map=device_map,
        quantization_config=bnb_config(cfg.quantization, cfg.double_quant, compute_dtype, fsdp))
    model.config.use_cache = False  # training: no KV cache
    n = check_quantized(model, cfg.quantization)
    log.info("%s: %d linear layers in %s", source, n, cfg.quantization)
    return model


def prepare_for_training(model: nn.Module) -> None:
    """Makes a quantized base trainable with LoRA, at less cost than peft's helper.

    - bitsandbytes repacks 4-bit weights for inference on CPUs with AVX512-BF16 the first time a
      layer runs in eval mode without gradients; the repacked layer has no backward, so an eval
      before training would silently cut the gradient. Repacking is switched off here.
    - nothing is upcast (peft's helper casts embeddings, norms and the head to float32), and the
      embedding output is not made to require grad: the run's checkpointing is non-reentrant,
      which needs no input that requires grad (:mod:`lora_gui.models.checkpointing` removes the
      hook that peft's helper and transformers add for the reentrant kind).
    """
    import bitsandbytes as bnb

    for module in model.modules():
        if isinstance(module, bnb.nn.Linear4bit):
            module.support_avx512bf16_for_cpu = False


def quant_state_tensors(model: nn.Module) -> list[torch.Tensor]:
    """Tensors of the quantized layers that are neither parameters nor buffers (4-bit block
    scales, nested scales and code books; int8 row scales), for the memory meter."""
    out: list[torch.Tensor] = []
    for module in model.modules():
        weight = getattr(module, "weight", None)
        state = getattr(weight, "quant_state", None)
        if state is not None:
            out += _state_tensors(state)
        matmul_state = getattr(module, "state", None)  # int8: row scales move here on first forward
        for scb in (getattr(weight, "SCB", None), getattr(matmul_state, "SCB", None)):
            if torch.is_tensor(scb):
                out.append(scb)
    return out


def _state_tensors(state: Any) -> list[torch.Tensor]:
    tensors = [getattr(state, k, None) for k in ("absmax", "code", "offset")]
    nested = getattr(state, "state2", None)
    if nested is not None:
        tensors += [getattr(nested, k, None) for k in ("absmax", "code")]
    return [t for t in tensors if torch.is_tensor(t)]


def check_resume(saved_trainer_state: dict[str, Any], cfg: RunConfig, optimizer: str, where: Any) -> None:
    """Refuses to resume a checkpoint written with another quantization or optimizer (its base
    weights or optimizer state would not match), before anything in the run folder changes.

    Raises:
        ConfigError: naming the setting, its value then and now.
    """
    from lora_gui.config import ConfigError

    then = {"quantization": saved_trainer_state.get("quantization", "none"),
            "optimizer": saved_trainer_state.get("optimizer", "adamw")}
    now = {"quantization": cfg.quantization, "optimizer": optimizer}
    changed = [k for k in then if then[k] != now[k]]
    if changed:
        detail = ", ".join(f"{k} {then[k]!r} then, {now[k]!r} now" for k in changed)
        raise ConfigError(f"{where}: cannot resume with another {' and '.join(changed)} ({detail}); "
                          "resume with the run's own settings or start a new run; nothing was "
                          "changed in the folder")
