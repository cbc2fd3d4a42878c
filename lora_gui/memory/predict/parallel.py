"""Per-GPU memory of a data-parallel run (source: predicted), from a one-GPU prediction.

Data parallel across N processes (``accelerate launch --num_processes N``), as the engine runs it
(:mod:`lora_gui.engine.core.distributed`, :mod:`lora_gui.engine.core.fsdp`):

- **DDP** (replicated): every GPU holds the whole model, so the per-GPU peak of a micro-batch is
  the one-GPU peak. N GPUs give N times the global batch at the same micro-batch. The LoRA
  gradients are all-reduced once a step in buckets of at most 25 MB (DDP's default
  ``bucket_cap_mb``): ``allreduce_bucket_bytes`` in ``info``, allocated after backward when the
  activations are gone, so it is noted, not added to the peak.
- **FSDP** (frozen weights sharded, LoRA replicated): each GPU stores 1/N of every frozen
  parameter (``frozen_weights``: the total over N, rounded up) plus, under ``quantization: nf4``,
  the whole quantization state (the 4-bit blocks' scales are module attributes, not parameters:
  FSDP does not shard them). ``fsdp_gathered`` is what FSDP holds unsharded at the step's peak,
  in separate storages beside the rank's own shards: the output head + final norm (+ the
  embedding when tied; kept gathered from forward into backward) and the decoder layers being
  run: one on a CPU (measured on the bundled model with the tracker, 2 and 3 processes) and two
  on CUDA (the running one and the one prefetched on another stream; not measured here).
  A unit's bytes are counted exactly from the config: a layer's Linear weights (nf4: two a byte)
  and norms, the head and embedding in the weights' dtype.
- **FSDP with parameter offload** (``offload``, GPUs only): the shards live in host memory and
  are copied to the GPU for each all-gather, so the GPU holds the quantization state, the
  gathered units and the copy of the unit being gathered (``fsdp_offload_staging``); the host
  holds every rank's shards: ``fsdp_offload_host_bytes`` per machine (all N on one machine).
- **Loading under FSDP**: only the main process loads the base (:mod:`lora_gui.engine.core.
  fsdp_loading`); it holds the whole base plus its shard until every tensor is sent
  (``fsdp_load_main_bytes``: on a GPU run on its card, on a CPU in host memory), every other
  process its shard, the quantization state and the one tensor in flight
  (``fsdp_load_other_bytes``); on a CPU ``fsdp_load_host_bytes`` is the machine's sum. These
  come before step 1 and are not in the step's peak. A ``lora_init`` pass runs on the main
  process alone before sharding, over the whole base (``frozen_whole_bytes``: the frozen bytes
  before sharding, which LoftQ's planned pass keeps resident).

The result is additive on the one-GPU prediction, so it applies to the trace, the closed-form
estimate and the UNet estimate alike. Not modelled: FSDP's all-gather staging buffers (a copy of
the rank's shard of the unit being gathered and the flat output, alive while a unit is gathered,
not at the step's peak on the bundled model) and communication buffers of the backend.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from lora_gui.memory.predict.trace import TraceResult

BUCKET_BYTES = 25 * 2**20  # the engine's all-reduce bucket (DDP's bucket_cap_mb default)
GPU_COUNTS = (2, 4, 8)  # columns of the "what fits where" table


@dataclass(frozen=True)
class Parallel:
    """How many processes share the run, and whether FSDP shards the frozen weights."""

    world_size: int = 1
    fsdp: bool = False
    offload: bool = False  # FSDP's parameter offload: the shards in host memory (GPUs)

    def __post_init__(self) -> None:
        if not isinstance(self.world_size, int) or self.world_size < 1:
            raise ValueError(f"world_size must be a whole number >= 1, got {self.world_size!r}")
        if self.offload and not self.fsdp:
            raise ValueError("parameter offload is FSDP's: ask for FSDP too (--fsdp)")

    @property
    def sharded(self) -> bool:
        return self.fsdp and self.world_size > 1

    def label(self) -> str:
        if self.world_size == 1:
            return "1 GPU"
        kind = "FSDP (frozen weights sharded)" if self.fsdp else "DDP (replicated)"
        if self.offload:
            kind = "FSDP (frozen weights sharded, offloaded to host memory)"
        return f"{self.world_size} GPUs, {kind}"


@dataclass(frozen=True)
class FrozenLayout:
    """The frozen weights by FSDP unit, in bytes."""

    layer: int  # one decoder layer's parameters (Linear weights, nf4: packed; its norms)
    tail: int  # the unit kept gathered: output head + final norm (+ the embedding when tied)
    embed: int  # the untied input embedding (a unit of its own); 0 when tied
    quant_state: int  # every layer's 4-bit scales and code books: not parameters, never sharded
    params: int  # all frozen parameters (what FSDP shards)
    largest: int = 0  # the largest single frozen tensor (what loading broadcasts at once)


def frozen_layout(config: Any, frozen_bytes: int, quantization: str = "none") -> FrozenLayout:
    """Splits a one-GPU prediction's ``frozen_weights`` into FSDP's units (Llama-style decoder).

    The dtype of the unquantized weights is the one that makes the config's parameter counts add
    up to ``frozen_bytes``; under nf4 the Linear weights take half a byte each and what is left
    is the quantization state. UNet (dict config): no head; the blocks (down, mid, up) share the
    weights equally (approximate: their sizes differ).
    """
    if isinstance(config, dict):
        blocks = len(config.get("down_block_types", ())) + len(config.get("up_block_types", ())) + 1
        return FrozenLayout(frozen_bytes // max(blocks, 1), 0, 0, 0, frozen_bytes)
    hidden = getattr(config, "hidden_size", None) or getattr(config, "n_embd", 0)
    vocab = getattr(config, "vocab_size", 0)
    layers = getattr(config, "num_hidden_layers", None) or getattr(config, "n_layer", 1)
    tied = bool(getattr(config, "tie_word_embeddings", False))
    linear, norms = _layer_counts(config, hidden)
    dense = layers * norms + vocab * hidden * (1 if tied else 2) + hidden  # unquantized parameters
    if quantization == "nf4":
        packed = layers * (linear // 2)  # two 4-bit weights a byte
        width = min((4, 2), key=lambda w: abs(frozen_bytes - packed - dense * w - packed / 16))
        quant_state = max(0, frozen_bytes - packed - dense * width)
        layer = linear // 2 + norms * width
    else:
        per_weight = frozen_bytes / max(layers * linear + dense, 1)
        width = min((2, 4), key=lambda w: abs(per_weight - w))  # the weights' dtype, bytes
        quant_state, layer = 0, (linear + norms) * width
    head = (vocab * hidden + hidden) * width
    embed = 0 if tied else vocab * hidden * width
    inter = getattr(config, "intermediate_size", None) or 4 * hidden
    mlp = hidden * inter // 2 if quantization == "nf4" else hidden * inter * width  # one MLP matrix
    largest = max(vocab * hidden * width, mlp)
    return FrozenLayout(layer, head, embed, quant_state, frozen_bytes - quant_state, largest)


def _layer_counts(config: Any, hidden: int) -> tuple[int, int]:
    """(Linear weights, norm weights) of one decoder layer, Llama-style, from its config."""
    inter = getattr(config, "intermediate_size", None) or 4 * hidden
    heads = getattr(config, "num_attention_heads", 1)
    head_dim = getattr(config, "head_dim", None) or hidden // max(heads, 1)
    kv = (getattr(config, "num_key_value_heads", None) or heads) * head_dim
    return 2 * hidden * heads * head_dim + 2 * hidden * kv + 3 * hidden * inter, 2 * hidden


def gathered_layers(device: str) -> int:
    """Decoder layers FSDP holds unsharded at the step's peak: one on a CPU (measured), two on
    CUDA (FSDP2's backward prefetch gathers the next layer on its own stream)."""
    return 2 if device == "cuda" else 1


def per_gpu(step: TraceResult, config: Any, parallel: Parallel | None) -> TraceResult:
    """The one-GPU prediction turned into one GPU's share of a data-parallel run.

    Raises:
        ValueError: int8 weights under FSDP, or parameter offload on a CPU (what to do instead).
    """
    if parallel is None or parallel.world_size == 1:
        return step
    n = parallel.world_size
    breakdown = dict(step.breakdown)
    info = dict(step.info, world_size=n, fsdp=parallel.fsdp,
                allreduce_bucket_bytes=min(BUCKET_BYTES, step.breakdown.get("lora_params", 0)))
    quantization = step.info.get("quantization", "none")
    if parallel.sharded and quantization == "int8":
        raise ValueError("quantization: int8 cannot be sharded by FSDP (its row scales live outside "
                         "the parameters); use quantization: nf4, or several processes without FSDP")
    if parallel.offload and step.device != "cuda":
        raise ValueError("parameter offload moves FSDP's shards from the GPU to host memory: plan it "
                         "for a GPU (--device cuda or --card NAME); on a CPU the weights are in host "
                         "memory already")
    if parallel.sharded:
        units = frozen_layout(config, breakdown["frozen_weights"], quantization)
        shard = math.ceil(units.params / n)
        breakdown["frozen_weights"] = units.quant_state + (0 if parallel.offload else shard)
        breakdown["fsdp_gathered"] = units.tail + gathered_layers(step.device) * units.layer
        info["fsdp_units"] = {"layer": units.layer, "tail": units.tail, "embed": units.embed,
                              "quant_state": units.quant_state, "shard": shard}
        # what the main process holds before sharding, where a lora_init pass runs (it alone)
        info["frozen_whole_bytes"] = step.breakdown["frozen_weights"]
        # loading (before step 1): the main process alone loads the whole base and keeps it while
        # it sends each tensor (engine/core/fsdp_loading.py); each other process holds its shard
        # and the tensor in flight. On a GPU the main process loads onto its card.
        main_load = units.params + units.quant_state + shard
        other_load = shard + units.quant_state + units.largest
        info["fsdp_load_main_bytes"], info["fsdp_load_other_bytes"] = main_load, other_load
        if step.device == "cpu":  # every process in host memory: one whole copy, the rest shards
            info["fsdp_load_host_bytes"] = main_load + (n - 1) * other_load
        if parallel.offload:  # the unit being gathered: its shard copied to the GPU first
            breakdown["fsdp_offload_staging"] = math.ceil(max(units.layer, units.tail) / n)
            info["fsdp_offload_host_bytes"] = shard * n  # every rank's shards on one machine
            info["host_bytes"] = int(info.get("host_bytes", 0) or 0) + shard * n
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
