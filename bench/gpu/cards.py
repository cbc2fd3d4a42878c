"""The GPU check's ``card`` and ``grads`` sections (bench/gpu/check.py): Llama nf4 under each
card's memory at the lengths ``plan --card NAME --longest`` gives, each memory switch turned the
other way; and the LoRA gradients with the rebuilds against without them."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from bench.gpu import plans as gpu_plans
from bench.gpu.step_measure import PLAN_ONLY, materialized, release
from lora_gui.memory.predict import trace as tr
from lora_gui.memory.predict.model_configs import load_model_config
from lora_gui.models.checkpointing import enable_checkpointing


def _step_under(model, optimizer, ids, budget: int, device: str) -> dict[str, Any]:
    """One warm and one measured step with the allocator capped as the card would cap it (the
    card's memory less the CUDA context the plan counts): max allocated / reserved, or the OOM."""
    out: dict[str, Any] = {"measured_bytes": 0, "measured_reserved_bytes": 0, "out_of_memory": False}
    if device == "cuda":
        release()
        usable = (budget - tr.CUDA_CONTEXT_BYTES) / torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(max(0.0, min(1.0, usable)))
    try:
        for measured in (False, True):  # a warm step first: the optimizer state exists
            if measured and device == "cuda":
                release()
                torch.cuda.reset_peak_memory_stats()
            model(input_ids=ids, labels=ids, use_cache=False).loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        if device == "cuda":
            torch.cuda.synchronize()
            out.update(measured_bytes=torch.cuda.max_memory_allocated(),
                       measured_reserved_bytes=torch.cuda.max_memory_reserved())
    except torch.OutOfMemoryError as err:
        out["out_of_memory"] = " ".join(str(err).split())[:600]
    finally:
        if device == "cuda":
            torch.cuda.set_per_process_memory_fraction(1.0)
    if out["out_of_memory"] and device == "cuda":  # how far the plan was: the same steps uncapped
        optimizer.zero_grad(set_to_none=True)
        release()
        for measured in (False, True):
            if measured:
                release()
                torch.cuda.reset_peak_memory_stats()
            model(input_ids=ids, labels=ids, use_cache=False).loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        out.update(uncapped_measured_bytes=torch.cuda.max_memory_allocated(),
                   uncapped_reserved_bytes=torch.cuda.max_memory_reserved())
    return out


OVER = 1.02  # the +2% row above each longest answer: it must run out of memory or come within the margin


def _over(seq: int) -> int:
    """The length 2% above a longest answer, in the search's steps of 64 tokens."""
    return -(-int(seq * OVER) // 64) * 64


def check_card(config: Any, cards: list[str], lengths: list[int], device: str) -> list[dict[str, Any]]:
    """Llama nf4, LoRA r32 all-linear, batch 1, under each card's memory (the CUDA context
    counted): at ``lengths`` (first card), at the longest length ``plan --card NAME --longest``
    gives (with its switches and its margin for savings no card has confirmed) and 2% above it;
    on the first card the answer again with each memory switch the other way (the rebuilds, the
    attention head groups, offloaded checkpoints, the chunked loss). Per row: planned allocated /
    reserved / nvidia-smi and the kernel's backward workspace vs the measured
    max_memory_allocated / max_memory_reserved, whether it ran out of memory, and whether that
    agrees with the plan (a planned length must not run out of memory; the +2% row must, or come
    within the margin the answer kept)."""
    import dataclasses
    import tempfile
    import types

    from bench.memory.quant_measure import save_random_model
    from lora_gui.attention.head_groups import key_value_heads, register_head_groups
    from lora_gui.cards import card_by_name
    from lora_gui.config import RunConfig, apply_overrides
    from lora_gui.engine.core.optim import make_optimizer
    from lora_gui.memory.predict.longest_text import longest_text
    from lora_gui.memory.predict.run_plan import step_kwargs
    from lora_gui.models import text as text_models
    from lora_gui.models.long_context import apply_long_context
    from lora_gui.models.stand_ins import rebuilds_made

    cfg = load_model_config(config)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as folder:
        if PLAN_ONLY[0]:
            cfg.save_pretrained(folder)  # the plan reads the config alone
        else:
            with torch.device(device):  # random weights made on the device: seconds, not minutes
                save_random_model(cfg, folder, dtype=dtype)
        base = apply_overrides(RunConfig(), {
            "model": folder, "quantization": "nf4", "lora_rank": 32, "lora_alpha": 32.0, "batch_size": 1,
            "lora_targets": "all-linear", "precision": "bf16" if device == "cuda" else "fp32"})
        for k, name in enumerate(cards):
            card = card_by_name(name)
            key = f"card:{name}:{cfg.hidden_size}x{cfg.num_hidden_layers}:{dtype}"
            longest = gpu_plans.planned(f"{key}:longest", lambda c=card: dataclasses.asdict(longest_text(
                base, c.total_bytes, "cuda", count_cuda_context=True)))
            answer = types.SimpleNamespace(**longest)
            run = apply_overrides(base, {**answer.switches, "max_seq_len": max(_over(answer.seq_len), 16)})
            # (length, settings, rebuilds made, what the row checks)
            runs = [(seq, run, True, "as planned") for seq in [*(lengths if k == 0 else []), answer.seq_len]]
            runs.append((_over(answer.seq_len), run, True, "+2% over the answer"))
            if k == 0:
                groups = 0 if run.attention_head_groups > 1 else key_value_heads(cfg)
                runs += [(answer.seq_len, run, False, "rebuilds off"),
                         (answer.seq_len, replace(run, attention_head_groups=groups), True,
                          f"head groups {'off' if groups == 0 else 'on'}"),
                         (answer.seq_len, replace(run, offload_checkpoints=not run.offload_checkpoints,
                                                  gradient_checkpointing=True),  # offload needs it
                          True, f"offloaded checkpoints {'off' if run.offload_checkpoints else 'on'}"),
                         (answer.seq_len, replace(run, loss_chunk=0 if run.loss_chunk else 1024), True,
                          f"chunked loss {'off' if run.loss_chunk else 'on'}")]
            plans = []
            for seq, at, rebuilt, _what in runs:
                def trace(seq=seq, at=at, rebuilt=rebuilt):
                    with rebuilds_made(rebuilt):
                        return tr.trace_text_step(cfg, batch_size=1, seq_len=seq, **step_kwargs(at, "cuda"))
                plans.append(gpu_plans.planned(
                    f"{key}:{seq}:{at.attention_head_groups}:{at.offload_checkpoints}:{at.loss_chunk}:{rebuilt}",
                    trace))
            if PLAN_ONLY[0]:
                continue
            built: dict[tuple, Any] = {}
            for (seq, at, rebuilt, what), planned in zip(runs, plans):
                # what needs a model built its own way
                shape = (at.offload_checkpoints, at.gradient_checkpointing, at.loss_chunk)
                if shape not in built:
                    built.clear()
                    if device == "cuda":
                        release()
                    model = text_models.attach_lora(
                        text_models.load_model_for(at, folder, dtype, torch.device(device)), at)
                    if at.gradient_checkpointing:
                        enable_checkpointing(model)
                    apply_long_context(model, offload_checkpoints=at.offload_checkpoints,
                                       mlp_chunk=at.mlp_chunk, embeddings_on_host=at.embeddings_on_host)
                    base_model = model.get_base_model() if hasattr(model, "get_base_model") else model
                    register_head_groups(base_model.config._attn_implementation)
                    model.train()
                    optimizer, _ = make_optimizer(at, [p for p in model.parameters() if p.requires_grad],
                                                  torch.device(device))
                    built[shape] = (model, optimizer)
                model, optimizer = built[shape]
                _set_head_groups(model, at.attention_head_groups)
                ids = torch.randint(0, cfg.vocab_size, (1, seq), device=device)
                fits = planned.peak_bytes <= card.total_bytes
                row = {"model": f"llama {cfg.hidden_size}x{cfg.num_hidden_layers} nf4 r32",
                       "card": card.name, "budget_bytes": card.total_bytes, "seq_len": seq, "row": what,
                       "planned_longest": seq == answer.seq_len and what == "as planned",
                       "attention_head_groups": at.attention_head_groups, "rebuilds": rebuilt,
                       "planned_to_fit": fits, "margin_bytes": answer.margin_bytes,
                       "reserve_margin_bytes": answer.reserve_margin_bytes,
                       "unconfirmed_savings": answer.unconfirmed,
                       "predicted_reserved_unlimited_bytes": planned.info.get("allocator_replay", {}).get(
                           "peak_reserved", 0),
                       "switches": answer.switches, "kernel": planned.info.get("kernel"),
                       "attention_workspace_bytes": planned.info.get("attention_workspace_bytes", 0),
                       "predicted_bytes": planned.allocator_peak_bytes,
                       "predicted_reserved_bytes": planned.reserved_peak_bytes,
                       "predicted_nvidia_smi_bytes": planned.peak_bytes,
                       "host_bytes": planned.info["host_bytes"]}
                with rebuilds_made(rebuilt):
                    row.update(_step_under(model, optimizer, ids, card.total_bytes, device))
                measured, reserved = row["measured_bytes"], row["measured_reserved_bytes"]
                row["error"] = planned.allocator_peak_bytes / measured - 1 if measured else None
                row["reserved_error"] = planned.reserved_peak_bytes / reserved - 1 if reserved else None
                # a plan that fits must run; one over the card must run out of memory, or run within
                # the margin the answer kept (its unconfirmed savings)
                ran = not row["out_of_memory"]
                margin = answer.margin_bytes + answer.reserve_margin_bytes
                row["agrees"] = ran if fits else (not ran or planned.peak_bytes - card.total_bytes <= margin)
                rows.append(row)
            built.clear()
            if device == "cuda":
                release()
    return rows


def check_rebuild_grads(config: Any, seq: int, device: str) -> list[dict[str, Any]]:
    """The LoRA gradients of one step with the rebuilds (norm, feed-forward and attention
    outputs recomputed in the backward) and without them, on the same weights and tokens: the
    largest difference relative to each tensor's largest gradient. Tolerance: 1e-2 in bf16 (8
    significant bits: one rounding is 2**-8 = 0.4%, and the recompute may run other kernels),
    1e-5 in float32."""
    from lora_gui.models.stand_ins import rebuilds_made

    cfg = load_model_config(config)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    if PLAN_ONLY[0]:
        return []
    torch.manual_seed(0)
    model = tr.build_text_model(cfg, attn_implementation="sdpa", dtype=dtype, lora_rank=16, lora_alpha=None,
                                target_modules="all-linear", lean_backward=True)
    model = materialized(model, device, dtype)
    for name, p in model.named_parameters():  # B = 0 at init: give the LoRA a gradient path through both
        if "lora_B" in name:
            with torch.no_grad():
                p.normal_(0, 0.02)
    ids = torch.randint(0, cfg.vocab_size, (1, seq), device=device)
    grads = []
    for rebuilt in (True, False):
        model.zero_grad(set_to_none=True)
        with rebuilds_made(rebuilt), torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda"):
            model(input_ids=ids, labels=ids, use_cache=False).loss.backward()
        grads.append({n: p.grad.float().clone() for n, p in model.named_parameters() if p.grad is not None})
    worst = max((float((grads[0][n] - grads[1][n]).abs().max() / grads[1][n].abs().max().clamp_min(1e-30)), n)
                for n in grads[1])
    tolerance = 1e-2 if dtype == torch.bfloat16 else 1e-5
    del model
    if device == "cuda":
        release()
    return [{"model": f"llama {cfg.hidden_size}x{cfg.num_hidden_layers}", "seq_len": seq, "dtype": str(dtype),
             "tensors": len(grads[1]), "max_relative_difference": worst[0], "worst_tensor": worst[1],
             "tolerance": tolerance, "within": worst[0] <= tolerance}]


def _set_head_groups(model: torch.nn.Module, groups: int) -> None:
    """Attention in ``groups`` calls per layer from now on (0: one call), on a built model."""
    from lora_gui.attention.head_groups import GROUPS_ATTR

    for module in model.modules():
        if hasattr(module, "num_key_value_groups") and hasattr(module, "k_proj"):
            setattr(module, GROUPS_ATTR, groups)
