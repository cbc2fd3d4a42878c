"""Per-GPU memory of a data-parallel run (source: predicted), from a one-GPU prediction.

Data parallel across N processes (``accelerate launch --num_processes N``), as the engine runs it
(:mod:`lora_gui.engine.core.distributed`, :mod:`lora_gui.engine.core.fsdp`):

- **DDP** (replicated): every GPU holds the whole model, so the per-GPU peak of a micro-batch is
  the one-GPU peak. N GPUs give N times the global batch at the same micro-batch. The LoRA
  gradients are all-reduced once a step in buckets of at most 25 MB (DDP's default
  ``bucket_cap_mb``): ``allreduce_bucket_bytes`` in ``info``, allocated after backward when the
  activations are gone, so it is noted, not added to the peak.
- **FSDP** (frozen weights sharded, LoRA replicated): each GPU stores 1/N of every frozen weight
  (``frozen_weights`` = total / N, rounded up per rank as FSDP pads dim 0), plus
  ``fsdp_gathered``: what is unsharded at the peak (start of backward): the output head + final
  norm (kept gathered from forward into backward) and two decoder layers (the one running and the
  one prefetched), less the rank's own shard of them.

The result is additive on the one-GPU prediction, so it applies to the trace, the closed-form
estimate and the UNet estimate alike. Not modelled: FSDP's all-gather staging buffers (a copy of
the rank's shard of the unit being gathered) and communication buffers of the backend.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from lora_gui.memory.predict.trace import TraceResult

BUCKET_BYTES = 25 * 2**20  # the engine's all-reduce bucket (DDP's bucket_cap_mb default)
GPU_COUNTS = (2, 4, 8)  # columns of the "what fits where" table
PREFETCHED_LAYERS = 2  # FSDP2 default: the running layer and the next one gathered ahead


@dataclass(frozen=True)
class Parallel:
    """How many processes share the run, and whether FSDP shards the frozen weights."""

    world_size: int = 1
    fsdp: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.world_size, int) or self.world_size < 1:
            raise ValueError(f"world_size must be a whole number >= 1, got {self.world_size!r}")

    @property
    def sharded(self) -> bool:
        return self.fsdp and self.world_size > 1

    def label(self) -> str:
        if self.world_size == 1:
            return "1 GPU"
        kind = "FSDP (frozen weights sharded)" if self.fsdp else "DDP (replicated)"
        return f"{self.world_size} GPUs, {kind}"


def frozen_units(config: Any, frozen_bytes: int) -> tuple[int, int]:
    """(bytes of the unit kept gathered: head + final norm, bytes of one decoder layer/block).

    Text: the output head is vocab x hidden (tied to the embedding or not, it is gathered at the
    end of forward); the layers share the rest equally. UNet (dict config): no head; the blocks
    (down, mid, up) share the weights equally (approximate: their sizes differ).
    """
    if isinstance(config, dict):
        blocks = len(config.get("down_block_types", ())) + len(config.get("up_block_types", ())) + 1
        return 0, frozen_bytes // max(blocks, 1)
    hidden = getattr(config, "hidden_size", None) or getattr(config, "n_embd", 0)
    vocab = getattr(config, "vocab_size", 0)
    layers = getattr(config, "num_hidden_layers", None) or getattr(config, "n_layer", 1)
    params = _param_count_guess(config, hidden, vocab, layers)
    per_param = frozen_bytes / params if params else 0.0  # bytes per frozen parameter (dtype)
    tied = getattr(config, "tie_word_embeddings", False)
    head = int((vocab * hidden + hidden) * per_param)
    embed = 0 if tied else int(vocab * hidden * per_param)
    return head, max(0, (frozen_bytes - head - embed) // max(layers, 1))


def _param_count_guess(config: Any, hidden: int, vocab: int, layers: int) -> int:
    """Frozen parameter count of a decoder from its config (Llama-style count; for the dtype)."""
    inter = getattr(config, "intermediate_size", None) or 4 * hidden
    heads = getattr(config, "num_attention_heads", 1)
    head_dim = getattr(config, "head_dim", None) or hidden // max(heads, 1)
    kv = (getattr(config, "num_key_value_heads", None) or heads) * head_dim
    per_layer = 2 * hidden * heads * head_dim + 2 * hidden * kv + 3 * hidden * inter + 2 * hidden
    tied = getattr(config, "tie_word_embeddings", False)
    return layers * per_layer + vocab * hidden * (1 if tied else 2) + hidden


def per_gpu(step: TraceResult, config: Any, parallel: Parallel | None) -> TraceResult:
    """The one-GPU prediction turned into one GPU's share of a data-parallel run."""
    if parallel is None or parallel.world_size == 1:
        return step
    n = parallel.world_size
    breakdown = dict(step.breakdown)
    info = dict(step.info, world_size=n, fsdp=parallel.fsdp,
                allreduce_bucket_bytes=min(BUCKET_BYTES, step.breakdown.get("lora_params", 0)))
    if parallel.sharded:
        frozen = breakdown["frozen_weights"]
        head, layer = frozen_units(config, frozen)
        breakdown["frozen_weights"] = math.ceil(frozen / n)
        breakdown["fsdp_gathered"] = int((head + PREFETCHED_LAYERS * layer) * (n - 1) / n)
    traced = sum(breakdown.values())
    overheads = dict(step.cuda_overheads)
    if step.device == "cuda":  # NCCL's own buffers, cudaMalloc'd beside the allocator (cuda_kernels)
        from lora_gui.memory.predict.cuda_kernels import nccl_rows

        overheads["nccl_buffers"] = sum(r.nbytes for r in nccl_rows(n))
    return replace(step, peak_bytes=traced + sum(overheads.values()), traced_peak_bytes=traced,
                   breakdown=breakdown, info=info, cuda_overheads=overheads)


def saving_bytes(step: TraceResult, config: Any, parallel: Parallel | None) -> int:
    """How much less one GPU holds than a single GPU would (on CUDA, less NCCL's buffers: negative
    without FSDP)."""
    return step.peak_bytes - per_gpu(step, config, parallel).peak_bytes
