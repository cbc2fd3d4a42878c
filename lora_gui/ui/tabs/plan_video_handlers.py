"""The Plan tab for a video run: its clip shape and switches, the run's own plan and both
"Longest that fits" answers (source: predicted).

One path with the CLI: the tab's fields become the same overrides ``plan --preset P --set k=v``
reads (:func:`lora_gui.ui.common.preset_config`), the budget is resolved by the same rule
(:func:`lora_gui.memory.predict.report.resolve_question`), and the figures come from the same
calls: :func:`lora_gui.memory.predict.predict` (a bundled Wan / LTX-Video config: one clip at
resolution x video_frames) with :func:`lora_gui.memory.predict.video_report.video_plan_lines` for
the text, and :func:`lora_gui.memory.predict.longest` (``video_limits``) for the longest clip
and the largest size. Every figure is in GB (:func:`lora_gui.units.gb`)."""

from __future__ import annotations

from typing import Any

from lora_gui.adapter_settings import TEXT_QUANTIZATIONS, VIDEO_QUANTIZATIONS
from lora_gui.config import ConfigError, RunConfig
from lora_gui.ui import charts, common, gpu_share
from lora_gui.units import GB, gb

VIDEO_PIPELINES = ("builtin:video", "builtin:ltx")  # the bundled video pipelines (weights, data)
# the fields only a video run has (after the tab's video resolution box), in the tab's order
VIDEO_FIELDS = ("video_frames", "blocks_to_swap", "video_window")
BUCKET_HEADERS = ["clip bucket (width x height x frames)", "micro-batch"]
SIZE_WORDS = "a side (512) or WxH (832x480)"


def bundled_video_names() -> list[str]:
    """The bundled video transformer configs (presets/models/*.json: shapes only, no weights)."""
    from lora_gui.memory.predict.model_configs import bundled_models
    from lora_gui.memory.predict.video_run import bundled_video_config

    return [name for name in bundled_models() if bundled_video_config(name) is not None]


def model_is_video(model: str | None) -> bool:
    """A bundled video pipeline or a bundled video config: the model alone makes the run a video one."""
    return (model or "").strip() in (*VIDEO_PIPELINES, *bundled_video_names())


def preset_task(preset: str | None) -> str | None:
    """The preset's task, or None when it cannot be read (the plan names why)."""
    try:
        return common.preset_config(preset).task
    except common.USER_ERRORS:
        return None


def is_video(preset: str | None, model: str | None) -> bool:
    """Whether the tab plans a video run: the preset's task is video, or the model is a video one."""
    return model_is_video(model) or preset_task(preset) == "video"


def task_for(preset: str | None, model: str | None) -> str:
    """The task the tab plans: video (:func:`is_video`), image for a bundled UNet / DiT config,
    else the preset's (text when it cannot be read)."""
    from lora_gui.memory.predict.model_configs import (
        bundled_models,
        is_dit_config,
        is_unet_config,
        load_model_config,
    )

    if is_video(preset, model):
        return "video"
    if model in bundled_models():
        config = load_model_config(model)
        if is_unet_config(config) or is_dit_config(config):
            return "image"
    return preset_task(preset) or "text"


def resolution_text(cfg: RunConfig) -> str:
    """The clip size as the video trainers write it: WxH (``video_size``) or a side."""
    return cfg.video_size or str(cfg.resolution)


def mode_updates(task: str, quantization: str | None = None) -> tuple[Any, ...]:
    """The tab's size fields for one task: max_seq_len (text), resolution as a side (image), the
    video ones (resolution as WxH, video_frames, blocks_to_swap, video_window), then the
    quantization choices (video: none / fp8; the value kept when it is one of them)."""
    import gradio as gr

    video = task == "video"
    choices = VIDEO_QUANTIZATIONS if video else TEXT_QUANTIZATIONS
    kept = quantization if quantization in choices else "none"
    return (gr.update(visible=task == "text"), gr.update(visible=task == "image"),
            *(gr.update(visible=video) for _ in range(1 + len(VIDEO_FIELDS))),
            gr.update(choices=list(choices), value=kept))


def _whole(name: str, value: Any) -> int:
    """A number field's value as a whole number, or a ConfigError naming the field."""
    if value is None or value == "":
        raise ConfigError(f"{name}: empty; enter a whole number")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{name}: {str(value)[:40]!r} is not a number") from None
    if not number.is_integer():
        raise ConfigError(f"{name}: {value} is not a whole number")
    return int(number)


def _resolution(value: Any) -> str | int:
    """The resolution box: WxH (a video clip size, RunConfig's own parsing) or a side in px."""
    text = str(value if value is not None else "").strip().lower()
    if not text:
        raise ConfigError(f"resolution: empty; enter {SIZE_WORDS}")
    if "x" in text:
        return text  # apply_overrides reads WxH into video_size (and refuses a bad one by name)
    if not text.isdigit():
        raise ConfigError(f"resolution: {text[:40]!r} is not {SIZE_WORDS}")
    return int(text)


def video_config(preset: str, model: str, resolution: Any, video_frames: Any, blocks_to_swap: Any,
                 video_window: Any, checkpointing: bool, quantization: str, optimizer: str,
                 lora_rank: Any = None, batch_size: Any = None) -> RunConfig:
    """The run's settings: the preset with the tab's fields as ``--set`` overrides (a bundled
    video model makes the task video, as ``--set task=video`` does).

    Raises:
        ConfigError / UserError: naming the field (a bad size, frames off the model's grid...).
    """
    from lora_gui.memory.predict.video_run import bundled_video_config, check_clip_shape
    from lora_gui.ui import input_checks, paths

    model = (model or "").strip()
    settings: dict[str, Any] = {
        "model": model, "resolution": _resolution(resolution),
        "video_frames": _whole("video_frames", video_frames),
        "blocks_to_swap": _whole("blocks_to_swap", blocks_to_swap),
        "video_window": str(video_window or "").strip(), "gradient_checkpointing": bool(checkpointing),
        "quantization": quantization or "none", "optimizer": optimizer or "auto",
        **{k: _whole(k, v) for k, v in (("lora_rank", lora_rank), ("batch_size", batch_size)) if v}}
    if model_is_video(model):
        settings["task"] = "video"
    problem = input_checks.model_task_problem(model, "video")
    if problem:
        raise ConfigError(problem)
    if model != "builtin" and not model.startswith("builtin:"):
        paths.check("model", model)  # a local pipeline folder typed in the page (as the text plan)
    try:
        cfg = common.preset_config(preset, settings)
    except ConfigError as err:  # the tab's fields, not the command line's --set
        raise ConfigError(str(err).removeprefix("--set: ")) from None
    if cfg.task != "video":
        raise ConfigError(f"model: {model} is not a video model; pick a video preset or a video model "
                          f"({', '.join((*VIDEO_PIPELINES, *bundled_video_names()))})")
    config = bundled_video_config(cfg.model)
    if config is not None:  # a pipeline's clips are checked by the plan (its data reader)
        check_clip_shape(cfg, config)  # before any trace, as plan refuses it
    return cfg


def _bucket_name(name: str) -> str:
    """'[64, 32, 5]' (a bundled config's row) or '64x32x5' -> '64x32x5'."""
    return "x".join(part.strip() for part in name.strip("[]").replace("x", ",").split(","))


def plan(preset: str, model: str, budget_gb: float, device: str, checkpointing: bool, quantization: str,
         optimizer: str, lora_rank: Any, batch_size: Any, gpus: Any, sharing: str, host_gb: float | None,
         resolution: Any, video_frames: Any, blocks_to_swap: Any, video_window: Any,
         ) -> tuple[Any, str, Any, list[list[Any]]]:
    """Breakdown figure, verdict with the host memory block swap needs and the text ``plan``
    prints, a row per clip bucket, and no card table (source: predicted)."""
    from lora_gui.memory.predict import predict, report
    from lora_gui.memory.predict.video_report import video_plan_lines
    from lora_gui.memory.predict.video_run import bundled_video_config
    from lora_gui.memory.runtime.host import check_host_memory, host_available_bytes

    try:
        if not budget_gb:
            raise ConfigError("budget_gb: pick a card or type a VRAM budget in GB to plan against")
        if host_gb is not None and not host_gb >= 0:  # also catches NaN
            raise ConfigError(f"host memory: {host_gb} GB is not a size (0 or more GB)")
        parallel = gpu_share.parallel_from_form(gpus, sharing)
        cfg = video_config(preset, model, resolution, video_frames, blocks_to_swap, video_window,
                           checkpointing, quantization, optimizer, lora_rank, batch_size)
        gpu_share.check_for_run(parallel, cfg.task, cfg.quantization)
        question = report.resolve_question(cfg, budget_gb=budget_gb, device=device, budget_from="VRAM budget")
        pred = predict(question.cfg, None, question.device, **gpu_share.predict_kwargs(parallel))
        host = int(pred.step.info.get("host_bytes", 0) or 0)
        check_host_memory(host, host_available_bytes() if host_gb is None else int(host_gb * GB),
                          "the host-side tensors of this run (swapped video blocks)")
    except (ValueError, NotImplementedError, *common.USER_ERRORS) as err:
        return charts.breakdown_figure({}, {}), f"Error: {err}", [], []
    budget = question.judged_against
    step = pred.step
    fits = pred.peak_bytes <= budget.bytes
    bucket = "x".join(str(v) for v in step.info.get("bucket", ()))
    lines = [f"**{'Fits' if fits else 'Does not fit'}** — the video run's largest micro-batch: "
             f"{step.info.get('batch_size')} clip(s) of {bucket} (width x height x frames)",
             f"Predicted peak: **{gb(pred.peak_bytes)}** against the {gb(budget.bytes)} budget "
             f"(source: predicted, {pred.device})"]
    if step.info.get("blocks_to_swap"):
        lines.append(f"Host memory (RAM) block swap needs: **{gb(host)}**, the frozen weights of the last "
                     f"{step.info['blocks_to_swap']} transformer blocks (source: predicted)")
    if bundled_video_config(cfg.model) is not None:
        lines.append(f"{cfg.model} is a bundled config (shapes only): one clip of resolution x video_frames, "
                     "latents and prompt embeddings cached; the caching pass (VAE) is planned by a run "
                     "on the real pipeline.")
    note = gpu_share.parallel_note(parallel, step)
    lines += [note] if note else []
    cli = [*video_plan_lines(question.cfg, pred, budget), question.rule]
    lines.append("What `python -m lora_gui plan` prints for these settings:\n\n```text\n"
                 + "\n".join(cli).strip("\n") + "\n```")
    rows = [[_bucket_name(name), batch] for name, batch in pred.bucket_batches]
    figure = charts.breakdown_figure(step.breakdown, step.cuda_overheads, budget.bytes)
    return figure, "\n\n".join(lines), {"headers": BUCKET_HEADERS, "data": rows}, []


def longest(preset: str, model: str, budget_gb: float, device: str, checkpointing: bool, quantization: str,
            optimizer: str, lora_rank: Any, batch_size: Any, resolution: Any, video_frames: Any,
            blocks_to_swap: Any, video_window: Any) -> str:
    """Both inverse answers at batch 1 (``plan --longest``): the longest clip at the run's size
    and the largest size at its frames, from :func:`lora_gui.memory.predict.longest`."""
    from lora_gui.memory.predict import longest as longest_fits
    from lora_gui.memory.predict import report

    if not budget_gb:
        return "Set a VRAM budget first: the longest clip depends on it."
    try:
        cfg = video_config(preset, model, resolution, video_frames, blocks_to_swap, video_window,
                           checkpointing, quantization, optimizer, lora_rank, batch_size)
        question = report.resolve_question(cfg, budget_gb=budget_gb, device=device, budget_from="VRAM budget")
        result = longest_fits(question.cfg, question.judged_against.bytes, question.device)
    except (ValueError, NotImplementedError, *common.USER_ERRORS) as err:
        return f"Error: {err}"
    return limits_text(result, question.judged_against.label(), question.device)


def limits_text(result: dict[str, Any], budget: str, device: str) -> str:
    """``video_limits``' two answers in Markdown, in the words of ``plan --longest`` (GB)."""
    size = result["largest_size_at_frames"]
    return (f"**Video run, budget {budget}, {device}** (batch 1, source: predicted)\n\n"
            f"- {result['note']} ({gb(result['peak_bytes_at_longest'])}, {result['source']})\n"
            f"- {size['note']} ({gb(size['peak_bytes_at_largest'])}, {size['source']})")
