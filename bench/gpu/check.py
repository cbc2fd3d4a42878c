"""Every GPU measurement the open issues ask for, in one prepared run (for a lent GPU machine).

    python -m bench.gpu.check --plan-only --plans bench/results/gpu_plans.json --out /tmp/x
                                                    # first, on a CPU: every row's plan (~10 min)
    python -m bench.gpu.check --plans bench/results/gpu_plans.json --out "$OUT"
                                                    # then on the GPU machine (~8 min on an H200)
    python -m bench.gpu.check --smoke --out /tmp/x  # on a CPU: tiny shapes, checks the code paths

Sections run in the order of ``--sections`` (context, text, card, grads, nf4, dit, unet, flex,
video, multi_gpu by default, video in bench/gpu/video.py, multi_gpu in bench/gpu/multi_gpu.py;
``peers``, TRL against lora_gui on the card, and ``image_peers``, diffusers' LoRA scripts against
lora_gui on SDXL and Flux at 1,024 px, only when named: bench/gpu/peers.py,
bench/gpu/image_peers.py);
both output files are rewritten after each, and a section that fails leaves its traceback
under ``errors`` without losing the others. After each section on a GPU,
``context_bytes`` records what NVML shows beyond the allocator's reserve and
``outside_allocator_bytes`` what cudaMemGetInfo does (the CUDA context the plans count); the
``context`` section (bench/gpu/context.py) reads them stage by stage. Every measured step starts
after a garbage collection and ``empty_cache``, so an earlier row's model held in a reference
cycle cannot inflate a later row's peaks.

1. Planner accuracy (issue 3): a ~1B Llama (Llama-3.2-1B shapes, random bf16 weights built from
   the config: nothing is downloaded) with LoRA r16 on all linear layers, batch 1 at seq
   512/1024/2048, and the SD-1.5 and SDXL UNets (presets/models/sd15-unet.json, sdxl-unet.json;
   SDXL with its pooled text embedding and time ids) at 512/768/1024 px (issue 5): one real
   steady-state step (a warm step first, so AdamW state exists) measured with
   ``torch.cuda.max_memory_allocated`` next to the trace's ``allocator_peak_bytes`` (trace +
   cuBLAS workspace + 512-byte rounding; the CUDA context is outside the allocator), and for the
   UNets also the planner's trace-calibrated estimate (what plan_image sizes batches with).
   Target 5%.
1b. Quantized base: the same ~1B Llama loaded the engine's way in NF4 (transformers'
   BitsAndBytesConfig, double quant, bf16 compute; random weights saved to a temporary folder),
   LoRA r16 all-linear, gradient checkpointing, batch 1 at seq 512/1024/2048: max_memory_allocated
   of a steady-state step next to the trace with ``quantization="nf4"``.
2b. DiT steps: the SD3.5-medium transformer at 512 / 1024 px and the Flux.1-dev one
   (gradient checkpointing) at 512 / 1024 px, LoRA r16 on the diffusers scripts' targets, the
   engine's flow-matching loss, against the DiT trace and the planner's estimate (``--only dit``
   runs these alone). Target 5%.
1c. Cards: Llama-3.1-8B (presets/models/llama-3.1-8b.json, random bf16 weights saved and loaded in
   NF4 the engine's way), r32 all-linear, batch 1, at 1,024 and 4,096 tokens and at the length
   ``plan --card 8gb --longest`` gives, then at the ``--card 24gb`` answer, each under
   ``torch.cuda.set_per_process_memory_fraction`` set to the card's memory less the CUDA context:
   planned allocated / reserved (the caching-allocator replay) / nvidia-smi and the attention
   kernel's backward workspace vs measured max_memory_allocated / max_memory_reserved, and
   whether the planned longest ran without running out of memory. Target: reserved within
   -1%...+5% of the plan, no out-of-memory at a planned length. The longest answers run attention
   in head groups (one key/value head a call) when the plan picks it; the first card's answer is
   then run once more with attention in one call, a row whose ``planned_to_fit`` says whether the
   plan expects it to run out of memory. The process runs with ``expandable_segments:True`` (as
   every run does); the planned reserved figure is the pages that hold live blocks (what a capped
   run needs), ``predicted_reserved_unlimited_bytes`` what an uncapped replay keeps mapped.
Every row of 1, 1b and 2b also has measured vs planned reserved memory.
2. Windowed attention (issue 4): ``flex`` vs causal SDPA, forward + backward, batch 1, 4 heads of
   64, bf16, W=256, G=4, S from 1k to 32k: median time and peak allocated bytes.
Writes gpu_check.json and gpu_check.md under --out.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from bench.docs.meta import stamp
from bench.gpu import context as gpu_context
from bench.gpu import image_peers as gpu_image_peers
from bench.gpu import multi_gpu as gpu_multi
from bench.gpu import peers as gpu_peers
from bench.gpu import plans as gpu_plans
from bench.gpu import video as gpu_video
from lora_gui.memory.predict import trace as tr
from lora_gui.memory.predict.model_configs import load_model_config
from lora_gui.models import flops
from lora_gui.models.checkpointing import enable_checkpointing

LLAMA_1B = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 2048,
            "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32,
            "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 4096,
            "rope_theta": 500000.0, "tie_word_embeddings": True, "rms_norm_eps": 1e-5}
TINY_LLAMA = {**LLAMA_1B, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512}

# wide enough for the rebuilds (models/stand_ins.py MIN_REBUILD_WIDTH), small enough for a CPU
REBUILT_LLAMA = {**TINY_LLAMA, "hidden_size": 256, "intermediate_size": 512}

TINY_UNET = {"_class_name": "UNet2DConditionModel", "block_out_channels": [32, 64],
             "down_block_types": ["CrossAttnDownBlock2D", "DownBlock2D"],
             "up_block_types": ["UpBlock2D", "CrossAttnUpBlock2D"], "cross_attention_dim": 32,
             "layers_per_block": 1, "attention_head_dim": 8, "norm_num_groups": 8, "sample_size": 8}
# SDXL-shaped (text_time added conditioning, linear projections, 2 transformer layers), tiny
TINY_SDXL_UNET = {"_class_name": "UNet2DConditionModel", "block_out_channels": [32, 64],
                  "down_block_types": ["DownBlock2D", "CrossAttnDownBlock2D"],
                  "up_block_types": ["CrossAttnUpBlock2D", "UpBlock2D"], "cross_attention_dim": 64,
                  "layers_per_block": 1, "attention_head_dim": [2, 4], "norm_num_groups": 8,
                  "transformer_layers_per_block": [1, 2], "use_linear_projection": True,
                  "addition_embed_type": "text_time", "addition_time_embed_dim": 8,
                  "projection_class_embeddings_input_dim": 80, "sample_size": 8}  # 80 = 32 + 6 x 8

TINY_SD3 = {"_class_name": "SD3Transformer2DModel", "sample_size": 64, "patch_size": 2, "in_channels": 4,
            "num_layers": 2, "attention_head_dim": 8, "num_attention_heads": 4, "caption_projection_dim": 32,
            "joint_attention_dim": 32, "pooled_projection_dim": 64, "out_channels": 4}
TINY_FLUX = {"_class_name": "FluxTransformer2DModel", "patch_size": 1, "in_channels": 16, "num_layers": 1,
             "num_single_layers": 1, "attention_head_dim": 16, "num_attention_heads": 2,
             "joint_attention_dim": 32, "pooled_projection_dim": 32, "guidance_embeds": True,
             "axes_dims_rope": [4, 4, 8]}


_RESERVED: list[int] = []  # max_memory_reserved of the last measured step (0 on a CPU)
_SECONDS: list[float] = []  # median wall seconds of the last row's timed steps
TIMED_STEPS = 3  # steady-state steps timed after the measured one (speed rows)
PLAN_ONLY: list[bool] = [False]  # --plan-only: compute and keep the plans, measure nothing


def _real_step_peak(model: torch.nn.Module, make_loss, device: str) -> int:
    """Peak allocated bytes of one steady-state step (a warm step creates the AdamW state);
    the step's max_memory_reserved is left in ``_RESERVED[-1]``, the median seconds of
    :data:`TIMED_STEPS` further steps in ``_SECONDS[-1]``."""
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    for measured in (False, True):
        if measured and device == "cuda":
            _release()
            torch.cuda.reset_peak_memory_stats()
        make_loss().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    peak = torch.cuda.max_memory_allocated() if device == "cuda" else 0
    _RESERVED.append(torch.cuda.max_memory_reserved() if device == "cuda" else 0)
    times = []
    for _ in range(TIMED_STEPS):
        t0 = time.perf_counter()
        make_loss().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    _SECONDS.append(statistics.median(times))
    return peak


def _release() -> None:
    """Frees what earlier rows left (models held in reference cycles until the collector runs,
    cached segments) so a row's peaks are its own step's."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def _speed(model: torch.nn.Module, make_loss, device: str, dtype: torch.dtype, unit: str, count: int,
           text_lengths: list[int] | None = None) -> dict[str, Any]:
    """The speed columns of a row: ``unit``/s (tokens or images per step over the median step),
    the step's useful FLOPs (text: counted from the modules; image: torch's counter on fake
    inputs) and MFU against this device's measured matmul peak in ``dtype``."""
    seconds = _SECONDS[-1]
    if text_lengths is not None:
        step_flops = flops.text_flops(model).step(text_lengths)
    else:
        step_flops = flops.counted_step_flops(model, make_loss)
    peak = flops.machine_peak(device, dtype)
    return {"step_s": seconds, f"{unit}_per_s": count / seconds, "useful_flops": step_flops,
            "peak_flops_per_s": peak.flops_per_s, "peak_source": peak.source,
            "mfu": flops.mfu(step_flops, seconds, peak.flops_per_s)}


def _reserved(measured: int, predicted: tr.TraceResult) -> dict[str, Any]:
    """The reserved-memory columns of a row: measured (max_memory_reserved) vs planned (the
    caching-allocator replay), and what nvidia-smi would show (planned reserved + context)."""
    reserved = _RESERVED[-1] if _RESERVED else 0
    return {"measured_reserved_bytes": reserved, "predicted_reserved_bytes": predicted.reserved_peak_bytes,
            "predicted_nvidia_smi_bytes": predicted.peak_bytes,
            "reserved_error": predicted.reserved_peak_bytes / reserved - 1 if reserved else None,
            "kernel": predicted.info.get("kernel"),
            "attention_workspace_bytes": predicted.info.get("attention_workspace_bytes", 0)}


def _materialized(model: torch.nn.Module, device: str, dtype: torch.dtype) -> torch.nn.Module:
    def make(t: torch.Tensor) -> torch.Tensor:
        if t.is_floating_point():
            return (torch.randn(t.shape, device=device, dtype=torch.float32) * 0.02).to(t.dtype)
        return torch.zeros(t.shape, device=device, dtype=t.dtype)

    tr.materialize(model, make)
    for name, buf in model.named_buffers():  # rotary inv_freq must hold real values
        if name.endswith("inv_freq"):
            base = getattr(model.config, "rope_theta", 10000.0) if hasattr(model, "config") else 1e4
            dim = buf.shape[0] * 2
            buf.copy_(1.0 / (base ** (torch.arange(0, dim, 2, device=device).float() / dim)))
    return model.train()


def check_text(config: dict, seqs: list[int], device: str) -> list[dict[str, Any]]:
    cfg = load_model_config(config)
    rows = []
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    label = config if isinstance(config, str) else f"llama {cfg.hidden_size}x{cfg.num_hidden_layers}"
    for seq in seqs:
        predicted = gpu_plans.planned(f"text:{label}:{dtype}:{seq}", lambda seq=seq: tr.trace_text_step(
            cfg, batch_size=1, seq_len=seq, lora_rank=16, dtype=dtype, device="cuda"))
        if PLAN_ONLY[0]:
            continue
        model = tr.build_text_model(cfg, attn_implementation="sdpa", dtype=dtype, lora_rank=16,
                                    lora_alpha=None, target_modules="all-linear",
                                    lean_backward=True)  # as the plan's trace and an optimized run
        model = _materialized(model, device, dtype)
        ids = torch.randint(0, cfg.vocab_size, (1, seq), device=device)
        measured = _real_step_peak(
            model, lambda m=model, i=ids: m(input_ids=i, labels=i, use_cache=False).loss, device)
        speed = _speed(model, lambda m=model, i=ids: m(input_ids=i, labels=i, use_cache=False).loss,
                       device, dtype, "tokens", seq, [seq])
        rows.append({"model": label, "seq_len": seq,
                     "measured_bytes": measured, "predicted_bytes": predicted.allocator_peak_bytes,
                     "predicted_with_context_bytes": predicted.peak_bytes,
                     "error": predicted.allocator_peak_bytes / measured - 1 if measured else None,
                     **_reserved(measured, predicted), "breakdown": predicted.breakdown, **speed})
        del model
        if device == "cuda":
            _release()
    return rows


def check_text_nf4(config: dict, seqs: list[int], device: str) -> list[dict[str, Any]]:
    """NF4 base loaded as the engine loads it; one real step per length vs the quantized trace."""
    import tempfile

    from bench.memory.quant_measure import save_random_model
    from lora_gui.config import RunConfig, apply_overrides
    from lora_gui.memory.predict.run_plan import step_kwargs
    from lora_gui.models import text as text_models

    cfg = load_model_config(config)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    run = apply_overrides(RunConfig(), {
        "quantization": "nf4", "gradient_checkpointing": True, "lora_rank": 16, "lora_alpha": 16.0,
        "max_seq_len": max(seqs), "precision": "bf16" if device == "cuda" else "fp32"})
    # the engine's own step (its chunked loss included), with the AdamW this check steps
    step = {**step_kwargs(run, "cuda"), "optimizer": "adamw", "dtype": dtype}
    plans = {seq: gpu_plans.planned(f"nf4:{cfg.hidden_size}x{cfg.num_hidden_layers}:{dtype}:{seq}:run",
                                    lambda seq=seq: tr.trace_text_step(
                                        cfg, batch_size=1, seq_len=seq, **step))
             for seq in seqs}
    if PLAN_ONLY[0]:
        return []
    with tempfile.TemporaryDirectory() as folder:
        with torch.device(device):  # random weights made on the device: seconds, not minutes
            save_random_model(cfg, folder)
        model = text_models.attach_lora(
            text_models.load_model_for(run, folder, dtype, torch.device(device)), run)
    enable_checkpointing(model)
    model.train()
    rows = []
    for seq in seqs:
        predicted = plans[seq]
        ids = torch.randint(0, cfg.vocab_size, (1, seq), device=device)
        measured = _real_step_peak(
            model, lambda m=model, i=ids: m(input_ids=i, labels=i, use_cache=False).loss, device)
        rows.append({"model": f"llama {cfg.hidden_size}x{cfg.num_hidden_layers} nf4 + grad ckpt",
                     "seq_len": seq, "measured_bytes": measured,
                     "predicted_bytes": predicted.allocator_peak_bytes,
                     "predicted_with_context_bytes": predicted.peak_bytes,
                     "error": predicted.allocator_peak_bytes / measured - 1 if measured else None,
                     **_reserved(measured, predicted), "breakdown": predicted.breakdown})
    del model
    if device == "cuda":
        _release()
    return rows


def _step_under(model, optimizer, ids, budget: int, device: str) -> dict[str, Any]:
    """One warm and one measured step with the allocator capped as the card would cap it (the
    card's memory less the CUDA context the plan counts): max allocated / reserved, or the OOM."""
    out: dict[str, Any] = {"measured_bytes": 0, "measured_reserved_bytes": 0, "out_of_memory": False}
    if device == "cuda":
        _release()
        usable = (budget - tr.CUDA_CONTEXT_BYTES) / torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(max(0.0, min(1.0, usable)))
    try:
        for measured in (False, True):  # a warm step first: the optimizer state exists
            if measured and device == "cuda":
                _release()
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
        _release()
        for measured in (False, True):
            if measured:
                _release()
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
                        _release()
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
                _release()
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
    model = _materialized(model, device, dtype)
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
        _release()
    return [{"model": f"llama {cfg.hidden_size}x{cfg.num_hidden_layers}", "seq_len": seq, "dtype": str(dtype),
             "tensors": len(grads[1]), "max_relative_difference": worst[0], "worst_tensor": worst[1],
             "tolerance": tolerance, "within": worst[0] <= tolerance}]


def _set_head_groups(model: torch.nn.Module, groups: int) -> None:
    """Attention in ``groups`` calls per layer from now on (0: one call), on a built model."""
    from lora_gui.attention.head_groups import GROUPS_ATTR

    for module in model.modules():
        if hasattr(module, "num_key_value_groups") and hasattr(module, "k_proj"):
            setattr(module, GROUPS_ATTR, groups)


def _unet_extra(c: dict, device: str, dtype: torch.dtype) -> dict[str, Any]:
    """SDXL's added conditioning (pooled text embedding, 6 time ids); nothing for SD 1.x."""
    if c.get("addition_embed_type") != "text_time":
        return {}
    pooled = c.get("projection_class_embeddings_input_dim", 2816) - 6 * c.get("addition_time_embed_dim", 256)
    return {"added_cond_kwargs": {"text_embeds": torch.randn(1, pooled, device=device, dtype=dtype),
                                  "time_ids": torch.randn(1, 6, device=device, dtype=dtype)}}


def check_unet(config: Any, resolutions: list[int], device: str) -> list[dict[str, Any]]:
    """UNet LoRA step (r16 on to_q/k/v/out, batch 1): measured peak, trace and planner estimate."""
    from lora_gui.memory.predict.estimate import estimate_unet_step

    rows = []
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    c = dict(load_model_config(config))
    name = config if isinstance(config, str) else ("tiny sdxl-shaped unet" if "addition_embed_type" in c
                                                   else "tiny unet")
    for res in resolutions:
        key = f"unet:{name}:{dtype}:{res}"
        predicted = gpu_plans.planned(key, lambda res=res: tr.trace_unet_step(
            c, batch_size=1, resolution=res, lora_rank=16, dtype=dtype, device="cuda"))
        planner_estimate = gpu_plans.planned(f"{key}:estimate", lambda res=res: estimate_unet_step(
            c, batch_size=1, resolution=res, lora_rank=16, dtype=dtype, device="cuda"))
        if PLAN_ONLY[0]:
            continue
        unet = _materialized(tr.build_unet(c, dtype=dtype, lora_rank=16, lora_alpha=None,
                                           target_modules=tr.UNET_LORA_TARGETS), device, dtype)
        ctx = c.get("cross_attention_dim", 768)
        ctx = ctx[0] if isinstance(ctx, (list, tuple)) else ctx

        def loss(u=unet, r=res, ctx=ctx):
            latents = torch.randn(1, 4, r // 8, r // 8, device=device, dtype=dtype)
            text = torch.randn(1, 77, ctx, device=device, dtype=dtype)
            t = torch.randint(0, 1000, (1,), device=device)
            out = u(latents, t, text, **_unet_extra(c, device, dtype)).sample
            return torch.nn.functional.mse_loss(out.float(), latents.float())

        measured = _real_step_peak(unet, loss, device)
        speed = _speed(unet, loss, device, dtype, "images", 1)
        rows.append({"model": name, "resolution": res, "measured_bytes": measured, **speed,
                     "predicted_bytes": predicted.allocator_peak_bytes,
                     # same allocator view as the trace: + cuBLAS workspace, no CUDA context
                     "planner_estimate_bytes": planner_estimate.traced_peak_bytes
                     + tr.CUBLAS_WORKSPACE_BYTES,
                     "error": predicted.allocator_peak_bytes / measured - 1 if measured else None,
                     **_reserved(measured, predicted)})
        del unet
        if device == "cuda":
            _release()
    return rows


def check_dit(config: Any, resolutions: list[int], device: str, gradient_checkpointing: bool = False,
              text_tokens: int | None = None) -> list[dict[str, Any]]:
    """DiT (SD3 / Flux) LoRA step, r16 on the scripts' targets, batch 1, cached latents and text
    embeddings: the engine's flow-matching loss (``FlowMatching.loss_at``); measured peak, trace
    and the planner's trace-calibrated estimate."""
    import types

    from diffusers import FlowMatchEulerDiscreteScheduler

    from lora_gui.memory.predict import dit_trace as dt
    from lora_gui.models.dit import FlowMatching, lora_targets

    rows = []
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    c = dict(load_model_config(config))
    kind = dt.dit_kind(c)
    name = config if isinstance(config, str) else f"tiny {kind}-shaped transformer"
    tokens = text_tokens or dt.default_text_tokens(kind)
    step = {"batch_size": 1, "lora_rank": 16, "dtype": dtype, "device": "cuda",
            "gradient_checkpointing": gradient_checkpointing, "text_seq_len": tokens}
    channels = c.get("in_channels", 64) // 4 if kind == "flux" else c.get("in_channels", 16)
    objective = FlowMatching(kind, FlowMatchEulerDiscreteScheduler(), "none",
                             guidance=3.5 if c.get("guidance_embeds") else None,
                             precondition_outputs=kind == "sd3")
    for res in resolutions:
        key = f"dit:{name}:{dtype}:{res}:{gradient_checkpointing}:{tokens}"
        predicted = gpu_plans.planned(key, lambda res=res: dt.trace_dit_step(c, resolution=res, **step))
        planner_estimate = gpu_plans.planned(f"{key}:estimate", lambda res=res: dt.estimate_dit_step(
            c, resolution=res, **step))
        if PLAN_ONLY[0]:
            continue
        model = _materialized(dt.build_dit(c, dtype=dtype, lora_rank=16, lora_alpha=None,
                                           target_modules=lora_targets(kind, "all-linear")), device, dtype)
        if gradient_checkpointing:
            model.get_base_model().enable_gradient_checkpointing()

        def loss(m=model, r=res):
            lat = (1, channels, r // 8, r // 8)
            enc = types.SimpleNamespace(
                latents=torch.randn(lat, device=device),
                hidden=torch.randn(1, tokens, c.get("joint_attention_dim", 4096), device=device, dtype=dtype),
                pooled=torch.randn(1, c.get("pooled_projection_dim", 768), device=device, dtype=dtype))
            sigmas = torch.rand(1, device=device)
            return objective.loss_at(m, enc, torch.randn(lat, device=device), sigmas, sigmas * 1000)

        measured = _real_step_peak(model, loss, device)
        speed = _speed(model, loss, device, dtype, "images", 1)
        rows.append({"model": name, "resolution": res, "measured_bytes": measured, **speed,
                     "predicted_bytes": predicted.allocator_peak_bytes,
                     "planner_estimate_bytes": planner_estimate.traced_peak_bytes + tr.CUBLAS_WORKSPACE_BYTES,
                     "gradient_checkpointing": gradient_checkpointing,
                     "error": predicted.allocator_peak_bytes / measured - 1 if measured else None,
                     **_reserved(measured, predicted)})
        del model
        if device == "cuda":
            _release()
    return rows


def check_flex(seqs: list[int], device: str, repeats: int = 5) -> list[dict[str, Any]]:
    from lora_gui.attention import WindowSpec, windowed_attention

    spec = WindowSpec(256, 4)
    rows = []
    impls = ("flex", "sdpa") if device == "cuda" else ("blocked", "sdpa")
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    for seq in seqs:
        for impl in impls:
            q, k, v = (torch.randn(1, 4, seq, 64, device=device, dtype=dtype, requires_grad=True)
                       for _ in range(3))

            def run(impl=impl, q=q, k=k, v=v):
                if impl == "sdpa":
                    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
                else:
                    out = windowed_attention(q, k, v, spec, impl=impl)
                out.float().sum().backward()

            run()  # compile / warm up
            times = []
            if device == "cuda":
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            for _ in range(repeats):
                start = time.perf_counter()
                run()
                if device == "cuda":
                    torch.cuda.synchronize()
                times.append(time.perf_counter() - start)
            peak = torch.cuda.max_memory_allocated() if device == "cuda" else None
            rows.append({"impl": impl, "seq_len": seq, "median_s": statistics.median(times),
                         "peak_bytes": peak})
    return rows


def _markdown(result: dict[str, Any]) -> str:
    mib = 2**20
    out = [f"# GPU check ({result['device_name']})", "",
           *(gpu_context.markdown(result["context"]) if "context" in result else []),
           "## Planner accuracy (allocator peak)", "",
           "| model | shape | measured MiB | predicted MiB (trace) | error | planner estimate MiB | "
           "measured reserved MiB | planned reserved MiB | reserved error |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in result.get("text", []) + result.get("unet", []) + result.get("dit", []):
        shape = f"seq {r['seq_len']}" if "seq_len" in r else f"{r['resolution']} px"
        err = f"{r['error']:+.1%}" if r["error"] is not None else "-"
        est = f"{r['planner_estimate_bytes'] / mib:,.0f}" if "planner_estimate_bytes" in r else "-"
        rerr = f"{r['reserved_error']:+.1%}" if r.get("reserved_error") is not None else "-"
        out.append(f"| {r['model']} | {shape} | {r['measured_bytes'] / mib:,.0f} | "
                   f"{r['predicted_bytes'] / mib:,.0f} | {err} | {est} | "
                   f"{r.get('measured_reserved_bytes', 0) / mib:,.0f} | "
                   f"{r.get('predicted_reserved_bytes', 0) / mib:,.0f} | {rerr} |")
    out += ["", "## Speed (batch 1, median of the timed steps; MFU against this device's measured "
            "matmul peak)", "",
            "| model | shape | s / step | tokens or images / s | useful GFLOP / step | MFU |",
            "|---|---|---|---|---|---|"]
    for r in result.get("text", []) + result.get("unet", []) + result.get("dit", []):
        if "step_s" not in r:
            continue
        shape = f"seq {r['seq_len']}" if "seq_len" in r else f"{r['resolution']} px"
        rate = f"{r['tokens_per_s']:,.0f} tok/s" if "tokens_per_s" in r else f"{r['images_per_s']:.3f} img/s"
        mfu = "-" if r["mfu"] is None else f"{r['mfu']:.1%}"
        out.append(f"| {r['model']} | {shape} | {r['step_s']:.3f} | {rate} | "
                   f"{r['useful_flops'] / 1e9:,.2f} | {mfu} |")
    out += ["", "## Windowed attention vs causal SDPA (fwd+bwd, B=1, 4x64, W=256, G=4)", "",
            "| S | impl | median ms | peak MiB |", "|---|---|---|---|"]
    for r in result.get("flex", []):
        peak = f"{r['peak_bytes'] / mib:,.0f}" if r["peak_bytes"] else "-"
        out.append(f"| {r['seq_len']} | {r['impl']} | {r['median_s'] * 1e3:.2f} | {peak} |")
    if result.get("peers"):
        out += ["", *gpu_peers.markdown(result["peers"])]
    if result.get("video"):
        out += ["", *gpu_video.markdown(result["video"])]
    if result.get("multi_gpu"):
        out += ["", *gpu_multi.markdown(result["multi_gpu"])]
    if result.get("image_peers"):
        out += ["", *gpu_image_peers.markdown(result["image_peers"])]
    out += ["", "## Cards: nf4 r32 under each card's memory (context counted; reserved vs plan)", "",
            "| model | card | seq | longest? | head groups | planned to fit | kernel | workspace MiB | "
            "measured alloc / reserved MiB | planned alloc / reserved MiB | reserved error |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in result.get("card", []):
        measured = "OOM" if r["out_of_memory"] else (f"{r['measured_bytes'] / mib:,.0f} / "
                                                       f"{r['measured_reserved_bytes'] / mib:,.0f}")
        if "uncapped_measured_bytes" in r:
            measured += (f" (uncapped: {r['uncapped_measured_bytes'] / mib:,.0f} / "
                         f"{r['uncapped_reserved_bytes'] / mib:,.0f})")
        err = f"{r['reserved_error']:+.1%}" if r["reserved_error"] is not None else "-"
        planned = f"{r['predicted_bytes'] / mib:,.0f} / {r['predicted_reserved_bytes'] / mib:,.0f}"
        out.append(f"| {r['model']} | {r['card']} | {r['seq_len']} | {r['planned_longest']} | "
                   f"{r['attention_head_groups'] or 'off'} | {r['planned_to_fit']} | "
                   f"{r['kernel']} | {r['attention_workspace_bytes'] / mib:,.1f} | {measured} | {planned} | "
                   f"{err} |")
    return "\n".join(out) + "\n"


# the order a lent card runs them in
SECTIONS = ("context", "text", "card", "grads", "nf4", "dit", "unet", "flex", "video", "multi_gpu")
# asked for by name only (--sections ...,peers): needs TRL, a bench-only package (bench/gpu/peers.py)
# image_peers: diffusers' scripts need torchvision, bench-only (bench/gpu/image_peers.py)
OPTIONAL_SECTIONS = ("peers", "image_peers")


def _sections(smoke: bool, device: str) -> dict[str, Any]:
    """Each section's rows as a callable, most wanted first (a run cut short keeps those)."""
    if smoke:
        return {"context": gpu_context.check_context,
                "text": lambda: check_text(TINY_LLAMA, [64], device)
                + check_text("assets/base-model", [128], device),
                "unet": lambda: check_unet(TINY_UNET, [64], device)
                + check_unet(TINY_SDXL_UNET, [64, 128], device),
                "card": lambda: check_card(TINY_LLAMA, ["8gb"], [64], device),
                "grads": lambda: check_rebuild_grads(REBUILT_LLAMA, 64, device),
                "dit": lambda: check_dit(TINY_SD3, [512], device, text_tokens=16) + check_dit(
                    TINY_FLUX, [512], device, gradient_checkpointing=True, text_tokens=16),
                "nf4": lambda: check_text_nf4(TINY_LLAMA, [64, 128], device),
                "flex": lambda: check_flex([512], device, repeats=2),
                "video": lambda: gpu_video.check_video(device, smoke=True, plan_only=PLAN_ONLY[0]),
                "peers": lambda: gpu_peers.check_peers(smoke=True),
                "multi_gpu": lambda: gpu_multi.check_multi_gpu(smoke=True),
                "image_peers": lambda: gpu_image_peers.check_image_peers(smoke=True)}
    # the bundled text demo's model, a ~1B at short lengths and at 8k tokens (long context, whole
    # sequence in one step), the UNets at 512-1024 px, Flux-shaped with gradient checkpointing
    return {"context": gpu_context.check_context,
            "text": lambda: check_text("assets/base-model", [512], device)
            + check_text(LLAMA_1B, [512, 1024, 2048, 8192], device),
            "unet": lambda: check_unet("sd15-unet", [512, 768, 1024], device)
            + check_unet("sdxl-unet", [512, 768, 1024], device),
            "card": lambda: check_card("llama-3.1-8b", ["8gb", "12gb", "24gb"], [1024, 4096], device),
            "grads": lambda: check_rebuild_grads(LLAMA_1B, 2048, device),
            "dit": lambda: check_dit("sd3.5-medium", [512, 1024], device) + check_dit(
                "flux.1-dev", [512, 1024], device, gradient_checkpointing=True),
            "nf4": lambda: check_text_nf4(LLAMA_1B, [512, 1024, 2048], device),
            "flex": lambda: check_flex([1024, 2048, 4096, 8192, 16384, 32768], device),
            "video": lambda: gpu_video.check_video(device, plan_only=PLAN_ONLY[0]),
            "peers": gpu_peers.check_peers, "multi_gpu": gpu_multi.check_multi_gpu,
            "image_peers": gpu_image_peers.check_image_peers}


def _context_bytes() -> int | None:
    """What nvidia-smi shows beyond the caching allocator's reserve now (source: nvml minus
    cuda_allocator): the CUDA context and the libraries' own memory, which plans count as
    ``CUDA_CONTEXT_BYTES``. None where NVML cannot be read."""
    try:
        import pynvml

        pynvml.nvmlInit()
        used = pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0)).used
    except Exception:  # no NVML: the row says so rather than guessing
        return None
    return int(used - torch.cuda.memory_reserved())


def _outside_allocator_bytes() -> int:
    """cudaMemGetInfo's total - free - the allocator's reserve: what this process (and any other
    on the card) holds outside the caching allocator, as an out-of-memory is decided."""
    free, total = torch.cuda.mem_get_info()
    return int(total - free - torch.cuda.memory_reserved())


def _write(out: Path, result: dict[str, Any]) -> None:
    """Both files after every section, so a run cut short still returns what it measured."""
    view = {**result, "text": result.get("text", []) + result.get("nf4", [])}  # one accuracy table
    body = {"meta": stamp(), **result}
    (out / "gpu_check.json").write_text(json.dumps(body, indent=1, default=str), encoding="utf-8")
    (out / "gpu_check.md").write_text(_markdown(view), encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--smoke", action="store_true", help="tiny shapes on CPU (code-path check)")
    parser.add_argument("--sections", default=",".join(SECTIONS),
                        help=f"comma-separated, run in this order (of {', '.join(SECTIONS)})")
    parser.add_argument("--plans", type=Path, help="precomputed plans to read (and, with --plan-only, write)")
    parser.add_argument("--plan-only", action="store_true",
                        help="trace every row's plan on this machine and write --plans; measure nothing")
    args = parser.parse_args()
    # before the first CUDA tensor: the allocator runs use and the plans model (kept if set)
    from lora_gui.memory.runtime.alloc_conf import use_expandable_segments

    use_expandable_segments()
    device = "cuda" if torch.cuda.is_available() and not args.smoke else "cpu"
    if args.plan_only and not args.smoke:
        device = "cuda"  # the card's dtype and precision; nothing is allocated when only planning
    args.out.mkdir(parents=True, exist_ok=True)
    PLAN_ONLY[0] = args.plan_only
    if args.plans and args.plans.exists():
        gpu_plans.load(args.plans)
    sections = _sections(args.smoke, device)
    wanted = [name.strip() for name in args.sections.split(",") if name.strip()]
    unknown = [name for name in wanted if name not in sections]
    if unknown:
        parser.error(f"--sections: unknown {', '.join(unknown)}; choose from "
                     f"{', '.join(SECTIONS + OPTIONAL_SECTIONS)}")
    result: dict[str, Any] = {
        "device_name": torch.cuda.get_device_name() if torch.cuda.is_available() and not args.smoke
        else "cpu (smoke)" if args.smoke else "cpu (plans only)",
        "torch": torch.__version__, "plans_traced_with": gpu_plans.traced_with(), "errors": {}, "seconds": {}}
    for name in wanted:
        start = time.perf_counter()
        print(f"[gpu_check] {name} ...", flush=True)
        try:
            result[name] = sections[name]()
        except Exception:  # one broken section must not lose the others' rows
            import traceback

            result["errors"][name] = traceback.format_exc()
            print(result["errors"][name], flush=True)
        result["seconds"][name] = round(time.perf_counter() - start, 1)
        if args.plan_only and args.plans:
            gpu_plans.save(args.plans)
        else:
            _write(args.out, result)
        print(f"[gpu_check] {name} done in {result['seconds'][name]} s", flush=True)
        if device == "cuda" and not args.plan_only:
            result.setdefault("context_bytes", {})[name] = _context_bytes()
            result.setdefault("outside_allocator_bytes", {})[name] = _outside_allocator_bytes()
        if device == "cuda":
            _release()
    if not args.plan_only:
        print((args.out / "gpu_check.md").read_text(encoding="utf-8"))


if __name__ == "__main__":
    main()
