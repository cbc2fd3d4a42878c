"""Plan tab handlers: will it fit? The predicted breakdown against a budget, the batch per bucket,
and which cards (and how many GPUs) fit a model."""

from __future__ import annotations

from typing import Any

from lora_gui.config import ConfigError
from lora_gui.memory.meter import GB
from lora_gui.presets import load_config
from lora_gui.ui import charts, common

IMAGE_PLAN_RESOLUTIONS = (512, 768, 1024, 1280, 1536)


def bundled_model_names() -> list[str]:
    from lora_gui.memory.model_configs import bundled_models

    return bundled_models()


def _plan_image(model: str, resolution: int, budget: int, device: str, checkpointing: bool):
    """A UNet config: trace at the resolution, batch per resolution, card table."""
    import torch

    from lora_gui.memory import planner
    from lora_gui.memory.model_configs import load_model_config
    from lora_gui.memory.trace import trace_unet_step

    if resolution % 64 or not 512 <= resolution <= 1536:
        raise ConfigError(f"resolution: {resolution} must be 512-1536 in steps of 64")
    unet = load_model_config(model)
    step_kw = {"gradient_checkpointing": checkpointing, "device": device,
               "dtype": torch.bfloat16 if device == "cuda" else torch.float32}
    step = trace_unet_step(unet, batch_size=1, resolution=resolution, **step_kw)
    result = planner.plan_image(unet, budget, IMAGE_PLAN_RESOLUTIONS, **step_kw)
    rows = planner.what_fits_where(unet, chosen=resolution, **step_kw)
    return result, step, rows


def plan(preset: str, model: str, max_seq_len: float, budget_gb: float, device: str,
         checkpointing: bool, resolution: float = 1024, quantization: str = "none",
         optimizer: str = "auto") -> tuple[Any, str, list[list[Any]], list[list[Any]]]:
    """Breakdown figure, verdict, bucket table and card table (source: predicted)."""
    from lora_gui.memory import planner, run_plan, run_predict
    from lora_gui.memory.model_configs import is_unet_config, load_model_config

    empty: list[list[Any]] = []
    try:
        budget = planner.check_budget((budget_gb or 0) * GB)
        if model in bundled_model_names() and is_unet_config(load_model_config(model)):
            result, step, rows = _plan_image(model, int(resolution or 0), budget, device, bool(checkpointing))
            return _outputs(result, step, rows, budget, device, "batch 1 at this resolution")
        cfg = load_config(preset, {"model": model, "max_seq_len": int(max_seq_len or 0),
                                   "gradient_checkpointing": bool(checkpointing),
                                   "quantization": quantization, "optimizer": optimizer})
        result, step = run_predict.plan_and_predict(cfg, budget, device, confirm=False)
        rows = planner.what_fits_where(run_plan.model_config_for(cfg), chosen=cfg.max_seq_len,
                                       **run_plan.step_kwargs(cfg, device))
    except (ValueError, *common.USER_ERRORS) as err:
        return charts.breakdown_figure({}, {}), f"Error: {err}", empty, empty
    return _outputs(result, step, rows, budget, device, "the run's largest micro-batch")


def _outputs(result, step, rows, budget: int, device: str, shape: str):
    verdict = "Fits" if result.fits else "Does not fit"
    text = (f"**{verdict}** — {result.message}\n\nPredicted peak at {shape}: "
            f"**{step.peak_bytes / 2**20:,.0f} MiB** (source: predicted, {device})")
    for sug in result.suggestions:
        text += (f"\n- {sug.switch}: {sug.peak_bytes / 2**20:,.0f} MiB — "
                 f"{'fits' if sug.fits else 'does not fit'} the budget")
    table = [[b.bucket, b.micro_batch, b.grad_accum, round(b.peak_bytes / 2**20)] for b in result.buckets]
    card_rows = [[r.card_gb, r.longest or "nothing fits", r.batch_at_chosen,
                  *(f"{fit[0] or '-'} / {fit[1]}" for fit in r.by_gpus.values()),
                  *([f"{fit[0] or '-'} / {fit[1]}" for fit in getattr(r, "by_quantization", {}).values()]
                    or ["-"] * 3)] for r in rows]
    return charts.breakdown_figure(step.breakdown, step.cuda_overheads, budget), text, table, card_rows
