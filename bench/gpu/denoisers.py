"""The GPU check's ``unet`` and ``dit`` sections (bench/gpu/check.py): one LoRA step of a UNet
(SD 1.x, SDXL) or a DiT (SD3, Flux) measured against its trace and the planner's estimate."""

from __future__ import annotations

from typing import Any

import torch

from bench.gpu import plans as gpu_plans
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
        unet = materialized(tr.build_unet(c, dtype=dtype, lora_rank=16, lora_alpha=None,
                                           target_modules=tr.UNET_LORA_TARGETS), device, dtype)
        ctx = c.get("cross_attention_dim", 768)
        ctx = ctx[0] if isinstance(ctx, (list, tuple)) else ctx

        def loss(u=unet, r=res, ctx=ctx):
            latents = torch.randn(1, 4, r // 8, r // 8, device=device, dtype=dtype)
            text = torch.randn(1, 77, ctx, device=device, dtype=dtype)
            t = torch.randint(0, 1000, (1,), device=device)
            out = u(latents, t, text, **_unet_extra(c, device, dtype)).sample
            return torch.nn.functional.mse_loss(out.float(), latents.float())

        measured = real_step_peak(unet, loss, device)
        speed = speed_columns(unet, loss, device, dtype, "images", 1)
        rows.append({"model": name, "resolution": res, "measured_bytes": measured, **speed,
                     "predicted_bytes": predicted.allocator_peak_bytes,
                     # same allocator view as the trace: + cuBLAS workspace, no CUDA context
                     "planner_estimate_bytes": planner_estimate.traced_peak_bytes
                     + tr.CUBLAS_WORKSPACE_BYTES,
                     "error": predicted.allocator_peak_bytes / measured - 1 if measured else None,
                     **reserved_columns(measured, predicted)})
        del unet
        if device == "cuda":
            release()
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
        model = materialized(dt.build_dit(c, dtype=dtype, lora_rank=16, lora_alpha=None,
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

        measured = real_step_peak(model, loss, device)
        speed = speed_columns(model, loss, device, dtype, "images", 1)
        rows.append({"model": name, "resolution": res, "measured_bytes": measured, **speed,
                     "predicted_bytes": predicted.allocator_peak_bytes,
                     "planner_estimate_bytes": planner_estimate.traced_peak_bytes + tr.CUBLAS_WORKSPACE_BYTES,
                     "gradient_checkpointing": gradient_checkpointing,
                     "error": predicted.allocator_peak_bytes / measured - 1 if measured else None,
                     **reserved_columns(measured, predicted)})
        del model
        if device == "cuda":
            release()
    return rows
