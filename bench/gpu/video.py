"""The GPU check's video rows (``python -m bench.gpu.check --sections video``): one LoRA training
step of a video transformer at a real clip shape, random bf16 weights built from the bundled
config (``presets/models/``: nothing is downloaded), latents and prompt embeddings as a cached
run feeds them, the engine's flow-matching loss (``FlowMatching.loss_at``), against the plan
``python -m lora_gui plan`` gives for the same settings (``plan_video_shape``, the function
``lora_gui.memory.predict.predict`` calls for a bundled video config).

Rows: Wan 2.1 1.3B at 832x480x33 (without and with gradient checkpointing), Wan 2.1 14B at
832x480x81 under a 24 GB card's cap with gradient checkpointing, fp8 base weights (diffusers'
layerwise casting: weights stored in float8 e4m3, each layer upcast to bf16 while it runs; the
matmuls run in bf16, fp8 tensor cores are not used) and block swap (``blocks_to_swap`` of its 40
blocks kept in pinned host memory, :mod:`lora_gui.models.block_swap`; the swapped blocks are made
on the host, the rest on the card; the row records the host bytes planned and held; when the plan
says it does not fit, the capped run must run out of memory and the same step then runs uncapped
to check the plan's bytes), and LTX-Video 2B at 768x512x49. Each: max allocated / reserved of a
steady-state step (a warm step first, so AdamW state exists) against the plan's allocated (trace +
cuBLAS workspace) / reserved (the caching-allocator replay). In ``--smoke`` mode, tiny Wan- and
LTX-shaped configs on the CPU run the same code paths (block swap and fp8 included).
"""

from __future__ import annotations

import contextlib
import gc
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from bench.gpu import plans as gpu_plans
from lora_gui.memory.predict import trace as tr

# the bundled tiny pipelines' transformer shapes (assets/video-model, lora_gui/models/build_video.py)
# with the _vae / _text shapes a bundled config carries: for --smoke on a CPU
TINY_WAN = {"_class_name": "WanTransformer3DModel", "attention_head_dim": 16, "cross_attn_norm": True,
            "eps": 1e-6, "ffn_dim": 128, "freq_dim": 32, "in_channels": 4, "num_attention_heads": 4,
            "num_layers": 4, "out_channels": 4, "patch_size": [1, 2, 2], "qk_norm": "rms_norm_across_heads",
            "rope_max_seq_len": 32, "text_dim": 32,
            "_vae": {"scale_factor_temporal": 4, "scale_factor_spatial": 4, "z_dim": 4},
            "_text": {"tokens": 16, "width": 32, "encoder_params": 0}}
TINY_LTX = {"_class_name": "LTXVideoTransformer3DModel", "in_channels": 4, "out_channels": 4, "patch_size": 1,
            "patch_size_t": 1, "num_attention_heads": 2, "attention_head_dim": 16, "num_layers": 2,
            "caption_channels": 32, "cross_attention_dim": 32,
            "_vae": {"scale_factor_temporal": 8, "scale_factor_spatial": 32, "z_dim": 4},
            "_text": {"tokens": 16, "width": 32, "encoder_params": 0}}


@dataclass(frozen=True)
class VideoRow:
    """One row: a config (a bundled name, or a dict for the smoke mode), a clip and the switches."""

    model: str | dict[str, Any]
    size: str  # WxH px
    frames: int
    gradient_checkpointing: bool = False
    quantization: str = "none"  # base weights' storage: none or fp8 (lora_gui.models.video_quant)
    card: str | None = None  # run under this card's memory (context counted); None: uncapped
    note: str = ""
    blocks_to_swap: int = 0  # the last N blocks' frozen weights in host memory (block swap)

    @property
    def name(self) -> str:
        if isinstance(self.model, str):
            return self.model
        return f"tiny {self.model['_class_name'].removesuffix('Transformer3DModel')}-shaped"


# Wan 14B's blocks swapped under the 24 GB cap at 832x480x81 with checkpointing: with bf16 weights
# the plan does not fit at any N (python -m lora_gui plan ... --set blocks_to_swap=N --card 24gb:
# 42.5 GB at 20 blocks; the checkpointed activations alone are 25.8 GB), so the row swaps every
# block and the capped run must run out of memory; fp8 weights (planned apart) change the weights' part
WAN14B_SWAP = 40

ROWS = (
    VideoRow("wan2.1-t2v-1.3b", "832x480", 33),
    VideoRow("wan2.1-t2v-1.3b", "832x480", 33, gradient_checkpointing=True),
    VideoRow("wan2.1-t2v-14b", "832x480", 81, gradient_checkpointing=True, quantization="fp8", card="24gb",
             blocks_to_swap=WAN14B_SWAP,
             note=f"fp8 weights (layerwise casting, bf16 matmuls), {WAN14B_SWAP} of 40 blocks swapped: "
                  "planned not to fit (activations)"),
    VideoRow("ltx-video-2b", "768x512", 49),
)
SMOKE_ROWS = (
    VideoRow(TINY_WAN, "64x32", 9),
    VideoRow(TINY_WAN, "64x32", 9, gradient_checkpointing=True, card="8gb"),
    VideoRow(TINY_WAN, "64x32", 9, gradient_checkpointing=True, blocks_to_swap=1),
    VideoRow(TINY_WAN, "64x32", 9, gradient_checkpointing=True, quantization="fp8"),
    VideoRow(TINY_LTX, "64x64", 17),
)


def _settings(row: VideoRow) -> Any:
    """The RunConfig ``plan`` reads for the row (bf16 on a card, LoRA r16 on the attention
    projections, batch 1, latents and embeddings cached, torch's AdamW as the step below runs)."""
    from lora_gui.config import RunConfig, apply_overrides

    return apply_overrides(RunConfig(), {
        "task": "video", "model": row.model if isinstance(row.model, str) else "builtin:video",
        "resolution": row.size, "video_frames": row.frames, "batch_size": 1,
        "gradient_checkpointing": row.gradient_checkpointing, "blocks_to_swap": row.blocks_to_swap,
        "quantization": row.quantization, "optimizer": "adamw"})


def _config(row: VideoRow) -> dict[str, Any]:
    from lora_gui.memory.predict.video_run import bundled_video_config

    config = row.model if isinstance(row.model, dict) else bundled_video_config(row.model)
    if config is None:
        raise ValueError(f"{row.model}: not a bundled video config in presets/models/")
    return config


def plan(row: VideoRow) -> tr.TraceResult:
    """The step `plan` traces for the row on a CUDA card (kept in the precomputed plans)."""
    from lora_gui.memory.predict.video_run import plan_video_shape

    key = f"video:{row.name}:{row.size}x{row.frames}:checkpointing={row.gradient_checkpointing}"
    if row.blocks_to_swap:
        key += f":blocks_to_swap={row.blocks_to_swap}"
    key += f":quantization={row.quantization}" if row.quantization != "none" else ""
    return gpu_plans.planned(key, lambda: plan_video_shape(_settings(row), _config(row), None, "cuda").step)


def _build(row: VideoRow, device: str) -> tuple[torch.nn.Module, Callable[[], torch.Tensor]]:
    """The row's transformer with its LoRA, random weights on ``device``, and a function giving
    one step's loss as the engine computes it (the same objective and inputs the plan traces)."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    from lora_gui.data.video_batches import clip_size
    from lora_gui.memory.predict.trace_step import run_autocast
    from lora_gui.memory.predict.video_run import build_video_transformer, shape_geometry, text_length_or
    from lora_gui.models import ltx
    from lora_gui.models.adapters import adapter_spec
    from lora_gui.models.checkpointing import enable_checkpointing
    from lora_gui.models.dit import FlowMatching
    from lora_gui.models.precision import planned_weights_dtype
    from lora_gui.models.video import VIDEO_TRANSFORMERS, lora_targets, rope_scale_for, set_video_attention

    cfg, config = _settings(row), _config(row)
    kind = {name: k for k, name in VIDEO_TRANSFORMERS.items()}[config["_class_name"]]
    geometry = shape_geometry(config)
    dtype = planned_weights_dtype(cfg.precision, "cuda")  # the card's dtype, as the plan's
    model = build_video_transformer(config, dtype=dtype, lora_rank=cfg.lora_rank, lora_alpha=cfg.lora_alpha,
                                    target_modules=lora_targets(cfg.lora_targets), adapter=adapter_spec(cfg),
                                    lean_backward=cfg.resolved_lean_backward(), quantization=cfg.quantization)
    set_video_attention(model.get_base_model(), cfg.resolved_attn_backend())

    def make_on(where: str) -> Callable[[torch.Tensor], torch.Tensor]:
        def make(t: torch.Tensor) -> torch.Tensor:
            if not t.is_meta:  # made already (a swapped block's, on the host)
                return t.detach()
            if t.is_floating_point():
                return (torch.randn(t.shape, device=where, dtype=torch.float32) * 0.02).to(t.dtype)
            return torch.zeros(t.shape, device=where, dtype=t.dtype)
        return make

    host_bytes = 0
    if row.blocks_to_swap:  # the swapped blocks made on the host (the card never holds them)
        from lora_gui.models.block_swap import enable_block_swap, transformer_blocks

        for block in transformer_blocks(model)[-row.blocks_to_swap:]:
            tr.materialize(block, make_on("cpu"))
    tr.materialize(model, make_on(device))  # the rest
    if row.blocks_to_swap:
        host = enable_block_swap(model, row.blocks_to_swap, pin=device == "cuda")
        host_bytes = sum({id(t.untyped_storage()): t.untyped_storage().nbytes() for t in host}.values())
    if row.gradient_checkpointing:
        enable_checkpointing(model, 0)
    model.train()
    objective = FlowMatching(kind, FlowMatchEulerDiscreteScheduler(), "none",
                             rope_scale=rope_scale_for(kind, geometry))
    channels = ltx.latent_channels(config) if kind == "ltx" else int(config.get("in_channels", 16))
    latent = (1, channels, *geometry.latent_shape((*clip_size(cfg), row.frames)))
    tokens, width = text_length_or(cfg, int(config["_text"]["tokens"])), int(config["_text"]["width"])
    autocast = run_autocast("cuda", dtype)  # the card's mixed precision (the CPU's own autocast in --smoke)

    def loss() -> torch.Tensor:
        mask = torch.ones(1, tokens, dtype=dtype, device=device) if kind == "ltx" else None
        enc = types.SimpleNamespace(latents=torch.randn(latent, device=device), pooled=None, text_mask=mask,
                                    hidden=torch.randn(1, tokens, width, dtype=dtype, device=device))
        sigmas = torch.rand(1, device=device)
        with _mixed_precision(model, autocast, device):
            out = objective.loss_at(model, enc, torch.randn(latent, device=device), sigmas, sigmas * 1000)
        out.held_inputs = enc  # the loop holds its batch until the backward is done, as the plan's
        return out

    loss.host_bytes = host_bytes  # block swap's host weights (pinned on a card)
    return model, loss


@contextlib.contextmanager
def _mixed_precision(model: torch.nn.Module, dtype: torch.dtype | None, device: str) -> Iterator[None]:
    """``model.forward`` as a run's accelerate wraps it: torch's own CUDA autocast to ``dtype``
    on a card, outputs converted to float32 (on a CPU, for --smoke: the planner's
    ``forward_under``, the CPU's autocast)."""
    from lora_gui.models.cuda_autocast import forward_under

    if device != "cuda" or dtype is None:
        with forward_under(model, dtype, device):
            yield
        return
    from accelerate.utils import convert_outputs_to_fp32

    forward, own = model.forward, "forward" in model.__dict__
    model.forward = convert_outputs_to_fp32(torch.autocast("cuda", dtype=dtype)(forward))
    try:
        yield
    finally:
        if own:
            model.forward = forward
        else:
            del model.forward  # the class's forward again


def _release() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def _steps(model: torch.nn.Module, loss: Callable[[], torch.Tensor], device: str) -> tuple[int, int]:
    """A warm step, then a measured one: (max allocated, max reserved) of the measured step (0, 0
    on a CPU)."""
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    for measured in (False, True):
        if measured and device == "cuda":
            _release()
            torch.cuda.reset_peak_memory_stats()
        loss().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    if device != "cuda":
        return 0, 0
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()


def measure(row: VideoRow, planned: tr.TraceResult, device: str) -> dict[str, Any]:
    """The row measured: under the card's cap first when it names one (weights and steps; an
    out-of-memory is recorded with where it happened), then uncapped when the cap stopped it."""
    from lora_gui.cards import card_by_name

    out: dict[str, Any] = {"out_of_memory": False}
    model = None
    if row.card and device == "cuda":
        budget = card_by_name(row.card).total_bytes
        usable = (budget - tr.CUDA_CONTEXT_BYTES) / torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(max(0.0, min(1.0, usable)))
        where = "loading the weights"
        try:
            model, loss = _build(row, device)
            out["measured_host_bytes"] = loss.host_bytes
            where = "the training step"
            out["measured_bytes"], out["measured_reserved_bytes"] = _steps(model, loss, device)
        except torch.OutOfMemoryError as err:
            out["out_of_memory"] = f"while {where}: " + " ".join(str(err).split())[:400]
        finally:
            torch.cuda.set_per_process_memory_fraction(1.0)
            model = loss = None
            _release()
    if not row.card or device != "cuda" or out["out_of_memory"]:
        model, loss = _build(row, device)
        out["measured_host_bytes"] = loss.host_bytes
        allocated, reserved = _steps(model, loss, device)
        key = "uncapped_" if out["out_of_memory"] else ""
        out[f"{key}measured_bytes"], out[f"{key}measured_reserved_bytes"] = allocated, reserved
        del model, loss
        _release()
    return out


def check_video(device: str, smoke: bool = False, plan_only: bool = False) -> list[dict[str, Any]]:
    """The video rows (``SMOKE_ROWS`` on a CPU with ``smoke``): plan, then measure unless ``plan_only``."""
    from lora_gui.cards import card_by_name

    rows = []
    for row in SMOKE_ROWS if smoke else ROWS:
        planned = plan(row)
        if plan_only:
            continue
        budget = card_by_name(row.card).total_bytes if row.card else None
        fits = budget is None or planned.peak_bytes <= budget
        result = {"model": row.name, "clip": f"{row.size}x{row.frames}",
                  "gradient_checkpointing": row.gradient_checkpointing, "quantization": row.quantization,
                  "card": row.card,
                  "budget_bytes": budget, "planned_to_fit": fits, "note": row.note,
                  "predicted_bytes": planned.allocator_peak_bytes,
                  "predicted_reserved_bytes": planned.reserved_peak_bytes,
                  "predicted_nvidia_smi_bytes": planned.peak_bytes,
                  "video_tokens": planned.info.get("video_tokens"), "kernel": planned.info.get("kernel"),
                  "blocks_to_swap": row.blocks_to_swap,
                  "planned_host_bytes": planned.info.get("host_bytes", 0),
                  **measure(row, planned, device)}
        allocated = result.get("uncapped_measured_bytes", result.get("measured_bytes", 0))
        reserved = result.get("uncapped_measured_reserved_bytes", result.get("measured_reserved_bytes", 0))
        result["error"] = planned.allocator_peak_bytes / allocated - 1 if allocated else None
        result["reserved_error"] = planned.reserved_peak_bytes / reserved - 1 if reserved else None
        # a plan that fits must run; one over the card must run out of memory under its cap
        result["agrees"] = (not result["out_of_memory"]) if fits else bool(result["out_of_memory"])
        rows.append(result)
    return rows


def markdown(rows: list[dict[str, Any]]) -> list[str]:
    """The video rows as a section of gpu_check.md."""
    mib = 2**20

    def cell(value: Any) -> str:
        return f"{value / mib:,.0f}" if value else "-"

    out = ["## Video: one LoRA step at real clip shapes, random bf16 weights (allocated / reserved "
           "vs plan)", "",
           "| model | clip (WxHxframes) | checkpointing | base weights | card cap | planned to fit | "
           "measured alloc / reserved MiB | planned alloc / reserved MiB | error alloc / reserved | "
           "agrees | note |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        measured = f"{cell(r.get('measured_bytes'))} / {cell(r.get('measured_reserved_bytes'))}"
        if r["out_of_memory"]:
            where = r["out_of_memory"].split(":")[0]
            measured = (f"OOM {where} (uncapped: {cell(r.get('uncapped_measured_bytes'))} / "
                        f"{cell(r.get('uncapped_measured_reserved_bytes'))})")
        errors = " / ".join("-" if r[k] is None else f"{r[k]:+.1%}" for k in ("error", "reserved_error"))
        out.append(f"| {r['model']} | {r['clip']} | {r['gradient_checkpointing']} | "
                   f"{r.get('quantization', 'none')} | {r['card'] or '-'} | "
                   f"{r['planned_to_fit']} | {measured} | {cell(r['predicted_bytes'])} / "
                   f"{cell(r['predicted_reserved_bytes'])} | {errors} | {r['agrees']} | {r['note'] or '-'} |")
    return out
