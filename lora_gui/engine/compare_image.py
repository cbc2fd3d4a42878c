"""Image rows of a comparison: traditional vs optimized per resolution through the image engine.

Kept small on purpose: the rows come from ``lora_gui.engine.diffusion.train_image`` (the image
engine), one real run per (question, resolution, mode), written like the text rows
(compare.json / compare.csv after each row, resumed from the rows already there). The memory
question runs every mode on the same images and steps; the speed question runs under the
``budget_gb`` setting (the image engine sizes the optimized batch per resolution under it) and is
skipped when no budget is set.
"""

from __future__ import annotations

import importlib.util
import threading
from pathlib import Path
from typing import Any

from lora_gui.config import ConfigError, RunConfig, apply_overrides
from lora_gui.engine.compare import CompareSettings, Comparison, _resume_rows, write_results

IMAGE_MODES = ("traditional", "optimized")
IMAGE_ENGINE = "lora_gui.engine.diffusion"
ROW_KEYS = ("peak_bytes", "memory_source", "predicted_peak_bytes", "budget_bytes", "images_per_s",
            "final_loss", "eval_loss", "steps", "images")


def _train_image():
    if importlib.util.find_spec(IMAGE_ENGINE) is None:
        raise ConfigError("compare --resolutions needs the image engine (lora_gui/engine/diffusion.py), "
                          "which this installation does not have yet; use --seq-lens for text presets")
    from lora_gui.engine.diffusion import train_image

    return train_image


def run_image_comparison(base: RunConfig, resolutions: list[int], steps: int, out: Path, *,
                         overwrite: bool = False, stop: threading.Event | None = None,
                         progress: bool = False) -> dict[str, Any]:
    """Fills out/compare.json with image rows (question, data 'images', mode, resolution)."""
    train_image = _train_image()
    if getattr(base, "task", "text") != "image":
        raise ConfigError("compare --resolutions needs an image preset (task: image)")
    if not resolutions or any(r < 64 or r % 8 for r in resolutions):
        raise ConfigError(f"--resolutions: expected multiples of 8 from 64 up, got {resolutions}")
    settings = CompareSettings(seq_lens=list(resolutions), steps=steps,
                               questions=["memory", "speed"] if base.budget_gb else ["memory"],
                               data_kinds=["corpus"], ablations=False)
    cmp = Comparison(base, settings, Path(out), stop or threading.Event(), progress=progress)
    cmp.rows = _resume_rows(cmp.out, cmp.saved_settings(), overwrite)
    for res in resolutions:
        for question in settings.questions:
            for mode in IMAGE_MODES:
                key = f"{question}|images|{mode}|{res}"
                if key in cmp.done() or cmp.stop.is_set():
                    continue
                budget = base.budget_gb if question == "speed" else 0.0
                cfg = apply_overrides(base, {"resolution": res, "mode": mode, "max_steps": steps,
                                             "budget_gb": budget})
                folder = cmp.out / "runs" / f"{question}-images-{res}-{mode}"
                s = train_image(cfg, folder, overwrite=True, progress=False)
                row = {"question": question, "data": "images", "mode": mode, "seq_len": None,
                       "resolution": res, "status": "ok" if s["status"] == "completed" else s["status"],
                       "message": "", "batch_size": s["config"].get("batch_size"), "measure": "measured",
                       **{k: s.get(k) for k in ROW_KEYS}}
                cmp.add(row)
    write_results(cmp.out, cmp.saved_settings(), cmp.rows)
    return {"settings": cmp.saved_settings(), "rows": cmp.rows}
