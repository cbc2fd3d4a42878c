"""Every GPU measurement the open issues ask for, in one prepared run (for a lent GPU machine).

    python -m bench.gpu.check --plan-only --plans bench/results/gpu_plans.json --out /tmp/x
                                                    # first, on a CPU: every row's plan (~10 min)
    python -m bench.gpu.check --plans bench/results/gpu_plans.json --out "$OUT"
                                                    # then on the GPU machine (~8 min on an H200)
    python -m bench.gpu.check --smoke --out /tmp/x  # on a CPU: tiny shapes, checks the code paths

Sections run in the order of ``--sections`` (context, text, card, grads, nf4, dit, unet, flex,
video, offload, multi_gpu by default; card and grads in bench/gpu/cards.py, dit and unet in
bench/gpu/denoisers.py, video in bench/gpu/video.py, offload in bench/gpu/offload_choice.py (the
plan's offload choice run on the card), multi_gpu in bench/gpu/multi_gpu.py, the
step each measures in bench/gpu/step_measure.py;
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
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from bench.docs.meta import stamp
from bench.gpu import context as gpu_context
from bench.gpu import image_peers as gpu_image_peers
from bench.gpu import multi_gpu as gpu_multi
from bench.gpu import offload_choice as gpu_offload
from bench.gpu import peers as gpu_peers
from bench.gpu import plans as gpu_plans
from bench.gpu import video as gpu_video
from bench.gpu.cards import check_card, check_rebuild_grads
from bench.gpu.denoisers import check_dit, check_unet
from bench.gpu.step_measure import (
    PLAN_ONLY,
    materialized,
    real_step_peak,
    release,
    reserved_columns,
    speed_columns,
)
from lora_gui.memory.predict import trace as tr
from lora_gui.memory.predict.model_configs import load_model_config
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
        model = materialized(model, device, dtype)
        ids = torch.randint(0, cfg.vocab_size, (1, seq), device=device)
        measured = real_step_peak(
            model, lambda m=model, i=ids: m(input_ids=i, labels=i, use_cache=False).loss, device)
        speed = speed_columns(model, lambda m=model, i=ids: m(input_ids=i, labels=i, use_cache=False).loss,
                       device, dtype, "tokens", seq, [seq])
        rows.append({"model": label, "seq_len": seq,
                     "measured_bytes": measured, "predicted_bytes": predicted.allocator_peak_bytes,
                     "predicted_with_context_bytes": predicted.peak_bytes,
                     "error": predicted.allocator_peak_bytes / measured - 1 if measured else None,
                     **reserved_columns(measured, predicted), "breakdown": predicted.breakdown, **speed})
        del model
        if device == "cuda":
            release()
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
        measured = real_step_peak(
            model, lambda m=model, i=ids: m(input_ids=i, labels=i, use_cache=False).loss, device)
        rows.append({"model": f"llama {cfg.hidden_size}x{cfg.num_hidden_layers} nf4 + grad ckpt",
                     "seq_len": seq, "measured_bytes": measured,
                     "predicted_bytes": predicted.allocator_peak_bytes,
                     "predicted_with_context_bytes": predicted.peak_bytes,
                     "error": predicted.allocator_peak_bytes / measured - 1 if measured else None,
                     **reserved_columns(measured, predicted), "breakdown": predicted.breakdown})
    del model
    if device == "cuda":
        release()
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
    if result.get("offload"):
        out += ["", *gpu_offload.markdown(result["offload"])]
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
SECTIONS = ("context", "text", "card", "grads", "nf4", "dit", "unet", "flex", "video", "offload", "multi_gpu")
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
                "offload": lambda: gpu_offload.check_offload_choice(smoke=True),
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
            "offload": gpu_offload.check_offload_choice,
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
            release()
    if not args.plan_only:
        print((args.out / "gpu_check.md").read_text(encoding="utf-8"))


if __name__ == "__main__":
    main()
