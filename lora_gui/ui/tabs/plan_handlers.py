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


def preset_settings(preset: str, model: str | None = None) -> tuple[Any, ...]:
    """The tab's fields filled from a preset: max_seq_len, resolution, checkpointing,
    quantization (its choices: the task's), optimizer, LoRA rank, batch size, the model (a video
    preset's own; a video model leaves with a preset of another task), then the video fields:
    resolution as WxH, video_frames, blocks_to_swap, video_window (a preset that cannot be read
    leaves them). Each size field shows for its task alone (one task at a time)."""
    import gradio as gr

    from lora_gui.ui.tabs import plan_video_handlers as video

    try:
        cfg = common.preset_config(preset)
    except common.USER_ERRORS:
        return (gr.update(),) * (8 + 1 + len(video.VIDEO_FIELDS))
    if cfg.task == "video":
        model = cfg.model
    elif video.model_is_video(model):
        model = "builtin"
    task = video.task_for(preset, model)
    length, side, size, *shown, quantization = video.mode_updates(task, cfg.quantization)
    return ({**length, "value": cfg.max_seq_len}, {**side, "value": cfg.resolution},
            cfg.gradient_checkpointing, quantization, cfg.optimizer, cfg.lora_rank, cfg.batch_size,
            gr.update() if model is None else model, {**size, "value": video.resolution_text(cfg)},
            *({**box, "value": getattr(cfg, name)} for box, name in zip(shown, video.VIDEO_FIELDS)))


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
         gpus: float | None = 1, sharing: str = gpu_share.REPLICATED, host_gb: float | None = None,
         video_resolution: Any = "", video_frames: Any = None, blocks_to_swap: Any = 0,
         video_window: Any = "") -> tuple[Any, str, Any, list[list[Any]]]:
    """Breakdown figure, verdict, bucket table and card table (source: predicted): the run's own
    plan (the same call and the same budget rule as ``python -m lora_gui plan`` and the Train
    tab), or for a bundled UNet config (shapes only) the trace at one resolution. With ``gpus``
    above 1 the figures are one GPU's, shared as ``sharing`` says (``plan --world-size N
    [--fsdp [--offload]]``). A video run (a video preset or model) reads ``video_resolution``
    (WxH or a side), ``video_frames``, ``blocks_to_swap``, ``video_window`` and ``host_gb`` (the
    host memory swapped blocks may take; None: what is free) instead of the length and side
    (:func:`lora_gui.ui.tabs.plan_video_handlers.plan`)."""
    from lora_gui.memory.predict import planner, predict, report, run_plan
    from lora_gui.memory.predict.model_configs import is_unet_config, load_model_config
    from lora_gui.ui.tabs import plan_video_handlers as video

    if video.is_video(preset, model):
        return video.plan(preset, model, budget_gb, device, checkpointing, quantization, optimizer, lora_rank,
                          batch_size, gpus, sharing, host_gb, video_resolution, video_frames, blocks_to_swap,
                          video_window)
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
    depth = report.depth_lines(pred.figures)  # the layers a checkpointing run's plan chose
    text += "".join(f"\n\n{line.strip()[0].upper()}{line.strip()[1:]}" for line in depth)
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
