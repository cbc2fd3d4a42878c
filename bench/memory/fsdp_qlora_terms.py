"""Where PEFT's published Llama-2-70B figures differ from the plan, term by term.

PEFT's page (docs/source/accelerate/fsdp.md, added by peft commit 6008f272a, 13 March 2024, with
its figures: 19.6 GB per GPU with CPU offload, 35.6 GB without) runs
examples/sft/run_peft_qlora_fsdp.sh with configs/fsdp_config_qlora.yaml: FSDP1, FULL_SHARD,
``use_orig_params: false``, ``TRANSFORMER_BASED_WRAP`` replaced by peft's
``fsdp_auto_wrap_policy`` (each decoder layer a unit, each trainable leaf Linear -- every
``lora_A`` / ``lora_B`` -- a unit of its own), ``BACKWARD_PRE`` prefetch, accelerate's default
``limit_all_gathers: true``, ``cpu_ram_efficient_loading``, bf16 weights (``--bf16``,
``bnb_4bit_quant_storage bfloat16``), LoRA r 8 on every Linear, micro-batch 2, gradient
accumulation 2, sequence 2,048, reentrant checkpointing.

Each row is the planned "PEFT's LoRA" row (source: predicted, from the results file) or an
arithmetic term from the model's shapes (``presets/models/llama-2-70b.json``) with the code that
makes it named. Nothing here is measured; the gap that stays is printed as such.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SHAPES = ROOT / "presets" / "models" / "llama-2-70b.json"
PUBLISHED_GB = {"offload": 19.6, "no_offload": 35.6}  # PEFT's page, per GPU
BF16 = 2  # bytes an element: their weights, LoRA weights, gradients and AdamW moments
PROCESSES = 2


def shapes() -> dict[str, int]:
    """The counts the terms use, from the public config of meta-llama/Llama-2-70b-hf."""
    c = json.loads(SHAPES.read_text(encoding="utf-8"))
    hidden, inter, layers, vocab = (c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"],
                                    c["vocab_size"])
    kv = hidden // c["num_attention_heads"] * c["num_key_value_heads"]
    linears = [(hidden, hidden), (hidden, kv), (hidden, kv), (hidden, hidden),  # q, k, v, o
               (hidden, inter), (hidden, inter), (inter, hidden)]  # gate, up, down
    return {"hidden": hidden, "vocab": vocab, "layers": layers,
            "layer_params": sum(i * o for i, o in linears),  # a decoder layer's 4-bit weights
            "lora_params": layers * sum(8 * (i + o) for i, o in linears)}  # r 8 on every Linear


def planned_row(results: dict[str, Any], step: str, offload: bool) -> dict[str, Any]:
    return next(r for r in results["rows"] if r["model"] == "llama-2-70b" and r["step"] == step
                and r["offload"] is offload)


def terms(results: dict[str, Any]) -> list[tuple[str, float, float, str]]:
    """(term, GB with offload, GB without, source) rows, the planned row first."""
    s = shapes()
    gb = 1e9
    with_off, without = planned_row(results, "PEFT's LoRA", True), planned_row(results, "PEFT's LoRA", False)
    stock = planned_row(results, "stock", True)
    lora_plan = {k: sum(r["breakdown"].get(n, 0) for n in ("lora_params", "gradients", "optimizer_state"))
                 for k, r in (("offload", with_off), ("no_offload", without))}
    lora_shard = s["lora_params"] * BF16 / PROCESSES  # their LoRA weights' shard, bf16
    embed = s["vocab"] * s["hidden"] * BF16
    layer_shard = s["layer_params"] / 2 / PROCESSES  # 4-bit: two weights a byte
    staging = with_off["breakdown"].get("fsdp_offload_staging", 0)
    return [
        (f"\"PEFT's LoRA\" row (dropout 0.1 adds {(with_off['gpu_bytes'] - stock['gpu_bytes']) / gb:.2f} GB "
         "to the stock step)",
         with_off["gpu_bytes"] / gb, without["gpu_bytes"] / gb, "planned"),
        ("FSDP1's root unit: peft's wrap policy wraps the decoder layers and the LoRA leaves, so the "
         "input embedding sits in the root unit with the final norm and the head, and FSDP1 does not "
         "free the root's gathered weights after the forward (`_post_forward_reshard`); here the "
         f"embedding is a unit of its own, resharded after use: {s['vocab']:,} x {s['hidden']:,} x 2 bytes",
         embed / gb, embed / gb, "arithmetic (torch/distributed/fsdp/_runtime_utils.py)"),
        ("the loss of transformers at the time (`logits.float()` then `logits[..., :-1, :].contiguous()`): "
         f"one more float32 copy of the logits than today's loss, 2 x 2,048 x {s['vocab']:,} x 4 bytes",
         2 * 2048 * s["vocab"] * 4 / gb, 2 * 2048 * s["vocab"] * 4 / gb, "arithmetic"),
        ("their LoRA: bf16 (peft then cast the adapter to the 4-bit weight's storage dtype, bf16 here; "
         "trl keeps it so for FSDP + QLoRA since May 2024), sharded by FSDP1 (each LoRA Linear a unit), "
         "AdamW's two moments in the weights' dtype: with offload all of it lives on the CPU (the plan "
         "keeps float32 weights and moments, whole, on the GPU); without, the GPU keeps the weights' and "
         f"the moments' shards, {s['lora_params']:,} x 2 bytes x 3 / 2",
         -lora_plan["offload"] / gb, (3 * lora_shard - lora_plan["no_offload"]) / gb,
         "arithmetic (peft 6008f272a src/peft/tuners/lora/layer.py `update_layer`; trl e4ed7a3 "
         "trl/trainer/sft_trainer.py)"),
        ("gradient accumulation 2: accelerate runs the first micro-batch under FSDP1's `no_sync`, which "
         "keeps whole (unsharded) gradients and, with CPU offload, keeps them on the GPU until the sync "
         f"(`FullyShardedDataParallel.no_sync`): the LoRA gradients, {s['lora_params']:,} x 2 bytes, "
         "alive through the second micro-batch",
         s["lora_params"] * BF16 / gb, s["lora_params"] * BF16 / gb,
         "arithmetic (accelerate/accelerator.py `no_sync`; torch/distributed/fsdp/"
         "fully_sharded_data_parallel.py)"),
        ("offload only: each all-gather first copies the unit's shard from host memory to the GPU "
         "(`FlatParamHandle.pre_unshard` -> `flat_param_to`), and FSDP1 lets two all-gathers run at "
         "once (`_limiter_utils`: 2 in flight): two decoder layers' shards, 2 x "
         f"{s['layer_params']:,} / 2 / 2 bytes, in place of the plan's one copy of the head's shard "
         f"({staging / gb:.2f} GB); an upper bound",
         (2 * layer_shard - staging) / gb, 0.0,
         "arithmetic (torch/distributed/fsdp/_flat_param.py, _limiter_utils.py)"),
    ]


def table(results: dict[str, Any]) -> dict[str, Any]:
    """The docs table (bench.docs renders it), stamped as the results it reads."""
    rows = terms(results)
    sums = [sum(r[1] for r in rows), sum(r[2] for r in rows)]
    def signed(gb: float) -> str:  # a term added to (or taken from) the planned row
        return f"{gb:+.2f}" if round(gb, 2) else "0"

    (name, a, b, source), *rest = rows
    cells = [[name, f"{a:.2f}", f"{b:.2f}", source]]
    cells += [[name, signed(a), signed(b), source] for name, a, b, source in rest]
    published = [PUBLISHED_GB["offload"], PUBLISHED_GB["no_offload"]]
    left = [p - s for p, s in zip(published, sums, strict=True)]
    cells += [["sum", f"{sums[0]:.2f}", f"{sums[1]:.2f}", ""],
              ["PEFT's figure", f"{published[0]}", f"{published[1]}", "their page"],
              ["not explained", f"{left[0]:.1f} ({-left[0] / published[0]:+.0%})",
               f"{left[1]:.1f} ({-left[1] / published[1]:+.1%})", ""]]
    meta = {**results["meta"],
            "made_by": "bench/memory/fsdp_qlora_terms.py from bench/results/fsdp_qlora_70b.json",
            "command": "OMP_NUM_THREADS=1 PYTHONPATH=. .venv/bin/python -m bench.memory.fsdp_qlora_70b "
                       "--tables"}
    return {"meta": meta, "title": "Llama-2-70B: PEFT's published GB per GPU against the plan, term by term",
            "columns": ["term", "GB with offload", "GB without", "source"], "rows": cells}
