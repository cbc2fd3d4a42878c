"""Image rows of a comparison: traditional vs strong baseline vs optimized per resolution, plus
one row per optimization switched on alone, each a real run of the image engine.

Rows are written like the text rows (compare.json / compare.csv after each row, resumed from the
rows already there). Two questions:

- ``memory``: every mode trains the same pictures for the same steps at ``batch_size``; the row's
  peak is what that work needs (tracker bytes on CPU, allocator bytes on CUDA).
- ``speed``: every mode gets the same VRAM budget (``budget_gb``, or else the traditional memory
  row's measured peak + 5%) and ``batch_size`` images a step; traditional and strong baseline run
  them as one micro-batch, optimized sizes its micro-batch per bucket under the budget (planner).
  The figure is training images/s (the optimized row also reports it with its caching pass).

Data is the preset's image folder in both questions (``data: images``): images have no
"full-length" variant, the buckets are the image engine's own.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from lora_gui.config import ConfigError, RunConfig, apply_overrides
from lora_gui.engine.compare.results import Comparison, resume_rows, write_results
from lora_gui.engine.compare.spec import CompareSettings, budget_gb
from lora_gui.engine.core.lock import holds_run_folder
from lora_gui.memory.runtime.meter import GB

SPEED_HEADROOM = 1.05  # default speed budget: traditional's measured peak at batch_size + 5%
_OFF = {"cache_latents": "off", "aspect_buckets": "off", "attn_backend": "eager", "image_batch": "fixed",
        "gradient_checkpointing": False, "lean_backward": "off"}
IMAGE_PROFILES: dict[str, dict[str, Any]] = {
    "traditional": {**_OFF, "mode": "traditional"},
    # what diffusers' train_text_to_image_lora.py gives by default: square crops, no caching,
    # SDPA (AttnProcessor2_0), one fixed batch
    "strong_baseline": {**_OFF, "mode": "optimized", "attn_backend": "sdpa"},
    "optimized": {"mode": "optimized", "cache_latents": "ram", "aspect_buckets": "on",
                  "attn_backend": "sdpa", "image_batch": "adaptive", "gradient_checkpointing": True,
                  "lean_backward": "on"},
}
IMAGE_ABLATIONS: dict[str, dict[str, Any]] = {  # each switched on alone over traditional
    "cache_latents": {"cache_latents": "ram"},
    "aspect_buckets": {"aspect_buckets": "on"},
    "sdpa": {"attn_backend": "sdpa"},
    "adaptive_batch": {"image_batch": "adaptive"},
    "gradient_checkpointing": {"gradient_checkpointing": True},
    "lean_backward": {"lean_backward": "on"},
}
SWITCHES = tuple(_OFF)
FIXED_BATCH = ("traditional", "strong_baseline")  # never split: an out-of-memory makes the row an OOM


def image_modes(question: str, ablations: bool) -> list[str]:
    """Modes of one question: the three profiles, plus the ablation rows in the memory question."""
    extra = [f"ablation:{n}" for n in IMAGE_ABLATIONS] if ablations and question == "memory" else []
    return [*IMAGE_PROFILES, *extra]


def image_overrides(mode: str, question: str) -> dict[str, Any]:
    """The switches of one row (the speed question leaves checkpointing off: it trades time for
    memory, and the budget is what the row is given)."""
    if mode.startswith("ablation:"):
        return {**IMAGE_PROFILES["traditional"], **IMAGE_ABLATIONS[mode.split(":", 1)[1]]}
    over = dict(IMAGE_PROFILES[mode])
    if question == "speed":
        over["gradient_checkpointing"] = False
    return over


def _row(cmp: Comparison, question: str, mode: str, res: int, budget: int | None) -> dict[str, Any] | None:
    """Trains one row; None when the comparison was stopped meanwhile."""
    from lora_gui.engine import train
    from lora_gui.engine.core.control import TrainControl

    base = cmp.base
    cfg = apply_overrides(base, {**image_overrides(mode, question), "resolution": res,
                                 "max_steps": cmp.settings.steps, "budget_gb": budget_gb(budget),
                                 "sample_images": 0, "monitor_hz": 0.0, "checkpoint_every": 1_000_000})
    control, first_oom = TrainControl(), {}

    def on_event(event: dict[str, Any]) -> None:
        if event.get("event") == "oom" and not first_oom:
            first_oom.update(event)
            if mode in FIXED_BATCH or mode.startswith("ablation:"):
                control.stop.set()

    control.on_event = on_event
    control.on_record = lambda _r: control.stop.set() if cmp.stop.is_set() else None
    row = {"question": question, "data": "images", "mode": mode, "seq_len": None, "resolution": res,
           "status": "ok", "message": "", "batch_size": cfg.batch_size, "budget_bytes": budget,
           "measure": "measured", "switches": {k: getattr(cfg, k) for k in SWITCHES}}
    s = train(cfg, cmp.out / "runs" / f"{question}-images-{res}-{mode.replace(':', '-')}",
                       overwrite=True, control=control, progress=False)
    if cmp.stop.is_set() and s["status"] == "stopped":
        return None
    if first_oom and (mode != "optimized" or s["status"] == "out_of_memory"):
        n, need = first_oom.get("micro_batch"), s["predicted_peak_bytes"] or 0
        return {**row, "status": "oom", "memory_source": s["memory_source"], "predicted_peak_bytes": need,
                "message": f"OOM at batch {n}: predicted need {need / GB:.3f} GB, "
                           f"budget {(budget or 0) / GB:.3f} GB"}
    keys = ("peak_bytes", "memory_source", "predicted_peak_bytes", "images_per_s",
            "images_per_s_with_caching", "final_loss", "eval_loss", "steps", "images", "train_seconds")
    return {**row, **{k: s.get(k) for k in keys},
            "status": "ok" if s["status"] == "completed" else s["status"],
            "oom_recovered": sum(1 for e in s.get("oom_events", []) if "new_cap" in e)}


@holds_run_folder("out")  # one writer per folder, as a training run
def run_image_comparison(base: RunConfig, resolutions: list[int], steps: int, out: Path, *,
                         overwrite: bool = False, stop: threading.Event | None = None,
                         progress: bool = False, ablations: bool = True,
                         questions: tuple[str, ...] = ("memory", "speed")) -> dict[str, Any]:
    """Fills out/compare.json with image rows (question, data 'images', mode, resolution)."""
    if base.task != "image":
        raise ConfigError("compare --resolutions needs an image preset (task: image), e.g. image-512")
    for res in resolutions:
        apply_overrides(base, {"resolution": res}, where="--resolutions")  # names a bad value
    settings = CompareSettings(seq_lens=list(resolutions), steps=steps, questions=list(questions),
                               data_kinds=["images"], ablations=ablations)
    cmp = Comparison(base, settings, Path(out), stop or threading.Event(), progress=progress)
    cmp.rows = resume_rows(cmp.out, cmp.saved_settings(), overwrite)
    for res in resolutions:
        for question in settings.questions:
            budget = None
            if question == "speed":
                budget = _speed_budget(cmp, res)
                if budget is None:
                    raise ConfigError("compare: the speed question needs budget_gb (--set budget_gb=N) or "
                                      "the memory question's traditional row to size its budget")
            for mode in image_modes(question, ablations):
                if f"{question}|images|{mode}|{res}" in cmp.done():
                    continue
                if cmp.stop.is_set():
                    return {"settings": cmp.saved_settings(), "rows": cmp.rows}
                row = _row(cmp, question, mode, res, budget)
                if row is None:
                    break
                cmp.add(row)
    write_results(cmp.out, cmp.saved_settings(), cmp.rows)
    return {"settings": cmp.saved_settings(), "rows": cmp.rows}


def _speed_budget(cmp: Comparison, res: int) -> int | None:
    """budget_gb when set; else the traditional memory row's measured peak + 5% (None without it)."""
    if cmp.base.budget_gb:
        return int(cmp.base.budget_gb * GB)
    trad = next((r for r in cmp.rows if r["question"] == "memory" and r["mode"] == "traditional"
                 and r["resolution"] == res and r.get("peak_bytes")), None)
    return int(trad["peak_bytes"] * SPEED_HEADROOM) if trad else None
