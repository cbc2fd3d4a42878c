"""PEFT's Llama-2-70B figures read as the peak of their whole run: the checkpoint their trainer
writes at the end of the epoch, term by term.

Their run (the setup is in :mod:`bench.memory.fsdp_qlora_terms`) saves a checkpoint at the end of
its one epoch (``--save_strategy epoch``) with ``fsdp_state_dict_type: SHARDED_STATE_DICT``.
transformers' Trainer saves an FSDP model with accelerate's ``save_fsdp_model(...,
adapter_only=True)``, which asks peft's ``get_peft_model_state_dict`` for the adapter; given no
state dict, that calls ``model.state_dict()`` on the FSDP root (peft 6008f272a
src/peft/utils/save_and_load.py): the whole model's sharded state dict, before the adapter's keys
are picked out of it. FSDP1 builds it unit by unit: the unit's weights are gathered on the GPU
(``_sharded_pre_state_dict_hook`` unshards with ``offload_to_cpu=False`` whatever the config),
each parameter's chunk for this rank is cloned into a ShardedTensor (``_create_chunk_sharded_tensor``:
``chunks[rank].clone()``, on the GPU) and moved to the CPU only when the state-dict config says
``offload_to_cpu`` (``_sharded_post_state_dict_hook``). accelerate sets that for
SHARDED_STATE_DICT only from v0.31.0 (commit 67308ca6, 10 May 2024, "Enable sharded cpu
resume"); the page (March 2024) asks for accelerate >= 0.28.0, whose ``set_state_dict_type``
configures FULL_STATE_DICT alone and so leaves FSDP's default ``offload_to_cpu=False``. Every
parameter's shard is then copied on the GPU: a second copy of the 4-bit shards beside the
resident ones without offload, the only one on the GPU with offload. The root unit (embedding,
final norm and head in their wrap) stays gathered through the whole walk, its hooks running
before and after its children's.

Each term is planned (the "PEFT's LoRA" rows' breakdown and CUDA overheads in the results file)
or arithmetic from the shapes; nothing is measured. The sum is a floor for what nvidia-smi shows:
the caching allocator's reserve beyond the live blocks is not counted.
"""

from __future__ import annotations

from typing import Any

from bench.memory.fsdp_qlora_terms import BF16, PROCESSES, PUBLISHED_GB, planned_row, shapes

GIB = 2**30


def save_terms(results: dict[str, Any]) -> list[tuple[str, float, float, str]]:
    """(term, GB with offload, GB without, source) rows of the save's peak per GPU."""
    s = shapes()
    gb = 1e9
    with_off, without = planned_row(results, "PEFT's LoRA", True), planned_row(results, "PEFT's LoRA", False)
    scales = with_off["breakdown"]["frozen_weights"]  # with offload the GPU keeps the 4-bit scales alone
    shard = without["breakdown"]["frozen_weights"] - scales  # this rank's shard of the frozen weights
    lora_shard = s["lora_params"] * BF16 / PROCESSES
    root = 2 * s["vocab"] * s["hidden"] * BF16  # embedding and head, bf16 (the norm: 16 KB)
    layer = s["layer_params"] / 2  # a decoder layer's 4-bit weights, two a byte, gathered
    overheads = {k: with_off["cuda_overheads"][k]
                 for k in ("cuda_context", "nccl_buffers", "cublas_workspace")}
    return [
        ("resident, planned: every layer's 4-bit scales (never sharded); without offload also this "
         "rank's shard of the 4-bit weights, embedding and head",
         scales / gb, (scales + shard) / gb, "planned (breakdown: frozen_weights)"),
        ("resident, their LoRA in bf16: without offload the shards of its weights and AdamW's two "
         f"moments (no gradient after zero_grad), {s['lora_params']:,} x 2 bytes x 3 / 2; with offload "
         "all on the CPU",
         0.0, 3 * lora_shard / gb, "arithmetic (as in the step's table)"),
        ("the sharded state dict: this rank's chunk of every parameter cloned on the GPU, the frozen "
         f"weights' shard and LoRA's ({lora_shard / gb:.2f} GB)",
         (shard + lora_shard) / gb, (shard + lora_shard) / gb,
         "arithmetic (torch/distributed/fsdp/_shard_utils.py `_create_chunk_sharded_tensor`, "
         "_state_dict_utils.py; accelerate v0.28.0 utils/dataclasses.py `set_state_dict_type`)"),
        (f"the root unit gathered through the walk: embedding and head, 2 x {s['vocab']:,} x "
         f"{s['hidden']:,} x 2 bytes",
         root / gb, root / gb, "arithmetic (torch/distributed/fsdp/_state_dict_utils.py)"),
        ("at the last decoder layer, beyond the clones so far: the layer gathered "
         f"({layer / gb:.2f} GB) and, with offload, its shard first copied to the GPU "
         f"({layer / PROCESSES / gb:.2f} GB), before the root's own chunks ({root / PROCESSES / gb:.2f} GB) "
         "are cloned at the end of the walk; without offload the end is the peak",
         max(0.0, layer + layer / PROCESSES - root / PROCESSES) / gb,
         max(0.0, layer - root / PROCESSES) / gb,
         "arithmetic (torch/distributed/fsdp/_flat_param.py `pre_unshard`)"),
        ("the CUDA context, NCCL's buffers and cuBLAS's workspace, as the step's plan counts them",
         sum(overheads.values()) / gb, sum(overheads.values()) / gb, "planned (cuda_overheads)"),
    ]


def save_table(results: dict[str, Any]) -> dict[str, Any]:
    """The docs table (bench.docs renders it), stamped as the results it reads."""
    rows = save_terms(results)
    sums = [sum(r[1] for r in rows), sum(r[2] for r in rows)]
    published = [PUBLISHED_GB["offload"], PUBLISHED_GB["no_offload"]]
    cells = [[name, f"{a:.2f}", f"{b:.2f}", source] for name, a, b, source in rows]
    cells += [["sum (GB)", f"{sums[0]:.2f}", f"{sums[1]:.2f}", ""],
              ["the sum in GiB (nvidia-smi's MiB / 1,024)", f"{sums[0] * 1e9 / GIB:.2f}",
               f"{sums[1] * 1e9 / GIB:.2f}", ""],
              ["PEFT's figure", f"{published[0]}", f"{published[1]}", "their page"],
              ["sum against their figure read as GB",
               *[f"{s / p - 1:+.1%}" for s, p in zip(sums, published, strict=True)], ""],
              ["sum against their figure read as GiB",
               *[f"{s * 1e9 / GIB / p - 1:+.1%}" for s, p in zip(sums, published, strict=True)], ""]]
    meta = {**results["meta"],
            "made_by": "bench/memory/fsdp_qlora_save.py from bench/results/fsdp_qlora_70b.json",
            "command": "OMP_NUM_THREADS=1 PYTHONPATH=. .venv/bin/python -m bench.memory.fsdp_qlora_70b "
                       "--tables"}
    return {"meta": meta,
            "title": "Llama-2-70B: PEFT's published GB per GPU as the peak of their epoch-end checkpoint",
            "columns": ["term", "GB with offload", "GB without", "source"], "rows": cells}
