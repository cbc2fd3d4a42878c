"""The memory of an adapter initialisation that runs a pass before the first step (``lora_init``
pissa / olora / loftq / corda; eva in :mod:`lora_gui.memory.predict.eva_trace`), as the run
executes it.

PiSSA runs an SVD of every adapted weight, one layer at a time, in float32: while a layer is
decomposed the model's weights, the adapter tensors made so far, a float32 copy of the layer's
weight (none when it is float32 already), its factors U (out x k), S (k) and Vh (k x in) and the
residual ``W - scale B A`` (out x in, float32) are alive; the largest adapted weight sets the peak.
OLoRA does the same with a QR decomposition. Both are traced on fake tensors with peft's own code.
LoftQ (4-bit base) is traced per layer with peft's decomposition on top of the resident 4-bit
model (:func:`loftq_peak_bytes`); CorDA's covariances and factors are counted in closed form
(:func:`corda_peak_bytes`, whose docstring lists what is modelled). EVA's pass (no-grad forwards
of the run's batches with peft's incremental SVD of each distinct layer input) is traced on fake
tensors with peft's hooks (:mod:`lora_gui.memory.predict.eva_trace`). The run measures each pass
with the tracker (CPU) or the CUDA allocator, and its peak counts when it is above the training
steps' (small models at short lengths; CorDA on large models; EVA on wide layers). LAPACK's own
workspace on a CPU is not a tensor and is counted by neither side.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

DECOMPOSING_INITS = ("pissa", "olora")
INIT_PASSES = (*DECOMPOSING_INITS, "loftq", "eva", "corda")  # run before step 1, saved for a resume


def init_peak_bytes(config: Any, *, dtype: torch.dtype, target_modules: Any, spec: Any,
                    device: str = "cpu") -> int:
    """Predicted peak (bytes, source: predicted) of attaching ``spec`` with its decomposing
    initialisation to the causal LM of ``config`` held in ``dtype``: the model built on the meta
    device and peft's initialisation run on it under the tracker (the SVD / QR of meta tensors
    gives the factors' shapes).

    Raises:
        ValueError: ``spec`` has no decomposing initialisation.
    """
    from lora_gui.memory.predict.trace import CUDA_CONTEXT_BYTES
    from lora_gui.memory.predict.trace_build import build_text_model
    from lora_gui.memory.runtime.tracker import StorageTracker
    from lora_gui.models.adapters import attach_adapter

    if spec.init not in DECOMPOSING_INITS:
        raise ValueError(f"lora_init {spec.init!r} does not decompose weights")
    model = build_text_model(config, attn_implementation="sdpa", dtype=dtype, lora_rank=spec.rank,
                             lora_alpha=spec.alpha, target_modules=target_modules, lora=False)
    tracker = StorageTracker()  # on the meta device: shapes and dtypes, storages of their size
    tracker.track([*model.parameters(), *model.buffers()])
    with tracker, torch.device("meta"):  # peft's new layers on the meta device too
        attach_adapter(model, dataclasses.replace(spec, dropout=0.0), target_modules, task_type="CAUSAL_LM")
    return tracker.peak_bytes + (CUDA_CONTEXT_BYTES if device == "cuda" else 0)


def measured_init(model: nn.Module, attach: Any, device: torch.device,
                  inputs: Sequence[torch.Tensor] = ()) -> tuple[Any, int, str]:
    """Runs ``attach()`` (the run's own adapter attach) and measures its peak: the CUDA
    allocator's on a GPU (everything on the card counts), else the tracker's over the model's
    tensors, ``inputs`` (what the pass reads, made before it: EVA's batches) and what the attach
    makes. Returns (attach's result, peak bytes, source)."""
    from lora_gui.memory.runtime.tracker import MEMORY_SOURCE, StorageTracker

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        result = attach()
        return result, int(torch.cuda.max_memory_allocated(device)), "cuda_allocator"
    tracker = StorageTracker()
    tracker.track([*model.parameters(), *model.buffers(), *inputs])
    with tracker:
        result = attach()
    return result, tracker.peak_bytes, MEMORY_SOURCE


def corda_peak_bytes(config: Any, *, dtype: torch.dtype, target_modules: Any, spec: Any,
                     tokens: int, device: str = "cpu") -> int:
    """Predicted peak (bytes, source: predicted) of CorDA's preprocessing (peft's
    ``preprocess_corda``), closed form over the adapted layers of the model built on the meta
    device. What is modelled: the model's weights and buffers; one float32 covariance matrix
    (in x in) per adapted layer, all alive from the first sample until the adapter is built;
    while layer i is decomposed, the full factors kept for layers before it (U: out x m,
    S: m, V: in x m, m = min(out, in), float32, cropped to rank r only after the last layer),
    and layer i's own temporaries at the larger of two moments: the inversion check (damping,
    damped covariance, inverse, identity and their product: 5 in x in, and their distance) or
    after the SVD (damping, damped covariance, inverse, ``W C``, U, S, Vh and ``Vh C^-1``), plus a float32
    copy of the weight when it is not float32; and the end of each forward over one sample of
    ``tokens`` (at most ``max_seq_len``): every covariance and the sample's logits (tokens x
    vocabulary in ``dtype``). Not modelled: the forward's other activations (one row, freed
    before the logits peak) and LAPACK's workspace (not a tensor)."""
    from peft import LoraConfig
    from peft.tuners.lora.corda import target_modules as corda_targets
    from peft.tuners.tuners_utils import _maybe_include_all_linear_layers

    from lora_gui.memory.predict.trace import CUDA_CONTEXT_BYTES
    from lora_gui.memory.predict.trace_build import build_text_model

    model = build_text_model(config, attn_implementation="sdpa", dtype=dtype, lora_rank=spec.rank,
                             lora_alpha=spec.alpha, target_modules=target_modules, lora=False)
    weights = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
    lora = _maybe_include_all_linear_layers(LoraConfig(r=spec.rank, target_modules=target_modules), model)
    shapes = [tuple(m.weight.shape) for _, m in corda_targets(model, lora)]
    f32 = 4
    live = weights + sum(i * i for _, i in shapes) * f32  # every covariance matrix
    vocab = model.get_output_embeddings().weight.shape[0]
    peak = live + tokens * vocab * torch.empty((), dtype=dtype).element_size()  # a sample's logits
    for out, inp in shapes:
        m = min(out, inp)
        copy = out * inp * f32 if dtype != torch.float32 else 0
        check = 5 * inp * inp + 1  # and torch.dist's result, one float32 beside them
        after = 3 * inp * inp + out * inp + out * m + m + 2 * m * inp
        peak = max(peak, live + copy + max(check, after) * f32)
        live += (out * m + m + inp * m) * f32  # this layer's full U, S, V stay until the crop
    return peak + (CUDA_CONTEXT_BYTES if device == "cuda" else 0)


def loftq_peak_bytes(config: Any, *, dtype: torch.dtype, target_modules: Any, spec: Any,
                     resident_bytes: int, device: str = "cpu") -> int:
    """Predicted peak (bytes, source: predicted) of LoftQ on a 4-bit base (peft's
    ``replace_lora_weights_loftq``): ``resident_bytes`` (the 4-bit model and its adapter, as the
    step's trace counts them) plus the largest adapted layer's pass, traced on the meta device
    with peft's own ``_low_rank_decomposition``: the original weight read from the safetensors
    file (in the checkpoint's dtype; on a GPU its float32 copy on the card), its dequantized
    4-bit copy (in ``dtype``), the float32 rounding error and its SVD (U, S, Vh, and the rank-r
    factors that become B and A). Layers run one at a time."""
    from peft import LoraConfig
    from peft.tuners.lora.corda import target_modules as adapted
    from peft.tuners.tuners_utils import _maybe_include_all_linear_layers
    from peft.utils.loftq_utils import _low_rank_decomposition

    from lora_gui.memory.predict.trace import CUDA_CONTEXT_BYTES
    from lora_gui.memory.predict.trace_build import build_text_model
    from lora_gui.memory.runtime.tracker import StorageTracker

    model = build_text_model(config, attn_implementation="sdpa", dtype=dtype, lora_rank=spec.rank,
                             lora_alpha=spec.alpha, target_modules=target_modules, lora=False)
    lora = _maybe_include_all_linear_layers(LoraConfig(r=spec.rank, target_modules=target_modules), model)
    shapes = {tuple(m.weight.shape) for _, m in adapted(model, lora)}
    file_dtype = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None) or torch.float32
    file_dtype = getattr(torch, file_dtype) if isinstance(file_dtype, str) else file_dtype
    layer = 0
    for out, inp in shapes:
        tracker = StorageTracker()
        with tracker, torch.device("meta"):
            weight = torch.empty(out, inp, dtype=torch.float32 if device == "cuda" else file_dtype)
            dequantized = torch.empty(out, inp, dtype=dtype)
            residual = weight.to(torch.float32) - dequantized
            factors = _low_rank_decomposition(residual, reduced_rank=spec.rank)
            del factors, residual, weight, dequantized
        layer = max(layer, tracker.peak_bytes)
    return resident_bytes + layer + (CUDA_CONTEXT_BYTES if device == "cuda" else 0)
