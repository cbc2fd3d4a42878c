""""Longest that fits" for the Plan and Train tabs: the longest max_seq_len under the budget and
the memory switches it needs (the planner's ``longest_text``; source: predicted)."""

from __future__ import annotations

from typing import Any

from lora_gui.config import RunConfig
from lora_gui.memory.runtime.meter import GB
from lora_gui.ui import common, forms

# settings the answer fills in the Train tab's form
FILLED = ("max_seq_len", "loss_chunk", "gradient_checkpointing", "offload_checkpoints", "mlp_chunk",
          "embeddings_on_host", "optimizer", "batching", "attention_head_groups")


def answer(cfg: RunConfig, budget_gb: float, device: str,
           host_gb: float | None = None) -> tuple[dict[str, Any], str]:
    """(settings to fill, the answer in Markdown) for a run under ``budget_gb`` on ``device``
    (every figure in GB); ``host_gb``: host memory the offloaded tensors may take (None: what
    this machine has free).

    Text runs: the longest max_seq_len and its switches; image runs: the largest resolution at
    batch 1 and the largest batch at the chosen resolution; video runs: the longest clip at the
    run's size and the largest size at its frames (nothing to fill for either)."""
    from lora_gui.memory.predict import longest
    from lora_gui.memory.predict.longest_text import describe
    from lora_gui.memory.runtime.host import host_available_bytes

    if not budget_gb:
        return {}, "Set a VRAM budget first: the longest length depends on it."
    try:
        if cfg.task == "image":
            res = longest(cfg, budget_gb * GB, device)
            return {}, (f"Image run: largest resolution at batch 1 **{res['largest_resolution']} px**, "
                        f"largest batch at {res['resolution']} px **{res['batch_at_resolution']}** "
                        f"(source: {res['source']}, {device})")
        if cfg.task == "video":  # the longest clip at the run's size, the largest size at its frames
            from lora_gui.ui.tabs.plan_video_handlers import limits_text
            from lora_gui.units import gb

            return {}, limits_text(longest(cfg, budget_gb * GB, device), gb(budget_gb * GB), device)
        host = host_available_bytes() if host_gb is None else int(host_gb * GB)
        result = longest(cfg, budget_gb * GB, device, host_limit_bytes=host)
    except (ValueError, NotImplementedError, *common.USER_ERRORS) as err:
        return {}, f"Error: {err}"
    lines = describe(result)
    text = f"**{lines[0]}**\n\n" + "\n".join(f"- {line.strip()}" for line in lines[1:])
    if common.gpu_total_gb() is None and device == "cpu":
        text += "\n- (simulated budget: no GPU here)"
    return {"max_seq_len": result.seq_len, **result.switches}, text


def fill_form(values: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The Train tab's button: the form's run at its budget, on the device a run here uses."""
    from lora_gui.memory.predict import run_device

    cfg, errors = forms.validate(values)
    if cfg is None:
        return {}, "Error: fix the settings marked below first: " + "; ".join(errors.values())
    return answer(cfg, cfg.budget_gb, run_device())


def plan_tab(preset: str, model: str, budget_gb: float, device: str, checkpointing: bool,
             quantization: str = "none", optimizer: str = "auto", host_gb: float | None = None,
             lora_rank: float | None = None, batch_size: float | None = None, video_resolution: Any = "",
             video_frames: Any = None, blocks_to_swap: Any = 0, video_window: Any = "") -> str:
    """The Plan tab's button: the preset with the tab's model and settings (LoRA rank, batch
    size, quantization...), under its budget and host memory; a video run (a video preset or
    model): the longest clip at its size and the largest size at its frames
    (:func:`lora_gui.ui.tabs.plan_video_handlers.longest`)."""
    from lora_gui.config import ConfigError
    from lora_gui.ui.tabs import plan_video_handlers as video

    if video.is_video(preset, model):
        return video.longest(preset, model, budget_gb, device, checkpointing, quantization, optimizer,
                             lora_rank, batch_size, video_resolution, video_frames, blocks_to_swap,
                             video_window)
    from lora_gui.memory.predict.model_configs import (
        bundled_models,
        is_dit_config,
        is_unet_config,
        load_model_config,
    )

    try:
        image = model in bundled_models() and (is_unet_config(load_model_config(model))
                                               or is_dit_config(load_model_config(model)))
        settings = {"model": model, "gradient_checkpointing": bool(checkpointing), "optimizer": optimizer,
                    **{k: int(v) for k, v in (("lora_rank", lora_rank), ("batch_size", batch_size)) if v}}
        settings.update({"task": "image"} if image else {"quantization": quantization})
        cfg = common.preset_config(preset, settings)
    except (ConfigError, *common.USER_ERRORS) as err:
        return f"Error: {err}"
    if host_gb is not None and not host_gb >= 0:  # also catches NaN
        return f"Error: host memory: {host_gb} GB is not a size (0 or more GB)"
    text = answer(cfg, float(budget_gb or 0), device, host_gb=host_gb)[1]
    if text.startswith("**Longest"):  # the verdict above judges the settings as they are
        text += ("\n- (with the switches listed here on; the verdict and the bucket table above judge "
                 "the settings as they are)")
    return text
