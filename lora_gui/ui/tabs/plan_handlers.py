"""Plan tab handlers: will it fit? The predicted breakdown against a budget, the batch per bucket,
and which cards (and how many GPUs) fit a model."""

from __future__ import annotations

from typing import Any

from lora_gui.config import ConfigError, RunConfig
from lora_gui.ui import charts, common, paths

IMAGE_PLAN_RESOLUTIONS = (512, 768, 1024, 1280, 1536)
# The RunConfig settings the tab shows (in its order) and their values on a fresh page.
FIELD_DEFAULTS = (("max_seq_len", 1024), ("resolution", 1024), ("budget_gb", 24.0),
                  ("gradient_checkpointing", False), ("quantization", "none"), ("optimizer", "auto"))


def bundled_model_names() -> list[str]:
    from lora_gui.memory.predict.model_configs import bundled_models

    return bundled_models()


def _plan_image(model: str, resolution: int, budget: int, device: str, checkpointing: bool):
    """A UNet config: trace at the resolution, batch per resolution, card table."""
    import torch

    from lora_gui.memory.predict import planner
    from lora_gui.memory.predict.model_configs import load_model_config
    from lora_gui.memory.predict.trace import trace_unet_step

    if resolution % 64 or not 512 <= resolution <= 1536:
        raise ConfigError(f"resolution: {resolution} must be 512-1536 in steps of 64")
    unet = load_model_config(model)
    step_kw = {"gradient_checkpointing": checkpointing, "device": device,
               "dtype": torch.bfloat16 if device == "cuda" else torch.float32}
    step = trace_unet_step(unet, batch_size=1, resolution=resolution, **step_kw)
    result = planner.plan_image(unet, budget, IMAGE_PLAN_RESOLUTIONS, **step_kw)
    rows = planner.what_fits_where(unet, chosen=resolution, cards_gb=cards_with(budget), **step_kw)
    return result, step, rows


def plan(preset: str, model: str, max_seq_len: float, resolution: float, budget_gb: float, device: str,
         checkpointing: bool, quantization: str = "none",
         optimizer: str = "auto") -> tuple[Any, str, list[list[Any]], list[list[Any]]]:
    """Breakdown figure, verdict, bucket table and card table (source: predicted): the run's own
    plan (the same call as ``python -m lora_gui plan`` and the Train tab), or for a bundled UNet
    config (shapes only) the trace at one resolution."""
    from lora_gui.memory.predict import planner, predict, report, run_plan
    from lora_gui.memory.predict.model_configs import is_unet_config, load_model_config

    empty: list[list[Any]] = []
    try:
        budget = report.resolve_budget(RunConfig(), budget_gb or None, budget_from="VRAM budget").bytes
        if model in bundled_model_names() and is_unet_config(load_model_config(model)):
            result, step, rows = _plan_image(model, int(resolution or 0), budget, device, bool(checkpointing))
            return _outputs(result, step, rows, budget, device, "batch 1 at this resolution", image=True)
        if model != "builtin" and not model.startswith("builtin:"):
            paths.check("model", model)  # a local folder typed in the page
        sizes = {"max_seq_len": int(max_seq_len or 0), "resolution": int(resolution or 0)}
        cfg = common.preset_config(preset, {"model": model, **{k: v for k, v in sizes.items() if v},
                                   "gradient_checkpointing": bool(checkpointing),
                                   "quantization": quantization, "optimizer": optimizer})
        pred = predict(cfg, budget, device)
        if cfg.task == "image":
            return _outputs(pred.plan, pred.step, [], budget, device, "the run's largest micro-batch",
                            pred.peak_bytes, image=True)
        rows = planner.what_fits_where(run_plan.model_config_for(cfg), chosen=cfg.max_seq_len,
                                       cards_gb=cards_with(budget), **run_plan.step_kwargs(cfg, device))
    except (ValueError, *common.USER_ERRORS) as err:
        return charts.breakdown_figure({}, {}), f"Error: {err}", empty, empty
    return _outputs(pred.plan, pred.step, rows, budget, device, "the run's largest micro-batch",
                    pred.peak_bytes)


def cards_with(budget: int) -> tuple[float, ...]:
    """The card sizes of "What fits where" (GB) with the budget being planned among them (a
    picked 8 GB card holds 8.36 GB, more than the table's 8 GB row), so the table has a row for
    the same budget as the verdict."""
    from lora_gui.memory.predict.planner import CARDS_GB
    from lora_gui.units import GB

    return tuple(sorted({*CARDS_GB, budget / GB}))


def _outputs(result, step, rows, budget: int, device: str, shape: str, peak: int | None = None,
             image: bool = False):
    from lora_gui.memory.predict import report
    from lora_gui.units import GB

    unit = "px" if image else "tokens"
    text = report.verdict_markdown(result, step.peak_bytes if peak is None else peak, budget, shape, device,
                                   unit)
    smallest = "512 px" if image else "256 tokens"  # what_fits_where's smallest size tried
    return (charts.breakdown_figure(step.breakdown, step.cuda_overheads, budget), text,
            report.plan_rows(result), report.fits_rows(rows, smallest, budget / GB))
