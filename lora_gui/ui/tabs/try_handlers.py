"""Try tab handlers: pick a finished run, generate from base and adapter side by side (streamed),
export. Thin: the engine (lora_gui.engine.generate / export) does the work."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from lora_gui.engine.core.rundir import load_run_config
from lora_gui.engine.export.run_export import export_run
from lora_gui.engine.generate import ImageTrial, RunInfo, TextTrial, VideoTrial, open_run
from lora_gui.errors import USER_ERRORS
from lora_gui.memory.predict import generation
from lora_gui.ui import common, paths

log = logging.getLogger(__name__)
_trial: dict[str, Any] = {}  # the loaded run: {"key": (path, adapter mtime), "trial": ...}
_lock = threading.Lock()  # one generation at a time per server (one model in memory)


def finished_runs(root: Path | None = None) -> list[str]:
    """Run folders under runs/ that hold a trained adapter, newest first."""
    root = root or common.runs_root()
    if not root.is_dir():
        return []
    found = []
    for folder in root.iterdir():
        adapter = folder / "adapter"
        if (folder / "config.json").is_file() and adapter.is_dir() and any(
                (adapter / name).is_file() for name in ("adapter_config.json",
                                                        "pytorch_lora_weights.safetensors")):
            found.append(folder)
    return [str(f) for f in sorted(found, key=lambda f: (f / "adapter").stat().st_mtime, reverse=True)]


def refresh_runs(current: str | None = None):
    """A Dropdown update listing the finished runs (keeps the current choice when still there)."""
    import gradio as gr

    runs = finished_runs()
    value = current if current in runs else (runs[0] if runs else None)
    return gr.update(choices=runs, value=value)


def _running_job():
    return common.MANAGER.job  # the dashboard's one job


def needed_bytes(run: RunInfo, max_new_tokens: int, prompt_tokens: int = 512) -> int:
    """Predicted bytes generation needs for this run (see lora_gui.memory.predict.generation)."""
    if run.cfg.task in ("image", "video"):  # one pipeline in memory, as for pictures
        from lora_gui.models import diffusion as dm

        return generation.image_generation_bytes(Path(dm.resolve_pipeline_source(run.cfg.model)), run.adapter)
    from lora_gui.models import text as text_models

    source = Path(text_models.resolve_model_source(run.cfg.model))
    return generation.text_generation_bytes(source, run.adapter, prompt_tokens + int(max_new_tokens))


def _trial_for(run: RunInfo):
    key = (str(run.out.resolve()), (run.adapter / "adapter_config.json").stat().st_mtime
           if run.cfg.task == "text" else (run.adapter / "pytorch_lora_weights.safetensors").stat().st_mtime)
    if _trial.get("key") != key:
        _trial.clear()  # free the previous run's model first
        trials = {"image": ImageTrial, "video": VideoTrial}
        _trial["trial"] = trials.get(run.cfg.task, TextTrial)(run)
        _trial["key"] = key
    return _trial["trial"]


def generate(run_dir: str | None, prompt: str, max_new_tokens: float, temperature: float, seed: float,
             scale: float) -> Iterator[tuple[Any, ...]]:
    """Streams (base text, adapter text, base picture, adapter picture, starting adapter's text
    (a run started from an earlier run's adapter), base clip, adapter clip (a video run's mp4
    files), message)."""
    for update in _generate_checked(run_dir, prompt, max_new_tokens, temperature, seed, scale):
        *panes, message = update
        yield (*panes, *([None, None] if len(panes) == 5 else []), message)


def _generate_checked(run_dir: str | None, prompt: str, max_new_tokens: float, temperature: float,
                      seed: float, scale: float) -> Iterator[tuple[Any, ...]]:
    """:func:`generate` without the clip panes but for a video run's updates (which have them)."""
    if not run_dir:
        yield "", "", None, None, "", "Pick a finished run first (train one, then press Refresh)."
        return
    if not (prompt or "").strip():
        yield "", "", None, None, "", "Type a prompt first."
        return
    try:
        run = open_run(paths.check("run", run_dir))
        paths.check_config(run.cfg)  # the base model the run names (its config.json) is read too
        room = generation.room_for_generation(needed_bytes(run, int(max_new_tokens or 64)), _running_job())
        if not room.fits:
            yield "", "", None, None, "", room.message
            return
        if not _lock.acquire(blocking=False):
            yield "", "", None, None, "", "A generation is already running; wait for it to finish."
            return
        try:
            yield from _generate(run, prompt, int(max_new_tokens or 64), float(temperature or 0),
                                 int(seed or 0), float(scale if scale is not None else 1.0))
        finally:
            _lock.release()
    except USER_ERRORS as err:
        yield "", "", None, None, "", f"Error: {err}"


def _generate(run: RunInfo, prompt: str, max_new: int, temperature: float, seed: int,
              scale: float) -> Iterator[tuple[Any, ...]]:
    trial = _trial_for(run)
    if run.cfg.task == "video":
        yield "", "", None, None, "", None, None, "Generating clips…"
        base, tuned = trial.clips(prompt, run.out / "try", seed=seed, scale=scale)
        yield ("", "", None, None, "", str(base), str(tuned),
               f"Done: seed {seed}, LoRA scale {scale:g}, {run.cfg.video_size or run.cfg.resolution} px, "
               f"{run.cfg.video_frames} frames.")
        return
    if run.cfg.task == "image":
        yield "", "", None, None, "", "Generating pictures…"
        base, tuned = trial.pictures(prompt, seed=seed, scale=scale)
        yield "", "", base, tuned, "", f"Done: seed {seed}, LoRA scale {scale:g}, {run.cfg.resolution} px."
        return
    what = "chat template applied" if run.is_chat else "plain text prompt"
    base = ""
    for base in trial.stream(prompt, adapter=False, max_new_tokens=max_new, temperature=temperature,
                             seed=seed):
        yield base, "", None, None, "", f"Base model generating… ({what})"
    start = ""
    if getattr(trial, "start", None) is not None:  # the adapter the run started from, between them
        for start in trial.stream(prompt, adapter="start", max_new_tokens=max_new, temperature=temperature,
                                  seed=seed):
            yield base, "", None, None, start, f"Starting adapter generating… ({what})"
    tuned = ""
    for tuned in trial.stream(prompt, adapter=True, max_new_tokens=max_new, temperature=temperature,
                              seed=seed):
        yield base, tuned, None, None, start, f"Adapter generating… ({what})"
    yield base, tuned, None, None, start, f"Done: seed {seed}, temperature {temperature:g}, {what}."


def export(run_dir: str | None, out: str, merged: bool, gguf: str | None = "none") -> str:
    """Exports the chosen run (adapter + model card, a merged model, or GGUF files with an
    Ollama Modelfile); returns a message."""
    if not run_dir:
        return "Pick a finished run first."
    target = (out or "").strip() or str(Path(run_dir).with_name(Path(run_dir).name + "-export"))
    kind = None if gguf in (None, "", "none") else gguf
    try:
        paths.check("run", run_dir)
        paths.check("export folder", target, writes=True)
        if (Path(run_dir) / "config.json").is_file():  # a merged export reads the run's base model
            paths.check_config(load_run_config(Path(run_dir)))
        path = export_run(run_dir, target, merged=bool(merged), gguf=kind)
    except USER_ERRORS as err:
        return f"Error: {err}"
    if kind:
        return f"Exported GGUF ({kind}) with an Ollama Modelfile to {path} (files checked on reading back)"
    return f"Exported {'the merged model' if merged else 'the adapter and its model card'} to {path}"


def run_task(run_dir: str | None) -> tuple[str | None, bool]:
    """(the run's task or None when unknown, whether it started from an earlier run's adapter),
    read from its config.json (no model is loaded)."""
    import json

    if not run_dir:
        return None, False
    try:
        cfg = json.loads((Path(run_dir) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None, False
    return cfg.get("task", "text"), bool(cfg.get("init_adapter"))


def task_panes(run_dir: str | None) -> tuple[bool, ...]:
    """Whether each of (max new tokens, temperature, LoRA scale, base text, start text, adapter
    text, base picture, adapter picture) shows: a text run shows its text panes (the start
    adapter's only when it started from one), an image run its pictures; an unknown run all."""
    task, started_from = run_task(run_dir)
    text, image = task in (None, "text"), task in (None, "image")
    return (text, text, image or task == "video", text, text and started_from, text, image, image)


def clip_panes(run_dir: str | None) -> tuple[bool, bool]:
    """Whether the base and adapter clips show: a video run's (and an unknown run's)."""
    task, _ = run_task(run_dir)
    return (task in (None, "video"),) * 2


def task_view(run_dir: str | None) -> tuple[dict[str, Any], ...]:
    """:func:`task_panes` and :func:`clip_panes` as visibility updates."""
    import gradio as gr

    return tuple(gr.update(visible=v) for v in (*task_panes(run_dir), *clip_panes(run_dir)))
