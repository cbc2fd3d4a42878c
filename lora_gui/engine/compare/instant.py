"""The predicted comparison, at once: every mode of a comparison (traditional, strong baseline,
optimized, each optimization alone) over lengths (text) or resolutions (image), from the
planner's closed-form estimates, for a CUDA GPU in bf16. No training, no weights: the model's
shapes only (a bundled config such as llama-3.1-8b, qwen2.5-7b, sdxl-unet, or the built-in one).

Rows have the shape of compare.json rows (``question`` memory, ``data`` full, ``measure`` and
``memory_source`` predicted), so the charts draw them beside measured rows.
"""

from __future__ import annotations

import logging
from typing import Any

from lora_gui.config import ConfigError, RunConfig, apply_overrides
from lora_gui.engine.compare.spec import mode_overrides, modes_for

log = logging.getLogger(__name__)

TEXT_LENGTHS = (512, 1024, 2048, 4096)
IMAGE_RESOLUTIONS = (512, 768, 1024, 1280, 1536)
DEVICE = "cuda"  # the card the comparison plans for (bf16 weights)


def _row(mode: str, size_key: str, size: int, cfg: RunConfig) -> dict[str, Any]:
    return {"question": "memory", "data": "full", "mode": mode, size_key: size, "status": "ok",
            "batch_size": cfg.batch_size, "measure": "predicted", "memory_source": "predicted",
            "device": DEVICE, "message": None}


def _text_rows(base: RunConfig, lengths: tuple[int, ...]) -> list[dict[str, Any]]:
    from lora_gui.memory.predict import estimate

    rows = []
    for seq_len in lengths:
        for mode in modes_for("memory", True):
            over = {"max_seq_len": seq_len, "budget_gb": 0.0,
                    **mode_overrides(mode, seq_len, base.batch_size, base)}
            row = _row(mode, "seq_len", seq_len, base)
            try:
                cfg = apply_overrides(base, over)
                step = estimate(cfg, DEVICE).step
            except (ValueError, NotImplementedError, RuntimeError) as err:
                rows.append({**row, "status": "error", "message": f"no prediction: {err}"})
                continue
            rows.append({**row, "peak_bytes": step.peak_bytes, "predicted_peak_bytes": step.peak_bytes,
                         "breakdown": step.breakdown})
    return rows


_UNET_STEPS: dict[tuple, Any] = {}  # eager rows are fake-tensor traces (seconds each): kept


def _unet_step_key(cfg: RunConfig) -> tuple:
    """What the image estimate reads: model, batch, resolution, rank, checkpointing, kernel."""
    batch = cfg.batch_size
    if cfg.resolved_image_batch() == "adaptive":
        table = cfg.batch_by_resolution()
        covering = [r for r in sorted(table) if r >= cfg.resolution]
        batch = min(batch, table[covering[0]] if covering else 1)
    return (cfg.model, batch, cfg.resolution, cfg.lora_rank, cfg.gradient_checkpointing,
            cfg.precision, cfg.resolved_attn_backend())


def _image_rows(base: RunConfig, resolutions: tuple[int, ...]) -> list[dict[str, Any]]:
    from lora_gui.engine.compare.image_rows import image_modes, image_overrides
    from lora_gui.memory.predict import estimate

    rows = []
    for res in resolutions:
        for mode in image_modes("memory", True):
            row = _row(mode, "resolution", res, base)
            try:
                cfg = apply_overrides(base, {"resolution": res, "budget_gb": 0.0,
                                             **image_overrides(mode, "memory")})
                key = _unet_step_key(cfg)
                if key not in _UNET_STEPS:  # the switches the UNet step does not see share it
                    _UNET_STEPS[key] = estimate(cfg, DEVICE).step
                step = _UNET_STEPS[key]
            except (ValueError, NotImplementedError, RuntimeError) as err:
                rows.append({**row, "status": "error", "message": f"no prediction: {err}"})
                continue
            rows.append({**row, "peak_bytes": step.peak_bytes, "predicted_peak_bytes": step.peak_bytes,
                         "breakdown": step.breakdown})
    return rows


def instant_rows(base: RunConfig, model: str | None = None,
                 sizes: tuple[int, ...] | None = None) -> list[dict[str, Any]]:
    """Predicted memory rows of every mode for ``base`` (with ``model`` in place of its model).

    Raises:
        ConfigError: the model does not suit the preset's task (a UNet config for a text preset).
    """
    from lora_gui.memory.predict.model_configs import bundled_models, is_unet_config, load_model_config

    if model:
        base = apply_overrides(base, {"model": model})
        if model in bundled_models():
            unet = is_unet_config(load_model_config(model))
            if unet != (base.task == "image"):
                kind = "an image (UNet)" if unet else "a text"
                raise ConfigError(f"model: {model} is {kind} model; pick a {base.task} preset for it")
    if base.task == "image":
        return _image_rows(base, tuple(sizes or IMAGE_RESOLUTIONS))
    return _text_rows(base, tuple(sizes or TEXT_LENGTHS))
