"""Plan tab handlers: will it fit? The predicted breakdown against a budget, the batch per bucket,
and which cards (and how many GPUs) fit a model."""

from __future__ import annotations

from typing import Any

from lora_gui.config import ConfigError, RunConfig
from lora_gui.ui import charts, common, gpu_share, paths

IMAGE_PLAN_RESOLUTIONS = (512, 768, 1024, 1280, 1536)
# The RunConfig settings the tab shows (in its order) and their values on a fresh page.
FIELD_DEFAULTS = (("max_seq_len", 1024), ("resolution", 1024), ("budget_gb", 24.0),
                  ("gradient_checkpointing", False), ("quantization", "none"), ("optimizer", "auto"),
                  ("lora_rank", RunConfig().lora_rank), ("batch_size", RunConfig().batch_size))
STALE = "*Settings changed since this answer: press the button again.*"


def mark_stale(*answers: str) -> tuple[str, ...]:
    """Each answer shown, marked as made for other settings (an empty one stays empty)."""
    return tuple(f"{STALE}\n\n{a}" if a and not a.startswith(STALE) else a for a in answers)


def preset_settings(preset: str) -> tuple[Any, ...]:
    """The tab's fields filled from a preset: max_seq_len, resolution, checkpointing,
    quantization, optimizer, LoRA rank, batch size (a preset that cannot be read leaves them)."""
    import gradio as gr

    try:
        cfg = common.preset_config(preset)
    except common.USER_ERRORS:
        return (gr.update(),) * 7
    text = cfg.task == "text"  # one task at a time: a length for text, a resolution for pictures
    return (gr.update(value=cfg.max_seq_len, visible=text), gr.update(value=cfg.resolution, visible=not text),
            cfg.gradient_checkpointing, cfg.quantization, cfg.optimizer, cfg.lora_rank, cfg.batch_size)


def host_free_gb() -> float:
    """Host memory free now, in GB (the default of the tab's host memory field)."""
    from lora_gui.memory.runtime.host import host_available_bytes

    return (host_available_bytes() or 0) / 1e9


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
         checkpointing: bool, quantization: str = "none", optimizer: str = "auto",
         lora_rank: float | None = None, batch_size: float | None = None,
         gpus: float | None = 1, sharing: str = gpu_share.REPLICATED,
         ) -> tuple[Any, str, list[list[Any]], list[list[Any]]]:
    """Breakdown figure, verdict, bucket table and card table (source: predicted): the run's own
    plan (the same call and the same budget rule as ``python -m lora_gui plan`` and the Train
    tab), or for a bundled UNet config (shapes only) the trace at one resolution. With ``gpus``
    above 1 the figures are one GPU's, shared as ``sharing`` says (``plan --world-size N
    [--fsdp [--offload]]``)."""
    from lora_gui.memory.predict import planner, predict, report, run_plan
    from lora_gui.memory.predict.model_configs import is_unet_config, load_model_config

    empty: list[list[Any]] = []
    try:
        if not budget_gb:
            raise ConfigError("budget_gb: pick a card or type a VRAM budget in GB to plan against")
        parallel = gpu_share.parallel_from_form(gpus, sharing)
        if model in bundled_model_names() and is_unet_config(load_model_config(model)):
            if parallel.world_size > 1:
                raise ConfigError(f"GPUs: {parallel.world_size}; a bundled UNet config is planned for one "
                                  "GPU (pick a preset with its pipeline to plan several)")
            budget = report.resolve_budget(RunConfig(), budget_gb or None, budget_from="VRAM budget").bytes
            result, step, rows = _plan_image(model, int(resolution or 0), budget, device, bool(checkpointing))
            return _outputs(result, step, rows, budget, device, "batch 1 at this resolution", image=True)
        if model != "builtin" and not model.startswith("builtin:"):
            paths.check("model", model)  # a local folder typed in the page
        sizes = {"max_seq_len": int(max_seq_len or 0), "resolution": int(resolution or 0),
                 "lora_rank": int(lora_rank or 0), "batch_size": int(batch_size or 0)}
        cfg = common.preset_config(preset, {"model": model, **{k: v for k, v in sizes.items() if v},
                                   "gradient_checkpointing": bool(checkpointing),
                                   "quantization": quantization, "optimizer": optimizer})
        question = report.resolve_question(cfg, budget_gb=budget_gb or None, device=device,
                                           budget_from="VRAM budget")
        gpu_share.check_for_run(parallel, cfg.task, cfg.quantization)
        pred = predict(question.cfg, None, question.device, **gpu_share.predict_kwargs(parallel))
        budget = question.budget.bytes
        rows = [] if cfg.task == "image" else planner.what_fits_where(
            run_plan.model_config_for(cfg), chosen=cfg.max_seq_len, cards_gb=cards_with(budget),
            **run_plan.step_kwargs(cfg, "cuda"))
    except (ValueError, *common.USER_ERRORS) as err:
        return charts.breakdown_figure({}, {}), f"Error: {err}", empty, empty
    figure, text, buckets, cards = _outputs(pred.plan, pred.step, rows, budget, device,
                                            "the run's largest micro-batch", pred.peak_bytes,
                                            image=cfg.task == "image")
    note = gpu_share.parallel_note(parallel, pred.step)
    return figure, f"{text}\n\n{note}" if note else text, buckets, cards


def cards_with(budget: int) -> tuple[float, ...]:
    """The card sizes of "What fits where" (GB): the cards as torch reports them (an 8 GB card
    holds 8.36 GB) and the budget being planned, as a row of its own when it is no card's."""
    from lora_gui.memory.predict.report import table_cards_gb

    return tuple(table_cards_gb(budget))


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
