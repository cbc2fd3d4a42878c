"""Fast kernels from libraries on CUDA, each a setting: Liger-Kernel's RMSNorm, RoPE, SwiGLU and
fused linear cross-entropy, and a regional ``torch.compile`` of the decoder blocks.

Each setting is 'auto' (on where it can run and helps: a CUDA device, the library installed),
'on' or 'off'. Where it cannot run (no CUDA device, Liger-Kernel not installed, a model type it
does not patch) the run goes on without it and says why in one log line. Liger-Kernel is an
optional CUDA extra (``pip install liger-kernel``): its kernels are Triton programs, which need
a CUDA device, so it is not among the requirements of a CPU install.

Why compile is off on CPUs: a CPU run measures its memory with the tracker's Python dispatch
mode, and dynamo skips compiled code while a dispatch mode is active, so the compiled blocks
would run eagerly there anyway (``bench/speed_switches.py --compile``).
"""

from __future__ import annotations

import importlib.util
import logging
from dataclasses import dataclass
from typing import Any

import torch

log = logging.getLogger(__name__)

# Liger-Kernel's patch for a model instance (liger_kernel/transformers/monkey_patch.py,
# _apply_liger_kernel_to_instance): the kernels asked for; cross_entropy stays off because the
# fused linear cross-entropy replaces the logits and the loss together
LIGER_KERNELS = {"rope": True, "rms_norm": True, "swiglu": True, "cross_entropy": False,
                 "fused_linear_cross_entropy": True}
# model types Liger-Kernel patches with these kernels (its MODEL_TYPE_TO_APPLY_LIGER_FN, the
# decoders lora_gui plans); another type trains without them
LIGER_MODEL_TYPES = ("llama", "mistral", "mixtral", "qwen2", "qwen3", "gemma", "gemma2", "phi3")


@dataclass(frozen=True)
class KernelChoice:
    """What a run gets for one fast-kernel setting: ``used``, and ``reason`` when it is not."""

    name: str
    used: bool
    reason: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "used": self.used, "reason": self.reason}


def liger_installed() -> bool:
    """Whether Liger-Kernel can be imported here (looked up without importing it)."""
    return importlib.util.find_spec("liger_kernel") is not None


def liger_choice(setting: str, device: str, model_type: str | None) -> KernelChoice:
    """Whether a run with ``liger_kernels=setting`` on ``device`` uses Liger-Kernel, and why not."""
    if setting == "off":
        return KernelChoice("liger_kernels", False, "off")
    if device != "cuda":
        return KernelChoice("liger_kernels", False, "its Triton kernels need a CUDA GPU")
    if not liger_installed():
        return KernelChoice("liger_kernels", False, "Liger-Kernel is not installed "
                                                    "(pip install liger-kernel)")
    if model_type not in LIGER_MODEL_TYPES:
        return KernelChoice("liger_kernels", False, f"no Liger kernels for model type {model_type!r}")
    return KernelChoice("liger_kernels", True)


def compile_choice(setting: str, device: str) -> KernelChoice:
    """Whether a run with ``compile_blocks=setting`` on ``device`` compiles its decoder blocks."""
    if setting == "off":
        return KernelChoice("compile_blocks", False, "off")
    if device != "cuda":
        return KernelChoice("compile_blocks", False, "CPU runs measure memory under a dispatch mode "
                                                     "that runs compiled code eagerly")
    return KernelChoice("compile_blocks", True)


def _say(choice: KernelChoice, setting: str) -> None:
    """One log line for a kernel asked for (on, or auto where it could help) that does not run."""
    if not choice.used and setting != "off":
        log.info("%s=%s: not used, %s", choice.name, setting, choice.reason)


def liger_kernels(chunked_loss: bool) -> dict[str, bool]:
    """The Liger kernels a run asks for: the fused linear cross-entropy only where the run's own
    chunked loss is off (both keep the whole batch's logits from being made at once; the plan
    traces the chunked one, so a run that has it keeps it)."""
    return {**LIGER_KERNELS, "fused_linear_cross_entropy": not chunked_loss}


def apply_liger(model: torch.nn.Module, setting: str, device: str, chunked_loss: bool) -> KernelChoice:
    """Liger-Kernel's kernels patched into ``model`` (the base model, before the adapter is
    attached) where :func:`liger_choice` allows; one log line where it does not.
    ``chunked_loss``: the run computes its loss with ``loss_chunk`` (:func:`liger_kernels`)."""
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    choice = liger_choice(setting, device, model_type)
    _say(choice, setting)
    if choice.used:
        from liger_kernel.transformers import _apply_liger_kernel_to_instance

        kernels = liger_kernels(chunked_loss)
        _apply_liger_kernel_to_instance(model=model, **kernels)
        log.info("liger_kernels: %s", ", ".join(k for k, on in kernels.items() if on))
    return choice


def decoder_blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The decoder layers of a causal LM, through peft's wrappers ([] when none are found)."""
    for module in model.modules():
        layers = getattr(module, "layers", None)
        if isinstance(layers, torch.nn.ModuleList) and len(layers):
            return list(layers)
    return []


def compile_blocks(model: torch.nn.Module, setting: str, device: str) -> KernelChoice:
    """Regional ``torch.compile`` of every decoder block (``dynamic=True``: one graph serves every
    layer and every bucket length) where :func:`compile_choice` allows; one log line where not."""
    choice = compile_choice(setting, device)
    blocks = decoder_blocks(model) if choice.used else []
    if choice.used and not blocks:
        choice = KernelChoice("compile_blocks", False, "no decoder blocks found in the model")
    _say(choice, setting)
    for block in blocks:
        block.compile(dynamic=True)
    return choice
